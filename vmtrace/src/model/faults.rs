//! The contract's FAULTS object and its latency histograms, derived from
//! the kernel's per-process aggregate.
use serde::{Deserialize, Serialize};
use vmtrace_common::{FaultStats, HIST_BUCKETS, HIST_MIN_SHIFT};

/// The contract's FAULTS object, plus the split by kind of latency.
/// Written through [`FaultsJson`]: a count this kernel's probes cannot take
/// ([`Faults::uncounted`]) is null, not a 0 that reads as measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(into = "FaultsJson", from = "FaultsJson")]
pub struct Faults {
    pub total: u64,
    pub minor: u64,
    pub major: u64,
    pub write: u64,
    pub exec: u64,
    pub cow: u64,
    /// Faults served by a huge page (anonymous THP allocated in the fault, or
    /// any fault of a hugetlb mapping); null when `--events regions` is off.
    pub huge: Option<u64>,
    /// Time inside the fault handler (estimated from the sample when minor latency is sampled).
    pub time_ns: u64,
    pub minor_time_ns: u64,
    pub major_time_ns: u64,
    /// Faults taken in kernel mode on user memory (e.g. `read()` into a fresh buffer).
    pub kernel_mode: u64,
    /// Faults whose latency was measured: the histograms count these.
    pub timed: u64,
    pub latency_hist_ns: Hist,
    /// The split by kind; absent when empty (regions and files have none).
    pub minor_latency_hist_ns: Hist,
    pub major_latency_hist_ns: Hist,
    /// Faults the kernel took for the process through `get_user_pages()`
    /// (`mlock`, `MAP_POPULATE`/`MAP_LOCKED`, `MADV_POPULATE_*`, pinning):
    /// not in `total` (no exception, no stack), but in the kernel's
    /// `min_flt`/`maj_flt`, so `total + populated` is getrusage's count.
    /// Absent where the fault end cannot see them (the perf-event end) and
    /// for regions and files.
    pub populated: Option<u64>,
    /// `UNCOUNTED_*` bits: the counts this kernel's probes cannot take
    /// (arm64's perf-event fault start has no access type; without
    /// `do_wp_page` no COW fault is seen). Their fields are 0 here and null
    /// in summary.json; summary.txt prints "-".
    pub uncounted: u8,
}

impl Faults {
    /// `v` (one of this object's counts, `bit` its `UNCOUNTED_*` bit) as a
    /// report shows it: `f(v)`, or "-" where the probes cannot take it.
    pub fn shown(&self, bit: u8, v: u64, f: impl Fn(u64) -> String) -> String {
        if self.uncounted & bit == 0 {
            f(v)
        } else {
            "-".into()
        }
    }
}

/// `Faults::uncounted`: WRITE not counted.
pub const UNCOUNTED_WRITE: u8 = 1;
/// `Faults::uncounted`: exec faults not counted.
pub const UNCOUNTED_EXEC: u8 = 2;
/// `Faults::uncounted`: COW faults not counted.
pub const UNCOUNTED_COW: u8 = 4;

/// summary.json's FAULTS object: [`Faults`] with its uncounted fields null.
#[derive(Serialize, Deserialize)]
struct FaultsJson {
    total: u64,
    minor: u64,
    major: u64,
    write: Option<u64>,
    exec: Option<u64>,
    cow: Option<u64>,
    huge: Option<u64>,
    time_ns: u64,
    minor_time_ns: u64,
    major_time_ns: u64,
    kernel_mode: u64,
    timed: u64,
    latency_hist_ns: Hist,
    #[serde(default, skip_serializing_if = "Hist::is_empty")]
    minor_latency_hist_ns: Hist,
    #[serde(default, skip_serializing_if = "Hist::is_empty")]
    major_latency_hist_ns: Hist,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    populated: Option<u64>,
}

impl From<Faults> for FaultsJson {
    fn from(f: Faults) -> Self {
        let counted = |bit: u8, v: u64| (f.uncounted & bit == 0).then_some(v);
        Self {
            total: f.total,
            minor: f.minor,
            major: f.major,
            write: counted(UNCOUNTED_WRITE, f.write),
            exec: counted(UNCOUNTED_EXEC, f.exec),
            cow: counted(UNCOUNTED_COW, f.cow),
            huge: f.huge,
            time_ns: f.time_ns,
            minor_time_ns: f.minor_time_ns,
            major_time_ns: f.major_time_ns,
            kernel_mode: f.kernel_mode,
            timed: f.timed,
            latency_hist_ns: f.latency_hist_ns,
            minor_latency_hist_ns: f.minor_latency_hist_ns,
            major_latency_hist_ns: f.major_latency_hist_ns,
            populated: f.populated,
        }
    }
}

impl From<FaultsJson> for Faults {
    fn from(j: FaultsJson) -> Self {
        let bit = |v: Option<u64>, b: u8| if v.is_none() { b } else { 0 };
        Self {
            uncounted: bit(j.write, UNCOUNTED_WRITE) | bit(j.exec, UNCOUNTED_EXEC) | bit(j.cow, UNCOUNTED_COW),
            total: j.total,
            minor: j.minor,
            major: j.major,
            write: j.write.unwrap_or(0),
            exec: j.exec.unwrap_or(0),
            cow: j.cow.unwrap_or(0),
            huge: j.huge,
            time_ns: j.time_ns,
            minor_time_ns: j.minor_time_ns,
            major_time_ns: j.major_time_ns,
            kernel_mode: j.kernel_mode,
            timed: j.timed,
            latency_hist_ns: j.latency_hist_ns,
            minor_latency_hist_ns: j.minor_latency_hist_ns,
            major_latency_hist_ns: j.major_latency_hist_ns,
            populated: j.populated,
        }
    }
}

/// Log2 latency histogram as `{"le_1024": N, …, "le_inf": N}`, written
/// sparse: only non-zero buckets (an absent bucket is zero). Version-1
/// files, dense with every bucket, read the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hist(pub [u64; HIST_BUCKETS]);

impl Default for Hist {
    fn default() -> Self {
        Self([0; HIST_BUCKETS])
    }
}

impl Hist {
    pub fn bucket_label(i: usize) -> String {
        if i + 1 == HIST_BUCKETS {
            "le_inf".into()
        } else {
            format!("le_{}", 1u64 << (HIST_MIN_SHIFT as usize + i))
        }
    }

    /// Upper bound in ns of bucket `i` (`None` for +inf).
    pub fn bucket_bound(i: usize) -> Option<u64> {
        (i + 1 < HIST_BUCKETS).then(|| 1u64 << (HIST_MIN_SHIFT as usize + i))
    }

    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&c| c == 0)
    }

    /// Upper bound of the bucket holding quantile `q` (0..=1); `None` when empty
    /// or in the +inf bucket.
    pub fn quantile_bound(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.0.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_bound(i);
            }
        }
        None
    }

    /// The bound [`Hist::quantile_bound`] gives, on the scale every table
    /// shows p50/p99 in: 4× buckets (≤1.0, 4.1, 16.4, 65.5 µs …), the finest
    /// the per-region counts keep, so the same faults read the same in the
    /// process, region and file tables. `None` when empty or past 1.07 s.
    pub fn table_quantile_bound(&self, q: f64) -> Option<u64> {
        let fine = self.quantile_bound(q)?.trailing_zeros().checked_sub(HIST_MIN_SHIFT)? as usize;
        // Fine bucket 2k is the upper end of 4× bucket k.
        Self::bucket_bound(fine.div_ceil(2) * 2)
    }

    fn add(&mut self, o: &Hist) {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            *a += b;
        }
    }
}

impl Serialize for Hist {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // 22 buckets per histogram, three per FAULTS object, on every region
        // and process: zeros written out were most of a long recording's file.
        let mut m = s.serialize_map(Some(self.0.iter().filter(|&&c| c > 0).count()))?;
        for (i, c) in self.0.iter().enumerate().filter(|(_, &c)| c > 0) {
            m.serialize_entry(&Self::bucket_label(i), c)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Hist {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = std::collections::BTreeMap::<String, u64>::deserialize(d)?;
        let mut h = Hist::default();
        for (k, v) in m {
            let i = (0..HIST_BUCKETS)
                .find(|&i| Self::bucket_label(i) == k)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown histogram bucket {k}")))?;
            h.0[i] = v;
        }
        Ok(h)
    }
}

/// Rounds `vals` to whole numbers whose sum is their sum rounded (largest
/// remainder): shares of a total, rounded, still add up to it.
pub fn largest_remainder(vals: &mut [f64]) {
    let want = vals.iter().sum::<f64>().round();
    let floors: Vec<f64> = vals.iter().map(|v| v.floor()).collect();
    let left = (want - floors.iter().sum::<f64>()).round().max(0.0) as usize;
    let mut order: Vec<usize> = (0..vals.len()).collect();
    order.sort_by(|&a, &b| (vals[b] - floors[b]).total_cmp(&(vals[a] - floors[a])).then(a.cmp(&b)));
    let up: crate::hash::HashSet<usize> = order.into_iter().take(left).collect();
    for (i, v) in vals.iter_mut().enumerate() {
        *v = floors[i] + if up.contains(&i) { 1.0 } else { 0.0 };
    }
}

/// Scales a sum measured on `timed` of `count` events up to all of them. The
/// one rule for fault time everywhere (processes, regions, files, tensors,
/// live views): minor time is scaled by its own sample, majors (all timed)
/// by theirs, never one by the other's.
pub fn scale(sum: u64, timed: u64, count: u64) -> u64 {
    if timed == 0 || timed >= count {
        sum
    } else {
        (u128::from(sum) * u128::from(count) / u128::from(timed)) as u64
    }
}

impl Faults {
    /// Derives the contract's view from one process's kernel aggregate.
    ///
    /// `total` is every fault that entered the handler on a user address; `major`
    /// is the kernel's own count (end hook, period 1), `minor` the rest. Minor
    /// latency is measured on 1 in `minor_period` faults and its time scaled up.
    pub fn from_stats(s: &FaultStats, minor_period: u32) -> Self {
        let major = s.major;
        let total = s.started.max(major);
        let minor = total - major;
        let minor_time_ns = if minor_period == 0 {
            0
        } else if minor_period == 1 && s.minor_sampled > 0 {
            // Stratified (`--fast-sample N`): every slow fault timed exactly,
            // each sampled fast one already weighted by the faults it stands
            // for. Summed as is, so that regions, files and tensors (summed
            // the same way from their granules) add up to the process.
            s.minor_time_ns
        } else if minor_period == 1 {
            scale(s.minor_time_ns, s.minor_timed, s.minor_seen)
        } else {
            scale(s.minor_time_ns, s.minor_timed, minor)
        };
        let major_time_ns = scale(s.major_time_ns, s.major_timed, major);
        let minor_hist = Hist(s.minor_hist);
        let major_hist = Hist(s.major_hist);
        let mut all = minor_hist.clone();
        all.add(&major_hist);
        Self {
            total,
            minor,
            major,
            write: s.write,
            exec: s.exec,
            cow: s.cow,
            huge: None,
            time_ns: minor_time_ns + major_time_ns,
            minor_time_ns,
            major_time_ns,
            kernel_mode: s.kernel_mode,
            timed: s.minor_timed + s.major_timed,
            latency_hist_ns: all,
            minor_latency_hist_ns: minor_hist,
            major_latency_hist_ns: major_hist,
            populated: Some(s.populated),
            uncounted: 0,
        }
    }

    pub fn add(&mut self, o: &Faults) {
        self.total += o.total;
        self.minor += o.minor;
        self.major += o.major;
        self.write += o.write;
        self.exec += o.exec;
        self.cow += o.cow;
        self.uncounted |= o.uncounted;
        self.huge = match (self.huge, o.huge) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.populated = match (self.populated, o.populated) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.time_ns += o.time_ns;
        self.minor_time_ns += o.minor_time_ns;
        self.major_time_ns += o.major_time_ns;
        self.kernel_mode += o.kernel_mode;
        self.timed += o.timed;
        self.latency_hist_ns.add(&o.latency_hist_ns);
        self.minor_latency_hist_ns.add(&o.minor_latency_hist_ns);
        self.major_latency_hist_ns.add(&o.major_latency_hist_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> FaultStats {
        let mut s = FaultStats {
            started: 1000,
            write: 600,
            cow: 10,
            exec: 5,
            major: 10,
            minor_seen: 990,
            ..Default::default()
        };
        s.minor_timed = 990;
        s.minor_time_ns = 990 * 1500;
        s.minor_hist[1] = 990;
        s.major_timed = 10;
        s.major_time_ns = 10 * 60_000;
        s.major_hist[6] = 10;
        s
    }

    /// A count the probes cannot take is null in summary.json, not 0, and
    /// reads back as uncounted; counted ones are written as before.
    #[test]
    fn uncounted_counts_are_null_in_json_and_read_back() {
        let mut f = Faults::from_stats(&stats(), 1);
        let counted = serde_json::to_value(&f).unwrap();
        assert_eq!((counted["write"].as_u64(), counted["cow"].as_u64()), (Some(600), Some(10)));
        f.uncounted = UNCOUNTED_WRITE | UNCOUNTED_EXEC;
        let v = serde_json::to_value(&f).unwrap();
        assert!(v["write"].is_null() && v["exec"].is_null(), "{v}");
        assert_eq!(v["cow"].as_u64(), Some(10), "{v}");
        assert_eq!(v["total"].as_u64(), Some(1000));
        // The field order of the contract is kept.
        let text = serde_json::to_string(&f).unwrap();
        assert!(
            text.starts_with(r#"{"total":1000,"minor":990,"major":10,"write":null,"exec":null,"cow":10,"huge":null,"#),
            "{text}"
        );
        let back: Faults = serde_json::from_str(&text).unwrap();
        assert_eq!(back.uncounted, UNCOUNTED_WRITE | UNCOUNTED_EXEC);
        assert_eq!((back.write, back.exec, back.cow, back.total), (0, 0, 10, 1000));
        // Summing keeps the mark.
        let mut t = Faults::default();
        t.add(&back);
        assert_eq!(t.uncounted, UNCOUNTED_WRITE | UNCOUNTED_EXEC);
    }

    #[test]
    fn exact_when_every_fault_is_timed() {
        let f = Faults::from_stats(&stats(), 1);
        assert_eq!((f.total, f.minor, f.major), (1000, 990, 10));
        assert_eq!(f.time_ns, 990 * 1500 + 600_000);
        assert_eq!(f.timed, 1000);
        assert_eq!(f.latency_hist_ns.count(), 1000);
        assert_eq!(f.minor_latency_hist_ns.quantile_bound(0.5), Some(2048));
        assert_eq!(f.major_latency_hist_ns.quantile_bound(0.99), Some(65_536));
    }

    #[test]
    fn sampled_minor_time_is_scaled_to_all_minors() {
        let mut s = stats();
        s.minor_seen = 99;
        s.minor_timed = 99;
        s.minor_time_ns = 99 * 1000;
        let f = Faults::from_stats(&s, 10);
        assert_eq!(f.minor, 990);
        assert_eq!(f.minor_time_ns, 990 * 1000);
    }

    #[test]
    fn minor_time_is_zero_when_not_measured() {
        let mut s = stats();
        s.minor_timed = 0;
        s.minor_time_ns = 0;
        s.minor_seen = 0;
        let f = Faults::from_stats(&s, 0);
        assert_eq!((f.minor, f.minor_time_ns, f.time_ns), (990, 0, 600_000));
    }

    #[test]
    fn histogram_serializes_sparse_with_contract_labels_and_round_trips() {
        let f = Faults::from_stats(&stats(), 1);
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["latency_hist_ns"]["le_2048"], 990);
        assert_eq!(v["latency_hist_ns"]["le_65536"], 10);
        // Only the non-zero buckets are written.
        assert_eq!(v["latency_hist_ns"].as_object().unwrap().len(), 2);
        assert!(v["latency_hist_ns"].get("le_1024").is_none());
        let back: Faults = serde_json::from_value(v).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn empty_split_histograms_are_left_out_and_read_back_empty() {
        let mut s = stats();
        s.major = 0;
        s.major_timed = 0;
        s.major_time_ns = 0;
        s.major_hist = [0; HIST_BUCKETS];
        let f = Faults::from_stats(&s, 1);
        let v = serde_json::to_value(&f).unwrap();
        assert!(v.get("major_latency_hist_ns").is_none(), "{v}");
        assert_eq!(v["minor_latency_hist_ns"]["le_2048"], 990);
        let back: Faults = serde_json::from_value(v).unwrap();
        assert_eq!(back, f);
        assert!(back.major_latency_hist_ns.is_empty());
    }

    #[test]
    fn version_1_dense_histograms_still_read() {
        let dense: serde_json::Map<String, serde_json::Value> = (0..HIST_BUCKETS)
            .map(|i| (Hist::bucket_label(i), serde_json::Value::from(u64::from(i == 3) * 7)))
            .collect();
        let h: Hist = serde_json::from_value(serde_json::Value::Object(dense)).unwrap();
        assert_eq!(h.count(), 7);
        assert_eq!(h.0[3], 7);
        assert_eq!(serde_json::to_string(&h).unwrap(), r#"{"le_8192":7}"#);
        assert!(serde_json::from_str::<Hist>(r#"{"le_3":1}"#).is_err(), "an unknown bucket is an error");
    }

    #[test]
    fn table_quantiles_use_the_4x_buckets_of_the_regions() {
        let mut h = Hist::default();
        // Fine buckets ≤1.0 µs, ≤2.0 µs, ≤4.1 µs, ≤8.2 µs.
        h.0[..4].copy_from_slice(&[10, 50, 10, 30]);
        assert_eq!(h.quantile_bound(0.5), Some(2048));
        assert_eq!(h.table_quantile_bound(0.5), Some(4096));
        assert_eq!(h.table_quantile_bound(0.99), Some(16_384));
        assert_eq!(h.table_quantile_bound(0.05), Some(1024));
        let mut far = Hist::default();
        far.0[HIST_BUCKETS - 2] = 1;
        assert_eq!(far.table_quantile_bound(0.5), Some(1 << 30));
        far.0[HIST_BUCKETS - 1] = 9;
        assert_eq!(far.table_quantile_bound(0.5), None, "the overflow bucket");
    }

    #[test]
    fn quantiles_of_empty_and_overflow() {
        assert_eq!(Hist::default().quantile_bound(0.5), None);
        let mut h = Hist::default();
        h.0[HIST_BUCKETS - 1] = 3;
        assert_eq!(h.quantile_bound(0.5), None);
        assert_eq!(Hist::bucket_label(HIST_BUCKETS - 1), "le_inf");
        assert_eq!(Hist::bucket_label(0), "le_1024");
    }
}
