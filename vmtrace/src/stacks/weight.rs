//! What each fault stack stands for. Stacks come in two strata (see
//! `vmtrace_common::STRATUM_*`): every slow fault (one that slept, or was
//! served by a huge page) carries its own stack and stands for itself; the
//! other stacks are a 1-in-N random sample of fault starts and share what is
//! left of their process's totals, in proportion to what was measured in
//! them (a ratio estimate). So each flamegraph adds up to the process table —
//! faults, fault time and majors — and the heavy tail is never left to chance.
use crate::hash::HashMap;
use std::collections::BTreeMap;

use vmtrace_common::STRATUM_EXACT;

use super::Stack;

/// What a flamegraph is weighted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weight {
    Faults,
    TimeNs,
    Major,
    /// Copy-on-write faults.
    Cow,
}

impl Weight {
    pub fn file_stem(self) -> &'static str {
        match self {
            Self::Faults => "faults",
            Self::TimeNs => "fault-time",
            Self::Major => "major-faults",
            Self::Cow => "cow",
        }
    }

    /// What `e` stands for by this weight.
    pub fn of(self, e: &Estimate) -> f64 {
        match self {
            Self::Faults => e.faults,
            Self::TimeNs => e.time_ns,
            Self::Major => e.major,
            Self::Cow => e.cow,
        }
    }
}

/// The weights a stack's counts are shared out by, in `Estimate`'s order.
const WEIGHTS: usize = 4;

/// The frame standing for the stacks folded under it by [`super::flamegraph::fold_small`].
pub const SMALL_STACKS: &str = "[small stacks folded]";

/// The leaf a folded stack keeps after [`SMALL_STACKS`]: a fork child's
/// pages shared with its parent stay told apart from its own when their
/// stacks are too light to show (resident.svg would else show a worker's
/// shared pages as its own).
pub fn kept_leaf(last_frame: &str) -> Option<&str> {
    (last_frame == crate::model::resident::SHARED_WITH_PARENT).then_some(last_frame)
}

/// `total` shared out in proportion to `shares` in whole parts that add up to it.
pub fn apportion(total: u64, shares: &[f64]) -> Vec<u64> {
    let sum: f64 = shares.iter().sum();
    if shares.is_empty() {
        return vec![];
    }
    if sum <= 0.0 {
        let mut parts = vec![0; shares.len()];
        parts[0] = total;
        return parts;
    }
    let exact: Vec<f64> = shares.iter().map(|s| s / sum * total as f64).collect();
    let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let left = total.saturating_sub(parts.iter().sum());
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b)));
    for &i in order.iter().cycle().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// A process's totals from the process table: what its stacks must add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub faults: u64,
    pub time_ns: u64,
    pub major: u64,
    pub cow: u64,
}

impl Totals {
    /// A process's totals from its fault counts.
    pub fn of(f: &crate::model::Faults) -> Self {
        Self { faults: f.total, time_ns: f.time_ns, major: f.major, cow: f.cow }
    }

    fn values(&self) -> [f64; WEIGHTS] {
        [self.faults as f64, self.time_ns as f64, self.major as f64, self.cow as f64]
    }
}

/// The frame of a process's share that no stack was sampled for (a short
/// process may take fewer faults than the sampling period).
pub const UNSAMPLED: &str = "[no stack sampled]";

/// `Stack::stratum` bit of a stack weighed already: the stacks of exited
/// processes folded into the "other" process while recording, each weighed
/// against its own process's totals then. `weigh` leaves its estimate.
pub const WEIGHED: u32 = 1 << 16;

/// Whether `s` is of the exact stratum (weighed already or not).
pub fn exact(s: &Stack) -> bool {
    s.stratum & !WEIGHED == STRATUM_EXACT
}

/// Sets every stack's `estimate` (but those `WEIGHED` already) and appends
/// one `UNSAMPLED` stack per process whose left-over has no sampled stack
/// to go to, named by `comm_of` for a process with no stack at all (a
/// short one).
pub fn weigh(stacks: &mut Vec<Stack>, totals: &BTreeMap<u32, Totals>, comm_of: &dyn Fn(u32) -> String) {
    #[derive(Default)]
    struct Sums {
        exact: [f64; WEIGHTS],
        sampled: [f64; WEIGHTS],
        comm: String,
    }
    let measured =
        |s: &Stack| [s.counts.faults as f64, s.counts.time_ns as f64, s.counts.major as f64, s.counts.cow as f64];
    let mut sums: HashMap<u32, Sums> = HashMap::default();
    for s in stacks.iter().filter(|s| s.stratum & WEIGHED == 0) {
        let e = sums.entry(s.pid).or_default();
        e.comm.clone_from(&s.comm);
        let side = if s.stratum == STRATUM_EXACT { &mut e.exact } else { &mut e.sampled };
        for (a, b) in side.iter_mut().zip(measured(s)) {
            *a += b;
        }
    }
    // Per process and weight: the factor for sampled stacks, and what no
    // sampled stack can take.
    let mut factors: HashMap<u32, [f64; WEIGHTS]> = HashMap::default();
    let mut unsampled = Vec::new();
    for (&pid, sum) in &sums {
        let want = totals.get(&pid).copied().unwrap_or_default().values();
        let mut f = [0.0; WEIGHTS];
        let mut rest = [0.0; WEIGHTS];
        for i in 0..WEIGHTS {
            let left = (want[i] - sum.exact[i]).max(0.0);
            if sum.sampled[i] > 0.0 {
                f[i] = left / sum.sampled[i];
            } else {
                rest[i] = left;
            }
        }
        factors.insert(pid, f);
        if rest.iter().any(|&r| r >= 0.5) {
            unsampled.push((pid, sum.comm.clone(), rest));
        }
    }
    for (&pid, t) in totals.iter().filter(|(pid, _)| !sums.contains_key(pid)) {
        let rest = t.values();
        if rest.iter().any(|&r| r >= 0.5) {
            unsampled.push((pid, comm_of(pid), rest));
        }
    }
    for s in stacks.iter_mut().filter(|s| s.stratum & WEIGHED == 0) {
        let m = measured(s);
        s.estimate = if s.stratum == STRATUM_EXACT {
            Estimate::from(m)
        } else {
            let f = factors.get(&s.pid).copied().unwrap_or([1.0; WEIGHTS]);
            Estimate::from(std::array::from_fn(|i| m[i] * f[i]))
        };
    }
    unsampled.sort_by_key(|u| u.0);
    for (pid, comm, rest) in unsampled {
        stacks.push(Stack {
            pid,
            comm,
            user: vec![UNSAMPLED.into()].into(),
            estimate: Estimate::from(rest),
            ..Stack::default()
        });
    }
}

/// A stack's estimated share of its process's faults, fault time and majors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    pub faults: f64,
    pub time_ns: f64,
    pub major: f64,
    pub cow: f64,
}

impl Estimate {
    /// Adds `o` in, weight by weight.
    pub fn add(&mut self, o: &Self) {
        self.faults += o.faults;
        self.time_ns += o.time_ns;
        self.major += o.major;
        self.cow += o.cow;
    }
}

impl From<[f64; WEIGHTS]> for Estimate {
    fn from([faults, time_ns, major, cow]: [f64; WEIGHTS]) -> Self {
        Self { faults, time_ns, major, cow }
    }
}

/// How the stacks of a recording were chosen, for flamegraph titles: faults
/// with an exact stack, and faults sampled at random.
pub fn strata(stacks: &[Stack]) -> (u64, u64) {
    stacks.iter().fold(
        (0, 0),
        |(e, s), st| {
            if exact(st) {
                (e + st.counts.faults, s)
            } else {
                (e, s + st.counts.faults)
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use vmtrace_common::{StackCounts, STRATUM_SAMPLED};

    use super::*;

    fn stack(pid: u32, leaf: &str, stratum: u32, faults: u64, time_ns: u64, major: u64) -> Stack {
        Stack {
            pid,
            comm: "w".into(),
            user: vec![leaf.into()].into(),
            counts: StackCounts { faults, major, time_ns, timed: faults, cow: 0 },
            stratum,
            ..Stack::default()
        }
    }

    #[test]
    fn exact_stacks_stand_for_themselves_and_sampled_ones_share_the_rest() {
        // 1,000 faults, 10 ms: 2 slow faults of 4 ms each with exact stacks;
        // 15 fast faults sampled, 10 in `a` and 5 in `b`.
        let mut stacks = vec![
            stack(1, "slow", STRATUM_EXACT, 2, 8_000_000, 2),
            stack(1, "a", STRATUM_SAMPLED, 10, 20_000, 0),
            stack(1, "b", STRATUM_SAMPLED, 5, 10_000, 0),
        ];
        let totals = BTreeMap::from([(1, Totals { faults: 1000, time_ns: 10_000_000, major: 2, cow: 0 })]);
        weigh(&mut stacks, &totals, &|_| "w".into());
        assert_eq!(stacks[0].estimate, Estimate { faults: 2.0, time_ns: 8e6, major: 2.0, cow: 0.0 });
        assert!((stacks[1].estimate.faults - 998.0 * 10.0 / 15.0).abs() < 1e-6);
        assert!((stacks[1].estimate.time_ns - 2e6 * 2.0 / 3.0).abs() < 1e-3);
        let sum = |f: fn(&Estimate) -> f64| stacks.iter().map(|s| f(&s.estimate)).sum::<f64>();
        assert!((sum(|e| e.faults) - 1000.0).abs() < 1e-6);
        assert!((sum(|e| e.time_ns) - 1e7).abs() < 1e-3);
        assert!((sum(|e| e.major) - 2.0).abs() < 1e-9);
        assert_eq!(strata(&stacks), (2, 15));
    }

    #[test]
    fn a_process_without_sampled_stacks_keeps_its_share_under_a_named_frame() {
        let mut stacks = vec![stack(7, "slow", STRATUM_EXACT, 1, 5_000, 1)];
        let totals = BTreeMap::from([(7, Totals { faults: 40, time_ns: 9_000, major: 1, cow: 0 })]);
        weigh(&mut stacks, &totals, &|_| "w".into());
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[1].user[..], [UNSAMPLED.into()]);
        assert_eq!(stacks[1].estimate, Estimate { faults: 39.0, time_ns: 4_000.0, major: 0.0, cow: 0.0 });
    }

    #[test]
    fn a_process_without_any_stack_keeps_its_share_under_its_name() {
        let mut stacks = vec![stack(7, "slow", STRATUM_EXACT, 1, 5_000, 1)];
        let totals = BTreeMap::from([
            (7, Totals { faults: 1, time_ns: 5_000, major: 1, cow: 0 }),
            (8, Totals { faults: 30, time_ns: 600, major: 0, cow: 0 }),
        ]);
        weigh(&mut stacks, &totals, &|pid| format!("p{pid}"));
        assert_eq!(stacks.len(), 2);
        assert_eq!((stacks[1].pid, stacks[1].comm.as_str()), (8, "p8"));
        assert_eq!(stacks[1].user[..], [UNSAMPLED.into()]);
        assert_eq!(stacks[1].estimate, Estimate { faults: 30.0, time_ns: 600.0, major: 0.0, cow: 0.0 });
    }
}
