//! `assemble` from hand-made inputs, checked as summary.json shows it.
use std::collections::BTreeMap;

use vmtrace_common::{DropKind, FaultStats, MmCall, MmStats};

use super::{assemble, counted_pids, summary_pids, Inputs};
use crate::{
    collect::process::ProcInfo,
    loader::Families,
    model::OomRecord,
    model::{Storm, TargetInfo, TargetKind, Timeline},
};

fn info(ppid: u32, comm: &str, exit_code: Option<i32>) -> ProcInfo {
    ProcInfo { ppid: Some(ppid), comm: comm.into(), exit_code, ..ProcInfo::default() }
}

fn oom(victim: u32) -> OomRecord {
    OomRecord {
        unknown: Vec::new(),
        victim_pid: victim,
        victim_comm: "hog".into(),
        trigger_pid: victim,
        trigger_comm: "hog".into(),
        constraint: "memcg".into(),
        constraint_source: "kernel".into(),
        victim_cgroup_source: Some("kernel".into()),
        cgroup: Some("/box".into()),
        cgroup_limit_bytes: Some(1 << 20),
        cgroup_peak_bytes: Some(1 << 20),
        total_vm_kb: 4096,
        anon_rss_kb: 1024,
        file_rss_kb: 8,
        shmem_rss_kb: 0,
        pgtables_kb: 12,
        oom_score_adj: 0,
        uid: 0,
        in_target: true,
        time_s: 0.5,
        top_regions: None,
        fault_rate_per_s: Some(10.0),
        victim_faults: None,
        victim_reclaim_stalls: None,
        victim_reclaim_ns: None,
        resident_sites: None,
    }
}

fn inputs() -> Inputs {
    let mut stats = BTreeMap::new();
    stats.insert(
        10,
        FaultStats {
            started: 1000,
            major: 10,
            write: 600,
            exec: 5,
            cow: 20,
            huge: 2,
            minor_seen: 62,
            minor_timed: 62,
            minor_time_ns: 62_000,
            major_timed: 10,
            major_time_ns: 100_000,
            reclaim: 1,
            reclaim_ns: 500,
            ..FaultStats::default()
        },
    );
    let mut mm = MmStats { munmap_bytes: 8192, ipis_sent: 7, tlb_pages: 3, ..MmStats::default() };
    mm.calls[MmCall::Mmap as usize] = 4;
    mm.calls[MmCall::Munmap as usize] = 2;
    mm.calls[MmCall::Madvise as usize] = 1;
    mm.advice[4] = 1;
    mm.tlb_reason[1] = 6;
    mm.ipis_by_call[MmCall::Madvise as usize] = 7;
    let mut drops = vec![0; DropKind::RegionStatsFull as usize + 1];
    drops[DropKind::MmEventRingFull as usize] = 3;
    drops[DropKind::FaultUntimed as usize] = 4;
    Inputs {
        folded: None,
        target: TargetInfo {
            kind: TargetKind::Command,
            command: Some(vec!["hog".into()]),
            pid: Some(10),
            exit_status: Some(137),
        },
        duration_s: 1.25,
        families: Families { resident: false, perf: false, ..Families::ALL },
        minor_period: 16,
        populated_seen: true,
        fast_period: 0,
        stack_mode: None,
        processes: vec![(10, info(1, "hog", None)), (11, info(10, "child", Some(0)))],
        stats,
        mm: [(10, mm)].into_iter().collect(),
        stacks: Vec::new(),
        mm_sites: Vec::new(),
        storms: Some(vec![Storm {
            pid: 10,
            comm: "hog".into(),
            start_s: 0.1,
            end_s: 0.3,
            peak_per_s: 5000,
            shootdowns: 7,
            top_stack: vec!["main".into(), "[madvise]".into()],
            top_call: "madvise".into(),
            top_share: 1.0,
            malloc_settings: std::collections::BTreeMap::new(),
        }]),
        attributed: None,
        ooms: vec![oom(10)],
        timeline: Timeline { interval_s: 0.1, faults: vec![600, 400], major: vec![4, 6] },
        drops,
        malformed_events: 1,
        unwound_samples: 0,
        python_native_only: Vec::new(),
        python_unnamed: (0, 0),
        probes: Vec::new(),
        kernel: "6.1.0-test".into(),
    }
}

#[test]
fn the_summary_has_the_contracts_fields() {
    let finished = assemble(inputs());
    let j = serde_json::to_value(&finished.summary).unwrap();
    assert_eq!(j["version"], 2);
    assert_eq!(j["target"], serde_json::json!({"kind": "command", "command": ["hog"], "pid": 10, "exit_status": 137}));
    assert_eq!(j["duration_s"], 1.25);
    // Ring full for mapping events, and one malformed record; untimed faults are not lost.
    assert_eq!(j["lost_events"], 4);
    assert_eq!(j["kernel"], "6.1.0-test");

    let p = &j["processes"][0];
    assert_eq!((&p["pid"], &p["ppid"], &p["comm"]), (&10.into(), &1.into(), &"hog".into()));
    // The command's own status wins over the table's.
    assert_eq!(p["exit_code"], 137);
    let f0 = &p["faults"];
    for (k, v) in
        [("total", 1000), ("minor", 990), ("major", 10), ("write", 600), ("exec", 5), ("cow", 20), ("huge", 2)]
    {
        assert_eq!(f0[k], v, "faults.{k}");
    }
    // Minor time scaled from 62 timed of 990 minors, plus the majors' own.
    assert_eq!(f0["time_ns"], 990_000 + 100_000);
    assert!(f0["latency_hist_ns"].is_object());
    assert_eq!(
        p["mmap"],
        serde_json::json!({"mmap": 4, "munmap": 2, "munmap_bytes": 8192, "mremap": 0, "madvise": 1,
                           "mprotect": 0, "brk": 0, "brk_shrinks": 0, "madvise_by_advice": {"dontneed": 1}})
    );
    let tlb = &p["tlb"];
    assert_eq!((&tlb["remote_shootdown"], &tlb["pages"], &tlb["ipis_sent"]), (&6.into(), &3.into(), &7.into()));
    assert_eq!(tlb["ipis_by_call"], serde_json::json!({"madvise": 7}));

    // A process that never faulted is listed with zeros.
    let child = &j["processes"][1];
    assert_eq!((&child["pid"], &child["exit_code"], &child["faults"]["total"]), (&11.into(), &0.into(), &0.into()));
    assert_eq!(j["totals"]["total"], 1000);

    let kill = &j["oom"][0];
    assert_eq!(
        (&kill["victim_pid"], &kill["constraint"], &kill["cgroup"]),
        (&10.into(), &"memcg".into(), &"/box".into())
    );
    // Whole-trace counts of the victim are added from its aggregate.
    assert_eq!((&kill["victim_faults"], &kill["victim_reclaim_stalls"]), (&1000.into(), &1.into()));

    let storm = &j["storms"][0];
    assert_eq!(
        (&storm["peak_per_s"], &storm["shootdowns"], &storm["top_stack"][1]),
        (&5000.into(), &7.into(), &"[madvise]".into())
    );
    assert_eq!(j["timeline"]["faults"], serde_json::json!([600, 400]));
    assert_eq!(j["drops"]["mm"], 3);
    assert_eq!(j["drops"]["task_events"], 1);
    assert_eq!(j["drops"]["untimed_faults"], 4);
    assert_eq!(j["sampling"], serde_json::json!({"minor_latency_period": 16, "time_estimated": true}));
    // Regions were traced but nothing was attributed here: absent, as given.
    assert!(j.get("stacks").is_none());
}

#[test]
fn untraced_families_leave_their_sections_out() {
    let mut i = inputs();
    i.families = Families::default();
    i.storms = None;
    let j = serde_json::to_value(&assemble(i).summary).unwrap();
    assert!(j["processes"][0].get("mmap").is_none() && j["processes"][0].get("tlb").is_none());
    assert!(j["processes"][0]["faults"]["huge"].is_null());
    assert!(j.get("oom").is_none() || j["oom"].is_null());
    assert!(j.get("storms").is_none());
}

#[test]
fn pids_of_the_summary() {
    let cmd = TargetInfo { kind: TargetKind::Command, command: None, pid: Some(5), exit_status: None };
    let pids = summary_pids(&cmd, [9, 3].into_iter(), [7, 3].into_iter(), |p| p == 7);
    assert_eq!(pids, [3, 5, 9]);
    let system = TargetInfo { kind: TargetKind::System, command: None, pid: None, exit_status: None };
    assert_eq!(summary_pids(&system, [9].into_iter(), [7].into_iter(), |_| false), [9]);
}

/// Stratified timing (the default where the memcg end serves): a process's
/// time is its exact slow faults plus its weighted samples, not scaled (its
/// regions, files and tensors sum the same weighted granules), and the
/// error states the fast faults no weight stood for.
#[test]
fn stratified_time_is_summed_as_weighted_and_the_unweighted_tail_is_in_the_error() {
    let mut i = inputs();
    (i.minor_period, i.fast_period) = (1, 16);
    let s = FaultStats {
        started: 1000,
        // 2 slow faults (1 ms each) and 50 samples of 1 µs standing for 960
        // fast faults: the last 38 stood for by none.
        minor_seen: 52,
        minor_sampled: 50,
        minor_sampled_ns: 50_000,
        minor_sampled_sq: 50 * 1_000_000,
        minor_timed: 962,
        minor_time_ns: 2_000_000 + 960_000,
        ..FaultStats::default()
    };
    i.stats = BTreeMap::from([(10, s)]);
    let f = assemble(i).summary;
    let p = f.processes.iter().find(|p| p.pid == 10).unwrap();
    assert_eq!(p.faults.minor_time_ns, 2_960_000, "weighted, not scaled to the 998 fast faults");
    assert_eq!(f.sampling.fast_sample_period, Some(16));
    assert_eq!(f.sampling.fast_faults, Some(998));
    // All samples equal: no sampling variance; the tail, 38 x 1 µs.
    assert_eq!(f.sampling.time_error_ns, Some(38_000), "{:?}", f.sampling);
    assert_eq!(super::unweighted_fast(&s), 38);
}

/// A kill on a kernel whose `oom:mark_victim` record has no sizes (before
/// 6.8): they are said to be unknown, not 0 MiB, in summary.txt and the finding.
#[test]
fn an_oom_record_without_sizes_says_unknown() {
    let mut r = oom(42);
    assert!(r.sizes_known());
    assert!(crate::model::oom::render(&r).contains("anon 1.0 MiB"));
    r.unknown = crate::kernel::tpformat::oom_unknown_in(&vmtrace_common::TpOffsets {
        offsets: {
            let mut o = vmtrace_common::TpOffsets::TABLE.offsets;
            for f in [vmtrace_common::Tp::OomAnonRss, vmtrace_common::Tp::OomFileRss, vmtrace_common::Tp::OomShmemRss] {
                o[f as usize] = vmtrace_common::TpOffsets::MISSING;
            }
            o
        },
    })
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(r.unknown, ["anon_rss_kb", "file_rss_kb", "shmem_rss_kb"]);
    assert!(!r.sizes_known());
    let text = crate::model::oom::render(&r);
    assert!(text.contains("anon unknown, file unknown, shmem unknown, page tables 0.0 MiB"), "{text}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["unknown"][0], "anon_rss_kb");
}

/// `record -a`: a kernel thread that faults nothing but sends shootdowns
/// (uc29: `kdamond.0`, 2 IPIs) gets a row, so that the rows' IPIs add up
/// to the shootdown flamegraph's; one that only had flushes (a context
/// switch's) gets none.
#[test]
fn a_kernel_thread_that_sends_shootdowns_has_a_row_and_the_ipis_add_up() {
    let mut i = inputs();
    i.target = TargetInfo { kind: TargetKind::System, command: None, pid: None, exit_status: None };
    let mut kdamond = MmStats { ipis_sent: 2, ..MmStats::default() };
    // Outside any mmap-family call.
    kdamond.ipis_by_call[vmtrace_common::MM_CALLS] = 2;
    let mut idle = MmStats::default();
    idle.tlb_reason[0] = 40;
    let mut mapper = MmStats::default();
    mapper.calls[MmCall::Mmap as usize] = 3;
    i.mm.extend([(20, kdamond), (30, idle), (40, mapper)]);
    let pids = summary_pids(&i.target, counted_pids(&i.stats, &i.mm), [7].into_iter(), |_| false);
    assert_eq!(pids, [10, 20, 40], "faults, shootdowns sent, mmap calls: not flushes received");
    // Before: only the processes with faults.
    assert_eq!(summary_pids(&i.target, i.stats.keys().copied(), std::iter::empty(), |_| false), [10]);
    i.processes = pids.iter().map(|pid| (*pid, info(1, if *pid == 20 { "kdamond.0" } else { "p" }, None))).collect();
    // The sites' IPIs (shootdowns.folded's total): 7 of the faulting process, 2 of kdamond's.
    let site = |pid, ipis| crate::model::MmSite { pid, comm: "p".into(), frames: Vec::new().into(), calls: 1, ipis };
    i.mm_sites = vec![site(10, 7), site(20, 2)];
    let s = assemble(i).summary;
    let rows: u64 = s.processes.iter().filter_map(|p| p.tlb.as_ref()).map(|t| t.ipis_sent).sum();
    assert_eq!(rows, 7 + 2);
    let row = s.processes.iter().find(|p| p.pid == 20).expect("kdamond's row");
    assert_eq!((row.comm.as_str(), row.faults.total), ("kdamond.0", 0));
}
