//! Page faults: a start hook at exception entry, an end hook where the kernel
//! accounts the fault (`mm_account_fault`, the same place getrusage counts).
//!
//! start: `exceptions:page_fault_user` / `page_fault_kernel` (tp_btf; classic
//!        tracepoint fallback). Counts every fault on a user address and its
//!        access type, and stamps the per-CPU in-flight slot (`inflight.rs`).
//! end:   fexit on `handle_mm_fault` where the kernel allows it (every fault,
//!        classified from its return value as `mm_account_fault()` does); else
//!        `memcg:count_memcg_events` (PGFAULT, 6.14+: every fault) with the
//!        PAGE_FAULTS_MAJ perf event (period 1) telling majors; else perf_event
//!        programs on the software events PAGE_FAULTS_MAJ (period 1) and
//!        PAGE_FAULTS_MIN (period `CONFIG.minor_period`): the kernel's own
//!        minor/major classification, and the latency since the start stamp.
//! huge:  `kmem:mm_page_alloc` of a PMD-order folio inside a fault marks it
//!        served by a huge page.
//! copy:  `kmem:mm_page_alloc` of a user page (order 0, `__GFP_MOVABLE`)
//!        inside a copy-on-write fault: the kernel copied the page
//!        (`wp_page_copy`) rather than giving write access back to a page the
//!        process holds alone (`wp_page_reuse`), which allocates nothing.
//! Slow faults (slept, or huge) always get a stack, in the exact stratum.
//! A thread that sleeps mid-fault is parked by the `sched_switch` hook (`sched.rs`).
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, fexit, map, perf_event, tracepoint},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{tracing::StackIdContext, BtfTracePointContext, FExitContext, PerfEventContext, TracePointContext},
};
use vmtrace_common::{
    granule_bucket, hist_bucket, pf, DropKind, EventHeader, EventKind, FaultMajorEvent, GranuleCounts, GranuleCur,
    GranuleKey, GranuleNewEvent, InflightFault, Merge, StackCounts, StackCur, StackKey, GEN_UNKNOWN, GRANULE_PAGES,
    INFLIGHT_COPIED, INFLIGHT_COW, INFLIGHT_ENDED, INFLIGHT_EXACT_STACK, INFLIGHT_HUGE, INFLIGHT_PAGE,
    INFLIGHT_PAGE_STACK, INFLIGHT_SAMPLED, INFLIGHT_STACK_COPY, INFLIGHT_UNTRACED, INFLIGHT_WRITE, LEAF_BLOCK_SHIFT,
    PMD_ORDER, REGION_GRANULE_SHIFT, STACK_CUR_SLOTS, STACK_ID_LOST, STACK_ID_NONE, STACK_KERNEL, STACK_USER,
    STRATUM_EXACT, STRATUM_SAMPLED,
};

use crate::{
    globals::{conf, config},
    inflight::{current_fault, nofault_read, take_start, FAULT_SLOT},
    mapgen::fault_gen,
    shared::{batched_wakeup, count_drop, current_stats, get_or_insert, tp_fixed, EVENTS, FAULT_STATS},
    stacks::{user_stack_id_of_page, STACKS},
};

/// Faults of all traced processes (index 0) and majors (1), per CPU: the
/// fault-rate timeline, read every 100 ms without walking the per-process map.
#[map]
static TOTALS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

#[inline(always)]
fn count_total(i: u32) {
    if let Some(p) = TOTALS.get_ptr_mut(i) {
        // SAFETY: per-CPU value.
        unsafe { *p += 1 };
    }
}

/// Fault counts per (process, user stack, kernel stack).
#[map]
static FAULT_STACKS: PerCpuHashMap<StackKey, StackCounts> = PerCpuHashMap::with_max_entries(65_536, 0);

/// The stack aggregates this CPU counts into, direct-mapped by key; see `StackCur`.
#[map]
static STACK_CUR: PerCpuArray<StackCur> = PerCpuArray::with_max_entries(STACK_CUR_SLOTS, 0);

/// Counts for `key`: its slot in this CPU's `STACK_CUR`, after moving the
/// slot's previous key's counts into `FAULT_STACKS` if it differs. Two ways of
/// several slots, as an unrolled loop faults at a few instructions in turn.
/// With a stack on every fault this saves a hash lookup per fault.
#[inline(always)]
fn stack_counts(key: &StackKey) -> Option<&'static mut StackCounts> {
    // Stack ids are hash-derived: their low bits spread keys over the slots.
    let i = ((key.user_stack ^ key.kernel_stack) as u32 ^ key.leaf_block as u32) % STACK_CUR_SLOTS;
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

/// Faults per (process, region granule): userspace maps granules to regions.
#[map]
static REGION_STATS: PerCpuHashMap<GranuleKey, GranuleCounts> = PerCpuHashMap::with_max_entries(262_144, 0);

/// Faults per (process, granule) of any generation, once `REGION_STATS` is
/// full (a process changing its mappings faster than anything can keep):
/// sized by the loader, a sixteenth of it.
#[map]
static REGION_LATE: PerCpuHashMap<GranuleKey, GranuleCounts> = PerCpuHashMap::with_max_entries(16_384, 0);

/// The granule this CPU counts into; see `GranuleCur`.
#[map]
static GRANULE_CUR: PerCpuArray<GranuleCur> = PerCpuArray::with_max_entries(1, 0);

/// Counts for the granule of `address` in `tgid`: this CPU's current granule,
/// after moving the previous one's counts into `REGION_STATS` if it differs.
/// One hash operation per run of faults in a granule instead of one per fault.
#[inline(always)]
fn granule_counts(tgid: u32, address: u64) -> Option<&'static mut GranuleCounts> {
    let key = GranuleKey { tgid, gen: fault_gen(tgid), granule: address >> REGION_GRANULE_SHIFT };
    // SAFETY: this CPU's slot; BPF programs on one CPU do not interleave.
    let cur = unsafe { &mut *GRANULE_CUR.get_ptr_mut(0)? };
    if cur.key != key {
        let c = &cur.counts;
        if c.faults | c.major | c.timed | u64::from(c.huge) | u64::from(c.cow_copied) != 0 {
            flush_granule(&cur.key, &cur.counts);
        }
        cur.key = key;
        cur.counts = GranuleCounts::default();
    }
    Some(&mut cur.counts)
}

#[inline(always)]
fn flush_granule(key: &GranuleKey, counts: &GranuleCounts) {
    if let Some(inserted) = merge_or_insert(&REGION_STATS, key, counts) {
        if inserted {
            note_new_granule(key, 0);
        }
        return;
    }
    // Full: the granule's faults of every later generation share one entry
    // of a map kept for this, placed approximately (userspace counts them so).
    let late = GranuleKey { gen: GEN_UNKNOWN, ..*key };
    match merge_or_insert(&REGION_LATE, &late, counts) {
        Some(false) => {}
        Some(true) => note_new_granule(&late, 1),
        None => count_drop(DropKind::RegionStatsFull),
    }
}

/// Tells the loader's key index (`GranuleNewEvent`) of a key just inserted,
/// without waking the collector: once per key, not per fault.
#[inline(always)]
fn note_new_granule(key: &GranuleKey, late: u32) {
    let ev = GranuleNewEvent {
        hdr: EventHeader {
            kind: EventKind::GranuleNew as u32,
            size: core::mem::size_of::<GranuleNewEvent>() as u32,
            ts_ns: 0,
        },
        key: *key,
        late,
        _pad: 0,
    };
    if EVENTS.output::<GranuleNewEvent>(&ev, batched_wakeup()).is_err() {
        count_drop(DropKind::GranuleKeyRingFull);
    }
}

/// Adds `counts` to `key`'s entry: `Some(true)` when this inserted it,
/// `Some(false)` when it was there, `None` when the map is full.
#[inline(always)]
fn merge_or_insert(
    map: &PerCpuHashMap<GranuleKey, GranuleCounts>,
    key: &GranuleKey,
    counts: &GranuleCounts,
) -> Option<bool> {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a live entry.
        unsafe { (*p).merge(counts) };
        return Some(false);
    }
    if map.insert(key, counts, 1).is_ok() {
        return Some(true);
    }
    match map.get_ptr_mut(key) {
        // SAFETY: as above (inserted meanwhile on another CPU).
        Some(p) => {
            unsafe { (*p).merge(counts) };
            Some(false)
        }
        None => None,
    }
}

/// Lowest kernel address on x86-64 (4- and 5-level paging): kernel-mode faults
/// at or above it are not faults on user memory.
const KERNEL_SPACE_START: u64 = 0xff00_0000_0000_0000;

// TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code)
#[btf_tracepoint(function = "page_fault_user")]
pub fn tp_btf_page_fault_user(ctx: BtfTracePointContext) -> i32 {
    let _ = try_fault_start(&ctx, ctx.arg::<u64>(0), ctx.arg::<u64>(2), false);
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn tp_btf_page_fault_kernel(ctx: BtfTracePointContext) -> i32 {
    let address = ctx.arg::<u64>(0);
    if address < KERNEL_SPACE_START {
        let _ = try_fault_start(&ctx, address, ctx.arg::<u64>(2), true);
    }
    0
}

// /sys/kernel/tracing/events/exceptions/page_fault_user/format (same for _kernel):
//   field:unsigned long address;    offset:8;  size:8; signed:0;
//   field:unsigned long ip;         offset:16; size:8; signed:0;
//   field:unsigned long error_code; offset:24; size:8; signed:0;
// (`Tp::FaultUserAddress` … in vmtrace-common's table, checked at attach).
#[tracepoint(category = "exceptions", name = "page_fault_user")]
pub fn tp_exceptions_page_fault_user(ctx: TracePointContext) -> u32 {
    let _ = try_tp_page_fault(
        &ctx,
        tp_fixed!(&ctx, FaultUserAddress: u64),
        tp_fixed!(&ctx, FaultUserErrorCode: u64),
        false,
    );
    0
}

#[tracepoint(category = "exceptions", name = "page_fault_kernel")]
pub fn tp_exceptions_page_fault_kernel(ctx: TracePointContext) -> u32 {
    let _ = try_tp_page_fault(
        &ctx,
        tp_fixed!(&ctx, FaultKernelAddress: u64),
        tp_fixed!(&ctx, FaultKernelErrorCode: u64),
        true,
    );
    0
}

fn try_tp_page_fault(ctx: &TracePointContext, address: u64, error_code: u64, kernel_mode: bool) -> Option<()> {
    if !kernel_mode || address < KERNEL_SPACE_START {
        try_fault_start(ctx, address, error_code, kernel_mode)?;
    }
    Some(())
}

#[inline(always)]
pub(crate) fn try_fault_start<C: StackIdContext>(
    ctx: &C,
    address: u64,
    error_code: u64,
    kernel_mode: bool,
) -> Option<()> {
    if kernel_mode && nofault_read() {
        return None;
    }
    let Some((tgid, tid, s)) = current_stats() else {
        // Untraced: mark this CPU's slot so the memcg end leaves at once
        // (else it would look for a parked fault).
        untraced_start();
        return None;
    };
    s.started += 1;
    count_total(0);
    if error_code & pf::WRITE != 0 {
        s.write += 1;
        if error_code & pf::PROT != 0 {
            s.cow += 1;
        }
    }
    if error_code & pf::INSTR != 0 {
        s.exec += 1;
    }
    if kernel_mode {
        s.kernel_mode += 1;
    }
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, address) {
            g.faults += 1;
            g.touched |= 1 << ((address >> 12) & (GRANULE_PAGES - 1));
            if error_code & pf::INSTR != 0 {
                g.exec += 1;
            }
            if error_code & pf::WRITE != 0 {
                g.write += 1;
                if error_code & pf::PROT != 0 {
                    g.cow += 1;
                }
            }
        }
    }
    let slot = FAULT_SLOT.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot; preemption is off in the fault entry path.
    let slot = unsafe { &mut *slot };
    slot.tid = tid;
    slot.page = address >> 12;
    slot.flags = sample_time(conf(|c| &c.fast_period), slot);
    if error_code & pf::WRITE != 0 {
        slot.flags |= INFLIGHT_WRITE;
    }
    if error_code & (pf::WRITE | pf::PROT) == pf::WRITE | pf::PROT {
        slot.flags |= INFLIGHT_COW;
    }
    (slot.user_stack, slot.kernel_stack) = sample_stack(ctx, tgid, address, slot);
    // SAFETY: no preconditions. Stamped last: the stack walk is not fault time.
    // Every fault is stamped: whether it will be slow (sleep, huge page,
    // major) is known only later, and each slow fault is timed exactly.
    slot.start_ns = unsafe { bpf_ktime_get_ns() };
    Some(())
}

#[inline(always)]
fn untraced_start() {
    if conf(|c| &c.memcg_pgfault) == 0 {
        return;
    }
    if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; preemption is off in the fault entry path.
        let slot = unsafe { &mut *slot };
        slot.tid = bpf_get_current_pid_tgid() as u32;
        slot.flags = INFLIGHT_UNTRACED;
    }
}

/// `INFLIGHT_SAMPLED` on 1 in `fast_period` faults of this CPU (random
/// stride 1..=2N-1, as for stacks), on every fault when that is 0 or 1.
/// Counts the fault into the weight the next sample stands for.
#[inline(always)]
fn sample_time(fast_period: u32, slot: &mut InflightFault) -> u32 {
    if fast_period <= 1 {
        return INFLIGHT_SAMPLED;
    }
    slot.pending = slot.pending.saturating_add(1);
    if slot.time_countdown > 1 {
        slot.time_countdown -= 1;
        return 0;
    }
    // SAFETY: no preconditions.
    slot.time_countdown = 1 + unsafe { bpf_get_prandom_u32() } % (2 * fast_period - 1);
    INFLIGHT_SAMPLED
}

/// The fault's stack ids on 1 in `stack_period` faults of this CPU, at
/// random, counted in `FAULT_STACKS` (the fault graphs' sample); and on
/// every fault whose page is in the resident sample (`page_sampled`: 1 in
/// `stack_period` pages by address), marked `INFLIGHT_PAGE`, whose stack is
/// taken for the resident profiles alone (`INFLIGHT_PAGE_STACK`) unless the
/// random draw took it too. (`STACK_ID_NONE`, `STACK_ID_NONE`) otherwise.
/// One stack walk either way: the walk is inlined once per program.
#[inline(always)]
fn sample_stack<C: StackIdContext>(ctx: &C, tgid: u32, address: u64, slot: &mut InflightFault) -> (i32, i32) {
    if conf(|c| &c.stack_mode) == 0 {
        return (STACK_ID_NONE, STACK_ID_NONE);
    }
    let stack_period = conf(|c| &c.stack_period);
    let drawn = if slot.stack_countdown > 1 {
        slot.stack_countdown -= 1;
        false
    } else {
        // Next sample in 1..=2N-1 faults, N on average: a fixed stride would
        // alias with loops (an unrolled loop would always be caught at the
        // same point).
        slot.stack_countdown = if stack_period > 1 {
            // SAFETY: no preconditions.
            1 + unsafe { bpf_get_prandom_u32() } % (2 * stack_period - 1)
        } else {
            1
        };
        true
    };
    let page = crate::probes::rss::page_in_sample(address >> 12, stack_period);
    if page {
        slot.flags |= INFLIGHT_PAGE;
    }
    if !drawn && !page {
        return (STACK_ID_NONE, STACK_ID_NONE);
    }
    // A page of the resident sample gets its own stack copied where the
    // frame-pointer walk is not whole (`send_sample`).
    let (ids, copied) = stack_ids(ctx, if page { address & !4095 } else { 0 });
    if copied {
        slot.flags |= INFLIGHT_STACK_COPY;
    }
    if drawn {
        count_stacks(tgid, ids, address, STRATUM_SAMPLED, slot.flags & INFLIGHT_COW != 0);
    } else {
        slot.flags |= INFLIGHT_PAGE_STACK;
    }
    ids
}

/// The current stacks, counted as one fault of `stratum`; and whether the
/// user stack was copied with the address of `page` (non-zero: a fault whose
/// page is streamed, `stack_ids`).
#[inline(always)]
fn take_stacks<C: StackIdContext>(
    ctx: &C,
    tgid: u32,
    address: u64,
    stratum: u32,
    cow: bool,
    page: u64,
) -> ((i32, i32), bool) {
    let (ids, copied) = stack_ids(ctx, page);
    count_stacks(tgid, ids, address, stratum, cow);
    (ids, copied)
}

/// One fault of `stratum` (a copy-on-write one if `cow`) under the stacks
/// `(user, kernel)`.
#[inline(always)]
fn count_stacks(tgid: u32, (user, kernel): (i32, i32), address: u64, stratum: u32, cow: bool) {
    let key = StackKey { tgid, user_stack: user, kernel_stack: kernel, stratum, leaf_block: leaf_block(address) };
    if let Some(c) = stack_counts(&key) {
        c.faults += 1;
        c.cow += u64::from(cow);
    }
}

/// The current user and kernel stack ids, as `stack_mode` asks, and
/// whether the user stack was copied with the address `page` (non-zero for
/// a fault whose page is streamed, `PageSample`: `send_sample`).
#[inline(always)]
fn stack_ids<C: StackIdContext>(ctx: &C, page: u64) -> ((i32, i32), bool) {
    let stack_mode = conf(|c| &c.stack_mode);
    let (user, copied) = if stack_mode & STACK_USER != 0 {
        let (id, copied) = user_stack_id_of_page(ctx, page);
        if id == STACK_ID_LOST {
            count_drop(DropKind::StackLost);
        }
        (id, copied)
    } else {
        (STACK_ID_NONE, false)
    };
    let kernel = if stack_mode & STACK_KERNEL != 0 {
        match ctx.get_stackid(&STACKS, 0) {
            Ok(id) => id as i32,
            Err(_) => {
                count_drop(DropKind::StackLost);
                STACK_ID_LOST
            }
        }
    } else {
        STACK_ID_NONE
    };
    ((user, kernel), copied)
}

/// `StackKey::leaf_block` of `address`: 0 unless stacks end in their region.
#[inline(always)]
fn leaf_block(address: u64) -> u64 {
    if conf(|c| &c.leaf_region) != 0 {
        address >> LEAF_BLOCK_SHIFT
    } else {
        0
    }
}

#[perf_event]
pub fn perf_event_page_faults_min(ctx: PerfEventContext) -> u32 {
    // SAFETY: `addr` is the faulting address perf_sw_event() was given.
    let _ = try_fault_end(unsafe { (*ctx.ctx).addr } >> 12, false);
    0
}

#[perf_event]
pub fn perf_event_page_faults_maj(ctx: PerfEventContext) -> u32 {
    // The memcg end, where attached, already timed this fault as minor.
    if conf(|c| &c.memcg_pgfault) == 0 || try_major_after_memcg_end().is_none() {
        // SAFETY: as above.
        let _ = try_fault_end(unsafe { (*ctx.ctx).addr } >> 12, true);
    }
    0
}

// TP_PROTO(struct mem_cgroup *memcg, int item, unsigned long val)
// Since 6.14 `mm_account_fault()` counts PGFAULT through `count_memcg_events()`
// for every fault it accounts, just before the perf events: an end hook on
// every fault that lockdown allows, where fexit is refused. It cannot tell
// minor from major (that is decided after it), so the fault is timed as minor
// and the MAJ perf event (period 1, right after on the same CPU) moves it.
#[btf_tracepoint(function = "count_memcg_events")]
pub fn tp_btf_count_memcg_events(ctx: BtfTracePointContext) -> i32 {
    let _ = try_memcg_event(&ctx, ctx.arg::<u32>(1));
    0
}

// /sys/kernel/tracing/events/memcg/count_memcg_events/format:
//   field:u64 id;            offset:8;  size:8; signed:0;
//   field:int item;          offset:16; size:4; signed:1;
//   field:unsigned long val; offset:24; size:8; signed:0;
#[tracepoint(category = "memcg", name = "count_memcg_events")]
pub fn tp_memcg_count_memcg_events(ctx: TracePointContext) -> u32 {
    let _ = try_memcg_event(&ctx, tp_fixed!(&ctx, MemcgEventItem: u32));
    0
}

#[inline(always)]
fn try_memcg_event<C: StackIdContext>(ctx: &C, item: u32) -> Option<()> {
    let item = item.wrapping_add(1);
    // memcg v1 also counts PGPGIN/PGPGOUT per charge here: filter first.
    if item != conf(|c| &c.memcg_pgfault) {
        // An anonymous (or shmem) THP allocated in a fault: the fault in
        // flight is served by a huge page (the `mm_page_alloc` hook's job
        // where these items are not known).
        if item == conf(|c| &c.memcg_thp_fault) || item == conf(|c| &c.memcg_thp_file) {
            let _ = try_huge_alloc(ctx);
        }
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: per-CPU slot; programs on one CPU do not interleave.
    let slot = unsafe { &mut *FAULT_SLOT.get_ptr_mut(0)? };
    let in_slot = slot.tid == tid;
    if in_slot {
        if slot.flags & INFLIGHT_UNTRACED != 0 {
            return None;
        }
        if slot.flags & INFLIGHT_ENDED != 0 {
            // A get_user_pages() fault after one that ended.
            count_populated();
            return None;
        }
        if slot.flags & (INFLIGHT_SAMPLED | INFLIGHT_HUGE) == 0 {
            // Fast and not sampled: counted at its start, its time stood for
            // by the samples. Left in the slot for a MAJ event right after.
            slot.flags |= INFLIGHT_ENDED;
            // Its page, if of the resident sample, whether timed or not.
            crate::probes::rss::stream_page((pid_tgid >> 32) as u32, slot);
            // Once: a MAJ event right after ends it again (`try_fault_end`).
            slot.flags &= !INFLIGHT_PAGE;
            // SAFETY: as above.
            unsafe { (*LAST_END.get_ptr_mut(0)?).tid = 0 };
            return None;
        }
    }
    memcg_end_timed(tid, slot, in_slot, conf(|c| &c.fast_period))
}

/// The memcg end of a fault that is timed: slow (it slept, so it is parked,
/// or a huge page) and timed exactly, or a sampled fast one, weighted.
#[inline(always)]
fn memcg_end_timed(tid: u32, slot: &mut InflightFault, in_slot: bool, fast_period: u32) -> Option<()> {
    let (tgid, _, s) = current_stats()?;
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // No start: a get_user_pages() fault (no exception, not a fault of the
    // task for perf, but in its min_flt/maj_flt), not a lost one.
    let start = if in_slot {
        slot.tid = 0;
        *slot
    } else if let Some(start) = take_start(tid, None) {
        start
    } else {
        s.populated += 1;
        return None;
    };
    s.minor_seen += 1;
    let ns = now.saturating_sub(start.start_ns);
    let sampled = fast_period > 1 && in_slot && start.flags & INFLIGHT_HUGE == 0;
    let weight = if sampled {
        let w = slot.pending.max(1);
        slot.pending = 0;
        s.minor_sampled += 1;
        s.minor_sampled_ns += ns;
        s.minor_sampled_sq += square(ns);
        u64::from(w)
    } else {
        // A slow fault, timed exactly: its start is not the samples' to stand for.
        slot.pending = slot.pending.saturating_sub(1);
        1
    };
    let b = hist_bucket(ns);
    s.minor_timed += weight;
    s.minor_time_ns += ns * weight;
    if let Some(h) = s.minor_hist.get_mut(b) {
        *h += weight;
    }
    account_end(tgid, &start, ns, false, weight);
    let e = LAST_END.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot; programs on one CPU do not interleave.
    unsafe {
        *e = EndedFault { tid, bucket: b as u32, ns, weight: weight as u32, sampled: u32::from(sampled), fault: start }
    };
    Some(())
}

/// One `get_user_pages()` fault of the current process, if traced.
#[inline(always)]
fn count_populated() {
    if let Some((_, _, s)) = current_stats() {
        s.populated += 1;
    }
}

/// The MAJ perf event after a memcg end: the fault this CPU just timed as
/// minor was major. None when this CPU's last memcg end was not this
/// thread's (no memcg end ran, or the thread migrated in between): the
/// caller then ends the fault the usual way.
#[inline(always)]
fn try_major_after_memcg_end() -> Option<()> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: per-CPU slot; programs on one CPU do not interleave.
    let e = unsafe { &mut *LAST_END.get_ptr_mut(0)? };
    if e.tid != tid || e.tid == 0 {
        return None;
    }
    e.tid = 0;
    let Some((tgid, _, s)) = current_stats() else {
        return Some(());
    };
    s.major += 1;
    count_total(1);
    let (ns, b, w) = (e.ns, e.bucket as usize, u64::from(e.weight));
    // Same CPU as the memcg end, so this CPU's copy holds what is taken back:
    // the minor it was counted as, with the weight it stood for.
    s.minor_seen = s.minor_seen.wrapping_sub(1);
    s.minor_timed = s.minor_timed.wrapping_sub(w);
    s.minor_time_ns = s.minor_time_ns.wrapping_sub(ns * w);
    if let Some(h) = s.minor_hist.get_mut(b) {
        *h = h.wrapping_sub(w);
    }
    if e.sampled != 0 {
        s.minor_sampled = s.minor_sampled.wrapping_sub(1);
        s.minor_sampled_ns = s.minor_sampled_ns.wrapping_sub(ns);
        s.minor_sampled_sq = s.minor_sampled_sq.wrapping_sub(square(ns));
        // The fast faults it stood for wait for the next sample.
        if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
            // SAFETY: per-CPU slot.
            unsafe { (*slot).pending = (*slot).pending.saturating_add(e.weight.saturating_sub(1)) };
        }
    }
    s.major_timed += 1;
    s.major_time_ns += ns;
    if let Some(h) = s.major_hist.get_mut(b) {
        *h += 1;
    }
    let fault = e.fault;
    stream_major(tgid, tid, &fault, ns);
    let extra = w - 1;
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, fault.page << 12) {
            g.major += 1;
            g.major_time_ns += ns;
            g.time_ns = g.time_ns.wrapping_sub(ns * extra);
            g.timed = g.timed.wrapping_sub(extra);
            if let Some(h) = g.hist.get_mut(granule_bucket(ns)) {
                *h = h.wrapping_sub(extra as u32);
            }
        }
    }
    if let Some(c) = fault_stack_counts(tgid, &fault) {
        c.major += 1;
        c.time_ns = c.time_ns.wrapping_sub(ns * extra);
        c.timed = c.timed.wrapping_sub(extra);
    }
    Some(())
}

/// The fault this CPU timed last at the memcg end, until the MAJ event that
/// may follow it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EndedFault {
    tid: u32,
    bucket: u32,
    ns: u64,
    /// The faults it was counted for (1, or a sample's weight).
    weight: u32,
    sampled: u32,
    fault: InflightFault,
}

#[map]
static LAST_END: PerCpuArray<EndedFault> = PerCpuArray::with_max_entries(1, 0);

// vm_fault_t handle_mm_fault(struct vm_area_struct *vma, unsigned long address,
//                            unsigned int flags, struct pt_regs *regs)
// One program for every fault's end, cheaper than the software-event path; it
// accounts exactly what mm_account_fault() (the perf events' source) does.
#[fexit(function = "handle_mm_fault")]
pub fn fexit_handle_mm_fault(ctx: FExitContext) -> i32 {
    let _ = try_fexit_handle_mm_fault(&ctx);
    0
}

#[inline(always)]
fn try_fexit_handle_mm_fault(ctx: &FExitContext) -> Option<()> {
    let address: u64 = ctx.arg(1);
    let flags = ctx.arg::<u64>(2) as u32;
    let regs: u64 = ctx.arg(3);
    let ret = ctx.arg::<u64>(4) as u32;
    let cfg = config();
    if ret & cfg.vm_fault_unaccounted != 0 {
        return None;
    }
    // No regs: get_user_pages(), no exception (nor perf event), but in the
    // task's min_flt/maj_flt.
    if regs == 0 {
        count_populated();
        return None;
    }
    try_fault_end(address >> 12, ret & cfg.vm_fault_major != 0 || flags & cfg.fault_flag_tried != 0)
}

#[inline(always)]
fn try_fault_end(page: u64, major: bool) -> Option<()> {
    let (tgid, tid, s) = current_stats()?;
    // SAFETY: no preconditions; the binding is merely declared unsafe.
    let now = unsafe { bpf_ktime_get_ns() };
    if major {
        s.major += 1;
        count_total(1);
    } else {
        s.minor_seen += 1;
    }
    let Some(start) = take_start(tid, Some(page)) else {
        count_drop(DropKind::FaultUntimed);
        return None;
    };
    let ns = now.saturating_sub(start.start_ns);
    let b = hist_bucket(ns);
    if major {
        s.major_timed += 1;
        s.major_time_ns += ns;
        if let Some(h) = s.major_hist.get_mut(b) {
            *h += 1;
        }
    } else {
        s.minor_timed += 1;
        s.minor_time_ns += ns;
        if let Some(h) = s.minor_hist.get_mut(b) {
            *h += 1;
        }
    }
    if major {
        stream_major(tgid, tid, &start, ns);
    }
    account_end(tgid, &start, ns, major, 1);
    Some(())
}

/// One record per timed major fault, for the Perfetto trace's slices
/// (`Config::stream_majors`). Majors wait for I/O: a ring record each is
/// noise beside them. The stack id is the exact stratum's, which every fault
/// that slept has.
#[inline(always)]
fn stream_major(tgid: u32, tid: u32, f: &InflightFault, ns: u64) {
    if conf(|c| &c.stream_majors) == 0 {
        return;
    }
    let Some(mut slot) = EVENTS.reserve::<FaultMajorEvent>(0) else {
        count_drop(DropKind::FaultMajorRingFull);
        return;
    };
    slot.write(FaultMajorEvent {
        hdr: EventHeader {
            kind: EventKind::FaultMajor as u32,
            size: core::mem::size_of::<FaultMajorEvent>() as u32,
            ts_ns: f.start_ns,
        },
        tgid,
        tid,
        duration_ns: ns,
        addr: f.page << 12,
        user_stack: f.user_stack,
        _pad: 0,
    });
    slot.submit(batched_wakeup());
}

/// A timed fault's share of its region granule and its stack, `weight`
/// times (a sampled fast fault stands for the faults before it).
#[inline(always)]
fn account_end(tgid: u32, start: &InflightFault, ns: u64, major: bool, weight: u64) {
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, start.page << 12) {
            g.major += u64::from(major);
            g.time_ns += ns * weight;
            g.timed += weight;
            if major {
                g.major_time_ns += ns;
            }
            if let Some(h) = g.hist.get_mut(granule_bucket(ns)) {
                *h += weight as u32;
            }
        }
    }
    if let Some(c) = fault_stack_counts(tgid, start) {
        c.major += u64::from(major);
        c.time_ns += ns * weight;
        c.timed += weight;
    }
    // Resident attribution: the sampled fault's page, owned by its stack.
    crate::probes::rss::stream_page(tgid, start);
}

/// Counts of the stack taken for this fault, if one was.
#[inline(always)]
fn fault_stack_counts(tgid: u32, f: &InflightFault) -> Option<&'static mut StackCounts> {
    // A stack taken for the resident sample alone is in no stratum.
    if (f.user_stack == STACK_ID_NONE && f.kernel_stack == STACK_ID_NONE) || f.flags & INFLIGHT_PAGE_STACK != 0 {
        return None;
    }
    let stratum = if f.flags & INFLIGHT_EXACT_STACK != 0 { STRATUM_EXACT } else { STRATUM_SAMPLED };
    let key = StackKey {
        tgid,
        user_stack: f.user_stack,
        kernel_stack: f.kernel_stack,
        stratum,
        leaf_block: leaf_block(f.page << 12),
    };
    stack_counts(&key)
}

// TP_PROTO(struct page *page, unsigned int order, gfp_t gfp_flags, int migratetype).
// An anonymous THP fault allocates its PMD-order folio inside the fault: while
// this thread has a fault in flight, such an allocation means the fault is
// served by a huge page. A copy-on-write fault that copies allocates the new
// page (order 0, movable: `GFP_HIGHUSER_MOVABLE`); one that reuses the page
// allocates none. Every page allocation in the system passes here, so the
// order and flags are tested first.
#[btf_tracepoint(function = "mm_page_alloc")]
pub fn tp_btf_mm_page_alloc(ctx: BtfTracePointContext) -> i32 {
    page_alloc(&ctx, ctx.arg::<u32>(1), ctx.arg::<u32>(2));
    0
}

// /sys/kernel/tracing/events/kmem/mm_page_alloc/format:
//   field:unsigned long pfn;          offset:8;  size:8; signed:0;
//   field:unsigned int order;         offset:16; size:4; signed:0;
//   field:unsigned long gfp_flags;    offset:24; size:8; signed:0;
//   field:int migratetype;            offset:32; size:4; signed:1;
#[tracepoint(category = "kmem", name = "mm_page_alloc")]
pub fn tp_kmem_mm_page_alloc(ctx: TracePointContext) -> u32 {
    page_alloc(&ctx, tp_fixed!(&ctx, PageAllocOrder: u32), tp_fixed!(&ctx, PageAllocGfp: u64) as u32);
    0
}

/// `___GFP_MOVABLE` (bit 3 of `gfp_t` on every kernel since 4.x): user
/// pages are movable; page tables, slab and kernel buffers are not.
const GFP_MOVABLE: u32 = 0x08;

/// `___GFP_ZERO` (bit 8 of `gfp_t` on every kernel since 4.x): the page is
/// allocated zeroed, as a copy-on-write fault on the zero page allocates its
/// copy (`vma_alloc_zeroed_movable_folio`); a copy of a page's contents does not.
const GFP_ZERO: u32 = 0x100;

/// See `try_cow_copy`.
const STALE_COPY_NS: u64 = 10_000_000;

#[inline(always)]
fn page_alloc<C: StackIdContext>(ctx: &C, order: u32, gfp: u32) {
    if order >= PMD_ORDER {
        let _ = try_huge_alloc(ctx);
    } else if order == 0 && gfp & GFP_MOVABLE != 0 {
        let _ = try_cow_copy(gfp & GFP_ZERO != 0);
    }
}

/// A user page allocated by the current thread: when its fault in flight is
/// a copy-on-write one, the kernel is copying the page. Counted once per
/// fault (a retried fault allocates again). `zeroed`: the zero page's copy.
#[inline(always)]
fn try_cow_copy(zeroed: bool) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: per-CPU slot; programs on one CPU do not interleave.
    let slot = unsafe { &mut *FAULT_SLOT.get_ptr_mut(0)? };
    let slot = if slot.tid == tid {
        slot
    } else {
        // Parked: the fault slept before its allocation (a lock, reclaim).
        // SAFETY: a live entry of this thread, which only its programs touch.
        unsafe { &mut *crate::inflight::current_fault(tid)? }
    };
    if slot.flags & (INFLIGHT_COW | INFLIGHT_COPIED | INFLIGHT_UNTRACED | INFLIGHT_ENDED) != INFLIGHT_COW {
        return None;
    }
    // The sampled perf-event end leaves most faults in the slot after they
    // end: a COW fault that reused its page would take a later allocation of
    // the thread's (a syscall's page-cache page) for a copy. A copy allocates
    // within microseconds of the fault's start unless it slept (parked, and
    // then ended by an end that takes it).
    // SAFETY: no preconditions.
    if conf(|c| &c.minor_period) > 1 && unsafe { bpf_ktime_get_ns() }.saturating_sub(slot.start_ns) > STALE_COPY_NS {
        return None;
    }
    slot.flags |= INFLIGHT_COPIED;
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, slot.page << 12) {
            g.cow_copied += 1;
            g.cow_zero += u32::from(zeroed);
        }
    }
    Some(())
}

/// `do_wp_page` entered (arm64, `fault_arm64.rs`): the current thread's fault
/// in flight is a write to a present, write-protected page, the
/// copy-on-write fault x86's `X86_PF_PROT | X86_PF_WRITE` tells at the
/// start. Counted once per fault (a retried fault enters it again); the
/// page-allocation hook then tells a copy from a reuse (`try_cow_copy`).
/// The fault's stacks were taken at its start, before this: they count it
/// as a fault, not as a COW one.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub(crate) fn try_wp_fault() -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: this CPU's slot, or a live entry of this thread, which only this
    // thread's programs touch.
    let slot = unsafe { &mut *current_fault(tid)? };
    if slot.flags & (INFLIGHT_COW | INFLIGHT_UNTRACED | INFLIGHT_ENDED) != 0 {
        return None;
    }
    // The sampled perf-event end (6.1) leaves a fault in the slot after it
    // ends: get_user_pages() breaking COW for the thread later (no fault
    // start of its own) must not be taken for it (as in `try_cow_copy`).
    // SAFETY: no preconditions.
    if conf(|c| &c.minor_period) > 1 && unsafe { bpf_ktime_get_ns() }.saturating_sub(slot.start_ns) > STALE_COPY_NS {
        return None;
    }
    slot.flags |= INFLIGHT_COW;
    let page = slot.page;
    let p = FAULT_STATS.get_ptr_mut(tgid)?;
    // SAFETY: this CPU's value of a live entry.
    unsafe { (*p).cow += 1 };
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, page << 12) {
            g.cow += 1;
        }
    }
    Some(())
}

/// A PMD-order folio allocated (or added to the page cache) by the current
/// thread: when it has a fault in flight, that fault is served by a huge page.
/// Counted once per fault.
#[inline(always)]
pub fn try_huge_alloc<C: StackIdContext>(ctx: &C) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Only a fault of this very thread on this CPU (the allocation cannot sleep
    // without parking it, and a parked fault is looked up as well).
    let slot = current_fault(tid)?;
    // SAFETY: this CPU's slot, or a live entry of this thread, which only this
    // thread's programs touch (it runs on one CPU at a time).
    let slot = unsafe { &mut *slot };
    if slot.flags & (INFLIGHT_HUGE | INFLIGHT_UNTRACED | INFLIGHT_ENDED) != 0 {
        return None;
    }
    slot.flags |= INFLIGHT_HUGE;
    exact_stack(ctx, tgid, slot);
    let page = slot.page;
    let p = FAULT_STATS.get_ptr_mut(tgid)?;
    // SAFETY: this CPU's value of a live entry.
    unsafe { (*p).huge += 1 };
    if conf(|c| &c.regions) != 0 {
        if let Some(g) = granule_counts(tgid, page << 12) {
            g.huge += 1;
        }
    }
    Some(())
}

/// A fault that turned out slow (it slept, or a huge page) gets a stack of
/// the exact stratum, unless it was sampled at its start.
#[inline(always)]
pub fn exact_stack<C: StackIdContext>(ctx: &C, tgid: u32, slot: &mut InflightFault) {
    if slot.flags & INFLIGHT_PAGE_STACK != 0 {
        // Taken for the resident sample only: the fault graphs count it now,
        // in the exact stratum, with no second walk.
        let cow = slot.flags & INFLIGHT_COW != 0;
        count_stacks(tgid, (slot.user_stack, slot.kernel_stack), slot.page << 12, STRATUM_EXACT, cow);
        slot.flags = (slot.flags & !INFLIGHT_PAGE_STACK) | INFLIGHT_EXACT_STACK;
        return;
    }
    if conf(|c| &c.stack_mode) == 0 || slot.user_stack != STACK_ID_NONE || slot.kernel_stack != STACK_ID_NONE {
        return;
    }
    let cow = slot.flags & INFLIGHT_COW != 0;
    // A huge page is streamed (`stream_page`): its stack is copied with its address.
    let page = if slot.flags & INFLIGHT_HUGE != 0 { slot.page << 12 } else { 0 };
    let ((user, kernel), copied) = take_stacks(ctx, tgid, slot.page << 12, STRATUM_EXACT, cow, page);
    (slot.user_stack, slot.kernel_stack) = (user, kernel);
    slot.flags |= INFLIGHT_EXACT_STACK;
    if copied {
        slot.flags |= INFLIGHT_STACK_COPY;
    }
}

/// `ns²` for the samples' variance, capped at 4.29 s (no 128-bit multiply in BPF).
#[inline(always)]
fn square(ns: u64) -> u64 {
    let q = ns.min(u64::from(u32::MAX));
    q * q
}
