//! Locked memory and NUMA placement against the kernel's own accounting:
//! an mlock'ed buffer against `VmLck` in /proc/PID/status while it is held,
//! with the stack that locked it; an `RLIMIT_MEMLOCK` refusal named with the
//! limit and the fix; and, on a host with one node, a plain "1 NUMA node".
mod common;

use std::{path::Path, process::Stdio};

use common::{compile_c, disk_dir, finish, privileged, record, status_kb, u, vmtrace};
use serde_json::Value;

/// Waits for `path` to exist (the workload writes it once its memory is
/// locked); panics with vmtrace's output if vmtrace ends first.
fn wait_for(path: &Path, child: &mut std::process::Child) -> String {
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("vmtrace ended ({st}) before the workload locked its buffer");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn site<'a>(sites: &'a [Value], pid: u64, call: &str) -> &'a Value {
    sites
        .iter()
        .find(|x| x["pid"] == pid && x["call"] == call)
        .unwrap_or_else(|| panic!("no {call} site of pid {pid} in {sites:#?}"))
}

/// Whether this host has one memory node (as vmtrace reads it).
fn one_node() -> bool {
    std::fs::read_to_string("/sys/devices/system/node/online").map_or(true, |s| s.trim() == "0")
}

#[test]
fn mlocked_buffer_shows_as_locked_with_its_stack() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c("lock_buffer.c", dir.path());
    let ready = dir.path().join("ready");
    let out = tempfile::tempdir().unwrap();
    let mut child = vmtrace()
        .arg("record")
        .arg("--out")
        .arg(out.path())
        .arg("--")
        .arg(&bin)
        .args(["mlock", "16"])
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run vmtrace");
    let pid: u32 = wait_for(&ready, &mut child).trim().parse().expect("the workload's pid");
    // Ground truth while the buffer is held: 16 MiB mlock'ed + 1 MiB MAP_LOCKED.
    let vm_lck = status_kb(pid, "VmLck");
    // Held past two of vmtrace's half-second reads of the machine's counters.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    std::fs::write(dir.path().join("ready.go"), "").unwrap();
    let run = finish(out, child.wait_with_output().unwrap());
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(vm_lck, 17 << 20, "the kernel's VmLck of the workload");

    let pinned = &run.summary["pinned"];
    let procs = pinned["processes"].as_array().expect("pinned.processes");
    let p = procs.iter().find(|p| p["pid"] == pid).unwrap_or_else(|| panic!("pid {pid} not in {pinned:#}"));
    // Read in the kernel at the MAP_LOCKED mmap's return: exactly VmLck.
    assert_eq!(u(&p["locked_bytes_peak"]), vm_lck, "{p:#}");
    assert!(p["timeline"].as_array().is_some_and(|t| t.len() >= 2), "a point per locking call: {p:#}");
    let sites = pinned["sites"].as_array().expect("pinned.sites");
    let m = site(sites, u64::from(pid), "mlock");
    assert_eq!((u(&m["calls"]), u(&m["bytes"]), u(&m["failed"])), (1, 16 << 20, 0), "{m:#}");
    let frames = m["frames"].to_string();
    assert!(frames.contains("setup_pool"), "the stack that locked the buffer: {frames}");
    let r = site(sites, u64::from(pid), "mmap(MAP_LOCKED)");
    assert_eq!(u(&r["bytes"]), 1 << 20, "{r:#}");
    assert!(r["frames"].to_string().contains("map_locked_ring"), "{r:#}");
    assert!(pinned["failures"].as_array().is_some_and(Vec::is_empty), "{pinned:#}");
    // The machine meanwhile: /proc/meminfo's Mlocked (every process's
    // locked pages) held the workload's at least; the page cache was read.
    let mach = &pinned["machine"];
    assert!(u(&mach["mlocked_bytes_peak"]) >= vm_lck, "{mach:#}");
    let (before, low, end) =
        (u(&mach["page_cache_bytes_before"]), u(&mach["page_cache_bytes_min"]), u(&mach["page_cache_bytes_end"]));
    assert!(before > 0 && low <= before && low <= end, "{mach:#}");

    // The same in summary.txt and report.html, and the mlock call site in mmap.folded.
    let read = |f: &str| std::fs::read_to_string(run.out.path().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let txt = read("summary.txt");
    assert!(txt.contains("Locked and pinned memory:") && txt.contains("17.0 MiB"), "{txt}");
    assert!(txt.contains("the machine while memory was locked"), "{txt}");
    let html = read("report.html");
    assert!(html.contains("<h2>Locked and pinned memory</h2>") && html.contains("setup_pool"), "report.html");
    assert!(read("mmap.folded").lines().any(|l| l.contains("setup_pool") && l.contains("[mlock]")), "mmap.folded");

    // NUMA: on one node, said plainly, with no per-process rows.
    let numa = &run.summary["numa"];
    if one_node() {
        assert_eq!(numa["nodes"], 1, "{numa:#}");
        assert!(numa["note"].as_str().is_some_and(|n| n.starts_with("1 NUMA node")), "{numa:#}");
        assert!(numa.get("processes").is_none(), "no zeros that read as all-local: {numa:#}");
        assert!(txt.contains("NUMA: 1 NUMA node"), "{txt}");
        assert!(html.contains("<h2>NUMA</h2>"), "report.html");
    } else {
        assert!(u(&numa["nodes"]) >= 2, "{numa:#}");
        let np = numa["processes"].as_array().and_then(|v| v.iter().find(|p| p["pid"] == pid));
        let np = np.unwrap_or_else(|| panic!("pid {pid} not in numa.processes: {numa:#}"));
        let pages: u64 = np["pages_by_node"].as_object().unwrap().values().map(u).sum();
        assert!(pages >= (17 << 20) / 4096, "the locked pages are resident and counted by node: {np:#}");
    }
}

#[test]
fn rlimit_memlock_failure_is_named() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c("lock_buffer.c", dir.path());
    // The workload sets RLIMIT_MEMLOCK to 64 KiB, becomes nobody (no
    // CAP_IPC_LOCK) and asks to lock 1 MiB: the kernel refuses (ENOMEM).
    let run = record(&[], &[bin.to_str().unwrap(), "limit", "1"]);
    assert_eq!(run.code(), Some(0), "the workload saw ENOMEM: {}", run.stderr());
    let failures = run.summary["pinned"]["failures"].as_array().expect("pinned.failures");
    assert_eq!(failures.len(), 1, "{failures:#?}");
    let f = &failures[0];
    assert_eq!(f["call"], "mlock");
    assert_eq!(f["errno"], "ENOMEM");
    assert_eq!(f["rlimit_memlock"], true, "{f:#}");
    assert_eq!((u(&f["limit_soft_bytes"]), u(&f["limit_hard_bytes"])), (64 << 10, 64 << 10), "{f:#}");
    assert_eq!(u(&f["bytes_asked"]), 1 << 20);
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("RLIMIT_MEMLOCK 64 KiB"), "{cause}");
    assert!(f["fix"].as_str().unwrap().contains("ulimit -l 1024"), "{f:#}");
    let findings = run.summary["findings"].as_array().expect("findings");
    assert!(findings.iter().any(|x| x["kind"] == "memlock_limit"), "{findings:#?}");
    let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(txt.contains("RLIMIT_MEMLOCK 64 KiB") && txt.contains("ulimit -l"), "{txt}");
}

/// Without `--events mmap`, no locking call is traced and `pinned` is absent
/// (not an empty section that would read as "nothing locked").
#[test]
fn no_pinned_section_without_mmap_events() {
    privileged!();
    let run = record(&["--events", "faults"], &["true"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.summary.get("pinned").is_none(), "{:#}", run.summary);
}

/// The workload's own `/proc/self/status` line `KEY: N kB`, in bytes.
fn own_status(run: &common::Run, key: &str) -> u64 {
    let out = String::from_utf8_lossy(&run.output.stdout);
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {key} line: {out}"))
        * 1024
}

/// A 96 MiB locked pool beside almost nothing else fires
/// `pinned_pool_oversized`, with the locked peak the process's own
/// `VmLck` gave and the site that locked it; the same pool beside 64 MiB
/// of memory in use stays silent.
#[test]
fn a_locked_pool_far_above_the_rest_fires_and_one_in_use_stays_silent() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c("lock_buffer.c", dir.path());
    let bin = bin.to_str().unwrap();
    let run = record(&[], &[bin, "pool", "96", "0"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let pid = run.summary["target"]["pid"].clone();
    let (vm_lck, vm_rss) = (own_status(&run, "VmLck:"), own_status(&run, "VmRSS:"));
    let findings = run.summary["findings"].as_array().expect("findings");
    let f = findings
        .iter()
        .find(|f| f["kind"] == "pinned_pool_oversized" && f["pid"] == pid)
        .unwrap_or_else(|| panic!("no pinned_pool_oversized: {findings:#?}"));
    assert_eq!(u(&f["evidence"]["locked_bytes_peak"]), vm_lck, "VmLck {vm_lck}, VmRSS {vm_rss}: {f:#}");
    let rest = u(&f["evidence"]["rest_bytes"]);
    assert!(rest < vm_rss - vm_lck + (4 << 20), "rest {rest}, the kernel's VmRSS − VmLck {}", vm_rss - vm_lck);
    assert!(f["site"].as_str().unwrap_or("").contains("lock_the_pool"), "{f:#}");
    assert!(f["fix"].as_str().unwrap().contains("pin_memory"), "{f:#}");
    // The mlock faulted the pool in through get_user_pages: no exception, so
    // not in `total`, but in the kernel's count: `populated`, and the two
    // add up to it (execve's own few get_user_pages faults aside).
    let faults = &run.process(u32::try_from(pid.as_u64().unwrap()).unwrap())["faults"];
    let populated = faults["populated"].as_u64().expect("populated, with the fexit or memcg fault end");
    // One a page: 4 KiB, or 2 MiB where THP is `always` (the vmtest guests).
    assert!(populated >= (96 << 20) / (2 << 20), "the pool's pages: {faults:#}");
    let k = &run.process(u32::try_from(pid.as_u64().unwrap()).unwrap())["kernel_accounting"];
    let kernel = u(&k["minor"]) + u(&k["major"]);
    let ours = u(&faults["total"]) + populated;
    assert!(ours.abs_diff(kernel) <= 16, "total + populated {ours}, the kernel's {kernel}: {faults:#}");

    let used = record(&[], &[bin, "pool", "96", "64"]);
    assert_eq!(used.code(), Some(0), "{}", used.stderr());
    let pid = used.summary["target"]["pid"].clone();
    let p = used.summary["pinned"]["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).cloned();
    assert!(p.is_some_and(|p| u(&p["locked_bytes_peak"]) >= 96 << 20), "{:#}", used.summary["pinned"]);
    let found = used.summary["findings"].as_array().unwrap();
    assert!(!found.iter().any(|f| f["kind"] == "pinned_pool_oversized"), "{found:#?}");
}
