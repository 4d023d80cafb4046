//! Shootdown storms: a process sending TLB-flush IPIs faster than a threshold.
//! Fed every tick (~100 ms, the window) with each process's IPIs-sent total and
//! the per-call-site deltas, so a storm knows its culprit stack.
use crate::hash::HashMap;
use std::collections::BTreeMap;

/// A call site: (`MmCall`, user stack id).
pub(crate) type Site = (u32, i32);

#[derive(Clone, Debug, PartialEq)]
pub struct RawStorm {
    pub pid: u32,
    pub start_s: f64,
    pub end_s: f64,
    pub peak_per_s: f64,
    pub ipis: u64,
    /// IPIs per call site during the storm.
    pub sites: HashMap<Site, u64>,
    /// The allocator settings of its environment (`malloc_env`), read
    /// while it storms; `None` until then.
    pub malloc: Option<BTreeMap<String, String>>,
}

pub struct StormDetector {
    threshold_per_s: f64,
    last: HashMap<u32, (f64, u64)>,
    open: HashMap<u32, RawStorm>,
    pub closed: Vec<RawStorm>,
}

impl StormDetector {
    pub fn new(threshold_per_s: f64) -> Self {
        Self { threshold_per_s, last: HashMap::default(), open: HashMap::default(), closed: Vec::new() }
    }

    /// IPIs a second from which a process is in a storm.
    pub fn threshold(&self) -> f64 {
        self.threshold_per_s
    }

    /// `pid`'s total IPIs sent at the last tick (0 before its first).
    pub fn last_total(&self, pid: u32) -> u64 {
        self.last.get(&pid).map_or(0, |(_, n)| *n)
    }

    /// `pid` exited: its last count goes (an open storm stays, to be closed
    /// at the end).
    pub fn forget(&mut self, pid: u32) {
        self.last.remove(&pid);
    }

    /// One tick: each process's total IPIs sent so far at `now_s`.
    pub fn tick(&mut self, now_s: f64, totals: &[(u32, u64)]) {
        for &(pid, total) in totals {
            let Some((t0, n0)) = self.last.insert(pid, (now_s, total)) else { continue };
            let dt = now_s - t0;
            if dt <= 0.0 {
                continue;
            }
            let delta = total.saturating_sub(n0);
            let rate = delta as f64 / dt;
            if rate >= self.threshold_per_s {
                let s = self.open.entry(pid).or_insert_with(|| RawStorm {
                    pid,
                    start_s: t0,
                    end_s: now_s,
                    peak_per_s: 0.0,
                    ipis: 0,
                    sites: HashMap::default(),
                    malloc: None,
                });
                s.end_s = now_s;
                s.peak_per_s = s.peak_per_s.max(rate);
                s.ipis += delta;
            } else if let Some(s) = self.open.remove(&pid) {
                self.closed.push(s);
            }
        }
    }

    pub fn in_storm(&self, pid: u32) -> bool {
        self.open.contains_key(&pid)
    }

    /// The processes in a storm whose allocator settings are not read yet.
    pub fn settings_unread(&self) -> Vec<u32> {
        self.open.values().filter(|s| s.malloc.is_none()).map(|s| s.pid).collect()
    }

    /// `pid`'s allocator settings, for its open storm.
    pub fn set_settings(&mut self, pid: u32, settings: BTreeMap<String, String>) {
        if let Some(s) = self.open.get_mut(&pid) {
            s.malloc = Some(settings);
        }
    }

    /// Storms still going on.
    pub fn open_storms(&self) -> impl Iterator<Item = &RawStorm> {
        self.open.values()
    }

    /// IPIs sent from one call site since the last tick.
    pub fn add_site(&mut self, pid: u32, site: Site, ipis: u64) {
        if let Some(s) = self.open.get_mut(&pid) {
            *s.sites.entry(site).or_default() += ipis;
        }
    }

    /// Every storm, open ones closed at their last tick.
    pub fn finish(mut self) -> Vec<RawStorm> {
        self.closed.extend(self.open.into_values());
        self.closed.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        self.closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_above_threshold_and_closes_below() {
        let mut d = StormDetector::new(1000.0);
        d.tick(0.0, &[(7, 0)]);
        d.tick(0.1, &[(7, 50)]); // 500/s: calm
        assert!(!d.in_storm(7));
        d.tick(0.2, &[(7, 250)]); // 2000/s
        assert!(d.in_storm(7));
        d.add_site(7, (1, 42), 200);
        d.tick(0.3, &[(7, 650)]); // 4000/s
        d.add_site(7, (1, 42), 400);
        d.tick(0.4, &[(7, 660)]); // 100/s: over
        assert!(!d.in_storm(7));
        let storms = d.finish();
        assert_eq!(storms.len(), 1);
        let s = &storms[0];
        assert!((s.start_s - 0.1).abs() < 1e-9 && (s.end_s - 0.3).abs() < 1e-9, "{s:?}");
        assert_eq!(s.ipis, 600);
        assert!((s.peak_per_s - 4000.0).abs() < 1e-6);
        assert_eq!(s.sites[&(1, 42)], 600);
    }

    #[test]
    fn a_calm_process_has_no_storm() {
        let mut d = StormDetector::new(1000.0);
        for i in 0u32..10 {
            d.tick(f64::from(i) * 0.1, &[(1, u64::from(i) * 10)]);
        }
        assert!(d.finish().is_empty());
    }
}
