//! Each rule on hand-built models: firing on the numbers the real programs
//! gave (tests/findings.rs), and silent on controls just past a threshold.
use std::collections::BTreeMap;

use super::*;
use crate::model::{
    CowFrom, Drops, Faults, FileSummary, KernelAccounting, MmapCounts, OomRecord, Reclaim, RegionSummary, ResidentSite,
    ResidentSummary, Sampling, Storm, TargetInfo, SUMMARY_VERSION,
};

fn faults(total: u64, major: u64, time_ns: u64) -> Faults {
    Faults {
        total,
        minor: total - major,
        major,
        time_ns,
        major_time_ns: if major > 0 { time_ns } else { 0 },
        ..Default::default()
    }
}

fn process(pid: u32, ppid: u32, comm: &str, total: u64) -> Process {
    Process {
        pid,
        ppid: Some(ppid),
        comm: comm.into(),
        cmdline: None,
        exit_code: Some(0),
        faults: faults(total, 0, total * 1000),
        reclaim: Reclaim::default(),
        migration: crate::model::Migration::default(),
        mmap: Some(MmapCounts { mmap: 8, brk: 3, ..Default::default() }),
        tlb: None,
        kernel_accounting: Some(KernelAccounting { minor: total, major: 0 }),
        cow_from: None,
        folded: 0,
        folded_comms: BTreeMap::new(),
        resident: None,
        identity: crate::model::Identity::default(),
    }
}

fn region(pid: u32, kind: RegionKind, perms: &str, path: Option<&str>, f: Faults, pages: u64) -> RegionSummary {
    RegionSummary {
        pid,
        start: "0x1000".into(),
        end: "0x100000".into(),
        perms: perms.into(),
        kind,
        path: path.map(Into::into),
        offset: 0,
        faults: f,
        pages_touched: pages,
        cow_from: None,
        folded: 0,
    }
}

fn summary(processes: Vec<Process>) -> Summary {
    Summary {
        version: SUMMARY_VERSION,
        target: TargetInfo {
            kind: crate::model::TargetKind::Command,
            command: Some(vec!["x".into()]),
            pid: Some(100),
            exit_status: Some(0),
        },
        duration_s: 1.0,
        lost_events: 0,
        processes,
        totals: Faults::default(),
        sampling: Sampling::plain(1, false),
        drops: Drops::default(),
        probes: Vec::new(),
        program_stats: None,
        kernel: "6.18".into(),
        vmtrace_version: "test".into(),
        perf: None,
        oom: Some(Vec::new()),
        regions: Some(Vec::new()),
        region_placement: None,
        files: Some(Vec::new()),
        timeline: None,
        storms: Some(Vec::new()),
        stacks: None,
        folding: None,
        resident: None,
        findings: None,
        thp_anon_mode: None,
        code_locations: None,
        pinned: None,
        numa: None,
    }
}

fn kinds(s: &Summary) -> Vec<String> {
    diagnose(s).into_iter().map(|f| f.kind).collect()
}

/// The heap-trim C program as vmtrace recorded it: 601,688 faults, 598,721
/// and 2,912 of them in two [heap] rows of 33 and 1,488 pages, 13,203 brk
/// of which `trims` moved the break down.
fn heap_trim_summary(heap_faults: u64, heap_pages: u64, brk: u64, trims: u64) -> Summary {
    let mut p = process(100, 1, "heap_trim", heap_faults + 100);
    let m = p.mmap.as_mut().unwrap();
    (m.brk, m.brk_shrinks) = (brk, trims);
    let mut s = summary(vec![p]);
    let heap = s.regions.as_mut().unwrap();
    let first = heap_faults * 99 / 100;
    heap.push(region(100, RegionKind::Heap, "rw-p", Some("[heap]"), faults(first, 0, first * 900), heap_pages / 50));
    let rest = heap_faults - first;
    heap.push(region(
        100,
        RegionKind::Heap,
        "rw-p",
        Some("[heap]"),
        faults(rest, 0, rest * 900),
        heap_pages - heap_pages / 50,
    ));
    heap.push(region(100, RegionKind::Anon, "rw-p", None, faults(100, 0, 100), 100));
    s
}

#[test]
fn heap_trim_fires_on_refaults_with_brk() {
    let s = heap_trim_summary(601_588, 1_521, 13_203, 400);
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    let f = &f[0];
    assert_eq!((f.kind.as_str(), f.pid, f.process.as_str()), ("heap_trim_refault", 100, "heap_trim (pid 100)"));
    assert_eq!(f.evidence["heap_faults"], 601_588);
    assert_eq!(f.evidence["heap_pages_touched"], 1_521);
    assert_eq!(f.evidence["brk_calls"], 13_203);
    assert_eq!(f.evidence["heap_trims"], 400);
    assert!(
        f.summary.contains("trimmed 400 times (brk moved the break down; 13203 brk calls in all)"),
        "{}",
        f.summary
    );
    // 2 × 1,521 pages is 12 MiB: the floor of 64 MiB is suggested.
    assert!(f.fix.contains("MALLOC_TRIM_THRESHOLD_=67108864 MALLOC_TOP_PAD_=67108864"), "{}", f.fix);
    let gain = f.expected_gain.as_deref().unwrap();
    assert!(gain.starts_with("up to 600067 fewer faults (99.7%"), "{gain}");
}

#[test]
fn heap_trim_by_the_programs_own_malloc_trim_asks_for_fewer_calls() {
    // 100 trims, 116 brk calls under malloc_trim (its stacks): the
    // threshold is no fix; the call is.
    let mut s = heap_trim_summary(601_588, 1_521, 13_203, 100);
    s.processes[0].mmap.as_mut().unwrap().brk_in_malloc_trim = 116;
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].evidence["brk_in_malloc_trim"], 116);
    assert!(f[0].summary.contains("the program's own malloc_trim() calls"), "{}", f[0].summary);
    assert!(f[0].fix.starts_with("Call malloc_trim() less often"), "{}", f[0].fix);
    assert!(f[0].fix.contains("malloc_trim(67108864)"), "{}", f[0].fix);
    assert!(!f[0].fix.contains("MALLOC_TRIM_THRESHOLD_="), "{}", f[0].fix);
    // A few explicit calls among glibc's own trims: the threshold is the fix.
    s.processes[0].mmap.as_mut().unwrap().brk_in_malloc_trim = 10;
    let f = diagnose(&s);
    assert!(f[0].fix.starts_with("Keep the heap"), "{}", f[0].fix);
}

#[test]
fn heap_trim_suggests_twice_a_large_heap() {
    // 100,000 pages (390 MiB) touched: 2× rounded up to a power of two, 1 GiB.
    let s = heap_trim_summary(1_000_000, 100_000, 5_000, 400);
    let f = diagnose(&s);
    assert!(f[0].fix.contains("MALLOC_TRIM_THRESHOLD_=1073741824"), "{}", f[0].fix);
}

#[test]
fn heap_trim_is_silent_on_its_controls() {
    // First touch: one fault per page.
    assert!(kinds(&heap_trim_summary(200_000, 200_000, 5_000, 400)).is_empty());
    // Just under 8 faults a page.
    assert!(kinds(&heap_trim_summary(79_000, 10_000, 5_000, 400)).is_empty());
    // Refaults without trims (madvise, or a heap that only grows, however
    // many brk calls it made): not this rule.
    assert!(kinds(&heap_trim_summary(601_588, 1_521, 13_203, HEAP_MIN_TRIMS - 1)).is_empty());
    // Too few faults to matter.
    assert!(kinds(&heap_trim_summary(HEAP_MIN_FAULTS - 1, 100, 5_000, 400)).is_empty());
}

/// A Python parent and two forked workers, as the objects script gave them:
/// 22,178 / 20,408 / 20,408 COW faults in the arenas.
fn python_fork(worker_objects: u64) -> Summary {
    let mut parent = process(100, 1, "python", 46_292);
    parent.cow_from = Some(CowFrom { fork: 22_326, python_objects: 22_178, ..Default::default() });
    let mut ws = Vec::new();
    for pid in [101, 102] {
        let mut w = process(pid, 100, "python", 20_483);
        w.cow_from = Some(CowFrom { fork: 20_427, python_objects: worker_objects, ..Default::default() });
        ws.push(w);
    }
    let mut all = vec![parent];
    all.extend(ws);
    summary(all)
}

/// The process tables tell workers apart the way the findings name them:
/// their command line is their parent's, so it says nothing.
#[test]
fn process_tables_name_workers_as_the_findings_do() {
    let mut s = python_fork(20_408);
    for p in &mut s.processes {
        p.cmdline = Some("/usr/bin/python train.py --workers 2".into());
    }
    let text = crate::report::text::render(&s);
    let row = |pid: &str| text.lines().find(|l| l.trim_start().starts_with(pid)).unwrap_or_default().to_string();
    assert!(row("100 ").ends_with("python train.py --workers 2"), "{text}");
    assert!(row("101 ").ends_with("worker 0 of 100"), "{text}");
    assert!(row("102 ").ends_with("worker 1 of 100"), "{text}");
    let html = crate::report::html::render(&s, std::path::Path::new("/nonexistent"));
    assert!(html.contains("worker 1 of 100"), "report.html names the worker");
}

/// uc30's k1: a rank-2 `python3 job.py` forks a worker (no exec: its
/// command line is the parent's, even renamed by prctl) and spawns a
/// `python3 -c …` with RANK=6 (fork + exec: a command line of its own).
/// Only the first is a worker; the exec'd one was "worker 1 of 4418".
#[test]
fn an_execd_child_of_the_same_name_is_no_worker() {
    let job = "python3 job.py --rank 2";
    let mut parent = process(4418, 1, "python3", 1_000);
    parent.cmdline = Some(job.into());
    let mut forked = process(4420, 4418, "pt_data_worker", 500);
    forked.cmdline = Some(job.into());
    let mut execd = process(4421, 4418, "python3", 500);
    execd.cmdline = Some("python3 -c import time; time.sleep(1)".into());
    let mut forked2 = process(4422, 4418, "python3", 500);
    forked2.cmdline = Some(job.into());
    // Command lines unknown (a summary of a process read too late): the name decides.
    let mut unknown = process(4423, 4418, "python3", 500);
    unknown.cmdline = None;
    let s = summary(vec![parent, forked, execd, forked2, unknown]);
    let label = |pid| super::process_label(&s, pid);
    assert_eq!(label(4420), "worker 0 of 4418 (pt_data_worker, pid 4420)");
    assert_eq!(label(4421), "python3 (pid 4421)");
    assert_eq!(label(4422), "worker 1 of 4418 (python3, pid 4422)");
    assert_eq!(label(4423), "worker 2 of 4418 (python3, pid 4423)");
    let text = crate::report::text::render(&s);
    let row = |pid: &str| text.lines().find(|l| l.trim_start().starts_with(pid)).unwrap_or_default().to_string();
    assert!(row("4421 ").ends_with("python3 -c import time; time.sleep(1)"), "{text}");
    assert!(row("4422 ").ends_with("worker 1 of 4418"), "{text}");
}

#[test]
fn fork_cow_python_objects_fires_per_process_and_names_workers() {
    let f = diagnose(&python_fork(20_408));
    let got: Vec<(&str, &str)> = f.iter().map(|f| (f.kind.as_str(), f.process.as_str())).collect();
    assert_eq!(
        got,
        [
            ("fork_cow_python_objects", "python (pid 100)"),
            ("fork_cow_python_objects", "worker 0 of 100 (python, pid 101)"),
            ("fork_cow_python_objects", "worker 1 of 100 (python, pid 102)"),
        ]
    );
    assert_eq!(f[1].evidence["cow_python_objects"], 20_408);
    assert!(f[1].fix.contains("gc.freeze()"));
    assert!(f[1].expected_gain.as_deref().unwrap().contains("79.7 MiB"), "{:?}", f[1].expected_gain);
    // The parent's copies are the other side of its workers': their fix,
    // pointed to, not said again.
    assert!(f[0].summary.contains("it shares with its forked workers"), "{:?}", f[0].summary);
    assert!(f[0].fix.starts_with("The fix of its workers' findings") && !f[0].fix.contains("Arrow"), "{}", f[0].fix);
}

#[test]
fn fork_cow_python_objects_is_silent_under_its_threshold_and_without_a_fork() {
    let s = python_fork(FORK_COW_PYTHON_MIN_PAGES - 1);
    // The workers copied more pages than the threshold, but not of Python
    // objects: the generic rule names them; the parent still has its own.
    let f = diagnose(&s);
    let got: Vec<&str> = f.iter().map(|f| f.kind.as_str()).collect();
    assert_eq!(got, ["fork_cow_python_objects", "fork_cow", "fork_cow"]);
    // A process that forked nothing and is no worker.
    let mut alone = process(100, 1, "python", 46_292);
    alone.cow_from = Some(CowFrom { python_objects: 22_178, ..Default::default() });
    assert!(kinds(&summary(vec![alone])).is_empty());
}

#[test]
fn fork_cow_fires_on_a_worker_writing_shared_pages() {
    // The demo's cow-refcount: each worker 16,404 fork copies of 16,437 faults.
    let mut parent = process(100, 1, "cow", 16_618);
    parent.cow_from = Some(CowFrom { fork: 31, ..Default::default() });
    let mut w = process(101, 100, "cow", 16_437);
    w.cow_from = Some(CowFrom { fork: 16_404, ..Default::default() });
    let f = diagnose(&summary(vec![parent.clone(), w.clone()]));
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind.as_str(), f[0].pid), ("fork_cow", 101));
    assert_eq!(f[0].evidence["copied_bytes"], 16_404 * 4096);
    // Controls: copies under half its faults; a child that ran another program.
    w.faults.total = 40_000;
    assert!(kinds(&summary(vec![parent.clone(), w.clone()])).is_empty());
    w.faults.total = 16_437;
    w.comm = "sort".into();
    assert!(kinds(&summary(vec![parent, w])).is_empty());
}

fn storm(pid: u32, call: &str, ipis: u64, start_s: f64) -> Storm {
    Storm {
        pid,
        comm: "churn".into(),
        start_s,
        end_s: start_s + 0.25,
        peak_per_s: ipis * 4,
        shootdowns: ipis,
        top_stack: vec!["main".into(), "churn_loop".into(), "unmap_one".into(), format!("[{call}]")],
        top_call: call.into(),
        top_share: 1.0,
        malloc_settings: std::collections::BTreeMap::new(),
    }
}

#[test]
fn storms_of_one_process_are_one_finding_with_the_munmap_size() {
    // The churn workload: 20,005 munmap of 1,377,891,351 bytes (68.9 KiB each).
    let mut p = process(100, 1, "churn", 40_000);
    let m = p.mmap.as_mut().unwrap();
    (m.munmap, m.munmap_bytes) = (20_005, 1_377_891_351);
    let mut s = summary(vec![p]);
    s.storms = Some(vec![storm(100, "munmap", 228, 0.3), storm(100, "munmap", 368, 0.9)]);
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    let f = &f[0];
    assert_eq!(f.kind, "shootdown_storm");
    assert_eq!((f.evidence["storms"].clone(), f.evidence["storm_ipis"].clone()), (2.into(), 596.into()));
    assert!(f.summary.contains("munmap calls of 67 KiB"), "{}", f.summary);
    // 2 × 67 KiB is under twice glibc's default: 256 KiB.
    assert!(f.fix.contains("MALLOC_MMAP_THRESHOLD_=262144"), "{}", f.fix);
    assert_eq!(f.site.as_deref(), Some("churn_loop ← unmap_one ← [munmap]"));
}

#[test]
fn a_storm_driven_by_a_low_mmap_threshold_in_the_environment_names_the_setting() {
    // numpy temporaries of 312.5 KiB under MALLOC_MMAP_THRESHOLD_=131072.
    let mut p = process(100, 1, "python3", 40_000);
    let m = p.mmap.as_mut().unwrap();
    (m.munmap, m.munmap_bytes) = (16_000, 16_000 * 320_000);
    let mut s = summary(vec![p]);
    let mut st = storm(100, "munmap", 900, 0.3);
    st.malloc_settings.insert("MALLOC_MMAP_THRESHOLD_".into(), "131072".into());
    s.storms = Some(vec![st.clone()]);
    let f = &diagnose(&s)[0];
    assert_eq!(f.evidence["malloc_setting"], "MALLOC_MMAP_THRESHOLD_=131072", "{f:#?}");
    assert!(f.summary.contains("because its environment sets MALLOC_MMAP_THRESHOLD_=131072"), "{}", f.summary);
    assert!(f.fix.contains("remove MALLOC_MMAP_THRESHOLD_=131072 from its environment"), "{}", f.fix);
    assert!(f.fix.contains("MALLOC_MMAP_THRESHOLD_=1048576"), "{}", f.fix);
    // A threshold above the blocks unmapped did not map them: not named.
    st.malloc_settings.insert("MALLOC_MMAP_THRESHOLD_".into(), "4194304".into());
    s.storms = Some(vec![st]);
    let f = &diagnose(&s)[0];
    assert!(!f.evidence.contains_key("malloc_setting"), "{f:#?}");
    assert!(!f.summary.contains("environment"), "{}", f.summary);
}

#[test]
fn storms_from_madvise_name_the_advice_and_no_storm_is_silent() {
    let mut p = process(100, 1, "jemalloc", 40_000);
    let m = p.mmap.as_mut().unwrap();
    m.madvise = 9_000;
    m.madvise_by_advice.insert("dontneed".into(), 9_000);
    let mut s = summary(vec![p]);
    assert!(kinds(&s).is_empty(), "no storm, no finding");
    s.storms = Some(vec![storm(100, "madvise", 900, 0.3)]);
    let f = diagnose(&s);
    assert!(f[0].summary.contains("dontneed 9000"), "{}", f[0].summary);
    assert!(f[0].fix.contains("dirty_decay_ms"), "{}", f[0].fix);
    // Not traced (`--events` without tlb): no section, no finding.
    s.storms = None;
    assert!(kinds(&s).is_empty());
}

fn file(total: u64, major: u64, added: u64, readahead: u64, from_disk: u64) -> FileSummary {
    FileSummary {
        path: "/data/ckpt.bin".into(),
        faults: faults(total, major, major * 145_000),
        pages_touched: total,
        page_cache_added: added,
        page_cache_written: 0,
        readahead_pages: readahead,
        cold_fraction: major as f64 / total.max(1) as f64,
        file_bytes: 256 << 20,
        from_disk_bytes: from_disk,
        tensors: Vec::new(),
    }
}

fn file_summary(f: FileSummary) -> Summary {
    let mut p = process(100, 1, "loader", f.faults.total + 100);
    p.mmap.as_mut().unwrap().madvise_by_advice.insert("random".into(), 1);
    let mut s = summary(vec![p]);
    let r = region(100, RegionKind::File, "r--s", Some("/data/ckpt.bin"), f.faults.clone(), f.pages_touched);
    s.regions.as_mut().unwrap().push(r);
    s.files.as_mut().unwrap().push(f);
    s
}

#[test]
fn a_cold_random_read_fires_with_the_majors_it_could_save() {
    // A cold read of every 4th page of 256 MiB with MADV_RANDOM: 16,384 majors, 16,384 pages added.
    let s = file_summary(file(16_384, 16_384, 16_384, 0, 64 << 20));
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind.as_str(), f[0].pid), ("cold_file_random_reads", 100));
    assert_eq!(f[0].evidence["pages_per_major"], 1.0);
    assert!(f[0].fix.contains("drop MADV_RANDOM"), "{}", f[0].fix);
    let gain = f[0].expected_gain.as_deref().unwrap();
    assert!(gain.contains("about 512 waits instead of 16384"), "{gain}");
}

#[test]
fn sequential_and_warm_reads_are_silent() {
    // Cold sequential (readahead ahead of it): 1 major of 532 faults.
    assert!(kinds(&file_summary(file(532, 1, 65_536, 65_535, 256 << 20))).is_empty());
    // Warm: no major.
    assert!(kinds(&file_summary(file(532, 0, 0, 0, 0))).is_empty());
    // Few majors, even if all of them.
    assert!(kinds(&file_summary(file(FILE_MIN_MAJORS - 1, FILE_MIN_MAJORS - 1, 255, 0, 1 << 20))).is_empty());
    // Many majors, under a quarter of the faults.
    assert!(kinds(&file_summary(file(4_000, 999, 32_000, 31_000, 128 << 20))).is_empty());
}

/// A library read cold at random (its text mapped executable, its data
/// read-only) is code: no read-ahead advice for it.
#[test]
fn a_file_mapped_executable_is_no_cold_data_file() {
    let mut s = file_summary(file(16_384, 16_384, 16_384, 0, 64 << 20));
    let text = region(100, RegionKind::File, "r-xp", Some("/data/ckpt.bin"), faults(10, 0, 10), 10);
    s.regions.as_mut().unwrap().push(text);
    assert!(!kinds(&s).contains(&"cold_file_random_reads".to_string()), "{:#?}", diagnose(&s));
}

#[test]
fn code_majors_fire_on_executable_mappings_only() {
    let mut p = process(100, 1, "server", 10_000);
    p.reclaim = Reclaim { stalls: 40, time_ns: 80_000_000 };
    let mut s = summary(vec![p]);
    let r = s.regions.as_mut().unwrap();
    r.push(region(100, RegionKind::File, "r-xp", Some("/usr/lib/libtorch.so"), faults(900, 70, 70_000_000), 900));
    r.push(region(100, RegionKind::File, "r--p", Some("/data/table"), faults(900, 500, 70_000_000), 900));
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, "code_major_faults");
    assert_eq!(f[0].evidence["code_major_faults"], 70);
    assert!(f[0].summary.contains("libtorch.so 70") && f[0].summary.contains("stalled 40 times"), "{}", f[0].summary);
    // A cold start: each code page read once, no reclaim stall.
    s.processes[0].reclaim = Reclaim::default();
    assert!(kinds(&s).is_empty(), "{:#?}", diagnose(&s));
    // The same pages read back (70 majors on 40 pages) is pressure, stall or not.
    s.regions.as_mut().unwrap()[0].pages_touched = 40;
    assert_eq!(kinds(&s), ["code_major_faults"]);
    // Under the threshold.
    s.regions.as_mut().unwrap()[0].faults.major = CODE_MIN_MAJORS - 1;
    assert!(kinds(&s).is_empty());
}

#[test]
fn an_oom_kill_names_the_limit_and_what_grew() {
    let mut s = summary(vec![process(100, 1, "oom-hog", 70_000)]);
    s.oom = Some(vec![OomRecord {
        unknown: Vec::new(),
        victim_pid: 100,
        victim_comm: "oom-hog".into(),
        trigger_pid: 100,
        trigger_comm: "oom-hog".into(),
        constraint: "memcg".into(),
        constraint_source: "kernel".into(),
        victim_cgroup_source: Some("kernel".into()),
        cgroup: Some("/vmtrace-demo".into()),
        cgroup_limit_bytes: Some(256 << 20),
        cgroup_peak_bytes: Some(256 << 20),
        total_vm_kb: 300_000,
        anon_rss_kb: 255_000,
        file_rss_kb: 1_000,
        shmem_rss_kb: 0,
        pgtables_kb: 600,
        oom_score_adj: 0,
        uid: 0,
        in_target: true,
        time_s: 1.5,
        top_regions: None,
        fault_rate_per_s: None,
        victim_faults: None,
        victim_reclaim_stalls: None,
        victim_reclaim_ns: None,
        resident_sites: Some(vec![ResidentSite {
            pid: 100,
            comm: "oom-hog".into(),
            frames: vec!["main".into(), "grow".into(), "[anon]".into()],
            bytes: 250 << 20,
            sampled_pages: 900,
        }]),
    }]);
    let f = diagnose(&s);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, "oom_kill");
    assert!(f[0].summary.contains("limit of 256.0 MiB; main ← grow ← [anon] held 250.0 MiB"), "{}", f[0].summary);
    assert!(f[0].fix.contains("memory.max"), "{}", f[0].fix);
    assert_eq!(f[0].evidence["cgroup_limit_bytes"], 256 << 20);
    // A kill outside the trace (another program's cgroup): not this recording's.
    s.oom.as_mut().unwrap()[0].in_target = false;
    assert!(kinds(&s).is_empty());
    // No kill, no finding.
    s.oom = Some(Vec::new());
    assert!(kinds(&s).is_empty());
}

fn resident_summary(top: u64, next: u64) -> Summary {
    let mut s = summary(vec![process(100, 1, "trainer", 1_000)]);
    let site = |frames: &[&str], bytes| ResidentSite {
        pid: 100,
        comm: "trainer".into(),
        frames: frames.iter().map(ToString::to_string).collect(),
        bytes,
        sampled_pages: 500,
    };
    s.resident = Some(ResidentSummary {
        top_at_peak: vec![site(&["main", "load_all"], top), site(&["main", "step"], next)],
        ..Default::default()
    });
    s
}

#[test]
fn one_call_site_far_above_the_others_fires() {
    let f = diagnose(&resident_summary(2 << 30, 100 << 20));
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!((f[0].kind.as_str(), f[0].site.as_deref()), ("resident_site_dominant", Some("main ← load_all")));
    assert!(f[0].summary.contains("20×"), "{}", f[0].summary);
    // Controls: under 4× the next one; under 1 GiB (a first touch of 128
    // MiB, a warm 64 MiB mapping: one site holds it all, and that is fine).
    assert!(kinds(&resident_summary(2 << 30, 600 << 20)).is_empty());
    assert!(kinds(&resident_summary((1 << 30) - 1, 1 << 20)).is_empty());
    // Not the other row (its peak sums many processes' peaks), and not the
    // bytes no sampled page stood for (no call site).
    let mut other = resident_summary(2 << 30, 100 << 20);
    other.resident.as_mut().unwrap().top_at_peak.iter_mut().for_each(|site| site.pid = 0);
    assert!(kinds(&other).is_empty());
    let mut unsampled = resident_summary(2 << 30, 100 << 20);
    let top = &mut unsampled.resident.as_mut().unwrap().top_at_peak[0];
    (top.frames, top.sampled_pages) = (vec!["[no page sampled]".into()], 0);
    assert!(kinds(&unsampled).is_empty());
}

#[test]
fn an_empty_recording_has_no_finding_and_says_so() {
    let s = summary(vec![process(100, 1, "sort", 85)]);
    assert!(diagnose(&s).is_empty());
    assert!(render_text(&[]).starts_with("Findings: none"));
}

#[test]
fn findings_round_trip_through_json() {
    let mut s = heap_trim_summary(601_588, 1_521, 13_203, 400);
    s.findings = Some(diagnose(&s));
    let text = serde_json::to_string(&s).unwrap();
    assert!(text.contains(r#""findings":[{"kind":"heap_trim_refault","pid":100"#), "{text}");
    let back: Summary = serde_json::from_str(&text).unwrap();
    assert_eq!(back, s);
    let shown = render_text(s.findings.as_ref().unwrap());
    assert!(shown.starts_with("Findings (1):\n1. [heap_trim_refault] heap_trim (pid 100): The heap took"), "{shown}");
}

fn thp_summary(mode: &str, advice: Option<&str>, touched: u64, huge: u64) -> Summary {
    let mut p = process(100, 1, "alloc", touched + 50);
    if let Some(a) = advice {
        p.mmap.as_mut().unwrap().madvise_by_advice.insert(a.into(), 1);
    }
    let mut s = summary(vec![p]);
    s.thp_anon_mode = Some(mode.into());
    let mut f = faults(touched, 0, touched * 1_500);
    f.huge = Some(huge);
    let mut r = region(100, RegionKind::Anon, "rw-p", None, f, touched);
    r.end = format!("{:#x}", 0x1000 + touched * 4096);
    s.regions.as_mut().unwrap().push(r);
    s
}

#[test]
fn large_buffers_in_4k_pages_fire_where_thp_is_madvise() {
    // 256 MiB malloc'd and written: 65,536 faults, none huge.
    let f = diagnose(&thp_summary("madvise", None, 65_536, 0));
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, "huge_pages_unused");
    assert_eq!(f[0].evidence["anon_bytes_touched"], 256 << 20);
    assert!(f[0].fix.contains("MADV_HUGEPAGE"), "{}", f[0].fix);
    assert!(f[0].expected_gain.as_deref().unwrap().starts_with("about 128 faults instead of 65536"));
    // Controls: THP always (the kernel does it) or never; advised either
    // way; got huge pages; under 64 MiB.
    assert!(kinds(&thp_summary("always", None, 65_536, 0)).is_empty());
    assert!(kinds(&thp_summary("never", None, 65_536, 0)).is_empty());
    assert!(kinds(&thp_summary("madvise", Some("nohugepage"), 65_536, 0)).is_empty());
    assert!(kinds(&thp_summary("madvise", Some("hugepage"), 65_536, 0)).is_empty());
    assert!(kinds(&thp_summary("madvise", None, 65_536, 128)).is_empty());
    assert!(kinds(&thp_summary("madvise", None, 16_383, 0)).is_empty());
    let mut unknown = thp_summary("madvise", None, 65_536, 0);
    unknown.thp_anon_mode = None;
    assert!(kinds(&unknown).is_empty(), "older summaries do not say the mode");
}

#[test]
fn a_workers_copies_at_its_parents_arena_addresses_count_as_python_objects() {
    // As recorded: the workers' rows at the parent's arenas came out "anon"
    // (python_objects 413), their 20,007 fork copies there.
    let mut s = python_fork(413);
    let arena = |pid, start: u64| {
        let mut r = region(pid, RegionKind::PythonArena, "rw-p", Some("[python arena]"), faults(256, 0, 1), 256);
        (r.start, r.end) = (format!("{start:#x}"), format!("{:#x}", start + (1 << 20)));
        r
    };
    let regions = s.regions.as_mut().unwrap();
    for i in 0..80u64 {
        regions.push(arena(100, 0x7f00_0000_0000 + i * (1 << 20)));
    }
    for pid in [101, 102] {
        let mut r = region(pid, RegionKind::Anon, "rw-p", None, faults(20_008, 0, 1), 20_008);
        (r.start, r.end) = ("0x7f0000000000".into(), "0x7f0008000000".into());
        r.faults.cow = 20_007;
        r.cow_from = Some(CowFrom { fork: 20_007, ..Default::default() });
        regions.push(r);
    }
    let f = diagnose(&s);
    let got: Vec<(&str, u32)> = f.iter().map(|f| (f.kind.as_str(), f.pid)).collect();
    assert_eq!(
        got,
        [("fork_cow_python_objects", 100), ("fork_cow_python_objects", 101), ("fork_cow_python_objects", 102)]
    );
    // At most the 80 arenas' 20,480 pages overlapped: all 20,007 copies.
    assert_eq!(f[1].evidence["cow_in_parent_arenas"], 20_007);
    assert_eq!(f[1].evidence["cow_python_objects"], 20_007);
}

fn pinned_summary(locked: u64, rss: u64) -> Summary {
    let mut s = summary(vec![process(40, 1, "trainer", 100)]);
    s.pinned = Some(crate::model::Pinned {
        processes: vec![crate::model::PinnedProcess {
            pid: 40,
            comm: "trainer".into(),
            locked_bytes_peak: locked,
            locked_bytes_last: locked,
            rss_bytes_at_peak: Some(rss),
            ..Default::default()
        }],
        sites: vec![crate::model::LockSite {
            pid: 40,
            comm: "trainer".into(),
            call: "mlock".into(),
            calls: 1,
            bytes: locked,
            failed: 0,
            frames: vec!["main".into(), "make_pool".into(), "[mlock]".into()],
        }],
        failures: vec![],
        machine: None,
    });
    s
}

#[test]
fn pinned_pool_fires_past_both_thresholds_only() {
    let mib = 1u64 << 20;
    // 512 MiB locked, 64 MiB else: 8×.
    let s = pinned_summary(512 * mib, 576 * mib);
    let f = diagnose(&s);
    let p = f.iter().find(|f| f.kind == "pinned_pool_oversized").expect("fires");
    assert_eq!(p.evidence["rest_bytes"], 64 * mib);
    assert!(p.site.as_deref().is_some_and(|x| x.contains("make_pool")), "{p:?}");
    // 4× exactly fires; under it, or under 64 MiB, silent.
    assert!(kinds(&pinned_summary(256 * mib, 320 * mib)).contains(&"pinned_pool_oversized".to_string()));
    assert!(!kinds(&pinned_summary(256 * mib, 384 * mib)).contains(&"pinned_pool_oversized".to_string()));
    assert!(!kinds(&pinned_summary(PINNED_MIN_BYTES - mib, PINNED_MIN_BYTES))
        .contains(&"pinned_pool_oversized".to_string()));
}

#[test]
fn memlock_limit_fires_once_per_process() {
    let mut s = pinned_summary(0, 0);
    let fail = crate::model::LockFailure {
        pid: 40,
        comm: "trainer".into(),
        call: "mlock".into(),
        errno: "ENOMEM".into(),
        bytes_asked: 1 << 20,
        limit_soft_bytes: Some(64 << 10),
        limit_hard_bytes: Some(64 << 10),
        rlimit_memlock: true,
        cause: "trainer (pid 40) mlock of 1.0 MiB failed with ENOMEM: over RLIMIT_MEMLOCK 64 KiB".into(),
        fix: "`ulimit -l 1024`".into(),
        ..Default::default()
    };
    let p = s.pinned.as_mut().unwrap();
    p.failures = vec![fail.clone(), fail.clone(), crate::model::LockFailure { rlimit_memlock: false, ..fail }];
    let f: Vec<Finding> = diagnose(&s).into_iter().filter(|f| f.kind == "memlock_limit").collect();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].evidence["refused"], 2);
    assert!(f[0].summary.contains("RLIMIT_MEMLOCK 64 KiB") && f[0].fix.contains("ulimit -l"), "{:?}", f[0]);
    // Named once, by the finding: not again in its summary.
    assert!(f[0].summary.starts_with("Mlock of 1.0 MiB failed") && !f[0].summary.contains("pid 40"), "{:?}", f[0]);
}

fn numa_summary(sampled: u64, remote: u64) -> Summary {
    let mut s = summary(vec![process(41, 1, "loader", 100)]);
    s.numa = Some(crate::model::Numa {
        nodes: 2,
        processes: vec![crate::model::NumaProcess {
            pid: 41,
            comm: "loader".into(),
            sampled_pages: sampled,
            remote_first_touch: remote,
            sampled_by_node: [("1".to_string(), sampled)].into_iter().collect(),
            faulting_cpu_node: [("0".to_string(), sampled)].into_iter().collect(),
            policies: [("bind:1".to_string(), sampled)].into_iter().collect(),
            ..Default::default()
        }],
        ..Default::default()
    });
    s
}

#[test]
fn numa_remote_fires_on_mostly_remote_pages() {
    let f = diagnose(&numa_summary(1000, 900));
    let n = f.iter().find(|f| f.kind == "numa_remote_memory").expect("fires");
    assert!(n.fix.contains("--cpunodebind=0 --membind=0"), "{}", n.fix);
    assert!(!kinds(&numa_summary(1000, 499)).contains(&"numa_remote_memory".to_string()));
    assert!(
        !kinds(&numa_summary(NUMA_MIN_SAMPLED - 1, NUMA_MIN_SAMPLED - 1)).contains(&"numa_remote_memory".to_string())
    );
}

#[test]
fn one_node_fires_nothing() {
    let mut s = summary(vec![process(42, 1, "x", 100)]);
    s.numa = Some(crate::model::Numa { nodes: 1, note: Some("1 NUMA node".into()), ..Default::default() });
    assert!(!kinds(&s).iter().any(|k| k.starts_with("numa")));
}

/// NUMA balancing's pages for pid 41, which held `held` pages at its peak.
fn churn_summary(moved: u64, held: u64) -> Summary {
    let mut s = summary(vec![process(41, 1, "trainer", 100)]);
    let p = &mut s.processes[0];
    p.migration = crate::model::Migration {
        pages: moved,
        pages_by_reason: [("numa_balancing".to_string(), moved)].into_iter().collect(),
        calls: moved,
        time_ns: 40_000_000,
        numa_moves: 12,
        ..Default::default()
    };
    p.resident = Some(crate::model::Resident { peak_bytes: held * 4096, ..Default::default() });
    s
}

#[test]
fn numa_churn_fires_when_pages_moved_more_than_twice_what_was_held() {
    let f = diagnose(&churn_summary(30_000, 10_000));
    let n = f.iter().find(|f| f.kind == "numa_migration_churn").expect("fires");
    assert_eq!(
        (n.evidence["numa_balancing_pages"].as_u64(), n.evidence["numa_moves"].as_u64()),
        (Some(30_000), Some(12))
    );
    assert!(n.summary.contains("3.0×") && n.fix.contains("--cpunodebind"), "{n:?}");
    let quiet = |moved, held| !kinds(&churn_summary(moved, held)).contains(&"numa_migration_churn".to_string());
    assert!(quiet(19_999, 10_000), "under twice what it held");
    assert!(quiet(NUMA_CHURN_MIN_PAGES - 1, 100), "too few pages to matter");
    let mut none = churn_summary(30_000, 10_000);
    none.processes[0].migration.pages_by_reason = [("compaction".to_string(), 30_000)].into_iter().collect();
    assert!(!kinds(&none).contains(&"numa_migration_churn".to_string()), "compaction is not NUMA balancing");
}
