//! The session's side of Python frames: finds the Pythons among traced
//! processes as their maps are read, registers them with the programs, and
//! reads the code objects of new stacks while their processes live.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::{process::ProcessTable, AggregateSource};
use crate::python::{
    detect::{Detected, Detector},
    CodeCache, PyStack,
};

/// How long a process is looked at again for a Python after it was first
/// seen: the loader maps libpython shortly after exec.
const LOOK_FOR: Duration = Duration::from_secs(3);

/// What a process runs: its name and how many execs it made while traced.
type Program = (String, u32);

#[derive(Default)]
pub(crate) struct Tracker {
    detector: Detector,
    pub codes: CodeCache,
    /// Per process: the program it ran when last looked at, since when it
    /// has been looked at, and whether that is settled (registered, unknown,
    /// or not Python). After an exec it is looked at again, even under the
    /// same name: a spawned worker is a Python forked and exec'd into
    /// Python, and what was registered between is the parent's layout.
    seen: HashMap<u32, (Program, Instant, bool)>,
    /// Stacks of processes not registered yet (a forked child the kernel
    /// follows before this tick found it): read once they are.
    pending: Vec<(Instant, PyStack)>,
    /// Pythons this build has no offsets for (for summary.json).
    pub unknown: Vec<String>,
}

impl Tracker {
    /// On every poll: re-reads the maps of processes named like a Python
    /// that are not registered yet, and looks at them. The loader maps
    /// libpython within milliseconds of the exec, and the script faults soon
    /// after: waiting for the 100 ms tick left a few % of a short script's
    /// faults without Python frames.
    pub(crate) fn look_at_young(&mut self, now: Instant, table: &mut ProcessTable, source: &mut impl AggregateSource) {
        let due: Vec<u32> = table
            .live()
            .filter(|(_, p)| p.exit_code.is_none() && p.comm.starts_with("python"))
            .filter(|(pid, p)| match self.seen.get(pid) {
                Some((prog, _, settled)) => prog.0 != p.comm || prog.1 != p.execs || !settled,
                None => true,
            })
            .map(|(pid, _)| pid)
            .collect();
        for pid in due {
            // Maps read at this generation already are the maps now.
            let gen = source.map_gen(pid);
            let p = table.get(pid);
            if gen.is_none() || p.is_none_or(|p| p.maps.is_empty() || p.maps_gen != gen) {
                let source = &*source;
                table.snapshot_maps_at(pid, &|p| source.map_gen(p));
            }
            self.look(now, table, source, Some(pid));
        }
    }

    /// `pid` exited: its detection state and its registration with the
    /// programs go (`PY_PROCS` holds 4,096 processes: with churn, later
    /// Pythons would find it full); its code objects stay, for its stacks.
    pub(crate) fn exited(&mut self, pid: u32, source: &mut impl AggregateSource) {
        if self.seen.remove(&pid).is_some_and(|(_, _, settled)| settled) {
            source.forget_python(pid);
        }
    }

    /// Looks for new Pythons, then reads the code objects of new stacks.
    pub(crate) fn tick(&mut self, now: Instant, table: &ProcessTable, source: &mut impl AggregateSource) {
        self.look(now, table, source, None);
        self.read_codes(now, source);
    }

    /// Looks at `only`, or at every process not settled.
    fn look(&mut self, now: Instant, table: &ProcessTable, source: &mut impl AggregateSource, only: Option<u32>) {
        let pids: Vec<u32> = match only {
            Some(pid) => vec![pid],
            None => table.live_pids().iter().copied().collect(),
        };
        for (pid, p) in pids.into_iter().filter_map(|pid| table.get(pid).map(|p| (pid, p))) {
            if p.exit_code.is_some() || p.maps.is_empty() {
                continue;
            }
            let prog = (p.comm.clone(), p.execs);
            let entry = self.seen.entry(pid).or_insert_with(|| (prog.clone(), now, false));
            if entry.0 != prog {
                if entry.2 {
                    // The old program's registration would read the new one's
                    // memory at the old addresses.
                    source.forget_python(pid);
                    self.codes.forget(pid);
                }
                *entry = (prog, now, false);
            }
            if entry.2 {
                continue;
            }
            match self.detector.detect(&p.maps, p.root.as_deref()) {
                Detected::Known(f) => {
                    if source.register_python(pid, &f.proc) {
                        self.codes.set_layout(pid, f.code);
                    }
                    entry.2 = true;
                }
                Detected::Unknown(what) => {
                    if !self.unknown.contains(&what) {
                        log::info!("python frames: no offsets for {what}; its stacks stay native");
                        self.unknown.push(what);
                    }
                    entry.2 = true;
                }
                Detected::None => entry.2 = now.saturating_duration_since(entry.1) > LOOK_FOR,
            }
        }
    }

    /// Reads the code objects of stacks the programs announced as stored, at
    /// once: the process may exit within milliseconds of its last fault.
    pub(crate) fn read_stored(&mut self, now: Instant, ids: &[u32], source: &mut impl AggregateSource) {
        let stacks = source.stored_python_stacks(ids);
        self.resolve(now, stacks.into_iter().map(|s| (now, s)));
    }

    /// Reads the code objects of stacks drained from the kernel map before
    /// they were looked at (`stacks::drain`).
    pub(crate) fn read_drained(&mut self, now: Instant, stacks: Vec<crate::python::PyStack>) {
        if !stacks.is_empty() {
            self.resolve(now, stacks.into_iter().map(|s| (now, s)));
        }
    }

    /// Reads the code objects of the stacks stored since the last call.
    fn read_codes(&mut self, now: Instant, source: &mut impl AggregateSource) {
        if !self.codes.any() {
            return;
        }
        let fresh = source.new_python_stacks().into_iter().map(|s| (now, s));
        self.resolve(now, fresh);
    }

    /// Reads the code objects of `fresh` stacks and of those pending, or
    /// keeps them pending while their process is not registered yet.
    fn resolve(&mut self, now: Instant, fresh: impl Iterator<Item = (Instant, PyStack)>) {
        let all: Vec<_> = std::mem::take(&mut self.pending).into_iter().chain(fresh).collect();
        for (since, s) in all {
            if self.codes.has_layout(s.tgid) {
                self.codes.resolve(&s);
            } else if now.saturating_duration_since(since) < LOOK_FOR {
                self.pending.push((since, s));
            }
        }
    }
}
