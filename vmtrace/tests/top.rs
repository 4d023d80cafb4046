//! `vmtrace top` in a real pseudo-terminal: tmux runs it at 80×24 (and 60 or
//! 200 columns), the test
//! reads the screen with capture-pane and drives it with send-keys (privileged).
mod common;

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use common::*;

/// A tmux server of its own (its own socket), killed on drop.
struct Tmux {
    socket: String,
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Runs `vmtrace ARGS` in an 80×24 window; its exit status lands in a file.
    fn start(name: &str, args: &[&str]) -> Self {
        Self::start_sized(name, 80, args)
    }

    /// The same in a window `width` columns wide.
    fn start_sized(name: &str, width: u16, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = format!("vmtrace-test-{name}-{}", std::process::id());
        let status = dir.path().join("status");
        let quoted: Vec<String> = std::iter::once(BIN).chain(args.iter().copied()).map(|a| format!("'{a}'")).collect();
        let script = format!("{}; echo $? > '{}'; sleep 600", quoted.join(" "), status.display());
        let ok = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                &width.to_string(),
                "-y",
                "24",
                &script,
            ])
            .env("TERM", "xterm-256color")
            .status()
            .expect("tmux is needed for this test (apt-get install tmux)")
            .success();
        assert!(ok, "tmux new-session failed");
        Self { socket, dir }
    }

    fn screen(&self) -> String {
        let out = Command::new("tmux").args(["-L", &self.socket, "capture-pane", "-p"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, k: &str) {
        assert!(Command::new("tmux").args(["-L", &self.socket, "send-keys", k]).status().unwrap().success());
    }

    /// Waits until `check` accepts the screen; panics with the last one.
    fn wait_for(&self, what: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + timeout;
        loop {
            let s = self.screen();
            if check(&s) {
                return s;
            }
            assert!(Instant::now() < until, "timed out waiting for {what}; screen:\n{s}");
            sleep(Duration::from_millis(250));
        }
    }

    fn status_file(&self) -> PathBuf {
        self.dir.path().join("status")
    }

    /// The exit status of vmtrace top, once it has quit.
    fn exit_status(&self, timeout: Duration) -> i32 {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            // The shell may have created the file and not yet written it.
            if let Some(status) = std::fs::read_to_string(self.status_file()).ok().and_then(|s| s.trim().parse().ok()) {
                return status;
            }
            sleep(Duration::from_millis(100));
        }
        panic!("vmtrace top did not quit; screen:\n{}", self.screen());
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).status();
    }
}

/// The numbers of the table row that starts with `pid`.
fn row_of(screen: &str, pid: u32) -> Option<Vec<String>> {
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
}

/// "12.3k" → 12300.
fn parse_human(s: &str) -> f64 {
    let (n, m) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1e3),
        Some('M') => (&s[..s.len() - 1], 1e6),
        _ => (s, 1.0),
    };
    n.parse::<f64>().map_or(0.0, |v| v * m)
}

struct Workload(Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn top_shows_a_running_workloads_pid_and_fault_rate_and_answers_keys() {
    privileged!();
    // ~1 MiB every 4 ms: a steady ~60k faults/s for a minute.
    let w = Workload(
        Command::new(BIN)
            .args(["workload", "touch", "--mib", "8000", "--pace-ms", "4"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = w.0.id();
    let tmux = Tmux::start("procs", &["top", "-p", &pid.to_string()]);
    let screen = tmux.wait_for("the workload's row with a fault rate", Duration::from_secs(20), |s| {
        cell(s, pid, "FAULT/s").is_some_and(|c| parse_human(&c) > 0.0)
    });
    assert!(screen.contains(&format!("pid {pid}")), "title names the target:\n{screen}");
    let row = row_of(&screen, pid).unwrap();
    assert_eq!(row[1], "vmtrace", "{screen}");
    let rate = cell(&screen, pid, "FAULT/s").map_or(0.0, |c| parse_human(&c));
    assert!(rate > 1000.0, "faults/s of a workload touching ~250 MiB/s:\n{screen}");
    // Its resident size, growing with it.
    assert!(cell(&screen, pid, "RSS").and_then(|c| parse_bytes(&c)).is_some(), "{screen}");
    assert!(screen.lines().count() <= 24 && screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    assert!(screen.contains("dTLB"), "dTLB line (unsupported without a PMU):\n{screen}");

    // r: regions, where the workload's anonymous memory takes the faults.
    tmux.keys("r");
    let screen = tmux.wait_for("the regions pane", Duration::from_secs(5), |s| s.contains("REGION"));
    let anon = screen
        .lines()
        .find(|l| l.contains("[anon]") && l.split_whitespace().next() == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("no anon region row:\n{screen}"));
    assert!(screen.contains("GiB"), "the 8000 MiB mapping:\n{screen}");
    let fields: Vec<&str> = anon.split_whitespace().collect();
    // PID COMM [anon] KIND SIZE UNIT FAULT/s …
    assert_eq!(fields[3], "anon", "{anon}\n{screen}");
    assert!(parse_human(fields[6]) > 0.0, "{anon}\n{screen}");

    // s: next sort key; p: pause; q: quit (the status lands in the file).
    tmux.keys("s");
    tmux.wait_for("sort by major/s", Duration::from_secs(5), |s| s.contains("sort major/s"));
    tmux.keys("p");
    tmux.wait_for("PAUSED", Duration::from_secs(5), |s| s.contains("PAUSED"));
    tmux.keys("q");
    assert_eq!(tmux.exit_status(Duration::from_secs(20)), 0);
    // A pid target is only watched: it still runs.
    assert!(vmtrace::target::pid_alive(pid), "top must not stop a process it only watches");
}

/// The table row whose second cell is `comm`.
fn row_named<'a>(screen: &'a str, comm: &str) -> Option<Vec<&'a str>> {
    screen.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|w| w.get(1) == Some(&comm))
}

#[test]
fn top_runs_a_command_and_says_when_it_ended() {
    privileged!();
    for width in [60, 200] {
        let tmux =
            Tmux::start_sized(&format!("cmd{width}"), width, &["top", "--", BIN, "workload", "touch", "--mib", "64"]);
        let screen =
            tmux.wait_for("the end banner", Duration::from_secs(20), |s| s.contains("command exited with status 0"));
        assert!(screen.contains("vmtrace workload touch"), "the title names the command:\n{screen}");
        // Its faults stay counted once it is gone: 64 MiB is 16,384 pages.
        // (At 60 columns the title takes two lines.)
        let total = screen
            .lines()
            .take(2)
            .flat_map(|l| l.split(" · "))
            .find(|p| p.trim_end().ends_with(" faults"))
            .map(str::trim_end)
            .map_or(0.0, |p| parse_human(p.trim_end_matches(" faults")));
        assert!(total >= 16_300.0, "total faults in the title: {total}\n{screen}");
        // The final table stays: the command's row, with its whole count in
        // the last column, refresh after refresh.
        sleep(Duration::from_millis(2500));
        let screen = tmux.screen();
        let row = row_named(&screen, "vmtrace").unwrap_or_else(|| panic!("{width} columns: no final row:\n{screen}"));
        let faults = row.last().map_or(0.0, |c| parse_human(c));
        assert!(faults >= 16_300.0, "{width} columns: the final FAULTS {faults}:\n{screen}");
        assert!(screen.lines().all(|l| l.chars().count() <= usize::from(width)), "{screen}");
        tmux.keys("q");
        assert_eq!(tmux.exit_status(Duration::from_secs(20)), 0);
    }
}

/// `q` while the command runs stops its whole job: a launcher's background
/// child and a setsid'd one too, not only the command's pid.
#[test]
fn quitting_stops_the_whole_job() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "sleep 300 & echo $! > {p}; setsid sleep 301 & echo $! >> {p}; exec {BIN} workload touch --mib 8 --pace-ms 60000",
        p = pids.display()
    );
    let tmux = Tmux::start("job", &["top", "--", "sh", "-c", &script]);
    tmux.wait_for("the table", Duration::from_secs(30), |s| s.contains("PID"));
    let until = Instant::now() + Duration::from_secs(20);
    let children: Vec<u32> = loop {
        let read = std::fs::read_to_string(&pids).unwrap_or_default();
        let got: Vec<u32> = read.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if got.len() == 2 || Instant::now() > until {
            break got;
        }
        sleep(Duration::from_millis(100));
    };
    assert_eq!(children.len(), 2, "{children:?}");
    assert!(children.iter().all(|&p| vmtrace::target::pid_alive(p)));
    tmux.keys("q");
    // SIGTERM ends the command: sh's shell status 143.
    assert_eq!(tmux.exit_status(Duration::from_secs(20)), 143);
    let until = Instant::now() + Duration::from_secs(10);
    while children.iter().any(|&p| vmtrace::target::pid_alive(p)) && Instant::now() < until {
        sleep(Duration::from_millis(100));
    }
    let left: Vec<u32> = children.iter().copied().filter(|&p| vmtrace::target::pid_alive(p)).collect();
    for p in &left {
        // SAFETY: cleaning up the test's own processes.
        unsafe { libc::kill(*p as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "still running after q: {left:?}");
}

/// Builds small objects, forks a worker that writes a reference count into
/// each (a COW copy of every arena page in use), and the worker writes its
/// pid and its own /proc/self/stat fault counts to argv[1] before `_exit`.
const FORK_WORKER_PY: &str = r#"
import os, sys
objs = [(i, str(i), [i]) for i in range(400_000)]
pid = os.fork()
if pid == 0:
    n = 0
    for o in objs:
        n += o[0] + len(o[1]) + len(o[2])
    with open("/proc/self/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    with open(sys.argv[1], "w") as f:
        f.write(f"{os.getpid()} {rest[7]} {rest[9]}\n")
    os._exit(0)
os.waitpid(pid, 0)
"#;

/// A forked Python worker's refcount COW shows in the regions pane as its
/// Python arenas' row: one row of kind `python`, whose COW faults are
/// nearly all the faults the worker's own /proc/self/stat counts.
#[test]
fn top_shows_a_fork_workers_python_arenas_and_their_cow() {
    privileged!();
    let Some(python) = pyenv_python(12).or_else(|| pyenv_python(10)) else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fork_worker.py");
    std::fs::write(&script, FORK_WORKER_PY).unwrap();
    let stat = dir.path().join("worker.txt");
    let tmux = Tmux::start_sized(
        "arenas",
        200,
        &["top", "--", python.to_str().unwrap(), script.to_str().unwrap(), stat.to_str().unwrap()],
    );
    tmux.wait_for("the end banner", Duration::from_mins(2), |s| s.contains("command exited with status 0"));
    let worker: Vec<u64> =
        std::fs::read_to_string(&stat).unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (wpid, kernel) = (worker[0], worker[1] + worker[2]);
    // The process pane tells the forked worker apart, as summary.txt does.
    let worker_row =
        |s: &str| s.lines().find(|l| l.split_whitespace().next() == Some(wpid.to_string().as_str())).map(str::to_owned);
    let screen = tmux.wait_for("the worker's labelled row", Duration::from_secs(20), |s| {
        worker_row(s).is_some_and(|l| l.contains("(worker 0 of "))
    });
    eprintln!("{}", worker_row(&screen).unwrap_or_default());
    tmux.keys("r");
    // PID COMM [python arena] ×N KIND SIZE UNIT FAULT/s MAJ/s COW/s TIME% FAULTS COW
    let arenas = |s: &str| {
        s.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.first() == Some(&wpid.to_string().as_str()) && w.contains(&"[python"))
            .map(|w| w.iter().map(ToString::to_string).collect::<Vec<_>>())
    };
    let screen = tmux.wait_for("the worker's arenas row", Duration::from_secs(20), |s| arenas(s).is_some());
    let row = arenas(&screen).unwrap();
    let at = row.iter().position(|c| c == "arena]").unwrap_or_else(|| panic!("{row:?}\n{screen}"));
    assert!(row[at + 1].starts_with('×'), "the arenas summed in one row: {row:?}\n{screen}");
    assert_eq!(row[at + 2], "python", "its kind: {row:?}\n{screen}");
    let (faults, cow) = (parse_human(&row[row.len() - 2]), parse_human(&row[row.len() - 1]));
    let kernel = kernel as f64;
    eprintln!("worker {wpid}: its arenas' row {row:?}; {kernel} faults by its own stat");
    assert!(
        cow >= 0.9 * kernel && faults <= kernel * 1.01 + 200.0,
        "worker {wpid}: {faults} faults, {cow} COW in its arenas; {kernel} faults by its own stat\n{screen}"
    );
    assert!(screen.lines().filter(|l| l.contains("[python arena]")).count() <= 2, "one row per process:\n{screen}");
    tmux.keys("q");
    assert_eq!(tmux.exit_status(Duration::from_secs(20)), 0);
}

#[test]
fn top_without_a_terminal_says_so() {
    let out = vmtrace().args(["top", "-a"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs a terminal") && err.contains("--stream json"), "{err}");
}

/// "130M" → bytes (top's binary units).
fn parse_bytes(s: &str) -> Option<f64> {
    let unit = match s.chars().last()? {
        'K' => 1024.0,
        'M' => 1_048_576.0,
        'G' => 1_073_741_824.0,
        'T' => 1_099_511_627_776.0,
        _ => return None,
    };
    s[..s.len() - 1].trim_start_matches('+').parse::<f64>().ok().map(|v| v * unit)
}

/// The cell under `column` of the row that starts with `pid`.
fn cell(screen: &str, pid: u32, column: &str) -> Option<String> {
    let head: Vec<&str> = screen.lines().find(|l| l.trim_start().starts_with("PID"))?.split_whitespace().collect();
    let i = head.iter().position(|h| *h == column)?;
    row_of(screen, pid)?.get(i).cloned()
}

/// Kills a pid when dropped.
struct Kill(u32);
impl Drop for Kill {
    fn drop(&mut self) {
        // SAFETY: a pid this test's command holds until killed.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}

/// Each process's resident size and its growth: a command that holds 128
/// MiB (after freeing 64 more) shows an RSS within 3% of the VmRSS the
/// kernel reports for it in /proc, and, holding still, a growth of 0.
#[test]
fn top_shows_each_processs_resident_size_and_growth() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_c("hold_memory.c", dir.path());
    let ready = dir.path().join("ready");
    let tmux = Tmux::start("rss", &["top", "--", bin.to_str().unwrap(), "128", ready.to_str().unwrap()]);
    let start = Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "the command never got ready:\n{}", tmux.screen());
        sleep(Duration::from_millis(100));
    }
    let pid: u32 = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();
    let _kill = Kill(pid);
    let vm_rss = status_kb(pid, "VmRSS") as f64;
    let screen = tmux.wait_for("the command's RSS, still", Duration::from_secs(20), |s| {
        let rss = cell(s, pid, "RSS").and_then(|c| parse_bytes(&c));
        rss.is_some_and(|r| (r - vm_rss).abs() <= vm_rss * 0.03) && cell(s, pid, "ΔRSS/s").as_deref() == Some("0")
    });
    let rss = cell(&screen, pid, "RSS").and_then(|c| parse_bytes(&c)).unwrap();
    assert!(rss >= 128.0 * 1_048_576.0, "{screen}");
    assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    // q stops the command (SIGTERM), whose status top then exits with.
    tmux.keys("q");
    assert_eq!(tmux.exit_status(Duration::from_secs(20)), 128 + libc::SIGTERM);
}

/// The findings so far as banners: the heap-trim fixture (glibc trims the
/// heap top every round, and the next round faults it in again) run long
/// enough to be seen live, and its finding still there once it ended.
#[test]
fn top_shows_a_finding_live() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_c("heap_trim.c", dir.path());
    let tmux = Tmux::start_sized("finding", 200, &["top", "--", bin.to_str().unwrap(), "4000"]);
    let screen =
        tmux.wait_for("the heap-trim finding", Duration::from_mins(1), |s| s.contains("FINDING heap_trim_refault"));
    assert!(screen.contains("brk calls"), "the banner says the evidence:\n{screen}");
}
