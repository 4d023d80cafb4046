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
    collect::{install_stop_handlers, stop_signal, Session},
    loader::{Families, LoadOptions, Probes},
    record::{preflight, RecordError},
    report::summary::Faults,
    stacks::StackMode,
    target::{check_pid, pid_alive, Target},
};

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
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.minor += o.minor;
        self.major += o.major;
        self.cow += o.cow;
        self.fault_ns += o.fault_ns;
        self.ipis += o.ipis;
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The exposition text for the current state of the trace.
fn render(session: &mut Session, labeled: &mut BTreeSet<u32>, top: usize) -> String {
    let mut per: BTreeMap<u32, Counts> = BTreeMap::new();
    // Live processes from the kernel maps, exited ones from what was taken at their exit.
    for (pid, s) in session.stats_totals() {
        let f = Faults::from_stats(&s, session.minor_period);
        let c = per.entry(pid).or_default();
        c.minor += f.minor;
        c.major += f.major;
        c.cow += f.cow;
        c.fault_ns += f.time_ns;
    }
    for (pid, m) in session.mm_totals() {
        per.entry(pid).or_default().ipis += m.ipis_sent;
    }
    let mut series: BTreeMap<(String, String), Counts> = BTreeMap::new();
    for (pid, c) in per {
        if !labeled.contains(&pid) && labeled.len() < top {
            labeled.insert(pid);
        }
        let key = if labeled.contains(&pid) {
            // ensure() reads /proc for processes that predate the trace.
            (pid.to_string(), session.table.ensure(pid).comm.clone())
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
    let _ = writeln!(t, "# TYPE vmtrace_oom_kills counter\n# HELP vmtrace_oom_kills OOM kills seen on the machine.");
    let _ = writeln!(t, "vmtrace_oom_kills_total {}", session.ooms.len());
    let lost: u64 = session.probes.drops().iter().sum();
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

pub fn serve(opts: &ServeOptions) -> Result<i32, RecordError> {
    if !opts.listen.ip().is_loopback() && !opts.allow_remote {
        return Err(RecordError::Preflight(format!(
            "refusing to listen on {}: the metrics would be reachable from the network\nhint: pass --allow-remote to do that on purpose",
            opts.listen
        )));
    }
    if let Target::Pid(pid) = opts.target {
        check_pid(pid)?;
    }
    preflight()?;
    let families = Families { oom: true, mmap: true, tlb: true, regions: false };
    let probes = Probes::load(&LoadOptions {
        trace_all: matches!(opts.target, Target::System),
        minor_period: 1,
        force_tracepoints: false,
        families,
        stacks: StackMode::None,
        stack_period: 1,
        leaf_region: false,
        end_on_tasks: false,
    })?;
    let mut session = Session::new(probes, families);
    if let Target::Pid(pid) = opts.target {
        session.probes.trace_pid(pid).map_err(|e| RecordError::Trace(pid, e))?;
        session.table.ensure(pid);
    }
    session.probes.start_counting();
    let listener = TcpListener::bind(opts.listen)
        .map_err(|err| RecordError::Preflight(format!("cannot listen on {}: {err}", opts.listen)))?;
    let addr = listener.local_addr().map_err(|err| RecordError::Preflight(err.to_string()))?;
    let body = Arc::new(Mutex::new(String::from("# EOF\n")));
    let shared = Arc::clone(&body);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let text = shared.lock().map(|b| b.clone()).unwrap_or_default();
            answer(&mut stream, &text);
        }
    });
    install_stop_handlers();
    session.start_clock();
    eprintln!("vmtrace: serving OpenMetrics on http://{addr}/metrics (Ctrl-C to stop)");
    let mut labeled = BTreeSet::new();
    let mut next = Instant::now();
    loop {
        session.poll(Duration::from_millis(100));
        if Instant::now() >= next {
            let text = render(&mut session, &mut labeled, opts.top);
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
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
