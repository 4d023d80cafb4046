//! Resident memory. `kmem:rss_stat` fires whenever one of an mm's resident
//! counters changes (mm/memory.c `add_mm_counter` and friends), carrying the
//! member and its new size, which the tracepoint sums over CPUs
//! (`percpu_counter_sum_positive`): the kernel's exact figure. Each address
//! space's current and peak resident size is kept here (`RSS_MM`).
//!
//! Only the classic tracepoint is used: a tp_btf program gets the mm and the
//! member but not the summed size (the event's assign does not run for it),
//! and summing a `percpu_counter` needs every CPU's slot.
//!
//! The fault path streams each fault on a page of the resident sample, 1 in
//! `stack_period` pages chosen by a hash of the virtual page address
//! (`page_in_sample`), and every huge-page fault, with its stack
//! (`stream_page`): userspace attributes resident pages to those stacks.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use vmtrace_common::{
    page_sampled, DropKind, EventHeader, EventKind, InflightFault, PageSample, RssEvent, RssMm, INFLIGHT_HUGE,
    INFLIGHT_PAGE, PAGE_HUGE, RSS_ENDED, RSS_MEMBERS, RSS_PEAK_MIN_STEP, STACK_ID_NONE,
};

use crate::{
    globals::stopped,
    shared::{batched_wakeup, count_drop, is_traced, tp_field, EVENTS},
};

/// Set by the loader: 1 streams the sampled pages (`PageSample`).
#[unsafe(no_mangle)]
static RESIDENT_PAGES: u32 = 0;

/// Set by the loader: the recording's random salt of the page hash
/// (`vmtrace_common::page_sampled`), which userspace knows too.
#[unsafe(no_mangle)]
static RESIDENT_SALT: u64 = 0;

#[inline(always)]
fn resident_pages() -> bool {
    // SAFETY: a global the loader rewrites before load; volatile so the
    // compiler does not fold the default in.
    unsafe { core::ptr::read_volatile(&raw const RESIDENT_PAGES) != 0 }
}

/// Whether the page `page` (address >> 12) is in the resident sample: 1 in
/// `period` pages by a hash of the virtual page address alone, so a fork
/// child samples the pages its parent sampled (its copy-on-write copies
/// land where the parent's pages were).
#[inline(always)]
pub fn page_in_sample(page: u64, period: u32) -> bool {
    // SAFETY: as for `resident_pages`.
    resident_pages() && page_sampled(page, unsafe { core::ptr::read_volatile(&raw const RESIDENT_SALT) }, period)
}

/// Resident counters per address space, keyed by `mm_id`. Userspace
/// deletes an entry a while after its teardown began.
#[map]
pub static RSS_MM: HashMap<u32, RssMm> = HashMap::with_max_entries(16_384, 0);

// /sys/kernel/tracing/events/kmem/rss_stat/format:
//   field:unsigned int mm_id;  offset:8;  size:4; signed:0;
//   field:unsigned int curr;   offset:12; size:4; signed:0;
//   field:int member;          offset:16; size:4; signed:1;
//   field:long size;           offset:24; size:8; signed:1;
const TP_RSS_MM_ID: usize = 8;
const TP_RSS_CURR: usize = 12;
const TP_RSS_MEMBER: usize = 16;
const TP_RSS_SIZE: usize = 24;

#[tracepoint(category = "kmem", name = "rss_stat")]
pub fn tp_kmem_rss_stat(ctx: TracePointContext) -> u32 {
    let _ = try_rss_stat(&ctx);
    0
}

#[inline(always)]
fn try_rss_stat(ctx: &TracePointContext) -> Option<()> {
    if stopped() {
        return None;
    }
    let member: u32 = tp_field(ctx, TP_RSS_MEMBER);
    if member as usize >= RSS_MEMBERS {
        return None;
    }
    let size = tp_field::<i64>(ctx, TP_RSS_SIZE).max(0) as u64;
    let mm_id: u32 = tp_field(ctx, TP_RSS_MM_ID);
    let curr = tp_field::<u32>(ctx, TP_RSS_CURR) != 0;
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(e) = RSS_MM.get_ptr_mut(mm_id) else {
        // A new address space of a traced process: its own (curr), or one it
        // fills without running in it: a child's at fork (dup_mmap), the new
        // one of an exec before the switch. Reclaim and teardown of an mm
        // not seen before are not counted: nothing of it was known.
        if is_traced(tgid) && RSS_MM.insert(mm_id, fresh(tgid, curr, member, size), 0).is_err() {
            count_drop(DropKind::RssMmFull);
        }
        return None;
    };
    // SAFETY: a live entry; concurrent updates of one mm race only on which
    // member's size lands last, each a whole u64 store.
    let e = unsafe { &mut *e };
    if e.flags & RSS_ENDED != 0 && size > member_of(&e.size, member) {
        // A torn-down address space only shrinks: a counter growing again is
        // a new one under the same id (`mm_id` hashes the mm's address, and
        // the slab hands a freed mm_struct to the next fork or exec). Its
        // old figures were streamed (`ResidentEnd`) and read by userspace.
        if is_traced(tgid) {
            *e = fresh(tgid, curr, member, size);
        }
        return None;
    }
    if e.tgid == 0 && curr {
        // The child's (or exec'd image's) first event in its own context.
        e.tgid = tgid;
    }
    // The owner changing its own counters while its mm is not current: it is
    // tearing the mm down (exit_mm, or the old mm at exec).
    if !curr && e.tgid == tgid && e.flags & RSS_ENDED == 0 {
        e.flags |= RSS_ENDED;
        e.end = e.size;
        // SAFETY: no preconditions.
        e.end_ns = unsafe { bpf_ktime_get_ns() };
        let ev = (e.tgid, e.end);
        emit(EventKind::ResidentEnd, ev.0, mm_id, &ev.1);
    }
    set_member(&mut e.size, member, size);
    if e.tgid == 0 {
        e.at_fork = e.size;
    }
    if e.flags & RSS_ENDED != 0 {
        return None;
    }
    let now = RssMm::resident(&e.size);
    if now > e.peak {
        e.peak = now;
        e.peak_size = e.size;
        // SAFETY: no preconditions.
        e.peak_ns = unsafe { bpf_ktime_get_ns() };
        let step = (e.reported_peak / 32).max(RSS_PEAK_MIN_STEP);
        if e.tgid != 0 && now >= e.reported_peak + step {
            e.reported_peak = now;
            let ev = (e.tgid, e.size);
            emit(EventKind::ResidentPeak, ev.0, mm_id, &ev.1);
        }
    }
    Some(())
}

/// A new address space's entry: owned by `tgid` if it is its own (`curr`),
/// else unclaimed until its owner's first event.
#[inline(always)]
fn fresh(tgid: u32, curr: bool, member: u32, size: u64) -> RssMm {
    let mut v = RssMm { tgid: if curr { tgid } else { 0 }, ..RssMm::default() };
    set_member(&mut v.size, member, size);
    v.at_fork = v.size;
    // SAFETY: no preconditions.
    v.first_ns = unsafe { bpf_ktime_get_ns() };
    v
}

/// `size[member]`, with constant indices (see `set_member`).
#[inline(always)]
fn member_of(size: &[u64; RSS_MEMBERS], member: u32) -> u64 {
    match member {
        0 => size[0],
        1 => size[1],
        2 => size[2],
        3 => size[3],
        _ => 0,
    }
}

/// `size[member] = v` with constant indices: the verifier loses the bound
/// of a variable index on its way through the compiler's shifts.
#[inline(always)]
fn set_member(size: &mut [u64; RSS_MEMBERS], member: u32, v: u64) {
    match member {
        0 => size[0] = v,
        1 => size[1] = v,
        2 => size[2] = v,
        3 => size[3] = v,
        _ => {}
    }
}

#[inline(always)]
fn emit(kind: EventKind, tgid: u32, mm_id: u32, size: &[u64; RSS_MEMBERS]) {
    let Some(mut slot) = EVENTS.reserve::<RssEvent>(0) else {
        count_drop(DropKind::RssRingFull);
        return;
    };
    slot.write(RssEvent {
        hdr: EventHeader {
            kind: kind as u32,
            size: core::mem::size_of::<RssEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        tgid,
        mm_id,
        size: *size,
    });
    slot.submit(batched_wakeup());
}

/// The fault path's hook, at a fault's end: a fault on a page of the
/// sample (`INFLIGHT_PAGE`), or served by a huge page (each one stands for
/// itself), is streamed with its page and stack, so userspace can make that
/// stack the page's owner. Faults whose stack the random draw alone took
/// are not: the sample is of addresses, the same in parent and child.
#[inline(always)]
pub fn stream_page(tgid: u32, f: &InflightFault) {
    if !resident_pages()
        || f.flags & (INFLIGHT_PAGE | INFLIGHT_HUGE) == 0
        || (f.user_stack == STACK_ID_NONE && f.kernel_stack == STACK_ID_NONE)
    {
        return;
    }
    let Some(mut slot) = EVENTS.reserve::<PageSample>(0) else {
        count_drop(DropKind::PageSampleRingFull);
        return;
    };
    let flags = if f.flags & INFLIGHT_HUGE != 0 { PAGE_HUGE } else { 0 };
    slot.write(PageSample {
        hdr: EventHeader {
            kind: EventKind::PageSample as u32,
            size: core::mem::size_of::<PageSample>() as u32,
            ts_ns: f.start_ns,
        },
        tgid,
        flags,
        addr: f.page << 12,
        user_stack: f.user_stack,
        kernel_stack: f.kernel_stack,
    });
    slot.submit(batched_wakeup());
}
