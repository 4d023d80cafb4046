//! `cargo xtask bench`: first touch of 512 MiB, untraced and under each tracer,
//! in interleaved rounds (the VM's memory balloon makes single runs noisy: the
//! minimum of many interleaved runs is the figure). The workload times its own
//! touch loop, so tracer start-up is excluded. Rewrites docs/performance.md.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds per variant.
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// Size of the first-touch workload.
    #[arg(long, default_value_t = 512)]
    pub mib: usize,
    /// Print the table without rewriting docs/performance.md.
    #[arg(long)]
    pub no_write: bool,
}

/// Builds a variant's full command line around the workload's argv.
type Wrap = Box<dyn Fn(&[String]) -> Vec<String>>;

struct Variant {
    name: &'static str,
    what: &'static str,
    wrap: Wrap,
    /// ns per page of each round.
    samples: Vec<f64>,
}

const BPFTRACE_PROG: &str = "tracepoint:exceptions:page_fault_user { @[pid] = count(); }";

fn ensure_bpftrace() -> Result<()> {
    if Command::new("bpftrace").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    eprintln!("xtask: installing bpftrace, the peer to compare with (apt-get install -y bpftrace)");
    let ok = Command::new("sh")
        .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftrace"])
        .status()?
        .success();
    if !ok {
        bail!("installing bpftrace failed; install it by hand (apt-get install bpftrace)");
    }
    Ok(())
}

fn variants(vmtrace: &Path, out: &Path) -> Vec<Variant> {
    let rec = move |extra: &'static [&'static str]| {
        let vmtrace = vmtrace.to_path_buf();
        let out = out.to_path_buf();
        Box::new(move |argv: &[String]| {
            let mut v = vec![vmtrace.display().to_string(), "record".into(), "--out".into(), out.display().to_string()];
            v.extend(extra.iter().map(ToString::to_string));
            v.push("--".into());
            v.extend_from_slice(argv);
            v
        }) as Wrap
    };
    vec![
        Variant { name: "untraced", what: "the workload alone", wrap: Box::new(<[String]>::to_vec), samples: vec![] },
        Variant {
            name: "vmtrace",
            what: "`vmtrace record` default: every fault counted and placed in its region, minor latency 1 in 16, majors all, user stacks 1 in 64, mmap/TLB/OOM hooks, perf counters",
            wrap: rec(&[]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace --latency-sample 1",
            what: "every fault counted and timed",
            wrap: rec(&["--latency-sample", "1"]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace --stacks none",
            what: "default without call stacks",
            wrap: rec(&["--stacks", "none"]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace --stack-sample 1",
            what: "a user stack on every fault",
            wrap: rec(&["--stack-sample", "1"]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace --latency-sample 0",
            what: "every fault counted, majors timed, minors not timed, no stacks",
            wrap: rec(&["--latency-sample", "0", "--stacks", "none"]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace lean",
            what: "`--events faults --stacks none --latency-sample 0`: per-process counts (minor/major/write/COW), majors timed — the nearest to the bpftrace one-liner",
            wrap: rec(&["--events", "faults", "--stacks", "none", "--latency-sample", "0"]),
            samples: vec![],
        },
        Variant {
            name: "vmtrace --force-tracepoints",
            what: "default, with classic tracepoints instead of tp_btf",
            wrap: rec(&["--force-tracepoints"]),
            samples: vec![],
        },
        Variant {
            name: "bpftrace per-pid count",
            what: "`bpftrace -e '{BPFTRACE_PROG}'`",
            wrap: Box::new(|argv: &[String]| {
                vec!["bpftrace".into(), "-q".into(), "-e".into(), BPFTRACE_PROG.into(), "-c".into(), argv.join(" ")]
            }),
            samples: vec![],
        },
    ]
}

/// ns per page reported by the workload's own JSON line.
fn run_once(argv: &[String]) -> Result<f64> {
    let out = Command::new(&argv[0]).args(&argv[1..]).output().with_context(|| format!("starting {}", argv[0]))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.contains("\"role\":\"first-touch\"")).with_context(|| {
        format!("no workload report from {:?}:\n{stdout}\n{}", argv, String::from_utf8_lossy(&out.stderr))
    })?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let (ns, pages) = (v["loop_ns"].as_f64().unwrap_or(0.0), v["pages"].as_f64().unwrap_or(1.0));
    Ok(ns / pages)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

pub fn run(root: &Path, args: &BenchArgs) -> Result<()> {
    ensure_bpftrace()?;
    let vmtrace = root.join("target/release/vmtrace");
    let out: PathBuf = std::env::temp_dir().join("vmtrace-bench-out");
    let workload: Vec<String> =
        vec![vmtrace.display().to_string(), "workload".into(), "touch".into(), "--mib".into(), args.mib.to_string()];
    let mut vs = variants(&vmtrace, &out);
    let n = vs.len();
    for round in 0..args.rounds {
        // Rotate the order each round so no variant always runs after the same one.
        for k in 0..n {
            let v = &mut vs[(k + round) % n];
            let ns = run_once(&(v.wrap)(&workload))?;
            v.samples.push(ns);
        }
        eprintln!("xtask: bench round {}/{} done", round + 1, args.rounds);
    }
    let base_min = min(&vs[0].samples);
    let base_med = median(&vs[0].samples);
    let mut table = String::new();
    let _ =
        writeln!(table, "| variant | min ns/fault | added (min) | ratio (min) | median ns/fault | ratio (median) |");
    let _ = writeln!(table, "|---|---|---|---|---|---|");
    for v in &vs {
        let (m, md) = (min(&v.samples), median(&v.samples));
        let _ = writeln!(
            table,
            "| {} | {m:.0} | {:+.0} | {:.3} | {md:.0} | {:.3} |",
            v.name,
            m - base_min,
            m / base_min,
            md / base_med
        );
    }
    let mut legend = String::new();
    for v in &vs {
        let _ = writeln!(legend, "- **{}**: {}", v.name, v.what);
    }
    print!("{table}");
    if !args.no_write {
        write_doc(root, args, &table, &legend)?;
    }
    Ok(())
}

fn write_doc(root: &Path, args: &BenchArgs, table: &str, legend: &str) -> Result<()> {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let date = Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())?;
    let path = root.join("docs/performance.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    // Everything after the marker is hand-written analysis and is kept.
    let marker = "<!-- end of generated section -->";
    let notes = old.find(marker).map_or("", |i| &old[i + marker.len()..]);
    let doc = format!(
        "# Performance\n\n\
         Generated by `cargo xtask bench` on {date} (kernel {}, {cpus} CPUs): first touch of {} MiB \
         ({} faults of 4 KiB, MADV_NOHUGEPAGE), {} interleaved rounds per variant. The workload times its \
         own touch loop, so tracer start-up is excluded. Ratios are to the untraced run; the minimum is the \
         figure (the VM's memory balloon makes single runs several times slower), the median shows the spread.\n\n\
         {table}\n{legend}\n{marker}{notes}",
        kernel.trim(),
        args.mib,
        args.mib * 256,
        args.rounds,
    );
    std::fs::write(&path, doc)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}
