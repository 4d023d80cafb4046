//! OOM kills: who died, who triggered it, in which memory cgroup, under which
//! constraint, and what the victim held.
//!
//! Without kprobes the OOM constraint is not visible directly; it is derived
//! from the victim's memory cgroup: the nearest cgroup (leaf upwards) with a
//! finite limit, whose OOM counter is non-zero and whose peak usage reached
//! the limit, was the one out of memory (memcg); with none, the OOM was global.
use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use vmtrace_common::{OomEvent, TpOffsets};

use crate::model::{HeldRegion, OomRecord};
use crate::{model::comm_str, procmaps};

/// The memory-cgroup hierarchy a path belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

pub(crate) const V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// Where the v2 hierarchy with the memory controller is mounted, if any.
pub(crate) fn v2_memory_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().filter(|l| l.contains(" - cgroup2 ")).filter_map(|l| l.split(' ').nth(4).map(PathBuf::from)).find(
        |root| {
            fs::read_to_string(root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
        },
    )
}

/// The memory cgroup of `pid` (path relative to its hierarchy's root).
/// Read for every process started: the mount table is looked at only when
/// there is no v1 memory line, at most once a second.
pub(crate) fn memory_cgroup_of(pid: u32) -> Option<(CgroupVersion, String)> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    memory_cgroup_in(&text)
}

/// The memory cgroup named by a `/proc/PID/cgroup` text already read.
pub(crate) fn memory_cgroup_in(text: &str) -> Option<(CgroupVersion, String)> {
    memory_line(text, v2_has_memory_lately)
}

/// [`v2_memory_root`]'s answer, read again once it is a second old.
fn v2_has_memory_lately() -> bool {
    use std::{sync::Mutex, time::Instant};
    static LAST: Mutex<Option<(Instant, bool)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match *last {
        Some((at, has)) if at.elapsed() < std::time::Duration::from_secs(1) => has,
        _ => {
            let has = v2_memory_root().is_some();
            *last = Some((Instant::now(), has));
            has
        }
    }
}

/// Picks the memory cgroup from `/proc/PID/cgroup`: the v1 `memory` line, else
/// the v2 line when v2 carries the memory controller.
pub(crate) fn parse_proc_cgroup(text: &str, v2_has_memory: bool) -> Option<(CgroupVersion, String)> {
    memory_line(text, || v2_has_memory)
}

fn memory_line(text: &str, v2_has_memory: impl FnOnce() -> bool) -> Option<(CgroupVersion, String)> {
    for line in text.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        if ctrls.split(',').any(|c| c == "memory") {
            return Some((CgroupVersion::V1, path.to_string()));
        }
    }
    if v2_has_memory() {
        return text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| (CgroupVersion::V2, p.to_string()));
    }
    None
}

/// The path (relative to `root`) of the cgroup directory whose inode number is
/// `id` — the kernfs id the kernel hook read. Cgroup trees are small.
pub(crate) fn cgroup_path_by_id(root: &Path, id: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    if id == 0 {
        return None;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            let rel = dir.strip_prefix(root).ok()?.to_string_lossy().into_owned();
            return Some(format!("/{rel}"));
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            stack.extend(
                rd.filter_map(Result::ok).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()),
            );
        }
    }
    None
}

/// The memory hierarchy in use: v1's memory controller, else v2 with memory.
pub(crate) fn memory_hierarchy() -> Option<(CgroupVersion, PathBuf)> {
    if Path::new(V1_MEMORY_ROOT).join("memory.limit_in_bytes").exists() {
        return Some((CgroupVersion::V1, PathBuf::from(V1_MEMORY_ROOT)));
    }
    v2_memory_root().map(|r| (CgroupVersion::V2, r))
}

/// Limit, peak usage and OOM count of one memory cgroup directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CgroupMemory {
    pub limit_bytes: Option<u64>,
    pub peak_bytes: Option<u64>,
    /// v2 `memory.events` "oom" (limit hit and an allocation about to fail);
    /// v1 `memory.oom_control` "oom_kill".
    pub oom_events: u64,
    pub oom_kills: u64,
}

fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn keyed(p: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(p).ok()?.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

pub(crate) fn read_cgroup_memory(dir: &Path, v: CgroupVersion) -> CgroupMemory {
    match v {
        CgroupVersion::V1 => {
            // An unlimited v1 cgroup reports a huge page-aligned number.
            let limit = read_u64(&dir.join("memory.limit_in_bytes")).filter(|&l| l < (1 << 62));
            let oom_kills = keyed(&dir.join("memory.oom_control"), "oom_kill ").unwrap_or(0);
            CgroupMemory {
                limit_bytes: limit,
                peak_bytes: read_u64(&dir.join("memory.max_usage_in_bytes")),
                oom_events: oom_kills,
                oom_kills,
            }
        }
        CgroupVersion::V2 => CgroupMemory {
            limit_bytes: read_u64(&dir.join("memory.max")),
            peak_bytes: read_u64(&dir.join("memory.peak")).or_else(|| read_u64(&dir.join("memory.current"))),
            oom_events: keyed(&dir.join("memory.events"), "oom ").unwrap_or(0),
            oom_kills: keyed(&dir.join("memory.events"), "oom_kill ").unwrap_or(0),
        },
    }
}

/// The cgroup, leaf first, that ran out of memory, with its counters.
pub(crate) fn find_oom_cgroup(root: &Path, path: &str, v: CgroupVersion) -> Option<(String, CgroupMemory)> {
    let mut p = path.trim_end_matches('/').to_string();
    loop {
        let m = read_cgroup_memory(&root.join(p.trim_start_matches('/')), v);
        if let Some(limit) = m.limit_bytes {
            // Within 1% or a page of the limit counts as reaching it.
            let reached = m.peak_bytes.is_some_and(|peak| peak + limit / 100 + 4096 >= limit);
            if m.oom_events > 0 && reached {
                return Some((if p.is_empty() { "/".into() } else { p }, m));
            }
        }
        match p.rfind('/') {
            Some(i) if !p.is_empty() => p.truncate(i),
            _ => return None,
        }
    }
}

/// The victim's largest regions by resident size, if its smaps is still readable.
pub(crate) fn top_regions(pid: u32, n: usize) -> Option<Vec<HeldRegion>> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut out = Vec::new();
    let mut current: Option<procmaps::Region> = None;
    for line in text.lines() {
        if let Some(r) = procmaps::parse(line).pop() {
            current = Some(r);
        } else if let (Some(rss), Some(r)) = (line.strip_prefix("Rss:"), current.as_ref()) {
            let kb: u64 = rss.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            out.push(HeldRegion {
                start: format!("{:#x}", r.start),
                end: format!("{:#x}", r.end),
                kind: r.kind,
                path: r.path.as_deref().map(String::from),
                rss_kb: kb,
            });
        }
    }
    out.sort_by_key(|r| std::cmp::Reverse(r.rss_kb));
    out.truncate(n);
    (!out.is_empty()).then_some(out)
}

/// Everything that can be learned about a kill when its event arrives: read
/// at once, since the victim is on its way out. `tp`: the offsets the
/// programs read the record at (`TP_OFFSETS`), naming the fields this
/// kernel's record lacks (`OomRecord::unknown`).
pub(crate) fn describe(
    ev: &OomEvent,
    victim_cgroup: Option<(CgroupVersion, String)>,
    in_target: bool,
    time_s: f64,
    tp: &TpOffsets,
) -> OomRecord {
    let mut r = describe_kill(ev, victim_cgroup, in_target, time_s);
    r.unknown = crate::kernel::tpformat::oom_unknown_in(tp).into_iter().map(String::from).collect();
    r
}

fn describe_kill(
    ev: &OomEvent,
    victim_cgroup: Option<(CgroupVersion, String)>,
    in_target: bool,
    time_s: f64,
) -> OomRecord {
    let top = top_regions(ev.victim_pid, 5);
    // The kernel's view at the kill first; /proc (racing the victim's exit) after.
    let hierarchy = memory_hierarchy();
    let from_kernel =
        hierarchy.as_ref().and_then(|(v, root)| cgroup_path_by_id(root, ev.victim_memcg_id).map(|p| (*v, p)));
    let source = match (&from_kernel, &victim_cgroup) {
        (Some(_), _) => Some("kernel".to_string()),
        (None, Some(_)) => Some("proc".to_string()),
        (None, None) => None,
    };
    let victim_cgroup = from_kernel.or(victim_cgroup);
    // The kernel's own answer, where oom_kill_process() could be probed.
    let kernel = kernel_constraint(ev.constraint);
    if let (Some(k), Some((v, root))) = (kernel, hierarchy) {
        let cgroup = if ev.oom_memcg_id != 0 { cgroup_path_by_id(&root, ev.oom_memcg_id) } else { None };
        if k != "memcg" || cgroup.is_some() {
            let m = cgroup.as_ref().map(|c| read_cgroup_memory(&root.join(c.trim_start_matches('/')), v));
            let cgroup = cgroup.or_else(|| victim_cgroup.as_ref().map(|(_, p)| p.clone()));
            let mut r = record(
                ev,
                k,
                cgroup,
                m.as_ref().and_then(|m| m.limit_bytes),
                m.and_then(|m| m.peak_bytes),
                in_target,
                time_s,
                top,
            );
            "kernel".clone_into(&mut r.constraint_source);
            r.victim_cgroup_source = source;
            return r;
        }
    }
    let (constraint, cgroup, limit, peak) = match &victim_cgroup {
        Some((v, path)) => {
            let root = match v {
                CgroupVersion::V1 => PathBuf::from(V1_MEMORY_ROOT),
                CgroupVersion::V2 => v2_memory_root().unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup")),
            };
            match find_oom_cgroup(&root, path, *v) {
                Some((cg, m)) => ("memcg", Some(cg), m.limit_bytes, m.peak_bytes),
                None => ("global", Some(path.clone()), None, None),
            }
        }
        None => ("global", None, None, None),
    };
    let mut r = record(ev, constraint, cgroup, limit, peak, in_target, time_s, top);
    r.victim_cgroup_source = source;
    r
}

/// A victim's comm neither the record (before 6.8) nor /proc gave.
pub(crate) const UNKNOWN_COMM: &str = "?";

/// `enum oom_constraint` + 1 as the OOM probe passes it.
fn kernel_constraint(v: u32) -> Option<&'static str> {
    match v {
        1 => Some("global"),
        2 => Some("cpuset"),
        3 => Some("mempolicy"),
        4 => Some("memcg"),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    ev: &OomEvent,
    constraint: &str,
    cgroup: Option<String>,
    limit: Option<u64>,
    peak: Option<u64>,
    in_target: bool,
    time_s: f64,
    top: Option<Vec<HeldRegion>>,
) -> OomRecord {
    OomRecord {
        victim_pid: ev.victim_pid,
        victim_comm: match comm_str(&ev.victim_comm) {
            // Not in this kernel's record: /proc, while the victim lasts.
            c if c.is_empty() => fs::read_to_string(format!("/proc/{}/comm", ev.victim_pid))
                .map_or_else(|_| UNKNOWN_COMM.into(), |c| c.trim_end().to_string()),
            c => c,
        },
        trigger_pid: ev.trigger_tgid,
        trigger_comm: comm_str(&ev.trigger_comm),
        constraint: constraint.into(),
        constraint_source: "derived".into(),
        victim_cgroup_source: None,
        cgroup,
        cgroup_limit_bytes: limit,
        cgroup_peak_bytes: peak,
        total_vm_kb: ev.total_vm_kb,
        anon_rss_kb: ev.anon_rss_kb,
        file_rss_kb: ev.file_rss_kb,
        shmem_rss_kb: ev.shmem_rss_kb,
        pgtables_kb: ev.pgtables_kb,
        oom_score_adj: ev.oom_score_adj,
        uid: ev.uid,
        unknown: Vec::new(),
        in_target,
        time_s,
        top_regions: top,
        fault_rate_per_s: None,
        victim_faults: None,
        victim_reclaim_stalls: None,
        victim_reclaim_ns: None,
        resident_sites: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_memory_cgroup_v1_then_v2() {
        let v1 = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        assert_eq!(parse_proc_cgroup(v1, false), Some((CgroupVersion::V1, "/process_api/abc".into())));
        let v2 = "0::/user.slice/train\n";
        assert_eq!(parse_proc_cgroup(v2, true), Some((CgroupVersion::V2, "/user.slice/train".into())));
        assert_eq!(parse_proc_cgroup(v2, false), None);
    }

    #[test]
    fn finds_the_cgroup_that_reached_its_limit() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("a/b");
        fs::create_dir_all(&leaf).unwrap();
        // Leaf unlimited; its parent limited at 64 MiB, peaked there, and OOMed.
        fs::write(leaf.join("memory.max"), "max\n").unwrap();
        fs::write(leaf.join("memory.events"), "oom 0\noom_kill 1\n").unwrap();
        let a = root.path().join("a");
        fs::write(a.join("memory.max"), "67108864\n").unwrap();
        fs::write(a.join("memory.peak"), "67108864\n").unwrap();
        fs::write(a.join("memory.events"), "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n").unwrap();
        let (cg, m) = find_oom_cgroup(root.path(), "/a/b", CgroupVersion::V2).unwrap();
        assert_eq!(cg, "/a");
        assert_eq!((m.limit_bytes, m.oom_events, m.oom_kills), (Some(64 << 20), 1, 1));
        // A limit never reached is not the culprit.
        fs::write(a.join("memory.peak"), "1048576\n").unwrap();
        assert_eq!(find_oom_cgroup(root.path(), "/a/b", CgroupVersion::V2), None);
    }

    #[test]
    fn cgroup_found_by_inode() {
        use std::os::unix::fs::MetadataExt as _;
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("x/y")).unwrap();
        let ino = fs::metadata(root.path().join("x/y")).unwrap().ino();
        assert_eq!(cgroup_path_by_id(root.path(), ino).as_deref(), Some("/x/y"));
        assert_eq!(cgroup_path_by_id(root.path(), 0), None);
    }

    #[test]
    fn v1_unlimited_is_no_limit() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        fs::write(d.path().join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        let m = read_cgroup_memory(d.path(), CgroupVersion::V1);
        assert_eq!((m.limit_bytes, m.oom_kills), (None, 3));
    }

    #[test]
    fn own_smaps_lists_resident_regions() {
        let v = vec![7u8; 8 << 20];
        std::hint::black_box(&v);
        let top = top_regions(std::process::id(), 3).unwrap();
        assert!(top[0].rss_kb >= 8 * 1024, "{top:?}");
    }
}
