//! Types shared by the kernel programs (`vmtrace-ebpf`) and userspace (`vmtrace`).
//!
//! Every type here is `#[repr(C)]` with explicit padding and no `bool`, so both
//! sides agree on the layout byte for byte; each has a compile-time size check.
//! The `user` feature adds `aya::Pod` impls for userspace.
#![no_std]

mod python;
mod resident;
mod samples;
pub use python::*;
pub use resident::*;
pub use samples::*;

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
}
const _: () = assert!(core::mem::size_of::<FaultStats>() == 8 * (17 + 2 * HIST_BUCKETS));

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

/// Key of the in-kernel stack aggregate (`FAULT_STACKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    /// Id in `STACKS` or `USER_STACKS`, else `STACK_ID_NONE` / `STACK_ID_LOST`.
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// `STRATUM_SAMPLED` or `STRATUM_EXACT`: how this stack's faults were
    /// chosen, so userspace weights each stratum by what it stands for.
    pub stratum: u32,
    /// `address >> LEAF_BLOCK_SHIFT` with `--leaf region`, else 0: userspace
    /// turns it into the memory region as the flamegraph's leaf.
    pub leaf_block: u64,
}
const _: () = assert!(core::mem::size_of::<StackKey>() == 24);

/// `StackKey::stratum`: a stack taken at random at 1 in `stack_period` fault
/// starts; it stands for the faults not in the exact stratum.
pub const STRATUM_SAMPLED: u32 = 0;
/// `StackKey::stratum`: a stack taken because its fault slept or was served
/// by a huge page; every such fault has one, so it stands for itself. Slow
/// faults carry most of the time and would be left to chance by sampling.
pub const STRATUM_EXACT: u32 = 1;

/// `CONTROL[0]` before the window: processes added to the traced set are
/// counted, `-a` counts nothing yet.
pub const CONTROL_READY: u32 = 0;
/// `CONTROL[0]` inside the window: `-a` counts every process.
pub const CONTROL_RUNNING: u32 = 1;
/// `CONTROL[0]` after it: nothing is counted, so the aggregates and the
/// kernel's own counters, read after, cover the same moment.
pub const CONTROL_STOPPED: u32 = 2;

/// Address block of `StackKey::leaf_block`: 64 KiB. (A *granule* is the
/// region aggregate's unit, `REGION_GRANULE_SHIFT`.)
pub const LEAF_BLOCK_SHIFT: u32 = 16;

/// Faults seen with one stack pair.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCounts {
    pub faults: u64,
    pub major: u64,
    /// Latency measured for `timed` of them (minor latency may be sampled).
    pub time_ns: u64,
    pub timed: u64,
}
const _: () = assert!(core::mem::size_of::<StackCounts>() == 32);

impl Merge for StackCounts {
    fn merge(&mut self, o: &StackCounts) {
        self.faults += o.faults;
        self.major += o.major;
        self.time_ns += o.time_ns;
        self.timed += o.timed;
    }
}

/// A stack aggregate this CPU is counting into (`STACK_CUR`, per CPU, a few
/// slots): a fault loop repeats a few stacks, so their counts gather here and
/// reach `FAULT_STACKS` when a slot's key changes. Userspace adds the slots
/// at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCur {
    pub key: StackKey,
    pub counts: StackCounts,
}
const _: () = assert!(core::mem::size_of::<StackCur>() == 24 + 32);

/// Slots of `STACK_CUR` per CPU.
pub const STACK_CUR_SLOTS: u32 = 16;

/// Address granule of the per-region aggregate: 256 KiB, 64 pages (one bit
/// each in `GranuleCounts::touched`). Each new granule costs the start hook a
/// hash insert, so a granule is as large as the bitmap allows.
pub const REGION_GRANULE_SHIFT: u32 = 18;

/// Pages per region granule.
pub const GRANULE_PAGES: u64 = 1 << (REGION_GRANULE_SHIFT - 12);
const _: () = assert!(GRANULE_PAGES <= 64, "GranuleCounts::touched has a bit per page");

/// Key of the per-region aggregate (`REGION_STATS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GranuleKey {
    pub tgid: u32,
    /// The process's address-space generation when the faults happened
    /// (`MAP_GEN_SLOTS`), so that each is placed in the mapping of its time.
    pub gen: u32,
    /// `address >> REGION_GRANULE_SHIFT`.
    pub granule: u64,
}
const _: () = assert!(core::mem::size_of::<GranuleKey>() == 16);

/// Faults in one granule (`REGION_GRANULE_SHIFT`) of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GranuleCounts {
    pub faults: u64,
    pub major: u64,
    pub write: u64,
    pub cow: u64,
    /// Measured latency of `timed` of them (minor latency may be sampled).
    pub time_ns: u64,
    pub timed: u64,
    /// Of `time_ns`: the majors' (every major is timed), so minor time alone
    /// is scaled when it is sampled.
    pub major_time_ns: u64,
    /// Bit i: page i of the granule faulted at least once.
    pub touched: u64,
    pub exec: u64,
    /// Faults served by a transparent huge page (see `FaultStats::huge`).
    pub huge: u64,
    /// Coarse latency histogram of the timed faults: bucket i holds latencies
    /// up to 1024 << 2i ns (1 µs, 4 µs, … 1.07 s), the last the rest; bucket
    /// i is exactly bucket 2i of the fine histogram.
    pub hist: [u32; GRANULE_HIST],
}
const _: () = assert!(core::mem::size_of::<GranuleCounts>() == 80 + 4 * GRANULE_HIST);

/// The granule this CPU is counting into (`GRANULE_CUR`, per CPU): faults
/// cluster, so counts gather here and reach `REGION_STATS` when the granule
/// changes. Userspace adds the slots of all CPUs at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GranuleCur {
    pub key: GranuleKey,
    pub counts: GranuleCounts,
}
const _: () = assert!(core::mem::size_of::<GranuleCur>() == 16 + core::mem::size_of::<GranuleCounts>());

impl Merge for GranuleCounts {
    fn merge(&mut self, o: &GranuleCounts) {
        self.faults += o.faults;
        self.major += o.major;
        self.write += o.write;
        self.cow += o.cow;
        self.time_ns += o.time_ns;
        self.timed += o.timed;
        self.major_time_ns += o.major_time_ns;
        self.touched |= o.touched;
        self.exec += o.exec;
        self.huge += o.huge;
        for i in 0..GRANULE_HIST {
            self.hist[i] += o.hist[i];
        }
    }
}

/// Folio order of a PMD-mapped transparent huge page on x86-64 (2 MiB).
pub const PMD_ORDER: u32 = 9;

pub const GRANULE_HIST: usize = 12;

/// Bucket of the coarse per-granule histogram for a latency.
#[inline(always)]
#[must_use]
pub fn granule_bucket(ns: u64) -> usize {
    // The fine bucket (ceil log2 from 1 µs), two fine buckets per coarse one.
    let fine = hist_bucket(ns);
    let coarse = fine.div_ceil(2);
    if coarse >= GRANULE_HIST {
        GRANULE_HIST - 1
    } else {
        coarse
    }
}

/// Key of page-cache additions per file (`FILE_CACHE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u32,
    /// `FILE_KEY_READ` or `FILE_KEY_WRITTEN`.
    pub kind: u32,
    pub ino: u64,
}

/// `FileKey::kind`: pages added to the page cache to be read from storage
/// (readahead, a fault, a read).
pub const FILE_KEY_READ: u32 = 0;
/// `FileKey::kind`: pages a write syscall added (they hold what the process
/// wrote; nothing was read from storage).
pub const FILE_KEY_WRITTEN: u32 = 1;
const _: () = assert!(core::mem::size_of::<FileKey>() == 16);

/// Key of page-cache additions per chunk of a file (`FILE_CHUNKS`): which
/// parts of a file came from disk, so a checkpoint's tensors can say how
/// much of each was read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileChunkKey {
    pub dev: u32,
    /// Page index in the file `>> FILE_CHUNK_SHIFT`.
    pub chunk: u32,
    pub ino: u64,
}
const _: () = assert!(core::mem::size_of::<FileChunkKey>() == 16);

/// `FileChunkKey::chunk`: 256 pages, 1 MiB.
pub const FILE_CHUNK_SHIFT: u32 = 8;

/// Which stacks to collect (`Config::stack_mode` bits).
pub const STACK_USER: u32 = 1;
pub const STACK_KERNEL: u32 = 2;

/// Why something was dropped; index into the per-CPU `DROPS` array.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropKind {
    /// The task-event ring buffer was full.
    TaskEventRingFull = 0,
    /// `FAULT_STATS` was full: a process's faults were not counted.
    FaultStatsFull = 1,
    /// `FAULT_STATS` (the traced set) was full: a new child could not be followed.
    TracedFull = 2,
    /// A fault ended with no recorded start (start hook missed it): counted, not timed.
    FaultUntimed = 3,
    /// The ring buffer was full when an OOM kill was reported.
    OomRingFull = 4,
    /// A stack could not be stored (`STACKS` full or a collision): counted without it.
    StackLost = 5,
    /// `FAULT_STACKS` was full: a sampled stack was not counted.
    StackCountsFull = 6,
    /// `MM_STATS` was full: a process's mmap/TLB counts are missing.
    MmStatsFull = 7,
    /// The ring buffer was full when a mapping change was reported.
    MmEventRingFull = 8,
    /// Retired, never counted: syscalls in flight are in a per-CPU slot, parked
    /// in an LRU map when their thread sleeps. The number is not reused.
    RetiredMmInflightFull = 9,
    /// `REGION_STATS` was full: a fault was counted, but not per region.
    RegionStatsFull = 10,
    /// `FILE_CHUNKS` was full: a page-cache addition counted for its file, not
    /// for the part of the file it was.
    FileChunksFull = 11,
    /// The stack-sample ring buffer was full: a user stack kept only its
    /// frame-pointer walk (not unwound through code without frame pointers).
    StackSampleRingFull = 12,
    /// The ring buffer was full when a major fault was to be streamed: it is
    /// counted, but has no slice in the Perfetto trace.
    FaultMajorRingFull = 13,
    /// `RSS_MM` was full: an address space's resident counters are missing.
    RssMmFull = 14,
    /// The ring buffer was full when a resident peak or end was reported:
    /// that snapshot of the sampled pages is missing (the totals are not).
    RssRingFull = 15,
    /// The ring buffer was full when a sampled page was to be streamed: it
    /// owns nothing in the resident profiles (the totals are exact anyway).
    PageSampleRingFull = 16,
}
pub const DROP_KINDS: u32 = 17;

/// Event kinds in the stream. Ranges per family; a retired number is never reused.
/// 1..=99 tasks, 100..=199 faults, 200..=299 mmap, 300..=399 tlb, 400..=499 oom,
/// 500..=599 stacks, 600..=699 resident memory.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    TaskFork = 1,
    TaskExec = 2,
    TaskExit = 3,
    FaultMajor = 100,
    MmMapChange = 200,
    OomMarkVictim = 400,
    StackSample = 500,
    PyStackStored = 501,
    ResidentPeak = 600,
    ResidentEnd = 601,
    PageSample = 602,
}

impl EventKind {
    #[must_use]
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::TaskFork),
            2 => Some(Self::TaskExec),
            3 => Some(Self::TaskExit),
            100 => Some(Self::FaultMajor),
            200 => Some(Self::MmMapChange),
            400 => Some(Self::OomMarkVictim),
            500 => Some(Self::StackSample),
            501 => Some(Self::PyStackStored),
            600 => Some(Self::ResidentPeak),
            601 => Some(Self::ResidentEnd),
            602 => Some(Self::PageSample),
            _ => None,
        }
    }
}

/// Fixed header first in every streamed event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// An [`EventKind`].
    pub kind: u32,
    /// Size of the whole event in bytes, header included.
    pub size: u32,
    /// `bpf_ktime_get_ns()` when it happened (CLOCK_MONOTONIC).
    pub ts_ns: u64,
}
const _: () = assert!(core::mem::size_of::<EventHeader>() == 16);

pub const COMM_LEN: usize = 16;

/// A user stack with Python frames was stored under `id` in the user stack
/// map: userspace reads its code objects at once, while `tgid` lives (a
/// script that faults just before it exits left them unread).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStackEvent {
    pub hdr: EventHeader,
    pub id: u32,
    pub tgid: u32,
}
const _: () = assert!(core::mem::size_of::<PyStackEvent>() == 24);

/// Process life-cycle event (fork, exec, exit). Fields a kind does not use are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskEvent {
    pub hdr: EventHeader,
    /// Thread id of the task (fork: the child).
    pub pid: u32,
    /// Thread-group id of the task (fork: the child's).
    pub tgid: u32,
    /// Fork: the parent's tgid. Otherwise 0.
    pub ppid: u32,
    /// Exit: `task->exit_code` as wait(2) encodes it.
    pub exit_code: u32,
    /// Exit: 1 when this was the last thread of its group.
    pub group_dead: u32,
    /// Fork: the parent's address-space generation, which the child's
    /// generation 0 continues; exec: the generation of the new address space.
    pub gen: u32,
    /// Exit with `group_dead`: the group's fault counters as the kernel keeps them
    /// (`signal->{min,maj}_flt` + the last thread's), the getrusage ground truth.
    pub kernel_min_flt: u64,
    pub kernel_maj_flt: u64,
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(core::mem::size_of::<TaskEvent>() == 16 + 24 + 16 + 16);

/// `Config::mm`: mmap-family syscalls and TLB flushes are traced.
pub const MM_ON: u32 = 1;
/// `Config::mm`: no `csd:csd_queue_cpu` on this kernel: count one IPI per
/// flush that sends IPIs (tlb_flush reason 4) instead of one per target CPU.
pub const MM_IPI_FROM_FLUSH: u32 = 2;

/// The memory-management syscalls vmtrace brackets (index into `MmStats::calls`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmCall {
    Mmap = 0,
    Munmap = 1,
    Mremap = 2,
    Madvise = 3,
    Mprotect = 4,
    Brk = 5,
}
pub const MM_CALLS: usize = 6;
pub const MM_CALL_NAMES: [&str; MM_CALLS] = ["mmap", "munmap", "mremap", "madvise", "mprotect", "brk"];
/// `madvise` advice values are counted in slots 0..31; larger ones (hwpoison…) in 31.
pub const ADVICE_SLOTS: usize = 32;
/// `tlb:tlb_flush` reasons (enum tlb_flush_reason): task switch, remote
/// shootdown (received), local shootdown, local mm shootdown, remote send IPI.
pub const TLB_REASONS: usize = 5;

/// Per-process memory-management and TLB aggregate (`MM_STATS`, per CPU, keyed
/// by tgid). Kept apart from `FaultStats` so the fault path stays small.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmStats {
    /// Calls per `MmCall`.
    pub calls: [u64; MM_CALLS],
    /// Bytes asked to be unmapped.
    pub munmap_bytes: u64,
    /// `madvise` calls by advice.
    pub advice: [u64; ADVICE_SLOTS],
    /// `tlb_flush` events in this process's context, by reason. Reason 1 is a
    /// shootdown this process *received* (it was running where the IPI landed).
    pub tlb_reason: [u64; TLB_REASONS],
    /// Pages in those of the flushes that named a range (a full flush,
    /// `TLB_FLUSH_ALL` = -1, is counted in `tlb_full_flushes` instead).
    pub tlb_pages: u64,
    /// Flushes of the whole TLB (the kernel's `pages` = `TLB_FLUSH_ALL`).
    pub tlb_full_flushes: u64,
    /// TLB-flush IPIs this process sent to other CPUs (one per target CPU).
    pub ipis_sent: u64,
    /// Of `ipis_sent`: sent during each `MmCall`, last slot outside any.
    pub ipis_by_call: [u64; MM_CALLS + 1],
}
const _: () =
    assert!(core::mem::size_of::<MmStats>() == 8 * (MM_CALLS + 1 + ADVICE_SLOTS + TLB_REASONS + 3 + MM_CALLS + 1));

impl Default for MmStats {
    fn default() -> Self {
        Self {
            calls: [0; MM_CALLS],
            munmap_bytes: 0,
            advice: [0; ADVICE_SLOTS],
            tlb_reason: [0; TLB_REASONS],
            tlb_pages: 0,
            tlb_full_flushes: 0,
            ipis_sent: 0,
            ipis_by_call: [0; MM_CALLS + 1],
        }
    }
}

impl Merge for MmStats {
    fn merge(&mut self, o: &MmStats) {
        for i in 0..MM_CALLS {
            self.calls[i] += o.calls[i];
        }
        for i in 0..=MM_CALLS {
            self.ipis_by_call[i] += o.ipis_by_call[i];
        }
        for i in 0..ADVICE_SLOTS {
            self.advice[i] += o.advice[i];
        }
        for i in 0..TLB_REASONS {
            self.tlb_reason[i] += o.tlb_reason[i];
        }
        self.munmap_bytes += o.munmap_bytes;
        self.tlb_pages += o.tlb_pages;
        self.tlb_full_flushes += o.tlb_full_flushes;
        self.ipis_sent += o.ipis_sent;
    }
}

/// A memory-management syscall in flight on a thread (`MM_SLOT` per CPU, `MM_PARKED` by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MmInflight {
    /// An `MmCall`.
    pub call: u32,
    pub user_stack: i32,
    /// Arguments: addr, len, prot/advice/new_len, flags, fd, offset.
    pub args: [u64; 6],
    /// The process's address-space generation after the call's enter bump.
    pub gen: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` at the syscall's enter: `MmEvent::start_ns`.
    pub start_ns: u64,
}
const _: () = assert!(core::mem::size_of::<MmInflight>() == 72);

/// Key of call-site stacks of memory-management syscalls (`MM_STACKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MmStackKey {
    pub tgid: u32,
    /// An `MmCall`.
    pub call: u32,
    pub user_stack: i32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<MmStackKey>() == 16);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MmStackCounts {
    pub calls: u64,
    /// TLB-flush IPIs sent while this call was in flight.
    pub ipis: u64,
}
const _: () = assert!(core::mem::size_of::<MmStackCounts>() == 16);

impl Merge for MmStackCounts {
    fn merge(&mut self, o: &MmStackCounts) {
        self.calls += o.calls;
        self.ipis += o.ipis;
    }
}

/// A mapping change of a traced process, so regions that come and go between
/// two reads of `/proc/PID/maps` are still known.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    /// An `MmCall` (mmap, munmap, mremap, mprotect or brk).
    pub call: u32,
    /// Resulting start (mmap/mremap return value), the unmapped or
    /// protected start; brk: the new break.
    pub addr: u64,
    /// Bytes; brk: 0.
    pub len: u64,
    /// mmap and mprotect.
    pub prot: u64,
    /// mmap and mremap.
    pub flags: u64,
    /// `fd` as passed (u64::MAX for -1).
    pub fd: u64,
    pub offset: u64,
    /// mremap: the old start and length; brk: the requested break.
    pub old_addr: u64,
    pub old_len: u64,
    /// Address-space generations before and after the change took effect
    /// (bumped at the call's enter and exit): a fault counted at a generation
    /// in `[gen_enter, gen_exit)` raced it.
    pub gen_enter: u32,
    pub gen_exit: u32,
    /// mmap of a file: its device (major << 20 | minor) and inode, read in
    /// the kernel while the fd is open; 0 when unknown.
    pub dev: u32,
    /// The thread that made the call.
    pub tid: u32,
    pub ino: u64,
    /// When the call entered (`hdr.ts_ns` is when it returned).
    pub start_ns: u64,
}
const _: () = assert!(core::mem::size_of::<MmEvent>() == 16 + 8 + 64 + 8 + 16 + 8);

/// A major fault, streamed when `Config::stream_majors` is set: majors are
/// rare (each waits for I/O), so one record each is cheap. `hdr.ts_ns` is
/// when the fault entered the handler.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FaultMajorEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub tid: u32,
    /// Time in the handler.
    pub duration_ns: u64,
    /// Page-aligned faulting address.
    pub addr: u64,
    /// The fault's user stack id (`StackKey::user_stack`; `STACK_ID_NONE`: none taken).
    pub user_stack: i32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<FaultMajorEvent>() == 16 + 8 + 16 + 8);

/// One process's address-space generation (`MAP_GEN`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapGenSlot {
    /// `tgid << 32 | generation`; 0: free.
    pub tag_gen: u64,
    /// 1: a fault was counted at the current generation. A mapping change
    /// bumps the generation only then: changes with no fault between them
    /// share one, and churn without faults makes no new granule keys.
    pub dirty: u32,
    pub _pad: u32,
}

/// Slots of the address-space generation array (`MAP_GEN`), indexed by
/// tgid modulo this; a process whose slot is taken uses an overflow hash.
pub const MAP_GEN_SLOTS: u32 = 1 << 16;
/// Generation of a fault whose process's counter was lost.
pub const GEN_UNKNOWN: u32 = u32::MAX;

/// An OOM kill, from `oom:mark_victim`, which runs in the task that invoked
/// the OOM killer: the trigger. Sizes are in kB, as the tracepoint reports them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomEvent {
    pub hdr: EventHeader,
    pub victim_pid: u32,
    pub trigger_tgid: u32,
    pub trigger_tid: u32,
    pub uid: u32,
    pub oom_score_adj: i32,
    /// From `oom_kill_process()` where a kprobe/fentry runs there: the kernel's
    /// `enum oom_constraint` + 1 (1 none, 2 cpuset, 3 mempolicy, 4 memcg); 0 unknown.
    pub constraint: u32,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    pub pgtables_kb: u64,
    pub victim_comm: [u8; COMM_LEN],
    pub trigger_comm: [u8; COMM_LEN],
    /// kernfs id (= inode number of the cgroup directory) of the victim's and the
    /// trigger's memory cgroup, read in the kernel at the kill; 0 when unknown.
    pub victim_memcg_id: u64,
    pub trigger_memcg_id: u64,
    /// kernfs id of the memory cgroup that ran out (`oc->memcg`); 0 when the
    /// OOM was not a memcg one or `oom_kill_process()` could not be probed.
    pub oom_memcg_id: u64,
}
const _: () = assert!(core::mem::size_of::<OomEvent>() == 16 + 24 + 40 + 32 + 24);

/// Kernel struct field offsets read from BTF at load time, passed as a read-only
/// global (`KOFFSETS`). `u32::MAX` marks a field this kernel lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    pub task_signal: u32,
    pub task_min_flt: u32,
    pub task_maj_flt: u32,
    pub signal_live: u32,
    pub signal_min_flt: u32,
    pub signal_maj_flt: u32,
    /// `signal_struct.thread_head` and `task_struct.thread_node`: the list
    /// of a group's live threads, whose own counts are not yet in
    /// `signal->min_flt` (`getrusage(RUSAGE_SELF)` sums them the same way).
    pub signal_thread_head: u32,
    pub task_thread_node: u32,
    /// `task_struct.cgroups` (struct css_set *).
    pub task_cgroups: u32,
    /// `css_set.subsys[memory_cgrp_id]`: offset of the memory controller's css pointer.
    pub css_set_memory: u32,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`.
    pub kernfs_id: u32,
    /// `oom_control.memcg`, `.constraint`, `.chosen`: the OOM domain at
    /// `oom_kill_process()`.
    pub oom_memcg: u32,
    pub oom_constraint: u32,
    pub oom_chosen: u32,
    /// `mem_cgroup.css`.
    pub memcg_css: u32,
    /// The file behind an fd: `task_struct.files`, `files_struct.fdt`,
    /// `fdtable.fd` and `.max_fds`, `file.f_inode`, `inode.i_ino` and
    /// `.i_sb`, `super_block.s_dev` (names a mapped file whose fd is closed
    /// or reused by the time userspace looks).
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `task_struct.thread.fsbase` (x86-64): the user FS base, which glibc
    /// sets to the thread's `pthread_t` (CPython 3.10's thread states name
    /// their thread by it).
    pub task_fsbase: u32,
}
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 116);

impl KernelOffsets {
    pub const MISSING: u32 = u32::MAX;
    pub const UNKNOWN: Self = Self {
        task_pid: Self::MISSING,
        task_tgid: Self::MISSING,
        task_exit_code: Self::MISSING,
        task_signal: Self::MISSING,
        task_min_flt: Self::MISSING,
        task_maj_flt: Self::MISSING,
        signal_live: Self::MISSING,
        signal_min_flt: Self::MISSING,
        signal_maj_flt: Self::MISSING,
        signal_thread_head: Self::MISSING,
        task_thread_node: Self::MISSING,
        task_cgroups: Self::MISSING,
        css_set_memory: Self::MISSING,
        css_cgroup: Self::MISSING,
        cgroup_kn: Self::MISSING,
        kernfs_id: Self::MISSING,
        oom_memcg: Self::MISSING,
        oom_constraint: Self::MISSING,
        oom_chosen: Self::MISSING,
        memcg_css: Self::MISSING,
        task_files: Self::MISSING,
        files_fdt: Self::MISSING,
        fdtable_fd: Self::MISSING,
        fdtable_max_fds: Self::MISSING,
        file_inode: Self::MISSING,
        inode_ino: Self::MISSING,
        inode_sb: Self::MISSING,
        sb_dev: Self::MISSING,
        task_fsbase: Self::MISSING,
    };
}

/// Run-time settings, a read-only global (`CONFIG`) set by the loader.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// 1: trace every process (`-a`); 0: only tgids with a `FAULT_STATS` entry.
    pub trace_all: u32,
    /// Period of the minor-fault end hook (1 = every minor fault timed).
    pub minor_period: u32,
    /// `STACK_USER | STACK_KERNEL` bits; 0 = no stacks.
    pub stack_mode: u32,
    /// Take a stack on 1 in N faults (per CPU).
    pub stack_period: u32,
    /// 1: key stacks by address block too (`--leaf region`, `LEAF_BLOCK_SHIFT`).
    pub leaf_region: u32,
    /// `MM_*` bits: mmap-family/TLB tracing on, IPI counting fallback.
    pub mm: u32,
    /// Address of the kernel's `flush_tlb_func`: IPIs with this callback are TLB shootdowns.
    pub flush_tlb_func: u64,
    /// 1: count faults per region granule (`REGION_GRANULE_SHIFT`) for region attribution.
    pub regions: u32,
    /// For the fexit end hook on `handle_mm_fault`, from kernel BTF: the
    /// `vm_fault_t` bits of faults the kernel does not account (VM_FAULT_ERROR
    /// | VM_FAULT_RETRY), VM_FAULT_MAJOR, and FAULT_FLAG_TRIED (a retried fault
    /// counts as major), as `mm_account_fault()` decides.
    pub vm_fault_unaccounted: u32,
    pub vm_fault_major: u32,
    pub fault_flag_tried: u32,
    /// How user stacks are taken: 0 = `bpf_get_stackid` into `STACKS`; else
    /// walked by the programs themselves into `USER_STACKS` (needs
    /// `bpf_task_pt_regs`, 5.15+), `USER_WALK_FRAMES` or `USER_WALK_WINDOWS`.
    pub user_walk: u32,
    /// `PGFAULT`'s value in the kernel's `enum vm_event_item`, plus one; 0 when
    /// the fault end is not `memcg:count_memcg_events` (see the fault probes).
    pub memcg_pgfault: u32,
    /// Bytes of user stack copied with the registers where a frame-pointer
    /// walk did not end cleanly (`StackSample`), one of `STACK_WINDOWS`; 0 = none.
    pub stack_window: u32,
    /// 1: every major fault is streamed (`EventKind::FaultMajor`) for the
    /// Perfetto trace; 0: majors are only counted.
    pub stream_majors: u32,
    /// With the memcg end: every slow fault (slept, huge, major) is timed
    /// exactly and 1 in `fast_period` of the fast minor faults (per CPU,
    /// random stride), weighted by the faults it stands for; 0 or 1 = every
    /// fault timed.
    pub fast_period: u32,
    /// `THP_FAULT_ALLOC` and `THP_FILE_ALLOC` in `enum vm_event_item`, plus
    /// one (0: not known): the memcg end marks the fault in flight huge on
    /// them, in place of the `mm_page_alloc` hook.
    pub memcg_thp_fault: u32,
    pub memcg_thp_file: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Config>() == 80);

/// `Config::user_walk`: a 16-byte read per frame.
pub const USER_WALK_FRAMES: u32 = 1;
/// `Config::user_walk`: 1 KiB reads, each usually holding several frames. The
/// verifier of 6.1 gives up on this loop (its paths do not converge); 6.12's
/// takes it.
pub const USER_WALK_WINDOWS: u32 = 2;

/// Bit 30 of every id in `USER_STACKS`: ids in `STACKS` stay below it.
pub const OWN_STACK_ID: u32 = 1 << 30;

/// Stack id (`StackKey`, `InflightFault`, `MmStackKey`) of a stack not taken:
/// that kind of stack is off, or the fault was not sampled.
pub const STACK_ID_NONE: i32 = -1;
/// Stack id of a stack that was to be taken but could not be read or stored
/// (`DropKind::StackLost`): the event is counted without it.
pub const STACK_ID_LOST: i32 = -2;

/// Deepest user stack recorded: the kernel's own limit (PERF_MAX_STACK_DEPTH).
pub const USER_STACK_DEPTH: usize = 127;

/// A user stack walked through frame pointers by the programs (`USER_STACKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    /// 64-bit hash of the frames: the map is keyed by 30 bits of it, so this
    /// tells a stored stack from a colliding one.
    pub hash: u64,
    pub nr: u64,
    /// Innermost first: the faulting instruction, then return addresses.
    pub ips: [u64; USER_STACK_DEPTH],
    /// The process whose Python frames these are (the first to store the
    /// stack): where userspace reads their code objects.
    pub py_tgid: u32,
    pub _pad: u32,
    /// Python frames recorded in `py` (0: none, or not a known interpreter).
    pub py_nr: u32,
    /// Bit i: `py[i]` is the outermost Python frame of its
    /// `_PyEval_EvalFrameDefault` call.
    pub py_ends: u32,
    /// Innermost first.
    pub py: [PyFrame; PY_DEPTH],
}
const _: () = assert!(core::mem::size_of::<UserStack>() == 1032 + 16 + 16 * PY_DEPTH);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), made only of integers, with no implicit padding
    // (checked by the size asserts above).
    unsafe impl aya::Pod for super::FaultStats {}
    unsafe impl aya::Pod for super::InflightFault {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::PyProc {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::StackCounts {}
    unsafe impl aya::Pod for super::StackCur {}
    unsafe impl aya::Pod for super::MmStats {}
    unsafe impl aya::Pod for super::GranuleKey {}
    unsafe impl aya::Pod for super::GranuleCounts {}
    unsafe impl aya::Pod for super::GranuleCur {}
    unsafe impl aya::Pod for super::MapGenSlot {}
    unsafe impl aya::Pod for super::FileKey {}
    unsafe impl aya::Pod for super::FileChunkKey {}
    unsafe impl aya::Pod for super::MmStackKey {}
    unsafe impl aya::Pod for super::MmStackCounts {}
    unsafe impl aya::Pod for super::MmEvent {}
    unsafe impl aya::Pod for super::FaultMajorEvent {}
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::TaskEvent {}
    unsafe impl aya::Pod for super::PyStackEvent {}
    unsafe impl aya::Pod for super::OomEvent {}
    unsafe impl aya::Pod for super::StackSampleHead {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::RssMm {}
    unsafe impl aya::Pod for super::RssEvent {}
    unsafe impl aya::Pod for super::PageSample {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ceil_log2_from_1us() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1024), 0);
        assert_eq!(hist_bucket(1025), 1);
        assert_eq!(hist_bucket(2048), 1);
        assert_eq!(hist_bucket(65_000), 6); // <= 65536
        assert_eq!(hist_bucket(1 << 30), 20);
        assert_eq!(hist_bucket((1 << 30) + 1), HIST_BUCKETS - 1);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn coarse_buckets_step_by_four() {
        assert_eq!(granule_bucket(1000), 0); // <= 1 µs
        assert_eq!(granule_bucket(1025), 1); // <= 4 µs
        assert_eq!(granule_bucket(4096), 1);
        assert_eq!(granule_bucket(4097), 2); // <= 16 µs
        assert_eq!(granule_bucket(65_536), 3); // <= 64 µs
        assert_eq!(granule_bucket(4 << 20), 6); // <= 4 ms
        assert_eq!(granule_bucket(5 << 20), 7); // <= 16 ms
        assert_eq!(granule_bucket(1 << 30), 10); // <= 1.07 s
        assert_eq!(granule_bucket((1 << 30) + 1), 11);
        assert_eq!(granule_bucket(u64::MAX), 11);
    }

    #[test]
    fn event_kinds_round_trip() {
        for k in [
            EventKind::TaskFork,
            EventKind::TaskExec,
            EventKind::TaskExit,
            EventKind::FaultMajor,
            EventKind::MmMapChange,
            EventKind::OomMarkVictim,
            EventKind::StackSample,
            EventKind::PyStackStored,
            EventKind::ResidentPeak,
            EventKind::ResidentEnd,
            EventKind::PageSample,
        ] {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(99), None);
    }

    #[test]
    fn stats_add_sums_every_field() {
        let mut a = FaultStats { started: 1, major: 2, ..Default::default() };
        a.minor_hist[3] = 4;
        let b = a;
        a.merge(&b);
        assert_eq!(a.started, 2);
        assert_eq!(a.major, 4);
        assert_eq!(a.minor_hist[3], 8);
    }
}
