//! `vmtrace serve`: a node agent. OpenMetrics at `/metrics` for Prometheus
//! (refreshed every second; series per cgroup and rank and per top process,
//! bounded whatever the churn: `metrics.rs`), the pprof profiles at
//! `/debug/pprof/<name>` for Parca and Pyroscope (`profiles.rs`), and
//! `/healthz`. The trace runs on this thread; each connection is answered on
//! a thread of its own, which asks this one for a profile's samples.
mod http;
mod metrics;
mod profiles;

use std::{
    collections::BTreeSet,
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    time::{Duration, Instant},
};

use http::{Reply, Route};

use crate::{
    collect::{live::LiveScope, stop_signal},
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
    /// Processes with series of their own; the rest add into `comm="other"`.
    pub top: usize,
    /// Cgroups (and ranks) with series of their own; the rest add into `cgroup="other"`.
    pub cgroups: usize,
    /// Take fault stacks for `/debug/pprof/` (off: the profiles answer 404).
    pub profiles: bool,
}

/// A connection thread's request for one profile's samples now.
struct Job {
    kind: crate::export::pprof::Kind,
    reply: mpsc::Sender<profiles::Snapshot>,
}

/// What the connection threads share with the trace's thread.
struct Shared {
    metrics: Mutex<String>,
    /// Seconds of the trace at the last refresh, as f64 bits.
    refreshed_s: AtomicU64,
    started: Instant,
    jobs: Mutex<mpsc::Sender<Job>>,
    profiles: bool,
    host: String,
    connections: AtomicUsize,
}

/// Connections answered at once; more get 503.
const MAX_CONNECTIONS: usize = 64;

/// How often live processes' names are read again from /proc (renamed since
/// their fork or exec: a process series' `comm` label follows).
const RENAME_EVERY: Duration = Duration::from_secs(2);

fn answer(stream: &mut TcpStream, shared: &Shared) {
    let Some((method, target)) = http::read_request(stream) else { return };
    let reply = match http::route(&method, &target) {
        Err(r) => r,
        Ok(Route::Metrics) => Reply {
            status: 200,
            content_type: "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body: shared.metrics.lock().map(|m| m.clone().into_bytes()).unwrap_or_default(),
        },
        Ok(Route::Healthz) => {
            let at = f64::from_bits(shared.refreshed_s.load(Ordering::Relaxed));
            let ago = shared.started.elapsed().as_secs_f64() - at;
            if ago < 10.0 {
                Reply::text(200, "ok\n")
            } else {
                Reply::text(503, format!("stalled: the metrics were last refreshed {ago:.0} s ago\n"))
            }
        }
        Ok(Route::Index) => Reply::text(200, http::index()),
        Ok(Route::Profile { .. }) if !shared.profiles => {
            Reply::text(404, "profiles are off: serve was started with --no-profiles\n")
        }
        Ok(Route::Profile { kind, seconds }) => profile(shared, kind, seconds),
    };
    http::send(stream, &reply, method == "HEAD");
}

/// Asks the trace's thread for `kind`'s samples now.
fn ask(shared: &Shared, kind: crate::export::pprof::Kind) -> Option<profiles::Snapshot> {
    let (tx, rx) = mpsc::channel();
    shared.jobs.lock().ok()?.send(Job { kind, reply: tx }).ok()?;
    rx.recv_timeout(Duration::from_mins(2)).ok()
}

fn profile(shared: &Shared, kind: crate::export::pprof::Kind, seconds: Option<u64>) -> Reply {
    let what = profiles::NAMES.iter().find(|n| n.0 == kind.stem).map_or(kind.stem, |n| n.1);
    let unavailable = || Reply::text(503, "the trace is stopping or stalled: no profile\n");
    let Some(first) = ask(shared, kind) else { return unavailable() };
    let (snap, duration_s) = match seconds {
        None => {
            let d = first.t_s;
            (first, d)
        }
        Some(n) => {
            std::thread::sleep(Duration::from_secs(n));
            let Some(second) = ask(shared, kind) else { return unavailable() };
            let d = second.t_s - first.t_s;
            (profiles::delta(&second, &first), d)
        }
    };
    match profiles::encode(kind, &snap, duration_s, what, &shared.host) {
        Ok(body) => Reply { status: 200, content_type: "application/octet-stream", body },
        Err(e) => Reply::text(500, format!("cannot encode the profile: {e}\n")),
    }
}

pub fn serve(opts: &ServeOptions) -> Result<i32, ServeError> {
    if !opts.listen.ip().is_loopback() && !opts.allow_remote {
        return Err(ServeError::Remote(opts.listen));
    }
    let plan = Plan {
        families: Families { regions: false, perf: false, ..Families::ALL },
        stacks: if opts.profiles { Stacks { python_frames: true, ..Stacks::DEFAULT } } else { Stacks::NONE },
        timing: Timing::EVERY_FAULT,
        // No storms: the metrics count shootdowns, no culprit is named.
        storm_threshold: f64::MAX,
        ..Plan::new(opts.target.clone())
    };
    // The address first: a port in use is said at once, not after the
    // probes load (uc32: 22 s on a busy machine). Connections made while
    // they load wait in the backlog.
    let listener = TcpListener::bind(opts.listen).map_err(|err| ServeError::Listen { addr: opts.listen, err })?;
    let mut tracer = Tracer::start(&plan, Front::Metrics, None)?;
    let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
    let (jobs_tx, jobs) = mpsc::channel::<Job>();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".into(), |h| h.trim().to_string());
    let shared = Arc::new(Shared {
        metrics: Mutex::new(String::from("# EOF\n")),
        refreshed_s: AtomicU64::new(0f64.to_bits()),
        started: Instant::now(),
        jobs: Mutex::new(jobs_tx),
        profiles: opts.profiles,
        host,
        connections: AtomicUsize::new(0),
    });
    let for_listener = Arc::clone(&shared);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let shared = Arc::clone(&for_listener);
            if shared.connections.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                shared.connections.fetch_sub(1, Ordering::AcqRel);
                http::send(&mut stream, &Reply::text(503, "too many connections at once\n"), false);
                continue;
            }
            std::thread::spawn(move || {
                answer(&mut stream, &shared);
                shared.connections.fetch_sub(1, Ordering::AcqRel);
            });
        }
    });
    // One write: a reader that takes the first line and closes the pipe
    // (the tests) must not make a second one fail.
    let profiles = if opts.profiles { format!(", profiles on http://{addr}/debug/pprof/") } else { String::new() };
    eprintln!("vmtrace: serving OpenMetrics on http://{addr}/metrics{profiles}, health on http://{addr}/healthz (Ctrl-C to stop)");
    let mut agg = metrics::Aggregator::new(opts.top, opts.cgroups);
    // Tests only: series dropped sooner than `metrics::LINGER` after their last process.
    if let Some(ms) = std::env::var("VMTRACE_TEST_SERVE_LINGER_MS").ok().and_then(|v| v.parse().ok()) {
        agg = agg.with_linger(Duration::from_millis(ms));
    }
    let mut next = Instant::now();
    let session = tracer.session();
    let period = u64::from(plan.stacks.period.max(1));
    loop {
        session.poll(Duration::from_millis(100));
        if Instant::now() >= next {
            session.rename_live(RENAME_EVERY);
            let mut snap = session.live_snapshot(LiveScope::WholeTrace);
            // Names read from /proc for the processes with series that predate the trace.
            let named: BTreeSet<u32> = snap
                .processes
                .iter()
                .filter(|p| p.comm.as_deref().is_none_or(str::is_empty) && !p.exited)
                .map(|p| p.pid)
                .collect();
            session.name_processes(&mut snap, |pid| named.contains(&pid));
            agg.update(&snap);
            if let Ok(mut m) = shared.metrics.lock() {
                *m = agg.render();
            }
            shared.refreshed_s.store(shared.started.elapsed().as_secs_f64().to_bits(), Ordering::Relaxed);
            next += Duration::from_secs(1);
            if next < Instant::now() {
                next = Instant::now() + Duration::from_secs(1);
            }
        }
        let pending: Vec<Job> = jobs.try_iter().collect();
        if !pending.is_empty() {
            let snap = session.live_snapshot(LiveScope::WholeTrace);
            let (stacks, sites) = session.live_stacks();
            let resident =
                if pending.iter().any(|j| profiles::is_gauge(j.kind)) { session.live_resident() } else { Vec::new() };
            let folded: std::collections::BTreeMap<u32, Arc<crate::model::Identity>> = (stacks.iter().map(|s| s.pid))
                .chain(sites.iter().map(|s| s.pid))
                .filter(|p| *p >= crate::collect::folded::FOLDED_IDENTITY_PIDS)
                .filter_map(|p| Some((p, session.folded_identity(p)?)))
                .collect();
            let inputs = profiles::Inputs { stacks: &stacks, sites: &sites, resident: &resident, folded: &folded };
            for job in pending {
                let _ = job.reply.send(profiles::take(job.kind, &inputs, &snap, period));
            }
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
