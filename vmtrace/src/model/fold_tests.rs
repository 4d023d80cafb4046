use super::*;
use crate::model::{Drops, MmapCounts, Sampling, TargetInfo, TargetKind, SUMMARY_VERSION};

fn faults(total: u64, time_ns: u64) -> Faults {
    let mut f = Faults { total, minor: total, time_ns, timed: total, huge: Some(0), ..Default::default() };
    f.latency_hist_ns.0[2] = total;
    f
}

fn process(pid: u32, comm: &str, total: u64) -> Process {
    Process {
        pid,
        ppid: Some(1),
        comm: comm.into(),
        cmdline: Some(comm.into()),
        exit_code: Some(0),
        faults: faults(total, total * 1000),
        reclaim: super::super::Reclaim::default(),
        migration: super::super::Migration::default(),
        mmap: Some(MmapCounts { mmap: 1, ..Default::default() }),
        tlb: None,
        kernel_accounting: Some(KernelAccounting { minor: total, major: 0 }),
        cow_from: None,
        folded: 0,
        folded_comms: BTreeMap::new(),
        resident: None,
        identity: crate::model::Identity::default(),
    }
}

fn region(pid: u32, start: u64, kind: RegionKind, path: Option<&str>, total: u64) -> RegionSummary {
    RegionSummary {
        pid,
        start: format!("{start:#x}"),
        end: format!("{:#x}", start + 0x1000 * (total + 1)),
        perms: if kind == RegionKind::File { "r-xp".into() } else { "rw-p".into() },
        kind,
        path: path.map(Into::into),
        offset: 0,
        faults: faults(total, total * 1000),
        pages_touched: total,
        cow_from: None,
        folded: 0,
    }
}

/// A target with one big region, and many small processes and regions: the
/// shape of a long `-a` recording.
pub(crate) fn summary() -> Summary {
    let mut processes = vec![process(100, "trainer", 98_000)];
    let mut regions = vec![region(100, 0x1000_0000, RegionKind::Anon, None, 90_000)];
    // The target's small regions: more libraries and thread stacks than the
    // floor of rows always kept.
    for i in 0..200 {
        let lib = format!("/usr/lib/lib{i}.so");
        regions.push(region(100, 0x7f00_0000_0000 + i * 0x10_0000, RegionKind::File, Some(&lib), 20));
    }
    for i in 0..200 {
        regions.push(region(100, 0x7e00_0000_0000 + i * 0x10_0000, RegionKind::Anon, Some("[thread stack]"), 20));
    }
    // 500 short processes with 3 regions each.
    for p in 0..500u32 {
        let pid = 1000 + p;
        processes.push(process(pid, if p % 3 == 0 { "bash" } else { "sed" }, 30));
        for (k, n) in [(RegionKind::File, 20), (RegionKind::Heap, 6), (RegionKind::Stack, 4)] {
            regions.push(region(pid, 0x5000 + n * 0x10_0000, k, None, n));
        }
    }
    let mut totals = Faults::default();
    for p in &processes {
        totals.add(&p.faults);
    }
    Summary {
        version: SUMMARY_VERSION,
        target: TargetInfo {
            kind: TargetKind::Command,
            command: Some(vec!["trainer".into()]),
            pid: Some(100),
            exit_status: Some(0),
        },
        duration_s: 600.0,
        lost_events: 0,
        processes,
        totals,
        sampling: Sampling::plain(1, false),
        drops: Drops::default(),
        probes: Vec::new(),
        program_stats: None,
        kernel: "6.1".into(),
        vmtrace_version: "test".into(),
        perf: None,
        oom: None,
        regions: Some(regions),
        region_placement: None,
        files: None,
        timeline: None,
        storms: None,
        stacks: None,
        folding: None,
        findings: None,
        thp_anon_mode: None,
        code_locations: None,
        pinned: None,
        numa: None,
        resident: None,
    }
}

fn region_sums(s: &Summary) -> BTreeMap<u32, (u64, u64)> {
    let mut by_pid: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for r in s.regions.as_ref().unwrap() {
        let e = by_pid.entry(r.pid).or_default();
        e.0 += r.faults.total;
        e.1 += r.faults.time_ns;
    }
    by_pid
}

#[test]
fn folding_keeps_every_total() {
    let mut s = summary();
    let before_totals = s.totals.clone();
    let before_regions = s.regions.as_ref().unwrap().len();
    fold(&mut s, 0.1);
    // The heaviest processes (the target first) stay; the rest are one row.
    let other = s.processes.iter().find(|p| p.pid == OTHER_PID).expect("an other row");
    assert_eq!(s.processes.len(), KEEP_TOP_PROCESSES + 1);
    assert_eq!(other.folded, 500 - (KEEP_TOP_PROCESSES as u64 - 1));
    assert_eq!(other.folded_comms.values().sum::<u64>(), other.folded);
    assert_eq!(other.kernel_accounting.unwrap().minor, other.faults.total);
    assert_eq!(other.mmap.as_ref().unwrap().mmap, other.folded);
    // The processes still add up to the totals.
    let mut sum = Faults::default();
    for p in &s.processes {
        sum.add(&p.faults);
    }
    assert_eq!(sum, before_totals);
    assert_eq!(s.totals, before_totals);
    // Each process's regions add up to its faults and time, the other row's too.
    let sums = region_sums(&s);
    for p in &s.processes {
        assert_eq!(sums.get(&p.pid).copied(), Some((p.faults.total, p.faults.time_ns)), "pid {}", p.pid);
    }
    assert_eq!(sums.len(), s.processes.len(), "no region of a pid that is not listed");
    let regions = s.regions.as_ref().unwrap();
    let folding = s.folding.clone().unwrap();
    let rows_folded: u64 = regions.iter().map(|r| r.folded).sum();
    assert_eq!(rows_folded, folding.regions);
    assert_eq!(
        regions.len() as u64 + folding.regions - regions.iter().filter(|r| r.folded > 0).count() as u64,
        before_regions as u64
    );
    assert!(regions.len() < 200, "{} rows", regions.len());
    // The target's small libraries fold into one file row, its thread
    // stacks into one row that keeps their name.
    let stacks = regions.iter().find(|r| r.pid == 100 && r.path.as_deref() == Some("[thread stack]")).unwrap();
    assert!(stacks.folded > 0);
    assert_eq!((stacks.start.as_str(), stacks.end.as_str(), stacks.perms.as_str()), ("0x0", "0x0", "rw-p"));
    // Still by fault time.
    assert!(regions.windows(2).all(|w| w[0].faults.time_ns >= w[1].faults.time_ns));
}

#[test]
fn zero_keeps_every_row_and_short_recordings_stay_whole() {
    let mut s = summary();
    let before = s.clone();
    fold(&mut s, 0.0);
    assert_eq!(s, before);
    // Under the floors: nothing to fold.
    let mut small = summary();
    small.processes.truncate(10);
    let pids: BTreeSet<u32> = small.processes.iter().map(|p| p.pid).collect();
    small.regions.as_mut().unwrap().retain(|r| pids.contains(&r.pid));
    small.regions.as_mut().unwrap().truncate(60);
    let before = small.clone();
    fold(&mut small, 0.1);
    assert_eq!(small, before);
}

#[test]
fn untimed_recordings_fold_by_faults_alone() {
    let mut s = summary();
    for f in s.processes.iter_mut().map(|p| &mut p.faults).chain(s.regions.iter_mut().flatten().map(|r| &mut r.faults))
    {
        f.time_ns = 0;
    }
    fold(&mut s, 0.1);
    assert_eq!(s.folding.map(|f| f.processes), Some(500 - (KEEP_TOP_PROCESSES as u64 - 1)));
}

#[test]
fn the_target_and_named_processes_are_never_folded() {
    let mut s = summary();
    s.target.pid = Some(1499);
    fold(&mut s, 0.1);
    assert!(s.processes.iter().any(|p| p.pid == 1499));
    assert!(region_sums(&s).contains_key(&1499));
}

#[test]
fn folded_summaries_round_trip() {
    let mut s = summary();
    fold(&mut s, 0.1);
    let json = serde_json::to_string(&s).unwrap();
    let back: Summary = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    // Folding a folded summary again changes nothing that adds up.
    let mut again = back.clone();
    fold(&mut again, 0.1);
    assert_eq!(region_sums(&again), region_sums(&back));
}

#[test]
fn permissions_of_folded_rows() {
    assert_eq!(union_perms(["rw-p", "r-xp"].into_iter()), "rwxp");
    assert_eq!(union_perms(["r--p", "rw-s"].into_iter()), "rw-*");
    assert_eq!(union_perms(["---p"].into_iter()), "---p");
}

/// More names than `folded_comms` lists: the 20 most common, and the rest
/// under `[other names]`, still adding up to the processes folded.
#[test]
fn folded_names_past_the_twentieth_are_other_names() {
    let mut s = summary();
    for (i, p) in s.processes.iter_mut().filter(|p| p.pid >= 1000).enumerate() {
        p.comm = format!("tool{}", i % 30);
    }
    fold(&mut s, 0.1);
    let other = s.processes.iter().find(|p| p.pid == OTHER_PID).expect("an other row");
    assert_eq!(other.folded_comms.len(), 21, "{:?}", other.folded_comms);
    assert_eq!(other.folded_comms.values().sum::<u64>(), other.folded, "{:?}", other.folded_comms);
    assert!(other.folded_comms.get(OTHER_NAMES).is_some_and(|n| *n > 0));
}
