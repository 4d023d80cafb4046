//! Process life cycle: follow every descendant of a traced process (in the
//! kernel, so a child's first fault is already seen) and tell userspace about
//! forks, execs and exits.
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::warn;
use vmtrace_common::{DropKind, EventHeader, EventKind, KernelOffsets, TaskEvent, COMM_LEN};

use crate::{
    globals::{config, koffsets},
    inflight::forget_parked,
    mapgen::{bump_gen, map_gen, release_gen, reset_gen},
    shared::{add_traced, count_drop, is_traced, tp_loaded, wake_once, EVENTS, FAULT_STATS},
};

/// Reads a `T` at `base + off`, or `None` when the offset is unknown on this kernel.
#[inline(always)]
pub fn read_field<T: Copy>(base: *const u8, off: u32) -> Option<T> {
    if off == KernelOffsets::MISSING || base.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { bpf_probe_read_kernel(base.add(off as usize).cast::<T>()) }.ok()
}

fn emit(ev: TaskEvent) {
    match EVENTS.reserve::<TaskEvent>(0) {
        Some(mut slot) => {
            slot.write(ev);
            slot.submit(wake_once());
        }
        None => count_drop(DropKind::TaskEventRingFull),
    }
}

fn task_event(kind: EventKind) -> TaskEvent {
    TaskEvent {
        hdr: EventHeader {
            kind: kind as u32,
            size: core::mem::size_of::<TaskEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
        ..TaskEvent::EMPTY
    }
}

/// Follows a new process (not a new thread: threads share their group's
/// tgid) of a traced one, or of the launcher (`is_launcher`: the command
/// vmtrace starts is counted from its fork).
fn try_fork<C: EbpfContext>(ctx: &C, parent_tgid: u32, child_pid: u32, child_tgid: u32) -> Option<()> {
    if child_pid != child_tgid || !(is_traced(parent_tgid) || crate::globals::is_launcher(parent_tgid)) {
        return None;
    }
    if config().trace_all == 0 && !add_traced(child_tgid) {
        count_drop(DropKind::TracedFull);
        warn!(ctx, "FAULT_STATS full: child {} of {} is not followed", child_tgid, parent_tgid);
        return None;
    }
    reset_gen(child_tgid);
    crate::python::on_fork(parent_tgid, child_tgid);
    let mut ev = task_event(EventKind::TaskFork);
    ev.pid = child_pid;
    ev.tgid = child_tgid;
    ev.ppid = parent_tgid;
    ev.gen = map_gen(parent_tgid);
    emit(ev);
    Some(())
}

// TP_PROTO(struct task_struct *parent, struct task_struct *child); runs as the parent.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn tp_btf_sched_process_fork(ctx: BtfTracePointContext) -> i32 {
    let _ = try_btf_sched_process_fork(&ctx);
    0
}

#[inline(always)]
fn try_btf_sched_process_fork(ctx: &BtfTracePointContext) -> Option<()> {
    let child: *const u8 = ctx.arg(1);
    let off = koffsets();
    let pid = read_field::<u32>(child, off.task_pid)?;
    let tgid = read_field::<u32>(child, off.task_tgid)?;
    try_fork(ctx, (bpf_get_current_pid_tgid() >> 32) as u32, pid, tgid)
}

// /sys/kernel/tracing/events/sched/sched_process_fork/format (6.18; on 6.1
// the comms are char[16] and child_pid is at 44: the loader reads the
// offset from the format, `Tp::ForkChildPid`):
//   field:__data_loc char[] parent_comm; offset:8;  size:4; signed:0;
//   field:pid_t parent_pid;              offset:12; size:4; signed:1;
//   field:__data_loc char[] child_comm;  offset:16; size:4; signed:0;
//   field:pid_t child_pid;               offset:20; size:4; signed:1;
// Without BTF the child's tgid is unknown: whether it is a thread is decided by
// CLONE_THREAD, which the format lacks. The child is recorded as its own group;
// for a thread that entry is harmless and is removed when the thread exits.
#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn tp_sched_sched_process_fork(ctx: TracePointContext) -> u32 {
    let _ = try_sched_process_fork(&ctx);
    0
}

#[inline(always)]
fn try_sched_process_fork(ctx: &TracePointContext) -> Option<()> {
    let child_pid = tp_loaded!(ctx, ForkChildPid: i32)?;
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    try_fork(ctx, parent_tgid, child_pid as u32, child_pid as u32)
}

// TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm); runs as p,
// after the new comm is set.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn tp_btf_sched_process_exec(_ctx: BtfTracePointContext) -> i32 {
    let _ = try_exec();
    0
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn tp_sched_sched_process_exec(_ctx: TracePointContext) -> u32 {
    let _ = try_exec();
    0
}

fn try_exec() -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if !is_traced(tgid) {
        return None;
    }
    crate::python::on_exec(tgid);
    let mut ev = task_event(EventKind::TaskExec);
    ev.pid = pid_tgid as u32;
    ev.tgid = tgid;
    ev.gen = bump_gen(tgid, true);
    if let Some((dev, ino, start_code, at_base)) = exec_image() {
        (ev.exe_dev, ev.exe_ino, ev.start_code, ev.at_base) = (dev, ino, start_code, at_base);
    }
    emit(ev);
    Some(())
}

/// Pairs of the auxiliary vector looked through for `AT_BASE` (the kernel
/// puts it ninth on x86-64 and arm64).
const AUXV_PAIRS: u32 = 24;
const AT_NULL: u64 = 0;
const AT_BASE: u64 = 7;

/// The image the exec just mapped (the hook runs after the binary handler):
/// the program file's (device, inode), `mm->start_code` and the dynamic
/// loader's `AT_BASE` (`TaskEvent::start_code`).
#[inline(always)]
fn exec_image() -> Option<(u32, u64, u64, u64)> {
    let off = koffsets();
    // SAFETY: no preconditions; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm: u64 = read_field(task, off.task_mm)?;
    let start_code: u64 = read_field(mm as *const u8, off.mm_start_code)?;
    let file: u64 = read_field(mm as *const u8, off.mm_exe_file)?;
    let inode: u64 = read_field(file as *const u8, off.file_inode)?;
    let ino: u64 = read_field(inode as *const u8, off.inode_ino)?;
    let sb: u64 = read_field(inode as *const u8, off.inode_sb)?;
    let dev: u32 = read_field(sb as *const u8, off.sb_dev)?;
    let mut at_base = 0;
    if off.mm_saved_auxv != KernelOffsets::MISSING {
        let auxv = mm + u64::from(off.mm_saved_auxv);
        for i in 0..AUXV_PAIRS {
            let at = (auxv + u64::from(i) * 16) as *const u8;
            let Some(key) = read_field::<u64>(at, 0) else { break };
            if key == AT_NULL {
                break;
            }
            if key == AT_BASE {
                at_base = read_field::<u64>(at, 8).unwrap_or(0);
                break;
            }
        }
    }
    Some((dev, ino, start_code, at_base))
}

// TP_PROTO(struct task_struct *p[, bool group_dead]); runs as p, after
// `exit_code` is set; after `exit_mm()` up to 6.15, just before it from 6.16
// (when `group_dead` came). group_dead is derived from
// `signal->live` (already decremented) so older kernels without the argument work.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn tp_btf_sched_process_exit(ctx: BtfTracePointContext) -> i32 {
    let task: *const u8 = ctx.arg(0);
    let _ = try_exit(task);
    0
}

// Classic fallback: the format has no task pointer, but the hook runs as the
// exiting task, so the current task is the one.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn tp_sched_sched_process_exit(_ctx: TracePointContext) -> u32 {
    // SAFETY: no preconditions; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let _ = try_exit(task);
    0
}

fn try_exit(task: *const u8) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let pid = pid_tgid as u32;
    forget_parked(pid);
    if pid != tgid && FAULT_STATS.remove(pid).is_ok() {
        // Only the fallback fork hook gives a thread an entry of its own (it
        // cannot tell threads from processes): tell userspace it was a thread.
        let mut ev = task_event(EventKind::TaskExit);
        ev.pid = pid;
        ev.tgid = tgid;
        emit(ev);
        return Some(());
    }
    if !is_traced(tgid) {
        return None;
    }
    let off = koffsets();
    let signal: Option<u64> = read_field(task, off.task_signal);
    let signal = signal.map_or(core::ptr::null(), |p| p as *const u8);
    let live: Option<i32> = read_field(signal, off.signal_live);
    // Without the task pointer, only the leader's exit is reported as the group's.
    let group_dead = match live {
        Some(l) => l == 0,
        None => pid == tgid,
    };
    if !group_dead {
        return None;
    }
    release_gen(tgid);
    let mut ev = task_event(EventKind::TaskExit);
    ev.pid = pid;
    ev.tgid = tgid;
    ev.group_dead = 1;
    if pid != tgid {
        // The process's name is its leader's, not the last thread's (a
        // DataLoader worker's is its queue feeder): what /proc/PID/comm
        // showed, after a prctl(PR_SET_NAME) too. The leader, a zombie
        // until the group is reaped, keeps its task_struct.
        ev.comm = leader_comm(task).unwrap_or([0u8; COMM_LEN]);
    }
    ev.exit_code = read_field::<i32>(task, off.task_exit_code).unwrap_or(-1) as u32;
    let smin: u64 = read_field(signal, off.signal_min_flt).unwrap_or(0);
    let smaj: u64 = read_field(signal, off.signal_maj_flt).unwrap_or(0);
    let (tmin, tmaj) = match threads_faults(signal) {
        Some(t) => t,
        // Without the thread list: this thread's own, as before.
        None => (read_field(task, off.task_min_flt).unwrap_or(0), read_field(task, off.task_maj_flt).unwrap_or(0)),
    };
    ev.kernel_min_flt = tmin + smin;
    ev.kernel_maj_flt = tmaj + smaj;
    emit(ev);
    Some(())
}

/// `task->group_leader->comm`.
#[inline(always)]
fn leader_comm(task: *const u8) -> Option<[u8; COMM_LEN]> {
    let off = koffsets();
    let leader: u64 = read_field(task, off.task_group_leader)?;
    read_field(leader as *const u8, off.task_comm)
}

/// Threads summed at a group's exit: more than a DataLoader worker or an
/// OpenMP pool has. Past it the rest are left out (a low count, never a wrong one).
const MAX_THREADS: u32 = 1024;

/// The faults of the threads still on the group's list (`signal->thread_head`),
/// the running one included: `signal->min_flt` has only those already released.
/// Whichever thread exits last, the leader (a zombie until reaped) and every
/// thread exiting at the same moment are still on it. `getrusage(RUSAGE_SELF)`
/// sums the same way.
#[inline(always)]
fn threads_faults(signal: *const u8) -> Option<(u64, u64)> {
    let off = koffsets();
    if signal.is_null()
        || off.signal_thread_head == KernelOffsets::MISSING
        || off.task_thread_node == KernelOffsets::MISSING
        || off.task_min_flt == KernelOffsets::MISSING
    {
        return None;
    }
    let head = signal as u64 + u64::from(off.signal_thread_head);
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    let mut node: u64 = unsafe { bpf_probe_read_kernel(head as *const u64) }.ok()?;
    let (mut min, mut maj) = (0u64, 0u64);
    for _ in 0..MAX_THREADS {
        if node == head || node == 0 {
            break;
        }
        let t = (node - u64::from(off.task_thread_node)) as *const u8;
        min += read_field::<u64>(t, off.task_min_flt).unwrap_or(0);
        maj += read_field::<u64>(t, off.task_maj_flt).unwrap_or(0);
        // SAFETY: as above; `list_head.next` is its first word.
        node = unsafe { bpf_probe_read_kernel(node as *const u64) }.unwrap_or(0);
    }
    Some((min, maj))
}
