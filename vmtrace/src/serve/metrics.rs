//! `/metrics`: the OpenMetrics text of a node agent, with a bounded number
//! of series whatever the process churn.
//!
//! Two sets of series, both sums of every traced process's counts:
//! - per cgroup and rank (`vmtrace_cgroup_*{cgroup,pod_uid,container_id,rank}`):
//!   a pod's container, a systemd service, a rank of a job. At most
//!   `--cgroups` of them; a cgroup (and rank) first seen when they are all
//!   taken adds into `cgroup="other"`.
//! - per process (`vmtrace_*{pid,comm,…}`): at most `--top` processes have
//!   series of their own, the rest add into `pid="",comm="other"`.
//!
//! Every series accumulates what its processes' counters grew by while they
//! belonged to it, so each counter only grows and the series of a set add up
//! to the whole trace's counts at every scrape. A series whose processes
//! have all exited is kept for `LINGER` (so Prometheus scrapes its final
//! value) and then dropped, which frees its place: a process's place goes
//! to the live process without one that faulted most in the last refresh
//! (its series counts from then; what it did before stays in `other`); a
//! cgroup's to the next cgroup seen. What a dropped series counted moves
//! into its set's remainder, `pid="",comm="[exited]"` and
//! `cgroup="[exited]"` (shown once a series was dropped), so that the sums
//! stay whole: `sum(vmtrace_page_faults_total)` equals
//! `sum(vmtrace_cgroup_page_faults_total)` at every scrape, and no counter
//! goes back. The remainder rises by a dropped series' whole count at
//! once, when that series stops being exposed: a `rate()` of the sum is
//! unchanged by the move (Prometheus no longer sees the dropped series grow).
use crate::hash::{HashMap, HashSet};
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    hash::{Hash as _, Hasher as _},
    sync::Arc,
    time::Duration,
};

use crate::model::{Identity, LiveProcess, LiveSnapshot};

/// How long a series outlives its last process.
pub const LINGER: Duration = Duration::from_mins(2);

/// Counters of a series (accumulated) and its resident gauges (now).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Counts {
    minor: u64,
    major: u64,
    cow: u64,
    fault_ns: u64,
    ipis: u64,
}

impl Counts {
    fn of(p: &LiveProcess) -> Self {
        Self {
            minor: p.faults.minor,
            major: p.faults.major,
            cow: p.faults.cow,
            fault_ns: p.faults.time_ns,
            ipis: p.ipis_sent,
        }
    }

    /// What `now` grew by since `before` (a counter that went back, a pid
    /// reused, counts from 0).
    fn growth(now: &Self, before: &Self) -> Self {
        let d = |a: u64, b: u64| if a >= b { a - b } else { a };
        Self {
            minor: d(now.minor, before.minor),
            major: d(now.major, before.major),
            cow: d(now.cow, before.cow),
            fault_ns: d(now.fault_ns, before.fault_ns),
            ipis: d(now.ipis, before.ipis),
        }
    }

    fn add(&mut self, o: &Self) {
        self.minor += o.minor;
        self.major += o.major;
        self.cow += o.cow;
        self.fault_ns += o.fault_ns;
        self.ipis += o.ipis;
    }

    fn faults(&self) -> u64 {
        self.minor + self.major
    }
}

/// Resident bytes of a series now (anon, file, shmem), and the largest
/// total one of its processes reached.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Resident {
    anon: u64,
    file: u64,
    shmem: u64,
    peak: u64,
    known: bool,
}

#[derive(Clone, Debug, Default)]
struct Series {
    counts: Counts,
    resident: Resident,
    /// Seconds (of the trace) a process of it was last seen alive.
    last_alive_s: f64,
    labels: String,
    /// Seconds (of the trace) its counters count from: the refresh before
    /// the one that made it (`_created`); none for a remainder that jumps.
    created_s: Option<f64>,
}

/// The cgroup series' key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct CgroupKey {
    cgroup: String,
    pod_uid: String,
    container_id: String,
    rank: String,
}

impl CgroupKey {
    fn of(id: Option<&Identity>) -> Self {
        let id = id.cloned().unwrap_or_default();
        Self {
            rank: id.rank_number().map(|r| r.to_string()).unwrap_or_default(),
            cgroup: id.cgroup.unwrap_or_default(),
            pod_uid: id.pod_uid.unwrap_or_default(),
            container_id: id.container_id.unwrap_or_default(),
        }
    }

    fn other() -> Self {
        Self { cgroup: "other".into(), pod_uid: String::new(), container_id: String::new(), rank: String::new() }
    }

    fn labels(&self) -> String {
        format!(
            "cgroup=\"{}\",pod_uid=\"{}\",container_id=\"{}\",rank=\"{}\"",
            label(&self.cgroup),
            label(&self.pod_uid),
            label(&self.container_id),
            label(&self.rank)
        )
    }

    fn hash64(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut h);
        h.finish()
    }
}

/// What is remembered of each process seen: its counters at the last
/// refresh, and whether it has a series of its own.
#[derive(Clone, Debug, Default)]
struct Seen {
    last: Counts,
    own: bool,
    /// Its place was taken back after it exited: never given one again.
    done: bool,
    /// It added into `other` at least once.
    folded: bool,
}

/// The series of a node agent, updated from one snapshot to the next.
pub struct Aggregator {
    top: usize,
    max_cgroups: usize,
    seen: HashMap<u32, Seen>,
    procs: BTreeMap<u32, Series>,
    proc_other: Series,
    cgroups: BTreeMap<CgroupKey, Series>,
    cgroup_other: Series,
    /// What the dropped series counted (`[exited]`), one per set.
    proc_exited: Series,
    cgroup_exited: Series,
    /// How long a series outlives its last process (`LINGER`).
    linger: Duration,
    /// Processes and cgroups that ever added into `other`.
    folded_procs: u64,
    folded_cgroups: HashSet<u64>,
    oom_kills: usize,
    dropped: u64,
    /// Unix seconds of the trace's start (`_created` = this + `created_s`).
    epoch_s: Option<f64>,
    /// Seconds (of the trace) of the last update: a series made at the
    /// next counts what grew since.
    last_t_s: f64,
}

impl Aggregator {
    /// `top` processes and `max_cgroups` cgroups (and ranks) with series of their own.
    pub fn new(top: usize, max_cgroups: usize) -> Self {
        Self {
            top,
            max_cgroups,
            seen: HashMap::default(),
            procs: BTreeMap::new(),
            proc_other: Series { created_s: Some(0.0), ..Series::default() },
            cgroups: BTreeMap::new(),
            cgroup_other: Series { created_s: Some(0.0), ..Series::default() },
            proc_exited: Series {
                labels: "pid=\"\",comm=\"[exited]\",cgroup=\"\",pod_uid=\"\",container_id=\"\",rank=\"\"".into(),
                ..Series::default()
            },
            cgroup_exited: Series {
                labels: "cgroup=\"[exited]\",pod_uid=\"\",container_id=\"\",rank=\"\"".into(),
                ..Series::default()
            },
            linger: LINGER,
            folded_procs: 0,
            folded_cgroups: HashSet::default(),
            oom_kills: 0,
            dropped: 0,
            epoch_s: None,
            last_t_s: 0.0,
        }
    }

    /// The trace's start in Unix seconds (tests: the clock otherwise, at
    /// the first update).
    #[cfg(test)]
    fn with_epoch(mut self, unix_s: f64) -> Self {
        self.epoch_s = Some(unix_s);
        self
    }

    /// How long a series outlives its last process (tests: `LINGER` otherwise).
    #[must_use]
    pub fn with_linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// Adds what every process's counters grew by since the last snapshot
    /// to its series. `snap` covers the whole trace (exited processes too).
    pub fn update(&mut self, snap: &LiveSnapshot) {
        let now_s = snap.t_s;
        let since = self.last_t_s;
        self.last_t_s = now_s;
        if self.epoch_s.is_none() {
            let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            self.epoch_s = Some(unix.as_secs_f64() - now_s);
        }
        let linger = self.linger.as_secs_f64();
        // A series with a live process is alive; the places of those gone
        // quiet for LINGER are taken back.
        for p in snap.processes.iter().filter(|p| !p.exited) {
            if let Some(s) = self.procs.get_mut(&p.pid) {
                s.last_alive_s = now_s;
            }
            if let Some(s) = self.cgroups.get_mut(&CgroupKey::of(p.identity.as_deref())) {
                s.last_alive_s = now_s;
            }
        }
        let exited = &mut self.proc_exited.counts;
        self.procs.retain(|_, s| {
            let keep = now_s - s.last_alive_s <= linger;
            if !keep {
                exited.add(&s.counts);
            }
            keep
        });
        for (pid, s) in &mut self.seen {
            if s.own && !self.procs.contains_key(pid) {
                s.own = false;
                s.done = true;
            }
        }
        let exited = &mut self.cgroup_exited.counts;
        self.cgroups.retain(|_, s| {
            let keep = now_s - s.last_alive_s <= linger;
            if !keep {
                exited.add(&s.counts);
            }
            keep
        });
        self.forget_folded_away(snap);
        let growth: Vec<Counts> = snap
            .processes
            .iter()
            .map(|p| Counts::growth(&Counts::of(p), &self.seen.get(&p.pid).map(|s| s.last).unwrap_or_default()))
            .collect();
        // Free places go to the live processes without one that faulted most
        // since; not to one that neither did anything since nor holds memory
        // (a kernel thread under `-a`: ksoftirqd, rcu_preempt).
        let free = self.top.saturating_sub(self.procs.len());
        if free > 0 {
            let holds = |p: &LiveProcess| p.resident.is_some_and(|r| r.anon + r.file + r.shmem > 0);
            let mut want: Vec<(u64, u32)> = snap
                .processes
                .iter()
                .zip(&growth)
                .filter(|(p, _)| !p.exited && self.seen.get(&p.pid).is_none_or(|s| !s.own && !s.done))
                .filter(|(p, g)| g.faults() + g.ipis > 0 || holds(p))
                .map(|(p, g)| (g.faults(), p.pid))
                .collect();
            want.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            for (_, pid) in want.into_iter().take(free) {
                self.seen.entry(pid).or_default().own = true;
                self.procs.insert(pid, Series { created_s: Some(since), ..Series::default() });
            }
        }
        for s in self.procs.values_mut().chain(self.cgroups.values_mut()) {
            s.resident = Resident::default();
        }
        self.proc_other.resident = Resident::default();
        self.cgroup_other.resident = Resident::default();
        for (p, g) in snap.processes.iter().zip(&growth) {
            let seen = self.seen.entry(p.pid).or_default();
            seen.last = Counts::of(p);
            let resident =
                p.resident.map(|r| Resident { anon: r.anon, file: r.file, shmem: r.shmem, peak: r.peak, known: true });
            let series = if seen.own {
                let s =
                    self.procs.entry(p.pid).or_insert_with(|| Series { created_s: Some(since), ..Series::default() });
                s.labels = process_labels(p);
                s
            } else {
                if !seen.folded && (g.faults() + g.ipis > 0 || !p.exited) {
                    seen.folded = true;
                    self.folded_procs += 1;
                }
                &mut self.proc_other
            };
            series.counts.add(g);
            add_resident(&mut series.resident, resident, true);
            if !p.exited {
                series.last_alive_s = now_s;
            }
            let series = self.cgroup_series(p, g, since);
            series.counts.add(g);
            // A cgroup's peak is no sum of its processes' peaks: not shown.
            add_resident(&mut series.resident, resident, false);
            if !p.exited {
                series.last_alive_s = now_s;
            }
        }
        self.oom_kills = snap.oom_kills;
        self.dropped = snap.drops.all_counters();
    }

    /// The cgroup-and-rank series `p`'s growth `g` adds to: its own (made
    /// now, counting from `since`, if a place is free) or `other`.
    fn cgroup_series(&mut self, p: &LiveProcess, g: &Counts, since: f64) -> &mut Series {
        let key = CgroupKey::of(p.identity.as_deref());
        // A place for a live process, or for one that grew and exited
        // between two refreshes (a short job: its rank's series, not
        // `other`); never for pid 0, what no refresh saw of the
        // processes folded away, which has no identity.
        let new_place = !p.exited || (g.faults() + g.ipis > 0 && p.pid != crate::model::fold::OTHER_PID);
        if self.cgroups.contains_key(&key) || (self.cgroups.len() < self.max_cgroups && new_place) {
            let labels = key.labels();
            return self.cgroups.entry(key).or_insert_with(|| Series {
                labels,
                created_s: Some(since),
                ..Series::default()
            });
        }
        if g.faults() + g.ipis > 0 {
            self.folded_cgroups.insert(key.hash64());
        }
        &mut self.cgroup_other
    }

    /// A process that left the snapshot was folded away into its other
    /// process (pid 0, `collect::folded`), whose counters now hold its own:
    /// what was seen of it becomes part of what was seen of pid 0, so that
    /// pid 0 grows only by what no refresh saw of it yet. Its memory goes.
    fn forget_folded_away(&mut self, snap: &LiveSnapshot) {
        let present: crate::hash::HashSet<u32> = snap.processes.iter().map(|p| p.pid).collect();
        let gone: Vec<u32> = self.seen.keys().copied().filter(|p| !present.contains(p)).collect();
        if gone.is_empty() {
            return;
        }
        let mut last = Counts::default();
        for pid in gone {
            if let Some(s) = self.seen.remove(&pid) {
                last.add(&s.last);
            }
        }
        let other = self.seen.entry(crate::model::fold::OTHER_PID).or_default();
        other.last.add(&last);
        // Pid 0 stands for processes counted in `folded_procs` already.
        other.folded = true;
    }

    /// A set's `[exited]` remainder, once a series of it was dropped.
    fn exited(s: &Series) -> Option<&Series> {
        (s.counts != Counts::default()).then_some(s)
    }

    /// Series now: (processes with their own, cgroups with their own).
    #[cfg(test)]
    pub fn series_counts(&self) -> (usize, usize) {
        (self.procs.len(), self.cgroups.len())
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut t = String::new();
        let procs: Vec<&Series> =
            self.procs.values().chain([&self.proc_other]).chain(Self::exited(&self.proc_exited)).collect();
        let cgroups: Vec<&Series> =
            self.cgroups.values().chain([&self.cgroup_other]).chain(Self::exited(&self.cgroup_exited)).collect();
        let other_labels = "pid=\"\",comm=\"other\",cgroup=\"\",pod_uid=\"\",container_id=\"\",rank=\"\"".to_string();
        let other_cg = CgroupKey::other().labels();
        let plabels = |s: &Series| if s.labels.is_empty() { other_labels.clone() } else { s.labels.clone() };
        let clabels = |s: &Series| if s.labels.is_empty() { other_cg.clone() } else { s.labels.clone() };
        let epoch = self.epoch_s.unwrap_or_default();
        // A counter's sample, then (OpenMetrics) when it started counting:
        // a series that appears mid-trace starts at what its processes did
        // in its first second, which Prometheus's increase() cannot see grow
        // without it.
        let counter = |t: &mut String, name: &str, labels: &str, value: &dyn std::fmt::Display, s: &Series| {
            let _ = writeln!(t, "{name}_total{{{labels}}} {value}");
            if let Some(c) = s.created_s {
                let _ = writeln!(t, "{name}_created{{{labels}}} {:.3}", epoch + c);
            }
        };
        for (prefix, set, labels, what) in [
            ("vmtrace_", &procs, &plabels as &dyn Fn(&Series) -> String, "process"),
            ("vmtrace_cgroup_", &cgroups, &clabels as &dyn Fn(&Series) -> String, "cgroup and rank"),
        ] {
            let _ = writeln!(
                t,
                "# TYPE {prefix}page_faults counter\n# HELP {prefix}page_faults Page faults taken, by {what} and kind."
            );
            for s in set {
                for (kind, v) in [("minor", s.counts.minor), ("major", s.counts.major)] {
                    counter(&mut t, &format!("{prefix}page_faults"), &format!("{},kind=\"{kind}\"", labels(s)), &v, s);
                }
            }
            let _ = writeln!(t, "# TYPE {prefix}cow_faults counter\n# HELP {prefix}cow_faults Copy-on-write (write-protect) faults, by {what}.");
            for s in set {
                counter(&mut t, &format!("{prefix}cow_faults"), &labels(s), &s.counts.cow, s);
            }
            let _ = writeln!(
                t,
                "# TYPE {prefix}fault_seconds counter\n# UNIT {prefix}fault_seconds seconds\n# HELP {prefix}fault_seconds Time in the fault handler, by {what}."
            );
            for s in set {
                let secs = format!("{:.9}", s.counts.fault_ns as f64 / 1e9);
                counter(&mut t, &format!("{prefix}fault_seconds"), &labels(s), &secs, s);
            }
            let _ = writeln!(
                t,
                "# TYPE {prefix}tlb_shootdown_ipis counter\n# HELP {prefix}tlb_shootdown_ipis TLB-flush IPIs sent to other CPUs, by {what}."
            );
            for s in set {
                counter(&mut t, &format!("{prefix}tlb_shootdown_ipis"), &labels(s), &s.counts.ipis, s);
            }
            let resident: Vec<&&Series> = set.iter().filter(|s| s.resident.known).collect();
            if !resident.is_empty() {
                let _ = writeln!(
                    t,
                    "# TYPE {prefix}resident_bytes gauge\n# UNIT {prefix}resident_bytes bytes\n# HELP {prefix}resident_bytes Resident memory now, by {what} and kind (the kernel's rss_stat counters of its live processes)."
                );
                for s in &resident {
                    let r = s.resident;
                    for (kind, v) in [("anon", r.anon), ("file", r.file), ("shmem", r.shmem)] {
                        let _ = writeln!(t, "{prefix}resident_bytes{{{},kind=\"{kind}\"}} {v}", labels(s));
                    }
                }
                if prefix == "vmtrace_" {
                    let _ = writeln!(
                        t,
                        "# TYPE vmtrace_resident_peak_bytes gauge\n# UNIT vmtrace_resident_peak_bytes bytes\n# HELP vmtrace_resident_peak_bytes Largest resident memory (anon + file + shmem) so far (\"other\": the sum of its processes' peaks)."
                    );
                    for s in &resident {
                        let _ = writeln!(t, "vmtrace_resident_peak_bytes{{{}}} {}", labels(s), s.resident.peak);
                    }
                }
            }
        }
        let _ = writeln!(
            t,
            "# TYPE vmtrace_folded_processes counter\n# HELP vmtrace_folded_processes Processes that added into the pid=\"\",comm=\"other\" series (--top bounds the others)."
        );
        let _ = writeln!(t, "vmtrace_folded_processes_total {}", self.folded_procs);
        let _ = writeln!(
            t,
            "# TYPE vmtrace_folded_cgroups counter\n# HELP vmtrace_folded_cgroups Cgroups (and ranks) that added into the cgroup=\"other\" series (--cgroups bounds the others)."
        );
        let _ = writeln!(t, "vmtrace_folded_cgroups_total {}", self.folded_cgroups.len());
        let _ = writeln!(t, "# TYPE vmtrace_series gauge\n# HELP vmtrace_series Series sets now, by kind (each is one set of the series above).");
        let _ = writeln!(t, "vmtrace_series{{set=\"process\"}} {}", procs.len());
        let _ = writeln!(t, "vmtrace_series{{set=\"cgroup\"}} {}", cgroups.len());
        let _ =
            writeln!(t, "# TYPE vmtrace_oom_kills counter\n# HELP vmtrace_oom_kills OOM kills seen on the machine.");
        let _ = writeln!(t, "vmtrace_oom_kills_total {}", self.oom_kills);
        let _ = writeln!(t, "# TYPE vmtrace_dropped counter\n# HELP vmtrace_dropped Events and samples dropped anywhere (all drop counters).");
        let _ = writeln!(t, "vmtrace_dropped_total {}", self.dropped);
        t.push_str("# EOF\n");
        t
    }
}

fn add_resident(to: &mut Resident, r: Option<Resident>, peaks: bool) {
    if let Some(r) = r {
        to.anon += r.anon;
        to.file += r.file;
        to.shmem += r.shmem;
        if peaks {
            to.peak += r.peak;
        }
        to.known = true;
    }
}

fn process_labels(p: &LiveProcess) -> String {
    let key = CgroupKey::of(p.identity.as_deref());
    format!("pid=\"{}\",comm=\"{}\",{}", p.pid, label(p.comm.as_deref().unwrap_or_default()), key.labels())
}

pub(crate) fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Identities of a snapshot's processes, by pid (the profiles' labels).
pub fn identities(snap: &LiveSnapshot) -> BTreeMap<u32, Arc<Identity>> {
    snap.processes.iter().filter_map(|p| Some((p.pid, Arc::clone(p.identity.as_ref()?)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DropCounts, LiveResident, Rank};

    fn id(cgroup: &str, rank: Option<u32>) -> Arc<Identity> {
        Arc::new(Identity {
            cgroup: Some(cgroup.into()),
            pod_uid: cgroup.strip_prefix("/kubepods/burstable/pod").map(|p| p[..36].to_string()),
            rank: rank.map(|r| Rank { rank: Some(r), ..Rank::default() }),
            ..Identity::default()
        })
    }

    fn proc(pid: u32, faults: u64, ident: &Arc<Identity>, exited: bool) -> LiveProcess {
        let stats = vmtrace_common::FaultStats { started: faults, ..Default::default() };
        LiveProcess {
            resident: Some(LiveResident { anon: faults << 12, file: 4096, shmem: 0, peak: 2 * (faults << 12) }),
            identity: Some(Arc::clone(ident)),
            exited,
            ..LiveProcess::from_counters(pid, Some(format!("p{pid}")), &stats, None, 1)
        }
    }

    fn sum(text: &str, metric: &str, with: &str) -> u64 {
        text.lines()
            .filter(|l| l.starts_with(metric) && l.contains(with))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    }

    const POD: &str = "/kubepods/burstable/pod4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b/0123";

    #[test]
    fn series_are_bounded_and_add_up_to_every_process() {
        let pod = id(POD, Some(3));
        let sys = id("/system.slice/cron.service", None);
        let mut a = Aggregator::new(2, 2);
        let mut snap = LiveSnapshot {
            t_s: 1.0,
            processes: vec![proc(3, 10, &pod, false), proc(5, 20, &sys, false), proc(9, 40, &sys, false)],
            drops: DropCounts { by_kind: vec![1, 0, 0, 7], malformed_events: 0 },
            oom_kills: 2,
            ..LiveSnapshot::default()
        };
        a.update(&snap);
        let t = a.render();
        openmetrics_parser::openmetrics::parse_openmetrics(&t).unwrap_or_else(|e| panic!("{e:?}\n{t}"));
        // The two that faulted most have their own series; pid 3 is in other.
        assert!(t.contains("vmtrace_page_faults_total{pid=\"9\",comm=\"p9\",cgroup=\"/system.slice/cron.service\",pod_uid=\"\",container_id=\"\",rank=\"\",kind=\"minor\"} 40\n"), "{t}");
        assert!(t.contains("vmtrace_page_faults_total{pid=\"\",comm=\"other\",cgroup=\"\",pod_uid=\"\",container_id=\"\",rank=\"\",kind=\"minor\"} 10\n"), "{t}");
        assert!(t.contains("vmtrace_cgroup_page_faults_total{cgroup=\"/kubepods/burstable/pod4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b/0123\",pod_uid=\"4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b\",container_id=\"\",rank=\"3\",kind=\"minor\"} 10\n"), "{t}");
        assert!(t.contains("vmtrace_cgroup_page_faults_total{cgroup=\"/system.slice/cron.service\",pod_uid=\"\",container_id=\"\",rank=\"\",kind=\"minor\"} 60\n"), "{t}");
        assert!(t.contains("vmtrace_folded_processes_total 1\n"), "{t}");
        assert!(t.contains("vmtrace_oom_kills_total 2\n") && t.contains("vmtrace_dropped_total 8\n"), "{t}");
        assert!(t.contains("vmtrace_resident_bytes{pid=\"9\",comm=\"p9\","), "{t}");
        assert!(t.contains("vmtrace_cgroup_resident_bytes{cgroup=\"/system.slice/cron.service\""), "{t}");
        assert!(!t.contains("vmtrace_cgroup_resident_peak_bytes"), "{t}");
        // Churn: 500 short processes in 500 new cgroups, then all exit.
        for i in 0..500u32 {
            snap.processes.push(proc(1000 + i, 1, &id(&format!("/churn/{i}"), None), false));
        }
        snap.t_s = 2.0;
        a.update(&snap);
        for p in &mut snap.processes[3..] {
            p.exited = true;
        }
        snap.t_s = 3.0;
        a.update(&snap);
        let t = a.render();
        let all: u64 = snap.processes.iter().map(|p| p.faults.minor).sum();
        assert_eq!(sum(&t, "vmtrace_page_faults_total{", "kind=\"minor\""), all, "process series add up to all: {t}");
        assert_eq!(
            sum(&t, "vmtrace_cgroup_page_faults_total{", "kind=\"minor\""),
            all,
            "cgroup series add up to all: {t}"
        );
        let sets = |prefix: &str| t.lines().filter(|l| l.starts_with(prefix) && l.contains("kind=\"minor\"")).count();
        assert_eq!(sets("vmtrace_page_faults_total{"), 3, "2 processes and other: {t}");
        assert_eq!(sets("vmtrace_cgroup_page_faults_total{"), 3, "2 cgroups and other: {t}");
        assert!(t.contains("vmtrace_folded_cgroups_total 500\n"), "{t}");
        assert!(t.contains("vmtrace_folded_processes_total 501\n"), "{t}");
    }

    #[test]
    fn a_place_freed_by_an_exit_goes_to_the_busiest_process_and_counters_only_grow() {
        let sys = id("/s", None);
        let mut a = Aggregator::new(1, 10);
        let mut snap = LiveSnapshot {
            t_s: 1.0,
            processes: vec![proc(1, 5, &sys, false), proc(2, 7, &sys, false)],
            ..LiveSnapshot::default()
        };
        a.update(&snap);
        assert!(a.render().contains("pid=\"2\""));
        // pid 2 exits; its series stays for LINGER, then pid 1 (still faulting) takes its place.
        snap.processes[1].exited = true;
        snap.processes[0] = proc(1, 9, &sys, false);
        snap.t_s = 2.0;
        a.update(&snap);
        assert!(a.render().contains("pid=\"2\""));
        let other_before = sum(&a.render(), "vmtrace_page_faults_total{pid=\"\",comm=\"other\"", "minor");
        assert!(!a.render().contains("[exited]"), "no series dropped yet");
        snap.processes[0] = proc(1, 12, &sys, false);
        snap.t_s = 3.0 + LINGER.as_secs_f64();
        a.update(&snap);
        let t = a.render();
        assert!(!t.contains("pid=\"2\"") && t.contains("pid=\"1\""), "{t}");
        // pid 1's series counts from its promotion; what it did before stays in other.
        assert_eq!(sum(&t, "vmtrace_page_faults_total{pid=\"1\"", "minor"), 3, "{t}");
        assert_eq!(sum(&t, "vmtrace_page_faults_total{pid=\"\",comm=\"other\"", "minor"), other_before, "{t}");
        // The cgroup's counter holds everything, the exited process's too.
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{cgroup=\"/s\"", "minor"), 19, "{t}");
        // uc30: the dropped series' 7 faults are in the remainder, so the
        // process series still add up to the cgroup ones.
        assert_eq!(sum(&t, "vmtrace_page_faults_total{pid=\"\",comm=\"[exited]\"", "minor"), 7, "{t}");
        assert_eq!(sum(&t, "vmtrace_page_faults_total{", "kind=\"minor\""), 19, "{t}");
        assert!(t.contains("vmtrace_series{set=\"process\"} 3\n"), "pid 1, other, [exited]: {t}");
        openmetrics_parser::openmetrics::parse_openmetrics(&t).unwrap_or_else(|e| panic!("{e:?}\n{t}"));
        // The cgroup exits too: its series goes after LINGER, into its remainder.
        snap.processes[0] = LiveProcess { exited: true, ..proc(1, 12, &sys, false) };
        snap.t_s = 4.0 + LINGER.as_secs_f64();
        a.update(&snap);
        snap.t_s = 5.0 + 2.0 * LINGER.as_secs_f64();
        a.update(&snap);
        let t = a.render();
        assert!(!t.contains("cgroup=\"/s\"") && !t.contains("pid=\"1\""), "{t}");
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{cgroup=\"[exited]\"", "minor"), 19, "{t}");
        assert_eq!(sum(&t, "vmtrace_page_faults_total{", "kind=\"minor\""), 19, "{t}");
        assert_eq!(sum(&t, "vmtrace_page_faults_total{pid=\"\",comm=\"[exited]\"", "minor"), 7 + 3, "{t}");
    }

    /// Churn under a small `--top`: at every refresh, whatever was dropped,
    /// the process series add up to the cgroup series and to every process's
    /// counts, and no series' counter goes back.
    #[test]
    fn dropped_series_keep_the_sums_whole_and_counters_monotonic() {
        let mut a = Aggregator::new(2, 1).with_linger(Duration::from_secs(2));
        let mut all: BTreeMap<u32, LiveProcess> = BTreeMap::new();
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for step in 0..40u32 {
            // A new process every step, each living 3 steps, in a new cgroup
            // every 10 steps (one place for cgroups).
            let pid = 100 + step;
            let ident = id(&format!("/c{}", step / 10), None);
            all.insert(pid, proc(pid, u64::from(step % 5) + 1, &ident, false));
            for (p, q) in &mut all {
                let age = step - (p - 100);
                if !q.exited {
                    let grown = q.faults.minor + u64::from(age);
                    *q = proc(*p, grown, q.identity.as_ref().unwrap(), age >= 3);
                }
            }
            let snap = LiveSnapshot {
                t_s: f64::from(step),
                processes: all.values().cloned().collect(),
                ..LiveSnapshot::default()
            };
            a.update(&snap);
            let t = a.render();
            let want: u64 = all.values().map(|p| p.faults.minor).sum();
            assert_eq!(sum(&t, "vmtrace_page_faults_total{", "kind=\"minor\""), want, "step {step}: {t}");
            assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{", "kind=\"minor\""), want, "step {step}: {t}");
            for l in t.lines().filter(|l| l.contains("page_faults_total{")) {
                let (series, v) = l.rsplit_once(' ').unwrap();
                let v: u64 = v.parse().unwrap();
                let before = last.insert(series.to_string(), v).unwrap_or(0);
                assert!(v >= before, "step {step}: {series} went back from {before} to {v}");
            }
        }
        let t = a.render();
        assert!(t.contains("comm=\"[exited]\"") && t.contains("cgroup=\"[exited]\""), "{t}");
        let (p, c) = a.series_counts();
        assert!(p <= 2 && c <= 1, "bounded: {p} {c}");
    }

    /// uc29: under `-a` the places left by few busy processes went to
    /// kernel threads that never fault and hold no memory.
    #[test]
    fn a_process_that_does_nothing_and_holds_nothing_takes_no_place() {
        let sys = id("/s", None);
        let mut a = Aggregator::new(3, 10);
        let kthread = LiveProcess { resident: None, ..proc(2, 0, &sys, false) };
        let idle_with_memory = proc(4, 0, &sys, false);
        let snap = LiveSnapshot {
            t_s: 1.0,
            processes: vec![kthread, proc(3, 5, &sys, false), idle_with_memory],
            ..LiveSnapshot::default()
        };
        a.update(&snap);
        let t = a.render();
        assert!(!t.contains("pid=\"2\""), "{t}");
        assert!(t.contains("pid=\"3\"") && t.contains("pid=\"4\""), "{t}");
        assert_eq!(a.series_counts().0, 2, "{t}");
    }

    #[test]
    fn processes_folded_away_count_once_and_are_forgotten() {
        let sys = id("/s", None);
        let mut a = Aggregator::new(2, 10);
        let mut snap = LiveSnapshot {
            t_s: 1.0,
            processes: vec![proc(1, 5, &sys, false), proc(2, 7, &sys, false), proc(3, 4, &sys, false)],
            ..LiveSnapshot::default()
        };
        a.update(&snap);
        // pids 2 (a series of its own) and 3 (in other) exit...
        snap.processes[1] = proc(2, 8, &sys, true);
        snap.processes[2] = proc(3, 6, &sys, true);
        snap.t_s = 2.0;
        a.update(&snap);
        // ...and are folded away into pid 0, with one fault no refresh saw.
        let mut other = proc(0, 8 + 6 + 1, &sys, true);
        other.identity = None;
        snap.processes = vec![proc(1, 5, &sys, false), other];
        snap.t_s = 3.0;
        a.update(&snap);
        let t = a.render();
        assert_eq!(sum(&t, "vmtrace_page_faults_total{", "kind=\"minor\""), 20, "{t}");
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{", "kind=\"minor\""), 20, "{t}");
        assert_eq!(sum(&t, "vmtrace_page_faults_total{pid=\"2\"", "minor"), 8, "its series stays: {t}");
        assert!(t.contains("vmtrace_folded_processes_total 1\n"), "pid 3 only: {t}");
        assert_eq!(a.seen.len(), 2, "pids 1 and 0 remembered");
        // A later refresh adds nothing.
        snap.t_s = 4.0;
        a.update(&snap);
        assert_eq!(sum(&a.render(), "vmtrace_page_faults_total{", "kind=\"minor\""), 20);
    }

    /// srv33 (issue #36): a job that started and exited between two
    /// refreshes (64 MiB touched in well under a second) had all its faults
    /// in `cgroup="other"` although places were free: an exited process
    /// made no cgroup series. Now it does when it grew; pid 0 (the folded
    /// away, no identity) still adds into other.
    #[test]
    fn a_job_that_exits_between_two_refreshes_has_its_ranks_series() {
        let mut a = Aggregator::new(5, 10);
        let sh = id("/s", None);
        let mut snap = LiveSnapshot { t_s: 1.0, processes: vec![proc(1, 5, &sh, false)], ..LiveSnapshot::default() };
        a.update(&snap);
        snap.processes.push(proc(2, 16_384, &id("/s", Some(3)), true));
        let mut other = proc(0, 40, &sh, true);
        other.identity = None;
        snap.processes.insert(0, other);
        snap.t_s = 2.0;
        a.update(&snap);
        let t = a.render();
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{cgroup=\"/s\"", "rank=\"3\""), 16_384, "{t}");
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{cgroup=\"other\"", "minor"), 40, "{t}");
        assert_eq!(sum(&t, "vmtrace_cgroup_page_faults_total{", "minor"), 16_384 + 40 + 5, "{t}");
    }

    /// uc32 (issue #36): a short job's series appeared at its full value,
    /// so Prometheus's increase() over it was 0 (rank 7's 66,452 faults).
    /// Each counter says when it started counting (`_created`): the trace's
    /// start for the series of the first refresh and for `other`, the
    /// refresh before the one that made it for the others; none for the
    /// `[exited]` remainder, which jumps by whole dropped series.
    #[test]
    fn a_series_made_mid_trace_says_when_it_started_counting() {
        let mut a = Aggregator::new(1, 10).with_epoch(1_000.0).with_linger(Duration::from_secs(1));
        let mut snap = LiveSnapshot {
            t_s: 1.0,
            processes: vec![proc(1, 5, &id("/s", Some(1)), false)],
            ..LiveSnapshot::default()
        };
        a.update(&snap);
        let t = a.render();
        openmetrics_parser::openmetrics::parse_openmetrics(&t).unwrap_or_else(|e| panic!("{e:?}\n{t}"));
        let s1 = "cgroup=\"/s\",pod_uid=\"\",container_id=\"\",rank=\"1\"";
        assert!(t.contains(&format!("vmtrace_cgroup_page_faults_created{{{s1},kind=\"minor\"}} 1000.000\n")), "{t}");
        assert!(
            t.contains(&format!("vmtrace_page_faults_created{{pid=\"1\",comm=\"p1\",{s1},kind=\"major\"}} 1000.000\n")),
            "{t}"
        );
        assert!(t.contains("vmtrace_cgroup_page_faults_created{cgroup=\"other\",pod_uid=\"\",container_id=\"\",rank=\"\",kind=\"minor\"} 1000.000\n"), "{t}");
        // A job of rank 2 starts between the refreshes at 1 and 3 s: its
        // series count from 1 s, so its first value is all growth.
        snap.processes[0] = proc(1, 5, &id("/s", Some(1)), true);
        snap.processes.push(proc(2, 700, &id("/s", Some(2)), false));
        snap.t_s = 3.0;
        a.update(&snap);
        let t = a.render();
        openmetrics_parser::openmetrics::parse_openmetrics(&t).unwrap_or_else(|e| panic!("{e:?}\n{t}"));
        let s2 = "cgroup=\"/s\",pod_uid=\"\",container_id=\"\",rank=\"2\"";
        assert!(t.contains(&format!("vmtrace_cgroup_page_faults_total{{{s2},kind=\"minor\"}} 700\n")), "{t}");
        assert!(t.contains(&format!("vmtrace_cgroup_page_faults_created{{{s2},kind=\"minor\"}} 1001.000\n")), "{t}");
        assert!(t.contains(&format!("vmtrace_cgroup_cow_faults_created{{{s2}}} 1001.000\n")), "{t}");
        assert!(t.contains(&format!("vmtrace_cgroup_fault_seconds_created{{{s2}}} 1001.000\n")), "{t}");
        assert!(t.contains(&format!("vmtrace_cgroup_tlb_shootdown_ipis_created{{{s2}}} 1001.000\n")), "{t}");
        // pid 1's series lingered out (1 s here) and its place went to pid 2.
        assert!(
            t.contains(&format!("vmtrace_page_faults_created{{pid=\"2\",comm=\"p2\",{s2},kind=\"minor\"}} 1001.000\n")),
            "{t}"
        );
        assert!(t.contains("vmtrace_page_faults_total{pid=\"\",comm=\"[exited]\""), "{t}");
        assert!(!t.contains("vmtrace_page_faults_created{pid=\"\",comm=\"[exited]\""), "{t}");
        // Every counter sample but the remainders' has its _created.
        let totals = t.lines().filter(|l| l.contains("_total{") && !l.contains("[exited]")).count();
        assert_eq!(t.lines().filter(|l| l.contains("_created{")).count(), totals, "{t}");
        openmetrics_parser::openmetrics::parse_openmetrics(&t).unwrap_or_else(|e| panic!("{e:?}\n{t}"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
