//! Stack capture: the kernel's stack map (`STACKS`, kernel stacks and the
//! user stacks of 32-bit tasks) and the user stacks the programs walk
//! themselves through frame pointers (`USER_STACKS`), and, where that walk
//! did not end cleanly, a copy of the stack and registers for userspace to
//! unwind with the objects' call-frame information (`STACK_SAMPLES`).
//!
//! Why walk user stacks here rather than `bpf_get_stackid(BPF_F_USER_STACK)`:
//! the kernel's walker (`perf_callchain_user`) reads the frame at address 0
//! that ends every chain (`_start` clears rbp), which takes a page fault and
//! its exception fixup on every walk, most of the walk's cost. This walk stops
//! there. From 6.12 it reads the stack a window at a time (a read's cost is
//! mostly the helper call, and a window usually holds several frames); before,
//! a read per frame, as 6.1's verifier gives up on the windowed loop.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_probe_read_user, generated},
    macros::map,
    maps::{HashMap, PerCpuArray, StackTrace},
    programs::tracing::StackIdContext,
};
use vmtrace_common::{
    EventHeader, EventKind, InsertMap, PyStackEvent, UserStack, OWN_STACK_ID, STACK_ID_LOST, USER_STACK_DEPTH,
    USER_WALK_WINDOWS,
};

use crate::{
    globals::config,
    inflight::{set_walking, FAULT_SLOT},
    samples::send_sample,
    shared::{count_insert_error, mix, EVENTS, WAKE_NOW},
};

/// Call stacks (user and kernel) of sampled faults, by id.
#[map]
pub static STACKS: StackTrace = StackTrace::with_max_entries(16_384, 0);

/// The current user stack's id: in `USER_STACKS` where the programs walk it
/// themselves (`Config::user_walk`), else in `STACKS`; `STACK_ID_LOST` when it
/// cannot be stored. The walk reads user memory through frame pointers and may
/// fault; those nested faults re-enter the fault hooks, which skip them while
/// this CPU's slot says it is walking (the kernel never accounts them).
#[inline(always)]
pub fn user_stack_id<C: StackIdContext>(ctx: &C) -> i32 {
    user_stack_id_of_page(ctx, 0).0
}

/// `user_stack_id` for a fault on the page at `page` of the resident sample
/// (0: any other stack), and whether its stack was copied with that address
/// (`send_sample`).
#[inline(always)]
pub fn user_stack_id_of_page<C: StackIdContext>(ctx: &C, page: u64) -> (i32, bool) {
    let slot = FAULT_SLOT.get_ptr_mut(0);
    set_walking(slot, true);
    // A constant of the frozen CONFIG: the verifier drops the branch not
    // taken, so kernels without bpf_task_pt_regs load the other.
    let own = if config().user_walk != 0 { walk() } else { None };
    let mut copied = false;
    let id = match own {
        Some((id, clean)) => {
            // Frame pointers are the fast path where their chain is whole;
            // elsewhere userspace unwinds a copy (samples.rs). `clean` goes
            // through a map value: the verifier then forgets how the walk's
            // loop ended, and its exits converge instead of each verifying
            // the copy again (1M instructions on 6.18 otherwise).
            if let Some(c) = WALK_CLEAN.get_ptr_mut(0) {
                // SAFETY: this CPU's value.
                unsafe { core::ptr::write_volatile(c, u32::from(clean)) };
                // SAFETY: as above.
                let clean = unsafe { core::ptr::read_volatile(c) } != 0;
                if !clean && id >= 0 && config().stack_window != 0 {
                    copied = send_sample(id, page);
                }
            }
            id
        }
        None => ctx.get_stackid(&STACKS, u64::from(BPF_F_USER_STACK)).map_or(STACK_ID_LOST, |id| id as i32),
    };
    set_walking(slot, false);
    (id, copied)
}

/// Walked user stacks by id (30 bits of their hash; see `store`). Not
/// preallocated: 16k stacks of 1.5 KiB would pin 24 MiB up front. Userspace
/// moves them out every 100 ms (vmtrace/src/stacks/drain.rs), so it holds
/// what one interval brings, not a whole recording's distinct stacks.
#[map]
pub static USER_STACKS: HashMap<u32, UserStack> = HashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// Whether this CPU's last walk ended cleanly (see `user_stack_id`).
#[map]
static WALK_CLEAN: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's stack being walked (too big for the BPF stack).
#[map]
static SCRATCH: PerCpuArray<UserStack> = PerCpuArray::with_max_entries(1, 0);

/// A stack this CPU stored lately.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecentStack {
    hash: u64,
    id: u32,
    /// 1: the walk ended cleanly (see `walk`).
    clean: u32,
}

const RECENT_SLOTS: u32 = 8;

/// Stacks this CPU stored lately, by the low bits of their hash: a fault loop
/// repeats a few stacks, and the `USER_STACKS` lookup that would find them
/// again is skipped. Userspace drains `USER_STACKS` every 100 ms but keeps
/// every stack it took out under its id (vmtrace/src/stacks/drain.rs), so an
/// id remembered here stays valid. One map entry per slot: the lookup returns
/// the slot itself (6.1's and 6.12's verifiers refuse an index added to a
/// pointer before its null check, which the compiler hoists).
#[map]
static RECENT: PerCpuArray<RecentStack> = PerCpuArray::with_max_entries(RECENT_SLOTS, 0);

/// Bytes of user stack read at once.
const WINDOW_BYTES: u64 = 1024;

/// This CPU's window of user stack bytes being walked. Two words longer than
/// a read: any 8-byte index below `WINDOW_BYTES` and the next are in bounds
/// without a check the verifier would have to follow.
#[map]
static WINDOW: PerCpuArray<[u64; WINDOW_BYTES as usize / 8 + 2]> = PerCpuArray::with_max_entries(1, 0);

/// Above every user address on x86-64 (5-level paging included) and arm64 (52-bit VA).
const USER_END: u64 = 1 << 56;

/// Walks the current task's user stack and stores it: `Some((id, clean))`
/// with its id in `USER_STACKS`, or `STACK_ID_LOST` when it cannot be read or
/// stored; `None` for a 32-bit task (the caller takes the kernel's walker,
/// which knows them). `clean`: the chain started on the stack and ended at a
/// zero frame pointer, as thread roots leave it (`_start`, `clone3`), so no
/// frame was skipped by code without frame pointers.
#[inline(always)]
fn walk() -> Option<(i32, bool)> {
    let Some(s) = SCRATCH.get_ptr_mut(0) else { return Some((STACK_ID_LOST, false)) };
    // SAFETY: this CPU's scratch; programs on one CPU do not interleave.
    let s = unsafe { &mut *s };
    let regs = crate::arch::user_regs();
    let crate::arch::UserRegs { ip, sp, fp, is64, .. } = regs;
    if !is64 {
        return None;
    }
    s.ips[0] = ip;
    let h = mix(0x9e37_79b9_7f4a_7c15 ^ ip);
    // A constant of the frozen CONFIG: the verifier sees one loop only.
    let (h, nr, root) = if config().user_walk == USER_WALK_WINDOWS {
        let Some(r) = by_windows(s, fp, h) else { return Some((STACK_ID_LOST, false)) };
        r
    } else {
        by_frames(s, fp, h)
    };
    // Code without frame pointers uses rbp as a general register: a chain
    // that does not start on the stack, just above sp, read data; and a
    // pointer to a zeroed local reads as a one-frame chain "ending" at once
    // (seen in numpy's copy loops), while a real one passes main and its caller.
    // arm64 adds the x30 rule (`arch::chain_holds_leaf`). x86-64 has no term
    // at all, not an always-true one: `&& true` still changed the code LLVM
    // emits for `clean` (its loop exits set a spilled flag), and 6.1's
    // verifier then gave up on `page_fault_kernel` (1M instructions).
    #[cfg(not(bpf_target_arch = "aarch64"))]
    let clean = root && nr >= 3 && fp >= sp && fp - sp < FIRST_FRAME_MAX;
    #[cfg(bpf_target_arch = "aarch64")]
    let clean =
        root && nr >= 3 && fp >= sp && fp - sp < FIRST_FRAME_MAX && crate::arch::chain_holds_leaf(regs.lr, s.ips[1]);
    let h = crate::python::walk(s, h);
    // SAFETY: this CPU's slot, as for the scratch.
    let recent = RECENT.get_ptr_mut(h as u32 & (RECENT_SLOTS - 1)).map(|r| unsafe { &mut *r });
    if let Some(r) = &recent {
        if r.hash == h && r.id != 0 {
            return Some((r.id as i32, r.clean != 0));
        }
    }
    s.nr = nr as u64;
    s.hash = h;
    let id = store(s);
    if let Some(r) = recent {
        if id >= 0 {
            (r.hash, r.id, r.clean) = (h, id as u32, u32::from(clean));
        }
    }
    Some((id, clean))
}

/// Farthest the first frame record may lie above sp for a chain to count as
/// clean: any real frame of the faulting function is much nearer.
const FIRST_FRAME_MAX: u64 = 1 << 20;

/// The frames above `fp`, each read by `read(fp)` as [saved fp, return
/// address]: `(hash, depth, root)`; `root`: the chain ended at a zero saved
/// frame pointer.
#[inline(always)]
fn chain(
    s: &mut UserStack,
    mut fp: u64,
    mut h: u64,
    mut read: impl FnMut(u64) -> Option<[u64; 2]>,
) -> (u64, usize, bool) {
    let mut nr = 1;
    let mut root = false;
    for i in 1..USER_STACK_DEPTH {
        if fp == 0 || fp & 7 != 0 || fp >= USER_END {
            break;
        }
        let Some([next, ret]) = read(fp) else { break };
        if ret == 0 {
            break;
        }
        if let Some(slot) = s.ips.get_mut(i) {
            *slot = ret;
        }
        h = mix(h ^ ret);
        nr = i + 1;
        // A frame chain climbs the stack; anything else is not a chain (code
        // without frame pointers leaves rbp as a general register).
        if next <= fp {
            root = next == 0;
            break;
        }
        fp = next;
    }
    (h, nr, root)
}

/// The frames above `fp`, read 16 bytes at a time.
#[inline(always)]
fn by_frames(s: &mut UserStack, fp: u64, h: u64) -> (u64, usize, bool) {
    // SAFETY: bpf_probe_read_user faults safely.
    chain(s, fp, h, |fp| unsafe { bpf_probe_read_user(fp as *const [u64; 2]) }.ok())
}

/// The frames above `fp`, read a window of `WINDOW_BYTES` at a time: a read
/// costs about the same whatever its size up to 1 KiB (mostly the helper
/// call), and a window usually holds several frames. `None` when this CPU's window is missing.
#[inline(always)]
fn by_windows(s: &mut UserStack, fp: u64, h: u64) -> Option<(u64, usize, bool)> {
    // SAFETY: this CPU's window, as for the scratch.
    let win = unsafe { &mut *WINDOW.get_ptr_mut(0)? };
    // The user stack bytes in `win`: [base, end).
    let (mut base, mut end) = (0u64, 0u64);
    Some(chain(s, fp, h, |fp| {
        if fp < base || fp + 16 > end {
            // The stack above a frame is mapped and present up to its top, so
            // only a window past the top fails (a fault and its fixup); then read up
            // to the end of the frame's page, which is present.
            let dst = win.as_mut_ptr().cast();
            let mut n = WINDOW_BYTES;
            // SAFETY: bpf_probe_read_user faults safely; sizes <= the window.
            if unsafe { generated::bpf_probe_read_user(dst, n as u32, fp as *const c_void) } != 0 {
                n = (4096 - (fp & 4095)).clamp(16, WINDOW_BYTES);
                // SAFETY: as above.
                if unsafe { generated::bpf_probe_read_user(dst, n as u32, fp as *const c_void) } != 0 {
                    return None;
                }
            }
            (base, end) = (fp, fp + n);
        }
        // The mask is for the verifier.
        let at = ((fp - base) >> 3) as usize & (WINDOW_BYTES as usize / 8 - 1);
        Some([*win.get(at)?, *win.get(at + 1)?])
    }))
}

/// Stores `s` under 30 bits of its hash, probing the next ids on a
/// collision; the full hash in the value tells stacks apart. Ids have bit 30
/// set, so they never equal an id of `STACKS` (< its 16,384 entries), where
/// the kernel's walker puts the stacks of 32-bit tasks.
/// Tells userspace a stack with Python frames is new. Lost when the ring is
/// full: then the map scan userspace makes every 100 ms finds it.
#[inline(always)]
fn announce_python(id: u32, tgid: u32) {
    let ev = PyStackEvent {
        hdr: EventHeader {
            kind: EventKind::PyStackStored as u32,
            size: core::mem::size_of::<PyStackEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { generated::bpf_ktime_get_ns() },
        },
        id,
        tgid,
    };
    let _ = EVENTS.output::<PyStackEvent>(&ev, WAKE_NOW);
}

#[inline(always)]
fn store(s: &UserStack) -> i32 {
    let base = (s.hash >> 34) as u32;
    for probe in 0..4u32 {
        let id = (base.wrapping_add(probe) & 0x3fff_ffff) | OWN_STACK_ID;
        // SAFETY: read-only look at a live value.
        if let Some(v) = unsafe { USER_STACKS.get(id) } {
            if v.hash == s.hash {
                return id as i32;
            }
            continue;
        }
        let refused = match USER_STACKS.insert(id, s, u64::from(BPF_NOEXIST)) {
            Ok(()) => {
                if s.py_nr > 0 {
                    announce_python(id, s.py_tgid);
                }
                return id as i32;
            }
            Err(e) => e,
        };
        // Taken meanwhile on another CPU (same stack or not), or the map is
        // full, or the kernel could not allocate the element.
        // SAFETY: as above.
        match unsafe { USER_STACKS.get(id) } {
            Some(v) if v.hash == s.hash => return id as i32,
            Some(_) => continue,
            None => {
                count_insert_error(InsertMap::UserStacks, refused);
                return STACK_ID_LOST;
            }
        }
    }
    STACK_ID_LOST
}
