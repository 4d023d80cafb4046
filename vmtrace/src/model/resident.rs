//! Resident memory in the summary: each process's kernel totals at its end
//! and at its peak, and how the resident profiles were estimated.
use serde::{Deserialize, Serialize};

/// One process's resident memory (`processes[].resident`), in bytes, from
/// the kernel's own counters (`kmem:rss_stat`): exact.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Resident {
    /// Resident (anon + file + shmem) at the process's end: its exit, or the
    /// end of the recording.
    pub end_bytes: u64,
    /// The largest resident size it reached (its high-water mark).
    pub peak_bytes: u64,
    /// `end_bytes` by kind.
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
    /// Of `end_bytes`, pages it got from its parent at fork and never wrote
    /// (so never copied): estimated from the sampled pages (0 for a process
    /// not forked while traced).
    pub shared_with_parent_bytes: u64,
    /// The rest of `end_bytes`: pages it faulted in itself — its
    /// copy-on-write copies of its parent's pages, and memory new to it.
    #[serde(default)]
    pub private_bytes: u64,
    /// Swap entries at the end (not resident).
    #[serde(default)]
    pub swap_bytes: u64,
    /// The peak by kind.
    #[serde(default)]
    pub peak_anon_bytes: u64,
    #[serde(default)]
    pub peak_file_bytes: u64,
    #[serde(default)]
    pub peak_shmem_bytes: u64,
    /// Seconds from the start of the trace to the peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_at_s: Option<f64>,
    /// Whether the process ended before the recording did.
    #[serde(default)]
    pub exited: bool,
}

impl Resident {
    /// Adds `r` in, for an "other" row: its figures are sums over the
    /// processes it holds (their peaks each at its own time, so no time).
    pub fn add(&mut self, r: &Self) {
        self.end_bytes += r.end_bytes;
        self.peak_bytes += r.peak_bytes;
        self.anon_bytes += r.anon_bytes;
        self.file_bytes += r.file_bytes;
        self.shmem_bytes += r.shmem_bytes;
        self.shared_with_parent_bytes += r.shared_with_parent_bytes;
        self.private_bytes += r.private_bytes;
        self.swap_bytes += r.swap_bytes;
        self.peak_anon_bytes += r.peak_anon_bytes;
        self.peak_file_bytes += r.peak_file_bytes;
        self.peak_shmem_bytes += r.peak_shmem_bytes;
        self.peak_at_s = None;
        self.exited &= r.exited;
    }
}

/// The leaf of a fork child's pages it got from its parent and never wrote
/// (the parent's pages, resident once, in both processes' figures).
pub const SHARED_WITH_PARENT: &str = "[shared with parent]";

/// The leaf of resident pages given back with `madvise(MADV_FREE)` that the
/// kernel has not reclaimed yet: still counted resident (`LazyFree` in
/// smaps), under the call site that faulted them in.
pub const FREED_LAZILY: &str = "[freed lazily (MADV_FREE), not yet reclaimed]";

/// Whether a resident site or stack's frames end in [`SHARED_WITH_PARENT`]:
/// pages its parent's rows already count.
pub fn shared_with_parent(frames: &[impl AsRef<str>]) -> bool {
    frames.last().is_some_and(|f| f.as_ref() == SHARED_WITH_PARENT)
}

/// How the resident profiles were made (`resident` in summary.json).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResidentSummary {
    /// The profile files written (`resident.*`, `resident-peak.*`).
    pub files: Vec<String>,
    /// Pages followed: 1 in `sample_period` pages, chosen by a hash of their
    /// virtual address (the same pages in every process), plus every huge
    /// page.
    pub sample_period: u32,
    pub sampled_pages: u64,
    /// Sampled pages still live at the end of each process, summed.
    pub live_pages_at_end: u64,
    /// What is exact and what is estimated, in words.
    pub estimate: String,
    /// How far each process's figures may be from the exact sum of the
    /// kernel's per-CPU counters: 0 when read from the classic `rss_stat`
    /// event (the sum), else `nr_cpus × percpu_counter_batch` pages (the
    /// counter's global count, what `get_mm_counter()` reads).
    #[serde(default)]
    pub counter_error_bytes: u64,
    /// Sampled pages not followed (the live set's bound, or the ring full),
    /// and peak/end snapshots missing (ring full).
    pub dropped_pages: u64,
    pub dropped_snapshots: u64,
    /// The call sites holding the most memory at their process's peak.
    pub top_at_peak: Vec<ResidentSite>,
    /// The same at each process's end.
    pub top_at_end: Vec<ResidentSite>,
}

/// A call site's share of its process's resident memory.
///
/// A site whose leaf is [`SHARED_WITH_PARENT`] holds a fork child's pages
/// still shared with its parent: the parent's own site holds the same pages,
/// so the lists that rank sites across processes (summary.txt, report.html,
/// findings) leave them out, and summary.json keeps them per process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ResidentSite {
    pub pid: u32,
    pub comm: String,
    /// Frames, outermost first, the leaf (region) last when there is one.
    pub frames: Vec<String>,
    pub bytes: u64,
    /// Sampled pages behind the estimate; its 95% error is about ±2/√n.
    pub sampled_pages: u64,
}
