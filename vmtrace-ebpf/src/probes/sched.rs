//! Context switches: a thread switched out mid-fault or mid-syscall has its
//! in-flight record moved from the CPU's slot to a map keyed by tid, so the
//! fault is timed, and the call blamed, wherever it resumes.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, tracepoint},
    programs::{tracing::StackIdContext, BtfTracePointContext, TracePointContext},
};

use super::{fault::exact_stack, mmap::mm_park};
use crate::inflight::park_fault;

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

/// Parks whatever the leaving thread has in flight. Infallible (the parking
/// maps are LRU), hence no `try_…`.
#[inline(always)]
fn park_inflight<C: StackIdContext>(ctx: &C) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    mm_park(tid);
    // A fault that sleeps is a slow one (I/O, a lock, reclaim).
    park_fault(tid, |slot| exact_stack(ctx, (pid_tgid >> 32) as u32, slot));
}
