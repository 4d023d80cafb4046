//! `vmtrace serve`: OpenMetrics over loopback that a real parser accepts, with
//! counters rising between scrapes and bounded labels (privileged).
mod common;

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use common::*;

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to vmtrace serve");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("application/openmetrics-text"), "{head}");
    openmetrics_parser::openmetrics::parse_openmetrics(body)
        .unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}\n{body}"));
    body.to_string()
}

/// Sum of a counter's samples (optionally of one label value).
fn total(body: &str, metric: &str, with: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(metric) && l.contains(with))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// `vmtrace serve -a --top TOP` on a free loopback port, and the address it
/// says it serves on.
fn serve_all(top: &str) -> (std::process::Child, String) {
    serve_with(&["-a", "--top", top])
}

/// `vmtrace serve` with `args` on a free loopback port, and its address.
fn serve_with(args: &[&str]) -> (std::process::Child, String) {
    serve_with_env(&[], args)
}

/// [`serve_with`] with environment variables set for vmtrace.
fn serve_with_env(env: &[(&str, &str)], args: &[&str]) -> (std::process::Child, String) {
    let mut vm = vmtrace()
        .envs(env.iter().copied())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(vm.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let addr =
        line.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_else(|| panic!("{line}")).to_string();
    (vm, addr)
}

#[test]
fn serve_exposes_rising_fault_counters_with_bounded_labels() {
    privileged!();
    let (mut vm, addr) = serve_all("3");
    sleep(Duration::from_millis(1500));
    let first = scrape(&addr);
    for _ in 0..2 {
        assert!(Command::new(BIN)
            .args(["workload", "touch", "--mib", "64"])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success());
    }
    sleep(Duration::from_millis(1500));
    let second = scrape(&addr);
    let grew = total(&second, "vmtrace_page_faults_total", "") - total(&first, "vmtrace_page_faults_total", "");
    assert!(grew >= 2.0 * 64.0 * 256.0, "the fault counter rose by {grew}");
    // At most 3 processes of their own; everyone else in comm="other".
    let pids: std::collections::BTreeSet<&str> = second
        .lines()
        .filter(|l| l.starts_with("vmtrace_page_faults_total{pid=\"") && !l.contains("pid=\"\""))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(pids.len() <= 3, "{pids:?}");
    assert!(second.contains("comm=\"other\""), "{second}");
    assert!(second.trim_end().ends_with("# EOF"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.id() as i32, libc::SIGINT) };
    assert!(vm.wait().unwrap().success());
}

#[test]
fn serve_refuses_a_public_address_without_the_flag() {
    let out = vmtrace().args(["serve", "--listen", "0.0.0.0:0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--allow-remote"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Resident gauges per process: a program started under `serve -a` holds
/// 128 MiB after freeing 64 more; `vmtrace_resident_bytes` (anon + file +
/// shmem) is within 3% of the VmRSS of its /proc/PID/status, its anon series
/// of RssAnon, and `vmtrace_resident_peak_bytes` within 3% of its VmHWM.
#[test]
fn serve_exports_each_processs_resident_bytes_and_peak() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_c("hold_memory.c", dir.path());
    let (mut vm, addr) = serve_all("100000");
    let ready = dir.path().join("ready");
    let mut hold = Command::new(&bin).arg("128").arg(&ready).spawn().unwrap();
    let pid = hold.id();
    let start = std::time::Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "the program never got ready");
        sleep(Duration::from_millis(100));
    }
    let (rss, anon, hwm) = (status_kb(pid, "VmRSS"), status_kb(pid, "RssAnon"), status_kb(pid, "VmHWM"));
    let of = |body: &str, metric: &str, kind: &str| -> f64 {
        let with = format!("{{pid=\"{pid}\",");
        body.lines()
            .filter(|l| l.starts_with(&format!("{metric}{with}")) && l.contains(kind))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let close = |a: f64, b: u64| (a - b as f64).abs() <= b as f64 * 0.03;
    // Refreshed every second: until the gauges show the memory held.
    let mut body = String::new();
    for _ in 0..30 {
        sleep(Duration::from_millis(500));
        body = scrape(&addr);
        if close(of(&body, "vmtrace_resident_bytes", ""), rss) {
            break;
        }
    }
    // The live resident profile: the program's samples add up to its VmRSS
    // of now, the 128 MiB under `hold`, the freed buffer under nothing.
    let (in_profile, sites) = pprof_by_function(&profile_at(&addr, "/debug/pprof/resident"), u64::from(pid));
    let rss_now = status_kb(pid, "VmRSS");
    let _ = hold.kill();
    let _ = hold.wait();
    let under = |f: &str| sites.get(f).copied().unwrap_or(0);
    eprintln!(
        "pid {pid}: /debug/pprof/resident {in_profile} bytes (hold {}, temporary {}), VmRSS {rss_now}",
        under("hold"),
        under("temporary")
    );
    assert!(in_profile.abs_diff(rss_now) <= rss_now * 3 / 100, "profile {in_profile} vs VmRSS {rss_now}: {sites:?}");
    assert!(under("hold").abs_diff(128 << 20) <= (128 << 20) / 20, "hold {} of 128 MiB: {sites:?}", under("hold"));
    assert_eq!(under("temporary"), 0, "the freed buffer holds nothing now: {sites:?}");
    let (status, _) = http_get(&addr, "/debug/pprof/resident?seconds=5");
    assert_eq!(status, 400, "a window of a gauge is refused");
    let total = of(&body, "vmtrace_resident_bytes", "");
    eprintln!(
        "pid {pid}: vmtrace_resident_bytes {total}, VmRSS {rss}; peak {}, VmHWM {hwm}",
        of(&body, "vmtrace_resident_peak_bytes", "")
    );
    assert!(close(total, rss), "resident bytes {total} vs VmRSS {rss}:\n{body}");
    let anon_series = of(&body, "vmtrace_resident_bytes", "kind=\"anon\"");
    assert!(close(anon_series, anon), "anon {anon_series} vs RssAnon {anon}");
    let peak = of(&body, "vmtrace_resident_peak_bytes", "");
    assert!(close(peak, hwm), "peak {peak} vs VmHWM {hwm}:\n{body}");
    assert!(body.contains("# TYPE vmtrace_resident_bytes gauge"), "{body}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.id() as i32, libc::SIGINT) };
    assert!(vm.wait().unwrap().success());
}

/// The gzipped pprof profile at `target`, decoded.
fn profile_at(addr: &str, target: &str) -> vmtrace_protos::pprof::Profile {
    let (status, body) = http_get(addr, target);
    assert_eq!(status, 200, "{target}: {}", String::from_utf8_lossy(&body));
    pprof_from_gzip(&body)
}

/// The faults in `/debug/pprof/faults` (its first sample type, summed).
fn profile_faults(addr: &str) -> u64 {
    let p = profile_at(addr, "/debug/pprof/faults");
    p.sample.iter().map(|s| u64::try_from(s.value[0]).unwrap_or(0)).sum()
}

/// A watched shell's children exit, and a second later `serve` lets go of
/// their maps and mapping histories: their faults stay in the faults
/// profile, as many as the metrics count, and no more than the kernel
/// counted for the shell and its children.
#[test]
fn exited_children_keep_their_faults_in_the_profile_and_the_metrics() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let (go, done) = (dir.path().join("go"), dir.path().join("done"));
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; for i in 1 2 3; do {BIN} workload touch --mib 32 > /dev/null; done; \
         touch {}; sleep 60",
        go.display(),
        done.display()
    );
    let mut sh = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let pid = sh.id();
    let (mut vm, addr) = serve_with(&["-p", &pid.to_string()]);
    let addr = addr.as_str();
    // Serving: the shell's children start now, traced from their start.
    std::fs::write(&go, "").unwrap();
    let start = std::time::Instant::now();
    while !done.exists() {
        assert!(start.elapsed() < Duration::from_mins(1), "the shell's children never finished");
        sleep(Duration::from_millis(100));
    }
    // Let go a second after their exit; the metrics refresh every second.
    sleep(Duration::from_secs(3));
    let metrics = total(&scrape(addr), "vmtrace_page_faults_total{", "") as u64;
    let profile = profile_faults(addr);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<u64> = stat.rsplit_once(')').unwrap().1.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // minflt, cminflt, majflt, cmajflt: the shell's and its waited-for children's.
    let kernel = f[7] + f[8] + f[9] + f[10];
    let _ = sh.kill();
    let _ = sh.wait();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.id() as i32, libc::SIGINT) };
    let _ = vm.wait();
    eprintln!("metrics {metrics} faults, profile {profile}, kernel {kernel} (shell and children)");
    assert_eq!(profile, metrics, "the profile's faults against the metrics'");
    assert!(metrics >= 3 * 8192, "three 32 MiB first touches: {metrics} faults");
    assert!(metrics <= kernel, "no more than the kernel counted: {metrics} > {kernel}");
}

/// The faults of `pid`'s waited-for children (cminflt + cmajflt of its
/// /proc/PID/stat).
fn children_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<u64> = stat.rsplit_once(')').unwrap().1.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    f[8] + f[10]
}

/// uc32 (issue #36): a job started in serve's first seconds whose launcher
/// has no rank (a shell without RANK forks, the child execs `env RANK=3`,
/// which execs the workload) has its faults after that exec under rank 3,
/// as many as the kernel counted for the child less its few pre-exec ones.
/// The shell waits on a fifo (no child of its own before the job), so its
/// children's counts are the job's alone.
#[test]
fn a_job_started_as_serve_starts_has_its_faults_under_its_rank() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let (go, done) = (dir.path().join("go"), dir.path().join("done"));
    let fifo = std::ffi::CString::new(go.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let script = format!(
        "read x < {}; env RANK=3 {BIN} workload touch --mib 64 > /dev/null; echo > {}; exec sleep 60",
        go.display(),
        done.display()
    );
    let mut sh = Command::new("sh").args(["-c", &script]).env_remove("RANK").spawn().unwrap();
    let pid = sh.id();
    let (mut vm, addr) = serve_with(&["-p", &pid.to_string()]);
    // At once: the job runs through serve's first refreshes.
    std::fs::write(&go, "go\n").unwrap();
    let start = std::time::Instant::now();
    while !done.exists() {
        assert!(start.elapsed() < Duration::from_mins(1), "the job never finished");
        sleep(Duration::from_millis(50));
    }
    let kernel = children_faults(pid);
    // The metrics refresh every second.
    sleep(Duration::from_millis(2500));
    let body = scrape(&addr);
    let _ = sh.kill();
    let _ = sh.wait();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.id() as i32, libc::SIGINT) };
    let _ = vm.wait();
    let ranked = total(&body, "vmtrace_cgroup_page_faults_total{", "rank=\"3\"") as u64;
    eprintln!("rank 3: {ranked} faults; the kernel counted {kernel} for the job (pre-exec parts included)");
    assert!(ranked <= kernel, "more under rank 3 than the kernel counted: {ranked} > {kernel}\n{body}");
    // The fork child's and env's faults before the workload's exec (~150) are the launcher's.
    assert!(ranked + 400 >= kernel, "rank 3 has {ranked} of the job's {kernel} faults\n{body}");
}

/// uc30 bug 8: once lingering series were dropped, the process series no
/// longer added up to the cgroup series (16.78M against 21.06M after
/// 12 min). A short churn with three process places and series dropped 1 s
/// after their last process: at every scrape both sums are equal, equal
/// to the cumulative fault profile at the end, no counter goes back, and
/// the dropped series' counts are in `comm="[exited]"`.
#[test]
fn dropped_series_keep_the_process_sums_whole() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let (go, done) = (dir.path().join("go"), dir.path().join("done"));
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; for i in 1 2 3 4 5; do \
         {BIN} workload touch --mib 8 --pace-ms 250 > /dev/null; sleep 1.5; done; touch {}; sleep 60",
        go.display(),
        done.display()
    );
    let mut sh = Command::new("sh").args(["-c", &script]).spawn().unwrap();
    let pid = sh.id();
    let (mut vm, addr) =
        serve_with_env(&[("VMTRACE_TEST_SERVE_LINGER_MS", "1000")], &["-p", &pid.to_string(), "--top", "3"]);
    let addr = addr.as_str();
    // The first refresh (every second) before the first scrape.
    sleep(Duration::from_millis(1500));
    std::fs::write(&go, "").unwrap();
    let start = std::time::Instant::now();
    let mut last: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    let mut scrapes = 0;
    let check = |body: &str, last: &mut std::collections::BTreeMap<String, f64>| {
        let procs = total(body, "vmtrace_page_faults_total{", "");
        let cgroups = total(body, "vmtrace_cgroup_page_faults_total{", "");
        assert_eq!(procs as u64, cgroups as u64, "process series against cgroup series:\n{body}");
        for l in body.lines().filter(|l| l.contains("page_faults_total{")) {
            let (series, v) = l.rsplit_once(' ').unwrap();
            let v: f64 = v.parse().unwrap();
            let before = last.insert(series.to_string(), v).unwrap_or(0.0);
            assert!(v >= before, "{series} went back from {before} to {v}");
        }
        procs
    };
    while !done.exists() {
        assert!(start.elapsed() < Duration::from_mins(1), "the shell's children never finished");
        check(&scrape(addr), &mut last);
        scrapes += 1;
        sleep(Duration::from_millis(300));
    }
    // The last workload's series lingers 1 s, then goes too.
    sleep(Duration::from_secs(3));
    let body = scrape(addr);
    let sum = check(&body, &mut last) as u64;
    let profile = profile_faults(addr);
    let _ = sh.kill();
    let _ = sh.wait();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.id() as i32, libc::SIGINT) };
    let _ = vm.wait();
    eprintln!("{scrapes} scrapes; metrics {sum} faults, profile {profile}");
    let exited = total(&body, "vmtrace_page_faults_total{pid=\"\",comm=\"[exited]\"", "") as u64;
    // Each workload (8 MiB over 2 s) has a series from the refresh after its start, until 1 s after its exit.
    assert!(exited >= 2 * 1024, "the workloads' dropped series are in [exited]: {exited}\n{body}");
    assert_eq!(sum, profile, "the metrics' faults against the cumulative profile's");
    assert!(sum >= 5 * 2048, "five 8 MiB first touches: {sum}");
}

/// A port already in use is the error, before any probe is loaded: run by
/// a user who may not load them, serve names the address, not the missing
/// privilege (uc32: the error came after the probes loaded, 22 s on a busy
/// machine).
#[test]
fn a_port_in_use_is_said_before_the_probes_load() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let dir = common::world_reachable_dir();
    let bin = common::world_runnable_bin(dir.path());
    let mut c = Command::new(&bin);
    c.args(["serve", "--listen", &addr]).current_dir(dir.path());
    if running_as_root() {
        common::as_nobody(&mut c);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
}

fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
