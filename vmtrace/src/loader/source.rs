//! What the collector needs from the kernel side, as one trait: the session
//! loop, the symbolizer and the attribution read the kernel only through it,
//! so unit tests drive them from a `FakeSource` (`collect::fake`) instead of
//! loaded programs. The loaded programs implement it themselves, in
//! `maps.rs`, where each map is read: a new kernel read is that method and
//! its fake, nothing else.
use std::time::Duration;

use vmtrace_common::{
    FaultStats, FileChunkKey, GranuleCounts, GranuleKey, MmStackCounts, MmStackKey, MmStats, StackCounts, StackKey,
};

use crate::model::ProbeInfo;

/// Every method is required: a source that forgets one does not build
/// (a default body would answer "nothing" in production with a green build).
/// The released processes whose drained stacks may go, and the stack ids
/// they and the others refer to besides their fault counts
/// (`AggregateSource::forget_stacks`).
#[derive(Default)]
pub struct StackUsers {
    pub gone: crate::hash::HashSet<u32>,
    /// Ids of `gone`'s call sites and resident pages.
    pub also: crate::hash::HashSet<u32>,
    /// Ids the call sites and resident pages of processes not released refer to.
    pub in_use: crate::hash::HashSet<u32>,
}

pub trait AggregateSource {
    /// Waits up to `timeout` until events may be ready (returns early on a signal).
    fn wait_for_events(&self, timeout: Duration);
    /// Hands every ring-buffer record available now to `on_event`, oldest first.
    fn drain_events(&mut self, on_event: &mut dyn FnMut(&[u8]));
    /// Forwards kernel-side log records, if any.
    fn flush_logs(&mut self);

    /// 1 in how many minor faults the programs time.
    fn minor_period(&self) -> u32;
    /// Whether `FaultStats::populated` is counted (the fault end sees
    /// `get_user_pages()` faults).
    fn populated_seen(&self) -> bool {
        false
    }
    /// Whether the programs tell a copy-on-write fault that copied from one
    /// that reused its page (`GranuleCounts::cow_copied`).
    fn cow_copies_seen(&self) -> bool {
        false
    }
    /// 1 in how many fast minor faults the programs time, every slow one
    /// exactly (0: not stratified).
    fn fast_period(&self) -> u32;
    /// The programs as attached, for summary.json's `probes`.
    fn probe_info(&self) -> Vec<ProbeInfo>;
    /// The salt of the resident sample's page hash
    /// (`vmtrace_common::page_sampled`).
    fn page_salt(&self) -> u64;
    /// The classic tracepoint fields' offsets the programs read at
    /// (`TP_OFFSETS`): `TpOffsets::MISSING` for a field this kernel's
    /// record lacks, which the programs leave 0 (an OOM record's sizes
    /// before 6.8: unknown, not 0).
    fn tp_offsets(&self) -> vmtrace_common::TpOffsets;

    /// Whether `tgid` is in the traced set.
    fn is_traced(&self, tgid: u32) -> bool;
    /// One process's fault aggregate, left in place.
    fn stats_of(&self, tgid: u32) -> Option<FaultStats>;
    /// Every fault aggregate still held.
    fn all_stats(&self) -> Vec<(u32, FaultStats)>;
    /// Reads and forgets an exited process's fault aggregate.
    fn take_stats(&mut self, tgid: u32) -> Option<FaultStats>;
    /// Every mmap/TLB aggregate still held.
    fn all_mm(&self) -> Vec<(u32, MmStats)>;
    /// Reads and forgets an exited process's mmap/TLB aggregate.
    fn take_mm(&mut self, tgid: u32) -> Option<MmStats>;
    /// TLB shootdowns received by traced processes, per CPU, as the per-CPU
    /// mmap/TLB aggregates still held count them (none without TLB tracing).
    fn received_per_cpu(&self) -> Vec<u64>;
    /// (faults, majors) of all traced processes so far.
    fn totals(&self) -> (u64, u64);
    /// Drop counters, indexed by `DropKind`.
    fn drops(&self) -> Vec<u64>;

    /// Fault stack aggregates.
    fn all_stack_counts(&self) -> Vec<(StackKey, StackCounts)>;
    /// The stack keys of `tgids` (retiring processes): drained, still in
    /// the kernel's map, or in a CPU's current slot.
    fn stack_keys_of(&self, tgids: &crate::hash::HashSet<u32>) -> Vec<StackKey>;
    /// Processes a CPU's current stack slot still counts into (not ready to
    /// retire: the slot's counts reach the aggregate later).
    fn stacks_in_flight(&self) -> crate::hash::HashSet<u32>;
    /// Takes the stack counts of released processes `tgids` out of the
    /// drained tables (`collect::folded`: they are folded away).
    fn take_stack_counts(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(StackKey, StackCounts)>;
    /// Takes the drained counts of a live process's keys that no drain
    /// added to for `min_age` drains (`Drained::take_settled`): the
    /// session seals them (`collect::symbols::Sealed`).
    fn take_settled_counts(&mut self, tgid: u32, min_age: u64) -> Vec<(StackKey, StackCounts)>;
    /// mmap-family call-site aggregates.
    fn all_mm_stacks(&self) -> Vec<(MmStackKey, MmStackCounts)>;
    /// Takes the call-site aggregates of exited processes out of the kernel's map.
    fn take_mm_stacks(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(MmStackKey, MmStackCounts)>;
    /// Takes the call-site aggregates `keys` out of the kernel's map (a
    /// live process's settled call sites, sealed by the session).
    fn take_mm_sites(&mut self, keys: Vec<MmStackKey>) -> Vec<(MmStackKey, MmStackCounts)>;
    /// A kernel stack's instruction pointers, innermost first.
    fn stack_ips(&self, id: i32) -> Option<Vec<u64>>;
    /// A user stack's instruction pointers, innermost first.
    fn user_stack_ips(&self, id: i32) -> Option<Vec<u64>>;

    /// Has the programs take `tgid`'s Python frames; false where they cannot.
    fn register_python(&mut self, tgid: u32, p: &vmtrace_common::PyProc) -> bool;
    /// Stops taking `tgid`'s Python frames.
    fn forget_python(&mut self, tgid: u32);
    /// Python frames of the user stacks stored since the last call.
    fn new_python_stacks(&mut self) -> Vec<crate::python::PyStack>;
    /// Python frames of the user stacks `ids`, announced stored by the
    /// programs (not returned by `new_python_stacks` again).
    fn stored_python_stacks(&mut self, ids: &[u32]) -> Vec<crate::python::PyStack>;
    /// The Python frames of user stack `id`.
    fn python_stack(&self, id: i32) -> Option<crate::python::PyStack>;
    /// Moves the stack aggregates out of the kernel maps (`stacks::drain`);
    /// the Python frames of stacks not looked at yet.
    fn drain_stacks(&mut self) -> Vec<crate::python::PyStack>;
    /// Lets go of the drained user stacks only the released processes
    /// `gone` were counted under (`Drained::forget_stacks`), and has the
    /// programs forget the ids they remember; returns how many went.
    /// `also`: ids the released processes used besides their fault counts
    /// (call sites, resident pages), or the ids of sealed keys (`gone`
    /// empty); `in_use`: ids something not released still refers to (kept
    /// whatever the counts say).
    fn forget_stacks(&mut self, _gone: &StackUsers, _keep: &dyn Fn(u32) -> bool) -> usize {
        0
    }
    /// Lets go of the drained stacks nothing refers to: no count, no key
    /// in the kernel's maps, not in `in_use` (what the session holds:
    /// call sites, resident pages, placements), drained at least `min_age`
    /// drains ago. Returns how many went.
    fn sweep_stacks(&mut self, _in_use: crate::hash::HashSet<u32>, _min_age: u64) -> usize {
        0
    }
    /// Drained stacks `sweep_stacks` let go so far.
    fn swept_stacks(&self) -> u64 {
        0
    }
    /// (faults under an id two stacks came to share, distinct stacks
    /// drained, bytes of their frames).
    fn drained_stacks(&self) -> (u64, usize, usize);

    /// How many of the drained stacks held are those of `tgids` (counted
    /// for them, in flight or their call sites) or in `also`.
    fn drained_stacks_of(&self, tgids: &crate::hash::HashSet<u32>, also: crate::hash::HashSet<u32>) -> usize;

    /// Per process: drained keys, and held stacks only it counts under
    /// (`RUST_LOG=vmtrace::weights=debug`).
    fn drained_by_tgid(&self) -> Vec<(u32, usize, usize)> {
        Vec::new()
    }

    /// Per-granule fault counts.
    fn all_granules(&self) -> Vec<(GranuleKey, GranuleCounts)>;
    /// Takes the granules of exited processes out of the kernel's maps.
    fn take_granules(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(GranuleKey, GranuleCounts)>;
    /// Processes whose last granule a CPU still counts into.
    fn granules_in_flight(&self) -> crate::hash::HashSet<u32>;
    /// A process's address-space generation now; `None` when not counting.
    fn map_gen(&self, tgid: u32) -> Option<u32>;
    /// Pages the traced processes added to the page cache for a file.
    fn page_cache_added(&self, dev: u32, ino: u64) -> Option<u64>;
    /// Pages their write syscalls added to the page cache for a file.
    fn page_cache_written(&self, dev: u32, ino: u64) -> Option<u64>;
    /// Pages added to the page cache per file chunk (`FILE_CHUNK_SHIFT`).
    fn page_cache_chunks(&self) -> Vec<(FileChunkKey, u64)>;

    /// Every address space's resident counters, by `mm_id` (none where
    /// resident memory is not traced).
    fn all_rss(&self) -> Vec<(u32, vmtrace_common::RssMm)>;
    /// Forgets an address space's resident counters.
    fn forget_rss(&mut self, mm_id: u32);
}
