//! What `vmtrace top` shows: rates over the last refresh, computed from the
//! cumulative counters the kernel keeps. No terminal here, so it is tested
//! without one.
use crate::hash::HashMap;

use crate::model::{
    live::{Cum, Rates},
    RegionKind, RegionSummary,
};

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
    /// Resident bytes now (the kernel's counters), and their growth per
    /// second over the last refresh; `None` where not known.
    pub resident: Option<u64>,
    pub resident_per_s: Option<f64>,
    /// Hosts with two NUMA nodes or more: its main node and that node's
    /// share of its pages ("1:97%", `top::numa`); `None` where not read.
    pub node: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RegionRow {
    pub pid: u32,
    pub comm: String,
    /// Path, or the kind in brackets (`[anon]`, `[heap]`…); a process's
    /// Python arenas are one row, `[python arena] ×N`.
    pub name: String,
    pub kind: RegionKind,
    pub size: u64,
    pub rates: Rates,
    pub total_faults: u64,
    /// Write faults that found the page present and read-only: in a forked
    /// worker's Python arenas, reference counts written into its parent's
    /// objects.
    pub total_cow: u64,
}

/// A row of the regions pane before its rates: one region, or all of one
/// process's CPython obmalloc arenas (a Python process has one per MiB of
/// small objects; a hundred rows of `[python arena]` say less than one).
#[derive(Clone, Debug, PartialEq)]
pub struct RegionTotal {
    /// (pid, start), or (pid, `ARENAS`) for the arenas' row.
    pub key: (u32, u64),
    pub kind: RegionKind,
    pub name: String,
    pub size: u64,
    pub cum: Cum,
}

/// The start in the key of a process's arenas row.
pub const ARENAS: u64 = u64::MAX;

/// The pane's rows of `regions`: each region, a process's arenas summed.
pub fn region_totals(regions: &[RegionSummary]) -> Vec<RegionTotal> {
    let start = |r: &RegionSummary| u64::from_str_radix(r.start.trim_start_matches("0x"), 16).unwrap_or(0);
    let mut out: Vec<RegionTotal> = Vec::new();
    let mut arenas: HashMap<u32, (usize, usize)> = HashMap::default();
    for r in regions {
        let f = &r.faults;
        let cum = Cum { faults: f.total, major: f.major, cow: f.cow, time_ns: f.time_ns, ..Cum::default() };
        if r.kind == RegionKind::PythonArena {
            if let Some(&(i, n)) = arenas.get(&r.pid) {
                let t = &mut out[i];
                t.size += r.size();
                let c = &mut t.cum;
                (c.faults, c.major, c.cow, c.time_ns) =
                    (c.faults + cum.faults, c.major + cum.major, c.cow + cum.cow, c.time_ns + cum.time_ns);
                t.name = format!("{} ×{}", crate::regions::python::NAME, n + 1);
                arenas.insert(r.pid, (i, n + 1));
                continue;
            }
            arenas.insert(r.pid, (out.len(), 1));
            out.push(RegionTotal {
                key: (r.pid, ARENAS),
                kind: r.kind,
                name: crate::regions::python::NAME.into(),
                size: r.size(),
                cum,
            });
            continue;
        }
        out.push(RegionTotal {
            key: (r.pid, start(r)),
            kind: r.kind,
            name: r.path.clone().unwrap_or_else(|| format!("[{}]", r.kind.label())),
            size: r.size(),
            cum,
        });
    }
    out
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
    /// Hosts with two NUMA nodes or more: the nodes and the shown
    /// processes' pages on each (and a NODE column).
    pub numa: Option<super::numa::NodeTotals>,
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

/// Bytes in at most 5 columns, binary units:
/// 900 KiB → "900K", 5.5 MiB → "5.5M", 130 MiB → "130M", 2.5 GiB → "2.5G".
pub fn human_bytes(v: f64) -> String {
    const K: f64 = 1024.0;
    let (m, g) = (K * K, K * K * K);
    if v >= 9.95 * K * g {
        format!("{:.0}T", v / (K * g))
    } else if v >= 999.5 * g {
        format!("{:.1}T", v / (K * g))
    } else if v >= 9.95 * g {
        format!("{:.0}G", v / g)
    } else if v >= 999.5 * m {
        format!("{:.1}G", v / g)
    } else if v >= 9.95 * m {
        format!("{:.0}M", v / m)
    } else if v >= 999.5 * K {
        format!("{:.1}M", v / m)
    } else {
        format!("{:.0}K", v / K)
    }
}

/// A growth in bytes with its sign ("+12M", "-96M"); "0" below 1 KiB.
pub fn human_growth(v: f64) -> String {
    if v.abs() < 1024.0 {
        "0".into()
    } else {
        format!("{}{}", if v > 0.0 { "+" } else { "-" }, human_bytes(v.abs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_byte_counts() {
        assert_eq!(human_bytes(0.0), "0K");
        assert_eq!(human_bytes(900.0 * 1024.0), "900K");
        assert_eq!(human_bytes(5.5 * 1_048_576.0), "5.5M");
        assert_eq!(human_bytes(130.0 * 1_048_576.0), "130M");
        assert_eq!(human_bytes(2.5 * 1_073_741_824.0), "2.5G");
        assert_eq!(human_bytes(40.0 * 1_073_741_824.0), "40G");
        assert_eq!(human_growth(16.0 * 1_048_576.0), "+16M");
        assert_eq!(human_growth(-96.0 * 1_048_576.0), "-96M");
        assert_eq!(human_growth(100.0), "0");
    }

    #[test]
    fn sorting_follows_the_key() {
        let row = |pid, faults, major| ProcRow {
            pid,
            comm: String::new(),
            rates: Rates { faults, major, ..Rates::default() },
            total_faults: 0,
            resident: None,
            resident_per_s: None,
            node: None,
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
    fn a_processs_python_arenas_are_one_row_with_their_cow() {
        use crate::model::Faults;
        let region = |pid: u32, start: u64, kind: RegionKind, path: Option<&str>, total: u64, cow: u64| RegionSummary {
            pid,
            start: format!("{start:#x}"),
            end: format!("{:#x}", start + (1 << 20)),
            perms: "rw-p".into(),
            kind,
            path: path.map(str::to_string),
            offset: 0,
            faults: Faults { total, cow, ..Faults::default() },
            pages_touched: total,
            cow_from: None,
            folded: 0,
        };
        let arena =
            |pid, start, total, cow| region(pid, start, RegionKind::PythonArena, Some("[python arena]"), total, cow);
        let rows = region_totals(&[
            arena(7, 0x7f00_0000_0000, 256, 250),
            region(7, 0x7f00_0010_0000, RegionKind::Anon, None, 10, 0),
            arena(7, 0x7f00_0020_0000, 200, 190),
            arena(8, 0x7f00_0000_0000, 100, 100),
            arena(7, 0x7f00_0030_0000, 50, 40),
        ]);
        let got: Vec<_> =
            rows.iter().map(|r| (r.key, r.kind, r.name.as_str(), r.size >> 20, r.cum.faults, r.cum.cow)).collect();
        assert_eq!(
            got,
            [
                ((7, ARENAS), RegionKind::PythonArena, "[python arena] ×3", 3, 506, 480),
                ((7, 0x7f00_0010_0000), RegionKind::Anon, "[anon]", 1, 10, 0),
                ((8, ARENAS), RegionKind::PythonArena, "[python arena]", 1, 100, 100),
            ]
        );
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
