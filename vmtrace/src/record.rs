//! `vmtrace record`: starts the trace (`trace::Tracer`), collects until the
//! target ends, writes every output. The CLI, the demo and the tests all call this.
use std::{
    fmt::Write as _,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub use crate::trace::Detach;
use crate::{
    collect::{stop_signal, Finished},
    model::{KernelAccounting, Summary},
    report,
    stacks::Stack,
    target::{pid_alive, stat_faults, wait_exit_usage, StatFaults, Target},
    trace::{Front, Plan, Stopped, TraceError, Tracer},
};

/// A recording: what to trace (the [`Plan`]) and where its outputs go.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub plan: Plan,
    pub out: PathBuf,
    pub duration: Option<Duration>,
    /// Print one JSON object per this many seconds on stdout (`--stream json`).
    pub stream_interval: Option<Duration>,
    /// Print summary.txt at the end.
    pub print_summary: bool,
    /// How large summary.json may grow, and how it is laid out.
    pub output: report::OutputOptions,
    /// How the programs are detached at the end.
    pub detach: Detach,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("cannot write to output directory {path}: {err}\nhint: choose a writable directory with --out DIR")]
    OutDir { path: PathBuf, err: std::io::Error },
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
    // create_dir_all says only "File exists" for a file (or /dev/null).
    if fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(err(std::io::Error::new(std::io::ErrorKind::NotADirectory, "it exists and is not a directory")));
    }
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

pub fn record(opts: &RecordOptions) -> Result<RecordOutcome, RecordError> {
    // Cheap user errors first: they need no privileges to report.
    opts.plan.check_target()?;
    prepare_out_dir(&opts.out)?;
    let mut tracer = Tracer::start(&opts.plan, Front::Record { fold_below: opts.output.fold_below }, None)?;
    log::info!("tracing {}", tracer.info().kind);
    let mut usage = None;
    let signalled = wait_for_end(&mut tracer, opts, &mut usage);
    let session = tracer.session();
    // Those still running are named as they are now (renamed since their fork?).
    session.rename_live(Duration::ZERO);
    // Exit events of the last processes may still be in flight.
    session.poll(Duration::from_millis(10));
    session.stop_clock();
    // The command's own counts, read before reaping it, replace the exit hook's read.
    if let (Some(pid), Some(u)) = (tracer.child().map(|c| c.pid), usage) {
        tracer.session().set_kernel_accounting(pid, KernelAccounting { minor: u.minor, major: u.major });
    }
    // One moment for everything: stop counting, then read the kernel's own
    // counters (processes may go on faulting while the reports are built).
    // The counters of processes still running are read right as counting
    // stops, before anything else (the perf counters' read, the programs'
    // detach, the nice restored): they go on faulting meanwhile, and a read
    // after the detach counted a child's faults vmtrace never saw (16,870
    // against 17,131 under load).
    let live = tracer.session().live_pids();
    tracer.stop_counting();
    let command_pid = tracer.child().map(|c| c.pid);
    let command_now = command_pid.filter(|_| usage.is_none()).and_then(stat_faults);
    let at_stop: crate::hash::HashMap<u32, u64> = live
        .into_iter()
        .filter(|pid| Some(*pid) != command_pid)
        .filter_map(|pid| stat_faults(pid).map(|s| (pid, s.minor)))
        .collect();
    let Stopped { mut perf, program_stats } = tracer.stop(opts.detach);
    let mut command_minor = None;
    if let (Some(p), Some(c)) = (perf.as_mut(), command_pid) {
        // No minor-fault perf event was opened on the command: its count is
        // the kernel's task counters of the command and the children it
        // waited for (what getrusage reads), from its fork on, as vmtrace's
        // (`Probes::follow_forks_of`).
        if let Some(f) = usage.or(command_now).filter(|_| p.minor_from_tasks) {
            p.kernel_minor_faults = f.minor + f.children_minor;
            p.kernel_page_faults = p.kernel_minor_faults + p.kernel_major_faults;
            p.scope.push_str("; minor faults from its task counters, with the children it waited for");
            // Those it did not wait for (still running, or orphaned and
            // reaped by another) are not in them: their own counters, read
            // at the stop.
            command_minor = Some((c, f, at_stop));
        }
    }
    let (session, info, child) = tracer.into_parts();
    let ending = Instant::now();
    let Finished { mut summary, stacks, mm_sites, trace, resident } = session.finish(info);
    if let (Some(p), Some((command, f, at_stop))) = (perf.as_mut(), command_minor) {
        count_unwaited(p, &summary.processes, command, f, &at_stop);
    }
    summary.perf = perf;
    summary.program_stats = program_stats;
    if let Some(st) = summary.stacks.as_mut() {
        st.files = report::flamegraph_files();
    }
    let stack_outputs = report::StackOutputs {
        faults: summary.stacks.is_some().then_some(stacks.as_slice()),
        mm_sites: opts.plan.families.mmap.then_some(mm_sites.as_slice()),
        resident: resident.as_ref().map(|r| (r.end.as_slice(), r.peak.as_slice())),
    };
    // Before report.html (it links it) and before folding: every process.
    let trace_failure = trace.and_then(|log| write_perfetto(&opts.out, &summary, &log));
    note_malloc_trims(&mut summary, &mm_sites);
    crate::collect::log_own_memory("the session's end");
    derive_and_fold(&mut summary, &stacks, resident.as_ref().map(|r| r.peak.as_slice()), opts.output.fold_below);
    crate::collect::log_own_memory("findings and the fold");
    let writing = Instant::now();
    let mut write_failures = report::write_recording_with(&opts.out, &summary, &stack_outputs, &opts.output);
    write_failures.extend(trace_failure);
    crate::collect::log_own_memory("the outputs");
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

/// The minor faults of the command's descendants by their own kernel
/// counters: each exited one's at its exit (`kernel_accounting`), each one
/// still running at the stop as read then (`at_stop`). `None` when one of
/// them has neither (its exit not seen).
fn descendants_minor(
    processes: &[crate::model::Process],
    command: u32,
    at_stop: &crate::hash::HashMap<u32, u64>,
) -> Option<u64> {
    processes
        .iter()
        .filter(|p| p.pid != command)
        .map(|p| at_stop.get(&p.pid).copied().or(p.kernel_accounting.map(|k| k.minor)))
        .sum()
}

/// A command that did not wait for every process it started (a launcher
/// that exits first, a shell's `cmd &`, a process group stopped by Ctrl-C
/// that kills the launcher before its children) has their faults in no
/// getrusage count of its own, while vmtrace counted them: the kernel's
/// figure is then each process's own counters, as vmtrace's rows are, and
/// the scope says why. A false gap otherwise (uc29: +7787% after Ctrl-C to
/// the group, blamed on faults that never completed).
fn count_unwaited(
    p: &mut crate::model::PerfSummary,
    processes: &[crate::model::Process],
    command: u32,
    f: StatFaults,
    at_stop: &crate::hash::HashMap<u32, u64>,
) {
    let Some(all) = descendants_minor(processes, command, at_stop) else { return };
    if all <= f.children_minor {
        return;
    }
    let running = processes.iter().filter(|q| at_stop.contains_key(&q.pid)).count();
    p.kernel_minor_faults = f.minor + all;
    p.kernel_page_faults = p.kernel_minor_faults + p.kernel_major_faults;
    let still = match running {
        0 => String::new(),
        1 => ", 1 still running at the stop".to_string(),
        n => format!(", {n} still running at the stop"),
    };
    let _ = write!(
        p.scope,
        "; but the command did not wait for every process it started (orphaned, or not yet exited{still}): \
         {} of their minor faults are in no getrusage count of it, so each process's own counters are summed \
         instead (at its exit, or at the stop)",
        all - f.children_minor
    );
}

/// Each process's brk calls made inside its own `malloc_trim()` (a site
/// whose stack has that frame), for the heap-trim finding: those trims go
/// on whatever `M_TRIM_THRESHOLD` says.
fn note_malloc_trims(summary: &mut Summary, mm_sites: &[crate::model::MmSite]) {
    let mut by_pid: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for site in mm_sites {
        let brk = site.frames.last().is_some_and(|f| &**f == "[brk]");
        if brk && site.frames.iter().any(|f| f.contains("malloc_trim")) {
            *by_pid.entry(site.pid).or_default() += site.calls;
        }
    }
    for p in &mut summary.processes {
        if let (Some(n), Some(m)) = (by_pid.get(&p.pid), p.mmap.as_mut()) {
            m.brk_in_malloc_trim = *n;
        }
    }
}

/// What the summaries open with, from every row before the small ones are
/// folded: the top code locations (with stacks) and the findings; then the
/// small rows folded.
fn derive_and_fold(summary: &mut Summary, stacks: &[Stack], resident_peak: Option<&[Stack]>, fold_below: f64) {
    summary.thp_anon_mode = crate::kernel::thp::anon_mode();
    if summary.stacks.is_some() {
        let mut l = crate::stacks::locations::code_locations(stacks, resident_peak);
        let paths: Vec<&str> =
            summary.regions.iter().flatten().filter_map(|r| r.path.as_deref()).filter(|p| p.starts_with('/')).collect();
        l.name_objects(&paths);
        summary.code_locations = Some(l);
    }
    summary.findings = Some(crate::model::findings::diagnose(summary));
    crate::model::fold(summary, fold_below);
}

/// The collector's own peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(crate::collect::pinned::status_kb(&status, "VmHWM")? / 1024)
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

/// Collects until the target ends, a stop signal arrives or the duration is up.
/// Returns the signal that stopped vmtrace, if one did.
fn wait_for_end(tracer: &mut Tracer, opts: &RecordOptions, usage: &mut Option<StatFaults>) -> Option<i32> {
    let started = tracer.session().started();
    let deadline = opts.duration.map(|d| started + d);
    let mut rates = crate::model::RateKeeper::default();
    let mut next_line = opts.stream_interval.map(|i| started + i);
    let child = tracer.child().map(|c| c.pid);
    // Tests only: a collector this much late on every tick (a loaded machine).
    let late = std::env::var("VMTRACE_TEST_TICK_DELAY_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    loop {
        // Often enough for every point of the fault-rate timeline.
        tracer.session().poll(crate::collect::timeline::TICK);
        if let Some(d) = late {
            std::thread::sleep(d);
        }
        if let (Some(at), Some(every)) = (next_line, opts.stream_interval) {
            if Instant::now() >= at {
                let snap = tracer.session().live_snapshot(crate::collect::live::LiveScope::Running);
                let line = report::stream::line(&snap, &mut rates, every.as_secs_f64());
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                next_line = Some(at + every);
            }
        }
        tracer.poll_perf();
        if let Some(pid) = child {
            if let Some((st, u)) = wait_exit_usage(pid, false) {
                tracer.info_mut().exit_status = Some(st);
                *usage = Some(u);
                return None;
            }
        } else if let Target::Pid(pid) = opts.plan.target {
            let exited = tracer.session().known(pid).and_then(|p| p.exit_code);
            if exited.is_some() || !pid_alive(pid) {
                tracer.info_mut().exit_status = exited;
                return None;
            }
        }
        if let Some(sig) = stop_signal() {
            if let Some(pid) = child {
                tracer.stop_job(pid, sig, usage);
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

    /// uc29's Ctrl-C to the process group: the launcher (62 faults of its
    /// own) died before reaping python (4,988), so its getrusage counts
    /// only itself; vmtrace counted both. The kernel's figure is then every
    /// process's own counters, and the scope says why: no false gap.
    #[test]
    fn a_command_that_did_not_wait_for_its_children_is_compared_by_each_processs_counters() {
        let mut s = crate::model::fold::tests::summary();
        s.processes.truncate(3);
        let set = |p: &mut crate::model::Process, pid, ka: Option<u64>| {
            p.pid = pid;
            p.faults.total = ka.unwrap_or(700);
            p.kernel_accounting = ka.map(|minor| KernelAccounting { minor, major: 0 });
        };
        set(&mut s.processes[0], 10, Some(62));
        set(&mut s.processes[1], 11, Some(4988));
        set(&mut s.processes[2], 12, None);
        let launcher = StatFaults { minor: 62, major: 0, children_minor: 0 };
        let perf = || crate::model::PerfSummary {
            kernel_minor_faults: 62,
            kernel_major_faults: 2,
            kernel_page_faults: 64,
            scope: "the command".into(),
            ..Default::default()
        };
        let text = |p: &crate::model::PerfSummary, procs: &[crate::model::Process]| {
            let mut s = s.clone();
            s.processes = procs.to_vec();
            s.totals.total = procs.iter().map(|p| p.faults.total).sum();
            s.perf = Some(p.clone());
            report::text::render(&s)
        };
        // Python exited (the exit hook read its counters); a third process
        // still ran at the stop, read then.
        let at_stop: crate::hash::HashMap<u32, u64> = [(12, 700)].into_iter().collect();
        let mut p = perf();
        count_unwaited(&mut p, &s.processes, 10, launcher, &at_stop);
        assert_eq!((p.kernel_minor_faults, p.kernel_page_faults), (62 + 4988 + 700, 64 + 4988 + 700));
        assert!(p.scope.contains("did not wait for every process it started"), "{}", p.scope);
        assert!(p.scope.contains("1 still running at the stop") && p.scope.contains(": 5688 of"), "{}", p.scope);
        let txt = text(&p, &s.processes);
        assert!(!txt.contains("GAP"), "{txt}");
        assert!(txt.contains("did not wait"), "{txt}");
        // Without: the uc29 figure, a false gap.
        assert!(text(&perf(), &s.processes).contains("GAP > 1%"));
        // A command that reaped them all: as before.
        let reaped = StatFaults { children_minor: 4988, ..launcher };
        let mut p = perf();
        count_unwaited(&mut p, &s.processes[..2], 10, reaped, &crate::hash::HashMap::default());
        assert_eq!(p, perf());
        // A process whose exit was not seen: no own count to sum, as before.
        let mut p = perf();
        count_unwaited(&mut p, &s.processes, 10, launcher, &crate::hash::HashMap::default());
        assert_eq!(p, perf());
    }

    /// uc30: `sh -c '… true; … env true; … ldconfig -p'`: kernel 577,
    /// vmtrace 569 exceptions and 8 faults through get_user_pages()
    /// (`totals.populated`), which the kernel's getrusage counts too.
    #[test]
    fn populated_faults_are_in_the_comparison_with_the_kernels_count() {
        let mut s = crate::model::fold::tests::summary();
        s.totals.total = 569;
        s.perf = Some(crate::model::PerfSummary {
            kernel_minor_faults: 577,
            kernel_page_faults: 577,
            scope: "the command".into(),
            ..Default::default()
        });
        s.lost_events = 0;
        s.totals.populated = Some(8);
        let txt = report::text::render(&s);
        assert!(!txt.contains("GAP"), "{txt}");
        assert!(txt.contains("vmtrace 569 + 8 through get_user_pages() (+0.00%)"), "{txt}");
        s.totals.populated = None;
        assert!(report::text::render(&s).contains("GAP > 1%"));
    }

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
