//! Fault aggregates and the fault in flight: the latency histogram, x86 error-code bits, per-process counts, the per-CPU in-flight slot.

/// Latency histogram: bucket `i` counts samples with `ns <= 2^(HIST_MIN_SHIFT + i)`,
/// the last bucket everything above `2^(HIST_MIN_SHIFT + HIST_BUCKETS - 2)` ns.
pub const HIST_MIN_SHIFT: u32 = 10;
/// 1 µs .. 1 s in powers of two, then +inf.
pub const HIST_BUCKETS: usize = 22;

/// Index of the histogram bucket for a latency in nanoseconds.
#[inline(always)]
#[must_use]
pub fn hist_bucket(ns: u64) -> usize {
    // Smallest b with ns <= 2^b, i.e. ceil(log2(ns)); written as a bounded
    // loop-free expression so the verifier sees a constant range.
    let b = if ns <= 1 { 0 } else { 64 - (ns - 1).leading_zeros() };
    let i = b.saturating_sub(HIST_MIN_SHIFT) as usize;
    if i >= HIST_BUCKETS - 1 {
        HIST_BUCKETS - 1
    } else {
        i
    }
}

/// x86 page-fault error code bits (arch/x86/include/asm/trap_pf.h).
pub mod pf {
    /// The page was present: a protection fault (write to a read-only PTE, …).
    pub const PROT: u64 = 1 << 0;
    /// The access was a write.
    pub const WRITE: u64 = 1 << 1;
    /// The access came from user mode.
    pub const USER: u64 = 1 << 2;
    /// The access was an instruction fetch.
    pub const INSTR: u64 = 1 << 4;
}

/// Aggregates kept per CPU in the kernel and summed by userspace.
pub trait Merge: Default {
    /// Adds another CPU's (or entry's) counts into this one.
    fn merge(&mut self, other: &Self);
}

/// Per-process fault aggregate, kept per CPU in the kernel (`FAULT_STATS`, keyed by tgid)
/// and summed by userspace. Never streamed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Faults entering the handler on a user address (user or kernel mode).
    pub started: u64,
    /// Of `started`: write accesses.
    pub write: u64,
    /// Of `started`: instruction fetches.
    pub exec: u64,
    /// Of `started`: writes to a present page (copy-on-write / write-protect faults).
    pub cow: u64,
    /// Of `started`: taken in kernel mode (e.g. `read()` filling an untouched buffer).
    pub kernel_mode: u64,
    /// Minor faults the kernel accounted, as seen by the end hook (1 in `minor_period`).
    pub minor_seen: u64,
    /// Major faults the kernel accounted (end hook with period 1: exact).
    pub major: u64,
    /// Minor faults seen at the end hook whose start was found (timed).
    pub minor_timed: u64,
    /// Major faults whose start was found (timed).
    pub major_timed: u64,
    /// Sum of timed minor latencies.
    pub minor_time_ns: u64,
    /// Sum of timed major latencies.
    pub major_time_ns: u64,
    /// Latency histogram of timed minor faults.
    pub minor_hist: [u64; HIST_BUCKETS],
    /// Latency histogram of timed major faults.
    pub major_hist: [u64; HIST_BUCKETS],
    /// Reclaim stalls: direct (global) and memcg reclaim this process ran itself.
    pub reclaim: u64,
    /// Time spent in those stalls.
    pub reclaim_ns: u64,
    /// Faults served by a transparent huge page: a PMD-order folio was
    /// allocated while the fault was in flight.
    pub huge: u64,
    /// Fast minor faults timed as samples (`Config::fast_period` > 1): how
    /// many, their summed and squared latencies (unweighted; `minor_timed`
    /// and `minor_time_ns` hold them weighted by the faults each stands for).
    pub minor_sampled: u64,
    pub minor_sampled_ns: u64,
    pub minor_sampled_sq: u64,
    /// Faults the kernel took in the process's threads through
    /// `get_user_pages()` (on its own memory, or another process's through
    /// `process_vm_*`/ptrace): no exception, so not in `started` (nor in
    /// perf's page-fault events), but in its `min_flt`/`maj_flt`: `mlock`,
    /// `MAP_POPULATE`/`MAP_LOCKED`, `MADV_POPULATE_*`, pinning for DMA.
    /// Seen by the fexit and memcg ends only.
    pub populated: u64,
    /// Pages migrated by migrations this process's threads ran (the
    /// kernel's `migrate_pages()`, `migrate:mm_migrate_pages`), by reason
    /// ([`MIGRATE_REASONS`]): their own stall, whoever's pages they moved.
    pub migrated: [u64; MIGRATE_REASONS],
    /// Pages those migrations failed to move.
    pub migrate_failed: u64,
    /// The migrations (`migrate_pages()` calls) and the time spent in them.
    pub migrations: u64,
    pub migrate_ns: u64,
    /// Times NUMA balancing moved one of its threads to another node's CPU
    /// (`sched:sched_move_numa`, and either side of `sched:sched_swap_numa`).
    pub numa_moves: u64,
}
const _: () = assert!(core::mem::size_of::<FaultStats>() == 8 * (22 + MIGRATE_REASONS + 2 * HIST_BUCKETS));

/// Migration reasons as `FaultStats::migrated` buckets them: the kernel's
/// `enum migrate_reason` (include/linux/migrate_mode.h) folded into four.
pub const MIGRATE_REASONS: usize = 4;
/// Names of the buckets, in order (summary.json `migration.pages_by_reason`).
pub const MIGRATE_REASON_NAMES: [&str; MIGRATE_REASONS] = ["compaction", "numa_balancing", "syscall", "other"];

/// The bucket of a kernel `migrate_reason`: MR_COMPACTION (0); MR_NUMA_MISPLACED
/// (5); MR_SYSCALL (3: move_pages, migrate_pages, cpusets) and
/// MR_MEMPOLICY_MBIND (4); everything else (memory failure, hotplug,
/// contiguous ranges and CMA, long-term pins, demotion, DAMON).
#[inline(always)]
#[must_use]
pub const fn migrate_bucket(reason: i32) -> usize {
    match reason {
        0 => 0,
        5 => 1,
        3 | 4 => 2,
        _ => 3,
    }
}

impl Merge for FaultStats {
    fn merge(&mut self, o: &FaultStats) {
        self.started += o.started;
        self.write += o.write;
        self.exec += o.exec;
        self.cow += o.cow;
        self.kernel_mode += o.kernel_mode;
        self.minor_seen += o.minor_seen;
        self.major += o.major;
        self.minor_timed += o.minor_timed;
        self.major_timed += o.major_timed;
        self.minor_time_ns += o.minor_time_ns;
        self.major_time_ns += o.major_time_ns;
        for i in 0..HIST_BUCKETS {
            self.minor_hist[i] += o.minor_hist[i];
            self.major_hist[i] += o.major_hist[i];
        }
        self.reclaim += o.reclaim;
        self.reclaim_ns += o.reclaim_ns;
        self.huge += o.huge;
        self.minor_sampled += o.minor_sampled;
        self.minor_sampled_ns += o.minor_sampled_ns;
        self.minor_sampled_sq += o.minor_sampled_sq;
        self.populated += o.populated;
        for i in 0..MIGRATE_REASONS {
            self.migrated[i] += o.migrated[i];
        }
        self.migrate_failed += o.migrate_failed;
        self.migrations += o.migrations;
        self.migrate_ns += o.migrate_ns;
        self.numa_moves += o.numa_moves;
    }
}

/// A fault that entered the handler and has not yet been accounted.
/// One per CPU (`FAULT_SLOT`); parked in `FAULT_PARKED` (keyed by tid) when its
/// thread sleeps mid-fault, since majors sleep on I/O and may resume elsewhere.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InflightFault {
    pub tid: u32,
    /// Faults left on this CPU until the next stack sample (per-CPU slot only).
    pub stack_countdown: u32,
    /// Page number of the faulting address (address >> 12): the end hook matches on it.
    pub page: u64,
    pub start_ns: u64,
    /// Stack ids of this fault (`STACK_ID_NONE`: none taken; `STACK_ID_LOST`: failed).
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// Non-zero while this CPU walks a user stack (per-CPU slot only): faults
    /// the walk takes are nofault reads, not the program's faults.
    pub walking: u32,
    /// `INFLIGHT_*` bits.
    pub flags: u32,
    /// Faults left on this CPU until the next fast fault is timed (per-CPU
    /// slot only; `Config::fast_period`).
    pub time_countdown: u32,
    /// Faults of traced processes started on this CPU since the last timed
    /// fast fault, less the slow ones timed meanwhile: the weight the next
    /// sample stands for (per-CPU slot only).
    pub pending: u32,
}
const _: () = assert!(core::mem::size_of::<InflightFault>() == 48);
/// `InflightFault::flags`: counted as served by a huge page (once: a readahead
/// may add several PMD-order folios in one fault).
pub const INFLIGHT_HUGE: u32 = 1;
/// `InflightFault::flags`: its stack was taken because the fault turned out
/// slow (slept, or a huge page), in the exact stratum (`STRATUM_EXACT`).
pub const INFLIGHT_EXACT_STACK: u32 = 2;
/// `InflightFault::flags`: to be timed even if fast (1 in `Config::fast_period`,
/// or every fault when that is 0 or 1).
pub const INFLIGHT_SAMPLED: u32 = 4;
/// `InflightFault::flags`: a fault of an untraced process (the memcg end
/// leaves at once).
pub const INFLIGHT_UNTRACED: u32 = 8;
/// `InflightFault::flags`: a fast fault the memcg end let pass untimed; kept
/// until the thread's next fault or switch so a MAJ event right after can
/// still time it exactly.
pub const INFLIGHT_ENDED: u32 = 16;
/// `InflightFault::flags`: its page is in the resident sample
/// (`page_sampled`): streamed at its end with its stack (`PageSample`).
pub const INFLIGHT_PAGE: u32 = 32;
/// `InflightFault::flags`: its stack was taken only for the resident sample
/// (`INFLIGHT_PAGE`), not counted in the fault graphs' strata; a slow fault
/// counts it in the exact stratum then.
pub const INFLIGHT_PAGE_STACK: u32 = 64;
/// `InflightFault::flags`: a write to a present page (x86's `X86_PF_WRITE |
/// X86_PF_PROT`): copy-on-write, counted in its stack's `StackCounts::cow`.
pub const INFLIGHT_COW: u32 = 128;
/// `InflightFault::flags`: a copy-on-write fault that allocated a user page
/// (`kmem:mm_page_alloc`, order 0, `__GFP_MOVABLE`): the kernel copied the
/// page rather than reusing it. Counted once per fault
/// (`GranuleCounts::cow_copied`).
pub const INFLIGHT_COPIED: u32 = 256;
/// `InflightFault::flags`: its user stack was copied with its page's address
/// (`StackSampleHead::addr`), streamed as `PAGE_STACK_COPY`.
pub const INFLIGHT_STACK_COPY: u32 = 512;
/// `InflightFault::flags`: a write fault (x86's `X86_PF_WRITE`, arm64's
/// `FAULT_FLAG_WRITE`; never set where the fault start has no access type,
/// arm64's software event), streamed as `PAGE_WRITE`.
pub const INFLIGHT_WRITE: u32 = 1024;
