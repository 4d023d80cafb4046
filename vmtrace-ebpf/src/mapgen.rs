//! Address-space generations: a counter per process, bumped when a mapping
//! change (mmap, munmap, mprotect, mremap, brk) enters and when it returns,
//! and at exec, if a fault was counted since the last bump. Faults are
//! counted per (granule, generation) and mapping changes are streamed with
//! theirs, so userspace places every fault in the mapping that covered its
//! address at the time (vmtrace/src/regions/history.rs).
//!
//! The fault path reads the generation from an array slot (`tgid` modulo the
//! size, tagged with the tgid): an array lookup is inlined by the verifier,
//! where a hash lookup would add ~15 ns to every fault. A process whose slot
//! another live process holds keeps its counter in a small LRU hash instead.
use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap},
};
use vmtrace_common::{MapGenSlot, GEN_UNKNOWN, MAP_GEN_SLOTS};

#[map]
static MAP_GEN: Array<MapGenSlot> = Array::with_max_entries(MAP_GEN_SLOTS, 0);

/// Generations of processes whose slot is held by another (always bumped).
#[map]
static MAP_GEN_OVERFLOW: LruHashMap<u32, u32> = LruHashMap::with_max_entries(16_384, 0);

#[inline(always)]
fn slot(tgid: u32) -> Option<*mut MapGenSlot> {
    MAP_GEN.get_ptr_mut(tgid & (MAP_GEN_SLOTS - 1))
}

#[inline(always)]
fn tag_gen(p: *mut MapGenSlot) -> u64 {
    // SAFETY: an array slot; other CPUs write it with whole 8-byte stores
    // or atomic adds.
    unsafe { core::ptr::read_volatile(&raw const (*p).tag_gen) }
}

fn overflow_gen(tgid: u32) -> u32 {
    // SAFETY: a live map value, read at once.
    MAP_GEN_OVERFLOW.get_ptr(tgid).map_or(0, |g| unsafe { *g })
}

/// `tgid`'s generation for a fault now: 0 until its first mapping change
/// under trace. Marks the generation as having faults.
#[inline(always)]
pub fn fault_gen(tgid: u32) -> u32 {
    let Some(p) = slot(tgid) else { return GEN_UNKNOWN };
    let v = tag_gen(p);
    if (v >> 32) as u32 != tgid {
        // Held by another, or free (a process that has not changed its
        // mappings yet, or whose counter moved here while the slot was held).
        return overflow_gen(tgid);
    }
    // The generation is read before the mark: a change that saw no mark
    // and did not bump came after this read, and a fault marking after a
    // bump already read the new generation.
    // SAFETY: as above.
    unsafe {
        if core::ptr::read_volatile(&raw const (*p).dirty) == 0 {
            core::ptr::write_volatile(&raw mut (*p).dirty, 1);
        }
    }
    v as u32
}

/// `tgid`'s generation now, as events report it.
#[inline(always)]
pub fn map_gen(tgid: u32) -> u32 {
    let Some(p) = slot(tgid) else { return GEN_UNKNOWN };
    let v = tag_gen(p);
    if (v >> 32) as u32 == tgid {
        v as u32
    } else {
        overflow_gen(tgid)
    }
}

/// Bumps `tgid`'s generation if a fault was counted at the current one, and
/// returns the generation now in effect. `always`: bump regardless (exec).
#[inline(always)]
pub fn bump_gen(tgid: u32, always: bool) -> u32 {
    let Some(p) = slot(tgid) else { return GEN_UNKNOWN };
    let v = tag_gen(p);
    if (v >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe {
            if !always && core::ptr::read_volatile(&raw const (*p).dirty) == 0 {
                return v as u32;
            }
            // Cleared before the bump: a fault between them marks again.
            core::ptr::write_volatile(&raw mut (*p).dirty, 0);
        }
        // Threads of one process may change mappings at once: the add is
        // atomic (BPF_ATOMIC add; core has no atomic read-modify-write here).
        #[cfg(target_arch = "bpf")]
        // SAFETY: an aligned, live map value.
        unsafe {
            let t = &raw mut (*p).tag_gen;
            core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) t, v = in(reg) 1u64);
        }
        return tag_gen(p) as u32;
    }
    let next = overflow_gen(tgid) + 1;
    if v == 0 {
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(&raw mut (*p).tag_gen, (u64::from(tgid) << 32) | u64::from(next));
            core::ptr::write_volatile(&raw mut (*p).dirty, 0);
        }
        let _ = MAP_GEN_OVERFLOW.remove(tgid);
    } else {
        let _ = MAP_GEN_OVERFLOW.insert(tgid, next, 0);
    }
    next
}

/// Marks `tgid`'s generation as ended by a change that did not bump it (an
/// munmap: faults before it are placed before it, userspace applies an
/// munmap after the faults of its generation), so the next change bumps.
#[inline(always)]
pub fn mark_gen(tgid: u32) {
    let Some(p) = slot(tgid) else { return };
    if (tag_gen(p) >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&raw mut (*p).dirty, 1) };
    }
}

/// A new process (fork) starts at generation 0: its parent's address space
/// as it was at the fork.
#[inline(always)]
pub fn reset_gen(tgid: u32) {
    let Some(p) = slot(tgid) else { return };
    let v = tag_gen(p);
    if v == 0 || (v >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(&raw mut (*p).tag_gen, u64::from(tgid) << 32);
            core::ptr::write_volatile(&raw mut (*p).dirty, 0);
        }
        let _ = MAP_GEN_OVERFLOW.remove(tgid);
    } else {
        let _ = MAP_GEN_OVERFLOW.insert(tgid, 0, 0);
    }
}

/// Frees `tgid`'s slot when its process is gone.
#[inline(always)]
pub fn release_gen(tgid: u32) {
    let Some(p) = slot(tgid) else { return };
    if (tag_gen(p) >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&raw mut (*p).tag_gen, 0) };
    }
    let _ = MAP_GEN_OVERFLOW.remove(tgid);
}
