//! `vmtrace serve`: OpenMetrics text at `/metrics` for Prometheus, refreshed
//! every second from a running trace. Label cardinality is bounded: the first
//! `--top` processes seen keep their own series (sticky, so every counter only
//! grows); all later ones add into `comm="other"`.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    collect::{live::LiveScope, stop_signal},
    model::LiveSnapshot,
    target::{pid_alive, Target},
    trace::{Families, Front, Plan, Stacks, Timing, TraceError, Tracer},
};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0}: the metrics would be reachable from the network\nhint: pass --allow-remote to do that on purpose"
    )]
    Remote(SocketAddr),
    /// The target, preflight and starting the trace, shared with `record`.
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        err: std::io::Error,
    },
    #[error(transparent)]
    LocalAddr(std::io::Error),
}

pub struct ServeOptions {
    pub listen: SocketAddr,
    pub allow_remote: bool,
    pub target: Target,
    /// Processes with a series of their own; the rest are `other`.
    pub top: usize,
}

/// Per-process counters behind the series.
#[derive(Clone, Copy, Default)]
struct Counts {
    minor: u64,
    major: u64,
    cow: u64,
    fault_ns: u64,
    ipis: u64,
    /// Resident bytes now (anon, file, shmem) and the peak (gauges);
    /// `has_resident`: any process of the series had figures.
    anon: u64,
    file: u64,
    shmem: u64,
    peak: u64,
    has_resident: bool,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.minor += o.minor;
        self.major += o.major;
        self.cow += o.cow;
        self.fault_ns += o.fault_ns;
        self.ipis += o.ipis;
        self.anon += o.anon;
        self.file += o.file;
        self.shmem += o.shmem;
        // "other": the sum of its processes' peaks, an upper bound.
        self.peak += o.peak;
        self.has_resident |= o.has_resident;
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The first `top` processes ever seen keep a series of their own.
fn label_new(snap: &LiveSnapshot, labeled: &mut BTreeSet<u32>, top: usize) {
    for p in &snap.processes {
        if !labeled.contains(&p.pid) && labeled.len() < top {
            labeled.insert(p.pid);
        }
    }
}

/// The exposition text for one snapshot of the whole trace (exited
/// processes included, so every counter only grows).
fn render(snap: &LiveSnapshot, labeled: &BTreeSet<u32>) -> String {
    let mut series: BTreeMap<(String, String), Counts> = BTreeMap::new();
    for p in &snap.processes {
        let r = p.resident.unwrap_or_default();
        let c = Counts {
            minor: p.faults.minor,
            major: p.faults.major,
            cow: p.faults.cow,
            fault_ns: p.faults.time_ns,
            ipis: p.ipis_sent,
            anon: r.anon,
            file: r.file,
            shmem: r.shmem,
            peak: r.peak,
            has_resident: p.resident.is_some(),
        };
        let key = if labeled.contains(&p.pid) {
            (p.pid.to_string(), p.comm.clone().unwrap_or_default())
        } else {
            (String::new(), "other".into())
        };
        series.entry(key).or_default().add(&c);
    }
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# TYPE vmtrace_page_faults counter\n# HELP vmtrace_page_faults Page faults taken, by process and kind."
    );
    for ((pid, comm), c) in &series {
        for (kind, v) in [("minor", c.minor), ("major", c.major)] {
            let _ =
                writeln!(t, "vmtrace_page_faults_total{{pid=\"{pid}\",comm=\"{}\",kind=\"{kind}\"}} {v}", label(comm));
        }
    }
    let _ = writeln!(
        t,
        "# TYPE vmtrace_cow_faults counter\n# HELP vmtrace_cow_faults Copy-on-write (write-protect) faults."
    );
    for ((pid, comm), c) in &series {
        let _ = writeln!(t, "vmtrace_cow_faults_total{{pid=\"{pid}\",comm=\"{}\"}} {}", label(comm), c.cow);
    }
    let _ = writeln!(
        t,
        "# TYPE vmtrace_fault_seconds counter\n# UNIT vmtrace_fault_seconds seconds\n# HELP vmtrace_fault_seconds Time in the fault handler (minor latency sampled, scaled)."
    );
    for ((pid, comm), c) in &series {
        let _ = writeln!(
            t,
            "vmtrace_fault_seconds_total{{pid=\"{pid}\",comm=\"{}\"}} {:.9}",
            label(comm),
            c.fault_ns as f64 / 1e9
        );
    }
    let _ = writeln!(t, "# TYPE vmtrace_tlb_shootdown_ipis counter\n# HELP vmtrace_tlb_shootdown_ipis TLB-flush IPIs sent to other CPUs.");
    for ((pid, comm), c) in &series {
        let _ = writeln!(t, "vmtrace_tlb_shootdown_ipis_total{{pid=\"{pid}\",comm=\"{}\"}} {}", label(comm), c.ipis);
    }
    let resident: Vec<_> = series.iter().filter(|(_, c)| c.has_resident).collect();
    if !resident.is_empty() {
        let _ = writeln!(
            t,
            "# TYPE vmtrace_resident_bytes gauge\n# UNIT vmtrace_resident_bytes bytes\n# HELP vmtrace_resident_bytes Resident memory now, by kind (the kernel's rss_stat counters; 0 once exited)."
        );
        for ((pid, comm), c) in &resident {
            for (kind, v) in [("anon", c.anon), ("file", c.file), ("shmem", c.shmem)] {
                let _ =
                    writeln!(t, "vmtrace_resident_bytes{{pid=\"{pid}\",comm=\"{}\",kind=\"{kind}\"}} {v}", label(comm));
            }
        }
        let _ = writeln!(
            t,
            "# TYPE vmtrace_resident_peak_bytes gauge\n# UNIT vmtrace_resident_peak_bytes bytes\n# HELP vmtrace_resident_peak_bytes Largest resident memory (anon + file + shmem) so far (\"other\": the sum of its processes' peaks)."
        );
        for ((pid, comm), c) in &resident {
            let _ = writeln!(t, "vmtrace_resident_peak_bytes{{pid=\"{pid}\",comm=\"{}\"}} {}", label(comm), c.peak);
        }
    }
    let _ = writeln!(t, "# TYPE vmtrace_oom_kills counter\n# HELP vmtrace_oom_kills OOM kills seen on the machine.");
    let _ = writeln!(t, "vmtrace_oom_kills_total {}", snap.oom_kills);
    let lost = snap.drops.all_counters();
    let _ = writeln!(t, "# TYPE vmtrace_dropped counter\n# HELP vmtrace_dropped Events and samples dropped anywhere (all drop counters).");
    let _ = writeln!(t, "vmtrace_dropped_total {lost}");
    t.push_str("# EOF\n");
    t
}

/// Answers `GET /metrics` with the latest text; anything else is 404.
fn answer(stream: &mut std::net::TcpStream, body: &str) {
    let mut req = [0u8; 2048];
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let n = stream.read(&mut req).unwrap_or(0);
    let first = String::from_utf8_lossy(&req[..n]).lines().next().unwrap_or_default().to_string();
    let reply = if first.starts_with("GET /metrics") {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\nConnection: close\r\n\r\nonly /metrics is here\n".to_string()
    };
    let _ = stream.write_all(reply.as_bytes());
}

pub fn serve(opts: &ServeOptions) -> Result<i32, ServeError> {
    if !opts.listen.ip().is_loopback() && !opts.allow_remote {
        return Err(ServeError::Remote(opts.listen));
    }
    let plan = Plan {
        families: Families { regions: false, perf: false, ..Families::ALL },
        stacks: Stacks::NONE,
        timing: Timing::EVERY_FAULT,
        // No storms: the metrics count shootdowns, no culprit is named.
        storm_threshold: f64::MAX,
        ..Plan::new(opts.target.clone())
    };
    let mut tracer = Tracer::start(&plan, Front::Metrics, None)?;
    let listener = TcpListener::bind(opts.listen).map_err(|err| ServeError::Listen { addr: opts.listen, err })?;
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    let body = Arc::new(Mutex::new(String::from("# EOF\n")));
    let shared = Arc::clone(&body);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let text = shared.lock().map(|b| b.clone()).unwrap_or_default();
            answer(&mut stream, &text);
        }
    });
    eprintln!("vmtrace: serving OpenMetrics on http://{addr}/metrics (Ctrl-C to stop)");
    let mut labeled = BTreeSet::new();
    let mut next = Instant::now();
    let session = tracer.session();
    loop {
        session.poll(Duration::from_millis(100));
        if Instant::now() >= next {
            let mut snap = session.live_snapshot(LiveScope::WholeTrace);
            label_new(&snap, &mut labeled, opts.top);
            // Names read from /proc for labeled processes that predate the trace.
            session.name_processes(&mut snap, |pid| labeled.contains(&pid));
            let text = render(&snap, &labeled);
            if let Ok(mut b) = body.lock() {
                *b = text;
            }
            next += Duration::from_secs(1);
        }
        if stop_signal().is_some() {
            return Ok(0);
        }
        if let Target::Pid(pid) = opts.target {
            if !pid_alive(pid) {
                eprintln!("vmtrace: pid {pid} exited");
                return Ok(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_processes_keep_their_series_the_rest_are_other() {
        use crate::model::{DropCounts, LiveProcess};
        let stats = |started| vmtrace_common::FaultStats { started, ..Default::default() };
        let proc = |pid: u32, n: u64| LiveProcess {
            resident: Some(crate::model::LiveResident { anon: n << 20, file: 4096, shmem: 0, peak: 2 * (n << 20) }),
            ..LiveProcess::from_counters(pid, Some(format!("p{pid}")), &stats(n), None, 1)
        };
        let snap = LiveSnapshot {
            processes: vec![proc(3, 10), proc(5, 20), proc(9, 40)],
            drops: DropCounts { by_kind: vec![1, 0, 0, 7], malformed_events: 0 },
            oom_kills: 2,
            ..LiveSnapshot::default()
        };
        let mut labeled = BTreeSet::new();
        label_new(&snap, &mut labeled, 1);
        let t = render(&snap, &labeled);
        assert!(t.contains("vmtrace_page_faults_total{pid=\"3\",comm=\"p3\",kind=\"minor\"} 10\n"), "{t}");
        assert!(t.contains("vmtrace_page_faults_total{pid=\"\",comm=\"other\",kind=\"minor\"} 60\n"), "{t}");
        assert!(t.contains("vmtrace_oom_kills_total 2\n"), "{t}");
        assert!(t.contains("vmtrace_resident_bytes{pid=\"3\",comm=\"p3\",kind=\"anon\"} 10485760\n"), "{t}");
        assert!(t.contains("vmtrace_resident_bytes{pid=\"3\",comm=\"p3\",kind=\"file\"} 4096\n"), "{t}");
        assert!(t.contains("vmtrace_resident_bytes{pid=\"\",comm=\"other\",kind=\"anon\"} 62914560\n"), "{t}");
        assert!(t.contains("vmtrace_resident_peak_bytes{pid=\"3\",comm=\"p3\"} 20971520\n"), "{t}");
        assert!(t.contains("# UNIT vmtrace_resident_bytes bytes\n"), "{t}");
        assert!(t.contains("vmtrace_dropped_total 8\n"), "every drop counter, untimed faults included: {t}");
        assert!(render(&LiveSnapshot::default(), &labeled).ends_with("vmtrace_dropped_total 0\n# EOF\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
