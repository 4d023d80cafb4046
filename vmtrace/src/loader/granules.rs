//! Which keys each process has in `REGION_STATS` and `REGION_LATE`, from
//! the programs' `GranuleNew` records (one per key, when it is inserted).
//!
//! Taking an exited process's granules is then a lookup and a delete per
//! key of its own. Without the index it was a walk of both maps: one
//! syscall per key of every process on the machine, once a second whenever
//! anything exited (a 40 GB job holds 160,000 granules; the walk was 16% of
//! the collector's time beside a shell loop starting a few processes a
//! second). A record the ring had no room for (`GranuleKeyRingFull`) makes
//! the next take walk the maps once and rebuild the index from them.
use crate::hash::HashMap;

use vmtrace_common::GranuleKey;

/// One key of a process: its generation and granule, and whether it is in
/// `REGION_LATE`.
type Entry = (u32, u64, bool);

#[derive(Default)]
pub(super) struct GranuleIndex {
    keys: HashMap<u32, Vec<Entry>>,
    /// The `GranuleKeyRingFull` count a walk last answered.
    drops_seen: u64,
}

impl GranuleIndex {
    /// A key entered a map (`late`: `REGION_LATE`).
    pub(super) fn note(&mut self, key: &GranuleKey, late: bool) {
        self.keys.entry(key.tgid).or_default().push((key.gen, key.granule, late));
    }

    /// Whether records were lost since the last walk (`lost`: the kernel's
    /// `GranuleKeyRingFull` count now): the index may miss keys.
    pub(super) fn needs_walk(&self, lost: u64) -> bool {
        lost > self.drops_seen
    }

    /// Replaces the index with what a walk of both maps found. Records
    /// still in the ring for keys the walk saw add duplicates, which
    /// [`Self::take`] removes.
    pub(super) fn rebuild(&mut self, walked: impl IntoIterator<Item = (GranuleKey, bool)>, lost: u64) {
        self.keys.clear();
        for (k, late) in walked {
            self.note(&k, late);
        }
        self.drops_seen = lost;
    }

    /// The keys of `tgids`, each once (`true`: in `REGION_LATE`), which
    /// leave the index.
    pub(super) fn take(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(GranuleKey, bool)> {
        let mut out = Vec::new();
        for tgid in tgids {
            let Some(mut v) = self.keys.remove(tgid) else { continue };
            v.sort_unstable();
            v.dedup();
            out.extend(v.into_iter().map(|(gen, granule, late)| (GranuleKey { tgid: *tgid, gen, granule }, late)));
        }
        out
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        self.keys.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, granule: u64) -> GranuleKey {
        GranuleKey { tgid, gen: 0, granule }
    }

    #[test]
    fn takes_only_the_processes_asked_each_key_once() {
        let mut ix = GranuleIndex::default();
        ix.note(&key(1, 10), false);
        ix.note(&key(1, 11), true);
        ix.note(&key(2, 10), false);
        let mut got = ix.take(&[1].into_iter().collect());
        got.sort();
        assert_eq!(got, vec![(key(1, 10), false), (key(1, 11), true)]);
        assert_eq!(ix.len(), 1);
        assert!(ix.take(&[1].into_iter().collect()).is_empty());
    }

    #[test]
    fn a_lost_record_asks_for_one_walk_whose_keys_replace_the_index() {
        let mut ix = GranuleIndex::default();
        assert!(!ix.needs_walk(0));
        ix.note(&key(1, 10), false);
        assert!(ix.needs_walk(1));
        ix.rebuild([(key(1, 10), false), (key(1, 12), false), (key(3, 1), true)], 1);
        assert!(!ix.needs_walk(1));
        // A record the walk already saw: one key still.
        ix.note(&key(1, 12), false);
        let mut got = ix.take(&[1, 3].into_iter().collect());
        got.sort();
        assert_eq!(got, vec![(key(1, 10), false), (key(1, 12), false), (key(3, 1), true)]);
        assert!(ix.needs_walk(2));
    }
}
