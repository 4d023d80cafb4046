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
        row_of(s, pid).is_some_and(|r| r.len() >= 3 && parse_human(&r[2]) > 0.0)
    });
    assert!(screen.contains(&format!("pid {pid}")), "title names the target:\n{screen}");
    let row = row_of(&screen, pid).unwrap();
    assert_eq!(row[1], "vmtrace", "{screen}");
    assert!(parse_human(&row[2]) > 1000.0, "faults/s of a workload touching ~250 MiB/s:\n{screen}");
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
    // PID COMM [anon] SIZE UNIT FAULT/s …
    assert!(parse_human(fields[5]) > 0.0, "{anon}\n{screen}");

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

#[test]
fn top_without_a_terminal_says_so() {
    let out = vmtrace().args(["top", "-a"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs a terminal") && err.contains("--stream json"), "{err}");
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
