//! Where memory sits: locked and pinned memory (`pinned.rs`) and NUMA
//! placement (`crate::numa`), fed by the session from its events and ticks
//! and turned into summary.json's `pinned` and `numa` at the end (and, with
//! the Perfetto trace, the pages per node of each numa_maps read).
use std::time::Instant;

use vmtrace_common::{MmLockEvent, PageSample};

use super::pinned::PinnedTracker;
use crate::{
    model::{trace::TraceLog, Summary},
    numa::{self, NumaTracker, Topology},
};

/// The trackers a recording runs; `None` where its family is off or the
/// host has one NUMA node.
pub(crate) struct Placement {
    pinned: Option<PinnedTracker>,
    topo: Topology,
    numa: Option<NumaTracker>,
}

impl Placement {
    /// Locked memory with `--events mmap`; NUMA on hosts with two nodes or
    /// more, each of its reads kept for the trace when `trace_log`.
    pub(crate) fn new(mmap: bool, trace_log: bool) -> Self {
        let topo = Topology::read();
        let mut numa = NumaTracker::new(topo.clone());
        if let (Some(n), true) = (numa.as_mut(), trace_log) {
            n.log_points();
        }
        Self { pinned: mmap.then(PinnedTracker::default), numa, topo }
    }

    pub(crate) fn lock(&mut self, ev: &MmLockEvent) {
        if let Some(p) = self.pinned.as_mut() {
            p.call(ev);
        }
    }

    /// After a drain: the processes whose locking calls it held
    /// (`NumaTracker::locked`), once each, after all of their calls in it
    /// (an mlock and a MAP_LOCKED mmap in a row are read together).
    pub(crate) fn locked(&mut self, pids: &[u32], now: Instant) {
        if let Some(n) = self.numa.as_mut() {
            for &pid in pids {
                n.locked(pid, now);
            }
        }
    }

    /// The user stack ids NUMA placement will name at the end.
    pub(crate) fn numa_stack_ids(&self) -> Vec<u32> {
        self.numa.as_ref().map(NumaTracker::stack_ids).unwrap_or_default()
    }

    /// Every user stack id the trackers will name at the end: NUMA
    /// placement's and the locking call sites'.
    pub(crate) fn stack_ids(&self) -> Vec<u32> {
        let mut ids = self.numa_stack_ids();
        ids.extend(self.pinned.iter().flat_map(PinnedTracker::stack_ids));
        ids
    }

    pub(crate) fn page(&mut self, ev: &PageSample) {
        if let Some(n) = self.numa.as_mut() {
            n.page(ev);
        }
    }

    /// Every housekeeping tick, with the live traced processes.
    pub(crate) fn tick(&mut self, now: Instant, live: &[u32]) {
        if let Some(p) = self.pinned.as_mut() {
            p.tick(now, live);
        }
        if let Some(n) = self.numa.as_mut() {
            n.tick(now, live);
        }
    }

    /// Fills `summary.pinned` and `summary.numa`, and `trace.nodes` (the
    /// last reads included; those the bound left out are counted in
    /// `drops.trace_events`).
    pub(crate) fn finish(
        mut self,
        summary: &mut Summary,
        trace: Option<&mut TraceLog>,
        (started, live): (Instant, &[u32]),
        comm_of: &dyn Fn(u32) -> String,
        frames: &mut dyn FnMut(u32, u32, i32) -> Vec<String>,
        since: &dyn Fn(u64) -> f64,
    ) {
        let now = Instant::now();
        if let Some(mut p) = self.pinned.take() {
            // The last read, forced: a process that locked and still lives.
            p.read_all(live);
            summary.pinned = Some(p.finish(comm_of, frames, since));
        }
        summary.numa = Some(match self.numa.take() {
            Some(mut n) => {
                for &pid in live {
                    n.read_maps(pid, now);
                }
                let (points, dropped) = n.take_points();
                if let Some(t) = trace {
                    t.nodes = points;
                    t.dropped += dropped;
                    summary.drops.trace_events += dropped;
                }
                // A call site's frames end with its call ("[mmap]"); a
                // fault's stack has none.
                let mut fault_frames = |pid: u32, stack: i32| {
                    let mut f = frames(pid, u32::MAX, stack);
                    f.pop();
                    f
                };
                n.finish(started, comm_of, &mut fault_frames)
            }
            None => numa::one_node(&self.topo),
        });
    }
}
