//! The userspace half of a trace: drain the kernel's event stream into the
//! process table while the target runs, then read the in-kernel aggregates
//! once and turn them into a `Summary`.
pub mod process;

use std::{
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use vmtrace_common::{DropKind, EventKind, FaultStats, TaskEvent};

use crate::{
    loader::Probes,
    report::summary::{Drops, Faults, ProbeInfo, Process, Sampling, Summary, TargetInfo, SUMMARY_VERSION},
};
use process::ProcessTable;

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

pub struct Session {
    pub probes: Probes,
    pub table: ProcessTable,
    pub malformed_events: u64,
    pub started: Instant,
}

impl Session {
    pub fn new(probes: Probes) -> Self {
        Self { probes, table: ProcessTable::default(), malformed_events: 0, started: Instant::now() }
    }

    /// Waits up to `timeout` for kernel events, then applies all that arrived.
    pub fn poll(&mut self, timeout: Duration) {
        let mut pfd = libc::pollfd { fd: self.probes.ring_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; EINTR (a stop signal) simply returns early.
        unsafe { libc::poll(&raw mut pfd, 1, timeout.as_millis() as i32) };
        self.drain();
    }

    pub fn drain(&mut self) {
        let mut exited = Vec::new();
        while let Some(item) = self.probes.events.next() {
            let bytes: &[u8] = &item;
            if bytes.len() < std::mem::size_of::<TaskEvent>() {
                self.malformed_events += 1;
                continue;
            }
            // SAFETY: length checked; TaskEvent is plain integers (any bit pattern is valid).
            let ev: TaskEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
            if ev.hdr.kind == EventKind::TaskExit as u32 && ev.group_dead != 0 {
                exited.push(ev.tgid);
            }
            self.table.apply(&ev);
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
    pub fn finish(mut self, target: TargetInfo, minor_period: u32) -> Summary {
        self.drain();
        let duration_s = self.started.elapsed().as_secs_f64();
        // Exited processes' aggregates were taken at their exit; the rest are still in the map.
        let mut stats: std::collections::BTreeMap<u32, FaultStats> =
            self.table.procs.iter().filter_map(|(pid, p)| p.stats.map(|s| (*pid, s))).collect();
        for (tgid, s) in self.probes.all_stats() {
            stats.entry(tgid).or_default().add(&s);
        }
        let drops = self.probes.drops();
        let d = |k: DropKind| drops.get(k as usize).copied().unwrap_or(0);
        let drops = Drops {
            task_events: d(DropKind::TaskEventRingFull) + self.malformed_events,
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
            processes.push(Process {
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
        Summary {
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
        }
    }
}
