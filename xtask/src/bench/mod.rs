//! `cargo xtask bench`: each scenario untraced and under each tracer, side by
//! side in interleaved rounds (the VM's memory balloon makes single runs
//! noisy: the minimum of many interleaved runs is the figure, the median shows
//! the spread). Workloads time their own measured loop, so tracer start-up is
//! excluded. `--soak SECS` measures the collector instead: CPU and peak RSS of
//! `vmtrace record -a` under a paced fault load. Rewrites docs/performance.md.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

mod python;
use python::{python_variants, PY_ROUNDS};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds per variant.
    #[arg(long, default_value_t = 7)]
    pub rounds: usize,
    /// Size of the first-touch workload.
    #[arg(long, default_value_t = 512)]
    pub mib: usize,
    /// Only scenarios whose name contains this.
    #[arg(long)]
    pub only: Option<String>,
    /// Only these variants (names as the tables print them, comma-separated);
    /// the untraced run is always kept. A loaded machine can measure a pair.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// Print the tables without rewriting docs/performance.md.
    #[arg(long)]
    pub no_write: bool,
    /// Instead of the scenarios: run `vmtrace record -a` for SECS under a paced
    /// fault load and report the collector's CPU and peak RSS.
    #[arg(long, value_name = "SECS")]
    pub soak: Option<u64>,
    /// Faults per second of the soak load.
    #[arg(long, default_value_t = 200_000)]
    pub soak_rate: u64,
}

/// What runs the workload.
#[derive(Clone)]
enum Tracer {
    None,
    /// `vmtrace record` with these extra arguments.
    Vmtrace(&'static [&'static str]),
    /// The scenario's bpftrace program.
    Bpftrace,
    /// `perf trace -F all`: one line per fault.
    PerfTrace,
    /// `perf record -e page-faults -c 1 --call-graph dwarf`: a copied user
    /// stack (8 KiB) on every fault, the peer of vmtrace's copied stacks.
    PerfDwarf,
    /// The same around a Python started with `-X perf`, so that perf can
    /// name its functions: the peer of vmtrace's Python frames.
    PerfDwarfXPerf,
}

struct Variant {
    name: &'static str,
    what: String,
    tracer: Tracer,
    /// ns per operation of each round.
    samples: Vec<f64>,
    /// vmtrace around a command: the fault time it reported for the
    /// workload's processes, each round (ns).
    fault_time: Vec<f64>,
    /// The error vmtrace stated for that time (`sampling.time_error_ns`), each round.
    stated_error: Vec<f64>,
}

struct Scenario {
    name: &'static str,
    what: String,
    /// Workload arguments after `vmtrace workload`.
    workload: Vec<String>,
    /// A command of its own instead (it prints the same report line).
    command: Option<Vec<String>>,
    /// Tracers run system-wide (`-a`) while two copies of the workload run.
    system: bool,
    /// The nearest bpftrace one-liner.
    bpftrace: &'static str,
    /// What one operation is.
    unit: &'static str,
    variants: Vec<Variant>,
}

const FAULTS_BT: &str = "tracepoint:exceptions:page_fault_user { @[pid] = count(); }";
const FILE_BT: &str = "tracepoint:exceptions:page_fault_user { @[pid] = count(); } \
                       tracepoint:filemap:mm_filemap_add_to_page_cache { @cache = count(); }";
const CHURN_BT: &str = "tracepoint:exceptions:page_fault_user { @f[pid] = count(); } \
                        tracepoint:syscalls:sys_enter_munmap { @m[pid] = count(); } \
                        tracepoint:tlb:tlb_flush { @t[args->reason] = count(); }";

fn variant(name: &'static str, what: &str, tracer: Tracer) -> Variant {
    Variant { name, what: what.into(), tracer, samples: vec![], fault_time: vec![], stated_error: vec![] }
}

/// The variants every scenario has; first touch and the warm mmap read add the cost breakdown.
fn variants(breakdown: bool) -> Vec<Variant> {
    let mut v = vec![
        variant("untraced", "the workload alone", Tracer::None),
        variant(
            "vmtrace",
            "`vmtrace record` default: every fault counted and placed in its region, every slow fault timed and 1 in 16 fast ones (`--fast-sample 16`, docs/design.md), user stacks 1 in 64 plus every slow fault, mmap/TLB/OOM hooks, resident memory, perf counters",
            Tracer::Vmtrace(&[]),
        ),
        variant(
            "vmtrace --fast-sample 1",
            "default, but every fault timed at the memcg end (the default from 2026-12-01, evening, to 2026-12-02, evening)",
            Tracer::Vmtrace(&["--fast-sample", "1"]),
        ),
        variant("vmtrace --stack-sample 1", "default with a user stack on every fault", Tracer::Vmtrace(&["--stack-sample", "1"])),
        variant("bpftrace", "the scenario's bpftrace one-liner (below)", Tracer::Bpftrace),
        variant(
            "perf trace -F all",
            "`perf trace -F all --no-syscalls -o /dev/null`: a line per fault (address, symbol, map)",
            Tracer::PerfTrace,
        ),
    ];
    if breakdown {
        v.extend([
            variant(
                "vmtrace resident off",
                "default without resident memory (`--events faults,regions,mmap,tlb,oom,perf`): no `rss_stat` program, no page samples",
                Tracer::Vmtrace(&["--events", "faults,regions,mmap,tlb,oom,perf"]),
            ),
            variant("vmtrace --stacks none", "default without call stacks", Tracer::Vmtrace(&["--stacks", "none"])),
            variant(
                "vmtrace --latency-sample 0",
                "every fault counted, majors timed, minors not timed, no stacks",
                Tracer::Vmtrace(&["--latency-sample", "0", "--stacks", "none"]),
            ),
            variant(
                "vmtrace lean",
                "`--events faults --stacks none --latency-sample 0`: per-process counts (minor/major/write/COW), majors timed — the nearest to the bpftrace one-liner",
                Tracer::Vmtrace(&["--events", "faults", "--stacks", "none", "--latency-sample", "0"]),
            ),
            variant(
                "vmtrace lean + regions",
                "`vmtrace lean` with the regions family (`--events faults,regions`): each family's share over the lean counting",
                Tracer::Vmtrace(&["--events", "faults,regions", "--stacks", "none", "--latency-sample", "0"]),
            ),
            variant(
                "vmtrace lean + mmap/tlb",
                "`vmtrace lean` with the mmap and TLB families (`--events faults,mmap,tlb`)",
                Tracer::Vmtrace(&["--events", "faults,mmap,tlb", "--stacks", "none", "--latency-sample", "0"]),
            ),
            variant(
                "vmtrace lean + timing",
                "`vmtrace lean` with the default's fault timing (`--events faults --stacks none`)",
                Tracer::Vmtrace(&["--events", "faults", "--stacks", "none"]),
            ),
            variant(
                "vmtrace --stack-window 0",
                "default with frame-pointer stacks only: no stack copied where a chain is not whole (before 2026-12-01)",
                Tracer::Vmtrace(&["--stack-window", "0"]),
            ),
            variant(
                "vmtrace --stack-sample 1 --stack-window 0",
                "a frame-pointer stack on every fault, none copied",
                Tracer::Vmtrace(&["--stack-sample", "1", "--stack-window", "0"]),
            ),
            variant(
                "perf record --call-graph dwarf",
                "`perf record -e page-faults -c 1 --call-graph dwarf`: an 8 KiB stack copy on every fault, unwound later by `perf report`",
                Tracer::PerfDwarf,
            ),
            variant(
                "vmtrace --force-tracepoints",
                "default, with classic tracepoints instead of tp_btf",
                Tracer::Vmtrace(&["--force-tracepoints"]),
            ),
        ]);
    }
    v
}

fn scenarios(args: &BenchArgs, file: &Path, python: Option<Vec<String>>) -> Vec<Scenario> {
    let f = file.display().to_string();
    let s = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
    let mut all = vec![
        Scenario {
            name: "first touch",
            what: format!("first touch of {} MiB of anonymous memory (4 KiB pages, MADV_NOHUGEPAGE)", args.mib),
            workload: s(&["touch", "--mib", &args.mib.to_string()]),
            command: None,
            system: false,
            bpftrace: FAULTS_BT,
            unit: "fault",
            variants: variants(true),
        },
        Scenario {
            name: "mmap checkpoint, warm",
            what: "a 256 MiB file in the page cache, mapped and read one byte per page".into(),
            workload: s(&["file-read", &f]),
            command: None,
            system: false,
            bpftrace: FILE_BT,
            unit: "page",
            // The scenario furthest above bpftrace (2026-12-06): its breakdown too.
            variants: variants(true),
        },
        Scenario {
            name: "mmap checkpoint, cold",
            what: "the same file evicted first (outside the timed loop): each page from disk, with readahead".into(),
            workload: s(&["file-read", &f, "--cold"]),
            command: None,
            system: false,
            bpftrace: FILE_BT,
            unit: "page",
            variants: variants(false),
        },
        Scenario {
            name: "munmap churn, 2 threads",
            what: "20,000 × (mmap 64 KiB, touch, munmap) on CPU 0 while a second thread spins on CPU 1: every munmap sends a shootdown IPI".into(),
            workload: s(&["churn", "--threads", "2", "--iterations", "20000"]),
            command: None,
            system: false,
            bpftrace: CHURN_BT,
            unit: "iteration",
            variants: variants(false),
        },
        Scenario {
            name: "system-wide, 2 processes",
            what: "tracers system-wide (`-a`) while two processes each first-touch 256 MiB at once".into(),
            workload: s(&["touch", "--mib", "256"]),
            command: None,
            system: true,
            bpftrace: FAULTS_BT,
            unit: "fault",
            variants: variants(false),
        },
    ];
    if let Some(cmd) = python {
        all.push(Scenario {
            name: "python",
            what: format!(
                "pyenv's CPython (no frame pointers) filling 4 MiB bytearrays in a function, {} rounds of 40: `{}`",
                PY_ROUNDS,
                cmd.join(" ")
            ),
            workload: Vec::new(),
            command: Some(cmd),
            system: false,
            bpftrace: FAULTS_BT,
            unit: "fault",
            variants: python_variants(),
        });
    }
    all
}

struct Env {
    vmtrace: PathBuf,
    out: PathBuf,
}

impl Env {
    fn workload(&self, args: &[String]) -> Vec<String> {
        let mut v = vec![self.vmtrace.display().to_string(), "workload".into()];
        v.extend_from_slice(args);
        v
    }

    /// The tracer's command line: around `argv`, or system-wide when `argv` is empty.
    fn tracer_argv(&self, t: &Tracer, bt: &str, argv: &[String]) -> Vec<String> {
        let s = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<String>>();
        let mut v = match t {
            Tracer::None => return argv.to_vec(),
            Tracer::Vmtrace(extra) => {
                let mut v = vec![self.vmtrace.display().to_string(), "record".into(), "--out".into()];
                v.push(self.out.display().to_string());
                v.extend(s(extra));
                v
            }
            Tracer::Bpftrace => s(&["bpftrace", "-q", "-e", bt]),
            Tracer::PerfTrace => s(&["perf", "trace", "-F", "all", "--no-syscalls", "-o", "/dev/null"]),
            Tracer::PerfDwarf | Tracer::PerfDwarfXPerf => {
                let data = self.out.join("perf.data").display().to_string();
                s(&["perf", "record", "-q", "-o", &data, "-e", "page-faults", "-c", "1", "--call-graph", "dwarf"])
            }
        };
        if let (Tracer::PerfDwarfXPerf, Some((python, rest))) = (t, argv.split_first()) {
            v.extend(["--".to_string(), python.clone(), "-X".into(), "perf".into()]);
            v.extend_from_slice(rest);
            return v;
        }
        match (t, argv.is_empty()) {
            (_, true) => v.push("-a".into()),
            (Tracer::Bpftrace, false) => v.extend(["-c".to_string(), argv.join(" ")]),
            _ => {
                v.push("--".into());
                v.extend_from_slice(argv);
            }
        }
        // bpftrace is system-wide without -c and takes no -a.
        if matches!(t, Tracer::Bpftrace) {
            v.retain(|a| a != "-a");
        }
        v
    }
}

/// ns per operation from the workload reports in `stdout` (their mean).
fn per_op(stdout: &str, argv: &[String], stderr: &str) -> Result<f64> {
    let per: Vec<f64> = stdout
        .lines()
        .filter(|l| l.contains("\"role\""))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["loop_ns"].as_f64().unwrap_or(0.0) / v["pages"].as_f64().unwrap_or(1.0).max(1.0))
        .collect();
    if per.is_empty() {
        bail!("no workload report from {argv:?}:\n{stdout}\n{stderr}");
    }
    Ok(per.iter().sum::<f64>() / per.len() as f64)
}

fn run_wrapped(argv: &[String]) -> Result<f64> {
    let out = Command::new(&argv[0]).args(&argv[1..]).output().with_context(|| format!("starting {}", argv[0]))?;
    per_op(&String::from_utf8_lossy(&out.stdout), argv, &String::from_utf8_lossy(&out.stderr))
}

fn stop(mut c: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc_kill(c.id() as i32, 2) };
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if c.try_wait().ok().flatten().is_some() {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// Starts a system-wide tracer and returns once it traces. vmtrace says so
/// on stderr (`tracing`, logged once every program is attached and Ctrl-C
/// is handled): on a busy machine its load takes far longer than a fixed
/// wait of 3 s (14.6 s at a load average of 18 on 2026-12-07; 2 s after
/// the fault-start program first ran, the fault-end, `rss_stat` and
/// page-allocation programs were not attached yet), and the workload would
/// run half traced. bpftrace compiles its one-liner in the fixed wait.
fn spawn_tracing(argv: &[String], vmtrace: bool) -> Result<Child> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdout(Stdio::null());
    if !vmtrace {
        let c = cmd.stderr(Stdio::null()).spawn().with_context(|| format!("starting {}", argv[0]))?;
        sleep(Duration::from_secs(3));
        return Ok(c);
    }
    let mut c = cmd
        .env("RUST_LOG", "vmtrace::record=info")
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    let err = c.stderr.take().context("vmtrace's stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Drained to the end, so that the end's lines never fill the pipe.
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(err).lines().map_while(std::io::Result::ok) {
            if line.contains("vmtrace::record] tracing") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_mins(3)).is_err() {
        stop(c);
        bail!("{argv:?} did not start tracing in 3 minutes");
    }
    Ok(c)
}

/// Two copies of the workload at once under a system-wide tracer.
fn run_system(env: &Env, t: &Tracer, bt: &str, workload: &[String]) -> Result<f64> {
    let tracer = if matches!(t, Tracer::None) {
        None
    } else {
        let argv = env.tracer_argv(t, bt, &[]);
        Some(spawn_tracing(&argv, matches!(t, Tracer::Vmtrace(_)))?)
    };
    let argv = env.workload(workload);
    let kids: Vec<Child> = (0..2)
        .map(|_| Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).spawn())
        .collect::<std::io::Result<_>>()?;
    let mut stdout = String::new();
    for k in kids {
        stdout.push_str(&String::from_utf8_lossy(&k.wait_with_output()?.stdout));
    }
    if let Some(c) = tracer {
        stop(c);
    }
    per_op(&stdout, &argv, "")
}

/// The fault time a recording reported for all its processes, and the
/// error it stated for it (0 when every fault was timed).
fn reported_fault_time(out: &Path) -> Option<(f64, f64)> {
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).ok()?).ok()?;
    Some((s["totals"]["time_ns"].as_f64()?, s["sampling"]["time_error_ns"].as_f64().unwrap_or(0.0)))
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
    let env = Env { vmtrace: root.join("target/release/vmtrace"), out: std::env::temp_dir().join("vmtrace-bench-out") };
    if let Some(secs) = args.soak {
        return soak(root, &env, args, secs);
    }
    // On disk (target/ is not tmpfs), so a cold read is disk I/O.
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("checkpoint.bin");
    let make = env.workload(&["make-file".into(), file.display().to_string(), "--mib".into(), "256".into()]);
    if !Command::new(&make[0]).args(&make[1..]).stdout(Stdio::null()).status()?.success() {
        bail!("cannot write {}", file.display());
    }
    let py = python::command(&dir)?;
    let mut scs: Vec<Scenario> = scenarios(args, &file, Some(py))
        .into_iter()
        .filter(|s| args.only.as_deref().is_none_or(|o| s.name.contains(o)))
        .collect();
    for sc in &mut scs {
        sc.variants
            .retain(|v| v.name == "untraced" || args.variants.is_empty() || args.variants.iter().any(|n| n == v.name));
    }
    if let Some(unknown) = args.variants.iter().find(|n| !scs.iter().any(|s| s.variants.iter().any(|v| &v.name == n))) {
        bail!("--variants: no variant named {unknown:?} in the scenarios run");
    }
    // The peers, where a variant kept runs them.
    let runs = |f: fn(&Tracer) -> bool| scs.iter().flat_map(|s| &s.variants).any(|v| f(&v.tracer));
    if runs(|t| matches!(t, Tracer::Bpftrace)) {
        crate::ensure_tool(&["bpftrace"], "bpftrace", "a peer to compare with")?;
    }
    if runs(|t| matches!(t, Tracer::PerfTrace | Tracer::PerfDwarf | Tracer::PerfDwarfXPerf)) {
        crate::ensure_tool(&["perf"], "linux-perf", "a peer to compare with")?;
    }
    for round in 0..args.rounds {
        for sc in &mut scs {
            let n = sc.variants.len();
            // Rotate the order each round so no variant always runs after the same one.
            for k in 0..n {
                let v = &mut sc.variants[(k + round) % n];
                let per = if sc.system {
                    run_system(&env, &v.tracer, sc.bpftrace, &sc.workload)?
                } else {
                    let argv = sc.command.clone().unwrap_or_else(|| env.workload(&sc.workload));
                    run_wrapped(&env.tracer_argv(&v.tracer, sc.bpftrace, &argv))?
                };
                v.samples.push(per);
                if let (Tracer::Vmtrace(_), false) = (&v.tracer, sc.system) {
                    if let Some((time, err)) = reported_fault_time(&env.out) {
                        v.fault_time.push(time);
                        v.stated_error.push(err);
                    }
                }
            }
        }
        eprintln!("xtask: bench round {}/{} done", round + 1, args.rounds);
    }
    let mut text = render(&scs, args);
    if let Some(sc) = scs.iter().find(|s| s.name == "python") {
        text.push_str(&python::walk_cost(&env, sc.command.as_deref().unwrap_or_default())?);
    }
    print!("{text}");
    if !args.no_write {
        write_doc(root, &text, "<!-- bench -->", "<!-- end of bench -->")?;
    }
    Ok(())
}

fn render(scs: &[Scenario], args: &BenchArgs) -> String {
    let mut t = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let _ = writeln!(
        t,
        "Generated by `cargo xtask bench` on {} (kernel {}, {cpus} CPUs), {} interleaved rounds. Ratios are to \
         the untraced run of the same round set; the minimum is the figure, the median shows the spread.\n",
        today(),
        kernel.trim(),
        args.rounds
    );
    let ratio = |sc: &Scenario, name: &str| {
        let base = min(&sc.variants[0].samples);
        sc.variants.iter().find(|v| v.name == name).map_or("—".into(), |v| format!("{:.2}×", min(&v.samples) / base))
    };
    let _ = writeln!(
        t,
        "| scenario (min ratio to untraced) | vmtrace | vmtrace, stack on every fault | bpftrace | perf trace -F all |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|");
    for sc in scs {
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            sc.name,
            ratio(sc, "vmtrace"),
            ratio(sc, "vmtrace --stack-sample 1"),
            ratio(sc, "bpftrace"),
            ratio(sc, "perf trace -F all")
        );
    }
    for sc in scs {
        let _ = writeln!(t, "\n### {}\n\n{}. bpftrace: `{}`\n", sc.name, sc.what, sc.bpftrace);
        let _ = writeln!(t, "| variant | min ns/{u} | ratio (min) | median ns/{u} | ratio (median) |", u = sc.unit);
        let _ = writeln!(t, "|---|---|---|---|---|");
        let (b_min, b_med) = (min(&sc.variants[0].samples), median(&sc.variants[0].samples));
        for v in &sc.variants {
            let (m, md) = (min(&v.samples), median(&v.samples));
            let _ = writeln!(t, "| {} | {m:.0} | {:.3} | {md:.0} | {:.3} |", v.name, m / b_min, md / b_med);
        }
    }
    fault_time_section(&mut t, scs);
    let _ = writeln!(t, "\nVariants:\n");
    let mut seen = Vec::new();
    for v in scs.iter().flat_map(|s| &s.variants) {
        if !seen.contains(&v.name) {
            seen.push(v.name);
            let _ = writeln!(t, "- **{}**: {}", v.name, v.what);
        }
    }
    t
}

fn today() -> String {
    Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Replaces the text between `begin` and `end` in docs/performance.md (adding
/// the section at the top when it is not there); the rest is hand-written.
fn write_doc(root: &Path, text: &str, begin: &str, end: &str) -> Result<()> {
    let path = root.join("docs/performance.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Performance\n".into());
    let section = format!("{begin}\n{text}{end}");
    let doc = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => format!("{}{section}{}", &old[..b], &old[e + end.len()..]),
        _ => match old.find('\n') {
            Some(i) => format!("{}\n\n{section}\n{}", &old[..i], &old[i + 1..]),
            None => format!("{old}\n\n{section}\n"),
        },
    };
    std::fs::write(&path, doc)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// What the collector used over one soak scenario.
struct CollectorCost {
    cpu_pct: f64,
    /// RSS (KiB) after the first second, at the end, and its peak (VmHWM).
    rss_first: u64,
    rss_last: u64,
    hwm: u64,
    /// Kernel memory of its BPF maps at the end (bytes, fdinfo `memlock`).
    kernel_maps: u64,
    /// Events lost, and processes seen, as the summary reports them.
    lost: Option<u64>,
    processes: Option<u64>,
    /// CPU seconds the collector used, and the seconds measured.
    cpu_s: f64,
    wall_s: f64,
}

impl CollectorCost {
    fn rows(&self) -> String {
        let mib = |k: u64| k as f64 / 1024.0;
        let opt = |v: Option<u64>| v.map_or_else(|| "?".into(), |v| v.to_string());
        format!(
            "| CPU, % of one core | {:.1} |\n\
             | RSS after 1 s / at the end / peak (VmHWM) | {:.1} / {:.1} / {:.1} MiB |\n\
             | kernel memory of its BPF maps at the end (fdinfo `memlock`) | {:.1} MiB |\n\
             | processes in the summary (rows + folded) / lost events | {} / {} |\n{}",
            self.cpu_pct,
            mib(self.rss_first),
            mib(self.rss_last),
            mib(self.hwm),
            self.kernel_maps as f64 / 1_048_576.0,
            opt(self.processes),
            opt(self.lost),
            self.per_process(),
        )
    }

    /// Processes a second, and the collector's CPU per process: what the
    /// cost of a node's churn is, base cost aside.
    fn per_process(&self) -> String {
        match self.processes {
            Some(n) if n >= 100 && self.wall_s > 0.0 => format!(
                "| processes a second / collector CPU per process | {:.0} / {:.2} ms |\n",
                n as f64 / self.wall_s,
                self.cpu_s * 1e3 / n as f64
            ),
            _ => String::new(),
        }
    }
}

/// Runs `vmtrace record -a` around `load` (started 3 s after the collector,
/// so that its start-up is not counted), sampling the collector's CPU and RSS
/// every second until `load` exits.
fn measure_collector(env: &Env, secs: u64, load: &mut dyn FnMut() -> Result<Child>) -> Result<(CollectorCost, Child)> {
    let _ = std::fs::remove_dir_all(&env.out);
    let rec = [
        env.vmtrace.display().to_string(),
        "record".into(),
        "-a".into(),
        "--out".into(),
        env.out.display().to_string(),
        "--duration".into(),
        (secs + 30).to_string(),
    ];
    let vm = spawn_tracing(&rec, true)?;
    let pid = vm.id();
    let (cpu0, _) = proc_cpu_rss(pid)?;
    let t0 = Instant::now();
    let mut w = load()?;
    let mut rss_samples = Vec::new();
    while w.try_wait()?.is_none() {
        sleep(Duration::from_secs(1));
        rss_samples.push(proc_cpu_rss(pid)?.1);
    }
    let (cpu1, _) = proc_cpu_rss(pid)?;
    let wall = t0.elapsed().as_secs_f64();
    let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    let kernel_maps = bpf_map_bytes(pid);
    stop(vm);
    let summary: Option<serde_json::Value> =
        std::fs::read_to_string(env.out.join("summary.json")).ok().and_then(|s| serde_json::from_str(&s).ok());
    let lost = summary.as_ref().and_then(|s| s["lost_events"].as_u64());
    let processes = summary.as_ref().and_then(|s| {
        let rows = s["processes"].as_array()?;
        let folded: u64 = rows.iter().filter_map(|r| r["folded"].as_u64()).sum();
        let plain = rows.iter().filter(|r| r["folded"].as_u64().unwrap_or(0) == 0).count() as u64;
        Some(plain + folded)
    });
    let cost = CollectorCost {
        cpu_pct: (cpu1 - cpu0) / wall * 100.0,
        rss_first: rss_samples.first().copied().unwrap_or(0),
        rss_last: rss_samples.last().copied().unwrap_or(0),
        hwm,
        kernel_maps,
        lost,
        processes,
        cpu_s: cpu1 - cpu0,
        wall_s: wall,
    };
    Ok((cost, w))
}

/// The kernel memory of the BPF maps process `pid` holds open: the sum of
/// their fdinfo `memlock` (from 6.4 the kernel's own count of what each map
/// uses, live entries only for maps that are not preallocated), each map once.
fn bpf_map_bytes(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return 0 };
    let mut seen = std::collections::HashMap::new();
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok());
        if let (Some(id), Some(bytes)) = (field("map_id:"), field("memlock:")) {
            seen.insert(id, bytes);
        }
    }
    seen.values().sum()
}

/// The churn load: a shell loop of short processes (what a node running
/// scripts and data pipelines looks like) for `secs`, with two 256 MiB first
/// touches, printing how many rounds it ran; `pause`: a sleep after each
/// round (a paced churn), else rounds back to back.
fn churn_script(env: &Env, secs: u64, pause: Option<&str>) -> String {
    let pause = pause.map_or_else(String::new, |p| format!(" sleep {p};"));
    let touch = env.workload(&["touch".into(), "--mib".into(), "256".into()]).join(" ");
    format!(
        "end=$(( $(date +%s) + {secs} )); n=0; half=$(( $(date +%s) + {secs} / 2 )); {touch} >/dev/null; \
         while [ $(date +%s) -lt $end ]; do /bin/true; sh -c 'ls / >/dev/null'; \
         python3 -c 'import json, ssl, sqlite3, decimal'; n=$((n+1));{pause} \
         if [ $half -gt 0 ] && [ $(date +%s) -ge $half ]; then half=0; {touch} >/dev/null; fi; done; echo $n"
    )
}

/// The pause after each round of the paced churn (seconds, as `sleep` takes it).
const PACED_CHURN_PAUSE: &str = "1";

/// Collector cost: `vmtrace record -a` for `secs` under a paced fault load,
/// then for `secs` beside process churn, back to back and paced.
fn soak(root: &Path, env: &Env, args: &BenchArgs, secs: u64) -> Result<()> {
    let load = env.workload(&[
        "fault-loop".into(),
        "--mib".into(),
        "64".into(),
        "--seconds".into(),
        secs.to_string(),
        "--rate".into(),
        args.soak_rate.to_string(),
    ]);
    let (paced, w) = measure_collector(env, secs, &mut || {
        Ok(Command::new(&load[0]).args(&load[1..]).stdout(Stdio::piped()).spawn()?)
    })?;
    let report = w.wait_with_output()?;
    let achieved = per_op(&String::from_utf8_lossy(&report.stdout), &load, "").map_or(0.0, |ns| 1e9 / ns);
    let churn_run = |pause: Option<&str>| -> Result<(CollectorCost, u64)> {
        let script = churn_script(env, secs, pause);
        let (cost, w) = measure_collector(env, secs, &mut || {
            Ok(Command::new("sh").arg("-c").arg(&script).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?)
        })?;
        let rounds: u64 = String::from_utf8_lossy(&w.wait_with_output()?.stdout).trim().parse().unwrap_or(0);
        Ok((cost, rounds))
    };
    let (churn, rounds) = churn_run(None)?;
    let (paced_churn, paced_rounds) = churn_run(Some(PACED_CHURN_PAUSE))?;
    let text = format!(
        "Generated by `cargo xtask bench --soak {secs}` on {}: `vmtrace record -a` (default events), \
         its CPU from /proc/PID/stat and its RSS sampled every second.\n\n\
         **Paced faults**: {secs} s while `vmtrace workload fault-loop --rate {}` ran, achieving {achieved:.0} faults/s.\n\n\
         | collector | value |\n|---|---|\n{}\n\
         **Process churn**: {secs} s while a shell loop ran `/bin/true`, `sh -c 'ls /'` and \
         `python3 -c 'import json, ssl, sqlite3, decimal'` ({rounds} rounds, {:.1} rounds/s, each 3 commands \
         and the processes they start), with a 256 MiB first touch at the start and halfway.\n\n\
         | collector | value |\n|---|---|\n{}\n\
         **Paced process churn**: the same loop with `sleep {PACED_CHURN_PAUSE}` after each round \
         ({paced_rounds} rounds, {:.1} rounds/s).\n\n\
         | collector | value |\n|---|---|\n{}",
        today(),
        args.soak_rate,
        paced.rows(),
        rounds as f64 / secs as f64,
        churn.rows(),
        paced_rounds as f64 / secs as f64,
        paced_churn.rows(),
    );
    print!("{text}");
    if !args.no_write {
        write_doc(root, &text, "<!-- soak -->", "<!-- end of soak -->")?;
    }
    Ok(())
}

/// (CPU seconds, RSS KiB) of a process.
fn proc_cpu_rss(pid: u32) -> Result<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the comm: state is [0]; utime [11], stime [12], rss pages [21].
    let ticks = 100.0;
    let cpu = (f[11].parse::<f64>()? + f[12].parse::<f64>()?) / ticks;
    let rss = f[21].parse::<u64>()? * 4;
    Ok((cpu, rss))
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// How far the default's fault time (slow faults exact, fast ones sampled)
/// strays from timing every fault: the same workload's reported fault time
/// per round, default against `--fast-sample 1`, beside the error the
/// default stated.
fn fault_time_section(t: &mut String, scs: &[Scenario]) {
    let ms = |v: f64| v / 1e6;
    let _ = writeln!(
        t,
        "\n### Fault time reported: the default (fast faults sampled 1 in 16) vs every fault timed\n\n\
         The workload's fault time as vmtrace reported it, per round (min–max over rounds, median); the error \
         the default stated (`sampling.time_error_pct`, one sigma, median over rounds); and the largest error \
         of a default round against the median of the every-fault rounds (the VM's noise is in both).\n"
    );
    let _ = writeln!(t, "| scenario | every fault (`--fast-sample 1`), ms | default, ms | default's stated error | worst default error |");
    let _ = writeln!(t, "|---|---|---|---|---|");
    for sc in scs.iter().filter(|s| !s.system) {
        let get = |name: &str| sc.variants.iter().find(|v| v.name == name);
        let (Some(all), Some(def)) = (get("vmtrace --fast-sample 1"), get("vmtrace")) else { continue };
        if all.fault_time.is_empty() || def.fault_time.is_empty() {
            continue;
        }
        let span = |v: &[f64]| {
            let max = v.iter().copied().fold(0.0, f64::max);
            format!("{:.1}–{:.1} (median {:.1})", ms(min(v)), ms(max), ms(median(v)))
        };
        let truth = median(&all.fault_time);
        let worst = def.fault_time.iter().map(|s| (s - truth).abs() / truth.max(1.0)).fold(0.0, f64::max);
        let stated: Vec<f64> =
            def.fault_time.iter().zip(&def.stated_error).map(|(time, err)| err / time.max(1.0)).collect();
        let _ = writeln!(
            t,
            "| {} | {} | {} | ±{:.1}% | {:.0}% |",
            sc.name,
            span(&all.fault_time),
            span(&def.fault_time),
            median(&stated) * 100.0,
            worst * 100.0
        );
    }
}
