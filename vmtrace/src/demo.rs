//! `vmtrace demo`: the built-in first-touch workload recorded for real, and
//! vmtrace's count set beside the workload's own getrusage.
use std::path::Path;

use crate::{
    record::{record, RecordError, RecordOptions},
    target::Target,
    workload::Report,
};

pub fn run(out: &Path) -> Result<i32, RecordError> {
    let exe =
        std::env::current_exe().map_err(|e| RecordError::Preflight(format!("cannot find own executable: {e}")))?;
    let dir = out.join("first-touch-4k");
    let argv = vec![exe.display().to_string(), "workload".into(), "touch".into(), "--mib".into(), "256".into()];
    println!("vmtrace demo: first touch of 256 MiB with 4 KiB pages, recorded into {}\n", dir.display());
    let outcome = record(&RecordOptions {
        target: Target::Command(argv),
        out: dir.clone(),
        duration: None,
        minor_period: 16,
        force_tracepoints: false,
        print_summary: true,
    })?;
    let _ = outcome;
    Ok(0)
}

/// Parses the JSON lines the built-in workloads print.
pub fn parse_reports(stdout: &str) -> Vec<Report> {
    stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
