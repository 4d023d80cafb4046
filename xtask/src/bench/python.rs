//! The Python scenario: pyenv's CPython (built without frame pointers) under
//! vmtrace with and without Python frames, beside perf's DWARF stacks with
//! `-X perf`; and the cost of the Python walk per stack taken, from the
//! kernel's BPF run-time statistics (`vmtrace record --probe-stats`).
use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use super::{variant, Env, Tracer, Variant};

/// Rounds of the Python scenario's fill loop.
pub const PY_ROUNDS: u32 = 6;

/// The Python scenario's script: `fill_buffers` takes the faults; it times its
/// own loop and prints the workloads' report line.
const PY_FILL: &str = "\
import sys, time, json
def fill_buffers(n):
    bufs = []
    for _ in range(n): bufs.append(bytearray(4 << 20))
    return bufs
def main(rounds):
    for _ in range(rounds):
        b = fill_buffers(40)
        del b
t = time.perf_counter_ns(); main(int(sys.argv[1])); dt = time.perf_counter_ns() - t
print(json.dumps({'role': 'python-fill', 'loop_ns': dt, 'pages': int(sys.argv[1]) * 40 * 1024}))
";

/// Variants of the Python scenario: Python frames against none, and perf's
/// DWARF stacks with `-X perf` (its only way to name Python functions).
pub fn python_variants() -> Vec<Variant> {
    vec![
        variant("untraced", "the workload alone", Tracer::None),
        variant("vmtrace", "`vmtrace record` default", Tracer::Vmtrace(&[])),
        variant("vmtrace --stack-sample 1", "default with a user stack on every fault", Tracer::Vmtrace(&["--stack-sample", "1"])),
        variant(
            "vmtrace --stack-sample 1 --no-python-frames",
            "a user stack on every fault, native frames only (no walk of the interpreter's frames)",
            Tracer::Vmtrace(&["--stack-sample", "1", "--no-python-frames"]),
        ),
        variant(
            "perf record --call-graph dwarf -X perf",
            "`perf record -e page-faults -c 1 --call-graph dwarf -- python -X perf …`: an 8 KiB stack copy on every fault; `-X perf` adds perf trampolines so `perf report` names Python functions",
            Tracer::PerfDwarfXPerf,
        ),
    ]
}

/// The scenario's command: pyenv's newest 3.12 (or `python3`) on the script.
pub fn command(dir: &Path) -> Result<Vec<String>> {
    let script = dir.join("fill.py");
    std::fs::write(&script, PY_FILL)?;
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let mut found: Vec<_> = std::fs::read_dir(format!("{root}/versions"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("3.12."))
        .map(|e| e.path().join("bin/python3.12"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    let python = if let Some(p) = found.pop() {
        p.display().to_string()
    } else {
        let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output();
        let out = out.context("the python scenario needs pyenv's 3.12 or python3")?;
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    Ok(vec![python, script.display().to_string(), PY_ROUNDS.to_string()])
}

/// Runs and time of the fault programs that take stacks, from one recording
/// with `--probe-stats` and a stack on every fault.
fn fault_program_ns(env: &Env, extra: &[&str], argv: &[String]) -> Result<(u64, u64, u64)> {
    let out = env.out.display().to_string();
    let mut cmd = Command::new(&env.vmtrace);
    cmd.args(["record", "--out", &out, "--probe-stats", "--stack-sample", "1"]).args(extra).arg("--").args(argv);
    let status = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).status()?;
    if !status.success() {
        bail!("vmtrace record --probe-stats failed on {argv:?}");
    }
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(env.out.join("summary.json"))?)?;
    let progs = s["program_stats"].as_array().context("summary.json has no program_stats")?;
    // The programs that end a user fault take its stack.
    let (runs, ns) = progs
        .iter()
        .filter(|p| p["program"].as_str().is_some_and(|n| n.contains("page_fault_user")))
        .fold((0, 0), |(r, t), p| (r + p["runs"].as_u64().unwrap_or(0), t + p["run_time_ns"].as_u64().unwrap_or(0)));
    let py = s["stacks"]["python_faults"].as_u64().unwrap_or(0);
    Ok((runs, ns, py))
}

/// The Python walk's cost per stack taken: the fault program's mean run time
/// with Python frames minus without (median of 5 pairs).
pub fn walk_cost(env: &Env, argv: &[String]) -> Result<String> {
    let mut diffs = Vec::new();
    let mut last = (0.0, 0.0, 0);
    for _ in 0..5 {
        let (r1, t1, py) = fault_program_ns(env, &[], argv)?;
        let (r0, t0, _) = fault_program_ns(env, &["--no-python-frames"], argv)?;
        let (with, without) = (t1 as f64 / r1.max(1) as f64, t0 as f64 / r0.max(1) as f64);
        diffs.push(with - without);
        last = (with, without, py);
    }
    diffs.sort_by(f64::total_cmp);
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n### Python walk per stack taken\n\n`vmtrace record --probe-stats --stack-sample 1` on the python \
         scenario, with and without `--no-python-frames` (5 pairs): the user-fault program's mean run time \
         (the kernel's BPF run-time statistics) is {:.0} ns with Python frames and {:.0} ns without in the last \
         pair ({} faults with Python frames); the walk adds {:.0} ns per stack taken (median; {:.0}–{:.0}).",
        last.0,
        last.1,
        last.2,
        diffs[diffs.len() / 2],
        diffs[0],
        diffs[diffs.len() - 1]
    );
    Ok(t)
}
