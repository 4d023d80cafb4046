//! The exited processes a system-wide recording folds away while it runs.
//!
//! A process the end's fold is sure to fold (`Session::sure_to_fold`) has
//! its region rows summed into the other process's as it retires. Once its
//! stacks are symbolized (`Session::release_retired`), the rest of it goes
//! the same way: its row into the "other" process row, its fault stacks
//! (weighed against its own totals first), resident profiles and mmap call
//! sites into stacks of the other process under its name, its sampling
//! error into a running sum. What the collector keeps of it is then
//! nothing per process: these tables grow with the distinct names and
//! stacks of the folded, not with how many came and went, so a recording
//! under process churn stays bounded (issue #31) while every count still
//! adds up in the summary and each flamegraph keeps its names.
use crate::hash::HashMap;
use std::{collections::BTreeMap, sync::Arc};

use crate::{
    model::{fold, Identity, MmSite, Process},
    stacks::{
        weight::{Estimate, WEIGHED},
        Frame, Frames, Stack,
    },
};

/// Names of folded processes counted one by one; beyond, they count under
/// `fold::OTHER_NAMES` (a name per process would grow with the churn).
const MAX_NAMES: usize = 4096;

/// Identities (cgroup, pod, container, rank) of folded processes kept on
/// their stacks and call sites (`serve`'s profiles label them); the
/// processes of later ones fold without (as many as `serve --cgroups`).
const MAX_IDENTITIES: usize = 200;

/// Pids `Session::live_stacks` gives the folded stacks of each identity
/// kept (`FOLDED_IDENTITY_PIDS + its index`): above any real pid (the
/// kernel's limit is 2^22), never a pid label.
pub const FOLDED_IDENTITY_PIDS: u32 = 1 << 31;

/// What makes two folded stacks one: everything a `Stack` shows but its
/// process and counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::option_option, reason = "`Stack::unwound` as it is")]
struct Shape {
    comm: String,
    user: Frames,
    kernel: Vec<Frame>,
    leaf: Option<String>,
    stratum: u32,
    unwound: Option<Option<&'static str>>,
    flags: u8,
    /// The index of its processes' identity (`FoldedAway::identities`).
    identity: Option<u32>,
}

/// A frame no map named (`[unknown] 0xADDR`) without its address: the
/// address of one process folded away says nothing of another's (address
/// space layout is random), and a table keyed by it would grow with every
/// process.
const UNKNOWN: &str = "[unknown]";

fn is_raw(f: &str) -> bool {
    f.starts_with("[unknown] 0x")
}

/// `frames` with raw addresses left out (`UNKNOWN`).
fn without_addresses(frames: &Frames) -> Frames {
    if !frames.iter().any(|f| is_raw(f)) {
        return frames.clone();
    }
    let unknown: Frame = UNKNOWN.into();
    frames.iter().map(|f| if is_raw(f) { unknown.clone() } else { f.clone() }).collect()
}

impl Shape {
    fn of(s: &Stack, identity: Option<u32>) -> Self {
        let flags = u8::from(s.user_missing)
            | u8::from(s.user_cut) << 1
            | u8::from(s.python) << 2
            | u8::from(s.python_unnamed) << 3;
        Self {
            comm: s.comm.clone(),
            user: without_addresses(&s.user),
            kernel: s.kernel.clone(),
            leaf: s.leaf.clone(),
            stratum: s.stratum | WEIGHED,
            unwound: s.unwound,
            flags,
            identity,
        }
    }

    fn stack(&self, counts: vmtrace_common::StackCounts, estimate: Estimate) -> Stack {
        Stack {
            pid: fold::OTHER_PID,
            comm: self.comm.clone(),
            user: self.user.clone(),
            kernel: self.kernel.clone(),
            counts,
            user_missing: self.flags & 1 != 0,
            user_cut: self.flags & 2 != 0,
            unwound: self.unwound,
            leaf: self.leaf.clone(),
            stratum: self.stratum,
            estimate,
            python: self.flags & 4 != 0,
            python_unnamed: self.flags & 8 != 0,
        }
    }
}

/// Distinct stacks of folded processes kept one by one; past twice as
/// many, the lightest go into one stack per name (`LIGHTER`). Folded
/// Python processes bring a long tail of stacks that differ in one line
/// (27,639 processes of a shell loop: 6,221 fault and 10,399 resident
/// stacks), which would grow with the churn.
const MAX_SHAPES: usize = 4096;

// The one frame of the stack a name's lightest folded stacks add into: the
// marker the unwound stacks' own bound uses.
use crate::stacks::native::LIGHTER;

/// Weighed stacks of folded processes, one per shape.
#[derive(Default)]
struct StackSums(HashMap<Shape, (vmtrace_common::StackCounts, Estimate)>);

impl StackSums {
    fn add(&mut self, stacks: impl IntoIterator<Item = Stack>, identity_of: &dyn Fn(u32) -> Option<u32>) {
        for s in stacks {
            self.add_one(Shape::of(&s, identity_of(s.pid)), &s.counts, &s.estimate);
        }
        if self.0.len() > 2 * MAX_SHAPES {
            self.compact(MAX_SHAPES);
        }
    }

    fn add_one(&mut self, shape: Shape, counts: &vmtrace_common::StackCounts, estimate: &Estimate) {
        use vmtrace_common::Merge as _;
        let e = self.0.entry(shape).or_default();
        e.0.merge(counts);
        e.1.add(estimate);
    }

    /// Keeps the `keep` heaviest stacks (by faults, then time) and adds the
    /// others into one stack per name, stratum and kind: counts stay whole.
    fn compact(&mut self, keep: usize) {
        let mut all: Vec<_> = self.0.drain().collect();
        all.sort_by(|a, b| (b.1).1.faults.total_cmp(&(a.1).1.faults).then((b.1).1.time_ns.total_cmp(&(a.1).1.time_ns)));
        let light = all.split_off(keep.min(all.len()));
        self.0.extend(all);
        let lighter: Frames = vec![Frame::from(LIGHTER)].into();
        for (shape, (counts, estimate)) in light {
            let into = Shape { user: lighter.clone(), kernel: Vec::new(), leaf: None, ..shape };
            self.add_one(into, &counts, &estimate);
        }
    }

    /// The stacks, those of one shape and different identities as one
    /// (merged only when some have an identity: the resident ones never).
    fn stacks(&self) -> impl Iterator<Item = Stack> + '_ {
        let merged = self.0.keys().any(|k| k.identity.is_some()).then(|| {
            let mut merged = Self::default();
            for (k, (c, e)) in &self.0 {
                merged.add_one(Shape { identity: None, ..k.clone() }, c, e);
            }
            merged.0
        });
        let direct = merged.is_none().then(|| self.0.iter().map(|(k, (c, e))| k.stack(*c, *e)));
        merged.into_iter().flatten().map(|(k, (c, e))| k.stack(c, e)).chain(direct.into_iter().flatten())
    }

    /// The stacks, each with the index of its identity.
    fn stacks_by_identity(&self) -> impl Iterator<Item = (Stack, Option<u32>)> + '_ {
        self.0.iter().map(|(k, (c, e))| (k.stack(*c, *e), k.identity))
    }
}

/// The fast stratum's error terms of the folded processes
/// (`assemble::sampling` adds them to the live ones').
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct FastSums {
    pub var: f64,
    pub fast: u64,
    pub samples: u64,
    pub sampled_ns: u64,
    pub unweighted: i64,
}

impl FastSums {
    /// Adds a process's fast stratum (`assemble::fast_stratum`).
    pub(crate) fn add(&mut self, st: &vmtrace_common::FaultStats) {
        let (fast, var) = super::assemble::fast_stratum(st);
        self.var += var;
        self.fast += fast;
        self.samples += st.minor_sampled;
        self.sampled_ns += st.minor_sampled_ns;
        self.unweighted += super::assemble::unweighted_fast(st);
    }
}

/// Everything the recording keeps of the processes it folded away.
#[derive(Default)]
pub(crate) struct FoldedAway {
    row: Option<Process>,
    names: HashMap<String, u64>,
    stacks: StackSums,
    resident_end: StackSums,
    resident_peak: StackSums,
    resident_live_pages: u64,
    sites: HashMap<(String, Frames, Option<u32>), (u64, u64)>,
    /// The identities kept (`MAX_IDENTITIES`), by index.
    identities: Vec<Arc<Identity>>,
    pub fast: FastSums,
    /// Their kernel counters summed, for the live views that cover the
    /// whole trace (`serve`: `Session::live_snapshot`).
    counters: Option<(vmtrace_common::FaultStats, vmtrace_common::MmStats)>,
}

impl FoldedAway {
    /// Processes folded away so far.
    pub(crate) fn processes(&self) -> u64 {
        self.row.as_ref().map_or(0, |r| r.folded)
    }

    /// Adds a process's kernel counters.
    pub(crate) fn add_counters(&mut self, st: &vmtrace_common::FaultStats, mm: &vmtrace_common::MmStats) {
        use vmtrace_common::Merge as _;
        let c = self.counters.get_or_insert_with(Default::default);
        c.0.merge(st);
        c.1.merge(mm);
    }

    /// The summed kernel counters of the processes folded away, if any.
    pub(crate) fn counters(&self) -> Option<&(vmtrace_common::FaultStats, vmtrace_common::MmStats)> {
        self.counters.as_ref()
    }

    /// Adds a process's row (as the summary would list it).
    pub(crate) fn add_row(&mut self, p: &Process) {
        let row = self.row.get_or_insert_with(|| fold::empty_other(p.kernel_accounting.is_some()));
        let mut one = HashMap::default();
        fold::add_to_other(row, p, &mut one);
        for (name, n) in one {
            let name = if self.names.len() < MAX_NAMES || self.names.contains_key(&name) {
                name
            } else {
                fold::OTHER_NAMES.to_string()
            };
            *self.names.entry(name).or_default() += n;
        }
    }

    /// The index of `id` among the identities kept, if it is or can be.
    fn keep(&mut self, id: Option<&Arc<Identity>>) -> Option<u32> {
        let id = id?;
        let at = match self.identities.iter().position(|k| k == id) {
            Some(at) => at,
            None if self.identities.len() < MAX_IDENTITIES => {
                self.identities.push(Arc::clone(id));
                self.identities.len() - 1
            }
            None => return None,
        };
        u32::try_from(at).ok()
    }

    /// The identity indices of `pids`.
    fn kept(
        &mut self,
        pids: impl Iterator<Item = u32>,
        identity_of: &dyn Fn(u32) -> Option<Arc<Identity>>,
    ) -> HashMap<u32, u32> {
        let mut out = HashMap::default();
        for pid in pids {
            if out.contains_key(&pid) {
                continue;
            }
            if let Some(at) = self.keep(identity_of(pid).as_ref()) {
                out.insert(pid, at);
            }
        }
        out
    }

    /// Adds a process's fault stacks, weighed against its totals already,
    /// each under its process's identity (`identity_of` its pid).
    pub(crate) fn add_stacks(&mut self, stacks: Vec<Stack>, identity_of: &dyn Fn(u32) -> Option<Arc<Identity>>) {
        let kept = self.kept(stacks.iter().map(|s| s.pid), identity_of);
        self.stacks.add(stacks, &|pid| kept.get(&pid).copied());
    }

    /// Adds a process's resident profiles (weighed in bytes) and the
    /// sampled pages it held at its end.
    pub(crate) fn add_resident(&mut self, end: Vec<Stack>, peak: Vec<Stack>, live_pages: u64) {
        self.resident_end.add(end, &|_| None);
        self.resident_peak.add(peak, &|_| None);
        self.resident_live_pages += live_pages;
    }

    /// Adds a process's mmap-family call sites, each under its process's
    /// identity.
    pub(crate) fn add_sites(&mut self, sites: Vec<MmSite>, identity_of: &dyn Fn(u32) -> Option<Arc<Identity>>) {
        let kept = self.kept(sites.iter().map(|s| s.pid), identity_of);
        for s in sites {
            let id = kept.get(&s.pid).copied();
            let e = self.sites.entry((s.comm, without_addresses(&s.frames), id)).or_default();
            e.0 += s.calls;
            e.1 += s.ipis;
        }
    }

    /// The "other" process row, its names counted (all of them, for the
    /// end's fold to add to).
    pub(crate) fn row(&self) -> Option<Process> {
        let mut row = self.row.clone()?;
        row.folded_comms = self.names.iter().map(|(k, v)| (k.clone(), *v)).collect::<BTreeMap<_, _>>();
        Some(row)
    }

    /// The folded fault stacks, under the other process.
    pub(crate) fn fault_stacks(&self) -> impl Iterator<Item = Stack> + '_ {
        self.stacks.stacks()
    }

    /// The folded resident profiles (end, peak) and sampled pages at the end.
    pub(crate) fn resident(&self) -> (Vec<Stack>, Vec<Stack>, u64) {
        (self.resident_end.stacks().collect(), self.resident_peak.stacks().collect(), self.resident_live_pages)
    }

    /// The folded mmap-family call sites, under the other process.
    pub(crate) fn sites(&self) -> impl Iterator<Item = MmSite> + '_ {
        let mut merged: HashMap<(&String, &Frames), (u64, u64)> = HashMap::default();
        for ((comm, frames, _), (calls, ipis)) in &self.sites {
            let e = merged.entry((comm, frames)).or_default();
            e.0 += calls;
            e.1 += ipis;
        }
        merged.into_iter().map(|((comm, frames), (calls, ipis))| MmSite {
            pid: fold::OTHER_PID,
            comm: comm.clone(),
            frames: frames.clone(),
            calls,
            ipis,
        })
    }

    /// The folded fault stacks and call sites for the live profiles: those
    /// of a kept identity under its pid (`FOLDED_IDENTITY_PIDS + index`),
    /// the others under the other process.
    pub(crate) fn by_identity(&self) -> (Vec<Stack>, Vec<MmSite>) {
        let pid = |id: Option<u32>| id.map_or(fold::OTHER_PID, |i| FOLDED_IDENTITY_PIDS + i);
        let stacks = self.stacks.stacks_by_identity().map(|(s, id)| Stack { pid: pid(id), ..s }).collect();
        let sites = self
            .sites
            .iter()
            .map(|((comm, frames, id), (calls, ipis))| MmSite {
                pid: pid(*id),
                comm: comm.clone(),
                frames: frames.clone(),
                calls: *calls,
                ipis: *ipis,
            })
            .collect();
        (stacks, sites)
    }

    /// The identity of a pid `by_identity` gave.
    pub(crate) fn identity_of(&self, pid: u32) -> Option<&Arc<Identity>> {
        self.identities.get(usize::try_from(pid.checked_sub(FOLDED_IDENTITY_PIDS)?).ok()?)
    }

    /// Distinct stacks and sites held (for the debug log).
    pub(crate) fn sizes(&self) -> (usize, usize, usize) {
        (self.stacks.0.len(), self.resident_end.0.len() + self.resident_peak.0.len(), self.sites.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtrace_common::StackCounts;

    fn stack(pid: u32, comm: &str, leaf: &str, faults: u64, estimate: f64) -> Stack {
        Stack {
            pid,
            comm: comm.into(),
            user: vec![Frame::from("main"), Frame::from(leaf)].into(),
            counts: StackCounts { faults, ..StackCounts::default() },
            estimate: Estimate { faults: estimate, ..Estimate::default() },
            ..Stack::default()
        }
    }

    #[test]
    fn stacks_of_one_name_and_frames_add_up_under_the_other_process() {
        let mut f = FoldedAway::default();
        f.add_stacks(vec![stack(10, "sh", "a", 2, 20.0), stack(10, "sh", "b", 1, 5.0)], &|_| None);
        f.add_stacks(vec![stack(11, "sh", "a", 3, 7.0), stack(12, "true", "a", 1, 1.0)], &|_| None);
        let mut out: Vec<(String, String, u64, f64, u32)> = f
            .fault_stacks()
            .map(|s| (s.comm.clone(), s.user[1].to_string(), s.counts.faults, s.estimate.faults, s.pid))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        assert_eq!(
            out,
            [
                ("sh".into(), "a".into(), 5, 27.0, 0),
                ("sh".into(), "b".into(), 1, 5.0, 0),
                ("true".into(), "a".into(), 1, 1.0, 0)
            ]
        );
        assert!(f.fault_stacks().all(|s| s.stratum & WEIGHED != 0));
    }

    #[test]
    fn the_lightest_folded_stacks_add_into_one_per_name() {
        let mut sums = StackSums::default();
        let mut all = Vec::new();
        for i in 0..30u32 {
            let comm = if i % 2 == 0 { "python3" } else { "sh" };
            all.push(stack(100 + i, comm, &format!("line{i}"), u64::from(i) + 1, f64::from(i) + 1.0));
        }
        sums.add(all, &|_| None);
        sums.compact(10);
        let out: Vec<Stack> = sums.stacks().collect();
        // The 10 heaviest (estimates 21..=30), and one lighter stack per name.
        assert_eq!(out.len(), 12);
        let faults: u64 = out.iter().map(|s| s.counts.faults).sum();
        assert_eq!(faults, (1..=30).sum::<u64>());
        let lighter: Vec<&Stack> = out.iter().filter(|s| &*s.user[0] == LIGHTER).collect();
        assert_eq!(lighter.len(), 2);
        let of = |c: &str| lighter.iter().find(|s| s.comm == c).unwrap().counts.faults;
        // 1..=20: the odd ones are python3's (i even), the even ones sh's.
        assert_eq!((of("python3"), of("sh")), ((1..=20).step_by(2).sum::<u64>(), (2..=20).step_by(2).sum::<u64>()));
        assert!(out.iter().filter(|s| &*s.user[0] != LIGHTER).all(|s| s.estimate.faults > 20.0));
    }

    /// uc32 (issue #36): serve's cumulative profiles labelled the samples
    /// of exited processes with their name only. The folded keep their
    /// identity (rank here) apart for the live profiles; the recording's
    /// end (`fault_stacks`, `sites`) sees one stack and site as before.
    #[test]
    fn folded_stacks_keep_their_processes_identity_apart() {
        let rank = |r: u32| {
            Arc::new(Identity {
                cgroup: Some("/job".into()),
                rank: Some(crate::model::Rank { rank: Some(r), ..Default::default() }),
                ..Identity::default()
            })
        };
        let (r3, r4) = (rank(3), rank(4));
        let of = |pid: u32| Some(Arc::clone(if pid == 10 { &r3 } else { &r4 }));
        let mut f = FoldedAway::default();
        f.add_stacks(vec![stack(10, "python", "a", 2, 20.0), stack(11, "python", "a", 3, 30.0)], &of);
        let frames: Frames = vec![Frame::from("python"), Frame::from("[mmap]")].into();
        let sites =
            [10, 11].map(|pid| MmSite { pid, comm: "python".into(), frames: frames.clone(), calls: 1, ipis: 0 });
        f.add_sites(Vec::from(sites), &of);
        assert_eq!(f.fault_stacks().count(), 1);
        assert_eq!(f.fault_stacks().map(|s| s.counts.faults).sum::<u64>(), 5);
        assert_eq!(f.sites().count(), 1);
        let (stacks, sites) = f.by_identity();
        let mut got: Vec<(Option<u32>, u64)> =
            stacks.iter().map(|s| (f.identity_of(s.pid).and_then(|i| i.rank_number()), s.counts.faults)).collect();
        got.sort_unstable();
        assert_eq!(got, [(Some(3), 2), (Some(4), 3)]);
        assert!(stacks.iter().all(|s| s.pid >= FOLDED_IDENTITY_PIDS));
        assert_eq!(sites.len(), 2);
        assert!(f.identity_of(fold::OTHER_PID).is_none());
    }

    #[test]
    fn raw_addresses_of_processes_folded_away_merge() {
        let mut f = FoldedAway::default();
        for (pid, addr) in [(10, "[unknown] 0x7f01922589b3"), (11, "[unknown] 0x7f55aa2589b3")] {
            let mut s = stack(pid, "bash", "a", 1, 1.0);
            s.user = vec![Frame::from("main"), Frame::from(addr)].into();
            f.add_stacks(vec![s], &|_| None);
            let frames: Frames = vec![Frame::from("bash"), Frame::from(addr), Frame::from("[mmap]")].into();
            f.add_sites(vec![MmSite { pid, comm: "bash".into(), frames, calls: 2, ipis: 1 }], &|_| None);
        }
        let stacks: Vec<Stack> = f.fault_stacks().collect();
        assert_eq!(stacks.len(), 1);
        assert_eq!((&*stacks[0].user[1], stacks[0].counts.faults), (UNKNOWN, 2));
        let sites: Vec<MmSite> = f.sites().collect();
        assert_eq!(sites.len(), 1);
        assert_eq!((&*sites[0].frames[1], sites[0].calls, sites[0].ipis), (UNKNOWN, 4, 2));
    }

    #[test]
    fn rows_add_and_every_name_is_counted() {
        let mut f = FoldedAway::default();
        for (pid, comm, faults) in [(10, "sh", 5), (11, "sh", 7), (12, "true", 1)] {
            let mut p = fold::empty_other(true);
            (p.pid, p.comm, p.faults.total) = (pid, comm.into(), faults);
            f.add_row(&p);
        }
        let row = f.row().unwrap();
        assert_eq!((row.pid, row.folded, row.faults.total), (fold::OTHER_PID, 3, 13));
        assert_eq!(row.folded_comms, BTreeMap::from([("sh".into(), 2), ("true".into(), 1)]));
        assert_eq!(f.processes(), 3);
    }
}
