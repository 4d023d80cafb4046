//! The `perf` section of summary.json: hardware TLB counters where a PMU
//! exists, and the kernel's software fault counters as an accounting check.
use serde::{Deserialize, Serialize};

use super::RegionKind;

/// The `perf` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PerfSummary {
    /// Whether hardware TLB counters could be read.
    pub supported: bool,
    /// Why not, with a hint; empty when supported.
    pub reason: String,
    pub dtlb_load_misses: Option<u64>,
    pub dtlb_store_misses: Option<u64>,
    pub itlb_misses: Option<u64>,
    pub instructions: Option<u64>,
    pub cycles: Option<u64>,
    /// dTLB load+store misses per 1,000 instructions.
    pub dtlb_misses_per_kilo_instructions: Option<f64>,
    /// Share of cycles with a page walk in progress (model-specific raw events).
    pub page_walk_cycles_pct: Option<f64>,
    /// The kernel's software counters for the same target. `kernel_page_faults`
    /// is the faults it accounted (minor + major, as getrusage counts them).
    pub kernel_page_faults: u64,
    /// With a command target, taken from the kernel's task counters
    /// (`minor_from_tasks`), else from a counting perf event.
    pub kernel_minor_faults: u64,
    pub kernel_major_faults: u64,
    pub context_switches: u64,
    /// What the counters watched.
    pub scope: String,
    /// `kernel_minor_faults` is to be read from the command's task counters
    /// (`min_flt` of it and the children it waited for, as getrusage): no
    /// PAGE_FAULTS_MIN event was opened, which would cost each of its faults
    /// the kernel's software-event path (~45 ns here).
    #[serde(skip)]
    pub minor_from_tasks: bool,
    /// dTLB-miss samples attributed to memory regions, where a PMU samples data addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tlb_miss_regions: Vec<RegionSamples>,
    /// TLB-miss samples the kernel dropped, and those outside every known region.
    #[serde(default)]
    pub tlb_miss_samples_lost: u64,
    #[serde(default)]
    pub tlb_miss_samples_unattributed: u64,
}

/// Samples that fell into one region of one process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RegionSamples {
    pub pid: u32,
    pub start: String,
    pub end: String,
    pub kind: RegionKind,
    pub path: Option<String>,
    pub samples: u64,
}
