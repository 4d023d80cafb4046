//! NUMA placement (summary.json `numa`): which node the traced processes'
//! pages landed on, how many were placed on a node other than the faulting
//! CPU's (remote first touch), the memory policy per region, and the
//! kernel's `numa_*` counters over the recording. On a host with one node
//! there is nothing to place: `nodes` is 1 and `note` says so, with no
//! per-process rows (never zeros that would read as "all local").
use std::{collections::BTreeMap, fmt::Write as _};

use serde::{Deserialize, Serialize};

use super::bytes;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Numa {
    /// Online memory nodes (`/sys/devices/system/node/online`).
    pub nodes: u32,
    /// Set when placement was not analysed, saying why ("1 NUMA node: …").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Each node's CPUs, as the kernel lists them (`nodeN/cpulist`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_cpus: BTreeMap<String, String>,
    /// `/proc/vmstat` `numa_*` and `pgmigrate_*` counters: their rise over
    /// the recording (system-wide).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub vmstat_delta: BTreeMap<String, u64>,
    /// Per process, most pages first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<NumaProcess>,
    /// Per region (`/proc/PID/numa_maps`), most pages first; top 50.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<NumaRegion>,
    /// Per call site: the sampled pages its faults placed, by node, and how
    /// many were remote from the faulting CPU; most sampled pages first, top 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<NumaSite>,
}

/// The sampled pages one call site faulted in, by node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NumaSite {
    pub pid: u32,
    pub comm: String,
    /// Root first, like `resident.sites[].frames`.
    pub frames: Vec<String>,
    pub sampled_pages: u64,
    pub sampled_by_node: BTreeMap<String, u64>,
    /// Of those, on a node other than that of the CPU that faulted them in.
    pub remote_first_touch: u64,
}

/// One process's pages by node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NumaProcess {
    pub pid: u32,
    pub comm: String,
    /// Resident pages by node ("0", "1"…) as `/proc/PID/numa_maps` counted
    /// them at the last read (every second while it lived, and at the end).
    pub pages_by_node: BTreeMap<String, u64>,
    /// Seconds since the start of that read.
    pub numa_maps_at_s: f64,
    /// Pages of the resident sample (`--events resident`) whose node was
    /// read with `move_pages(2)` while the process lived.
    pub sampled_pages: u64,
    /// Of those, by node.
    pub sampled_by_node: BTreeMap<String, u64>,
    /// Of those, placed on a node other than that of the CPU that faulted them in.
    pub remote_first_touch: u64,
    /// Faults of the sample by the faulting CPU's node.
    pub faulting_cpu_node: BTreeMap<String, u64>,
    /// The node most of its pages are on, and that node's share of them.
    pub main_node: Option<u32>,
    pub main_node_share: f64,
    /// Memory policies of its regions ("default", "bind:1", "interleave:0-1"…) with their pages.
    pub policies: BTreeMap<String, u64>,
}

/// One region's pages by node.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NumaRegion {
    pub pid: u32,
    pub start: String,
    /// "default", "bind:1", "prefer:0", "interleave:0-1"…
    pub policy: String,
    /// "anon", "heap", "stack" or the file.
    pub what: String,
    pub pages_by_node: BTreeMap<String, u64>,
}

/// The text section (summary.txt).
#[must_use]
pub fn render_text(n: &Numa) -> String {
    let mut s = String::new();
    if let Some(note) = &n.note {
        let _ = writeln!(s, "NUMA: {note}");
        return s;
    }
    let _ = writeln!(s, "NUMA placement ({} nodes):", n.nodes);
    for p in &n.processes {
        let nodes: Vec<String> = p.pages_by_node.iter().map(|(k, v)| format!("node {k} {}", bytes(v * 4096))).collect();
        let remote = if p.sampled_pages > 0 {
            format!(
                "; sampled {} pages, {} remote first touches ({:.0}%)",
                p.sampled_pages,
                p.remote_first_touch,
                100.0 * p.remote_first_touch as f64 / p.sampled_pages as f64
            )
        } else {
            String::new()
        };
        let pol: Vec<&str> = p.policies.keys().map(String::as_str).collect();
        let _ = writeln!(s, "  {} (pid {}): {}{remote}; policy {}", p.comm, p.pid, nodes.join(", "), pol.join(", "));
    }
    if !n.sites.is_empty() {
        let _ = writeln!(s, "  by call site (sampled pages):");
        for t in n.sites.iter().take(5) {
            let nodes: Vec<String> = t.sampled_by_node.iter().map(|(k, v)| format!("node {k} {v}")).collect();
            let _ = writeln!(
                s,
                "    {} (pid {}): {}, {} remote — {}",
                t.comm,
                t.pid,
                nodes.join(", "),
                t.remote_first_touch,
                super::oom::site_tail(&t.frames)
            );
        }
    }
    if !n.vmstat_delta.is_empty() {
        let v: Vec<String> = n.vmstat_delta.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} +{v}")).collect();
        let _ = writeln!(
            s,
            "  /proc/vmstat over the recording: {}",
            if v.is_empty() { "no change".into() } else { v.join(", ") }
        );
    }
    s
}
