//! The end of a trace as a pure function: plain aggregates in, the
//! `Summary` (and what the flamegraphs need) out. Nothing here reads the
//! kernel or /proc, so every field can be checked from hand-made inputs.
use std::collections::BTreeMap;

use vmtrace_common::{FaultStats, MmCall, MmStats, ADVICE_SLOTS, MM_CALL_NAMES};

use super::{process::ProcInfo, Finished, MmSite};
use crate::model::TargetKind;
use crate::{
    loader::Families,
    model::{
        DropCounts, Faults, MmapCounts, OomRecord, ProbeInfo, Process, Reclaim, Sampling, StacksSummary, Storm,
        Summary, TargetInfo, Timeline, TlbCounts, SUMMARY_VERSION,
    },
    regions::Attributed,
    stacks::{self, Stack, StackMode},
};

/// Everything a finished trace knows, read out of the session.
pub(crate) struct Inputs {
    pub target: TargetInfo,
    pub duration_s: f64,
    pub families: Families,
    /// 1 in how many minor faults was timed.
    pub minor_period: u32,
    /// Whether `get_user_pages()` faults were counted (`Faults::populated`).
    pub populated_seen: bool,
    /// 1 in how many fast minor faults was timed, every slow one exactly
    /// (0: not stratified).
    pub fast_period: u32,
    /// Stack mode and sample period, when stacks were collected.
    pub stack_mode: Option<(StackMode, u32)>,
    /// The processes of the summary, in order (see [`summary_pids`]).
    pub processes: Vec<(u32, ProcInfo)>,
    /// Fault aggregates per process, taken at exit or at the end.
    pub stats: BTreeMap<u32, FaultStats>,
    /// mmap/TLB aggregates per process.
    pub mm: BTreeMap<u32, MmStats>,
    pub stacks: Vec<Stack>,
    pub mm_sites: Vec<MmSite>,
    pub storms: Option<Vec<Storm>>,
    pub attributed: Option<Attributed>,
    pub ooms: Vec<OomRecord>,
    pub timeline: Timeline,
    /// Drop counters, indexed by `DropKind`.
    pub drops: Vec<u64>,
    /// Ring-buffer records too short for their kind.
    pub malformed_events: u64,
    /// Copied user stacks unwound (`stacks::native`).
    pub unwound_samples: u64,
    /// Pythons seen without known structure offsets.
    pub python_native_only: Vec<String>,
    /// Code objects not named: (freed before read, unreadable).
    pub python_unnamed: (u64, u64),
    pub probes: Vec<ProbeInfo>,
    /// The kernel release.
    pub kernel: String,
    /// The processes folded away while recording (`collect::folded`).
    pub folded: Option<super::folded::FoldedAway>,
}

/// Which processes the summary lists: every one that faulted and, unless the
/// whole system was traced, every one the target ran (even one that never
/// faulted), in pid order. `is_thread` drops live threads the fallback fork
/// hook could not tell from processes.
/// The processes the totals and the folded files count: those with a fault,
/// an mmap-family call or a shootdown IPI sent. A kernel thread that
/// faults nothing but sends shootdowns (`kdamond.0`, DAMON's, unmapping
/// user pages) is in `shootdowns.folded`, and so gets a row: the rows' IPIs
/// add up to the flamegraph's (uc29: 962 against 964). A flush only
/// received (a context switch's) makes no row.
pub(crate) fn counted_pids<'a>(
    stats: &'a BTreeMap<u32, FaultStats>,
    mm: &'a BTreeMap<u32, MmStats>,
) -> impl Iterator<Item = u32> + 'a {
    let sent = mm.iter().filter(|(_, m)| m.ipis_sent > 0 || m.calls.iter().any(|n| *n > 0)).map(|(pid, _)| *pid);
    stats.keys().copied().chain(sent)
}

pub(crate) fn summary_pids(
    target: &TargetInfo,
    faulted: impl Iterator<Item = u32>,
    known: impl Iterator<Item = u32>,
    is_thread: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut pids: Vec<u32> = faulted.collect();
    if target.kind != TargetKind::System {
        pids.extend(known);
    }
    if let Some(pid) = target.pid {
        pids.push(pid);
    }
    pids.sort_unstable();
    pids.dedup();
    pids.retain(|&pid| !is_thread(pid));
    pids
}

/// The fast stratum of one process: its fast minor faults (every minor
/// that was not timed exactly) and the variance of their estimated time.
/// Each sample stands for `F / n` faults on average; treating the sample as
/// simple random, the total's variance is F² s² / n (1 − n/F), s² the
/// samples' variance. One sample: its own value as the error.
pub(crate) fn fast_stratum(s: &FaultStats) -> (u64, f64) {
    let n = s.minor_sampled;
    let minor = s.started.max(s.major) - s.major;
    // minor_seen counts the faults timed at the end unweighted: slow + samples.
    let slow = s.minor_seen.saturating_sub(n);
    let fast = minor.saturating_sub(slow);
    if n == 0 || fast == 0 {
        return (fast, 0.0);
    }
    let (nf, ff) = (n as f64, fast as f64);
    let mean = s.minor_sampled_ns as f64 / nf;
    if n == 1 {
        return (fast, (ff * mean).powi(2));
    }
    let var = ((s.minor_sampled_sq as f64 - nf * mean * mean) / (nf - 1.0)).max(0.0);
    (fast, ff * ff * var / nf * (1.0 - (nf / ff).min(1.0)))
}

/// The fast faults of one process that no sample's weight stood for, or
/// (negative) the weight its samples carried for other processes' faults:
/// each sample stands for the fast faults started on its CPU since the one
/// before, whoever took them, and those after a CPU's last sample stand
/// unweighted. Its time, valued at `mean_ns`, is a bias of the process's
/// estimate (the total's is only the unweighted tail).
pub(crate) fn unweighted_fast(s: &FaultStats) -> i64 {
    let minor = s.started.max(s.major) - s.major;
    minor as i64 - s.minor_timed as i64
}

fn sampling(i: &Inputs, time_estimated: bool, stratified: bool, total_ns: u64) -> Sampling {
    let mut s = Sampling::plain(i.minor_period, time_estimated);
    if !stratified {
        return s;
    }
    let (mut var, mut samples, mut fast, mut sampled_ns) = (0.0, 0, 0, 0u64);
    for st in i.stats.values() {
        let (f, v) = fast_stratum(st);
        var += v;
        fast += f;
        samples += st.minor_sampled;
        sampled_ns += st.minor_sampled_ns;
    }
    // The fast faults no weight stood for (the tail after each CPU's last
    // sample), valued at the mean sampled latency: a bias, added to the
    // error rather than to the time, so that every view still adds up.
    let mut tail: i64 = i.stats.values().map(unweighted_fast).sum();
    if let Some(f) = i.folded.as_ref().map(|f| f.fast) {
        var += f.var;
        fast += f.fast;
        samples += f.samples;
        sampled_ns += f.sampled_ns;
        tail += f.unweighted;
    }
    let mean = if samples > 0 { sampled_ns as f64 / samples as f64 } else { 0.0 };
    let err = var.sqrt() + tail.max(0) as f64 * mean;
    s.fast_sample_period = Some(i.fast_period);
    s.time_error_ns = Some(err.round() as u64);
    s.time_error_pct = Some(if total_ns > 0 { (err * 1000.0 / total_ns as f64).round() / 10.0 } else { 0.0 });
    s.fast_samples = Some(samples);
    s.fast_faults = Some(fast);
    s
}

pub(crate) fn assemble(mut i: Inputs) -> Finished {
    if let Some(f) = i.folded.as_ref() {
        // Weighed already: `weigh` leaves them as they are.
        i.stacks.extend(f.fault_stacks());
        i.mm_sites.extend(f.sites());
    }
    let drop_counts = DropCounts { by_kind: i.drops.clone(), malformed_events: i.malformed_events };
    // summary.json sums some counters (`mm` is the map's and the ring's):
    // the log names each, so that a loss says where it happened.
    let named = drop_counts.by_name();
    let refused = drop_counts.insert_errors();
    if drop_counts.lost() > 0 {
        log::warn!("lost {} events; kernel drop counters: {named:?}; inserts refused: {refused:?}", drop_counts.lost());
    } else if !named.is_empty() || !refused.is_empty() {
        log::info!("kernel drop counters (nothing lost): {named:?}; inserts refused: {refused:?}");
    }
    let drops = drop_counts.summary();
    let (processes, totals) = processes(&i);
    let stratified = i.fast_period > 1 && i.minor_period == 1;
    let time_estimated = i.minor_period != 1 || drops.untimed_faults > 0 || stratified;
    let sampling = sampling(&i, time_estimated, stratified, totals.time_ns);
    for r in &mut i.ooms {
        if let Some(s) = i.stats.get(&r.victim_pid) {
            r.victim_faults = Some(s.started);
            r.victim_reclaim_stalls = Some(s.reclaim);
            r.victim_reclaim_ns = Some(s.reclaim_ns);
        }
    }
    // Each stack's share of its process: the flamegraphs add up to the table
    // (the other row folded while recording: its stacks are weighed already).
    let by_pid = processes
        .iter()
        .filter(|p| p.folded == 0)
        .map(|p| {
            let t = stacks::weight::Totals::of(&p.faults);
            (p.pid, t)
        })
        .collect();
    let (exact_faults, _) = stacks::weight::strata(&i.stacks);
    let (reached_root, cut, frame_pointer_only) = stacks::endings(&i.stacks);
    let sampled_faults = i.stacks.iter().map(|s| s.counts.faults).sum();
    if i.stack_mode.is_some() {
        let comms: BTreeMap<u32, &str> = processes.iter().map(|p| (p.pid, p.comm.as_str())).collect();
        let comm_of = |pid: u32| comms.get(&pid).map_or_else(String::new, |c| (*c).to_string());
        stacks::weight::weigh(&mut i.stacks, &by_pid, &comm_of);
    }
    let stacks_summary = i.stack_mode.map(|(mode, period)| StacksSummary {
        mode: format!("{mode:?}").to_lowercase(),
        sample_period: period,
        sampled_faults,
        exact_faults,
        distinct_stacks: i.stacks.len() as u64,
        lost: drop_counts.stacks_lost(),
        shallow_user_stacks_pct: stacks::shallow_pct(&i.stacks),
        broken_chain_pct: stacks::broken_pct(&i.stacks),
        reached_root,
        reached_root_pct: stacks::reached_root_pct(&i.stacks),
        cut,
        frame_pointer_only,
        unwound_samples: i.unwound_samples,
        python_faults: i.stacks.iter().filter(|s| s.python).map(|s| s.counts.faults).sum(),
        python_pct: stacks::python_pct(&i.stacks),
        python_unnamed_faults: i.stacks.iter().filter(|s| s.python_unnamed).map(|s| s.counts.faults).sum(),
        python_truncated_faults: stacks::python_truncated_faults(&i.stacks),
        python_codes_freed: i.python_unnamed.0,
        python_codes_unreadable: i.python_unnamed.1,
        python_native_only: i.python_native_only.clone(),
        files: Vec::new(),
        ..StacksSummary::default()
    });
    let mut summary = Summary {
        version: SUMMARY_VERSION,
        target: i.target,
        duration_s: i.duration_s,
        lost_events: drop_counts.lost(),
        processes,
        totals,
        sampling,
        drops,
        probes: i.probes,
        program_stats: None,
        kernel: i.kernel,
        vmtrace_version: env!("CARGO_PKG_VERSION").into(),
        perf: None,
        oom: i.families.oom.then_some(i.ooms),
        stacks: stacks_summary,
        storms: i.storms,
        timeline: Some(i.timeline),
        region_placement: i.attributed.as_ref().map(|a| {
            let p = &a.placement;
            let r = |v: f64| v.round().max(0.0) as u64;
            crate::model::RegionPlacement { exact: r(p.exact), approximate: r(p.approximate), unplaced: r(p.unplaced) }
        }),
        // Moved, not copied: a system-wide recording's rows are its
        // largest table at the end.
        regions: i.attributed.as_mut().map(|a| std::mem::take(&mut a.regions)),
        files: i.attributed.map(|a| a.files),
        folding: None,
        findings: None,
        thp_anon_mode: None,
        code_locations: None,
        pinned: None,
        numa: None,
        resident: None,
    };
    summary.mark_uncounted();
    Finished { summary, stacks: i.stacks, mm_sites: i.mm_sites, trace: None, resident: None }
}

/// One entry per process of the trace, and their fault totals; the
/// processes folded away while recording as one "other" row.
fn processes(i: &Inputs) -> (Vec<Process>, Faults) {
    let mut totals = Faults::default();
    let mut out = Vec::new();
    for (pid, info) in &i.processes {
        let pid = *pid;
        let st = i.stats.get(&pid).copied().unwrap_or_default();
        let m = i.mm.get(&pid).copied().unwrap_or_default();
        let mut p = process_row(pid, info, &st, &m, i.families, i.minor_period);
        if Some(pid) == i.target.pid && i.target.kind == TargetKind::Command {
            p.exit_code = i.target.exit_status.or(info.exit_code);
        }
        p.cow_from = cow_of(i, pid).or(info.cow_from);
        if !i.populated_seen {
            p.faults.populated = None;
        }
        totals.add(&p.faults);
        out.push(p);
    }
    if let Some(mut row) = i.folded.as_ref().and_then(super::folded::FoldedAway::row) {
        if !i.populated_seen {
            row.faults.populated = None;
        }
        totals.add(&row.faults);
        out.push(row);
    }
    (out, totals)
}

/// A process's row from its table entry and aggregates (its COW copies
/// as its entry has them).
pub(crate) fn process_row(
    pid: u32,
    info: &ProcInfo,
    st: &FaultStats,
    m: &MmStats,
    families: Families,
    minor_period: u32,
) -> Process {
    let mut faults = Faults::from_stats(st, minor_period);
    if families.regions {
        faults.huge = Some(st.huge);
    }
    // The memcg end also counts a get_user_pages() fault that failed (an
    // mlock at its cgroup's limit), and an exception fault whose start it
    // could not find: never more than the kernel's own count leaves.
    if let (Some(p), Some(k)) = (faults.populated.as_mut(), info.kernel.as_ref()) {
        *p = (*p).min((k.minor + k.major).saturating_sub(faults.total));
    }
    Process {
        mmap: families.mmap.then(|| MmapCounts { brk_shrinks: info.brk_shrinks, ..mmap_counts(m) }),
        tlb: families.tlb.then(|| tlb_counts(m)),
        reclaim: Reclaim { stalls: st.reclaim, time_ns: st.reclaim_ns },
        migration: crate::model::Migration::from_stats(st),
        pid,
        ppid: info.ppid,
        comm: info.comm.clone(),
        cmdline: info.cmdline.clone(),
        exit_code: info.exit_code,
        faults,
        kernel_accounting: info.kernel,
        cow_from: info.cow_from,
        folded: 0,
        folded_comms: BTreeMap::new(),
        resident: None,
        identity: info.identity.as_deref().cloned().unwrap_or_default(),
    }
}

/// A process's COW faults by what was copied, from its regions.
fn cow_of(i: &Inputs, pid: u32) -> Option<crate::model::CowFrom> {
    let regions = &i.attributed.as_ref()?.regions;
    let mut sum = crate::model::CowFrom::default();
    for c in regions.iter().filter(|r| r.pid == pid).filter_map(|r| r.cow_from.as_ref()) {
        sum.add(c);
    }
    (sum.total() > 0).then_some(sum)
}

const ADVICE_NAMES: [(usize, &str); 20] = [
    (0, "normal"),
    (1, "random"),
    (2, "sequential"),
    (3, "willneed"),
    (4, "dontneed"),
    (8, "free"),
    (9, "remove"),
    (10, "dontfork"),
    (11, "dofork"),
    (12, "mergeable"),
    (13, "unmergeable"),
    (14, "hugepage"),
    (15, "nohugepage"),
    (16, "dontdump"),
    (17, "dodump"),
    (18, "wipeonfork"),
    (19, "keeponfork"),
    (20, "cold"),
    (21, "pageout"),
    (22, "populate_read"),
];

fn advice_name(i: usize) -> String {
    match ADVICE_NAMES.iter().find(|(n, _)| *n == i) {
        Some((_, name)) => (*name).to_string(),
        None if i == ADVICE_SLOTS - 1 => "other".into(),
        None => format!("advice_{i}"),
    }
}

pub(crate) fn mmap_counts(m: &MmStats) -> MmapCounts {
    MmapCounts {
        mmap: m.calls[MmCall::Mmap as usize],
        munmap: m.calls[MmCall::Munmap as usize],
        munmap_bytes: m.munmap_bytes,
        mremap: m.calls[MmCall::Mremap as usize],
        madvise: m.calls[MmCall::Madvise as usize],
        mprotect: m.calls[MmCall::Mprotect as usize],
        brk: m.calls[MmCall::Brk as usize],
        // Told from the streamed brk events (`ProcessTable::note_change`), not the kernel's counts.
        brk_shrinks: 0,
        // From the call sites' stacks, at the end (`record::derive_and_fold`).
        brk_in_malloc_trim: 0,
        madvise_by_advice: m
            .advice
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (advice_name(i), *n))
            .collect(),
    }
}

fn tlb_counts(m: &MmStats) -> TlbCounts {
    let mut by_call: BTreeMap<String, u64> = BTreeMap::new();
    for (i, n) in m.ipis_by_call.iter().enumerate().filter(|(_, n)| **n > 0) {
        by_call.insert(MM_CALL_NAMES.get(i).copied().unwrap_or("other").to_string(), *n);
    }
    TlbCounts {
        task_switch: m.tlb_reason[0],
        remote_shootdown: m.tlb_reason[1],
        local_shootdown: m.tlb_reason[2],
        local_mm_shootdown: m.tlb_reason[3],
        remote_ipi_send: m.tlb_reason[4],
        pages: m.tlb_pages,
        full_flushes: m.tlb_full_flushes,
        ipis_sent: m.ipis_sent,
        ipis_by_call: by_call,
    }
}

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
