//! pprof profiles (`faults.pb.gz`, `fault-time.pb.gz`, `major-faults.pb.gz`,
//! `mmap.pb.gz`, `shootdowns.pb.gz`): the folded files' stacks as gzipped
//! `perftools.profiles.Profile` messages, for `go tool pprof`, Pyroscope,
//! Grafana and speedscope. Each sample is one folded line (of one process,
//! where the recording knows it), so a profile's total is its folded file's.
//! The frames are the folded files' strings, taken apart in [`parse_frame`]:
//! the process name is the root frame, as in the folded files.
use crate::hash::HashMap;
use std::{io, io::Write as _, path::Path};

use prost::Message as _;

use crate::stacks::tree::Graph;
use vmtrace_protos::pprof as pb;
pub use vmtrace_protos::pprof::Profile;

/// What one profile holds: its file, its values and what a sample stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// `faults` for `faults.pb.gz`, as for `faults.folded`.
    pub stem: &'static str,
    /// (type, unit) of each value of a sample; the first is the folded file's weight.
    pub values: &'static [(&'static str, &'static str)],
    /// (type, unit) of the events a stack was sampled among.
    pub period_type: (&'static str, &'static str),
}

pub const FAULTS: Kind = Kind { stem: "faults", values: &[("faults", "count")], period_type: ("faults", "count") };
pub const FAULT_TIME: Kind =
    Kind { stem: "fault-time", values: &[("fault_time", "nanoseconds")], period_type: ("faults", "count") };
pub const MAJOR_FAULTS: Kind =
    Kind { stem: "major-faults", values: &[("major_faults", "count")], period_type: ("faults", "count") };
pub const MMAP: Kind = Kind { stem: "mmap", values: &[("calls", "count")], period_type: ("calls", "count") };
/// IPIs sent by each call site, and the calls of that site that sent them.
pub const SHOOTDOWNS: Kind =
    Kind { stem: "shootdowns", values: &[("ipis", "count"), ("calls", "count")], period_type: ("calls", "count") };

/// Bytes resident at each process's end, by the stack that faulted them in
/// (the heap-profile convention: `inuse_space`, bytes).
pub const RESIDENT: Kind =
    Kind { stem: "resident", values: &[("inuse_space", "bytes")], period_type: ("space", "bytes") };
/// The same at each process's peak resident size.
pub const RESIDENT_PEAK: Kind =
    Kind { stem: "resident-peak", values: &[("inuse_space", "bytes")], period_type: ("space", "bytes") };

/// Copy-on-write faults by process (`serve`'s `/debug/pprof/cow`): the
/// stacks count no COW faults apart, so each process is one sample.
pub const COW: Kind = Kind { stem: "cow", values: &[("cow_faults", "count")], period_type: ("faults", "count") };

// Every profile, with its flamegraph, is listed once in `report::GRAPHS`.

impl Kind {
    pub fn file(self) -> String {
        format!("{}.pb.gz", self.stem)
    }
}

/// A frame string as symbolization wrote it, taken apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The function's name (Python: the code object's name), or the whole
    /// frame where it names no function (`libc.so.6+0x1234`, markers).
    pub function: &'a str,
    /// The source file, for `function (file:line)` and `function (file)`.
    pub file: Option<&'a str>,
    /// The source line, 0 where unknown.
    pub line: i64,
    /// The object the code is in, for `object+0xOFF` and `[kernel] 0xADDR`.
    pub object: Option<&'a str>,
    /// The offset in `object` (or the address of `[unknown] 0xADDR`), 0 where unknown.
    pub address: u64,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// Takes a frame apart: `function (file:line)` and `function (file)` (Python
/// frames, and native ones symbolized with line info), `object+0xOFF` (code
/// no symbol covers), `[kernel] 0xADDR` / `[unknown] 0xADDR`, markers in
/// brackets (`[no unwind info]`, region leaves), and bare function names.
pub fn parse_frame(s: &str) -> Frame<'_> {
    let bare = Frame { function: s, file: None, line: 0, object: None, address: 0 };
    if let Some(addr) = s.strip_prefix("[kernel] ").and_then(hex) {
        return Frame { object: Some("[kernel]"), address: addr, ..bare };
    }
    if let Some(addr) = s.strip_prefix("[unknown] ").and_then(hex) {
        return Frame { address: addr, ..bare };
    }
    if let Some((object, off)) = s.rsplit_once('+') {
        if let Some(off) = hex(off).filter(|_| !object.is_empty() && !object.contains(' ')) {
            return Frame { object: Some(object), address: off, ..bare };
        }
    }
    if s.starts_with('[') && s.ends_with(']') {
        return bare;
    }
    let Some((name, inner)) = s.strip_suffix(')').and_then(|r| r.rsplit_once(" (")) else { return bare };
    if name.is_empty() || inner.is_empty() || inner.contains(['(', ')']) {
        return bare;
    }
    match inner.rsplit_once(':') {
        Some((file, line)) if !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => {
            Frame { function: name, file: Some(file), line: line.parse().unwrap_or(0), ..bare }
        }
        // A file without a line must look like one: `f (anonymous namespace)` is a name.
        _ if inner.contains('/') || inner.contains(".py") => Frame { function: name, file: Some(inner), ..bare },
        _ => bare,
    }
}

/// The faulting region a `--leaf region` leaf frame names, as labels:
/// `[file /path]`, `[anon 0x…-0x…]` (a mapping without a name),
/// `[heap]`/`[stack]`/`[anon:…]` (the kernel's names), `[unmapped region]`.
/// `None` for a frame that is no region leaf.
pub fn region_labels(leaf: &str) -> Option<Vec<(&'static str, String)>> {
    let inner = leaf.strip_prefix('[')?.strip_suffix(']')?;
    let mut labels = vec![("region", leaf.to_string())];
    if let Some(path) = inner.strip_prefix("file ") {
        labels.push(("region_kind", "file".into()));
        labels.push(("region_path", path.to_string()));
    } else if inner == "unmapped region" {
        labels.push(("region_kind", "unmapped".into()));
    } else if let Some((kind, range)) = inner.split_once(' ') {
        let (lo, hi) = range.split_once('-')?;
        hex(lo)?;
        hex(hi)?;
        labels.push(("region_kind", kind.to_string()));
    } else if inner == "heap" || inner == "stack" {
        labels.push(("region_kind", inner.to_string()));
    } else if let Some(kind) = inner.split(':').next().filter(|k| inner.contains(':') && !k.is_empty()) {
        // `[anon:name]`, `[anon_shmem:name]`: named anonymous memory.
        labels.push(("region_kind", kind.to_string()));
        labels.push(("region_path", inner.to_string()));
    } else {
        return None;
    }
    Some(labels)
}

/// One sample before encoding.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Frames outermost first, the process name first (a folded line's
    /// frames), each name kept once per profile ([`FrameNames`]).
    pub frames: Vec<std::sync::Arc<str>>,
    /// One per `Kind::values`.
    pub values: Vec<i64>,
    pub pid: Option<u32>,
    /// String labels: `comm`, `region`, `region_kind`, `region_path`, `syscall`.
    pub labels: Vec<(&'static str, String)>,
}

/// Builds one profile: strings, functions, locations and mappings are kept
/// once each, by content.
pub struct Builder {
    profile: pb::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<String, u64>,
    mappings: HashMap<String, u64>,
}

impl Builder {
    /// A profile of `kind` whose stacks were taken on 1 in `period` events.
    pub fn new(kind: Kind, period: u64) -> Self {
        let mut b = Self {
            profile: pb::Profile::default(),
            strings: HashMap::default(),
            functions: HashMap::default(),
            locations: HashMap::default(),
            mappings: HashMap::default(),
        };
        // string_table[0] must be "".
        b.string("");
        for (t, u) in kind.values {
            let vt = pb::ValueType { r#type: b.string(t), unit: b.string(u) };
            b.profile.sample_type.push(vt);
        }
        b.profile.period_type =
            Some(pb::ValueType { r#type: b.string(kind.period_type.0), unit: b.string(kind.period_type.1) });
        b.profile.period = period.max(1) as i64;
        b.profile.default_sample_type = b.string(kind.values[0].0);
        b
    }

    /// Text pprof shows with the profile (what the numbers are, how sampled).
    pub fn comment(&mut self, text: &str) {
        let id = self.string(text);
        self.profile.comment.push(id);
    }

    /// Names what was recorded as the profile's first mapping, which pprof
    /// shows as its `File:` (else the first library a frame named). It
    /// holds no location. Call before any `add`.
    pub fn main_name(&mut self, name: &str) {
        if self.profile.mapping.is_empty() {
            let filename = self.string(name);
            self.profile.mapping.push(pb::Mapping { id: 1, filename, has_functions: true, ..Default::default() });
        }
    }

    /// How long the recording ran.
    pub fn duration(&mut self, seconds: f64) {
        self.profile.duration_nanos = (seconds * 1e9) as i64;
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, object: &str, address: u64) -> u64 {
        let id = if let Some(&id) = self.mappings.get(object) {
            id
        } else {
            let id = self.profile.mapping.len() as u64 + 1;
            // Addresses are offsets in the object; every location of the
            // mapping already has its function, so pprof does not look for
            // the binary to symbolize it.
            let m = pb::Mapping { id, filename: self.string(object), has_functions: true, ..Default::default() };
            self.profile.mapping.push(m);
            self.mappings.insert(object.to_string(), id);
            id
        };
        let m = &mut self.profile.mapping[id as usize - 1];
        m.memory_limit = m.memory_limit.max(address.saturating_add(1));
        id
    }

    fn location(&mut self, frame: &str) -> u64 {
        if let Some(&id) = self.locations.get(frame) {
            return id;
        }
        let f = parse_frame(frame);
        let name = self.string(f.function);
        let file = f.file.map_or(0, |p| self.string(p));
        let function_id = if let Some(&id) = self.functions.get(&(name, file)) {
            id
        } else {
            let id = self.profile.function.len() as u64 + 1;
            // No system name: pprof would take `name` for a mangled one and
            // "simplify" it (`<module>` became `<unknown>`). Names are
            // already demangled, as in the folded files.
            let func = pb::Function { id, name, system_name: 0, filename: file, start_line: 0 };
            self.profile.function.push(func);
            self.functions.insert((name, file), id);
            id
        };
        let mapping_id = f.object.map_or(0, |o| self.mapping(o, f.address));
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(pb::Location {
            id,
            mapping_id,
            address: f.address,
            line: vec![pb::Line { function_id, line: f.line, column: 0 }],
            is_folded: false,
        });
        self.locations.insert(frame.to_string(), id);
        id
    }

    pub fn add(&mut self, s: &Sample) {
        // pprof wants the leaf first.
        let location_id = s.frames.iter().rev().map(|f| self.location(f)).collect();
        let labels: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.add_located(location_id, s.values.clone(), s.pid, &labels);
    }

    /// The location of a frame (as a folded file writes it), made once per
    /// distinct frame: for [`Builder::add_located`].
    pub fn location_of(&mut self, frame: &str) -> u64 {
        self.location(frame)
    }

    /// A sample of locations (leaf first, from [`Builder::location_of`]),
    /// labelled with its pid and `labels`.
    pub fn add_located(&mut self, location_id: Vec<u64>, value: Vec<i64>, pid: Option<u32>, labels: &[(&str, &str)]) {
        let mut label = Vec::new();
        if let Some(pid) = pid {
            label.push(pb::Label { key: self.string("pid"), num: i64::from(pid), ..Default::default() });
        }
        for (k, v) in labels {
            label.push(pb::Label { key: self.string(k), str: self.string(v), ..Default::default() });
        }
        self.profile.sample.push(pb::Sample { location_id, value, label });
    }

    pub fn finish(self) -> pb::Profile {
        self.profile
    }
}

/// Writes `profile` gzipped, as pprof expects on disk.
pub fn write(path: &Path, profile: &pb::Profile) -> io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut gz = flate2::write::GzEncoder::new(io::BufWriter::new(file), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    // A full disk may only show when the last blocks go out: say so, not drop it.
    gz.finish()?.flush()
}

/// A sample of a folded line (`comm;outer;…;inner`, without its weight):
/// labelled with its process name (the root frame), its pid where known, its
/// region (`region`, a `--leaf region` leaf) and, for `mmap`/`shootdowns`,
/// its syscall (the leaf `[munmap]`). A process frame that names its
/// identity (`model::identity::named`) becomes the name alone: the
/// identity is the labels' ([`Meta::identities`]), as [`graph_profile`] has it.
pub fn sample(kind: Kind, line: &str, pid: Option<u32>, region: Option<&str>, values: Vec<i64>) -> Sample {
    sample_with(&mut FrameNames::default(), kind, line, pid, region, values)
}

/// Frame names kept once across the samples of a profile: a served
/// profile's ~20,000 samples of ~30 frames each held every frame as its
/// own string (25 MB at the agent's heap peak under churn, 2026-12-06).
#[derive(Default)]
pub struct FrameNames(crate::hash::HashSet<std::sync::Arc<str>>);

impl FrameNames {
    pub fn get(&mut self, name: &str) -> std::sync::Arc<str> {
        if let Some(n) = self.0.get(name) {
            return n.clone();
        }
        let n: std::sync::Arc<str> = name.into();
        self.0.insert(n.clone());
        n
    }
}

/// [`sample`], its frame names shared through `names`.
pub fn sample_with(
    names: &mut FrameNames,
    kind: Kind,
    line: &str,
    pid: Option<u32>,
    region: Option<&str>,
    values: Vec<i64>,
) -> Sample {
    let mut frames: Vec<std::sync::Arc<str>> = line.split(';').map(|f| names.get(f)).collect();
    let comm = crate::model::identity::split_named(&frames[0]).0.to_string();
    frames[0] = names.get(&comm);
    let mut labels = vec![("comm", comm)];
    if let Some(r) = region {
        labels.extend(region_labels(r).unwrap_or_else(|| vec![("region", r.to_string())]));
    }
    if kind == MMAP || kind == SHOOTDOWNS {
        if let Some(call) = frames.last().and_then(|f| f.strip_prefix('[')?.strip_suffix(']')) {
            labels.push(("syscall", call.to_string()));
        }
    }
    Sample { frames, values, pid, labels }
}

/// (frames, weight) of each line of a folded file.
pub fn parse_folded(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|l| {
        let (line, w) = l.rsplit_once(' ')?;
        Some((line, w.parse().ok()?))
    })
}

/// What a profile says about its recording besides its samples.
pub struct Meta<'a> {
    /// Stacks were taken on 1 in `period` events.
    pub period: u64,
    /// What the numbers are, shown by pprof.
    pub comment: &'a str,
    pub duration_s: f64,
    /// What was recorded (the command's name), pprof's `File:`.
    pub main: &'a str,
    /// Each process's cgroup, pod, container and rank: labels of its samples.
    pub identities: &'a Identities<'a>,
}

/// Identities by pid, for [`Meta::identities`].
pub type Identities<'a> = std::collections::BTreeMap<u32, &'a crate::model::Identity>;

/// The labels `meta` gives the samples of `pid`.
fn identity_labels(meta: &Meta, pid: Option<u32>) -> Vec<(&'static str, String)> {
    pid.and_then(|p| meta.identities.get(&p)).map(|i| i.labels()).unwrap_or_default()
}

/// A whole profile: `samples` of `kind`.
pub fn profile(kind: Kind, meta: &Meta, samples: impl IntoIterator<Item = Sample>) -> pb::Profile {
    let mut b = Builder::new(kind, meta.period);
    b.main_name(meta.main);
    b.comment(meta.comment);
    b.duration(meta.duration_s);
    for mut s in samples {
        s.labels.extend(identity_labels(meta, s.pid));
        b.add(&s);
    }
    b.finish()
}

/// A whole profile of a graph's lines (`stacks::tree`): a sample per line
/// and process, as [`sample`] makes them from `flamegraph::folded_by_pid`'s
/// lines, without a string per line: each frame is parsed once.
pub fn graph_profile(kind: Kind, meta: &Meta, graph: &Graph) -> pb::Profile {
    graph_profile_with(kind, meta, graph, None)
}

/// [`graph_profile`] with a second value per sample: the part of the same
/// line and process in `also`, a graph of the same tree (a shootdown
/// site's calls beside its IPIs).
pub fn graph_profile_with(kind: Kind, meta: &Meta, graph: &Graph, also: Option<&Graph>) -> pb::Profile {
    let also = also.map(parts_by_node);
    let mut b = Builder::new(kind, meta.period);
    b.main_name(meta.main);
    b.comment(meta.comment);
    b.duration(meta.duration_s);
    let tree = graph.tree;
    // Location ids by frame id, 0 until made.
    let mut located = vec![0u64; tree.frame_count()];
    // Process frames' locations apart: their names without the identity.
    let mut roots: HashMap<u32, u64> = HashMap::default();
    let mut path = Vec::new();
    let mut identities: HashMap<u32, Vec<(&'static str, String)>> = HashMap::default();
    for l in &graph.lines {
        let mut parts = l.parts().peekable();
        if parts.peek().is_none() {
            continue;
        }
        tree.path(l.node, &mut path);
        let mut labels: Vec<(&'static str, String)> = Vec::new();
        if let Some(r) = l.region {
            labels.extend(region_labels(r).unwrap_or_else(|| vec![("region", r.to_string())]));
        }
        if kind == MMAP || kind == SHOOTDOWNS {
            if let Some(call) = path.last().and_then(|&f| tree.name(f).strip_prefix('[')?.strip_suffix(']')) {
                labels.push(("syscall", call.to_string()));
            }
        }
        // The process's name: its identity goes in labels, not in a frame.
        let comm = path.first().map_or("", |&f| tree.process_name(f));
        let labels: Vec<(&str, &str)> =
            std::iter::once(("comm", comm)).chain(labels.iter().map(|(k, v)| (*k, v.as_str()))).collect();
        for (pid, weight) in parts {
            let mut values = vec![weight as i64];
            if let Some(a) = &also {
                values.push(a.get(&(l.node, pid)).copied().unwrap_or(0) as i64);
            }
            let mut location_id = Vec::with_capacity(path.len());
            for (i, &f) in path.iter().enumerate().rev() {
                let at = if i == 0 { roots.entry(f).or_insert(0) } else { &mut located[f as usize] };
                if *at == 0 {
                    *at = b.location_of(if i == 0 { tree.process_name(f) } else { tree.name(f) });
                }
                location_id.push(*at);
            }
            let id = identities.entry(pid).or_insert_with(|| identity_labels(meta, Some(pid)));
            if id.is_empty() {
                b.add_located(location_id, values, Some(pid), &labels);
            } else {
                let mut all = labels.clone();
                all.extend(id.iter().map(|(k, v)| (*k, v.as_str())));
                b.add_located(location_id, values, Some(pid), &all);
            }
        }
    }
    b.finish()
}

/// The samples of a graph's lines, one per line and process, as
/// [`graph_profile`] makes them (for profiles built from samples, such as
/// `serve`'s windows, which subtract two of them).
pub fn graph_samples(kind: Kind, graph: &Graph) -> Vec<Sample> {
    graph_samples_with(kind, graph, None)
}

/// [`graph_samples`] with a second value per sample, as
/// [`graph_profile_with`] makes them.
fn graph_samples_with(kind: Kind, graph: &Graph, also: Option<&Graph>) -> Vec<Sample> {
    let also = also.map(parts_by_node);
    let mut out = Vec::new();
    let mut names = FrameNames::default();
    for l in &graph.lines {
        if l.parts().next().is_none() {
            continue;
        }
        let line = graph.tree.line(l.node);
        for (pid, weight) in l.parts() {
            let mut values = vec![weight as i64];
            if let Some(a) = &also {
                values.push(a.get(&(l.node, pid)).copied().unwrap_or(0) as i64);
            }
            out.push(sample_with(&mut names, kind, &line, Some(pid), l.region, values));
        }
    }
    out
}

/// Each (line, process)'s part of `graph`.
fn parts_by_node(graph: &Graph) -> HashMap<(u32, u32), u64> {
    graph.lines.iter().flat_map(|l| l.parts().map(move |(pid, w)| ((l.node, pid), w))).collect()
}

/// Call sites as stacks for a graph tree (`stacks::tree`): calls as the
/// weight of `Weight::Faults`, the IPIs they sent as `Weight::TimeNs`
/// (`mm_graphs`). The frames are the sites' own, not copied.
pub fn mm_stacks(sites: &[crate::model::MmSite]) -> Vec<crate::stacks::Stack> {
    sites
        .iter()
        .map(|m| crate::stacks::Stack {
            pid: m.pid,
            comm: m.comm.clone(),
            user: m.frames.clone(),
            kernel: Vec::new(),
            counts: vmtrace_common::StackCounts::default(),
            user_missing: false,
            user_cut: false,
            unwound: None,
            leaf: None,
            stratum: 0,
            estimate: crate::stacks::weight::Estimate {
                faults: m.calls as f64,
                time_ns: m.ipis as f64,
                ..Default::default()
            },
            python: false,
            python_unnamed: false,
        })
        .collect()
}

/// The graphs of `mmap` (calls) and `shootdowns` (IPIs sent) of call sites
/// made into `stacks` (`mm_stacks`), on their tree.
pub fn mm_graphs<'t, 'a>(
    tree: &'t crate::stacks::tree::Tree<'a>,
    stacks: &'a [crate::stacks::Stack],
) -> (Graph<'t, 'a>, Graph<'t, 'a>) {
    use crate::stacks::weight::Weight;
    (tree.graph(stacks, Weight::Faults), tree.graph(stacks, Weight::TimeNs))
}

/// The samples of `mmap` (calls) or `shootdowns` (IPIs sent, and the calls
/// of the site that sent them) from the symbolized call sites: a sample per
/// folded line and process, as `mmap.folded` and `shootdowns.folded` hold them.
pub fn mm_samples(kind: Kind, sites: &[crate::model::MmSite]) -> Vec<Sample> {
    let stacks = mm_stacks(sites);
    let tree = crate::stacks::tree::Tree::new(&stacks);
    let (calls, ipis) = mm_graphs(&tree, &stacks);
    if kind != SHOOTDOWNS {
        return graph_samples(kind, &calls);
    }
    graph_samples_with(kind, &ipis, Some(&calls))
}

/// A profile gzipped, as pprof reads it from a file or over HTTP.
pub fn gzipped(profile: &pb::Profile) -> io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()
}

/// The samples of `kind` from its folded file alone (`vmtrace report DIR`):
/// the pid of a process frame (a name, with its identity where the
/// recording knew one) where `pid_of` knows one, else the labels
/// `shared_of` gives it (what the processes sharing that frame have in
/// common: a rank's DataLoader workers share their rank's frame), the
/// region of a line that ends in a region leaf, and for `shootdowns` the
/// calls of each site from `mmap.folded` (`calls`), whose lines name the
/// same sites.
pub fn folded_samples(
    kind: Kind,
    folded: &str,
    pid_of: impl Fn(&str) -> Option<u32>,
    shared_of: impl Fn(&str) -> Vec<(&'static str, String)>,
    calls: Option<&str>,
) -> Vec<Sample> {
    let calls: HashMap<&str, u64> = calls.map(|c| parse_folded(c).collect()).unwrap_or_default();
    let faults = kind != MMAP && kind != SHOOTDOWNS;
    parse_folded(folded)
        .map(|(line, w)| {
            let comm = line.split(';').next().unwrap_or_default();
            let leaf = line.rsplit(';').next().filter(|l| faults && region_labels(l).is_some());
            let mut values = vec![w as i64];
            if kind == SHOOTDOWNS {
                values.push(calls.get(line).copied().unwrap_or(0) as i64);
            }
            let pid = pid_of(comm);
            let mut s = sample(kind, line, pid, leaf, values);
            if pid.is_none() {
                s.labels.extend(shared_of(comm));
            }
            s
        })
        .collect()
}

#[cfg(test)]
#[path = "pprof_tests.rs"]
mod tests;
