//! The userspace half of a trace: drain the kernel's event stream into the
//! process table while the target runs, then read the in-kernel aggregates
//! once and turn them into a `Summary`.
pub mod process;
pub mod storms;

use std::{
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use std::collections::{BTreeMap, HashMap, VecDeque};

use vmtrace_common::{
    DropKind, EventHeader, EventKind, FaultStats, Merge, MmCall, MmEvent, MmStackKey, MmStats, OomEvent, TaskEvent,
    ADVICE_SLOTS, MM_CALL_NAMES,
};

use crate::{
    loader::Families,
    oom::{self, OomRecord},
    regions::{self, Attributed, ProcessRegions},
    stacks::{
        self,
        symbolize::{Names, PerfMap},
        Stack, StackMode, StacksSummary,
    },
};
use crate::{
    loader::Probes,
    report::summary::{
        Drops, Faults, MmapCounts, ProbeInfo, Process, Reclaim, Sampling, Storm, Summary, TargetInfo, Timeline,
        TlbCounts, SUMMARY_VERSION,
    },
};
use process::ProcessTable;
use storms::StormDetector;
use vmtrace_common::{StackCounts, StackKey};

/// Copies a `T` out of a ring-buffer record after checking its length.
fn read_event<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    // SAFETY: length checked; T is Pod (plain integers, any bit pattern valid).
    (bytes.len() >= std::mem::size_of::<T>()).then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Last SIGINT/SIGTERM received (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: i32) {
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the trace cleanly, with every output written.
pub fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
}

pub fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How far back the flight recorder keeps each process's fault count.
const HISTORY: Duration = Duration::from_secs(5);
const HISTORY_STEP: Duration = Duration::from_millis(250);

pub struct Session {
    pub probes: Probes,
    pub table: ProcessTable,
    pub malformed_events: u64,
    pub started: Instant,
    /// CLOCK_MONOTONIC at `started`, the clock of kernel event timestamps.
    started_mono_ns: u64,
    /// Which optional families are traced.
    pub families: Families,
    /// 1 in how many minor faults is timed, as the kernel programs were attached.
    pub minor_period: u32,
    pub ooms: Vec<OomRecord>,
    /// Flight recorder: (seconds since start, faults so far) per process, last few seconds.
    history: HashMap<u32, VecDeque<(f64, u64)>>,
    last_history: Instant,
    /// Stacks are collected: keep memory maps of live processes.
    pub stacks: Option<(StackMode, u32)>,
    last_maps_refresh: Instant,

    pub storms: StormDetector,
    /// IPIs per call site at the last tick (for storm culprits).
    last_sites: HashMap<MmStackKey, u64>,
    /// Fault-rate timeline: totals at the last tick, and the series.
    last_totals: (u64, u64),
    last_tick: Instant,
    timeline: Timeline,
}

/// Timeline and storm window.
const TICK: Duration = Duration::from_millis(100);

/// What a finished session hands to the reports.
pub struct Finished {
    pub summary: Summary,
    pub stacks: Vec<Stack>,
    pub mm_sites: Vec<MmSite>,
}

const ADVICE_NAMES: [(usize, &str); 20] = [
    (0, "normal"),
    (1, "random"),
    (2, "sequential"),
    (3, "willneed"),
    (4, "dontneed"),
    (8, "free"),
    (9, "remove"),
    (10, "dontfork"),
    (11, "dofork"),
    (12, "mergeable"),
    (13, "unmergeable"),
    (14, "hugepage"),
    (15, "nohugepage"),
    (16, "dontdump"),
    (17, "dodump"),
    (18, "wipeonfork"),
    (19, "keeponfork"),
    (20, "cold"),
    (21, "pageout"),
    (22, "populate_read"),
];

fn advice_name(i: usize) -> String {
    match ADVICE_NAMES.iter().find(|(n, _)| *n == i) {
        Some((_, name)) => (*name).to_string(),
        None if i == ADVICE_SLOTS - 1 => "other".into(),
        None => format!("advice_{i}"),
    }
}

fn mmap_counts(m: &MmStats) -> MmapCounts {
    MmapCounts {
        mmap: m.calls[MmCall::Mmap as usize],
        munmap: m.calls[MmCall::Munmap as usize],
        munmap_bytes: m.munmap_bytes,
        mremap: m.calls[MmCall::Mremap as usize],
        madvise: m.calls[MmCall::Madvise as usize],
        mprotect: m.calls[MmCall::Mprotect as usize],
        brk: m.calls[MmCall::Brk as usize],
        madvise_by_advice: m
            .advice
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (advice_name(i), *n))
            .collect(),
    }
}

fn tlb_counts(m: &MmStats) -> TlbCounts {
    let mut by_call: BTreeMap<String, u64> = BTreeMap::new();
    for (i, n) in m.ipis_by_call.iter().enumerate().filter(|(_, n)| **n > 0) {
        by_call.insert(MM_CALL_NAMES.get(i).copied().unwrap_or("other").to_string(), *n);
    }
    TlbCounts {
        task_switch: m.tlb_reason[0],
        remote_shootdown: m.tlb_reason[1],
        local_shootdown: m.tlb_reason[2],
        local_mm_shootdown: m.tlb_reason[3],
        remote_ipi_send: m.tlb_reason[4],
        pages: m.tlb_pages,
        ipis_sent: m.ipis_sent,
        ipis_by_call: by_call,
    }
}

/// mmap/TLB call-site stacks, symbolized, for `mmap.folded` and `shootdowns.folded`.
pub struct MmSite {
    pub comm: String,
    pub frames: Vec<String>,
    pub calls: u64,
    pub ipis: u64,
}

/// One aggregated stack before symbolization: key, counts, user and kernel IPs.
type RawStack = (StackKey, StackCounts, Vec<u64>, Vec<u64>);

/// How often memory maps of live processes are re-read for symbolization.
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// Processes younger than this have their maps re-read on every poll.
const YOUNG: Duration = Duration::from_secs(2);

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Session {
    pub fn new(probes: Probes, families: Families) -> Self {
        let minor_period = probes.minor_period;
        Self {
            probes,
            table: ProcessTable::default(),
            malformed_events: 0,
            started: Instant::now(),
            started_mono_ns: monotonic_ns(),
            families,
            minor_period,
            ooms: Vec::new(),
            history: HashMap::new(),
            last_history: Instant::now(),
            stacks: None,
            last_maps_refresh: Instant::now(),

            storms: StormDetector::new(f64::MAX),
            last_sites: HashMap::new(),
            last_totals: (0, 0),
            last_tick: Instant::now(),
            timeline: Timeline { interval_s: TICK.as_secs_f64(), ..Timeline::default() },
        }
    }

    /// Every 100 ms: the fault-rate timeline and the storm window.
    fn tick(&mut self) {
        if self.last_tick.elapsed() < TICK {
            return;
        }
        self.last_tick = Instant::now();
        let (f, m) = self.probes.totals();
        self.timeline.push(f.saturating_sub(self.last_totals.0), m.saturating_sub(self.last_totals.1));
        self.last_totals = (f, m);
        if self.families.tlb {
            self.storm_tick(self.started.elapsed().as_secs_f64());
        }
    }

    /// Re-reads the maps of live traced processes: libraries load after exec,
    /// so young processes are re-read on every poll, older ones every second.
    fn refresh_maps(&mut self) {
        if self.stacks.is_none() {
            return;
        }
        let all_due = self.last_maps_refresh.elapsed() >= MAPS_REFRESH;
        if all_due {
            self.last_maps_refresh = Instant::now();
        }
        let due: Vec<u32> = self
            .table
            .procs
            .iter()
            .filter(|(_, p)| p.exit_code.is_none() && (all_due || p.first_seen.elapsed() < YOUNG))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            self.table.snapshot_maps(pid);
        }
    }

    /// Symbolizes the in-kernel stack aggregate.
    fn build_stacks(&mut self) -> Vec<Stack> {
        let raw = self.probes.all_stack_counts();
        let mut names = Names::default();
        let mut out = Vec::new();
        let mut by_pid: HashMap<u32, Vec<RawStack>> = HashMap::new();
        for (k, c) in raw {
            let user =
                if k.user_stack >= 0 { self.probes.user_stack_ips(k.user_stack).unwrap_or_default() } else { vec![] };
            let kernel =
                if k.kernel_stack >= 0 { self.probes.stack_ips(k.kernel_stack).unwrap_or_default() } else { vec![] };
            by_pid.entry(k.tgid).or_default().push((k, c, user, kernel));
        }
        for (pid, entries) in by_pid {
            if self.table.procs.get(&pid).is_none_or(|p| p.maps.is_empty()) {
                self.table.snapshot_maps(pid);
            }
            let info = self.table.ensure(pid).clone();
            let jit = PerfMap::read(pid);
            let all_user: Vec<u64> = entries.iter().flat_map(|e| e.2.iter().copied()).collect();
            names.prepare_user(&all_user, &info.maps);
            let all_kernel: Vec<u64> = entries.iter().flat_map(|e| e.3.iter().copied()).collect();
            names.prepare_kernel(&all_kernel);
            for (k, counts, user, kernel) in entries {
                let (user, user_cut) = stacks::user_frames(&user, &names, &info.maps, &info.mapped, jit.as_ref());
                out.push(Stack {
                    pid,
                    comm: info.comm.clone(),
                    user,
                    kernel: kernel.iter().rev().map(|&a| names.kernel(a)).collect(),
                    counts,
                    user_missing: k.user_stack == vmtrace_common::STACK_ID_LOST,
                    user_cut,
                    leaf: (k.leaf_block != 0).then(|| {
                        let a = k.leaf_block << vmtrace_common::LEAF_BLOCK_SHIFT;
                        let end = a + (1 << vmtrace_common::LEAF_BLOCK_SHIFT) - 1;
                        // A region may start inside the block: try its last byte too.
                        let leaf = stacks::region_leaf(&info.maps, &info.mapped, a);
                        if leaf == "[unmapped region]" {
                            stacks::region_leaf(&info.maps, &info.mapped, end)
                        } else {
                            leaf
                        }
                    }),
                });
            }
        }
        out
    }

    /// Marks the start of the trace proper.
    pub fn start_clock(&mut self) {
        self.started = Instant::now();
        self.last_tick = self.started;
        self.last_totals = self.probes.totals();
        self.started_mono_ns = monotonic_ns();
    }

    /// Seconds since the start for a kernel timestamp.
    fn since_start(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.started_mono_ns) as f64 / 1e9
    }

    /// Every few hundred ms, the fault count of each live traced process.
    fn record_history(&mut self) {
        if !self.families.oom || self.last_history.elapsed() < HISTORY_STEP {
            return;
        }
        self.last_history = Instant::now();
        let now = self.started.elapsed().as_secs_f64();
        for (tgid, s) in self.probes.all_stats() {
            let h = self.history.entry(tgid).or_default();
            h.push_back((now, s.started));
            while h.front().is_some_and(|&(t, _)| now - t > HISTORY.as_secs_f64()) {
                h.pop_front();
            }
        }
    }

    /// Feeds the storm detector: IPIs sent per process, and per call site.
    fn storm_tick(&mut self, now: f64) {
        let totals: Vec<(u32, u64)> = self.probes.all_mm().into_iter().map(|(pid, m)| (pid, m.ipis_sent)).collect();
        self.storms.tick(now, &totals);
        for (k, c) in self.probes.all_mm_stacks() {
            let before = self.last_sites.insert(k, c.ipis).unwrap_or(0);
            if c.ipis > before && self.storms.in_storm(k.tgid) {
                self.storms.add_site(k.tgid, (k.call, k.user_stack), c.ipis - before);
            }
        }
    }

    /// Streamed events and samples lost so far: summary.json's `lost_events`,
    /// also in streamed lines and `top`. Untimed faults, stack misses and
    /// faults not placed in a region are counted, just with less detail: they
    /// have their own `drops` entries.
    pub fn lost_events(&self) -> u64 {
        let not_lost = [
            DropKind::FaultUntimed as usize,
            DropKind::StackLost as usize,
            DropKind::StackCountsFull as usize,
            DropKind::RegionStatsFull as usize,
        ];
        let drops: u64 =
            self.probes.drops().iter().enumerate().filter(|(i, _)| !not_lost.contains(i)).map(|(_, n)| n).sum();
        drops + self.malformed_events
    }

    /// One line of `--stream json`: every live traced process's counts so far
    /// and its rates since the previous line (same field names as summary.json).
    pub fn stream_line(&mut self, prev: &mut HashMap<u32, (u64, u64, u64, u64)>, interval_s: f64) -> serde_json::Value {
        let mm: HashMap<u32, MmStats> =
            if self.families.tlb { self.probes.all_mm().into_iter().collect() } else { HashMap::new() };
        let mut procs = Vec::new();
        let mut seen = Vec::new();
        for (pid, st) in self.probes.all_stats() {
            let f = Faults::from_stats(&st, self.minor_period);
            let ipis = mm.get(&pid).map_or(0, |m| m.ipis_sent);
            let (pf, pm, pc, pi) = prev.insert(pid, (f.total, f.major, f.cow, ipis)).unwrap_or_default();
            let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / interval_s;
            seen.push(pid);
            procs.push(serde_json::json!({
                "pid": pid,
                "comm": self.table.procs.get(&pid).map_or("?", |p| p.comm.as_str()),
                "faults": {"total": f.total, "minor": f.minor, "major": f.major, "write": f.write, "cow": f.cow, "time_ns": f.time_ns},
                "faults_per_s": rate(f.total, pf),
                "major_per_s": rate(f.major, pm),
                "cow_per_s": rate(f.cow, pc),
                "tlb": {"ipis_sent": ipis, "ipis_per_s": rate(ipis, pi)},
            }));
        }
        prev.retain(|pid, _| seen.contains(pid));
        let lost = self.lost_events();
        serde_json::json!({
            "t_s": self.started.elapsed().as_secs_f64(),
            "interval_s": interval_s,
            "processes": procs,
            "lost_events": lost,
        })
    }

    /// Fault rate of `pid` over the flight recorder's window, up to now: its
    /// count is read once more at the kill, and a process younger than one
    /// sample is measured from when it was first seen.
    fn recent_rate(&self, pid: u32) -> Option<f64> {
        let now = self.started.elapsed().as_secs_f64();
        let current = self.probes.stats_of(pid)?.started;
        let (t0, n0) = if let Some(&(t, n)) = self.history.get(&pid).and_then(|h| h.front()) {
            (t, n)
        } else {
            (now - self.table.procs.get(&pid)?.first_seen.elapsed().as_secs_f64(), 0)
        };
        (now > t0).then(|| current.saturating_sub(n0) as f64 / (now - t0))
    }

    fn on_oom(&mut self, ev: &OomEvent) {
        let victim = ev.victim_pid;
        // Read now: the victim is on its way out.
        let cgroup =
            oom::memory_cgroup_of(victim).or_else(|| self.table.procs.get(&victim).and_then(|p| p.cgroup.clone()));
        let in_target = self.table.procs.contains_key(&victim) || self.probes.is_traced(victim);
        let mut rec = oom::describe(ev, cgroup, in_target, self.since_start(ev.hdr.ts_ns));
        rec.fault_rate_per_s = self.recent_rate(victim);
        self.ooms.push(rec);
    }

    /// Waits up to `timeout` for kernel events, then applies all that arrived.
    pub fn poll(&mut self, timeout: Duration) {
        let mut pfd = libc::pollfd { fd: self.probes.ring_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; EINTR (a stop signal) simply returns early.
        unsafe { libc::poll(&raw mut pfd, 1, timeout.as_millis() as i32) };
        self.drain();
        self.tick();
        self.record_history();
        self.refresh_maps();
    }

    pub fn drain(&mut self) {
        let mut exited = Vec::new();
        let mut ooms = Vec::new();
        let mut born = Vec::new();
        while let Some(item) = self.probes.events.next() {
            let bytes: &[u8] = &item;
            let Some(hdr) = read_event::<EventHeader>(bytes) else {
                self.malformed_events += 1;
                continue;
            };
            match EventKind::from_u32(hdr.kind) {
                Some(EventKind::TaskFork | EventKind::TaskExec | EventKind::TaskExit) => {
                    let Some(ev) = read_event::<TaskEvent>(bytes) else {
                        self.malformed_events += 1;
                        continue;
                    };
                    if ev.hdr.kind == EventKind::TaskExit as u32 && ev.group_dead != 0 {
                        exited.push(ev.tgid);
                    } else if ev.hdr.kind != EventKind::TaskExit as u32 {
                        born.push(ev.tgid);
                    }
                    self.table.apply(&ev);
                }
                Some(EventKind::MmMapChange) => match read_event::<MmEvent>(bytes) {
                    Some(ev) if ev.call != MmCall::Munmap as u32 => {
                        self.table.note_mapping(ev.tgid, process::region_from_event(&ev));
                    }
                    Some(_) => {}
                    None => self.malformed_events += 1,
                },
                Some(EventKind::OomMarkVictim) => match read_event::<OomEvent>(bytes) {
                    Some(ev) => ooms.push(ev),
                    None => self.malformed_events += 1,
                },
                None => self.malformed_events += 1,
            }
        }
        for ev in &ooms {
            self.on_oom(ev);
        }
        // A thread the fallback fork hook reported, and whose exit came in the
        // same batch, is gone from the table: reading its /proc now would fail
        // and give it back an entry (its parent's maps) as a process.
        born.retain(|tgid| self.table.procs.contains_key(tgid));
        if self.stacks.is_some() {
            for &tgid in &born {
                self.table.snapshot_maps(tgid);
            }
        }
        if self.families.oom {
            for tgid in born {
                if let Some(cg) = oom::memory_cgroup_of(tgid) {
                    self.table.procs.entry(tgid).or_default().cgroup = Some(cg);
                }
            }
        }
        // Take an exited process's aggregate out of the kernel map: it is final,
        // and the map stays bounded however many processes come and go.
        for tgid in exited {
            if let Some(m) = self.probes.take_mm(tgid) {
                self.table.procs.entry(tgid).or_default().mm.get_or_insert_with(MmStats::default).merge(&m);
            }
            if let Some(s) = self.probes.take_stats(tgid) {
                self.table.procs.entry(tgid).or_default().stats.get_or_insert_with(FaultStats::default).merge(&s);
            }
        }
        self.probes.flush_logs();
    }

    /// Fault aggregates of every process: taken at exit, or still in the map.
    pub(crate) fn stats_totals(&self) -> BTreeMap<u32, FaultStats> {
        let mut all: BTreeMap<u32, FaultStats> =
            self.table.procs.iter().filter_map(|(pid, p)| p.stats.map(|s| (*pid, s))).collect();
        for (tgid, s) in self.probes.all_stats() {
            all.entry(tgid).or_default().merge(&s);
        }
        all
    }

    /// mmap/TLB aggregates of every process: taken at exit, or still in the map.
    pub(crate) fn mm_totals(&self) -> BTreeMap<u32, MmStats> {
        let mut all: BTreeMap<u32, MmStats> =
            self.table.procs.iter().filter_map(|(pid, p)| p.mm.map(|m| (*pid, m))).collect();
        for (tgid, m) in self.probes.all_mm() {
            all.entry(tgid).or_default().merge(&m);
        }
        all
    }

    /// Faults per region of every process, then per file and tensor.
    pub(crate) fn build_regions(&mut self) -> Attributed {
        let granules = self.probes.all_granules();
        // Processes whose maps were never read (e.g. with -a) are read now if alive.
        let mut pids: Vec<u32> = granules.iter().map(|(k, _)| k.tgid).collect();
        pids.dedup();
        for pid in pids {
            if self.table.procs.get(&pid).is_none_or(|p| p.maps.is_empty()) {
                self.table.snapshot_maps(pid);
            }
        }
        let table = &self.table;
        let probes = &self.probes;
        let mut a = regions::attribute(
            &granules,
            |pid| table.procs.get(&pid).map(|p| ProcessRegions { maps: &p.maps, mapped: &p.mapped }),
            |path| regions::kernel_dev_ino(path).and_then(|(dev, ino)| probes.page_cache_added(dev, ino)),
        );
        a.regions.sort_by(|x, y| y.faults.time_ns.cmp(&x.faults.time_ns).then(y.faults.total.cmp(&x.faults.total)));
        a.files.sort_by_key(|f| std::cmp::Reverse(f.faults.time_ns));
        a
    }

    /// Call sites of mmap-family syscalls, symbolized, with calls and IPIs sent.
    fn build_mm_sites(&mut self) -> Vec<MmSite> {
        let raw = self.probes.all_mm_stacks();
        let mut names = Names::default();
        let mut out = Vec::new();
        for (k, c) in raw {
            let frames = self.site_frames(&mut names, k.tgid, k.call, k.user_stack);
            let comm = self.table.ensure(k.tgid).comm.clone();
            out.push(MmSite { comm, frames, calls: c.calls, ipis: c.ipis });
        }
        out
    }

    /// Frames of a call site, outermost first, the syscall as leaf.
    pub(crate) fn site_frames(&mut self, names: &mut Names, tgid: u32, call: u32, user_stack: i32) -> Vec<String> {
        if self.table.procs.get(&tgid).is_none_or(|p| p.maps.is_empty()) {
            self.table.snapshot_maps(tgid);
        }
        let ips = if user_stack >= 0 { self.probes.user_stack_ips(user_stack).unwrap_or_default() } else { vec![] };
        let info = self.table.ensure(tgid);
        names.prepare_user(&ips, &info.maps);
        let (mut frames, _) = stacks::user_frames(&ips, names, &info.maps, &info.mapped, None);
        if user_stack == vmtrace_common::STACK_ID_LOST {
            frames.push("[no user stack]".into());
        }
        frames.push(format!("[{}]", MM_CALL_NAMES.get(call as usize).copied().unwrap_or("?")));
        frames
    }

    fn finish_storms(&mut self) -> Vec<Storm> {
        let raw = std::mem::replace(&mut self.storms, StormDetector::new(f64::MAX)).finish();
        let mut names = Names::default();
        raw.into_iter()
            .map(|s| {
                let top = s.sites.iter().max_by_key(|(_, n)| **n).map(|(site, n)| (*site, *n));
                let (top_stack, top_call, top_share) = match top {
                    Some(((call, stack), n)) => (
                        self.site_frames(&mut names, s.pid, call, stack),
                        MM_CALL_NAMES.get(call as usize).copied().unwrap_or("?").to_string(),
                        // Call-site and process totals are read a moment apart.
                        (n as f64 / s.ipis.max(1) as f64).min(1.0),
                    ),
                    None => (Vec::new(), "other".into(), 0.0),
                };
                Storm {
                    pid: s.pid,
                    comm: self.table.ensure(s.pid).comm.clone(),
                    start_s: s.start_s,
                    end_s: s.end_s,
                    peak_per_s: s.peak_per_s.round() as u64,
                    shootdowns: s.ipis,
                    top_stack,
                    top_call,
                    top_share,
                }
            })
            .collect()
    }

    /// One entry per process of the trace, and their fault totals.
    fn build_processes(
        &mut self,
        target: &TargetInfo,
        stats: &BTreeMap<u32, FaultStats>,
        mm: &BTreeMap<u32, MmStats>,
        minor_period: u32,
    ) -> (Vec<Process>, Faults) {
        let system = target.kind == "system";
        let mut pids: Vec<u32> = stats.keys().copied().collect();
        if !system {
            // Every process of the target appears, even one that never faulted.
            pids.extend(self.table.procs.keys().copied());
        }
        if let Some(pid) = target.pid {
            pids.push(pid);
        }
        pids.sort_unstable();
        pids.dedup();
        // The fallback fork hook cannot tell threads from processes; drop live threads.
        pids.retain(|&pid| !process::is_thread(pid));
        let mut totals = Faults::default();
        let mut processes = Vec::new();
        for pid in pids {
            let st = stats.get(&pid).copied().unwrap_or_default();
            let mut faults = Faults::from_stats(&st, minor_period);
            if self.families.regions {
                faults.huge = Some(st.huge);
            }
            // After `huge` is known, or the total's stays null.
            totals.add(&faults);
            let info = self.table.ensure(pid).clone();
            let exit_code = if Some(pid) == target.pid && target.kind == "command" {
                target.exit_status.or(info.exit_code)
            } else {
                info.exit_code
            };
            let m = mm.get(&pid).copied().unwrap_or_default();
            processes.push(Process {
                mmap: self.families.mmap.then(|| mmap_counts(&m)),
                tlb: self.families.tlb.then(|| tlb_counts(&m)),
                reclaim: Reclaim { stalls: st.reclaim, time_ns: st.reclaim_ns },
                pid,
                ppid: info.ppid,
                comm: info.comm,
                cmdline: info.cmdline,
                exit_code,
                faults,
                kernel_accounting: info.kernel,
            });
        }
        (processes, totals)
    }

    pub fn finish(mut self, target: TargetInfo) -> Finished {
        let minor_period = self.minor_period;
        self.drain();
        // The last, partial interval.
        self.last_tick -= TICK;
        self.tick();
        let stacks = if self.stacks.is_some() { self.build_stacks() } else { Vec::new() };
        let mm_sites = if self.families.mmap { self.build_mm_sites() } else { Vec::new() };
        let storms = self.families.tlb.then(|| self.finish_storms());
        let attributed = self.families.regions.then(|| self.build_regions());
        let mm = self.mm_totals();
        let duration_s = self.started.elapsed().as_secs_f64();
        let stats = self.stats_totals();
        let drops_raw = self.probes.drops();
        let d = |k: DropKind| drops_raw.get(k as usize).copied().unwrap_or(0);
        let drops = Drops {
            task_events: d(DropKind::TaskEventRingFull) + d(DropKind::OomRingFull) + self.malformed_events,
            mm: d(DropKind::MmStatsFull) + d(DropKind::MmEventRingFull) + d(DropKind::MmInflightFull),
            region_stats_full: d(DropKind::RegionStatsFull),
            fault_stats_full: d(DropKind::FaultStatsFull),
            traced_full: d(DropKind::TracedFull),
            untimed_faults: d(DropKind::FaultUntimed),
        };
        let (processes, totals) = self.build_processes(&target, &stats, &mm, minor_period);
        let time_estimated = minor_period != 1 || drops.untimed_faults > 0;
        for r in &mut self.ooms {
            if let Some(s) = stats.get(&r.victim_pid) {
                r.victim_faults = Some(s.started);
                r.victim_reclaim_stalls = Some(s.reclaim);
                r.victim_reclaim_ns = Some(s.reclaim_ns);
            }
        }
        let stacks_summary = self.stacks.map(|(mode, period)| StacksSummary {
            mode: format!("{mode:?}").to_lowercase(),
            sample_period: period,
            sampled_faults: stacks.iter().map(|s| s.counts.faults).sum(),
            distinct_stacks: stacks.len() as u64,
            lost: drops_raw.get(DropKind::StackLost as usize).copied().unwrap_or(0)
                + drops_raw.get(DropKind::StackCountsFull as usize).copied().unwrap_or(0),
            shallow_user_stacks_pct: crate::stacks::shallow_pct(&stacks),
            broken_chain_pct: crate::stacks::broken_pct(&stacks),
            files: Vec::new(),
        });
        let summary = Summary {
            version: SUMMARY_VERSION,
            target,
            duration_s,
            lost_events: self.lost_events(),
            processes,
            totals,
            sampling: Sampling { minor_latency_period: minor_period, time_estimated },
            drops,
            probes: self
                .probes
                .attached
                .iter()
                .map(|a| ProbeInfo {
                    what: a.what.into(),
                    program_type: a.program_type.into(),
                    target: a.target.clone(),
                    fallback_reason: a.fallback_reason.clone(),
                })
                .collect(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into(),
            vmtrace_version: env!("CARGO_PKG_VERSION").into(),
            perf: None,
            oom: self.families.oom.then(|| std::mem::take(&mut self.ooms)),
            stacks: stacks_summary,
            storms,
            timeline: Some(std::mem::take(&mut self.timeline)),
            regions: attributed.as_ref().map(|a| a.regions.clone()),
            files: attributed.map(|a| a.files),
        };
        Finished { summary, stacks, mm_sites }
    }
}
