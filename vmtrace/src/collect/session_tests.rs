//! The session driven from a `FakeSource`: no root, no kernel, a clock the
//! tests move by hand.
use std::time::Duration;

use vmtrace_common::{DropKind, EventKind, FaultStats, MmCall, MmStackCounts, MmStackKey, MmStats};

use super::{Session, SessionOptions};
use crate::{
    collect::fake::{exit, oom_kill, task, FakeSource, NO_SUCH_PID},
    loader::Families,
    model::{TargetInfo, TargetKind},
    stacks::StackMode,
};

const PARENT: u32 = NO_SUCH_PID + 1;
const CHILD: u32 = NO_SUCH_PID + 2;
const THREAD: u32 = NO_SUCH_PID + 3;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn session(source: FakeSource, opts: SessionOptions) -> Session<FakeSource> {
    let mut s = Session::new(source, opts);
    s.start_clock();
    s
}

fn command(pid: u32) -> TargetInfo {
    TargetInfo { kind: TargetKind::Command, command: Some(vec!["work".into()]), pid: Some(pid), exit_status: Some(0) }
}

fn faults(started: u64, major: u64) -> FaultStats {
    FaultStats { started, major, write: started / 2, cow: 3, ..FaultStats::default() }
}

/// Finishes with the clock stopped at `at` after the start.
fn finish_at(s: Session<FakeSource>, at: Duration) -> crate::collect::Finished {
    let end = s.started + at;
    s.finish_with(command(PARENT), move || end)
}

#[test]
fn task_events_build_the_process_table() {
    let mut src = FakeSource::new(16);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
    src.push(&task(EventKind::TaskExec, CHILD, CHILD, 0, "worker"));
    // A thread the fallback fork hook took for a process, and its exit in the
    // same poll (cae92f3): it must not come back as a process.
    src.push(&task(EventKind::TaskFork, THREAD, THREAD, PARENT, "work"));
    src.push(&thread_exit(THREAD, PARENT));
    src.push(&exit(CHILD, 11 << 8, "worker"));
    src.stats.insert(PARENT, faults(100, 4));
    src.stats.insert(CHILD, faults(40, 1));
    let opts = SessionOptions { stacks: Some((StackMode::User, 1)), ..SessionOptions::new(Families::default()) };
    let mut s = session(src, opts);
    s.set_parent(PARENT, 1);
    let t0 = s.started;
    s.step(t0 + ms(10));

    assert!(s.known(THREAD).is_none(), "thread read back as a process");
    let c = s.known(CHILD).expect("child in the table");
    assert_eq!((c.ppid, c.comm.as_str(), c.exit_code), (Some(PARENT), "worker", Some(11)));
    // The exited child's aggregate left the source for the table.
    assert_eq!(c.stats.map(|f| f.started), Some(40));
    assert!(!s.source().stats.contains_key(&CHILD));

    let f = finish_at(s, ms(20));
    let pids: Vec<(u32, Option<u32>, &str, Option<i32>)> =
        f.summary.processes.iter().map(|p| (p.pid, p.ppid, p.comm.as_str(), p.exit_code)).collect();
    // The target's exit status is the command's own.
    assert_eq!(pids, [(PARENT, Some(1), "?", Some(0)), (CHILD, Some(PARENT), "worker", Some(11))]);
    let totals: Vec<(u64, u64, u64)> =
        f.summary.processes.iter().map(|p| (p.faults.total, p.faults.minor, p.faults.major)).collect();
    assert_eq!(totals, [(100, 96, 4), (40, 39, 1)]);
    assert_eq!((f.summary.totals.total, f.summary.totals.major, f.summary.totals.cow), (140, 5, 6));
}

#[test]
fn mm_counts_made_after_an_exit_go_to_the_process_and_leave_the_map() {
    let mut src = FakeSource::new(16);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
    src.push(&exit(CHILD, 0, "work"));
    src.mm.insert(CHILD, MmStats { munmap_bytes: 3, tlb_pages: 5, ..MmStats::default() });
    src.mm.insert(PARENT, MmStats { munmap_bytes: 1, ..MmStats::default() });
    let families = Families { tlb: true, ..Families::default() };
    let mut s = session(src, SessionOptions::new(families));
    let t0 = s.started;
    s.step(t0 + ms(10));
    assert!(!s.source().mm.contains_key(&CHILD));
    // The teardown's TLB flushes, counted after the exit was applied: the
    // next tick takes them; the live parent's stay in the map.
    s.source_mut().mm.insert(CHILD, MmStats { tlb_pages: 2, ..MmStats::default() });
    s.step(t0 + ms(150));
    assert!(!s.source().mm.contains_key(&CHILD), "a late aggregate left in the map");
    assert!(s.source().mm.contains_key(&PARENT));
    let m = s.known(CHILD).and_then(|p| p.mm).expect("child's mm counts");
    assert_eq!((m.munmap_bytes, m.tlb_pages), (3, 7));
}

/// The exit of a thread that is not its group's leader.
fn thread_exit(tid: u32, tgid: u32) -> vmtrace_common::TaskEvent {
    task(EventKind::TaskExit, tid, tgid, 0, "work")
}

#[test]
fn drops_and_malformed_records_are_counted() {
    let mut src = FakeSource::new(1);
    let mut drops = vec![0; DropKind::RegionStatsFull as usize + 1];
    drops[DropKind::TaskEventRingFull as usize] = 2;
    drops[DropKind::FaultUntimed as usize] = 5;
    drops[DropKind::MmStatsFull as usize] = 7;
    drops[DropKind::StackLost as usize] = 9;
    src.drops = drops;
    // Shorter than any header.
    src.events.push_back(vec![1, 2, 3]);
    // A task event cut short.
    src.events.push_back(
        crate::collect::fake::bytes_of(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "w"))[..20].to_vec(),
    );
    let mut s = session(src, SessionOptions::new(Families::default()));
    s.step(s.started + ms(1));
    assert_eq!(s.lost_events(), 2 + 7 + 2);
    let f = finish_at(s, ms(5));
    let d = &f.summary.drops;
    assert_eq!((d.task_events, d.mm, d.untimed_faults, d.fault_stats_full), (4, 7, 5, 0));
    assert_eq!(f.summary.lost_events, 11);
    // Minor faults timed 1 in 1, but some untimed: time is an estimate.
    assert!(f.summary.sampling.time_estimated);
    assert!(f.summary.stacks.is_none());
}

#[test]
fn timeline_bins_are_faults_per_tick() {
    let mut s = session(FakeSource::new(16), SessionOptions::new(Families::default()));
    let t0 = s.started;
    // Ticks every 20 ms (`timeline::TICK`).
    for (at, totals) in [(20, (50, 1)), (30, (60, 1)), (40, (80, 2)), (60, (80, 2))] {
        s.source_mut().totals = totals;
        s.step(t0 + ms(at));
    }
    s.source_mut().totals = (95, 5);
    let tl = finish_at(s, ms(66)).summary.timeline.expect("timeline");
    // 30 ms was not a tick: its faults land in the 40 ms bin; the last bin is partial.
    assert_eq!(tl.faults, [50, 30, 0, 15]);
    assert_eq!(tl.major, [1, 1, 0, 3]);
    assert!((tl.interval_s - 0.02).abs() < 1e-12);
}

#[test]
fn a_shootdown_storm_names_its_culprit() {
    let mut src = FakeSource::new(16);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "churn"));
    let site = MmStackKey { tgid: CHILD, call: MmCall::Madvise as u32, user_stack: -1, _pad: 0 };
    let families = Families { tlb: true, ..Families::default() };
    let mut s = session(src, SessionOptions { storm_threshold: 1000.0, ..SessionOptions::new(families) });
    let t0 = s.started;
    // IPIs sent so far at each tick: 50/s, then 3000/s and 5000/s, then calm.
    for (at, ipis) in [(100, 0), (200, 5), (300, 305), (400, 805), (500, 810)] {
        let src = s.source_mut();
        src.mm.insert(CHILD, MmStats { ipis_sent: ipis, ..MmStats::default() });
        src.mm_stacks = vec![(site, MmStackCounts { calls: ipis / 5, ipis })];
        s.step(t0 + ms(at));
    }
    let f = finish_at(s, ms(550));
    let storms = f.summary.storms.expect("tlb traced");
    assert_eq!(storms.len(), 1, "{storms:?}");
    let st = &storms[0];
    assert_eq!((st.pid, st.comm.as_str(), st.shootdowns, st.peak_per_s), (CHILD, "churn", 800, 5000));
    assert!((st.start_s - 0.2).abs() < 1e-9 && (st.end_s - 0.4).abs() < 1e-9, "{st:?}");
    assert_eq!(st.top_call, "madvise");
    assert_eq!(st.top_stack.last().map(String::as_str), Some("[madvise]"));
    assert!((st.top_share - 1.0).abs() < 1e-9);
}

#[test]
fn an_oom_kill_carries_the_flight_recorders_rate() {
    let mut src = FakeSource::new(16);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "hog"));
    let families = Families { oom: true, ..Families::default() };
    let mut s = session(src, SessionOptions::new(families));
    let t0 = s.started;
    // 100 faults per 250 ms sample.
    for (at, n) in [(250, 100), (500, 200), (750, 300)] {
        s.source_mut().stats.insert(CHILD, faults(n, 0));
        s.step(t0 + ms(at));
    }
    s.source_mut().stats.insert(CHILD, faults(400, 0));
    let kill = oom_kill(CHILD, "hog", s.started_mono_ns + 1_500_000_000, 2048);
    s.source_mut().push(&kill);
    s.step(t0 + ms(1000));
    assert_eq!(s.ooms().len(), 1);

    let f = finish_at(s, ms(1100));
    let ooms = f.summary.oom.expect("oom traced");
    let r = &ooms[0];
    assert_eq!((r.victim_pid, r.victim_comm.as_str(), r.in_target), (CHILD, "hog", true));
    assert_eq!((r.anon_rss_kb, r.total_vm_kb), (2048, 4096));
    assert!((r.time_s - 1.5).abs() < 1e-9, "{}", r.time_s);
    // (400 - 100) faults over 0.75 s since the window's oldest sample.
    assert!(r.fault_rate_per_s.is_some_and(|v| (v - 400.0).abs() < 1e-6), "{:?}", r.fault_rate_per_s);
    assert_eq!(r.victim_faults, Some(400));
}

/// The fields a kill's record lacks are those the loader found missing
/// (the source's `TP_OFFSETS`), not a second read of the format files.
#[test]
fn an_oom_kills_unknown_fields_are_the_loaders() {
    use vmtrace_common::{Tp, TpOffsets};
    let unknown_with = |tp: Option<TpOffsets>| {
        let mut src = FakeSource::new(16);
        src.tp_offsets = tp;
        let families = Families { oom: true, ..Families::default() };
        let mut s = session(src, SessionOptions::new(families));
        let kill = oom_kill(CHILD, "hog", s.started_mono_ns + 1_000, 0);
        s.source_mut().push(&kill);
        s.step(s.started + ms(250));
        s.ooms()[0].unknown.clone()
    };
    assert_eq!(unknown_with(None), Vec::<String>::new());
    let mut pid_alone = TpOffsets::TABLE;
    for (i, f) in vmtrace_common::TP_FIELDS.iter().enumerate() {
        if f.tracepoint == "oom:mark_victim" && i != Tp::OomPid as usize {
            pid_alone.offsets[i] = TpOffsets::MISSING;
        }
    }
    assert_eq!(
        unknown_with(Some(pid_alone)),
        ["total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb", "pgtables_kb", "uid", "oom_score_adj"]
    );
}

/// Before 6.8 the record has no comm; a victim already gone from /proc
/// keeps the name the table knew it by.
#[test]
fn an_oom_victim_without_a_comm_in_the_record_is_named_from_the_table() {
    let mut src = FakeSource::new(16);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "hog"));
    let families = Families { oom: true, ..Families::default() };
    let mut s = session(src, SessionOptions::new(families));
    let kill = oom_kill(CHILD, "", s.started_mono_ns + 1_000, 0);
    s.source_mut().push(&kill);
    let stranger = oom_kill(CHILD + 100, "", s.started_mono_ns + 2_000, 0);
    s.source_mut().push(&stranger);
    s.step(s.started + ms(250));
    let names: Vec<&str> = s.ooms().iter().map(|o| o.victim_comm.as_str()).collect();
    assert_eq!(names, ["hog", "?"]);
}

#[test]
fn the_duration_ends_when_tracing_stopped_not_after_the_reports() {
    let mut s = session(FakeSource::new(16), SessionOptions::new(Families::default()));
    s.stopped = Some(s.started + ms(250));
    // Detaching and building the summary took another 700 ms.
    let f = finish_at(s, ms(950));
    assert!((f.summary.duration_s - 0.25).abs() < 1e-9, "{}", f.summary.duration_s);
}

/// `record`: an exited process's granules leave the source a moment after
/// its exit, placed then; the regions add up as when placed at the end.
#[test]
fn an_exited_process_is_retired_and_its_regions_still_add_up() {
    use vmtrace_common::{GranuleCounts, GranuleKey};
    let run = |retire: bool| {
        let mut src = FakeSource::new(1);
        src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
        src.push(&exit(CHILD, 0, "work"));
        src.stats.insert(PARENT, faults(16, 0));
        src.stats.insert(CHILD, faults(32, 0));
        let g = GranuleCounts { faults: 16, touched: 0xffff, ..GranuleCounts::default() };
        for (tgid, granule) in [(CHILD, 1), (CHILD, 2), (PARENT, 1)] {
            src.granules.push((GranuleKey { tgid, gen: 0, granule }, g));
        }
        let families = Families { regions: true, ..Families::default() };
        let opts = SessionOptions { retire_exited: retire, fold_below: 0.1, ..SessionOptions::new(families) };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        // Not yet: its exit is not a second old.
        s.step(t0 + ms(500));
        assert_eq!(s.source().granules.len(), 3);
        s.step(t0 + ms(5000));
        let left: Vec<u32> = s.source().granules.iter().map(|(k, _)| k.tgid).collect();
        if retire {
            assert_eq!(left, [PARENT], "the child's granules taken out");
            assert!(s.known(CHILD).is_some_and(|p| p.retired));
            assert_eq!(s.retired, 1);
        } else {
            assert_eq!(left.len(), 3);
        }
        let f = finish_at(s, ms(6000));
        let mut rows: Vec<(u32, u64)> = f.summary.regions.unwrap().iter().map(|r| (r.pid, r.faults.total)).collect();
        rows.sort_unstable();
        rows
    };
    let (retired, at_end) = (run(true), run(false));
    assert_eq!(retired, at_end);
    assert_eq!(retired.iter().filter(|r| r.0 == CHILD).map(|r| r.1).sum::<u64>(), 32);
}

/// `record` under process churn: a retired process's stacks and call sites
/// are symbolized as it is let go, and the end gives what it gives when
/// every process is symbolized at the end.
#[test]
fn a_released_process_keeps_its_stacks_and_call_sites() {
    use vmtrace_common::{StackCounts, StackKey};
    let run = |release_above: usize| {
        let mut src = FakeSource::new(1);
        src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
        src.push(&exit(CHILD, 0, "work"));
        src.stats.insert(PARENT, faults(16, 0));
        src.stats.insert(CHILD, faults(32, 0));
        src.user_stacks.insert(5, vec![0x1000, 0x2000]);
        for tgid in [PARENT, CHILD] {
            let key = StackKey { tgid, user_stack: 5, kernel_stack: -1, ..StackKey::default() };
            src.stack_counts
                .push((key, StackCounts { faults: 8, timed: 8, time_ns: 800, cow: 3, ..Default::default() }));
            let site = MmStackKey { tgid, call: MmCall::Munmap as u32, user_stack: 5, _pad: 0 };
            src.mm_stacks.push((site, MmStackCounts { calls: 3, ipis: 2 }));
        }
        let families = Families { regions: true, mmap: true, ..Families::default() };
        let opts = SessionOptions {
            retire_exited: true,
            release_above,
            stacks: Some((StackMode::User, 1)),
            ..SessionOptions::new(families)
        };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        s.step(t0 + ms(5000));
        assert_eq!(s.released, u64::from(release_above == 0));
        assert_eq!(s.known(CHILD).is_some_and(|p| p.released), release_above == 0);
        if release_above == 0 {
            assert!(s.source().mm_stacks.iter().all(|(k, _)| k.tgid == PARENT), "the child's sites taken out");
        }
        let f = finish_at(s, ms(6000));
        let mut stacks: Vec<String> =
            f.stacks.iter().map(|s| format!("{} {} {:?} {}", s.pid, s.comm, s.user, s.counts.faults)).collect();
        stacks.sort();
        let mut sites: Vec<String> =
            f.mm_sites.iter().map(|m| format!("{} {} {:?} {} {}", m.pid, m.comm, m.frames, m.calls, m.ipis)).collect();
        sites.sort();
        (stacks, sites)
    };
    let (released, at_end) = (run(0), run(usize::MAX));
    assert_eq!(released, at_end);
    assert_eq!(released.0.len(), 2, "{released:?}");
    assert_eq!(released.1.len(), 2, "{released:?}");
}

/// `record -a` under process churn: the light exited processes are folded
/// away once released (the collector forgets them), and the summary, fault
/// stacks and call sites come out as when every process is kept to the end
/// and folded there.
#[test]
fn light_exited_processes_are_folded_away_and_the_end_is_the_same() {
    use vmtrace_common::{GranuleCounts, GranuleKey, StackCounts, StackKey};
    // More than a placing slice (64).
    const CHILDREN: u32 = 70;
    let child = |i: u32| CHILD + 10 + i;
    let run = |fold_away: bool| {
        let mut src = FakeSource::new(1);
        src.stats.insert(PARENT, FaultStats { minor_time_ns: 1_000_000, minor_timed: 10_000, ..faults(10_000, 0) });
        src.user_stacks.insert(5, vec![0x1000, 0x2000]);
        src.user_stacks.insert(6, vec![0x1000, 0x3000]);
        let g = GranuleCounts { faults: 10_000, touched: 1, ..GranuleCounts::default() };
        src.granules.push((GranuleKey { tgid: PARENT, gen: 0, granule: 1 }, g));
        for i in 0..CHILDREN {
            let pid = child(i);
            src.push(&task(EventKind::TaskFork, pid, pid, PARENT, "work"));
            let n = 10 + u64::from(i);
            let st = FaultStats { minor_time_ns: 100 * n, minor_timed: n, minor_seen: n, ..faults(n, 0) };
            src.push(&exit(pid, 0, "work"));
            src.stats.insert(pid, st);
            for (stack, share) in [(5, 2), (6, 1)] {
                let key = StackKey { tgid: pid, user_stack: stack, kernel_stack: -1, ..StackKey::default() };
                src.stack_counts.push((
                    key,
                    StackCounts { faults: share, timed: share, time_ns: 10 * share, ..Default::default() },
                ));
            }
            let site = MmStackKey { tgid: pid, call: MmCall::Munmap as u32, user_stack: 5, _pad: 0 };
            src.mm_stacks.push((site, MmStackCounts { calls: 3, ipis: 2 }));
            let g = GranuleCounts { faults: n, touched: 1, ..GranuleCounts::default() };
            src.granules.push((GranuleKey { tgid: pid, gen: 0, granule: 1 }, g));
        }
        let families = Families { regions: true, mmap: true, ..Families::default() };
        let opts = SessionOptions {
            retire_exited: true,
            release_above: 0,
            fold_below: 5.0,
            fold_processes: fold_away,
            stacks: Some((StackMode::User, 1)),
            ..SessionOptions::new(families)
        };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        for k in 2..8 {
            s.step(t0 + ms(1000 * k));
        }
        let gone = (0..CHILDREN).filter(|i| s.known(child(*i)).is_none()).count();
        let end = s.started + ms(9000);
        let mut f = s.finish_with(
            TargetInfo { kind: TargetKind::System, command: None, pid: None, exit_status: None },
            move || end,
        );
        // The children whose stacks or call sites the end built one by one.
        let built: std::collections::BTreeSet<u32> = (f.stacks.iter().map(|s| s.pid))
            .chain(f.mm_sites.iter().map(|m| m.pid))
            .filter(|p| (child(0)..child(CHILDREN)).contains(p))
            .collect();
        crate::model::fold(&mut f.summary, 5.0);
        let other = f.summary.processes.iter().find(|p| p.pid == crate::model::OTHER_PID).cloned();
        let mut by_comm: std::collections::BTreeMap<String, (f64, f64)> = std::collections::BTreeMap::new();
        for st in &f.stacks {
            // (Raw addresses of processes folded away are left out.)
            let e = by_comm.entry(st.comm.clone()).or_default();
            e.0 += st.estimate.faults;
            e.1 += st.estimate.time_ns;
        }
        let mut sites: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
        for m in &f.mm_sites {
            let e = sites.entry(format!("{} {}", m.comm, m.frames.len())).or_default();
            e.0 += m.calls;
            e.1 += m.ipis;
        }
        // Each process's regions (pid 0's included) add up to its faults.
        let regions = f.summary.regions.clone().unwrap_or_default();
        for p in &f.summary.processes {
            let sum: u64 = regions.iter().filter(|r| r.pid == p.pid).map(|r| r.faults.total).sum();
            assert_eq!(sum, p.faults.total, "regions of {} (fold away: {fold_away})", p.pid);
        }
        (gone, f.summary.totals.clone(), other, by_comm, sites, f.summary.folding.clone(), built.len())
    };
    let (away, kept) = (run(true), run(false));
    assert!(away.0 > 10, "{} of {CHILDREN} folded away", away.0);
    assert_eq!(kept.0, 0);
    assert_eq!(away.1, kept.1, "totals");
    let (a, k) = (away.2.unwrap(), kept.2.unwrap());
    assert_eq!((a.folded, &a.faults, &a.folded_comms), (k.folded, &k.faults, &k.folded_comms));
    assert_eq!(a.folded_comms.get("work").copied(), Some(u64::from(CHILDREN) - 19));
    assert_eq!(away.3.len(), kept.3.len(), "{:?}\n{:?}", away.3, kept.3);
    for ((ka, va), (kk, vk)) in away.3.iter().zip(&kept.3) {
        assert_eq!(ka, kk);
        assert!((va.0 - vk.0).abs() < 1e-6 && (va.1 - vk.1).abs() < 1e-3, "{ka}: {va:?} against {vk:?}");
    }
    assert_eq!(away.4, kept.4, "call sites");
    let folding = away.5.unwrap();
    assert_eq!(folding.while_recording, away.0 as u64);
    assert_eq!(folding.processes, a.folded);
    // At the end, those still unfolded that the end's fold folds were
    // folded away before the end built its stacks and call sites: it built
    // the 19 children that stay rows, and the one left for the end's fold.
    assert_eq!(kept.6, CHILDREN as usize);
    assert_eq!(away.6, 20, "children built at the end");
}

#[test]
fn only_calls_that_lock_memory_read_numa_placement() {
    let ev = |call: MmCall, ret: i64| crate::collect::fake::lock_call(call, ret, 4096, 1);
    for call in [MmCall::Mlock, MmCall::Mlockall] {
        assert!(super::locks_memory(&ev(call, 0)), "{call:?}");
        assert!(!super::locks_memory(&ev(call, -12)), "a failed {call:?} locked nothing");
    }
    assert!(super::locks_memory(&ev(MmCall::Mmap, 0x7f00_0000_0000)), "a MAP_LOCKED mmap");
    assert!(!super::locks_memory(&ev(MmCall::Mmap, -12)));
    // An unlock leaves pages about to go: a read then would replace the
    // locked set with what is left of it.
    for call in [MmCall::Munlock, MmCall::Munlockall] {
        assert!(!super::locks_memory(&ev(call, 0)), "{call:?}");
    }
}

#[test]
fn a_snapshot_labels_counts_with_the_identity_of_execs_that_came_before_them() {
    // A pod's entrypoint: moved into the pod's cgroup, then exec'd. Its
    // faults since are in the kernel's counters, and its exec (which
    // re-reads its identity) still waits in the ring when the snapshot is
    // taken, as on a loaded node.
    let me = std::process::id();
    let mut src = FakeSource::new(1);
    src.push(&task(EventKind::TaskFork, me, me, PARENT, "sh"));
    src.stats.insert(me, faults(10, 0));
    let mut s = session(src, SessionOptions::new(Families::default()));
    let t0 = s.started;
    s.step(t0 + ms(10));
    let before = crate::model::Identity { cgroup: Some("/before/the/move".into()), ..Default::default() };
    s.table.set_identity(me, before);
    s.source.push(&task(EventKind::TaskExec, me, me, 0, "hold"));
    s.source.stats.insert(me, faults(24_000, 0));
    let snap = s.live_snapshot(crate::collect::live::LiveScope::WholeTrace);
    let p = snap.processes.iter().find(|p| p.pid == me).expect("the process is in the snapshot");
    let id = p.identity.as_deref().expect("an identity");
    assert_eq!(p.faults.total, 24_000);
    let now = crate::identity::read(me).expect("this test's own identity");
    assert_eq!(id.cgroup, now.cgroup, "labelled with the cgroup it exec'd in, not {:?}", "/before/the/move");
}

#[test]
fn a_process_the_snapshots_drain_forgets_keeps_its_label_and_leaves_no_entry() {
    // `top -a` forgets exited processes: one whose exit waits in the ring
    // when a snapshot reads its counts is shown exited, with what the table
    // knew of it, and not brought back into the table by the labelling.
    let mut src = FakeSource::new(1);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "worker"));
    src.stats.insert(CHILD, faults(500, 0));
    let opts = SessionOptions { forget_exited: true, ..SessionOptions::new(Families::default()) };
    let mut s = session(src, opts);
    let t0 = s.started;
    s.step(t0 + ms(10));
    s.table.set_identity(CHILD, crate::model::Identity { cgroup: Some("/pod/a".into()), ..Default::default() });
    s.source.push(&exit(CHILD, 0, "worker"));
    let snap = s.live_snapshot(crate::collect::live::LiveScope::Running);
    let p = snap.processes.iter().find(|p| p.pid == CHILD).expect("its counts were read before the drain");
    assert!(p.exited);
    assert_eq!(p.comm.as_deref(), Some("worker"));
    assert_eq!(p.identity.as_deref().and_then(|i| i.cgroup.as_deref()), Some("/pod/a"));
    assert!(s.table.get(CHILD).is_none(), "forgotten, and not read back");
}

/// Live processes' settled stack keys sealed as the recording goes (the
/// fake's are all settled), counted again afterwards, and one of the
/// processes exiting and released: the end gives every process the same
/// counts and every folded line the same weight as without sealing.
#[test]
fn sealed_stacks_of_live_processes_give_the_same_end() {
    use crate::stacks::{flamegraph, weight::Weight};
    use vmtrace_common::{StackCounts, StackKey};
    const LATER: u32 = NO_SUCH_PID + 4;
    let run = |seal: bool| {
        let mut src = FakeSource::new(1);
        src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
        src.push(&task(EventKind::TaskFork, LATER, LATER, PARENT, "later"));
        src.stats.insert(CHILD, faults(64, 0));
        src.stats.insert(LATER, faults(32, 0));
        src.user_stacks.insert(5, vec![0x1000, 0x2000]);
        src.user_stacks.insert(6, vec![0x1000, 0x3000]);
        let key = |tgid, user_stack| StackKey { tgid, user_stack, kernel_stack: -1, ..StackKey::default() };
        let c = |n: u64| StackCounts { faults: n, timed: n, time_ns: 100 * n, cow: n / 2, ..Default::default() };
        for tgid in [CHILD, LATER] {
            src.stack_counts.push((key(tgid, 5), c(8)));
        }
        let families = Families { regions: true, ..Families::default() };
        let opts = SessionOptions {
            retire_exited: true,
            release_above: 0,
            stacks: Some((StackMode::User, 1)),
            stack_seal: (if seal { ms(100) } else { Duration::ZERO }, 0),
            ..SessionOptions::new(families)
        };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        s.step(t0 + ms(200));
        assert_eq!(s.source().stack_counts.is_empty(), seal, "sealed: taken out");
        // Counted again: the same key (afresh once sealed) and a new one.
        for tgid in [CHILD, LATER] {
            s.source_mut().stack_counts.push((key(tgid, 5), c(4)));
            s.source_mut().stack_counts.push((key(tgid, 6), c(2)));
        }
        s.source_mut().push(&exit(LATER, 0, "later"));
        s.step(t0 + ms(400));
        s.step(t0 + ms(5000));
        assert!(s.known(LATER).is_some_and(|p| p.released), "released");
        let f = finish_at(s, ms(6000));
        let procs: Vec<(u32, u64)> = f.summary.processes.iter().map(|p| (p.pid, p.faults.total)).collect();
        let lines: Vec<String> = [Weight::Faults, Weight::TimeNs, Weight::Cow]
            .into_iter()
            .flat_map(|w| flamegraph::folded_by_pid(&f.stacks, w))
            .map(|l| format!("{} {} {}", l.pid, l.line, l.weight))
            .collect();
        let st = f.summary.stacks.clone().unwrap();
        (procs, lines, st.sampled_faults, st.sealed_keys)
    };
    let (sealed, not) = (run(true), run(false));
    assert_eq!(sealed.0, not.0, "processes");
    assert_eq!(sealed.1, not.1, "folded lines");
    assert_eq!(sealed.2, not.2);
    assert_eq!(sealed.2, 2 * (8 + 4 + 2));
    assert_eq!((sealed.3, not.3), (4, 0), "keys sealed: 2, then the live one's 2");
    // Four fault lines, two COW lines (the fake's totals have no fault time).
    assert_eq!(sealed.1.len(), 6, "{:?}", sealed.1);
}

/// `top` builds the regions at every refresh once its command ended: each
/// build tells copies from reuses as the first does (uc32 bug 6: the second
/// took every COW fault for a copy, 38,164 pages of "Python objects" in a
/// parent whose `record` said 1,175).
#[test]
fn the_regions_built_again_tell_copies_from_reuses_as_the_first_time() {
    use vmtrace_common::{GranuleCounts, GranuleKey};
    let mut src = FakeSource { cow_copies: true, ..FakeSource::new(1) };
    src.stats.insert(PARENT, faults(16, 0));
    let g =
        GranuleCounts { faults: 16, write: 16, cow: 10, cow_copied: 2, touched: 0xffff, ..GranuleCounts::default() };
    src.granules.push((GranuleKey { tgid: PARENT, gen: 0, granule: 1 }, g));
    let families = Families { regions: true, ..Families::default() };
    let mut s = session(src, SessionOptions::new(families));
    let t0 = s.started;
    s.step(t0 + ms(10));
    let cow = |s: &mut Session<FakeSource>| {
        let rows = s.build_regions().regions;
        let c: Vec<_> = rows.iter().filter(|r| r.pid == PARENT).filter_map(|r| r.cow_from).collect();
        assert_eq!(c.len(), 1, "{rows:#?}");
        c[0]
    };
    let first = cow(&mut s);
    assert_eq!(first.reused, 8, "2 of the 10 copied: {first:?}");
    for _ in 0..2 {
        assert_eq!(cow(&mut s), first);
    }
}

/// A live process's unwound stacks (`NativeStacks`) go with their id's
/// drained stack: a sealed key's once the sealing lets its stack go, one
/// still held (here: not let go by the source) at the sweep that lets it
/// go; an id no key was sealed under keeps its stacks.
#[test]
fn sealed_keys_let_their_unwound_stacks_go_with_their_drained_stack() {
    use crate::stacks::native::NativeStack;
    use vmtrace_common::{StackCounts, StackKey};
    let mut src = FakeSource::new(1);
    src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
    src.stats.insert(CHILD, faults(24, 0));
    for id in [5, 6, 7] {
        src.user_stacks.insert(id, vec![0x1000, 0x2000 + id as u64]);
    }
    // The sealing lets 6 go; 5 stays (another key counts under it, say).
    src.let_go.insert(6);
    let key = |user_stack| StackKey { tgid: CHILD, user_stack, kernel_stack: -1, ..StackKey::default() };
    let c = StackCounts { faults: 8, timed: 8, time_ns: 800, ..Default::default() };
    src.stack_counts.extend([(key(5), c), (key(6), c)]);
    let opts = SessionOptions {
        stacks: Some((StackMode::User, 1)),
        stack_seal: (ms(100), 0),
        ..SessionOptions::new(Families::default())
    };
    let mut s = session(src, opts);
    for id in [5, 6, 7] {
        s.native.add_variant(CHILD, id, NativeStack { frames: vec![0x1000, 0x2000 + id as u64, 0x9000], cut: None }, 3);
    }
    assert_eq!(s.native.ids_held(), 3);
    let t0 = s.started;
    s.step(t0 + ms(10));
    s.step(t0 + ms(200));
    assert!(s.source().stack_counts.is_empty(), "both keys sealed");
    assert!(s.native.variants(CHILD, 6).is_empty(), "6's drained stack went, its unwound stacks too");
    assert_eq!(s.native.variants(CHILD, 5).len(), 1, "5's drained stack is held: its unwound stacks stay");
    assert_eq!(s.native.variants(CHILD, 7).len(), 1, "no key sealed under 7");
    assert_eq!(s.unwound_sealed.iter().copied().collect::<Vec<_>>(), vec![(CHILD, 5)], "5 waits");
    // A sweep lets 5 go.
    s.source_mut().let_go.insert(5);
    s.sweep_stacks(t0 + ms(300));
    assert!(s.native.variants(CHILD, 5).is_empty(), "swept: 5's unwound stacks went");
    assert!(s.unwound_sealed.is_empty());
    assert_eq!(s.native.ids_held(), 1, "7's");
    // Counted again under 6: unwound afresh from its new samples.
    s.native.add_variant(CHILD, 6, NativeStack { frames: vec![0x1000, 0x2006], cut: None }, 1);
    assert_eq!(s.native.variants(CHILD, 6).len(), 1);
}

/// Live processes' call sites whose calls and IPIs did not change between
/// two sealings are taken out of the kernel's map and sealed; one is called
/// again afterwards (a new key, from 0), one keeps being called, and one of
/// the processes exits and is released: the end gives the same mmap and
/// shootdown call-site lines, calls and IPIs as without sealing.
#[test]
fn sealed_call_sites_of_live_processes_give_the_same_sites() {
    const LATER: u32 = NO_SUCH_PID + 4;
    let site = |tgid, call: MmCall, user_stack| MmStackKey { tgid, call: call as u32, user_stack, _pad: 0 };
    // Calls added to a site: to its key while in the kernel's map, else a key afresh.
    let add = |sites: &mut Vec<(MmStackKey, MmStackCounts)>, k: MmStackKey, calls: u64, ipis: u64| match sites
        .iter_mut()
        .find(|(key, _)| *key == k)
    {
        Some((_, c)) => (c.calls, c.ipis) = (c.calls + calls, c.ipis + ipis),
        None => sites.push((k, MmStackCounts { calls, ipis })),
    };
    let run = |seal: bool| {
        let mut src = FakeSource::new(1);
        src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
        src.push(&task(EventKind::TaskFork, LATER, LATER, PARENT, "later"));
        src.stats.insert(CHILD, faults(64, 0));
        src.stats.insert(LATER, faults(32, 0));
        src.user_stacks.insert(5, vec![0x1000, 0x2000]);
        src.user_stacks.insert(6, vec![0x1000, 0x3000]);
        for tgid in [CHILD, LATER] {
            add(&mut src.mm_stacks, site(tgid, MmCall::Munmap, 5), 3, 2);
            add(&mut src.mm_stacks, site(tgid, MmCall::Mmap, 6), 7, 0);
        }
        let families = Families { regions: true, mmap: true, tlb: true, ..Families::default() };
        let opts = SessionOptions {
            retire_exited: true,
            release_above: 0,
            stacks: Some((StackMode::User, 1)),
            stack_seal: (if seal { ms(100) } else { Duration::ZERO }, 0),
            ..SessionOptions::new(families)
        };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        s.step(t0 + ms(200));
        // The mmap sites are called on: not settled.
        for tgid in [CHILD, LATER] {
            add(&mut s.source_mut().mm_stacks, site(tgid, MmCall::Mmap, 6), 1, 0);
        }
        s.step(t0 + ms(400));
        let munmap = MmCall::Munmap as u32;
        let left: Vec<u32> = s.source().mm_stacks.iter().map(|(k, _)| k.call).collect();
        assert_eq!(left.contains(&munmap), !seal, "settled munmap sites taken out when sealed: {left:?}");
        assert_eq!(left.iter().filter(|c| **c != munmap).count(), 2, "the mmap sites called on stay");
        // The munmap sites called again.
        for tgid in [CHILD, LATER] {
            add(&mut s.source_mut().mm_stacks, site(tgid, MmCall::Munmap, 5), 1, 5);
        }
        s.source_mut().push(&exit(LATER, 0, "later"));
        s.step(t0 + ms(600));
        s.step(t0 + ms(5000));
        assert!(s.known(LATER).is_some_and(|p| p.released), "released");
        let sealed = s.syms.sealed_sites_sizes();
        let f = finish_at(s, ms(6000));
        let mut by_site: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
        for m in &f.mm_sites {
            let e = by_site.entry(format!("{} {} {:?}", m.pid, m.comm, m.frames)).or_default();
            e.0 += m.calls;
            e.1 += m.ipis;
        }
        let lines: Vec<String> = by_site.into_iter().map(|(k, (calls, ipis))| format!("{k} {calls} {ipis}")).collect();
        let calls: Vec<(u32, u64)> = f.summary.processes.iter().map(|p| (p.pid, p.faults.total)).collect();
        (lines, calls, sealed)
    };
    let (sealed, not) = (run(true), run(false));
    assert_eq!(sealed.0, not.0, "call-site lines");
    assert_eq!(sealed.1, not.1, "processes");
    assert_eq!(sealed.0.len(), 4, "{:?}", sealed.0);
    assert!(sealed.0.iter().all(|l| l.ends_with(" 4 7") || l.ends_with(" 8 0")), "{:?}", sealed.0);
    assert!(sealed.2 .0 == 2 && sealed.2 .1 >= 2, "(processes, sites) sealed: {:?}", sealed.2);
    assert_eq!(not.2, (0, 0));
}

const PAGE: u64 = 4096;

fn page_sample(tgid: u32, addr: u64, stack: i32) -> vmtrace_common::PageSample {
    vmtrace_common::PageSample {
        hdr: vmtrace_common::EventHeader { kind: EventKind::PageSample as u32, size: 48, ts_ns: 1 },
        tgid,
        flags: 0,
        addr,
        user_stack: stack,
        kernel_stack: -1,
        cpu: 0,
        _pad: 0,
    }
}

fn rss_event(kind: EventKind, tgid: u32, pages: u64) -> vmtrace_common::RssEvent {
    let mut size = [0; 4];
    size[vmtrace_common::RSS_ANON] = pages * PAGE;
    let hdr = vmtrace_common::EventHeader { kind: kind as u32, size: 56, ts_ns: 3 };
    vmtrace_common::RssEvent { hdr, tgid, mm_id: 7, size }
}

fn madvise(tgid: u32, addr: u64, len: u64) -> vmtrace_common::MmEvent {
    crate::collect::fake::mm_change(tgid, MmCall::Madvise, addr, len)
}

/// Folded lines (pid, line, weight) of `stacks` by faults, sorted.
fn folded_lines(stacks: &[crate::stacks::Stack]) -> Vec<String> {
    use crate::stacks::{flamegraph, weight::Weight};
    let mut v: Vec<String> = flamegraph::folded_by_pid(stacks, Weight::Faults)
        .into_iter()
        .map(|l| format!("{} {} {}", l.pid, l.line, l.weight))
        .collect();
    v.sort();
    v
}

/// The resident pages (and the peak and end snapshots) of stacks whose
/// keys were sealed, in a live process and in one released, are made owner
/// shapes: no stack id is held for them any more, and the resident end
/// and peak profiles and each process's figures are the same as without
/// sealing, as are the fault lines.
#[test]
fn sealed_owners_of_resident_pages_give_the_same_resident_profiles() {
    use vmtrace_common::{RssMm, StackCounts, StackKey, RSS_ANON};
    const LATER: u32 = NO_SUCH_PID + 4;
    let run = |seal: bool| {
        let mut src = FakeSource::new(1);
        src.push(&task(EventKind::TaskFork, CHILD, CHILD, PARENT, "work"));
        src.push(&task(EventKind::TaskFork, LATER, LATER, PARENT, "later"));
        src.stats.insert(CHILD, faults(64, 0));
        src.stats.insert(LATER, faults(32, 0));
        src.user_stacks.insert(5, vec![0x1000, 0x2000]);
        src.user_stacks.insert(6, vec![0x1000, 0x3000]);
        let key = |tgid, user_stack| StackKey { tgid, user_stack, kernel_stack: -1, ..StackKey::default() };
        let counts = |n: u64| StackCounts { faults: n, timed: n, time_ns: 100 * n, ..Default::default() };
        for tgid in [CHILD, LATER] {
            src.stack_counts.push((key(tgid, 5), counts(8)));
            // 6 pages of stack 5, 2 of which are given back after the peak.
            for i in 0..6 {
                src.push(&page_sample(tgid, 0x10_0000 + i * PAGE, 5));
            }
            src.push(&rss_event(EventKind::ResidentPeak, tgid, 60));
        }
        let mut size = [0; 4];
        size[RSS_ANON] = 80 * PAGE;
        let mut peak_size = [0; 4];
        peak_size[RSS_ANON] = 90 * PAGE;
        src.rss.push((1, RssMm { tgid: CHILD, size, peak: 90 * PAGE, peak_size, ..RssMm::default() }));
        let families = Families { regions: true, resident: true, ..Families::default() };
        let opts = SessionOptions {
            retire_exited: true,
            release_above: 0,
            stacks: Some((StackMode::User, 1)),
            stack_seal: (if seal { ms(100) } else { Duration::ZERO }, 0),
            ..SessionOptions::new(families)
        };
        let mut s = session(src, opts);
        let t0 = s.started;
        s.step(t0 + ms(10));
        s.step(t0 + ms(200));
        let held = s.resident.as_ref().unwrap().stack_ids(|_| true);
        assert_eq!(held.contains(&5), !seal, "sealed: the pages hold no stack id");
        // Freed, counted again (the same stack, afresh once sealed, and a
        // new one) with pages of both.
        for tgid in [CHILD, LATER] {
            s.source_mut().push(&madvise(tgid, 0x10_0000, 2 * PAGE));
            s.source_mut().stack_counts.push((key(tgid, 5), counts(4)));
            s.source_mut().stack_counts.push((key(tgid, 6), counts(2)));
            s.source_mut().push(&page_sample(tgid, 0x20_0000, 5));
            s.source_mut().push(&page_sample(tgid, 0x20_0000 + PAGE, 6));
        }
        s.source_mut().push(&exit(LATER, 0, "later"));
        s.source_mut().push(&rss_event(EventKind::ResidentEnd, LATER, 40));
        s.step(t0 + ms(400));
        s.step(t0 + ms(5000));
        assert!(s.known(LATER).is_some_and(|p| p.released), "released");
        if seal {
            assert!(s.resident.as_ref().unwrap().stack_ids(|_| true).is_empty(), "every page is a shape's");
        }
        let finished = finish_at(s, ms(6000));
        let profiles = finished.resident.as_ref().expect("resident profiles");
        let figures: Vec<(u32, u64, u64)> =
            profiles.per_process.iter().map(|(p, x)| (*p, x.end_bytes, x.peak_bytes)).collect();
        (folded_lines(&profiles.end), folded_lines(&profiles.peak), figures, folded_lines(&finished.stacks))
    };
    let (sealed, not) = (run(true), run(false));
    assert_eq!(sealed.0, not.0, "resident end");
    assert_eq!(sealed.1, not.1, "resident peak");
    assert_eq!(sealed.2, not.2, "figures");
    assert_eq!(sealed.3, not.3, "fault lines");
    // Each process's end has stacks 5 and 6, its peak stack 5 alone.
    assert_eq!(sealed.0.len(), 4, "{:?}", sealed.0);
    assert_eq!(sealed.1.len(), 2, "{:?}", sealed.1);
    let sum = |v: &[String], pid: u32| -> u64 {
        v.iter()
            .filter(|l| l.starts_with(&format!("{pid} ")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    for (pid, end, peak) in &sealed.2 {
        assert_eq!(sum(&sealed.0, *pid), *end, "{pid}'s resident end adds up");
        assert_eq!(sum(&sealed.1, *pid), *peak, "{pid}'s peak adds up");
    }
}

/// An exited chain (rustc, cc, ld) retires in one pass; a parent of a live
/// process, or of an exited one that cannot retire yet, waits.
#[test]
fn an_exited_chain_retires_in_one_pass_and_parents_of_the_waiting_wait() {
    let now = std::time::Instant::now();
    let old = now.checked_sub(Duration::from_secs(2)).unwrap();
    // 10 -> 11 -> 12 exited together; 20 -> 21 with 21 still alive;
    // 30 -> 31 with 31 exited a moment ago; 40 -> 41 with 41 in flight.
    let parents: std::collections::HashMap<u32, u32> =
        [(11, 10), (12, 11), (21, 20), (31, 30), (41, 40)].into_iter().collect();
    let retiring = [(10, old), (11, old), (12, old), (20, old), (30, old), (31, now), (40, old), (41, old)];
    let in_flight: crate::hash::HashSet<u32> = [41].into_iter().collect();
    let needed = super::still_needed([21].into_iter(), &retiring, now, &in_flight, |p| parents.get(&p).copied());
    let mut needed: Vec<u32> = needed.into_iter().collect();
    needed.sort_unstable();
    assert_eq!(needed, [20, 30, 40]);
}
