//! Faults per memory region (VMA), per file across processes, and per tensor
//! of a safetensors checkpoint: summary.json `regions[]` and `files[]`.
use serde::{Deserialize, Serialize};

use super::Faults;

/// What a region holds, as users ask about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionKind {
    Anon,
    Heap,
    Stack,
    File,
    Shmem,
    Hugetlb,
    Vdso,
    Other,
    /// CPython's object memory: an obmalloc arena (`docs/design.md`, "Python
    /// object memory"). Anonymous memory, named.
    #[serde(rename = "python_arena")]
    PythonArena,
}

impl RegionKind {
    /// The name in tables (a column of 7).
    pub fn label(self) -> &'static str {
        match self {
            Self::Anon => "anon",
            Self::Heap => "heap",
            Self::Stack => "stack",
            Self::File => "file",
            Self::Shmem => "shmem",
            Self::Hugetlb => "hugetlb",
            Self::Vdso => "vdso",
            Self::Other => "other",
            Self::PythonArena => "python",
        }
    }

    /// Anonymous memory, whatever its name ([heap], [stack], [anon:…], a
    /// Python arena): a read maps the zero page, a fork shares it.
    pub fn is_anon_like(self) -> bool {
        matches!(self, Self::Anon | Self::Heap | Self::Stack | Self::Other | Self::PythonArena)
    }
}

/// One region of one process in summary.json `regions[]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegionSummary {
    pub pid: u32,
    pub start: String,
    pub end: String,
    pub perms: String,
    pub kind: RegionKind,
    pub path: Option<String>,
    pub offset: u64,
    pub faults: Faults,
    /// Pages faulted in: 4 KiB pages that took a fault, a huge page counting
    /// all 512 it maps, at most the region's pages. Pages mapped around a
    /// fault (fault-around) are not.
    pub pages_touched: u64,
    /// Its COW (write-protect) faults by what was copied; absent without any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cow_from: Option<CowFrom>,
    /// An "other" row: how many regions below the folding threshold it sums
    /// (`start`/`end` "0x0"); 0 for a region of its own.
    #[serde(default, skip_serializing_if = "super::summary::is_zero")]
    pub folded: u64,
}

/// COW faults (writes to a present, write-protected page) by what the kernel
/// had to do, inferred per region (docs/design.md, "What COW copied").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CowFrom {
    /// Copied the zero page: anonymous memory written after it was first read.
    pub zero_page: u64,
    /// Copied a page shared with a parent or child since a fork.
    pub fork: u64,
    /// Copied a page of a privately mapped file (a library's data, a
    /// MAP_PRIVATE file written to).
    pub file: u64,
    /// No copy: write access given back on a page the process holds alone
    /// (after mprotect, after a forked child exited, dirty tracking).
    pub reused: u64,
    /// Copied another page of anonymous memory in a process that shares
    /// nothing since a fork (KSM-merged, pinned, in the swap cache): only
    /// where copies are observed (docs/design.md, "What COW copied").
    #[serde(default, skip_serializing_if = "super::summary::is_zero")]
    pub other: u64,
    /// Of the copies (all but `reused`), those in Python object memory
    /// (CPython's obmalloc arenas: reference counts written in objects a
    /// fork shares).
    #[serde(default, skip_serializing_if = "super::summary::is_zero")]
    pub python_objects: u64,
}

impl CowFrom {
    pub fn add(&mut self, o: &CowFrom) {
        self.zero_page += o.zero_page;
        self.fork += o.fork;
        self.file += o.file;
        self.reused += o.reused;
        self.other += o.other;
        self.python_objects += o.python_objects;
    }

    pub fn total(&self) -> u64 {
        self.zero_page + self.fork + self.file + self.reused + self.other
    }
}

/// One tensor of a checkpoint (safetensors, or a torch zip checkpoint).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorSummary {
    pub name: String,
    pub offset: u64,
    pub bytes: u64,
    pub faults: u64,
    pub major: u64,
    pub time_ns: u64,
    pub pages_touched: u64,
    /// Of its bytes, those the traced processes brought in from disk during
    /// the recording (readahead included): how much of the tensor was read.
    #[serde(default)]
    pub from_disk_bytes: u64,
}

/// One file across processes in summary.json `files[]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileSummary {
    pub path: String,
    pub faults: Faults,
    pub pages_touched: u64,
    /// Pages the traced processes added to the page cache for this file to
    /// be read from storage (readahead, faults, reads).
    pub page_cache_added: u64,
    /// Pages their write syscalls added (what they wrote: nothing read).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub page_cache_written: u64,
    /// Of those, pages no major fault asked for: brought in by readahead.
    pub readahead_pages: u64,
    /// Share of its faults that waited for I/O (major).
    pub cold_fraction: f64,
    /// The file's size at the end of the recording (0: gone).
    #[serde(default)]
    pub file_bytes: u64,
    /// What the traced processes read from storage into the page cache for
    /// it during the recording, readahead included (pages they wrote, or
    /// that were cached already, are not).
    #[serde(default)]
    pub from_disk_bytes: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<TensorSummary>,
}

impl RegionSummary {
    /// Bytes from `start` to `end` (both hex strings).
    pub fn size(&self) -> u64 {
        let p = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or(0);
        p(&self.end).saturating_sub(p(&self.start))
    }
}

/// summary.json `region_placement`: faults (of `regions`) by how their
/// mapping was found (docs/design.md, "Regions through time").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RegionPlacement {
    /// In the mapping that covered the address at the fault's generation.
    pub exact: u64,
    /// A mapping change raced the fault or was seen late: placed in the
    /// nearest mapping in time that could serve it.
    pub approximate: u64,
    /// No mapping known: in `[unknown region of PID]` rows.
    pub unplaced: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(v: &u64) -> bool {
    *v == 0
}
