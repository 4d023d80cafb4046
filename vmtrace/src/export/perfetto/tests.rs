use crate::hash::HashMap;

use prost::Message as _;
use vmtrace_protos::perfetto::{trace_packet::Data, track_event, Trace, TrackEvent};

use super::{render, render::COUNTERS, Writer};
use crate::model::{
    trace::{CounterPoint, CpuPoint, MajorFault, MmChange, NodePoint, ResidentPoint, TaskKind, TaskMark, TraceLog},
    Cum, Storm, Summary,
};

const T0: u64 = 5_000_000_000;

fn summary() -> Summary {
    let mut s: Summary = serde_json::from_str(include_str!("../../../tests/golden/summary.json")).expect("golden");
    s.storms = Some(vec![Storm {
        pid: 13784,
        comm: "vmtrace".into(),
        start_s: 0.1,
        end_s: 0.3,
        peak_per_s: 9000,
        shootdowns: 1500,
        top_stack: vec!["main".into(), "free".into(), "[munmap]".into()],
        top_call: "munmap".into(),
        top_share: 0.9,
        malloc_settings: std::collections::BTreeMap::new(),
    }]);
    s
}

fn task(ts: u64, kind: TaskKind, tid: u32, tgid: u32) -> TaskMark {
    TaskMark { ts_ns: T0 + ts, kind, tid, tgid, ppid: 13783, comm: "vmtrace".into(), group_dead: true, exit_code: 0 }
}

fn log() -> TraceLog {
    let point = |ts: u64, faults: u64, major: u64| CounterPoint {
        ts_ns: T0 + ts,
        dur_ns: 100_000_000,
        pid: 13784,
        delta: Cum { faults, major, time_ns: 50_000_000, ..Cum::default() },
    };
    TraceLog {
        start_ns: T0,
        end_ns: T0 + 1_000_000_000,
        tasks: vec![
            task(1_000, TaskKind::Fork, 13784, 13784),
            task(2_000, TaskKind::Exec, 13784, 13784),
            task(3_000, TaskKind::Fork, 13785, 13784),
            task(900_000_000, TaskKind::Exit, 13784, 13784),
        ],
        majors: vec![MajorFault {
            ts_ns: T0 + 20_000_000,
            dur_ns: 2_000_000,
            tgid: 13784,
            tid: 13785,
            addr: 0x7f00_0000_0000,
            stack: vec!["main".into(), "read_weights".into()],
        }],
        // A major inside an munmap on the same thread nests in it.
        mm_changes: vec![MmChange {
            ts_ns: T0 + 19_000_000,
            dur_ns: 5_000_000,
            tgid: 13784,
            tid: 13785,
            call: "munmap",
            addr: 0x7f00_0000_0000,
            len: 1 << 20,
        }],
        // Two adjoining intervals, then one after a gap.
        counters: vec![point(0, 100, 1), point(100_000_000, 50, 0), point(400_000_000, 10, 2)],
        cpu_ipis: vec![CpuPoint { ts_ns: T0, dur_ns: 100_000_000, cpu: 1, received: 40 }],
        resident: Vec::new(),
        nodes: Vec::new(),
        dropped: 0,
    }
}

fn decode(summary: &Summary, log: &TraceLog) -> Trace {
    let mut w = Writer::new(Vec::new());
    render(&mut w, summary, log).expect("render");
    let bytes = w.out.clone();
    let stats = w.finish().expect("finish");
    assert_eq!(stats.bytes, bytes.len() as u64);
    let trace = Trace::decode(bytes.as_slice()).expect("decodes as a Perfetto Trace");
    assert_eq!(trace.packet.len() as u64, stats.packets);
    trace
}

fn name(e: &TrackEvent) -> &str {
    match &e.name_field {
        Some(track_event::NameField::Name(n)) => n,
        _ => "",
    }
}

#[test]
fn tracks_slices_instants_and_counters() {
    let trace = decode(&summary(), &log());
    let first = &trace.packet[0];
    assert!(matches!(&first.data, Some(Data::ClockSnapshot(c)) if c.primary_trace_clock == Some(3)));
    assert_eq!(first.sequence_flags, Some(1));
    let mut tracks: HashMap<u64, String> = HashMap::default();
    let mut events = Vec::new();
    for p in &trace.packet {
        match &p.data {
            Some(Data::TrackDescriptor(t)) => {
                let label = match (&t.process, &t.thread, &t.static_or_dynamic_name) {
                    (Some(pr), _, _) => format!("process {}", pr.pid.unwrap_or(0)),
                    (_, Some(th), _) => format!("thread {}", th.tid.unwrap_or(0)),
                    (_, _, Some(vmtrace_protos::perfetto::track_descriptor::StaticOrDynamicName::Name(n))) => n.clone(),
                    _ => String::new(),
                };
                tracks.insert(t.uuid.expect("uuid"), label);
            }
            Some(Data::TrackEvent(e)) => {
                assert_eq!(p.timestamp_clock_id, Some(3), "on CLOCK_MONOTONIC");
                assert!(tracks.contains_key(&e.track_uuid.expect("track")), "track declared before use");
                events.push((p.timestamp.expect("ts"), e.clone()));
            }
            _ => {}
        }
    }
    for want in ["process 13784", "process 13787", "thread 13785", "faults/s", "cpu1 shootdowns received/s"] {
        assert!(tracks.values().any(|t| t == want), "no track {want}: {tracks:?}");
    }
    assert!(events.windows(2).all(|w| w[0].0 <= w[1].0), "events in time order");
    let slices: Vec<&str> = events
        .iter()
        .filter(|(_, e)| e.r#type == Some(track_event::Type::SliceBegin as i32))
        .map(|(_, e)| name(e))
        .collect();
    assert_eq!(slices, ["munmap", "major fault", "shootdown storm"]);
    let ends = events.iter().filter(|(_, e)| e.r#type == Some(track_event::Type::SliceEnd as i32)).count();
    assert_eq!(ends, 3);
    let (ts, major) = events.iter().find(|(_, e)| name(e) == "major fault").expect("major");
    assert_eq!(*ts, T0 + 20_000_000);
    let Some(track_event::CallstackField::Callstack(stack)) = &major.callstack_field else {
        panic!("the major fault's slice has its callstack")
    };
    assert_eq!(stack.frames.len(), 2);
    let samples: Vec<_> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(Data::StackSample(s)) => Some((p.timestamp, s)),
            _ => None,
        })
        .collect();
    assert_eq!(samples.len(), 1, "a callstack sample per major fault with a stack");
    assert_eq!(samples[0].0, Some(T0 + 20_000_000));
    assert!(matches!(
        &samples[0].1.task_context_field,
        Some(vmtrace_protos::perfetto::stack_sample::TaskContextField::TaskContext(c)) if c.tid == Some(13785)
    ));
    assert_eq!((samples[0].1.primary_weight, samples[0].1.follower_weights.as_slice()), (Some(1), &[2_000_000][..]));
    let (storm_ts, _) = events.iter().find(|(_, e)| name(e) == "shootdown storm").expect("storm");
    assert_eq!(*storm_ts, T0 + 100_000_000);
    let instants: Vec<&str> = events
        .iter()
        .filter(|(_, e)| e.r#type == Some(track_event::Type::Instant as i32))
        .map(|(_, e)| name(e))
        .collect();
    assert_eq!(instants, ["fork", "exec", "thread start", "OOM kill", "process exit"]);
}

/// Each counter's integral over time (rate × time it holds) is the total it counts.
#[test]
fn counters_integrate_to_their_totals() {
    let log = log();
    let trace = decode(&summary(), &log);
    let mut tracks: HashMap<u64, String> = HashMap::default();
    let mut series: HashMap<u64, Vec<(u64, f64)>> = HashMap::default();
    for p in &trace.packet {
        match &p.data {
            Some(Data::TrackDescriptor(t)) => {
                if let Some(vmtrace_protos::perfetto::track_descriptor::StaticOrDynamicName::Name(n)) =
                    &t.static_or_dynamic_name
                {
                    tracks.insert(t.uuid.unwrap_or(0), n.clone());
                }
            }
            Some(Data::TrackEvent(e)) => {
                if let Some(track_event::CounterValueField::DoubleCounterValue(v)) = e.counter_value_field {
                    series.entry(e.track_uuid.unwrap_or(0)).or_default().push((p.timestamp.unwrap_or(0), v));
                }
            }
            _ => {}
        }
    }
    let integral = |name: &str| {
        let (uuid, _) = tracks.iter().find(|(_, n)| *n == name).expect(name);
        let s = &series[uuid];
        assert_eq!(s.last().map(|p| p.1), Some(0.0), "{name} ends at zero");
        s.windows(2).map(|w| w[0].1 * (w[1].0 - w[0].0) as f64 / 1e9).sum::<f64>()
    };
    assert!((integral("faults/s") - 160.0).abs() < 1e-6);
    assert!((integral("major faults/s") - 3.0).abs() < 1e-6);
    // 3 × 50 ms of handler time = 15% of a CPU-second.
    assert!((integral(COUNTERS[3].0) - 15.0).abs() < 1e-6);
    assert!((integral("cpu1 shootdowns received/s") - 40.0).abs() < 1e-6);
    assert!(!tracks.values().any(|n| n == "COW faults/s"), "a counter that never moved has no track");
}

/// Resident points become counter tracks in bytes under their process: the
/// total, and each kind the process ever held; their values step from point
/// to point, so the total's maximum is the peak point's.
#[test]
fn resident_points_are_byte_counters_per_process() {
    let point = |ts: u64, anon: u64, file: u64| ResidentPoint { ts_ns: T0 + ts, pid: 13784, anon, file, shmem: 0 };
    let log = TraceLog {
        resident: vec![point(0, 1 << 20, 4096), point(50, 9 << 20, 4096), point(90, 2 << 20, 4096), point(91, 0, 0)],
        ..log()
    };
    let trace = decode(&summary(), &log);
    let (tracks, values) = named_counters(&trace);
    let mut series: HashMap<String, Vec<f64>> = HashMap::default();
    for (uuid, _, v) in values {
        series.entry(tracks[&uuid].0.clone()).or_default().push(v);
    }
    let process = super::render::process_uuid(13784);
    for name in ["resident bytes", "resident anon bytes", "resident file bytes"] {
        let (_, unit, parent) = tracks.values().find(|t| t.0 == name).unwrap_or_else(|| panic!("no {name} track"));
        assert_eq!((unit.as_deref(), *parent), (Some("bytes"), Some(process)), "{name}");
    }
    assert!(!tracks.values().any(|t| t.0 == "resident shmem bytes"), "a kind never held has no track");
    let total = &series["resident bytes"];
    let mib = 1_048_576.0;
    assert_eq!(total, &[mib + 4096.0, 9.0 * mib + 4096.0, 2.0 * mib + 4096.0, 0.0]);
}

/// A trace's named tracks, uuid → (name, unit, parent), each uuid described
/// once; and its counter values in order, (track uuid, timestamp, value).
type Tracks = HashMap<u64, (String, Option<String>, Option<u64>)>;
fn named_counters(trace: &Trace) -> (Tracks, Vec<(u64, u64, f64)>) {
    let (mut tracks, mut values) = (Tracks::default(), Vec::new());
    for p in &trace.packet {
        match &p.data {
            Some(Data::TrackDescriptor(t)) => {
                if let Some(vmtrace_protos::perfetto::track_descriptor::StaticOrDynamicName::Name(n)) =
                    &t.static_or_dynamic_name
                {
                    let unit = t.counter.as_ref().and_then(|c| c.unit_name.clone());
                    assert!(tracks.insert(t.uuid.unwrap_or(0), (n.clone(), unit, t.parent_uuid)).is_none(), "{n}");
                }
            }
            Some(Data::TrackEvent(e)) => {
                if let Some(track_event::CounterValueField::DoubleCounterValue(v)) = e.counter_value_field {
                    let uuid = e.track_uuid.unwrap_or(0);
                    assert!(tracks.contains_key(&uuid), "a value on track {uuid} before its descriptor");
                    values.push((uuid, p.timestamp.unwrap_or(0), v));
                }
            }
            _ => {}
        }
    }
    (tracks, values)
}

/// Counter values by (track name, parent): (ms since `T0`, value).
type Series = HashMap<(String, Option<u64>), Vec<(u64, f64)>>;

/// numa_maps reads become byte counters per process and node (a node the
/// process never had pages on has no track), back to 0 at the process's
/// exit, and per node a global track summing each process's latest read.
#[test]
fn node_points_are_byte_counters_per_process_and_node() {
    const MS: u64 = 1_000_000;
    let point = |ms: u64, pid: u32, node: u32, pages: u64| NodePoint { ts_ns: T0 + ms * MS, pid, node, pages };
    // 13784 exits at 900 ms (`log()`'s tasks); 13787 lives on.
    let log = TraceLog {
        nodes: vec![
            point(100, 13784, 0, 100),
            point(100, 13784, 1, 0),
            point(200, 13787, 0, 0),
            point(200, 13787, 1, 10),
            point(500, 13784, 0, 40),
            point(500, 13784, 1, 60),
            point(600, 13787, 0, 0),
            point(600, 13787, 1, 10),
        ],
        ..log()
    };
    let trace = decode(&summary(), &log);
    let (tracks, values) = named_counters(&trace);
    let mut series = Series::default();
    for (uuid, ts, v) in values {
        let (name, _, parent) = tracks[&uuid].clone();
        series.entry((name, parent)).or_default().push(((ts - T0) / MS, v / 4096.0));
    }
    let (a, b) = (Some(super::render::process_uuid(13784)), Some(super::render::process_uuid(13787)));
    let node = |n: u32| format!("resident bytes on node {n}");
    let total = |n: u32| format!("node {n} resident bytes (traced processes)");
    for (name, parent) in [(node(0), a), (node(1), a), (node(1), b), (total(0), None), (total(1), None)] {
        let t = tracks.values().find(|t| t.0 == name && t.2 == parent);
        assert!(t.is_some_and(|t| t.1.as_deref() == Some("bytes")), "no {name} track under {parent:?}: {tracks:?}");
    }
    assert!(!tracks.values().any(|t| t.0 == node(0) && t.2 == b), "13787 never had pages on node 0: {tracks:?}");
    let pages = |name: String, parent: Option<u64>| series.get(&(name, parent)).cloned().unwrap_or_default();
    assert_eq!(pages(node(0), a), [(100, 100.0), (500, 40.0), (900, 0.0)]);
    assert_eq!(pages(node(1), a), [(100, 0.0), (500, 60.0), (900, 0.0)]);
    assert_eq!(pages(node(1), b), [(200, 10.0), (600, 10.0)]);
    assert_eq!(pages(total(0), None), [(100, 100.0), (500, 40.0), (900, 0.0)]);
    assert_eq!(pages(total(1), None), [(100, 0.0), (200, 10.0), (500, 70.0), (900, 10.0)]);
}

#[test]
fn an_empty_log_is_a_valid_trace() {
    let trace = decode(&summary(), &TraceLog::default());
    assert!(trace.packet.len() > 1);
}

#[test]
fn process_tracks_carry_rank_pod_and_container() {
    let mut s = summary();
    let p = s.processes.iter_mut().find(|p| p.pid == 13784).expect("process 13784");
    p.identity = crate::model::Identity {
        cgroup: Some("/kubepods/burstable/pod4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b/0123".into()),
        pod_uid: Some("4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".into()),
        rank: Some(crate::model::Rank { rank: Some(3), ..crate::model::Rank::default() }),
        ..crate::model::Identity::default()
    };
    let comm = p.comm.clone();
    let trace = decode(&s, &log());
    let track = trace
        .packet
        .iter()
        .find_map(|p| match &p.data {
            Some(Data::TrackDescriptor(t)) => t.process.as_ref().filter(|pr| pr.pid == Some(13784)),
            _ => None,
        })
        .expect("a process track");
    assert_eq!(track.process_name.as_deref(), Some(format!("{comm} [rank 3]").as_str()));
    assert!(track.process_labels.contains(&"pod_uid=4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".to_string()), "{track:?}");
    assert!(track.process_labels.contains(&"rank=3".to_string()), "{track:?}");
    // A process with nothing known has no labels.
    let other = trace.packet.iter().find_map(|p| match &p.data {
        Some(Data::TrackDescriptor(t)) => t.process.as_ref().filter(|pr| pr.pid == Some(13787)),
        _ => None,
    });
    assert!(other.is_some_and(|t| t.process_labels.is_empty()));
}

/// The OOM kill's arguments; `anon_rss_kb` only where the kernel's record has it.
#[test]
fn an_oom_kills_unknown_size_is_left_out_not_zero() {
    let args = |s: &Summary| -> Vec<String> {
        let trace = decode(s, &log());
        let kill = trace
            .packet
            .iter()
            .find_map(|p| match &p.data {
                Some(Data::TrackEvent(e)) if name(e) == "OOM kill" => Some(e.clone()),
                _ => None,
            })
            .expect("an OOM kill instant");
        kill.debug_annotations
            .iter()
            .filter_map(|a| match &a.name_field {
                Some(vmtrace_protos::perfetto::debug_annotation::NameField::Name(n)) => Some(n.clone()),
                _ => None,
            })
            .collect()
    };
    let mut s = summary();
    assert!(args(&s).contains(&"anon_rss_kb".to_string()));
    s.oom.as_mut().unwrap()[0].unknown = vec!["anon_rss_kb".into(), "file_rss_kb".into(), "shmem_rss_kb".into()];
    let without = args(&s);
    assert!(!without.contains(&"anon_rss_kb".to_string()), "{without:?}");
    assert!(without.contains(&"victim_pid".to_string()), "{without:?}");
}
