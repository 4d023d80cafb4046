//! One module per probe family. Each entry point is a thin wrapper named after
//! its hook; the work happens in a fallible `try_…` beside it.
pub mod fault;
#[cfg(bpf_target_arch = "aarch64")]
pub mod fault_arm64;
pub mod filemap;
pub mod migrate;
pub mod mmap;
pub mod oom;
pub mod rss;
pub mod sched;
pub mod task;
pub mod tlb;
