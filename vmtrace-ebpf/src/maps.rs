//! Maps and read-only globals shared by all probe families.
use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, TracePointContext},
    EbpfContext,
};
use vmtrace_common::{
    Config, DropKind, FaultStats, FileKey, GranuleCounts, GranuleCur, GranuleKey, InflightFault, KernelOffsets, Merge,
    MmInflight, MmStackCounts, MmStackKey, MmStats, StackCounts, StackCur, StackKey, CONTROL_RUNNING, CONTROL_STOPPED,
    DROP_KINDS, REGION_GRANULE_SHIFT, STACK_CUR_SLOTS,
};

/// Written by userspace, `CONTROL_*`: the window every aggregate covers, the
/// same as the kernel's own counters' (opened at its start, read at its end).
#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn control() -> u32 {
    CONTROL.get(0).copied().unwrap_or(CONTROL_STOPPED)
}

#[inline(always)]
pub fn stopped() -> bool {
    control() == CONTROL_STOPPED
}

/// `-a` counts a process only inside the window; a traced target is counted
/// from the moment it is added, which userspace does inside it.
#[inline(always)]
fn system_wide_counting() -> bool {
    config().trace_all != 0 && control() == CONTROL_RUNNING
}

/// Set by the loader before load; never written here.
#[unsafe(no_mangle)]
static CONFIG: Config = Config {
    trace_all: 0,
    minor_period: 1,
    stack_mode: 0,
    stack_period: 1,
    leaf_region: 0,
    mm: 0,
    flush_tlb_func: 0,
    regions: 0,
    vm_fault_unaccounted: 0,
    vm_fault_major: 0,
    fault_flag_tried: 0,
    user_walk: 0,
    memcg_pgfault: 0,
};

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

/// Field at `offset` of a classic tracepoint's record. A tracepoint program
/// may load from its context at constant offsets; `read_at` instead calls
/// `bpf_probe_read_kernel`, ~25 ns a field here.
#[inline(always)]
pub fn tp_field<T: Copy>(ctx: &TracePointContext, offset: usize) -> T {
    // SAFETY: offsets come from the tracepoint formats; the verifier checks
    // that the load is inside the record and aligned.
    unsafe { core::ptr::read_volatile(ctx.as_ptr().cast::<u8>().add(offset).cast::<T>()) }
}

/// Per-process fault aggregates, keyed by tgid. It is also the traced set: a
/// tgid is traced iff it has an entry (userspace adds the target, the fork hook
/// every descendant), so the hot path does one lookup, not two. Userspace reads
/// and deletes a process's entry when it exits. With `-a`, entries are created
/// on a process's first fault.
#[map]
pub static FAULT_STATS: PerCpuHashMap<u32, FaultStats> = PerCpuHashMap::with_max_entries(32_768, 0);

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

/// Call stacks (user and kernel) of sampled faults, by id.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(16_384, 0);

/// Fault counts per (process, user stack, kernel stack).
#[map]
pub static FAULT_STACKS: PerCpuHashMap<StackKey, StackCounts> = PerCpuHashMap::with_max_entries(65_536, 0);

/// The stack aggregates this CPU counts into, direct-mapped by key; see `StackCur`.
#[map]
pub static STACK_CUR: PerCpuArray<StackCur> = PerCpuArray::with_max_entries(STACK_CUR_SLOTS, 0);

/// Counts for `key`: its slot in this CPU's `STACK_CUR`, after moving the
/// slot's previous key's counts into `FAULT_STACKS` if it differs. Two ways of
/// several slots, as an unrolled loop faults at a few instructions in turn.
/// With a stack on every fault this saves a hash lookup (~50 ns here) per fault.
#[inline(always)]
pub fn stack_counts(key: &StackKey) -> Option<&'static mut StackCounts> {
    // Stack ids are hash-derived: their low bits spread keys over the slots.
    let i = ((key.user_stack ^ key.kernel_stack) as u32 ^ key.granule as u32) % STACK_CUR_SLOTS;
    // SAFETY: this CPU's slots; BPF programs on one CPU do not interleave.
    let cur = unsafe { &mut *STACK_CUR.get_ptr_mut(i)? };
    if cur.key == *key {
        return Some(&mut cur.counts);
    }
    // SAFETY: as above.
    let other = unsafe { &mut *STACK_CUR.get_ptr_mut(i ^ 1)? };
    if other.key == *key {
        return Some(&mut other.counts);
    }
    let c = cur.counts;
    if c.faults | c.major | c.timed != 0 {
        match get_or_insert(&FAULT_STACKS, &cur.key, &StackCounts::default()) {
            Some(v) => v.merge(&c),
            None => count_drop(DropKind::StackCountsFull),
        }
    }
    cur.key = *key;
    cur.counts = StackCounts::default();
    Some(&mut cur.counts)
}

/// The current user stack's id: in `USER_STACKS` where the programs walk it
/// themselves (`Config::user_walk`), else in `STACKS`; -2 when it cannot be
/// stored. The walk reads user memory through frame pointers and may fault;
/// those nested faults re-enter the fault hooks, which skip them while this
/// CPU's slot says it is walking (the kernel never accounts them).
#[inline(always)]
pub fn user_stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    let slot = FAULT_SLOT.get_ptr_mut(0);
    if let Some(s) = slot {
        // SAFETY: this CPU's slot; BPF programs on one CPU do not interleave.
        unsafe { (*s).walking = 1 };
    }
    // A constant of the frozen CONFIG: the verifier drops the branch not
    // taken, so kernels without bpf_task_pt_regs load the other.
    let own = if config().user_walk != 0 { crate::ustack::walk() } else { None };
    let id = own.unwrap_or_else(|| ctx.get_stackid(&STACKS, u64::from(BPF_F_USER_STACK)).map_or(-2, |id| id as i32));
    if let Some(s) = slot {
        // SAFETY: as above.
        unsafe { (*s).walking = 0 };
    }
    id
}

/// Per-process mmap-family and TLB aggregate, keyed by tgid (processes in the
/// traced set only). Userspace takes an exited process's entry, as for faults.
#[map]
pub static MM_STATS: PerCpuHashMap<u32, MmStats> = PerCpuHashMap::with_max_entries(16_384, 0);

/// All-zero `MmStats` to insert from (too big for the BPF stack).
#[map]
pub static ZERO_MM: PerCpuArray<MmStats> = PerCpuArray::with_max_entries(1, 0);

/// The memory-management syscall in flight on this CPU (`tid` 0: none): TLB
/// IPIs sent meanwhile are blamed on it and its call site. A per-CPU slot, as
/// for faults: a hash insert and delete per call cost ~250 ns here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MmSlot {
    pub tid: u32,
    pub _pad: u32,
    pub call: MmInflight,
}

#[map]
pub static MM_SLOT: PerCpuArray<MmSlot> = PerCpuArray::with_max_entries(1, 0);

/// Calls whose thread was switched out mid-call (they sleep on locks and
/// I/O), by tid. LRU: a call that never returns (its task was killed) ages out.
#[map]
pub static MM_PARKED: LruHashMap<u32, MmInflight> = LruHashMap::with_max_entries(16_384, 0);

/// Starts `call` on thread `tid`.
#[inline(always)]
pub fn mm_begin(tid: u32, call: &MmInflight) {
    if let Some(s) = MM_SLOT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs on one CPU do not interleave.
        unsafe { *s = MmSlot { tid, _pad: 0, call: *call } };
    }
}

/// Ends thread `tid`'s call in flight and returns it.
#[inline(always)]
pub fn mm_end(tid: u32) -> Option<MmInflight> {
    if let Some(s) = MM_SLOT.get_ptr_mut(0) {
        // SAFETY: as above.
        let s = unsafe { &mut *s };
        if s.tid == tid {
            s.tid = 0;
            return Some(s.call);
        }
    }
    // SAFETY: copied out before removal.
    let parked = unsafe { MM_PARKED.get(&tid) }.copied()?;
    let _ = MM_PARKED.remove(&tid);
    Some(parked)
}

/// Thread `tid`'s call in flight: (call, user stack id).
#[inline(always)]
pub fn mm_current(tid: u32) -> Option<(u32, i32)> {
    if let Some(s) = MM_SLOT.get_ptr(0) {
        // SAFETY: as above.
        let s = unsafe { &*s };
        if s.tid == tid {
            return Some((s.call.call, s.call.user_stack));
        }
    }
    // SAFETY: a live map value, read at once.
    MM_PARKED.get_ptr(&tid).map(|p| unsafe { ((*p).call, (*p).user_stack) })
}

/// Moves the leaving thread's call in flight to `MM_PARKED` (`sched_switch`).
#[inline(always)]
pub fn mm_park(tid: u32) {
    let Some(s) = MM_SLOT.get_ptr_mut(0) else { return };
    // SAFETY: as above; preemption is off in __schedule.
    let s = unsafe { &mut *s };
    if s.tid != 0 && s.tid == tid {
        s.tid = 0;
        // LRU map: insertion cannot fail for lack of room.
        let _ = MM_PARKED.insert(&tid, &s.call, 0);
    }
}

/// Calls and IPIs per (process, syscall, user call site).
#[map]
pub static MM_STACKS: PerCpuHashMap<MmStackKey, MmStackCounts> = PerCpuHashMap::with_max_entries(16_384, 0);

/// This CPU's value for `key` in a per-CPU hash, inserted from `init` when
/// missing (BPF_NOEXIST: another CPU may have created it meanwhile).
#[inline(always)]
pub fn get_or_insert<K, V>(map: &PerCpuHashMap<K, V>, key: &K, init: &V) -> Option<&'static mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a live entry; no other writer on this CPU.
        return Some(unsafe { &mut *p });
    }
    let _ = map.insert(key, init, 1);
    // SAFETY: as above.
    map.get_ptr_mut(key).map(|p| unsafe { &mut *p })
}

/// This CPU's aggregate for `tgid`, created on first use.
#[inline(always)]
pub fn mm_stats(tgid: u32) -> Option<&'static mut MmStats> {
    let m = get_or_insert(&MM_STATS, &tgid, ZERO_MM.get(0)?);
    if m.is_none() {
        count_drop(DropKind::MmStatsFull);
    }
    m
}

/// Faults per (process, region granule): userspace maps granules to regions.
#[map]
pub static REGION_STATS: PerCpuHashMap<GranuleKey, GranuleCounts> = PerCpuHashMap::with_max_entries(262_144, 0);

/// Pages added to the page cache per file by traced processes (readahead).
#[map]
pub static FILE_CACHE: PerCpuHashMap<FileKey, u64> = PerCpuHashMap::with_max_entries(16_384, 0);

/// The granule this CPU counts into; see `GranuleCur`.
#[map]
pub static GRANULE_CUR: PerCpuArray<GranuleCur> = PerCpuArray::with_max_entries(1, 0);

/// Counts for the granule of `address` in `tgid`: this CPU's current granule,
/// after moving the previous one's counts into `REGION_STATS` if it differs.
/// One hash operation per run of faults in a granule instead of one per fault.
#[inline(always)]
pub fn granule_counts(tgid: u32, address: u64) -> Option<&'static mut GranuleCounts> {
    let key = GranuleKey { tgid, _pad: 0, granule: address >> REGION_GRANULE_SHIFT };
    // SAFETY: this CPU's slot; BPF programs on one CPU do not interleave.
    let cur = unsafe { &mut *GRANULE_CUR.get_ptr_mut(0)? };
    if cur.key != key {
        if cur.counts.faults | cur.counts.major | cur.counts.timed | cur.counts.huge != 0 {
            flush_granule(&cur.key, &cur.counts);
        }
        cur.key = key;
        cur.counts = GranuleCounts::default();
    }
    Some(&mut cur.counts)
}

#[inline(always)]
fn flush_granule(key: &GranuleKey, counts: &GranuleCounts) {
    if let Some(p) = REGION_STATS.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a live entry.
        unsafe { (*p).merge(counts) };
        return;
    }
    if REGION_STATS.insert(key, counts, 1).is_err() {
        match REGION_STATS.get_ptr_mut(key) {
            // SAFETY: as above (inserted meanwhile on another CPU).
            Some(p) => unsafe { (*p).merge(counts) },
            None => count_drop(DropKind::RegionStatsFull),
        }
    }
}

/// Faults of all traced processes (index 0) and majors (1), per CPU: the
/// fault-rate timeline, read every 100 ms without walking the per-process map.
#[map]
pub static TOTALS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

#[inline(always)]
pub fn count_total(i: u32) {
    if let Some(p) = TOTALS.get_ptr_mut(i) {
        // SAFETY: per-CPU value.
        unsafe { *p += 1 };
    }
}

/// Per-CPU drop counters, indexed by `DropKind`.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_KINDS, 0);

const EVENTS_BYTES: u32 = 1024 * 1024;

/// Events for userspace: task life cycle, mapping changes, OOM kills.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Submit flags for mapping changes. Waking the collector on every one cost
/// ~20 µs per mmap+munmap pair in a churn loop (a context switch on a busy
/// CPU); it polls every 100 ms anyway, so it is woken only once a quarter of
/// the ring waits (~3,000 events: headroom for ~100k events/s).
#[inline(always)]
pub fn batched_wakeup() -> u64 {
    if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) > u64::from(EVENTS_BYTES / 4) {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Submit flags for task and OOM events: wake the collector now (a new task
/// is told from a thread by reading /proc while it lives; an OOM victim's
/// /proc is gone soon). Forced, because after unwoken records the kernel's
/// default wakes nobody (it wakes only when the reader had caught up).
pub const WAKE_NOW: u64 = BPF_RB_FORCE_WAKEUP as u64;

#[inline(always)]
pub fn count_drop(kind: DropKind) {
    if let Some(p) = DROPS.get_ptr_mut(kind as u32) {
        // SAFETY: per-CPU value, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// Adds a zeroed aggregate for `tgid` (BPF_NOEXIST: an existing one is kept).
#[inline(always)]
pub fn add_traced(tgid: u32) -> bool {
    let Some(zero) = ZERO_STATS.get(0) else { return false };
    FAULT_STATS.insert(&tgid, zero, 1).is_ok() || FAULT_STATS.get_ptr(&tgid).is_some()
}

#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    !stopped() && (system_wide_counting() || FAULT_STATS.get_ptr(&tgid).is_some())
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
    if let Some(p) = FAULT_STATS.get_ptr_mut(&tgid) {
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
    FAULT_STATS.get_ptr_mut(&tgid).map(|p| (tgid, tid, unsafe { &mut *p }))
}
