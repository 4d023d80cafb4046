//! The event log of `record --perfetto`: streamed events as they arrive, and
//! each process's counters every collector interval (100 ms), as growth
//! since the last one. Bounded per kind ([`TraceLog::MAX_PER_KIND`]).
use std::collections::HashMap;

use vmtrace_common::{EventKind, FaultMajorEvent, MmEvent, MmStats, TaskEvent, MM_CALLS, MM_CALL_NAMES};

use super::{
    process::{ProcInfo, ProcessTable},
    symbols, AggregateSource,
};
use crate::model::{
    comm_str,
    trace::{CounterPoint, CpuPoint, MajorFault, MmChange, TaskKind, TaskMark, TraceLog},
    Cum, LiveProcess,
};
use crate::{
    python::CodeCache,
    stacks::{native::NativeStacks, symbolize::Names},
};

/// A major fault whose stack is named at the end (names need the maps).
pub(crate) struct PendingMajor {
    pub fault: MajorFault,
    pub user_stack: i32,
}

#[derive(Default)]
pub(crate) struct TraceRecorder {
    pub log: TraceLog,
    pub majors: Vec<PendingMajor>,
    /// Counters of each process at the last interval.
    last: HashMap<u32, Cum>,
    /// Shootdowns received per CPU at the last interval.
    last_cpu: Vec<u64>,
    last_ts_ns: u64,
}

impl TraceRecorder {
    pub(crate) fn new(start_ns: u64) -> Self {
        Self { log: TraceLog { start_ns, ..TraceLog::default() }, last_ts_ns: start_ns, ..Self::default() }
    }

    /// Restarts the clock (the trace proper starts now); what was seen
    /// before stays (the counters count from the attach, as summary.json's).
    pub(crate) fn restart(&mut self, start_ns: u64) {
        self.log.start_ns = start_ns;
        self.last_ts_ns = start_ns;
    }

    pub(crate) fn task(&mut self, ev: &TaskEvent, kind: TaskKind) {
        let mark = TaskMark {
            ts_ns: ev.hdr.ts_ns,
            kind,
            tid: ev.pid,
            tgid: ev.tgid,
            ppid: ev.ppid,
            comm: comm_str(&ev.comm),
            group_dead: ev.group_dead != 0,
            exit_code: ev.exit_code,
        };
        TraceLog::push(&mut self.log.tasks, &mut self.log.dropped, mark, TraceLog::MAX_PER_KIND);
    }

    pub(crate) fn mm_change(&mut self, ev: &MmEvent) {
        let change = MmChange {
            // A record from before this field existed has no start: a point.
            ts_ns: if ev.start_ns == 0 { ev.hdr.ts_ns } else { ev.start_ns },
            dur_ns: if ev.start_ns == 0 { 0 } else { ev.hdr.ts_ns.saturating_sub(ev.start_ns) },
            tgid: ev.tgid,
            tid: ev.tid,
            call: MM_CALL_NAMES.get(ev.call as usize).copied().unwrap_or("?"),
            addr: ev.addr,
            len: ev.len,
        };
        TraceLog::push(&mut self.log.mm_changes, &mut self.log.dropped, change, TraceLog::MAX_PER_KIND);
    }

    pub(crate) fn major(&mut self, ev: &FaultMajorEvent) {
        let fault = MajorFault {
            ts_ns: ev.hdr.ts_ns,
            dur_ns: ev.duration_ns,
            tgid: ev.tgid,
            tid: ev.tid,
            addr: ev.addr,
            stack: Vec::new(),
        };
        let pending = PendingMajor { fault, user_stack: ev.user_stack };
        TraceLog::push(&mut self.majors, &mut self.log.dropped, pending, TraceLog::MAX_PER_KIND);
    }

    /// One interval ending at `now_ns`: each process's growth since the last.
    /// `procs` are the live ones' counters plus any that exited since (their
    /// final counts), so an exit between two intervals loses nothing.
    pub(crate) fn interval(&mut self, now_ns: u64, procs: &[LiveProcess], received_per_cpu: &[u64]) {
        let (ts_ns, dur_ns) = (self.last_ts_ns, now_ns.saturating_sub(self.last_ts_ns));
        if dur_ns == 0 {
            return;
        }
        self.last_ts_ns = now_ns;
        for p in procs {
            let now = p.cum();
            let before = self.last.insert(p.pid, now).unwrap_or_default();
            let delta = grown(&before, &now);
            if delta != Cum::default() {
                let point = CounterPoint { ts_ns, dur_ns, pid: p.pid, delta };
                TraceLog::push(&mut self.log.counters, &mut self.log.dropped, point, TraceLog::MAX_COUNTERS);
            }
        }
        self.last_cpu.resize(received_per_cpu.len().max(self.last_cpu.len()), 0);
        for (cpu, (&now, last)) in received_per_cpu.iter().zip(self.last_cpu.iter_mut()).enumerate() {
            // An exited process takes its entry (and its per-CPU split) with it:
            // a total that went down counts from there.
            let received = now.saturating_sub(*last);
            *last = now;
            if received > 0 {
                let point = CpuPoint { ts_ns, dur_ns, cpu: cpu as u32, received };
                TraceLog::push(&mut self.log.cpu_ipis, &mut self.log.dropped, point, TraceLog::MAX_PER_KIND);
            }
        }
    }

    /// A process that exited: its counters are final; a pid reused later counts anew.
    pub(crate) fn exited(&mut self, now_ns: u64, final_counts: &LiveProcess) {
        let before = self.last.remove(&final_counts.pid).unwrap_or_default();
        let delta = grown(&before, &final_counts.cum());
        if delta != Cum::default() {
            let ts_ns = self.last_ts_ns.min(now_ns);
            let point =
                CounterPoint { ts_ns, dur_ns: now_ns.saturating_sub(ts_ns).max(1), pid: final_counts.pid, delta };
            TraceLog::push(&mut self.log.counters, &mut self.log.dropped, point, TraceLog::MAX_COUNTERS);
        }
    }
}

/// Growth of each counter; one that went backwards (a reused pid) counts from zero.
fn grown(before: &Cum, now: &Cum) -> Cum {
    let d = |a: u64, b: u64| if a >= b { a - b } else { a };
    Cum {
        faults: d(now.faults, before.faults),
        major: d(now.major, before.major),
        cow: d(now.cow, before.cow),
        time_ns: d(now.time_ns, before.time_ns),
        munmap: d(now.munmap, before.munmap),
        ipis: d(now.ipis, before.ipis),
    }
}

/// The log's kind of a task event (`None`: not a task event).
pub(crate) fn task_kind(kind: u32) -> Option<TaskKind> {
    match EventKind::from_u32(kind)? {
        EventKind::TaskFork => Some(TaskKind::Fork),
        EventKind::TaskExec => Some(TaskKind::Exec),
        EventKind::TaskExit => Some(TaskKind::Exit),
        _ => None,
    }
}

/// One interval from the kernel's aggregates as they are now.
pub(crate) fn interval(t: &mut TraceRecorder, source: &impl AggregateSource, minor_period: u32, now_ns: u64) {
    let mm: HashMap<u32, MmStats> = source.all_mm().into_iter().collect();
    let procs: Vec<LiveProcess> = source
        .all_stats()
        .iter()
        .map(|(pid, s)| LiveProcess::from_counters(*pid, None, s, mm.get(pid), minor_period))
        .collect();
    t.interval(now_ns, &procs, &source.received_per_cpu());
}

/// A process's final counts, once its aggregates were taken at its exit.
pub(crate) fn exited(t: &mut TraceRecorder, pid: u32, p: &ProcInfo, minor_period: u32, now_ns: u64) {
    if let Some(s) = &p.stats {
        t.exited(now_ns, &LiveProcess::from_counters(pid, None, s, p.mm.as_ref(), minor_period));
    }
}

/// The finished log: major faults' stacks named (once per stack id).
pub(crate) fn finish(
    mut t: TraceRecorder,
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    now_ns: u64,
) -> TraceLog {
    let mut names = Names::default();
    let mut named: HashMap<(u32, i32), Vec<String>> = HashMap::new();
    for m in std::mem::take(&mut t.majors) {
        let mut fault = m.fault;
        if m.user_stack >= 0 {
            let key = (fault.tgid, m.user_stack);
            named
                .entry(key)
                .or_insert_with(|| {
                    let site = (fault.tgid, MM_CALLS as u32, m.user_stack);
                    let mut frames =
                        symbols::site_frames(table, source, &mut names, site, native.dominant(site.0, site.2), py);
                    // The call-site leaf ("[other]"): a fault is no syscall.
                    frames.pop();
                    frames
                })
                .clone_into(&mut fault.stack);
        }
        t.log.majors.push(fault);
    }
    t.log.end_ns = now_ns;
    t.log
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Faults;

    fn proc(pid: u32, faults: u64, major: u64) -> LiveProcess {
        LiveProcess {
            pid,
            comm: None,
            faults: Faults { total: faults, major, ..Faults::default() },
            munmap: 0,
            ipis_sent: 0,
        }
    }

    #[test]
    fn intervals_keep_growth_and_exits_their_last_counts() {
        let mut r = TraceRecorder::new(1_000);
        r.interval(101_000, &[proc(7, 10, 1)], &[0, 5]);
        r.interval(201_000, &[proc(7, 10, 1)], &[0, 5]);
        r.interval(301_000, &[proc(7, 25, 1)], &[3, 2]);
        r.exited(350_000, &proc(7, 40, 2));
        let c = &r.log.counters;
        assert_eq!(c.len(), 3, "{c:?}");
        assert_eq!((c[0].ts_ns, c[0].dur_ns, c[0].delta.faults, c[0].delta.major), (1_000, 100_000, 10, 1));
        assert_eq!((c[1].ts_ns, c[1].delta.faults), (201_000, 15));
        assert_eq!((c[2].ts_ns, c[2].dur_ns, c[2].delta.faults, c[2].delta.major), (301_000, 49_000, 15, 1));
        assert_eq!(c.iter().map(|p| p.delta.faults).sum::<u64>(), 40);
        let cpu: Vec<(u32, u64)> = r.log.cpu_ipis.iter().map(|p| (p.cpu, p.received)).collect();
        assert_eq!(cpu, [(1, 5), (0, 3)]);
    }

    #[test]
    fn the_log_is_bounded_and_counts_the_rest() {
        let mut list = Vec::new();
        let mut dropped = 0;
        for i in 0..TraceLog::MAX_PER_KIND + 3 {
            TraceLog::push(&mut list, &mut dropped, i, TraceLog::MAX_PER_KIND);
        }
        assert_eq!((list.len(), dropped), (TraceLog::MAX_PER_KIND, 3));
    }
}
