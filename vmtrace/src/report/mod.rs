//! What a trace leaves behind: `summary.json` (for tools) and `summary.txt` (for people).
pub mod charts;
pub mod html;
pub mod stream;
pub mod text;
pub mod words;

use std::{fs, io, path::Path};

use crate::{
    export::pprof,
    model::{fmt_ns, MmSite, Sampling, StacksSummary, Summary},
    stacks::{
        flamegraph::{self, Weight},
        Stack,
    },
};

/// An output file that could not be written; the others still were.
#[derive(Debug)]
pub struct WriteFailure {
    pub file: String,
    pub err: io::Error,
}

impl std::fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.err)
    }
}

/// Writes files one by one, keeping going past a failure.
struct Writer<'a> {
    dir: &'a Path,
    failed: Vec<WriteFailure>,
}

impl Writer<'_> {
    fn put(&mut self, file: &str, write: impl FnOnce(&Path) -> io::Result<()>) {
        if let Err(err) = write(&self.dir.join(file)) {
            // A half-written file would read as a whole one.
            let _ = fs::remove_file(self.dir.join(file));
            self.failed.push(WriteFailure { file: file.to_string(), err });
        }
    }

    fn text(&mut self, file: &str, content: &str) {
        self.put(file, |p| fs::write(p, content));
    }

    /// `stem.folded` and `stem.svg`, with frames too small to see folded
    /// into their callers (`flamegraph::fold_small`; the profiles keep all).
    fn flamegraph(&mut self, stem: &str, folded: &str, title: &str, unit: &str) {
        let folded = flamegraph::fold_small(folded, flamegraph::MIN_SHARE);
        self.text(&format!("{stem}.folded"), &folded);
        self.put(&format!("{stem}.svg"), |p| flamegraph::write_svg(p, &folded, title, unit));
    }

    /// `stem.folded` (already folded with `flamegraph::MIN_SHARE`) and `stem.svg`.
    fn flamegraph_folded(&mut self, stem: &str, folded: &str, title: &str, unit: &str) {
        self.text(&format!("{stem}.folded"), folded);
        self.put(&format!("{stem}.svg"), |p| flamegraph::write_svg(p, folded, title, unit));
    }

    /// Builds and writes a pprof profile, timed (`-vv` shows it: the cost
    /// docs/performance.md quotes).
    fn pprof(&mut self, kind: pprof::Kind, build: impl FnOnce() -> pprof::Profile) {
        let t = std::time::Instant::now();
        let profile = build();
        self.put(&kind.file(), |p| pprof::write(p, &profile));
        let size = fs::metadata(self.dir.join(kind.file())).map_or(0, |m| m.len());
        log::debug!(
            "{}: {} samples, {} locations, {size} bytes in {:.1} ms",
            kind.file(),
            profile.sample.len(),
            profile.location.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// How a recording's summary.json is bounded and laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutputOptions {
    /// Processes and regions under this percentage of the faults and of the
    /// time are folded into "other" rows (`model::fold`); 0 lists every row.
    pub fold_below: f64,
    /// Indented JSON instead of compact.
    pub pretty: bool,
}

impl Default for OutputOptions {
    fn default() -> Self {
        Self { fold_below: 0.1, pretty: false }
    }
}

/// The stacks behind a recording's flamegraphs.
pub struct StackOutputs<'a> {
    /// Fault stacks, when stacks were taken.
    pub faults: Option<&'a [Stack]>,
    /// mmap-family call sites, when mmap was traced.
    pub mm_sites: Option<&'a [MmSite]>,
    /// Stacks by bytes resident at each process's end and at its peak.
    pub resident: Option<(&'a [Stack], &'a [Stack])>,
}

/// Processes in the resident tables of summary.txt and report.html.
pub const RESIDENT_ROWS: usize = 20;

/// The processes with resident figures, largest peak first, at most
/// `RESIDENT_ROWS`, and how many more summary.json holds: the same rows in
/// summary.txt and report.html.
/// A process's name as the reports' tables show it: with its rank, pod and
/// container where known (`python3 [rank 6/8 pod 7a8b9c0d ctr c0ffee001122]`,
/// `model::identity::named`), as the folded files, pprof, Perfetto and `top`
/// name it; its comm alone when none is known.
pub(crate) fn process_name(p: &crate::model::Process) -> std::borrow::Cow<'_, str> {
    crate::model::identity::named(&p.comm, Some(&p.identity))
}

/// [`process_name`] of every process by pid, for tables keyed by pid (regions).
pub(crate) fn process_names(s: &Summary) -> std::collections::HashMap<u32, std::borrow::Cow<'_, str>> {
    s.processes.iter().map(|p| (p.pid, process_name(p))).collect()
}

pub(crate) fn resident_rows(s: &Summary) -> (Vec<(&crate::model::Process, &crate::model::Resident)>, usize) {
    let mut procs: Vec<_> = s.processes.iter().filter_map(|p| p.resident.as_ref().map(|r| (p, r))).collect();
    procs.sort_by(|a, b| b.1.peak_bytes.cmp(&a.1.peak_bytes).then(a.0.pid.cmp(&b.0.pid)));
    let more = procs.len().saturating_sub(RESIDENT_ROWS);
    procs.truncate(RESIDENT_ROWS);
    (procs, more)
}

/// Every file a recording writes ([`GRAPHS`]' stems give the flamegraph
/// triples): the only ones [`remove_earlier_outputs`] may remove.
pub fn owned_files() -> Vec<String> {
    let mut files: Vec<String> = ["summary.json", "summary.txt", "regions.txt", "report.html"].map(String::from).into();
    files.push(crate::export::perfetto::FILE.to_string());
    for g in GRAPHS {
        files.extend(graph_files(g.kind));
    }
    files
}

/// Removes what an earlier recording left in `dir` before a new one writes
/// there: a file the new one does not write (a `trace.perfetto-trace` of a
/// run with `--perfetto`, `regions.txt` of a run with regions) would sit
/// beside its outputs, and report.html would link it. Only vmtrace's own
/// file names are touched; anything else in `dir` stays. The names removed.
pub fn remove_earlier_outputs(dir: &Path) -> Vec<String> {
    owned_files().into_iter().filter(|f| fs::remove_file(dir.join(f)).is_ok()).collect()
}

/// Writes every output of a recording into `dir`, most important first:
/// `summary.json`, `summary.txt`, `regions.txt`, the flamegraphs (each with
/// its pprof profile), then
/// `report.html` (which embeds them). A file that fails is reported by name
/// and the rest are still attempted: on a full disk the summary survives.
/// `s.stacks.files` must already name the flamegraph files ([`flamegraph_files`]).
pub fn write_recording(dir: &Path, s: &Summary, stacks: &StackOutputs) -> Vec<WriteFailure> {
    write_recording_with(dir, s, stacks, &OutputOptions::default())
}

/// [`write_recording`], with summary.json laid out as `o` says.
pub fn write_recording_with(dir: &Path, s: &Summary, stacks: &StackOutputs, o: &OutputOptions) -> Vec<WriteFailure> {
    let mut w = Writer { dir, failed: Vec::new() };
    // Compact by default: indentation was 40% of a large file.
    let json = if o.pretty { serde_json::to_string_pretty(s) } else { serde_json::to_string(s) };
    match json {
        Ok(json) => w.text("summary.json", &(json + "\n")),
        Err(e) => w.failed.push(WriteFailure { file: "summary.json".into(), err: io::Error::other(e) }),
    }
    w.text("summary.txt", &text::render(s));
    if s.regions.is_some() {
        w.text("regions.txt", &text::render_regions(s));
    }
    if let (Some(faults), Some(st)) = (stacks.faults, &s.stacks) {
        write_flamegraphs(&mut w, faults, st, s);
    }
    if let Some(sites) = stacks.mm_sites {
        write_mm_flamegraphs(&mut w, sites, s);
    }
    if let (Some((end, peak)), Some(r)) = (stacks.resident, &s.resident) {
        write_resident(&mut w, end, peak, r, s);
    }
    w.text("report.html", &html::render(s, dir));
    w.failed
}

/// One flamegraph of a recording: its profile (whose stem names its
/// `.folded`, `.svg` and `.pb.gz`), what its title says it shows and the
/// unit of its weights.
#[derive(Clone, Copy, Debug)]
pub struct Graph {
    pub kind: pprof::Kind,
    pub title: &'static str,
    pub unit: &'static str,
}

/// Every flamegraph `record` writes, each with its pprof profile, in the
/// order they are written: `record` takes each one's title and unit from
/// here, `report DIR` rebuilds each one whose folded file it finds, and
/// report.html links each profile. A new graph is one entry (and its writer).
pub const GRAPHS: [Graph; 8] = [
    Graph { kind: pprof::FAULTS, title: "Page faults by call stack", unit: "faults" },
    Graph { kind: pprof::FAULT_TIME, title: "Fault-handler time by call stack", unit: "ns" },
    Graph { kind: pprof::MAJOR_FAULTS, title: "Major faults by call stack", unit: "faults" },
    Graph { kind: pprof::COW, title: "Copy-on-write faults by call stack", unit: "faults" },
    Graph { kind: pprof::MMAP, title: "mmap-family calls by call site", unit: "calls" },
    Graph { kind: pprof::SHOOTDOWNS, title: "TLB shootdown IPIs sent, by initiating call site", unit: "IPIs" },
    Graph { kind: pprof::RESIDENT, title: "Resident memory at each process's end by call stack", unit: "bytes" },
    Graph { kind: pprof::RESIDENT_PEAK, title: "Resident memory at each process's peak by call stack", unit: "bytes" },
];

/// The entry of [`GRAPHS`] for `kind`.
fn graph_of(kind: pprof::Kind) -> Graph {
    GRAPHS.into_iter().find(|g| g.kind == kind).unwrap_or(Graph { kind, title: kind.stem, unit: "" })
}

/// The fault flamegraphs, by what each is weighted by.
const FAULT_GRAPHS: [(Weight, pprof::Kind); 4] = [
    (Weight::Faults, pprof::FAULTS),
    (Weight::TimeNs, pprof::FAULT_TIME),
    (Weight::Major, pprof::MAJOR_FAULTS),
    (Weight::Cow, pprof::COW),
];

/// A graph's `.svg`, `.folded` and `.pb.gz`.
fn graph_files(kind: pprof::Kind) -> [String; 3] {
    [format!("{}.svg", kind.stem), format!("{}.folded", kind.stem), kind.file()]
}

/// The files the fault flamegraphs and profiles are written to, for summary.json.
pub fn flamegraph_files() -> Vec<String> {
    FAULT_GRAPHS.iter().flat_map(|(_, kind)| graph_files(*kind)).collect()
}

/// The folded stacks, flamegraphs and pprof profiles of a recording.
fn write_flamegraphs(w: &mut Writer, stacks: &[Stack], st: &StacksSummary, s: &Summary) {
    let sampling: &Sampling = &s.sampling;
    let n = u64::from(st.sample_period.max(1));
    // Say plainly what the total is and where it is an estimate.
    let how = if n > 1 {
        let slow = match st.exact_faults {
            0 => "no slow faults".to_string(),
            1 => "the 1 slow fault (slept or huge) with its own stack".to_string(),
            k => format!("all {k} slow faults (slept or huge) with their own stacks"),
        };
        format!("estimated: {slow}, the rest from 1 in {n} faults")
    } else {
        "a stack on every fault".to_string()
    };
    let timing = match sampling.minor_latency_period {
        _ if sampling.fast_sample_period.is_some() => format!(
            "slow faults timed exactly, fast ones 1 in {} (±{}%); ",
            sampling.fast_sample_period.unwrap_or(0),
            sampling.time_error_pct.unwrap_or(0.0)
        ),
        0 => "minor faults untimed; ".to_string(),
        1 => "every fault timed; ".to_string(),
        p => format!("minor latency timed 1 in {p}; "),
    };
    // One tree of frames for the three graphs: no string per stack.
    let t = std::time::Instant::now();
    let tree = crate::stacks::tree::Tree::with_identities(stacks, &identities(s));
    log::debug!(
        "stack tree: {} stacks, {} frames in {:.1} ms",
        stacks.len(),
        tree.frame_count(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for (weight, kind) in FAULT_GRAPHS {
        let Graph { title, unit, .. } = graph_of(kind);
        // One split feeds both: the profile's samples add up to the folded lines.
        let graph = tree.graph(stacks, weight);
        let total = graph.total();
        // A scaled total is an estimate: say so in the number too.
        let total_text = match (weight, n > 1) {
            (Weight::TimeNs, true) => format!("≈{}", fmt_ns(total)),
            (Weight::TimeNs, false) => fmt_ns(total),
            (_, true) => format!("{} {unit}", words::approx(total)),
            (_, false) => format!("{total} {unit}"),
        };
        let extra = if weight == Weight::TimeNs { format!("{timing}{how}") } else { how.clone() };
        let title = format!("{title} — {total_text} ({extra})");
        w.flamegraph_folded(kind.stem, &graph.folded_small(flamegraph::MIN_SHARE), &title, unit);
        let meta = pprof::Meta {
            period: n,
            comment: &title,
            duration_s: s.duration_s,
            main: &recorded(s),
            identities: &identities(s),
        };
        w.pprof(kind, || pprof::graph_profile(kind, &meta, &graph));
    }
}

/// `mmap.{svg,folded,pb.gz}` (call sites of mmap-family syscalls by calls)
/// and `shootdowns.{svg,folded,pb.gz}` (by TLB-flush IPIs sent while the
/// call ran; the profile also has the calls that sent them).
fn write_mm_flamegraphs(w: &mut Writer, sites: &[MmSite], s: &Summary) {
    // A tree, as the fault graphs: a system-wide recording under process
    // churn ends with tens of thousands of sites, and a string per site
    // and process took ~100 MB.
    let stacks = pprof::mm_stacks(sites);
    let tree = crate::stacks::tree::Tree::with_identities(&stacks, &identities(s));
    let (calls, ipis) = pprof::mm_graphs(&tree, &stacks);
    for (kind, graph) in [(pprof::MMAP, &calls), (pprof::SHOOTDOWNS, &ipis)] {
        let Graph { title, unit, .. } = graph_of(kind);
        let f = graph.folded();
        let total = graph.total();
        let title = format!("{title} — {total} {unit}");
        w.flamegraph(kind.stem, &f, &title, unit);
        let meta = pprof::Meta {
            period: 1,
            comment: &title,
            duration_s: s.duration_s,
            main: &recorded(s),
            identities: &identities(s),
        };
        let also = (kind == pprof::SHOOTDOWNS).then_some(&calls);
        w.pprof(kind, || pprof::graph_profile_with(kind, &meta, graph, also));
    }
}

/// The files the resident profiles are written to, for summary.json.
pub fn resident_files() -> Vec<String> {
    [pprof::RESIDENT, pprof::RESIDENT_PEAK].into_iter().flat_map(graph_files).collect()
}

/// `resident.{folded,svg,pb.gz}` and `resident-peak.*`: stacks by the bytes
/// they faulted in that were still resident at each process's end, and at
/// its peak, scaled to the kernel's exact totals.
fn write_resident(w: &mut Writer, end: &[Stack], peak: &[Stack], r: &crate::model::ResidentSummary, s: &Summary) {
    let how = format!("estimated from the pages of 1 in {} faults, scaled to the kernel's totals", r.sample_period);
    for (kind, stacks) in [(pprof::RESIDENT, end), (pprof::RESIDENT_PEAK, peak)] {
        let Graph { title: what, unit, .. } = graph_of(kind);
        // As many stacks as the faults' with a stack on every fault: a tree, as there.
        let tree = crate::stacks::tree::Tree::with_identities(stacks, &identities(s));
        let graph = tree.graph(stacks, Weight::Faults);
        let total = graph.total();
        let title = format!("{what} — {} ({how})", crate::model::bytes(total));
        w.flamegraph_folded(kind.stem, &graph.folded_small(flamegraph::MIN_SHARE), &title, unit);
        let meta = pprof::Meta {
            period: 4096,
            comment: &title,
            duration_s: s.duration_s,
            main: &recorded(s),
            identities: &identities(s),
        };
        w.pprof(kind, || pprof::graph_profile(kind, &meta, &graph));
    }
}

/// Rebuilds the human outputs of a recorded directory from its `summary.json`,
/// each file attempted even when one before it failed.
pub fn rebuild(dir: &Path) -> Result<Summary, String> {
    let path = dir.join("summary.json");
    let data = fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut s: Summary =
        serde_json::from_str(&data).map_err(|e| format!("{} is not a vmtrace summary: {e}", path.display()))?;
    // A summary written before findings: derived from its (folded) rows.
    if s.findings.is_none() {
        s.findings = Some(crate::model::findings::diagnose(&s));
    }
    let mut w = Writer { dir, failed: Vec::new() };
    w.text("summary.txt", &text::render(&s));
    if s.regions.is_some() {
        w.text("regions.txt", &text::render_regions(&s));
    }
    // Every flamegraph `record` writes, from the folded stacks saved beside it.
    for Graph { kind, title, unit } in GRAPHS {
        let stem = kind.stem;
        if let Ok(f) = fs::read_to_string(dir.join(format!("{stem}.folded"))) {
            let title = format!("{title} — {} {unit} (rebuilt by vmtrace report)", flamegraph::total(&f));
            w.put(&format!("{stem}.svg"), |p| flamegraph::write_svg(p, &f, &title, unit));
        }
    }
    rebuild_profiles(&mut w, &s);
    // Last: it embeds the SVGs and links the profiles written above.
    w.text("report.html", &html::render(&s, dir));
    if w.failed.is_empty() {
        Ok(s)
    } else {
        let names: Vec<String> = w.failed.iter().map(|f| format!("cannot write {}/{f}", dir.display())).collect();
        Err(names.join("\n"))
    }
}

/// Each process's identity, for its profile samples' labels.
fn identities(s: &Summary) -> pprof::Identities<'_> {
    s.processes.iter().filter(|p| !p.identity.is_empty()).map(|p| (p.pid, &p.identity)).collect()
}

/// What a recording traced, as a profile's `File:` names it: the command's
/// program, the traced process's name, or every process.
fn recorded(s: &Summary) -> String {
    let program = s.target.command.as_ref().and_then(|c| c.first()).map(|p| p.rsplit('/').next().unwrap_or(p));
    let process = || s.target.pid.and_then(|pid| s.processes.iter().find(|p| p.pid == pid)).map(|p| p.comm.as_str());
    match (program, s.target.kind) {
        (Some(p), _) => p.to_string(),
        (None, crate::model::TargetKind::System) => "[all processes]".to_string(),
        (None, _) => process().unwrap_or("[traced process]").to_string(),
    }
}

/// Labels by process frame (`model::identity::named`), for a frame
/// several processes share.
type SharedLabels = crate::hash::HashMap<String, Vec<(&'static str, String)>>;

/// The pid of each process frame the folded files name, and for a frame
/// several processes share (a rank's DataLoader workers share their rank's)
/// the identity labels all of them have: their samples keep their rank,
/// pod and container, not none.
fn process_frames(s: &Summary) -> (crate::hash::HashMap<String, u32>, SharedLabels) {
    let mut pids: crate::hash::HashMap<String, u32> = crate::hash::HashMap::default();
    let mut shared = SharedLabels::default();
    for p in &s.processes {
        let frame = crate::model::identity::named(&p.comm, Some(&p.identity)).into_owned();
        let labels = p.identity.labels();
        if let Some(common) = shared.get_mut(&frame) {
            common.retain(|l| labels.contains(l));
        } else if let Some(first) = pids.get(&frame).filter(|first| **first != p.pid) {
            let theirs = s.processes.iter().find(|q| q.pid == *first).map(|q| q.identity.labels()).unwrap_or_default();
            shared.insert(frame, theirs.into_iter().filter(|l| labels.contains(l)).collect());
        } else {
            pids.insert(frame, p.pid);
        }
    }
    pids.retain(|c, _| !shared.contains_key(c));
    (pids, shared)
}

/// The pprof profiles of a recorded directory, from its folded files: a
/// process's pid where only one process had its process frame (its name,
/// with its rank, pod and container where known: `stacks::tree`).
/// A frame several processes share keeps the labels they have in common.
fn rebuild_profiles(w: &mut Writer, s: &Summary) {
    let (pids, shared) = process_frames(s);
    let calls = fs::read_to_string(w.dir.join("mmap.folded")).ok();
    for Graph { kind, .. } in GRAPHS {
        let Ok(f) = fs::read_to_string(w.dir.join(format!("{}.folded", kind.stem))) else { continue };
        let period = match kind {
            pprof::MMAP | pprof::SHOOTDOWNS => 1,
            _ => s.stacks.as_ref().map_or(1, |st| u64::from(st.sample_period.max(1))),
        };
        let title = format!("{} — rebuilt by vmtrace report from {}.folded", kind.stem, kind.stem);
        let meta = pprof::Meta {
            period,
            comment: &title,
            duration_s: s.duration_s,
            main: &recorded(s),
            identities: &identities(s),
        };
        w.pprof(kind, || {
            let shared_of = |c: &str| shared.get(c).cloned().unwrap_or_default();
            pprof::profile(
                kind,
                &meta,
                pprof::folded_samples(kind, &f, |c| pids.get(c).copied(), shared_of, calls.as_deref()),
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_frame_several_processes_share_keeps_the_labels_they_have_in_common() {
        let mut s = crate::model::fold::tests::summary();
        let rank = |r, l| crate::model::identity::Rank { rank: Some(r), local_rank: Some(l), world_size: Some(8) };
        let pod = "1f2e3d4c-0000-4000-8000-000000000001".to_string();
        // A rank's main process and its DataLoader worker share a frame
        // (comm and rank/pod/container); another rank has its own.
        for (p, (r, local, cgroup)) in s.processes.iter_mut().zip([(0, 0, "/a"), (0, 1, "/b"), (1, 1, "/b")]) {
            p.comm = "python3".into();
            p.identity.rank = Some(rank(r, local));
            p.identity.pod_uid = Some(pod.clone());
            p.identity.cgroup = Some(cgroup.into());
        }
        let (main, worker, other) = (s.processes[0].pid, s.processes[1].pid, s.processes[2].pid);
        let (pids, shared) = process_frames(&s);
        let frame = |pid| {
            let p = s.processes.iter().find(|p| p.pid == pid).unwrap();
            crate::model::identity::named(&p.comm, Some(&p.identity)).into_owned()
        };
        assert_eq!(frame(main), frame(worker));
        assert_eq!(pids.get(&frame(other)), Some(&other), "its own frame: its pid");
        assert!(!pids.contains_key(&frame(main)), "a shared frame has no pid");
        let mut common = shared[&frame(main)].clone();
        common.sort();
        assert_eq!(common, [("pod_uid", pod), ("rank", "0".into()), ("world_size", "8".into())]);
    }

    /// arm64 6.1: the fault start is the software event PAGE_FAULTS (no
    /// access type): WRITE is "-" with a line saying why, null in
    /// summary.json, never a 0 that reads as measured. Where do_wp_page took
    /// no program, COW too.
    #[test]
    fn counts_the_probes_cannot_take_are_said_not_printed_as_zero() {
        use crate::model::ProbeInfo;
        let golden =
            fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json")).unwrap();
        let mut s: Summary = serde_json::from_str(&golden).unwrap();
        s.mark_uncounted();
        assert_eq!(s.totals.uncounted, 0, "x86 probes count everything");
        assert!(!text::render(&s).contains("not counted: the fault start"));
        let probe = |what: &str, program_type: &str, target: &str, reason: Option<&str>| ProbeInfo {
            what: what.into(),
            program_type: program_type.into(),
            target: target.into(),
            fallback_reason: reason.map(str::to_string),
        };
        s.probes = vec![
            probe(
                "fault start",
                "perf_event",
                "sw PAGE_FAULTS period 1 on 2 CPUs (no access type: write and exec faults not counted)",
                Some("fentry handle_mm_fault: refused"),
            ),
            probe("COW faults", "kprobe", "do_wp_page", Some("fentry do_wp_page: refused")),
        ];
        s.mark_uncounted();
        let txt = text::render(&s);
        assert!(
            txt.contains(
                "fault start: taken through perf events instead (no access type: write and exec faults not counted)"
            ),
            "{txt}"
        );
        assert!(
            txt.contains("WRITE (and exec) not counted: the fault start is the software event PAGE_FAULTS"),
            "{txt}"
        );
        assert!(!txt.contains("COW not counted"), "{txt}");
        let all = txt.lines().find(|l| l.trim_start().starts_with("all ")).unwrap_or_else(|| panic!("{txt}"));
        let cols: Vec<&str> = all.split_whitespace().collect();
        // all, N, processes, FAULTS, MINOR, MAJOR, WRITE, COW
        assert_eq!(cols[6], "-", "{all}");
        assert_ne!(cols[7], "-", "{all}");
        let v = serde_json::to_value(&s).unwrap();
        assert!(v["totals"]["write"].is_null() && v["processes"][0]["faults"]["write"].is_null(), "{}", v["totals"]);
        assert!(v["totals"]["cow"].is_u64());
        // No program on do_wp_page: COW is "-" and null too.
        s.probes[1] = probe(
            "COW faults",
            "none",
            "do_wp_page",
            Some("fentry do_wp_page: refused; kprobe do_wp_page: refused; COW faults are not counted (faults.cow is null)"),
        );
        s.mark_uncounted();
        let txt = text::render(&s);
        assert!(txt.contains("COW not counted: neither fentry nor a kprobe on do_wp_page attached"), "{txt}");
        assert!(txt.contains("COW faults: not recorded on this kernel"), "{txt}");
        let v = serde_json::to_value(&s).unwrap();
        assert!(v["totals"]["cow"].is_null() && v["processes"][1]["faults"]["cow"].is_null());
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(text::render(&back), txt, "summary.json reads back to the same summary.txt");
    }

    /// Every fault meant to be timed: those counted without an end are said.
    #[test]
    fn faults_counted_without_an_end_are_said() {
        let golden =
            fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json")).unwrap();
        let mut s: Summary = serde_json::from_str(&golden).unwrap();
        s.sampling.minor_latency_period = 1;
        s.sampling.fast_sample_period = None;
        s.totals.timed = s.totals.total;
        assert_eq!(text::unended_line(&s), None);
        s.totals.total = 761;
        s.totals.timed = 746;
        let line = text::unended_line(&s).unwrap();
        assert!(line.starts_with("not timed: 15 of 761 faults (their end was not seen"), "{line}");
        assert!(text::render(&s).contains(&line));
        // Sampled on purpose: nothing to say.
        s.sampling.fast_sample_period = Some(16);
        assert_eq!(text::unended_line(&s), None);
    }

    #[test]
    fn a_file_that_fails_is_named_and_the_rest_are_still_written() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where summary.txt goes: writing it fails, alone.
        fs::create_dir(dir.path().join("summary.txt")).unwrap();
        let s: Summary = serde_json::from_str(
            &fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json")).unwrap(),
        )
        .unwrap();
        let failed = write_recording(dir.path(), &s, &StackOutputs { faults: None, mm_sites: None, resident: None });
        assert_eq!(failed.iter().map(|f| f.file.as_str()).collect::<Vec<_>>(), ["summary.txt"]);
        assert!(failed[0].to_string().starts_with("summary.txt: "), "{}", failed[0]);
        for f in ["summary.json", "regions.txt", "report.html"] {
            assert!(dir.path().join(f).is_file(), "{f} still written");
        }
    }

    #[test]
    fn folded_rows_read_as_such_and_regions_txt_stays_short() {
        let mut s = crate::model::fold::tests::summary();
        // Many more regions than regions.txt lists, none folded.
        let many = s.clone();
        let txt = text::render_regions(&many);
        assert!(txt.lines().count() < text::REGIONS_TXT_ROWS + 10, "{} lines", txt.lines().count());
        let more = many.regions.as_ref().unwrap().len() - text::REGIONS_TXT_ROWS;
        assert!(txt.contains(&format!("({more} more regions)")), "{txt}");
        assert!(text::render(&many).contains("Top regions by fault time (the first 500 in regions.txt)"));
        crate::model::fold(&mut s, 0.1);
        let summary = text::render(&s);
        assert!(summary.contains("  other  481 processes"), "{summary}");
        assert!(summary.contains("under the folding threshold: sed×321, bash×160"), "{summary}");
        assert!(summary.contains("    all  501 processes"), "{summary}");
        let regions = text::render_regions(&s);
        assert!(regions.contains("(200 regions)"), "{regions}");
        assert!(regions.contains("summed in \"(N regions)\" rows (--regions all lists each)"), "{regions}");
    }

    #[test]
    fn summary_txt_lists_the_largest_storms_in_time_order() {
        let mut s = crate::model::fold::tests::summary();
        let storm = |i: u64| crate::model::Storm {
            pid: 100,
            comm: "trainer".into(),
            start_s: i as f64,
            end_s: i as f64 + 0.5,
            peak_per_s: 5000,
            shootdowns: 1000 + (i * 7) % 30,
            top_stack: vec!["main".into(), "[munmap]".into()],
            top_call: "munmap".into(),
            top_share: 1.0,
            malloc_settings: std::collections::BTreeMap::new(),
        };
        s.storms = Some((0..30).map(storm).collect());
        let txt = text::render(&s);
        let starts: Vec<&str> =
            txt.lines().filter_map(|l| l.strip_prefix("STORM ")).map(|l| l.split('-').next().unwrap_or("")).collect();
        assert_eq!(starts.len(), 20, "{txt}");
        assert!(txt.contains("(10 more storms in summary.json)"), "{txt}");
        let t: Vec<f64> = starts.iter().map(|x| x.parse().unwrap()).collect();
        assert!(t.windows(2).all(|w| w[0] < w[1]), "{t:?}");
    }

    /// What `record` writes with every graph: the golden summary, with
    /// fault stacks, mmap-family call sites and resident stacks.
    fn record_every_graph(dir: &Path) -> Summary {
        let mut s: Summary = serde_json::from_str(
            &fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json")).unwrap(),
        )
        .unwrap();
        s.resident = Some(crate::model::ResidentSummary { sample_period: 1, ..Default::default() });
        // As `record` does.
        s.findings = Some(crate::model::findings::diagnose(&s));
        let pid = s.processes[0].pid;
        let stack = |user: &[&str], faults: f64, time_ns: f64, major: f64, cow: f64| Stack {
            pid,
            comm: "prog".into(),
            user: user.iter().map(|f| (*f).into()).collect(),
            estimate: crate::stacks::weight::Estimate { faults, time_ns, major, cow },
            ..Stack::default()
        };
        let faults = [
            stack(&["main", "load"], 60.0, 9000.0, 1.0, 0.0),
            stack(&["main", "fork_and_write"], 40.0, 800.0, 0.0, 40.0),
        ];
        let site = |frames: &[&str], calls, ipis| MmSite {
            pid,
            comm: "prog".into(),
            frames: frames.iter().map(|f| (*f).into()).collect(),
            calls,
            ipis,
        };
        let sites = [site(&["main", "[mmap]"], 30, 0), site(&["main", "free", "[munmap]"], 20, 19)];
        let end = [stack(&["main", "load"], 40960.0, 0.0, 0.0, 0.0)];
        let peak = [stack(&["main", "load"], 81920.0, 0.0, 0.0, 0.0), stack(&["main", "tmp"], 4096.0, 0.0, 0.0, 0.0)];
        let outputs = StackOutputs { faults: Some(&faults), mm_sites: Some(&sites), resident: Some((&end, &peak)) };
        assert!(write_recording(dir, &s, &outputs).is_empty());
        s
    }

    fn files_in(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().into_string().unwrap(), fs::read(e.path()).unwrap())
            })
            .collect()
    }

    /// `report DIR` writes every file `record` wrote but summary.json and
    /// the folded files it reads (and the Perfetto trace, which it cannot):
    /// every flamegraph, not only the fault ones. The text and folded files
    /// come out byte for byte the same.
    #[test]
    fn report_rebuilds_every_file_record_writes() {
        let dir = tempfile::tempdir().unwrap();
        record_every_graph(dir.path());
        let recorded = files_in(dir.path());
        let names: Vec<&str> = recorded.keys().map(String::as_str).collect();
        for g in GRAPHS {
            for f in graph_files(g.kind) {
                assert!(recorded.contains_key(&f), "record wrote no {f}: {names:?}");
            }
        }
        let kept = |f: &str| f == "summary.json" || f.ends_with(".folded");
        for f in recorded.keys().filter(|f| !kept(f)) {
            fs::remove_file(dir.path().join(f)).unwrap();
        }
        rebuild(dir.path()).expect("report DIR");
        let rebuilt = files_in(dir.path());
        assert_eq!(rebuilt.keys().collect::<Vec<_>>(), recorded.keys().collect::<Vec<_>>(), "the same files");
        for f in ["summary.json", "summary.txt", "regions.txt"]
            .iter()
            .copied()
            .chain(names.iter().copied().filter(|f| f.ends_with(".folded")))
        {
            assert!(
                rebuilt[f] == recorded[f],
                "{f} rebuilt differs:\n{}\n---\n{}",
                String::from_utf8_lossy(&recorded[f]),
                String::from_utf8_lossy(&rebuilt[f])
            );
        }
        // The page embeds and links the same graphs as record's.
        let html = String::from_utf8_lossy(&rebuilt["report.html"]);
        for f in ["shootdowns.svg", "mmap.svg", "resident.svg", "resident-peak.svg", "major-faults.svg", "cow.pb.gz"] {
            assert!(html.contains(f), "report.html names no {f}");
        }
        let embedded = |h: &str| h.matches("<svg").count() + h.matches("data:image/svg").count();
        assert_eq!(embedded(&html), embedded(&String::from_utf8_lossy(&recorded["report.html"])));
    }

    #[test]
    fn every_graph_is_listed_once() {
        let mut stems: Vec<&str> = GRAPHS.iter().map(|g| g.kind.stem).collect();
        stems.sort_unstable();
        stems.dedup();
        assert_eq!(stems.len(), GRAPHS.len());
        assert!(GRAPHS.iter().all(|g| !g.unit.is_empty() && !g.title.is_empty()));
    }

    #[test]
    fn report_rebuilds_a_version_1_directory_and_writes_compact_json() {
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let dir = tempfile::tempdir().unwrap();
        fs::copy(golden.join("summary-v1.json"), dir.path().join("summary.json")).unwrap();
        let s = rebuild(dir.path()).expect("vmtrace report reads version 1");
        assert_eq!(s.version, 1);
        assert_eq!(fs::read_to_string(dir.path().join("regions.txt")).unwrap(), text::render_regions(&s));
        // Written again by this version: compact unless asked, either way the same summary.
        let out = tempfile::tempdir().unwrap();
        for pretty in [false, true] {
            let o = OutputOptions { pretty, ..Default::default() };
            assert!(write_recording_with(
                out.path(),
                &s,
                &StackOutputs { faults: None, mm_sites: None, resident: None },
                &o
            )
            .is_empty());
            let json = fs::read_to_string(out.path().join("summary.json")).unwrap();
            assert_eq!(json.lines().count() > 1, pretty);
            assert_eq!(serde_json::from_str::<Summary>(&json).unwrap(), s);
        }
    }
}
