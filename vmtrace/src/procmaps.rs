//! `/proc/PID/maps`: a process's memory regions (VMAs), classified the way
//! users ask about them (heap, stack, file, anon, …), and address lookup.
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub(crate) mod exec_image;
pub(crate) mod root;

use crate::model::RegionKind;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    pub perms: Perms,
    pub offset: u64,
    pub kind: RegionKind,
    pub path: Option<Arc<str>>,
}

/// A region's permissions as /proc/PID/maps writes them (`r-xp`, `rw-s`):
/// up to four ASCII characters, kept inline. A region is cloned every time
/// an address space is replayed or inherited, and its permissions were a
/// heap string each time (a tenth of the collector's allocations beside
/// process churn).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Perms {
    bytes: [u8; 4],
    len: u8,
}

impl Perms {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl From<&str> for Perms {
    /// The first four characters of `s` if ASCII (permissions always are),
    /// else none.
    fn from(s: &str) -> Self {
        let mut p = Self::default();
        if s.is_ascii() {
            let n = s.len().min(4);
            p.bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
            p.len = n as u8;
        }
        p
    }
}

impl From<String> for Perms {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl std::ops::Deref for Perms {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for Perms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for Perms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for Perms {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Perms {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for Perms {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Perms {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Self::from(s.as_ref()))
    }
}

impl Region {
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

fn classify(inode: u64, name: &str) -> RegionKind {
    match name {
        "[heap]" => RegionKind::Heap,
        "[stack]" => RegionKind::Stack,
        "[vdso]" | "[vvar]" | "[vsyscall]" | "[vvar_vclock]" => RegionKind::Vdso,
        "" => RegionKind::Anon,
        n if n.starts_with("[anon:") => RegionKind::Anon,
        n if n.starts_with("[stack:") => RegionKind::Stack,
        n if n.starts_with("/anon_hugepage") => RegionKind::Hugetlb,
        n if n.starts_with("/dev/zero") || n.starts_with("/SYSV") || n.starts_with("/memfd:") => RegionKind::Shmem,
        n if n.starts_with("/dev/shm/") => RegionKind::Shmem,
        n if n.starts_with('/') && inode != 0 => RegionKind::File,
        _ => RegionKind::Other,
    }
}

/// Parses the text of `/proc/PID/maps`. Lines that do not parse are skipped.
pub(crate) fn parse(text: &str) -> Vec<Region> {
    text.lines().filter_map(|l| parse_line(l).map(|(r, _)| r)).collect()
}

/// As `parse`, each region with the file it maps: the kernel's (device,
/// inode), device as `major << 20 | minor` as the tracepoints give it;
/// inode 0 for none.
pub(crate) fn parse_with_files(text: &str) -> Vec<(Region, (u32, u64))> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<(Region, (u32, u64))> {
    // start-end perms offset dev inode [path]; the path may contain spaces.
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = Perms::from(it.next()?);
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let (major, minor) = it.next()?.split_once(':')?;
    let dev = (u32::from_str_radix(major, 16).ok()? << 20) | u32::from_str_radix(minor, 16).ok()?;
    let inode: u64 = it.next()?.parse().ok()?;
    let name = it.next().unwrap_or("").trim_start();
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    let (s, e) = range.split_once('-')?;
    let (start, end) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
    let kind = classify(inode, name);
    let path = (!name.is_empty()).then(|| intern(name));
    Some((Region { start, end, perms, offset, kind, path }, (dev, inode)))
}

/// Region paths, shared: every maps read of every process names the same
/// few hundred files (libc, libpython, the interpreter's modules), and a
/// process's mapping log keeps each read it changed. Unshared, their paths
/// were ~9.5 MB of 103 MB live after 300 s of `record -a` beside the churn
/// loop and two builds (heaptrack), one allocation per region read.
struct Paths {
    set: crate::hash::HashSet<Arc<str>>,
    /// The size at which the paths only the table holds are let go.
    prune_at: usize,
}

static PATHS: std::sync::Mutex<Option<Paths>> = std::sync::Mutex::new(None);

/// `name` as an `Arc<str>` shared with every other region of that path.
pub(crate) fn intern(name: &str) -> Arc<str> {
    let mut guard = PATHS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let paths = guard.get_or_insert_with(|| Paths { set: crate::hash::HashSet::default(), prune_at: 4096 });
    if let Some(p) = paths.set.get(name) {
        return p.clone();
    }
    if paths.set.len() >= paths.prune_at {
        // Those no region holds any more go (a path per exited process's
        // temporary files, `/memfd:` names); the bound doubles with what is held.
        paths.set.retain(|p| Arc::strong_count(p) > 1);
        paths.set.shrink_to_fit();
        paths.prune_at = (2 * paths.set.len()).max(4096);
    }
    let p: Arc<str> = Arc::from(name);
    paths.set.insert(p.clone());
    p
}

pub(crate) fn read(pid: u32) -> std::io::Result<Vec<Region>> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|t| parse(&t))
}

/// As `read`, with the file of each region (`parse_with_files`).
pub(crate) fn read_with_files(pid: u32) -> std::io::Result<Vec<(Region, (u32, u64))>> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).map(|t| parse_with_files(&t))
}

/// The region holding `addr` (regions sorted by start, as the kernel lists them).
pub(crate) fn find(regions: &[Region], addr: u64) -> Option<&Region> {
    let i = regions.partition_point(|r| r.start <= addr);
    i.checked_sub(1).map(|i| &regions[i]).filter(|r| r.contains(addr))
}

/// Regions a process announced by mmap/mremap events, by start address:
/// they stay known after they are unmapped. Bounded; lookups are O(log n),
/// since a churning process announces tens of thousands per second.
#[derive(Clone, Debug, Default)]
pub struct MappedRegions {
    by_start: std::collections::BTreeMap<u64, Region>,
}

impl MappedRegions {
    /// How many are remembered per process (the lowest starts go first).
    pub const CAP: usize = 4096;

    /// Adds `r`, in the order the process mapped it: what it covers of
    /// regions added before is theirs no more (a mapping over a mapping
    /// replaces it, as `MAP_FIXED` does: ld.so maps a library's text over
    /// the span it reserved, then its data over the text's tail). Regions
    /// unmapped and not mapped over stay known.
    pub fn insert(&mut self, r: Region) {
        let covered: Vec<u64> =
            (self.by_start.range(..r.end).rev()).take_while(|(_, e)| e.end > r.start).map(|(s, _)| *s).collect();
        for start in covered {
            let Some(e) = self.by_start.remove(&start) else { continue };
            if e.end > r.end {
                let skip = r.end - e.start;
                let offset = if e.path.is_some() { e.offset + skip } else { e.offset };
                self.by_start.insert(r.end, Region { start: r.end, offset, ..e.clone() });
            }
            if e.start < r.start {
                self.by_start.insert(e.start, Region { end: r.start, ..e });
            }
        }
        self.by_start.insert(r.start, r);
        if self.by_start.len() > Self::CAP {
            self.by_start.pop_first();
        }
    }

    /// The region holding `addr`, among the few starting just below it.
    pub fn find(&self, addr: u64) -> Option<&Region> {
        self.by_start.range(..=addr).rev().take(8).map(|(_, r)| r).find(|r| r.contains(addr))
    }

    /// The regions, lowest start first.
    pub fn iter(&self) -> impl Iterator<Item = &Region> {
        self.by_start.values()
    }

    /// The regions, to change what does not place them (their names).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Region> {
        self.by_start.values_mut()
    }

    pub fn len(&self) -> usize {
        self.by_start.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }
}

impl From<Vec<Region>> for MappedRegions {
    fn from(v: Vec<Region>) -> Self {
        let mut m = Self::default();
        for r in v {
            m.insert(r);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_regions_are_shared_and_let_go_when_unused() {
        let a = parse("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libshared-by-test.so\n");
        let b = parse("8f00-8f10 r--p 00001000 08:01 42 /usr/lib/libshared-by-test.so\n");
        let (pa, pb) = (a[0].path.clone().unwrap(), b[0].path.clone().unwrap());
        assert!(Arc::ptr_eq(&pa, &pb), "one allocation for both reads");
        assert_eq!(&*pa, "/usr/lib/libshared-by-test.so");
    }

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fe:01 1048 /usr/bin/python3.11
55d0c1e2e000-55d0c1f72000 rw-p 00000000 00:00 0                          [heap]
7f1b2c000000-7f1b34000000 rw-p 00000000 00:00 0 
7f1b3c200000-7f1b3c400000 r--s 00000000 fe:01 2222 /data/model weights.safetensors
7f1b3d000000-7f1b3d100000 rw-s 00000000 00:05 7 /dev/zero (deleted)
7ffc8a9d0000-7ffc8a9f1000 rw-p 00000000 00:00 0                          [stack]
7ffc8a9f8000-7ffc8a9fa000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn parses_and_classifies() {
        let r = parse(MAPS);
        assert_eq!(r.len(), 7);
        assert_eq!(r[0].kind, RegionKind::File);
        assert_eq!(r[1].kind, RegionKind::Heap);
        assert_eq!((r[2].kind, r[2].path.as_deref()), (RegionKind::Anon, None));
        assert_eq!(r[3].path.as_deref(), Some("/data/model weights.safetensors"));
        assert_eq!(r[4].kind, RegionKind::Shmem);
        assert_eq!(r[5].kind, RegionKind::Stack);
        assert_eq!(r[6].kind, RegionKind::Vdso);
        assert_eq!(r[3].perms, "r--s");
    }

    #[test]
    fn parses_the_file_of_each_region() {
        let ids: Vec<_> = parse_with_files(MAPS).into_iter().map(|(_, id)| id).collect();
        assert_eq!(ids[0], ((0xfe << 20) | 1, 1048));
        assert_eq!(ids[1], (0, 0));
        assert_eq!(ids[3], ((0xfe << 20) | 1, 2222));
        assert_eq!(ids[4], (5, 7));
    }

    #[test]
    fn finds_the_region_of_an_address() {
        let r = parse(MAPS);
        assert_eq!(find(&r, 0x7f1b_2c00_0000).map(|r| r.kind), Some(RegionKind::Anon));
        assert_eq!(find(&r, 0x7f1b_33ff_ffff).map(|r| r.kind), Some(RegionKind::Anon));
        assert_eq!(find(&r, 0x7f1b_3400_0000), None, "end is exclusive");
        assert_eq!(find(&r, 0x1000), None);
    }

    #[test]
    fn mapped_regions_are_found_and_bounded() {
        let r = |start: u64, end: u64| Region {
            start,
            end,
            perms: "rw-p".into(),
            offset: 0,
            kind: RegionKind::Anon,
            path: None,
        };
        let mut m = MappedRegions::from(vec![r(0x1000, 0x3000), r(0x10000, 0x20000)]);
        assert_eq!(m.find(0x2fff).map(|r| r.start), Some(0x1000));
        assert_eq!(m.find(0x3000), None);
        assert_eq!(m.find(0x18000).map(|r| r.start), Some(0x10000));
        // Mapped over at the same start: the newest holds what it covers,
        // the rest of the older one stays (as the kernel leaves it).
        m.insert(r(0x10000, 0x11000));
        assert_eq!(m.find(0x10800).map(|r| r.end), Some(0x11000));
        assert_eq!(m.find(0x18000).map(|r| r.start), Some(0x11000));
        for i in 0..(MappedRegions::CAP as u64 + 10) {
            let start = 0x0010_0000 + i * 0x1000;
            m.insert(r(start, start + 0x1000));
        }
        assert_eq!(m.len(), MappedRegions::CAP);
    }

    #[test]
    fn reads_own_maps() {
        let r = read(std::process::id()).unwrap();
        let here = find(&r, find as fn(&[Region], u64) -> Option<&Region> as usize as u64).unwrap();
        assert_eq!(here.kind, RegionKind::File);
        assert!(here.perms.contains('x'));
    }
}
