//! Locked and pinned memory (summary.json `pinned`, `--events mmap`): bytes
//! each process had locked (mlock, mlock2, mlockall, mmap `MAP_LOCKED`) and
//! pinned long-term (RDMA, io_uring, vfio: the kernel's `pinned_vm`) over
//! time, the call sites that locked, and the calls refused (an
//! `RLIMIT_MEMLOCK` failure named with the limit and the fix).
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::bytes;

/// Locked and pinned memory of the recording.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Pinned {
    /// Processes that had memory locked or pinned at some point, most locked first.
    pub processes: Vec<PinnedProcess>,
    /// Locking call sites (syscall, user stack with Python lines), most bytes first.
    pub sites: Vec<LockSite>,
    /// Locking calls the kernel refused, in time order.
    pub failures: Vec<LockFailure>,
    /// What the rest of the machine went through while memory was locked
    /// or pinned: `/proc/meminfo` and `/proc/vmstat` from the first lock seen
    /// to the end. Absent when nothing was locked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineEffect>,
}

/// The machine while memory was locked or pinned (system-wide counters).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MachineEffect {
    /// When the first locked or pinned memory was seen (seconds since the start).
    pub since_s: f64,
    /// `Mlocked` (every process's locked pages) at most.
    pub mlocked_bytes_peak: u64,
    /// `Cached` (the page cache) when the first lock was seen, at its
    /// lowest while memory was locked, and at the end.
    pub page_cache_bytes_before: u64,
    pub page_cache_bytes_min: u64,
    pub page_cache_bytes_end: u64,
    /// `MemAvailable` at its lowest.
    pub mem_available_bytes_min: u64,
    /// The rise of `/proc/vmstat` over the same time: direct-reclaim stalls
    /// (`allocstall_*`), pages scanned by direct reclaim and by kswapd
    /// (`pgscan_direct`, `pgscan_kswapd`), pages reclaimed (`pgsteal_*`).
    pub direct_reclaim_stalls: u64,
    pub pages_scanned_direct: u64,
    pub pages_scanned_kswapd: u64,
    pub pages_reclaimed: u64,
}

impl MachineEffect {
    /// One line for people.
    pub fn describe(&self) -> String {
        format!(
            "while memory was locked (from {:.1} s): the page cache {} → {} at its lowest ({} at the end); \
             MemAvailable at least {}; {} direct-reclaim stalls, {} pages scanned by direct reclaim and {} by \
             kswapd, {} reclaimed; Mlocked system-wide at most {}",
            self.since_s,
            bytes(self.page_cache_bytes_before),
            bytes(self.page_cache_bytes_min),
            bytes(self.page_cache_bytes_end),
            bytes(self.mem_available_bytes_min),
            self.direct_reclaim_stalls,
            self.pages_scanned_direct,
            self.pages_scanned_kswapd,
            self.pages_reclaimed,
            bytes(self.mlocked_bytes_peak)
        )
    }
}

/// One process's locked and pinned memory.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PinnedProcess {
    pub pid: u32,
    pub comm: String,
    /// The largest `VmLck` seen (the kernel's `mm->locked_vm`), in bytes.
    pub locked_bytes_peak: u64,
    /// The last value seen: at the end of the recording for a live process,
    /// else its last locking call or `/proc` read before it exited (the
    /// kernel unlocks everything at exit).
    pub locked_bytes_last: u64,
    /// The same for `VmPin` (`mm->pinned_vm`: long-term pins by drivers).
    pub pinned_bytes_peak: u64,
    pub pinned_bytes_last: u64,
    /// Resident bytes (`VmRSS`) at the `/proc` read of the locked peak, where one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes_at_peak: Option<u64>,
    /// `RLIMIT_MEMLOCK` (soft) in bytes, as `/proc/PID/limits` said; absent: unlimited or unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memlock_limit_bytes: Option<u64>,
    /// Each change seen, in time order.
    pub timeline: Vec<LockPoint>,
}

/// Locked and pinned bytes of a process at one moment.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LockPoint {
    /// Seconds since the start of the recording.
    pub t_s: f64,
    pub locked_bytes: u64,
    pub pinned_bytes: u64,
    /// "call": read in the kernel at a locking call's return; "status":
    /// `/proc/PID/status` (read every 0.5 s).
    pub source: String,
}

/// A locking call site of one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LockSite {
    pub pid: u32,
    pub comm: String,
    /// "mlock" (mlock and mlock2), "munlock", "mlockall", "munlockall" or "mmap(MAP_LOCKED)".
    pub call: String,
    pub calls: u64,
    /// Bytes asked for by the calls that succeeded (mlockall: 0).
    pub bytes: u64,
    /// Calls refused.
    pub failed: u64,
    /// Outermost first, the syscall as leaf (as `mmap.folded`).
    pub frames: Vec<String>,
}

/// A locking call the kernel refused.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LockFailure {
    pub t_s: f64,
    pub pid: u32,
    pub comm: String,
    pub call: String,
    /// "ENOMEM", "EPERM", "EAGAIN"…
    pub errno: String,
    /// Bytes the call asked to lock (mlockall: 0).
    pub bytes_asked: u64,
    /// Bytes the process already had locked when it asked.
    pub locked_bytes_before: u64,
    /// `RLIMIT_MEMLOCK` soft and hard limits in bytes (`None`: unlimited;
    /// both absent when the process was gone before `/proc/PID/limits` was read).
    pub limit_soft_bytes: Option<u64>,
    pub limit_hard_bytes: Option<u64>,
    /// Whether `RLIMIT_MEMLOCK` is the cause: the request and what was
    /// locked exceed the soft limit (or the limit is 0), as the kernel checks
    /// for a process without `CAP_IPC_LOCK`.
    pub rlimit_memlock: bool,
    /// What happened, in one sentence with its numbers.
    pub cause: String,
    /// The change to make.
    pub fix: String,
    pub frames: Vec<String>,
}

/// The text section (summary.txt), empty when nothing was locked.
#[must_use]
pub fn render_text(p: &Pinned) -> String {
    let mut s = String::new();
    if p.processes.is_empty() && p.failures.is_empty() {
        return s;
    }
    let _ = writeln!(s, "Locked and pinned memory:");
    let _ = writeln!(
        s,
        "  {:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}",
        "pid", "comm", "locked peak", "locked last", "pinned peak", "limit"
    );
    for q in &p.processes {
        let limit = q.memlock_limit_bytes.map_or_else(|| "unlimited".into(), bytes);
        let _ = writeln!(
            s,
            "  {:>8}  {:<16} {:>12} {:>12} {:>12} {:>12}",
            q.pid,
            q.comm,
            bytes(q.locked_bytes_peak),
            bytes(q.locked_bytes_last),
            bytes(q.pinned_bytes_peak),
            limit
        );
    }
    for site in p.sites.iter().take(10) {
        let failed = if site.failed > 0 { format!(", {} refused", site.failed) } else { String::new() };
        let _ = writeln!(
            s,
            "  {} (pid {}) {}: {} calls, {}{failed}: {}",
            site.comm,
            site.pid,
            site.call,
            site.calls,
            bytes(site.bytes),
            short_stack(&site.frames)
        );
    }
    for f in &p.failures {
        let _ = writeln!(s, "  FAILED at {:.2}s: {}", f.t_s, f.cause);
        let _ = writeln!(s, "    fix: {}", f.fix);
    }
    if let Some(m) = &p.machine {
        let _ = writeln!(s, "  the machine {}", m.describe());
    }
    s
}

/// The innermost frames of a call site, innermost first, for one line
/// (short C++ names, each cut at 100 characters).
#[must_use]
pub fn short_stack(frames: &[String]) -> String {
    let inner: Vec<String> = frames.iter().rev().take(4).map(|f| super::clip(&super::short_name(f), 100)).collect();
    inner.join(" < ")
}

#[cfg(test)]
mod tests {
    use super::short_stack;

    #[test]
    fn a_locking_sites_frames_read_short() {
        let frames = vec![
            "main".to_string(),
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, \
             CUstream_st*)"
                .to_string(),
            "std::vector<std::pair<std::basic_string<char, std::char_traits<char>, std::allocator<char> >, int>, \
             std::allocator<std::pair<std::basic_string<char>, int> > >::reserve(unsigned long)"
                .to_string(),
            "[mlock]".to_string(),
        ];
        let s = short_stack(&frames);
        assert_eq!(
            s,
            "[mlock] < std::vector<…>::reserve(…) < c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(…) < main"
        );
    }
}
