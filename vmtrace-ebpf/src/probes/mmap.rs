//! Memory-management syscalls of traced processes: counts, advice, bytes
//! unmapped, call-site stacks, and a bracket (enter → exit) per thread so TLB
//! shootdowns sent meanwhile are blamed on the call (see `tlb.rs`). Mapping
//! changes are streamed: regions that live between two reads of
//! `/proc/PID/maps` are still known to userspace.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::tracepoint,
    programs::TracePointContext,
    EbpfContext as _,
};
use vmtrace_common::{
    DropKind, EventHeader, EventKind, MmCall, MmEvent, MmInflight, MmStackCounts, MmStackKey, ADVICE_SLOTS, STACK_USER,
};

use crate::maps::{
    batched_wakeup, config, count_drop, get_or_insert, is_traced, mm_begin, mm_end, mm_stats, tp_field, user_stack_id,
    EVENTS, MM_STACKS, WAKE_NOW,
};

// /sys/kernel/tracing/events/syscalls/sys_enter_*/format: `int __syscall_nr`
// at 8, then the arguments as 8-byte fields from offset 16:
//   mmap(addr, len, prot, flags, fd, off)      munmap(addr, len)
//   mremap(addr, old_len, new_len, flags, new_addr)
//   madvise(start, len_in, behavior)           mprotect(start, len, prot)
//   brk(brk)
// sys_exit_*: `long ret` at 16.
const SYSCALL_NR: usize = 8;
const ARG0: usize = 16;
const EXIT_RET: usize = 16;
const MAP_ANONYMOUS: u64 = 0x20;

/// The family's x86-64 syscall numbers, and how many arguments each has.
#[inline(always)]
fn call_of(nr: i32) -> Option<(MmCall, usize)> {
    Some(match nr {
        9 => (MmCall::Mmap, 6),
        10 => (MmCall::Mprotect, 3),
        11 => (MmCall::Munmap, 2),
        12 => (MmCall::Brk, 1),
        25 => (MmCall::Mremap, 5),
        28 => (MmCall::Madvise, 3),
        _ => return None,
    })
}

pub fn stack_key(tgid: u32, call: u32, user_stack: i32) -> MmStackKey {
    MmStackKey { tgid, call, user_stack, _pad: 0 }
}

pub fn mm_stack_counts(key: &MmStackKey) -> Option<&'static mut MmStackCounts> {
    get_or_insert(&MM_STACKS, key, &MmStackCounts::default())
}

fn enter(ctx: &TracePointContext, pid_tgid: u64, call: MmCall, a: [u64; 6]) {
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(m) = mm_stats(tgid) {
        if let Some(c) = m.calls.get_mut(call as usize) {
            *c += 1;
        }
        match call {
            MmCall::Munmap => m.munmap_bytes += a[1],
            MmCall::Madvise => {
                let slot = if a[2] < ADVICE_SLOTS as u64 { a[2] as usize } else { ADVICE_SLOTS - 1 };
                if let Some(c) = m.advice.get_mut(slot) {
                    *c += 1;
                }
            }
            _ => {}
        }
    }
    // Syscalls are far rarer than faults: every call site is taken.
    let user_stack = if config().stack_mode & STACK_USER != 0 { user_stack_id(ctx) } else { -1 };
    if let Some(c) = mm_stack_counts(&stack_key(tgid, call as u32, user_stack)) {
        c.calls += 1;
    }
    mm_begin(pid_tgid as u32, &MmInflight { call: call as u32, user_stack, args: a });
}

fn exit(ctx: &TracePointContext) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(f) = mm_end(tid) else { return };
    let ret: i64 = tp_field(ctx, EXIT_RET);
    let (addr, len) = match f.call {
        c if c == MmCall::Mmap as u32 && !(-4095..0).contains(&ret) => (ret as u64, f.args[1]),
        c if c == MmCall::Munmap as u32 && ret == 0 => (f.args[0], f.args[1]),
        c if c == MmCall::Mremap as u32 && !(-4095..0).contains(&ret) => (ret as u64, f.args[2]),
        _ => return,
    };
    let Some(mut slot) = EVENTS.reserve::<MmEvent>(0) else {
        count_drop(DropKind::MmEventRingFull);
        return;
    };
    let is_mmap = f.call == MmCall::Mmap as u32;
    slot.write(MmEvent {
        hdr: EventHeader {
            kind: EventKind::MmMapChange as u32,
            size: core::mem::size_of::<MmEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        tgid: (pid_tgid >> 32) as u32,
        call: f.call,
        addr,
        len,
        prot: if is_mmap { f.args[2] } else { 0 },
        flags: if is_mmap { f.args[3] } else { 0 },
        fd: if is_mmap { f.args[4] } else { u64::MAX },
        offset: if is_mmap { f.args[5] } else { 0 },
    });
    // A file mapping is named from /proc/PID/fd/FD while the fd is open:
    // wake the collector now. Anonymous ones can wait for its next poll.
    let file_backed = is_mmap && (f.args[4] as i64) >= 0 && f.args[3] & MAP_ANONYMOUS == 0;
    slot.submit(if file_backed { WAKE_NOW } else { batched_wakeup() });
}

// One enter program on every sys_enter_* of the family (and one exit program
// on every sys_exit_*): the verifier checks the stack walk once, not six times
// (~45 ms each at start-up). The arguments are copied with one read: a direct
// load past the shortest record (brk's, one argument) would keep the program
// off that tracepoint, as the kernel compares a program's deepest context
// load with each record's size at attach. The names below only name the
// sections: userspace attaches each program to every tracepoint by name.
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn tp_syscalls_sys_enter(ctx: TracePointContext) -> u32 {
    let Some((call, n)) = call_of(tp_field(&ctx, SYSCALL_NR)) else {
        return 0;
    };
    // Every process's calls come here: the copy below is for traced ones only.
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_traced((pid_tgid >> 32) as u32) {
        return 0;
    }
    // SAFETY: the record lies in the kernel's per-CPU trace buffer, which
    // extends past the shortest record; a failed read leaves zeros.
    let mut a: [u64; 6] =
        unsafe { bpf_probe_read_kernel(ctx.as_ptr().cast::<u8>().add(ARG0).cast::<[u64; 6]>()) }.unwrap_or([0; 6]);
    for (i, v) in a.iter_mut().enumerate() {
        if i >= n {
            *v = 0;
        }
    }
    enter(&ctx, pid_tgid, call, a);
    0
}

#[tracepoint(category = "syscalls", name = "sys_exit_mmap")]
pub fn tp_syscalls_sys_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx);
    0
}
