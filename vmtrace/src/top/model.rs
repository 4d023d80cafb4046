//! What `vmtrace top` shows: rates over the last refresh, computed from the
//! cumulative counters the kernel keeps. No terminal here, so it is tested
//! without one.
use std::collections::HashMap;

/// Cumulative counters of one process or region, as read from the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cum {
    pub faults: u64,
    pub major: u64,
    pub cow: u64,
    pub time_ns: u64,
    pub munmap: u64,
    pub ipis: u64,
}

/// Per-second rates over one refresh.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    pub faults: f64,
    pub minor: f64,
    pub major: f64,
    /// Time in the fault handler as % of one CPU's wall time (like top's %CPU:
    /// several threads faulting at once go past 100).
    pub fault_pct: f64,
    pub cow: f64,
    pub munmap: f64,
    /// TLB-flush IPIs sent to other CPUs (remote shootdowns).
    pub ipis: f64,
}

impl Rates {
    /// From two readings `dt_s` apart. A counter that went backwards (a pid
    /// reused, a map entry re-created) counts from zero.
    pub fn between(before: &Cum, now: &Cum, dt_s: f64) -> Self {
        if dt_s <= 0.0 {
            return Self::default();
        }
        let d = |a: u64, b: u64| if a >= b { (a - b) as f64 / dt_s } else { a as f64 / dt_s };
        let faults = d(now.faults, before.faults);
        let major = d(now.major, before.major).min(faults);
        Self {
            faults,
            minor: faults - major,
            major,
            fault_pct: d(now.time_ns, before.time_ns) / 1e9 * 100.0,
            cow: d(now.cow, before.cow),
            munmap: d(now.munmap, before.munmap),
            ipis: d(now.ipis, before.ipis),
        }
    }

    fn key(&self, k: SortKey) -> f64 {
        match k {
            SortKey::Faults => self.faults,
            SortKey::Major => self.major,
            SortKey::Time => self.fault_pct,
            SortKey::Cow => self.cow,
            SortKey::Munmap => self.munmap,
            SortKey::Ipis => self.ipis,
        }
    }
}

/// Column the tables are sorted by (`s` cycles through them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Faults,
    Major,
    Time,
    Cow,
    Munmap,
    Ipis,
}

impl SortKey {
    #[must_use]
    pub fn next(self) -> Self {
        match self {
            Self::Faults => Self::Major,
            Self::Major => Self::Time,
            Self::Time => Self::Cow,
            Self::Cow => Self::Munmap,
            Self::Munmap => Self::Ipis,
            Self::Ipis => Self::Faults,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Faults => "faults/s",
            Self::Major => "major/s",
            Self::Time => "fault time",
            Self::Cow => "COW/s",
            Self::Munmap => "munmap/s",
            Self::Ipis => "IPIs/s",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProcRow {
    pub pid: u32,
    pub comm: String,
    pub rates: Rates,
    pub total_faults: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RegionRow {
    pub pid: u32,
    pub comm: String,
    /// Path, or the kind in brackets (`[anon]`, `[heap]`…).
    pub name: String,
    pub size: u64,
    pub rates: Rates,
    pub total_faults: u64,
}

/// Everything one frame shows.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub target: String,
    pub uptime_s: f64,
    pub total: Rates,
    pub total_faults: u64,
    pub procs: Vec<ProcRow>,
    /// None when regions are not traced.
    pub regions: Option<Vec<RegionRow>>,
    /// One line per storm going on (or ended within the last seconds).
    pub storms: Vec<String>,
    /// The latest OOM kill.
    pub oom: Option<String>,
    /// dTLB misses per second, or why there are none.
    pub dtlb: String,
    pub lost_events: u64,
    /// Set once the traced command or pid is gone.
    pub ended: Option<String>,
}

/// Turns successive readings into rates, remembering the previous ones.
#[derive(Default)]
pub struct RateKeeper<K> {
    prev: HashMap<K, Cum>,
}

impl<K: std::hash::Hash + Eq + Copy> RateKeeper<K> {
    /// Rates of every key in `now`; keys gone since the last call are forgotten.
    pub fn update(&mut self, now: &[(K, Cum)], dt_s: f64) -> Vec<(K, Rates)> {
        let out = now
            .iter()
            .map(|(k, c)| (*k, Rates::between(&self.prev.get(k).copied().unwrap_or_default(), c, dt_s)))
            .collect();
        self.prev = now.iter().copied().collect();
        out
    }
}

/// Sorts rows by `key`, busiest first; cumulative faults break ties so a
/// quiet table keeps a stable order.
pub fn sort_procs(rows: &mut [ProcRow], key: SortKey) {
    rows.sort_by(|a, b| {
        b.rates.key(key).total_cmp(&a.rates.key(key)).then(b.total_faults.cmp(&a.total_faults)).then(a.pid.cmp(&b.pid))
    });
}

pub fn sort_regions(rows: &mut [RegionRow], key: SortKey) {
    rows.sort_by(|a, b| {
        b.rates.key(key).total_cmp(&a.rates.key(key)).then(b.total_faults.cmp(&a.total_faults)).then(a.pid.cmp(&b.pid))
    });
}

/// 1234 → "1234", 12345 → "12.3k", 1.5e6 → "1.5M".
pub fn human(v: f64) -> String {
    if v >= 9_999_500.0 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 999_950.0 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 9_999.5 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cum(faults: u64, major: u64, time_ns: u64) -> Cum {
        Cum { faults, major, time_ns, ..Cum::default() }
    }

    #[test]
    fn rates_over_an_interval() {
        let r = Rates::between(&cum(100, 10, 0), &cum(2100, 30, 500_000_000), 2.0);
        assert!((r.faults - 1000.0).abs() < 1e-9);
        assert!((r.major - 10.0).abs() < 1e-9);
        assert!((r.minor - 990.0).abs() < 1e-9);
        // 0.5 s of handler time in 2 s of wall = 25%.
        assert!((r.fault_pct - 25.0).abs() < 1e-9);
    }

    #[test]
    fn a_reset_counter_counts_from_zero() {
        let r = Rates::between(&cum(5000, 0, 0), &cum(300, 0, 0), 1.0);
        assert!((r.faults - 300.0).abs() < 1e-9);
        assert_eq!(Rates::between(&cum(0, 0, 0), &cum(10, 0, 0), 0.0), Rates::default());
    }

    #[test]
    fn keeper_forgets_gone_keys() {
        let mut k = RateKeeper::default();
        k.update(&[(1u32, cum(10, 0, 0)), (2, cum(10, 0, 0))], 1.0);
        let r = k.update(&[(1, cum(30, 0, 0))], 1.0);
        assert_eq!(r.len(), 1);
        assert!((r[0].1.faults - 20.0).abs() < 1e-9);
        // Key 2 comes back: counted from zero, not from its old reading.
        let r = k.update(&[(2, cum(15, 0, 0))], 1.0);
        assert!((r[0].1.faults - 15.0).abs() < 1e-9);
    }

    #[test]
    fn sorting_follows_the_key() {
        let row = |pid, faults, major| ProcRow {
            pid,
            comm: String::new(),
            rates: Rates { faults, major, ..Rates::default() },
            total_faults: 0,
        };
        let mut rows = vec![row(1, 10.0, 5.0), row(2, 20.0, 0.0), row(3, 5.0, 9.0)];
        sort_procs(&mut rows, SortKey::Faults);
        assert_eq!(rows.iter().map(|r| r.pid).collect::<Vec<_>>(), [2, 1, 3]);
        sort_procs(&mut rows, SortKey::Major);
        assert_eq!(rows.iter().map(|r| r.pid).collect::<Vec<_>>(), [3, 1, 2]);
        let mut k = SortKey::Faults;
        for _ in 0..6 {
            k = k.next();
        }
        assert_eq!(k, SortKey::Faults);
    }

    #[test]
    fn human_numbers() {
        assert_eq!(human(0.4), "0");
        assert_eq!(human(1234.0), "1234");
        assert_eq!(human(12_345.0), "12.3k");
        assert_eq!(human(1_500_000.0), "1.5M");
        assert_eq!(human(25_000_000.0), "25M");
    }
}
