//! Regions and files: faults per 256 KiB granule of an address space, page-cache additions per file, the address-space generation.
use crate::{hist_bucket, Merge};

/// Address granule of the per-region aggregate: 256 KiB, 64 pages (one bit
/// each in `GranuleCounts::touched`). Each new granule costs the start hook a
/// hash insert, so a granule is as large as the bitmap allows.
pub const REGION_GRANULE_SHIFT: u32 = 18;

/// Pages per region granule.
pub const GRANULE_PAGES: u64 = 1 << (REGION_GRANULE_SHIFT - 12);
const _: () = assert!(GRANULE_PAGES <= 64, "GranuleCounts::touched has a bit per page");

/// Key of the per-region aggregate (`REGION_STATS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GranuleKey {
    pub tgid: u32,
    /// The process's address-space generation when the faults happened
    /// (`MAP_GEN_SLOTS`), so that each is placed in the mapping of its time.
    pub gen: u32,
    /// `address >> REGION_GRANULE_SHIFT`.
    pub granule: u64,
}
const _: () = assert!(core::mem::size_of::<GranuleKey>() == 16);

/// Faults in one granule (`REGION_GRANULE_SHIFT`) of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GranuleCounts {
    pub faults: u64,
    pub major: u64,
    pub write: u64,
    pub cow: u64,
    /// Measured latency of `timed` of them (minor latency may be sampled).
    pub time_ns: u64,
    pub timed: u64,
    /// Of `time_ns`: the majors' (every major is timed), so minor time alone
    /// is scaled when it is sampled.
    pub major_time_ns: u64,
    /// Bit i: page i of the granule faulted at least once.
    pub touched: u64,
    pub exec: u32,
    /// Of `cow`: the faults in which the kernel allocated the new page of a
    /// copy (`INFLIGHT_COPIED`); the others gave write access back to a page
    /// the process held alone (reuse, no copy).
    pub cow_copied: u32,
    /// Faults served by a transparent huge page (see `FaultStats::huge`).
    pub huge: u32,
    /// Of `cow_copied`: the copies whose new page was allocated zeroed
    /// (`__GFP_ZERO`): a write to anonymous memory that a read had mapped to
    /// the zero page. The other copies copied a page's contents.
    pub cow_zero: u32,
    /// Coarse latency histogram of the timed faults: bucket i holds latencies
    /// up to 1024 << 2i ns (1 µs, 4 µs, … 1.07 s), the last the rest; bucket
    /// i is exactly bucket 2i of the fine histogram.
    pub hist: [u32; GRANULE_HIST],
}
const _: () = assert!(core::mem::size_of::<GranuleCounts>() == 80 + 4 * GRANULE_HIST);

/// The granule this CPU is counting into (`GRANULE_CUR`, per CPU): faults
/// cluster, so counts gather here and reach `REGION_STATS` when the granule
/// changes. Userspace adds the slots of all CPUs at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GranuleCur {
    pub key: GranuleKey,
    pub counts: GranuleCounts,
}
const _: () = assert!(core::mem::size_of::<GranuleCur>() == 16 + core::mem::size_of::<GranuleCounts>());

impl Merge for GranuleCounts {
    fn merge(&mut self, o: &GranuleCounts) {
        self.faults += o.faults;
        self.major += o.major;
        self.write += o.write;
        self.cow += o.cow;
        self.time_ns += o.time_ns;
        self.timed += o.timed;
        self.major_time_ns += o.major_time_ns;
        self.touched |= o.touched;
        self.exec += o.exec;
        self.huge += o.huge;
        self.cow_copied += o.cow_copied;
        self.cow_zero += o.cow_zero;
        for i in 0..GRANULE_HIST {
            self.hist[i] += o.hist[i];
        }
    }
}

/// Folio order of a PMD-mapped transparent huge page on x86-64 (2 MiB).
pub const PMD_ORDER: u32 = 9;

pub const GRANULE_HIST: usize = 12;

/// Bucket of the coarse per-granule histogram for a latency.
#[inline(always)]
#[must_use]
pub fn granule_bucket(ns: u64) -> usize {
    // The fine bucket (ceil log2 from 1 µs), two fine buckets per coarse one.
    let fine = hist_bucket(ns);
    let coarse = fine.div_ceil(2);
    if coarse >= GRANULE_HIST {
        GRANULE_HIST - 1
    } else {
        coarse
    }
}

/// Key of page-cache additions per file (`FILE_CACHE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u32,
    /// `FILE_KEY_READ` or `FILE_KEY_WRITTEN`.
    pub kind: u32,
    pub ino: u64,
}

/// `FileKey::kind`: pages added to the page cache to be read from storage
/// (readahead, a fault, a read).
pub const FILE_KEY_READ: u32 = 0;
/// `FileKey::kind`: pages a write syscall added (they hold what the process
/// wrote; nothing was read from storage).
pub const FILE_KEY_WRITTEN: u32 = 1;
const _: () = assert!(core::mem::size_of::<FileKey>() == 16);

/// Key of page-cache additions per chunk of a file (`FILE_CHUNKS`): which
/// parts of a file came from disk, so a checkpoint's tensors can say how
/// much of each was read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileChunkKey {
    pub dev: u32,
    /// Page index in the file `>> FILE_CHUNK_SHIFT`.
    pub chunk: u32,
    pub ino: u64,
}
const _: () = assert!(core::mem::size_of::<FileChunkKey>() == 16);

/// `FileChunkKey::chunk`: 256 pages, 1 MiB.
pub const FILE_CHUNK_SHIFT: u32 = 8;

/// One process's address-space generation (`MAP_GEN`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapGenSlot {
    /// `tgid << 32 | generation`; 0: free.
    pub tag_gen: u64,
    /// 1: a fault was counted at the current generation. A mapping change
    /// bumps the generation only then: changes with no fault between them
    /// share one, and churn without faults makes no new granule keys.
    pub dirty: u32,
    pub _pad: u32,
}

/// Slots of the address-space generation array (`MAP_GEN`), indexed by
/// tgid modulo this; a process whose slot is taken uses an overflow hash.
pub const MAP_GEN_SLOTS: u32 = 1 << 16;
/// Generation of a fault whose process's counter was lost.
pub const GEN_UNKNOWN: u32 = u32::MAX;
