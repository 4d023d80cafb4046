//! `record --perfetto` against summary.json (privileged: loads BPF): the
//! trace, decoded with Perfetto's own protos (prost types of the vendored
//! `perfetto_trace.proto`), has the tracks, slices, instants and counters the
//! recording implies.
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::*;
use prost::Message as _;
use serde_json::Value;
use vmtrace_protos::perfetto::{
    debug_annotation, stack_sample, trace_packet::Data, track_descriptor::StaticOrDynamicName, track_event, Trace,
    TrackEvent,
};

/// What a trace holds, by track.
#[derive(Default)]
struct Decoded {
    /// uuid → (pid of a process track, or (pid, tid) of a thread track, or name).
    processes: BTreeMap<u64, u32>,
    threads: BTreeMap<u64, (u32, u32)>,
    named: BTreeMap<u64, (String, Option<u64>)>,
    /// (timestamp, event) in file order.
    events: Vec<(u64, TrackEvent)>,
    /// CLOCK_MONOTONIC when the trace was written.
    written_mono_ns: u64,
    /// Callstack samples: (timestamp, pid, tid, frames).
    samples: Vec<(u64, u32, u32, usize)>,
}

fn decode(path: &std::path::Path) -> Decoded {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let trace = Trace::decode(bytes.as_slice()).expect("a Perfetto Trace message");
    let mut d = Decoded::default();
    for p in trace.packet {
        match p.data {
            Some(Data::ClockSnapshot(c)) => {
                assert_eq!(c.primary_trace_clock, Some(3), "BUILTIN_CLOCK_MONOTONIC is the trace's clock");
                d.written_mono_ns = c.clocks.iter().find(|c| c.clock_id == Some(3)).and_then(|c| c.timestamp).unwrap();
            }
            Some(Data::TrackDescriptor(t)) => {
                let uuid = t.uuid.expect("track uuid");
                if let Some(pr) = t.process {
                    d.processes.insert(uuid, pr.pid.unwrap() as u32);
                } else if let Some(th) = t.thread {
                    d.threads.insert(uuid, (th.pid.unwrap() as u32, th.tid.unwrap() as u32));
                } else if let Some(StaticOrDynamicName::Name(n)) = t.static_or_dynamic_name {
                    d.named.insert(uuid, (n, t.parent_uuid));
                }
            }
            Some(Data::TrackEvent(e)) => {
                assert_eq!(p.timestamp_clock_id, Some(3), "events on CLOCK_MONOTONIC");
                d.events.push((p.timestamp.expect("timestamp"), e));
            }
            Some(Data::StackSample(s)) => {
                let Some(stack_sample::TaskContextField::TaskContext(task)) = s.task_context_field else {
                    panic!("a sample names its thread")
                };
                let Some(stack_sample::CallstackField::Callstack(stack)) = s.callstack_field else {
                    panic!("a sample has its callstack inline")
                };
                let ts = p.timestamp.expect("timestamp");
                d.samples.push((ts, task.pid.unwrap(), task.tid.unwrap(), stack.frames.len()));
            }
            _ => {}
        }
    }
    d
}

fn is(e: &TrackEvent, t: track_event::Type) -> bool {
    e.r#type == Some(t as i32)
}

fn name(e: &TrackEvent) -> &str {
    match &e.name_field {
        Some(track_event::NameField::Name(n)) => n,
        _ => "",
    }
}

fn uint_arg(e: &TrackEvent, key: &str) -> Option<u64> {
    e.debug_annotations.iter().find_map(|a| match (&a.name_field, &a.value) {
        (Some(debug_annotation::NameField::Name(n)), Some(debug_annotation::Value::UintValue(v))) if n == key => {
            Some(*v)
        }
        _ => None,
    })
}

impl Decoded {
    /// Slices (begin timestamp, duration, begin event) on each track, paired
    /// begin to end as a reader nests them.
    fn slices(&self) -> Vec<(u64, u64, u64, &TrackEvent)> {
        let mut open: HashMap<u64, Vec<(u64, &TrackEvent)>> = HashMap::new();
        let mut out = Vec::new();
        for (ts, e) in &self.events {
            let track = e.track_uuid.expect("track_uuid");
            if is(e, track_event::Type::SliceBegin) {
                open.entry(track).or_default().push((*ts, e));
            } else if is(e, track_event::Type::SliceEnd) {
                let (start, b) = open.get_mut(&track).and_then(Vec::pop).expect("an end matches a begin");
                out.push((track, start, ts - start, b));
            }
        }
        assert!(open.values().all(Vec::is_empty), "every slice ends");
        out
    }

    /// Integral over time of the counter track `counter` under `pid`'s process track.
    fn integral(&self, pid: u32, counter: &str) -> f64 {
        let parent = self.processes.iter().find(|(_, p)| **p == pid).map(|(u, _)| *u);
        let Some(uuid) = self.named.iter().find(|(_, (n, p))| n == counter && *p == parent).map(|(u, _)| *u) else {
            return 0.0;
        };
        let points: Vec<(u64, f64)> = self
            .events
            .iter()
            .filter(|(_, e)| e.track_uuid == Some(uuid))
            .filter_map(|(ts, e)| match e.counter_value_field {
                Some(track_event::CounterValueField::DoubleCounterValue(v)) => Some((*ts, v)),
                _ => None,
            })
            .collect();
        points.windows(2).map(|w| w[0].1 * (w[1].0 - w[0].0) as f64 / 1e9).sum()
    }
}

#[test]
fn trace_matches_the_summary() {
    privileged!();
    let dir = disk_dir();
    let file = dir.path().join("cold.bin");
    let made = vmtrace().args(["workload", "make-file"]).arg(&file).args(["--mib", "16"]).status();
    assert!(made.is_ok_and(|s| s.success()), "cannot write {}", file.display());
    // Cold faults (majors), forks with copy-on-write, mmap/munmap churn with IPIs.
    let script = format!(
        "{bin} workload file-read {f} --cold --random && {bin} workload cow --children 2 --mib 8 --refcount \
         && {bin} workload churn --iterations 1000",
        bin = BIN,
        f = file.display()
    );
    let run = record(&["--perfetto", "--stacks", "user"], &["sh", "-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let s = &run.summary;
    assert_eq!(u(&s["drops"]["trace_events"]), 0, "nothing beyond the log's bound here");
    let d = decode(&run.out.path().join("trace.perfetto-trace"));
    let procs: Vec<&Value> = s["processes"].as_array().unwrap().iter().collect();

    // A process track per process; every thread that has an event has a thread track.
    let track_pids: BTreeSet<u32> = d.processes.values().copied().collect();
    for p in &procs {
        assert!(track_pids.contains(&(u(&p["pid"]) as u32)), "no process track for {}", p["pid"]);
    }
    let known: BTreeSet<u64> = d.processes.keys().chain(d.threads.keys()).chain(d.named.keys()).copied().collect();
    assert!(d.events.iter().all(|(_, e)| known.contains(&e.track_uuid.unwrap())), "every event's track is declared");

    // Every event lies within the recording, on the kernel's monotonic clock.
    let duration_ns = (s["duration_s"].as_f64().unwrap() * 1e9) as u64;
    let first = d.events.iter().map(|(ts, _)| *ts).min().unwrap();
    let last = d.events.iter().map(|(ts, _)| *ts).max().unwrap();
    assert!(last <= d.written_mono_ns, "events before the trace was written");
    assert!(last - first <= duration_ns + 2_000_000_000, "events span {} ns, the run {duration_ns}", last - first);

    // A slice per major fault, as long as the kernel timed it.
    let slices = d.slices();
    let majors: Vec<_> = slices.iter().filter(|s| name(s.3) == "major fault").collect();
    let total_major: u64 = procs.iter().map(|p| u(&p["faults"]["major"])).sum();
    let major_ns: u64 = procs.iter().map(|p| u(&p["faults"]["major_time_ns"])).sum();
    assert!(total_major >= 100, "the cold read took majors: {total_major}");
    let untimed = u(&s["drops"]["untimed_faults"]);
    assert!(
        majors.len() as u64 <= total_major && majors.len() as u64 + untimed >= total_major,
        "{} major slices, {total_major} majors ({untimed} faults untimed)",
        majors.len()
    );
    let sliced_ns: u64 = majors.iter().map(|m| uint_arg(m.3, "duration_ns").unwrap()).sum();
    assert_eq!(sliced_ns, major_ns, "major slices add up to the majors' time");
    for m in &majors {
        assert!(d.threads.contains_key(&m.0), "a major fault's slice is on a thread track");
        assert!(m.2 >= uint_arg(m.3, "duration_ns").unwrap().max(1));
    }

    // The majors' stacks (every fault that slept takes one) as callstack
    // samples on their threads, at the fault's start.
    let with_stack: Vec<(u64, u64)> =
        majors.iter().filter(|m| m.3.callstack_field.is_some()).map(|m| (m.1, d.threads[&m.0].1.into())).collect();
    assert!(!with_stack.is_empty(), "majors have stacks with --stacks user");
    assert_eq!(d.samples.len(), with_stack.len());
    let with_stack: BTreeSet<(u64, u64)> = with_stack.into_iter().collect();
    for (ts, pid, tid, frames) in &d.samples {
        assert!(with_stack.contains(&(*ts, (*tid).into())), "sample at {ts} on {tid} is a major fault's");
        assert!(d.threads.values().any(|t| *t == (*pid, *tid)) && *frames > 0);
    }

    // A slice per munmap that succeeded (every one here).
    let munmaps = slices.iter().filter(|s| name(s.3) == "munmap").count() as u64;
    let munmap_calls: u64 = procs.iter().map(|p| u(&p["mmap"]["munmap"])).sum();
    assert_close("munmap slices", munmaps, munmap_calls, 1.0);

    // Storms, each with its culprit stack.
    let storms = s["storms"].as_array().map_or(0, Vec::len);
    let storm_slices: Vec<_> = slices.iter().filter(|s| name(s.3) == "shootdown storm").collect();
    assert_eq!(storm_slices.len(), storms);
    assert!(storm_slices.iter().all(|s| s.3.debug_annotations.iter().any(|a| !a.array_values.is_empty())));

    // Instants: a fork per process (the command's by vmtrace, which the
    // kernel follows from its fork: `Probes::follow_forks_of`), an exit per
    // process, OOM kills.
    let instants = |n: &str| d.events.iter().filter(|(_, e)| is(e, track_event::Type::Instant) && name(e) == n).count();
    assert_eq!(instants("fork"), procs.len(), "forks: every process, the command's included");
    assert_eq!(instants("process exit"), procs.iter().filter(|p| !p["exit_code"].is_null()).count());
    assert!(instants("exec") >= 3, "sh execs the workloads");
    assert_eq!(instants("OOM kill"), s["oom"].as_array().map_or(0, Vec::len));

    // Counters integrate to each process's totals.
    for p in &procs {
        let pid = u(&p["pid"]) as u32;
        let f = &p["faults"];
        for (counter, want) in [
            ("faults/s", u(&f["total"])),
            ("major faults/s", u(&f["major"])),
            ("COW faults/s", u(&f["cow"])),
            ("shootdown IPIs sent/s", p["tlb"]["ipis_sent"].as_u64().unwrap_or(0)),
        ] {
            let got = d.integral(pid, counter).round() as u64;
            assert_eq!(got, want, "{counter} of {pid} integrates to {got}, summary.json says {want}");
        }
        let pct_s = d.integral(pid, "fault handler % CPU");
        let want_s = u(&f["time_ns"]) as f64 / 1e7;
        assert!((pct_s - want_s).abs() <= want_s * 1e-6 + 1e-6, "fault time of {pid}: {pct_s} vs {want_s}");
    }
    let cows: u64 = procs.iter().map(|p| u(&p["faults"]["cow"])).sum();
    assert!(cows > 0, "the cow workload wrote to shared pages");

    // report.html links the trace; `report DIR --perfetto` says why it cannot rebuild it.
    let html = std::fs::read_to_string(run.out.path().join("report.html")).unwrap();
    assert!(html.contains("href=\"trace.perfetto-trace\""));
    let again = vmtrace().arg("report").arg(run.out.path()).arg("--perfetto").output().unwrap();
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("only `record --perfetto` keeps") && err.contains("is there already"), "{err}");
}

/// No root needed: `report DIR --perfetto` on a recording without the trace
/// fails and says why and what to do.
#[test]
fn report_perfetto_says_the_trace_needs_record() {
    let dir = tempfile::tempdir().unwrap();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json");
    std::fs::copy(golden, dir.path().join("summary.json")).unwrap();
    let out = vmtrace().arg("report").arg(dir.path()).arg("--perfetto").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a failure, not a crash");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only `record --perfetto` keeps"), "{err}");
    assert!(err.contains("hint: ") && err.contains("record again with --perfetto"), "{err}");
    assert!(!dir.path().join("trace.perfetto-trace").exists());
}

/// An OOM kill in a scratch memory cgroup: an instant on the victim's
/// process track, at the kill, before the victim's exit.
#[test]
fn oom_kill_is_an_instant_on_the_victim() {
    privileged!();
    let cgroup = format!("vmtrace-perfetto-oom-{}", std::process::id());
    let cg = vmtrace::demo::cgroup::ScratchCgroup::new(&cgroup, 64 << 20)
        .expect("a memory cgroup (v1 or v2) is needed to test OOM kills without risking a global OOM");
    let argv = cg.run_inside(&[BIN, "workload", "touch", "--mib", "256", "--pace-ms", "5"]);
    let run = record(&["--perfetto"], &strs(&argv));
    assert_eq!(run.code(), Some(137), "{}", run.stderr());
    let pid = u(&run.summary["target"]["pid"]) as u32;
    let d = decode(&run.out.path().join("trace.perfetto-trace"));
    let track = d.processes.iter().find(|(_, p)| **p == pid).map(|(u, _)| *u).expect("the victim's process track");
    let at = |n: &str| {
        d.events
            .iter()
            .filter(|(_, e)| is(e, track_event::Type::Instant) && name(e) == n)
            .filter(|(_, e)| match e.track_uuid {
                Some(t) if n == "OOM kill" => t == track,
                Some(t) => d.threads.get(&t).is_some_and(|th| th.1 == pid),
                None => false,
            })
            .map(|(ts, e)| (*ts, e.clone()))
            .collect::<Vec<_>>()
    };
    let kills = at("OOM kill");
    let in_summary = run.summary["oom"].as_array().unwrap().iter().filter(|o| o["victim_pid"] == pid).count();
    assert_eq!((kills.len(), in_summary), (1, 1), "one kill of {pid}");
    assert_eq!(uint_arg(&kills[0].1, "victim_pid"), Some(u64::from(pid)));
    let exits = at("process exit");
    assert_eq!(exits.len(), 1, "the victim's exit");
    assert!(kills[0].0 <= exits[0].0, "killed at {}, exited at {}", kills[0].0, exits[0].0);
    // Its memory grew until the kill: the fault counter integrates to its faults.
    let faults = d.integral(pid, "faults/s").round() as u64;
    assert_eq!(faults, u(&run.process(pid)["faults"]["total"]));
}

/// A process's resident memory as counter tracks (bytes, the kernel's
/// `rss_stat` counters): a C program keeps 112 MiB and frees a 96 MiB buffer
/// before its end. The "resident bytes" track's maximum is its peak, against
/// the VmHWM the program read of itself just before exiting (the peak lasts
/// less than a collector interval: it is the kernel's own peak point), and
/// its value before the teardown its VmRSS then; the anonymous track's
/// maximum is the summary's `peak_anon_bytes`.
#[test]
fn resident_counter_per_process_peaks_at_its_vmhwm() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c("resident_heap.c", dir.path());
    let run = record(&["--perfetto"], &[bin.to_str().unwrap(), dir.path().to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let own = std::fs::read_to_string(dir.path().join("status.txt")).expect("the workload's status.txt");
    let kb = |key: &str| -> u64 {
        own.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.trim_start_matches(':').split_whitespace().next()))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {key} in:\n{own}"))
            * 1024
    };
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    let d = decode(&run.out.path().join("trace.perfetto-trace"));
    let parent = d.processes.iter().find(|(_, p)| **p == pid).map(|(u, _)| *u).expect("the target's process track");
    let series = |counter: &str| -> Vec<f64> {
        let uuid = d
            .named
            .iter()
            .find(|(_, (n, p))| n == counter && *p == Some(parent))
            .map_or_else(|| panic!("no {counter} track under {pid}: {:?}", d.named), |(u, _)| *u);
        d.events
            .iter()
            .filter(|(_, e)| e.track_uuid == Some(uuid))
            .filter_map(|(_, e)| match e.counter_value_field {
                Some(track_event::CounterValueField::DoubleCounterValue(v)) => Some(v),
                _ => None,
            })
            .collect()
    };
    let total = series("resident bytes");
    let max = total.iter().copied().fold(0.0, f64::max) as u64;
    eprintln!("resident bytes track: max {max}, VmHWM {}, {} points", kb("VmHWM"), total.len());
    assert_close("the resident track's maximum", max, kb("VmHWM"), 5.0);
    let r = &run.process(pid)["resident"];
    assert_close("the resident track's maximum", max, u(&r["peak_bytes"]), 1.0);
    // It ends at zero (the teardown), after its value at the end.
    assert_eq!(total.last(), Some(&0.0), "{total:?}");
    let at_end = total[total.len() - 2] as u64;
    assert_close("the resident track at the end", at_end, kb("VmRSS"), 5.0);
    let anon = series("resident anon bytes");
    let anon_max = anon.iter().copied().fold(0.0, f64::max) as u64;
    assert_close("the anonymous track's maximum", anon_max, u(&r["peak_anon_bytes"]), 1.0);
}
