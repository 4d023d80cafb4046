//! Which track each part of the model goes on, and in what order.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::{self, Write},
};

use super::{
    arg, counter, instant, major_fault_sample, named_track, process_track, slice_begin, slice_end, thread_track,
    with_callstack, Arg, Writer,
};
use crate::model::{
    trace::{CounterPoint, ResidentPoint, TaskKind, TraceLog},
    Cum, Summary,
};

/// Track uuids: a kind in the top byte, the id below (tids and pids fit in 32 bits).
const PROCESS: u64 = 1 << 56;
const THREAD: u64 = 2 << 56;
const COUNTER: u64 = 3 << 56;
const CPU: u64 = 4 << 56;
const STORMS: u64 = 5 << 56;
/// A process's bytes on a NUMA node: the pid above the node (node ids are
/// below 1024, the kernel's largest `MAX_NUMNODES`).
const NODE: u64 = 6 << 56;
/// The traced processes' bytes on a node.
const NODE_TOTAL: u64 = 7 << 56;
/// numa_maps pages as `NodePoint` counts them.
const NODE_PAGE: u64 = 4096;

pub(super) fn process_uuid(pid: u32) -> u64 {
    PROCESS | u64::from(pid)
}

pub(super) fn thread_uuid(tid: u32) -> u64 {
    THREAD | u64::from(tid)
}

/// A per-process counter: its track's name, its unit, and what of an
/// interval's growth it shows per second.
pub(super) type Counter = (&'static str, &'static str, fn(&Cum) -> f64);

pub(super) const COUNTERS: [Counter; 5] = [
    ("faults/s", "faults/s", |c| c.faults as f64),
    ("major faults/s", "faults/s", |c| c.major as f64),
    ("COW faults/s", "faults/s", |c| c.cow as f64),
    // ns per s / 1e7 = % of one CPU, as `top` shows it.
    ("fault handler % CPU", "%", |c| c.time_ns as f64 / 1e7),
    ("shootdown IPIs sent/s", "IPIs/s", |c| c.ipis as f64),
];

/// A per-process resident memory track: its name and which bytes of a
/// point it shows. Their uuids follow `COUNTERS`' (`RESIDENT_UUID` + index).
pub type ResidentCounter = (&'static str, fn(&ResidentPoint) -> u64);

pub const RESIDENT: [ResidentCounter; 4] = [
    ("resident bytes", ResidentPoint::total),
    ("resident anon bytes", |p| p.anon),
    ("resident file bytes", |p| p.file),
    ("resident shmem bytes", |p| p.shmem),
];
const RESIDENT_UUID: usize = 16;

pub fn counter_uuid(pid: u32, kind: usize) -> u64 {
    COUNTER | u64::from(pid) << 8 | kind as u64
}

pub(super) fn cpu_uuid(cpu: u32) -> u64 {
    CPU | u64::from(cpu)
}

pub(super) fn node_uuid(pid: u32, node: u32) -> u64 {
    NODE | u64::from(pid) << 16 | u64::from(node & 0xffff)
}

pub(super) fn node_total_uuid(node: u32) -> u64 {
    NODE_TOTAL | u64::from(node)
}

/// One timed event, sorted before writing: at one instant slices end before
/// others begin, outer slices begin first and inner ones end first. 32
/// bytes, one per packet: the index the writer sorts, the events themselves
/// stay in the log.
struct Timed {
    ts: u64,
    tie: i64,
    what: What,
    rank: u8,
}

/// An event by its index in the log (or the summary's storms and OOM kills).
#[derive(Clone, Copy)]
enum What {
    Major(u32),
    /// A major fault's stack as a callstack sample.
    Sample(u32),
    Mm(u32),
    Storm(u32),
    EndMajor(u32),
    EndMm(u32),
    EndStorm(u32),
    Task(u32),
    Oom(u32),
    /// `COUNTERS[k]` of a counter point, or 0 where the next interval has none.
    Counter {
        point: u32,
        k: u8,
        zero: bool,
    },
    Cpu {
        point: u32,
        zero: bool,
    },
    /// `RESIDENT[k]` of a resident point.
    Resident {
        point: u32,
        k: u8,
    },
    /// A process's pages on a node (`log.nodes`), its exit, the sum of all.
    Node(u32),
    NodeEnd(u32),
    NodeTotal(u32),
}
const _: () = assert!(std::mem::size_of::<Timed>() == 32);

const END: u8 = 0;
const POINT: u8 = 1;
const BEGIN: u8 = 2;

impl Timed {
    fn slice(ts: u64, dur: u64, begin: What, end: What) -> [Timed; 2] {
        // A slice of no length would end before it begins in this order.
        let end_ts = ts + dur.max(1);
        [
            Timed { ts, rank: BEGIN, tie: -(dur as i64), what: begin },
            Timed { ts: end_ts, rank: END, tie: -(ts as i64), what: end },
        ]
    }

    fn point(ts: u64, what: What) -> Timed {
        Timed { ts, rank: POINT, tie: 0, what }
    }
}

/// Writes the whole trace: clocks, then every track, then the events in time order.
pub fn render<W: Write>(w: &mut Writer<W>, summary: &Summary, log: &TraceLog) -> io::Result<()> {
    w.clocks()?;
    let storms = summary.storms.as_deref().unwrap_or_default();
    let ooms = summary.oom.as_deref().unwrap_or_default();
    let nodes = node_series(log);
    tracks(w, summary, log, &nodes)?;
    for t in timeline(summary, log, &nodes) {
        let at = |i: u32| i as usize;
        let e = match t.what {
            What::Major(i) => {
                let m = &log.majors[at(i)];
                let args = vec![arg("address", Arg::Pointer(m.addr)), arg("duration_ns", Arg::Uint(m.dur_ns))];
                with_callstack(slice_begin(thread_uuid(m.tid), "major fault", args), &m.stack)
            }
            What::Sample(i) => {
                let m = &log.majors[at(i)];
                w.stack_sample(t.ts, major_fault_sample(m.tgid, m.tid, &m.stack, m.dur_ns))?;
                continue;
            }
            What::Mm(i) => {
                let m = &log.mm_changes[at(i)];
                let args = vec![arg("address", Arg::Pointer(m.addr)), arg("length", Arg::Uint(m.len))];
                slice_begin(thread_uuid(m.tid), m.call, args)
            }
            What::Storm(i) => {
                let s = &storms[at(i)];
                let args = vec![
                    arg("shootdowns", Arg::Uint(s.shootdowns)),
                    arg("peak_per_s", Arg::Uint(s.peak_per_s)),
                    arg("top_call", Arg::Str(s.top_call.clone())),
                    arg("top_share", Arg::Float(s.top_share)),
                    arg("culprit_stack", Arg::Strings(s.top_stack.clone())),
                ];
                with_callstack(slice_begin(STORMS | u64::from(s.pid), "shootdown storm", args), &s.top_stack)
            }
            What::EndMajor(i) => slice_end(thread_uuid(log.majors[at(i)].tid)),
            What::EndMm(i) => slice_end(thread_uuid(log.mm_changes[at(i)].tid)),
            What::EndStorm(i) => slice_end(STORMS | u64::from(storms[at(i)].pid)),
            What::Task(i) => task_instant(log, at(i)),
            What::Oom(i) => {
                let o = &ooms[at(i)];
                let mut args = vec![
                    arg("victim_pid", Arg::Uint(u64::from(o.victim_pid))),
                    arg("victim_comm", Arg::Str(o.victim_comm.clone())),
                    arg("trigger_pid", Arg::Uint(u64::from(o.trigger_pid))),
                    arg("constraint", Arg::Str(o.constraint.clone())),
                ];
                // Left out where the kernel's record has no sizes (read as 0).
                if o.known("anon_rss_kb") {
                    args.push(arg("anon_rss_kb", Arg::Uint(o.anon_rss_kb)));
                }
                instant(process_uuid(o.victim_pid), "OOM kill", args)
            }
            What::Counter { point, k, zero } => {
                let p = &log.counters[at(point)];
                let (_, _, value) = COUNTERS[usize::from(k)];
                let per_s = if zero { 0.0 } else { value(&p.delta) * 1e9 / p.dur_ns.max(1) as f64 };
                counter(counter_uuid(p.pid, usize::from(k)), per_s)
            }
            What::Resident { point, k } => {
                let p = &log.resident[at(point)];
                counter(counter_uuid(p.pid, RESIDENT_UUID + usize::from(k)), RESIDENT[usize::from(k)].1(p) as f64)
            }
            What::Node(i) => {
                let p = &log.nodes[at(i)];
                counter(node_uuid(p.pid, p.node), (p.pages * NODE_PAGE) as f64)
            }
            What::NodeEnd(i) => {
                let (_, pid, node) = nodes.ends[at(i)];
                counter(node_uuid(pid, node), 0.0)
            }
            What::NodeTotal(i) => {
                let (_, node, pages) = nodes.totals[at(i)];
                counter(node_total_uuid(node), (pages * NODE_PAGE) as f64)
            }
            What::Cpu { point, zero } => {
                let p = &log.cpu_ipis[at(point)];
                let per_s = if zero { 0.0 } else { p.received as f64 * 1e9 / p.dur_ns.max(1) as f64 };
                counter(cpu_uuid(p.cpu), per_s)
            }
        };
        w.event(t.ts, e)?;
    }
    Ok(())
}

/// Every event of the trace, in the order written.
fn timeline(summary: &Summary, log: &TraceLog, nodes: &NodeSeries) -> Vec<Timed> {
    let storms = summary.storms.as_deref().unwrap_or_default();
    let ooms = summary.oom.as_deref().unwrap_or_default();
    // Indices fit in u32: the log holds at most `TraceLog::MAX_COUNTERS` of a kind.
    let mut timed = Vec::new();
    for (i, m) in (0u32..).zip(&log.majors) {
        timed.extend(Timed::slice(m.ts_ns, m.dur_ns, What::Major(i), What::EndMajor(i)));
        if !m.stack.is_empty() {
            timed.push(Timed::point(m.ts_ns, What::Sample(i)));
        }
    }
    for (i, m) in (0u32..).zip(&log.mm_changes) {
        timed.extend(Timed::slice(m.ts_ns, m.dur_ns, What::Mm(i), What::EndMm(i)));
    }
    for (i, s) in (0u32..).zip(storms) {
        let (start, end) = (log.at(s.start_s), log.at(s.end_s));
        timed.extend(Timed::slice(start, end.saturating_sub(start), What::Storm(i), What::EndStorm(i)));
    }
    for (i, t) in (0u32..).zip(&log.tasks) {
        timed.push(Timed::point(t.ts_ns, What::Task(i)));
    }
    for (i, o) in (0u32..).zip(ooms) {
        timed.push(Timed::point(log.at(o.time_s), What::Oom(i)));
    }
    counter_points(&mut timed, &log.counters);
    let resident = resident_tracks(&log.resident);
    for (point, p) in (0u32..).zip(&log.resident) {
        for (k, _) in (0u8..).zip(RESIDENT.iter()).filter(|(k, _)| resident.contains(&(p.pid, usize::from(*k)))) {
            timed.push(Timed::point(p.ts_ns, What::Resident { point, k }));
        }
    }
    for (i, p) in (0u32..).zip(&log.nodes).filter(|(_, p)| nodes.tracks.contains(&(p.pid, p.node))) {
        timed.push(Timed::point(p.ts_ns, What::Node(i)));
    }
    for (i, (ts, _, _)) in (0u32..).zip(&nodes.ends) {
        timed.push(Timed::point(*ts, What::NodeEnd(i)));
    }
    for (i, (ts, _, _)) in (0u32..).zip(&nodes.totals) {
        timed.push(Timed::point(*ts, What::NodeTotal(i)));
    }
    for (point, p) in (0u32..).zip(&log.cpu_ipis) {
        timed.push(Timed::point(p.ts_ns, What::Cpu { point, zero: false }));
        // Back to zero where the next interval has nothing.
        timed.push(Timed { ts: p.ts_ns + p.dur_ns, rank: END, tie: 0, what: What::Cpu { point, zero: true } });
    }
    timed.sort_unstable_by_key(|t| (t.ts, t.rank, t.tie));
    timed
}

fn task_instant(log: &TraceLog, i: usize) -> vmtrace_protos::perfetto::TrackEvent {
    let t = &log.tasks[i];
    let track = thread_uuid(t.tid);
    match t.kind {
        TaskKind::Fork if t.tid == t.tgid => {
            instant(track, "fork", vec![arg("parent_pid", Arg::Uint(u64::from(t.ppid)))])
        }
        TaskKind::Fork => instant(track, "thread start", vec![]),
        TaskKind::Exec => instant(track, "exec", vec![arg("comm", Arg::Str(t.comm.clone()))]),
        TaskKind::Exit if t.group_dead => {
            instant(track, "process exit", vec![arg("exit_code", Arg::Int(i64::from(t.exit_code)))])
        }
        TaskKind::Exit => instant(track, "thread exit", vec![]),
    }
}

/// Each process's interval growth as rates: the value holds from the
/// interval's start, back to zero where the next interval had nothing, so
/// the integral of each counter is the process's total.
fn counter_points(timed: &mut Vec<Timed>, points: &[CounterPoint]) {
    let mut by_pid: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (i, p) in (0u32..).zip(points) {
        by_pid.entry(p.pid).or_default().push(i);
    }
    let at = |i: u32| &points[i as usize];
    for ps in by_pid.into_values() {
        let mut ps = ps;
        ps.sort_by_key(|&i| at(i).ts_ns);
        for (k, (_, _, value)) in (0u8..).zip(COUNTERS.iter()) {
            if ps.iter().all(|&i| value(&at(i).delta) == 0.0) {
                continue;
            }
            for (j, &point) in ps.iter().enumerate() {
                let p = at(point);
                timed.push(Timed::point(p.ts_ns, What::Counter { point, k, zero: false }));
                let end = p.ts_ns + p.dur_ns.max(1);
                if ps.get(j + 1).is_none_or(|&n| at(n).ts_ns > end) {
                    timed.push(Timed { ts: end, rank: END, tie: 0, what: What::Counter { point, k, zero: true } });
                }
            }
        }
    }
}

/// The resident tracks to write: each process's total, and each kind it
/// ever held.
fn resident_tracks(points: &[ResidentPoint]) -> BTreeSet<(u32, usize)> {
    let mut tracks = BTreeSet::new();
    for p in points {
        tracks.insert((p.pid, 0));
        tracks.extend(RESIDENT.iter().enumerate().skip(1).filter(|(_, r)| r.1(p) > 0).map(|(k, _)| (p.pid, k)));
    }
    tracks
}

/// The NUMA tracks (`log.nodes`): each process's bytes on each node it ever
/// had pages on, back to 0 at its exit; and per such node, the traced
/// processes' bytes on it, each process counted at its latest read.
#[derive(Debug, Default)]
struct NodeSeries {
    /// (pid, node).
    tracks: BTreeSet<(u32, u32)>,
    /// (time, pid, node): the process exited after a read.
    ends: Vec<(u64, u32, u32)>,
    /// (time, node, pages): the sum from then on.
    totals: Vec<(u64, u32, u64)>,
}

fn node_series(log: &TraceLog) -> NodeSeries {
    let mut s = NodeSeries::default();
    let mut first: BTreeMap<u32, u64> = BTreeMap::new();
    for p in &log.nodes {
        if p.pages > 0 {
            s.tracks.insert((p.pid, p.node));
        }
        let t = first.entry(p.pid).or_insert(p.ts_ns);
        *t = (*t).min(p.ts_ns);
    }
    for t in log.tasks.iter().filter(|t| t.kind == TaskKind::Exit && t.group_dead) {
        if first.get(&t.tgid).is_some_and(|f| *f < t.ts_ns) {
            let tracks = s.tracks.range((t.tgid, 0)..=(t.tgid, u32::MAX));
            s.ends.extend(tracks.map(|&(pid, node)| (t.ts_ns, pid, node)));
        }
    }
    let mut changes: Vec<(u64, u32, u32, u64)> = log
        .nodes
        .iter()
        .filter(|p| s.tracks.contains(&(p.pid, p.node)))
        .map(|p| (p.ts_ns, p.pid, p.node, p.pages))
        .chain(s.ends.iter().map(|&(ts, pid, node)| (ts, pid, node, 0)))
        .collect();
    // Stable: at one time a read comes before an exit.
    changes.sort_by_key(|c| c.0);
    let mut now: HashMap<(u32, u32), u64> = HashMap::default();
    let mut sum: BTreeMap<u32, u64> = BTreeMap::new();
    // Each node's last total: (time, index in `totals`).
    let mut last: HashMap<u32, (u64, usize)> = HashMap::default();
    for (ts, pid, node, pages) in changes {
        let before = now.insert((pid, node), pages).unwrap_or(0);
        let total = sum.entry(node).or_default();
        *total = *total - before + pages;
        match last.get(&node) {
            Some(&(at, i)) if at == ts => s.totals[i].2 = *total,
            Some(&(_, i)) if s.totals[i].2 == *total => {}
            _ => {
                last.insert(node, (ts, s.totals.len()));
                s.totals.push((ts, node, *total));
            }
        }
    }
    s
}

/// Process and thread tracks for everything the events name, then the
/// counter and storm tracks under their processes.
fn tracks<W: Write>(w: &mut Writer<W>, summary: &Summary, log: &TraceLog, nodes: &NodeSeries) -> io::Result<()> {
    let mut procs: BTreeMap<u32, String> = summary.processes.iter().map(|p| (p.pid, p.comm.clone())).collect();
    let identities: BTreeMap<u32, &crate::model::Identity> =
        summary.processes.iter().filter(|p| !p.identity.is_empty()).map(|p| (p.pid, &p.identity)).collect();
    let mut threads: BTreeMap<u32, (u32, Option<String>)> = BTreeMap::new();
    for t in &log.tasks {
        let e = threads.entry(t.tid).or_insert((t.tgid, None));
        if t.kind != TaskKind::Exit {
            e.1 = Some(t.comm.clone());
        }
        procs.entry(t.tgid).or_insert_with(|| t.comm.clone());
    }
    for (tgid, tid) in log.majors.iter().map(|m| (m.tgid, m.tid)).chain(log.mm_changes.iter().map(|m| (m.tgid, m.tid)))
    {
        threads.entry(tid).or_insert((tgid, None));
        procs.entry(tgid).or_default();
    }
    for o in summary.oom.as_deref().unwrap_or_default() {
        procs.entry(o.victim_pid).or_insert_with(|| o.victim_comm.clone());
    }
    let storm_pids: BTreeSet<u32> = summary.storms.iter().flatten().map(|s| s.pid).collect();
    // Only the counters that ever moved get a track.
    let mut moved: BTreeSet<(u32, usize)> = BTreeSet::new();
    for p in &log.counters {
        moved.extend(COUNTERS.iter().enumerate().filter(|(_, c)| c.2(&p.delta) != 0.0).map(|(k, _)| (p.pid, k)));
    }
    let resident = resident_tracks(&log.resident);
    for pid in storm_pids.iter().chain(moved.iter().map(|(pid, _)| pid)).chain(resident.iter().map(|(pid, _)| pid)) {
        procs.entry(*pid).or_default();
    }
    for (pid, _) in &nodes.tracks {
        procs.entry(*pid).or_default();
    }
    for (pid, name) in &procs {
        w.track(process_track(process_uuid(*pid), *pid, name, identities.get(pid).copied()))?;
    }
    for (tid, (pid, name)) in &threads {
        w.track(thread_track(thread_uuid(*tid), *pid, *tid, name.as_deref()))?;
    }
    for pid in &storm_pids {
        w.track(named_track(STORMS | u64::from(*pid), process_uuid(*pid), "shootdown storms", None))?;
    }
    for (pid, k) in moved {
        let (name, unit, _) = COUNTERS[k];
        w.track(named_track(counter_uuid(pid, k), process_uuid(pid), name, Some(unit)))?;
    }
    for (pid, k) in resident {
        let uuid = counter_uuid(pid, RESIDENT_UUID + k);
        w.track(named_track(uuid, process_uuid(pid), RESIDENT[k].0, Some("bytes")))?;
    }
    for &(pid, node) in &nodes.tracks {
        let name = format!("resident bytes on node {node}");
        w.track(named_track(node_uuid(pid, node), process_uuid(pid), &name, Some("bytes")))?;
    }
    let with_pages: BTreeSet<u32> = nodes.tracks.iter().map(|(_, node)| *node).collect();
    for node in with_pages {
        let name = format!("node {node} resident bytes (traced processes)");
        w.track(named_track(node_total_uuid(node), 0, &name, Some("bytes")))?;
    }
    let cpus: BTreeSet<u32> = log.cpu_ipis.iter().map(|p| p.cpu).collect();
    for cpu in cpus {
        w.track(named_track(cpu_uuid(cpu), 0, &format!("cpu{cpu} shootdowns received/s"), Some("IPIs/s")))?;
    }
    Ok(())
}
