//! `vmtrace serve` as a node agent, read by the real engines (privileged):
//! Debian's `prometheus` scrapes it over loopback and its HTTP API returns
//! the fault series of a process this test runs in a Kubernetes-style memory
//! cgroup (`kubepods/burstable/pod<uid>/<container id>`) with `RANK` set,
//! labelled with that pod, container and rank, at the kernel's count of the
//! process's faults (/proc/PID/stat); `go tool pprof` reads
//! `/debug/pprof/faults` over HTTP with the same total for that pod.
mod common;

use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use common::*;
use serde_json::Value;

/// A child killed and reaped on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// (minflt, majflt) of `pid` from /proc/PID/stat: the kernel's count.
fn kernel_faults(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (f[7].parse().unwrap(), f[9].parse().unwrap())
}

/// The series of a Prometheus instant query.
fn query(prom: &str, q: &str) -> Vec<Value> {
    let enc: String = q
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_-.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={enc}"));
    if status != 200 {
        return Vec::new();
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value_of(series: &Value) -> f64 {
    series["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN)
}

/// `vmtrace serve -a`, every process with its own series, and its address.
fn start_serve() -> (Killed, String) {
    let mut vm = vmtrace()
        .args(["serve", "--listen", "127.0.0.1:0", "-a", "--top", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = BufReader::new(vm.stderr.take().unwrap());
    err.read_line(&mut line).unwrap();
    // Whatever it says later goes to the test's stderr (a closed pipe would fail its writes).
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::stderr()));
    let vm = Killed(vm);
    let addr =
        line.split("http://").nth(1).and_then(|r| r.split('/').next()).unwrap_or_else(|| panic!("{line}")).to_string();
    (vm, addr)
}

/// Prometheus scraping `target` every second, and its address.
fn start_prometheus(dir: &Path, target: &str) -> (Killed, String) {
    let prom = format!("127.0.0.1:{}", free_port());
    let config = dir.join("prometheus.yml");
    let yml = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vmtrace\n    static_configs:\n      - targets: ['{target}']\n"
    );
    std::fs::write(&config, yml).unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    (Killed(child), prom)
}

#[test]
fn prometheus_and_pprof_read_a_pods_faults_by_pod_container_and_rank() {
    privileged!();
    if !have_prometheus("prometheus_and_pprof_read_a_pods_faults_by_pod_container_and_rank")
        || !have_go("prometheus_and_pprof_read_a_pods_faults_by_pod_container_and_rank")
    {
        return;
    }
    let unix_now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let began = unix_now();
    let dir = tempfile::tempdir().unwrap();
    let hold = compile_c("hold_memory.c", dir.path());
    let cg = PodCgroup::new();
    let (vm, addr) = start_serve();
    let (_prometheus, prom) = start_prometheus(dir.path(), &addr);
    // The workload: moves itself into the pod's container cgroup, then execs
    // a program that touches 64 MiB and holds it, with its rank in its environment.
    let ready = dir.path().join("ready");
    let script =
        format!("echo $$ > {}/cgroup.procs && exec {} 64 {}", cg.leaf.display(), hold.display(), ready.display());
    let work = Killed(
        Command::new("sh")
            .args(["-c", &script])
            .env("RANK", "5")
            .env("LOCAL_RANK", "1")
            .env("WORLD_SIZE", "8")
            .spawn()
            .unwrap(),
    );
    let pid = work.0.id();
    let start = Instant::now();
    while !ready.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "the workload never got ready");
        sleep(Duration::from_millis(50));
    }
    let (minflt, majflt) = kernel_faults(pid);
    let kernel = minflt + majflt;
    // Prometheus has the pod's series once it scraped them at the held count.
    let q = format!("sum(vmtrace_cgroup_page_faults_total{{pod_uid=\"{}\"}})", cg.uid);
    let mut got = 0.0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(90) {
        got = query(&prom, &q).first().map_or(0.0, value_of);
        if (got - kernel as f64).abs() <= kernel as f64 * 0.03 {
            break;
        }
        sleep(Duration::from_millis(500));
    }
    let log = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    eprintln!("pid {pid}: Prometheus says {got} faults for pod {}, the kernel {kernel} ({minflt} minor)", cg.uid);
    if (got - kernel as f64).abs() > kernel as f64 * 0.03 {
        // What vmtrace itself serves for the process and the pod, and whether Prometheus scrapes it.
        let (_, m) = http_get(&addr, "/metrics");
        let m = String::from_utf8_lossy(&m).to_string();
        let ours: Vec<&str> =
            m.lines().filter(|l| l.contains(&format!("pid=\"{pid}\"")) || l.contains(&cg.uid)).collect();
        let up = query(&prom, "up");
        panic!(
            "Prometheus: {got} faults in pod {}; the kernel counted {kernel}\nvmtrace serves:\n{}\nup: {up:?}\nprometheus log tail:\n{}",
            cg.uid,
            ours.join("\n"),
            log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
        );
    }
    // The series carry the pod, the container and the rank.
    let series = query(&prom, &format!("vmtrace_cgroup_page_faults_total{{pod_uid=\"{}\",kind=\"minor\"}}", cg.uid));
    assert_eq!(series.len(), 1, "one cgroup-and-rank series for the pod: {series:?}");
    let m = &series[0]["metric"];
    assert_eq!(m["container_id"], cg.id.as_str(), "{m}");
    assert_eq!(m["rank"], "5", "{m}");
    assert!(
        m["cgroup"].as_str().is_some_and(|c| c.ends_with(&format!("/kubepods/burstable/pod{}/{}", cg.uid, cg.id))),
        "{m}"
    );
    assert_eq!(m["job"], "vmtrace", "{m}");
    // uc32 (issue #36): the series says when it started counting
    // (OpenMetrics `_created`, a series of its own in Prometheus): after this
    // test began, as serve started in it.
    let created = query(&prom, &format!("vmtrace_cgroup_page_faults_created{{pod_uid=\"{}\",kind=\"minor\"}}", cg.uid));
    let created = created.first().map_or(f64::NAN, value_of);
    eprintln!("pod {}: created {created}, test began {began}", cg.uid);
    assert!(created >= began - 1.0 && created <= unix_now(), "created {created}, test began {began}");
    // The process's own series, with the same labels and its pid.
    let own =
        query(&prom, &format!("sum(vmtrace_page_faults_total{{pid=\"{pid}\",rank=\"5\",pod_uid=\"{}\"}})", cg.uid));
    let own = own.first().map_or(0.0, value_of);
    assert!((own - kernel as f64).abs() <= kernel as f64 * 0.03, "the process's series {own}, the kernel {kernel}");

    // go tool pprof reads the faults profile over HTTP: the pod's samples
    // add up to its metric (both read while the workload holds still).
    let metric = {
        let (_, body) = http_get(&addr, "/metrics");
        let body = String::from_utf8(body).unwrap();
        body.lines()
            .filter(|l| {
                l.starts_with("vmtrace_cgroup_page_faults_total{") && l.contains(&format!("pod_uid=\"{}\"", cg.uid))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum::<u64>()
    };
    let raw = go_pprof_raw(&addr, "faults", dir.path());
    let in_pod = raw_total(&raw, &format!("pod_uid:[{}]", cg.uid));
    eprintln!("pod {}: /metrics {metric} faults, /debug/pprof/faults {in_pod}", cg.uid);
    assert!(in_pod > 0 && in_pod.abs_diff(metric) <= 2 + metric / 200, "profile {in_pod} vs metrics {metric}\n{raw}");
    assert!(raw.contains("rank:[5]") && raw.contains(&format!("container_id:[{}]", cg.id)), "{raw}");
    // And the resident profile: what the pod's process holds now, by call
    // site, adds up to its VmRSS.
    let raw = go_pprof_raw(&addr, "resident", dir.path());
    let rss = status_kb(pid, "VmRSS");
    let held = raw_total(&raw, &format!("pod_uid:[{}]", cg.uid));
    eprintln!("pod {}: /debug/pprof/resident {held} bytes, VmRSS {rss}", cg.uid);
    assert!(held.abs_diff(rss) <= rss * 3 / 100, "resident profile {held} vs VmRSS {rss}\n{raw}");

    bad_requests_are_answered_clearly(&addr);
    drop(work);
    drop(vm);
}

/// `go tool pprof -raw` of the profile `name` served at `addr`.
fn go_pprof_raw(addr: &str, name: &str, tmp: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(format!("http://{addr}/debug/pprof/{name}"))
        .env("PPROF_TMPDIR", tmp)
        .output()
        .expect("go tool pprof");
    assert!(out.status.success(), "go tool pprof failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// An unknown profile, a bad window, and the health check.
fn bad_requests_are_answered_clearly(addr: &str) {
    let (status, body) = http_get(addr, "/debug/pprof/heap");
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("faults, fault-time"), "{}", String::from_utf8_lossy(&body));
    let (status, body) = http_get(addr, "/debug/pprof/faults?seconds=soon");
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("not a whole number"));
    assert_eq!(http_get(addr, "/healthz"), (200, b"ok\n".to_vec()));
}

/// The total of a `go tool pprof -raw` listing's samples whose labels hold `label`.
fn raw_total(raw: &str, label: &str) -> u64 {
    let mut total = 0;
    let mut current: Option<u64> = None;
    let mut matched = false;
    let mut flush = |v: Option<u64>, m: bool| {
        if m {
            total += v.unwrap_or(0);
        }
    };
    let mut in_samples = false;
    for l in raw.lines() {
        if l.starts_with("Samples:") {
            in_samples = true;
            continue;
        }
        if l.starts_with("Locations") {
            break;
        }
        if !in_samples {
            continue;
        }
        let t = l.trim_start();
        // A sample: `  VALUE: LOC LOC …`; its labels on the lines after it.
        if let Some((v, _)) = t.split_once(": ").filter(|(v, _)| v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty())
        {
            flush(current, matched);
            current = v.parse().ok();
            matched = false;
        } else if t.contains(label) {
            matched = true;
        }
    }
    flush(current, matched);
    total
}
