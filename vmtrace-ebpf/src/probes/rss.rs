//! Resident memory. `rss_stat` fires whenever one of an mm's resident
//! counters changes (mm/memory.c `add_mm_counter` and friends), on every
//! first-touch fault. Each address space's current and peak resident size is
//! kept here (`RSS_MM`).
//!
//! The tp_btf program (preferred) reads the counter's global `count` from the
//! mm: the figure `get_mm_counter()` gives, within `nr_cpus ×
//! percpu_counter_batch` pages of the exact sum. The classic tracepoint
//! (`--force-tracepoints`, or no BTF) carries the exact sum, which its assign
//! computes over every CPU under the counter's lock, and a keyed hash of the
//! mm pointer, on every event: ~100 ns more per fault here.
//!
//! The fault path streams each fault on a page of the resident sample, 1 in
//! `stack_period` pages chosen by a hash of the virtual page address
//! (`page_in_sample`), and every huge-page fault, with its stack
//! (`stream_page`): userspace attributes resident pages to those stacks.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_get_smp_processor_id, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{BtfTracePointContext, TracePointContext},
};
use vmtrace_common::{
    page_sampled, DropKind, EventHeader, EventKind, InflightFault, KernelOffsets, PageSample, RssEvent, RssMm,
    INFLIGHT_COPIED, INFLIGHT_COW, INFLIGHT_HUGE, INFLIGHT_PAGE, INFLIGHT_STACK_COPY, INFLIGHT_WRITE, PAGE_COPIED,
    PAGE_COW, PAGE_HUGE, PAGE_STACK_COPY, PAGE_WRITE, RSS_ENDED, RSS_MEMBERS, RSS_OWN_FIRST, RSS_PEAK_MIN_STEP,
    RSS_PEAK_TIME_STEP, RSS_SEEN_ALL, RSS_SEEN_SHIFT, STACK_ID_NONE,
};

use crate::{
    globals::{koffsets, stopped},
    probes::task::read_field,
    shared::{batched_wakeup, count_drop, is_traced, tp_fixed, EVENTS},
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
// (`Tp::RssMmId` … in vmtrace-common's table: the same on 6.1, 6.12 and
// 6.18, and checked at attach).

// The event has no mm pointer and no reference count: a teardown in
// another task's context (a CLONE_VM sibling, or a reader of the owner's
// /proc files holding the last reference) is told by `Teardown::Classic`.
#[tracepoint(category = "kmem", name = "rss_stat")]
pub fn tp_kmem_rss_stat(ctx: TracePointContext) -> u32 {
    let member = tp_fixed!(&ctx, RssMember: u32);
    let size = tp_fixed!(&ctx, RssSize: i64).max(0) as u64;
    let curr = tp_fixed!(&ctx, RssCurr: u32) != 0;
    let _ = update(tp_fixed!(&ctx, RssMmId: u32), curr, Teardown::Classic, member, size, None);
    0
}

/// How an event tells that its mm is being torn down (`mm_users` is 0,
/// `__mmput`), whatever task's context it runs in.
#[derive(Clone, Copy)]
enum Teardown {
    /// The tp_btf program read the event's mm (`mm`) and its `mm_users`.
    Btf { mm: u64, dying: bool },
    /// The classic event: `mm_users` read through the entry's `owner_mm`,
    /// the address the owner's own first event gave (its `current->mm`; the
    /// event's `mm_id` is a keyed hash of it, which a program cannot
    /// compute). Exact as the tp_btf test is: the same field of the same mm.
    /// Not an exit mark: `sched_process_exit` fires after `exit_mm()` up to
    /// 6.15 (arm64's 6.1 and 6.12, where this program serves), so a /proc
    /// reader's `mmput` can tear the mm down before the owner's exit is seen;
    /// nor userspace guessing from the first decrease in another context:
    /// reclaim decreases a live mm's counters from kswapd too.
    Classic,
}

impl Teardown {
    /// The mm's address in an event of its owner's own (`curr`).
    #[inline(always)]
    fn own_mm(self) -> u64 {
        match self {
            Self::Btf { mm, .. } => mm,
            Self::Classic => {
                // SAFETY: no preconditions; the pointer is only read through
                // bpf_probe_read_kernel.
                let task = unsafe { aya_ebpf::helpers::bpf_get_current_task() } as *const u8;
                read_field::<u64>(task, koffsets().task_mm).unwrap_or(0)
            }
        }
    }

    /// Whether the mm of an entry whose `owner_mm` is `owner_mm` has no user
    /// left; read only for a change outside the owner's context.
    #[inline(always)]
    fn dying(self, owner_mm: u64) -> bool {
        match self {
            Self::Btf { dying, .. } => dying,
            Self::Classic => read_field::<i32>(owner_mm as *const u8, koffsets().mm_users) == Some(0),
        }
    }
}

/// x86-64's page size; the counters count pages.
#[cfg(not(bpf_target_arch = "aarch64"))]
const PAGE_SHIFT: u32 = 12;

/// Set by the loader on arm64: log2 of the kernel's page size (4, 16 or
/// 64 KiB kernels); the counters count pages.
#[cfg(bpf_target_arch = "aarch64")]
#[unsafe(no_mangle)]
static RSS_PAGE_SHIFT: u32 = 12;

#[inline(always)]
fn page_shift() -> u32 {
    #[cfg(not(bpf_target_arch = "aarch64"))]
    return PAGE_SHIFT;
    // SAFETY: as for `resident_pages`.
    #[cfg(bpf_target_arch = "aarch64")]
    return unsafe { core::ptr::read_volatile(&raw const RSS_PAGE_SHIFT) } & 31;
}

/// The address space's id: x86-64's `mm->context.ctx_id`, unique per mm for
/// the boot. arm64's `mm->context.id` is the ASID, reassigned at each
/// generation rollover: the mm pointer is folded into 32 bits instead, as
/// the classic event hashes it (a freed mm's pointer handed to the next mm
/// is a reused id, which `update` already tells apart).
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn mm_id(mm: *const u8, off: &KernelOffsets) -> u64 {
    btf_load::<u64>(mm, off.mm_ctx_id)
}

#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn mm_id(mm: *const u8, _off: &KernelOffsets) -> u64 {
    // mm_structs are 64-byte aligned slab objects.
    let p = mm as u64;
    if p == 0 {
        0
    } else {
        u64::from(((p >> 6) as u32) ^ ((p >> 38) as u32)) | 1
    }
}

// TP_PROTO(struct mm_struct *mm, int member) (6.2+; before: `, long count`).
// The classic event's assign sums the counter over every CPU under its lock
// (`percpu_counter_sum_positive`) and hashes the mm pointer; here the
// counter's global `count` is read instead, the figure `get_mm_counter()`
// gives, within `nr_cpus × percpu_counter_batch` pages of the sum (each
// CPU folds its share in once it reaches the batch; `resident.error_pages`).
#[btf_tracepoint(function = "rss_stat")]
pub fn tp_btf_rss_stat(ctx: BtfTracePointContext) -> i32 {
    let _ = try_btf_rss_stat(&ctx);
    0
}

#[inline(always)]
fn try_btf_rss_stat(ctx: &BtfTracePointContext) -> Option<()> {
    let off = koffsets();
    #[cfg(not(bpf_target_arch = "aarch64"))]
    if off.mm_ctx_id == KernelOffsets::MISSING {
        return None;
    }
    // Loads through the arguments' BTF pointers (the verifier checks each
    // against the kernel's types, a fault reads 0): no helper calls.
    let mm: *const u8 = ctx.arg(0);
    let member = ctx.arg::<u32>(1);
    let count = |i: u32| btf_load::<i64>(mm, off.mm_rss_stat + i * off.pcpu_size + off.pcpu_count);
    // Every member's count (6.2+): a new entry starts from all of them, not
    // only the member whose event made it (a process traced mid-life has
    // file pages that may never change while traced). Three loads more
    // per event that gets here.
    let (pages, all): (i64, Option<[i64; RSS_MEMBERS]>) = if off.pcpu_size == KernelOffsets::MISSING {
        (ctx.arg(2), None)
    } else {
        // Constant offsets, as the verifier requires of these loads.
        let all = [count(0), count(1), count(2), count(3)];
        let pages = match member {
            0 => all[0],
            1 => all[1],
            2 => all[2],
            3 => all[3],
            _ => return None,
        };
        (pages, Some(all))
    };
    // SAFETY: no preconditions; the current task's BTF pointer.
    let task = unsafe { bpf_get_current_task_btf() }.cast::<u8>().cast_const();
    let current_mm = btf_load::<*const u8>(task, off.task_mm);
    if unchanged(mm, current_mm, member, pages) {
        return None;
    }
    let id = mm_id(mm, &off);
    // A kernel thread has no mm: its load reads 0, never an id (from 1).
    let curr = mm_id(current_mm, &off) == id;
    // Torn down by whoever dropped the last reference: no user is left.
    let dying = !curr && off.mm_users != KernelOffsets::MISSING && btf_load::<i32>(mm, off.mm_users) == 0;
    let how = Teardown::Btf { mm: mm as u64, dying };
    let bytes = |p: i64| (p.max(0) as u64) << page_shift();
    let all = all.map(|a| [bytes(a[0]), bytes(a[1]), bytes(a[2]), bytes(a[3])]);
    update(id as u32, curr, how, member, bytes(pages), all)
}

/// The last counter this CPU saw change: its mm, the current task's mm,
/// the member and the global count read.
#[repr(C)]
#[derive(Clone, Copy)]
struct RssLast {
    mm: u64,
    current_mm: u64,
    member: u64,
    pages: i64,
}

#[map]
static RSS_LAST: PerCpuArray<RssLast> = PerCpuArray::with_max_entries(1, 0);

/// Whether this event repeats the last one this CPU saw: the same counter of
/// the same mm, read in the same mm, at the same global count. The global
/// count moves only when a CPU folds its share in (every
/// `percpu_counter_batch` pages, 32 here), so most events of a faulting
/// process repeat the one before and need no lookup: 111 → 81 ns per run
/// under `bpf_stats` on a first touch (docs/performance.md). A teardown (the mm no longer
/// current) or another mm is never a repeat. Rare miss: another CPU's fold
/// and this CPU's next fold cancelling out to the count this CPU saw last
/// leaves the other CPU's figure until the next fold (one batch, within
/// `resident.error_pages`' bound).
#[inline(always)]
fn unchanged(mm: *const u8, current_mm: *const u8, member: u32, pages: i64) -> bool {
    let Some(last) = RSS_LAST.get_ptr_mut(0) else { return false };
    // SAFETY: this CPU's slot; programs on one CPU do not interleave.
    let last = unsafe { &mut *last };
    let now = RssLast { mm: mm as u64, current_mm: current_mm as u64, member: u64::from(member), pages };
    if last.mm == now.mm && last.current_mm == now.current_mm && last.member == now.member && last.pages == pages {
        return true;
    }
    *last = now;
    false
}

/// A load at `base + off` through a BTF pointer.
#[inline(always)]
fn btf_load<T: Copy>(base: *const u8, off: u32) -> T {
    // SAFETY: the verifier checks the access against BTF and the kernel
    // recovers from a faulting load (it reads zero).
    unsafe { core::ptr::read_volatile(base.add(off as usize).cast::<T>()) }
}

/// One counter of the address space `mm_id` changed to `size` bytes; `curr`:
/// the mm is the current task's; `how`: how to tell it is being torn down
/// (no user left), in whatever task's context; `all`: every member, when
/// the program could read them (a new entry starts from them).
#[inline(always)]
fn update(
    mm_id: u32,
    curr: bool,
    how: Teardown,
    member: u32,
    size: u64,
    all: Option<[u64; RSS_MEMBERS]>,
) -> Option<()> {
    if stopped() || member as usize >= RSS_MEMBERS {
        return None;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(e) = RSS_MM.get_ptr_mut(mm_id) else {
        // A new address space of a traced process: its own (curr), or one it
        // fills without running in it: a child's at fork (dup_mmap), the new
        // one of an exec before the switch. Reclaim and teardown of an mm
        // not seen before are not counted: nothing of it was known.
        if is_traced(tgid) && RSS_MM.insert(mm_id, fresh(tgid, curr, how, member, size, all), 0).is_err() {
            count_drop(DropKind::RssMmFull);
        }
        return None;
    };
    // SAFETY: a live entry; concurrent updates of one mm race only on which
    // member's size lands last, each a whole u64 store.
    let e = unsafe { &mut *e };
    if e.flags & RSS_ENDED != 0 && size > member_of(&e.size, member) {
        // A torn-down address space only shrinks: a counter growing again is
        // a new one under the same id (the slab hands a freed mm_struct to
        // the next fork or exec). Its old figures were streamed
        // (`ResidentEnd`) and read by userspace.
        if is_traced(tgid) {
            *e = fresh(tgid, curr, how, member, size, all);
        }
        return None;
    }
    if e.tgid == 0 && curr {
        // The child's (or exec'd image's) first event in its own context.
        e.tgid = tgid;
        e.owner_mm = how.own_mm();
    }
    // The owner changing its own counters while its mm is not current: it is
    // tearing the mm down (exit_mm, or the old mm at exec). Or another task
    // is, having held the last reference when the owner exited: a reader of
    // the owner's /proc files (vmtrace's own collector among them, under
    // load) or a CLONE_VM sibling. The counters still hold the owner's end.
    // (Reclaim changes a live mm's counters from kswapd: not a teardown.)
    if !curr && e.tgid != 0 && e.flags & RSS_ENDED == 0 && (e.tgid == tgid || how.dying(e.owner_mm)) {
        e.flags |= RSS_ENDED;
        e.end = e.size;
        // SAFETY: no preconditions.
        e.end_ns = unsafe { bpf_ktime_get_ns() };
        let ev = (e.tgid, e.end);
        emit(EventKind::ResidentEnd, ev.0, mm_id, &ev.1);
    }
    set_member(&mut e.size, member, size);
    e.flags |= 1 << (RSS_SEEN_SHIFT + member);
    if e.tgid == 0 {
        e.at_fork = e.size;
    }
    if e.flags & RSS_ENDED != 0 {
        return None;
    }
    let now = RssMm::resident(&e.size);
    if now > e.peak {
        // The clock is read once per `RSS_PEAK_TIME_STEP` of growth, not on
        // every page of a growing process (~40 ns each): the peak's time is
        // that of the last step it passed.
        if now >= e.peak_timed + RSS_PEAK_TIME_STEP || e.peak_ns == 0 {
            // SAFETY: no preconditions.
            e.peak_ns = unsafe { bpf_ktime_get_ns() };
            e.peak_timed = now;
        }
        e.peak = now;
        e.peak_size = e.size;
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
/// else unclaimed until its owner's first event. It starts from every
/// member when `all` has them (`RSS_SEEN_ALL`), else from the event's alone.
#[inline(always)]
fn fresh(tgid: u32, curr: bool, how: Teardown, member: u32, size: u64, all: Option<[u64; RSS_MEMBERS]>) -> RssMm {
    let mut v =
        RssMm { tgid: if curr { tgid } else { 0 }, owner_mm: if curr { how.own_mm() } else { 0 }, ..RssMm::default() };
    v.flags = (1 << (RSS_SEEN_SHIFT + member)) | if curr { RSS_OWN_FIRST } else { 0 };
    if let Some(all) = all {
        v.size = all;
        v.flags |= RSS_SEEN_ALL;
    }
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
    let mut flags = if f.flags & INFLIGHT_HUGE != 0 { PAGE_HUGE } else { 0 };
    // Its user stack went to userspace as a copy with this page's address.
    if f.flags & INFLIGHT_STACK_COPY != 0 {
        flags |= PAGE_STACK_COPY;
    }
    // A read of a writable private file mapping maps a file page, a write
    // a copy (`page_kind` in userspace).
    if f.flags & INFLIGHT_WRITE != 0 {
        flags |= PAGE_WRITE;
    }
    // A copy-on-write fault, and whether the page-allocation hook saw it
    // copy: the fault ended, so the copy (allocated inside it) was seen.
    if f.flags & INFLIGHT_COW != 0 {
        flags |= PAGE_COW;
        if f.flags & INFLIGHT_COPIED != 0 {
            flags |= PAGE_COPIED;
        }
    }
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
        // SAFETY: no preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        _pad: 0,
    });
    slot.submit(batched_wakeup());
}
