use std::process::ExitCode;

use clap::Parser as _;
use vmtrace::{
    cli::{Cli, Command, EventFamily, Leaf, RecordArgs, RegionRows, WorkloadCmd},
    demo::{self, workload},
    kernel::preflight,
    record, report,
    target::Target,
    trace::{Plan, Stacks, Timing},
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).format_timestamp(None).init();
    match run(cli) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("vmtrace: error: {e:#}");
            ExitCode::from(failure_status(&e))
        }
    }
}

/// `vmtrace record`: the options as the recording takes them.
fn record_command(a: RecordArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        a.events.contains(&EventFamily::Faults),
        "--events must include `faults`: every other family builds on the fault probes"
    );
    let target = match (a.pid, a.all) {
        (Some(pid), _) => Target::Pid(pid),
        (None, true) => Target::System,
        _ => Target::Command(a.command),
    };
    let plan = Plan {
        target,
        families: EventFamily::families(&a.events),
        stacks: Stacks {
            mode: a.stacks,
            period: a.stack_sample,
            window: a.stack_window,
            python_frames: !a.no_python_frames,
            leaf_region: a.leaf == Leaf::Region,
        },
        timing: Timing { minor_period: a.latency_sample, fast_period: a.fast_sample },
        storm_threshold: a.storm_threshold,
        force_tracepoints: a.force_tracepoints,
        perfetto: a.perfetto,
        probe_stats: a.probe_stats,
    };
    let outcome = record::record(&record::RecordOptions {
        plan,
        out: a.out,
        duration: a.duration,
        stream_interval: a.stream.map(|_| a.interval),
        print_summary: true,
        output: report::OutputOptions {
            fold_below: if a.regions == RegionRows::All { 0.0 } else { a.fold_below },
            pretty: a.pretty,
        },
        detach: record::Detach::AfterExit,
    })?;
    Ok(outcome.exit_status)
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Record(a) => record_command(a),
        Command::Report { dir, perfetto } => {
            if perfetto {
                anyhow::bail!(
                    "{}",
                    vmtrace::export::perfetto::not_from_summary(&dir.join(vmtrace::export::perfetto::FILE))
                );
            }
            let s = report::rebuild(&dir).map_err(anyhow::Error::msg)?;
            print!("{}", report::text::render(&s));
            Ok(0)
        }
        Command::Check => {
            let checks = preflight::run_all();
            print!("{}", preflight::render(&checks));
            let missing = checks.iter().any(|c| c.status == preflight::Status::Missing);
            if !missing {
                match vmtrace::trace::probe_selection() {
                    Ok(attached) => print!("{}", vmtrace::loader::render_selection(&attached)),
                    Err(e) => {
                        println!("\nprobe selection: loading the programs failed: {e}");
                        return Ok(1);
                    }
                }
            }
            Ok(i32::from(missing))
        }
        Command::Demo { out } => Ok(demo::run(&out)?),
        Command::Top(a) => {
            let target = match (a.pid, a.command.is_empty()) {
                (Some(pid), _) => Target::Pid(pid),
                (None, false) => Target::Command(a.command),
                (None, true) => Target::System,
            };
            Ok(vmtrace::top::run(&vmtrace::top::TopOptions {
                target,
                command_output: a.command_output,
                interval: a.interval,
                storm_threshold: a.storm_threshold,
            })?)
        }
        Command::Serve { listen, allow_remote, pid, all: _, top, cgroups, no_profiles } => {
            Ok(vmtrace::serve::serve(&vmtrace::serve::ServeOptions {
                listen,
                allow_remote,
                target: pid.map_or(Target::System, Target::Pid),
                top,
                cgroups,
                profiles: !no_profiles,
            })?)
        }
        Command::Workload(w) => {
            let r = match w {
                WorkloadCmd::Touch { mib, huge, no_advice, threads, pace_ms, unmap } => {
                    workload::first_touch(mib, (!no_advice).then_some(huge), threads, pace_ms, unmap)
                }
                WorkloadCmd::FileRead { path, random, stride, cold } => {
                    workload::file_read(&path, random, stride, cold)
                }
                WorkloadCmd::MakeFile { path, mib } => workload::make_file(&path, mib),
                WorkloadCmd::ReadFile { path, cold } => workload::read_file(&path, cold),
                WorkloadCmd::FaultLoop { mib, seconds, rate } => workload::fault_loop(mib, seconds, rate),
                WorkloadCmd::MakeSafetensors { path, mib } => workload::make_safetensors(&path, mib),
                WorkloadCmd::Cow { children, mib, refcount } => workload::cow(children, mib, refcount),
                WorkloadCmd::Churn { threads, iterations, madvise, kib } => {
                    workload::churn(threads, iterations, madvise, kib << 10)
                }
                WorkloadCmd::Fork { children, mib, exit } => workload::fork_children(children, mib, exit),
                WorkloadCmd::HeapTrim { rounds } => workload::heap_trim(rounds),
                WorkloadCmd::CodeEvicted { path, rounds, keep } => workload::code_evicted(&path, rounds, keep),
                WorkloadCmd::Hold { mib, sites } => workload::hold(mib, sites),
                WorkloadCmd::Lock { mib, rest_mib, limit_kib } => workload::lock(mib, rest_mib, limit_kib),
            };
            r.map_err(anyhow::Error::msg)?;
            Ok(0)
        }
    }
}

/// vmtrace's own failures exit 1, except a command that cannot be started:
/// 127 when it is not found, 126 when it cannot be executed, as a shell does.
fn failure_status(e: &anyhow::Error) -> u8 {
    use vmtrace::{record::RecordError, target::TargetError, top::TopError, trace::TraceError};
    let trace = match (e.downcast_ref::<RecordError>(), e.downcast_ref::<TopError>()) {
        (Some(RecordError::Trace(t)), _) | (_, Some(TopError::Trace(t))) => Some(t),
        _ => None,
    };
    match trace {
        Some(TraceError::Target(TargetError::NotFound(_))) => 127,
        Some(TraceError::Target(TargetError::Exec(_, err))) if err.raw_os_error() == Some(libc::ENOENT) => 127,
        Some(TraceError::Target(TargetError::Exec(..))) => 126,
        _ => 1,
    }
}
