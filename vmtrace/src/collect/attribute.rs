//! Region attribution: the kernel's per-granule fault counts placed in the
//! regions each process had mapped, then summed per file.
use super::{process::ProcessTable, AggregateSource};
use crate::hash::{HashMap, HashSet};
use std::sync::Arc;

use vmtrace_common::{GranuleCounts, GranuleKey};

use crate::{
    procmaps::Region,
    regions::{self, Attributed, PageCache, Partial, ProcessInput},
};

/// Whether `pid` forked a traced child (`parents`), or was forked and did
/// not exec since.
fn shares_after_fork(table: &ProcessTable, parents: &HashSet<u32>, pid: u32) -> bool {
    table.get(pid).is_some_and(|p| p.history.forked_from.is_some() && !p.history.execed()) || parents.contains(&pid)
}

/// The address space `pid` started from: its parent's at the fork, replayed
/// (a chain of forks at most `depth` long). Replays are kept in `starts`:
/// the children a shell forks one after the other start from one replay of
/// the shell's history, not one each (the replays were a tenth of the
/// collector's time beside a shell loop), across the slices and ticks that
/// place them.
fn start_of(table: &ProcessTable, pid: u32, depth: u32, starts: &mut Starts) -> Option<Start> {
    let fork = table.get(pid)?.history.forked_from?;
    let (ppid, gen) = (fork.parent, fork.gen);
    let parent = table.get(ppid)?;
    log::debug!("{pid}: forked from {ppid} at generation {gen}; its history empty: {}", parent.history.is_empty());
    if depth == 0 || parent.history.is_empty() {
        return None;
    }
    // A parent that exec'd before the fork: what it started from is gone.
    let start = if parent.history.first_exec_gen().is_some_and(|e| e <= gen) {
        None
    } else {
        start_of(table, ppid, depth - 1, starts)
    };
    let key = StartKey {
        parent: ppid,
        gen,
        kept: regions::history::kept_at_fork(&parent.history, (gen, fork.at_ns)),
        changes: parent.history.changes(),
        maps: (parent.maps.len(), parent.maps_read),
        from: start.as_ref().map_or(0, |(id, _)| *id),
    };
    if let Some(r) = starts.memo.get(&key) {
        starts.hits += 1;
        return r.clone();
    }
    log::debug!(target: "vmtrace::starts", "replaying {ppid} for {pid}: {key:?}");
    let replayed =
        regions::regions_at(&parent.history, start.as_ref().map(|(_, r)| &**r), (gen, fork.at_ns), &parent.maps);
    if starts.memo.len() >= STARTS_KEPT {
        starts.memo.clear();
    }
    starts.next_id += 1;
    let r = Some((starts.next_id, Arc::from(replayed)));
    starts.memo.insert(key, r.clone());
    r
}

/// What decides a replayed start: the parent, the fork's generation, the
/// parent's entries of that generation the fork keeps, the parent's log and
/// maps as they were (its count of changes, its maps' length and last
/// read), and the start its own replay began from (an id each replay gets;
/// 0 for none, as where the chain was cut at its depth: the depth itself
/// is not, so a parent reached along chains of two lengths is one replay).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct StartKey {
    parent: u32,
    gen: u32,
    kept: Vec<usize>,
    changes: u64,
    maps: (usize, Option<std::time::Instant>),
    from: u64,
}

/// Replays kept at once, at most: a parent's address space is tens of KB,
/// and a loop forks from the same few.
const STARTS_KEPT: usize = 128;

/// A replayed start and the id it was given.
type Start = (u64, Arc<[Region]>);

/// Replayed starts of forked processes, kept between placements.
#[derive(Default)]
pub(crate) struct Starts {
    memo: HashMap<StartKey, Option<Start>>,
    next_id: u64,
    /// Starts found already replayed.
    pub hits: u64,
}

/// Faults per region of the processes `wanted` picks (`top` while running:
/// the live ones, not every process the trace has seen), then per file and
/// tensor; the regions costliest in fault time first.
pub(crate) fn build_regions_of(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    starts: &mut Starts,
    wanted: impl Fn(u32) -> bool,
) -> Attributed {
    let mut partial = Partial::new(weighted_time(source)).with_cow_copies(source.cow_copies_seen());
    let mut granules = source.all_granules();
    granules.retain(|(k, _)| wanted(k.tgid));
    place_into(&mut partial, table, starts, &granules);
    finish(partial, source)
}

/// Whether `source`'s timed faults carry their weights (stratified timing:
/// every slow fault exact, 1 in N fast minor faults weighted), so that fault
/// time is summed as is in every view (`regions::Partial::new`).
pub(crate) fn weighted_time(source: &impl AggregateSource) -> bool {
    source.fast_period() > 1 && source.minor_period() == 1
}

/// Places `granules` in the regions of their processes, into `partial`.
pub(crate) fn place_into(
    partial: &mut Partial,
    table: &mut ProcessTable,
    starts: &mut Starts,
    granules: &[(GranuleKey, GranuleCounts)],
) {
    // Processes whose maps were never read (e.g. with -a) are read now if alive.
    let mut pids: Vec<u32> = granules.iter().map(|(k, _)| k.tgid).collect();
    pids.dedup();
    for pid in pids {
        if table.get(pid).is_none_or(|p| p.maps.is_empty() && !p.retired) {
            table.snapshot_maps(pid);
        }
    }
    let table = &*table;
    let parents: HashSet<u32> = table.iter().filter_map(|(_, p)| p.ppid).collect();
    // The earliest generation each process faulted at.
    let mut first_gen: HashMap<u32, u32> = HashMap::default();
    for (k, _) in granules {
        first_gen.entry(k.tgid).and_modify(|g| *g = (*g).min(k.gen)).or_insert(k.gen);
    }
    partial.add(granules, |pid| {
        table.get(pid).map(|p| ProcessInput {
            history: &p.history,
            // One that exec'd before its first fault never used what it
            // started from: no replay of its parent (most of a shell's
            // children).
            start: match p.history.first_exec_gen() {
                Some(e) if first_gen.get(&pid).is_none_or(|g| *g >= e) => None,
                _ => start_of(table, pid, 16, starts).map(|(_, r)| r),
            },
            final_maps: &p.maps,
            shares_after_fork: shares_after_fork(table, &parents, pid),
        })
    });
}

/// The files and tensors of what `partial` placed, with what the kernel
/// counted of their page cache; the regions costliest in fault time first.
pub(crate) fn finish(partial: Partial, source: &impl AggregateSource) -> Attributed {
    let mut chunks: HashMap<(u32, u64), Vec<(u64, u64)>> = HashMap::default();
    for (k, pages) in source.page_cache_chunks() {
        chunks.entry((k.dev, k.ino)).or_default().push((u64::from(k.chunk), pages));
    }
    let mut a = partial.finish(|path| {
        let (dev, ino, file_bytes) = regions::file_identity(path)?;
        Some(PageCache {
            added: source.page_cache_added(dev, ino).unwrap_or(0),
            written: source.page_cache_written(dev, ino).unwrap_or(0),
            chunks: chunks.get(&(dev, ino)).cloned().unwrap_or_default(),
            file_bytes,
        })
    });
    a.regions.sort_by(regions::table_order);
    a.files.sort_by_key(|f| std::cmp::Reverse(f.faults.time_ns));
    a
}
