//! Outputs sized for long recordings (privileged): a recording of hundreds
//! of short processes folds them into "other" rows, stays small, and every
//! process's regions still add up to its faults.
mod common;

use std::collections::BTreeMap;

use common::*;

#[test]
fn many_processes_fold_into_a_small_summary_that_adds_up() {
    privileged!();
    let n = 400 / scale();
    let script = format!("for i in $(seq {n}); do /bin/true; done");
    // 1%: each `true` holds ~1/n of the faults, under it whatever the machine.
    let run = record(&["--fold-below", "1"], &["sh", "-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let s = &run.summary;
    assert_eq!(s["version"], 2);
    let bytes = std::fs::metadata(run.out.path().join("summary.json")).unwrap().len();
    // Unfolded, each process costs ~10 KiB (its ~25 regions): n × 10 KiB.
    assert!(bytes < 512 << 10, "summary.json of {n} processes is {bytes} bytes");
    let procs = s["processes"].as_array().unwrap();
    let other = procs.iter().find(|p| p["pid"] == 0).unwrap_or_else(|| panic!("an other row: {procs:#?}"));
    assert_eq!(other["comm"], "other");
    // The 20 heaviest, the target, and those with 1% of the time (a `true`
    // that waited on a slow fault).
    let listed = procs.len() as u64 - 1;
    assert!(listed < n / 4, "{listed} of {n} processes listed");
    assert!(u(&other["folded"]) + listed > n, "{} folded + {listed} listed", other["folded"]);
    assert_eq!(u(&s["folding"]["processes"]), u(&other["folded"]));
    assert!(u(&other["folded_comms"]["true"]) > n / 2, "{}", other["folded_comms"]);
    // Processes add up to the totals, regions to each process (pid 0's too).
    let total: u64 = procs.iter().map(|p| u(&p["faults"]["total"])).sum();
    assert_eq!(total, u(&s["totals"]["total"]));
    let mut by_pid: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for r in s["regions"].as_array().unwrap() {
        let e = by_pid.entry(u(&r["pid"])).or_default();
        e.0 += u(&r["faults"]["total"]);
        e.1 += u(&r["faults"]["major"]);
    }
    for p in procs {
        let (faults, major) = by_pid.get(&u(&p["pid"])).copied().unwrap_or_default();
        assert_eq!(faults, u(&p["faults"]["total"]), "regions of {} add up to its faults", p["pid"]);
        assert_eq!(major, u(&p["faults"]["major"]), "regions of {} add up to its majors", p["pid"]);
    }
    // People read the same: the other row in the process table.
    let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(txt.contains(&format!("other  {} processes", other["folded"])), "{txt}");
    // `report` rebuilds from the folded file.
    let out = vmtrace().arg("report").arg(run.out.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
