//! Copied user stacks (`STACK_SAMPLES`): the registers and a window of the
//! stack from sp, for userspace to unwind through code built without frame
//! pointers with the objects' call-frame information (framehop). Sent only
//! where a stack is taken already (sampled faults, slow faults, mmap-family
//! call sites) and its frame-pointer walk did not end cleanly: a copy costs
//! microseconds, far more than the walk (docs/design.md, "Native stacks").
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_get_prandom_u32, bpf_ktime_get_ns, generated},
    macros::map,
    maps::{LruHashMap, RingBuf},
};
use vmtrace_common::{DropKind, EventHeader, EventKind, StackSample, StackSampleHead};

use crate::{globals::config, shared::count_drop};

const SAMPLES_BYTES: u32 = 8 * 1024 * 1024;

/// Copied stacks for userspace; apart from `EVENTS` so a burst of them never
/// crowds out task and mapping events. 8 MiB: 500 samples of 16 KiB, five
/// times what 1 in 64 faults at 100k faults/s sends between two polls.
#[map]
pub static STACK_SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_BYTES, 0);

const PAGE: u64 = 4096;

/// The top of each thread's stack, as far as a copy could read, by tid: a
/// read past it fails only after a page fault and its exception fixup, and
/// then the copy goes page by page, several helper calls. Once known, a copy
/// is one read of `min(window, top - sp)`. A stale entry (tid reused) makes
/// that read fail, and the copy learns the top again.
#[map]
static STACK_TOPS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16_384, 0);

/// Copies sent per frame-pointer stack id.
#[map]
static COPIES: LruHashMap<u32, u32> = LruHashMap::with_max_entries(16_384, 0);

/// Bytes waiting in `STACK_SAMPLES` from which a copy for its page alone
/// (weight 0, `send_sample`) is left out: the quarter that wakes the
/// collector (`send`), so it is behind. Every fault of the resident sample
/// copies its stack, unthinned: code without frame pointers faulting fast
/// (a first touch, a Python filling buffers) sends a copy per sampled page,
/// 4,600 for nofp.c's 16k faults at 1 in 4, and a collector slower than
/// that (arm64 under TCG: 4,080 of them lost to a full ring, vm32) lost the
/// weighted copies the fault graphs are unwound from along with them. These
/// yield first: the weighted ones keep three quarters of the ring.
const PAGE_COPIES_BELOW: u32 = SAMPLES_BYTES / 4;

/// Copies of an id sent at every event before thinning starts.
const COPIES_WHOLE: u32 = 64;
/// Thinning stops at 1 copy in 2^this.
const THIN_MAX_SHIFT: u32 = 10;

/// Sends the current task's user registers and stack window as the sample of
/// the frame-pointer stack `id`. A call site taken on every call, or a fault
/// loop, repeats one id: after `COPIES_WHOLE` copies an id's copies are
/// thinned at random, 1 in 2 until twice as many, 1 in 4 until four times as
/// many, and so on, and each copy carries its weight (2^k): the shares
/// userspace gives the id's unwound stacks stay unbiased however the mix of
/// stacks behind one id changes over time. A constant of the frozen CONFIG
/// picks the record size: the verifier keeps one branch.
///
/// `page`: the faulting address of a fault on a page of the resident sample
/// (0 for any other stack): its copy is sent whatever the thinning, carrying
/// the address, so userspace gives the page the stack of its own fault, not
/// its id's mix over the run (code without frame pointers: one id for every
/// call site of its leaf). One the thinning would have left out weighs 0: it
/// names its page only, and is sent only while the collector keeps up
/// (`PAGE_COPIES_BELOW`); else it is counted (`DropKind::PageCopySkipped`)
/// and its page keeps the id's mix. Returns whether a copy with `page` was sent.
#[inline(always)]
pub fn send_sample(id: i32, page: u64) -> bool {
    let key = id as u32;
    // SAFETY: a plain value read.
    let copies = unsafe { COPIES.get(key) }.copied().unwrap_or(0);
    let mut weight = 1u32;
    if copies >= COPIES_WHOLE {
        let shift = (32 - (copies / COPIES_WHOLE).leading_zeros()).min(THIN_MAX_SHIFT);
        weight = 1 << shift;
        // SAFETY: no preconditions.
        if unsafe { bpf_get_prandom_u32() } & (weight - 1) != 0 {
            if page == 0 {
                return false;
            }
            if STACK_SAMPLES.query(u64::from(BPF_RB_AVAIL_DATA)) >= u64::from(PAGE_COPIES_BELOW) {
                count_drop(DropKind::PageCopySkipped);
                return false;
            }
            weight = 0;
        }
    }
    if weight != 0 {
        let _ = COPIES.insert(key, copies + 1, 0);
    }
    match config().stack_window {
        8192 => send::<8192>(id, weight, page),
        16384 => send::<16384>(id, weight, page),
        32768 => send::<32768>(id, weight, page),
        _ => false,
    }
}

#[inline(always)]
fn read_user(dst: *mut u8, n: u32, src: u64) -> bool {
    // SAFETY: bpf_probe_read_user faults safely; callers keep `n` within `dst`.
    unsafe { generated::bpf_probe_read_user(dst.cast::<c_void>(), n, src as *const c_void) == 0 }
}

/// Copies the whole window: `N` bytes, or 0 when the read fails.
#[inline(always)]
fn read_full<const N: usize>(dst: *mut u8, sp: u64) -> u32 {
    if read_user(dst, N as u32, sp) {
        N as u32
    } else {
        0
    }
}

/// Copies `n` (< `N`) bytes; 0 when the read fails or `n` is not below `N`.
/// The mask is for the verifier, at the call: a bound checked before the
/// value was spilled to the stack is lost on 6.1.
#[inline(always)]
fn read_part<const N: usize>(dst: *mut u8, n: u64, sp: u64) -> u32 {
    let n = (n as u32) & (N as u32 - 1);
    if n != 0 && read_user(dst, n, sp) {
        n
    } else {
        0
    }
}

#[inline(always)]
fn send<const N: usize>(id: i32, weight: u32, page: u64) -> bool {
    let Some(mut e) = STACK_SAMPLES.reserve::<StackSample<N>>(0) else {
        // A copy for its page alone loses only that page's own stack.
        count_drop(if weight == 0 { DropKind::PageCopySkipped } else { DropKind::StackSampleRingFull });
        return false;
    };
    let crate::arch::UserRegs { ip, sp, fp: bp, lr, .. } = crate::arch::user_regs();
    // SAFETY: reserved ring memory of the record's size, written before submit.
    let s = unsafe { &mut *e.as_mut_ptr() };
    let dst = s.stack.as_mut_ptr();
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: a plain value read.
    let top = unsafe { STACK_TOPS.get(tid) }.copied().unwrap_or(0);
    let mut len = 0;
    if top > sp {
        let d = top - sp;
        len = if d >= N as u64 { read_full::<N>(dst, sp) } else { read_part::<N>(dst, d, sp) };
    }
    if len == 0 {
        len = read_full::<N>(dst, sp);
    }
    if len == 0 {
        // The window crosses the top of the stack (a read past it fails): the
        // longest read that ends on a page boundary and succeeds is up to the
        // top, which is remembered (`STACK_TOPS`), so this costs a few failed
        // reads once per thread. Every read starts at the buffer's start: a
        // variable offset into it is more than 6.1's verifier follows.
        let first = ((!sp) & (PAGE - 1)) + 1;
        for j in (0..N as u64 / PAGE).rev() {
            len = read_part::<N>(dst, first + j * PAGE, sp);
            if len != 0 {
                let _ = STACK_TOPS.insert(tid, sp + u64::from(len), 0);
                break;
            }
        }
    }
    s.head = StackSampleHead {
        hdr: EventHeader {
            kind: EventKind::StackSample as u32,
            size: core::mem::size_of::<StackSample<N>>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        user_stack: id,
        len,
        ip,
        sp,
        bp,
        lr,
        weight,
        _pad: 0,
        addr: page,
    };
    // The collector polls every 100 ms: wake it early only once a quarter waits.
    let wake = if STACK_SAMPLES.query(u64::from(BPF_RB_AVAIL_DATA)) > u64::from(SAMPLES_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    e.submit(u64::from(wake));
    page != 0
}
