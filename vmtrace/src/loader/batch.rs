//! Hash maps read (and emptied) a few hundred entries per system call:
//! `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_LOOKUP_AND_DELETE_BATCH` (Linux 5.6+,
//! hash and per-CPU hash maps). aya 0.14 walks a map one key at a time: a
//! `get_next_key`, a lookup and a delete, three system calls per entry,
//! which beside a shell loop (a few hundred processes a second, each with
//! its own stacks and call sites) were an eighth of the collector's time.
//! A count a program adds through a value it looked up before the entry was
//! taken is still lost, as between a lookup and a delete (a few
//! instructions' window).
//!
//! A kernel that refuses the commands (`EINVAL`, `ENOTSUPP`) gets `None`,
//! and the caller walks the map key by key as before.
use std::os::fd::{AsRawFd as _, BorrowedFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// Entries asked for per call; a bucket holding more is asked again with
/// room for it (`ENOSPC`).
const CHUNK: usize = 256;

/// How a map's values are laid out: one value per entry, or one per
/// possible CPU (each rounded up to 8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Values {
    Plain,
    PerCpu(usize),
}

/// Calls `each` with every entry of the hash map `fd` (key, and its value
/// per CPU, or its one value), removing each when `delete`. `None`: the
/// kernel does not batch for this map (or another failure): nothing was
/// read or removed, walk it key by key. A batch that fails after the first
/// stops there (what was taken was passed to `each`) and gives `Some`.
pub(super) fn for_each<K: Copy, V: Copy>(
    fd: BorrowedFd,
    values: Values,
    delete: bool,
    mut each: impl FnMut(K, &[V]),
) -> Option<usize> {
    let (cpus, stride) = match values {
        Values::Plain => (1, std::mem::size_of::<V>()),
        Values::PerCpu(n) => (n, std::mem::size_of::<V>().next_multiple_of(8)),
    };
    let ksize = std::mem::size_of::<K>();
    let mut chunk = CHUNK;
    let mut keys: Vec<u8> = Vec::new();
    let mut vals: Vec<u64> = Vec::new();
    let mut per_cpu: Vec<V> = Vec::with_capacity(cpus);
    let (mut token_in, mut token_out) = (0u32, 0u32);
    let mut started = false;
    let mut total = 0usize;
    loop {
        keys.resize(chunk * ksize, 0);
        vals.resize((chunk * cpus * stride).div_ceil(8), 0);
        // `union bpf_attr`'s batch part: in_batch, out_batch, keys, values,
        // count and map_fd (u32 each), elem_flags, flags.
        let mut attr: [u64; 7] = [
            if started { std::ptr::from_ref(&token_in) as u64 } else { 0 },
            std::ptr::from_mut(&mut token_out) as u64,
            keys.as_mut_ptr() as u64,
            vals.as_mut_ptr() as u64,
            chunk as u64 | (u64::from(fd.as_raw_fd() as u32) << 32),
            0,
            0,
        ];
        let cmd = if delete { BPF_MAP_LOOKUP_AND_DELETE_BATCH } else { BPF_MAP_LOOKUP_BATCH };
        // SAFETY: `attr` points at buffers for `chunk` keys and `chunk`
        // values of the map's sizes (per possible CPU for a per-CPU map),
        // and at the two batch tokens (a u32 bucket index for hash maps).
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(&attr)) };
        let err = (r < 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        if err == Some(libc::ENOSPC) && chunk < (1 << 16) {
            // One bucket holds more entries than `chunk`: ask again with room.
            chunk *= 4;
            continue;
        }
        if err.is_some_and(|e| e != libc::ENOENT) {
            return started.then_some(total);
        }
        // The kernel wrote the count it filled over `attr[4]`'s low half.
        // SAFETY: `attr` is live; the kernel wrote through the pointer we gave.
        let filled = (unsafe { std::ptr::read_volatile(attr.as_ptr().add(4)) } as u32) as usize;
        let filled = filled.min(chunk);
        let bytes = vals.as_ptr().cast::<u8>();
        for i in 0..filled {
            // SAFETY: within `keys`; keys are plain integers (Pod).
            let k: K = unsafe { std::ptr::read_unaligned(keys.as_ptr().add(i * ksize).cast::<K>()) };
            per_cpu.clear();
            for cpu in 0..cpus {
                // SAFETY: within `vals` (`chunk * cpus * stride` bytes); values are Pod.
                per_cpu.push(unsafe { std::ptr::read_unaligned(bytes.add((i * cpus + cpu) * stride).cast::<V>()) });
            }
            each(k, &per_cpu);
        }
        total += filled;
        started = true;
        if err == Some(libc::ENOENT) {
            return Some(total);
        }
        token_in = token_out;
    }
}
