//! The fault start on arm64, which has no `exceptions:page_fault_*`
//! tracepoints and whose fault entry points cannot be kprobed
//! (`do_page_fault` is `__kprobes`, `do_mem_abort` `NOKPROBE_SYMBOL`).
//!
//! start: fentry on `handle_mm_fault` where the kernel allows trampolines:
//!        the fault's flags say write (`FAULT_FLAG_WRITE`), exec
//!        (`FAULT_FLAG_INSTRUCTION`) and user or kernel mode
//!        (`FAULT_FLAG_USER`); a retry is not a new fault. Else the software
//!        perf event PERF_COUNT_SW_PAGE_FAULTS (period 1), raised once per
//!        fault in `do_page_fault` with the address and the faulting
//!        registers, but no access type: write, exec and COW are not known
//!        there (userspace says so).
//! COW:   neither start tells a write to a present read-only page (x86's
//!        `X86_PF_PROT`) from a write to an absent one; `do_wp_page`, which
//!        `handle_pte_fault` calls for exactly those, does: fentry where
//!        trampolines exist, else a kprobe (6.1 has no arm64 trampolines).
//! end:   the same chain as x86 (`fault.rs`).
use aya_ebpf::{
    bindings::user_pt_regs,
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, kprobe, map, perf_event},
    maps::LruHashMap,
    programs::{FEntryContext, PerfEventContext, ProbeContext},
};
use vmtrace_common::pf;

use crate::{
    globals::config,
    probes::fault::{try_fault_start, try_wp_fault},
};

/// `enum fault_flag` (include/linux/mm_types.h; the same bits 5.10–6.12).
const FAULT_FLAG_WRITE: u32 = 1 << 0;
const FAULT_FLAG_USER: u32 = 1 << 6;
const FAULT_FLAG_INSTRUCTION: u32 = 1 << 8;
/// 6.4+: the attempt under the per-VMA lock; a `VM_FAULT_RETRY` from it is
/// retried under the mmap lock without `FAULT_FLAG_TRIED`.
const FAULT_FLAG_VMA_LOCK: u32 = 1 << 12;

/// Lowest kernel (TTBR1) address on arm64.
const KERNEL_SPACE_START: u64 = 0xff00_0000_0000_0000;

/// The page of each thread's last per-VMA-lock attempt: the mmap-lock
/// attempt that follows a retry is the same fault.
#[map]
static VMA_LOCK_TRY: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16_384, 0);

// vm_fault_t handle_mm_fault(struct vm_area_struct *vma, unsigned long address,
//                            unsigned int flags, struct pt_regs *regs)
#[fentry(function = "handle_mm_fault")]
pub fn fentry_handle_mm_fault(ctx: FEntryContext) -> i32 {
    let _ = try_fentry_handle_mm_fault(&ctx);
    0
}

#[inline(always)]
fn try_fentry_handle_mm_fault(ctx: &FEntryContext) -> Option<()> {
    let address: u64 = ctx.arg(1);
    let flags = ctx.arg::<u64>(2) as u32;
    let regs: u64 = ctx.arg(3);
    // No regs: get_user_pages(), not a fault of the task.
    if regs == 0 || flags & config().fault_flag_tried != 0 {
        return None;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let page = address >> 12;
    if flags & FAULT_FLAG_VMA_LOCK != 0 {
        let _ = VMA_LOCK_TRY.insert(tid, page, 0);
    } else if
    // SAFETY: a plain value read.
    unsafe { VMA_LOCK_TRY.get(tid) }.is_some_and(|p| *p == page) {
        let _ = VMA_LOCK_TRY.remove(tid);
        return None;
    }
    let mut error_code = 0;
    if flags & FAULT_FLAG_WRITE != 0 {
        error_code |= pf::WRITE;
    }
    if flags & FAULT_FLAG_INSTRUCTION != 0 {
        error_code |= pf::INSTR;
    }
    try_fault_start(ctx, address, error_code, flags & FAULT_FLAG_USER == 0)
}

/// PERF_COUNT_SW_PAGE_FAULTS, period 1: every fault `do_page_fault` handles.
#[perf_event]
pub fn perf_event_page_faults(ctx: PerfEventContext) -> u32 {
    // SAFETY: the sample data perf_sw_event() was given: the faulting address
    // and the registers at the fault.
    let (address, pstate) = unsafe {
        let d = &*ctx.ctx;
        let regs: &user_pt_regs = &*(&raw const d.regs).cast::<user_pt_regs>();
        (d.addr, regs.pstate)
    };
    // PSR_MODE_MASK: EL0t (0) is user mode.
    let kernel_mode = pstate & 0xf != 0;
    if !kernel_mode || address < KERNEL_SPACE_START {
        let _ = try_fault_start(&ctx, address, 0, kernel_mode);
    }
    0
}

// vm_fault_t do_wp_page(struct vm_fault *vmf): a write (or GUP's unshare) to
// a present, write-protected pte, inside `handle_mm_fault`.
#[fentry(function = "do_wp_page")]
pub fn fentry_do_wp_page(_ctx: FEntryContext) -> i32 {
    let _ = try_wp_fault();
    0
}

#[kprobe]
pub fn kprobe_do_wp_page(_ctx: ProbeContext) -> u32 {
    let _ = try_wp_fault();
    0
}
