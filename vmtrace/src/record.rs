//! `vmtrace record`: preflight, load, start or attach to the target, collect
//! until it ends, write every output. The CLI, the demo and the tests all call this.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    cli::EventFamily,
    collect::{install_stop_handlers, stop_signal, Finished, Session, SessionOptions},
    kernel::preflight,
    loader::{Families, LoadError, LoadOptions, Probes},
    model::{KernelAccounting, PerfSummary, Summary, TargetInfo},
    perf::{sampling::DataSampler, Counters, FaultEnd, Scope},
    report,
    stacks::{Stack, StackMode},
    target::{check_pid, pid_alive, resolve_program, wait_exit_usage, GatedChild, Target, TargetError},
};

#[derive(Clone, Debug)]
#[allow(clippy::struct_excessive_bools, reason = "independent switches of one recording")]
pub struct RecordOptions {
    pub target: Target,
    pub out: PathBuf,
    pub duration: Option<Duration>,
    /// Time 1 in N minor faults (0: none; majors: every one).
    pub minor_period: u32,
    /// Time 1 in N fast minor faults, every slow one exactly (the memcg end;
    /// `LoadOptions::fast_period`).
    pub fast_period: u32,
    pub force_tracepoints: bool,
    /// Event families beyond faults (perf counters, OOM kills).
    pub events: Vec<EventFamily>,
    pub stacks: StackMode,
    /// Take a stack on 1 in N faults.
    pub stack_period: u32,
    /// Bytes of user stack copied for userspace unwinding (0: frame pointers only).
    pub stack_window: u32,
    /// Walk Python frames at each stack taken.
    pub python_frames: bool,
    /// Count each program's runs and run time (`program_stats`).
    pub probe_stats: bool,
    /// Add the faulting memory region as the flamegraphs' leaf frame.
    pub leaf_region: bool,
    /// TLB-flush IPIs per second above which a process is in a shootdown storm.
    pub storm_threshold: f64,
    /// Print one JSON object per this many seconds on stdout (`--stream json`).
    pub stream_interval: Option<Duration>,
    /// Print summary.txt at the end.
    pub print_summary: bool,
    /// How large summary.json may grow, and how it is laid out.
    pub output: report::OutputOptions,
    /// How the programs are detached at the end.
    pub detach: Detach,
    /// Write `trace.perfetto-trace` (majors streamed, the event log kept).
    pub perfetto: bool,
}

/// `Parallel` (a thread per program: the detaches overlap) only when no child
/// is forked after the recording: glibc keeps finished threads' stacks and
/// arenas, and a later child touches them all before its exec, in faults the
/// kernel counts and vmtrace cannot see. Measured in docs/performance.md
/// ("Exit after the command"). `AfterExit` (the CLI): the programs, stopped,
/// are detached by a child process once vmtrace has exited, so the shell
/// gets its prompt back without waiting ~0.6 s for RCU grace periods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detach {
    Sequential,
    Parallel,
    AfterExit,
}

impl RecordOptions {
    pub fn has(&self, family: EventFamily) -> bool {
        self.events.contains(&family)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Preflight(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot write to output directory {path}: {err}\nhint: choose a writable directory with --out DIR")]
    OutDir { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Counters(#[from] crate::perf::CountersError),
    #[error("cannot add pid {0} to the traced set: {1}")]
    Trace(u32, aya::maps::MapError),
}

pub struct RecordOutcome {
    pub summary: Summary,
    /// What `vmtrace record` exits with: the traced command's status, or
    /// 128+signal when vmtrace itself was stopped by one; 1 when the command
    /// succeeded but an output could not be written.
    pub exit_status: i32,
    /// Outputs that could not be written (each named on stderr).
    pub write_failures: Vec<report::WriteFailure>,
}

/// Creates `dir` and proves it writable before anything runs, and removes
/// an earlier recording's outputs from it (`report::remove_earlier_outputs`).
pub fn prepare_out_dir(dir: &Path) -> Result<(), RecordError> {
    let err = |err| RecordError::OutDir { path: dir.to_path_buf(), err };
    fs::create_dir_all(dir).map_err(err)?;
    let probe = dir.join(".vmtrace-write-test");
    fs::write(&probe, b"").map_err(err)?;
    let _ = fs::remove_file(probe);
    let removed = crate::report::remove_earlier_outputs(dir);
    if !removed.is_empty() {
        log::info!("removed an earlier recording's {} from {}", removed.join(", "), dir.display());
    }
    Ok(())
}

/// Checks everything recording needs, mounting tracefs when missing.
pub fn preflight() -> Result<(), RecordError> {
    let mut checks = vec![preflight::privileges(), preflight::btf_check(), preflight::tracefs_check()];
    // Tracepoints are only meaningful once tracefs is there.
    if checks.iter().all(|c| c.status != preflight::Status::Missing) {
        for (c, n) in preflight::TRACEPOINTS {
            checks.push(preflight::tracepoint_check(c, n));
        }
    }
    preflight::require(&checks).map_err(RecordError::Preflight)
}

/// A command that exists and can run, or a pid that exists.
pub fn check_target(target: &Target) -> Result<(), RecordError> {
    match target {
        Target::Command(argv) => {
            resolve_program(argv.first().ok_or(TargetError::Empty)?)?;
        }
        Target::Pid(pid) => check_pid(*pid)?,
        Target::System => {}
    }
    Ok(())
}

pub fn record(opts: &RecordOptions) -> Result<RecordOutcome, RecordError> {
    // Cheap user errors first: they need no privileges to report.
    check_target(&opts.target)?;
    prepare_out_dir(&opts.out)?;
    preflight()?;
    let families = Families {
        oom: opts.has(EventFamily::Oom),
        mmap: opts.has(EventFamily::Mmap),
        tlb: opts.has(EventFamily::Tlb),
        regions: opts.has(EventFamily::Regions),
        resident: opts.has(EventFamily::Resident),
    };
    let probes = Probes::load(&LoadOptions {
        trace_all: matches!(opts.target, Target::System),
        minor_period: opts.minor_period,
        fast_period: opts.fast_period,
        force_tracepoints: opts.force_tracepoints,
        families,
        stacks: opts.stacks,
        stack_period: opts.stack_period,
        stack_window: opts.stack_window,
        leaf_region: opts.leaf_region,
        end_on_tasks: !matches!(opts.target, Target::System),
        stream_majors: opts.perfetto,
    })?;
    let mut session = Session::new(
        probes,
        SessionOptions {
            families,
            stacks: (opts.stacks != StackMode::None).then(|| (opts.stacks, opts.stack_period.max(1))),
            storm_threshold: opts.storm_threshold,
            python_frames: opts.python_frames,
            trace_log: opts.perfetto,
            forget_exited: false,
            retire_exited: true,
            // The Perfetto trace is written from the summary before folding.
            fold_below: if opts.perfetto { 0.0 } else { opts.output.fold_below },
            fold_processes: matches!(opts.target, Target::System),
        },
    );
    // The kernel counts programs' run time while this is held.
    let _stats = opts.probe_stats.then(crate::loader::enable_run_stats).transpose()?;
    install_stop_handlers();
    let (mut info, child, mut perf) = start_target(&mut session, &opts.target, opts.has(EventFamily::Perf), None)?;
    session.start_clock();
    log::info!("tracing {}", info.kind);
    let mut usage = None;
    let signalled = wait_for_end(&mut session, opts, child.as_ref(), &mut info, perf.as_mut(), &mut usage);
    // Exit events of the last processes may still be in flight.
    session.poll(Duration::from_millis(10));
    session.stop_clock();
    // The command's own counts, read before reaping it, replace the exit hook's read.
    if let (Some(c), Some((minor, major))) = (child.as_ref(), usage) {
        session.set_kernel_accounting(c.pid, KernelAccounting { minor, major });
    }
    // One moment for everything: stop counting, then read the kernel's own
    // counters (processes may go on faulting while the reports are built).
    session.source_mut().stop_counting();
    let program_stats = opts.probe_stats.then(|| session.source().program_stats());
    let perf = perf.map(PerfProbe::finish);
    match opts.detach {
        Detach::AfterExit => detach_after_exit(),
        d => session.source_mut().detach_all(d == Detach::Parallel),
    }
    let ending = Instant::now();
    let Finished { mut summary, stacks, mm_sites, trace, resident } = session.finish(info);
    summary.perf = perf;
    summary.program_stats = program_stats;
    if let Some(st) = summary.stacks.as_mut() {
        st.files = report::flamegraph_files();
    }
    let stack_outputs = report::StackOutputs {
        faults: summary.stacks.is_some().then_some(stacks.as_slice()),
        mm_sites: opts.has(EventFamily::Mmap).then_some(mm_sites.as_slice()),
        resident: resident.as_ref().map(|r| (r.end.as_slice(), r.peak.as_slice())),
    };
    // Before report.html (it links it) and before folding: every process.
    let trace_failure = trace.and_then(|log| write_perfetto(&opts.out, &summary, &log));
    derive_and_fold(&mut summary, &stacks, resident.as_ref().map(|r| r.peak.as_slice()), opts.output.fold_below);
    let writing = Instant::now();
    let mut write_failures = report::write_recording_with(&opts.out, &summary, &stack_outputs, &opts.output);
    write_failures.extend(trace_failure);
    log::info!(
        "outputs written in {:.2} s; the end step (symbols, summary, outputs) took {:.2} s; \
         collector peak memory {} KiB",
        writing.elapsed().as_secs_f64(),
        ending.elapsed().as_secs_f64(),
        peak_rss_kib().unwrap_or(0)
    );
    if opts.print_summary {
        let main_files = ["summary.json", "summary.txt", "report.html"];
        let ok: Vec<&str> = main_files.into_iter().filter(|f| write_failures.iter().all(|w| w.file != *f)).collect();
        let written = if ok.is_empty() {
            String::new()
        } else {
            format!("\nwritten: {}/{}\n", opts.out.display(), ok.join(", "))
        };
        // stdout is the traced command's (or the JSON stream's), as for
        // `time` and `perf stat`: the summary goes to stderr.
        eprint!("{}{written}", report::text::render(&summary));
    }
    if let (Some(c), None, None) = (child.as_ref(), summary.target.exit_status, signalled) {
        // --duration ended the trace, not the command: it goes on, untraced.
        eprintln!("vmtrace: --duration reached: tracing stopped; the command goes on running untraced (pid {})", c.pid);
    }
    let command_status = match (summary.target.exit_status, signalled) {
        (Some(st), _) => st,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 0,
    };
    let exit_status = report_write_failures(&opts.out, &write_failures, command_status);
    Ok(RecordOutcome { summary, exit_status, write_failures })
}

/// What the summaries open with, from every row before the small ones are
/// folded: the top code locations (with stacks) and the findings; then the
/// small rows folded.
fn derive_and_fold(summary: &mut Summary, stacks: &[Stack], resident_peak: Option<&[Stack]>, fold_below: f64) {
    summary.thp_anon_mode = crate::kernel::thp::anon_mode();
    if summary.stacks.is_some() {
        summary.code_locations = Some(crate::stacks::locations::code_locations(stacks, resident_peak));
    }
    summary.findings = Some(crate::model::findings::diagnose(summary));
    crate::model::fold(summary, fold_below);
}

/// The collector's own peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `trace.perfetto-trace`; a partial file is removed (report.html links the file if it is there).
fn write_perfetto(dir: &Path, summary: &Summary, log: &crate::model::trace::TraceLog) -> Option<report::WriteFailure> {
    let file = crate::export::perfetto::FILE;
    match crate::export::perfetto::write(dir, summary, log) {
        Ok(st) => {
            log::info!("{file}: {} packets, {} bytes in {} ms", st.packets, st.bytes, st.micros / 1000);
            None
        }
        Err(err) => {
            let _ = fs::remove_file(dir.join(file));
            Some(report::WriteFailure { file: file.into(), err })
        }
    }
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

/// Names each output that could not be written, on stderr, and returns the
/// exit status: the command's, or 1 when the command succeeded but vmtrace
/// did not (the contract: vmtrace's own failure exits non-zero).
fn report_write_failures(dir: &Path, failures: &[report::WriteFailure], command_status: i32) -> i32 {
    if failures.is_empty() {
        return command_status;
    }
    for f in failures {
        eprintln!("vmtrace: error: cannot write {}/{f}", dir.display());
    }
    let out_of_space = failures.iter().any(|f| f.err.raw_os_error() == Some(libc::ENOSPC));
    eprintln!(
        "vmtrace: error: {} output file(s) not written (the others were){}; the command exited with status {command_status}",
        failures.len(),
        if out_of_space { ", the disk is full" } else { "" },
    );
    eprintln!("hint: free space or choose another directory with --out DIR");
    if command_status == 0 {
        1
    } else {
        command_status
    }
}

/// Perf counters, and data-address sampling where the PMU allows it.
pub struct PerfProbe {
    counters: Counters,
    sampler: Option<DataSampler>,
}

impl PerfProbe {
    fn open(scope: &Scope, end: Option<FaultEnd>) -> Result<Self, RecordError> {
        let counters = Counters::open(scope.clone(), end)?;
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

pub(crate) type Started = (TargetInfo, Option<GatedChild>, Option<PerfProbe>);

/// Puts the target in the traced set and opens its counters; a command is
/// started only once both are in place.
/// `output` takes the command's stdout and stderr (else it shares ours).
pub(crate) fn start_target(
    session: &mut Session,
    target: &Target,
    perf: bool,
    output: Option<&std::fs::File>,
) -> Result<Started, RecordError> {
    // The target's own fault-end events (when the loader left them to us)
    // serve the perf counters too; without counters the probes keep them.
    let mut perf_for = |scope: Scope| -> Result<Option<PerfProbe>, RecordError> {
        let end = match session.source().end_programs() {
            Some(p) => Some(FaultEnd::open(&scope, &p)?),
            None => None,
        };
        if perf {
            return PerfProbe::open(&scope, end).map(Some);
        }
        session.source_mut().keep_fault_end(end);
        Ok(None)
    };
    Ok(match target {
        Target::Command(argv) => {
            let mut c = GatedChild::spawn_with_output(argv, output)?;
            let counters = perf_for(Scope::Tasks(vec![c.pid]))?;
            session.source_mut().trace_pid(c.pid).map_err(|e| RecordError::Trace(c.pid, e))?;
            session.set_parent(c.pid, std::process::id());
            session.read_maps(c.pid);
            c.release()?;
            let info =
                TargetInfo { kind: "command".into(), command: Some(argv.clone()), pid: Some(c.pid), exit_status: None };
            (info, Some(c), counters)
        }
        Target::Pid(pid) => {
            let counters = perf_for(Scope::process(*pid))?;
            session.source_mut().trace_pid(*pid).map_err(|e| RecordError::Trace(*pid, e))?;
            session.process(*pid);
            (TargetInfo { kind: "pid".into(), command: None, pid: Some(*pid), exit_status: None }, None, counters)
        }
        Target::System => {
            let counters = perf_for(Scope::system())?;
            session.source_mut().start_counting();
            (TargetInfo { kind: "system".into(), command: None, pid: None, exit_status: None }, None, counters)
        }
    })
}

/// Collects until the target ends, a stop signal arrives or the duration is up.
/// Returns the signal that stopped vmtrace, if one did.
fn wait_for_end(
    session: &mut Session,
    opts: &RecordOptions,
    child: Option<&GatedChild>,
    info: &mut TargetInfo,
    mut perf: Option<&mut PerfProbe>,
    usage: &mut Option<(u64, u64)>,
) -> Option<i32> {
    let deadline = opts.duration.map(|d| session.started() + d);
    let mut rates = crate::model::RateKeeper::default();
    let mut next_line = opts.stream_interval.map(|i| session.started() + i);
    // Tests only: a collector this much late on every tick (a loaded machine).
    let late = std::env::var("VMTRACE_TEST_TICK_DELAY_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    loop {
        // Often enough for every point of the fault-rate timeline.
        session.poll(crate::collect::timeline::TICK);
        if let Some(d) = late {
            std::thread::sleep(d);
        }
        if let (Some(at), Some(every)) = (next_line, opts.stream_interval) {
            if Instant::now() >= at {
                let snap = session.live_snapshot(crate::collect::live::LiveScope::Running);
                let line = report::stream::line(&snap, &mut rates, every.as_secs_f64());
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                next_line = Some(at + every);
            }
        }
        if let Some(p) = perf.as_deref_mut() {
            p.poll();
        }
        if let Some(c) = child {
            if let Some((st, u)) = wait_exit_usage(c.pid, false) {
                info.exit_status = Some(st);
                *usage = Some(u);
                return None;
            }
        } else if let Target::Pid(pid) = opts.target {
            let exited = session.known(pid).and_then(|p| p.exit_code);
            if exited.is_some() || !pid_alive(pid) {
                info.exit_status = exited;
                return None;
            }
        }
        if let Some(sig) = stop_signal() {
            if let Some(c) = child {
                // The command gets what vmtrace got, as under a shell; give it a
                // moment to exit so its status is reported.
                // SAFETY: signalling our own child.
                unsafe { libc::kill(c.pid as i32, sig) };
                let until = Instant::now() + Duration::from_secs(2);
                while Instant::now() < until {
                    if let Some((st, u)) = wait_exit_usage(c.pid, false) {
                        info.exit_status = Some(st);
                        *usage = Some(u);
                        break;
                    }
                    session.poll(Duration::from_millis(20));
                }
            }
            return Some(sig);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_output_fails_vmtrace_but_keeps_the_commands_own_failure() {
        let full = || {
            vec![report::WriteFailure { file: "mmap.svg".into(), err: std::io::Error::from_raw_os_error(libc::ENOSPC) }]
        };
        let dir = Path::new("/x");
        assert_eq!(report_write_failures(dir, &[], 0), 0);
        assert_eq!(report_write_failures(dir, &[], 3), 3);
        assert_eq!(report_write_failures(dir, &full(), 0), 1);
        assert_eq!(report_write_failures(dir, &full(), 3), 3);
        assert_eq!(report_write_failures(dir, &full(), 130), 130);
    }
}
