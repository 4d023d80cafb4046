//! `--stream json`: one line per interval with every live traced process's
//! counts so far and its rates since the previous line (same field names as
//! summary.json).
use crate::model::{LiveSnapshot, RateKeeper};

/// The line for `snap`; `rates` remembers the previous line's counts.
pub fn line(snap: &LiveSnapshot, rates: &mut RateKeeper<u32>, interval_s: f64) -> serde_json::Value {
    let rates = snap.rates(rates, interval_s);
    let procs: Vec<serde_json::Value> = snap
        .processes
        .iter()
        .zip(rates)
        .map(|(p, (_, r))| {
            let f = &p.faults;
            serde_json::json!({
                "pid": p.pid,
                "comm": p.comm.as_deref().unwrap_or("?"),
                "faults": {"total": f.total, "minor": f.minor, "major": f.major, "write": f.write, "cow": f.cow, "time_ns": f.time_ns},
                "faults_per_s": r.faults,
                "major_per_s": r.major,
                "cow_per_s": r.cow,
                "tlb": {"ipis_sent": p.ipis_sent, "ipis_per_s": r.ipis},
            })
        })
        .collect();
    serde_json::json!({
        "t_s": snap.t_s,
        "interval_s": interval_s,
        "processes": procs,
        "lost_events": snap.drops.lost(),
    })
}

#[cfg(test)]
mod tests {
    use vmtrace_common::FaultStats;

    use super::*;
    use crate::model::{DropCounts, LiveProcess};

    #[test]
    fn keys_and_rates_between_lines() {
        let stats = |started| FaultStats { started, major: 2, cow: 1, ..FaultStats::default() };
        let snap = |started| LiveSnapshot {
            t_s: 1.5,
            processes: vec![LiveProcess::from_counters(7, None, &stats(started), None, 1)],
            drops: DropCounts { by_kind: vec![1, 0, 0, 9], malformed_events: 1 },
            ..LiveSnapshot::default()
        };
        let mut keeper = RateKeeper::default();
        line(&snap(100), &mut keeper, 0.5);
        let v = line(&snap(300), &mut keeper, 0.5);
        assert_eq!(v["lost_events"], 2, "untimed faults are not lost");
        let p = &v["processes"][0];
        assert_eq!((p["pid"].as_u64(), p["comm"].as_str()), (Some(7), Some("?")));
        assert_eq!(p["faults"]["total"], 300);
        assert!((p["faults_per_s"].as_f64().unwrap() - 400.0).abs() < 1e-9);
        assert_eq!(p["major_per_s"].as_f64(), Some(0.0));
        assert_eq!(p["tlb"]["ipis_sent"], 0);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["interval_s", "lost_events", "processes", "t_s"]);
    }
}
