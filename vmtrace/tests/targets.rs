//! `-p PID`, `-a`, stop on signals, and bad input (privileged: loads BPF).
mod common;

use std::{
    ffi::OsStr,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use common::*;

#[test]
fn attach_to_running_pid_sees_its_exec_and_exit() {
    privileged!();
    // A shell that waits until vmtrace traces it, then becomes the workload
    // (same pid, new program). A fixed wait raced with vmtrace's start-up.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let go_arg = go.display().to_string();
    let argv = sh_then_exec(
        "go=$1; shift; while [ ! -e \"$go\" ]; do sleep 0.05; done",
        &[&go_arg, BIN, "workload", "touch", "--mib", "128"],
    );
    let child = Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = tempfile::tempdir().unwrap();
    let pid_arg = pid.to_string();
    let vm = spawn_traced(&[
        OsStr::new("record"),
        OsStr::new("--out"),
        out.path().as_os_str(),
        "-p".as_ref(),
        pid_arg.as_ref(),
    ]);
    std::fs::write(&go, "").unwrap();
    let child_out = child.wait_with_output().unwrap();
    let vm = vm.wait();
    let mut run = finish(out, vm);
    run.reports = vmtrace::demo::workload::parse_reports(&String::from_utf8_lossy(&child_out.stdout));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let r = run.report("first-touch");
    assert_eq!(r.pid, pid);
    // getrusage also holds the shell's faults from before vmtrace attached.
    assert_close("faults after attach", u(&run.process(pid)["faults"]["total"]), r.minflt, 1.0);
    assert_eq!(run.summary["target"]["kind"], "pid");
    assert_eq!(run.process(pid)["exit_code"], 0);
}

#[test]
fn system_wide_sees_an_unrelated_process() {
    privileged!();
    let out = tempfile::tempdir().unwrap();
    let vm = spawn_traced(&[
        OsStr::new("record"),
        "-a".as_ref(),
        "--duration".as_ref(),
        "3".as_ref(),
        "--out".as_ref(),
        out.path().as_os_str(),
    ]);
    let w = Command::new(BIN).args(["workload", "touch", "--mib", "64"]).output().unwrap();
    let vm = vm.wait();
    let run = finish(out, vm);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let r = &vmtrace::demo::workload::parse_reports(&String::from_utf8_lossy(&w.stdout))[0];
    assert_eq!(run.summary["target"]["kind"], "system");
    assert_close("faults of a process started after -a", u(&run.process(r.pid)["faults"]["total"]), r.minflt, 1.0);
}

#[test]
fn sigint_stops_and_still_writes_every_output() {
    privileged!();
    let out = tempfile::tempdir().unwrap();
    // Signalled once it traces: a fixed wait raced with start-up on a busy
    // machine, and a SIGINT before the handler is installed kills vmtrace.
    let vm = spawn_traced(&[
        OsStr::new("record"),
        "--out".as_ref(),
        out.path().as_os_str(),
        "--".as_ref(),
        "sleep".as_ref(),
        "30".as_ref(),
    ]);
    sleep(Duration::from_millis(300));
    let run = finish(out, vm.interrupt());
    // sleep got the SIGINT too, as under a shell, and died of it.
    assert_eq!(run.code(), Some(130), "{}", run.stderr());
    assert!(run.out.path().join("summary.txt").exists());
    assert_eq!(run.summary["target"]["exit_status"], 130);
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    assert!(u(&run.process(pid)["faults"]["total"]) > 0, "sleep's start-up faults were seen");
}

/// uc30 bug 5: `kill -INT` of vmtrace alone stops the whole traced job,
/// not only the command's pid: a launcher (`sh -c`), its child with default
/// signal dispositions, a child that left the process group and the
/// session (setsid, as detached workers do), and `sleep &` (a shell's
/// background command ignores SIGINT: SIGTERM 2 s later ends it). All are
/// gone afterwards, each died of the signal it was sent, and every output
/// is written.
#[test]
fn sigint_to_vmtrace_alone_stops_the_whole_job() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let member = compile_c("job_member.c", dir.path());
    let list = dir.path().join("members");
    let script = format!(
        "m='{m}'; f='{f}'; \"$m\" \"$f\" plain & \"$m\" \"$f\" setsid & sleep 300 & echo \"$! sleep\" >> \"$f\"; wait",
        m = member.display(),
        f = list.display()
    );
    let out = tempfile::tempdir().unwrap();
    let vm = spawn_traced(&[
        OsStr::new("record"),
        "--out".as_ref(),
        out.path().as_os_str(),
        "--".as_ref(),
        "sh".as_ref(),
        "-c".as_ref(),
        script.as_ref(),
    ]);
    let members = || -> Vec<(u32, String)> {
        let text = std::fs::read_to_string(&list).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                Some((w.next()?.parse().ok()?, w.next()?.to_string()))
            })
            .collect()
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while members().len() < 3 && std::time::Instant::now() < until {
        sleep(Duration::from_millis(50));
    }
    let members = members();
    assert_eq!(members.len(), 3, "the job started: {members:?}");
    let started = std::time::Instant::now();
    let run = finish(out, vm.interrupt());
    let took = started.elapsed();
    assert_eq!(run.code(), Some(130), "{}", run.stderr());
    for f in ["summary.json", "summary.txt", "report.html", "faults.folded"] {
        assert!(run.out.path().join(f).exists(), "{f} written");
    }
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
    };
    let launcher = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    assert!(gone(launcher), "the launcher is gone");
    assert_eq!(run.summary["target"]["exit_status"], 130, "the launcher died of SIGINT");
    for (pid, mode) in &members {
        // Reparented to init once the launcher died: a zombie only until reaped.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while !gone(*pid) && std::time::Instant::now() < until {
            sleep(Duration::from_millis(50));
        }
        assert!(gone(*pid), "{mode} member {pid} still runs:\n{}", run.stderr());
        let want = if mode == "sleep" { 128 + libc::SIGTERM } else { 130 };
        assert_eq!(run.process(*pid)["exit_code"], want, "{mode} member {pid}: its exit is in the trace");
        if mode != "sleep" {
            assert!(u(&run.process(*pid)["faults"]["total"]) >= 1024, "{mode} member's 4 MiB were traced");
        }
    }
    assert!(run.stderr().contains("sending SIGTERM"), "the escalation is said: {}", run.stderr());
    assert!(took < Duration::from_secs(15), "stopped within the grace periods: {took:?}");
}

#[test]
fn duration_stops_a_pid_trace() {
    privileged!();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let out = tempfile::tempdir().unwrap();
    let vm = vmtrace()
        .args(["record", "--duration", "1", "--out"])
        .arg(out.path())
        .args(["-p", &sleeper.id().to_string()])
        .output()
        .unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let run = finish(out, vm);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.process(sleeper.id())["exit_code"], serde_json::Value::Null, "still running when the trace ended");
}

fn expect_error(run: &Run, needle: &str) {
    assert_ne!(run.code(), Some(0), "should fail: {}", run.stderr());
    assert!(run.stderr().contains(needle), "stderr should name the problem ({needle}):\n{}", run.stderr());
}

#[test]
fn bad_input_gets_a_clear_error() {
    // These fail before anything is loaded: no privileges needed.
    let run = record(&[], &["no-such-command-vmtrace"]);
    expect_error(&run, "command not found: no-such-command-vmtrace");
    assert_eq!(run.code(), Some(127), "as a shell exits for a command not found");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let run = record(&[], &[script.to_str().unwrap()]);
    expect_error(&run, "cannot execute");
    assert_eq!(run.code(), Some(126), "as a shell exits for a command it cannot execute");

    let out = tempfile::tempdir().unwrap();
    let vm = vmtrace().args(["record", "-p", "999999999", "--out"]).arg(out.path()).output().unwrap();
    expect_error(&finish(out, vm), "no such process: 999999999");

    let out = tempfile::tempdir().unwrap();
    let vm = vmtrace().args(["record", "--out", "/proc/vmtrace-cannot-write", "--", "true"]).output().unwrap();
    expect_error(&finish(out, vm), "cannot write to output directory");

    let out = tempfile::tempdir().unwrap();
    let vm = vmtrace().args(["report"]).arg(out.path()).output().unwrap();
    expect_error(&finish(out, vm), "summary.json");
}

#[test]
fn unprivileged_user_is_told_what_to_do() {
    privileged!();
    // nobody must reach the binary and the output directory wherever the
    // checkout and TMPDIR live (root's home is 0700 on most systems).
    let shared = world_reachable_dir();
    let bin = world_runnable_bin(shared.path());
    let out = tempfile::Builder::new().prefix("out-").tempdir_in(shared.path()).unwrap();
    std::fs::set_permissions(out.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let vm = as_nobody(&mut Command::new(&bin))
        .current_dir(shared.path())
        .args(["record", "--out"])
        .arg(out.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    let run = finish(out, vm);
    expect_error(&run, "privileges");
    assert!(run.stderr().contains("run as root"), "{}", run.stderr());
}

#[test]
fn stream_json_prints_one_object_per_interval_with_rates() {
    privileged!();
    // 128 MiB at 1 MiB per 15 ms: about 2 s of 16k faults/s.
    let run = record(
        &["--stream", "json", "--interval", "0.5"],
        &strs(&workload(&["touch", "--mib", "128", "--pace-ms", "15"])),
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let pid = run.report("first-touch").pid;
    let stdout = String::from_utf8_lossy(&run.output.stdout);
    let lines: Vec<serde_json::Value> =
        stdout.lines().filter(|l| l.starts_with("{\"interval_s\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 3, "about one object per 0.5 s over ~2 s: {stdout}");
    let rates: Vec<f64> = lines
        .iter()
        .filter_map(|l| l["processes"].as_array()?.iter().find(|p| p["pid"] == pid)?["faults_per_s"].as_f64())
        .collect();
    assert!(rates.iter().any(|&r| r > 5000.0), "the workload's fault rate shows: {rates:?}");
    assert!(!stdout.contains("Page faults by process"), "with --stream the summary goes to stderr");
    assert!(run.stderr().contains("Page faults by process"));
}

#[test]
fn duration_with_a_command_stops_tracing_and_leaves_it_running() {
    privileged!();
    let out = tempfile::tempdir().unwrap();
    // Files, not pipes: the command inherits them and would hold a pipe open.
    let logs = tempfile::tempdir().unwrap();
    let (o, e) = (logs.path().join("out"), logs.path().join("err"));
    let status = vmtrace()
        .args(["record", "--duration", "1", "--out"])
        .arg(out.path())
        .args(["--", "sleep", "3600"])
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .status()
        .unwrap();
    let output =
        std::process::Output { status, stdout: std::fs::read(&o).unwrap(), stderr: std::fs::read(&e).unwrap() };
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.stderr().contains("goes on running untraced"), "the user is told: {}", run.stderr());
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as i32;
    assert_eq!(run.summary["target"]["exit_status"], serde_json::Value::Null);
    // SAFETY: probing and then ending the command vmtrace left running.
    unsafe {
        // vmtrace returned at the duration, not at the command's end: not
        // timed (a busy machine can take many seconds to load the probes),
        // the command outlives it.
        assert_eq!(libc::kill(pid, 0), 0, "the command still runs");
        libc::kill(pid, libc::SIGKILL);
    }
}

/// A tmpfs of `kib` KiB mounted on a fresh directory, unmounted on drop.
struct TinyDisk(tempfile::TempDir);

impl TinyDisk {
    fn mount(kib: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a {kib} KiB tmpfs");
        Self(dir)
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_keeps_the_summary_and_names_every_file_it_lost() {
    privileged!();
    // summary.json takes ~50-70 KiB, the whole set ~250 KiB: the summary
    // fits, the flamegraphs and report.html do not all.
    for (cmd, want) in [("exit 0", 1), ("exit 3", 3)] {
        let disk = TinyDisk::mount(160);
        let out = disk.0.path().join("out");
        let vm = vmtrace().args(["record", "--out"]).arg(&out).args(["--", "sh", "-c", cmd]).output().unwrap();
        let err = String::from_utf8_lossy(&vm.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        // The command's failure stays its own; a command that succeeded gets
        // 1 for vmtrace's failure (the contract: non-zero, said on stderr).
        assert_eq!(vm.status.code(), Some(want), "{cmd}:\n{err}");
        assert!(err.contains("Page faults by process"), "the summary is still printed:\n{err}");
        assert!(err.contains("output file(s) not written") && err.contains("the disk is full"), "{err}");
        let json = std::fs::read_to_string(out.join("summary.json")).expect("summary.json is written first");
        let _: serde_json::Value = serde_json::from_str(&json).expect("and whole");
        assert!(out.join("summary.txt").exists(), "summary.txt comes second:\n{err}");
        let all = ["regions.txt", "faults.svg", "faults.folded", "fault-time.svg", "mmap.svg", "report.html"];
        let lost: Vec<&str> = all.iter().copied().filter(|f| !out.join(f).exists()).collect();
        assert!(!lost.is_empty(), "160 KiB cannot hold every output");
        for f in lost {
            assert!(err.contains(&format!("cannot write {}/{f}: ", out.display())), "{f} is named:\n{err}");
        }
    }
}

/// The nice in a /proc/PID/stat line (field 19).
fn nice_in_stat(stat: &str) -> i32 {
    let after_comm = stat.rsplit_once(')').expect("comm").1;
    after_comm.split_whitespace().nth(16).expect("field 19").parse().expect("a nice")
}

#[test]
fn the_collector_raises_its_priority_and_the_command_keeps_its_own() {
    privileged!();
    let ours = nice_in_stat(&std::fs::read_to_string("/proc/self/stat").unwrap());
    // The command prints its parent's (vmtrace's) stat line and its own.
    let script = "sleep 0.3; cat /proc/$PPID/stat; cat /proc/$$/stat";
    let run = record(&["--events", "faults", "--stacks", "none"], &["sh", "-c", script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let stdout = String::from_utf8_lossy(&run.output.stdout);
    let lines: Vec<&str> = stdout.lines().filter(|l| l.contains(") ")).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("(vmtrace)"), "the command's parent is the collector: {stdout}");
    assert_eq!(nice_in_stat(lines[0]), ours.clamp(-20, -10), "the collector while it traces: {stdout}");
    assert_eq!(nice_in_stat(lines[1]), ours, "the command keeps the nice it was started with: {stdout}");
}
