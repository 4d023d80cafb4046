//! `vmtrace demo`: the classic virtual-memory experiments, each run for real
//! under `record` into its own folder, then one comparison table and one
//! `report.html`. Workloads are built into the binary (`vmtrace workload …`).
//!
//! Also home of what the demo, the tests and the bench share to make and
//! measure known workloads: the workloads themselves ([`workload`], with the
//! reports they print about themselves) and a scratch memory cgroup
//! ([`cgroup`]). None of it is used by recording.
pub mod cgroup;
pub mod workload;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde::Serialize;

use crate::{
    model::{escape_html, fmt_ns, oom::render, Summary},
    record::{record, RecordError, RecordOptions},
    report::html,
    target::Target,
    trace::{Families, Plan, Stacks, Timing},
};

use cgroup::ScratchCgroup;
use workload::{parse_reports, REPORT_ENV};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot find own executable")]
    OwnExe(#[source] std::io::Error),
    /// The workloads report their failures as text (`vmtrace workload` prints it).
    #[error("{0}")]
    Checkpoint(String),
    /// Recording a scenario, and writing into the output directory.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// One row of the comparison table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub group: String,
    pub scenario: String,
    pub what: String,
    pub faults: u64,
    /// Faults the kernel took for the workload through get_user_pages()
    /// (its mlock): not in `faults`, in getrusage's count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub populated: Option<u64>,
    pub major: u64,
    pub cow: u64,
    pub fault_time_ns: u64,
    pub ipis_sent: u64,
    pub storms: usize,
    pub oom_kills: usize,
    pub exit_status: Option<i32>,
    /// The workloads' own getrusage total (minor + major), for comparison;
    /// null when none reported (a workload killed before it could).
    pub getrusage_faults: Option<u64>,
    pub note: String,
    /// What vmtrace diagnosed in this experiment: one line per finding
    /// (`kind process: what is wrong`), and the fix of each.
    pub findings: Vec<DemoFinding>,
}

/// A finding of one experiment, as demo.txt and demo.json show it.
#[derive(Clone, Debug, Serialize)]
pub struct DemoFinding {
    pub kind: String,
    pub summary: String,
    pub fix: String,
}

impl Row {
    /// The figures of the comparison table, in its column order.
    fn cells(&self) -> [String; 7] {
        [
            self.faults.to_string(),
            self.major.to_string(),
            self.cow.to_string(),
            fmt_ns(self.fault_time_ns),
            self.ipis_sent.to_string(),
            self.storms.to_string(),
            self.getrusage_faults.map_or("-".into(), |g| g.to_string()),
        ]
    }
}

struct Scenario {
    group: &'static str,
    name: &'static str,
    what: &'static str,
    argv: Vec<String>,
}

fn workload(exe: &Path, args: &[&str]) -> Vec<String> {
    let mut v = vec![exe.display().to_string(), "workload".into()];
    v.extend(args.iter().map(ToString::to_string));
    v
}

/// vmtrace's own binary under the name `comm` (a symlink in `bin`), so the
/// workload's processes are called what they are: "killed oom-hog", not
/// "killed vmtrace" (which read as if vmtrace itself had been killed). The
/// kernel names a process after the file it executed, cut to 15 bytes.
fn named_exe(bin: &Path, exe: &Path, comm: &str) -> PathBuf {
    let link = bin.join(comm);
    let _ = std::fs::remove_file(&link);
    if std::fs::create_dir_all(bin).and_then(|()| std::os::unix::fs::symlink(exe, &link)).is_ok() {
        link
    } else {
        exe.to_path_buf()
    }
}

/// The trim threshold and top pad of `heap-trim-kept`: what `heap_trim_refault`
/// suggests for a heap of this size (at least 64 MiB).
const HEAP_KEPT: u64 = crate::model::findings::HEAP_SUGGESTED_MIN;

/// Two forked workers read a parent's list of Python objects: each read
/// writes the object's reference count, so every page of them is copied
/// (what a fork DataLoader does to a Dataset's objects).
const FORK_PY: &str = "import os
data = [(i, str(i), [i]) for i in range(400_000)]
pids = []
for w in range(2):
    pid = os.fork()
    if pid == 0:
        n = 0
        for o in data:
            n += o[0] + len(o[1]) + len(o[2])
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
";

/// The interpreter `python3` on PATH runs (a pyenv shim resolves to its
/// real binary), if there is one.
fn python3() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && path.is_absolute()).then_some(path)
}

fn scenarios(exe: &Path, bin: &Path, ckpt: &str, code: &str) -> Vec<Scenario> {
    let mut all = base_scenarios(exe, bin, ckpt);
    all.extend(code_scenarios(exe, bin, code));
    // Python's lesson where a Python is installed: said so where there is none.
    match python3() {
        Some(py) => {
            let at = all.iter().position(|s| s.name == "cow-flat").map_or(all.len(), |i| i + 1);
            let py = named_exe(bin, &py, "cow-python").display().to_string();
            all.insert(
                at,
                Scenario {
                    group: "3. fork + copy-on-write",
                    name: "cow-python-objects",
                    what: "2 Python workers read a list of 400,000 objects (each read writes a reference count)",
                    argv: vec![py, "-c".into(), FORK_PY.into()],
                },
            );
        }
        None => {
            eprintln!("vmtrace demo: no python3 on PATH: the Python fork workers (cow-python-objects) are left out");
        }
    }
    all
}

fn base_scenarios(exe: &Path, bin: &Path, ckpt: &str) -> Vec<Scenario> {
    let named = |name: &str| named_exe(bin, exe, name);
    vec![
        Scenario {
            group: "1. first touch",
            name: "first-touch-4k",
            what: "256 MiB, 4 KiB pages (MADV_NOHUGEPAGE)",
            argv: workload(&named("touch-4k"), &["touch", "--mib", "256"]),
        },
        Scenario {
            group: "1. first touch",
            name: "first-touch-thp",
            what: "256 MiB, transparent huge pages (MADV_HUGEPAGE)",
            argv: workload(&named("touch-thp"), &["touch", "--mib", "256", "--huge"]),
        },
        Scenario {
            group: "1. first touch",
            name: "first-touch-no-advice",
            what: "256 MiB, no huge-page advice (the system's THP mode decides)",
            argv: workload(&named("touch-plain"), &["touch", "--mib", "256", "--no-advice"]),
        },
        Scenario {
            group: "2. checkpoint load",
            name: "ckpt-read-cold",
            what: "read() into a buffer, cold page cache",
            argv: workload(&named("read-cold"), &["read-file", ckpt, "--cold"]),
        },
        Scenario {
            group: "2. checkpoint load",
            name: "ckpt-mmap-cold",
            what: "mmap, sequential, cold",
            argv: workload(&named("mmap-cold"), &["file-read", ckpt, "--cold"]),
        },
        Scenario {
            group: "2. checkpoint load",
            name: "ckpt-mmap-warm",
            what: "mmap, sequential, warm",
            argv: workload(&named("mmap-warm"), &["file-read", ckpt]),
        },
        Scenario {
            group: "2. checkpoint load",
            name: "ckpt-mmap-random-cold",
            what: "mmap + MADV_RANDOM, every 4th page in random order, cold",
            argv: workload(&named("mmap-rand-cold"), &["file-read", ckpt, "--random", "--stride", "4", "--cold"]),
        },
        Scenario {
            group: "3. fork + copy-on-write",
            name: "cow-refcount",
            what: "2 workers walk 64 MiB writing a refcount per page (a list of objects)",
            argv: workload(&named("cow-refcount"), &["cow", "--children", "2", "--mib", "64", "--refcount"]),
        },
        Scenario {
            group: "3. fork + copy-on-write",
            name: "cow-flat",
            what: "2 workers read 64 MiB (one flat buffer)",
            argv: workload(&named("cow-flat"), &["cow", "--children", "2", "--mib", "64"]),
        },
        Scenario {
            group: "4. munmap churn",
            name: "churn-2-threads",
            what: "mmap/touch/munmap ×20k on CPU 0, a second thread on CPU 1",
            argv: workload(&named("churn-2thr"), &["churn", "--threads", "2"]),
        },
        Scenario {
            group: "4. munmap churn",
            name: "churn-1-thread",
            what: "the same with one thread",
            argv: workload(&named("churn-1thr"), &["churn", "--threads", "1"]),
        },
        Scenario {
            group: "5. heap trim",
            name: "heap-trim-default",
            what: "malloc/write/free 32 × 96 KiB, 100 rounds, glibc's defaults (trims the heap top on free)",
            argv: workload(&named("heap-trim"), &["heap-trim", "--rounds", "100"]),
        },
        Scenario {
            group: "5. heap trim",
            name: "heap-trim-kept",
            what: "the same with MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ at 64 MiB (the finding's fix)",
            argv: [
                vec![
                    "env".into(),
                    format!("MALLOC_TRIM_THRESHOLD_={HEAP_KEPT}"),
                    format!("MALLOC_TOP_PAD_={HEAP_KEPT}"),
                ],
                workload(&named("heap-kept"), &["heap-trim", "--rounds", "100"]),
            ]
            .concat(),
        },
    ]
}

/// Code evicted and read back (`code_major_faults`), and kept cached.
fn code_scenarios(exe: &Path, bin: &Path, code: &str) -> Vec<Scenario> {
    let named = |name: &str| named_exe(bin, exe, name);
    vec![
        Scenario {
            group: "6. code evicted",
            name: "code-evicted",
            what: "64 KiB of code called 200 times, its pages evicted before each round (as memory pressure does)",
            argv: workload(&named("code-evicted"), &["code-evicted", code, "--rounds", "200"]),
        },
        Scenario {
            group: "6. code evicted",
            name: "code-kept",
            what: "the same code kept cached (read once)",
            argv: workload(&named("code-kept"), &["code-evicted", code, "--rounds", "200", "--keep"]),
        },
    ]
}

/// Memory held to the end at one call site (`resident_site_dominant`), and
/// the same split between two sites. Recorded with resident memory by call
/// site (`--events resident`, the default of `record`).
fn held_scenarios(exe: &Path, bin: &Path) -> Vec<Scenario> {
    let named = |name: &str| named_exe(bin, exe, name);
    vec![
        Scenario {
            group: "7. memory held",
            name: "held-one-site",
            what: "1,280 MiB written at one call site and held until exit",
            argv: workload(&named("held-one-site"), &["hold", "--mib", "1280", "--sites", "1"]),
        },
        Scenario {
            group: "7. memory held",
            name: "held-two-sites",
            what: "the same 1,280 MiB, half from each of two call sites",
            argv: workload(&named("held-two-sites"), &["hold", "--mib", "1280", "--sites", "2"]),
        },
    ]
}

/// Locked memory: a pool far above what the process uses
/// (`pinned_pool_oversized`), one beside memory in use, and a lock the
/// kernel refuses under `RLIMIT_MEMLOCK` (`memlock_limit`).
fn locked_scenarios(exe: &Path, bin: &Path) -> Vec<Scenario> {
    let named = |name: &str| named_exe(bin, exe, name);
    vec![
        Scenario {
            group: "9. locked memory",
            name: "locked-pool-idle",
            what: "128 MiB mlock'ed as a reserve beside 8 MiB in use",
            argv: workload(&named("locked-idle"), &["lock", "--mib", "128", "--rest-mib", "8"]),
        },
        Scenario {
            group: "9. locked memory",
            name: "locked-pool-in-use",
            what: "the same pool beside 64 MiB in use",
            argv: workload(&named("locked-in-use"), &["lock", "--mib", "128", "--rest-mib", "64"]),
        },
        Scenario {
            group: "9. locked memory",
            name: "memlock-refused",
            what: "mlock of 1 MiB as user nobody under RLIMIT_MEMLOCK 64 KiB",
            argv: workload(&named("memlock-refused"), &["lock", "--mib", "1", "--limit-kib", "64"]),
        },
    ]
}

/// `resident`: resident memory by call site too (the held-memory
/// experiments; the others leave it out, as it changes nothing they show).
fn options(target: Target, out: PathBuf, resident: bool) -> RecordOptions {
    RecordOptions {
        plan: Plan {
            families: Families { resident, ..Families::ALL },
            stacks: Stacks { period: 16, leaf_region: true, ..Stacks::DEFAULT },
            timing: Timing::EVERY_FAULT,
            perfetto: true,
            ..Plan::new(target)
        },
        out,
        duration: None,
        stream_interval: None,
        print_summary: false,
        output: crate::report::OutputOptions::default(),
        detach: crate::record::Detach::Sequential,
    }
}

/// Records one scenario; the workload's own getrusage lines land beside it.
fn run_one(sc: Scenario, resident: bool, out: &Path) -> Result<(Row, Summary), RecordError> {
    let Scenario { group, name, what, argv } = sc;
    let dir = out.join(name);
    crate::record::prepare_out_dir(&dir)?;
    let reports = dir.join("workload-report.jsonl");
    let _ = std::fs::remove_file(&reports);
    // SAFETY (edition 2021: a safe fn): no other thread of vmtrace reads the environment now.
    std::env::set_var(REPORT_ENV, &reports);
    let outcome = record(&options(Target::Command(argv), dir.clone(), resident));
    std::env::remove_var(REPORT_ENV);
    let s = outcome?.summary;
    let lines = parse_reports(&std::fs::read_to_string(&reports).unwrap_or_default());
    let truth = (!lines.is_empty()).then(|| lines.iter().map(|r| r.minflt + r.majflt).sum());
    let row = Row {
        group: group.into(),
        scenario: name.into(),
        what: what.into(),
        faults: s.totals.total,
        populated: s.totals.populated,
        major: s.totals.major,
        cow: s.totals.cow,
        fault_time_ns: s.totals.time_ns,
        ipis_sent: s.processes.iter().filter_map(|p| p.tlb.as_ref()).map(|t| t.ipis_sent).sum(),
        storms: s.storms.as_ref().map_or(0, Vec::len),
        oom_kills: s.oom.as_ref().map_or(0, Vec::len),
        exit_status: s.target.exit_status,
        getrusage_faults: truth,
        note: String::new(),
        findings: s
            .findings
            .iter()
            .flatten()
            .map(|f| DemoFinding {
                kind: f.kind.clone(),
                summary: format!("{}: {}", f.process, f.summary),
                fix: f.fix.clone(),
            })
            .collect(),
    };
    println!(
        "  {name:<24} {:>9} faults  {:>9} major  {:>10}  {what}",
        row.faults,
        row.major,
        fmt_ns(row.fault_time_ns)
    );
    Ok((row, s))
}

pub fn run(out: &Path) -> Result<i32, DemoError> {
    let exe = std::env::current_exe().map_err(DemoError::OwnExe)?;
    crate::record::prepare_out_dir(out)?;
    println!("vmtrace demo: the classic virtual-memory experiments, each recorded into {}/<scenario>\n", out.display());
    let ckpt = out.join("model.safetensors");
    workload::make_safetensors(&ckpt, 64).map_err(DemoError::Checkpoint)?;
    let mut rows = Vec::new();
    let mut sections = Vec::new();
    let code = out.join("code.bin").display().to_string();
    let held = held_scenarios(&exe, &out.join("bin")).into_iter().map(|sc| (sc, true));
    for (sc, resident) in scenarios(&exe, &out.join("bin"), &ckpt.display().to_string(), &code)
        .into_iter()
        .map(|sc| (sc, false))
        .chain(held)
    {
        let (name, what) = (sc.name.to_string(), sc.what.to_string());
        let (row, s) = run_one(sc, resident, out)?;
        sections.push((name, what, s));
        rows.push(row);
    }
    // 8. OOM in a 64 MiB memory cgroup, when one can be made.
    let cg_name = format!("vmtrace-demo-{}", std::process::id());
    match ScratchCgroup::new(&cg_name, 64 << 20) {
        Ok(cg) => {
            let exe = named_exe(&out.join("bin"), &exe, "oom-hog").display().to_string();
            let hog = [exe.as_str(), "workload", "touch", "--mib", "256", "--pace-ms", "2"];
            let what = "a hog grows in a 64 MiB memory cgroup";
            let sc = Scenario { group: "8. OOM kill", name: "oom-64mib-cgroup", what, argv: cg.run_inside(&hog) };
            let (mut row, s) = run_one(sc, false, out)?;
            if let Some(o) = s.oom.as_ref().and_then(|v| v.first()) {
                row.note = render(o);
            }
            sections.push(("oom-64mib-cgroup".into(), what.into(), s));
            rows.push(row);
        }
        Err(e) => println!("  {:<24} skipped: {e}", "oom-64mib-cgroup"),
    }
    for sc in locked_scenarios(&exe, &out.join("bin")) {
        let (name, what) = (sc.name.to_string(), sc.what.to_string());
        let (row, s) = run_one(sc, false, out)?;
        sections.push((name, what, s));
        rows.push(row);
    }
    let table = comparison(&rows);
    println!("\n{table}");
    std::fs::write(out.join("demo.txt"), &table).map_err(|err| RecordError::OutDir { path: out.into(), err })?;
    let json = serde_json::to_string_pretty(&rows).unwrap_or_default();
    std::fs::write(out.join("demo.json"), json + "\n").map_err(|err| RecordError::OutDir { path: out.into(), err })?;
    std::fs::write(out.join("report.html"), demo_html(&rows, &sections, out))
        .map_err(|err| RecordError::OutDir { path: out.into(), err })?;
    println!(
        "\nwritten: {0}/report.html (open it in a browser), {0}/demo.txt, {0}/demo.json, one folder per scenario",
        out.display()
    );
    Ok(0)
}

/// What the GETRUSAGE column is, and why it differs from FAULTS by a few
/// faults, either way.
const GETRUSAGE_NOTE: &str =
    "GETRUSAGE: the faults each workload process counted itself (getrusage), read when it writes its\n\
     report, just before it exits. Two things part it from FAULTS, in opposite directions. GETRUSAGE\n\
     also has the kernel's get_user_pages() faults for it (execve copying its arguments: `populated`).\n\
     FAULTS also has the faults after the report (writing it, exiting). So FAULTS may be\n\
     a few below GETRUSAGE or a few above it. In the COW rows it is tens above: three processes, and\n\
     a forked worker shares its pages with its parent, so even writing its report copies pages.";

/// Populated faults above this many are a row's own story (an mlock, a
/// MAP_POPULATE), not execve's few.
const POPULATED_NOTE_MIN: u64 = 16;

/// The notes under the table, each a paragraph: what GETRUSAGE is, and the
/// rows whose GETRUSAGE has many faults the kernel took through
/// get_user_pages() (`populated`), which FAULTS leaves out.
fn getrusage_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = vec![GETRUSAGE_NOTE.to_string()];
    let populated: Vec<&Row> = rows.iter().filter(|r| r.populated.is_some_and(|p| p > POPULATED_NOTE_MIN)).collect();
    if !populated.is_empty() {
        let mut n = String::from(
            "GETRUSAGE also has the pages the kernel faulted in for a call (mlock, MAP_POPULATE: through\n\
             get_user_pages(), no fault of the program's own), which FAULTS leaves out; summary.json and\n\
             demo.json have them as `populated`:",
        );
        for r in populated {
            let p = r.populated.unwrap_or(0);
            let g = r.getrusage_faults.map_or("-".into(), |g| g.to_string());
            let _ =
                write!(n, "\n  {}: FAULTS {} + {p} populated = {} (GETRUSAGE {g})", r.scenario, r.faults, r.faults + p);
        }
        notes.push(n);
    }
    notes
}

fn find<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.scenario == name)
}

/// The table and what each pair shows.
pub fn comparison(rows: &[Row]) -> String {
    let mut t = format!(
        "{:<24} {:>9} {:>8} {:>8} {:>11} {:>9} {:>6} {:>9}\n",
        "SCENARIO", "FAULTS", "MAJOR", "COW", "FAULT TIME", "IPIS", "STORM", "GETRUSAGE"
    );
    let mut group = "";
    for r in rows {
        if r.group != group {
            group = &r.group;
            let _ = writeln!(t, "{group}");
        }
        let c = r.cells();
        let _ = writeln!(
            t,
            "  {:<22} {:>9} {:>8} {:>8} {:>11} {:>9} {:>6} {:>9}",
            r.scenario, c[0], c[1], c[2], c[3], c[4], c[5], c[6]
        );
    }
    for note in getrusage_notes(rows) {
        let _ = writeln!(t, "{note}");
    }
    let _ = writeln!(t, "\nWhat it shows:");
    if let (Some(a), Some(b)) = (find(rows, "first-touch-4k"), find(rows, "first-touch-thp")) {
        let _ = writeln!(
            t,
            "- huge pages: {} faults instead of {} for the same 256 MiB ({} vs {} in the fault handler)",
            b.faults,
            a.faults,
            fmt_ns(b.fault_time_ns),
            fmt_ns(a.fault_time_ns)
        );
        if b.fault_time_ns >= a.fault_time_ns {
            let _ = writeln!(
                t,
                "  Against the textbook, huge pages took no less time here: each huge fault zeroes 2 MiB and\n  \
                 may first compact memory to find a free 2 MiB block, and on a VM the host backs that memory\n  \
                 too, so run-to-run noise is large. Run the demo again to see whether it holds."
            );
        }
    }
    if let (Some(c), Some(w)) = (find(rows, "ckpt-mmap-random-cold"), find(rows, "ckpt-mmap-warm")) {
        let _ = writeln!(
            t,
            "- a cold random mmap read waits on disk: {} major faults, {} in faults; warm: {} major",
            c.major,
            fmt_ns(c.fault_time_ns),
            w.major
        );
        if c.major == 0 {
            let _ = writeln!(
                t,
                "  No major fault at all: the checkpoint stayed in the page cache (it could not be evicted)."
            );
        }
    }
    if let (Some(a), Some(b)) = (find(rows, "cow-refcount"), find(rows, "cow-flat")) {
        let _ = writeln!(
            t,
            "- fork workers writing refcounts copy every page: {} COW faults, vs {} when they only read",
            a.cow, b.cow
        );
    }
    if let (Some(a), Some(b)) = (find(rows, "churn-2-threads"), find(rows, "churn-1-thread")) {
        let _ = writeln!(
            t,
            "- munmap with a second thread on another CPU: {} shootdown IPIs and {} storm(s); alone: {} IPIs",
            a.ipis_sent, a.storms, b.ipis_sent
        );
        if a.storms == 0 {
            let _ = writeln!(
                t,
                "  No storm this time: the second thread was not running on the other CPU often enough\n  \
                 (on a VM two vCPUs may share one host CPU)."
            );
        }
    }
    if let (Some(a), Some(b)) = (find(rows, "heap-trim-default"), find(rows, "heap-trim-kept")) {
        let _ = writeln!(
            t,
            "- glibc trimming its heap on free: {} faults ({}); with the trim threshold raised: {} ({})",
            a.faults,
            fmt_ns(a.fault_time_ns),
            b.faults,
            fmt_ns(b.fault_time_ns)
        );
    }
    if let (Some(a), Some(b)) = (find(rows, "held-one-site"), find(rows, "held-two-sites")) {
        let dominant = |r: &Row| r.findings.iter().any(|f| f.kind == "resident_site_dominant");
        let _ = writeln!(
            t,
            "- 1,280 MiB held to the end: from one call site, {}; split between two sites, {}",
            if dominant(a) { "that site is named (resident_site_dominant)" } else { "no finding this time" },
            if dominant(b) { "one site still dominates" } else { "neither dominates: no finding" }
        );
    }
    if let Some(o) = find(rows, "oom-64mib-cgroup") {
        let _ = writeln!(t, "- {}", if o.note.is_empty() { "no OOM kill was seen".into() } else { o.note.clone() });
    }
    diagnosed(&mut t, rows);
    t
}

/// Each experiment's findings, under the table.
fn diagnosed(t: &mut String, rows: &[Row]) {
    let _ = writeln!(t, "\nWhat vmtrace diagnosed in each experiment (docs/findings.md):");
    for r in rows {
        if r.findings.is_empty() {
            let _ = writeln!(t, "  {:<22} no finding", r.scenario);
        }
        for f in &r.findings {
            let _ = writeln!(t, "  {:<22} [{}] {}\n  {:<22}   fix: {}", r.scenario, f.kind, f.summary, "", f.fix);
        }
    }
}

fn demo_html(rows: &[Row], sections: &[(String, String, Summary)], out: &Path) -> String {
    let mut b = String::from("<h2>Scenarios</h2><div class='scroll'><table><tr><th class='l'>scenario</th><th class='l'>what</th><th>faults</th><th>major</th><th>COW</th><th>fault time</th><th>shootdown IPIs</th><th>storms</th><th>getrusage</th></tr>");
    for r in rows {
        let cells = r.cells().iter().fold(String::new(), |mut acc, c| {
            let _ = write!(acc, "<td>{}</td>", escape_html(c));
            acc
        });
        let _ = write!(
            b,
            "<tr><td><a href='#{0}'>{0}</a></td><td class='l'>{1}</td>{cells}</tr>",
            escape_html(&r.scenario),
            escape_html(&r.what)
        );
    }
    b.push_str("</table></div>");
    for note in getrusage_notes(rows) {
        // The text's line breaks flow, a list's items keep theirs.
        let _ = write!(b, "<p class='note'>{}</p>", escape_html(&note).replace("\n  ", "<br>").replace('\n', " "));
    }
    let _ = write!(
        b,
        "<h3>What it shows</h3><pre class='wrap'>{}</pre>",
        escape_html(comparison(rows).split("What it shows:").nth(1).unwrap_or("").trim_start_matches('\n'))
    );
    for (name, what, s) in sections {
        let _ = write!(
            b,
            "<h2 id='{0}'>{0}</h2><p>{1}</p>{2}",
            escape_html(name),
            escape_html(what),
            html::recording_body(s, &out.join(name), &format!("{name}/"))
        );
    }
    html::page("vmtrace demo: where does memory time go?", &b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(scenario: &str, faults: u64, time_ms: u64) -> Row {
        Row {
            group: "g".into(),
            scenario: scenario.into(),
            what: String::new(),
            faults,
            populated: None,
            major: 0,
            cow: 0,
            fault_time_ns: time_ms * 1_000_000,
            ipis_sent: 0,
            storms: 0,
            oom_kills: 0,
            exit_status: Some(0),
            getrusage_faults: Some(faults),
            note: String::new(),
            findings: Vec::new(),
        }
    }

    #[test]
    fn the_table_says_what_getrusage_is_and_when_the_textbook_does_not_hold() {
        let textbook = [row("first-touch-4k", 65_536, 96), row("first-touch-thp", 128, 54)];
        let t = comparison(&textbook);
        assert!(t.contains("GETRUSAGE: the faults each workload process counted itself"), "{t}");
        assert!(t.contains("a few below GETRUSAGE or a few above it"), "either way, each said why: {t}");
        assert!(!t.contains("Against the textbook"), "{t}");
        let flipped = [row("first-touch-4k", 65_536, 96), row("first-touch-thp", 128, 211)];
        assert!(comparison(&flipped).contains("Against the textbook, huge pages took no less time here"));
    }

    #[test]
    fn the_table_explains_the_populated_pages_getrusage_counts() {
        let mut plain = row("first-touch-4k", 65_752, 96);
        (plain.populated, plain.getrusage_faults) = (Some(1), Some(65_755));
        let mut locked = row("locked-pool-idle", 2_255, 4);
        (locked.populated, locked.getrusage_faults) = (Some(32_769), Some(35_025));
        let t = comparison(&[plain.clone(), locked]);
        assert!(t.contains("\n  locked-pool-idle: FAULTS 2255 + 32769 populated = 35024 (GETRUSAGE 35025)\n"), "{t}");
        assert!(!t.contains("first-touch-4k: FAULTS"), "execve's populated fault is the general note's: {t}");
        assert!(!comparison(&[plain]).contains("populated = "), "no row populated much: no list");
    }

    #[test]
    fn workloads_run_under_their_own_names() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let named = named_exe(&dir.path().join("bin"), &exe, "oom-hog");
        assert_eq!(named.file_name().and_then(|n| n.to_str()), Some("oom-hog"));
        assert_eq!(std::fs::canonicalize(&named).unwrap(), std::fs::canonicalize(&exe).unwrap());
        // Made again over the old link, as a second demo run does.
        assert_eq!(named_exe(&dir.path().join("bin"), &exe, "oom-hog"), named);
    }
}
