//! Page migrations and NUMA balancing's task moves, per traced process:
//! compaction, NUMA balancing (a hinting fault that finds its page on the
//! wrong node moves it, in the faulting thread), `move_pages`/`mbind`,
//! long-term pins. Counted for the process whose thread ran the migration
//! (its stall), with the time it took, in its `FaultStats`. Rare next to
//! faults: one start and one end per `migrate_pages()` call.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::HashMap,
    programs::{BtfTracePointContext, TracePointContext},
};
use vmtrace_common::{migrate_bucket, FaultStats};

use crate::{
    globals::stopped,
    shared::{is_traced, tp_fixed, FAULT_STATS},
};

/// Migrations in flight per thread: `[start, reason]` of the outer one and
/// of one nested inside it, and the depth. Sync migrations sleep (writeback,
/// locks) and may resume on another CPU; a huge-page migration's target
/// allocation may compact, which migrates again inside it.
#[map]
static MIGRATE_START: HashMap<u32, [u64; 5]> = HashMap::with_max_entries(16_384, 0);

/// This CPU's aggregate of `tgid` when it is traced already: a kernel thread
/// (kcompactd) or an untraced process gets no entry from a migration.
#[inline(always)]
fn stats_of(tgid: u32) -> Option<&'static mut FaultStats> {
    if stopped() {
        return None;
    }
    // SAFETY: this CPU's value of a live entry; no other writer on this CPU.
    FAULT_STATS.get_ptr_mut(tgid).map(|p| unsafe { &mut *p })
}

fn migrate_start(reason: i32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(v) = MIGRATE_START.get_ptr_mut(tid) {
        // SAFETY: this thread's entry; only this thread writes it.
        let v = unsafe { &mut *v };
        if v[4] == 1 {
            v[2] = now;
            v[3] = reason as u64;
        }
        v[4] += 1;
    } else if is_traced((pid_tgid >> 32) as u32) {
        let _ = MIGRATE_START.insert(tid, [now, reason as u64, 0, 0, 1], 0);
    }
}

fn try_migrate_end(succeeded: u64, failed: u64) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let v = MIGRATE_START.get_ptr_mut(tid)?;
    // SAFETY: this thread's entry; only this thread writes it.
    let v = unsafe { &mut *v };
    let depth = v[4];
    // The outer migration's time holds the nested one's: timed once. A
    // migration nested deeper than two has no reason kept: "other".
    let (start, reason) = match depth {
        0 | 1 => (v[0], v[1]),
        2 => (0, v[3]),
        _ => (0, u64::MAX),
    };
    if depth <= 1 {
        let _ = MIGRATE_START.remove(tid);
    } else {
        v[4] -= 1;
    }
    let s = stats_of((pid_tgid >> 32) as u32)?;
    let b = migrate_bucket(reason as i32);
    if b < s.migrated.len() {
        s.migrated[b] += succeeded;
    }
    s.migrate_failed += failed;
    s.migrations += 1;
    if start > 0 {
        // SAFETY: no preconditions.
        s.migrate_ns += unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    }
    Some(())
}

// TP_PROTO(enum migrate_mode mode, int reason); the classic record
// {mode @8, reason @12}, the same on every kernel that has the event.
#[btf_tracepoint(function = "mm_migrate_pages_start")]
pub fn tp_btf_mm_migrate_pages_start(ctx: BtfTracePointContext) -> i32 {
    migrate_start(ctx.arg::<i32>(1));
    0
}

#[tracepoint(category = "migrate", name = "mm_migrate_pages_start")]
pub fn tp_migrate_mm_migrate_pages_start(ctx: TracePointContext) -> u32 {
    migrate_start(tp_fixed!(&ctx, MigrateStartReason: i32));
    0
}

// TP_PROTO(unsigned long succeeded, unsigned long failed, …): the first two
// arguments, and the record's first two fields (@8, @16), are the same from
// 5.11 on; what follows moved (a later kernel added `large_folio_split`), so the reason
// is the one the start saw.
#[btf_tracepoint(function = "mm_migrate_pages")]
pub fn tp_btf_mm_migrate_pages(ctx: BtfTracePointContext) -> i32 {
    let _ = try_migrate_end(ctx.arg::<u64>(0), ctx.arg::<u64>(1));
    0
}

#[tracepoint(category = "migrate", name = "mm_migrate_pages")]
pub fn tp_migrate_mm_migrate_pages(ctx: TracePointContext) -> u32 {
    let _ = try_migrate_end(tp_fixed!(&ctx, MigrateSucceeded: u64), tp_fixed!(&ctx, MigrateFailed: u64));
    0
}

fn numa_moved(tgid: i32) {
    if let Some(s) = stats_of(tgid as u32) {
        s.numa_moves += 1;
    }
}

// sched_move_numa {pid @8, tgid @12, ngid, src_cpu, src_nid, dst_cpu, dst_nid}:
// NUMA balancing moved a thread to a CPU of its preferred node.
#[tracepoint(category = "sched", name = "sched_move_numa")]
pub fn tp_sched_sched_move_numa(ctx: TracePointContext) -> u32 {
    numa_moved(tp_fixed!(&ctx, MoveNumaTgid: i32));
    0
}

// sched_swap_numa {src_pid @8, src_tgid @12, …, dst_pid @28, dst_tgid @32, …}:
// two threads swapped CPUs across nodes; each moved.
#[tracepoint(category = "sched", name = "sched_swap_numa")]
pub fn tp_sched_sched_swap_numa(ctx: TracePointContext) -> u32 {
    numa_moved(tp_fixed!(&ctx, SwapNumaSrcTgid: i32));
    numa_moved(tp_fixed!(&ctx, SwapNumaDstTgid: i32));
    0
}
