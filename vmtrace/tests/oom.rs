//! OOM kills in a memory cgroup the test makes under its own (privileged).
mod common;

use std::fs;

use common::*;

#[test]
fn memcg_oom_names_victim_trigger_cgroup_and_what_it_held() {
    privileged!();
    let name = format!("vmtrace-oom-{}", std::process::id());
    let cg = vmtrace::demo::cgroup::ScratchCgroup::new(&name, 64 << 20)
        .expect("a memory cgroup (v1 or v2) is needed to test OOM kills without risking a global OOM");
    let argv = cg.run_inside(&[BIN, "workload", "touch", "--mib", "256", "--pace-ms", "5"]);
    let run = record(&[], &strs(&argv));
    assert_eq!(run.code(), Some(137), "the hog's SIGKILL comes through: {}", run.stderr());
    let pid = run.summary["target"]["pid"].as_u64().unwrap();
    // OOM kills are reported system-wide: the other OOM test's kill may show too.
    let ooms: Vec<_> =
        run.summary["oom"].as_array().expect("oom section").iter().filter(|o| o["in_target"] == true).collect();
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!(o["victim_pid"], pid);
    assert_eq!(o["victim_comm"], "vmtrace");
    assert_eq!(o["trigger_pid"], pid, "a memcg OOM is triggered by the charging task itself");
    assert_eq!(o["constraint"], "memcg", "{o:#}");
    assert_eq!(o["victim_cgroup_source"], "kernel", "{o:#}");
    // Read at oom_kill_process() where a probe can run there, derived otherwise.
    let probed = run.summary["probes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["what"] == "OOM constraint and memcg" && p["program_type"] != "none");
    assert_eq!(o["constraint_source"], if probed { "kernel" } else { "derived" }, "{o:#}");
    assert!(o["cgroup"].as_str().unwrap().ends_with(&format!("/{name}")), "{o:#}");
    assert_eq!(o["cgroup_limit_bytes"], 64u64 << 20);
    let anon = u(&o["anon_rss_kb"]);
    assert!((48 * 1024..=66 * 1024).contains(&anon), "anon RSS near the 64 MiB limit: {anon} kB");
    assert_eq!(o["in_target"], true);
    assert!(o["fault_rate_per_s"].as_f64().unwrap() > 0.0, "{o:#}");
    assert!(u(&o["victim_reclaim_stalls"]) > 0, "a hog at its limit stalls in reclaim first");
    assert_eq!(run.process(pid as u32)["exit_code"], 137);
    let txt = fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(txt.contains("killed vmtrace") && txt.contains("ran out"), "{txt}");
}

/// Another tracer's classic probe on oom:mark_victim, registered before ours,
/// runs our classic hook before our tp_btf one on the same call: the event
/// waits for the tp_btf hook, so the victim's cgroup is still the kernel's.
#[test]
fn victim_cgroup_is_the_kernels_when_another_tracer_came_first() {
    privileged!();
    let first_out = tempfile::tempdir().unwrap();
    let mut first = vmtrace()
        .args(["record", "-a", "--events", "faults,oom", "--duration", "60", "--out"])
        .arg(first_out.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let name = format!("vmtrace-oom2-{}", std::process::id());
    let cg = vmtrace::demo::cgroup::ScratchCgroup::new(&name, 32 << 20).expect("a memory cgroup (v1 or v2)");
    let argv = cg.run_inside(&[BIN, "workload", "touch", "--mib", "128", "--pace-ms", "5"]);
    let run = record(&["--events", "faults,oom"], &strs(&argv));
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    let _ = first.wait();
    assert_eq!(run.code(), Some(137), "{}", run.stderr());
    let ooms: Vec<_> =
        run.summary["oom"].as_array().expect("oom section").iter().filter(|o| o["in_target"] == true).collect();
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = ooms[0];
    assert_eq!(o["victim_cgroup_source"], "kernel", "{o:#}");
    assert!(o["cgroup"].as_str().unwrap_or_default().ends_with(&format!("/{name}")), "{o:#}");
    assert_eq!(o["constraint"], "memcg", "{o:#}");
}

/// The OOM-domain probe's fallbacks: with --force-tracepoints fentry is off,
/// so a kernel with kprobes reads the constraint through the kprobe, and one
/// without (this machine) derives it from the cgroup's counters.
#[test]
fn memcg_oom_constraint_without_fentry() {
    privileged!();
    let name = format!("vmtrace-oomkp-{}", std::process::id());
    let cg = vmtrace::demo::cgroup::ScratchCgroup::new(&name, 32 << 20).expect("a memory cgroup (v1 or v2)");
    let argv = cg.run_inside(&[BIN, "workload", "touch", "--mib", "128", "--pace-ms", "5"]);
    let run = record(&["--force-tracepoints", "--events", "faults,oom"], &strs(&argv));
    assert_eq!(run.code(), Some(137), "{}", run.stderr());
    let probe = run.summary["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["what"] == "OOM constraint and memcg")
        .cloned()
        .expect("the OOM-domain probe is listed");
    assert_ne!(probe["program_type"], "fentry", "{probe:#}");
    let pid = run.summary["target"]["pid"].clone();
    let o = run.summary["oom"].as_array().unwrap().iter().find(|o| o["victim_pid"] == pid).cloned().expect("the kill");
    assert_eq!(o["constraint"], "memcg", "{o:#}");
    assert!(o["cgroup"].as_str().unwrap().ends_with(&format!("/{name}")), "{o:#}");
    let want = if probe["program_type"] == "kprobe" { "kernel" } else { "derived" };
    assert_eq!(o["constraint_source"], want, "{probe:#}\n{o:#}");
}

#[test]
fn no_oom_in_the_target_is_an_empty_section() {
    privileged!();
    let run = record(&[], &["true"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // Present even when empty; OOMs are reported system-wide, so a kill elsewhere
    // (the other test of this file runs beside it) may show, never as the target's.
    let ooms = run.summary["oom"].as_array().expect("traced: the oom section is present");
    assert!(ooms.iter().all(|o| o["in_target"] == false), "{ooms:#?}");
    let run = record(&["--events", "faults"], &["true"]);
    assert!(run.summary.get("oom").is_none(), "not traced: absent");
}

/// What grew: a C program keeps a 16 MiB table, then grows until its
/// cgroup's OOM killer takes it. The kill records its resident memory by
/// call site: the table's site holds 16 MiB, the growing one what the
/// program itself counted it had touched, and the sites add up to what the
/// kernel reported the victim held at the kill.
#[test]
fn memcg_oom_records_what_grew_by_call_site() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c("oom_grow.c", dir.path());
    let name = format!("vmtrace-oomgrow-{}", std::process::id());
    let cg = vmtrace::demo::cgroup::ScratchCgroup::new(&name, 64 << 20).expect("a memory cgroup (v1 or v2)");
    let argv = cg.run_inside(&[bin.to_str().unwrap(), dir.path().to_str().unwrap()]);
    let run = record(&["--stack-sample", "4"], &strs(&argv));
    assert_eq!(run.code(), Some(137), "{}", run.stderr());
    let pid = run.summary["target"]["pid"].clone();
    let o = run.summary["oom"].as_array().unwrap().iter().find(|o| o["victim_pid"] == pid).cloned().expect("the kill");
    let sites = o["resident_sites"].as_array().unwrap_or_else(|| panic!("no resident_sites: {o:#}"));
    let held = (u(&o["anon_rss_kb"]) + u(&o["file_rss_kb"]) + u(&o["shmem_rss_kb"])) * 1024;
    let under = |f: &str| -> u64 {
        sites.iter().filter(|s| s["frames"].as_array().unwrap().iter().any(|x| x == f)).map(|s| u(&s["bytes"])).sum()
    };
    let all: u64 = sites.iter().map(|s| u(&s["bytes"])).sum();
    assert!(all <= held + 4096, "the sites ({all}) within what the kill reported ({held}): {o:#}");
    assert_close("the sites listed, against the kill's anon + file + shmem", all, held, 10.0);
    let mib = 1u64 << 20;
    let grown: u64 = fs::read_to_string(dir.path().join("grown.txt")).unwrap().trim().parse().unwrap();
    assert!(grown >= 16, "it grew {grown} MiB before the kill");
    assert_close("grow_forever at the kill", under("grow_forever"), grown * mib, 10.0);
    assert_close("load_table at the kill", under("load_table"), 16 * mib, 10.0);
    assert_eq!(u(&sites[0]["bytes"]), sites.iter().map(|s| u(&s["bytes"])).max().unwrap(), "largest first");
    let txt = fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    // The OOM section's line (the findings, first, name the kill too).
    let line = txt
        .lines()
        .find(|l| l.contains("killed oom_grow") && l.contains("what grew"))
        .unwrap_or_else(|| panic!("{txt}"));
    assert!(line.contains("grow_forever"), "{line}");
    // The finding names what grew, with the bytes the kill recorded for it.
    let f = run.summary["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "oom_kill" && f["pid"] == pid)
        .unwrap_or_else(|| panic!("no oom_kill finding: {:#}", run.summary["findings"]));
    assert!(f["site"].as_str().unwrap_or("").contains("grow_forever"), "{f:#}");
    assert_eq!(u(&f["evidence"]["grew_bytes"]), u(&sites[0]["bytes"]), "{f:#}");
    assert_close("what grew, in the finding", u(&f["evidence"]["grew_bytes"]), grown * mib, 10.0);
    assert!(f["fix"].as_str().unwrap().contains("grow_forever"), "{f:#}");
}
