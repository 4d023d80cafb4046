//! mmap-family calls and TLB flushes: per-process counts, call sites, the calls streamed.
use crate::{EventHeader, Merge};

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
    /// mlock and mlock2.
    Mlock = 6,
    Munlock = 7,
    Mlockall = 8,
    Munlockall = 9,
}
pub const MM_CALLS: usize = 10;
pub const MM_CALL_NAMES: [&str; MM_CALLS] =
    ["mmap", "munmap", "mremap", "madvise", "mprotect", "brk", "mlock", "munlock", "mlockall", "munlockall"];
/// mmap's `MAP_LOCKED` flag: the mapping is faulted in and locked as mlock does.
pub const MAP_LOCKED: u64 = 0x2000;

impl MmCall {
    /// Whether this call locks or unlocks memory (mlock family).
    #[must_use]
    pub fn is_lock_family(call: u32) -> bool {
        (MmCall::Mlock as u32..=MmCall::Munlockall as u32).contains(&call)
    }
}
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

/// A call that locked or unlocked memory (mlock, mlock2, munlock, mlockall,
/// munlockall, or an mmap with `MAP_LOCKED`), streamed at its return with the
/// process's locked and pinned page counts as the kernel then kept them
/// (`EventKind::MmLock`; these calls are rare).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MmLockEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub tid: u32,
    /// An `MmCall` (`Mmap` for an mmap with `MAP_LOCKED`).
    pub call: u32,
    /// The call site (`MmStackKey::user_stack`, `STACK_ID_NONE`: none taken).
    pub user_stack: i32,
    /// The syscall's return value (`-errno` on failure).
    pub ret: i64,
    /// mlock/munlock/mmap: the start (mmap: as asked) and the length; mlockall: 0, 0.
    pub addr: u64,
    pub len: u64,
    /// mlock2 and mlockall flags; mmap: its flags.
    pub flags: u64,
    /// `mm->locked_vm` and `mm->pinned_vm` in pages after the call; `u64::MAX`: unknown.
    pub locked_pages: u64,
    pub pinned_pages: u64,
    /// When the call entered (`hdr.ts_ns` is when it returned).
    pub start_ns: u64,
    /// A failed call's `RLIMIT_MEMLOCK` (soft, hard) in bytes as the kernel
    /// held it at the return (`u64::MAX`: unlimited), when `memlock_read`
    /// is 1: the process may be gone before /proc/PID/limits is read.
    pub memlock_cur: u64,
    pub memlock_max: u64,
    pub memlock_read: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<MmLockEvent>() == 16 + 16 + 8 + 24 + 16 + 8 + 24);
