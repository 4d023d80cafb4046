//! Helpers for the privileged tests: run the real binary against workloads the
//! tests start, and read the kernel's own accounting the workloads report.
#![allow(dead_code)]

use std::{
    ffi::OsStr,
    io::{BufRead as _, BufReader, Read as _},
    os::unix::process::CommandExt as _,
    process::{Child, ChildStderr, Command, Output, Stdio},
    thread::JoinHandle,
};

use serde_json::Value;
use vmtrace::demo::workload::Report;

pub const BIN: &str = env!("CARGO_BIN_EXE_vmtrace");

/// True when `program` runs (`program version_arg`). Missing, the test
/// fails unless `skip_var`=1 says to skip it explicitly (`cargo xtask test`
/// installs `package` first); `does` says what the test needs it for.
fn have_tool(test: &str, (program, version_arg): (&str, &str), skip_var: &str, does: &str, package: &str) -> bool {
    if Command::new(program).arg(version_arg).output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    if std::env::var(skip_var).as_deref() == Ok("1") {
        eprintln!("SKIPPED {test}: {skip_var}=1 and no `{program}` to {does}");
        return false;
    }
    panic!(
        "{test} needs `{program}` to {does} and there is none: install Debian's {package} (cargo xtask test does), \
         or set {skip_var}=1 to skip it explicitly"
    );
}

/// `go`, for `go tool pprof` (`VMTRACE_SKIP_GO_PPROF=1` skips).
pub fn have_go(test: &str) -> bool {
    have_tool(test, ("go", "version"), "VMTRACE_SKIP_GO_PPROF", "run `go tool pprof`", "golang-go")
}

/// `prometheus`, to scrape vmtrace (`VMTRACE_SKIP_PROMETHEUS=1` skips).
pub fn have_prometheus(test: &str) -> bool {
    have_tool(test, ("prometheus", "--version"), "VMTRACE_SKIP_PROMETHEUS", "scrape vmtrace", "prometheus")
}

/// Workload divisor for slow machines: `cargo xtask vmtest` sets
/// VMTRACE_TEST_SCALE=10 under software emulation, where every instruction
/// costs ~50×. Tests shrink their workloads (and rate thresholds) by it rather
/// than skip assertions.
pub fn scale() -> u64 {
    std::env::var("VMTRACE_TEST_SCALE").ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or(1)
}

/// True when privileged tests should run. A skip needs the explicit opt-out
/// variable and says so; otherwise a non-root run fails loudly.
pub fn may_run_privileged(test: &str) -> bool {
    if std::env::var("VMTRACE_SKIP_PRIVILEGED").as_deref() == Ok("1") {
        eprintln!("SKIPPED {test}: VMTRACE_SKIP_PRIVILEGED=1 (this test loads BPF programs)");
        return false;
    }
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "{test} loads BPF programs and needs root; set VMTRACE_SKIP_PRIVILEGED=1 to skip it explicitly"
    );
    true
}

/// `privileged!();` first in a privileged test: returns from it when
/// [`may_run_privileged`] says to skip, naming the test after the function it is
/// written in (a nested fn's type name is `crate::module::test::here`), so the
/// name cannot drift from the test's.
macro_rules! privileged {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let test = path.strip_suffix("::here").and_then(|p| p.rsplit("::").next()).unwrap_or(path);
        if !$crate::common::may_run_privileged(test) {
            return;
        }
    }};
}
pub(crate) use privileged;

pub struct Run {
    pub out: tempfile::TempDir,
    pub output: Output,
    pub summary: Value,
    /// JSON lines the built-in workloads printed about themselves.
    pub reports: Vec<Report>,
}

impl Run {
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    pub fn process(&self, pid: u32) -> &Value {
        self.summary["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
            .unwrap_or_else(|| panic!("pid {pid} not in summary: {:#}", self.summary))
    }

    pub fn report(&self, role: &str) -> &Report {
        self.reports.iter().find(|r| r.role == role).unwrap_or_else(|| panic!("no {role} report in {:?}", self.reports))
    }
}

pub fn vmtrace() -> Command {
    let mut c = Command::new(BIN);
    c.env("RUST_BACKTRACE", "1");
    c
}

/// A vmtrace run that has started tracing (see `spawn_traced`).
pub struct Traced {
    pub child: Child,
    stderr: String,
    rest: JoinHandle<String>,
}

/// Spawns `vmtrace -v ARGS` and returns once it says it is tracing. Its
/// start-up (BTF, verifying the programs) takes a second or two: a fixed wait
/// before starting a workload races with it.
pub fn spawn_traced<S: AsRef<OsStr>>(args: &[S]) -> Traced {
    spawn_traced_with(&[], args)
}

/// [`spawn_traced`] with environment variables set for vmtrace.
pub fn spawn_traced_with<S: AsRef<OsStr>>(env: &[(&str, &str)], args: &[S]) -> Traced {
    let mut c = vmtrace();
    c.envs(env.iter().copied());
    let mut child = c.arg("-v").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err: BufReader<ChildStderr> = BufReader::new(child.stderr.take().unwrap());
    let mut stderr = String::new();
    while !stderr.contains("] tracing ") {
        if err.read_line(&mut stderr).unwrap() == 0 {
            break;
        }
    }
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        rest
    });
    Traced { child, stderr, rest }
}

impl Traced {
    /// Stops the run with SIGINT (Ctrl-C) and waits for it to end.
    pub fn interrupt(self) -> Output {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.wait()
    }

    /// Waits for the run to end; its whole stderr is in the output.
    pub fn wait(self) -> Output {
        let mut out = self.child.wait_with_output().unwrap();
        out.stderr = (self.stderr + &self.rest.join().unwrap()).into_bytes();
        out
    }
}

/// `vmtrace record ARGS -- CMD…` into a fresh directory.
pub fn record(args: &[&str], cmd: &[&str]) -> Run {
    let out = tempfile::tempdir().expect("tempdir");
    let output = vmtrace()
        .arg("record")
        .arg("--out")
        .arg(out.path())
        .args(args)
        .arg("--")
        .args(cmd)
        .output()
        .expect("run vmtrace");
    finish(out, output)
}

pub fn finish(out: tempfile::TempDir, output: Output) -> Run {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reports = vmtrace::demo::workload::parse_reports(&stdout);
    let path = out.path().join("summary.json");
    let summary =
        std::fs::read_to_string(&path).map_or(Value::Null, |s| serde_json::from_str(&s).expect("summary.json parses"));
    // A Rust panic's own line: the summary printed on stderr lists other
    // processes' command lines, and one may name the word (`grep panicked
    // log` run beside a system-wide recording).
    assert!(
        !String::from_utf8_lossy(&output.stderr)
            .lines()
            .any(|l| l.starts_with("thread '") && l.contains("panicked at")),
        "vmtrace panicked:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Run { out, output, summary, reports }
}

/// `vmtrace workload …` as a command line.
pub fn workload(args: &[&str]) -> Vec<String> {
    let mut v = vec![BIN.to_string(), "workload".into()];
    v.extend(args.iter().map(ToString::to_string));
    v
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// |a - b| within `pct` percent of b.
pub fn assert_close(what: &str, got: u64, want: u64, pct: f64) {
    let diff = got.abs_diff(want) as f64;
    assert!(
        diff <= want as f64 * pct / 100.0,
        "{what}: vmtrace says {got}, the kernel says {want} (more than {pct}% apart)"
    );
}

/// A directory on a real disk (not tmpfs), so page-cache eviction means disk
/// I/O; removed when dropped.
pub fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("vmtrace-test-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("create test dir")
}

/// A safetensors checkpoint of about `mib` MiB (`vmtrace workload
/// make-safetensors`) in a fresh directory on disk, removed with the dir.
pub fn safetensors_on_disk(mib: u32) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = disk_dir();
    let path = dir.path().join("model.safetensors");
    let ok = vmtrace().args(["workload", "make-safetensors"]).arg(&path).args(["--mib", &mib.to_string()]).status();
    assert!(ok.is_ok_and(|s| s.success()), "cannot write {}", path.display());
    (dir, path)
}

/// Runs `cmd` as user nobody (for the unprivileged-user test).
pub fn as_nobody(c: &mut Command) -> &mut Command {
    c.uid(65_534).gid(65_534)
}

/// A fresh directory every user may enter, for what an unprivileged user must
/// reach. The checkout (root's 0700 home) and `TMPDIR` may be closed to others,
/// so the first candidate whose ancestors all let others through is used.
pub fn world_reachable_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let reachable = |dir: &std::path::Path| {
        dir.is_dir() && dir.ancestors().all(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
    };
    let base = [std::env::temp_dir(), "/tmp".into(), "/var/tmp".into(), "/dev/shm".into()]
        .into_iter()
        .find(|d| reachable(d))
        .expect("no directory that every user may enter (tried $TMPDIR, /tmp, /var/tmp, /dev/shm)");
    let dir = tempfile::Builder::new().prefix("vmtrace-test-").tempdir_in(base).expect("create a world-reachable dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A copy of the vmtrace binary that every user may run, inside `dir`.
pub fn world_runnable_bin(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let bin = dir.join("vmtrace");
    std::fs::copy(BIN, &bin).expect("copy the vmtrace binary");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// `sh -c` that runs `argv` after `prelude`, with every word passed as an
/// argument rather than pasted into the script: paths may hold spaces.
pub fn sh_then_exec(prelude: &str, argv: &[&str]) -> Vec<String> {
    let mut v = vec!["sh".to_string(), "-c".into(), format!("{prelude}\nexec \"$@\""), "sh".into()];
    v.extend(argv.iter().map(ToString::to_string));
    v
}

/// Log2-bucket upper bound holding quantile q of a summary histogram.
pub fn hist_quantile(h: &Value, q: f64) -> u64 {
    let m = h.as_object().expect("histogram");
    let mut buckets: Vec<(u64, u64)> =
        m.iter().map(|(k, v)| (k.strip_prefix("le_").and_then(|n| n.parse().ok()).unwrap_or(u64::MAX), u(v))).collect();
    buckets.sort_unstable();
    let n: u64 = buckets.iter().map(|b| b.1).sum();
    assert!(n > 0, "empty histogram");
    let rank = ((q * n as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (bound, c) in buckets {
        seen += c;
        if seen >= rank {
            return bound;
        }
    }
    u64::MAX
}

/// Flush IPIs received by every CPU so far: /proc/interrupts' `TLB` row.
pub fn tlb_ipis_received() -> u64 {
    let irq = std::fs::read_to_string("/proc/interrupts").expect("/proc/interrupts");
    irq.lines()
        .find(|l| l.trim_start().starts_with("TLB:"))
        .map_or(0, |l| l.split_whitespace().skip(1).map_while(|w| w.parse::<u64>().ok()).sum())
}

/// Whether a recording's storms must be there: the kernel counted flush IPIs
/// at 4x the threshold over the run (`ipis_before` from `tlb_ipis_received`).
/// On a busy machine two threads may take turns on one CPU and send none.
pub fn kernel_saw_a_storm(run: &Run, ipis_before: u64, threshold: u64) -> bool {
    let rate = (tlb_ipis_received() - ipis_before) as f64 / run.summary["duration_s"].as_f64().unwrap_or(1.0);
    let storm = rate >= 4.0 * threshold as f64;
    if !storm {
        eprintln!("the kernel counted {rate:.0} TLB IPIs/s, under 4x the threshold {threshold}/s: no storm required");
    }
    storm
}

/// Share of a folded file's weight whose line passes `pred`.
pub fn folded_share(folded: &str, pred: impl Fn(&str) -> bool) -> f64 {
    let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok()).unwrap_or(0);
    let total: u64 = folded.lines().map(weight).sum();
    let hit: u64 = folded.lines().filter(|l| pred(l)).map(weight).sum();
    hit as f64 / total.max(1) as f64
}

/// A folded line's Python frames alone, `;`-joined: 3.10 runs each Python
/// call in its own evaluation-loop call, so the native frames of the call
/// (`_PyEval_Vector`) lie between its Python frames; 3.11+ runs Python
/// calls inside one and its chains read the same either way.
pub fn python_only(line: &str) -> String {
    let stack = line.rsplit_once(' ').map_or(line, |(s, _)| s);
    stack.split(';').filter(|f| vmtrace::python::is_python_frame(f)).collect::<Vec<_>>().join(";")
}

/// pyenv's Python `minor` (3.x). Missing, the test fails, unless
/// `VMTRACE_SKIP_MISSING_PYTHON=1` lets it skip (`None`) and say so.
pub fn pyenv_python(minor: u32) -> Option<std::path::PathBuf> {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(format!("{root}/versions"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("3.{minor}.")))
        .map(|e| e.path().join(format!("bin/python3.{minor}")))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    if found.is_empty() {
        let why = format!("pyenv has no Python 3.{minor} under {root}/versions");
        assert!(
            std::env::var("VMTRACE_SKIP_MISSING_PYTHON").as_deref() == Ok("1"),
            "{why}: `pyenv install 3.{minor}`, or set VMTRACE_SKIP_MISSING_PYTHON=1 to skip explicitly"
        );
        eprintln!("SKIPPED: {why} (VMTRACE_SKIP_MISSING_PYTHON=1)");
    }
    found.pop()
}

/// A python with `packages` importable: `python3` itself when it has them,
/// else a virtualenv made from it under the target dir (cached across runs).
pub fn python_with(packages: &[&str]) -> std::path::PathBuf {
    // The interpreter itself, not a launcher script (pyenv shims are bash).
    let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output();
    let system = std::path::PathBuf::from(
        String::from_utf8(out.expect("python3 is needed for this test").stdout).unwrap().trim().to_string(),
    );
    python_from(&system, packages)
}

/// `base` when it imports `packages`, else a virtualenv made from it in
/// [`cache_dir`], outside the clone (made once per machine and interpreter,
/// as pip's own cache keeps the wheels), with them installed from the
/// registry. Panics with the fix when that fails: a test that needs them
/// never skips silently.
pub fn python_from(base: &std::path::Path, packages: &[&str]) -> std::path::PathBuf {
    let imports = packages.iter().map(|p| format!("import {p}")).collect::<Vec<_>>().join("; ");
    let has = |python: &std::path::Path| {
        Command::new(python).args(["-c", &imports]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    if has(base) {
        return base.to_path_buf();
    }
    let version = base.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // Two interpreters of one name (pyenv's and Debian's python3.11) get
    // venvs of their own: the name carries a hash of the interpreter's path.
    let id = base
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let name = format!("venv-{version}-{:08x}-{}", id as u32, packages.join("-"));
    let venv = cache_dir().join(&name);
    let python = venv.join("bin/python");
    if !has(&python) {
        // One test at a time makes a venv: the others wait, then use it.
        let lock = std::fs::File::create(cache_dir().join(format!("{name}.lock"))).expect("the cache is writable");
        // SAFETY: flock on a descriptor we own; released when `lock` drops.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
        if !has(&python) {
            let ok = Command::new(base).args(["-m", "venv", "--clear"]).arg(&venv).status().is_ok_and(|s| s.success())
                && Command::new(&python)
                    .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                    .args(packages)
                    .status()
                    .is_ok_and(|s| s.success());
            assert!(
                ok && has(&python),
                "cannot install {packages:?} into {}: pip install them for {}",
                venv.display(),
                base.display()
            );
        }
    }
    python
}

/// A test fixture's path (`vmtrace/tests/fixtures/NAME`).
pub fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Where downloads too large to fetch for every clone are kept between runs:
/// `$VMTRACE_CACHE`, else `$XDG_CACHE_HOME/vmtrace`, else `~/.cache/vmtrace`.
pub fn cache_dir() -> std::path::PathBuf {
    let home = || std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache");
    let dir = match (std::env::var_os("VMTRACE_CACHE"), std::env::var_os("XDG_CACHE_HOME")) {
        (Some(d), _) => std::path::PathBuf::from(d),
        (None, Some(x)) => std::path::PathBuf::from(x).join("vmtrace"),
        (None, None) => home().join("vmtrace"),
    };
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create the cache {}: {e}", dir.display()));
    dir
}

/// pyenv's Python 3.12 in a venv with torch (with its CUDA libraries; it
/// runs on the CPU), numpy and safetensors from the registry. The venv is
/// kept in [`cache_dir`], outside the clone: torch is ~3 GB, made once per
/// machine (pip's own cache keeps the wheels too). A failed install fails
/// the test with the fix, unless `VMTRACE_SKIP_TORCH=1` lets it skip
/// (`None`) and say so.
pub fn torch_python() -> Option<std::path::PathBuf> {
    let skip = std::env::var("VMTRACE_SKIP_TORCH").as_deref() == Ok("1");
    if skip {
        eprintln!("SKIPPED: VMTRACE_SKIP_TORCH=1 (the torch tests need a venv with torch, numpy and safetensors)");
        return None;
    }
    let base = pyenv_python(12)?;
    let version = base
        .parent()
        .and_then(|b| b.parent())
        .and_then(|v| v.file_name())
        .map_or_else(|| "3.12".to_string(), |n| n.to_string_lossy().into_owned());
    let venv = cache_dir().join(format!("venv-{version}-torch"));
    let python = venv.join("bin/python");
    let imports = "import torch, numpy, safetensors.torch";
    let has = || Command::new(&python).args(["-c", imports]).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
    if !has() {
        // One test at a time installs: the others wait on the lock.
        let lock = std::fs::File::create(cache_dir().join("venv-torch.lock")).expect("the cache is writable");
        // SAFETY: flock on a descriptor we own; released when `lock` drops.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
        if !has() {
            eprintln!("installing torch, numpy and safetensors into {} (once per machine)", venv.display());
            let ok = Command::new(&base).args(["-m", "venv", "--clear"]).arg(&venv).status().is_ok_and(|s| s.success())
                && Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "torch",
                        "numpy",
                        "safetensors",
                    ])
                    .status()
                    .is_ok_and(|s| s.success());
            assert!(
                ok && has(),
                "cannot install torch, numpy and safetensors into {}: check the package registry can be reached and \
                 there is ~6 GB free, or set VMTRACE_SKIP_TORCH=1 to skip the torch tests explicitly",
                venv.display()
            );
        }
    }
    Some(python)
}

/// Compiles the C fixture `name` (-O0, frame pointers: every function keeps
/// its frame, so its stacks name it) into `dir`; returns the binary.
pub fn compile_c(name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    compile_c_with(name, &["-O0", "-fno-omit-frame-pointer"], dir)
}

/// Compiles the C fixture `name` with `flags` into `dir`; returns the
/// binary. Where `VMTRACE_PREBUILT_FIXTURES` names a directory (a guest
/// without a compiler: `cargo xtask vmtest --arch arm64` cross-builds the
/// fixtures its tests use, with the same flags, before booting), the binary
/// built there is used instead, and its absence fails the test.
pub fn compile_c_with(name: &str, flags: &[&str], dir: &std::path::Path) -> std::path::PathBuf {
    let stem = name.trim_end_matches(".c");
    if let Some(prebuilt) = std::env::var_os("VMTRACE_PREBUILT_FIXTURES") {
        let bin = std::path::Path::new(&prebuilt).join(stem);
        assert!(bin.exists(), "VMTRACE_PREBUILT_FIXTURES: no prebuilt {} ({name} {flags:?})", bin.display());
        return bin;
    }
    let bin = dir.join(stem);
    let ok = Command::new("cc").args(flags).arg("-o").arg(&bin).arg(fixture(name)).status().expect("a C compiler (cc)");
    assert!(ok.success(), "compiling {name} failed");
    bin
}

/// A /proc/PID/status line's value in kB, as bytes.
pub fn status_kb(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("pid {pid}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.trim_start_matches(':').split_whitespace().next()))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        * 1024
}

/// A pprof profile decoded from its gzipped bytes.
pub fn pprof_from_gzip(gz: &[u8]) -> vmtrace_protos::pprof::Profile {
    use prost::Message as _;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).expect("a gzipped profile");
    vmtrace_protos::pprof::Profile::decode(raw.as_slice()).expect("a pprof Profile")
}

/// `pid`'s samples of `p` (first value): their total, and their sum under
/// each function name in their stacks (a sample counts once per name).
pub fn pprof_by_function(
    p: &vmtrace_protos::pprof::Profile,
    pid: u64,
) -> (u64, std::collections::BTreeMap<String, u64>) {
    let string = |i: i64| p.string_table.get(usize::try_from(i).unwrap_or(0)).cloned().unwrap_or_default();
    let functions: std::collections::HashMap<u64, String> = p.function.iter().map(|f| (f.id, string(f.name))).collect();
    let locations: std::collections::HashMap<u64, Vec<String>> = p
        .location
        .iter()
        .map(|l| (l.id, l.line.iter().filter_map(|x| functions.get(&x.function_id).cloned()).collect()))
        .collect();
    let mut total = 0;
    let mut out = std::collections::BTreeMap::new();
    for s in &p.sample {
        if !s.label.iter().any(|l| string(l.key) == "pid" && u64::try_from(l.num) == Ok(pid)) {
            continue;
        }
        let v = u64::try_from(s.value[0]).unwrap_or(0);
        total += v;
        let mut seen = std::collections::BTreeSet::new();
        for name in s.location_id.iter().filter_map(|l| locations.get(l)).flatten() {
            if seen.insert(name) {
                *out.entry(name.clone()).or_insert(0) += v;
            }
        }
    }
    (total, out)
}

/// The status and body of `GET target` from the HTTP server at `addr`.
pub fn http_get(addr: &str, target: &str) -> (u16, Vec<u8>) {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    write!(s, "GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    let at = reply.windows(4).position(|w| w == b"\r\n\r\n").expect("an HTTP reply");
    let head = String::from_utf8_lossy(&reply[..at]).to_string();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, reply[at + 4..].to_vec())
}

/// A Kubernetes-style memory cgroup (`kubepods/burstable/pod<uid>/<id>`, the
/// kubelet's cgroupfs layout), made for the test and removed after it: under
/// the v1 memory controller where there is one, else in the v2 hierarchy.
pub struct PodCgroup {
    /// Directories made, deepest last.
    made: Vec<std::path::PathBuf>,
    /// The container's cgroup: a process writes its pid into its `cgroup.procs`.
    pub leaf: std::path::PathBuf,
    /// The pod uid and the container id (64 hex digits) its path names.
    pub uid: String,
    pub id: String,
}

impl PodCgroup {
    pub fn new() -> Self {
        // Unique per run: the pid and the time.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let seed = format!("{:016x}{:08x}", nanos as u64, std::process::id());
        let uid = format!("{}-{}-4{}-8{}-{}", &seed[..8], &seed[8..12], &seed[12..15], &seed[15..18], &seed[..12]);
        let id: String = seed.repeat(4).chars().take(64).collect();
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
        let root = if v1.join("memory.limit_in_bytes").exists() {
            v1.to_path_buf()
        } else {
            std::path::PathBuf::from("/sys/fs/cgroup")
        };
        let mut made = Vec::new();
        let mut dir = root.clone();
        for part in ["kubepods".to_string(), "burstable".to_string(), format!("pod{uid}"), id.clone()] {
            if root.join("cgroup.subtree_control").exists() {
                // cgroup v2: the memory controller for the children.
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory");
            }
            dir = dir.join(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot make the cgroup {}: {e}", dir.display()));
                made.push(dir.clone());
            }
        }
        Self { made, leaf: dir, uid, id }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
