//! `vmtrace top`'s NODE column, on hosts with two NUMA nodes or more: each
//! shown process's main node and that node's share of its resident pages,
//! from `/proc/PID/numa_maps`. A read walks the process's page tables, so
//! only the rows on screen are read, and at most once per [`READ_EVERY`];
//! between rounds a row keeps its last read. The reads run on a thread of
//! their own: a process of hundreds of GB takes seconds to walk, and the
//! loop that drains the kernel's rings must not wait for it. On a host with
//! one node nothing is read and there is no column.
use crate::hash::HashMap;
use std::{
    collections::BTreeMap,
    sync::mpsc,
    time::{Duration, Instant},
};

use super::model::human_bytes;
use crate::numa::{pages_by_node, parse_numa_maps, Topology};

/// How often the shown rows' numa_maps are read.
pub const READ_EVERY: Duration = Duration::from_secs(2);

/// The last round of numa_maps reads.
#[derive(Debug)]
pub struct NodeReads {
    nodes: Vec<u32>,
    last: Option<Instant>,
    /// Pages (4 KiB) by node of each process read in the last round.
    by_pid: HashMap<u32, BTreeMap<u32, u64>>,
    /// The round being read on its own thread: each pid's numa_maps text.
    pending: Option<mpsc::Receiver<Vec<(u32, String)>>>,
}

/// What the header says: the host's nodes and the shown processes' pages on each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTotals {
    pub nodes: Vec<u32>,
    pub pages: BTreeMap<u32, u64>,
    /// Processes whose pages are in `pages`.
    pub processes: usize,
}

impl NodeReads {
    /// `None` on a host with one node: nothing to show, nothing read.
    #[must_use]
    pub fn new(topo: &Topology) -> Option<Self> {
        (!topo.single_node()).then(|| Self {
            nodes: topo.nodes.clone(),
            last: None,
            by_pid: HashMap::default(),
            pending: None,
        })
    }

    /// Whether a round is due: none yet, or the last one [`READ_EVERY`] ago.
    fn due(&self, now: Instant) -> bool {
        self.last.is_none_or(|t| now.saturating_duration_since(t) >= READ_EVERY)
    }

    /// Reads the numa_maps of `shown` (the rows on screen, in order) with
    /// `read` unless the last round was less than [`READ_EVERY`] ago. A
    /// process whose read fails or is empty (it exited) has no value.
    pub fn refresh(&mut self, now: Instant, shown: &[u32], read: impl Fn(u32) -> Option<String>) {
        if !self.due(now) {
            return;
        }
        self.last = Some(now);
        let texts: Vec<(u32, String)> = shown.iter().filter_map(|&pid| Some((pid, read(pid)?))).collect();
        self.apply(&texts);
    }

    /// As [`Self::refresh`], reading `/proc/PID/numa_maps` on a thread of its
    /// own: a round's values replace the last round's when it is read, at a
    /// later call; until then (and while a round is read) rows keep their
    /// last values, and no new round starts.
    pub fn refresh_in_background(&mut self, now: Instant, shown: &[u32]) {
        if let Some(rx) = &self.pending {
            match rx.try_recv() {
                Ok(texts) => {
                    self.pending = None;
                    self.apply(&texts);
                }
                Err(mpsc::TryRecvError::Empty) => return,
                Err(mpsc::TryRecvError::Disconnected) => self.pending = None,
            }
        }
        if !self.due(now) {
            return;
        }
        self.last = Some(now);
        let (pids, (tx, rx)) = (shown.to_vec(), mpsc::channel());
        let reader = std::thread::Builder::new().name("numa_maps".into()).spawn(move || {
            let read = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).ok();
            let _ = tx.send(pids.into_iter().filter_map(|pid| Some((pid, read(pid)?))).collect());
        });
        if reader.is_ok() {
            self.pending = Some(rx);
        }
    }

    /// A round's texts: the rows read, each with its pages by node.
    fn apply(&mut self, texts: &[(u32, String)]) {
        self.by_pid.clear();
        for (pid, text) in texts {
            let lines = parse_numa_maps(text);
            if !lines.is_empty() {
                self.by_pid.insert(*pid, pages_by_node(&lines, &self.nodes));
            }
        }
    }

    /// The NODE cell of `pid`: "1:97%", the node most of its pages are on
    /// (the lowest of equals) and their share; `None` when not read or
    /// without pages.
    #[must_use]
    pub fn cell(&self, pid: u32) -> Option<String> {
        let by = self.by_pid.get(&pid)?;
        let total: u64 = by.values().sum();
        let (node, pages) = by.iter().rev().max_by_key(|(_, p)| **p)?;
        (total > 0).then(|| format!("{node}:{:.0}%", 100.0 * *pages as f64 / total as f64))
    }

    /// The pages by node of the processes of `shown` read in the last round.
    #[must_use]
    pub fn totals(&self, shown: &[u32]) -> NodeTotals {
        let mut t = NodeTotals { nodes: self.nodes.clone(), ..NodeTotals::default() };
        for by in shown.iter().filter_map(|pid| self.by_pid.get(pid)) {
            t.processes += 1;
            for (n, p) in by {
                *t.pages.entry(*n).or_default() += p;
            }
        }
        t
    }
}

impl NodeTotals {
    /// The header line's parts: "NUMA nodes 0,1", "node 0 1.2G",
    /// "node 1 300M", "resident, 3 processes shown".
    #[must_use]
    pub fn parts(&self) -> Vec<String> {
        let nodes: Vec<String> = self.nodes.iter().map(u32::to_string).collect();
        let mut parts = vec![format!("NUMA nodes {}", nodes.join(","))];
        if self.processes == 0 {
            parts.push("no numa_maps read yet".into());
            return parts;
        }
        parts.extend(self.nodes.iter().map(|n| {
            let pages = self.pages.get(n).copied().unwrap_or(0);
            format!("node {n} {}", human_bytes((pages * 4096) as f64))
        }));
        let s = if self.processes == 1 { "" } else { "es" };
        parts.push(format!("resident, {} process{s} shown", self.processes));
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> Topology {
        Topology { nodes: vec![0, 1], ..Topology::default() }
    }

    const BOUND: &str = "\
7f0000000000 bind:1 anon=970 dirty=970 N1=970 kernelpagesize_kB=4
55d000000000 default file=/usr/bin/python3 mapped=30 N0=30 kernelpagesize_kB=4
";
    const LOCAL: &str = "55e000000000 default heap anon=256 dirty=256 N0=256 kernelpagesize_kB=4\n";

    fn text(pid: u32) -> Option<String> {
        match pid {
            7 => Some(BOUND.into()),
            8 => Some(LOCAL.into()),
            // Exited: the file is empty or gone.
            9 => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn one_node_reads_nothing() {
        let topo = Topology { nodes: vec![0], ..Topology::default() };
        assert!(NodeReads::new(&topo).is_none());
        assert!(NodeReads::new(&Topology::default()).is_none(), "no node directory: one node");
    }

    #[test]
    fn cells_say_the_main_node_and_its_share() {
        let mut r = NodeReads::new(&two_nodes()).expect("two nodes");
        r.refresh(Instant::now(), &[7, 8, 9, 10], text);
        assert_eq!(r.cell(7).as_deref(), Some("1:97%"));
        assert_eq!(r.cell(8).as_deref(), Some("0:100%"));
        assert_eq!((r.cell(9), r.cell(10)), (None, None), "exited or unreadable: no value");
        let t = r.totals(&[7, 8, 9]);
        assert_eq!(t.processes, 2);
        assert_eq!(t.pages.into_iter().collect::<Vec<_>>(), [(0, 286), (1, 970)]);
        // An even split names the lower node.
        let mut r = NodeReads::new(&two_nodes()).expect("two nodes");
        r.refresh(Instant::now(), &[1], |_| Some("7f00 default anon=4 N0=2 N1=2\n".into()));
        assert_eq!(r.cell(1).as_deref(), Some("0:50%"));
    }

    /// Only the rows shown are read, and at most once per `READ_EVERY`.
    #[test]
    fn reads_the_shown_rows_every_two_seconds() {
        let reads = std::cell::RefCell::new(Vec::new());
        let read = |pid: u32| {
            reads.borrow_mut().push(pid);
            text(pid)
        };
        let mut r = NodeReads::new(&two_nodes()).expect("two nodes");
        let t0 = Instant::now();
        r.refresh(t0, &[7], read);
        r.refresh(t0 + Duration::from_secs(1), &[7, 8], read);
        assert_eq!(*reads.borrow(), [7], "a second later: nothing read");
        assert!(r.cell(8).is_none(), "not read yet");
        r.refresh(t0 + READ_EVERY, &[8], read);
        assert_eq!(*reads.borrow(), [7, 8]);
        assert!(r.cell(7).is_none(), "a row no longer shown keeps no value");
        assert_eq!(r.cell(8).as_deref(), Some("0:100%"));
    }

    /// The background round: this process's own numa_maps, read on its
    /// thread and taken in at a later call.
    #[test]
    fn reads_in_the_background() {
        let me = std::process::id();
        let mut r = NodeReads::new(&two_nodes()).expect("two nodes");
        let t0 = Instant::now();
        r.refresh_in_background(t0, &[me]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.cell(me).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            r.refresh_in_background(t0 + Duration::from_secs(1), &[me]);
        }
        assert!(r.cell(me).is_some_and(|c| c.starts_with("0:")), "{:?}", r.cell(me));
        assert!(r.pending.is_none(), "not due a second later: no new round");
    }

    #[test]
    fn header_parts() {
        let mut r = NodeReads::new(&two_nodes()).expect("two nodes");
        assert_eq!(r.totals(&[7]).parts(), ["NUMA nodes 0,1", "no numa_maps read yet"]);
        r.refresh(Instant::now(), &[7, 8], text);
        assert_eq!(
            r.totals(&[7, 8]).parts(),
            ["NUMA nodes 0,1", "node 0 1.1M", "node 1 3.8M", "resident, 2 processes shown"]
        );
        assert_eq!(r.totals(&[8]).parts()[1..], ["node 0 1.0M", "node 1 0K", "resident, 1 process shown"]);
    }
}
