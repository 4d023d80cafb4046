//! mmap churn and TLB shootdowns: who flushed whose TLB, storms and their call
//! sites (privileged; needs two CPUs).
//!
//! Checked against what the kernel counted while the run went on, not against
//! what the churn "should" do on an idle machine: the `TLB` row of
//! /proc/interrupts (flush IPIs received, every CPU, every process) and, where
//! the kernel has them (CONFIG_DEBUG_TLBFLUSH), /proc/vmstat's
//! `nr_tlb_remote_flush` and `nr_tlb_remote_flush_received`. Those are
//! system-wide: they bound vmtrace's counts for one process from above, and
//! the background they hold is measured beside the run. Storms are found with
//! a threshold derived from the churn's own measured IPI rate.
mod common;

use std::{collections::HashMap, sync::OnceLock, time::Duration};

use common::*;

fn two_cpus() -> u64 {
    let n = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    assert!(n >= 2, "the shootdown tests need two CPUs (this machine has {n})");
    n as u64
}

/// The churn tests pin threads to CPUs 0 and 1: run them one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Churn iterations (20,000, fewer under emulation).
fn n() -> u64 {
    20_000 / scale()
}

/// The kernel's own TLB counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Kernel {
    /// Sum over CPUs of /proc/interrupts' `TLB` row: flush IPIs received.
    tlb_irqs: u64,
    /// /proc/vmstat, where present.
    remote_flush: Option<u64>,
    remote_flush_received: Option<u64>,
}

impl Kernel {
    fn read() -> Self {
        let irq = std::fs::read_to_string("/proc/interrupts").expect("/proc/interrupts");
        let row = irq.lines().find(|l| l.trim_start().starts_with("TLB:")).expect("a TLB row in /proc/interrupts");
        let tlb_irqs = row.split_whitespace().skip(1).map_while(|w| w.parse::<u64>().ok()).sum();
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let get = |k: &str| {
            vmstat
                .lines()
                .find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix(' ')))
                .and_then(|v| v.parse().ok())
        };
        Self {
            tlb_irqs,
            remote_flush: get("nr_tlb_remote_flush"),
            remote_flush_received: get("nr_tlb_remote_flush_received"),
        }
    }

    fn since(self, before: Self) -> Self {
        let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        Self {
            tlb_irqs: self.tlb_irqs.saturating_sub(before.tlb_irqs),
            remote_flush: d(self.remote_flush, before.remote_flush),
            remote_flush_received: d(self.remote_flush_received, before.remote_flush_received),
        }
    }
}

/// Flush IPIs the rest of the machine makes per second (other processes,
/// other builds), measured over `over`.
fn background_rate(over: Duration) -> f64 {
    let (k0, t0) = (Kernel::read(), std::time::Instant::now());
    std::thread::sleep(over);
    Kernel::read().since(k0).tlb_irqs as f64 / t0.elapsed().as_secs_f64()
}

/// Whether each IPI is counted as it is queued (csd:csd_queue_cpu, 6.6+);
/// before that a flush that sends IPIs counts as one.
fn exact_ipis() -> bool {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|t| std::path::Path::new(t).join("events/csd/csd_queue_cpu").exists())
}

struct Churn {
    run: Run,
    /// What the kernel counted from before vmtrace started to after it ended.
    kernel: Kernel,
    /// The background's flush IPIs over the same time: what every other
    /// process sent meanwhile, counted by a system-wide recording beside the
    /// run (builds and guests beside the suite flush in bursts), and at least
    /// the larger of its rates just before and just after, times the run's
    /// length.
    background: f64,
    secs: f64,
}

fn churn_with(threshold: f64, args: &[&str]) -> Churn {
    churn_n(n(), threshold, args)
}

fn churn_n(iterations: u64, threshold: f64, args: &[&str]) -> Churn {
    two_cpus();
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let iterations = iterations.to_string();
    let mut w = vec!["churn", "--iterations", &iterations];
    w.extend_from_slice(args);
    let threshold = format!("{threshold:.0}");
    let quiet = Duration::from_millis(300);
    let before_rate = background_rate(quiet);
    let meter_out = tempfile::tempdir().unwrap();
    let meter_dir = meter_out.path().to_str().expect("a UTF-8 temporary directory");
    let meter = spawn_traced(&["record", "-a", "--events", "faults,tlb", "--stacks", "none", "--out", meter_dir]);
    let (k0, t0) = (Kernel::read(), std::time::Instant::now());
    let run = record(&["--storm-threshold", &threshold], &strs(&workload(&w)));
    let (kernel, secs) = (Kernel::read().since(k0), t0.elapsed().as_secs_f64());
    let meter = finish(meter_out, meter.interrupt());
    assert!(meter.summary.is_object(), "the system-wide recording failed: {}", meter.stderr());
    let after_rate = background_rate(quiet);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let churn = run.report("churn").pid;
    let others: u64 = meter.summary["processes"]
        .as_array()
        .expect("the system-wide recording's processes")
        .iter()
        .filter(|p| p["pid"].as_u64() != Some(u64::from(churn)))
        .map(|p| p["tlb"]["ipis_sent"].as_u64().unwrap_or(0))
        .sum();
    let background = (others as f64).max(4.0 * before_rate.max(after_rate) * secs);
    Churn { run, kernel, background, secs }
}

/// The storm threshold: a quarter of the IPI rate a two-thread munmap churn
/// reached here, now, under vmtrace (its IPIs over its loop's own time).
fn threshold() -> f64 {
    static T: OnceLock<f64> = OnceLock::new();
    *T.get_or_init(|| {
        let c = churn_with(f64::MAX, &["--threads", "2"]);
        let r = c.run.report("churn");
        let ipis = u(&c.run.process(r.pid)["tlb"]["ipis_sent"]);
        let rate = ipis as f64 / (r.loop_ns as f64 / 1e9);
        eprintln!(
            "calibration: {ipis} IPIs in {:.3} s of churn: {rate:.0}/s; storm threshold {:.0}/s",
            r.loop_ns as f64 / 1e9,
            rate / 4.0
        );
        assert!(ipis > 0, "a two-thread churn sends shootdowns: {:#}", c.run.process(r.pid)["tlb"]);
        rate / 4.0
    })
}

/// The most IPIs a churn can send outside storms, whatever the machine's
/// load did to its pace: storms are the ~100 ms windows at or above the
/// threshold, so every other window holds fewer than threshold × its
/// length, and those windows span at most the churn's own loop plus a
/// partial window (up to a slow tick, 0.3 s) at each end. A churn paced
/// above the threshold on average must storm by this bound; one a busy
/// machine slowed below it may not.
fn out_of_storms_bound(c: &Churn, threshold: f64) -> f64 {
    let loop_s = c.run.report("churn").loop_ns as f64 / 1e9;
    threshold * (loop_s + 0.6)
}

/// vmtrace's TLB counts of the churn against the kernel's over the same run.
fn against_the_kernel(c: &Churn, pid: u32) -> (u64, u64) {
    let t = &c.run.process(pid)["tlb"];
    let (sent, received, flushes) = (u(&t["ipis_sent"]), u(&t["remote_shootdown"]), u(&t["remote_ipi_send"]));
    let k = c.kernel;
    eprintln!(
        "vmtrace: {sent} IPIs sent, {received} received, {flushes} flushes that sent; kernel: {} TLB IRQs \
         (background ~{:.0} over {:.2} s), vmstat remote_flush {:?} received {:?}",
        k.tlb_irqs, c.background, c.secs, k.remote_flush, k.remote_flush_received
    );
    // Every shootdown received by this process was a TLB IRQ of the kernel's.
    assert!(received <= k.tlb_irqs, "received {received} > the kernel's {} TLB IRQs: {t:#}", k.tlb_irqs);
    if let Some(r) = k.remote_flush_received {
        assert!(received <= r, "received {received} > vmstat's {r}");
    }
    if let Some(f) = k.remote_flush {
        assert!(flushes <= f, "flushes that sent IPIs {flushes} > vmstat's nr_tlb_remote_flush {f}");
    }
    // Each flush IPI is received once, as a TLB IRQ.
    assert!(sent <= k.tlb_irqs, "sent {sent} > the kernel's {} TLB IRQs: {t:#}", k.tlb_irqs);
    // A flush that sends reaches at most every other CPU.
    assert!(sent <= flushes * (two_cpus() - 1), "{sent} IPIs from {flushes} flushes: {t:#}");
    if !exact_ipis() {
        // Before 6.6 each IPI is counted where it lands: in a thread of the
        // process that sent it (a flush IPI goes to CPUs running its mm).
        assert_eq!(sent, received, "before 6.6 the IPIs sent are those its threads received: {t:#}");
    }
    (sent, received)
}

#[test]
fn two_thread_munmap_churn_storms_are_blamed_on_its_call_site() {
    privileged!();
    let threshold = threshold();
    let c = churn_with(threshold, &["--threads", "2"]);
    let run = &c.run;
    let pid = run.report("churn").pid;
    let p = run.process(pid);
    let (m, t) = (&p["mmap"], &p["tlb"]);
    assert!(u(&m["munmap"]) >= n(), "{m:#}");
    assert!(u(&m["munmap_bytes"]) >= n() * 65_536, "{m:#}");
    let (ipis, _) = against_the_kernel(&c, pid);
    // The kernel's IRQs are this churn's IPIs plus the background's: vmtrace
    // misses none beyond what the background could hide.
    let unexplained = c.kernel.tlb_irqs as f64 - ipis as f64 - c.background;
    assert!(
        unexplained <= (n() / 10) as f64,
        "the kernel saw {unexplained:.0} more flush IPIs than vmtrace and the background"
    );
    assert!(ipis > 0 && u(&t["ipis_by_call"]["munmap"]) * 100 >= ipis * 95, "blamed on munmap: {t:#}");
    let storms = run.summary["storms"].as_array().unwrap();
    // One storm on a quiet machine; a loaded one may pause the churner for a
    // whole window and split it (`out_of_storms_bound`).
    let mut in_storms = 0;
    // The churner also sends a few IPIs outside munmap (6 to 18 in a 6.1
    // guest with NUMA balancing on): a storm split so small that they could
    // top it (a slow guest cut one churn into 4-shootdown storms) is blamed
    // on whatever its process sent most of in it, within what it sent.
    let other = ipis - u(&t["ipis_by_call"]["munmap"]);
    for s in storms {
        assert_eq!(s["pid"], pid);
        if u(&s["shootdowns"]) > 2 * other {
            assert_eq!(s["top_call"], "munmap", "{s:#}; the process sent {other} IPIs outside munmap");
            let stack: Vec<&str> = s["top_stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
            assert!(
                stack.iter().any(|f| f.contains("churn_munmap_loop")),
                "culprit stack names the churner: {stack:?}"
            );
        } else {
            let call = s["top_call"].as_str().unwrap();
            let of_call = t["ipis_by_call"][call].as_u64().unwrap_or(0) as f64;
            let share = s["top_share"].as_f64().unwrap() * u(&s["shootdowns"]) as f64;
            assert!(share <= of_call + 0.5, "{s:#}: more {call} IPIs than the process sent ({of_call}): {t:#}");
        }
        assert!(s["peak_per_s"].as_f64().unwrap() >= threshold.floor(), "{s:#} (threshold {threshold:.0}/s)");
        in_storms += u(&s["shootdowns"]);
    }
    let bound = out_of_storms_bound(&c, threshold);
    assert!(
        in_storms <= ipis && ((ipis - in_storms) as f64) < bound,
        "{in_storms} of {ipis} IPIs in storms; the windows below the threshold hold < {bound:.0}: {storms:#?}"
    );
    let folded = std::fs::read_to_string(run.out.path().join("shootdowns.folded")).unwrap();
    let top = folded.lines().max_by_key(|l| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok())).unwrap();
    assert!(top.contains("churn_munmap_loop") && top.contains("[munmap]"), "{folded}");
    let svg = std::fs::read_to_string(run.out.path().join("shootdowns.svg")).unwrap();
    let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    roxmltree::Document::parse_with_options(&svg, opts).expect("shootdowns.svg is well-formed");
    let mmap_folded = std::fs::read_to_string(run.out.path().join("mmap.folded")).unwrap();
    assert!(mmap_folded.contains("churn_munmap_loop"), "{mmap_folded}");
}

#[test]
fn single_thread_churn_sends_no_shootdowns() {
    privileged!();
    let threshold = threshold();
    let c = churn_with(threshold, &["--threads", "1"]);
    let p = c.run.process(c.run.report("churn").pid);
    assert!(u(&p["mmap"]["munmap"]) >= n());
    let (ipis, _) = against_the_kernel(&c, c.run.report("churn").pid);
    // Under emulation the lone thread migrates between vCPUs often, leaving its
    // mm on the other one for a while (and 6.1 counts one IPI per such flush).
    let most = if scale() > 1 { n() / 4 } else { n() / 10 };
    assert!(ipis < most, "no other CPU runs this mm: {ipis} IPIs for {} munmaps", n());
    assert_eq!(c.run.summary["storms"], serde_json::json!([]), "threshold {threshold:.0}/s");
    let txt = std::fs::read_to_string(c.run.out.path().join("summary.txt")).unwrap();
    assert!(txt.contains("Shootdown storms: none"), "{txt}");
}

#[test]
fn madvise_churn_is_blamed_on_madvise_not_munmap() {
    privileged!();
    let threshold = threshold();
    let c = churn_with(threshold, &["--threads", "2", "--madvise"]);
    let pid = c.run.report("churn").pid;
    let p = c.run.process(pid);
    let t = &p["tlb"];
    let (ipis, _) = against_the_kernel(&c, pid);
    assert!(ipis > 0, "{t:#}");
    assert!(u(&t["ipis_by_call"]["madvise"]) * 100 >= ipis * 95, "{t:#}");
    assert!(t["ipis_by_call"].get("munmap").map_or(0, u) * 100 < ipis, "{t:#}");
    assert!(u(&p["mmap"]["madvise_by_advice"]["dontneed"]) >= n(), "{:#}", p["mmap"]);
    let storms = c.run.summary["storms"].as_array().unwrap();
    let in_storms: u64 = storms.iter().map(|s| u(&s["shootdowns"])).sum();
    let bound = out_of_storms_bound(&c, threshold);
    assert!(((ipis - in_storms.min(ipis)) as f64) < bound, "{in_storms} of {ipis} IPIs in storms: {storms:#?}");
    assert!(storms.iter().all(|s| s["top_call"] == "madvise"), "{storms:#?}");
}

/// Regions past the kernel's tlb_single_page_flush_ceiling (33 pages) are
/// flushed whole: the kernel reports those as TLB_FLUSH_ALL (-1), which must
/// be counted apart and never summed into `pages`.
#[test]
fn full_flushes_are_counted_apart_and_pages_stay_sane() {
    privileged!();
    let ceiling: u64 = std::fs::read_to_string("/sys/kernel/debug/x86/tlb_single_page_flush_ceiling")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(33);
    // Four times the ceiling, in KiB.
    let kib = (ceiling * 4 * 4).to_string();
    let c = churn_n(2000, f64::MAX, &["--threads", "2", "--kib", &kib]);
    let pid = c.run.report("churn").pid;
    let t = &c.run.process(pid)["tlb"];
    let (full, pages) = (u(&t["full_flushes"]), u(&t["pages"]));
    let flushes: u64 = ["task_switch", "remote_shootdown", "local_shootdown", "local_mm_shootdown", "remote_ipi_send"]
        .iter()
        .map(|k| u(&t[*k]))
        .sum();
    assert!(full >= 2000, "each munmap of {kib} KiB is a full flush: {t:#}");
    // A ranged flush is at most the ceiling's pages: the rest are full.
    assert!(pages <= (flushes - full.min(flushes)) * ceiling, "pages {pages} from {flushes} flushes: {t:#}");
    let mut names = HashMap::new();
    for (k, v) in t.as_object().unwrap() {
        if let Some(n) = v.as_u64() {
            names.insert(k.clone(), n);
        }
    }
    assert!(names.values().all(|v| *v < 1 << 48), "no count wrapped: {t:#}");
    against_the_kernel(&c, pid);
}
