//! One way to start a trace. A front end (`record`, `top`, `serve`; the demo
//! through `record`) says what it wants in a [`Plan`] — the target, the
//! event families, the stacks, the timing — and which [`Front`] it is; a
//! [`Tracer`] does the rest, in one order: the target checked, preflight, the
//! programs loaded, the session, the target started with its perf counters;
//! at the end the counting stopped and the programs detached. The front ends
//! keep only their own loop and view.
//!
//! No CLI type is in here: `main.rs` turns the options into a plan.
use std::{
    os::fd::BorrowedFd,
    time::{Duration, Instant},
};

pub use crate::loader::Families;
use crate::{
    collect::{install_stop_handlers, stop_from_terminal, stop_signals_received, Session, SessionOptions},
    kernel::preflight,
    loader::{LoadError, LoadOptions, Probes},
    model::{PerfSummary, ProgramStats, TargetInfo, TargetKind},
    perf::{sampling::DataSampler, Counters, FaultEnd, Scope},
    stacks::StackMode,
    target::{
        check_pid, proc_stat_after_comm, resolve_program, wait_exit_usage, GatedChild, StatFaults, Target, TargetError,
    },
};

/// What to trace, as the user chose it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub target: Target,
    pub families: Families,
    pub stacks: Stacks,
    pub timing: Timing,
    /// TLB-flush IPIs per second above which a process is in a shootdown storm.
    pub storm_threshold: f64,
    /// Classic tracepoints instead of tp_btf (tests the fallback path).
    pub force_tracepoints: bool,
    /// Keep what `trace.perfetto-trace` needs: every major fault streamed,
    /// the event log kept.
    pub perfetto: bool,
    /// Count each program's runs and run time (`program_stats`).
    pub probe_stats: bool,
}

/// Which call stacks are taken, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stacks {
    pub mode: StackMode,
    /// A stack on 1 in N faults.
    pub period: u32,
    /// Bytes of user stack copied for userspace unwinding (0: frame pointers only).
    pub window: u32,
    /// Walk Python frames at each stack taken.
    pub python_frames: bool,
    /// The faulting region as the flamegraphs' leaf frame.
    pub leaf_region: bool,
}

impl Stacks {
    /// `record`'s default: user stacks, 1 in 64 faults.
    pub const DEFAULT: Self = Self {
        mode: StackMode::User,
        period: 64,
        window: vmtrace_common::STACK_WINDOW_DEFAULT,
        python_frames: true,
        leaf_region: false,
    };
    /// No stacks at all.
    pub const NONE: Self =
        Self { mode: StackMode::None, period: 1, window: 0, python_frames: true, leaf_region: false };
}

/// Which faults are timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Time 1 in N minor faults (0: none; majors: every one).
    pub minor_period: u32,
    /// Time 1 in N fast minor faults, every slow one exactly (the memcg end;
    /// `LoadOptions::fast_period`).
    pub fast_period: u32,
}

impl Timing {
    /// Every fault timed.
    pub const EVERY_FAULT: Self = Self { minor_period: 1, fast_period: 1 };
}

impl Plan {
    /// `record`'s defaults (every family, user stacks 1 in 64, every fault
    /// timed) for `target`.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            families: Families::ALL,
            stacks: Stacks::DEFAULT,
            timing: Timing { minor_period: 1, fast_period: crate::loader::DEFAULT_FAST_PERIOD },
            storm_threshold: crate::collect::DEFAULT_STORM_THRESHOLD,
            force_tracepoints: false,
            perfetto: false,
            probe_stats: false,
        }
    }

    /// A command that exists and can run, or a pid that exists: the cheap
    /// user errors, which need no privileges to report.
    pub fn check_target(&self) -> Result<(), TraceError> {
        match &self.target {
            Target::Command(argv) => {
                resolve_program(argv.first().ok_or(TargetError::Empty)?)?;
            }
            Target::Pid(pid) => check_pid(*pid)?,
            Target::System => {}
        }
        Ok(())
    }

    fn system(&self) -> bool {
        matches!(self.target, Target::System)
    }

    fn load_options(&self, front: Front) -> LoadOptions {
        LoadOptions {
            trace_all: self.system(),
            minor_period: self.timing.minor_period,
            fast_period: self.timing.fast_period,
            force_tracepoints: self.force_tracepoints,
            families: self.families,
            stacks: self.stacks.mode,
            stack_period: self.stacks.period,
            stack_window: self.stacks.window,
            leaf_region: self.stacks.leaf_region,
            // `serve` opens no perf counters: its fault end stays the loader's.
            end_on_tasks: !self.system() && front != Front::Metrics,
            stream_majors: self.perfetto,
        }
    }

    fn session_options(&self, front: Front) -> SessionOptions {
        let record = match front {
            Front::Record { fold_below } => Some(fold_below),
            Front::Live | Front::Metrics => None,
        };
        SessionOptions {
            families: self.families,
            // A recording and `serve` (its profiles) aggregate fault stacks
            // (`top` takes them for storm culprits only).
            stacks: (front != Front::Live && self.stacks.mode != StackMode::None)
                .then(|| (self.stacks.mode, self.stacks.period.max(1))),
            storm_threshold: self.storm_threshold,
            python_frames: self.stacks.python_frames,
            trace_log: self.perfetto,
            // The system has no end: `top -a` never shows an exited process again.
            forget_exited: front == Front::Live && self.system(),
            retire_exited: record.is_some(),
            // `serve` runs for as long as the node: what it keeps of an
            // exited process is its counts and symbolized stacks.
            release_exited: front == Front::Metrics,
            // The Perfetto trace is written from the summary before folding.
            fold_below: if self.perfetto { 0.0 } else { record.unwrap_or(0.0) },
            fold_processes: record.is_some() && self.system(),
            // `VMTRACE_RELEASE_ABOVE`: the tests let go of every retired
            // process, not only past the 512th.
            release_above: std::env::var("VMTRACE_RELEASE_ABOVE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(crate::collect::session::RELEASE_ABOVE),
            // `VMTRACE_STACK_SWEEP_MS`: the tests sweep more often.
            stack_sweep: std::env::var("VMTRACE_STACK_SWEEP_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(crate::collect::session::STACK_SWEEP, std::time::Duration::from_millis),
            // `VMTRACE_STACK_SEAL_MS` (0: never) and `VMTRACE_STACK_SEAL_ABOVE`:
            // the tests seal live processes' stacks sooner.
            stack_seal: (
                std::env::var("VMTRACE_STACK_SEAL_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map_or(crate::collect::session::STACK_SEAL, std::time::Duration::from_millis),
                std::env::var("VMTRACE_STACK_SEAL_ABOVE")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(crate::collect::session::SEAL_ABOVE),
            ),
        }
    }
}

/// What the front end makes of the trace: how long exited processes are
/// kept, whether stacks are aggregated.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Front {
    /// `record`: a summary at the end, exited processes retired into it as
    /// they go, its rows under `fold_below` % folded.
    Record { fold_below: f64 },
    /// `top`: live processes (system-wide, the exited are forgotten).
    Live,
    /// `serve`: counters per process since the start.
    Metrics,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{0}")]
    Preflight(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Counters(#[from] crate::perf::CountersError),
    #[error("cannot add pid {0} to the traced set: {1}")]
    Trace(u32, aya::maps::MapError),
}

/// Checks everything tracing needs, mounting tracefs when missing.
pub fn preflight() -> Result<(), TraceError> {
    let mut checks = vec![preflight::privileges(), preflight::btf_check(), preflight::tracefs_check()];
    // Tracepoints are only meaningful once tracefs is there.
    if checks.iter().all(|c| c.status != preflight::Status::Missing) {
        for (c, n) in preflight::TRACEPOINTS {
            checks.push(preflight::tracepoint_check(c, n));
        }
    }
    preflight::require(&checks).map_err(TraceError::Preflight)
}

/// `Parallel` (a thread per program: the detaches overlap) only when no child
/// is forked after the recording: glibc keeps finished threads' stacks and
/// arenas, and a later child touches them all before its exec, in faults the
/// kernel counts and vmtrace cannot see. Measured in docs/performance.md
/// ("Exit after the command"). `AfterExit` (the CLI): the programs, stopped,
/// are detached by a child process once vmtrace has exited, so the shell
/// gets its prompt back without waiting ~0.6 s for RCU grace periods.
/// `OnDrop`: as the tracer is dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    Sequential,
    Parallel,
    AfterExit,
    OnDrop,
}

/// A running trace: the loaded programs inside the collecting session, the
/// target (a started command, a pid, the system) and its perf counters.
pub struct Tracer {
    session: Session<Probes>,
    info: TargetInfo,
    child: Option<GatedChild>,
    perf: Option<PerfProbe>,
    /// The kernel counts programs' run time while this is held.
    run_stats: Option<std::os::fd::OwnedFd>,
    /// The nice the collector had before `raise_priority`.
    restore_nice: Option<i32>,
    /// The collector runs at `SCHED_RR` (`VMTRACE_SCHED=rr`) until `stop`.
    realtime: bool,
}

/// What [`Tracer::stop`] read at the moment counting stopped.
pub struct Stopped {
    pub perf: Option<PerfSummary>,
    pub program_stats: Option<Vec<ProgramStats>>,
}

impl Tracer {
    /// Starts `plan` for `front`. `output` takes a command's stdout and
    /// stderr (else it shares ours).
    pub fn start(plan: &Plan, front: Front, output: Option<&std::fs::File>) -> Result<Self, TraceError> {
        plan.check_target()?;
        preflight()?;
        let probes = Probes::load(&plan.load_options(front))?;
        let mut session = Session::new(probes, plan.session_options(front));
        let run_stats = plan.probe_stats.then(crate::loader::enable_run_stats).transpose()?;
        install_stop_handlers();
        let (info, child, perf) = start_target(&mut session, &plan.target, plan.families.perf, output)?;
        // After the command was forked: it keeps the nice it was given.
        let restore_nice = raise_priority();
        let realtime = realtime_from_env();
        session.start_clock();
        Ok(Self { session, info, child, perf, run_stats, restore_nice, realtime })
    }

    /// The collecting session (poll it, take snapshots).
    pub fn session(&mut self) -> &mut Session<Probes> {
        &mut self.session
    }

    /// The session and the perf counters, for a view that reads both.
    pub fn session_and_perf(&mut self) -> (&mut Session<Probes>, Option<&mut PerfProbe>) {
        (&mut self.session, self.perf.as_mut())
    }

    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    pub fn info_mut(&mut self) -> &mut TargetInfo {
        &mut self.info
    }

    /// The started command, if the target is one.
    pub fn child(&self) -> Option<&GatedChild> {
        self.child.as_ref()
    }

    /// Drains data-address samples, if any are taken.
    pub fn poll_perf(&mut self) {
        if let Some(p) = &mut self.perf {
            p.poll();
        }
    }

    /// The event ring's fd, to wait on.
    pub fn ring_fd(&self) -> BorrowedFd<'_> {
        self.session.source().ring_fd()
    }

    /// Stops all counting at once: the aggregates and the kernel's own
    /// counters cover the same moment.
    pub fn stop_counting(&mut self) {
        self.session.source_mut().stop_counting();
    }

    /// Stops counting, reads what only this moment gives (the perf counters,
    /// the programs' run time), and detaches the programs as `detach` says.
    pub fn stop(&mut self, detach: Detach) -> Stopped {
        self.stop_counting();
        // Building the reports may take seconds beside a job still running
        // (`-p`, `--duration`): that work is not urgent.
        if std::mem::take(&mut self.realtime) {
            let _ = set_policy(libc::SCHED_OTHER, 0);
        }
        if let Some(nice) = self.restore_nice.take() {
            let _ = set_nice(nice);
        }
        let program_stats = self.run_stats.is_some().then(|| self.session.source().program_stats());
        let perf = self.perf.take().map(PerfProbe::finish);
        match detach {
            Detach::AfterExit => detach_after_exit(),
            Detach::Sequential | Detach::Parallel => self.session.source_mut().detach_all(detach == Detach::Parallel),
            Detach::OnDrop => {}
        }
        Stopped { perf, program_stats }
    }

    /// The session and the target, to build the summary from.
    pub fn into_parts(self) -> (Session<Probes>, TargetInfo, Option<GatedChild>) {
        (self.session, self.info, self.child)
    }
}

/// The collector's nice while it traces (`VMTRACE_NICE`, `off` to leave
/// it as it is). A job that keeps every CPU busy (a DataLoader's workers)
/// otherwise starves it: on 2 CPUs beside a torch job's 9 busy processes a
/// 100 ms tick took 2-20 s of wall time for 0.3 s of CPU, and the stack map
/// and the rings filled meanwhile (docs/performance.md). The collector uses
/// what it uses either way; it gets the CPU when it needs it, within its own
/// session: with autogroups on, a build in another session still takes
/// turns with it as a group (it waited for a CPU 33-48% of a churn window
/// beside one, ring34); `VMTRACE_SCHED=rr` runs it at SCHED_RR 1 instead.
const TRACING_NICE: i32 = -10;

/// Sets the collector's nice to `TRACING_NICE` (or `VMTRACE_NICE`) unless
/// it already runs at that or higher; returns the nice to restore. Every
/// thread started later inherits it.
fn raise_priority() -> Option<i32> {
    let want = match std::env::var("VMTRACE_NICE") {
        Ok(v) if v == "off" => return None,
        Ok(v) => {
            if let Ok(n) = v.parse::<i32>() {
                n.clamp(-20, 19)
            } else {
                log::warn!("VMTRACE_NICE={v:?} is not a nice value (-20..19) or `off`: using {TRACING_NICE}");
                TRACING_NICE
            }
        }
        Err(_) => TRACING_NICE,
    };
    // SAFETY: no pointers. `who` 0 is the calling thread.
    let old = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if old <= want {
        return None;
    }
    match set_nice(want) {
        Ok(()) => Some(old),
        Err(e) => {
            log::debug!("the collector stays at nice {old} ({e}): a job keeping every CPU busy may delay its drains");
            None
        }
    }
}

/// `VMTRACE_SCHED=rr`: the collector thread runs at `SCHED_RR` priority 1
/// while it traces (threads and processes it starts do not inherit it).
/// Its nice weighs it only against the threads of its own autogroup (its
/// session, with `kernel.sched_autogroup_enabled`): beside a build started
/// in another session, at nice −10, it waited for a CPU 33–48% of the wall
/// time on 2 CPUs; at `SCHED_RR`, 0–1% (docs/performance.md, "The collector
/// starved of CPU"). Off by default: a real-time collector takes the CPU
/// from everything else whenever it has work.
fn realtime_from_env() -> bool {
    match std::env::var("VMTRACE_SCHED").as_deref() {
        Ok("rr") => match set_policy(libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, 1) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("VMTRACE_SCHED=rr: the collector stays at its policy ({e})");
                false
            }
        },
        Ok(v) if !v.is_empty() && v != "off" => {
            log::warn!("VMTRACE_SCHED={v:?} is not `rr` or `off`: the collector stays at its policy");
            false
        }
        _ => false,
    }
}

fn set_policy(policy: i32, priority: i32) -> std::io::Result<()> {
    let p = libc::sched_param { sched_priority: priority };
    // SAFETY: a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, policy, &raw const p) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn set_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: no pointers. `who` 0 is the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Which program type each hook gets on this kernel: loads and attaches
/// everything `record` would (every family, user stacks), then lets it go
/// (`vmtrace check`). Nothing is counted: no target is put in the traced set.
pub fn probe_selection() -> Result<Vec<crate::loader::Attachment>, TraceError> {
    let plan = Plan::new(Target::Pid(std::process::id()));
    let probes = Probes::load(&plan.load_options(Front::Metrics))?;
    Ok(probes.attached().to_vec())
}

/// Perf counters, and data-address sampling where the PMU allows it.
pub struct PerfProbe {
    counters: Counters,
    sampler: Option<DataSampler>,
}

impl PerfProbe {
    fn open(scope: &Scope, end: Option<FaultEnd>, minor_from_tasks: bool) -> Result<Self, TraceError> {
        let counters = Counters::open(scope.clone(), end, minor_from_tasks)?;
        let sampler = if counters.hardware_supported() {
            DataSampler::open_tlb(scope).map_err(|e| log::info!("no TLB-miss address sampling: {e}")).ok()
        } else {
            None
        };
        Ok(Self { counters, sampler })
    }

    fn poll(&mut self) {
        if let Some(s) = &mut self.sampler {
            s.drain();
        }
    }

    /// The counters so far (for live views), draining address samples.
    pub(crate) fn read(&mut self) -> PerfSummary {
        self.poll();
        self.counters.read()
    }

    fn finish(mut self) -> PerfSummary {
        let mut s = self.counters.read();
        if let Some(sampler) = self.sampler {
            s.tlb_miss_samples_lost = sampler.lost;
            let (regions, outside) = sampler.finish();
            s.tlb_miss_regions = regions;
            s.tlb_miss_samples_unattributed = outside;
        }
        s
    }
}

type Started = (TargetInfo, Option<GatedChild>, Option<PerfProbe>);

/// Puts the target in the traced set and opens its counters; a command is
/// started only once both are in place.
fn start_target(
    session: &mut Session<Probes>,
    target: &Target,
    perf: bool,
    output: Option<&std::fs::File>,
) -> Result<Started, TraceError> {
    // A command is followed from its fork: its faults before the gate count.
    let spawned = match target {
        Target::Command(argv) => {
            session.source_mut().follow_forks_of(Some(std::process::id()));
            let spawned = GatedChild::spawn_with_output(argv, output);
            session.source_mut().follow_forks_of(None);
            Some(spawned?)
        }
        _ => None,
    };
    // The target's own fault-end events (when the loader left them to us)
    // serve the perf counters too; without counters the probes keep them.
    // `minor_from_tasks`: a command's minor faults are read from its task
    // counters at the end (`record`), not counted by a perf event of their own.
    let mut perf_for = |scope: Scope, minor_from_tasks: bool| -> Result<Option<PerfProbe>, TraceError> {
        let end = match session.source().end_programs() {
            Some(p) => Some(FaultEnd::open(&scope, &p)?),
            None => None,
        };
        if perf {
            return PerfProbe::open(&scope, end, minor_from_tasks).map(Some);
        }
        session.source_mut().keep_fault_end(end);
        Ok(None)
    };
    Ok(match target {
        Target::Command(argv) => {
            let mut c = spawned.expect("forked above for a command");
            let counters = perf_for(Scope::Tasks(vec![c.pid]), true)?;
            session.source_mut().trace_pid(c.pid).map_err(|e| TraceError::Trace(c.pid, e))?;
            session.set_parent(c.pid, std::process::id());
            session.read_maps(c.pid);
            c.release()?;
            let info = TargetInfo {
                kind: TargetKind::Command,
                command: Some(argv.clone()),
                pid: Some(c.pid),
                exit_status: None,
            };
            (info, Some(c), counters)
        }
        Target::Pid(pid) => {
            let counters = perf_for(Scope::process(*pid), false)?;
            session.source_mut().trace_pid(*pid).map_err(|e| TraceError::Trace(*pid, e))?;
            session.process(*pid);
            (TargetInfo { kind: TargetKind::Pid, command: None, pid: Some(*pid), exit_status: None }, None, counters)
        }
        Target::System => {
            let counters = perf_for(Scope::system(), false)?;
            session.source_mut().start_counting();
            (TargetInfo { kind: TargetKind::System, command: None, pid: None, exit_status: None }, None, counters)
        }
    })
}

/// Leaves the detaching of every program to a child process that waits for
/// vmtrace to exit: a classic tracepoint's detach waits for RCU grace periods
/// under a kernel mutex (~0.6 s for the syscall hooks here), time the user
/// would otherwise wait for the prompt. The programs no longer count
/// (`stop_counting`); the child holds their file descriptors, so vmtrace's
/// own closes are cheap, and the last close (the slow one) is the child's.
/// Where fork fails, the programs are detached as vmtrace drops them (one by
/// one, the slowest way, but still detached).
fn detach_after_exit() {
    let mut pipe = [0i32; 2];
    // SAFETY: pipe2 fills the two-int array it is given.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    // SAFETY: /dev/null opened before the fork; the child only makes
    // async-signal-safe calls (setsid, dup2, close, read, close_range, _exit).
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    // SAFETY: see above.
    match unsafe { libc::fork() } {
        0 => unsafe {
            libc::setsid();
            if null >= 0 {
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
            }
            libc::close(pipe[1]);
            // EOF once vmtrace (the only holder of the write end) has exited.
            let mut b = 0u8;
            while libc::read(pipe[0], (&raw mut b).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            libc::_exit(0);
        },
        pid if pid < 0 => log::debug!("fork for the detach failed: {}", std::io::Error::last_os_error()),
        _ => {}
    }
    // SAFETY: closing fds this function opened; the write end stays open
    // (close-on-exec) until vmtrace exits.
    unsafe {
        libc::close(pipe[0]);
        if null >= 0 {
            libc::close(null);
        }
    }
}

/// How long each step of [`Tracer::stop_job`] waits for the job to exit.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The signals that stop a traced job, one step each: the one vmtrace got,
/// then SIGTERM, then SIGKILL.
fn stop_steps(sig: i32) -> Vec<i32> {
    let mut steps = vec![sig];
    if sig != libc::SIGTERM {
        steps.push(libc::SIGTERM);
    }
    steps.push(libc::SIGKILL);
    steps
}

/// Who gets a step's signal: every process of the job still running (a
/// pid whose state and process group are no longer readable is gone). Ctrl-C
/// at the terminal already reached every process of vmtrace's process group
/// (the terminal's foreground group): its first step goes only to those that
/// left the group (setsid'd or setpgid'd workers), so that none gets SIGINT
/// twice (a second KeyboardInterrupt would cut a program's own clean-up
/// short).
fn recipients(job: &[u32], skip_own_group: bool, own_pgrp: i32, pgrp_of: impl Fn(u32) -> Option<i32>) -> Vec<u32> {
    job.iter().copied().filter(|&pid| pgrp_of(pid).is_some_and(|g| !(skip_own_group && g == own_pgrp))).collect()
}

/// The process group of a running `pid`; `None` when it is gone or a zombie.
fn running_pgrp(pid: u32) -> Option<i32> {
    let stat = proc_stat_after_comm(pid)?;
    // After "(comm)": state, ppid, pgrp.
    let mut f = stat.split_whitespace();
    let state = f.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    f.nth(1)?.parse().ok()
}

/// The traced job's processes that still run: the command (until reaped) and
/// every traced process (its descendants, in whatever process group or
/// session they are now), after draining the exits already reported.
fn job_pids(tracer: &mut Tracer, command: Option<u32>) -> Vec<u32> {
    tracer.session().poll(Duration::from_millis(1));
    let me = std::process::id();
    let mut job: Vec<u32> = command.into_iter().chain(tracer.session().live_pids()).filter(|&p| p != me).collect();
    job.sort_unstable();
    job.dedup();
    job.retain(|&p| running_pgrp(p).is_some());
    job
}

impl Tracer {
    /// vmtrace got SIGINT or SIGTERM while tracing a command: stops the whole
    /// job, not only the command's pid (a launcher's children, `sh -c`, torchrun,
    /// setsid'd workers would otherwise go on running untraced). Every traced
    /// process still running gets the same signal (see [`recipients`] for
    /// Ctrl-C); those still running 2 s later get SIGTERM (and SIGCONT, should
    /// one be stopped), and 2 s after that SIGKILL. A second SIGINT/SIGTERM to
    /// vmtrace moves to the next step at once. The trace goes on meanwhile, so
    /// their exits are in it; the command's status is kept when it exits.
    pub(crate) fn stop_job(&mut self, command: u32, sig: i32, usage: &mut Option<StatFaults>) {
        let tracer = self;
        // SAFETY: getpgrp cannot fail.
        let own_pgrp = unsafe { libc::getpgrp() };
        let mut reaped = false;
        let mut reap = |tracer: &mut Tracer, reaped: &mut bool| {
            if !*reaped {
                if let Some((st, u)) = wait_exit_usage(command, false) {
                    tracer.info_mut().exit_status = Some(st);
                    *usage = Some(u);
                    *reaped = true;
                }
            }
        };
        for (i, step) in stop_steps(sig).into_iter().enumerate() {
            let job = job_pids(tracer, (!reaped).then_some(command));
            if job.is_empty() {
                reap(tracer, &mut reaped);
                return;
            }
            let to = recipients(&job, i == 0 && stop_from_terminal(), own_pgrp, running_pgrp);
            if i > 0 {
                eprintln!(
                    "vmtrace: {} process(es) of the traced job still running {} s after {}: sending {} to {}",
                    job.len(),
                    STOP_GRACE.as_secs(),
                    signal_name(if i == 1 { sig } else { libc::SIGTERM }),
                    signal_name(step),
                    job.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
                );
            }
            for pid in to {
                // SAFETY: a signal to a process of the traced job (running, just checked).
                unsafe {
                    libc::kill(pid as i32, step);
                    if step == libc::SIGTERM && i > 0 {
                        libc::kill(pid as i32, libc::SIGCONT);
                    }
                }
            }
            let asked = stop_signals_received();
            let until = Instant::now() + STOP_GRACE;
            while Instant::now() < until && stop_signals_received() == asked {
                reap(tracer, &mut reaped);
                if reaped && job_pids(tracer, None).is_empty() {
                    return;
                }
                tracer.session().poll(Duration::from_millis(20));
            }
        }
        reap(tracer, &mut reaped);
        let left = job_pids(tracer, (!reaped).then_some(command));
        if !left.is_empty() {
            log::warn!("{} process(es) of the traced job survived SIGKILL (uninterruptible?): {left:?}", left.len());
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        _ => "the signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_front_gets_its_session() {
        let plan = Plan::new(Target::System);
        let rec = plan.session_options(Front::Record { fold_below: 0.1 });
        assert!(rec.retire_exited && rec.fold_processes && !rec.forget_exited);
        assert_eq!(rec.stacks, Some((StackMode::User, 64)));
        assert!((rec.fold_below - 0.1).abs() < f64::EPSILON);
        let live = plan.session_options(Front::Live);
        assert!(live.forget_exited && !live.retire_exited && live.stacks.is_none());
        let serve = plan.session_options(Front::Metrics);
        assert!(!serve.forget_exited && !serve.retire_exited && serve.stacks.is_some() && serve.release_exited);
        // The Perfetto trace needs every row: nothing folds as processes retire.
        let perfetto = Plan { perfetto: true, ..Plan::new(Target::Pid(1)) };
        let o = perfetto.session_options(Front::Record { fold_below: 0.1 });
        assert!(o.trace_log && o.fold_below == 0.0 && !o.fold_processes);
        assert!(perfetto.load_options(Front::Record { fold_below: 0.1 }).stream_majors);
    }

    #[test]
    fn the_fault_end_goes_on_the_targets_tasks_except_system_wide_and_for_serve() {
        let on_tasks = |t: Target, f: Front| Plan::new(t).load_options(f).end_on_tasks;
        assert!(on_tasks(Target::Pid(1), Front::Record { fold_below: 0.0 }));
        assert!(on_tasks(Target::Command(vec!["true".into()]), Front::Live));
        assert!(!on_tasks(Target::System, Front::Record { fold_below: 0.0 }));
        assert!(!on_tasks(Target::Pid(1), Front::Metrics));
    }

    /// Ctrl-C at the terminal reached vmtrace's whole process group: the
    /// first step signals only the job's processes outside it (a setsid'd
    /// worker); kill(2) to vmtrace alone, and the later steps, reach all.
    #[test]
    fn a_stop_reaches_every_process_of_the_job_once() {
        assert_eq!(stop_steps(libc::SIGINT), [libc::SIGINT, libc::SIGTERM, libc::SIGKILL]);
        assert_eq!(stop_steps(libc::SIGTERM), [libc::SIGTERM, libc::SIGKILL]);
        // 10 the launcher and 11 its child in vmtrace's group 7; 12 setsid'd; 13 gone.
        let pgrp = |pid| match pid {
            10 | 11 => Some(7),
            12 => Some(12),
            _ => None,
        };
        let job = [10, 11, 12, 13];
        assert_eq!(recipients(&job, true, 7, pgrp), [12]);
        assert_eq!(recipients(&job, false, 7, pgrp), [10, 11, 12]);
        // vmtrace in a group of its own (setsid vmtrace …): nothing to skip.
        assert_eq!(recipients(&job, true, 99, pgrp), [10, 11, 12]);
        let me = std::process::id();
        // SAFETY: getpgrp cannot fail.
        assert_eq!(running_pgrp(me), Some(unsafe { libc::getpgrp() }));
        assert_eq!(running_pgrp(u32::MAX), None);
    }
}
