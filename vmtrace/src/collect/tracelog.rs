//! The event log of `record --perfetto`: streamed events as they arrive, and
//! each process's counters every collector interval (100 ms), as growth
//! since the last one. Bounded per kind ([`TraceLog::MAX_PER_KIND`]).
use crate::hash::HashMap;

use vmtrace_common::{
    EventKind, FaultMajorEvent, MmEvent, MmStats, RssMm, TaskEvent, MM_CALLS, MM_CALL_NAMES, RSS_ANON, RSS_ENDED,
    RSS_FILE, RSS_MEMBERS, RSS_SHMEM,
};

use super::{
    process::{ProcInfo, ProcessTable},
    symbols, AggregateSource,
};
use crate::model::{
    comm_str,
    trace::{CounterPoint, CpuPoint, MajorFault, MmChange, ResidentPoint, TaskKind, TaskMark, TraceLog},
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
    /// Resident points per address space (process, `mm_id`): the trace keeps
    /// each process's last one (`finish`).
    rss: HashMap<(u32, u32), RssTrack>,
    rss_points: usize,
}

/// One address space's resident points, and what the last read of its
/// counters (`RSS_MM`) showed.
#[derive(Default)]
struct RssTrack {
    first_ns: u64,
    peak_ns: u64,
    size: [u64; RSS_MEMBERS],
    ended: bool,
    end_ns: u64,
    points: Vec<ResidentPoint>,
}

impl RssTrack {
    /// Which of a process's address spaces is its own, as the resident
    /// figures choose (`ResidentTracker::kernel_counters`): the one it still
    /// runs in, else the last torn down. (When each was first seen does not
    /// tell: an exec's new one is filled before the old one's last event.)
    fn rank(&self) -> (bool, u64, u64) {
        (!self.ended, self.end_ns, self.first_ns)
    }
}

fn resident_point(ts_ns: u64, pid: u32, size: &[u64; RSS_MEMBERS]) -> ResidentPoint {
    ResidentPoint { ts_ns, pid, anon: size[RSS_ANON], file: size[RSS_FILE], shmem: size[RSS_SHMEM] }
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

    /// The kernel's resident counters of every address space (`RSS_MM`) as
    /// read at `now_ns`: a point where they changed since the last read, one
    /// at each new peak when the kernel saw it (so the track's maximum is
    /// the process's peak, however briefly it lasted), and at a teardown the
    /// figures then and zero.
    pub fn resident(&mut self, now_ns: u64, all: &[(u32, RssMm)]) {
        for (mm_id, m) in all {
            if m.tgid == 0 {
                continue;
            }
            let t = self.rss.entry((m.tgid, *mm_id)).or_default();
            if t.first_ns != m.first_ns || (t.ended && m.flags & RSS_ENDED == 0) {
                // A new address space under a reused id.
                if !t.points.is_empty() {
                    self.log.dropped += t.points.len() as u64;
                    self.rss_points -= t.points.len();
                }
                *t = RssTrack { first_ns: m.first_ns, ..RssTrack::default() };
            }
            let before = t.points.len();
            let ended = m.flags & RSS_ENDED != 0;
            if m.peak > 0 && m.peak_ns != t.peak_ns && (!ended || m.peak_ns <= m.end_ns) {
                t.points.push(resident_point(m.peak_ns, m.tgid, &m.peak_size));
                t.peak_ns = m.peak_ns;
            }
            if ended && !t.ended {
                t.points.push(resident_point(m.end_ns, m.tgid, &m.end));
                t.points.push(resident_point(m.end_ns + 1, m.tgid, &[0; RSS_MEMBERS]));
            } else if !ended && m.size != t.size {
                t.points.push(resident_point(now_ns, m.tgid, &m.size));
            }
            (t.size, t.ended, t.end_ns) = (m.size, ended, m.end_ns);
            // Bounded as the other counters are: the rest is counted dropped.
            let added = t.points.len() - before;
            if self.rss_points + added > TraceLog::MAX_COUNTERS {
                t.points.truncate(before);
                self.log.dropped += added as u64;
            } else {
                self.rss_points += added;
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
    let mut named: HashMap<(u32, i32), Vec<String>> = HashMap::default();
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
    // Each process's last address space, as summary.json's figures are
    // (an exec's old one, in `record -- CMD` a copy of vmtrace's own, is not
    // the program's).
    let mut last: HashMap<u32, RssTrack> = HashMap::default();
    for ((pid, _), track) in t.rss {
        match last.get(&pid) {
            Some(l) if l.rank() > track.rank() => {}
            _ => {
                last.insert(pid, track);
            }
        }
    }
    let mut points: Vec<ResidentPoint> = last.into_values().flat_map(|t| t.points).collect();
    points.sort_by_key(|p| (p.pid, p.ts_ns));
    t.log.resident = points;
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
            resident: None,
            identity: None,
            exited: false,
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

    fn mm(tgid: u32, first_ns: u64, anon: u64) -> RssMm {
        let mut m = RssMm { tgid, first_ns, ..RssMm::default() };
        m.size[RSS_ANON] = anon;
        m
    }

    #[test]
    fn resident_points_change_peak_and_end_of_the_last_address_space() {
        let mut r = TraceRecorder::new(0);
        // The address space an exec left and the new one, first seen before
        // it (filled by the exec while the old one was current).
        let mut old = mm(7, 5, 50 << 20);
        let mut new = mm(7, 1, 1 << 20);
        r.resident(100, &[(1, old), (2, new)]);
        // Unchanged: no point. Then a peak at 150 between two reads.
        r.resident(200, &[(2, new)]);
        new.size[RSS_ANON] = 3 << 20;
        (new.peak, new.peak_ns, new.peak_size[RSS_ANON]) = (8 << 20, 150, 8 << 20);
        old.flags = RSS_ENDED;
        (old.end_ns, old.end[RSS_ANON]) = (120, 50 << 20);
        r.resident(300, &[(1, old), (2, new)]);
        new.flags = RSS_ENDED;
        (new.end_ns, new.end[RSS_ANON]) = (350, 3 << 20);
        new.size[RSS_ANON] = 0;
        r.resident(400, &[(2, new)]);
        let source = crate::collect::fake::FakeSource::default();
        let log =
            finish(r, &mut ProcessTable::default(), &source, &NativeStacks::default(), &CodeCache::default(), 500);
        let got: Vec<(u64, u64)> = log.resident.iter().map(|p| (p.ts_ns, p.anon >> 20)).collect();
        // The old address space's 50 MiB is not the program's.
        assert_eq!(got, [(100, 1), (150, 8), (300, 3), (350, 3), (351, 0)]);
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
