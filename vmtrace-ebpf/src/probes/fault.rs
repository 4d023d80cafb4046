//! Page faults: a start hook at exception entry, an end hook where the kernel
//! accounts the fault (`mm_account_fault`, the same place getrusage counts).
//!
//! start: `exceptions:page_fault_user` / `page_fault_kernel` (tp_btf; classic
//!        tracepoint fallback). Counts every fault on a user address and its
//!        access type, and stamps the per-CPU in-flight slot.
//! end:   fexit on `handle_mm_fault` where the kernel allows it (every fault,
//!        classified from its return value as `mm_account_fault()` does); else
//!        `memcg:count_memcg_events` (PGFAULT, 6.14+: every fault) with the
//!        PAGE_FAULTS_MAJ perf event (period 1) telling majors; else perf_event
//!        programs on the software events PAGE_FAULTS_MAJ (period 1) and
//!        PAGE_FAULTS_MIN (period `CONFIG.minor_period`): the kernel's own
//!        minor/major classification, and the latency since the start stamp.
//! park:  `sched_switch` moves the slot of a thread that sleeps mid-fault (majors
//!        wait on I/O) to a hash keyed by tid, so the fault is timed wherever it resumes.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, fexit, map, perf_event, tracepoint},
    maps::PerCpuArray,
    programs::{tracing::StackIdContext, BtfTracePointContext, FExitContext, PerfEventContext, TracePointContext},
};
use vmtrace_common::{
    granule_bucket, hist_bucket, pf, DropKind, InflightFault, StackCounts, StackKey, GRANULE_PAGES,
    INFLIGHT_EXACT_STACK, INFLIGHT_HUGE, LEAF_GRANULE_SHIFT, PMD_ORDER, STACK_KERNEL, STACK_USER, STRATUM_EXACT,
    STRATUM_SAMPLED,
};

use crate::maps::{
    config, count_drop, count_total, current_stats, granule_counts, mm_park, stack_counts, tp_field, user_stack_id,
    FAULT_PARKED, FAULT_SLOT, FAULT_STATS, STACKS,
};

/// Lowest kernel address on x86-64 (4- and 5-level paging): kernel-mode faults
/// at or above it are not faults on user memory.
const KERNEL_SPACE_START: u64 = 0xff00_0000_0000_0000;

// TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code)
#[btf_tracepoint(function = "page_fault_user")]
pub fn tp_btf_page_fault_user(ctx: BtfTracePointContext) -> i32 {
    fault_start(&ctx, ctx.arg::<u64>(0), ctx.arg::<u64>(2), false);
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn tp_btf_page_fault_kernel(ctx: BtfTracePointContext) -> i32 {
    let address = ctx.arg::<u64>(0);
    if address < KERNEL_SPACE_START {
        fault_start(&ctx, address, ctx.arg::<u64>(2), true);
    }
    0
}

// /sys/kernel/tracing/events/exceptions/page_fault_user/format (same for _kernel):
//   field:unsigned long address;    offset:8;  size:8; signed:0;
//   field:unsigned long ip;         offset:16; size:8; signed:0;
//   field:unsigned long error_code; offset:24; size:8; signed:0;
const TP_FAULT_ADDRESS: usize = 8;
const TP_FAULT_ERROR_CODE: usize = 24;

#[tracepoint(category = "exceptions", name = "page_fault_user")]
pub fn tp_exceptions_page_fault_user(ctx: TracePointContext) -> u32 {
    try_tp_page_fault(&ctx, false);
    0
}

#[tracepoint(category = "exceptions", name = "page_fault_kernel")]
pub fn tp_exceptions_page_fault_kernel(ctx: TracePointContext) -> u32 {
    try_tp_page_fault(&ctx, true);
    0
}

fn try_tp_page_fault(ctx: &TracePointContext, kernel_mode: bool) {
    let address: u64 = tp_field(ctx, TP_FAULT_ADDRESS);
    let error_code: u64 = tp_field(ctx, TP_FAULT_ERROR_CODE);
    if !kernel_mode || address < KERNEL_SPACE_START {
        fault_start(ctx, address, error_code, kernel_mode);
    }
}

/// A kernel-mode fault taken while this CPU walks a user stack for us: the
/// walk's nofault read fails it, and the kernel never accounts it. (The
/// task's `pagefault_disabled` cannot tell: `read()` copies to user memory
/// with page faults disabled, and those faults are handled and accounted.)
#[inline(always)]
fn nofault_read() -> bool {
    FAULT_SLOT.get(0).is_some_and(|s| s.walking != 0)
}

#[inline(always)]
fn fault_start<C: StackIdContext>(ctx: &C, address: u64, error_code: u64, kernel_mode: bool) {
    if kernel_mode && nofault_read() {
        return;
    }
    let Some((tgid, tid, s)) = current_stats() else {
        return;
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
    if config().regions != 0 {
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
    if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; preemption is off in the fault entry path.
        let slot = unsafe { &mut *slot };
        slot.tid = tid;
        slot.page = address >> 12;
        slot.flags = 0;
        (slot.user_stack, slot.kernel_stack) = sample_stack(ctx, tgid, address, slot);
        // SAFETY: no preconditions. Stamped last: the stack walk is not fault time.
        slot.start_ns = unsafe { bpf_ktime_get_ns() };
    }
}

/// On 1 in `stack_period` faults of this CPU, the fault's stack ids, counted
/// in `FAULT_STACKS`; (-1, -1) otherwise.
#[inline(always)]
fn sample_stack<C: StackIdContext>(ctx: &C, tgid: u32, address: u64, slot: &mut InflightFault) -> (i32, i32) {
    let cfg = config();
    if cfg.stack_mode == 0 {
        return (-1, -1);
    }
    if slot.stack_countdown > 1 {
        slot.stack_countdown -= 1;
        return (-1, -1);
    }
    // Next sample in 1..=2N-1 faults, N on average: a fixed stride would alias
    // with loops (an unrolled loop would always be caught at the same point).
    slot.stack_countdown = if cfg.stack_period > 1 {
        // SAFETY: no preconditions.
        1 + unsafe { bpf_get_prandom_u32() } % (2 * cfg.stack_period - 1)
    } else {
        1
    };
    take_stacks(ctx, tgid, address, STRATUM_SAMPLED)
}

/// The current stacks, counted as one fault of `stratum`.
#[inline(always)]
fn take_stacks<C: StackIdContext>(ctx: &C, tgid: u32, address: u64, stratum: u32) -> (i32, i32) {
    let cfg = config();
    let take = |flags: u64| -> i32 {
        match ctx.get_stackid(&STACKS, flags) {
            Ok(id) => id as i32,
            Err(_) => {
                count_drop(DropKind::StackLost);
                -2
            }
        }
    };
    let user = if cfg.stack_mode & STACK_USER != 0 {
        let id = user_stack_id(ctx);
        if id < 0 {
            count_drop(DropKind::StackLost);
        }
        id
    } else {
        -1
    };
    let kernel = if cfg.stack_mode & STACK_KERNEL != 0 { take(0) } else { -1 };
    let key = StackKey { tgid, user_stack: user, kernel_stack: kernel, stratum, granule: granule(address) };
    if let Some(c) = stack_counts(&key) {
        c.faults += 1;
    }
    (user, kernel)
}

#[inline(always)]
fn granule(address: u64) -> u64 {
    if config().leaf_region != 0 {
        address >> LEAF_GRANULE_SHIFT
    } else {
        0
    }
}

#[perf_event]
pub fn perf_event_page_faults_min(ctx: PerfEventContext) -> u32 {
    // SAFETY: `addr` is the faulting address perf_sw_event() was given.
    fault_end(unsafe { (*ctx.ctx).addr } >> 12, false);
    0
}

#[perf_event]
pub fn perf_event_page_faults_maj(ctx: PerfEventContext) -> u32 {
    // The memcg end, where attached, already timed this fault as minor.
    if config().memcg_pgfault == 0 || !major_after_memcg_end() {
        // SAFETY: as above.
        fault_end(unsafe { (*ctx.ctx).addr } >> 12, true);
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
    memcg_event(ctx.arg::<u32>(1));
    0
}

// /sys/kernel/tracing/events/memcg/count_memcg_events/format:
//   field:u64 id;            offset:8;  size:8; signed:0;
//   field:int item;          offset:16; size:4; signed:1;
//   field:unsigned long val; offset:24; size:8; signed:0;
#[tracepoint(category = "memcg", name = "count_memcg_events")]
pub fn tp_memcg_count_memcg_events(ctx: TracePointContext) -> u32 {
    memcg_event(tp_field::<u32>(&ctx, 16));
    0
}

#[inline(always)]
fn memcg_event(item: u32) {
    // memcg v1 also counts PGPGIN/PGPGOUT per charge here: filter first.
    if item.wrapping_add(1) != config().memcg_pgfault {
        return;
    }
    let Some((tgid, tid, s)) = current_stats() else {
        return;
    };
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // No start: a get_user_pages() fault (no exception, not a fault of the
    // task for perf or vmtrace), not a lost one.
    let Some(start) = take_start_of(tid) else {
        return;
    };
    s.minor_seen += 1;
    let ns = now.saturating_sub(start.start_ns);
    let b = hist_bucket(ns);
    s.minor_timed += 1;
    s.minor_time_ns += ns;
    if let Some(h) = s.minor_hist.get_mut(b) {
        *h += 1;
    }
    account_end(tgid, &start, ns, false);
    if let Some(e) = LAST_END.get_ptr_mut(0) {
        // SAFETY: per-CPU slot; programs on one CPU do not interleave.
        unsafe { *e = EndedFault { tid, bucket: b as u32, ns, fault: start } };
    }
}

/// The MAJ perf event after a memcg end: the fault this CPU just timed as
/// minor was major. False when this CPU's last memcg end was not this
/// thread's (no memcg end ran, or the thread migrated in between): the
/// caller then ends the fault the usual way.
#[inline(always)]
fn major_after_memcg_end() -> bool {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: per-CPU slot; programs on one CPU do not interleave.
    let Some(e) = LAST_END.get_ptr_mut(0).map(|e| unsafe { &mut *e }) else {
        return false;
    };
    if e.tid != tid || e.tid == 0 {
        return false;
    }
    e.tid = 0;
    let Some((tgid, _, s)) = current_stats() else {
        return true;
    };
    s.major += 1;
    count_total(1);
    let (ns, b) = (e.ns, e.bucket as usize);
    // Same CPU as the memcg end, so this CPU's copy holds what is taken back.
    s.minor_seen = s.minor_seen.wrapping_sub(1);
    s.minor_timed = s.minor_timed.wrapping_sub(1);
    s.minor_time_ns = s.minor_time_ns.wrapping_sub(ns);
    if let Some(h) = s.minor_hist.get_mut(b) {
        *h = h.wrapping_sub(1);
    }
    s.major_timed += 1;
    s.major_time_ns += ns;
    if let Some(h) = s.major_hist.get_mut(b) {
        *h += 1;
    }
    let fault = e.fault;
    if config().regions != 0 {
        if let Some(g) = granule_counts(tgid, fault.page << 12) {
            g.major += 1;
            g.major_time_ns += ns;
        }
    }
    if let Some(c) = fault_stack_counts(tgid, &fault) {
        c.major += 1;
    }
    true
}

/// The fault this CPU timed last at the memcg end, until the MAJ event that
/// may follow it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EndedFault {
    tid: u32,
    bucket: u32,
    ns: u64,
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
    let address: u64 = ctx.arg(1);
    let flags = ctx.arg::<u64>(2) as u32;
    let regs: u64 = ctx.arg(3);
    let ret = ctx.arg::<u64>(4) as u32;
    let cfg = config();
    // No regs: get_user_pages(), not a fault of the task.
    if regs == 0 || ret & cfg.vm_fault_unaccounted != 0 {
        return 0;
    }
    fault_end(address >> 12, ret & cfg.vm_fault_major != 0 || flags & cfg.fault_flag_tried != 0);
    0
}

#[inline(always)]
fn fault_end(page: u64, major: bool) {
    let Some((tgid, tid, s)) = current_stats() else {
        return;
    };
    // SAFETY: no preconditions; the binding is merely declared unsafe.
    let now = unsafe { bpf_ktime_get_ns() };
    if major {
        s.major += 1;
        count_total(1);
    } else {
        s.minor_seen += 1;
    }
    let Some(start) = take_start(tid, page) else {
        count_drop(DropKind::FaultUntimed);
        return;
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
    account_end(tgid, &start, ns, major);
}

/// A timed fault's share of its region granule and its sampled stack.
#[inline(always)]
fn account_end(tgid: u32, start: &InflightFault, ns: u64, major: bool) {
    if config().regions != 0 {
        if let Some(g) = granule_counts(tgid, start.page << 12) {
            g.major += u64::from(major);
            g.time_ns += ns;
            if major {
                g.major_time_ns += ns;
            }
            g.timed += 1;
            if let Some(h) = g.hist.get_mut(granule_bucket(ns)) {
                *h += 1;
            }
        }
    }
    if let Some(c) = fault_stack_counts(tgid, start) {
        c.major += u64::from(major);
        c.time_ns += ns;
        c.timed += 1;
    }
}

/// Counts of the stack sampled at this fault's start, if one was.
#[inline(always)]
fn fault_stack_counts(tgid: u32, f: &InflightFault) -> Option<&'static mut StackCounts> {
    if f.user_stack == -1 && f.kernel_stack == -1 {
        return None;
    }
    let stratum = if f.flags & INFLIGHT_EXACT_STACK != 0 { STRATUM_EXACT } else { STRATUM_SAMPLED };
    let key = StackKey {
        tgid,
        user_stack: f.user_stack,
        kernel_stack: f.kernel_stack,
        stratum,
        granule: granule(f.page << 12),
    };
    stack_counts(&key)
}

/// This thread's in-flight fault, whatever its page: the memcg end has no
/// address (a thread has one fault in flight at a time).
#[inline(always)]
fn take_start_of(tid: u32) -> Option<InflightFault> {
    if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        let slot = unsafe { &mut *slot };
        if slot.tid == tid {
            slot.tid = 0;
            return Some(*slot);
        }
    }
    // SAFETY: copied out before removal.
    let parked = unsafe { FAULT_PARKED.get(&tid) }.copied()?;
    let _ = FAULT_PARKED.remove(&tid);
    Some(parked)
}

/// This thread's in-flight fault on `page`: from this CPU's slot, or parked
/// when the thread slept mid-fault.
#[inline(always)]
fn take_start(tid: u32, page: u64) -> Option<InflightFault> {
    if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        let slot = unsafe { &mut *slot };
        if slot.tid == tid && slot.page == page {
            slot.tid = 0;
            return Some(*slot);
        }
    }
    // SAFETY: copied out before removal.
    let parked = unsafe { FAULT_PARKED.get(&tid) }.copied()?;
    let _ = FAULT_PARKED.remove(&tid);
    (parked.page == page).then_some(parked)
}

// TP_PROTO(struct page *page, unsigned int order, gfp_t gfp_flags, int migratetype).
// An anonymous THP fault allocates its PMD-order folio inside the fault: while
// this thread has a fault in flight, such an allocation means the fault is
// served by a huge page. Every page allocation in the system passes here, so
// the order is tested first.
#[btf_tracepoint(function = "mm_page_alloc")]
pub fn tp_btf_mm_page_alloc(ctx: BtfTracePointContext) -> i32 {
    if ctx.arg::<u32>(1) >= PMD_ORDER {
        huge_alloc(&ctx);
    }
    0
}

// /sys/kernel/tracing/events/kmem/mm_page_alloc/format:
//   field:unsigned long pfn;          offset:8;  size:8; signed:0;
//   field:unsigned int order;         offset:16; size:4; signed:0;
//   field:unsigned long gfp_flags;    offset:24; size:8; signed:0;
//   field:int migratetype;            offset:32; size:4; signed:1;
#[tracepoint(category = "kmem", name = "mm_page_alloc")]
pub fn tp_kmem_mm_page_alloc(ctx: TracePointContext) -> u32 {
    if tp_field::<u32>(&ctx, 16) >= PMD_ORDER {
        huge_alloc(&ctx);
    }
    0
}

/// A PMD-order folio allocated (or added to the page cache) by the current
/// thread: when it has a fault in flight, that fault is served by a huge page.
/// Counted once per fault.
#[inline(always)]
pub fn huge_alloc<C: StackIdContext>(ctx: &C) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Only a fault of this very thread on this CPU (the allocation cannot sleep
    // without parking it, and a parked fault is looked up as well).
    let slot = match FAULT_SLOT.get_ptr_mut(0) {
        Some(s) if unsafe { (*s).tid } == tid => s,
        _ => match FAULT_PARKED.get_ptr_mut(&tid) {
            Some(p) => p,
            None => return,
        },
    };
    // SAFETY: this CPU's slot, or a live entry of this thread, which only this
    // thread's programs touch (it runs on one CPU at a time).
    let slot = unsafe { &mut *slot };
    if slot.flags & INFLIGHT_HUGE != 0 {
        return;
    }
    slot.flags |= INFLIGHT_HUGE;
    exact_stack(ctx, tgid, slot);
    let page = slot.page;
    let Some(p) = FAULT_STATS.get_ptr_mut(&tgid) else { return };
    // SAFETY: this CPU's value of a live entry.
    unsafe { (*p).huge += 1 };
    if config().regions != 0 {
        if let Some(g) = granule_counts(tgid, page << 12) {
            g.huge += 1;
        }
    }
}

/// A fault that turned out slow gets a stack of the exact stratum, unless
/// it was sampled at its start.
#[inline(always)]
fn exact_stack<C: StackIdContext>(ctx: &C, tgid: u32, slot: &mut InflightFault) {
    if config().stack_mode == 0 || slot.user_stack != -1 || slot.kernel_stack != -1 {
        return;
    }
    (slot.user_stack, slot.kernel_stack) = take_stacks(ctx, tgid, slot.page << 12, STRATUM_EXACT);
    slot.flags |= INFLIGHT_EXACT_STACK;
}

// TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
// Runs as `prev`, so the current tid is the one leaving the CPU.
#[btf_tracepoint(function = "sched_switch")]
pub fn tp_btf_sched_switch(ctx: BtfTracePointContext) -> i32 {
    park_inflight(&ctx);
    0
}

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn tp_sched_sched_switch(ctx: TracePointContext) -> u32 {
    park_inflight(&ctx);
    0
}

#[inline(always)]
fn park_inflight<C: StackIdContext>(ctx: &C) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    mm_park(tid);
    let Some(slot) = FAULT_SLOT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, preemption off in __schedule.
    let slot = unsafe { &mut *slot };
    if slot.tid == 0 || slot.tid != tid {
        return;
    }
    // A fault that sleeps is a slow one (I/O, a lock, reclaim).
    exact_stack(ctx, (pid_tgid >> 32) as u32, slot);
    let parked: InflightFault = *slot;
    slot.tid = 0;
    // LRU map: insertion cannot fail for lack of room.
    let _ = FAULT_PARKED.insert(&parked.tid, &parked, 0);
}
