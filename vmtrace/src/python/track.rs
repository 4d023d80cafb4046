//! The session's side of Python frames: finds the Pythons among traced
//! processes as their maps are read, registers them with the programs, and
//! reads the code objects of new stacks while their processes live.
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use super::{
    detect::{Detected, Detector},
    CodeCache,
};
use crate::collect::{process::ProcessTable, AggregateSource};

/// How long a process is looked at again for a Python after it was first
/// seen: the loader maps libpython shortly after exec.
const LOOK_FOR: Duration = Duration::from_secs(3);

#[derive(Default)]
pub struct Tracker {
    detector: Detector,
    pub codes: CodeCache,
    /// Processes settled: registered, unknown, or not Python.
    settled: HashSet<u32>,
    /// Pythons this build has no offsets for (for summary.json).
    pub unknown: Vec<String>,
}

impl Tracker {
    /// Looks for new Pythons, then reads the code objects of new stacks.
    pub fn tick(&mut self, now: Instant, table: &ProcessTable, source: &mut impl AggregateSource) {
        for (&pid, p) in &table.procs {
            if self.settled.contains(&pid) || p.exit_code.is_some() || p.maps.is_empty() {
                continue;
            }
            match self.detector.detect(&p.maps) {
                Detected::Known(f) => {
                    if source.register_python(pid, &f.proc) {
                        self.codes.set_layout(pid, f.code);
                    }
                    self.settled.insert(pid);
                }
                Detected::Unknown(what) => {
                    if !self.unknown.contains(&what) {
                        log::info!("python frames: no offsets for {what}; its stacks stay native");
                        self.unknown.push(what);
                    }
                    self.settled.insert(pid);
                }
                Detected::None => {
                    if now.saturating_duration_since(p.first_seen) > LOOK_FOR {
                        self.settled.insert(pid);
                    }
                }
            }
        }
        if self.codes.any() {
            for s in source.new_python_stacks() {
                self.codes.resolve(&s);
            }
        }
    }
}
