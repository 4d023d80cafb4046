//! Places one process's faults (per granule and address-space generation)
//! in its regions by replaying its mapping history (`history.rs`) in
//! generation order alongside them.
use crate::hash::HashMap;

use vmtrace_common::{GranuleCounts, GranuleKey, GEN_UNKNOWN, GRANULE_PAGES, REGION_GRANULE_SHIFT};

use super::{
    history::{self, History},
    replay::{self, Placed, Replay},
    Acc,
};
use crate::{model::RegionKind, procmaps::Region};

/// Faults by how sure their placement is (summary.json `region_placement`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Placement {
    /// In the mapping that covered the address at the fault's generation.
    pub exact: f64,
    /// A mapping change raced the fault or was seen late (a read of
    /// /proc/PID/maps disagreed with the changes seen): the nearest mapping
    /// in time that could serve it.
    pub approximate: f64,
    /// No mapping known at the address: an "[unknown region]" row.
    pub unplaced: f64,
}

impl Placement {
    pub(crate) fn add(&mut self, o: &Placement) {
        self.exact += o.exact;
        self.approximate += o.approximate;
        self.unplaced += o.unplaced;
    }
}

/// Where a row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum RowRef {
    Replay(usize),
    /// A region of the last maps read (no history covers the page).
    Final(usize),
    /// Nothing known: one row per granule.
    Unknown(u64),
}

/// A region with its faults and, for file regions, the file offsets hit.
pub(super) struct PlacedRegion {
    pub region: Region,
    pub acc: Acc,
    /// (granule counts, file offset, share) per file page.
    pub file_hits: Vec<(GranuleCounts, u64, f64)>,
}

/// One process's inputs.
pub(crate) struct ProcessInput<'a> {
    pub history: &'a History,
    /// The address space it started from (its parent's at the fork), if known.
    pub start: Option<std::sync::Arc<[Region]>>,
    /// The last read of its maps (after the recording if it still lived).
    pub final_maps: &'a [Region],
    /// It forked, or was forked and did not exec since: its anonymous pages
    /// may be shared with another process until written.
    pub shares_after_fork: bool,
}

/// Replays `history` up to a fork of its process at generation `gen` and
/// time `at_ns` (CLOCK_MONOTONIC; `history::ordered_until`) from `start`: the
/// parent's address space the child started from. `final_maps`: its last
/// maps read (which CPython it runs, if its maps were not read while it ran).
pub(crate) fn regions_at(
    history: &History,
    start: Option<&[Region]>,
    (gen, at_ns): (u32, u64),
    final_maps: &[Region],
) -> Vec<Region> {
    let arena = python_arena_size(history, start, final_maps);
    let mut r = start.map_or_else(Replay::default, Replay::from_regions).with_python_arenas(arena);
    let log = history::ordered_until(history, Some((gen, at_ns)));
    let mut races = Races::new(&log);
    let unmap_gens = unmap_gens(&log);
    for entry in &log {
        apply_logged(&mut r, &mut races, &unmap_gens, entry);
    }
    r.regions()
}

/// Generations of munmaps: a maps read at one may have been made before it
/// or after (an munmap does not bump the generation).
fn unmap_gens(log: &[(u32, u32, &history::Change)]) -> crate::hash::HashSet<u32> {
    log.iter().filter(|(_, _, c)| matches!(c, history::Change::Unmap { .. })).map(|(g, _, _)| *g).collect()
}

/// Applies one logged change; a maps read made while a change was in flight,
/// or at an munmap's generation, only for backdating (it may show it half done).
fn apply_logged(
    replay: &mut Replay,
    races: &mut Races,
    unmap_gens: &crate::hash::HashSet<u32>,
    (g, _, c): &(u32, u32, &history::Change),
) {
    if races.any_open(*g) || unmap_gens.contains(g) {
        replay.apply_raced(*g, c);
    } else {
        replay.apply(*g, c);
    }
}

/// The obmalloc arena size of the CPython a process runs, from the files it
/// mapped, was started with (a parent's at the fork) or maps at the end.
fn python_arena_size(history: &History, start: Option<&[Region]>, final_maps: &[Region]) -> Option<u64> {
    let start = start.unwrap_or_default();
    super::python::arena_size_in(
        history.file_paths().chain(super::python::paths(start)).chain(super::python::paths(final_maps)),
    )
}

/// Changes whose making spans generations (`[from, gen)`): faults and maps
/// reads at those generations raced them. Queried at nondecreasing
/// generations, so the windows open are kept as a sweep goes.
struct Races {
    /// (from, gen, start, end), by `from`.
    windows: Vec<(u32, u32, u64, u64)>,
    next: usize,
    open: Vec<(u32, u32, u64, u64)>,
    at: u32,
}

impl Races {
    fn new(log: &[(u32, u32, &history::Change)]) -> Self {
        let mut windows: Vec<(u32, u32, u64, u64)> = log
            .iter()
            .filter(|(g, from, _)| from < g)
            .filter_map(|(g, from, c)| history::change_range(c).map(|(a, b)| (*from, *g, a, b)))
            .collect();
        windows.sort_unstable();
        Self { windows, next: 0, open: Vec::new(), at: 0 }
    }

    /// Moves the sweep to `gen` (never back).
    fn advance(&mut self, gen: u32) {
        self.at = self.at.max(gen);
        while self.next < self.windows.len() && self.windows[self.next].0 <= self.at {
            self.open.push(self.windows[self.next]);
            self.next += 1;
        }
        let at = self.at;
        self.open.retain(|w| at < w.1);
    }

    fn any_open(&mut self, gen: u32) -> bool {
        self.advance(gen);
        !self.open.is_empty()
    }

    fn covers(&mut self, addr: u64, gen: u32) -> bool {
        self.advance(gen);
        self.open.iter().any(|w| w.2 <= addr && addr < w.3)
    }
}

/// Rows with their faults and file pages, as pages are placed.
/// What makes two rows the same row: range, permissions, kind, name, offset.
type RowKey = (u64, u64, crate::procmaps::Perms, RegionKind, Option<std::sync::Arc<str>>, u64);

/// A file page hit: its granule's counts, file offset and share of them.
type FileHits = Vec<(GranuleCounts, u64, f64)>;

#[derive(Default)]
struct Rows {
    out: HashMap<RowRef, (Acc, FileHits)>,
    how: Placement,
    /// The generation of the exec of a process forked while traced: before
    /// it, it shared its parent's pages, whatever it became (`/bin/ls` run
    /// by a shell, whose child writes its stack and libc data between the
    /// fork and the exec): its copies then are `Acc::cow_forked`.
    exec_after_fork: Option<u32>,
}

impl Rows {
    /// One page of granule `g` (`n` pages touched, at generation `gen`) in `row`.
    fn add(&mut self, row: RowRef, (g, gen): (&GranuleCounts, u32), n: u64, file_offset: Option<u64>) {
        let share = 1.0 / n as f64;
        let e = self.out.entry(row).or_default();
        e.0.add_share(g, share, 1);
        if self.exec_after_fork.is_some_and(|e| gen < e) {
            e.0.cow_forked += g.cow as f64 * share;
        }
        if let Some(off) = file_offset {
            e.1.push((*g, off, share));
        }
    }
}

fn file_offset(replay: &Replay, row: usize, addr: u64) -> Option<u64> {
    let r = &replay.rows[row].region;
    (r.kind == RegionKind::File).then(|| r.offset + addr.saturating_sub(r.start))
}

/// Places `granules` (all of one process) in its regions.
pub(super) fn place(
    pid: u32,
    granules: &[(GranuleKey, GranuleCounts)],
    input: &ProcessInput<'_>,
) -> (Vec<PlacedRegion>, Placement) {
    let arena = python_arena_size(input.history, input.start.as_deref(), input.final_maps);
    let mut replay =
        input.start.as_deref().map_or_else(Replay::default, Replay::from_regions).with_python_arenas(arena);
    let log = history::ordered(input.history);
    log::debug!(
        "{pid}: {} changes, from {} regions ({} arenas), Python arenas of {arena:?} bytes",
        log.len(),
        input.start.as_deref().map_or(0, <[Region]>::len),
        input.start.iter().flat_map(|s| s.iter()).filter(|r| r.kind == RegionKind::PythonArena).count()
    );
    let mut races = Races::new(&log);
    // A maps read made while a change was in flight may show it half done.
    // An munmap does not bump the generation: a read at the generation of
    // one may have been made before it or after.
    let unmap_gens = unmap_gens(&log);
    let apply = |replay: &mut Replay, races: &mut Races, entry: &(u32, u32, &history::Change)| {
        apply_logged(replay, races, &unmap_gens, entry);
    };
    let mut order: Vec<usize> = (0..granules.len()).collect();
    order.sort_by_key(|&i| granules[i].0.gen);
    let mut next = 0;
    let exec_after_fork = input.history.forked_from.and(input.history.first_exec_gen());
    let mut rows = Rows { exec_after_fork, ..Rows::default() };
    // Pages no mapping held at their generation: (granule, page, gen, epoch).
    let mut pending: Vec<(usize, u64, u32, u32)> = Vec::new();
    for &i in &order {
        let (key, g) = &granules[i];
        let unknown_gen = key.gen == GEN_UNKNOWN;
        let gen = if unknown_gen { u32::MAX - 1 } else { key.gen };
        while next < log.len() && (log[next].0 < gen || (log[next].0 == gen && !history::after_faults(log[next].2))) {
            apply(&mut replay, &mut races, &log[next]);
            next += 1;
        }
        let n = u64::from(g.touched.count_ones()).max(1);
        let share = g.faults as f64 / n as f64;
        for addr in pages(key, g) {
            let Some((row, off)) = replay.find(addr).or_else(|| replay.grown_stack(addr).map(|r| (r, 0))) else {
                pending.push((i, addr, gen, replay.epoch()));
                continue;
            };
            let file = (replay.rows[row].region.kind == RegionKind::File).then_some(off);
            rows.add(RowRef::Replay(row), (g, gen), n, file);
            let late = input.history.truncated_at.is_some_and(|t| gen >= t);
            if unknown_gen || late || races.covers(addr, gen) {
                rows.how.approximate += share;
            } else {
                rows.how.exact += share;
            }
        }
    }
    for entry in &log[next..] {
        apply(&mut replay, &mut races, entry);
    }
    // The last read (after the recording, for a process still alive): its
    // mappings over addresses no change touched since the last exec were
    // there all along.
    replay.backdate(input.final_maps);
    for (i, addr, gen, epoch) in pending {
        place_late(&mut rows, &replay, input, &granules[i], addr, gen, epoch);
    }
    // The same mapping made again at the same place (an allocator churning
    // one size) is one row: thousands of identical rows say nothing more.
    let mut merged: HashMap<RowKey, PlacedRegion> = HashMap::default();
    for (row, (acc, file_hits)) in rows.out {
        let region = match row {
            RowRef::Replay(i) => {
                let r = &replay.rows[i];
                let (kind, path) = replay::label(r);
                Region { kind, path, ..r.region.clone() }
            }
            RowRef::Final(i) => input.final_maps[i].clone(),
            RowRef::Unknown(granule) => unknown(pid, granule),
        };
        let key = (region.start, region.end, region.perms, region.kind, region.path.clone(), region.offset);
        match merged.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let p = e.get_mut();
                p.acc.merge(&acc);
                p.file_hits.extend(file_hits);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(PlacedRegion { region, acc, file_hits });
            }
        }
    }
    let regions = merged.into_values().collect();
    (regions, rows.how)
}

fn pages(key: &GranuleKey, g: &GranuleCounts) -> impl Iterator<Item = u64> {
    let base = key.granule << REGION_GRANULE_SHIFT;
    let touched = g.touched;
    (0..GRANULE_PAGES).filter(move |b| touched & (1 << b) != 0).map(move |b| base + b * 4096)
}

/// A page no mapping held at its generation: one that turned out to be
/// there all along, else the nearest later one, else the last maps read
/// (approximate unless that is all there is), else unknown.
fn place_late(
    rows: &mut Rows,
    replay: &Replay,
    input: &ProcessInput<'_>,
    (key, g): &(GranuleKey, GranuleCounts),
    addr: u64,
    gen: u32,
    epoch: u32,
) {
    let n = u64::from(g.touched.count_ones()).max(1);
    let share = g.faults as f64 / n as f64;
    // A stack grows down with no event: below a stack seen later.
    let grown = || (epoch == replay.epoch()).then(|| replay.grown_stack(addr)).flatten().map(Placed::Exact);
    match replay.later(addr, gen, epoch).or_else(grown) {
        Some(Placed::Exact(row)) => {
            rows.how.exact += share;
            rows.add(RowRef::Replay(row), (g, gen), n, file_offset(replay, row, addr));
        }
        Some(Placed::Approximate(row)) => {
            log::debug!("{addr:#x} (generation {gen}) placed late in {:?}", replay.rows[row].region);
            rows.how.approximate += share;
            rows.add(RowRef::Replay(row), (g, gen), n, file_offset(replay, row, addr));
        }
        None => {
            // Not from the same exec as the last read: its mappings are not this page's.
            let same_exec = epoch == replay.epoch() || input.history.is_empty();
            let maps = input.final_maps;
            let found = maps.partition_point(|r| r.start <= addr).checked_sub(1).filter(|&i| maps[i].contains(addr));
            if let Some(i) = found.filter(|_| same_exec) {
                // Without any history (e.g. -a, a process never read while
                // it ran) the last read is all there is.
                if input.history.is_empty() {
                    rows.how.exact += share;
                } else {
                    rows.how.approximate += share;
                }
                let r = &maps[i];
                let file = (r.kind == RegionKind::File).then(|| r.offset + (addr - r.start));
                rows.add(RowRef::Final(i), (g, gen), n, file);
            } else {
                log::debug!("region of {addr:#x} (generation {gen}, exec {epoch}) unknown");
                rows.how.unplaced += share;
                rows.add(RowRef::Unknown(key.granule), (g, gen), n, None);
            }
        }
    }
}

fn unknown(pid: u32, granule: u64) -> Region {
    let start = granule << REGION_GRANULE_SHIFT;
    Region {
        start,
        end: start + (1 << REGION_GRANULE_SHIFT),
        perms: "----".into(),
        offset: 0,
        kind: crate::model::RegionKind::Other,
        path: Some(format!("[unknown region of {pid}]").into()),
    }
}
