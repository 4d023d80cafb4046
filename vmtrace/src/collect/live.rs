//! The live snapshot (`model::LiveSnapshot`) read from a running session:
//! the one place the stream, `top` and `serve` get their counts from.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use vmtrace_common::{FaultStats, MmStats};

use super::{AggregateSource, Session};
use crate::model::{Identity, LiveProcess, LiveSnapshot};

/// Which processes a snapshot covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveScope {
    /// Those still in the kernel's maps (the stream, `top`).
    Running,
    /// Every process of the trace so far, exited ones included (`serve`,
    /// whose counters may only grow).
    WholeTrace,
}

impl<S: AggregateSource> Session<S> {
    /// Every covered process's counters now, named as the process table knows
    /// them (see [`Session::name_processes`] for the others).
    pub fn live_snapshot(&mut self, scope: LiveScope) -> LiveSnapshot {
        let (stats, mm): (Vec<(u32, FaultStats)>, HashMap<u32, MmStats>) = match scope {
            LiveScope::Running => (
                self.source.all_stats(),
                if self.opts.families.tlb { self.source.all_mm().into_iter().collect() } else { HashMap::default() },
            ),
            LiveScope::WholeTrace => {
                let mut stats: BTreeMap<u32, FaultStats> = self.stats_totals();
                let mut mm = self.mm_totals();
                // The processes folded away, as one (`serve` releases
                // exited processes so: `Session::release_exited`).
                // The kernel's own tgid 0 (the idle task's TLB counts) adds in.
                if let Some((st, m)) = self.folded.counters() {
                    use vmtrace_common::Merge as _;
                    stats.entry(crate::model::fold::OTHER_PID).or_default().merge(st);
                    mm.entry(crate::model::fold::OTHER_PID).or_default().merge(m);
                }
                (stats.into_iter().collect(), mm.into_iter().collect())
            }
        };
        let mut pids: Vec<u32> = stats.iter().map(|(p, _)| *p).collect();
        let mut processes: Vec<LiveProcess> = stats
            .iter()
            .map(|(pid, s)| {
                LiveProcess::from_counters(*pid, known_comm(&self.table, *pid), s, mm.get(pid), self.minor_period)
            })
            .collect();
        if scope == LiveScope::WholeTrace {
            // A process with mmap/TLB counts and no fault yet still has a series.
            pids.sort_unstable();
            for (pid, m) in &mm {
                if pids.binary_search(pid).is_err() {
                    let comm = known_comm(&self.table, *pid);
                    processes.push(LiveProcess::from_counters(*pid, comm, &FaultStats::default(), Some(m), 0));
                }
            }
            processes.sort_by_key(|p| p.pid);
        }
        // The events that came before these counts, applied before they are
        // labelled: a process that moved into a cgroup and exec'd (a pod's
        // entrypoint) has its faults since counted above, and its exec, which
        // re-reads its identity, waits in the ring until now. Labelled with the
        // identity it had before, they would stay in its old cgroup's series.
        // A process this drain forgets (`top -a` forgets the exited) keeps
        // what the table knew of it: read from /proc again, it would come
        // back as an entry nothing removes.
        let known: HashMap<u32, Option<Arc<Identity>>> =
            processes.iter().filter_map(|p| Some((p.pid, self.table.get(p.pid)?.identity.clone()))).collect();
        self.drain();
        for p in &mut processes {
            match (self.table.get(p.pid), known.get(&p.pid)) {
                (None, Some(before)) => {
                    p.identity.clone_from(before);
                    p.exited = true;
                    continue;
                }
                (Some(info), _) if !info.comm.is_empty() => p.comm = Some(info.comm.clone()),
                _ => {}
            }
            p.identity = self.table.identify(p.pid);
            p.exited = self.table.get(p.pid).is_some_and(|i| i.exited);
            if p.pid == crate::model::fold::OTHER_PID && self.folded.counters().is_some() {
                p.comm = Some("other".into());
                p.exited = true;
            }
        }
        self.fresh_resident_counters();
        if let Some(r) = self.resident.as_ref() {
            for p in &mut processes {
                p.resident = r.kernel_of(p.pid).map(|m| crate::model::LiveResident::from_kernel(&m));
            }
        }
        let (all_faults, all_major) = self.source.totals();
        LiveSnapshot {
            t_s: self.started.elapsed().as_secs_f64(),
            processes,
            all_faults,
            all_major,
            drops: self.drop_counts(),
            oom_kills: self.flight.ooms().len(),
        }
    }

    /// Names each live process as `/proc/PID/comm` does now
    /// (`ProcessTable::rename_live`), when `every` has passed since the last
    /// time: the live views (`serve`, `top`) call it on each refresh, and
    /// `record` once at the end (`Duration::ZERO`).
    pub fn rename_live(&mut self, every: std::time::Duration) {
        if self.last_names.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.drain();
        let n = self.table.rename_live();
        if n > 0 {
            log::debug!("{n} live process(es) renamed since their fork or exec");
        }
        self.last_names = Some(std::time::Instant::now());
    }

    /// Names the processes of `snap` that `wanted` picks through the process
    /// table, reading /proc for those the trace has not seen start (once: the
    /// table keeps them).
    pub fn name_processes(&mut self, snap: &mut LiveSnapshot, wanted: impl Fn(u32) -> bool) {
        for p in &mut snap.processes {
            if wanted(p.pid) {
                p.comm = Some(self.table.ensure(p.pid).comm.clone());
            }
        }
    }

    /// Each running process's resident memory by call site now: its sampled
    /// pages, scaled kind by kind to the kernel's counters of this moment
    /// (read afresh), as a recording's `resident.folded` is at a process's
    /// end. Weights (`estimate.faults`) are bytes. Empty without stacks or
    /// resident memory.
    pub fn live_resident(&mut self) -> Vec<crate::stacks::Stack> {
        if self.opts.stacks.is_none() || self.resident.is_none() {
            return Vec::new();
        }
        self.drain();
        self.fresh_resident_counters();
        let Some(r) = self.resident.as_ref() else { return Vec::new() };
        let snaps = r.live_snapshots(crate::kernel::monotonic_ns());
        let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
        let comms: HashMap<u32, String> = snaps
            .iter()
            .map(|(p, _)| *p)
            .collect::<Vec<_>>()
            .into_iter()
            .map(|p| (p, known_comm(table, p).unwrap_or_else(|| table.ensure(p).comm.clone())))
            .collect();
        let syms = &mut self.syms;
        let mut symbolize = |raw| crate::collect::symbols::symbolize_owner_counts(raw, table, source, native, py, syms);
        let comm_of = |pid: u32| comms.get(&pid).cloned().unwrap_or_default();
        let refs: Vec<(u32, &crate::collect::resident::Snapshot)> = snaps.iter().map(|(p, s)| (*p, s)).collect();
        crate::collect::resident::profile(&refs, self.leaf_seen, &mut symbolize, &comm_of)
    }

    /// The fault stacks of the whole trace so far, symbolized and weighted
    /// to each process's totals as a recording's flamegraphs are (so they add
    /// up to the same counts `live_snapshot` gives), and the mmap-family call
    /// sites with the IPIs they sent: what `serve`'s profiles are made of.
    /// Empty without stacks.
    pub fn live_stacks(&mut self) -> (Vec<crate::stacks::Stack>, Vec<crate::model::MmSite>) {
        if self.opts.stacks.is_none() {
            return (Vec::new(), Vec::new());
        }
        let (native, py) = (&self.native, &self.python.codes);
        let mut stacks = super::symbols::build_stacks(&mut self.table, &self.source, native, py, &mut self.syms);
        let table = &mut self.table;
        stacks.extend(self.syms.sealed_stacks(|_| true, &mut |pid| table.ensure(pid).comm.clone()));
        let totals = self
            .stats_totals()
            .iter()
            .map(|(pid, s)| {
                let f = crate::model::Faults::from_stats(s, self.minor_period);
                (*pid, crate::stacks::weight::Totals::of(&f))
            })
            .collect();
        let table = &self.table;
        let comm_of = |pid: u32| table.get(pid).map_or_else(String::new, |p| p.comm.clone());
        crate::stacks::weight::weigh(&mut stacks, &totals, &comm_of);
        // Those of the processes folded away, weighed already: under a pid
        // per identity kept (`folded_identity`), so that the profiles keep
        // their cgroup and rank.
        let (folded_stacks, folded_sites) = self.folded.by_identity();
        stacks.extend(folded_stacks);
        let sites = if self.opts.families.mmap {
            // Released processes' call sites left the kernel's map.
            let mut raw = self.source.all_mm_stacks();
            raw.extend(self.retired_mm.iter().copied());
            let mut sites =
                super::symbols::build_mm_sites(raw, &mut self.table, &self.source, native, py, &mut self.syms);
            // Live processes' settled call sites, out of the kernel's map.
            let table = &mut self.table;
            sites.extend(self.syms.sealed_sites(|_| true, &mut |pid| table.ensure(pid).comm.clone()));
            sites.extend(folded_sites);
            sites
        } else {
            Vec::new()
        };
        (stacks, sites)
    }
}

impl<S: AggregateSource> Session<S> {
    /// The identity of a pid [`Session::live_stacks`] gave the stacks and
    /// call sites of folded processes (`collect::folded::FOLDED_IDENTITY_PIDS`).
    pub fn folded_identity(&self, pid: u32) -> Option<Arc<Identity>> {
        self.folded.identity_of(pid).cloned()
    }
}

/// `pid`'s name, `None` while unknown: an entry made by an event of a
/// process that started before the trace (a mapping change, a fault) has
/// no name until /proc is read (uc30: `serve` labelled every such process
/// `comm=""`, as it names from /proc only the unnamed).
pub(crate) fn known_comm(table: &crate::collect::process::ProcessTable, pid: u32) -> Option<String> {
    table.get(pid).map(|p| p.comm.clone()).filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_entry_made_before_its_name_was_read_has_no_name_yet() {
        let mut t = crate::collect::process::ProcessTable::default();
        // A mapping change or a fault of a process that predates the trace
        // makes its entry with an empty name.
        t.set_parent(77, 1);
        assert_eq!(super::known_comm(&t, 77), None, "unknown, so serve reads it from /proc");
        assert_eq!(super::known_comm(&t, 78), None);
        let me = std::process::id();
        let _ = t.ensure(me);
        assert!(super::known_comm(&t, me).is_some_and(|c| !c.is_empty()));
    }
}
