//! One OOM kill as summary.json records it (`oom[]`), and its paragraph in
//! summary.txt (also the demo's note).
use serde::{Deserialize, Serialize};

use super::{fmt_ns, RegionKind};

/// One region the victim held, from `/proc/PID/smaps` read at the kill.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeldRegion {
    pub start: String,
    pub end: String,
    pub kind: RegionKind,
    pub path: Option<String>,
    pub rss_kb: u64,
}

/// One OOM kill in summary.json (`oom[]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OomRecord {
    pub victim_pid: u32,
    pub victim_comm: String,
    pub trigger_pid: u32,
    pub trigger_comm: String,
    /// "memcg", "global", "cpuset" or "mempolicy".
    pub constraint: String,
    /// "kernel" (read at `oom_kill_process()`) or "derived" (from the
    /// cgroup's limit, OOM counter and peak, where that cannot be probed).
    #[serde(default)]
    pub constraint_source: String,
    /// Where the victim's cgroup came from: "kernel" (read at the kill) or
    /// "proc" (`/proc/PID/cgroup`, racing the victim's exit); null: unknown.
    #[serde(default)]
    pub victim_cgroup_source: Option<String>,
    /// The memory cgroup that ran out (memcg), else the victim's own.
    pub cgroup: Option<String>,
    pub cgroup_limit_bytes: Option<u64>,
    pub cgroup_peak_bytes: Option<u64>,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    pub pgtables_kb: u64,
    pub oom_score_adj: i32,
    pub uid: u32,
    /// The fields above that this kernel's `oom:mark_victim` record lacks
    /// (before 6.8 it has the pid alone), by name: 0 there means unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    pub in_target: bool,
    /// Seconds since the trace started.
    pub time_s: f64,
    /// The victim's largest regions at the kill (null when it was already reaped).
    pub top_regions: Option<Vec<HeldRegion>>,
    /// The victim's fault rate over the seconds before the kill (traced victims).
    pub fault_rate_per_s: Option<f64>,
    /// Its faults and reclaim stalls over the whole trace (traced victims).
    pub victim_faults: Option<u64>,
    pub victim_reclaim_stalls: Option<u64>,
    pub victim_reclaim_ns: Option<u64>,
    /// What grew: the victim's resident memory by call site just before the
    /// kill (`--events resident` with stacks), largest first. Estimated from
    /// its sampled pages, scaled to the kernel's anon + file + shmem at the
    /// kill (`anon_rss_kb` + `file_rss_kb` + `shmem_rss_kb`; where those are
    /// `unknown`, each sampled page stands for the sample period's pages);
    /// null when the victim was not traced or no page of it was sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resident_sites: Option<Vec<super::ResidentSite>>,
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// A call site's innermost frames (at most three, short C++ names, each
/// cut at 100 characters), outermost first; led by its code location (the
/// Python line, else the program's own frame: `locations::location`) when
/// that is further out: `work (temps.py:5) … array_dealloc ← free ← [munmap]`.
pub fn site_tail(frames: &[String]) -> String {
    let n = frames.len().saturating_sub(3);
    let tail: Vec<String> = frames[n..].iter().map(|f| super::clip(&super::short_name(f), 100)).collect();
    match super::locations::location(frames) {
        Some(loc) if !tail.contains(&loc) && !frames[n..].contains(&loc) => format!("{loc} … {}", tail.join(" ← ")),
        _ => tail.join(" ← "),
    }
}

impl OomRecord {
    /// Whether `field` (as named in the record) was read from the kernel.
    pub fn known(&self, field: &str) -> bool {
        !self.unknown.iter().any(|u| u == field)
    }

    /// Whether the victim's resident sizes were read.
    pub fn sizes_known(&self) -> bool {
        ["anon_rss_kb", "file_rss_kb", "shmem_rss_kb"].iter().all(|f| self.known(f))
    }
}

/// One paragraph per kill for summary.txt.
pub fn render(r: &OomRecord) -> String {
    use std::fmt::Write as _;
    let known = |f: &str, v: String| if r.known(f) { v } else { "unknown".into() };
    let mut s = format!(
        "OOM at {:.2} s: killed {} (pid {}{}), anon {}, file {}, shmem {}, page tables {}, oom_score_adj {}",
        r.time_s,
        r.victim_comm,
        r.victim_pid,
        if r.in_target { "" } else { ", not traced" },
        known("anon_rss_kb", mib(r.anon_rss_kb)),
        known("file_rss_kb", mib(r.file_rss_kb)),
        known("shmem_rss_kb", mib(r.shmem_rss_kb)),
        known("pgtables_kb", mib(r.pgtables_kb)),
        known("oom_score_adj", r.oom_score_adj.to_string())
    );
    if !r.sizes_known() {
        s.push_str(" (this kernel's oom:mark_victim record has no sizes: unknown, not zero)");
    }
    let _ = match (r.constraint.as_str(), &r.cgroup) {
        ("memcg", Some(cg)) => write!(
            s,
            "; memory cgroup {cg} ran out (limit {}, peak {})",
            r.cgroup_limit_bytes.map_or("?".into(), |b| mib(b / 1024)),
            r.cgroup_peak_bytes.map_or("?".into(), |b| mib(b / 1024))
        ),
        (c, Some(cg)) => write!(s, "; {c} OOM, victim in cgroup {cg}"),
        (c, None) => write!(s, "; {c} OOM"),
    };
    let _ = write!(s, "; triggered by {} (pid {})", r.trigger_comm, r.trigger_pid);
    if let Some(rate) = r.fault_rate_per_s {
        let _ = write!(s, "; it was faulting {rate:.0}/s just before");
    }
    if let (Some(n), Some(ns)) = (r.victim_reclaim_stalls, r.victim_reclaim_ns) {
        if n > 0 {
            let _ = write!(s, "; {n} reclaim stalls, {}", fmt_ns(ns));
        }
    }
    match &r.top_regions {
        Some(top) => {
            let list: Vec<String> = top
                .iter()
                .take(3)
                .map(|h| format!("{} {:?} {}", h.path.as_deref().unwrap_or("[anon]"), h.kind, mib(h.rss_kb)))
                .collect();
            let _ = write!(s, "; it held: {}", list.join(", "));
        }
        None => s.push_str("; its regions were already reaped"),
    }
    if let Some(sites) = r.resident_sites.as_ref().filter(|v| !v.is_empty()) {
        let list: Vec<String> = sites
            .iter()
            .take(3)
            .map(|site| format!("{} {}", mib(site.bytes / 1024), site_tail(&site.frames)))
            .collect();
        let _ = write!(s, "; what grew (resident by call site at the kill, estimated): {}", list.join(", "));
    }
    s.push('.');
    s
}

#[cfg(test)]
mod site_tests {
    use super::site_tail;

    fn v(frames: &[&str]) -> Vec<String> {
        frames.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_site_is_led_by_its_code_location_when_that_is_further_out() {
        let numpy = v(&["main", "work (temps.py:5)", "array_dealloc", "__libc_free", "[munmap]"]);
        assert_eq!(site_tail(&numpy), "work (temps.py:5) … array_dealloc ← __libc_free ← [munmap]");
        let own = v(&["main", "churn_loop", "unmap_one", "[munmap]"]);
        assert_eq!(site_tail(&own), "churn_loop ← unmap_one ← [munmap]");
        let c = v(&["main", "fill_round", "malloc", "_int_malloc", "sysmalloc"]);
        assert_eq!(site_tail(&c), "fill_round … malloc ← _int_malloc ← sysmalloc");
        let runtime = v(&["_start", "__libc_start_main", "[brk]"]);
        assert_eq!(site_tail(&runtime), "_start ← __libc_start_main ← [brk]");
    }
}
