//! The fault-rate timeline of summary.json: faults and majors per tick,
//! from the kernel's running totals.
use std::time::{Duration, Instant};

use crate::model::Timeline;

/// One timeline point: fine enough that a run of a fraction of a second
/// still draws a curve (`record` polls at least this often).
pub const TICK: Duration = Duration::from_millis(20);

pub struct TimelineRecorder {
    /// Totals at the last tick.
    last_totals: (u64, u64),
    last_tick: Instant,
    timeline: Timeline,
}

impl TimelineRecorder {
    pub fn new(now: Instant) -> Self {
        Self {
            last_totals: (0, 0),
            last_tick: now,
            timeline: Timeline { interval_s: TICK.as_secs_f64(), ..Timeline::default() },
        }
    }

    /// Starts the series over from these totals.
    pub fn restart(&mut self, now: Instant, totals: (u64, u64)) {
        self.last_tick = now;
        self.last_totals = totals;
    }

    /// Whether a tick is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_tick) >= TICK
    }

    /// One point: what the totals grew by since the last one.
    pub fn push(&mut self, now: Instant, (faults, major): (u64, u64)) {
        self.last_tick = now;
        self.timeline.push(faults.saturating_sub(self.last_totals.0), major.saturating_sub(self.last_totals.1));
        self.last_totals = (faults, major);
    }

    pub fn take(&mut self) -> Timeline {
        std::mem::take(&mut self.timeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_growth_per_tick() {
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
}
