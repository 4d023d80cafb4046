//! Folded stacks (`comm;outer;…;inner weight`, what flamegraph.pl and inferno
//! read) and their SVGs.
use std::{fmt::Write as _, io, path::Path};

use super::Stack;

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

/// Folded lines, one per stack with a non-zero weight, sorted: each stack
/// weighted by its estimate (`weight::weigh`), so a graph adds up to the
/// process table.
pub fn folded(stacks: &[Stack], weight: Weight) -> String {
    // Identical frames (e.g. one stack over several address blocks of one region) merge.
    let mut merged: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
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
        *merged.entry(line).or_default() += w;
    }
    // Rounded so that the lines still add up to the estimated total.
    let mut weights: Vec<f64> = merged.values().copied().collect();
    crate::model::largest_remainder(&mut weights);
    let mut out = String::new();
    for (line, w) in merged.keys().zip(weights) {
        let w = w as u64;
        if w > 0 {
            let _ = writeln!(out, "{line} {w}");
        }
    }
    out
}

/// Folded text from (frames outermost first, weight) pairs; identical stacks merge.
pub fn folded_lines(stacks: impl IntoIterator<Item = (Vec<String>, u64)>) -> String {
    let mut merged: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (frames, w) in stacks {
        if w > 0 {
            let line = frames.iter().map(|f| clean(f)).collect::<Vec<_>>().join(";");
            *merged.entry(line).or_default() += w;
        }
    }
    let mut out = String::new();
    for (line, w) in merged {
        let _ = writeln!(out, "{line} {w}");
    }
    out
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

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
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
