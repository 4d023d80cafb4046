//! Resident memory: the kernel's own per-mm counters (`kmem:rss_stat`) kept
//! per address space, and the sampled pages userspace attributes to stacks.
use crate::EventHeader;

/// `RssMm::size` index: the kernel's `MM_FILEPAGES`, `MM_ANONPAGES`,
/// `MM_SWAPENTS`, `MM_SHMEMPAGES` (include/linux/mm_types_task.h), as the
/// tracepoint's `member` numbers them.
pub const RSS_FILE: usize = 0;
pub const RSS_ANON: usize = 1;
pub const RSS_SWAP: usize = 2;
pub const RSS_SHMEM: usize = 3;
pub const RSS_MEMBERS: usize = 4;

/// `RssMm::flags`: the owner tore its address space down (exit, or the old
/// one at exec): `end` holds the counters just before.
pub const RSS_ENDED: u32 = 1;

/// `RssMm::flags`: the entry was made by an event in the owner's own
/// context (a fault of its own), not by whoever filled a new address space
/// (a parent's fork, an exec before the switch): an address space that
/// existed before it was first seen, a process that started before the
/// trace. Its figures from before then (the peak, `VmHWM`) are read from
/// `/proc/PID/status` by userspace.
pub const RSS_OWN_FIRST: u32 = 2;

/// `RssMm::flags`: member `i` (an `RSS_*` index) is known, from an event of
/// its own or read from the mm when the entry was made (the tp_btf
/// program): bit `RSS_SEEN_SHIFT + i`. An unseen member of an address
/// space that existed before it was first seen is not 0 but unknown, and
/// unchanged since (each change fires the event): userspace reads it from
/// `/proc/PID/status` once.
pub const RSS_SEEN_SHIFT: u32 = 8;
/// Every member known.
pub const RSS_SEEN_ALL: u32 = ((1 << RSS_MEMBERS) - 1) << RSS_SEEN_SHIFT;

/// One address space's resident counters (`RSS_MM`, keyed by the
/// tracepoint's `mm_id`, a hash of the mm pointer). Bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RssMm {
    /// The process whose mm this is; 0 until its own first event (a child's
    /// mm is filled by its parent's fork before the child runs).
    pub tgid: u32,
    /// `RSS_ENDED`, `RSS_OWN_FIRST`, the members seen (`RSS_SEEN_SHIFT`).
    pub flags: u32,
    /// Each member's size as of the last event.
    pub size: [u64; RSS_MEMBERS],
    /// The largest file + anon + shmem seen, and each member at that moment.
    pub peak: u64,
    pub peak_size: [u64; RSS_MEMBERS],
    /// `size` when the owner began tearing the mm down.
    pub end: [u64; RSS_MEMBERS],
    /// The peak last streamed (`EventKind::ResidentPeak`).
    pub reported_peak: u64,
    /// The members at the moment the mm was first seen: a child's pages
    /// shared with its parent at fork (copied by `dup_mmap`).
    pub at_fork: [u64; RSS_MEMBERS],
    /// When the mm was first seen, reached its peak, and began its teardown.
    pub first_ns: u64,
    pub peak_ns: u64,
    pub end_ns: u64,
    /// The peak when `peak_ns` was last read (once per `RSS_PEAK_TIME_STEP`).
    pub peak_timed: u64,
    /// The `mm_struct`'s address, taken from the owner's own first event
    /// (its `current->mm`), 0 until then. The classic event carries only a
    /// hash of it: its program reads `mm_users` through this to tell a
    /// teardown in another task's context. Not used by userspace.
    pub owner_mm: u64,
}
const _: () = assert!(core::mem::size_of::<RssMm>() == 8 + 8 * (4 * RSS_MEMBERS + 2) + 40);

impl RssMm {
    /// Resident bytes (file + anon + shmem; swap entries are not resident).
    #[inline(always)]
    #[must_use]
    pub fn resident(size: &[u64; RSS_MEMBERS]) -> u64 {
        size[RSS_FILE] + size[RSS_ANON] + size[RSS_SHMEM]
    }
}

/// A new peak of one address space passed the last one streamed by
/// `RSS_PEAK_STEP` (`EventKind::ResidentPeak`), or its owner began tearing
/// it down (`EventKind::ResidentEnd`): the collector snapshots the process's
/// sampled pages then, in ring order with the pages themselves.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RssEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub mm_id: u32,
    /// The members (bytes) at the peak or at the end.
    pub size: [u64; RSS_MEMBERS],
}
const _: () = assert!(core::mem::size_of::<RssEvent>() == 16 + 8 + 8 * RSS_MEMBERS);

/// A new peak is streamed once it passes the last streamed one by a
/// sixteenth (and at least this many bytes): a growing process sends a few
/// dozen, not one per page.
pub const RSS_PEAK_MIN_STEP: u64 = 1 << 20;

/// The peak's time is read once per this much growth (not on every page of
/// a growing process): it is the time the peak passed its last step.
pub const RSS_PEAK_TIME_STEP: u64 = 256 << 10;

/// `PageSample::flags`: served by a transparent huge page (PMD size).
pub const PAGE_HUGE: u32 = 1;
/// `PageSample::flags`: its stack is of the exact stratum (`STRATUM_EXACT`):
/// the fault stands for itself, not for 1 in `stack_period`. No longer sent
/// since pages are sampled by address (`page_sampled`): a huge page stands
/// for itself (`PAGE_HUGE`), every other page is of the address sample.
pub const PAGE_EXACT: u32 = 2;
/// `PageSample::flags`: a copy-on-write fault (a write to a present,
/// write-protected page).
pub const PAGE_COW: u32 = 4;
/// `PageSample::flags`: with `PAGE_COW`, the kernel allocated the copy
/// (`wp_page_copy`); without it the fault reused the page it had
/// (`wp_page_reuse`: the process held it alone, e.g. after its fork child
/// exited), which stays its first owner's. Meaningful only where the
/// page-allocation hook tells copies (`cow_copies_seen`).
pub const PAGE_COPIED: u32 = 8;
/// `PageSample::flags`: the fault's user stack was copied for userspace to
/// unwind (its frame-pointer walk was not whole), the copy carrying the
/// page's address (`StackSampleHead::addr`): the loader hands that copy
/// over just before the page, whose owner is then its unwound stack.
pub const PAGE_STACK_COPY: u32 = 16;
/// `PageSample::flags`: a write fault. In a writable private file mapping a
/// read fault maps the file's page-cache page (the kernel counts it in
/// `MM_FILEPAGES`) and a write one a private copy (`MM_ANONPAGES`): a
/// checkpoint mapped `rw-p` and only read (`torch.load(mmap=True)`) is file
/// memory. Never set where the fault start has no access type (arm64's
/// software event): there every such page is taken for a copy.
pub const PAGE_WRITE: u32 = 32;

/// A 64-bit mix of a virtual page number (address >> 12) and the
/// recording's salt: splitmix64's finalizer, a bijection, so with a uniform
/// random salt the result is uniform for every page.
#[inline(always)]
#[must_use]
pub fn page_hash(page: u64, salt: u64) -> u64 {
    let mut z = page ^ salt;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether the small page `page` (address >> 12) is in the resident sample:
/// 1 in `period` pages, chosen by a hash of the *virtual page address* alone,
/// not by the fault or the process. A fork child and its parent therefore
/// sample the same pages: a child's copy-on-write copy of a sampled page is
/// seen where its parent's page was, and a page's later fates (copy,
/// munmap, madvise) are seen for the same set. Each page is in with
/// probability 1/`period` over the salt (drawn at random per recording), so
/// the sample is unbiased whatever the program's access pattern.
#[inline(always)]
#[must_use]
pub fn page_sampled(page: u64, salt: u64, period: u32) -> bool {
    period <= 1 || page_hash(page, salt).is_multiple_of(u64::from(period))
}

/// A fault on a page of the resident sample (`page_sampled`), or served by
/// a huge page (every one is streamed), with its stack, streamed when
/// resident attribution is on (`EventKind::PageSample`): the page it brought
/// in is owned by the stack until the memory is given back.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PageSample {
    pub hdr: EventHeader,
    pub tgid: u32,
    /// `PAGE_*`.
    pub flags: u32,
    /// Page-aligned faulting address.
    pub addr: u64,
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// The CPU the fault ended on: the page was allocated on its node
    /// unless a memory policy said otherwise (remote first touch, `numa.rs`).
    pub cpu: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<PageSample>() == 16 + 8 + 8 + 8 + 8);
