//! What happened when: faults per interval, and shootdown storms.
use serde::{Deserialize, Serialize};

/// Faults of all traced processes per interval, from the start of the trace.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Timeline {
    pub interval_s: f64,
    pub faults: Vec<u64>,
    pub major: Vec<u64>,
}

impl Timeline {
    /// At most this many points: longer traces merge neighbours.
    pub const MAX_POINTS: usize = 2000;

    pub fn push(&mut self, faults: u64, major: u64) {
        self.faults.push(faults);
        self.major.push(major);
        if self.faults.len() > Self::MAX_POINTS {
            self.merge_pairs();
        }
    }

    /// Halves the resolution: each two neighbours become one bin of twice the interval.
    pub fn merge_pairs(&mut self) {
        let merge = |v: &mut Vec<u64>| *v = v.chunks(2).map(|c| c.iter().sum()).collect();
        merge(&mut self.faults);
        merge(&mut self.major);
        self.interval_s *= 2.0;
    }
}

/// A shootdown storm: IPIs sent faster than `--storm-threshold` per second.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Storm {
    pub pid: u32,
    pub comm: String,
    pub start_s: f64,
    pub end_s: f64,
    pub peak_per_s: u64,
    /// TLB-flush IPIs sent during the storm.
    pub shootdowns: u64,
    /// The call site that sent most of them: frames outermost first, the syscall last.
    pub top_stack: Vec<String>,
    pub top_call: String,
    /// Share of the storm's IPIs from that call site.
    pub top_share: f64,
    /// The allocator settings in the process's environment, by name
    /// (`MALLOC_MMAP_THRESHOLD_`, `glibc.malloc.*` tunables, `MALLOC_CONF`,
    /// an allocator in `LD_PRELOAD`); absent when none is set.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub malloc_settings: std::collections::BTreeMap<String, String>,
}
