//! What happened when, event by event: the log behind the Perfetto trace
//! (`record --perfetto`). The collector fills it (bounded, see
//! [`TraceLog::MAX_PER_KIND`]), the sink (`export::perfetto`) renders it with
//! the summary. Every timestamp is the kernel's CLOCK_MONOTONIC in ns
//! (`bpf_ktime_get_ns`), the clock `perf` and the PyTorch profiler use too.
use super::Cum;

/// A process life-cycle event (`sched_process_fork`/`exec`/`exit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    Fork,
    Exec,
    Exit,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskMark {
    pub ts_ns: u64,
    pub kind: TaskKind,
    /// Fork: the child thread; else the thread itself.
    pub tid: u32,
    pub tgid: u32,
    /// Fork: the parent's tgid.
    pub ppid: u32,
    pub comm: String,
    /// Exit: the last thread of its group left (the process ended).
    pub group_dead: bool,
    /// Exit: wait(2)'s status.
    pub exit_code: u32,
}

/// One major fault: when it entered the handler and how long it was there.
#[derive(Clone, Debug, PartialEq)]
pub struct MajorFault {
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    pub addr: u64,
    /// Its user stack, outermost first (empty: none taken or symbolized).
    pub stack: Vec<String>,
}

/// An mmap-family call that mapped, unmapped or changed memory (madvise is
/// not streamed): from its enter to its return.
#[derive(Clone, Debug, PartialEq)]
pub struct MmChange {
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// `MM_CALL_NAMES`' name.
    pub call: &'static str,
    pub addr: u64,
    pub len: u64,
}

/// What one process did in one collector interval (only non-zero ones are kept).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterPoint {
    /// Start of the interval.
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub pid: u32,
    /// Growth over the interval (fault time scaled as summary.json scales it).
    pub delta: Cum,
}

/// TLB-shootdown IPIs received on one CPU in one interval (traced processes'
/// flushes of reason "remote shootdown", counted where they ran).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuPoint {
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub cpu: u32,
    pub received: u64,
}

/// A process's resident memory (bytes, the kernel's `rss_stat` counters) from
/// this moment until its next point: each change seen at a collector
/// interval, its peak at the moment the kernel recorded it, and its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResidentPoint {
    pub ts_ns: u64,
    pub pid: u32,
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
}

impl ResidentPoint {
    /// anon + file + shmem.
    pub fn total(&self) -> u64 {
        self.anon + self.file + self.shmem
    }
}

/// A process's pages on one NUMA node as one read of `/proc/PID/numa_maps`
/// counted them (4 KiB pages; hosts with two nodes or more). Each read gives
/// a point for every node of the host, 0 where the process had none; a
/// value holds until the process's next point, or its exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodePoint {
    pub ts_ns: u64,
    pub pid: u32,
    pub node: u32,
    pub pages: u64,
}

/// The whole log. `dropped` counts records beyond the per-kind bound; they
/// are in summary.json's `drops.trace_events` too.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceLog {
    /// CLOCK_MONOTONIC at summary.json's time 0 (storms' and OOM kills'
    /// `_s` fields count from here).
    pub start_ns: u64,
    pub end_ns: u64,
    pub tasks: Vec<TaskMark>,
    pub majors: Vec<MajorFault>,
    pub mm_changes: Vec<MmChange>,
    pub counters: Vec<CounterPoint>,
    pub cpu_ipis: Vec<CpuPoint>,
    /// Resident memory per process, in time order per process (with
    /// `--events resident`).
    pub resident: Vec<ResidentPoint>,
    /// Pages per NUMA node per process, in time order (hosts with two
    /// nodes or more: `numa::NumaTracker`'s reads).
    pub nodes: Vec<NodePoint>,
    pub dropped: u64,
}

impl TraceLog {
    /// Events kept per kind (tasks, majors, mapping changes, per-CPU
    /// points): 50-80 bytes each in memory, ~100 in the trace. A busy `-a`
    /// recording here streams ~200k mapping changes a minute: the first
    /// 250k are kept (docs/performance.md).
    pub const MAX_PER_KIND: usize = 250_000;
    /// Counter points kept (72 bytes each): one per process that moved per
    /// 100 ms, ~20k a minute in that recording, so 10 minutes fit.
    pub const MAX_COUNTERS: usize = 1_000_000;

    /// Appends `item` unless `list` holds `cap` already (then counts it dropped).
    pub fn push<T>(list: &mut Vec<T>, dropped: &mut u64, item: T, cap: usize) {
        if list.len() < cap {
            list.push(item);
        } else {
            *dropped += 1;
        }
    }

    /// Seconds since the start as a timestamp on the trace's clock.
    pub fn at(&self, seconds: f64) -> u64 {
        self.start_ns + (seconds.max(0.0) * 1e9) as u64
    }
}
