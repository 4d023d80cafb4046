//! TLB flushes and the IPIs that carry remote ones (shootdowns), attributed to
//! the process that *sent* them and to the syscall and call site in flight on
//! the sending thread. A shootdown *received* (reason 1) is counted for the
//! task it interrupted, never as that task's own doing.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map, tracepoint},
    maps::LruHashMap,
    programs::{tracing::StackIdContext, BtfTracePointContext, TracePointContext},
    EbpfContext as _,
};
use vmtrace_common::{MM_CALLS, MM_IPI_FROM_FLUSH, STACK_ID_NONE, STACK_USER, TLB_REASONS};

use super::mmap::{mm_current, mm_stack_counts, mm_stats, stack_key};
use crate::{
    globals::config,
    shared::{is_traced, tp_fixed},
    stacks::user_stack_id,
};

// TP_PROTO(int reason, unsigned long pages)
// reason: 0 TLB_FLUSH_ON_TASK_SWITCH, 1 TLB_REMOTE_SHOOTDOWN (received),
// 2 TLB_LOCAL_SHOOTDOWN, 3 TLB_LOCAL_MM_SHOOTDOWN, 4 TLB_REMOTE_SEND_IPI.
#[btf_tracepoint(function = "tlb_flush")]
pub fn tp_btf_tlb_flush(ctx: BtfTracePointContext) -> i32 {
    let _ = try_tlb_flush(&ctx, ctx.arg::<i32>(0), ctx.arg::<u64>(1));
    0
}

// /sys/kernel/tracing/events/tlb/tlb_flush/format:
//   field:int reason;          offset:8;  size:4; signed:1;
//   field:unsigned long pages; offset:16; size:8; signed:0;
#[tracepoint(category = "tlb", name = "tlb_flush")]
pub fn tp_tlb_tlb_flush(ctx: TracePointContext) -> u32 {
    let _ = try_tlb_flush(&ctx, tp_fixed!(&ctx, TlbFlushReason: i32), tp_fixed!(&ctx, TlbFlushPages: u64));
    0
}

#[inline(always)]
fn try_tlb_flush<C: StackIdContext>(ctx: &C, reason: i32, pages: u64) -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_traced(tgid) {
        return None;
    }
    if let Some(m) = mm_stats(tgid) {
        if (0..TLB_REASONS as i32).contains(&reason) {
            if let Some(c) = m.tlb_reason.get_mut(reason as usize) {
                *c += 1;
            }
        }
        // A full flush reports TLB_FLUSH_ALL (-1UL): counted apart, never
        // summed as pages.
        if pages == u64::MAX {
            m.tlb_full_flushes += 1;
        } else {
            m.tlb_pages += pages;
        }
    }
    // Without csd_queue_cpu (before 6.6): a flush that would send (reason
    // 4) leaves its call site for the IPIs it sends; each one is counted
    // where it lands (reason 1). A flush IPI only goes to a CPU running
    // this very address space (a lazy CPU is skipped unless page tables
    // were freed, and then switches away untraced), so the task it
    // interrupts is a thread of the sender's process. Counting reason-4
    // flushes instead counted one IPI whenever the mm had been on another
    // CPU, sent or not (a lone thread that migrated: 2,000 "IPIs", the
    // kernel's TLB row 7).
    if config().mm & MM_IPI_FROM_FLUSH != 0 {
        match reason {
            4 => flush_sender(ctx, tgid),
            1 => flush_received(tgid),
            _ => {}
        }
    }
    Some(())
}

/// The call site of each process's last flush that sends IPIs (call << 32 |
/// user stack id), for the IPIs it sends (pre-6.6 kernels).
#[map]
static FLUSH_SENDER: LruHashMap<u32, u64> = LruHashMap::with_max_entries(4_096, 0);

#[inline(always)]
fn flush_sender<C: StackIdContext>(ctx: &C, tgid: u32) {
    let (call, user_stack) = call_site(ctx);
    let v = (u64::from(call) << 32) | u64::from(user_stack as u32);
    let _ = FLUSH_SENDER.insert(tgid, v, 0);
}

/// An IPI received by a thread of `tgid`: sent by its own last flush.
#[inline(always)]
fn flush_received(tgid: u32) {
    // SAFETY: a live map value, read at once.
    let v =
        FLUSH_SENDER.get_ptr(tgid).map_or((MM_CALLS as u64) << 32 | u64::from(STACK_ID_NONE as u32), |p| unsafe { *p });
    count_ipis(tgid, (v >> 32) as u32, v as u32 as i32, 1);
}

/// The current thread's call site: its mmap-family call in flight, else
/// its user stack under call `MM_CALLS`.
#[inline(always)]
fn call_site<C: StackIdContext>(ctx: &C) -> (u32, i32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    // Only the two fields, each with a defined default: a copied-out
    // Option<MmInflight> leaves registers the verifier rejects as uninitialized.
    let (call, user_stack) = mm_current(pid_tgid as u32).unwrap_or((MM_CALLS as u32, STACK_ID_NONE));
    let user_stack = if (call as usize) < MM_CALLS {
        user_stack
    } else if config().stack_mode & STACK_USER != 0 {
        user_stack_id(ctx)
    } else {
        STACK_ID_NONE
    };
    (call, user_stack)
}

/// Counts `n` TLB-flush IPIs sent by the current thread. Outside an
/// mmap-family call (a COW fault of a threaded process, NUMA migration,
/// direct reclaim) the sender's user stack is taken, under call `MM_CALLS`:
/// every IPI then has a call site to be blamed on.
#[inline(always)]
fn ipis_sent<C: StackIdContext>(ctx: &C, n: u64) {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if n == 0 || !is_traced(tgid) {
        return;
    }
    let (call, user_stack) = call_site(ctx);
    count_ipis(tgid, call, user_stack, n);
}

/// `n` IPIs sent by `tgid` during `call` (`MM_CALLS`: outside any) from
/// the call site `user_stack`.
#[inline(always)]
fn count_ipis(tgid: u32, call: u32, user_stack: i32, n: u64) {
    if let Some(m) = mm_stats(tgid) {
        m.ipis_sent += n;
        if let Some(c) = m.ipis_by_call.get_mut((call as usize).min(MM_CALLS)) {
            *c += n;
        }
    }
    if let Some(c) = mm_stack_counts(&stack_key(tgid, call, user_stack)) {
        c.ipis += n;
    }
}

// A shootdown is a cross-CPU function call (6.6+: one event per target CPU)
// whose function is `flush_tlb_func`; the ipi:* tracepoints carry the generic
// IPI handler instead, not the TLB function.
// TP_PROTO(const unsigned int cpu, unsigned long callsite, smp_call_func_t func,
//          call_single_data_t *csd)
#[btf_tracepoint(function = "csd_queue_cpu")]
pub fn tp_btf_csd_queue_cpu(ctx: BtfTracePointContext) -> i32 {
    // The verifier refuses a direct load of a function-pointer argument
    // ("arg2 type FUNC_PROTO is not a struct"): copy the slot instead.
    // SAFETY: the context is an array of the tracepoint's u64 arguments.
    let func = unsafe { bpf_probe_read_kernel(ctx.as_ptr().cast::<u64>().add(2)) }.unwrap_or(0);
    csd_queued(&ctx, func);
    0
}

// /sys/kernel/tracing/events/csd/csd_queue_cpu/format:
//   field:unsigned int cpu; offset:8;  size:4; signed:0;
//   field:void * callsite;  offset:16; size:8; signed:0;
//   field:void * func;      offset:24; size:8; signed:0;
//   field:void * csd;       offset:32; size:8; signed:0;
#[tracepoint(category = "csd", name = "csd_queue_cpu")]
pub fn tp_csd_csd_queue_cpu(ctx: TracePointContext) -> u32 {
    csd_queued(&ctx, tp_fixed!(&ctx, CsdFunc: u64));
    0
}

#[inline(always)]
fn csd_queued<C: StackIdContext>(ctx: &C, func: u64) {
    if func != 0 && func == config().flush_tlb_func {
        ipis_sent(ctx, 1);
    }
}
