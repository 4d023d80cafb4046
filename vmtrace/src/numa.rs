//! NUMA placement, read from the kernel's own accounting: the node topology
//! (`/sys/devices/system/node`), each traced process's pages by node and its
//! memory policies (`/proc/PID/numa_maps`), the node of sampled pages
//! (`move_pages(2)` with `nodes` NULL, which only reports), and the
//! `/proc/vmstat` `numa_*` counters over the recording. A host with one
//! node is said to have one node; nothing else is read there.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use vmtrace_common::PageSample;

use crate::model::{
    trace::{NodePoint, TraceLog},
    Numa, NumaProcess, NumaRegion, NumaSite,
};

const NODE_DIR: &str = "/sys/devices/system/node";
/// How often the numa_maps of live traced processes are re-read.
const MAPS_EVERY: Duration = Duration::from_secs(1);
/// A locking call's numa_maps read is put off to the next tick when the
/// process's were read less than this ago (a loop of mlock calls).
const LOCKED_READ_EVERY: Duration = Duration::from_millis(100);
/// Processes whose numa_maps are read per round (the largest by pages are kept).
const MAX_PROCESSES: usize = 64;
/// Regions listed in summary.json.
const MAX_REGIONS: usize = 50;
/// Distinct stacks kept per process; call sites listed in summary.json.
const MAX_STACKS: usize = 4096;
const MAX_SITES: usize = 20;

/// Parses a kernel CPU or node list ("0-3,8,10-11").
#[must_use]
pub fn parse_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// The host's memory nodes and which node each CPU belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<u32>,
    /// CPU → node.
    pub cpu_node: HashMap<u32, u32>,
    /// Node → its cpulist as the kernel wrote it.
    pub node_cpus: BTreeMap<u32, String>,
}

impl Topology {
    /// Read from sysfs; a kernel without NUMA (no node directory) is one node.
    #[must_use]
    pub fn read() -> Self {
        let nodes = std::fs::read_to_string(format!("{NODE_DIR}/online")).map_or_else(|_| vec![0], |s| parse_list(&s));
        let mut t = Self { nodes, ..Self::default() };
        for &n in &t.nodes {
            let Ok(list) = std::fs::read_to_string(format!("{NODE_DIR}/node{n}/cpulist")) else { continue };
            for cpu in parse_list(&list) {
                t.cpu_node.insert(cpu, n);
            }
            t.node_cpus.insert(n, list.trim().to_string());
        }
        t
    }

    #[must_use]
    pub fn single_node(&self) -> bool {
        self.nodes.len() <= 1
    }
}

/// What summary.json says on a host with one node.
#[must_use]
pub fn one_node_note(nodes: usize) -> String {
    format!(
        "{nodes} NUMA node: every page is on node 0 and every access is local; \
         placement (pages by node, remote first touches, migrations) is not analysed"
    )
}

/// `/proc/vmstat` counters of NUMA placement and migration.
#[must_use]
pub fn vmstat_numa() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    parse_vmstat_numa(&text)
}

#[must_use]
pub fn parse_vmstat_numa(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| k.starts_with("numa_") || k.starts_with("pgmigrate_") || *k == "pgpromote_success")
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// One line of `/proc/PID/numa_maps`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaMapsLine {
    pub start: u64,
    pub policy: String,
    /// "anon", "heap", "stack" or the file.
    pub what: String,
    /// Pages by node (`N<node>=<pages>`), in the line's page size converted to 4 KiB pages.
    pub by_node: BTreeMap<u32, u64>,
}

/// Parses `/proc/PID/numa_maps` (fs/proc/task_mmu.c `show_numa_map`).
#[must_use]
pub fn parse_numa_maps(text: &str) -> Vec<NumaMapsLine> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(start), Some(policy)) = (words.next(), words.next()) else { continue };
        let Ok(start) = u64::from_str_radix(start, 16) else { continue };
        let mut l = NumaMapsLine { start, policy: policy.to_string(), what: "anon".into(), ..Default::default() };
        let mut page_kb = 4u64;
        let mut raw: Vec<(u32, u64)> = Vec::new();
        for w in words {
            if let Some(f) = w.strip_prefix("file=") {
                l.what = f.to_string();
            } else if w == "heap" || w == "stack" || w == "huge" {
                l.what = w.to_string();
            } else if let Some(k) = w.strip_prefix("kernelpagesize_kB=") {
                page_kb = k.parse().unwrap_or(4);
            } else if let Some(rest) = w.strip_prefix('N') {
                if let Some((n, p)) = rest.split_once('=') {
                    if let (Ok(n), Ok(p)) = (n.parse::<u32>(), p.parse::<u64>()) {
                        raw.push((n, p));
                    }
                }
            }
        }
        for (n, p) in raw {
            *l.by_node.entry(n).or_default() += p * (page_kb / 4).max(1);
        }
        out.push(l);
    }
    out
}

/// A whole numa_maps' pages by node (4 KiB pages), each of `nodes` present
/// (0 where there are none), so a node a process left shows it left.
#[must_use]
pub fn pages_by_node(lines: &[NumaMapsLine], nodes: &[u32]) -> BTreeMap<u32, u64> {
    let mut by: BTreeMap<u32, u64> = nodes.iter().map(|n| (*n, 0)).collect();
    for l in lines {
        for (n, c) in &l.by_node {
            *by.entry(*n).or_default() += c;
        }
    }
    by
}

/// The node of each page of `pid` at `addrs`, by `move_pages(2)` with
/// `nodes` NULL (a query: nothing moves); `None` for a page not present.
#[must_use]
pub fn nodes_of_pages(pid: u32, addrs: &[u64]) -> Option<Vec<Option<u32>>> {
    if addrs.is_empty() {
        return Some(Vec::new());
    }
    let pages: Vec<*mut libc::c_void> = addrs.iter().map(|a| *a as *mut libc::c_void).collect();
    let mut status = vec![0i32; addrs.len()];
    // SAFETY: `pages` and `status` hold `addrs.len()` elements each; nodes
    // NULL makes the call report each page's node in `status` only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            libc::c_long::from(pid as i32),
            addrs.len() as libc::c_ulong,
            pages.as_ptr(),
            std::ptr::null::<i32>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if r < 0 {
        return None;
    }
    Some(status.into_iter().map(|s| u32::try_from(s).ok()).collect())
}

#[derive(Default)]
struct ProcNuma {
    lines: Vec<NumaMapsLine>,
    read_at: Option<Instant>,
    sampled: u64,
    sampled_by_node: BTreeMap<u32, u64>,
    remote: u64,
    cpu_node: BTreeMap<u32, u64>,
    /// By user stack id: sampled pages by node, and the remote ones.
    stacks: HashMap<i32, StackNodes>,
    /// Nodes (bit N; 63 and above share a bit) its trace points had pages on.
    nodes_seen: u64,
}

/// One stack's sampled pages by node, and how many of them were remote.
type StackNodes = (BTreeMap<u32, u64>, u64);

/// Collects placement during a recording on a host with two nodes or more.
pub struct NumaTracker {
    topo: Topology,
    vmstat_start: BTreeMap<String, u64>,
    /// Sampled faults not yet looked up: (tgid, page address, cpu, user stack).
    pending: Vec<(u32, u64, u32, i32)>,
    procs: HashMap<u32, ProcNuma>,
    last_maps: Option<Instant>,
    /// Processes whose numa_maps are read at the next tick (`locked`).
    stale: std::collections::BTreeSet<u32>,
    /// Each read's pages by node, for the Perfetto trace (`log_points`).
    points: Option<Vec<NodePoint>>,
    points_dropped: u64,
}

impl NumaTracker {
    /// `None` on a one-node host (nothing to track; see [`one_node_note`]).
    #[must_use]
    pub fn new(topo: Topology) -> Option<Self> {
        if topo.single_node() {
            return None;
        }
        Some(Self {
            topo,
            vmstat_start: vmstat_numa(),
            pending: Vec::new(),
            procs: HashMap::default(),
            last_maps: None,
            stale: std::collections::BTreeSet::new(),
            points: None,
            points_dropped: 0,
        })
    }

    /// Keeps a point per node at each numa_maps read (the trace log is on).
    pub fn log_points(&mut self) {
        self.points.get_or_insert_with(Vec::new);
    }

    /// The points kept so far, and how many the bound left out.
    pub fn take_points(&mut self) -> (Vec<NodePoint>, u64) {
        let points = self.points.as_mut().map(std::mem::take).unwrap_or_default();
        (points, std::mem::take(&mut self.points_dropped))
    }

    /// The user stack ids of the sampled pages (pending or counted): they
    /// are named at the end, so their ids must not be let go before.
    #[must_use]
    pub fn stack_ids(&self) -> Vec<u32> {
        let counted = self.procs.values().flat_map(|p| p.stacks.keys().copied());
        let pending = self.pending.iter().map(|(_, _, _, s)| *s);
        counted.chain(pending).filter_map(|s| u32::try_from(s).ok()).collect()
    }

    /// A fault on a page of the resident sample.
    pub fn page(&mut self, ev: &PageSample) {
        if self.pending.len() < 1 << 16 {
            self.pending.push((ev.tgid, ev.addr, ev.cpu, ev.user_stack));
        }
    }

    /// Looks up the pending pages' nodes (while their processes live), and
    /// every second re-reads the numa_maps of `live`.
    pub fn tick(&mut self, now: Instant, live: &[u32]) {
        self.resolve_pending();
        for pid in std::mem::take(&mut self.stale) {
            self.read_maps(pid, now);
        }
        if self.last_maps.is_some_and(|t| now.saturating_duration_since(t) < MAPS_EVERY) {
            return;
        }
        self.last_maps = Some(now);
        for &pid in live.iter().take(MAX_PROCESSES) {
            self.read_maps(pid, now);
        }
    }

    /// Locking calls of `pid` returned (mlock and MAP_LOCKED make the pages
    /// resident; called once per drain of the events, after all of them):
    /// its numa_maps are read now, or at the next tick if read less than
    /// `LOCKED_READ_EVERY` ago. Read only every second, a
    /// process that locked a buffer and exited within the second kept the
    /// placement it had before (the pinned test under `vmtest` on 6.1: 635
    /// of the 4,352 locked pages counted).
    pub fn locked(&mut self, pid: u32, now: Instant) {
        let read_at = self.procs.get(&pid).and_then(|p| p.read_at);
        if read_at.is_some_and(|t| now.saturating_duration_since(t) < LOCKED_READ_EVERY) {
            self.stale.insert(pid);
        } else {
            self.read_maps(pid, now);
        }
    }

    /// Reads `pid`'s numa_maps now (a process about to be gone, or the end).
    pub fn read_maps(&mut self, pid: u32, now: Instant) {
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")) {
            let lines = parse_numa_maps(&text);
            if let (Some(points), false) = (self.points.as_mut(), lines.is_empty()) {
                let ts_ns = crate::kernel::monotonic_ns();
                // A node's 0 only where the process had pages before (it
                // left): zeros on every node of a large host would take
                // the points' bound.
                let seen = &mut self.procs.entry(pid).or_default().nodes_seen;
                for (node, pages) in pages_by_node(&lines, &self.topo.nodes) {
                    let bit = 1u64 << node.min(63);
                    if pages == 0 && *seen & bit == 0 {
                        continue;
                    }
                    *seen |= bit;
                    let point = NodePoint { ts_ns, pid, node, pages };
                    TraceLog::push(points, &mut self.points_dropped, point, TraceLog::MAX_PER_KIND);
                }
            }
            let pages = |lines: &[NumaMapsLine]| lines.iter().flat_map(|l| l.by_node.values()).sum::<u64>();
            let p = self.procs.entry(pid).or_default();
            // A read while the process exits (its pages already freed, a
            // locking call's event drained late) does not replace one that
            // saw its pages.
            if !lines.is_empty() && (pages(&lines) > 0 || pages(&p.lines) == 0) {
                p.lines = lines;
                p.read_at = Some(now);
            }
        }
    }

    fn resolve_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut by_pid: HashMap<u32, Vec<(u64, u32, i32)>> = HashMap::default();
        for (tgid, addr, cpu, stack) in self.pending.drain(..) {
            by_pid.entry(tgid).or_default().push((addr, cpu, stack));
        }
        for (pid, pages) in by_pid {
            let addrs: Vec<u64> = pages.iter().map(|(a, _, _)| *a).collect();
            let Some(nodes) = nodes_of_pages(pid, &addrs) else { continue };
            let p = self.procs.entry(pid).or_default();
            for ((_, cpu, stack), node) in pages.iter().zip(nodes) {
                let Some(node) = node else { continue };
                let cpu_node = self.topo.cpu_node.get(cpu).copied();
                let remote = cpu_node.is_some_and(|c| c != node);
                p.sampled += 1;
                *p.sampled_by_node.entry(node).or_default() += 1;
                if let Some(c) = cpu_node {
                    *p.cpu_node.entry(c).or_default() += 1;
                }
                p.remote += u64::from(remote);
                // Stacks past the bound count under "no stack" (id -1).
                let key = if p.stacks.len() < MAX_STACKS || p.stacks.contains_key(stack) { *stack } else { -1 };
                let s = p.stacks.entry(key).or_default();
                *s.0.entry(node).or_default() += 1;
                s.1 += u64::from(remote);
            }
        }
    }

    /// The model, `started` being the start of the recording.
    /// `frames(pid, user_stack)` names a sampled fault's call site, root first.
    pub fn finish(
        mut self,
        started: Instant,
        comm_of: &dyn Fn(u32) -> String,
        frames: &mut dyn FnMut(u32, i32) -> Vec<String>,
    ) -> Numa {
        self.resolve_pending();
        let end = vmstat_numa();
        let vmstat_delta =
            end.iter().map(|(k, v)| (k.clone(), v.saturating_sub(*self.vmstat_start.get(k).unwrap_or(v)))).collect();
        let key = |n: &u32| n.to_string();
        let mut processes = Vec::new();
        let mut regions = Vec::new();
        for (pid, p) in &self.procs {
            let mut by_node: BTreeMap<u32, u64> = BTreeMap::new();
            let mut policies: BTreeMap<String, u64> = BTreeMap::new();
            for l in &p.lines {
                let pages: u64 = l.by_node.values().sum();
                for (n, c) in &l.by_node {
                    *by_node.entry(*n).or_default() += c;
                }
                *policies.entry(l.policy.clone()).or_default() += pages;
                if pages > 0 {
                    regions.push(NumaRegion {
                        pid: *pid,
                        start: format!("{:#x}", l.start),
                        policy: l.policy.clone(),
                        what: l.what.clone(),
                        pages_by_node: l.by_node.iter().map(|(n, c)| (key(n), *c)).collect(),
                    });
                }
            }
            let total: u64 = by_node.values().sum();
            if total == 0 && p.sampled == 0 {
                continue;
            }
            let main = by_node.iter().max_by_key(|(_, c)| **c).map(|(n, c)| (*n, *c));
            processes.push(NumaProcess {
                pid: *pid,
                comm: comm_of(*pid),
                pages_by_node: by_node.iter().map(|(n, c)| (key(n), *c)).collect(),
                numa_maps_at_s: p.read_at.map_or(0.0, |t| t.saturating_duration_since(started).as_secs_f64()),
                sampled_pages: p.sampled,
                sampled_by_node: p.sampled_by_node.iter().map(|(n, c)| (key(n), *c)).collect(),
                remote_first_touch: p.remote,
                faulting_cpu_node: p.cpu_node.iter().map(|(n, c)| (key(n), *c)).collect(),
                main_node: main.map(|(n, _)| n),
                main_node_share: main.map_or(0.0, |(_, c)| if total == 0 { 0.0 } else { c as f64 / total as f64 }),
                policies,
            });
        }
        let pages = |p: &NumaProcess| p.pages_by_node.values().sum::<u64>();
        processes.sort_by(|a, b| pages(b).cmp(&pages(a)).then(a.pid.cmp(&b.pid)));
        let rpages = |r: &NumaRegion| r.pages_by_node.values().sum::<u64>();
        regions.sort_by(|a, b| rpages(b).cmp(&rpages(a)).then(a.pid.cmp(&b.pid)));
        regions.truncate(MAX_REGIONS);
        let sites = self.sites(comm_of, frames);
        Numa {
            nodes: self.topo.nodes.len() as u32,
            note: None,
            node_cpus: self.topo.node_cpus.iter().map(|(n, c)| (key(n), c.clone())).collect(),
            vmstat_delta,
            processes,
            regions,
            sites,
        }
    }

    /// The call sites with the most sampled pages: the heaviest stacks named
    /// (only those: a name costs a symbolization), merged where two stacks
    /// name the same frames.
    fn sites(&self, comm_of: &dyn Fn(u32) -> String, frames: &mut dyn FnMut(u32, i32) -> Vec<String>) -> Vec<NumaSite> {
        let mut all: Vec<(u32, i32, &StackNodes)> =
            self.procs.iter().flat_map(|(pid, p)| p.stacks.iter().map(|(id, s)| (*pid, *id, s))).collect();
        let n = |s: &StackNodes| s.0.values().sum::<u64>();
        all.sort_by(|a, b| n(b.2).cmp(&n(a.2)).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
        let mut merged: Vec<NumaSite> = Vec::new();
        for (pid, id, (by_node, remote)) in all.into_iter().take(4 * MAX_SITES) {
            let f = if id < 0 { vec!["[no user stack]".to_string()] } else { frames(pid, id) };
            let at = merged.iter().position(|s| s.pid == pid && s.frames == f).unwrap_or_else(|| {
                merged.push(NumaSite { pid, comm: comm_of(pid), frames: f, ..NumaSite::default() });
                merged.len() - 1
            });
            let site = &mut merged[at];
            for (node, c) in by_node {
                *site.sampled_by_node.entry(node.to_string()).or_default() += c;
                site.sampled_pages += c;
            }
            site.remote_first_touch += remote;
        }
        merged.sort_by(|a, b| b.sampled_pages.cmp(&a.sampled_pages).then(a.pid.cmp(&b.pid)));
        merged.truncate(MAX_SITES);
        merged
    }
}

/// summary.json's `numa` for a host with one node.
#[must_use]
pub fn one_node(topo: &Topology) -> Numa {
    Numa {
        nodes: topo.nodes.len().max(1) as u32,
        note: Some(one_node_note(topo.nodes.len().max(1))),
        node_cpus: topo.node_cpus.iter().map(|(n, c)| (n.to_string(), c.clone())).collect(),
        ..Numa::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A locking call reads the process's numa_maps at once; another within
    /// `LOCKED_READ_EVERY` waits for the next tick, which reads it whatever
    /// the once-a-second round says.
    #[test]
    fn a_locking_call_reads_numa_maps_soon() {
        let topo = Topology { nodes: vec![0, 1], ..Topology::default() };
        let mut t = NumaTracker::new(topo).expect("two nodes");
        let pid = std::process::id();
        let t0 = Instant::now();
        t.tick(t0, &[]);
        t.locked(pid, t0);
        assert_eq!(t.procs.get(&pid).and_then(|p| p.read_at), Some(t0), "read at the call");
        let t1 = t0 + Duration::from_millis(10);
        t.locked(pid, t1);
        assert_eq!(t.procs.get(&pid).and_then(|p| p.read_at), Some(t0), "a second call within 100 ms waits");
        let t2 = t0 + Duration::from_millis(20);
        t.tick(t2, &[]);
        assert_eq!(t.procs.get(&pid).and_then(|p| p.read_at), Some(t2), "read at the next tick");
        assert!(t.stale.is_empty());
    }

    /// With the trace log on, each numa_maps read is a point per node the
    /// process has pages on, and 0 on one it had pages on before.
    #[test]
    fn reads_are_points_per_node() {
        let topo = Topology { nodes: vec![0, 1], ..Topology::default() };
        let mut t = NumaTracker::new(topo).expect("two nodes");
        let pid = std::process::id();
        t.read_maps(pid, Instant::now());
        assert_eq!(t.take_points(), (Vec::new(), 0), "no points unless asked");
        t.log_points();
        t.read_maps(pid, Instant::now());
        t.read_maps(u32::MAX, Instant::now());
        let (points, dropped) = t.take_points();
        assert_eq!(dropped, 0);
        let nodes: Vec<(u32, u32)> = points.iter().map(|p| (p.pid, p.node)).collect();
        // This host's pages are all on node 0: no zero for node 1, which it never had.
        assert_eq!(nodes, [(pid, 0)], "one read of a live process, none of a missing one");
        let text = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).expect("numa_maps");
        let truth = pages_by_node(&parse_numa_maps(&text), &[]);
        assert!(points.iter().map(|p| p.pages).sum::<u64>() > 0, "this process has pages: {points:?}");
        for p in &points {
            let kernel = truth.get(&p.node).copied().unwrap_or(0);
            // A read a moment later: the test's own allocations move it a little.
            assert!(p.pages.abs_diff(kernel) * 10 <= kernel.max(10), "node {}: {} vs {kernel}", p.node, p.pages);
        }
        assert!(t.take_points().0.is_empty(), "taken");
    }

    /// Sampled pages are counted per call site: the heaviest stacks named,
    /// two stacks with the same frames one site, remote by the faulting
    /// CPU's node (here every page is on node 0, and CPU 1 is node 1's).
    #[test]
    fn sampled_pages_by_call_site() {
        let cpu_node = [(0, 0), (1, 1)].into_iter().collect();
        let topo = Topology { nodes: vec![0, 1], cpu_node, ..Topology::default() };
        let mut t = NumaTracker::new(topo).expect("two nodes");
        let buf = vec![1u8; 16 << 12];
        let page = |i: usize| (buf.as_ptr() as u64 + (i as u64) * 4096 + 4095) & !4095;
        let pid = std::process::id();
        let ev = |i: usize, cpu: u32, user_stack: i32| PageSample {
            hdr: vmtrace_common::EventHeader { kind: 0, size: 0, ts_ns: 0 },
            tgid: pid,
            flags: 0,
            addr: page(i),
            user_stack,
            kernel_stack: -1,
            cpu,
            _pad: 0,
        };
        for i in 0..6 {
            t.page(&ev(i, 1, 5));
        }
        for i in 6..9 {
            t.page(&ev(i, 0, 7));
        }
        t.page(&ev(9, 0, 9));
        let mut named = Vec::new();
        let mut frames = |_: u32, id: i32| {
            named.push(id);
            if id == 9 {
                vec!["main".to_string(), "other".to_string()]
            } else {
                vec!["main".to_string(), "fill".to_string()]
            }
        };
        let n = t.finish(Instant::now(), &|_| "me".into(), &mut frames);
        assert_eq!(n.sites.len(), 2, "{:?}", n.sites);
        let fill = &n.sites[0];
        assert_eq!((fill.pid, &fill.frames[..]), (pid, &["main".to_string(), "fill".to_string()][..]));
        assert_eq!((fill.sampled_pages, fill.remote_first_touch), (9, 6), "{fill:?}");
        assert_eq!(fill.sampled_by_node.get("0"), Some(&9));
        assert_eq!((n.sites[1].sampled_pages, n.sites[1].remote_first_touch), (1, 0));
        assert_eq!(named, [5, 7, 9], "each stack named once, heaviest first");
        drop(buf);
    }

    #[test]
    fn pages_by_node_sums_lines_and_names_every_node() {
        let l = parse_numa_maps(
            "7f0000000000 bind:1 anon=256 dirty=256 N1=256 kernelpagesize_kB=4\n\
             55e000000000 default heap anon=5 dirty=5 N0=5 N1=2 kernelpagesize_kB=4\n",
        );
        let by = pages_by_node(&l, &[0, 1, 2]);
        assert_eq!(by.into_iter().collect::<Vec<_>>(), [(0, 5), (1, 258), (2, 0)]);
        assert!(pages_by_node(&[], &[]).is_empty());
    }

    #[test]
    fn lists() {
        assert_eq!(parse_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_list("0"), vec![0]);
        assert!(parse_list("").is_empty());
    }

    #[test]
    fn numa_maps_lines() {
        let text = "\
7f0000000000 bind:1 anon=256 dirty=256 active=0 N1=256 kernelpagesize_kB=4
55d000000000 default file=/usr/bin/python3 mapped=10 N0=7 N1=3 kernelpagesize_kB=4
55e000000000 default heap anon=5 dirty=5 N0=5 kernelpagesize_kB=4
7ff000000000 interleave:0-1 anon=2 dirty=2 N0=1 N1=1 kernelpagesize_kB=2048
7ffd00000000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4
";
        let l = parse_numa_maps(text);
        assert_eq!(l.len(), 5);
        assert_eq!(l[0].policy, "bind:1");
        assert_eq!(l[0].by_node.get(&1), Some(&256));
        assert_eq!(l[1].what, "/usr/bin/python3");
        assert_eq!(l[1].by_node.get(&0), Some(&7));
        assert_eq!(l[2].what, "heap");
        // A 2 MiB page is 512 4 KiB pages.
        assert_eq!(l[3].by_node.get(&0), Some(&512));
        assert_eq!(l[4].what, "stack");
    }

    #[test]
    fn vmstat_counters() {
        let v = parse_vmstat_numa("nr_free_pages 10\nnuma_hit 5\nnuma_miss 2\npgmigrate_success 7\npgfault 9\n");
        assert_eq!(v.len(), 3);
        assert_eq!(v["numa_miss"], 2);
    }

    #[test]
    fn one_node_says_so() {
        let t = Topology { nodes: vec![0], ..Topology::default() };
        assert!(t.single_node());
        let n = one_node(&t);
        assert_eq!(n.nodes, 1);
        assert!(n.note.as_deref().is_some_and(|s| s.starts_with("1 NUMA node")));
        assert!(n.processes.is_empty());
    }

    #[test]
    fn own_pages_have_a_node() {
        let buf = vec![1u8; 4 * 4096];
        let page = (buf.as_ptr() as u64 + 4095) & !4095;
        let nodes = nodes_of_pages(std::process::id(), &[page]).expect("move_pages query");
        assert_eq!(nodes.len(), 1);
        assert!(nodes[0].is_some(), "a touched page of this process has a node: {nodes:?}");
    }
}
