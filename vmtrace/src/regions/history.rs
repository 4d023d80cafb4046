//! A process's address space through time. The kernel stamps every fault
//! with its process's address-space generation (bumped when a mapping change
//! enters and when it returns, and at exec; `vmtrace-ebpf/src/mapgen.rs`) and
//! streams every change with its generations. Here the changes and the reads
//! of `/proc/PID/maps` are logged while recording, then replayed in
//! generation order to place each fault in the mapping that covered its
//! address when it happened (`Replay::place`).
//!
//! Rows are what the region table shows: one per (mapping, permissions),
//! where a mapping is what one mmap (or exec, or brk for the heap) created;
//! mprotect moves pages between the rows of their mapping, and a new mapping
//! at reused addresses is a new row.
use crate::hash::HashMap;

use crate::procmaps::Region;

const PAGE: u64 = 4096;

/// `v` rounded up to a page boundary (saturating at the top of the space).
pub(super) fn page_up(v: u64) -> u64 {
    v.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// A maps read as logged: whole, or what changed since the read logged
/// before it (the process's reads are replayed in the order they were
/// logged, from its first, which is whole). A long-running process's maps
/// are read every second and differ by a mapping or two: logged whole,
/// each read copied the whole map (~200 regions), and a busy process's log
/// grew by megabytes a minute.
#[derive(Clone, Debug)]
pub enum MapsRead {
    Whole(Vec<Region>),
    /// The regions of the read before that are gone (their indices, in
    /// order), and the new ones (by start).
    Since {
        gone: Box<[u32]>,
        new: Box<[Region]>,
    },
}

impl MapsRead {
    /// `now` as logged after `before` (both sorted by start, as the kernel lists them).
    pub fn since(before: &[Region], now: &[Region]) -> Self {
        let (mut i, mut j) = (0, 0);
        let (mut gone, mut new) = (Vec::new(), Vec::new());
        while i < before.len() || j < now.len() {
            match (before.get(i), now.get(j)) {
                (Some(b), Some(n)) if b == n => (i, j) = (i + 1, j + 1),
                (Some(b), Some(n)) if b.start < n.start => (gone.push(i as u32), i += 1).1,
                (Some(b), Some(n)) if n.start < b.start => (new.push(n.clone()), j += 1).1,
                (Some(_), Some(n)) => {
                    gone.push(i as u32);
                    new.push(n.clone());
                    (i, j) = (i + 1, j + 1);
                }
                (Some(_), None) => (gone.push(i as u32), i += 1).1,
                (None, Some(n)) => (new.push(n.clone()), j += 1).1,
                (None, None) => unreachable!(),
            }
        }
        Self::Since { gone: gone.into(), new: new.into() }
    }

    /// The whole read, given the read logged before it.
    pub fn rebuild(&self, before: &[Region]) -> Vec<Region> {
        match self {
            Self::Whole(v) => v.clone(),
            Self::Since { gone, new } => {
                let mut gone = gone.iter().peekable();
                let kept = before.iter().enumerate().filter(|(i, _)| {
                    let g = gone.peek().is_some_and(|g| **g as usize == *i);
                    if g {
                        gone.next();
                    }
                    !g
                });
                let mut out: Vec<Region> = kept.map(|(_, r)| r.clone()).collect();
                out.extend(new.iter().cloned());
                out.sort_by_key(|r| r.start);
                out
            }
        }
    }

    /// The regions it holds (the new ones of a `Since`).
    pub fn regions(&self) -> &[Region] {
        match self {
            Self::Whole(v) => v,
            Self::Since { new, .. } => new,
        }
    }
}

/// One logged change, taking effect at `gen`.
#[derive(Clone, Debug)]
pub enum Change {
    /// A new mapping over `region`'s range, replacing what was there.
    Map {
        region: Region,
        flags: u64,
    },
    Unmap {
        start: u64,
        end: u64,
    },
    /// `perms`: "rwx" flags only; private/shared stays the mapping's.
    Protect {
        start: u64,
        end: u64,
        perms: String,
    },
    Remap {
        old_start: u64,
        old_len: u64,
        new_start: u64,
        new_len: u64,
    },
    /// The break after a brk call.
    Brk {
        brk: u64,
    },
    /// execve: a new, empty address space.
    Exec,
    /// A read of /proc/PID/maps while tracing, with no change in flight.
    Snapshot(MapsRead),
    /// A read that raced a change: only its mappings over addresses no
    /// change touched since the exec are used (they were there all along).
    Backdate(MapsRead),
    /// An munmap whose mapping was made again as it was (see `History::push`).
    Nothing,
}

#[derive(Clone, Debug)]
struct Logged {
    /// The generation from which it is in effect.
    gen: u32,
    /// Faults at `[race_from, gen)` ran while it was being made.
    race_from: u32,
    /// CLOCK_MONOTONIC when it was done (an mm call's return, the end of a
    /// maps read; 0 if unknown): a fork at its generation came before or
    /// after it (see `Fork`).
    at_ns: u64,
    change: Change,
}

/// Where a forked process's address space came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fork {
    pub parent: u32,
    /// The parent's generation at the fork.
    pub gen: u32,
    /// CLOCK_MONOTONIC of the fork (`sched_process_fork`, after the
    /// address space was copied). An munmap does not bump the generation,
    /// nor does a change with no fault since the last bump: what the parent
    /// logs at the fork's generation may come after the fork (a Python
    /// parent freeing its arenas at exit), and is told apart by its time.
    pub at_ns: u64,
}

/// Logged mapping changes of one process.
#[derive(Clone, Debug, Default)]
pub struct History {
    log: Vec<Logged>,
    pub forked_from: Option<Fork>,
    /// The last maps read logged, its generation and time: the next is
    /// logged as what changed since (`MapsRead::Since`).
    last_snapshot: Option<(Vec<Region>, u32, u64)>,
    /// The generation of the first change not logged (the log was full):
    /// faults from it on are placed approximately.
    pub truncated_at: Option<u32>,
    /// The last mapping made at each start address, and the munmap that
    /// removed it (its generation and log index), to see it made again.
    last_map: HashMap<u64, (Region, u64)>,
    unmapped: HashMap<u64, (u64, u32, usize)>,
    /// Changes pushed so far (a replay of the log is kept while it is
    /// unchanged: `collect::attribute`).
    changes: u64,
}

/// Entries kept per process (~100 bytes each): a process that changes its
/// mappings hundreds of thousands of times keeps the first ones; faults after
/// are placed in the address space as last logged, counted approximate.
const LOG_CAP: usize = 100_000;

impl History {
    /// An munmap and an mmap that makes the same mapping again at the same
    /// generation (the kernel does not bump it for that: an allocator
    /// churning one size) are dropped: placing faults in the old mapping or
    /// the new one gives the same row, and the log stays small.
    pub fn push(&mut self, gen: u32, race_from: u32, change: Change) {
        self.push_at(gen, race_from, 0, change);
    }

    /// `push` of a change done at `at_ns` (CLOCK_MONOTONIC).
    pub fn push_at(&mut self, gen: u32, race_from: u32, at_ns: u64, change: Change) {
        self.changes += 1;
        match &change {
            Change::Map { region, flags } => {
                if let Some(&(end, at, i)) = self.unmapped.get(&region.start) {
                    let same = self.last_map.get(&region.start).is_some_and(|(r, f)| r == region && f == flags);
                    let logged = self.log.get(i).is_some_and(
                        |l| matches!(l.change, Change::Unmap { start, end: e } if start == region.start && e == end),
                    );
                    if same && end == region.end && at == gen && logged {
                        self.log[i].change = Change::Nothing;
                        self.unmapped.remove(&region.start);
                        while self.log.last().is_some_and(|l| matches!(l.change, Change::Nothing)) {
                            self.log.pop();
                        }
                        return;
                    }
                }
                self.unmapped.remove(&region.start);
                self.last_map.insert(region.start, (region.clone(), *flags));
            }
            Change::Unmap { start, end } if self.last_map.get(start).is_some_and(|(r, _)| r.end == *end) => {
                self.unmapped.insert(*start, (*end, gen, self.log.len()));
            }
            _ => {}
        }
        if self.log.len() < LOG_CAP && self.truncated_at.is_none() {
            self.log.push(Logged { gen, race_from, at_ns, change });
        } else {
            self.truncated_at.get_or_insert(race_from);
        }
    }

    /// Logs a maps read made at `gen`, unless the maps did not change since
    /// the last one (a long-running process is read every second).
    /// `settled`: no change was in flight (the generation before and after
    /// the read was `gen`); else `gen` is the one after.
    /// `at_ns`: CLOCK_MONOTONIC when the read was done.
    pub fn snapshot(&mut self, gen: u32, maps: &[Region], settled: bool, at_ns: u64) {
        let read = match &self.last_snapshot {
            Some((last, ..)) if last.as_slice() == maps => return,
            // Replayed in the order logged (by generation, then time): a
            // read that would sort before the last one is logged whole.
            Some((last, g, t)) if gen >= *g && at_ns >= *t && at_ns != 0 => MapsRead::since(last, maps),
            _ => MapsRead::Whole(maps.to_vec()),
        };
        self.last_snapshot = Some((maps.to_vec(), gen, at_ns));
        let change = if settled { Change::Snapshot(read) } else { Change::Backdate(read) };
        self.push_at(gen, gen, at_ns, change);
    }

    pub fn is_empty(&self) -> bool {
        self.log.is_empty()
    }

    /// Entries logged, and the regions they hold (a maps read holds them
    /// all): to measure what a live process's log weighs.
    pub fn weight(&self) -> (usize, usize) {
        let regions = |l: &Logged| match &l.change {
            Change::Snapshot(r) | Change::Backdate(r) => r.regions().len(),
            _ => 1,
        };
        (self.log.len(), self.log.iter().map(regions).sum::<usize>())
    }

    /// How many changes were pushed (each one may change the log).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Its process has exited: no change comes any more, so what only
    /// folds later ones (the last mapping at each address, the munmaps that
    /// may be undone, the last maps read) goes; the log is kept whole.
    pub fn retire(&mut self) {
        self.last_map = HashMap::default();
        self.unmapped = HashMap::default();
        self.last_snapshot = None;
        self.log.shrink_to_fit();
    }

    /// Its faults are placed: the log goes (`forked_from` stays).
    pub fn forget_log(&mut self) {
        self.retire();
        self.log = Vec::new();
        self.changes += 1;
    }

    /// The paths of the files it mapped (mmaps and maps reads).
    pub fn file_paths(&self) -> impl Iterator<Item = &str> {
        self.log.iter().flat_map(|l| {
            let regions: &[Region] = match &l.change {
                Change::Map { region, .. } => std::slice::from_ref(region),
                Change::Snapshot(r) | Change::Backdate(r) => r.regions(),
                _ => &[],
            };
            super::python::paths(regions)
        })
    }

    /// The generation its first exec while traced began (faults from it on
    /// are in the exec'd program's address space, whatever it started from).
    pub fn first_exec_gen(&self) -> Option<u32> {
        self.log.iter().filter(|l| matches!(l.change, Change::Exec)).map(|l| l.gen).min()
    }

    /// Whether it exec'd while traced.
    pub fn execed(&self) -> bool {
        self.log.iter().any(|l| matches!(l.change, Change::Exec))
    }
}

/// The log in replay order: by generation; within one, the changes the
/// generation began with, then (`after_faults`) munmaps, which do not bump
/// it, and maps reads.
pub(crate) fn ordered(h: &History) -> Vec<(u32, u32, &Change)> {
    ordered_until(h, None)
}

/// `ordered` up to a fork of the process (`fork.gen` and `fork.at_ns`,
/// CLOCK_MONOTONIC): the changes of earlier generations, and those of the
/// fork's own done before it. Changes that do not bump the generation
/// (munmaps, a change with no fault since the last bump) and maps reads
/// share it with the fork whether they came before or after, and only
/// their time tells: an munmap's return (or a read's end) before the fork
/// is in the child's address space, one after is not. A change of unknown
/// time (0) is taken as before.
pub(crate) fn ordered_until(h: &History, fork: Option<(u32, u64)>) -> Vec<(u32, u32, &Change)> {
    let keep = |l: &Logged| fork.is_none_or(|(gen, at)| l.gen < gen || (l.gen == gen && l.at_ns <= at));
    let mut v: Vec<(u32, u32, &Change)> =
        h.log.iter().filter(|l| keep(l)).map(|l| (l.gen, l.race_from, &l.change)).collect();
    let class = |c: &Change| match c {
        Change::Unmap { .. } => 1,
        Change::Snapshot(_) | Change::Backdate(_) => 2,
        _ => 0,
    };
    v.sort_by_key(|(g, _, c)| (*g, class(c)));
    v
}

/// What of `h`'s log a fork at `fork` (generation, time) keeps beyond every
/// entry of an earlier generation: the indices of its generation's entries
/// it keeps. With the generation, it decides [`ordered_until`]'s result, so
/// the children a parent forks between two changes share one replay.
pub(crate) fn kept_at_fork(h: &History, (gen, at): (u32, u64)) -> Vec<usize> {
    h.log.iter().enumerate().filter(|(_, l)| l.gen == gen && l.at_ns <= at).map(|(i, _)| i).collect()
}

/// Applied after the faults counted at its generation: an munmap (the
/// kernel does not bump the generation for it: nothing can fault in what
/// it removed) and a maps read (faults of its generation may precede it).
pub(crate) fn after_faults(c: &Change) -> bool {
    matches!(c, Change::Unmap { .. } | Change::Snapshot(_) | Change::Backdate(_))
}

/// The address range a change touches, for faults that raced it.
pub(crate) fn change_range(c: &Change) -> Option<(u64, u64)> {
    match c {
        Change::Map { region, .. } => Some((region.start, page_up(region.end))),
        Change::Unmap { start, end } | Change::Protect { start, end, .. } => Some((*start, page_up(*end))),
        Change::Remap { old_start, old_len, new_start, new_len } => {
            let (a, b) = (*old_start.min(new_start), page_up((old_start + old_len).max(new_start + new_len)));
            Some((a, b))
        }
        Change::Brk { .. } | Change::Exec | Change::Snapshot(_) | Change::Backdate(_) | Change::Nothing => None,
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
