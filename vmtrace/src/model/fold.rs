//! Bounded summaries for long recordings: processes and regions below a
//! share of the faults and of the fault time are folded into "other" rows
//! that keep their counts, so every total still adds up (a process's
//! regions to its faults, the processes to `totals`). A ten-minute `-a`
//! recording has thousands of processes and ~10⁵ regions; almost all of
//! them hold a sliver of the faults (docs/performance.md, "Output sizes").
use crate::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{CowFrom, Faults, KernelAccounting, Process, RegionKind, RegionSummary, Summary};

/// The pid of the row the folded processes add into.
pub const OTHER_PID: u32 = 0;
/// The heaviest processes (by faults, and by time) are always listed, so a
/// short recording keeps every row.
pub const KEEP_TOP_PROCESSES: usize = 20;
/// The same for regions.
pub const KEEP_TOP_REGIONS: usize = 100;
/// The names counted in the "other" process row's `folded_comms`.
const FOLDED_COMMS: usize = 20;

/// summary.json `folding`: what the "other" rows hold.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Folding {
    /// Rows under this percentage of all faults and of all fault time were
    /// folded (`record --fold-below`).
    pub below_pct: f64,
    /// Processes summed in the `pid` 0 "other" row.
    pub processes: u64,
    /// Regions summed in "other" rows (`folded` > 0).
    pub regions: u64,
    /// Of `processes`, those folded while recording (a system-wide
    /// recording folds an exited process it is sure to fold once it has
    /// symbolized its stacks, so that the collector's memory follows what
    /// is live: `collect::folded`).
    #[serde(default)]
    pub while_recording: u64,
}

/// Folds the small processes and regions of `s` (below `below_pct` percent
/// of the faults and of the time). Never folds the target, a process named by
/// a storm or an OOM kill, nor a lone row (folding one row saves nothing,
/// unless an "other" row folded while recording takes it).
/// `below_pct` 0 keeps every row.
pub fn fold(s: &mut Summary, below_pct: f64) {
    if below_pct <= 0.0 {
        return;
    }
    let mut pinned: BTreeSet<u32> = s.target.pid.into_iter().collect();
    pinned.extend(s.storms.iter().flatten().map(|st| st.pid));
    pinned.extend(s.oom.iter().flatten().flat_map(|o| [o.victim_pid, o.trigger_pid]));
    let folded_pids = fold_processes(&mut s.processes, below_pct, &pinned);
    let mut folded_regions = 0;
    if let Some(regions) = s.regions.as_mut() {
        folded_regions = fold_regions(regions, below_pct, &folded_pids);
    }
    // The other row's own count: a refolded "other" row stands for many.
    // (one folded while recording holds processes too).
    let processes = s.processes.iter().find(|p| p.pid == OTHER_PID).map_or(0, |p| p.folded);
    let while_recording = s.folding.as_ref().map_or(0, |f| f.while_recording);
    if processes + folded_regions > 0 {
        s.folding = Some(Folding { below_pct, processes, regions: folded_regions, while_recording });
    }
}

/// Whether `f` holds at least `pct` percent of the faults or of the time.
/// A total of zero (`--latency-sample 0` leaves minor faults untimed) makes
/// no row heavy by it.
fn heavy(f: &Faults, total: u64, time_ns: u64, pct: f64) -> bool {
    let share = |x: u64, of: u64| of > 0 && x as f64 * 100.0 >= of as f64 * pct;
    share(f.total, total) || share(f.time_ns, time_ns)
}

/// Indices of the `n` heaviest rows by faults and the `n` by time.
fn top(faults: &[&Faults], n: usize) -> BTreeSet<usize> {
    let mut idx: Vec<usize> = (0..faults.len()).collect();
    let mut keep = BTreeSet::new();
    idx.sort_by_key(|&i| std::cmp::Reverse(faults[i].total));
    keep.extend(idx.iter().take(n));
    idx.sort_by_key(|&i| std::cmp::Reverse(faults[i].time_ns));
    keep.extend(idx.iter().take(n));
    keep
}

/// Replaces the small processes by one "other" row; returns their pids.
fn fold_processes(procs: &mut Vec<Process>, pct: f64, pinned: &BTreeSet<u32>) -> BTreeSet<u32> {
    let all: Vec<&Faults> = procs.iter().map(|p| &p.faults).collect();
    let (total, time_ns) = (all.iter().map(|f| f.total).sum(), all.iter().map(|f| f.time_ns).sum());
    // An "other" row folded while recording takes no place among the
    // heaviest: it is folded into again.
    let fresh: Vec<usize> = (0..procs.len()).filter(|&i| procs[i].folded == 0).collect();
    let fresh_faults: Vec<&Faults> = fresh.iter().map(|&i| &procs[i].faults).collect();
    let keep: BTreeSet<usize> = top(&fresh_faults, KEEP_TOP_PROCESSES).into_iter().map(|j| fresh[j]).collect();
    let mut fold: BTreeSet<u32> = procs
        .iter()
        .enumerate()
        .filter(|(i, p)| !keep.contains(i) && !pinned.contains(&p.pid) && !heavy(&p.faults, total, time_ns, pct))
        .map(|(_, p)| p.pid)
        .collect();
    // A real row with the other row's pid would make two rows of one pid;
    // and a lone row folds into an "other" row folded while recording
    // (one row fewer).
    if procs.iter().any(|p| p.pid == OTHER_PID) {
        fold.insert(OTHER_PID);
    }
    if fold.len() < 2 {
        return BTreeSet::new();
    }
    let (folded, kept): (Vec<Process>, Vec<Process>) =
        std::mem::take(procs).into_iter().partition(|p| fold.contains(&p.pid));
    *procs = kept;
    procs.push(other_process(&folded));
    fold
}

/// The sum of `folded` as one row: counts add, identities are dropped.
fn other_process(folded: &[Process]) -> Process {
    let mut o = empty_other(folded.iter().all(|p| p.kernel_accounting.is_some()));
    let mut comms: HashMap<String, u64> = HashMap::default();
    for p in folded {
        add_to_other(&mut o, p, &mut comms);
    }
    o.folded_comms = top_comms(&comms, FOLDED_COMMS);
    o
}

/// An "other" row with nothing in it yet; `kernel_accounting`: whether
/// every process it will hold has the kernel's own fault counts.
pub fn empty_other(kernel_accounting: bool) -> Process {
    Process {
        pid: OTHER_PID,
        ppid: None,
        comm: "other".into(),
        cmdline: None,
        exit_code: None,
        faults: Faults::default(),
        reclaim: super::Reclaim::default(),
        migration: super::Migration::default(),
        mmap: None,
        tlb: None,
        kernel_accounting: kernel_accounting.then_some(KernelAccounting { minor: 0, major: 0 }),
        cow_from: None,
        folded: 0,
        folded_comms: BTreeMap::new(),
        resident: None,
        identity: super::Identity::default(),
    }
}

/// Adds `p` into the "other" row `o`, its name into `comms` (an "other" row
/// folded again brings its own count and names).
pub(crate) fn add_to_other(o: &mut Process, p: &Process, comms: &mut HashMap<String, u64>) {
    o.faults.add(&p.faults);
    o.reclaim.stalls += p.reclaim.stalls;
    o.reclaim.time_ns += p.reclaim.time_ns;
    o.migration.add(&p.migration);
    if let Some(m) = &p.mmap {
        o.mmap.get_or_insert_with(Default::default).add(m);
    }
    if let Some(t) = &p.tlb {
        o.tlb.get_or_insert_with(Default::default).add(t);
    }
    match (o.kernel_accounting.as_mut(), p.kernel_accounting) {
        (Some(sum), Some(k)) => {
            sum.minor += k.minor;
            sum.major += k.major;
        }
        _ => o.kernel_accounting = None,
    }
    if let Some(c) = &p.cow_from {
        o.cow_from.get_or_insert_with(CowFrom::default).add(c);
    }
    if let Some(r) = &p.resident {
        let sum = o.resident.get_or_insert_with(|| super::Resident { exited: true, ..Default::default() });
        sum.add(r);
    }
    o.folded += p.folded.max(1);
    if p.folded > 0 && !p.folded_comms.is_empty() {
        let named: u64 = p.folded_comms.values().sum();
        for (c, n) in &p.folded_comms {
            *comms.entry(c.clone()).or_default() += n;
        }
        if p.folded > named {
            *comms.entry(OTHER_NAMES.into()).or_default() += p.folded - named;
        }
    } else {
        *comms.entry(p.comm.clone()).or_default() += p.folded.max(1);
    }
}

/// The name counted for folded processes whose names were not kept.
pub const OTHER_NAMES: &str = "[other names]";

/// The `n` names counted most (ties by name), the rest summed under
/// `OTHER_NAMES`: the counts still add up to the processes folded.
fn top_comms(comms: &HashMap<String, u64>, n: usize) -> BTreeMap<String, u64> {
    let mut by_count: Vec<(&String, &u64)> = comms.iter().filter(|(c, _)| *c != OTHER_NAMES).collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let rest: u64 =
        by_count.iter().skip(n).map(|(_, k)| **k).sum::<u64>() + comms.get(OTHER_NAMES).copied().unwrap_or(0);
    let mut top: BTreeMap<String, u64> = by_count.into_iter().take(n).map(|(c, k)| (c.clone(), *k)).collect();
    if rest > 0 {
        top.insert(OTHER_NAMES.into(), rest);
    }
    top
}

/// The "other" row a folded region adds into: per process, per kind, and per
/// named kind of mapping (`[thread stack]`, `[malloc arena]`, `[heap]`…);
/// the regions of folded processes into the other process's, per kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct GroupKey {
    pid: u32,
    kind: u8,
    label: Option<String>,
}

/// Folds the small regions into "other" rows; returns how many it folded.
fn fold_regions(regions: &mut Vec<RegionSummary>, pct: f64, folded_pids: &BTreeSet<u32>) -> u64 {
    let (total, time_ns) =
        (regions.iter().map(|r| r.faults.total).sum(), regions.iter().map(|r| r.faults.time_ns).sum());
    // Rows folded already (while recording, or by an earlier fold) are
    // "other" rows: never listed as heavy, they add into their group.
    let fresh: Vec<usize> = (0..regions.len()).filter(|&i| regions[i].folded == 0).collect();
    let all: Vec<&Faults> = fresh.iter().map(|&i| &regions[i].faults).collect();
    let keep: BTreeSet<usize> = top(&all, KEEP_TOP_REGIONS).into_iter().map(|j| fresh[j]).collect();
    let mut groups: BTreeMap<GroupKey, Vec<RegionSummary>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, r) in std::mem::take(regions).into_iter().enumerate() {
        // A pid-0 row folded while recording adds into the other process's.
        let key = if folded_pids.contains(&r.pid) || (r.pid == OTHER_PID && r.folded > 0) {
            GroupKey { pid: OTHER_PID, kind: r.kind as u8, label: None }
        } else if r.folded == 0 && (keep.contains(&i) || heavy(&r.faults, total, time_ns, pct)) {
            out.push(r);
            continue;
        } else {
            let label = r.path.clone().filter(|p| p.starts_with('['));
            GroupKey { pid: r.pid, kind: r.kind as u8, label }
        };
        groups.entry(key).or_default().push(r);
    }
    let mut folded = 0;
    for (key, mut rows) in groups {
        // A lone region of a listed process stays as it is (one folded
        // already while recording still counts what it holds).
        if rows.len() == 1 && key.pid != OTHER_PID {
            folded += rows[0].folded;
            out.append(&mut rows);
            continue;
        }
        folded += rows.iter().map(|r| r.folded.max(1)).sum::<u64>();
        out.push(other_region(key.pid, key.label, &rows));
    }
    // Back in the order of the table: by fault time, then faults.
    out.sort_by(|x, y| y.faults.time_ns.cmp(&x.faults.time_ns).then(y.faults.total.cmp(&x.faults.total)));
    *regions = out;
    folded
}

/// Folds the rows `foldable` picks as [`fold`] would at the end, for rows
/// the end's fold is sure to fold (a recording folds an exited process's
/// small regions as it retires it): per (process, kind, named kind), a lone
/// row staying as it is.
pub fn fold_rows(rows: Vec<RegionSummary>, foldable: impl Fn(&RegionSummary) -> bool) -> Vec<RegionSummary> {
    let mut groups: BTreeMap<GroupKey, Vec<RegionSummary>> = BTreeMap::new();
    let mut out = Vec::new();
    for r in rows {
        if !foldable(&r) {
            out.push(r);
            continue;
        }
        let label = r.path.clone().filter(|p| p.starts_with('['));
        groups.entry(GroupKey { pid: r.pid, kind: r.kind as u8, label }).or_default().push(r);
    }
    for (key, mut rows) in groups {
        if rows.len() == 1 {
            out.append(&mut rows);
        } else {
            out.push(other_region(key.pid, key.label, &rows));
        }
    }
    out
}

pub(crate) fn other_region(pid: u32, label: Option<String>, rows: &[RegionSummary]) -> RegionSummary {
    let mut faults = Faults::default();
    let mut cow = CowFrom::default();
    let (mut pages, mut n) = (0, 0);
    for r in rows {
        faults.add(&r.faults);
        pages += r.pages_touched;
        n += r.folded.max(1);
        if let Some(c) = &r.cow_from {
            cow.add(c);
        }
    }
    RegionSummary {
        pid,
        start: "0x0".into(),
        end: "0x0".into(),
        perms: union_perms(rows.iter().map(|r| r.perms.as_str())),
        kind: rows.first().map_or(RegionKind::Other, |r| r.kind),
        path: label,
        offset: 0,
        faults,
        pages_touched: pages,
        cow_from: (cow.total() > 0).then_some(cow),
        folded: n,
    }
}

/// The permissions any of the rows had (`rw-p` and `r-xp` give `rwxp`); the
/// last letter `p`/`s` when all agree, else `*`.
fn union_perms<'a>(perms: impl Iterator<Item = &'a str>) -> String {
    let mut out = *b"---?";
    for p in perms {
        for (i, c) in p.bytes().take(4).enumerate() {
            if i < 3 && c != b'-' {
                out[i] = c;
            } else if i == 3 {
                out[3] = match out[3] {
                    b'?' => c,
                    same if same == c => c,
                    _ => b'*',
                };
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[path = "fold_tests.rs"]
pub(crate) mod tests;
