//! The fault-rate timeline of summary.json: faults and majors per bin, from
//! the kernel's running totals.
//!
//! Bins are fixed slices of CLOCK_MONOTONIC (`Instant` is that clock on
//! Linux, the one of `bpf_ktime_get_ns` and of the Perfetto trace), counted
//! from the start of the trace. A tick's growth is spread over the bins its
//! interval covers, in proportion to the time it spent in each: a late tick
//! fills every bin it was late for, so the axis keeps the run's real length
//! however slowly the collector ran.
use std::time::{Duration, Instant};

use crate::model::Timeline;

/// One timeline bin: fine enough that a run of a fraction of a second
/// still draws a curve (`record` polls at least this often).
pub(crate) const TICK: Duration = Duration::from_millis(20);

pub(crate) struct TimelineRecorder {
    /// Totals at the last tick.
    last_totals: (u64, u64),
    /// The start of bin 0.
    start: Instant,
    last_tick: Instant,
    timeline: Timeline,
}

impl TimelineRecorder {
    pub(crate) fn new(now: Instant) -> Self {
        Self { last_totals: (0, 0), start: now, last_tick: now, timeline: Self::empty() }
    }

    fn empty() -> Timeline {
        Timeline { interval_s: TICK.as_secs_f64(), ..Timeline::default() }
    }

    /// Starts the series over from these totals, bin 0 at `now`.
    pub(crate) fn restart(&mut self, now: Instant, totals: (u64, u64)) {
        self.start = now;
        self.last_tick = now;
        self.last_totals = totals;
        self.timeline = Self::empty();
    }

    /// Whether a tick is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_tick) >= TICK
    }

    /// What the totals grew by since the last tick, over the bins from then to `now`.
    pub(crate) fn push(&mut self, now: Instant, (faults, major): (u64, u64)) {
        let from = self.last_tick.saturating_duration_since(self.start).as_nanos() as u64;
        let to = (now.saturating_duration_since(self.start).as_nanos() as u64).max(from);
        let grew = (faults.saturating_sub(self.last_totals.0), major.saturating_sub(self.last_totals.1));
        spread(&mut self.timeline, from, to, grew);
        self.last_tick = now.max(self.last_tick);
        self.last_totals = (faults, major);
    }

    pub(crate) fn take(&mut self) -> Timeline {
        std::mem::take(&mut self.timeline)
    }
}

/// Adds `grew` to the bins of `t` covering `[from, to)` ns after its start,
/// each its share of the time (the whole of it to `from`'s bin when the
/// interval is empty). Grows the series to `to`'s bin, merging neighbours past
/// [`Timeline::MAX_POINTS`].
fn spread(t: &mut Timeline, from: u64, to: u64, grew: (u64, u64)) {
    let bin_ns = |t: &Timeline| ((t.interval_s * 1e9).round() as u64).max(1);
    let last = to.saturating_sub(1).max(from);
    while last / bin_ns(t) >= Timeline::MAX_POINTS as u64 {
        t.merge_pairs();
    }
    let bin = bin_ns(t);
    let len = (last / bin + 1) as usize;
    if t.faults.len() < len {
        t.faults.resize(len, 0);
        t.major.resize(len, 0);
    }
    if to == from {
        let i = (from / bin) as usize;
        t.faults[i] += grew.0;
        t.major[i] += grew.1;
        return;
    }
    let span = u128::from(to - from);
    let (mut given, mut covered) = ((0u64, 0u64), 0u128);
    for i in from / bin..=last / bin {
        let (lo, hi) = ((i * bin).max(from), ((i + 1) * bin).min(to));
        covered += u128::from(hi - lo);
        let share = |n: u64| (u128::from(n) * covered / span) as u64;
        let (f, m) = (share(grew.0), share(grew.1));
        t.faults[i as usize] += f - given.0;
        t.major[i as usize] += m - given.1;
        given = (f, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_growth_per_bin() {
        let t0 = Instant::now();
        let mut r = TimelineRecorder::new(t0);
        r.restart(t0, (10, 1));
        assert!(!r.due(t0 + TICK / 2));
        assert!(r.due(t0 + TICK));
        r.push(t0 + TICK, (110, 3));
        r.push(t0 + 2 * TICK, (110, 3));
        r.push(t0 + 3 * TICK, (150, 4));
        let t = r.take();
        assert_eq!((t.faults, t.major, t.interval_s), (vec![100, 0, 40], vec![2, 0, 1], TICK.as_secs_f64()));
    }

    #[test]
    fn a_late_tick_fills_every_bin_it_was_late_for() {
        let t0 = Instant::now();
        let mut r = TimelineRecorder::new(t0);
        r.restart(t0, (0, 0));
        r.push(t0 + TICK, (100, 0));
        // Four bins late: its 400 faults over bins 1-4, not one bin.
        r.push(t0 + 5 * TICK, (500, 8));
        r.push(t0 + 6 * TICK, (600, 8));
        let t = r.take();
        assert_eq!(t.faults, vec![100, 100, 100, 100, 100, 100]);
        assert_eq!(t.major, vec![0, 2, 2, 2, 2, 0]);
        assert_eq!(
            (t.faults.len(), t.interval_s.to_bits()),
            (6, TICK.as_secs_f64().to_bits()),
            "the axis keeps its length"
        );
    }

    #[test]
    fn a_tick_off_the_grid_is_split_by_time_and_keeps_every_fault() {
        let t0 = Instant::now();
        let mut r = TimelineRecorder::new(t0);
        r.restart(t0, (0, 0));
        r.push(t0 + TICK / 2, (10, 0));
        r.push(t0 + TICK * 3 / 2, (30, 0)); // half in bin 0, half in bin 1
        r.push(t0 + TICK * 37 / 10, (1030, 1));
        let t = r.take();
        assert_eq!(&t.faults[..2], &[20, 10 + 227]);
        assert_eq!(t.faults.iter().sum::<u64>(), 1030);
        assert_eq!(t.major.iter().sum::<u64>(), 1);
        assert_eq!(t.faults.len(), 4);
    }

    #[test]
    fn a_long_run_merges_bins_and_keeps_its_length() {
        let t0 = Instant::now();
        let mut r = TimelineRecorder::new(t0);
        r.restart(t0, (0, 0));
        let ticks = 3 * Timeline::MAX_POINTS as u32;
        for i in 1..=ticks {
            r.push(t0 + TICK * i, (u64::from(i), 0));
        }
        let t = r.take();
        assert!(t.faults.len() <= Timeline::MAX_POINTS);
        assert_eq!(t.faults.iter().sum::<u64>(), u64::from(ticks));
        let span = t.faults.len() as f64 * t.interval_s;
        let real = (TICK * ticks).as_secs_f64();
        assert!(span >= real && span < real + t.interval_s, "{span} s for {real} s");
    }
}
