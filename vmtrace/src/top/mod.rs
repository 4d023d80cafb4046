//! `vmtrace top`: a live full-screen view of a command, a pid or the whole
//! system. The kernel keeps cumulative counters (the same programs as
//! `record`); every refresh reads them, turns them into rates ([`model`]) and
//! draws a frame ([`view`]). One tokio task multiplexes the ring-buffer
//! drain, the refresh timer and the keyboard.
pub mod layout;
pub mod model;
pub mod numa;
pub mod view;

use crate::hash::HashMap;
use std::{
    io::IsTerminal as _,
    time::{Duration, Instant},
};

use crate::model::live::{Cum, RateKeeper, Rates};
use crossterm::event::{Event, EventStream, KeyCode, KeyEventKind, KeyModifiers};
use futures_util::StreamExt as _;
use model::{ProcRow, RegionRow, Snapshot};
use tokio::io::{unix::AsyncFd, Interest};
use view::{Pane, ViewState};

use crate::{
    collect::{live::LiveScope, stop_signal, Session},
    loader::Probes,
    model::{OomRecord, RegionSummary},
    stacks::symbolize::Names,
    target::{pid_alive, wait_exit, Target},
    trace::{Front, PerfProbe, Plan, Stacks, Timing, TraceError, Tracer},
};

#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(
        "vmtrace top draws a full-screen view and needs a terminal, but stdout is not one\nhint: to pipe live data, use `vmtrace record --stream json`"
    )]
    NotATerminal,
    /// The target, preflight and starting it, shared with `record`.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The cause is in the message, not a `#[source]`: the hint stays the
    /// last line (the binary prints the source chain after the message).
    #[error(
        "cannot create {} for the command's output: {err}\nhint: choose a writable file with --command-output FILE",
        .path.display()
    )]
    CommandOutput { path: std::path::PathBuf, err: std::io::Error },
    #[error("cannot set up the terminal")]
    TerminalSetup(#[source] std::io::Error),
    #[error("cannot start the event loop")]
    EventLoop(#[source] std::io::Error),
    #[error("terminal")]
    Terminal(#[source] std::io::Error),
}

pub struct TopOptions {
    pub target: Target,
    /// Where a command's stdout and stderr go (the screen is the view's).
    pub command_output: Option<std::path::PathBuf>,
    pub interval: Duration,
    pub storm_threshold: f64,
}

const MINOR_PERIOD: u32 = 1;
/// Fault stacks are not shown live; user stacks stay on for the mmap call
/// sites that a storm banner blames. 1 in 10^6 faults keeps the walk cost nil.
const FAULT_STACK_PERIOD: u32 = 1_000_000;
/// Regions kept per refresh (the screen shows a screenful of them).
const MAX_REGION_ROWS: usize = 200;
/// How long an ended storm or an OOM kill stays on screen.
const BANNER_HOLD_S: f64 = 30.0;

/// Rates and banners from the session, refresh after refresh.
struct Model {
    procs: RateKeeper<u32>,
    regions: RateKeeper<(u32, u64)>,
    totals: RateKeeper<()>,
    /// Each process's resident bytes at the last refresh.
    resident_prev: HashMap<u32, u64>,
    dtlb_prev: Option<(u64, u64)>,
    last: Instant,
    names: Names,
    /// Storm culprit labels by (pid, call, user stack).
    sites: HashMap<(u32, u32, i32), String>,
    /// The NODE column's reads (hosts with two NUMA nodes or more).
    numa: Option<numa::NodeReads>,
}

impl Model {
    fn new() -> Self {
        Self {
            procs: RateKeeper::default(),
            regions: RateKeeper::default(),
            totals: RateKeeper::default(),
            resident_prev: HashMap::default(),
            dtlb_prev: None,
            last: Instant::now(),
            names: Names::default(),
            sites: HashMap::default(),
            numa: numa::NodeReads::new(&crate::numa::Topology::read()),
        }
    }

    /// `ended`: the target is gone, and the table keeps every process of the
    /// trace with its final count (those that exited at rate 0) instead of
    /// emptying as they leave the kernel's maps. `rows`: the most the
    /// screen can show (the NODE column reads those).
    fn refresh(
        &mut self,
        session: &mut Session<Probes>,
        perf: Option<&mut PerfProbe>,
        (sort, rows): (model::SortKey, usize),
        ended: bool,
    ) -> Snapshot {
        let dt = self.last.elapsed().as_secs_f64();
        self.last = Instant::now();
        session.rename_live(Duration::from_secs(2));
        let mut snap = session.live_snapshot(if ended { LiveScope::WholeTrace } else { LiveScope::Running });
        session.name_processes(&mut snap, |_| true);
        let rates = snap.rates(&mut self.procs, dt);
        let resident_now: HashMap<u32, u64> =
            snap.processes.iter().filter_map(|p| Some((p.pid, p.resident?.total()))).collect();
        let resident_prev = std::mem::replace(&mut self.resident_prev, resident_now.clone());
        // Growth over the refresh, per second; a process first seen now grew from nothing.
        let growth = |pid: u32| -> Option<f64> {
            let now = *resident_now.get(&pid)?;
            (dt > 0.0).then(|| (now as f64 - resident_prev.get(&pid).copied().unwrap_or(0) as f64) / dt)
        };
        let labels = worker_labels(session, &snap);
        let mut procs: Vec<ProcRow> = snap
            .processes
            .iter()
            .zip(rates)
            .map(|(p, (_, rates))| ProcRow {
                pid: p.pid,
                comm: with_identity(
                    labels.get(&p.pid).map_or_else(|| p.comm.as_deref().unwrap_or_default(), String::as_str),
                    p.identity.as_deref(),
                ),
                rates: if ended && session.known(p.pid).is_some_and(|k| k.exit_code.is_some()) {
                    Rates::default()
                } else {
                    rates
                },
                total_faults: p.faults.total,
                resident: resident_now.get(&p.pid).copied(),
                resident_per_s: growth(p.pid),
                node: None,
            })
            .collect();
        model::sort_procs(&mut procs, sort);
        let numa = self.numa.as_mut().map(|n| {
            let shown: Vec<u32> = procs.iter().take(rows).map(|p| p.pid).collect();
            n.refresh_in_background(Instant::now(), &shown);
            for p in &mut procs {
                p.node = n.cell(p.pid);
            }
            n.totals(&shown)
        });

        // Faults of processes that exited since the last refresh are in the
        // kernel's totals, not in any row: the header counts them.
        let (all, all_major) = (snap.all_faults, snap.all_major);
        let head = self.totals.update(&[((), Cum { faults: all, major: all_major, ..Cum::default() })], dt)[0].1;
        // fold from +0.0: an empty f64 sum() is -0.0, which prints as "-0".
        let sum = |f: fn(&Rates) -> f64| procs.iter().map(|p| f(&p.rates)).fold(0.0, |a, b| a + b);
        let total = Rates {
            faults: head.faults,
            minor: head.minor,
            major: head.major,
            fault_pct: sum(|r| r.fault_pct),
            cow: sum(|r| r.cow),
            munmap: sum(|r| r.munmap),
            ipis: sum(|r| r.ipis),
        };

        let (regions, attributed) = match session.families().regions.then(|| self.regions(session, dt, sort, ended)) {
            Some((rows, attributed)) => (Some(rows), Some(attributed)),
            None => (None, None),
        };
        let now_s = session.started().elapsed().as_secs_f64();
        let findings = live_findings(session, &snap, attributed, now_s);
        Snapshot {
            target: String::new(),
            uptime_s: now_s,
            total,
            total_faults: all,
            procs,
            regions,
            storms: self.storms(session, now_s),
            findings,
            oom: session.ooms().iter().rev().find(|o| now_s - o.time_s < BANNER_HOLD_S).map(oom_line),
            dtlb: self.dtlb(perf, dt),
            lost_events: snap.drops.lost(),
            ended: None,
            numa,
        }
    }

    /// While the target runs, the regions of live processes (as the
    /// process pane shows them): attributing every region of every process
    /// the trace has seen, each second, grew with churn. Once it ended, all.
    fn regions(
        &mut self,
        session: &mut Session<Probes>,
        dt: f64,
        sort: model::SortKey,
        ended: bool,
    ) -> (Vec<RegionRow>, Vec<RegionSummary>) {
        let attributed = if ended { session.build_regions() } else { session.build_live_regions() }.regions;
        let totals = model::region_totals(&attributed);
        let cums: Vec<((u32, u64), Cum)> = totals.iter().map(|t| (t.key, t.cum)).collect();
        let rates: HashMap<(u32, u64), Rates> = self.regions.update(&cums, dt).into_iter().collect();
        let mut rows: Vec<RegionRow> = totals
            .into_iter()
            .map(|t| RegionRow {
                pid: t.key.0,
                comm: session.known(t.key.0).map_or_else(String::new, |p| p.comm.clone()),
                rates: rates.get(&t.key).copied().unwrap_or_default(),
                name: t.name,
                kind: t.kind,
                size: t.size,
                total_faults: t.cum.faults,
                total_cow: t.cum.cow,
            })
            .collect();
        model::sort_regions(&mut rows, sort);
        rows.truncate(MAX_REGION_ROWS);
        (rows, attributed)
    }

    /// A line per storm going on, or ended in the last seconds, with the
    /// call site that sent most of its IPIs.
    fn storms(&mut self, session: &mut Session<Probes>, now_s: f64) -> Vec<String> {
        let storms: Vec<_> = session
            .storms()
            .open_storms()
            .map(|s| (s.clone(), true))
            .chain(
                session.storms().closed.iter().filter(|s| now_s - s.end_s < BANNER_HOLD_S).map(|s| (s.clone(), false)),
            )
            .collect();
        let mut out = Vec::new();
        for (s, open) in storms {
            let comm = session.known(s.pid).map_or_else(String::new, |p| p.comm.clone());
            let site = s.sites.iter().max_by_key(|(_, n)| **n).map(|(&(call, stack), _)| {
                let key = (s.pid, call, stack);
                if !self.sites.contains_key(&key) {
                    let frames = session.culprit_frames(&mut self.names, s.pid, call, stack);
                    // Leaf (the syscall) first, then its nearest callers.
                    let label = frames
                        .iter()
                        .rev()
                        .take(3)
                        .map(|f| f.strip_prefix('[').and_then(|f| f.strip_suffix(']')).unwrap_or(f))
                        .map(crate::model::short_name)
                        .collect::<Vec<_>>()
                        .join(" ← ");
                    let label = match crate::python::innermost_python(&frames) {
                        Some(py) if !label.contains(py) => format!("{label} ← … {py}"),
                        _ => label,
                    };
                    self.sites.insert(key, label);
                }
                self.sites[&key].clone()
            });
            let when = if open {
                format!("for {:.0} s", now_s - s.start_s)
            } else {
                format!("ended {:.0} s ago", now_s - s.end_s)
            };
            out.push(format!(
                "STORM pid {} ({comm}) {} IPIs/s peak, {when}{}",
                s.pid,
                model::human(s.peak_per_s),
                site.map(|l| format!(": {l}")).unwrap_or_default()
            ));
        }
        out
    }

    fn dtlb(&mut self, perf: Option<&mut PerfProbe>, dt: f64) -> String {
        let Some(p) = perf else { return "dTLB misses: not measured".into() };
        let s = p.read();
        if !s.supported {
            // The first clause of the reason fits on the line ("no hardware PMU visible").
            let why = s.reason.trim_start_matches("dTLB-load-misses: ");
            let why = why.split(" (perf_event_open").next().unwrap_or_default();
            return format!("dTLB: unsupported ({})", why.split(" — ").next().unwrap_or_default());
        }
        let misses = s.dtlb_load_misses.unwrap_or(0) + s.dtlb_store_misses.unwrap_or(0);
        let ins = s.instructions.unwrap_or(0);
        let prev = self.dtlb_prev.replace((misses, ins));
        let (m0, i0) = prev.unwrap_or((misses, ins));
        let dm = misses.saturating_sub(m0) as f64;
        let di = ins.saturating_sub(i0) as f64;
        if prev.is_none() || dt <= 0.0 {
            return "dTLB misses: measuring…".into();
        }
        let per_k = if di > 0.0 { format!(" ({:.2} per 1k instructions)", dm * 1000.0 / di) } else { String::new() };
        format!("dTLB misses {}/s{per_k}", model::human(dm / dt))
    }
}

fn oom_line(o: &OomRecord) -> String {
    let anon =
        if o.known("anon_rss_kb") { format!("{:.1} MiB", o.anon_rss_kb as f64 / 1024.0) } else { "unknown".into() };
    format!(
        "OOM KILL at {:.1} s: pid {} ({}) anon {anon}, {} constraint{}; triggered by pid {} ({})",
        o.time_s,
        o.victim_pid,
        o.victim_comm,
        o.constraint,
        o.cgroup.as_deref().map(|c| format!(" in {c}")).unwrap_or_default(),
        o.trigger_pid,
        o.trigger_comm
    )
}

fn describe(target: &Target) -> String {
    match target {
        Target::System => "system".into(),
        Target::Pid(pid) => format!("pid {pid}"),
        Target::Command(argv) => {
            let program = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
            let mut s =
                program.into_iter().chain(argv.iter().skip(1).map(String::as_str)).collect::<Vec<_>>().join(" ");
            if s.len() > 30 {
                s.truncate(s.floor_char_boundary(29));
                s.push('…');
            }
            s
        }
    }
}

pub fn run(opts: &TopOptions) -> Result<i32, TopError> {
    let plan = Plan {
        stacks: Stacks { period: FAULT_STACK_PERIOD, ..Stacks::DEFAULT },
        timing: Timing { minor_period: MINOR_PERIOD, fast_period: 1 },
        storm_threshold: opts.storm_threshold,
        ..Plan::new(opts.target.clone())
    };
    plan.check_target()?;
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    let log = match &opts.target {
        Target::Command(_) => {
            let path = opts
                .command_output
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join(format!("vmtrace-top-{}.log", std::process::id())));
            let file =
                std::fs::File::create(&path).map_err(|err| TopError::CommandOutput { path: path.clone(), err })?;
            Some((path, file))
        }
        _ => None,
    };
    let tracer = Tracer::start(&plan, Front::Live, log.as_ref().map(|(_, f)| f))?;
    let mut terminal = ratatui::try_init().map_err(TopError::TerminalSetup)?;
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_time().enable_io().build().map_err(TopError::EventLoop)?;
    let mut app = App {
        tracer,
        model: Model::new(),
        target: opts.target.clone(),
        view: ViewState::default(),
        shown: Snapshot::default(),
        ended: None,
        exit_status: None,
        log: log.map(|(p, _)| p),
    };
    let r = rt.block_on(app.run(&mut terminal, opts.interval));
    // The cursor to the last line before the alternate screen is left: a
    // terminal that has none (or ignores it) keeps the last frame on screen,
    // and the note below goes under it, not over the row the last draw
    // ended on (uc32 bug 7: it overwrote the python row of the final table).
    // A terminal that has one restores its own cursor.
    if let Ok(size) = terminal.size() {
        let _ = terminal.set_cursor_position((0, size.height.saturating_sub(1)));
    }
    ratatui::restore();
    r.map_err(TopError::Terminal)?;
    app.tracer.stop_counting();
    if let Some(p) = &app.log {
        eprintln!("\nvmtrace: the command's output is in {}", p.display());
    }
    Ok(app.finish())
}

struct App {
    tracer: Tracer,
    model: Model,
    target: Target,
    view: ViewState,
    /// The frame on screen (frozen while paused).
    shown: Snapshot,
    ended: Option<String>,
    exit_status: Option<i32>,
    /// The command's output file.
    log: Option<std::path::PathBuf>,
}

impl App {
    async fn run(&mut self, terminal: &mut ratatui::DefaultTerminal, interval: Duration) -> std::io::Result<()> {
        // Drained as soon as the kernel wakes us: a 100 ms nap would let a
        // burst of mapping events overflow the ring buffer.
        let ring_fd = self.tracer.ring_fd().try_clone_to_owned()?;
        // SAFETY: the AsyncFd owns this duplicate, open until the AsyncFd drops.
        let ring =
            unsafe { AsyncFd::register_with_interest(ring_fd, Interest::READABLE) }.map_err(std::io::Error::from)?;
        let mut keys = EventStream::new();
        let mut drain = tokio::time::interval(Duration::from_millis(100));
        // A baseline reading now, the first rates one interval later.
        let rows = usize::from(terminal.size()?.height);
        let (session, perf) = self.tracer.session_and_perf();
        self.model.refresh(session, perf, (self.view.sort, rows), false);
        self.shown.target = describe(&self.target);
        self.shown.dtlb = "dTLB: measuring…".into();
        terminal.draw(|f| view::draw(f, &self.shown, self.view))?;
        let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                ready = ring.readable() => {
                    let mut guard = ready?;
                    self.tracer.session().drain();
                    guard.clear_ready();
                }
                _ = drain.tick() => {
                    self.tracer.session().poll(Duration::ZERO);
                    self.check_target();
                    if stop_signal().is_some() {
                        return Ok(());
                    }
                }
                _ = refresh.tick() => {
                    let ended = self.ended.is_some();
                    let rows = usize::from(terminal.size()?.height);
                    let (session, perf) = self.tracer.session_and_perf();
                    let mut snap = self.model.refresh(session, perf, (self.view.sort, rows), ended);
                    snap.target = describe(&self.target);
                    snap.ended.clone_from(&self.ended);
                    if !self.view.paused {
                        self.shown = snap;
                    }
                    terminal.draw(|f| view::draw(f, &self.shown, self.view))?;
                }
                ev = keys.next() => {
                    match ev {
                        Some(Ok(Event::Key(k))) if k.kind == KeyEventKind::Press => {
                            let ctrl_c = k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c');
                            match k.code {
                                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                                _ if ctrl_c => return Ok(()),
                                KeyCode::Char('s') => {
                                    self.view.sort = self.view.sort.next();
                                    model::sort_procs(&mut self.shown.procs, self.view.sort);
                                    if let Some(r) = self.shown.regions.as_mut() {
                                        model::sort_regions(r, self.view.sort);
                                    }
                                }
                                KeyCode::Char('p') => self.view.paused = !self.view.paused,
                                KeyCode::Char('r') => {
                                    self.view.pane =
                                        if self.view.pane == Pane::Processes { Pane::Regions } else { Pane::Processes };
                                }
                                _ => continue,
                            }
                            terminal.draw(|f| view::draw(f, &self.shown, self.view))?;
                        }
                        Some(Ok(Event::Resize(..))) => {
                            terminal.draw(|f| view::draw(f, &self.shown, self.view))?;
                        }
                        Some(Err(e)) => return Err(e),
                        // Input closed (the terminal went away): stop.
                        None => return Ok(()),
                        _ => {}
                    }
                }
            }
        }
    }

    /// Notices the traced command or pid ending; the view stays up until `q`.
    fn check_target(&mut self) {
        if self.ended.is_some() {
            return;
        }
        if let Some(c) = self.tracer.child() {
            if let Some(st) = wait_exit(c.pid, false) {
                self.exit_status = Some(st);
                let log = self.log.as_ref().map(|p| format!(", output in {}", p.display())).unwrap_or_default();
                self.ended = Some(format!("command exited with status {st}{log} — final counts below; q to quit"));
            }
        } else if let Target::Pid(pid) = self.target {
            if !pid_alive(pid) {
                self.ended = Some(format!("pid {pid} exited — final counts below; q to quit"));
            }
        }
    }

    /// Leaving while the command still runs stops the whole job, as a stop
    /// signal does under `record`: the command and every traced process
    /// still running (a launcher's children, setsid'd workers) get SIGTERM,
    /// those left 2 s later SIGKILL. Its status is what `top` exits with.
    fn finish(mut self) -> i32 {
        let Some(command) = self.tracer.child().map(|c| c.pid).filter(|_| self.exit_status.is_none()) else {
            return self.exit_status.unwrap_or(0);
        };
        self.tracer.stop_job(command, libc::SIGTERM, &mut None);
        self.tracer.info().exit_status.or_else(|| wait_exit(command, true)).unwrap_or(137)
    }
}

/// The findings so far (docs/findings.md), one line each: the rules of
/// `record`'s summary run on what the trace holds now: each process's
/// counters, the live regions (`--events regions`), the storms and OOM kills.
fn live_findings(
    session: &Session<Probes>,
    snap: &crate::model::LiveSnapshot,
    regions: Option<Vec<RegionSummary>>,
    now_s: f64,
) -> Vec<String> {
    use crate::model::{CowFrom, Faults, Process, Sampling, Storm, Summary, TargetInfo};
    let families = session.families();
    let mm = if families.mmap { session.mm_totals() } else { std::collections::BTreeMap::new() };
    let processes: Vec<Process> = snap
        .processes
        .iter()
        .map(|p| {
            let info = session.known(p.pid);
            let mut cow = CowFrom::default();
            for c in regions.iter().flatten().filter(|r| r.pid == p.pid).filter_map(|r| r.cow_from.as_ref()) {
                cow.add(c);
            }
            Process {
                pid: p.pid,
                ppid: info.and_then(|i| i.ppid),
                comm: p.comm.clone().or_else(|| info.map(|i| i.comm.clone())).unwrap_or_default(),
                cmdline: info.and_then(|i| i.cmdline.clone()),
                exit_code: info.and_then(|i| i.exit_code),
                faults: p.faults.clone(),
                reclaim: crate::model::Reclaim::default(),
                migration: crate::model::Migration::default(),
                mmap: mm.get(&p.pid).map(|m| crate::model::MmapCounts {
                    brk_shrinks: info.map_or(0, |i| i.brk_shrinks),
                    ..crate::collect::assemble::mmap_counts(m)
                }),
                tlb: None,
                kernel_accounting: None,
                cow_from: (cow.total() > 0).then_some(cow),
                folded: 0,
                folded_comms: std::collections::BTreeMap::new(),
                resident: None,
                identity: p.identity.as_deref().cloned().unwrap_or_default(),
            }
        })
        .collect();
    let storms = families.tlb.then(|| {
        let d = session.storms();
        d.open_storms()
            .chain(d.closed.iter())
            .map(|s| {
                let call = s.sites.iter().max_by_key(|(_, n)| **n).map_or(u32::MAX, |((call, _), _)| *call);
                let top_call = vmtrace_common::MM_CALL_NAMES.get(call as usize).copied().unwrap_or("other");
                Storm {
                    pid: s.pid,
                    comm: String::new(),
                    start_s: s.start_s,
                    end_s: if s.end_s > s.start_s { s.end_s } else { now_s },
                    peak_per_s: s.peak_per_s as u64,
                    shootdowns: s.ipis,
                    top_stack: Vec::new(),
                    top_call: top_call.into(),
                    top_share: 1.0,
                    malloc_settings: s.malloc.clone().unwrap_or_default(),
                }
            })
            .collect()
    });
    let summary = Summary {
        version: crate::model::SUMMARY_VERSION,
        // No rule reads the target: the live view is of the traced processes.
        target: TargetInfo { kind: crate::model::TargetKind::System, command: None, pid: None, exit_status: None },
        duration_s: now_s,
        lost_events: 0,
        processes,
        totals: Faults::default(),
        sampling: Sampling::plain(1, false),
        drops: crate::model::Drops::default(),
        probes: Vec::new(),
        program_stats: None,
        kernel: String::new(),
        vmtrace_version: String::new(),
        perf: None,
        oom: families.oom.then(|| session.ooms().to_vec()),
        regions,
        region_placement: None,
        files: None,
        timeline: None,
        storms,
        stacks: None,
        folding: None,
        resident: None,
        findings: None,
        thp_anon_mode: crate::kernel::thp::anon_mode(),
        code_locations: None,
        pinned: None,
        numa: None,
    };
    crate::model::findings::diagnose(&summary).iter().map(crate::model::findings::one_line).collect()
}

/// A process's name as the table shows it: with its rank, pod and
/// container where known (`python3 [rank 3/8 pod 1f2e3d4c ctr 0123456789ab]`).
/// "NAME (worker N of PPID)" for each process of the view that is a worker
/// its parent (also in the view) forked, as summary.txt and report.html
/// tell DataLoader workers apart (`findings::worker_among`).
fn worker_labels(session: &Session<Probes>, snap: &crate::model::LiveSnapshot) -> HashMap<u32, String> {
    use crate::model::findings::{worker_among, Who};
    let infos: Vec<_> = snap.processes.iter().filter_map(|p| Some((p.pid, session.known(p.pid)?))).collect();
    let all: Vec<Who> = infos
        .iter()
        .map(|(pid, i)| Who { pid: *pid, ppid: i.ppid, comm: &i.comm, cmdline: i.cmdline.as_deref() })
        .collect();
    all.iter()
        .filter_map(|w| {
            let (n, ppid) = worker_among(&all, w)?;
            Some((w.pid, format!("{} (worker {n} of {ppid})", w.comm)))
        })
        .collect()
}

fn with_identity(comm: &str, id: Option<&crate::model::Identity>) -> String {
    crate::model::identity::named(comm, id).into_owned()
}
