//! Locked and pinned memory during a recording: each locking call as the
//! kernel streams it (`MmLockEvent`, with `mm->locked_vm` and
//! `mm->pinned_vm` read at its return), `/proc/PID/status` `VmLck`/`VmPin`
//! every half second (pins taken without a syscall of the family: RDMA,
//! io_uring, vfio; mlockall(MCL_FUTURE) growth), and refused calls named
//! with the process's `RLIMIT_MEMLOCK`.
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use vmtrace_common::{MmCall, MmLockEvent, MM_CALL_NAMES};

use crate::{
    kernel::page_size,
    model::{bytes, LockFailure, LockPoint, LockSite, MachineEffect, Pinned, PinnedProcess},
};

/// `/proc/meminfo` fields (kB → bytes) and `/proc/vmstat` sums the machine
/// effect follows: (Mlocked, Cached, MemAvailable), (allocstall_*,
/// pgscan_direct, pgscan_kswapd, pgsteal_*).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MachineRead {
    pub mlocked: u64,
    pub cached: u64,
    pub available: u64,
    pub stalls: u64,
    pub scanned_direct: u64,
    pub scanned_kswapd: u64,
    pub reclaimed: u64,
}

impl MachineRead {
    /// From the two files' text.
    #[must_use]
    pub fn parse(meminfo: &str, vmstat: &str) -> Self {
        let kb = |key: &str| status_kb(meminfo, key).unwrap_or(0);
        let mut r =
            Self { mlocked: kb("Mlocked"), cached: kb("Cached"), available: kb("MemAvailable"), ..Self::default() };
        // pgsteal_{anon,file} split the same pages as pgsteal_{kswapd,direct,…}
        // by kind (5.8+): one family or the other.
        let (mut by_kind, mut by_who) = (None::<u64>, 0);
        for l in vmstat.lines() {
            let Some((k, v)) = l.split_once(' ') else { continue };
            let Ok(v) = v.trim().parse::<u64>() else { continue };
            match k {
                _ if k.starts_with("allocstall_") => r.stalls += v,
                "pgscan_direct" => r.scanned_direct += v,
                "pgscan_kswapd" => r.scanned_kswapd += v,
                "pgsteal_anon" | "pgsteal_file" => *by_kind.get_or_insert(0) += v,
                _ if k.starts_with("pgsteal_") => by_who += v,
                _ => {}
            }
        }
        r.reclaimed = by_kind.unwrap_or(by_who);
        r
    }

    fn now() -> Option<Self> {
        let m = std::fs::read_to_string("/proc/meminfo").ok()?;
        let v = std::fs::read_to_string("/proc/vmstat").ok()?;
        Some(Self::parse(&m, &v))
    }
}

/// The machine from the first lock seen: the first read, and the extremes since.
#[derive(Clone, Copy, Debug)]
struct Machine {
    since_ns: u64,
    first: MachineRead,
    last: MachineRead,
    mlocked_peak: u64,
    cached_min: u64,
    available_min: u64,
}

impl Machine {
    fn new(since_ns: u64, r: MachineRead) -> Self {
        Self { since_ns, first: r, last: r, mlocked_peak: r.mlocked, cached_min: r.cached, available_min: r.available }
    }

    fn add(&mut self, r: MachineRead) {
        self.last = r;
        self.mlocked_peak = self.mlocked_peak.max(r.mlocked);
        self.cached_min = self.cached_min.min(r.cached);
        self.available_min = self.available_min.min(r.available);
    }

    fn effect(&self, since: &dyn Fn(u64) -> f64) -> MachineEffect {
        let (a, b) = (&self.first, &self.last);
        MachineEffect {
            since_s: since(self.since_ns),
            mlocked_bytes_peak: self.mlocked_peak,
            page_cache_bytes_before: a.cached,
            page_cache_bytes_min: self.cached_min,
            page_cache_bytes_end: b.cached,
            mem_available_bytes_min: self.available_min,
            direct_reclaim_stalls: b.stalls.saturating_sub(a.stalls),
            pages_scanned_direct: b.scanned_direct.saturating_sub(a.scanned_direct),
            pages_scanned_kswapd: b.scanned_kswapd.saturating_sub(a.scanned_kswapd),
            pages_reclaimed: b.reclaimed.saturating_sub(a.reclaimed),
        }
    }
}

/// How often `/proc/PID/status` is read.
const STATUS_EVERY: Duration = Duration::from_millis(500);
/// At most this many processes' status files per read (those that locked first).
const MAX_STATUS_READS: usize = 64;
/// A timeline keeps this many points per process (the peak is kept apart).
const MAX_POINTS: usize = 2_000;

/// The name a locking call goes by in the summary.
#[must_use]
pub fn call_label(call: u32) -> String {
    if call == MmCall::Mmap as u32 {
        "mmap(MAP_LOCKED)".into()
    } else {
        MM_CALL_NAMES.get(call as usize).copied().unwrap_or("other").into()
    }
}

/// `RLIMIT_MEMLOCK` from `/proc/PID/limits`: (soft, hard), `None` = unlimited.
#[must_use]
pub fn parse_memlock_limit(limits: &str) -> Option<(Option<u64>, Option<u64>)> {
    let line = limits.lines().find(|l| l.starts_with("Max locked memory"))?;
    let rest = line.trim_start_matches("Max locked memory").split_whitespace().collect::<Vec<_>>();
    let v = |s: &str| if s == "unlimited" { Some(None) } else { s.parse::<u64>().ok().map(Some) };
    Some((v(rest.first()?)?, v(rest.get(1)?)?))
}

/// A `/proc/PID/status` line's value ("VmRSS:   10000 kB"), in bytes.
pub(crate) fn status_kb(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|r| r.trim_start_matches(':').split_whitespace().next()?.parse::<u64>().ok())
        .map(|v| v * 1024)
}

/// (VmLck, VmPin, VmRSS) in bytes from `/proc/PID/status`.
#[must_use]
pub fn parse_status(text: &str) -> Option<(u64, u64, u64)> {
    let kb = |key: &str| status_kb(text, key);
    Some((kb("VmLck")?, kb("VmPin").unwrap_or(0), kb("VmRSS").unwrap_or(0)))
}

fn errno_name(e: i64) -> String {
    match e {
        1 => "EPERM".into(),
        11 => "EAGAIN".into(),
        12 => "ENOMEM".into(),
        22 => "EINVAL".into(),
        14 => "EFAULT".into(),
        _ => format!("errno {e}"),
    }
}

#[derive(Default)]
struct ProcLock {
    points: Vec<(u64, u64, u64, &'static str)>,
    peak_locked: u64,
    peak_pinned: u64,
    rss_at_peak: Option<u64>,
    last: (u64, u64),
    limit: Option<(Option<u64>, Option<u64>)>,
}

#[derive(Default)]
struct SiteAcc {
    calls: u64,
    bytes: u64,
    failed: u64,
}

struct RawFailure {
    ts_ns: u64,
    ev: MmLockEvent,
    locked_before: u64,
    limit: Option<(Option<u64>, Option<u64>)>,
}

/// Collects locked and pinned memory (`--events mmap`).
pub struct PinnedTracker {
    page: u64,
    procs: BTreeMap<u32, ProcLock>,
    sites: HashMap<(u32, u32, i32), SiteAcc>,
    failures: Vec<RawFailure>,
    last_status: Option<Instant>,
    /// `None` until locked or pinned memory is first seen.
    machine: Option<Machine>,
}

impl PinnedTracker {
    /// The user stack ids of the locking call sites (named at the end).
    pub(crate) fn stack_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.sites.keys().filter_map(|(_, _, s)| u32::try_from(*s).ok())
    }
}

impl Default for PinnedTracker {
    fn default() -> Self {
        Self {
            page: page_size(),
            procs: BTreeMap::new(),
            sites: HashMap::default(),
            failures: Vec::new(),
            last_status: None,
            machine: None,
        }
    }
}

impl PinnedTracker {
    fn point(&mut self, pid: u32, ts_ns: u64, locked: u64, pinned: u64, source: &'static str, rss: Option<u64>) {
        let p = self.procs.entry(pid).or_default();
        // The resident size beside the peak: the largest read while it
        // held (a status read that finds the same locked bytes as the call
        // before it still counts), none read yet at a new peak.
        if locked > p.peak_locked || (locked == p.peak_locked && p.rss_at_peak.is_none()) {
            p.peak_locked = locked;
            p.rss_at_peak = rss;
        } else if locked == p.peak_locked {
            p.rss_at_peak = p.rss_at_peak.max(rss);
        }
        // The machine is followed from a locking call's memory, a pin, or
        // a megabyte locked (not a daemon's few locked pages under -a).
        if (source == "call" && locked > 0 || pinned > 0 || locked >= 1 << 20) && self.machine.is_none() {
            self.machine = MachineRead::now().map(|r| Machine::new(ts_ns, r));
        }
        if p.points.last().is_some_and(|l| l.1 == locked && l.2 == pinned) {
            return;
        }
        p.peak_pinned = p.peak_pinned.max(pinned);
        p.last = (locked, pinned);
        if p.points.len() < MAX_POINTS {
            p.points.push((ts_ns, locked, pinned, source));
        }
    }

    /// A locking call's return.
    pub fn call(&mut self, ev: &MmLockEvent) {
        let failed = ev.ret < 0 && ev.ret > -4096;
        let site = self.sites.entry((ev.tgid, ev.call, ev.user_stack)).or_default();
        site.calls += 1;
        if failed {
            site.failed += 1;
        } else {
            site.bytes += ev.len;
        }
        let locked_before = self.procs.get(&ev.tgid).map_or(0, |p| p.last.0);
        if ev.locked_pages != u64::MAX {
            let pinned = if ev.pinned_pages == u64::MAX { 0 } else { ev.pinned_pages * self.page };
            self.point(ev.tgid, ev.hdr.ts_ns, ev.locked_pages * self.page, pinned, "call", None);
        }
        // The kernel's at a failure's return; else /proc while it lives.
        let unlimited = |v: u64| (v != u64::MAX).then_some(v);
        let limit = if ev.memlock_read == 1 {
            Some((unlimited(ev.memlock_cur), unlimited(ev.memlock_max)))
        } else {
            std::fs::read_to_string(format!("/proc/{}/limits", ev.tgid)).ok().and_then(|t| parse_memlock_limit(&t))
        };
        if let Some(l) = limit {
            self.procs.entry(ev.tgid).or_default().limit = Some(l);
        }
        if failed {
            let before = if ev.locked_pages == u64::MAX { locked_before } else { ev.locked_pages * self.page };
            self.failures.push(RawFailure { ts_ns: ev.hdr.ts_ns, ev: *ev, locked_before: before, limit });
        }
    }

    /// Every half second: `VmLck`/`VmPin` of the processes that locked, and
    /// of the other live ones (`live`) up to a bound.
    pub fn tick(&mut self, now: Instant, live: &[u32]) {
        if self.last_status.is_some_and(|t| now.saturating_duration_since(t) < STATUS_EVERY) {
            return;
        }
        self.last_status = Some(now);
        self.read_all(live);
    }

    /// Reads the status of `live` now (also at the end), and the machine's
    /// counters once memory has been locked.
    pub fn read_all(&mut self, live: &[u32]) {
        if let Some(m) = self.machine.as_mut() {
            if let Some(r) = MachineRead::now() {
                m.add(r);
            }
        }
        let mono = crate::kernel::monotonic_ns();
        let mut pids: Vec<u32> = self.procs.keys().copied().filter(|p| live.contains(p)).collect();
        pids.extend(live.iter().filter(|p| !self.procs.contains_key(p)));
        for pid in pids.into_iter().take(MAX_STATUS_READS) {
            self.read_status(pid, mono);
        }
    }

    fn read_status(&mut self, pid: u32, mono: u64) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return };
        let Some((locked, pinned, rss)) = parse_status(&text) else { return };
        if locked == 0 && pinned == 0 && !self.procs.contains_key(&pid) {
            return;
        }
        if self.procs.get(&pid).is_none_or(|p| p.limit.is_none()) {
            let limit =
                std::fs::read_to_string(format!("/proc/{pid}/limits")).ok().and_then(|t| parse_memlock_limit(&t));
            self.procs.entry(pid).or_default().limit = limit;
        }
        self.point(pid, mono, locked, pinned, "status", Some(rss));
    }

    /// The model. `frames(pid, call, user_stack)` symbolizes a call site;
    /// `since(ts_ns)` turns a kernel time into seconds since the start.
    pub fn finish(
        self,
        comm_of: &dyn Fn(u32) -> String,
        frames: &mut dyn FnMut(u32, u32, i32) -> Vec<String>,
        since: &dyn Fn(u64) -> f64,
    ) -> Pinned {
        let mut processes: Vec<PinnedProcess> = self
            .procs
            .iter()
            .filter(|(_, p)| p.peak_locked > 0 || p.peak_pinned > 0)
            .map(|(pid, p)| PinnedProcess {
                pid: *pid,
                comm: comm_of(*pid),
                locked_bytes_peak: p.peak_locked,
                locked_bytes_last: p.last.0,
                pinned_bytes_peak: p.peak_pinned,
                pinned_bytes_last: p.last.1,
                rss_bytes_at_peak: p.rss_at_peak,
                memlock_limit_bytes: p.limit.and_then(|l| l.0),
                timeline: p
                    .points
                    .iter()
                    .map(|(ts, l, pi, src)| LockPoint {
                        t_s: since(*ts),
                        locked_bytes: *l,
                        pinned_bytes: *pi,
                        source: (*src).into(),
                    })
                    .collect(),
            })
            .collect();
        processes.sort_by(|a, b| {
            (b.locked_bytes_peak + b.pinned_bytes_peak)
                .cmp(&(a.locked_bytes_peak + a.pinned_bytes_peak))
                .then(a.pid.cmp(&b.pid))
        });
        let mut sites: Vec<LockSite> = self
            .sites
            .iter()
            .map(|((pid, call, stack), acc)| LockSite {
                pid: *pid,
                comm: comm_of(*pid),
                call: call_label(*call),
                calls: acc.calls,
                bytes: acc.bytes,
                failed: acc.failed,
                frames: frames(*pid, *call, *stack),
            })
            .collect();
        sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.calls.cmp(&a.calls)).then(a.pid.cmp(&b.pid)));
        let failures = self
            .failures
            .iter()
            .map(|f| {
                describe_failure(f, comm_of(f.ev.tgid), frames(f.ev.tgid, f.ev.call, f.ev.user_stack), since(f.ts_ns))
            })
            .collect();
        let machine = self.machine.filter(|_| !processes.is_empty()).map(|m| m.effect(since));
        Pinned { processes, sites, failures, machine }
    }
}

fn describe_failure(f: &RawFailure, comm: String, frames: Vec<String>, t_s: f64) -> LockFailure {
    let e = &f.ev;
    let errno = -e.ret;
    let call = call_label(e.call);
    let (soft, hard) = f.limit.map_or((None, None), |l| l);
    // The kernel's check (mm/mlock.c `can_do_mlock`, `do_mlock`; mm/mmap.c
    // `mlock_future_ok`): without CAP_IPC_LOCK, locked + asked > the soft
    // limit is ENOMEM (mlock), EAGAIN (mmap MAP_LOCKED), and a 0 limit EPERM.
    let over =
        soft.is_some_and(|s| s == 0 || f.locked_before.saturating_add(e.len) > s || e.call == MmCall::Mlockall as u32);
    let rlimit = matches!(errno, 1 | 11 | 12) && over;
    let limit_text = match (f.limit, soft) {
        (None, _) => "RLIMIT_MEMLOCK unread (the process was gone)".to_string(),
        (Some(_), None) => "RLIMIT_MEMLOCK unlimited".to_string(),
        (Some(_), Some(s)) => format!("RLIMIT_MEMLOCK {}", bytes(s)),
    };
    let asked = if e.call == MmCall::Mlockall as u32 { "all its memory".to_string() } else { bytes(e.len) };
    let cause = if rlimit {
        format!(
            "{comm} (pid {}) {call} of {asked} failed with {}: over {limit_text} (already locked {})",
            e.tgid,
            errno_name(errno),
            bytes(f.locked_before)
        )
    } else {
        format!("{comm} (pid {}) {call} of {asked} failed with {} ({limit_text})", e.tgid, errno_name(errno))
    };
    let fix = if rlimit {
        let need = f.locked_before.saturating_add(e.len);
        format!(
            "raise the limit to at least {} before the process starts: `ulimit -l {}` (or unlimited) in its shell, \
             `LimitMEMLOCK=infinity` in a systemd unit, `--ulimit memlock=-1:-1` for docker, a memlock ulimit in the \
             container runtime for Kubernetes; or grant CAP_IPC_LOCK; or lock less",
            bytes(need),
            need.div_ceil(1024).max(1)
        )
    } else if errno == 12 {
        "the range is not mapped, or locking it would exceed the memory available: check the address and length".into()
    } else {
        "see mlock(2) for this error".into()
    };
    LockFailure {
        t_s,
        pid: e.tgid,
        comm,
        call,
        errno: errno_name(errno),
        bytes_asked: e.len,
        locked_bytes_before: f.locked_before,
        limit_soft_bytes: soft,
        limit_hard_bytes: hard,
        rlimit_memlock: rlimit,
        cause,
        fix,
        frames,
    }
}

#[cfg(test)]
mod tests {
    /// The machine's counters: meminfo's kB in bytes, vmstat's families
    /// summed (reclaimed pages by kind where the kernel splits them so).
    #[test]
    fn machine_reads_parse() {
        let old = MachineRead::parse("", "pgsteal_kswapd 7\npgsteal_direct 3\n");
        assert_eq!(old.reclaimed, 10);
        let r = MachineRead::parse(
            "MemTotal: 100 kB\nMemAvailable:  60 kB\nCached:  30 kB\nMlocked:   8 kB\n",
            "allocstall_dma 1\nallocstall_normal 2\npgscan_kswapd 10\npgscan_direct 4\npgsteal_kswapd 7\npgsteal_direct 3\npgsteal_anon 99\n",
        );
        assert_eq!(
            r,
            MachineRead {
                mlocked: 8192,
                cached: 30 * 1024,
                available: 60 * 1024,
                stalls: 3,
                scanned_direct: 4,
                scanned_kswapd: 10,
                reclaimed: 99,
            }
        );
    }

    use super::*;
    use crate::collect::fake::{lock_call, NO_SUCH_PID};

    #[test]
    fn limits_line() {
        let t = "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max locked memory         65536                131072               bytes\n";
        assert_eq!(parse_memlock_limit(t), Some((Some(65536), Some(131_072))));
        let t = "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(parse_memlock_limit(t), Some((None, None)));
    }

    #[test]
    fn status_fields() {
        let t = "Name:\tx\nVmLck:\t    8192 kB\nVmPin:\t       0 kB\nVmRSS:\t   10000 kB\n";
        assert_eq!(parse_status(t), Some((8192 * 1024, 0, 10000 * 1024)));
    }

    #[test]
    fn calls_and_a_refusal() {
        let mut t = PinnedTracker::default();
        let page = t.page;
        t.call(&lock_call(MmCall::Mlock, 0, 8 << 20, (8 << 20) / page));
        t.call(&lock_call(MmCall::Mlock, -12, 1 << 20, (8 << 20) / page));
        let mut frames = |_: u32, _: u32, _: i32| vec!["main".to_string(), "[mlock]".to_string()];
        let p = t.finish(&|_| "w".into(), &mut frames, &|ts| ts as f64 / 1e9);
        assert_eq!(p.processes.len(), 1);
        assert_eq!(p.processes[0].locked_bytes_peak, 8 << 20);
        assert_eq!(p.sites.len(), 1);
        assert_eq!((p.sites[0].calls, p.sites[0].bytes, p.sites[0].failed), (2, 8 << 20, 1));
        assert_eq!(p.failures.len(), 1);
        assert_eq!(p.failures[0].errno, "ENOMEM");
        assert_eq!(p.failures[0].locked_bytes_before, 8 << 20);
        // No /proc for this pid: the limit is unread, and said so.
        assert!(!p.failures[0].rlimit_memlock);
        assert!(p.failures[0].cause.contains("unread"), "{}", p.failures[0].cause);
    }

    #[test]
    fn the_resident_size_at_the_peak_is_read_even_when_the_locked_bytes_did_not_change() {
        let mut t = PinnedTracker::default();
        let page = t.page;
        t.call(&lock_call(MmCall::Mlock, 0, 96 << 20, (96 << 20) / page));
        // Status reads at the same locked bytes: the larger resident size counts.
        t.point(NO_SUCH_PID, 2, 96 << 20, 0, "status", Some(98 << 20));
        t.point(NO_SUCH_PID, 3, 96 << 20, 0, "status", Some(162 << 20));
        t.point(NO_SUCH_PID, 4, 96 << 20, 0, "status", Some(100 << 20));
        let mut frames = |_: u32, _: u32, _: i32| vec!["main".to_string(), "[mlock]".to_string()];
        let p = t.finish(&|_| "w".into(), &mut frames, &|ts| ts as f64 / 1e9);
        assert_eq!(p.processes[0].rss_bytes_at_peak, Some(162 << 20));
        assert_eq!(p.processes[0].timeline.len(), 1, "one point: the bytes never changed");
    }

    #[test]
    fn rlimit_named_with_the_fix() {
        let f = RawFailure {
            ts_ns: 0,
            ev: lock_call(MmCall::Mlock, -12, 1 << 20, 0),
            locked_before: 0,
            limit: Some((Some(64 << 10), Some(64 << 10))),
        };
        let d = describe_failure(&f, "w".into(), vec![], 0.0);
        assert!(d.rlimit_memlock);
        assert!(d.cause.contains("RLIMIT_MEMLOCK 64 KiB"), "{}", d.cause);
        assert!(d.fix.contains("ulimit -l 1024"), "{}", d.fix);
    }
}
