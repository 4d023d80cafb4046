//! CPython's object memory: obmalloc arenas. CPython allocates objects of up
//! to 512 bytes from arenas it maps itself (`_PyObject_ArenaMmap`:
//! `mmap(NULL, ARENA_SIZE, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS,
//! -1, 0)`), 1 MiB each on 64-bit 3.10 and later (`ARENA_BITS` 20, with the
//! radix tree), 256 KiB before. Measured with `sys._debugmallocstats()`
//! ("N arenas * 1048576 bytes/arena") and `strace -e mmap` on pyenv builds of
//! 3.9.18 (262144), 3.10.13, 3.11.7, 3.12.1 and 3.13.0 (1048576). The
//! free-threaded build (`python3.13t`) uses mimalloc instead and is not named.
//!
//! A process runs CPython when it maps a `python3.N` executable or a
//! `libpython3.N` library (pyenv, distribution and venv interpreters all map
//! one of them: a venv's `python` is a symlink, maps show its target); its
//! mmaps of exactly the arena size with exactly those flags are arenas.
use crate::{model::RegionKind, procmaps::Region};

/// The name of an arena's row.
pub(crate) const NAME: &str = "[python arena]";

/// The name CPython gives its arenas where it names anonymous memory
/// (`PR_SET_VMA_ANON_NAME`, newer versions).
const KERNEL_NAME: &str = "[anon:cpython:pymalloc]";

/// (major, minor) of a CPython executable or library named in `path`:
/// `…/python3.12`, `…/python3.12d`, `…/libpython3.12.so.1.0`; `None` for
/// other files and for free-threaded builds (`python3.13t`).
pub(crate) fn version_of(path: &str) -> Option<(u32, u32)> {
    let base = path.rsplit('/').next()?;
    let (rest, lib) = match base.strip_prefix("libpython") {
        Some(r) => (r, true),
        None => (base.strip_prefix("python")?, false),
    };
    let (major, rest) = rest.split_once('.')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (minor, tail) = rest.split_at(digits);
    let tail = tail.strip_prefix('d').unwrap_or(tail);
    let ok_tail = if lib { tail.is_empty() || tail.starts_with(".so") || tail == ".a" } else { tail.is_empty() };
    if !ok_tail || major.is_empty() || minor.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// obmalloc's arena size for a CPython version (64-bit), if its arenas come
/// from their own mmap (3.4 and later; 2.7 takes them from malloc).
pub(crate) fn arena_size(version: (u32, u32)) -> Option<u64> {
    match version {
        (3, m) if m >= 10 => Some(1 << 20),
        (3, m) if m >= 4 => Some(256 << 10),
        _ => None,
    }
}

/// The arena size of the CPython whose files appear in `paths` (the files a
/// process mapped), if any.
pub(crate) fn arena_size_in<'a>(paths: impl IntoIterator<Item = &'a str>) -> Option<u64> {
    paths.into_iter().filter_map(version_of).find_map(arena_size)
}

/// The paths of the files in `regions`.
pub(crate) fn paths(regions: &[Region]) -> impl Iterator<Item = &str> {
    regions.iter().filter(|r| r.path.as_deref().is_some_and(|p| p.starts_with('/'))).filter_map(|r| r.path.as_deref())
}

/// Whether an mmap of `region` with `flags` is an obmalloc arena of `size`:
/// anonymous, private, read-write, exactly `MAP_PRIVATE|MAP_ANONYMOUS`, at an
/// address the kernel chose, of exactly the arena size.
pub(crate) fn is_arena_mmap(region: &Region, flags: u64, size: u64) -> bool {
    let want = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    region.kind == RegionKind::Anon
        && region.path.is_none()
        && region.perms == "rw-p"
        && flags == want
        && region.end - region.start == size
}

/// A region the kernel names as CPython's (newer versions name their arenas).
pub(crate) fn is_kernel_named(region: &Region) -> bool {
    region.path.as_deref() == Some(KERNEL_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_paths() {
        assert_eq!(version_of("/root/.pyenv/versions/3.12.1/bin/python3.12"), Some((3, 12)));
        assert_eq!(version_of("/usr/lib/x86_64-linux-gnu/libpython3.10.so.1.0"), Some((3, 10)));
        assert_eq!(version_of("/usr/bin/python3.9d"), Some((3, 9)));
        assert_eq!(version_of("/usr/bin/python3.13t"), None);
        assert_eq!(version_of("/usr/lib/libpython3.13t.so.1.0"), None);
        assert_eq!(version_of("/usr/bin/python3"), None);
        assert_eq!(version_of("/x/python3.12/site-packages/torch/lib/libtorch.so"), None);
        assert_eq!(version_of("/x/lib/python3.12/lib-dynload/_ssl.cpython-312-x86_64-linux-gnu.so"), None);
        assert_eq!(version_of("/usr/bin/python3.12-config"), None);
        assert_eq!(arena_size_in(["/bin/sh", "/usr/bin/python3.11"]), Some(1 << 20));
        assert_eq!(arena_size_in(["/usr/bin/python3.8"]), Some(256 << 10));
        assert_eq!(arena_size_in(["/usr/bin/python2.7"]), None);
    }

    #[test]
    fn arena_mmaps() {
        let r = |len: u64, perms: &str| Region {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0000_0000 + len,
            perms: perms.into(),
            offset: 0,
            kind: RegionKind::Anon,
            path: None,
        };
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        assert!(is_arena_mmap(&r(1 << 20, "rw-p"), flags, 1 << 20));
        // A malloc'd 1 MiB buffer is a page larger; a thread stack has MAP_STACK.
        assert!(!is_arena_mmap(&r((1 << 20) + 4096, "rw-p"), flags, 1 << 20));
        assert!(!is_arena_mmap(&r(1 << 20, "rw-p"), flags | libc::MAP_STACK as u64, 1 << 20));
        assert!(!is_arena_mmap(&r(1 << 20, "---p"), flags | libc::MAP_NORESERVE as u64, 1 << 20));
        assert!(!is_arena_mmap(&r(1 << 20, "rw-p"), flags | libc::MAP_FIXED as u64, 1 << 20));
    }
}
