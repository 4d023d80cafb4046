//! Call stacks as the outputs see them: the `stacks` section of
//! summary.json, and the symbolized mmap/TLB call sites behind `mmap.folded`
//! and `shootdowns.folded`.
use serde::{Deserialize, Serialize};

/// The `stacks` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StacksSummary {
    pub mode: String,
    /// One fault in N had its stack taken; folded weights are scaled by N.
    pub sample_period: u32,
    /// Faults whose stack was taken.
    pub sampled_faults: u64,
    /// Of those: slow faults (slept, or a huge page), every one of which has
    /// its stack; the rest stand for the faults of no stack.
    #[serde(default)]
    pub exact_faults: u64,
    pub distinct_stacks: u64,
    /// Stacks lost because the stack map was full (their faults still count).
    pub lost: u64,
    /// Share of sampled user stacks with at most two frames: a sign of code
    /// built without frame pointers.
    pub shallow_user_stacks_pct: f64,
    /// Share of sampled user stacks cut where their frame chain left
    /// executable memory: code built without frame pointers.
    #[serde(default)]
    pub broken_chain_pct: f64,
    pub files: Vec<String>,
}

/// The outermost frame of a stack whose frame chain broke.
pub const BROKEN_CHAIN: &str = "[frame chain broken]";

/// mmap/TLB call-site stacks, symbolized, for `mmap.folded` and `shootdowns.folded`.
pub struct MmSite {
    pub comm: String,
    pub frames: Vec<String>,
    pub calls: u64,
    pub ipis: u64,
}
