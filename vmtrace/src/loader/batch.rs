//! Batched map reads and deletes (`BPF_MAP_LOOKUP_BATCH`,
//! `BPF_MAP_DELETE_BATCH`, Linux 5.6+): aya 0.14 has none, and a walk key by
//! key costs three system calls an entry (next key, lookup, delete). The
//! collector takes exited processes' granules and call sites out of maps
//! that also hold every live process's, every second: under process churn
//! those walks were a tenth of its CPU (docs/performance.md). Here a system
//! call moves up to `CHUNK` entries. Only entries no program adds to any
//! more (exited processes') are taken this way: a batch read followed by a
//! batch delete would lose what a program added in between. Where the
//! kernel lacks the commands (`EINVAL`) the callers walk as before.
use std::{io, os::fd::BorrowedFd};

const BPF_MAP_LOOKUP_BATCH: u32 = 24;
const BPF_MAP_DELETE_BATCH: u32 = 27;

/// Entries asked for per system call (a hash bucket larger than this is
/// retried with a larger chunk: `ENOSPC`).
const CHUNK: usize = 1024;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf(cmd: u32, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` is the batch commands' part of `bpf_attr`, its size
    // given; the buffers it points to outlive the call and are as large as
    // `count` entries of the map's key and value sizes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            libc::c_long::from(cmd as i32),
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            std::mem::size_of::<BatchAttr>() as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The value size of one entry as the batch commands copy it: for a
/// per-CPU map, each possible CPU's value rounded up to 8 bytes.
pub(crate) fn value_size<V>(per_cpu: Option<usize>) -> usize {
    match per_cpu {
        Some(cpus) => std::mem::size_of::<V>().next_multiple_of(8) * cpus,
        None => std::mem::size_of::<V>(),
    }
}

/// The entries of a hash map whose key `keep` says, as raw keys and values
/// (`key_size` and `value_size` bytes each): the map is read a chunk at a
/// time, and only the entries kept are held.
fn entries(
    fd: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
    keep: &dyn Fn(&[u8]) -> bool,
) -> io::Result<(Vec<u8>, Vec<u8>)> {
    use std::os::fd::AsRawFd as _;
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    let mut chunk = CHUNK;
    let (mut kbuf, mut vbuf) = (vec![0u8; chunk * key_size], vec![0u8; chunk * value_size]);
    // The position tokens (a bucket index for hash maps).
    let (mut at, mut next) = ([0u8; 8], [0u8; 8]);
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { at.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: kbuf.as_mut_ptr() as u64,
            values: vbuf.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let r = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let n = (attr.count as usize).min(chunk);
        match r {
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && n == 0 => {
                // One bucket holds more than a chunk.
                chunk *= 4;
                (kbuf, vbuf) = (vec![0u8; chunk * key_size], vec![0u8; chunk * value_size]);
                continue;
            }
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
            _ => {}
        }
        for i in (0..n).filter(|i| keep(&kbuf[i * key_size..(i + 1) * key_size])) {
            keys.extend_from_slice(&kbuf[i * key_size..(i + 1) * key_size]);
            values.extend_from_slice(&vbuf[i * value_size..(i + 1) * value_size]);
        }
        if r.is_err() {
            // ENOENT: the map's end.
            return Ok((keys, values));
        }
        at = next;
        first = false;
    }
}

/// Reads a `T` out of `bytes` at `offset`.
fn read<T: aya::Pod>(bytes: &[u8], offset: usize) -> T {
    assert!(offset + std::mem::size_of::<T>() <= bytes.len());
    // SAFETY: in bounds (checked above); `T` is plain data, read unaligned.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().add(offset).cast::<T>()) }
}

/// The entries of a per-CPU hash map (`cpus`: its possible CPUs) whose key
/// `keep` says, each CPU's value merged into one by `merge`.
pub(crate) fn per_cpu_entries<K: aya::Pod, V: aya::Pod + Default>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    keep: impl Fn(&K) -> bool,
    merge: impl Fn(&mut V, &V),
) -> io::Result<Vec<(K, V)>> {
    let (ks, vs) = (std::mem::size_of::<K>(), value_size::<V>(Some(cpus)));
    let (keys, values) = entries(fd, ks, vs, &|k| keep(&read::<K>(k, 0)))?;
    let stride = std::mem::size_of::<V>().next_multiple_of(8);
    let n = keys.len() / ks.max(1);
    Ok((0..n)
        .map(|i| {
            let mut sum = V::default();
            for c in 0..cpus {
                merge(&mut sum, &read::<V>(&values, i * vs + c * stride));
            }
            (read::<K>(&keys, i * ks), sum)
        })
        .collect())
}

/// Deletes `keys` from a hash map; returns how many went.
pub(crate) fn delete<K: aya::Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> io::Result<usize> {
    use std::os::fd::AsRawFd as _;
    let mut gone = 0;
    for part in keys.chunks(CHUNK) {
        let mut attr = BatchAttr {
            keys: part.as_ptr() as u64,
            count: part.len() as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let r = bpf(BPF_MAP_DELETE_BATCH, &mut attr);
        gone += attr.count as usize;
        match r {
            // A key gone already (the batch stops there): the rest one by one.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let done = attr.count as usize;
                if done < part.len() {
                    gone += delete(fd, &part[done + 1..])?;
                }
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
    }
    Ok(gone)
}

#[cfg(test)]
mod tests {
    #[test]
    fn per_cpu_values_are_padded_to_eight_bytes() {
        assert_eq!(super::value_size::<u32>(Some(3)), 24);
        assert_eq!(super::value_size::<[u64; 3]>(Some(2)), 48);
        assert_eq!(super::value_size::<u32>(None), 4);
    }
}
