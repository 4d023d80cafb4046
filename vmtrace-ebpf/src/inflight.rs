//! The fault in flight on each CPU, from the start hook to the end hook, and
//! the faults parked when their thread sleeps mid-fault (majors wait on I/O),
//! so a fault is timed wherever it resumes.
use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use vmtrace_common::{InflightFault, INFLIGHT_ENDED, INFLIGHT_UNTRACED};

/// The fault in flight on this CPU.
#[map]
pub static FAULT_SLOT: PerCpuArray<InflightFault> = PerCpuArray::with_max_entries(1, 0);

/// Faults whose thread was switched out mid-fault, keyed by tid. LRU: an entry
/// whose fault never completed (SIGSEGV) ages out instead of filling the map.
#[map]
pub static FAULT_PARKED: LruHashMap<u32, InflightFault> = LruHashMap::with_max_entries(16_384, 0);

/// A kernel-mode fault taken while this CPU walks a user stack for us: the
/// walk's nofault read fails it, and the kernel never accounts it. (The
/// task's `pagefault_disabled` cannot tell: `read()` copies to user memory
/// with page faults disabled, and those faults are handled and accounted.)
#[inline(always)]
pub fn nofault_read() -> bool {
    FAULT_SLOT.get(0).is_some_and(|s| s.walking != 0)
}

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
