//! summary.json's types, under the path they had before [`crate::model`]
//! became their home.
pub use crate::model::{
    Drops, Faults, Hist, KernelAccounting, MmapCounts, ProbeInfo, Process, Reclaim, Sampling, Storm, Summary,
    TargetInfo, Timeline, TlbCounts, SUMMARY_VERSION,
};
