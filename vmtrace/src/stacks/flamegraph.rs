//! Folded stacks (`comm;outer;…;inner weight`, what flamegraph.pl and inferno
//! read) and their SVGs.
use std::{fmt::Write as _, io, path::Path};

use super::Stack;
use crate::model::escape_html as escape;

/// What a flamegraph is weighted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    Faults,
    TimeNs,
    Major,
}

impl Weight {
    pub fn file_stem(self) -> &'static str {
        match self {
            Self::Faults => "faults",
            Self::TimeNs => "fault-time",
            Self::Major => "major-faults",
        }
    }
}

fn clean(frame: &str) -> String {
    // ';' separates frames and a trailing space-number is the weight.
    frame.replace(';', ":").replace('\n', " ")
}

/// One folded line's share from one process: what a pprof sample is.
#[derive(Clone, Debug, PartialEq)]
pub struct PidLine {
    /// The folded line's frames (`comm;outer;…;inner`), without its weight.
    pub line: String,
    pub pid: u32,
    /// The faulting region's leaf frame (`--leaf region`), also the line's last frame.
    pub region: Option<String>,
    pub weight: u64,
}

/// A folded line's weight before rounding (summed in stack order, as it
/// always was), by process (pids ascending), and its region leaf.
#[derive(Default)]
struct Shares {
    sum: f64,
    pids: Vec<(u32, f64)>,
    region: Option<String>,
}

/// Stacks weighted by `weight` merged into folded lines, each with its
/// processes' shares: identical frames (e.g. one stack over several address
/// blocks of one region, or two processes of one name) merge.
fn merge(stacks: &[Stack], weight: Weight) -> std::collections::BTreeMap<String, Shares> {
    let mut merged: std::collections::BTreeMap<String, Shares> = std::collections::BTreeMap::new();
    for s in stacks {
        let w = match weight {
            Weight::Faults => s.estimate.faults,
            Weight::TimeNs => s.estimate.time_ns,
            Weight::Major => s.estimate.major,
        };
        if w <= 0.0 {
            continue;
        }
        let mut line = clean(&s.comm);
        if s.user_missing && s.user.is_empty() {
            line.push_str(";[no user stack]");
        }
        for f in s.user.iter().chain(s.kernel.iter()).chain(s.leaf.iter()) {
            line.push(';');
            line.push_str(&clean(f));
        }
        let e = merged.entry(line).or_default();
        e.sum += w;
        match e.pids.binary_search_by_key(&s.pid, |p| p.0) {
            Ok(i) => e.pids[i].1 += w,
            Err(i) => e.pids.insert(i, (s.pid, w)),
        }
        if e.region.is_none() {
            e.region.clone_from(&s.leaf);
        }
    }
    merged
}

/// The merged lines' whole weights: each line's weight rounded so that the
/// lines still add up to the estimated total.
fn rounded(merged: &std::collections::BTreeMap<String, Shares>) -> Vec<u64> {
    let mut weights: Vec<f64> = merged.values().map(|e| e.sum).collect();
    crate::model::largest_remainder(&mut weights);
    weights.into_iter().map(|w| w as u64).collect()
}

/// Folded lines, one per stack with a non-zero weight, sorted: each stack
/// weighted by its estimate (`weight::weigh`), so a graph adds up to the
/// process table.
pub fn folded(stacks: &[Stack], weight: Weight) -> String {
    fold(&folded_by_pid(stacks, weight))
}

/// Folded text of lines split by process (sorted by line): each line's parts summed.
pub fn fold(parts: &[PidLine]) -> String {
    let mut out = String::new();
    for group in parts.chunk_by(|a, b| a.line == b.line) {
        let _ = writeln!(out, "{} {}", group[0].line, group.iter().map(|p| p.weight).sum::<u64>());
    }
    out
}

/// The lines of [`folded`] split by process: each line's whole weight shared
/// among its processes (largest remainder), so the parts add up to the
/// folded file's line by line.
pub fn folded_by_pid(stacks: &[Stack], weight: Weight) -> Vec<PidLine> {
    let merged = merge(stacks, weight);
    let mut out = Vec::new();
    for ((line, e), w) in merged.iter().zip(rounded(&merged)) {
        let shares: Vec<f64> = e.pids.iter().map(|p| p.1).collect();
        for ((pid, _), part) in e.pids.iter().zip(apportion(w, &shares)) {
            if part > 0 {
                out.push(PidLine { line: line.clone(), pid: *pid, region: e.region.clone(), weight: part });
            }
        }
    }
    out
}

/// `total` shared out in proportion to `shares` in whole parts that add up to it.
pub fn apportion(total: u64, shares: &[f64]) -> Vec<u64> {
    let sum: f64 = shares.iter().sum();
    if shares.is_empty() {
        return vec![];
    }
    if sum <= 0.0 {
        let mut parts = vec![0; shares.len()];
        parts[0] = total;
        return parts;
    }
    let exact: Vec<f64> = shares.iter().map(|s| s / sum * total as f64).collect();
    let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let left = total.saturating_sub(parts.iter().sum());
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    for &i in order.iter().cycle().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// Folded text from (frames outermost first, weight) pairs; identical stacks merge.
pub fn folded_lines(stacks: impl IntoIterator<Item = (Vec<String>, u64)>) -> String {
    fold(&folded_lines_by_pid(stacks.into_iter().map(|(f, w)| (0, f, w))))
}

/// [`folded_lines`] split by process: (pid, frames outermost first, weight)
/// merged per line and process, sorted by line then pid.
pub fn folded_lines_by_pid(stacks: impl IntoIterator<Item = (u32, Vec<String>, u64)>) -> Vec<PidLine> {
    let mut merged: std::collections::BTreeMap<(String, u32), u64> = std::collections::BTreeMap::new();
    for (pid, frames, w) in stacks {
        if w > 0 {
            let line = frames.iter().map(|f| clean(f)).collect::<Vec<_>>().join(";");
            *merged.entry((line, pid)).or_default() += w;
        }
    }
    merged.into_iter().map(|((line, pid), weight)| PidLine { line, pid, region: None, weight }).collect()
}

/// Total weight of folded text.
pub fn total(folded: &str) -> u64 {
    folded.lines().filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum()
}

/// Writes `stem.folded` and `stem.svg` into `dir`.
pub fn write(dir: &Path, stem: &str, folded: &str, title: &str, count_name: &str) -> io::Result<()> {
    std::fs::write(dir.join(format!("{stem}.folded")), folded)?;
    write_svg(&dir.join(format!("{stem}.svg")), folded, title, count_name)
}

/// The SVG alone (the folded file written apart, so a failure names its file).
pub fn write_svg(svg: &Path, folded: &str, title: &str, count_name: &str) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    title.clone_into(&mut opts.title);
    count_name.clone_into(&mut opts.count_name);
    opts.deterministic = true;
    if folded.is_empty() {
        // inferno refuses empty input; an empty picture that says so is better than none.
        let msg = format!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" height=\"60\" \
             xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"30\" text-anchor=\"middle\">{} — no samples</text></svg>\n",
            escape(title)
        );
        return std::fs::write(svg, msg);
    }
    let file = std::fs::File::create(svg)?;
    let mut out = io::BufWriter::new(file);
    inferno::flamegraph::from_lines(&mut opts, folded.lines(), &mut out).map_err(io::Error::other)?;
    // A full disk may only show when the buffer is flushed: say so, not drop it.
    io::Write::flush(&mut out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtrace_common::StackCounts;

    fn stack(user: &[&str], faults: u64, time: u64) -> Stack {
        let f = faults as f64;
        Stack {
            pid: 1,
            comm: "train".into(),
            user: user.iter().map(ToString::to_string).collect(),
            counts: StackCounts { faults, major: 1, time_ns: time, timed: 1 },
            estimate: super::super::weight::Estimate { faults: f * 4.0, time_ns: time as f64 * 2.0, major: 0.0 },
            ..Stack::default()
        }
    }

    #[test]
    fn folded_is_root_first_and_weighted_by_the_estimate() {
        let s = [
            stack(&["main", "load;weights"], 2, 500),
            stack(&["main", "init"], 1, 0),
            stack(&["main", "load;weights"], 1, 0),
        ];
        let f = folded(&s, Weight::Faults);
        assert_eq!(f, "train;main;init 4\ntrain;main;load:weights 12\n");
        assert_eq!(total(&f), 16);
        assert_eq!(folded(&s, Weight::TimeNs), "train;main;load:weights 1000\n");
        assert_eq!(folded(&s, Weight::Major), "");
    }

    #[test]
    fn split_by_process_adds_up_to_each_folded_line() {
        let mut s =
            vec![stack(&["main", "load"], 3, 0), stack(&["main", "load"], 1, 0), stack(&["main", "init"], 1, 0)];
        s[1].pid = 2;
        s[2].leaf = Some("[heap]".into());
        let by_pid = folded_by_pid(&s, Weight::Faults);
        assert_eq!(
            by_pid,
            [
                PidLine { line: "train;main;init;[heap]".into(), pid: 1, region: Some("[heap]".into()), weight: 4 },
                PidLine { line: "train;main;load".into(), pid: 1, region: None, weight: 12 },
                PidLine { line: "train;main;load".into(), pid: 2, region: None, weight: 4 },
            ]
        );
        assert_eq!(by_pid.iter().map(|p| p.weight).sum::<u64>(), total(&folded(&s, Weight::Faults)));
    }

    #[test]
    fn apportion_keeps_the_total() {
        assert_eq!(apportion(10, &[1.0, 1.0, 1.0]), [4, 3, 3]);
        assert_eq!(apportion(1, &[0.2, 0.7]), [0, 1]);
        assert_eq!(apportion(5, &[0.0, 0.0]), [5, 0]);
        assert_eq!(apportion(0, &[2.0]), [0]);
        assert!(apportion(3, &[]).is_empty());
    }

    #[test]
    fn small_shares_still_add_up_to_the_total() {
        // Ten stacks of 0.4 faults each: rounding each alone would draw none.
        let s: Vec<Stack> = (0..10)
            .map(|i| Stack {
                comm: "tar".into(),
                user: vec![format!("f{i}")],
                estimate: super::super::weight::Estimate { faults: 0.4, ..Default::default() },
                ..Stack::default()
            })
            .collect();
        assert_eq!(total(&folded(&s, Weight::Faults)), 4);
    }

    #[test]
    fn svg_is_written_even_when_empty() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "faults", "", "Page faults", "faults").unwrap();
        let svg = std::fs::read_to_string(d.path().join("faults.svg")).unwrap();
        assert!(svg.contains("no samples"));
        write(d.path(), "faults", "train;main 5\n", "Page faults", "faults").unwrap();
        let svg = std::fs::read_to_string(d.path().join("faults.svg")).unwrap();
        assert!(svg.contains("main") && svg.starts_with("<?xml"));
    }
}
