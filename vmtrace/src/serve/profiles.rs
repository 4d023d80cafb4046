//! `/debug/pprof/<name>`: the recording's pprof profiles, live. Each is the
//! whole trace so far (cumulative, as `faults.pb.gz` of a recording that
//! ended now), or with `?seconds=N` what changed over the next N seconds: the
//! difference of two cumulative profiles, which Parca (`delta: true`) and
//! Grafana Alloy's `pyroscope.scrape` ask for.
use crate::hash::HashMap;
use std::{collections::BTreeMap, sync::Arc};

use crate::{
    export::pprof::{self, Kind, Sample},
    model::{Identity, LiveSnapshot, MmSite},
    stacks::{weight::Weight, Stack},
};

/// Every profile served: (name, what it weighs).
pub const NAMES: [(&str, &str); 7] = [
    ("faults", "page faults by call stack"),
    ("fault-time", "time in the fault handler by call stack (ns)"),
    ("major-faults", "major faults by call stack"),
    ("cow", "copy-on-write faults by call stack"),
    ("shootdowns", "TLB-shootdown IPIs sent by call site, and the calls that sent them"),
    ("mmap", "mmap-family calls by call site"),
    (
        "resident",
        "resident memory of the running processes by the call stack that faulted it in (bytes, now; no ?seconds)",
    ),
];

/// Profiles that are a gauge (what is held now), not a count since the start:
/// a window of one has no meaning.
pub fn is_gauge(kind: Kind) -> bool {
    kind.stem == pprof::RESIDENT.stem
}

/// The profile kind behind a served name.
pub fn kind_of(name: &str) -> Option<Kind> {
    Some(match name {
        "faults" => pprof::FAULTS,
        "fault-time" => pprof::FAULT_TIME,
        "major-faults" => pprof::MAJOR_FAULTS,
        "cow" => pprof::COW,
        "shootdowns" => pprof::SHOOTDOWNS,
        "mmap" => pprof::MMAP,
        "resident" => pprof::RESIDENT,
        _ => return None,
    })
}

/// One profile's samples at one moment of the trace.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub samples: Vec<Sample>,
    /// Seconds since the trace started.
    pub t_s: f64,
    /// Stacks were taken on 1 in `period` faults.
    pub period: u64,
    pub identities: BTreeMap<u32, Arc<Identity>>,
}

/// What the profiles are made of at one moment of the trace.
pub struct Inputs<'a> {
    /// The fault stacks, weighted to each process's counts.
    pub stacks: &'a [Stack],
    /// The mmap-family call sites.
    pub sites: &'a [MmSite],
    /// The running processes' resident memory by call stack (bytes in
    /// `estimate.faults`), when a job asked for it.
    pub resident: &'a [Stack],
    /// The identities of the pids that stand for folded processes
    /// (`collect::folded::FOLDED_IDENTITY_PIDS`): their samples are
    /// labelled with it, and with no pid.
    pub folded: &'a BTreeMap<u32, Arc<Identity>>,
}

/// The samples of `kind` now: from the weighted fault stacks, the resident
/// stacks or the call sites.
pub fn take(kind: Kind, inputs: &Inputs, snap: &LiveSnapshot, period: u64) -> Snapshot {
    let weight = |stacks: &[Stack], w| {
        let tree = crate::stacks::tree::Tree::new(stacks);
        pprof::graph_samples(kind, &tree.graph(stacks, w))
    };
    let mut samples = match kind.stem {
        "faults" => weight(inputs.stacks, Weight::Faults),
        "fault-time" => weight(inputs.stacks, Weight::TimeNs),
        "major-faults" => weight(inputs.stacks, Weight::Major),
        "cow" => weight(inputs.stacks, Weight::Cow),
        "resident" => weight(inputs.resident, Weight::Faults),
        _ => pprof::mm_samples(kind, inputs.sites),
    };
    for s in &mut samples {
        if let Some(pid) = s.pid.filter(|p| *p >= crate::collect::folded::FOLDED_IDENTITY_PIDS) {
            s.pid = None;
            if let Some(id) = inputs.folded.get(&pid) {
                s.labels.extend(id.labels());
            }
        }
    }
    let period = match kind.stem {
        "faults" | "fault-time" | "major-faults" | "cow" => period,
        "resident" => 4096,
        _ => 1,
    };
    Snapshot { samples, t_s: snap.t_s, period, identities: super::metrics::identities(snap) }
}

/// `now` less `before`, sample by sample (same frames, process and labels).
/// A stack's estimated share of its process can shrink as more stacks are
/// sampled: a value that went down is left out (pprof viewers take no
/// negative values), so a window's total can pass the difference of the
/// counters by what those shrank.
pub fn delta(now: &Snapshot, before: &Snapshot) -> Snapshot {
    type Key = (Option<u32>, Vec<std::sync::Arc<str>>, Vec<(&'static str, String)>);
    let key = |s: &Sample| -> Key { (s.pid, s.frames.clone(), s.labels.clone()) };
    let old: HashMap<Key, &Vec<i64>> = before.samples.iter().map(|s| (key(s), &s.values)).collect();
    let samples = now
        .samples
        .iter()
        .filter_map(|s| {
            let prev = old.get(&key(s));
            let values: Vec<i64> = s
                .values
                .iter()
                .enumerate()
                .map(|(i, v)| (v - prev.and_then(|p| p.get(i)).copied().unwrap_or(0)).max(0))
                .collect();
            values.iter().any(|v| *v > 0).then(|| Sample { values, ..s.clone() })
        })
        .collect();
    Snapshot { samples, t_s: now.t_s, period: now.period, identities: now.identities.clone() }
}

/// The gzipped profile of `snap` (covering `duration_s`), its samples
/// labelled with their processes' identities.
pub fn encode(kind: Kind, snap: &Snapshot, duration_s: f64, what: &str, host: &str) -> std::io::Result<Vec<u8>> {
    let identities: pprof::Identities = snap.identities.iter().map(|(pid, id)| (*pid, id.as_ref())).collect();
    let total: i64 = snap.samples.iter().map(|s| s.values[0]).sum();
    let how = if kind == pprof::RESIDENT {
        "estimated from 1 in N pages sampled by address and every huge page, scaled to each process's resident counters now"
            .to_string()
    } else if snap.period > 1 {
        format!("stacks of 1 in {} faults and of every slow one, scaled to each process's counts", snap.period)
    } else {
        "every event counted".to_string()
    };
    let comment = format!("{what} — {total} over {duration_s:.1} s on {host} ({how})");
    let meta = pprof::Meta { period: snap.period, comment: &comment, duration_s, main: host, identities: &identities };
    pprof::gzipped(&pprof::profile(kind, &meta, snap.samples.iter().cloned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pid: u32, line: &str, v: i64) -> Sample {
        pprof::sample(pprof::FAULTS, line, Some(pid), None, vec![v])
    }

    #[test]
    fn a_window_is_the_difference_of_two_cumulative_profiles() {
        let before = Snapshot { samples: vec![s(1, "a;f", 10), s(1, "a;g", 5), s(2, "b;h", 4)], ..Snapshot::default() };
        let now = Snapshot {
            samples: vec![s(1, "a;f", 25), s(1, "a;g", 3), s(2, "b;h", 4), s(3, "c;k", 7)],
            t_s: 10.0,
            ..Snapshot::default()
        };
        let d = delta(&now, &before);
        let got: Vec<(u32, String, i64)> =
            d.samples.iter().map(|x| (x.pid.unwrap(), x.frames.join(";"), x.values[0])).collect();
        // Grew: kept with its growth; shrank or unchanged: left out; new: whole.
        assert_eq!(got, [(1, "a;f".to_string(), 15), (3, "c;k".to_string(), 7)]);
        assert!((d.t_s - 10.0).abs() < f64::EPSILON);
    }

    #[test]
    fn every_name_has_a_kind() {
        for (name, _) in NAMES {
            assert_eq!(kind_of(name).map(|k| k.stem), Some(name));
        }
        assert!(kind_of("heap").is_none());
    }
}
