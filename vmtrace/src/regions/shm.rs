//! Unlinked shared-memory segments, grouped. A program that passes data
//! between processes in shared memory makes a segment per transfer and
//! unlinks it at once: PyTorch's DataLoader workers put each batch in a
//! `/dev/shm/torch_<pid>_<random>_<n>` file, unlinked, whose descriptor goes
//! to the parent (`file_descriptor` sharing). One row per segment makes a
//! region table and `files[]` that grow by rows per batch, each named by an
//! inode nobody can look up any more. So the segments of one program are one
//! row per process in `regions[]` and one row in `files[]`, named
//! `[shm: PROGRAM (N segments)]`, their counts summed: a process's regions
//! still add up to its faults.
//!
//! A segment is a mapping of a file in `/dev/shm` that no longer exists (a
//! segment still linked keeps its own row: it has a name to look for), or of
//! a file on `/dev/shm`'s device that was gone before its name was read
//! (`[file MAJ:MIN inode N]`), or a memfd (`/memfd:NAME`, never linked).
//! PROGRAM is the name's first part (`torch_7590_…` is `torch`, `sem.OxeBTF`
//! is `sem`); a segment whose name was never seen is `unnamed`.
use std::collections::{BTreeMap, BTreeSet};

use crate::model::{CowFrom, Faults, FileSummary, RegionKind, RegionSummary};

/// Where segments live: `/dev/shm`'s device, as tracepoints report it
/// (major << 20 | minor).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ShmDevice(pub Option<u32>);

impl ShmDevice {
    /// This machine's `/dev/shm`.
    pub(crate) fn here() -> Self {
        Self(super::kernel_dev_ino("/dev/shm").map(|(dev, _, _)| dev))
    }
}

/// The group of a segment at `path`, if it is one ("torch", "memfd:foo").
/// `exists` says whether a path still names a file.
pub(crate) fn group_of(path: &str, shm: ShmDevice, exists: &impl Fn(&str) -> bool) -> Option<String> {
    if let Some(name) = path.strip_prefix("/dev/shm/") {
        let name = name.strip_suffix(" (deleted)").unwrap_or(name);
        if name.contains('/') || (!path.ends_with(" (deleted)") && exists(path)) {
            return None;
        }
        return Some(program(name));
    }
    if let Some(name) = path.strip_prefix("/memfd:") {
        let name = name.strip_suffix(" (deleted)").unwrap_or(name);
        return Some(format!("memfd:{}", program(name)));
    }
    // "[file MAJ:MIN inode N]": gone before it was named.
    let dev = path.strip_prefix("[file ")?.split_once(" inode ")?.0;
    let (major, minor) = dev.split_once(':')?;
    let dev = (major.parse::<u32>().ok()? << 20) | minor.parse::<u32>().ok()?;
    (shm.0 == Some(dev)).then(|| "unnamed".to_string())
}

/// A segment name's first part, the rest being numbers and random letters:
/// `torch_7590_2710951582_0` is `torch`, `psm_4f3a2b1c` is `psm`,
/// `sem.OxeBTF` (a multiprocessing semaphore) is `sem`.
fn program(name: &str) -> String {
    let first = name.split(['_', '-', '.']).next().unwrap_or("");
    if first.is_empty() || first.bytes().any(|b| b.is_ascii_digit()) {
        "unnamed".into()
    } else {
        first.into()
    }
}

fn label(group: &str, segments: usize) -> String {
    let (kind, name) = group.split_once(':').unwrap_or(("shm", group));
    let s = if segments == 1 { "" } else { "s" };
    format!("[{kind}: {name} ({} segment{s})]", crate::report::words::thousands(segments as u64))
}

/// Groups the segments in `regions` (per process and program) and in
/// `files` (per program).
pub(crate) fn group(regions: &mut Vec<RegionSummary>, files: &mut Vec<FileSummary>, shm: ShmDevice) {
    let exists = |p: &str| std::fs::symlink_metadata(p).is_ok();
    let group = |path: Option<&str>, kind: RegionKind| {
        matches!(kind, RegionKind::File | RegionKind::Shmem).then_some(path?).and_then(|p| group_of(p, shm, &exists))
    };
    let mut groups: BTreeMap<(u32, String), Vec<RegionSummary>> = BTreeMap::new();
    // In place: the rows are a system-wide recording's largest table at
    // its end, and the segments few.
    regions.retain(|r| match group(r.path.as_deref(), r.kind) {
        Some(g) => {
            groups.entry((r.pid, g)).or_default().push(r.clone());
            false
        }
        None => true,
    });
    for ((pid, g), rows) in groups {
        regions.push(grouped_region(pid, &g, &rows));
    }

    let mut fgroups: BTreeMap<String, Vec<FileSummary>> = BTreeMap::new();
    let mut fout = Vec::with_capacity(files.len());
    for f in std::mem::take(files) {
        match group(Some(&f.path), RegionKind::File) {
            Some(g) => fgroups.entry(g).or_default().push(f),
            None => fout.push(f),
        }
    }
    for (g, rows) in fgroups {
        fout.push(grouped_file(&g, &rows));
    }
    *files = fout;
}

fn grouped_region(pid: u32, group: &str, rows: &[RegionSummary]) -> RegionSummary {
    let mut faults = Faults::default();
    let mut cow = CowFrom::default();
    let (mut pages, mut folded) = (0, 0);
    let mut segments = BTreeSet::new();
    let mut perms = rows.first().map_or_else(String::new, |r| r.perms.clone());
    for r in rows {
        faults.add(&r.faults);
        pages += r.pages_touched;
        folded += r.folded.max(1);
        if let Some(c) = &r.cow_from {
            cow.add(c);
        }
        segments.insert(r.path.clone());
        if r.perms != perms {
            perms = union_perms(&perms, &r.perms);
        }
    }
    RegionSummary {
        pid,
        start: "0x0".into(),
        end: "0x0".into(),
        perms,
        kind: rows.first().map_or(RegionKind::File, |r| r.kind),
        path: Some(label(group, segments.len())),
        offset: 0,
        faults,
        pages_touched: pages,
        cow_from: (cow.total() > 0).then_some(cow),
        folded,
    }
}

/// "rw-s" and "r--s" give "rw-s"; a last letter that differs gives `*`.
fn union_perms(a: &str, b: &str) -> String {
    a.bytes()
        .zip(b.bytes())
        .enumerate()
        .map(|(i, (x, y))| match (i, x == y) {
            (_, true) => x as char,
            (3, false) => '*',
            _ => (if x == b'-' { y } else { x }) as char,
        })
        .collect()
}

fn grouped_file(group: &str, rows: &[FileSummary]) -> FileSummary {
    let mut faults = Faults::default();
    let (mut pages, mut added, mut written, mut readahead, mut bytes, mut from_disk) = (0, 0, 0, 0, 0, 0);
    for f in rows {
        faults.add(&f.faults);
        pages += f.pages_touched;
        added += f.page_cache_added;
        written += f.page_cache_written;
        readahead += f.readahead_pages;
        bytes += f.file_bytes;
        from_disk += f.from_disk_bytes;
    }
    FileSummary {
        path: label(group, rows.len()),
        cold_fraction: if faults.total > 0 { faults.major as f64 / faults.total as f64 } else { 0.0 },
        faults,
        pages_touched: pages,
        page_cache_added: added,
        page_cache_written: written,
        readahead_pages: readahead,
        file_bytes: bytes,
        from_disk_bytes: from_disk,
        tensors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHM: ShmDevice = ShmDevice(Some(27));

    fn region(pid: u32, path: &str, faults: u64) -> RegionSummary {
        RegionSummary {
            pid,
            start: "0x1000".into(),
            end: "0x2000".into(),
            perms: "rw-s".into(),
            kind: RegionKind::File,
            path: Some(path.into()),
            offset: 0,
            faults: Faults { total: faults, minor: faults, ..Faults::default() },
            pages_touched: 1,
            cow_from: None,
            folded: 0,
        }
    }

    #[test]
    fn segment_names() {
        let gone = |_: &str| false;
        let there = |_: &str| true;
        assert_eq!(group_of("/dev/shm/torch_7590_2710951582_0", SHM, &gone).as_deref(), Some("torch"));
        assert_eq!(group_of("/dev/shm/torch_7590_2710951582_0 (deleted)", SHM, &there).as_deref(), Some("torch"));
        // Still linked: a name to look for.
        assert_eq!(group_of("/dev/shm/torch_7590_2710951582_0", SHM, &there), None);
        assert_eq!(group_of("/dev/shm/psm_4f3a2b1c", SHM, &gone).as_deref(), Some("psm"));
        assert_eq!(group_of("/dev/shm/1234", SHM, &gone).as_deref(), Some("unnamed"));
        assert_eq!(group_of("/dev/shm/sem.OxeBTF", SHM, &gone).as_deref(), Some("sem"));
        assert_eq!(group_of("/memfd:wayland-shm (deleted)", SHM, &there).as_deref(), Some("memfd:wayland"));
        assert_eq!(group_of("[file 0:27 inode 699]", SHM, &gone).as_deref(), Some("unnamed"));
        assert_eq!(group_of("[file 254:0 inode 699]", SHM, &gone), None);
        assert_eq!(group_of("/tmp/x_1", SHM, &gone), None);
        assert_eq!(label("torch", 1200), "[shm: torch (1,200 segments)]");
        assert_eq!(label("memfd:jit", 1), "[memfd: jit (1 segment)]");
    }

    #[test]
    fn one_row_per_process_and_program_with_counts_that_add_up() {
        let mut regions = vec![region(1, "/usr/lib/libc.so.6", 5)];
        for i in 0..300 {
            regions.push(region(1, &format!("/dev/shm/torch_1_{i}_0"), 2));
            regions.push(region(2, &format!("[file 0:27 inode {i}]"), 1));
        }
        let sum = |rs: &[RegionSummary], pid| rs.iter().filter(|r| r.pid == pid).map(|r| r.faults.total).sum::<u64>();
        let before = (sum(&regions, 1), sum(&regions, 2));
        let mut files: Vec<FileSummary> = regions
            .iter()
            .map(|r| FileSummary {
                path: r.path.clone().unwrap(),
                faults: r.faults.clone(),
                pages_touched: 1,
                page_cache_added: 0,
                page_cache_written: 0,
                readahead_pages: 0,
                cold_fraction: 0.0,
                file_bytes: 0,
                from_disk_bytes: 0,
                tensors: Vec::new(),
            })
            .collect();
        group(&mut regions, &mut files, SHM);
        assert_eq!(regions.len(), 3, "{regions:#?}");
        assert_eq!((sum(&regions, 1), sum(&regions, 2)), before);
        let torch = regions.iter().find(|r| r.pid == 1 && r.folded > 0).unwrap();
        assert_eq!(torch.path.as_deref(), Some("[shm: torch (300 segments)]"));
        assert_eq!((torch.faults.total, torch.folded, torch.pages_touched), (600, 300, 300));
        assert_eq!(regions.iter().find(|r| r.pid == 2).unwrap().path.as_deref(), Some("[shm: unnamed (300 segments)]"));
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/usr/lib/libc.so.6", "[shm: torch (300 segments)]", "[shm: unnamed (300 segments)]"]);
        assert_eq!(files.iter().map(|f| f.faults.total).sum::<u64>(), 5 + 600 + 300);
    }
}
