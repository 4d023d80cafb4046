//! What a trace leaves behind: `summary.json` (for tools) and `summary.txt` (for people).
pub mod html;
pub mod stream;
pub mod text;

use std::{fs, io, path::Path};

use crate::{
    model::{fmt_ns, MmSite, Sampling, StacksSummary, Summary},
    stacks::{
        flamegraph::{self, Weight},
        Stack,
    },
};

/// Writes every output of a recording into `dir`.
pub fn write_all(dir: &Path, s: &Summary) -> io::Result<()> {
    let json = serde_json::to_string_pretty(s).map_err(io::Error::other)?;
    fs::write(dir.join("summary.json"), json + "\n")?;
    fs::write(dir.join("summary.txt"), text::render(s))?;
    if s.regions.is_some() {
        fs::write(dir.join("regions.txt"), text::render_regions(s))?;
    }
    fs::write(dir.join("report.html"), html::render(s, dir))?;
    Ok(())
}

/// Writes the folded stacks and flamegraphs of a recording; returns the file names.
pub fn write_flamegraphs(
    dir: &Path,
    stacks: &[Stack],
    st: &StacksSummary,
    sampling: &Sampling,
) -> io::Result<Vec<String>> {
    let n = u64::from(st.sample_period.max(1));
    // Say plainly what the total is and where it is an estimate.
    let how = if n > 1 {
        let slow = match st.exact_faults {
            1 => "the 1 slow fault (slept or huge) with its own stack".to_string(),
            k => format!("all {k} slow faults (slept or huge) with their own stacks"),
        };
        format!("estimated: {slow}, the rest from 1 in {n} faults")
    } else {
        "a stack on every fault".to_string()
    };
    let timing = match sampling.minor_latency_period {
        0 => "minor faults untimed; ".to_string(),
        1 => "every fault timed; ".to_string(),
        p => format!("minor latency timed 1 in {p}; "),
    };
    let mut files = Vec::new();
    for (w, title, unit) in [
        (Weight::Faults, "Page faults by call stack", "faults"),
        (Weight::TimeNs, "Time in the fault handler by call stack", "ns"),
        (Weight::Major, "Major faults by call stack", "faults"),
    ] {
        let f = flamegraph::folded(stacks, w);
        let total = flamegraph::total(&f);
        let total_text = if w == Weight::TimeNs { fmt_ns(total) } else { format!("{total} {unit}") };
        let extra = if w == Weight::TimeNs { format!("{timing}{how}") } else { how.clone() };
        flamegraph::write(dir, w.file_stem(), &f, &format!("{title} — {total_text} ({extra})"), unit)?;
        files.push(format!("{}.svg", w.file_stem()));
        files.push(format!("{}.folded", w.file_stem()));
    }
    Ok(files)
}

/// `mmap.{svg,folded}` (call sites of mmap-family syscalls by calls) and
/// `shootdowns.{svg,folded}` (by TLB-flush IPIs sent while the call ran).
pub fn write_mm_flamegraphs(dir: &Path, sites: &[MmSite]) -> io::Result<()> {
    for (stem, title, unit) in [
        ("mmap", "mmap-family calls by call site", "calls"),
        ("shootdowns", "TLB shootdown IPIs sent, by initiating call site", "IPIs"),
    ] {
        let lines = sites.iter().map(|s| {
            let w = if stem == "mmap" { s.calls } else { s.ipis };
            (std::iter::once(s.comm.clone()).chain(s.frames.iter().cloned()).collect::<Vec<_>>(), w)
        });
        let f = flamegraph::folded_lines(lines);
        let total = flamegraph::total(&f);
        flamegraph::write(dir, stem, &f, &format!("{title} — {total} {unit}"), unit)?;
    }
    Ok(())
}

/// Rebuilds the human outputs of a recorded directory from its `summary.json`.
pub fn rebuild(dir: &Path) -> Result<Summary, String> {
    let path = dir.join("summary.json");
    let data = fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let s: Summary =
        serde_json::from_str(&data).map_err(|e| format!("{} is not a vmtrace summary: {e}", path.display()))?;
    fs::write(dir.join("summary.txt"), text::render(&s)).map_err(|e| format!("cannot write {}: {e}", dir.display()))?;
    if s.regions.is_some() {
        fs::write(dir.join("regions.txt"), text::render_regions(&s))
            .map_err(|e| format!("cannot write regions.txt: {e}"))?;
    }
    // Flamegraphs from the folded stacks saved beside them.
    for w in [Weight::Faults, Weight::TimeNs, Weight::Major] {
        let folded_path = dir.join(format!("{}.folded", w.file_stem()));
        if let Ok(f) = fs::read_to_string(&folded_path) {
            let unit = if w == Weight::TimeNs { "ns" } else { "faults" };
            let title = format!("{} — {} {unit} (rebuilt by vmtrace report)", w.file_stem(), flamegraph::total(&f));
            flamegraph::write(dir, w.file_stem(), &f, &title, unit)
                .map_err(|e| format!("cannot write flamegraph: {e}"))?;
        }
    }
    Ok(s)
}
