//! Address-space generations: a counter per process, bumped when a mapping
//! change (mmap, munmap, mprotect, mremap, brk) enters and when it returns,
//! and at exec. Faults are counted per (granule, generation) and mapping
//! changes are streamed with theirs, so userspace places every fault in the
//! mapping that covered its address at the time (vmtrace/src/regions/history.rs).
//!
//! The fault path reads the generation from an array slot (`tgid` modulo the
//! size, tagged with the tgid): an array lookup is inlined by the verifier,
//! where a hash lookup would add ~15 ns to every fault. A process whose slot
//! another live process holds keeps its counter in a small LRU hash instead.
use aya_ebpf::{
    macros::map,
    maps::{Array, LruHashMap},
};
use vmtrace_common::{GEN_UNKNOWN, MAP_GEN_SLOTS};

/// `tgid << 32 | generation`; 0: free.
#[map]
static MAP_GEN: Array<u64> = Array::with_max_entries(MAP_GEN_SLOTS, 0);

/// Generations of processes whose slot is held by another.
#[map]
static MAP_GEN_OVERFLOW: LruHashMap<u32, u32> = LruHashMap::with_max_entries(16_384, 0);

#[inline(always)]
fn slot(tgid: u32) -> Option<*mut u64> {
    MAP_GEN.get_ptr_mut(tgid & (MAP_GEN_SLOTS - 1))
}

/// `tgid`'s generation now: 0 until its first mapping change under trace.
#[inline(always)]
pub fn map_gen(tgid: u32) -> u32 {
    let Some(p) = slot(tgid) else { return GEN_UNKNOWN };
    // SAFETY: an array slot; written by other CPUs with whole 8-byte stores.
    let v = unsafe { core::ptr::read_volatile(p) };
    if (v >> 32) as u32 == tgid {
        return v as u32;
    }
    // Held by another, or free (a process that has not changed its mappings
    // yet, or one whose counter moved here while the slot was held).
    // SAFETY: a live map value, read at once.
    MAP_GEN_OVERFLOW.get_ptr(tgid).map_or(0, |g| unsafe { *g })
}

/// Bumps `tgid`'s generation and returns the new one.
#[inline(always)]
pub fn bump_gen(tgid: u32) -> u32 {
    let Some(p) = slot(tgid) else { return GEN_UNKNOWN };
    // SAFETY: as above.
    let v = unsafe { core::ptr::read_volatile(p) };
    if (v >> 32) as u32 == tgid {
        // Threads of one process may change mappings at once: the add is
        // atomic (BPF_ATOMIC add; core has no atomic read-modify-write here).
        // SAFETY: an aligned, live map value.
        #[cfg(target_arch = "bpf")]
        unsafe {
            core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) p, v = in(reg) 1u64);
        }
        // SAFETY: as above.
        return unsafe { core::ptr::read_volatile(p) } as u32;
    }
    // SAFETY: as above.
    let next = MAP_GEN_OVERFLOW.get_ptr(tgid).map_or(0, |g| unsafe { *g }) + 1;
    if v == 0 {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(p, (u64::from(tgid) << 32) | u64::from(next)) };
        let _ = MAP_GEN_OVERFLOW.remove(tgid);
    } else {
        let _ = MAP_GEN_OVERFLOW.insert(tgid, next, 0);
    }
    next
}

/// A new process (fork) starts at generation 0: its parent's address space
/// as it was at the fork.
#[inline(always)]
pub fn reset_gen(tgid: u32) {
    let Some(p) = slot(tgid) else { return };
    // SAFETY: as above.
    let v = unsafe { core::ptr::read_volatile(p) };
    if v == 0 || (v >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(p, u64::from(tgid) << 32) };
        let _ = MAP_GEN_OVERFLOW.remove(tgid);
    } else {
        let _ = MAP_GEN_OVERFLOW.insert(tgid, 0, 0);
    }
}

/// Frees `tgid`'s slot when its process is gone.
#[inline(always)]
pub fn release_gen(tgid: u32) {
    let Some(p) = slot(tgid) else { return };
    // SAFETY: as above.
    if (unsafe { core::ptr::read_volatile(p) } >> 32) as u32 == tgid {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(p, 0) };
    }
    let _ = MAP_GEN_OVERFLOW.remove(tgid);
}
