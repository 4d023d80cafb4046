//! `vmtrace demo`: the built-in first-touch workload recorded for real, and
//! vmtrace's count set beside the workload's own getrusage.
use std::path::Path;

use crate::{
    cli::EventFamily,
    record::{record, RecordError, RecordOptions},
    report::text::fmt_ns,
    target::Target,
    workload::{Report, REPORT_ENV},
};

const MIB: usize = 256;

pub fn run(out: &Path) -> Result<i32, RecordError> {
    let exe =
        std::env::current_exe().map_err(|e| RecordError::Preflight(format!("cannot find own executable: {e}")))?;
    let dir = out.join("first-touch-4k");
    crate::record::prepare_out_dir(&dir)?;
    let report_file = dir.join("workload-report.jsonl");
    let _ = std::fs::remove_file(&report_file);
    let argv = vec![exe.display().to_string(), "workload".into(), "touch".into(), "--mib".into(), MIB.to_string()];
    println!("vmtrace demo: first touch of {MIB} MiB with 4 KiB pages, recorded into {}\n", dir.display());
    // The traced workload inherits this and writes its getrusage there.
    // SAFETY (edition 2021: safe fn): single-threaded at this point.
    std::env::set_var(REPORT_ENV, &report_file);
    let outcome = record(&RecordOptions {
        target: Target::Command(argv),
        out: dir.clone(),
        duration: None,
        minor_period: 16,
        force_tracepoints: false,
        events: vec![EventFamily::Faults, EventFamily::Mmap, EventFamily::Tlb, EventFamily::Oom, EventFamily::Perf],
        stacks: crate::stacks::StackMode::User,
        stack_period: 16,
        leaf_region: true,
        storm_threshold: 1000.0,
        print_summary: true,
    });
    std::env::remove_var(REPORT_ENV);
    let outcome = outcome?;
    let reports = parse_reports(&std::fs::read_to_string(&report_file).unwrap_or_default());
    if let (Some(r), Some(p)) =
        (reports.first(), outcome.summary.processes.iter().find(|p| Some(p.pid) == outcome.summary.target.pid))
    {
        let f = &p.faults;
        let truth = r.minflt + r.majflt;
        println!(
            "\nground truth: the workload's own getrusage() counts {truth} faults ({} minor, {} major); \
             vmtrace counted {} ({:+.2}%), {} in the fault handler: {:.0} ns per fault",
            r.minflt,
            r.majflt,
            f.total,
            (f.total as f64 - truth as f64) * 100.0 / truth.max(1) as f64,
            fmt_ns(f.time_ns),
            f.time_ns as f64 / f.total.max(1) as f64,
        );
    }
    Ok(outcome.exit_status)
}

/// Parses the JSON lines the built-in workloads print.
pub fn parse_reports(text: &str) -> Vec<Report> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
