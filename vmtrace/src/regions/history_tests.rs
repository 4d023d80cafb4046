use super::*;
use crate::regions::place::{place, ProcessInput};
use crate::{model::RegionKind, regions::replay::*};
use vmtrace_common::{GranuleCounts, GranuleKey, REGION_GRANULE_SHIFT};

const MIB: u64 = 1 << 20;

fn anon(start: u64, end: u64, perms: &str) -> Region {
    Region { start, end, perms: perms.into(), offset: 0, kind: RegionKind::Anon, path: None }
}

fn file(start: u64, end: u64, path: &str) -> Region {
    Region { start, end, perms: "r--p".into(), offset: 0, kind: RegionKind::File, path: Some(path.into()) }
}

/// One fault on each page of `[start, end)` at `gen` (whole granules only).
fn faults(start: u64, end: u64, gen: u32) -> Vec<(GranuleKey, GranuleCounts)> {
    let mut v = Vec::new();
    let mut at = start;
    while at < end {
        let granule = at >> REGION_GRANULE_SHIFT;
        let g_end = ((granule + 1) << REGION_GRANULE_SHIFT).min(end);
        let pages = (g_end - at) / 4096;
        let first = (at >> 12) & 63;
        let touched = if pages == 64 { u64::MAX } else { ((1u64 << pages) - 1) << first };
        v.push((
            GranuleKey { tgid: 7, gen, granule },
            GranuleCounts { faults: pages, write: pages, touched, ..Default::default() },
        ));
        at = g_end;
    }
    v
}

fn run(h: &History, granules: &[(GranuleKey, GranuleCounts)]) -> (Vec<(Region, u64)>, super::super::Placement) {
    let (rows, how) =
        place(7, granules, &ProcessInput { history: h, start: None, final_maps: &[], shares_after_fork: false });
    let mut out: Vec<(Region, u64)> = rows.into_iter().map(|r| (r.region, r.acc.faults.round() as u64)).collect();
    out.sort_by_key(|(r, _)| (r.start, r.perms));
    (out, how)
}

#[test]
fn a_malloc_arena_grown_by_mprotect_takes_its_faults_in_read_write_rows() {
    // glibc new_heap: reserve 128 MiB, trim to an aligned 64 MiB, open 4 MiB at a time.
    let base = 0x7f00_0000_0000u64;
    let mut h = History::default();
    h.push(2, 1, Change::Map { region: anon(base - 32 * MIB, base + 96 * MIB, "---p"), flags: MAP_NORESERVE });
    h.push(4, 3, Change::Unmap { start: base - 32 * MIB, end: base });
    h.push(6, 5, Change::Unmap { start: base + 64 * MIB, end: base + 96 * MIB });
    let mut granules = Vec::new();
    let mut gen = 6;
    for step in 0..4u64 {
        h.push(
            gen + 2,
            gen + 1,
            Change::Protect { start: base, end: base + (step + 1) * 4 * MIB, perms: "rw-".into() },
        );
        gen += 2;
        granules.extend(faults(base + step * 4 * MIB, base + (step + 1) * 4 * MIB, gen));
    }
    let (rows, how) = run(&h, &granules);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (r, n) = &rows[0];
    assert_eq!((r.perms.as_str(), r.kind, r.path.as_deref()), ("rw-p", RegionKind::Heap, Some("[malloc arena]")));
    assert_eq!((r.start, r.end, *n), (base, base + 16 * MIB, 4096));
    assert_eq!((how.exact.round() as u64, how.approximate.round() as u64, how.unplaced.round() as u64), (4096, 0, 0));
}

#[test]
fn a_mapping_at_reused_addresses_is_a_row_of_its_own() {
    let at = 0x5000_0000u64;
    let mut h = History::default();
    h.push(2, 1, Change::Map { region: anon(at, at + MIB, "rw-p"), flags: 0 });
    h.push(4, 3, Change::Unmap { start: at, end: at + MIB });
    h.push(6, 5, Change::Map { region: file(at, at + MIB, "/data/x"), flags: 0 });
    // MAP_FIXED over the second half.
    h.push(8, 7, Change::Map { region: anon(at + MIB / 2, at + MIB, "rw-p"), flags: 0 });
    let mut g = faults(at, at + MIB, 2);
    g.extend(faults(at, at + MIB, 6));
    g.extend(faults(at + MIB / 2, at + MIB, 8));
    let (rows, how) = run(&h, &g);
    let summary: Vec<(u64, u64, &str, u64)> =
        rows.iter().map(|(r, n)| (r.start - at, r.end - at, r.perms.as_str(), *n)).collect();
    assert_eq!(
        summary,
        vec![(0, MIB / 2, "r--p", 256), (0, MIB, "rw-p", 256), (MIB / 2, MIB, "rw-p", 128)],
        "three mappings, three rows (the file row spans what is left of it): {rows:?}"
    );
    assert!(how.approximate + how.unplaced < 1e-9, "{how:?}");
}

#[test]
fn mremap_moves_a_mappings_pages_and_brk_grows_the_heap() {
    let mut h = History::default();
    h.push(2, 1, Change::Map { region: anon(0x1000_0000, 0x1000_0000 + MIB, "rw-p"), flags: 0 });
    h.push(4, 3, Change::Remap { old_start: 0x1000_0000, old_len: MIB, new_start: 0x2000_0000, new_len: 2 * MIB });
    h.push(5, 5, Change::Brk { brk: 0x4000_0000 });
    h.push(7, 6, Change::Brk { brk: 0x4000_0000 + MIB });
    let mut g = faults(0x1000_0000, 0x1000_0000 + MIB, 2);
    g.extend(faults(0x2000_0000, 0x2000_0000 + 2 * MIB, 4));
    g.extend(faults(0x4000_0000, 0x4000_0000 + MIB, 7));
    let (rows, how) = run(&h, &g);
    assert_eq!(rows.len(), 2, "the moved mapping is one row: {rows:?}");
    assert_eq!(rows[0].1, 256 + 512);
    assert_eq!((rows[1].0.kind, rows[1].0.path.as_deref(), rows[1].1), (RegionKind::Heap, Some("[heap]"), 256));
    assert_eq!(how.exact.round() as u64, 1024);
}

#[test]
fn exec_mappings_read_later_are_there_from_the_exec() {
    let bin = file(0x5555_0000_0000, 0x5555_0000_0000 + MIB, "/usr/bin/x");
    let stack = Region {
        kind: RegionKind::Stack,
        path: Some("[stack]".into()),
        ..anon(0x7ffd_0000_0000, 0x7ffd_0010_0000, "rw-p")
    };
    let mut h = History::default();
    h.push(1, 1, Change::Exec);
    h.push(3, 2, Change::Map { region: anon(0x7f00_0000_0000, 0x7f00_0000_0000 + MIB, "rw-p"), flags: 0 });
    h.snapshot(3, &[bin.clone(), anon(0x7f00_0000_0000, 0x7f00_0000_0000 + MIB, "rw-p"), stack.clone()], true, 0);
    // The stack grew below what the read showed.
    let mut g = faults(bin.start, bin.end, 1);
    g.extend(faults(stack.start - MIB, stack.start, 3));
    let (rows, how) = run(&h, &g);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!((rows[0].0.path.as_deref(), rows[0].1), (Some("/usr/bin/x"), 256));
    assert_eq!((rows[1].0.kind, rows[1].1), (RegionKind::Stack, 256));
    assert_eq!(how.exact.round() as u64, 512, "{how:?}");
}

#[test]
fn a_fault_racing_a_change_is_counted_approximate_and_never_in_a_mapping_without_access() {
    let at = 0x6000_0000u64;
    let mut h = History::default();
    h.push(2, 1, Change::Map { region: anon(at, at + MIB, "---p"), flags: 0 });
    // Another thread's fault at gen 3 ran while mprotect (enter 3, exit 4) opened it.
    h.push(4, 3, Change::Protect { start: at, end: at + MIB, perms: "rw-".into() });
    let (rows, how) = run(&h, &faults(at, at + MIB, 3));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0.perms, "rw-p");
    assert_eq!((how.exact.round() as u64, how.approximate.round() as u64), (0, 256));
}

#[test]
fn thread_stacks_and_jit_code_are_named() {
    let mut h = History::default();
    h.push(2, 1, Change::Map { region: anon(0x7000_0000, 0x7000_0000 + 8 * MIB, "rw-p"), flags: MAP_STACK });
    h.push(4, 3, Change::Map { region: anon(0x7100_0000, 0x7100_0000 + MIB, "rwxp"), flags: 0 });
    let mut g = faults(0x7000_0000, 0x7000_0000 + MIB, 2);
    g.extend(faults(0x7100_0000, 0x7100_0000 + MIB, 4));
    let (rows, _) = run(&h, &g);
    assert_eq!((rows[0].0.kind, rows[0].0.path.as_deref()), (RegionKind::Stack, Some("[thread stack]")));
    assert_eq!(rows[1].0.path.as_deref(), Some("[jit code]"));
}

#[test]
fn the_same_mapping_made_again_is_one_row_and_is_not_logged_again() {
    let at = 0x7000_0000u64;
    let mut h = History::default();
    let mut g = Vec::new();
    h.push(2, 1, Change::Map { region: anon(at, at + MIB, "rw-p"), flags: 0x22 });
    for _ in 0..1000 {
        // The kernel does not bump the generation for a munmap, nor for an
        // mmap that makes the same mapping again.
        h.push(2, 2, Change::Unmap { start: at, end: at + MIB });
        h.push(2, 2, Change::Map { region: anon(at, at + MIB, "rw-p"), flags: 0x22 });
    }
    assert!(h.log.len() <= 3, "{} entries", h.log.len());
    g.extend(faults(at, at + MIB, 2));
    h.push(2, 2, Change::Unmap { start: at, end: at + MIB });
    let (rows, how) = run(&h, &g);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, 256);
    assert_eq!(how.exact.round() as u64, 256);
}

/// A Python parent maps its obmalloc arenas, forks, and frees most of them
/// at exit: the munmaps (which never bump the generation) and a maps read
/// after them share the fork's generation, and only their time keeps them
/// out of the address space the child started from.
#[test]
fn a_forked_child_starts_with_the_arenas_its_parent_freed_after_the_fork() {
    let (exe, at) = (file(0x5555_0000_0000, 0x5555_0000_0000 + MIB, "/usr/bin/python3.12"), 0x7f00_0000_0000u64);
    let arenas = |n: u64| (0..n).map(move |i| anon(at + i * MIB, at + (i + 1) * MIB, "rw-p"));
    let mut h = History::default();
    h.push_at(1, 1, 10, Change::Exec);
    h.snapshot(1, std::slice::from_ref(&exe), true, 20);
    for (i, r) in arenas(4).enumerate() {
        let gen = 2 + i as u32;
        h.push_at(gen, gen - 1, 30 + i as u64, Change::Map { region: r, flags: 0x22 });
    }
    // An munmap before the fork (at its generation), the fork at time 100,
    // then three munmaps and a read of the maps that shows what is left.
    h.push_at(6, 6, 90, Change::Map { region: anon(at + 8 * MIB, at + 9 * MIB, "rw-p"), flags: 0 });
    h.push_at(6, 6, 95, Change::Unmap { start: at + 8 * MIB, end: at + 9 * MIB });
    for i in 1..4 {
        h.push_at(6, 6, 100 + i, Change::Unmap { start: at + i * MIB, end: at + (i + 1) * MIB });
    }
    h.snapshot(6, &[exe, anon(at, at + MIB, "rw-p")], true, 120);
    let start = crate::regions::place::regions_at(&h, None, (6, 100), &[]);
    let named: Vec<u64> = start.iter().filter(|r| r.kind == RegionKind::PythonArena).map(|r| r.start).collect();
    assert_eq!(named, (0..4).map(|i| at + i * MIB).collect::<Vec<_>>(), "{start:#?}");
    assert!(start.iter().all(|r| r.start != at + 8 * MIB), "unmapped before the fork: {start:#?}");
    // A fork after the last of them starts without them.
    let later = crate::regions::place::regions_at(&h, None, (6, 130), &[]);
    assert_eq!(later.iter().filter(|r| r.kind == RegionKind::PythonArena).count(), 1, "{later:#?}");
}

#[test]
fn a_maps_read_logged_as_what_changed_rebuilds_the_read_whole() {
    let a = vec![anon(MIB, 2 * MIB, "rw-p"), file(4 * MIB, 5 * MIB, "/lib/a.so"), anon(8 * MIB, 9 * MIB, "rw-p")];
    // One region grown, one gone, two new (one where a region was, other perms).
    let b = vec![
        anon(MIB, 3 * MIB, "rw-p"),
        anon(4 * MIB, 5 * MIB, "r--p"),
        file(6 * MIB, 7 * MIB, "/lib/b.so"),
        anon(8 * MIB, 9 * MIB, "rw-p"),
    ];
    for (before, now) in [(&a, &b), (&b, &a), (&a, &a), (&a, &Vec::new()), (&Vec::new(), &b)] {
        let read = MapsRead::since(before, now);
        assert_eq!(&read.rebuild(before), now);
    }
    let MapsRead::Since { gone, new } = MapsRead::since(&a, &b) else { panic!("whole") };
    assert_eq!((&*gone, new.len()), (&[0u32, 1][..], 3), "only what changed is logged");
}

#[test]
fn faults_placed_among_reads_logged_as_changes_land_where_whole_reads_put_them() {
    // Reads that each move one mapping: logged as changes after the first,
    // they place each generation's faults as whole reads would.
    let mut h = History::default();
    let mut whole = History::default();
    let mut granules = Vec::new();
    for gen in 1..6u32 {
        let at = u64::from(gen) * 4 * MIB;
        let maps = vec![anon(MIB, 2 * MIB, "rw-p"), file(at, at + MIB, "/lib/moving.so")];
        h.snapshot(gen, &maps, true, u64::from(gen) * 1000);
        whole.push_at(gen, gen, u64::from(gen) * 1000, Change::Snapshot(MapsRead::Whole(maps)));
        granules.extend(faults(at, at + MIB, gen));
    }
    assert!(h.log.iter().skip(1).all(|l| matches!(&l.change, Change::Snapshot(MapsRead::Since { .. }))));
    let (rows, _) = run(&h, &granules);
    assert_eq!(rows, run(&whole, &granules).0);
    assert!(rows.iter().any(|(r, n)| r.path.as_deref() == Some("/lib/moving.so") && *n > 0), "{rows:?}");
}
