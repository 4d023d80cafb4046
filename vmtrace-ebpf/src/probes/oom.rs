//! OOM kills and the memory pressure before them: `oom:mark_victim` (every
//! kill, system-wide, whoever the victim) and the reclaim stalls of traced
//! processes. Kills are rare, so the classic tracepoint (stable format, no
//! BTF needed) is their only path; a tp_btf twin adds the victim's cgroup.
use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, fentry, kprobe, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext, TracePointContext},
    EbpfContext,
};
use vmtrace_common::{DropKind, EventHeader, EventKind, KernelOffsets, OomEvent, COMM_LEN};

use crate::{
    globals::koffsets,
    shared::{count_drop, current_stats, is_traced, tp_loaded, EVENTS, WAKE_NOW},
};

/// The 8 bytes at `base + off`, or None for a null base or an offset this kernel lacks.
fn read_ptr(base: *const u8, off: u32) -> Option<*const u8> {
    if base.is_null() || off == KernelOffsets::MISSING {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { bpf_probe_read_kernel(base.add(off as usize).cast::<u64>()) }.ok().map(|p| p as *const u8)
}

/// kernfs id of a memory controller css: css->cgroup->kn->id.
fn css_id(css: *const u8) -> Option<u64> {
    let o = koffsets();
    let kn = read_ptr(read_ptr(css, o.css_cgroup)?, o.cgroup_kn)?;
    read_ptr(kn, o.kernfs_id).map(|p| p as u64)
}

/// kernfs id of `task`'s memory cgroup: task->cgroups->subsys[memory]->cgroup->kn->id.
fn memcg_id(task: *const u8) -> u64 {
    let o = koffsets();
    read_ptr(task, o.task_cgroups).and_then(|cs| read_ptr(cs, o.css_set_memory)).and_then(css_id).unwrap_or(0)
}

/// The OOM domain of a kill, by victim pid: left by the `oom_kill_process()`
/// probe for `mark_victim`, which runs inside it.
#[map]
static OOM_DOMAIN: HashMap<u32, [u64; 2]> = HashMap::with_max_entries(256, 0);

/// `oom_kill_process(struct oom_control *oc, const char *message)`: the
/// kernel's own constraint and, for a memcg OOM, the cgroup that ran out.
fn try_oom_kill_process(oc: *const u8) -> Option<()> {
    let o = koffsets();
    let chosen = read_ptr(oc, o.oom_chosen)?;
    if o.task_pid == KernelOffsets::MISSING || o.oom_constraint == KernelOffsets::MISSING {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely.
    let pid = unsafe { bpf_probe_read_kernel(chosen.add(o.task_pid as usize).cast::<i32>()) }.ok()?;
    // SAFETY: as above; `enum oom_constraint` is an int.
    let constraint = unsafe { bpf_probe_read_kernel(oc.add(o.oom_constraint as usize).cast::<u32>()) }.ok()?;
    // mem_cgroup.css is its first member on every kernel, but read the offset anyway.
    let memcg = read_ptr(oc, o.oom_memcg)
        .filter(|m| !m.is_null() && o.memcg_css != KernelOffsets::MISSING)
        // SAFETY: pointer arithmetic only; reads go through bpf_probe_read_kernel.
        .and_then(|m| css_id(unsafe { m.add(o.memcg_css as usize) }))
        .unwrap_or(0);
    let _ = OOM_DOMAIN.insert(pid as u32, [u64::from(constraint) + 1, memcg], 0);
    Some(())
}

#[fentry(function = "oom_kill_process")]
pub fn fentry_oom_kill_process(ctx: FEntryContext) -> i32 {
    let _ = try_oom_kill_process(ctx.arg(0));
    0
}

#[kprobe]
pub fn kprobe_oom_kill_process(ctx: ProbeContext) -> u32 {
    let _ = ctx.arg::<*const u8>(0).and_then(try_oom_kill_process);
    0
}

/// Victim pid → its memory cgroup, left by the tp_btf hook (which sees the victim
/// task) for the classic hook (which has the fields) on the same tracepoint call.
#[map]
static VICTIM_MEMCG: HashMap<u32, u64> = HashMap::with_max_entries(256, 0);

// TP_PROTO(struct task_struct *task, uid_t uid) since 6.8; before it
// TP_PROTO(int pid), no task: the loader does not attach this there
// (`BtfFacts::victim_task`). Attached before the classic hook, so it runs
// first on the same tracepoint.
#[btf_tracepoint(function = "mark_victim")]
pub fn tp_btf_mark_victim(ctx: BtfTracePointContext) -> i32 {
    let _ = try_btf_mark_victim(&ctx);
    0
}

#[inline(always)]
fn try_btf_mark_victim(ctx: &BtfTracePointContext) -> Option<()> {
    let task: *const u8 = ctx.arg(0);
    let o = koffsets();
    if o.task_pid == KernelOffsets::MISSING || task.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely.
    let pid = unsafe { bpf_probe_read_kernel(task.add(o.task_pid as usize).cast::<i32>()) }.ok()? as u32;
    // The classic hook ran first and left its event: complete and send it.
    if let Some(p) = OOM_PENDING.get_ptr_mut(pid) {
        // SAFETY: a live map value, sent before removal.
        unsafe { (*p).victim_memcg_id = memcg_id(task) };
        // SAFETY: as above. Sent from map memory by reference: by value, the
        // event would first be copied onto the 512-byte BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        if EVENTS.output::<OomEvent>(unsafe { &*p }, WAKE_NOW).is_err() {
            count_drop(DropKind::OomRingFull);
        }
        let _ = OOM_PENDING.remove(pid);
    } else {
        let _ = VICTIM_MEMCG.insert(pid, memcg_id(task), 0);
    }
    Some(())
}

// /sys/kernel/tracing/events/oom/mark_victim/format:
//   field:int pid;                     offset:8;  size:4; signed:1;
//   field:__data_loc char[] comm;      offset:12; size:4; signed:0;
//   field:unsigned long total_vm;      offset:16; size:8; signed:0;
//   field:unsigned long anon_rss;      offset:24; size:8; signed:0;
//   field:unsigned long file_rss;      offset:32; size:8; signed:0;
//   field:unsigned long shmem_rss;     offset:40; size:8; signed:0;
//   field:uid_t uid;                   offset:48; size:4; signed:0;
//   field:unsigned long pgtables;      offset:56; size:8; signed:0;
//   field:short oom_score_adj;         offset:64; size:2; signed:1;
// print fmt: "... total-vm=%lukB anon-rss=%lukB ..." (values already in kB)
// Before 6.8 the record has `pid` alone: every field is read where the loader
// found it (`Tp::OomPid` …), and one the record lacks is left 0 (userspace
// reports it unknown).
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn tp_oom_mark_victim(ctx: TracePointContext) -> u32 {
    let _ = try_tp_oom_mark_victim(&ctx);
    0
}

fn try_tp_oom_mark_victim(ctx: &TracePointContext) -> Result<(), i32> {
    let Some(mut slot) = EVENTS.reserve::<OomEvent>(0) else {
        count_drop(DropKind::OomRingFull);
        return Ok(());
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: no preconditions.
    let ev = unsafe {
        OomEvent {
            hdr: EventHeader {
                kind: EventKind::OomMarkVictim as u32,
                size: core::mem::size_of::<OomEvent>() as u32,
                ts_ns: bpf_ktime_get_ns(),
            },
            victim_pid: tp_loaded!(ctx, OomPid: i32).unwrap_or(0) as u32,
            trigger_tgid: (pid_tgid >> 32) as u32,
            trigger_tid: pid_tgid as u32,
            uid: tp_loaded!(ctx, OomUid: u32).unwrap_or(0),
            oom_score_adj: i32::from(tp_loaded!(ctx, OomScoreAdj: i16).unwrap_or(0)),
            constraint: 0,
            total_vm_kb: tp_loaded!(ctx, OomTotalVm: u64).unwrap_or(0),
            anon_rss_kb: tp_loaded!(ctx, OomAnonRss: u64).unwrap_or(0),
            file_rss_kb: tp_loaded!(ctx, OomFileRss: u64).unwrap_or(0),
            shmem_rss_kb: tp_loaded!(ctx, OomShmemRss: u64).unwrap_or(0),
            pgtables_kb: tp_loaded!(ctx, OomPgtables: u64).unwrap_or(0),
            victim_comm: [0; COMM_LEN],
            trigger_comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
            victim_memcg_id: 0,
            trigger_memcg_id: memcg_id(bpf_get_current_task() as *const u8),
            oom_memcg_id: 0,
        }
    };
    let out = slot.write(ev);
    // Map keys from the stack: 6.1's verifier refuses ring-buffer memory as a key.
    let victim = out.victim_pid;
    // SAFETY: copied out before removal.
    if let Some([constraint, memcg]) = unsafe { OOM_DOMAIN.get(victim) }.copied() {
        out.constraint = constraint as u32;
        out.oom_memcg_id = memcg;
        let _ = OOM_DOMAIN.remove(victim);
    }
    // __data_loc: low 16 bits the offset of the string in the record, high 16 its length.
    // Without it (before 6.8) the comm stays empty: userspace reads /proc.
    // (The tp_btf hook cannot fill it in: before 6.8 it gets the pid alone.)
    if let Some(loc) = tp_loaded!(ctx, OomComm: u32) {
        // SAFETY: the record's own offset of the string; the helper bounds the copy.
        let src = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(src, &mut out.victim_comm) };
    }
    // SAFETY: copied out before removal.
    if let Some(id) = unsafe { VICTIM_MEMCG.get(victim) }.copied() {
        out.victim_memcg_id = id;
        let _ = VICTIM_MEMCG.remove(victim);
    } else if OOM_HELPER.get(0).is_some_and(|&on| on != 0) {
        // The tp_btf hook has not run yet on this call: another tracer's
        // classic probe on mark_victim registered before it, so ours runs
        // first. Leave the event for it to complete and send.
        if let Some(p) = OOM_SCRATCH.get_ptr_mut(0) {
            // SAFETY: this CPU's scratch; copied so that 6.1's verifier sees map memory.
            unsafe { *p = *out };
            // SAFETY: as above. A reference into map memory, not a copy on the stack.
            #[allow(clippy::needless_borrows_for_generic_args)]
            if OOM_PENDING.insert(victim, unsafe { &*p }, 0).is_ok() {
                slot.discard(0);
                return Ok(());
            }
        }
    }
    slot.submit(WAKE_NOW);
    Ok(())
}

/// Set to 1 by userspace once `tp_btf_mark_victim` is attached: the classic
/// hook may then leave an event for it (`OOM_PENDING`).
#[map]
static OOM_HELPER: Array<u32> = Array::with_max_entries(1, 0);

/// Victim pid → its event, built by the classic hook when it ran before the
/// tp_btf one on the same tracepoint call.
#[map]
static OOM_PENDING: HashMap<u32, OomEvent> = HashMap::with_max_entries(256, 0);

#[map]
static OOM_SCRATCH: PerCpuArray<OomEvent> = PerCpuArray::with_max_entries(1, 0);

/// Reclaim start per thread: reclaim sleeps and may migrate, so a per-CPU slot
/// would lose it. Only traced threads enter.
#[map]
static RECLAIM_START: HashMap<u32, u64> = HashMap::with_max_entries(16_384, 0);

fn reclaim_begin() {
    let pid_tgid = bpf_get_current_pid_tgid();
    if is_traced((pid_tgid >> 32) as u32) {
        // SAFETY: no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = RECLAIM_START.insert(pid_tgid as u32, now, 0);
    }
}

fn try_reclaim_end() -> Option<()> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: the value is copied out before removal.
    let start = unsafe { RECLAIM_START.get(tid) }.copied()?;
    let _ = RECLAIM_START.remove(tid);
    let (_, _, s) = current_stats()?;
    s.reclaim += 1;
    // SAFETY: no preconditions.
    s.reclaim_ns += unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    Some(())
}

// Formats: direct_reclaim_begin / memcg_reclaim_begin {int order; unsigned long gfp_flags},
// *_end {unsigned long nr_reclaimed}: only the timing is used. tp_btf where the
// kernel has it (cheaper to detach: a classic tracepoint's detach waits for RCU
// grace periods under a kernel mutex), else the classic tracepoint.
macro_rules! reclaim_hooks {
    ($($btf:ident, $tp:ident, $name:literal, $f:ident;)+) => {$(
        #[btf_tracepoint(function = $name)]
        pub fn $btf(_ctx: BtfTracePointContext) -> i32 {
            let _ = $f();
            0
        }

        #[tracepoint(category = "vmscan", name = $name)]
        pub fn $tp(_ctx: TracePointContext) -> u32 {
            let _ = $f();
            0
        }
    )+};
}

reclaim_hooks!(
    tp_btf_mm_vmscan_direct_reclaim_begin, tp_vmscan_mm_vmscan_direct_reclaim_begin,
        "mm_vmscan_direct_reclaim_begin", reclaim_begin;
    tp_btf_mm_vmscan_direct_reclaim_end, tp_vmscan_mm_vmscan_direct_reclaim_end,
        "mm_vmscan_direct_reclaim_end", try_reclaim_end;
    tp_btf_mm_vmscan_memcg_reclaim_begin, tp_vmscan_mm_vmscan_memcg_reclaim_begin,
        "mm_vmscan_memcg_reclaim_begin", reclaim_begin;
    tp_btf_mm_vmscan_memcg_reclaim_end, tp_vmscan_mm_vmscan_memcg_reclaim_end,
        "mm_vmscan_memcg_reclaim_end", try_reclaim_end;
);
