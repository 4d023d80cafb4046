//! Call stacks of faults: the kernel aggregates counts per (process, user
//! stack, kernel stack); here they are symbolized and written as folded stacks
//! and flamegraphs (`faults`, `fault-time`, `major-faults`).
pub mod flamegraph;
pub mod symbolize;

use serde::{Deserialize, Serialize};
use vmtrace_common::{StackCounts, StackKey};

/// Which stacks `--stacks` collects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StackMode {
    User,
    Kernel,
    Both,
    None,
}

impl StackMode {
    pub fn bits(self) -> u32 {
        match self {
            Self::User => vmtrace_common::STACK_USER,
            Self::Kernel => vmtrace_common::STACK_KERNEL,
            Self::Both => vmtrace_common::STACK_USER | vmtrace_common::STACK_KERNEL,
            Self::None => 0,
        }
    }
}

/// One aggregated stack, symbolized: frames outermost first.
#[derive(Clone, Debug, PartialEq)]
pub struct Stack {
    pub pid: u32,
    pub comm: String,
    pub user: Vec<String>,
    pub kernel: Vec<String>,
    pub counts: StackCounts,
    /// The user stack could not be read (no frame pointers past a frame, or none at all).
    pub user_missing: bool,
    /// The faulting memory region, with `--leaf region`.
    pub leaf: Option<String>,
}

/// The leaf frame naming the region that holds `addr`: in the last map read
/// of the process, else among the regions its mapping events announced
/// (newest first), which covers mappings gone by the end.
pub fn region_leaf(maps: &[crate::procmaps::Region], mapped: &crate::procmaps::MappedRegions, addr: u64) -> String {
    let found = crate::procmaps::find(maps, addr).or_else(|| mapped.find(addr));
    match found {
        Some(r) => match &r.path {
            Some(p) if p.starts_with('/') => format!("[file {p}]"),
            Some(p) => p.clone(),
            None => format!("[{:?} {:#x}-{:#x}]", r.kind, r.start, r.end).to_lowercase(),
        },
        None => "[unmapped region]".into(),
    }
}

/// The `stacks` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StacksSummary {
    pub mode: String,
    /// One fault in N had its stack taken; folded weights are scaled by N.
    pub sample_period: u32,
    /// Faults whose stack was taken.
    pub sampled_faults: u64,
    pub distinct_stacks: u64,
    /// Stacks lost because the stack map was full (their faults still count).
    pub lost: u64,
    /// Share of sampled user stacks with at most two frames: a sign of code
    /// built without frame pointers.
    pub shallow_user_stacks_pct: f64,
    pub files: Vec<String>,
}

/// Raw stack ids to look up and the counts of each key.
pub type RawStacks = Vec<(StackKey, StackCounts)>;

/// Share of stacks with a user part that is at most two frames deep.
pub fn shallow_pct(stacks: &[Stack]) -> f64 {
    let (mut shallow, mut all) = (0u64, 0u64);
    for s in stacks.iter().filter(|s| !s.user.is_empty() || s.user_missing) {
        all += s.counts.faults;
        if s.user.len() <= 2 {
            shallow += s.counts.faults;
        }
    }
    if all == 0 {
        0.0
    } else {
        shallow as f64 * 100.0 / all as f64
    }
}
