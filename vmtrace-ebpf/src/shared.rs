//! Maps and helpers every probe family uses: the traced set with its
//! per-process fault aggregate, drop counters, the event ring, and reading
//! tracepoint records.
use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TracePointContext,
    EbpfContext,
};
use vmtrace_common::{insert_error_slot, DropKind, FaultStats, InsertMap, CONTROL_WOKEN, DROPS_ENTRIES};

use crate::globals::{stopped, system_wide_counting, CONTROL};

/// Field at `offset` of a classic tracepoint's record. A tracepoint program
/// may load from its context at constant offsets; `read_at` instead calls
/// `bpf_probe_read_kernel`, a helper call per field.
#[inline(always)]
pub fn tp_field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: offsets come from the tracepoint formats; the verifier checks
    // that the load is inside the record and aligned.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}

/// A `Fixed` field of `vmtrace_common::TP_FIELDS`, read at its table offset
/// (a constant load): `tp_fixed!(ctx, RssSize: i64)`. The loader refuses the
/// program where the kernel's format has the field elsewhere; the type's
/// size is checked against the table's at compile time.
macro_rules! tp_fixed {
    ($ctx:expr, $f:ident: $t:ty) => {{
        const { assert!(core::mem::size_of::<$t>() == vmtrace_common::Tp::$f.size(), "the field's size") };
        $crate::shared::tp_field::<$t>($ctx, const { vmtrace_common::Tp::$f.fixed_offset() })
    }};
}
pub(crate) use tp_fixed;

/// A `Loaded` field of `vmtrace_common::TP_FIELDS`, read at the offset the
/// loader found in the kernel's format file: `tp_loaded!(ctx, OomAnonRss:
/// u64)`, `None` where the kernel's record lacks it.
macro_rules! tp_loaded {
    ($ctx:expr, $f:ident: $t:ty) => {{
        const {
            assert!(core::mem::size_of::<$t>() == vmtrace_common::Tp::$f.size(), "the field's size");
            assert!(vmtrace_common::Tp::$f.is_loaded(), "a Fixed field is read with tp_fixed!");
        };
        $crate::shared::tp_read_loaded::<$t>($ctx, vmtrace_common::Tp::$f)
    }};
}
pub(crate) use tp_loaded;

/// `tp_loaded!`'s read: `bpf_probe_read_kernel` at a variable offset (the
/// verifier refuses a direct context load at one).
#[inline(always)]
pub fn tp_read_loaded<T: Copy>(ctx: &TracePointContext, f: vmtrace_common::Tp) -> Option<T> {
    let off = crate::globals::tp_offset(f);
    if off == vmtrace_common::TpOffsets::MISSING {
        return None;
    }
    // SAFETY: an offset from the running kernel's format file; the helper
    // faults safely.
    unsafe { ctx.read_at::<T>(usize::from(off)) }.ok()
}

/// Per-process fault aggregates, keyed by tgid (not preallocated; the loader
/// sizes it by CPU count, vmtrace/src/loader/sizes.rs). It is also the traced set: a
/// tgid is traced iff it has an entry (userspace adds the target, the fork hook
/// every descendant), so the hot path does one lookup, not two. Userspace reads
/// and deletes a process's entry when it exits. With `-a`, entries are created
/// on a process's first fault.
#[map]
pub static FAULT_STATS: PerCpuHashMap<u32, FaultStats> = PerCpuHashMap::with_max_entries(32_768, BPF_F_NO_PREALLOC);

/// All-zero value to insert from: a `FaultStats` is too big for the 512-byte BPF stack.
#[map]
static ZERO_STATS: PerCpuArray<FaultStats> = PerCpuArray::with_max_entries(1, 0);

/// Adds a zeroed aggregate for `tgid` (BPF_NOEXIST: an existing one is kept).
#[inline(always)]
pub fn add_traced(tgid: u32) -> bool {
    let Some(zero) = ZERO_STATS.get(0) else { return false };
    match FAULT_STATS.insert(tgid, zero, 1) {
        Ok(()) => true,
        Err(e) => {
            let there = FAULT_STATS.get_ptr(tgid).is_some();
            if !there {
                count_insert_error(InsertMap::FaultStats, e);
            }
            there
        }
    }
}

#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    !stopped() && (system_wide_counting() || FAULT_STATS.get_ptr(tgid).is_some())
}

/// The current task's (tgid, tid) and this CPU's aggregate of its process,
/// when it is traced.
#[inline(always)]
pub fn current_stats() -> Option<(u32, u32, &'static mut FaultStats)> {
    if stopped() {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if let Some(p) = FAULT_STATS.get_ptr_mut(tgid) {
        // SAFETY: this CPU's value of a live entry; no other writer on this CPU.
        return Some((tgid, tid, unsafe { &mut *p }));
    }
    // With -a every process is traced from its first fault (pid 0: idle/kernel).
    if !system_wide_counting() || tgid == 0 {
        return None;
    }
    if !add_traced(tgid) {
        count_drop(DropKind::FaultStatsFull);
        return None;
    }
    // SAFETY: as above.
    FAULT_STATS.get_ptr_mut(tgid).map(|p| (tgid, tid, unsafe { &mut *p }))
}

/// This CPU's value for `key` in a per-CPU hash, inserted from `init` when
/// missing (BPF_NOEXIST: another CPU may have created it meanwhile).
#[inline(always)]
pub fn get_or_insert<K, V>(map: &PerCpuHashMap<K, V>, key: &K, init: &V) -> Option<&'static mut V> {
    try_get_or_insert(map, key, init).ok()
}

/// `get_or_insert`, counting the kernel's error under `which` when the
/// entry could not be made (an insert refused because another CPU made it
/// meanwhile is not an error: the entry is found).
#[inline(always)]
pub fn get_or_insert_counted<K, V>(
    map: &PerCpuHashMap<K, V>,
    which: InsertMap,
    key: &K,
    init: &V,
) -> Option<&'static mut V> {
    try_get_or_insert(map, key, init)
        .map_err(|refused| {
            if let Some(e) = refused {
                count_insert_error(which, e);
            }
        })
        .ok()
}

/// `get_or_insert`'s lookup, insert and lookup again; `Err` with the
/// insert's error (if it was refused) when no entry is there after it.
#[inline(always)]
fn try_get_or_insert<K, V>(map: &PerCpuHashMap<K, V>, key: &K, init: &V) -> Result<&'static mut V, Option<i32>> {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a live entry; no other writer on this CPU.
        return Ok(unsafe { &mut *p });
    }
    let refused = map.insert(key, init, 1).err();
    // SAFETY: as above.
    map.get_ptr_mut(key).map(|p| unsafe { &mut *p }).ok_or(refused)
}

/// Per-CPU drop counters, indexed by `DropKind`.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROPS_ENTRIES, 0);

#[inline(always)]
pub fn count_drop(kind: DropKind) {
    if let Some(p) = DROPS.get_ptr_mut(kind as u32) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// Counts an insert into `map` the kernel refused with `ret` (negative
/// errno), by error (`vmtrace_common::insert_error_slot`).
#[inline(always)]
pub fn count_insert_error(map: InsertMap, ret: i32) {
    if let Some(p) = DROPS.get_ptr_mut(insert_error_slot(map, ret)) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

const EVENTS_BYTES: u32 = 1024 * 1024;

/// Events for userspace: task life cycle, mapping changes, OOM kills.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Submit flags for frequent events (mapping changes). Waking the collector
/// on every one costs a context switch on a busy CPU; it polls every 100 ms
/// anyway, so it is woken only once a quarter of the ring waits (~3,000
/// events: headroom for ~100k events/s).
#[inline(always)]
pub fn batched_wakeup() -> u64 {
    if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) > u64::from(EVENTS_BYTES / 4) {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Submit flags for OOM events: wake the collector now (an OOM victim's
/// /proc is gone soon). Forced, because after unwoken records the kernel's
/// default wakes nobody (it wakes only when the reader had caught up).
pub const WAKE_NOW: u64 = BPF_RB_FORCE_WAKEUP as u64;

/// Submit flags for task and file-mapping events, which the collector wants
/// soon (a new task is told from a thread by reading /proc while it lives; a
/// mapped file is named from /proc/PID/fd while the fd is open): `WAKE_NOW`
/// for the first since userspace last drained the ring, none for the rest,
/// which that wakeup's drain (or the poll after it, which finds the ring
/// not empty) takes as well (`CONTROL_WOKEN`). Under `-a` a forced wakeup
/// per fork, exec, exit and file mapping was most of those programs' cost.
/// Called just before the submit: userspace clears the flag before it drains.
#[inline(always)]
pub fn wake_once() -> u64 {
    let Some(w) = CONTROL.get_ptr_mut(CONTROL_WOKEN) else { return WAKE_NOW };
    // SAFETY: a live array value; a race with another CPU forces one more wakeup at worst.
    unsafe {
        if core::ptr::read_volatile(w) != 0 {
            return u64::from(BPF_RB_NO_WAKEUP);
        }
        core::ptr::write_volatile(w, 1);
    }
    WAKE_NOW
}

/// A 64-bit finalizer (murmur3's fmix64): stack and Python chain hashes
/// mix each frame in with it.
#[inline(always)]
pub fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}
