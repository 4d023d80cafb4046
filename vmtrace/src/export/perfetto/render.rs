//! Which track each part of the model goes on, and in what order.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{self, Write},
};

use super::{
    arg, counter, instant, major_fault_sample, named_track, process_track, slice_begin, slice_end, thread_track,
    with_callstack, Arg, Writer,
};
use crate::model::{
    trace::{CounterPoint, TaskKind, TraceLog},
    Cum, Summary,
};

/// Track uuids: a kind in the top byte, the id below (tids and pids fit in 32 bits).
const PROCESS: u64 = 1 << 56;
const THREAD: u64 = 2 << 56;
const COUNTER: u64 = 3 << 56;
const CPU: u64 = 4 << 56;
const STORMS: u64 = 5 << 56;

pub fn process_uuid(pid: u32) -> u64 {
    PROCESS | u64::from(pid)
}

pub fn thread_uuid(tid: u32) -> u64 {
    THREAD | u64::from(tid)
}

/// A per-process counter: its track's name, its unit, and what of an
/// interval's growth it shows per second.
pub type Counter = (&'static str, &'static str, fn(&Cum) -> f64);

pub const COUNTERS: [Counter; 5] = [
    ("faults/s", "faults/s", |c| c.faults as f64),
    ("major faults/s", "faults/s", |c| c.major as f64),
    ("COW faults/s", "faults/s", |c| c.cow as f64),
    // ns per s / 1e7 = % of one CPU, as `top` shows it.
    ("fault handler % CPU", "%", |c| c.time_ns as f64 / 1e7),
    ("shootdown IPIs sent/s", "IPIs/s", |c| c.ipis as f64),
];

pub fn counter_uuid(pid: u32, kind: usize) -> u64 {
    COUNTER | u64::from(pid) << 8 | kind as u64
}

pub fn cpu_uuid(cpu: u32) -> u64 {
    CPU | u64::from(cpu)
}

/// One timed event, sorted before writing: at one instant slices end before
/// others begin, outer slices begin first and inner ones end first.
struct Timed {
    ts: u64,
    rank: u8,
    tie: i64,
    what: What,
}

enum What {
    Major(usize),
    /// A major fault's stack as a callstack sample.
    Sample(usize),
    Mm(usize),
    Storm(usize),
    End(u64),
    Task(usize),
    Oom(usize),
    Counter(u64, f64),
}

const END: u8 = 0;
const POINT: u8 = 1;
const BEGIN: u8 = 2;

impl Timed {
    fn slice(ts: u64, dur: u64, track: u64, what: What) -> [Timed; 2] {
        // A slice of no length would end before it begins in this order.
        let end = ts + dur.max(1);
        [
            Timed { ts, rank: BEGIN, tie: -(dur as i64), what },
            Timed { ts: end, rank: END, tie: -(ts as i64), what: What::End(track) },
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
    tracks(w, summary, log)?;
    let mut timed = Vec::new();
    for (i, m) in log.majors.iter().enumerate() {
        timed.extend(Timed::slice(m.ts_ns, m.dur_ns, thread_uuid(m.tid), What::Major(i)));
        if !m.stack.is_empty() {
            timed.push(Timed::point(m.ts_ns, What::Sample(i)));
        }
    }
    for (i, m) in log.mm_changes.iter().enumerate() {
        timed.extend(Timed::slice(m.ts_ns, m.dur_ns, thread_uuid(m.tid), What::Mm(i)));
    }
    for (i, s) in storms.iter().enumerate() {
        let (start, end) = (log.at(s.start_s), log.at(s.end_s));
        timed.extend(Timed::slice(start, end.saturating_sub(start), STORMS | u64::from(s.pid), What::Storm(i)));
    }
    for (i, t) in log.tasks.iter().enumerate() {
        timed.push(Timed::point(t.ts_ns, What::Task(i)));
    }
    for (i, o) in ooms.iter().enumerate() {
        timed.push(Timed::point(log.at(o.time_s), What::Oom(i)));
    }
    counter_points(&mut timed, &log.counters);
    for p in &log.cpu_ipis {
        timed.push(Timed::point(p.ts_ns, What::Counter(cpu_uuid(p.cpu), p.received as f64 * 1e9 / p.dur_ns as f64)));
        // Back to zero where the next interval has nothing.
        timed.push(Timed { ts: p.ts_ns + p.dur_ns, rank: END, tie: 0, what: What::Counter(cpu_uuid(p.cpu), 0.0) });
    }
    timed.sort_by_key(|t| (t.ts, t.rank, t.tie));
    for t in timed {
        let e = match t.what {
            What::Major(i) => {
                let m = &log.majors[i];
                let args = vec![arg("address", Arg::Pointer(m.addr)), arg("duration_ns", Arg::Uint(m.dur_ns))];
                with_callstack(slice_begin(thread_uuid(m.tid), "major fault", args), &m.stack)
            }
            What::Sample(i) => {
                let m = &log.majors[i];
                w.stack_sample(t.ts, major_fault_sample(m.tgid, m.tid, &m.stack, m.dur_ns))?;
                continue;
            }
            What::Mm(i) => {
                let m = &log.mm_changes[i];
                let args = vec![arg("address", Arg::Pointer(m.addr)), arg("length", Arg::Uint(m.len))];
                slice_begin(thread_uuid(m.tid), m.call, args)
            }
            What::Storm(i) => {
                let s = &storms[i];
                let args = vec![
                    arg("shootdowns", Arg::Uint(s.shootdowns)),
                    arg("peak_per_s", Arg::Uint(s.peak_per_s)),
                    arg("top_call", Arg::Str(s.top_call.clone())),
                    arg("top_share", Arg::Float(s.top_share)),
                    arg("culprit_stack", Arg::Strings(s.top_stack.clone())),
                ];
                with_callstack(slice_begin(STORMS | u64::from(s.pid), "shootdown storm", args), &s.top_stack)
            }
            What::End(track) => slice_end(track),
            What::Task(i) => task_instant(log, i),
            What::Oom(i) => {
                let o = &ooms[i];
                let args = vec![
                    arg("victim_pid", Arg::Uint(u64::from(o.victim_pid))),
                    arg("victim_comm", Arg::Str(o.victim_comm.clone())),
                    arg("trigger_pid", Arg::Uint(u64::from(o.trigger_pid))),
                    arg("constraint", Arg::Str(o.constraint.clone())),
                    arg("anon_rss_kb", Arg::Uint(o.anon_rss_kb)),
                ];
                instant(process_uuid(o.victim_pid), "OOM kill", args)
            }
            What::Counter(track, v) => counter(track, v),
        };
        w.event(t.ts, e)?;
    }
    Ok(())
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
    let mut by_pid: BTreeMap<u32, Vec<&CounterPoint>> = BTreeMap::new();
    for p in points {
        by_pid.entry(p.pid).or_default().push(p);
    }
    for (pid, mut ps) in by_pid {
        ps.sort_by_key(|p| p.ts_ns);
        for (k, (_, _, value)) in COUNTERS.iter().enumerate() {
            if ps.iter().all(|p| value(&p.delta) == 0.0) {
                continue;
            }
            let track = counter_uuid(pid, k);
            for (i, p) in ps.iter().enumerate() {
                let per_s = value(&p.delta) * 1e9 / p.dur_ns.max(1) as f64;
                timed.push(Timed::point(p.ts_ns, What::Counter(track, per_s)));
                let end = p.ts_ns + p.dur_ns.max(1);
                if ps.get(i + 1).is_none_or(|n| n.ts_ns > end) {
                    timed.push(Timed { ts: end, rank: END, tie: 0, what: What::Counter(track, 0.0) });
                }
            }
        }
    }
}

/// Process and thread tracks for everything the events name, then the
/// counter and storm tracks under their processes.
fn tracks<W: Write>(w: &mut Writer<W>, summary: &Summary, log: &TraceLog) -> io::Result<()> {
    let mut procs: BTreeMap<u32, String> = summary.processes.iter().map(|p| (p.pid, p.comm.clone())).collect();
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
    for pid in storm_pids.iter().chain(moved.iter().map(|(pid, _)| pid)) {
        procs.entry(*pid).or_default();
    }
    for (pid, name) in &procs {
        w.track(process_track(process_uuid(*pid), *pid, name))?;
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
    let cpus: BTreeSet<u32> = log.cpu_ipis.iter().map(|p| p.cpu).collect();
    for cpu in cpus {
        w.track(named_track(cpu_uuid(cpu), 0, &format!("cpu{cpu} shootdowns received/s"), Some("IPIs/s")))?;
    }
    Ok(())
}
