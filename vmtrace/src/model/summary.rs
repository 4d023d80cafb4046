//! `summary.json`, version 2: the machine-readable record of a trace
//! (../shared/spec/vmtrace-contract.md). Fields are added, never renamed.
//! Version 2 (docs/summary-json.md) writes histograms sparse and folds the
//! smallest processes and regions into "other" rows; version-1 files still
//! read (`vmtrace report`).
use serde::{Deserialize, Serialize};

use super::{
    Drops, Faults, FileSummary, OomRecord, PerfSummary, RegionPlacement, RegionSummary, StacksSummary, Storm, Timeline,
};

pub const SUMMARY_VERSION: u32 = 2;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub version: u32,
    pub target: TargetInfo,
    pub duration_s: f64,
    /// Everything dropped anywhere; 0 = nothing lost.
    pub lost_events: u64,
    pub processes: Vec<Process>,
    /// Faults of all traced processes together.
    pub totals: Faults,
    /// How fault latency was measured: 1 = every fault timed.
    pub sampling: Sampling,
    /// Drop counters by cause (their sum is `lost_events` plus untimed faults).
    pub drops: Drops,
    /// Which program type each hook used on this kernel.
    pub probes: Vec<ProbeInfo>,
    /// Each program's runs and run time, busiest first (`--probe-stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program_stats: Option<Vec<ProgramStats>>,
    pub kernel: String,
    pub vmtrace_version: String,
    /// Hardware TLB counters and the kernel's software fault counters (`--events perf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perf: Option<PerfSummary>,
    /// Every OOM kill during the trace, system-wide (`--events oom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<Vec<OomRecord>>,
    /// Faults per memory region of each process (`--events regions`), by fault time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<Vec<RegionSummary>>,
    /// How surely `regions` places each fault in the mapping of its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_placement: Option<RegionPlacement>,
    /// Faults per file across processes, with readahead and tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<FileSummary>>,
    /// Faults per interval over the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
    /// Shootdown storms (`--events tlb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storms: Option<Vec<Storm>>,
    /// Call stacks of faults (`--stacks`), and the files drawn from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<StacksSummary>,
    /// What was folded into "other" rows (absent: every row is listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folding: Option<super::Folding>,
    /// How the resident profiles were made (`--events resident` with stacks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident: Option<super::ResidentSummary>,
    /// What is wrong and what to change (docs/findings.md), from this
    /// recording's numbers; absent in summaries written before findings
    /// (`vmtrace report` then derives them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub findings: Option<Vec<super::Finding>>,
    /// The system's transparent-huge-page mode for anonymous memory at the
    /// end of the recording: "always", "madvise" or "never" (absent without
    /// THP, or in older summaries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thp_anon_mode: Option<String>,
    /// The top code locations by fault time, faults and resident bytes
    /// (`--stacks`), for summary.txt and report.html to open with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_locations: Option<super::CodeLocations>,
    /// Locked and pinned memory, locking call sites and refused calls (`--events mmap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<super::Pinned>,
    /// NUMA placement: nodes, pages by node, remote first touches, numa_* counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<super::Numa>,
}

/// What was traced.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// A command vmtrace started, and what it forked.
    Command,
    /// A running process, and what it forked since.
    Pid,
    /// Every process.
    System,
}

impl std::fmt::Display for TargetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Command => "command",
            Self::Pid => "pid",
            Self::System => "system",
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TargetInfo {
    /// "command", "pid" or "system" in summary.json.
    pub kind: TargetKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Exit status of the target (`command`: as a shell reports it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Sampling {
    /// 1 in N minor faults is timed; 0 = minor faults are not timed (their
    /// time is then missing from `time_ns`). Majors are always timed.
    pub minor_latency_period: u32,
    /// True when `time_ns` is scaled up from a sample, or lacks minor time.
    pub time_estimated: bool,
    /// Fault time stratified: every slow fault (slept, huge page, major)
    /// timed exactly, 1 in this many fast minor faults timed, each standing
    /// for the fast faults before it (`record --fast-sample`). Absent: not
    /// stratified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_sample_period: Option<u32>,
    /// Stratified only: the fast faults' estimated time's standard error
    /// (one sigma, from the samples' variance), in ns and as a percentage of
    /// the total fault time (`totals.time_ns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_error_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_error_pct: Option<f64>,
    /// Stratified only: the fast minor faults (every fault not timed
    /// exactly), and how many of them were timed as samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_faults: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fast_samples: Option<u64>,
}

impl Sampling {
    /// The plain settings: every fault timed (period 1), or 1 in N minors.
    pub fn plain(minor_latency_period: u32, time_estimated: bool) -> Self {
        Self {
            minor_latency_period,
            time_estimated,
            fast_sample_period: None,
            time_error_ns: None,
            time_error_pct: None,
            fast_faults: None,
            fast_samples: None,
        }
    }
}

/// One program's runs and time in it (`--probe-stats`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProgramStats {
    pub program: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProbeInfo {
    pub what: String,
    pub program_type: String,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

/// arm64's fault start (`probes[].what`): on the software event PAGE_FAULTS
/// it sees no access type, so neither write nor exec faults are counted.
pub const FAULT_START_ARM64: &str = "fault start";
/// arm64's COW hook (`probes[].what`): skipped, no COW fault is counted.
pub const COW_FAULTS_ARM64: &str = "COW faults";

/// The counts these probes cannot take (`UNCOUNTED_*` bits of
/// [`crate::model::Faults::uncounted`]).
pub fn uncounted_of(probes: &[ProbeInfo]) -> u8 {
    use crate::model::faults::{UNCOUNTED_COW, UNCOUNTED_EXEC, UNCOUNTED_WRITE};
    let mut bits = 0;
    for p in probes {
        if p.what == FAULT_START_ARM64 && p.program_type == "perf_event" {
            bits |= UNCOUNTED_WRITE | UNCOUNTED_EXEC;
        }
        if p.what == COW_FAULTS_ARM64 && p.program_type == "none" {
            bits |= UNCOUNTED_COW;
        }
    }
    bits
}

impl Summary {
    /// Marks the counts the probes could not take on every FAULTS object
    /// (processes, totals, regions, files): null in summary.json, "-" in
    /// summary.txt, never a 0 that reads as measured.
    pub fn mark_uncounted(&mut self) {
        let bits = uncounted_of(&self.probes);
        if bits == 0 {
            return;
        }
        self.totals.uncounted |= bits;
        for p in &mut self.processes {
            p.faults.uncounted |= bits;
        }
        for r in self.regions.iter_mut().flatten() {
            r.faults.uncounted |= bits;
        }
        for f in self.files.iter_mut().flatten() {
            f.faults.uncounted |= bits;
        }
    }
}

/// How a skipped hook's reason begins when nothing is lost without it.
pub const NOT_NEEDED: &str = "not needed: ";

impl ProbeInfo {
    /// A hook left out because nothing it would record is missing: another
    /// program sees the same events (the memcg fault end sees the huge-page
    /// faults), or they cannot happen on this kernel (THP off everywhere).
    pub fn not_needed(&self) -> bool {
        self.program_type == "none" && self.fallback_reason.as_deref().is_some_and(|r| r.starts_with(NOT_NEEDED))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Process {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Option<String>,
    /// As a shell reports it: the exit code, or 128+signal. Null while running.
    pub exit_code: Option<i32>,
    pub faults: Faults,
    /// Reclaim stalls (direct and memcg) this process ran itself.
    #[serde(default)]
    pub reclaim: Reclaim,
    /// Page migrations its threads ran and NUMA balancing's moves of its
    /// threads (`--events oom`); absent when there were none.
    #[serde(default, skip_serializing_if = "Migration::is_empty")]
    pub migration: Migration,
    /// Memory-map syscalls (`--events mmap`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmap: Option<MmapCounts>,
    /// TLB flushes and shootdowns (`--events tlb`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tlb: Option<TlbCounts>,
    /// The kernel's own counters for the whole process at its exit
    /// (what getrusage reports), when the kernel exposed them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_accounting: Option<KernelAccounting>,
    /// Its COW faults by what was copied, summed over its regions
    /// (`--events regions`); absent without any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cow_from: Option<super::CowFrom>,
    /// The "other" row (pid 0, comm "other"): how many processes below the
    /// folding threshold it sums (0 for a process of its own).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub folded: u64,
    /// Of the folded processes, how many had each name (the most common ones).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub folded_comms: std::collections::BTreeMap<String, u64>,
    /// Resident memory at its end and at its peak (`--events resident`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident: Option<super::Resident>,
    /// Its cgroup, container id, pod uid and rank (`cgroup`, `container_id`,
    /// `container_runtime`, `pod_uid`, `rank`, `local_rank`, `world_size`
    /// in the row itself; each absent where unknown).
    #[serde(flatten)]
    pub identity: super::Identity,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MmapCounts {
    pub mmap: u64,
    pub munmap: u64,
    pub munmap_bytes: u64,
    pub mremap: u64,
    pub madvise: u64,
    pub mprotect: u64,
    pub brk: u64,
    /// Of `brk`: calls that moved the break down (heap trims: glibc's free
    /// past `M_TRIM_THRESHOLD`, malloc_trim). Absent in older summaries.
    #[serde(default)]
    pub brk_shrinks: u64,
    /// Of `brk`: calls made inside the program's own `malloc_trim()`, from
    /// the calls' user stacks (0 without user stacks). Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub brk_in_malloc_trim: u64,
    /// `madvise` calls by advice name (non-zero ones).
    pub madvise_by_advice: std::collections::BTreeMap<String, u64>,
}

impl MmapCounts {
    pub fn add(&mut self, o: &MmapCounts) {
        self.mmap += o.mmap;
        self.munmap += o.munmap;
        self.munmap_bytes += o.munmap_bytes;
        self.mremap += o.mremap;
        self.madvise += o.madvise;
        self.mprotect += o.mprotect;
        self.brk += o.brk;
        self.brk_shrinks += o.brk_shrinks;
        self.brk_in_malloc_trim += o.brk_in_malloc_trim;
        for (k, v) in &o.madvise_by_advice {
            *self.madvise_by_advice.entry(k.clone()).or_default() += v;
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TlbCounts {
    /// Shootdowns this process *received*: it was running where another CPU's
    /// flush IPI landed (tlb_flush reason 1), not its own doing.
    pub remote_shootdown: u64,
    pub local_shootdown: u64,
    pub local_mm_shootdown: u64,
    /// Flush operations of this process that sent IPIs to other CPUs (reason 4).
    pub remote_ipi_send: u64,
    pub task_switch: u64,
    /// Pages in ranged flushes only (the kernel's page count of each).
    pub pages: u64,
    /// Flushes of the whole TLB (`TLB_FLUSH_ALL`: a range past the kernel's
    /// `tlb_single_page_flush_ceiling`, a task switch): no page count.
    #[serde(default)]
    pub full_flushes: u64,
    /// TLB-flush IPIs sent (one per target CPU), and during which syscall.
    pub ipis_sent: u64,
    pub ipis_by_call: std::collections::BTreeMap<String, u64>,
}

impl TlbCounts {
    pub fn add(&mut self, o: &TlbCounts) {
        self.remote_shootdown += o.remote_shootdown;
        self.local_shootdown += o.local_shootdown;
        self.local_mm_shootdown += o.local_mm_shootdown;
        self.remote_ipi_send += o.remote_ipi_send;
        self.task_switch += o.task_switch;
        self.pages += o.pages;
        self.full_flushes += o.full_flushes;
        self.ipis_sent += o.ipis_sent;
        for (k, v) in &o.ipis_by_call {
            *self.ipis_by_call.entry(k.clone()).or_default() += v;
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reclaim {
    pub stalls: u64,
    pub time_ns: u64,
}

/// Page migrations a process's threads ran (`migrate_pages()`: compaction,
/// NUMA balancing, move_pages/mbind, long-term pins), whoever's pages they
/// moved, and the times NUMA balancing moved one of its threads to another
/// node's CPU.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Migration {
    /// Pages moved.
    pub pages: u64,
    /// Of those, by reason: `compaction`, `numa_balancing` (a hinting fault
    /// found the page on another node than the thread's), `syscall`
    /// (move_pages, migrate_pages, mbind with MPOL_MF_MOVE, cpusets),
    /// `other` (long-term pins, CMA, demotion, hotplug, memory failure);
    /// only those above zero.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pages_by_reason: std::collections::BTreeMap<String, u64>,
    /// Pages the migrations could not move.
    pub failed: u64,
    /// `migrate_pages()` calls, and the time spent in them.
    pub calls: u64,
    pub time_ns: u64,
    /// NUMA balancing moved (or swapped) one of its threads to another node's CPU.
    pub numa_moves: u64,
}

impl Migration {
    pub fn is_empty(&self) -> bool {
        self.calls == 0 && self.numa_moves == 0
    }

    pub fn from_stats(st: &vmtrace_common::FaultStats) -> Self {
        let pages_by_reason = vmtrace_common::MIGRATE_REASON_NAMES
            .iter()
            .zip(st.migrated)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| ((*k).to_string(), n))
            .collect();
        Self {
            pages: st.migrated.iter().sum(),
            pages_by_reason,
            failed: st.migrate_failed,
            calls: st.migrations,
            time_ns: st.migrate_ns,
            numa_moves: st.numa_moves,
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.pages += o.pages;
        for (k, v) in &o.pages_by_reason {
            *self.pages_by_reason.entry(k.clone()).or_default() += v;
        }
        self.failed += o.failed;
        self.calls += o.calls;
        self.time_ns += o.time_ns;
        self.numa_moves += o.numa_moves;
    }

    /// NUMA balancing's share of the pages.
    pub fn numa_balancing(&self) -> u64 {
        self.pages_by_reason.get("numa_balancing").copied().unwrap_or(0)
    }

    /// One line for people: "242 pages (compaction 242), 161 failed, in 18
    /// calls, 929 µs; NUMA balancing moved its threads 3 times".
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        if self.calls > 0 {
            let why: Vec<String> =
                self.pages_by_reason.iter().map(|(k, v)| format!("{} {v}", k.replace('_', " "))).collect();
            let _ = write!(s, "{} pages", self.pages);
            if !why.is_empty() {
                let _ = write!(s, " ({})", why.join(", "));
            }
            if self.failed > 0 {
                let _ = write!(s, ", {} failed", self.failed);
            }
            let _ = write!(s, ", in {} calls, {}", self.calls, super::fmt_ns(self.time_ns));
        }
        if self.numa_moves > 0 {
            if !s.is_empty() {
                s.push_str("; ");
            }
            let _ = write!(s, "NUMA balancing moved its threads {} times", self.numa_moves);
        }
        s
    }
}

/// The processes whose threads migrated pages or were moved by NUMA
/// balancing, most pages first (at most `limit`), and how many there were.
pub fn migrating(processes: &[Process], limit: usize) -> (Vec<&Process>, usize) {
    let mut v: Vec<&Process> = processes.iter().filter(|p| !p.migration.is_empty()).collect();
    let n = v.len();
    v.sort_by_key(|p| (std::cmp::Reverse(p.migration.pages), std::cmp::Reverse(p.migration.numa_moves), p.pid));
    v.truncate(limit);
    (v, n)
}

/// Whether this recording counted page migrations: its migration end hook
/// was attached (a kernel without the migrate events, or a recording made
/// before vmtrace had them, did not count any).
pub fn migrations_recorded(probes: &[ProbeInfo]) -> bool {
    probes.iter().any(|p| p.target.ends_with("mm_migrate_pages") && p.program_type != "none")
}

/// "none", or why nothing could be counted, for an empty migration section.
pub fn no_migrations(probes: &[ProbeInfo]) -> &'static str {
    if migrations_recorded(probes) {
        "none"
    } else {
        "not recorded (no migrate:mm_migrate_pages hook in this recording)"
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelAccounting {
    pub minor: u64,
    pub major: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_migrations_says_whether_they_were_counted() {
        let probe = |program_type: &str| ProbeInfo {
            what: "page migration end".into(),
            program_type: program_type.into(),
            target: "migrate:mm_migrate_pages".into(),
            fallback_reason: None,
        };
        assert_eq!(no_migrations(&[probe("tracepoint")]), "none");
        assert!(no_migrations(&[probe("none")]).starts_with("not recorded"));
        // A recording made before the hook existed.
        assert!(no_migrations(&[]).starts_with("not recorded"));
    }
}
