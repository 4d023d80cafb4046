//! What the kernel's drop counters mean for the summary: which of them lost
//! events (`lost_events`) and how they group in `drops`.
use vmtrace_common::DropKind;

use crate::report::summary::Drops;

/// One counter of the raw, `DropKind`-indexed list (0 when the kernel side is older).
fn count(raw: &[u64], k: DropKind) -> u64 {
    raw.get(k as usize).copied().unwrap_or(0)
}

/// Streamed events and samples lost: summary.json's `lost_events`, also in
/// streamed lines and `top`. Untimed faults, stack misses and faults not
/// placed in a region are counted, just with less detail: they have their
/// own `drops` entries.
pub fn lost_events(raw: &[u64], malformed_events: u64) -> u64 {
    let not_lost = [
        DropKind::FaultUntimed as usize,
        DropKind::StackLost as usize,
        DropKind::StackCountsFull as usize,
        DropKind::RegionStatsFull as usize,
    ];
    let drops: u64 = raw.iter().enumerate().filter(|(i, _)| !not_lost.contains(i)).map(|(_, n)| n).sum();
    drops + malformed_events
}

/// summary.json's `drops`: the counters grouped by what they cost.
pub fn classify(raw: &[u64], malformed_events: u64) -> Drops {
    let d = |k| count(raw, k);
    Drops {
        task_events: d(DropKind::TaskEventRingFull) + d(DropKind::OomRingFull) + malformed_events,
        mm: d(DropKind::MmStatsFull) + d(DropKind::MmEventRingFull) + d(DropKind::MmInflightFull),
        region_stats_full: d(DropKind::RegionStatsFull),
        fault_stats_full: d(DropKind::FaultStatsFull),
        traced_full: d(DropKind::TracedFull),
        untimed_faults: d(DropKind::FaultUntimed),
    }
}

/// Sampled stacks not counted (`stacks.lost`).
pub fn stacks_lost(raw: &[u64]) -> u64 {
    count(raw, DropKind::StackLost) + count(raw, DropKind::StackCountsFull)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(DropKind, u64)]) -> Vec<u64> {
        let mut v = vec![0; DropKind::RegionStatsFull as usize + 1];
        for (k, n) in pairs {
            v[*k as usize] = *n;
        }
        v
    }

    #[test]
    fn counted_with_less_detail_is_not_lost() {
        let r = raw(&[
            (DropKind::FaultUntimed, 100),
            (DropKind::StackLost, 10),
            (DropKind::StackCountsFull, 1),
            (DropKind::RegionStatsFull, 5),
            (DropKind::TaskEventRingFull, 2),
            (DropKind::MmEventRingFull, 3),
        ]);
        assert_eq!(lost_events(&r, 4), 2 + 3 + 4);
        assert_eq!(stacks_lost(&r), 11);
        let d = classify(&r, 4);
        assert_eq!((d.task_events, d.mm, d.region_stats_full, d.untimed_faults), (6, 3, 5, 100));
        assert_eq!((d.fault_stats_full, d.traced_full), (0, 0));
    }

    #[test]
    fn a_shorter_counter_list_reads_as_zeros() {
        assert_eq!(classify(&[], 0).mm, 0);
        assert_eq!(lost_events(&[], 1), 1);
    }
}
