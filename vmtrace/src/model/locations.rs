//! The top code locations: where in the program's own code the faults, their
//! time and the resident memory come from, so "which line?" needs no
//! flamegraph. A location is the stack's innermost Python line, else its
//! innermost native frame that is not libc's, the allocator's or a language
//! runtime's (`stacks::locations` picks it).
use serde::{Deserialize, Serialize};

/// A list with its title and how its values read.
pub type Listed<'a> = (&'a str, &'a Vec<CodeLocation>, fn(u64) -> String);

/// One code location and its share of a total.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CodeLocation {
    /// `function (file.py:LINE)`, or a native function (short name).
    pub location: String,
    /// The process name with most of its weight.
    pub comm: String,
    /// Faults, ns, or bytes, as the list says (estimated from the sampled stacks).
    pub value: u64,
    /// Of the list's whole (every stack's weight), in %.
    pub share_pct: f64,
}

/// `code_locations` in summary.json (with `--stacks`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CodeLocations {
    /// By time in the fault handler (ns).
    pub by_fault_time: Vec<CodeLocation>,
    /// By faults.
    pub by_faults: Vec<CodeLocation>,
    /// By bytes resident at each process's peak (`--events resident`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_resident: Vec<CodeLocation>,
}

impl CodeLocations {
    /// At most this many per list.
    pub const TOP: usize = 10;

    /// The lists as summary.txt shows them, after the findings.
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s =
            String::from("Top code locations (the Python line, else the first frame of the program's own code):\n");
        let lists: [Listed<'_>; 3] = [
            ("by fault time", &self.by_fault_time, super::fmt_ns),
            ("by faults", &self.by_faults, |v| v.to_string()),
            ("by resident bytes at peak", &self.by_resident, super::bytes),
        ];
        for (what, list, fmt) in lists {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(s, "  {what}:");
            for l in list.iter().take(5) {
                let _ = writeln!(s, "    {:>10} {:>5.1}%  {} [{}]", fmt(l.value), l.share_pct, l.location, l.comm);
            }
        }
        s
    }
}
