//! Maps and read-only globals shared by all probe families.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use vmtrace_common::{Config, DropKind, FaultStats, InflightFault, KernelOffsets, DROP_KINDS};

/// Set by the loader before load; never written here.
#[unsafe(no_mangle)]
static CONFIG: Config = Config { trace_all: 0, minor_period: 1 };

/// Kernel struct offsets from BTF, set by the loader.
#[unsafe(no_mangle)]
static KOFFSETS: KernelOffsets = KernelOffsets::UNKNOWN;

#[inline(always)]
pub fn config() -> Config {
    // SAFETY: a global the loader rewrites before load; volatile so the compiler
    // does not fold the default value in.
    unsafe { core::ptr::read_volatile(&raw const CONFIG) }
}

#[inline(always)]
pub fn koffsets() -> KernelOffsets {
    // SAFETY: as for `config`.
    unsafe { core::ptr::read_volatile(&raw const KOFFSETS) }
}

/// Thread-group ids being traced (value unused). Filled by userspace with the
/// target and by the fork hook with every descendant.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(65_536, 0);

/// Per-process fault aggregates, keyed by tgid.
#[map]
pub static FAULT_STATS: PerCpuHashMap<u32, FaultStats> = PerCpuHashMap::with_max_entries(16_384, 0);

/// All-zero value to insert from: a `FaultStats` is too big for the 512-byte BPF stack.
#[map]
pub static ZERO_STATS: PerCpuArray<FaultStats> = PerCpuArray::with_max_entries(1, 0);

/// The fault in flight on this CPU.
#[map]
pub static FAULT_SLOT: PerCpuArray<InflightFault> = PerCpuArray::with_max_entries(1, 0);

/// Faults whose thread was switched out mid-fault, keyed by tid. LRU: an entry
/// whose fault never completed (SIGSEGV) ages out instead of filling the map.
#[map]
pub static FAULT_PARKED: LruHashMap<u32, InflightFault> = LruHashMap::with_max_entries(16_384, 0);

/// Per-CPU drop counters, indexed by `DropKind`.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_KINDS, 0);

/// Task life-cycle events for userspace.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[inline(always)]
pub fn count_drop(kind: DropKind) {
    if let Some(p) = DROPS.get_ptr_mut(kind as u32) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// (tgid, tid) of the current task when it is traced.
#[inline(always)]
pub fn current_if_traced() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if config().trace_all != 0 {
        // The idle task (pid 0) and kernel threads never take user faults we want.
        return if tgid == 0 { None } else { Some((tgid, tid)) };
    }
    // SAFETY: the value is only tested for presence.
    if unsafe { TRACED.get(&tgid) }.is_some() {
        Some((tgid, tid))
    } else {
        None
    }
}

/// This CPU's aggregate for `tgid`, created on first use.
#[inline(always)]
pub fn fault_stats(tgid: u32) -> Option<&'static mut FaultStats> {
    if let Some(p) = FAULT_STATS.get_ptr_mut(&tgid) {
        // SAFETY: per-CPU value of a live entry.
        return Some(unsafe { &mut *p });
    }
    let zero = ZERO_STATS.get(0)?;
    // BPF_NOEXIST: another CPU may have created it meanwhile; that is fine.
    if FAULT_STATS.insert(&tgid, zero, 1).is_err() && FAULT_STATS.get_ptr_mut(&tgid).is_none() {
        count_drop(DropKind::FaultStatsFull);
        return None;
    }
    // SAFETY: as above.
    FAULT_STATS.get_ptr_mut(&tgid).map(|p| unsafe { &mut *p })
}
