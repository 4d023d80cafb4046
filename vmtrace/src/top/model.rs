//! What `vmtrace top` shows: rates over the last refresh, computed from the
//! cumulative counters the kernel keeps. No terminal here, so it is tested
//! without one.
use crate::model::live::Rates;

/// The rate a table is sorted by.
fn key_of(r: &Rates, k: SortKey) -> f64 {
    match k {
        SortKey::Faults => r.faults,
        SortKey::Major => r.major,
        SortKey::Time => r.fault_pct,
        SortKey::Cow => r.cow,
        SortKey::Munmap => r.munmap,
        SortKey::Ipis => r.ipis,
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
    /// The findings so far, one line each (docs/findings.md).
    pub findings: Vec<String>,
    /// The latest OOM kill.
    pub oom: Option<String>,
    /// dTLB misses per second, or why there are none.
    pub dtlb: String,
    pub lost_events: u64,
    /// Set once the traced command or pid is gone.
    pub ended: Option<String>,
}

/// Sorts rows by `key`, busiest first; cumulative faults break ties so a
/// quiet table keeps a stable order.
pub fn sort_procs(rows: &mut [ProcRow], key: SortKey) {
    rows.sort_by(|a, b| {
        key_of(&b.rates, key)
            .total_cmp(&key_of(&a.rates, key))
            .then(b.total_faults.cmp(&a.total_faults))
            .then(a.pid.cmp(&b.pid))
    });
}

pub fn sort_regions(rows: &mut [RegionRow], key: SortKey) {
    rows.sort_by(|a, b| {
        key_of(&b.rates, key)
            .total_cmp(&key_of(&a.rates, key))
            .then(b.total_faults.cmp(&a.total_faults))
            .then(a.pid.cmp(&b.pid))
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
