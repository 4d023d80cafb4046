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

/// `record -a` beside process churn folds the exited processes it is sure to
/// fold while it records (so that the collector keeps nothing per process
/// for them), and the summary and flamegraphs still count every one of
/// them: their number, under their name, and their faults against what the
/// kernel counted for each (`wait4`'s rusage).
#[test]
#[allow(clippy::zombie_processes, reason = "each child is reaped by wait4, for its rusage")]
fn churned_processes_are_folded_while_recording_and_keep_their_names_and_faults() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    // A name no other process on the machine has.
    let bin = dir.path().join("vmt-fold-away");
    std::fs::copy("/bin/true", &bin).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut args: Vec<std::ffi::OsString> =
        ["record", "-a", "--fold-below", "1", "--out"].iter().map(Into::into).collect();
    args.push(out.path().into());
    // Every retired process is let go (not only past the 512th), so that
    // this short run folds some while it records.
    // Drained stacks nothing refers to are swept every second: the names
    // below must not depend on any of them.
    let env = [
        ("VMTRACE_RELEASE_ABOVE", "0"),
        ("VMTRACE_STACK_SWEEP_MS", "1000"),
        ("RUST_LOG", "info,vmtrace::release=debug"),
    ];
    let vm = spawn_traced_with(&env, &args);
    let n = 300 / scale();
    let (mut faults, mut started) = (0u64, 0u64);
    for i in 0..n {
        let child = std::process::Command::new(&bin).spawn().unwrap();
        let mut status = 0;
        // SAFETY: plain syscalls on our own child, reaped here only.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(child.id() as i32, &raw mut status, 0, &raw mut ru) };
        assert_eq!(pid, child.id() as i32);
        faults += (ru.ru_minflt + ru.ru_majflt) as u64;
        started += 1;
        if i % 50 == 49 {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    // Retired (a second after exit) and released on the next ticks.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let run = finish(out, vm.interrupt());
    assert_eq!(run.code(), Some(130), "stopped by SIGINT: {}", run.stderr());
    let s = &run.summary;
    let away = u(&s["folding"]["while_recording"]);
    assert!(away > 0, "nothing folded while recording: {}\n{}", s["folding"], run.stderr());
    assert!(run.stderr().contains("folded away"), "{}", run.stderr());
    // Every process started is counted: listed, or under its name in the other row.
    let procs = s["processes"].as_array().unwrap();
    let other = procs.iter().find(|p| p["pid"] == 0).unwrap_or_else(|| panic!("an other row: {procs:#?}"));
    let listed = procs.iter().filter(|p| p["comm"] == "vmt-fold-away").count() as u64;
    let folded = other["folded_comms"]["vmt-fold-away"].as_u64().unwrap_or(0);
    assert_eq!(listed + folded, started, "listed {listed}, folded {folded}: {}", other["folded_comms"]);
    assert!(u(&other["folded"]) >= away);
    // Processes add up to the totals.
    let total: u64 = procs.iter().map(|p| u(&p["faults"]["total"])).sum();
    assert_eq!(total, u(&s["totals"]["total"]));
    // Their faults, folded or not, under their name in the flamegraph, as
    // the kernel counted them for each: a line rounds by under one fault,
    // and the kernel also counts exec's get_user_pages() faults (copying
    // argv), which raise no exception and no event: one or two a process.
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let lines: Vec<u64> = folded
        .lines()
        .filter(|l| l.starts_with("vmt-fold-away;"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    let under: u64 = lines.iter().sum();
    let slack = lines.len() as u64;
    assert!(
        under <= faults + slack && under + 2 * started + slack >= faults,
        "{under} faults under vmt-fold-away in faults.folded, the kernel counted {faults} ({} lines)",
        lines.len()
    );
}

/// `record -a` beside heavy process churn (shells starting 20 `ls` and 20
/// `cat` each, Python starts that map dozens of libraries: ~250 processes
/// a second here), every retired process released at once: the collector keeps up
/// and loses nothing, and the test's own processes are all counted. It
/// lost 145,764 events in 20 s of this before the ring buffer was drained
/// between the slices of a tick's work (2026-12-03).
#[test]
fn nothing_is_lost_beside_heavy_process_churn() {
    privileged!();
    let out = tempfile::tempdir().unwrap();
    let mut args: Vec<std::ffi::OsString> = ["record", "-a", "--out"].iter().map(Into::into).collect();
    args.push(out.path().into());
    // Drained stacks nothing refers to are let go every 2 s (10 s by default).
    let sweep = std::env::var("VMTRACE_STACK_SWEEP_MS").unwrap_or_else(|_| "2000".into());
    let vm = spawn_traced_with(&[("VMTRACE_RELEASE_ABOVE", "0"), ("VMTRACE_STACK_SWEEP_MS", &sweep)], &args);
    let python = ["/usr/bin/python3", "/usr/local/bin/python3"].into_iter().find(|p| std::path::Path::new(p).exists());
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut rounds = 0u64;
    while std::time::Instant::now() < until {
        let shell = "for j in $(seq 20); do ls / >/dev/null; cat /etc/hostname >/dev/null; done";
        assert!(std::process::Command::new("bash").args(["-c", shell]).status().unwrap().success());
        if let Some(py) = python {
            let import = "import json, ssl, sqlite3, decimal";
            assert!(std::process::Command::new(py).args(["-c", import]).status().unwrap().success());
        }
        rounds += 1;
    }
    // Retired (a second after exit) and released on the next ticks.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let run = finish(out, vm.interrupt());
    assert_eq!(run.code(), Some(130), "stopped by SIGINT: {}", run.stderr());
    let s = &run.summary;
    let d = &s["drops"];
    assert_eq!(
        (u(&s["lost_events"]), u(&d["task_events"]), u(&d["mm"])),
        (0, 0, 0),
        "{rounds} rounds: drops {d}\n{}",
        run.stderr()
    );
    // Every `ls` the test started is counted (others on the machine may add).
    let procs = s["processes"].as_array().unwrap();
    let listed = procs.iter().filter(|p| p["comm"] == "ls").count() as u64;
    let folded = procs.iter().find(|p| p["pid"] == 0).and_then(|o| o["folded_comms"]["ls"].as_u64()).unwrap_or(0);
    assert!(listed + folded >= 20 * rounds, "{rounds} rounds: ls listed {listed}, folded {folded}");
    let total: u64 = procs.iter().map(|p| u(&p["faults"]["total"])).sum();
    assert_eq!(total, u(&s["totals"]["total"]));
    // What the collector holds of the drained stacks follows what is live,
    // not every process seen: each process's stacks are its own (ASLR), and
    // those walked for pages it no longer held stayed, more than one a
    // process, until they were swept. The processes alive at the end (a
    // build running beside the test has thousands of stacks) hold theirs.
    let seen = procs.len() as u64 - 1 + procs.iter().find(|p| p["pid"] == 0).map_or(0, |o| u(&o["folded"]));
    let held = u(&s["stacks"]["drained_stacks"]);
    let of_live = s["stacks"]["drained_stacks_of_live"].as_u64().unwrap_or(0);
    let swept = s["stacks"]["swept_stacks"].as_u64().unwrap_or(0);
    eprintln!(
        "{rounds} rounds: {seen} processes seen, {held} drained stacks held at the end ({of_live} of live processes), \
         {swept} swept"
    );
    assert!(
        swept > 0 && 4 * held.saturating_sub(of_live) < seen,
        "{held} drained stacks held at the end ({of_live} of live processes) for {seen} processes seen: {}",
        s["stacks"]
    );
}
