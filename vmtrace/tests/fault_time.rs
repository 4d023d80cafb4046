//! Fault time under the default settings, on real workloads: every fault
//! timed, regions adding up to their process, flamegraphs adding up to the
//! process table (privileged).
mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

/// Sum of a folded file's weights, per first frame (the process's comm).
fn folded_total(run: &Run, file: &str) -> u64 {
    let text = std::fs::read_to_string(run.out.path().join(file)).unwrap_or_default();
    text.lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum()
}

/// The invariants every default recording keeps, whatever it traced.
fn check_invariants(run: &Run, what: &str) {
    let s = &run.summary;
    let procs = s["processes"].as_array().expect("processes");
    let regions = s["regions"].as_array().expect("regions");
    let totals = &s["totals"];
    // Every fault the kernel accounts is timed, or stood for by a sample of
    // the fast ones (a few enter the handler and never complete: bad
    // addresses). Stratified, the fast faults after a CPU's last sample
    // stand unweighted: at most 2N-1 per CPU (the random stride's longest),
    // a share that matters only for a short recording (tar: 14 of 152).
    let (total, timed) = (u(&totals["total"]), u(&totals["timed"]));
    let period = s["sampling"]["fast_sample_period"].as_u64().unwrap_or(1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let tail = if period > 1 { (2 * period - 1) * cpus } else { 0 };
    assert!((timed + tail) * 1000 >= total * 990, "{what}: {timed} of {total} faults timed (tail allowed: {tail})");
    assert_eq!(s["sampling"]["minor_latency_period"], 1, "{what}: the default's end sees every fault");
    // Stratified (the memcg end): the estimate says how far off it may be.
    if let Some(n) = s["sampling"]["fast_sample_period"].as_u64() {
        assert_eq!(n, 16, "{what}: the default samples 1 in 16 fast faults");
        assert!(s["sampling"]["time_error_ns"].as_u64().is_some(), "{what}: the error is stated: {:#}", s["sampling"]);
        assert!(s["sampling"]["time_error_pct"].as_f64().is_some(), "{what}: the error is stated as a share");
        assert_eq!(s["sampling"]["time_estimated"], true, "{what}: fast faults' time is an estimate");
    }
    let mut time_sum = 0;
    for p in procs {
        let pid = p["pid"].as_u64().unwrap();
        let mine: Vec<&Value> = regions.iter().filter(|r| r["pid"] == pid).collect();
        if mine.is_empty() {
            continue;
        }
        let f = &p["faults"];
        let count: u64 = mine.iter().map(|r| u(&r["faults"]["total"])).sum();
        assert_eq!(count, u(&f["total"]), "{what}: regions of {pid} ({}) add up to its faults", p["comm"]);
        let major: u64 = mine.iter().map(|r| u(&r["faults"]["major"])).sum();
        assert_eq!(major, u(&f["major"]), "{what}: regions of {pid} add up to its majors");
        let t: u64 = mine.iter().map(|r| u(&r["faults"]["time_ns"])).sum();
        let pt = u(&f["time_ns"]);
        if pt > 1_000_000 {
            assert_close(&format!("{what}: region time of {pid}"), t, pt, 3.0);
        }
        time_sum += pt;
    }
    // The flamegraphs add up to the process table.
    let all_time: u64 = procs.iter().map(|p| u(&p["faults"]["time_ns"])).sum();
    let all_faults: u64 = procs.iter().map(|p| u(&p["faults"]["total"])).sum();
    assert_close(&format!("{what}: fault-time flamegraph"), folded_total(run, "fault-time.folded"), all_time, 1.0);
    assert_close(&format!("{what}: faults flamegraph"), folded_total(run, "faults.folded"), all_faults, 1.0);
    assert!(time_sum > 0, "{what}: some fault time");
}

#[test]
fn cold_checkpoint_load_is_timed_in_full_and_adds_up() {
    privileged!();
    let (_dir, path) = safetensors_on_disk(64);
    let p = path.to_str().unwrap();
    // Sequential and cold: a few slow minor faults wait on readahead I/O and
    // carry most of the time; sampling 1 in 16 missed or multiplied them.
    let run = record(&[], &strs(&workload(&["file-read", p, "--cold"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    check_invariants(&run, "cold mmap read");
    let pid = run.report("file-read").pid;
    let proc_time = u(&run.process(pid)["faults"]["time_ns"]);
    let loop_ns = run.report("file-read").loop_ns;
    // Waiting on the disk is most of the read loop, and the fault time says so.
    assert!(proc_time * 4 >= loop_ns, "fault time {proc_time} ns of a {loop_ns} ns cold read");
    let f =
        run.summary["files"].as_array().unwrap().iter().find(|f| f["path"] == p).expect("the checkpoint's file row");
    assert_close("the file's fault time vs its process's", u(&f["faults"]["time_ns"]), proc_time, 10.0);
    let size = u(&f["file_bytes"]);
    assert!(u(&f["from_disk_bytes"]) * 10 >= size * 9, "most of the cold file came from disk: {f:#}");
    let tensors: u64 = f["tensors"].as_array().unwrap().iter().map(|t| u(&t["time_ns"])).sum();
    // The header's page is the file's, no tensor's: placed by time, its own
    // cold fault (the read's first, waiting on the disk) is no longer spread
    // over the granule's other pages.
    let file_time = u(&f["faults"]["time_ns"]);
    assert!(tensors <= file_time + file_time / 100, "tensors' time {tensors} within the file's {file_time}");
    // The rest is the header's page: the read's first fault, which waits for
    // the disk and a first readahead window (84% under four parallel builds).
    assert!(tensors * 100 >= file_time * 75, "tensors' time {tensors} is most of the file's {file_time}");
    // A cold sequential read brings every tensor in from disk: each says so.
    for t in f["tensors"].as_array().unwrap() {
        assert!(u(&t["from_disk_bytes"]) * 10 >= u(&t["bytes"]) * 9, "tensor read from disk: {t:#}");
    }
    assert!(u(&run.summary["stacks"]["exact_faults"]) > 0, "slow faults carry their own stacks");
}

#[test]
fn thp_touch_is_timed_and_counts_the_huge_pages_it_maps() {
    privileged!();
    let run = record(&[], &strs(&workload(&["touch", "--mib", "64", "--huge"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    check_invariants(&run, "THP touch");
    let r = run.report("first-touch");
    if r.huge_pages == 0 {
        // The kernel may fail to find a free 2 MiB page (THP `defer`, fragmentation).
        eprintln!("no THP given by the kernel this run: only the invariants were checked");
        return;
    }
    let region = run.summary["regions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["pid"] == r.pid)
        .max_by_key(|x| u(&x["faults"]["huge"].clone()))
        .unwrap();
    let huge = u(&region["faults"]["huge"]);
    // Pages faulted in count every 4 KiB page a huge fault mapped.
    assert!(u(&region["pages_touched"]) >= huge * 512, "{region:#}");
}

#[test]
fn real_programs_add_up_tar_and_numpy() {
    privileged!();
    let run = record(&[], &["tar", "cf", "/dev/null", "/usr/lib/python3"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    check_invariants(&run, "tar");
    let python = python_with(&["numpy"]);
    let script = "import numpy as np\na = np.ones((1500, 1500))\nfor _ in range(3):\n    b = a @ a\n";
    let run = record(&[], &[python.to_str().unwrap(), "-c", script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    check_invariants(&run, "numpy");
}

#[test]
fn system_wide_cross_check_compares_the_same_window() {
    privileged!();
    // A load that starts while vmtrace is still loading: the kernel's
    // counters and vmtrace must both count from the same moment.
    let mut load = Command::new(BIN).args(["workload", "fault-loop", "--mib", "16", "--seconds", "4"]).spawn().unwrap();
    let out = tempfile::tempdir().unwrap();
    // No stacks: its walks of other tests' user stacks would raise nofault
    // faults that the other recordings (whose walk flag is their own) count
    // as faults that never complete.
    let vm = vmtrace()
        .args(["record", "-a", "--stacks", "none", "--duration", "2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let _ = load.wait();
    let run = finish(out, vm);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let perf = &run.summary["perf"];
    let kernel = u(&perf["kernel_minor_faults"]) + u(&perf["kernel_major_faults"]);
    assert_close("vmtrace -a vs the kernel's counters", u(&run.summary["totals"]["total"]), kernel, 1.0);
}
