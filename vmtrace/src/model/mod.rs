//! The model every output reads: summary.json's types (and so summary.txt's,
//! report.html's), the live snapshot behind `--stream json`, `top` and
//! `serve`, and the formatting they share. It depends on `vmtrace-common`
//! only: the collector fills it, the sinks render it, and neither side
//! imports the other.
pub mod drops;
pub mod faults;
pub mod findings;
pub mod fold;
pub mod format;
pub mod identity;
pub mod live;
pub mod locations;
pub mod numa;
pub mod oom;
pub mod perf;
pub mod pinned;
pub mod regions;
pub mod resident;
pub mod shorten;
pub mod stacks;
pub mod summary;
pub mod timeline;
pub mod trace;

pub use drops::{DropCounts, Drops};
pub use faults::{largest_remainder, scale, Faults, Hist};
pub use findings::Finding;
pub use fold::{fold, Folding, OTHER_PID};
pub use format::{bytes, clip, comm_str, escape_html, fmt_ns};
pub use identity::{Identity, Rank};
pub use live::{Cum, LiveProcess, LiveResident, LiveSnapshot, RateKeeper, Rates};
pub use locations::{CodeLocation, CodeLocations};
pub use numa::{Numa, NumaProcess, NumaRegion, NumaSite};
pub use oom::{HeldRegion, OomRecord};
pub use perf::{PerfSummary, RegionSamples};
pub use pinned::{LockFailure, LockPoint, LockSite, MachineEffect, Pinned, PinnedProcess};
pub use regions::{CowFrom, FileSummary, RegionKind, RegionPlacement, RegionSummary, TensorSummary};
pub use resident::{Resident, ResidentSite, ResidentSummary};
pub use shorten::short_name;
pub use stacks::{MmSite, StacksSummary, BROKEN_CHAIN};
pub use summary::{
    KernelAccounting, Migration, MmapCounts, ProbeInfo, Process, ProgramStats, Reclaim, Sampling, Summary, TargetInfo,
    TargetKind, TlbCounts, SUMMARY_VERSION,
};
pub use timeline::{Storm, Timeline};
