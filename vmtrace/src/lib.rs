//! vmtrace: page faults and the virtual-memory work behind them, per process,
//! measured in the kernel with eBPF.
//!
//! The fault path, kernel to report:
//! `vmtrace-ebpf/src/probes/fault.rs` (start/end hooks, in-kernel aggregate)
//! → [`loader`] (attach, with per-kernel fallbacks; [`trace`] starts a trace
//!   the one way every front end uses)
//! → [`collect`] (process table from task events, aggregates read at the end)
//! → [`model`] (what every output reads: the summary, the live snapshot)
//! ← [`report`] (`summary.json`, `summary.txt`), [`export`] (pprof), [`top`], [`serve`].
pub mod cli;
mod collect;
pub mod demo;
pub mod export;
pub mod hash;
pub mod identity;
pub mod kernel;
pub mod loader;
mod malloc_env;
pub mod model;
pub mod numa;
mod oom;
pub mod perf;
mod procmaps;
pub mod python;
pub mod record;
mod regions;
pub mod report;
pub mod serve;
pub mod stacks;
pub mod target;
pub mod top;
pub mod trace;

/// The kernel programs, built by `build.rs` from `vmtrace-ebpf`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vmtrace"));
