//! The userspace half of a trace: drain the kernel's event stream into the
//! process table while the target runs, then read the in-kernel aggregates
//! once and turn them into a `Summary`.
pub mod process;

use std::{
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use std::collections::{HashMap, VecDeque};

use vmtrace_common::{DropKind, EventHeader, EventKind, FaultStats, OomEvent, TaskEvent};

use crate::{
    loader::Probes,
    report::summary::{Drops, Faults, ProbeInfo, Process, Reclaim, Sampling, Summary, TargetInfo, SUMMARY_VERSION},
};
use crate::{
    oom::{self, OomRecord},
    stacks::{
        symbolize::{Names, PerfMap},
        Stack, StackMode, StacksSummary,
    },
};
use process::ProcessTable;
use vmtrace_common::{StackCounts, StackKey};

/// Copies a `T` out of a ring-buffer record after checking its length.
fn read_event<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    // SAFETY: length checked; T is Pod (plain integers, any bit pattern valid).
    (bytes.len() >= std::mem::size_of::<T>()).then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Last SIGINT/SIGTERM received (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: i32) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the trace cleanly, with every output written.
pub fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
}

pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How far back the flight recorder keeps each process's fault count.
const HISTORY: Duration = Duration::from_secs(5);
const HISTORY_STEP: Duration = Duration::from_millis(100);

pub struct Session {
    pub probes: Probes,
    pub table: ProcessTable,
    pub malformed_events: u64,
    pub started: Instant,
    /// CLOCK_MONOTONIC at `started`, the clock of kernel event timestamps.
    started_mono_ns: u64,
    /// Whether OOM kills are traced (and cgroups of new processes recorded).
    pub oom_enabled: bool,
    pub ooms: Vec<OomRecord>,
    /// Flight recorder: (seconds since start, faults so far) per process, last few seconds.
    history: HashMap<u32, VecDeque<(f64, u64)>>,
    last_history: Instant,
    /// Stacks are collected: keep memory maps of live processes.
    pub stacks: Option<(StackMode, u32)>,
    last_maps_refresh: Instant,
}

/// One aggregated stack before symbolization: key, counts, user and kernel IPs.
type RawStack = (StackKey, StackCounts, Vec<u64>, Vec<u64>);

/// How often memory maps of live processes are re-read for symbolization.
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// Processes younger than this have their maps re-read on every poll.
const YOUNG: Duration = Duration::from_secs(2);

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Session {
    pub fn new(probes: Probes, oom_enabled: bool) -> Self {
        Self {
            probes,
            table: ProcessTable::default(),
            malformed_events: 0,
            started: Instant::now(),
            started_mono_ns: monotonic_ns(),
            oom_enabled,
            ooms: Vec::new(),
            history: HashMap::new(),
            last_history: Instant::now(),
            stacks: None,
            last_maps_refresh: Instant::now(),
        }
    }

    /// Re-reads the maps of live traced processes: libraries load after exec,
    /// so young processes are re-read on every poll, older ones every second.
    fn refresh_maps(&mut self) {
        if self.stacks.is_none() {
            return;
        }
        let all_due = self.last_maps_refresh.elapsed() >= MAPS_REFRESH;
        if all_due {
            self.last_maps_refresh = Instant::now();
        }
        let due: Vec<u32> = self
            .table
            .procs
            .iter()
            .filter(|(_, p)| p.exit_code.is_none() && (all_due || p.first_seen.elapsed() < YOUNG))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            self.table.snapshot_maps(pid);
        }
    }

    /// Symbolizes the in-kernel stack aggregate.
    fn build_stacks(&mut self) -> Vec<Stack> {
        let raw = self.probes.all_stack_counts();
        let mut names = Names::default();
        let mut out = Vec::new();
        let mut by_pid: HashMap<u32, Vec<RawStack>> = HashMap::new();
        for (k, c) in raw {
            let user = if k.user_stack >= 0 { self.probes.stack_ips(k.user_stack).unwrap_or_default() } else { vec![] };
            let kernel =
                if k.kernel_stack >= 0 { self.probes.stack_ips(k.kernel_stack).unwrap_or_default() } else { vec![] };
            by_pid.entry(k.tgid).or_default().push((k, c, user, kernel));
        }
        for (pid, entries) in by_pid {
            if self.table.procs.get(&pid).is_none_or(|p| p.maps.is_empty()) {
                self.table.snapshot_maps(pid);
            }
            let info = self.table.ensure(pid).clone();
            let jit = PerfMap::read(pid);
            let all_user: Vec<u64> = entries.iter().flat_map(|e| e.2.iter().copied()).collect();
            names.prepare_user(&all_user, &info.maps);
            let all_kernel: Vec<u64> = entries.iter().flat_map(|e| e.3.iter().copied()).collect();
            names.prepare_kernel(&all_kernel);
            for (k, counts, user, kernel) in entries {
                out.push(Stack {
                    pid,
                    comm: info.comm.clone(),
                    user: user.iter().rev().map(|&a| names.user(a, &info.maps, jit.as_ref())).collect(),
                    kernel: kernel.iter().rev().map(|&a| names.kernel(a)).collect(),
                    counts,
                    user_missing: k.user_stack == -2,
                });
            }
        }
        out
    }

    /// Marks the start of the trace proper.
    pub fn start_clock(&mut self) {
        self.started = Instant::now();
        self.started_mono_ns = monotonic_ns();
    }

    /// Seconds since the start for a kernel timestamp.
    fn since_start(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.started_mono_ns) as f64 / 1e9
    }

    /// Every few hundred ms, the fault count of each live traced process.
    fn record_history(&mut self) {
        if !self.oom_enabled || self.last_history.elapsed() < HISTORY_STEP {
            return;
        }
        self.last_history = Instant::now();
        let now = self.started.elapsed().as_secs_f64();
        for (tgid, s) in self.probes.all_stats() {
            let h = self.history.entry(tgid).or_default();
            h.push_back((now, s.started));
            while h.front().is_some_and(|&(t, _)| now - t > HISTORY.as_secs_f64()) {
                h.pop_front();
            }
        }
    }

    /// Fault rate of `pid` over the flight recorder's window.
    fn recent_rate(&self, pid: u32) -> Option<f64> {
        let h = self.history.get(&pid)?;
        let (&(t0, n0), &(t1, n1)) = (h.front()?, h.back()?);
        (t1 > t0).then(|| n1.saturating_sub(n0) as f64 / (t1 - t0))
    }

    fn on_oom(&mut self, ev: &OomEvent) {
        let victim = ev.victim_pid;
        // Read now: the victim is on its way out.
        let cgroup =
            oom::memory_cgroup_of(victim).or_else(|| self.table.procs.get(&victim).and_then(|p| p.cgroup.clone()));
        let in_target = self.table.procs.contains_key(&victim) || self.probes.is_traced(victim);
        let mut rec = oom::describe(ev, cgroup, in_target, self.since_start(ev.hdr.ts_ns));
        rec.fault_rate_per_s = self.recent_rate(victim);
        self.ooms.push(rec);
    }

    /// Waits up to `timeout` for kernel events, then applies all that arrived.
    pub fn poll(&mut self, timeout: Duration) {
        let mut pfd = libc::pollfd { fd: self.probes.ring_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; EINTR (a stop signal) simply returns early.
        unsafe { libc::poll(&raw mut pfd, 1, timeout.as_millis() as i32) };
        self.drain();
        self.record_history();
        self.refresh_maps();
    }

    pub fn drain(&mut self) {
        let mut exited = Vec::new();
        let mut ooms = Vec::new();
        let mut born = Vec::new();
        while let Some(item) = self.probes.events.next() {
            let bytes: &[u8] = &item;
            let Some(hdr) = read_event::<EventHeader>(bytes) else {
                self.malformed_events += 1;
                continue;
            };
            match EventKind::from_u32(hdr.kind) {
                Some(EventKind::TaskFork | EventKind::TaskExec | EventKind::TaskExit) => {
                    let Some(ev) = read_event::<TaskEvent>(bytes) else {
                        self.malformed_events += 1;
                        continue;
                    };
                    if ev.hdr.kind == EventKind::TaskExit as u32 && ev.group_dead != 0 {
                        exited.push(ev.tgid);
                    } else if ev.hdr.kind != EventKind::TaskExit as u32 {
                        born.push(ev.tgid);
                    }
                    self.table.apply(&ev);
                }
                Some(EventKind::OomMarkVictim) => match read_event::<OomEvent>(bytes) {
                    Some(ev) => ooms.push(ev),
                    None => self.malformed_events += 1,
                },
                None => self.malformed_events += 1,
            }
        }
        for ev in &ooms {
            self.on_oom(ev);
        }
        if self.stacks.is_some() {
            for &tgid in &born {
                self.table.snapshot_maps(tgid);
            }
        }
        if self.oom_enabled {
            for tgid in born {
                if let Some(cg) = oom::memory_cgroup_of(tgid) {
                    self.table.procs.entry(tgid).or_default().cgroup = Some(cg);
                }
            }
        }
        // Take an exited process's aggregate out of the kernel map: it is final,
        // and the map stays bounded however many processes come and go.
        for tgid in exited {
            if let Some(s) = self.probes.take_stats(tgid) {
                self.table.procs.entry(tgid).or_default().stats.get_or_insert_with(FaultStats::default).add(&s);
            }
        }
        self.probes.flush_logs();
    }

    /// Reads the in-kernel aggregates and builds the summary.
    pub fn finish(mut self, target: TargetInfo, minor_period: u32) -> (Summary, Vec<Stack>) {
        self.drain();
        let stacks = if self.stacks.is_some() { self.build_stacks() } else { Vec::new() };
        let duration_s = self.started.elapsed().as_secs_f64();
        // Exited processes' aggregates were taken at their exit; the rest are still in the map.
        let mut stats: std::collections::BTreeMap<u32, FaultStats> =
            self.table.procs.iter().filter_map(|(pid, p)| p.stats.map(|s| (*pid, s))).collect();
        for (tgid, s) in self.probes.all_stats() {
            stats.entry(tgid).or_default().add(&s);
        }
        let drops_raw = self.probes.drops();
        let d = |k: DropKind| drops_raw.get(k as usize).copied().unwrap_or(0);
        let drops = Drops {
            task_events: d(DropKind::TaskEventRingFull) + d(DropKind::OomRingFull) + self.malformed_events,
            fault_stats_full: d(DropKind::FaultStatsFull),
            traced_full: d(DropKind::TracedFull),
            untimed_faults: d(DropKind::FaultUntimed),
        };
        let system = target.kind == "system";
        let mut pids: Vec<u32> = stats.keys().copied().collect();
        if !system {
            // Every process of the target appears, even one that never faulted.
            pids.extend(self.table.procs.keys().copied());
        }
        if let Some(pid) = target.pid {
            pids.push(pid);
        }
        pids.sort_unstable();
        pids.dedup();
        // The fallback fork hook cannot tell threads from processes; drop live threads.
        pids.retain(|&pid| !process::is_thread(pid));
        let mut totals = Faults::default();
        let mut processes = Vec::new();
        for pid in pids {
            let faults = Faults::from_stats(&stats.get(&pid).copied().unwrap_or_default(), minor_period);
            totals.add(&faults);
            let info = self.table.ensure(pid).clone();
            let exit_code = if Some(pid) == target.pid && target.kind == "command" {
                target.exit_status.or(info.exit_code)
            } else {
                info.exit_code
            };
            let st = stats.get(&pid).copied().unwrap_or_default();
            processes.push(Process {
                reclaim: Reclaim { stalls: st.reclaim, time_ns: st.reclaim_ns },
                pid,
                ppid: info.ppid,
                comm: info.comm,
                cmdline: info.cmdline,
                exit_code,
                faults,
                kernel_accounting: info.kernel,
            });
        }
        let time_estimated = minor_period != 1 || drops.untimed_faults > 0;
        for r in &mut self.ooms {
            if let Some(s) = stats.get(&r.victim_pid) {
                r.victim_faults = Some(s.started);
                r.victim_reclaim_stalls = Some(s.reclaim);
                r.victim_reclaim_ns = Some(s.reclaim_ns);
            }
        }
        let stacks_summary = self.stacks.map(|(mode, period)| StacksSummary {
            mode: format!("{mode:?}").to_lowercase(),
            sample_period: period,
            sampled_faults: stacks.iter().map(|s| s.counts.faults).sum(),
            distinct_stacks: stacks.len() as u64,
            lost: drops_raw.get(DropKind::StackLost as usize).copied().unwrap_or(0)
                + drops_raw.get(DropKind::StackCountsFull as usize).copied().unwrap_or(0),
            shallow_user_stacks_pct: crate::stacks::shallow_pct(&stacks),
            files: Vec::new(),
        });
        let summary = Summary {
            version: SUMMARY_VERSION,
            target,
            duration_s,
            lost_events: drops.task_events + drops.fault_stats_full + drops.traced_full,
            processes,
            totals,
            sampling: Sampling { minor_latency_period: minor_period, time_estimated },
            drops,
            probes: self
                .probes
                .attached
                .iter()
                .map(|a| ProbeInfo {
                    what: a.what.into(),
                    program_type: a.program_type.into(),
                    target: a.target.clone(),
                    fallback_reason: a.fallback_reason.clone(),
                })
                .collect(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into(),
            vmtrace_version: env!("CARGO_PKG_VERSION").into(),
            perf: None,
            oom: self.oom_enabled.then(|| std::mem::take(&mut self.ooms)),
            stacks: stacks_summary,
        };
        (summary, stacks)
    }
}
