//! The OOM flight recorder: each traced process's fault count over the last
//! few seconds, so a kill can say how fast its victim was faulting, and the
//! kills recorded so far.
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use vmtrace_common::FaultStats;

use crate::model::OomRecord;

/// How far back each process's fault count is kept.
const HISTORY: Duration = Duration::from_secs(5);
const HISTORY_STEP: Duration = Duration::from_millis(250);

pub(crate) struct FlightRecorder {
    /// (seconds since start, faults so far) per process, last few seconds.
    history: HashMap<u32, VecDeque<(f64, u64)>>,
    last_sample: Instant,
    ooms: Vec<OomRecord>,
}

impl FlightRecorder {
    pub(crate) fn new(now: Instant) -> Self {
        Self { history: HashMap::default(), last_sample: now, ooms: Vec::new() }
    }

    /// Whether the next sample is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_sample) >= HISTORY_STEP
    }

    /// One sample: the fault count of each live traced process at `now_s`.
    pub(crate) fn sample(&mut self, now: Instant, now_s: f64, stats: &[(u32, FaultStats)]) {
        self.last_sample = now;
        for (tgid, s) in stats {
            let h = self.history.entry(*tgid).or_default();
            h.push_back((now_s, s.started));
            while h.front().is_some_and(|&(t, _)| now_s - t > HISTORY.as_secs_f64()) {
                h.pop_front();
            }
        }
        // Processes gone from the aggregates (they exited) are not sampled
        // again: their history goes once it is all older than the window.
        self.history.retain(|_, h| h.back().is_some_and(|&(t, _)| now_s - t <= HISTORY.as_secs_f64()));
    }

    /// Fault rate of `pid` over the window, up to `now_s`, when it had made
    /// `current` faults: its count is read once more at the kill, and a
    /// process younger than one sample is measured from when it was first
    /// seen (`first_seen_s`).
    pub(crate) fn rate(&self, pid: u32, now_s: f64, current: u64, first_seen_s: Option<f64>) -> Option<f64> {
        let (t0, n0) = match self.history.get(&pid).and_then(|h| h.front()) {
            Some(&(t, n)) => (t, n),
            None => (first_seen_s?, 0),
        };
        (now_s > t0).then(|| current.saturating_sub(n0) as f64 / (now_s - t0))
    }

    pub(crate) fn record(&mut self, r: OomRecord) {
        self.ooms.push(r);
    }

    pub(crate) fn ooms(&self) -> &[OomRecord] {
        &self.ooms
    }

    pub(crate) fn take_ooms(&mut self) -> Vec<OomRecord> {
        std::mem::take(&mut self.ooms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(started: u64) -> FaultStats {
        FaultStats { started, ..FaultStats::default() }
    }

    #[test]
    fn rate_is_over_the_last_seconds_only() {
        let t0 = Instant::now();
        let mut f = FlightRecorder::new(t0);
        assert!(!f.due(t0 + Duration::from_millis(100)));
        for i in 0..=28u32 {
            // 100 faults per 250 ms sample.
            f.sample(t0, f64::from(i) * 0.25, &[(7, stats(u64::from(i) * 100))]);
        }
        // Window start: the oldest sample within 5 s of 7.0 s is at 2.0 s (800 faults).
        let r = f.rate(7, 7.5, 3000, None).unwrap();
        assert!((r - (3000.0 - 800.0) / 5.5).abs() < 1e-9, "{r}");
    }

    #[test]
    fn a_process_never_sampled_counts_from_when_it_was_seen() {
        let f = FlightRecorder::new(Instant::now());
        assert_eq!(f.rate(9, 2.0, 300, Some(1.5)), Some(600.0));
        assert_eq!(f.rate(9, 2.0, 300, None), None);
        assert_eq!(f.rate(9, 1.5, 300, Some(1.5)), None);
    }
}
