//! The fault in flight on each CPU, from the start hook to the end hook, and
//! the faults parked when their thread sleeps mid-fault (majors wait on I/O),
//! so a fault is timed wherever it resumes.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use vmtrace_common::{InflightFault, KernelOffsets, INFLIGHT_ENDED, INFLIGHT_UNTRACED};

use crate::globals::koffset_task_pagefault_disabled;

/// The fault in flight on this CPU.
#[map]
pub static FAULT_SLOT: PerCpuArray<InflightFault> = PerCpuArray::with_max_entries(1, 0);

/// Faults whose thread was switched out mid-fault, keyed by tid. LRU: an entry
/// whose fault never completed (SIGSEGV) ages out instead of filling the map.
#[map]
pub static FAULT_PARKED: LruHashMap<u32, InflightFault> = LruHashMap::with_max_entries(16_384, 0);

/// A kernel-mode fault the kernel never handles or accounts: taken while
/// this CPU walks a user stack for us, or while the task runs with page
/// faults disabled (`task_struct.pagefault_disabled`), where
/// `do_user_addr_fault` fixes the access up at once. The second case covers
/// another BPF tracer's stack walk (a second vmtrace, bpftrace's `ustack`),
/// which this instance's walking flag cannot see, and atomic user copies.
///
/// The count is read through `bpf_probe_read_kernel`, whose
/// `copy_from_kernel_nofault` disables page faults around the read: the
/// value read is one more than the task's own (measured on 6.18 with
/// bpftrace, which reads it the same way: 1 on every handled fault, user or
/// kernel mode, 2 on the faults of another tracer's walk).
#[inline(always)]
pub fn nofault_read() -> bool {
    if FAULT_SLOT.get(0).is_some_and(|s| s.walking != 0) {
        return true;
    }
    let off = koffset_task_pagefault_disabled();
    if off == KernelOffsets::MISSING {
        return false;
    }
    // SAFETY: the current task, read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    unsafe { bpf_probe_read_kernel(task.wrapping_add(off as usize).cast::<i32>()) }
        .is_ok_and(|d| d > PROBE_READ_OWN_DISABLE)
}

/// What `bpf_probe_read_kernel` adds to `pagefault_disabled` while it reads.
const PROBE_READ_OWN_DISABLE: i32 = 1;

/// Marks this CPU as walking a user stack (`on`) or done: see `nofault_read`.
#[inline(always)]
pub fn set_walking(slot: Option<*mut InflightFault>, on: bool) {
    if let Some(s) = slot {
        // SAFETY: this CPU's slot; BPF programs on one CPU do not interleave.
        unsafe { (*s).walking = u32::from(on) };
    }
}

/// This thread's in-flight fault: from this CPU's slot, or parked when the
/// thread slept mid-fault. Taken: the slot is freed. `page`, where the end
/// hook knows the faulting address, must match; the memcg end has none (a
/// thread has one fault in flight at a time).
#[inline(always)]
pub fn take_start(tid: u32, page: Option<u64>) -> Option<InflightFault> {
    let matches = |f: &InflightFault| f.flags & INFLIGHT_UNTRACED == 0 && page.is_none_or(|p| f.page == p);
    if let Some(slot) = FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        let slot = unsafe { &mut *slot };
        if slot.tid == tid && matches(slot) {
            slot.tid = 0;
            return Some(*slot);
        }
    }
    // SAFETY: copied out before removal.
    let parked = unsafe { FAULT_PARKED.get(tid) }.copied()?;
    let _ = FAULT_PARKED.remove(tid);
    matches(&parked).then_some(parked)
}

/// Thread `tid`'s fault in flight, left in place: this CPU's slot when the
/// thread runs its fault here, else its parked entry.
#[inline(always)]
pub fn current_fault(tid: u32) -> Option<*mut InflightFault> {
    match FAULT_SLOT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; read only.
        Some(s) if unsafe { (*s).tid } == tid => Some(s),
        _ => FAULT_PARKED.get_ptr_mut(tid),
    }
}

/// Whether thread `tid` is inside a fault now: a fast fault the memcg end
/// let pass stays in the slot (`INFLIGHT_ENDED`) but is over.
#[inline(always)]
pub fn in_fault(tid: u32) -> bool {
    // SAFETY: this CPU's slot or the thread's parked entry; read only.
    current_fault(tid).is_some_and(|f| unsafe { (*f).flags } & INFLIGHT_ENDED == 0)
}

/// Moves the leaving thread's fault in flight from this CPU's slot to
/// `FAULT_PARKED` (`sched_switch`), after `before` has seen it.
#[inline(always)]
pub fn park_fault(tid: u32, before: impl FnOnce(&mut InflightFault)) {
    let Some(slot) = FAULT_SLOT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, preemption off in __schedule.
    let slot = unsafe { &mut *slot };
    if slot.tid == 0 || slot.tid != tid {
        return;
    }
    // Nothing to time: an untraced process's fault, or a fast one that ended.
    if slot.flags & (INFLIGHT_UNTRACED | INFLIGHT_ENDED) != 0 {
        slot.tid = 0;
        return;
    }
    before(slot);
    let parked: InflightFault = *slot;
    slot.tid = 0;
    // LRU map: insertion cannot fail for lack of room.
    let _ = FAULT_PARKED.insert(parked.tid, parked, 0);
}

/// Forgets an exiting thread's parked fault.
#[inline(always)]
pub fn forget_parked(tid: u32) {
    let _ = FAULT_PARKED.remove(tid);
}
