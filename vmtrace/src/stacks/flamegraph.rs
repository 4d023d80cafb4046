//! Folded stacks (`comm;outer;…;inner weight`, what flamegraph.pl and inferno
//! read) and their SVGs.
use std::{fmt::Write as _, io, path::Path};

pub use super::weight::{apportion, Weight, SMALL_STACKS};
use super::Stack;
use crate::model::escape_html as escape;

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

/// Folded lines, one per stack with a non-zero weight, sorted: each stack
/// weighted by its estimate (`weight::weigh`), so a graph adds up to the
/// process table. Identical frames (e.g. one stack over several address
/// blocks of one region, or two processes of one name) merge.
pub fn folded(stacks: &[Stack], weight: Weight) -> String {
    super::tree::Tree::new(stacks).graph(stacks, weight).folded()
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
/// folded file's line by line. A string per line: for many stacks, walk
/// [`super::tree::Graph`]'s lines instead.
pub fn folded_by_pid(stacks: &[Stack], weight: Weight) -> Vec<PidLine> {
    let tree = super::tree::Tree::new(stacks);
    let graph = tree.graph(stacks, weight);
    let mut out = Vec::new();
    for l in &graph.lines {
        let mut line = None;
        for (pid, weight) in l.parts() {
            let line = line.get_or_insert_with(|| tree.line(l.node)).clone();
            out.push(PidLine { line, pid, region: l.region.map(str::to_string), weight });
        }
    }
    out
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

/// A frame weighing less than this share of a graph's total is folded into
/// its caller: 4 px of the 1,200 px picture, too narrow to hold a name
/// (inferno itself leaves out frames under 0.1 px). `record -- python -c
/// 'import torch'` wrote 40.7 MB before, 6.4 MB at 1/500, under 5 MB at
/// this width (docs/performance.md).
pub const MIN_SHARE: f64 = 1.0 / 300.0;

/// `folded` with every frame that weighs less than `min_share` of the total
/// (with all the stacks through it) folded into its caller: the stacks
/// through it end in one `[small stacks folded]` frame there, weights kept, so
/// the lines still add up to the same total and every frame shown keeps its
/// weight. A `[shared with parent]` leaf stays after it ([`super::weight::kept_leaf`]). What inferno's minimum width does to the picture, done to the
/// text, which keeps the files small (a stack on every fault of a long job
/// makes hundreds of thousands of distinct lines). The pprof profiles keep
/// every stack.
pub fn fold_small(folded: &str, min_share: f64) -> String {
    let lines: Vec<(&str, u64)> = folded
        .lines()
        .filter_map(|l| {
            let (stack, w) = l.rsplit_once(' ')?;
            Some((stack, w.parse().ok()?))
        })
        .collect();
    let total: u64 = lines.iter().map(|l| l.1).sum();
    let min = (total as f64 * min_share).ceil() as u64;
    if min <= 1 {
        return folded.to_string();
    }
    // The weight of every stack prefix, as a tree of frames: (parent, frame) -> node.
    let mut nodes: crate::hash::HashMap<(u32, &str), u32> = crate::hash::HashMap::default();
    let mut weights: Vec<u64> = vec![0];
    let mut paths: Vec<Vec<u32>> = Vec::with_capacity(lines.len());
    for (stack, w) in &lines {
        let mut at = 0u32;
        let mut path = Vec::new();
        for frame in stack.split(';') {
            let next = weights.len() as u32;
            let n = *nodes.entry((at, frame)).or_insert(next);
            if n == next {
                weights.push(0);
            }
            weights[n as usize] += w;
            path.push(n);
            at = n;
        }
        paths.push(path);
    }
    let mut out: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for ((stack, w), path) in lines.iter().zip(&paths) {
        // The first frame too light to show, past the process's own.
        let cut = path.iter().skip(1).position(|&n| weights[n as usize] < min).map(|i| i + 1);
        let line = match cut {
            None => (*stack).to_string(),
            Some(i) => {
                let kept: Vec<&str> = stack.split(';').take(i).collect();
                match stack.rsplit(';').next().and_then(super::weight::kept_leaf) {
                    Some(leaf) => format!("{};{SMALL_STACKS};{leaf}", kept.join(";")),
                    None => format!("{};{SMALL_STACKS}", kept.join(";")),
                }
            }
        };
        *out.entry(line).or_default() += w;
    }
    let mut text = String::new();
    for (line, w) in out {
        let _ = writeln!(text, "{line} {w}");
    }
    text
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
    let (title, subtitle) = split_title(title);
    title.clone_into(&mut opts.title);
    opts.subtitle = subtitle.map(str::to_string);
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

/// Characters of a title line that fit a 1,200 px flamegraph: inferno
/// draws titles at 17 px, about 10 px a character, centred.
pub const TITLE_CHARS: usize = 80;

/// A title too long for one line of the picture, split before its
/// parenthesised explanation: (title, subtitle).
pub fn split_title(title: &str) -> (&str, Option<&str>) {
    if title.chars().count() <= TITLE_CHARS {
        return (title, None);
    }
    match title.find(" (") {
        Some(i) => (&title[..i], Some(title[i + 1..].trim())),
        None => (title, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtrace_common::StackCounts;

    #[test]
    fn small_frames_fold_into_their_caller_and_the_total_stays() {
        let folded = "p;a;b 900\np;a;c 60\np;a;d;e 30\np;a;d;f 9\np;g 1\n";
        let small = fold_small(folded, 0.05);
        // d (39) is under 5% of 1000 (50), so are g and c's... c is 60: kept.
        assert_eq!(small, "p;[small stacks folded] 1\np;a;[small stacks folded] 39\np;a;b 900\np;a;c 60\n");
        assert_eq!(total(&small), total(folded));
        // Nothing to fold: the text is kept as it was.
        assert_eq!(fold_small(folded, 0.0), folded);
    }

    /// uc32: a DataLoader worker's shared pages, too light stack by stack,
    /// showed as its own in resident.svg once folded.
    #[test]
    fn a_folded_stack_keeps_its_shared_with_parent_leaf() {
        let folded = "w;a;b 900\nw;a;c;[shared with parent] 30\nw;a;d;[shared with parent] 20\nw;a;e 10\n";
        let small = fold_small(folded, 0.05);
        assert_eq!(
            small,
            "w;a;[small stacks folded] 10\nw;a;[small stacks folded];[shared with parent] 50\nw;a;b 900\n"
        );
        assert_eq!(total(&small), total(folded));
    }

    fn stack(user: &[&str], faults: u64, time: u64) -> Stack {
        let f = faults as f64;
        Stack {
            pid: 1,
            comm: "train".into(),
            user: user.iter().map(|f| (*f).into()).collect(),
            counts: StackCounts { faults, major: 1, time_ns: time, timed: 1, cow: 0 },
            estimate: super::super::weight::Estimate {
                faults: f * 4.0,
                time_ns: time as f64 * 2.0,
                ..Default::default()
            },
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
                user: vec![format!("f{i}").into()].into(),
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
