//! What the live views show at one moment (`--stream json`, `top`,
//! `serve`): each process's counters so far, turned into per-second rates
//! between two moments. One snapshot type for the three views.
use crate::hash::HashMap;

use vmtrace_common::{FaultStats, MmCall, MmStats};

use super::{DropCounts, Faults};

/// One traced process as the kernel counts it now.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveProcess {
    pub pid: u32,
    /// As the process table knows it; `None` for a process the trace has not
    /// seen start (a view may look it up in /proc).
    pub comm: Option<String>,
    pub faults: Faults,
    pub munmap: u64,
    /// TLB-flush IPIs sent to other CPUs.
    pub ipis_sent: u64,
    /// Its resident memory now (the kernel's `rss_stat` counters; `None`
    /// where resident memory is not traced or its address space not seen).
    pub resident: Option<LiveResident>,
    /// Its cgroup, container, pod and rank, where read (shared by the
    /// processes of one container).
    pub identity: Option<std::sync::Arc<super::Identity>>,
    /// Its exit was seen (its counters are final).
    pub exited: bool,
}

/// A process's resident memory as the kernel counts it (bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveResident {
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
    /// The largest anon + file + shmem so far.
    pub peak: u64,
}

impl LiveResident {
    /// From an address space's counters: what it holds now (nothing once
    /// torn down: the process exited) and its peak.
    pub fn from_kernel(m: &vmtrace_common::RssMm) -> Self {
        use vmtrace_common::{RSS_ANON, RSS_ENDED, RSS_FILE, RSS_SHMEM};
        let now = if m.flags & RSS_ENDED != 0 { [0; vmtrace_common::RSS_MEMBERS] } else { m.size };
        let total = now[RSS_ANON] + now[RSS_FILE] + now[RSS_SHMEM];
        Self { anon: now[RSS_ANON], file: now[RSS_FILE], shmem: now[RSS_SHMEM], peak: m.peak.max(total) }
    }

    /// anon + file + shmem.
    pub fn total(&self) -> u64 {
        self.anon + self.file + self.shmem
    }
}

impl LiveProcess {
    /// From the kernel's aggregates of one process (`mm`: none when mmap/TLB
    /// are not traced).
    pub fn from_counters(
        pid: u32,
        comm: Option<String>,
        stats: &FaultStats,
        mm: Option<&MmStats>,
        minor_period: u32,
    ) -> Self {
        Self {
            pid,
            comm,
            faults: Faults::from_stats(stats, minor_period),
            munmap: mm.map_or(0, |m| m.calls[MmCall::Munmap as usize]),
            ipis_sent: mm.map_or(0, |m| m.ipis_sent),
            resident: None,
            identity: None,
            exited: false,
        }
    }

    pub fn cum(&self) -> Cum {
        let f = &self.faults;
        Cum {
            faults: f.total,
            major: f.major,
            cow: f.cow,
            time_ns: f.time_ns,
            munmap: self.munmap,
            ipis: self.ipis_sent,
        }
    }
}

/// Everything the live views read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveSnapshot {
    /// Seconds since the trace started.
    pub t_s: f64,
    pub processes: Vec<LiveProcess>,
    /// Faults (all, major) of every traced process so far, exited ones included.
    pub all_faults: u64,
    pub all_major: u64,
    pub drops: DropCounts,
    pub oom_kills: usize,
}

impl LiveSnapshot {
    /// Rates of every process since the previous call on `keeper`.
    pub fn rates(&self, keeper: &mut RateKeeper<u32>, dt_s: f64) -> Vec<(u32, Rates)> {
        let cums: Vec<(u32, Cum)> = self.processes.iter().map(|p| (p.pid, p.cum())).collect();
        keeper.update(&cums, dt_s)
    }
}

/// Cumulative counters of one process or region, as read from the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cum {
    pub faults: u64,
    pub major: u64,
    pub cow: u64,
    pub time_ns: u64,
    pub munmap: u64,
    pub ipis: u64,
}

/// Per-second rates over one refresh.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub faults: f64,
    pub minor: f64,
    pub major: f64,
    /// Time in the fault handler as % of one CPU's wall time (like top's %CPU:
    /// several threads faulting at once go past 100).
    pub fault_pct: f64,
    pub cow: f64,
    pub munmap: f64,
    /// TLB-flush IPIs sent to other CPUs (remote shootdowns).
    pub ipis: f64,
}

impl Rates {
    /// From two readings `dt_s` apart. A counter that went backwards (a pid
    /// reused, a map entry re-created) counts from zero.
    pub fn between(before: &Cum, now: &Cum, dt_s: f64) -> Self {
        if dt_s <= 0.0 {
            return Self::default();
        }
        let d = |a: u64, b: u64| if a >= b { (a - b) as f64 / dt_s } else { a as f64 / dt_s };
        let faults = d(now.faults, before.faults);
        let major = d(now.major, before.major).min(faults);
        Self {
            faults,
            minor: faults - major,
            major,
            fault_pct: d(now.time_ns, before.time_ns) / 1e9 * 100.0,
            cow: d(now.cow, before.cow),
            munmap: d(now.munmap, before.munmap),
            ipis: d(now.ipis, before.ipis),
        }
    }
}

/// Turns successive readings into rates, remembering the previous ones.
#[derive(Default)]
pub struct RateKeeper<K> {
    prev: HashMap<K, Cum>,
}

impl<K: std::hash::Hash + Eq + Copy> RateKeeper<K> {
    /// Rates of every key in `now`; keys gone since the last call are forgotten.
    pub fn update(&mut self, now: &[(K, Cum)], dt_s: f64) -> Vec<(K, Rates)> {
        let out = now
            .iter()
            .map(|(k, c)| (*k, Rates::between(&self.prev.get(k).copied().unwrap_or_default(), c, dt_s)))
            .collect();
        self.prev = now.iter().copied().collect();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cum(faults: u64, major: u64, time_ns: u64) -> Cum {
        Cum { faults, major, time_ns, ..Cum::default() }
    }

    #[test]
    fn rates_over_an_interval() {
        let r = Rates::between(&cum(100, 10, 0), &cum(2100, 30, 500_000_000), 2.0);
        assert!((r.faults - 1000.0).abs() < 1e-9);
        assert!((r.major - 10.0).abs() < 1e-9);
        assert!((r.minor - 990.0).abs() < 1e-9);
        // 0.5 s of handler time in 2 s of wall = 25%.
        assert!((r.fault_pct - 25.0).abs() < 1e-9);
    }

    #[test]
    fn a_reset_counter_counts_from_zero() {
        let r = Rates::between(&cum(5000, 0, 0), &cum(300, 0, 0), 1.0);
        assert!((r.faults - 300.0).abs() < 1e-9);
        assert_eq!(Rates::between(&cum(0, 0, 0), &cum(10, 0, 0), 0.0), Rates::default());
    }

    #[test]
    fn keeper_forgets_gone_keys() {
        let mut k = RateKeeper::default();
        k.update(&[(1u32, cum(10, 0, 0)), (2, cum(10, 0, 0))], 1.0);
        let r = k.update(&[(1, cum(30, 0, 0))], 1.0);
        assert_eq!(r.len(), 1);
        assert!((r[0].1.faults - 20.0).abs() < 1e-9);
        // Key 2 comes back: counted from zero, not from its old reading.
        let r = k.update(&[(2, cum(15, 0, 0))], 1.0);
        assert!((r[0].1.faults - 15.0).abs() < 1e-9);
    }
}
