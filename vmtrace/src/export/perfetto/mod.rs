//! `trace.perfetto-trace`: the recording as a Perfetto trace (a stream of
//! `TracePacket`s, encoded by prost from Perfetto's own `.proto`), for
//! ui.perfetto.dev and trace_processor. A sink of the model: it reads the
//! summary and the event log (`model::trace`) and nothing else.
//!
//! What goes where ([`render`]): a process track per process and a thread
//! track per thread seen; counter tracks per process (faults/s, majors/s,
//! COW/s, time in the fault handler, IPIs sent/s; resident bytes, in all
//! and per kind; on hosts with two NUMA nodes or more, resident bytes on
//! each node, from each `/proc/PID/numa_maps` read), per CPU (shootdowns
//! received/s) and per NUMA node (the traced processes' resident bytes on
//! it); slices for major faults and mapping changes on their threads,
//! storms on their process; instants for fork, exec, exit and OOM kills. Timestamps are CLOCK_MONOTONIC (`BUILTIN_CLOCK_MONOTONIC`), the
//! trace's primary clock, as `bpf_ktime_get_ns` gives them.
use std::{
    io::{self, Write},
    path::Path,
    time::Instant,
};

use prost::Message as _;
use vmtrace_protos::perfetto::{
    clock_snapshot::Clock, debug_annotation, inline_callstack, stack_sample, trace_packet, track_descriptor,
    track_event, BuiltinClock, ClockSnapshot, CounterDescriptor, DebugAnnotation, InlineCallstack, ProcessDescriptor,
    StackSample, ThreadDescriptor, Trace, TracePacket, TrackDescriptor, TrackEvent,
};

use crate::model::{trace::TraceLog, Summary};

mod render;
#[cfg(test)]
mod tests;

pub use render::render;

/// The file `record --perfetto` writes beside summary.json.
pub const FILE: &str = "trace.perfetto-trace";

/// Every packet is on this one sequence (a single writer).
const SEQUENCE_ID: u32 = 1;
/// `TracePacket::SEQ_INCREMENTAL_STATE_CLEARED`: the sequence starts here.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;

/// Why `report DIR --perfetto` cannot write the trace: `path` is where
/// `record --perfetto` would have put it.
pub fn not_from_summary(path: &Path) -> String {
    let have = if path.is_file() {
        format!("{} is there already, written by `record --perfetto`", path.display())
    } else {
        format!("{} was not written: record again with --perfetto", path.display())
    };
    format!(
        "cannot write a Perfetto trace from a recording: the trace is made of events (each major fault, \
         mapping change, fork, exit and the 100 ms counters) that only `record --perfetto` keeps, and \
         summary.json holds totals\nhint: {have}"
    )
}

/// What writing a trace took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub packets: u64,
    pub bytes: u64,
    pub micros: u64,
}

/// Writes the trace of `summary` and `log` to `dir`/[`FILE`].
pub fn write(dir: &Path, summary: &Summary, log: &TraceLog) -> io::Result<WriteStats> {
    let started = Instant::now();
    let file = std::fs::File::create(dir.join(FILE))?;
    let mut w = Writer::new(io::BufWriter::with_capacity(1 << 16, file));
    render(&mut w, summary, log)?;
    let mut stats = w.finish()?;
    stats.micros = started.elapsed().as_micros() as u64;
    Ok(stats)
}

/// Encodes packets one by one: a `Trace` holding one packet, concatenated,
/// is the same message as one `Trace` holding them all (a repeated field),
/// so the trace is never whole in memory.
pub struct Writer<W: Write> {
    out: W,
    stats: WriteStats,
    buf: Vec<u8>,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Self { out, stats: WriteStats::default(), buf: Vec::with_capacity(256) }
    }

    fn packet(&mut self, mut p: TracePacket) -> io::Result<()> {
        p.optional_trusted_packet_sequence_id =
            Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(SEQUENCE_ID));
        if self.stats.packets == 0 {
            p.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
            p.first_packet_on_sequence = Some(true);
        }
        self.buf.clear();
        Trace { packet: vec![p] }.encode(&mut self.buf).map_err(io::Error::other)?;
        self.out.write_all(&self.buf)?;
        self.stats.packets += 1;
        self.stats.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// The trace's clocks as of now, MONOTONIC primary: events stamped with
    /// it stay on it, and other traces of the same run (BOOTTIME, REALTIME)
    /// are placed through this snapshot.
    pub fn clocks(&mut self) -> io::Result<()> {
        let clock = |id: BuiltinClock, c: libc::clockid_t| Clock {
            clock_id: Some(id as u32),
            timestamp: Some(clock_ns(c)),
            ..Clock::default()
        };
        let snapshot = ClockSnapshot {
            clocks: vec![
                clock(BuiltinClock::Boottime, libc::CLOCK_BOOTTIME),
                clock(BuiltinClock::Monotonic, libc::CLOCK_MONOTONIC),
                clock(BuiltinClock::Realtime, libc::CLOCK_REALTIME),
            ],
            primary_trace_clock: Some(BuiltinClock::Monotonic as i32),
        };
        self.packet(TracePacket { data: Some(trace_packet::Data::ClockSnapshot(snapshot)), ..TracePacket::default() })
    }

    pub fn track(&mut self, t: TrackDescriptor) -> io::Result<()> {
        self.packet(TracePacket { data: Some(trace_packet::Data::TrackDescriptor(t)), ..TracePacket::default() })
    }

    pub fn event(&mut self, ts_ns: u64, e: TrackEvent) -> io::Result<()> {
        self.packet(TracePacket {
            timestamp: Some(ts_ns),
            timestamp_clock_id: Some(BuiltinClock::Monotonic as u32),
            data: Some(trace_packet::Data::TrackEvent(e)),
            ..TracePacket::default()
        })
    }

    pub fn stack_sample(&mut self, ts_ns: u64, sample: StackSample) -> io::Result<()> {
        self.packet(TracePacket {
            timestamp: Some(ts_ns),
            timestamp_clock_id: Some(BuiltinClock::Monotonic as u32),
            data: Some(trace_packet::Data::StackSample(sample)),
            ..TracePacket::default()
        })
    }

    pub fn finish(mut self) -> io::Result<WriteStats> {
        self.out.flush()?;
        Ok(self.stats)
    }
}

fn clock_ns(c: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(c, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A process's track: its name (with its rank where known, so ranks tell
/// apart in the track list) and its identity as process labels
/// (`pod_uid=…`, `container_id=…`, `cgroup=…`, `rank=…`).
pub fn process_track(uuid: u64, pid: u32, name: &str, id: Option<&crate::model::Identity>) -> TrackDescriptor {
    let name = match id.and_then(crate::model::Identity::rank_number) {
        Some(r) if !name.is_empty() => format!("{name} [rank {r}]"),
        _ => name.to_string(),
    };
    TrackDescriptor {
        uuid: Some(uuid),
        process: Some(ProcessDescriptor {
            pid: Some(pid as i32),
            process_name: (!name.is_empty()).then_some(name),
            process_labels: id
                .map(|i| i.labels().into_iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default(),
            ..ProcessDescriptor::default()
        }),
        ..TrackDescriptor::default()
    }
}

pub fn thread_track(uuid: u64, pid: u32, tid: u32, name: Option<&str>) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(uuid),
        thread: Some(ThreadDescriptor {
            pid: Some(pid as i32),
            tid: Some(i64::from(tid)),
            thread_name: name.map(str::to_string),
            ..ThreadDescriptor::default()
        }),
        ..TrackDescriptor::default()
    }
}

/// A named track under `parent` (0: a global one); a counter track when `unit` is given.
pub fn named_track(uuid: u64, parent: u64, name: &str, unit: Option<&str>) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(uuid),
        parent_uuid: (parent != 0).then_some(parent),
        static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(name.to_string())),
        counter: unit.map(|u| CounterDescriptor { unit_name: Some(u.to_string()), ..CounterDescriptor::default() }),
        ..TrackDescriptor::default()
    }
}

fn event(kind: track_event::Type, track: u64, name: Option<&str>) -> TrackEvent {
    TrackEvent {
        r#type: Some(kind as i32),
        track_uuid: Some(track),
        name_field: name.map(|n| track_event::NameField::Name(n.to_string())),
        ..TrackEvent::default()
    }
}

pub fn slice_begin(track: u64, name: &str, args: Vec<DebugAnnotation>) -> TrackEvent {
    TrackEvent { debug_annotations: args, ..event(track_event::Type::SliceBegin, track, Some(name)) }
}

pub fn slice_end(track: u64) -> TrackEvent {
    event(track_event::Type::SliceEnd, track, None)
}

/// `frames` (outermost first) as a slice's own callstack (none when empty).
pub fn with_callstack(mut e: TrackEvent, frames: &[String]) -> TrackEvent {
    if frames.is_empty() {
        return e;
    }
    let frames = frames
        .iter()
        .map(|f| track_event::inline_callstack::Frame { function_name: Some(f.clone()), ..Default::default() })
        .collect();
    e.callstack_field = Some(track_event::CallstackField::Callstack(track_event::InlineCallstack { frames }));
    e
}

/// A callstack sample of one major fault on its thread (Perfetto's
/// `StackSample`, v58+): the timebase is page faults (weight 1), the
/// fault's time in the handler a follower in ns, so a flamegraph over an
/// area weighs stacks by either.
pub fn major_fault_sample(pid: u32, tid: u32, frames: &[String], dur_ns: u64) -> StackSample {
    use stack_sample::counter_descriptor::UnitField;
    let counter = |name: &str, unit: stack_sample::Unit| stack_sample::CounterDescriptor {
        name: Some(name.to_string()),
        unit_field: Some(UnitField::Unit(unit as i32)),
        ..Default::default()
    };
    let frames = frames
        .iter()
        .map(|f| inline_callstack::Frame { function_name: Some(f.clone()), ..Default::default() })
        .collect();
    StackSample {
        task_context_field: Some(stack_sample::TaskContextField::TaskContext(stack_sample::TaskContext {
            pid: Some(pid),
            tid: Some(tid),
            ..Default::default()
        })),
        callstack_field: Some(stack_sample::CallstackField::Callstack(InlineCallstack { frames })),
        primary_descriptor_field: Some(stack_sample::PrimaryDescriptorField::PrimaryDescriptor(counter(
            "major faults",
            stack_sample::Unit::PageFaults,
        ))),
        primary_weight: Some(1),
        follower_descriptors: vec![counter("major fault time", stack_sample::Unit::Nanoseconds)],
        follower_weights: vec![dur_ns],
        ..Default::default()
    }
}

pub fn instant(track: u64, name: &str, args: Vec<DebugAnnotation>) -> TrackEvent {
    TrackEvent { debug_annotations: args, ..event(track_event::Type::Instant, track, Some(name)) }
}

pub fn counter(track: u64, value: f64) -> TrackEvent {
    TrackEvent {
        counter_value_field: Some(track_event::CounterValueField::DoubleCounterValue(value)),
        ..event(track_event::Type::Counter, track, None)
    }
}

/// A debug annotation (slice argument) with a value.
pub fn arg(name: &str, value: Arg) -> DebugAnnotation {
    use debug_annotation::Value;
    let (value, array_values) = match value {
        Arg::Str(s) => (Some(Value::StringValue(s)), Vec::new()),
        Arg::Uint(u) => (Some(Value::UintValue(u)), Vec::new()),
        Arg::Int(i) => (Some(Value::IntValue(i)), Vec::new()),
        Arg::Float(f) => (Some(Value::DoubleValue(f)), Vec::new()),
        Arg::Pointer(p) => (Some(Value::PointerValue(p)), Vec::new()),
        Arg::Strings(v) => (
            None,
            v.into_iter()
                .map(|s| DebugAnnotation { value: Some(Value::StringValue(s)), ..DebugAnnotation::default() })
                .collect(),
        ),
    };
    DebugAnnotation {
        name_field: Some(debug_annotation::NameField::Name(name.to_string())),
        value,
        array_values,
        ..DebugAnnotation::default()
    }
}

pub enum Arg {
    Str(String),
    Uint(u64),
    Int(i64),
    Float(f64),
    Pointer(u64),
    Strings(Vec<String>),
}
