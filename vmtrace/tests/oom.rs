//! OOM kills in a memory cgroup the test makes under its own (privileged).
mod common;

use std::{
    fs,
    path::{Path, PathBuf},
};

use common::*;

/// A child memory cgroup with a 64 MiB limit and no swap, removed on drop.
struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    fn new(name: &str) -> Self {
        let own = fs::read_to_string("/proc/self/cgroup").unwrap();
        let limit = (64u64 << 20).to_string();
        if let Some(v1) = own.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string())) {
            let dir = Path::new(vmtrace::oom::V1_MEMORY_ROOT).join(v1.trim_start_matches('/')).join(name);
            fs::create_dir_all(&dir).expect("create v1 memory cgroup");
            fs::write(dir.join("memory.limit_in_bytes"), &limit).unwrap();
            let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), &limit);
            return Self { dir };
        }
        let root = vmtrace::oom::v2_memory_root().expect(
            "no memory cgroup (v1 or v2) on this machine: the OOM test needs one to stay away from a global OOM",
        );
        // v2 forbids processes in inner cgroups, so the test cgroup hangs off the root.
        let dir = root.join(name);
        fs::create_dir_all(&dir).expect("create v2 memory cgroup");
        fs::write(dir.join("memory.max"), &limit).unwrap();
        let _ = fs::write(dir.join("memory.swap.max"), "0");
        Self { dir }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

#[test]
fn memcg_oom_names_victim_trigger_cgroup_and_what_it_held() {
    if !privileged("memcg_oom_names_victim_trigger_cgroup_and_what_it_held") {
        return;
    }
    let name = format!("vmtrace-oom-{}", std::process::id());
    let cg = MemCgroup::new(&name);
    let script =
        format!("echo $$ > {}/cgroup.procs && exec {BIN} workload touch --mib 256 --pace-ms 5", cg.dir.display());
    let run = record(&[], &["sh", "-c", &script]);
    assert_eq!(run.code(), Some(137), "the hog's SIGKILL comes through: {}", run.stderr());
    let pid = run.summary["target"]["pid"].as_u64().unwrap();
    let ooms = run.summary["oom"].as_array().expect("oom section");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!(o["victim_pid"], pid);
    assert_eq!(o["victim_comm"], "vmtrace");
    assert_eq!(o["trigger_pid"], pid, "a memcg OOM is triggered by the charging task itself");
    assert_eq!(o["constraint"], "memcg");
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

#[test]
fn no_oom_is_an_empty_list() {
    if !privileged("no_oom_is_an_empty_list") {
        return;
    }
    let run = record(&[], &["true"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.summary["oom"], serde_json::json!([]), "traced and saw nothing: present and empty");
    let run = record(&["--events", "faults"], &["true"]);
    assert!(run.summary.get("oom").is_none(), "not traced: absent");
}
