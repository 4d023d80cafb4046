//! Counters of what was dropped, and the one definition of "lost".
use serde::{Deserialize, Serialize};
use vmtrace_common::DropKind;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Drops {
    pub task_events: u64,
    pub fault_stats_full: u64,
    pub traced_full: u64,
    /// Faults counted but not timed (their start was not seen).
    pub untimed_faults: u64,
    /// Faults counted but not placed in a region (granule map full).
    #[serde(default)]
    pub region_stats_full: u64,
    /// mmap/TLB counts or mapping events lost (map or ring buffer full).
    #[serde(default)]
    pub mm: u64,
    /// Page-cache additions counted for their file but not for the part of
    /// it they were (chunk map full): tensors' `from_disk_bytes` fall short.
    #[serde(default)]
    pub file_chunks_full: u64,
    /// Copied user stacks dropped (ring full): their stacks kept only the
    /// frame-pointer walk.
    #[serde(default)]
    pub stack_samples: u64,
    /// Perfetto trace records (`record --perfetto`) not kept: major faults
    /// the ring had no room for, and records beyond the event log's bound
    /// (`TraceLog::MAX_PER_KIND` per kind). Their counts are in every total.
    #[serde(default)]
    pub trace_events: u64,
    /// Resident memory: address spaces whose counters could not be kept
    /// (map full), peak/end reports and sampled pages the ring had no room
    /// for. The per-process totals of the others are exact; a lost page
    /// only thins the profiles' sample.
    #[serde(default, skip_serializing_if = "crate::model::summary::is_zero")]
    pub resident: u64,
    /// Memory-map calls (and the IPIs sent in them) counted for their
    /// process but under no call site: the call-site map was full, so
    /// `mmap.folded`/`shootdowns.folded` add up to less than the rows.
    #[serde(default, skip_serializing_if = "crate::model::summary::is_zero")]
    pub mm_sites: u64,
    /// Faults on pages of the resident sample whose own stack copy was left
    /// out (the collector was behind: the copy ring had a quarter waiting,
    /// or was full): those pages are named by their frame-pointer stack's
    /// unwound stacks, not their own. Nothing else is lost.
    #[serde(default, skip_serializing_if = "crate::model::summary::is_zero")]
    pub page_copies: u64,
    /// Inserts the kernel refused, by map and error (`"MM_STATS ENOMEM"`):
    /// why, not what was lost (the fields above say that). A refused
    /// `MM_STATS` entry's counts go to a preallocated spill map and are
    /// not lost; `mm` counts them only when that was full too.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub insert_errors: std::collections::BTreeMap<String, u64>,
}

/// The kernel's drop counters (indexed by `DropKind`, summed over CPUs) and
/// the ring records userspace could not read, as of one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    pub by_kind: Vec<u64>,
    pub malformed_events: u64,
}

impl DropCounts {
    pub fn get(&self, k: DropKind) -> u64 {
        self.by_kind.get(k as usize).copied().unwrap_or(0)
    }

    /// Events and samples lost: summary.json's `lost_events`, the streamed
    /// lines' and `top`'s. Untimed faults, stack misses and faults not placed
    /// in a region are counted, just with less detail: they have their own
    /// `drops` entries.
    pub fn lost(&self) -> u64 {
        let not_lost = [
            DropKind::FaultUntimed,
            DropKind::StackLost,
            DropKind::StackCountsFull,
            DropKind::RegionStatsFull,
            DropKind::FileChunksFull,
            DropKind::StackSampleRingFull,
            DropKind::FaultMajorRingFull,
            DropKind::PageSampleRingFull,
            DropKind::GranuleKeyRingFull,
            DropKind::MmStacksFull,
            DropKind::PageCopySkipped,
        ];
        let dropped: u64 = self
            .kinds()
            .iter()
            .enumerate()
            .filter(|(i, _)| !not_lost.iter().any(|k| *k as usize == *i))
            .map(|(_, n)| n)
            .sum();
        dropped + self.malformed_events
    }

    /// Every kernel drop counter summed, the less detailed included: the
    /// OpenMetrics `vmtrace_dropped_total` (docs/summary-json.md).
    pub fn all_counters(&self) -> u64 {
        self.kinds().iter().sum()
    }

    /// The drop kinds' counters (`DROPS` holds the insert errors after them).
    fn kinds(&self) -> &[u64] {
        &self.by_kind[..self.by_kind.len().min(vmtrace_common::DROP_KINDS as usize)]
    }

    /// Refused inserts that happened, by `"MAP ERRNO"` (`other`: an error
    /// not told apart).
    pub fn insert_errors(&self) -> Vec<(String, u64)> {
        use vmtrace_common::{INSERT_ERRNOS, INSERT_ERROR_SLOTS, INSERT_MAP_NAMES};
        let errors = self.by_kind.get(vmtrace_common::DROP_KINDS as usize..).unwrap_or(&[]);
        let mut out = Vec::new();
        for (i, &n) in errors.iter().enumerate().filter(|(_, n)| **n > 0) {
            let (map, class) = (i / INSERT_ERROR_SLOTS as usize, i % INSERT_ERROR_SLOTS as usize);
            let Some(map) = INSERT_MAP_NAMES.get(map) else { continue };
            let errno = INSERT_ERRNOS.get(class).map_or("other", |e| e.1);
            out.push((format!("{map} {errno}"), n));
        }
        out
    }

    /// The kernel counters that are not zero, by their `DropKind` name
    /// (`mm` in summary.json is two of them: the map and the ring).
    pub fn by_name(&self) -> Vec<(&'static str, u64)> {
        use DropKind as K;
        const NAMES: [(DropKind, &str); vmtrace_common::DROP_KINDS as usize - 1] = [
            (K::TaskEventRingFull, "TaskEventRingFull"),
            (K::FaultStatsFull, "FaultStatsFull"),
            (K::TracedFull, "TracedFull"),
            (K::FaultUntimed, "FaultUntimed"),
            (K::OomRingFull, "OomRingFull"),
            (K::StackLost, "StackLost"),
            (K::StackCountsFull, "StackCountsFull"),
            (K::MmStatsFull, "MmStatsFull"),
            (K::MmEventRingFull, "MmEventRingFull"),
            (K::RegionStatsFull, "RegionStatsFull"),
            (K::FileChunksFull, "FileChunksFull"),
            (K::StackSampleRingFull, "StackSampleRingFull"),
            (K::FaultMajorRingFull, "FaultMajorRingFull"),
            (K::RssMmFull, "RssMmFull"),
            (K::RssRingFull, "RssRingFull"),
            (K::PageSampleRingFull, "PageSampleRingFull"),
            (K::GranuleKeyRingFull, "GranuleKeyRingFull"),
            (K::MmStacksFull, "MmStacksFull"),
            (K::PageCopySkipped, "PageCopySkipped"),
        ];
        NAMES.iter().map(|&(k, name)| (name, self.get(k))).filter(|(_, n)| *n > 0).collect()
    }

    /// Stacks that could not be kept (their faults still count).
    pub fn stacks_lost(&self) -> u64 {
        self.get(DropKind::StackLost) + self.get(DropKind::StackCountsFull)
    }

    /// summary.json's `drops`, by cause.
    pub fn summary(&self) -> Drops {
        let d = |k| self.get(k);
        Drops {
            task_events: d(DropKind::TaskEventRingFull) + d(DropKind::OomRingFull) + self.malformed_events,
            mm: d(DropKind::MmStatsFull) + d(DropKind::MmEventRingFull),
            region_stats_full: d(DropKind::RegionStatsFull),
            file_chunks_full: d(DropKind::FileChunksFull),
            fault_stats_full: d(DropKind::FaultStatsFull),
            traced_full: d(DropKind::TracedFull),
            untimed_faults: d(DropKind::FaultUntimed),
            stack_samples: d(DropKind::StackSampleRingFull),
            trace_events: d(DropKind::FaultMajorRingFull),
            resident: d(DropKind::RssMmFull) + d(DropKind::RssRingFull) + d(DropKind::PageSampleRingFull),
            mm_sites: d(DropKind::MmStacksFull),
            page_copies: d(DropKind::PageCopySkipped),
            insert_errors: self.insert_errors().into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call counted for its process but not for its call site is not
    /// lost; it is said in `drops.mm_sites` (absent when none).
    #[test]
    fn calls_under_no_call_site_are_said_not_lost() {
        let mut by_kind = vec![0; vmtrace_common::DROP_KINDS as usize];
        by_kind[DropKind::MmStacksFull as usize] = 42;
        let d = DropCounts { by_kind, malformed_events: 0 };
        assert_eq!((d.lost(), d.summary().mm_sites, d.summary().mm), (0, 42, 0));
        assert_eq!(d.by_name(), [("MmStacksFull", 42)]);
        let v = serde_json::to_value(d.summary()).unwrap();
        assert_eq!(v["mm_sites"], 42);
        assert!(serde_json::to_value(Drops::default()).unwrap().get("mm_sites").is_none());
    }

    /// Refused inserts sit after the drop kinds in `DROPS`: named by map
    /// and error, never counted as lost or in `vmtrace_dropped_total`.
    #[test]
    fn refused_inserts_are_named_by_map_and_error_and_not_lost() {
        use vmtrace_common::{insert_error_slot, InsertMap, DROPS_ENTRIES};
        let mut by_kind = vec![0; DROPS_ENTRIES as usize];
        by_kind[insert_error_slot(InsertMap::MmStats, -12) as usize] = 3;
        by_kind[insert_error_slot(InsertMap::UserStacks, -7) as usize] = 2;
        by_kind[insert_error_slot(InsertMap::FaultStats, -1) as usize] = 1;
        let d = DropCounts { by_kind, malformed_events: 0 };
        assert_eq!((d.lost(), d.all_counters()), (0, 0));
        assert_eq!(
            d.insert_errors(),
            [
                ("MM_STATS ENOMEM".to_string(), 3),
                ("FAULT_STATS other".to_string(), 1),
                ("USER_STACKS E2BIG".to_string(), 2)
            ]
        );
        let v = serde_json::to_value(d.summary()).unwrap();
        assert_eq!(v["insert_errors"]["MM_STATS ENOMEM"], 3);
        assert!(serde_json::to_value(Drops::default()).unwrap().get("insert_errors").is_none());
        // The kernel side's slot for each error told apart is the name's
        // (`insert_error_slot` matches on the same errno values).
        for (class, (errno, name)) in vmtrace_common::INSERT_ERRNOS.iter().enumerate() {
            let mut by_kind = vec![0; DROPS_ENTRIES as usize];
            by_kind[insert_error_slot(InsertMap::FaultStats, -errno) as usize] = 1;
            let d = DropCounts { by_kind, malformed_events: 0 };
            assert_eq!(d.insert_errors(), [(format!("FAULT_STATS {name}"), 1)], "slot {class}");
        }
    }

    /// A page whose own stack copy was left out keeps its frame-pointer
    /// stack's: said in `drops.page_copies` (absent when none), not lost.
    #[test]
    fn page_copies_left_out_are_said_not_lost() {
        let mut by_kind = vec![0; vmtrace_common::DROP_KINDS as usize];
        by_kind[DropKind::PageCopySkipped as usize] = 7;
        let d = DropCounts { by_kind, malformed_events: 0 };
        assert_eq!((d.lost(), d.summary().page_copies, d.summary().stack_samples), (0, 7, 0));
        assert_eq!(d.by_name(), [("PageCopySkipped", 7)]);
        assert_eq!(serde_json::to_value(d.summary()).unwrap()["page_copies"], 7);
        assert!(serde_json::to_value(Drops::default()).unwrap().get("page_copies").is_none());
    }

    #[test]
    fn lost_leaves_out_what_is_counted_with_less_detail() {
        let mut by_kind = vec![0; vmtrace_common::DROP_KINDS as usize];
        for (k, n) in [
            (DropKind::TaskEventRingFull, 1),
            (DropKind::FaultUntimed, 100),
            (DropKind::StackLost, 10),
            (DropKind::StackCountsFull, 20),
            (DropKind::RegionStatsFull, 30),
            (DropKind::MmEventRingFull, 2),
        ] {
            by_kind[k as usize] = n;
        }
        let d = DropCounts { by_kind, malformed_events: 4 };
        assert_eq!(d.lost(), 1 + 2 + 4);
        assert_eq!(d.all_counters(), 163);
        assert_eq!(d.stacks_lost(), 30);
        let s = d.summary();
        assert_eq!((s.task_events, s.mm, s.untimed_faults, s.region_stats_full), (5, 2, 100, 30));
        assert_eq!(
            d.by_name(),
            [
                ("TaskEventRingFull", 1),
                ("FaultUntimed", 100),
                ("StackLost", 10),
                ("StackCountsFull", 20),
                ("MmEventRingFull", 2),
                ("RegionStatsFull", 30)
            ]
        );
    }
}
