//! Stack aggregates moved out of the kernel maps while recording.
//!
//! The kernel counts faults per stack key in `FAULT_STACKS` and stores each
//! distinct user stack once in `USER_STACKS`; both are bounded (65,536 keys,
//! 16,384 stacks). A long job with a stack on every fault has far more
//! distinct stacks than that (Python frames carry their instruction, so
//! every bytecode offset is its own stack): the collector empties both maps
//! every 100 ms into these compact userspace tables, and the kernel's maps
//! only have to hold what one interval brings.
//!
//! A stack's id is 30 bits of its hash (`vmtrace-ebpf/src/stacks.rs`,
//! `store`), so a stack walked again after its entry was drained gets the
//! same id, and ids the programs still remember (a CPU's `RECENT` slots,
//! `STACK_CUR` keys, faults in flight) stay valid here. Two stacks whose
//! hashes share those 30 bits, one drained before the other was stored,
//! would share an id: the first keeps it, and the faults counted under that
//! id are reported (`reused_faults`; of 300,000 distinct stacks, about 40 would share an id in a
//! billion-id space).
use crate::hash::HashMap;
use crate::hash::ShrinkSparse as _;

use vmtrace_common::{Merge as _, PyFrame, StackCounts, StackKey};

use crate::python::PyStack;

/// One drained user stack: its frames, and its Python frames if any.
struct Stored {
    hash: u64,
    /// `Drained::calls` when it was drained.
    born: u64,
    /// Innermost first.
    ips: Box<[u64]>,
    /// Python frames (innermost first), their process, `ends` bits and
    /// whether they were cut short.
    py: Option<(u32, u32, bool, Box<[PyFrame]>)>,
}

/// A key's drained counts, and the drain that last added to them.
#[derive(Clone, Copy, Default)]
struct Counted {
    counts: StackCounts,
    last: u64,
}

/// Counts and stacks drained from the kernel maps.
#[derive(Default)]
pub struct Drained {
    /// By process: a retiring process's keys are found without a walk of all.
    counts: HashMap<u32, HashMap<StackKey, Counted>>,
    stacks: HashMap<u32, Stored>,
    /// Stacks found under an id already holding another stack (see the module doc).
    reused: crate::hash::HashSet<u32>,
    /// Drains that moved anything.
    pub drains: u64,
    /// Drains, whether or not they moved anything (a stack's age).
    calls: u64,
    /// Stacks `sweep` let go.
    pub swept: u64,
}

impl Drained {
    /// Adds the counts of a key taken out of `FAULT_STACKS`.
    pub fn add_counts(&mut self, key: StackKey, c: &StackCounts) {
        let e = self.counts.entry(key.tgid).or_default().entry(key).or_default();
        e.counts.merge(c);
        e.last = self.calls;
    }

    /// Takes out the counts of `tgid`'s keys that no drain added to for
    /// `min_age` drains (settled): a live process's counts, symbolized and
    /// sealed by the session (`collect::symbols::Sealed`), so that the
    /// stacks only they were counted under can go (`forget_stacks`). A
    /// count drained later for the same key starts afresh.
    pub fn take_settled(&mut self, tgid: u32, min_age: u64) -> Vec<(StackKey, StackCounts)> {
        let Some(m) = self.counts.get_mut(&tgid) else { return Vec::new() };
        let now = self.calls;
        let mut out = Vec::new();
        m.retain(|k, c| {
            let settled = now.saturating_sub(c.last) >= min_age;
            if settled {
                out.push((*k, c.counts));
            }
            !settled
        });
        if m.is_empty() {
            self.counts.remove(&tgid);
        } else {
            m.shrink_if_sparse();
        }
        self.counts.shrink_if_sparse();
        out
    }

    /// The keys of `tgids` drained so far.
    pub fn keys_of<'a>(&'a self, tgids: &'a crate::hash::HashSet<u32>) -> impl Iterator<Item = StackKey> + 'a {
        tgids.iter().filter_map(|t| self.counts.get(t)).flat_map(|m| m.keys().copied())
    }

    /// Keeps a stack taken out of `USER_STACKS`; false when its id already
    /// holds a different stack (the first is kept).
    pub fn add_stack(&mut self, id: u32, hash: u64, ips: &[u64], py: Option<&PyStack>) -> bool {
        match self.stacks.get(&id) {
            Some(s) if s.hash == hash => true,
            Some(_) => {
                self.reused.insert(id);
                false
            }
            None => {
                let py = py.map(|p| (p.tgid, p.ends, p.truncated, p.frames.clone().into_boxed_slice()));
                self.stacks.insert(id, Stored { hash, born: self.calls, ips: ips.into(), py });
                true
            }
        }
    }

    /// A drained stack's frames, innermost first.
    pub fn ips(&self, id: u32) -> Option<Vec<u64>> {
        self.stacks.get(&id).map(|s| s.ips.to_vec())
    }

    /// A drained stack's Python frames.
    pub fn python(&self, id: u32) -> Option<PyStack> {
        let (tgid, ends, truncated, frames) = self.stacks.get(&id)?.py.as_ref()?;
        Some(PyStack { tgid: *tgid, frames: frames.to_vec(), ends: *ends, truncated: *truncated })
    }

    /// Takes the counts of `tgids` out.
    pub fn take_counts(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(StackKey, StackCounts)> {
        let out = tgids.iter().filter_map(|t| self.counts.remove(t)).flatten().map(|(k, c)| (k, c.counts)).collect();
        self.counts.shrink_if_sparse();
        out
    }

    /// Adds every drained count into `all`.
    pub fn merge_into(&self, all: &mut HashMap<StackKey, StackCounts>) {
        for (k, c) in self.counts.values().flatten() {
            all.entry(*k).or_default().merge(&c.counts);
        }
    }

    /// Lets go of the stacks that only the processes `gone` were counted
    /// under (their keys were symbolized as they were released), keeping
    /// every id a process for which `keep` holds is counted under. Their
    /// counts stay (the end adds them up). Returns the ids let go.
    /// `kept`: ids the kernel's maps still count under for others.
    pub fn forget_stacks(
        &mut self,
        gone: &crate::hash::HashSet<u32>,
        keep: &dyn Fn(u32) -> bool,
        kept: &crate::hash::HashSet<u32>,
        also: &crate::hash::HashSet<u32>,
    ) -> Vec<u32> {
        let ids_of = |m: &HashMap<StackKey, Counted>| {
            m.keys().filter_map(|k| u32::try_from(k.user_stack).ok()).collect::<Vec<u32>>()
        };
        let mut ids: crate::hash::HashSet<u32> =
            gone.iter().filter_map(|t| self.counts.get(t)).flat_map(ids_of).collect();
        ids.extend(also);
        if ids.is_empty() {
            return Vec::new();
        }
        for (_, m) in self.counts.iter().filter(|(t, _)| !gone.contains(t) && keep(**t)) {
            for id in ids_of(m) {
                ids.remove(&id);
            }
        }
        let out: Vec<u32> =
            ids.into_iter().filter(|id| !kept.contains(id)).filter(|id| self.stacks.remove(id).is_some()).collect();
        self.stacks.shrink_if_sparse();
        out
    }

    /// One more drain of the kernel's maps.
    pub fn next_drain(&mut self) {
        self.calls += 1;
    }

    /// Lets go of the stacks nothing refers to any more: under no count
    /// drained (of any process), not in `referenced` (the kernel's keys, the
    /// call sites, resident pages and placements the session still holds),
    /// and drained at least `min_age` drains ago (a ring record naming one
    /// may still be on its way). `forget_stacks` lets go of a released
    /// process's counted stacks and call sites; a stack walked for
    /// something the process no longer holds (the owner of a sampled page
    /// since unmapped or freed at its exit) is in neither, and under
    /// process churn, where every process's ids are its own, those were
    /// most of what stayed (~1 a process; 19,463 of 20,799 held after 46 s
    /// of `docs/scripts/churn-serve.sh`). Returns the ids let go.
    pub fn sweep(&mut self, referenced: &crate::hash::HashSet<u32>, min_age: u64) -> Vec<u32> {
        let counted: crate::hash::HashSet<u32> =
            self.counts.values().flat_map(|m| m.keys()).filter_map(|k| u32::try_from(k.user_stack).ok()).collect();
        let now = self.calls;
        let mut out = Vec::new();
        self.stacks.retain(|id, s| {
            let keep = now.saturating_sub(s.born) < min_age || counted.contains(id) || referenced.contains(id);
            if !keep {
                out.push(*id);
            }
            keep
        });
        self.stacks.shrink_if_sparse();
        self.swept += out.len() as u64;
        out
    }

    /// Faults counted under an id two stacks came to share.
    pub fn reused_faults(&self) -> u64 {
        if self.reused.is_empty() {
            return 0;
        }
        let reused = |k: &StackKey| u32::try_from(k.user_stack).is_ok_and(|id| self.reused.contains(&id));
        self.counts.values().flatten().filter(|(k, _)| reused(k)).map(|(_, c)| c.counts.faults).sum()
    }

    /// How many of `ids` are held.
    pub fn held_of(&self, ids: &crate::hash::HashSet<u32>) -> usize {
        ids.iter().filter(|id| self.stacks.contains_key(id)).count()
    }

    /// Keys drained per process, and the held stacks only it counts under
    /// (to measure what each process's drained stacks weigh).
    pub fn keys_by_tgid(&self) -> Vec<(u32, usize, usize)> {
        let ids_of = |m: &HashMap<StackKey, Counted>| -> crate::hash::HashSet<u32> {
            m.keys().filter_map(|k| u32::try_from(k.user_stack).ok()).collect()
        };
        let mut users: HashMap<u32, u32> = HashMap::default();
        for m in self.counts.values() {
            for id in ids_of(m) {
                *users.entry(id).or_default() += 1;
            }
        }
        let own = |m| ids_of(m).into_iter().filter(|id| users[id] == 1 && self.stacks.contains_key(id)).count();
        self.counts.iter().map(|(t, m)| (*t, m.len(), own(m))).collect()
    }

    /// Distinct user stacks kept.
    pub fn stacks(&self) -> usize {
        self.stacks.len()
    }

    /// Bytes of frames held (to measure the tables' size).
    pub fn frame_bytes(&self) -> usize {
        self.stacks
            .values()
            .map(|s| s.ips.len() * 8 + s.py.as_ref().map_or(0, |p| p.3.len() * std::mem::size_of::<PyFrame>()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user_stack: i32) -> StackKey {
        StackKey { tgid: 7, user_stack, ..StackKey::default() }
    }

    #[test]
    fn a_released_processs_stacks_go_unless_another_process_counts_under_them() {
        let mut d = Drained::default();
        let c = StackCounts { faults: 1, ..StackCounts::default() };
        let of = |tgid: u32, user_stack: i32| StackKey { tgid, user_stack, ..StackKey::default() };
        // 7 and 8 share stack 1 (a fork child and its parent); 7 alone has 2.
        d.add_counts(of(7, 0x4000_0001), &c);
        d.add_counts(of(7, 0x4000_0002), &c);
        d.add_counts(of(8, 0x4000_0001), &c);
        d.add_counts(of(9, 0x4000_0003), &c);
        for id in [0x4000_0001, 0x4000_0002, 0x4000_0003] {
            assert!(d.add_stack(id, u64::from(id), &[u64::from(id)], None));
        }
        let gone: crate::hash::HashSet<u32> = [7].into_iter().collect();
        // 9 was released before: its stack is not kept for it.
        // 7's call site walked 4 (never a fault stack); 5 is a live
        // process's resident page's.
        for id in [0x4000_0004, 0x4000_0005] {
            assert!(d.add_stack(id, u64::from(id), &[u64::from(id)], None));
        }
        let none = crate::hash::HashSet::default();
        let (also, in_use): (crate::hash::HashSet<u32>, crate::hash::HashSet<u32>) =
            ([0x4000_0004, 0x4000_0005].into_iter().collect(), [0x4000_0005].into_iter().collect());
        let mut forgot = d.forget_stacks(&gone, &|t| t != 9, &in_use, &also);
        forgot.sort_unstable();
        assert_eq!(forgot, vec![0x4000_0002, 0x4000_0004]);
        assert!(d.ips(0x4000_0001).is_some(), "8 still counts under it");
        assert!(d.ips(0x4000_0003).is_some(), "not 7's");
        assert!(d.ips(0x4000_0005).is_some(), "in use");
        assert!(d.forget_stacks(&gone, &|t| t != 9, &none, &none).is_empty());
        let mut all = HashMap::default();
        d.merge_into(&mut all);
        assert_eq!(all.len(), 4, "every count stays");
    }

    #[test]
    fn settled_keys_are_taken_and_their_stacks_go_unless_still_counted_under() {
        let mut d = Drained::default();
        let c = StackCounts { faults: 2, ..StackCounts::default() };
        let of =
            |user_stack: i32, kernel_stack: i32| StackKey { tgid: 7, user_stack, kernel_stack, ..StackKey::default() };
        // 1: counted long ago (two keys); 2: long ago; 3: counted again lately.
        d.next_drain();
        for k in [of(0x4000_0001, -1), of(0x4000_0001, 9), of(0x4000_0002, -1), of(0x4000_0003, -1)] {
            d.add_counts(k, &c);
        }
        for id in [0x4000_0001, 0x4000_0002, 0x4000_0003] {
            assert!(d.add_stack(id, u64::from(id), &[u64::from(id)], None));
        }
        for _ in 0..10 {
            d.next_drain();
        }
        d.add_counts(of(0x4000_0001, 9), &c);
        d.add_counts(of(0x4000_0003, -1), &c);
        let mut taken = d.take_settled(7, 5);
        taken.sort_by_key(|(k, _)| k.user_stack);
        assert_eq!(
            taken.iter().map(|(k, c)| (k.user_stack, c.faults)).collect::<Vec<_>>(),
            [(0x4000_0001, 2), (0x4000_0002, 2)]
        );
        assert!(d.take_settled(7, 5).is_empty() && d.take_settled(8, 0).is_empty());
        let ids: crate::hash::HashSet<u32> = taken.iter().map(|(k, _)| k.user_stack as u32).collect();
        let none = crate::hash::HashSet::default();
        // 1 is still counted under (its key with a kernel stack is young): kept.
        assert_eq!(d.forget_stacks(&none, &|_| true, &none, &ids), vec![0x4000_0002]);
        assert!(d.ips(0x4000_0001).is_some() && d.ips(0x4000_0003).is_some());
        // Counted again later: the key starts afresh.
        d.add_counts(of(0x4000_0002, -1), &c);
        let mut all = HashMap::default();
        d.merge_into(&mut all);
        assert_eq!((all[&of(0x4000_0002, -1)].faults, all[&of(0x4000_0001, 9)].faults), (2, 4));
        assert!(!all.contains_key(&of(0x4000_0001, -1)));
    }

    #[test]
    fn a_stack_nothing_refers_to_goes_once_it_is_old_enough() {
        let mut d = Drained::default();
        let c = StackCounts { faults: 1, ..StackCounts::default() };
        // 1: counted; 2: a live page's owner (referenced); 3: nothing; 4: nothing, but new.
        d.add_counts(key(0x4000_0001), &c);
        for id in [0x4000_0001, 0x4000_0002, 0x4000_0003] {
            assert!(d.add_stack(id, u64::from(id), &[u64::from(id)], None));
        }
        for _ in 0..10 {
            d.next_drain();
        }
        assert!(d.add_stack(0x4000_0004, 4, &[4], None));
        let referenced: crate::hash::HashSet<u32> = [0x4000_0002].into_iter().collect();
        assert_eq!(d.sweep(&referenced, 5), vec![0x4000_0003]);
        assert_eq!(d.stacks(), 3);
        for _ in 0..5 {
            d.next_drain();
        }
        assert_eq!(d.sweep(&referenced, 5), vec![0x4000_0004]);
        assert!(d.ips(0x4000_0001).is_some() && d.ips(0x4000_0002).is_some());
        // Drained again later (a live process walked it once more): stored again.
        assert!(d.add_stack(0x4000_0003, u64::from(0x4000_0003u32), &[3], None));
        assert_eq!(d.ips(0x4000_0003), Some(vec![3]));
    }

    #[test]
    fn drained_counts_add_up_and_a_stack_keeps_its_first_content() {
        let mut d = Drained::default();
        let c = StackCounts { faults: 3, major: 1, time_ns: 30, timed: 3, cow: 0 };
        d.add_counts(key(0x4000_0001), &c);
        d.add_counts(key(0x4000_0001), &c);
        let py = PyStack { tgid: 7, frames: vec![PyFrame { code: 1, instr: 2, stamp: 3 }], ends: 1, truncated: true };
        assert!(d.add_stack(0x4000_0001, 99, &[1, 2, 3], Some(&py)));
        // Drained again after being walked again: same hash, same stack.
        assert!(d.add_stack(0x4000_0001, 99, &[1, 2, 3], Some(&py)));
        assert_eq!(d.ips(0x4000_0001), Some(vec![1, 2, 3]));
        assert_eq!(d.python(0x4000_0001), Some(py));
        let mut all = HashMap::default();
        d.merge_into(&mut all);
        assert_eq!(all[&key(0x4000_0001)].faults, 6);
        assert_eq!(d.reused_faults(), 0);
        // Another stack under the same id: the first is kept, its faults flagged.
        assert!(!d.add_stack(0x4000_0001, 100, &[4], None));
        assert_eq!(d.ips(0x4000_0001), Some(vec![1, 2, 3]));
        assert_eq!(d.reused_faults(), 6);
        assert_eq!(d.stacks(), 1);
    }
}
