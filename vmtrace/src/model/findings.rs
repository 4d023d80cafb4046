//! Findings: what is wrong and what to change, from what one recording
//! measured (docs/findings.md). A pure function of the assembled summary:
//! each rule reads named numbers of the model, fires only past its
//! thresholds (the consts below, written in docs/findings.md), and says
//! the evidence, a concrete fix and, where it can be estimated, the gain.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{bytes, fmt_ns, Process, RegionKind, Summary};

/// One diagnosis (`findings[]` in summary.json).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Finding {
    /// Stable snake_case name of the rule (docs/findings.md).
    pub kind: String,
    pub pid: u32,
    pub comm: String,
    /// The process as people tell it apart: "heap_trim (pid 12)", or for a
    /// forked worker "worker 0 of 11 (python, pid 12)".
    pub process: String,
    /// What is wrong, in one sentence with its numbers.
    pub summary: String,
    /// The named numbers from this recording behind it.
    pub evidence: BTreeMap<String, Value>,
    /// The change to make: an environment variable, a call, a code pattern.
    pub fix: String,
    /// What the fix should save, estimated from the evidence; null where it
    /// cannot be estimated.
    pub expected_gain: Option<String>,
    /// The call site, where the recording names one (short frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// Heap refaulting after trims: at least this many faults in `[heap]`…
pub const HEAP_MIN_FAULTS: u64 = 10_000;
/// …at least this many faults per distinct heap page touched…
pub const HEAP_MIN_FAULTS_PER_PAGE: f64 = 8.0;
/// …and at least this many heap trims: `brk` calls that moved the break
/// down (glibc gives the free top back that way; grows are not counted).
pub const HEAP_MIN_TRIMS: u64 = 64;
/// The smallest trim threshold and top pad suggested (64 MiB).
pub const HEAP_SUGGESTED_MIN: u64 = 64 << 20;

/// A process that copied at least this many pages of Python objects (COW
/// faults in CPython's arenas) after a fork.
pub const FORK_COW_PYTHON_MIN_PAGES: u64 = 1_000;
/// A forked child that copied at least this many of its parent's pages…
pub const FORK_COW_MIN_PAGES: u64 = 1_000;
/// …that were at least this share of its faults.
pub const FORK_COW_MIN_SHARE: f64 = 0.5;

/// Majors on one mapped file: at least this many…
pub const FILE_MIN_MAJORS: u64 = 256;
/// …being at least this share of its faults (a sequential read has
/// readahead ahead of it, and nearly every fault is minor).
pub const FILE_MIN_MAJOR_SHARE: f64 = 0.25;
/// The readahead window a sequential read gets by default (128 KiB): the
/// gain is estimated as the majors the same bytes would take in such pieces.
pub const FILE_READAHEAD_PAGES: u64 = 32;

/// Majors on executable file mappings (code, libraries) in one process.
pub const CODE_MIN_MAJORS: u64 = 64;

/// glibc's largest `M_MMAP_THRESHOLD` on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`):
/// larger settings are ignored.
pub const GLIBC_MMAP_THRESHOLD_MAX: u64 = 32 << 20;
/// glibc's default `M_MMAP_THRESHOLD` (128 KiB): malloc serves larger blocks
/// with mmap and frees them with munmap.
pub const GLIBC_MMAP_THRESHOLD_DEFAULT: u64 = 128 << 10;

/// Anonymous memory faulted in 4 KiB pages where THP is `madvise`: at least
/// this much of it touched in one process's unadvised regions.
pub const THP_MIN_TOUCHED_BYTES: u64 = 64 << 20;
/// Pages a PMD huge page maps (2 MiB / 4 KiB).
pub const THP_PAGES: u64 = 512;

/// Resident memory held by one call site: at least this much…
pub const RESIDENT_MIN_BYTES: u64 = 1 << 30;
/// …and at least this many times the next call site of the same process.
pub const RESIDENT_DOMINANCE: f64 = 4.0;

/// Pages are 4 KiB.
const PAGE: u64 = 4096;

/// Every finding of a summary: OOM kills first, then each rule's in turn,
/// each rule's by process.
pub fn diagnose(s: &Summary) -> Vec<Finding> {
    let mut out = Vec::new();
    oom_kills(s, &mut out);
    heap_trim(s, &mut out);
    fork_cow(s, &mut out);
    storms(s, &mut out);
    cold_files(s, &mut out);
    huge_pages_unused(s, &mut out);
    code_majors(s, &mut out);
    resident_sites(s, &mut out);
    placement::run(s, &mut out);
    out
}

#[path = "findings_placement.rs"]
mod placement;
pub use placement::{
    NUMA_CHURN_MIN_PAGES, NUMA_CHURN_OVER_RESIDENT, NUMA_MIN_SAMPLED, NUMA_REMOTE_SHARE, PINNED_MIN_BYTES,
    PINNED_OVER_REST,
};

/// The process as people tell it apart. A child of a traced process that
/// runs the same program because it did not exec ([`worker_among`]) is a
/// worker: "worker N of PPID", N its place among such children by pid.
pub fn process_label(s: &Summary, pid: u32) -> String {
    let Some(p) = s.processes.iter().find(|p| p.pid == pid) else {
        return format!("pid {pid}");
    };
    match worker_of(s, p) {
        Some((n, ppid)) => format!("worker {n} of {ppid} ({}, pid {pid})", p.comm),
        None => format!("{} (pid {pid})", p.comm),
    }
}

/// `(N, PPID)` when `p` is the N-th worker its traced parent forked.
pub fn worker_of(s: &Summary, p: &Process) -> Option<(usize, u32)> {
    let all: Vec<Who> = s.processes.iter().map(Who::of).collect();
    worker_among(&all, &Who::of(p))
}

/// A process as [`worker_among`] tells workers apart: a recording's
/// `Process`, or a live view's row with what the process table knows.
#[derive(Clone, Copy)]
pub struct Who<'a> {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: &'a str,
    pub cmdline: Option<&'a str>,
}

impl<'a> Who<'a> {
    fn of(q: &'a Process) -> Self {
        Self { pid: q.pid, ppid: q.ppid, comm: &q.comm, cmdline: q.cmdline.as_deref() }
    }
}

/// `(N, PPID)` when `p` is the N-th worker its parent in `all` forked: a
/// child that runs the parent's program because it did not exec, N its
/// place among such children by pid. Not exec'd reads from the command
/// lines: the collector gives a forked child its parent's until it execs and
/// reads the new one at the exec, so a worker's is the parent's (even after
/// a `prctl` renamed it `pt_data_worker`), while a child that exec'd the same
/// program with other arguments (`python3 -c …` of a `python3 job.py`, uc30's
/// k1, where the rank-6 child was "worker 1 of 4418") has its own. Only where
/// either command line is unknown does the name decide.
pub fn worker_among(all: &[Who], p: &Who) -> Option<(usize, u32)> {
    let ppid = p.ppid?;
    let parent = all.iter().find(|q| q.pid == ppid)?;
    let same = |q: &Who| match (q.cmdline, parent.cmdline) {
        (Some(c), Some(pc)) => c == pc,
        _ => q.comm == parent.comm,
    };
    if !same(p) {
        return None;
    }
    let n = all.iter().filter(|q| q.ppid == Some(ppid) && q.pid < p.pid && same(q)).count();
    Some((n, ppid))
}

fn finding(s: &Summary, kind: &str, pid: u32, summary: String, fix: String) -> Finding {
    let comm = s.processes.iter().find(|p| p.pid == pid).map_or_else(String::new, |p| p.comm.clone());
    Finding {
        kind: kind.into(),
        pid,
        comm,
        process: process_label(s, pid),
        summary,
        evidence: BTreeMap::new(),
        fix,
        expected_gain: None,
        site: None,
    }
}

fn ev(f: &mut Finding, name: &str, v: impl Into<Value>) {
    f.evidence.insert(name.into(), v.into());
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 100.0).round() / 100.0
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 * 1000.0 / b as f64).round() / 10.0
    }
}

/// The smallest power of two at least `n`, and at least `floor`.
fn pow2_at_least(n: u64, floor: u64) -> u64 {
    n.max(floor).next_power_of_two()
}

/// An OOM kill: who was killed, what it held, the limit it hit, what grew.
fn oom_kills(s: &Summary, out: &mut Vec<Finding>) {
    // Kills of processes outside the trace (OOM kills are seen system-wide)
    // are another program's story.
    for r in s.oom.iter().flatten().filter(|r| r.in_target) {
        let held = if r.sizes_known() {
            format!(
                "{} resident ({} anon)",
                bytes((r.anon_rss_kb + r.file_rss_kb + r.shmem_rss_kb) << 10),
                bytes(r.anon_rss_kb << 10)
            )
        } else {
            "an unknown amount (this kernel's OOM record has no sizes)".to_string()
        };
        let limit = match (r.constraint.as_str(), &r.cgroup, r.cgroup_limit_bytes) {
            ("memcg", Some(cg), Some(l)) => format!("the memory cgroup {cg}'s limit of {}", bytes(l)),
            ("memcg", Some(cg), None) => format!("the memory cgroup {cg}'s limit"),
            ("global", ..) => "the machine's memory (no cgroup limit)".to_string(),
            (c, ..) => format!("a {c} constraint"),
        };
        let grew = r.resident_sites.as_ref().and_then(|v| v.first());
        let what = match grew {
            Some(site) => format!("; {} held {}", super::oom::site_tail(&site.frames), bytes(site.bytes)),
            None => String::new(),
        };
        let mut f = finding(
            s,
            "oom_kill",
            r.victim_pid,
            format!(
                "The OOM killer killed {} at {:.2} s: it held {held} when it hit {limit}{what}.",
                r.victim_comm, r.time_s,
            ),
            match (r.constraint.as_str(), r.cgroup_limit_bytes) {
                ("memcg", Some(l)) => format!(
                    "Raise the cgroup's limit above the working set (memory.max, or memory.limit_in_bytes on cgroup v1; \
                     now {}), or cut what grew{}: free it once used, load it in pieces, or map a file instead of copying it",
                    bytes(l),
                    grew.map_or(String::new(), |g| format!(" ({})", super::oom::site_tail(&g.frames)))
                ),
                _ => format!(
                    "Cut what grew{}: free it once used, load it in pieces, or map a file instead of copying it; \
                     or give the job a memory cgroup sized for it so the kernel does not pick among all processes",
                    grew.map_or(String::new(), |g| format!(" ({})", super::oom::site_tail(&g.frames)))
                ),
            },
        );
        if r.victim_comm != f.comm {
            f.comm.clone_from(&r.victim_comm);
            f.process = format!("{} (pid {})", r.victim_comm, r.victim_pid);
        }
        if r.sizes_known() {
            ev(&mut f, "anon_rss_kb", r.anon_rss_kb);
            ev(&mut f, "file_rss_kb", r.file_rss_kb);
            ev(&mut f, "shmem_rss_kb", r.shmem_rss_kb);
        }
        ev(&mut f, "time_s", (r.time_s * 100.0).round() / 100.0);
        ev(&mut f, "constraint", r.constraint.clone());
        if let Some(cg) = &r.cgroup {
            ev(&mut f, "cgroup", cg.clone());
        }
        if let Some(l) = r.cgroup_limit_bytes {
            ev(&mut f, "cgroup_limit_bytes", l);
        }
        if let Some(p) = r.cgroup_peak_bytes {
            ev(&mut f, "cgroup_peak_bytes", p);
        }
        if let Some(g) = grew {
            ev(&mut f, "grew_bytes", g.bytes);
            f.site = Some(super::oom::site_tail(&g.frames));
        }
        out.push(f);
    }
}

/// Heap refaulting after trims: glibc gives the free top of `[heap]` back
/// with brk and the next allocations fault it in again.
fn heap_trim(s: &Summary, out: &mut Vec<Finding>) {
    let Some(regions) = &s.regions else { return };
    for p in &s.processes {
        let Some(m) = &p.mmap else { continue };
        let heap = regions.iter().filter(|r| r.pid == p.pid && r.kind == RegionKind::Heap && r.folded == 0);
        let (mut faults, mut pages, mut time_ns) = (0u64, 0u64, 0u64);
        for r in heap {
            faults += r.faults.total;
            pages += r.pages_touched;
            time_ns += r.faults.time_ns;
        }
        if faults < HEAP_MIN_FAULTS || m.brk_shrinks < HEAP_MIN_TRIMS || pages == 0 {
            continue;
        }
        let per_page = faults as f64 / pages as f64;
        if per_page < HEAP_MIN_FAULTS_PER_PAGE {
            continue;
        }
        let setting = pow2_at_least(pages * PAGE * 2, HEAP_SUGGESTED_MIN);
        let avoidable = faults - pages;
        // Trims the program asks for itself: no threshold stops them. A
        // quarter: the count comes from unwound stacks and reads low or high
        // (75-144 brk calls for 100 trims measured; docs/findings.md).
        let explicit = m.brk_in_malloc_trim > 0 && m.brk_in_malloc_trim * 4 >= m.brk_shrinks;
        let (who, fix) = if explicit {
            (
                format!(
                    "the program's own malloc_trim() calls give the free top of the heap back to the kernel ({} of \
                     the brk calls were inside malloc_trim)",
                    m.brk_in_malloc_trim
                ),
                format!(
                    "Call malloc_trim() less often: once after a phase that freed a lot (a load, an epoch), not \
                     after each round (MALLOC_TRIM_THRESHOLD_ does not stop it); or let it keep room for the next \
                     round: malloc_trim({setting}) leaves that much free at the top of the heap"
                ),
            )
        } else {
            (
                "glibc gives the free top of the heap back to the kernel".to_string(),
                format!(
                    "Keep the heap: run with MALLOC_TRIM_THRESHOLD_={setting} MALLOC_TOP_PAD_={setting} \
                     (or mallopt(M_TRIM_THRESHOLD, …) and mallopt(M_TOP_PAD, …) at start-up), or use jemalloc or \
                     mimalloc (LD_PRELOAD)"
                ),
            )
        };
        let mut f = finding(
            s,
            "heap_trim_refault",
            p.pid,
            format!(
                "The heap took {faults} faults on {pages} distinct pages ({per_page:.0} per page) and was trimmed {} \
                 times (brk moved the break down; {} brk calls in all): {who}, and the next allocations fault it in \
                 again.",
                m.brk_shrinks, m.brk
            ),
            fix,
        );
        ev(&mut f, "heap_faults", faults);
        ev(&mut f, "heap_pages_touched", pages);
        ev(&mut f, "faults_per_page", (per_page * 10.0).round() / 10.0);
        ev(&mut f, "brk_calls", m.brk);
        ev(&mut f, "heap_trims", m.brk_shrinks);
        ev(&mut f, "brk_in_malloc_trim", m.brk_in_malloc_trim);
        ev(&mut f, "heap_fault_time_ns", time_ns);
        ev(&mut f, "process_faults", p.faults.total);
        ev(&mut f, "suggested_bytes", setting);
        let saved_ns = (time_ns as f64 * avoidable as f64 / faults as f64) as u64;
        f.expected_gain = Some(format!(
            "up to {avoidable} fewer faults ({}% of the process's {}), about {} in the fault handler",
            pct(avoidable, p.faults.total),
            p.faults.total,
            fmt_ns(saved_ns)
        ));
        out.push(f);
    }
}

/// Fork workers copying their parent's pages: Python objects (reference
/// counts written by reading them), or any page a child writes.
fn fork_cow(s: &Summary, out: &mut Vec<Finding>) {
    for p in &s.processes {
        let (Some(c), Some((n, in_arenas))) = (&p.cow_from, python_object_copies(s, p)) else { continue };
        let time = |n: u64| (p.faults.time_ns as f64 * n as f64 / p.faults.total.max(1) as f64) as u64;
        let children = s.processes.iter().filter(|q| q.ppid == Some(p.pid)).count();
        let forked = worker_of(s, p).is_some() || children > 0;
        if n >= FORK_COW_PYTHON_MIN_PAGES && forked {
            // A parent whose workers fire too copies for the same reason:
            // its fix is theirs, said once (on the workers').
            let parent_of_firing = worker_of(s, p).is_none()
                && s.processes
                    .iter()
                    .filter(|q| q.ppid == Some(p.pid))
                    .any(|q| python_object_copies(s, q).is_some_and(|(m, _)| m >= FORK_COW_PYTHON_MIN_PAGES));
            let (summary, fix) = if parent_of_firing {
                (
                    format!(
                        "It copied {n} pages ({}) of Python objects it shares with its forked workers: after the \
                         fork its own reads write reference counts (and the collector headers) on shared pages too.",
                        bytes(n * PAGE)
                    ),
                    "The fix of its workers' findings (gc.freeze() before forking; read-only data in arrays) \
                     removes these copies too"
                        .to_string(),
                )
            } else {
                (
                    format!(
                        "It copied {n} pages ({}) of Python objects shared across a fork: reading an object writes \
                         its reference count (and the collector its header), so every page of objects a worker walks \
                         is copied.",
                        bytes(n * PAGE)
                    ),
                    "Call gc.freeze() in the parent just before forking the workers (the collector then leaves the \
                     shared objects alone), and keep the large read-only data in numpy or Arrow arrays (or \
                     multiprocessing.shared_memory) rather than lists, dicts and tuples of Python objects: an \
                     array's data pages hold no reference counts"
                        .to_string(),
                )
            };
            let mut f = finding(s, "fork_cow_python_objects", p.pid, summary, fix);
            ev(&mut f, "cow_python_objects", n);
            if in_arenas > 0 {
                ev(&mut f, "cow_in_parent_arenas", in_arenas);
            }
            ev(&mut f, "cow_from_fork", c.fork);
            ev(&mut f, "cow_faults", p.faults.cow);
            ev(&mut f, "process_faults", p.faults.total);
            ev(&mut f, "copied_bytes", n * PAGE);
            f.expected_gain = Some(format!(
                "up to {} less memory in this process and {n} fewer faults (~{}), with the data in arrays",
                bytes(n * PAGE),
                fmt_ns(time(n))
            ));
            out.push(f);
        } else if worker_of(s, p).is_some()
            && c.fork >= FORK_COW_MIN_PAGES
            && c.fork as f64 >= FORK_COW_MIN_SHARE * p.faults.total as f64
        {
            let n = c.fork;
            let mut f = finding(
                s,
                "fork_cow",
                p.pid,
                format!(
                    "It copied {n} pages ({}) it shared with its parent since the fork: {}% of its faults are \
                     copy-on-write breaks of the parent's memory.",
                    bytes(n * PAGE),
                    pct(n, p.faults.total)
                ),
                "Do not write into memory shared with the parent: keep what workers change (counters, flags, \
                 reference counts) apart from the data they only read, put shared data in MAP_SHARED memory \
                 (shared_memory, a mapped file), or fork before the parent fills it"
                    .into(),
            );
            ev(&mut f, "cow_from_fork", n);
            ev(&mut f, "cow_faults", p.faults.cow);
            ev(&mut f, "process_faults", p.faults.total);
            ev(&mut f, "copied_bytes", n * PAGE);
            f.expected_gain =
                Some(format!("up to {} less memory and {n} fewer faults (~{})", bytes(n * PAGE), fmt_ns(time(n))));
            out.push(f);
        }
    }
}

/// Pages of Python objects `p` copied (its COW in arenas, or for a worker
/// its fork copies at its parent's arena addresses, the larger) and the
/// second of those; `None` without a COW split.
fn python_object_copies(s: &Summary, p: &Process) -> Option<(u64, u64)> {
    let c = p.cow_from.as_ref()?;
    let in_arenas = copies_in_parent_arenas(s, p);
    Some((c.python_objects.max(in_arenas), in_arenas))
}

/// A worker's fork copies at its parent's Python arenas' addresses: for
/// each of its regions that overlaps them, its COW copies of shared pages,
/// at most the overlapped arena pages. A worker's own rows may not name the
/// arenas (docs/design.md, "Python object memory": a child's map is its
/// parent's replayed to the fork, then merged with its own maps read), but
/// the addresses are the parent's.
fn copies_in_parent_arenas(s: &Summary, p: &Process) -> u64 {
    let (Some(regions), Some((_, ppid))) = (&s.regions, worker_of(s, p)) else { return 0 };
    let span = |r: &super::RegionSummary| {
        let h = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap_or(0);
        (h(&r.start), h(&r.end))
    };
    let arenas: Vec<(u64, u64)> =
        regions.iter().filter(|r| r.pid == ppid && r.kind == RegionKind::PythonArena).map(span).collect();
    let mut copies = 0;
    for r in regions.iter().filter(|r| r.pid == p.pid && r.kind.is_anon_like()) {
        let fork = r.cow_from.map_or(0, |c| c.fork);
        if fork == 0 {
            continue;
        }
        let (a, b) = span(r);
        let overlap: u64 = arenas.iter().map(|&(x, y)| y.min(b).saturating_sub(x.max(a))).sum::<u64>() / PAGE;
        copies += fork.min(overlap);
    }
    copies
}

/// Shootdown storms, one finding per process, with what drove them: the
/// syscall behind most IPIs and the process's own munmap/madvise counts.
fn storms(s: &Summary, out: &mut Vec<Finding>) {
    let Some(storms) = &s.storms else { return };
    let mut by_pid: BTreeMap<u32, Vec<&super::Storm>> = BTreeMap::new();
    for st in storms {
        by_pid.entry(st.pid).or_default().push(st);
    }
    for (pid, list) in by_pid {
        let ipis: u64 = list.iter().map(|st| st.shootdowns).sum();
        let peak = list.iter().map(|st| st.peak_per_s).max().unwrap_or(0);
        let seconds: f64 = list.iter().map(|st| st.end_s - st.start_s).sum();
        let Some(biggest) = list.iter().max_by_key(|st| st.shootdowns) else { continue };
        let mut calls: BTreeMap<&str, u64> = BTreeMap::new();
        for st in &list {
            *calls.entry(st.top_call.as_str()).or_default() += st.shootdowns;
        }
        let call = calls.iter().max_by_key(|(_, n)| **n).map_or("?", |(c, _)| *c).to_string();
        let p = s.processes.iter().find(|p| p.pid == pid);
        let m = p.and_then(|p| p.mmap.as_ref());
        let site = super::oom::site_tail(&biggest.top_stack);
        let settings = list.iter().map(|st| &st.malloc_settings).find(|m| !m.is_empty());
        let (why, fix, low_threshold) = storm_cause(&call, m, settings);
        let mut f = finding(
            s,
            "shootdown_storm",
            pid,
            format!(
                "{} shootdown storm{} ({ipis} TLB-flush IPIs over {seconds:.2} s, peak {peak}/s), driven by {why}.",
                list.len(),
                if list.len() == 1 { "" } else { "s" }
            ),
            fix,
        );
        if f.comm.is_empty() {
            f.comm.clone_from(&biggest.comm);
        }
        ev(&mut f, "storms", list.len() as u64);
        ev(&mut f, "storm_ipis", ipis);
        ev(&mut f, "peak_ipis_per_s", peak);
        ev(&mut f, "storm_seconds", (seconds * 100.0).round() / 100.0);
        ev(&mut f, "top_call", call.clone());
        ev(&mut f, "top_call_share", (biggest.top_share * 100.0).round() / 100.0);
        if let Some(m) = m {
            ev(&mut f, "munmap_calls", m.munmap);
            ev(&mut f, "munmap_bytes", m.munmap_bytes);
            ev(&mut f, "madvise_calls", m.madvise);
        }
        if let Some(t) = p.and_then(|p| p.tlb.as_ref()) {
            ev(&mut f, "ipis_sent", t.ipis_sent);
        }
        if let Some((_, set)) = low_threshold {
            ev(&mut f, "malloc_setting", set);
        }
        f.site = (!site.is_empty()).then_some(site);
        f.expected_gain = Some(format!(
            "the {ipis} IPIs of the storms (each interrupts every other CPU running this process), and the {call} \
             calls' time in the kernel"
        ));
        out.push(f);
    }
}

/// What drove a storm whose IPIs came mostly from `call`, and its fix; with
/// the allocator setting of the environment that caused it (the threshold
/// and the text to quote), if one did.
fn storm_cause(
    call: &str,
    m: Option<&super::MmapCounts>,
    settings: Option<&BTreeMap<String, String>>,
) -> (String, String, Option<(u64, String)>) {
    // The threshold its environment fixed, when it is low enough that the
    // blocks it unmaps were mapped because of it.
    let mut low_threshold = None;
    let (why, fix) = match (call, m) {
        ("munmap", Some(m)) if m.munmap > 0 => {
            let avg = m.munmap_bytes / m.munmap;
            let setting = pow2_at_least(avg * 2, 2 * GLIBC_MMAP_THRESHOLD_DEFAULT);
            // glibc's own threshold, where no other allocator is preloaded,
            // and one glibc accepts (at most its maximum).
            low_threshold = settings
                .filter(|m| !m.contains_key("LD_PRELOAD"))
                .and_then(crate::malloc_env::mmap_threshold)
                .filter(|(v, _)| *v <= avg && *v <= GLIBC_MMAP_THRESHOLD_MAX);
            let raise = if setting <= GLIBC_MMAP_THRESHOLD_MAX {
                format!(", or raise it to MALLOC_MMAP_THRESHOLD_={setting}")
            } else {
                String::new()
            };
            let env = if let Some((_, set)) = &low_threshold {
                format!(
                    "remove {set} from its environment (a fixed threshold also stops glibc from raising it past \
                     the blocks it has freed){raise}, so freed buffers go back to the heap; "
                )
            } else if setting <= GLIBC_MMAP_THRESHOLD_MAX {
                format!(
                    "if they are malloc'd (glibc maps blocks of M_MMAP_THRESHOLD and more, 128 KiB by default, \
                     and a low MALLOC_MMAP_THRESHOLD_ makes it so for smaller ones), raise the threshold above \
                     them: MALLOC_MMAP_THRESHOLD_={setting} (or mallopt(M_MMAP_THRESHOLD, {setting})), so freed \
                     buffers go back to the heap; "
                )
            } else {
                String::new()
            };
            let cause = low_threshold.as_ref().map_or(String::new(), |(v, set)| {
                format!(
                    ", because its environment sets {set}: glibc maps every block of {} and more and unmaps it \
                     when it is freed",
                    bytes(*v)
                )
            });
            (
                format!("temporaries freed with munmap: {} munmap calls of {} on average{cause}", m.munmap, bytes(avg)),
                format!(
                    "Stop unmapping a buffer per iteration: {env}otherwise allocate the buffer once outside the \
                     loop and reuse it (a preallocated array, out= arguments, a buffer pool)"
                ),
            )
        }
        ("madvise", Some(m)) => {
            let advice: Vec<String> = m.madvise_by_advice.iter().map(|(k, v)| format!("{k} {v}")).collect();
            (
                format!("pages given back with madvise ({} calls: {})", m.madvise, advice.join(", ")),
                "Give memory back less often: an allocator's purge (jemalloc \
                 MALLOC_CONF=dirty_decay_ms:10000,muzzy_decay_ms:10000; tcmalloc's release rate; glibc's \
                 MALLOC_TRIM_THRESHOLD_) or the code's own MADV_DONTNEED per iteration; reuse the buffers instead"
                    .into(),
            )
        }
        ("mprotect", _) => (
            "permission changes (mprotect) on memory other CPUs use".into(),
            "Change protections in batches, or not per iteration (guard pages made once, a JIT writing code in \
             larger pieces)"
                .into(),
        ),
        (c, _) => (
            format!("{c} on memory other CPUs use"),
            "Unmap and remap less often: reuse mappings across iterations".into(),
        ),
    };
    (why, fix, low_threshold)
}

/// A cold file read at random or in small pieces through a mapping: most
/// of its faults wait for the disk, each for a few pages.
fn cold_files(s: &Summary, out: &mut Vec<Finding>) {
    let Some(files) = &s.files else { return };
    for file in files {
        let majors = file.faults.major;
        if majors < FILE_MIN_MAJORS || (majors as f64) < FILE_MIN_MAJOR_SHARE * file.faults.total as f64 {
            continue;
        }
        // A file mapped executable is a program or a library the loader
        // mapped, not data the program reads: its majors are
        // `code_major_faults`' (and read-ahead advice does not apply).
        let code = s.regions.iter().flatten().any(|r| {
            r.path.as_deref() == Some(file.path.as_str()) && r.kind == RegionKind::File && r.perms.contains('x')
        });
        if code {
            continue;
        }
        // The process with most of its majors.
        let pid = s
            .regions
            .iter()
            .flatten()
            .filter(|r| r.path.as_deref() == Some(file.path.as_str()))
            .fold(BTreeMap::<u32, u64>::new(), |mut m, r| {
                *m.entry(r.pid).or_default() += r.faults.major;
                m
            })
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map_or(0, |(pid, _)| pid);
        let per_major = ratio(file.page_cache_added, majors);
        let advice = s
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.mmap.as_ref())
            .map(|m| m.madvise_by_advice.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "));
        let random_advised = s
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.mmap.as_ref())
            .is_some_and(|m| m.madvise_by_advice.contains_key("random"));
        let mut f = finding(
            s,
            "cold_file_random_reads",
            pid,
            format!(
                "{}: {majors} of its {} faults waited for the disk ({}% major, {per_major} pages read per major), \
                 {} in all: a cold file read through a mapping at random or in small pieces.",
                file.path,
                file.faults.total,
                pct(majors, file.faults.total),
                fmt_ns(file.faults.major_time_ns)
            ),
            format!(
                "Read it in large sequential pieces: {}madvise(MADV_SEQUENTIAL) on the mapping, or MADV_WILLNEED \
                 (posix_fadvise(POSIX_FADV_WILLNEED)) on the part about to be used, before touching it; on a \
                 network file system read it with pread/read in MiB pieces instead of mmap; a larger readahead \
                 (blockdev --setra, /sys/block/DEV/queue/read_ahead_kb) helps sequential reads",
                if random_advised { "drop MADV_RANDOM, use " } else { "" }
            ),
        );
        ev(&mut f, "path", file.path.clone());
        ev(&mut f, "major_faults", majors);
        ev(&mut f, "faults", file.faults.total);
        ev(&mut f, "major_time_ns", file.faults.major_time_ns);
        ev(&mut f, "page_cache_added", file.page_cache_added);
        ev(&mut f, "readahead_pages", file.readahead_pages);
        ev(&mut f, "pages_per_major", per_major);
        ev(&mut f, "from_disk_bytes", file.from_disk_bytes);
        ev(&mut f, "file_bytes", file.file_bytes);
        if let Some(a) = advice.filter(|a| !a.is_empty()) {
            ev(&mut f, "madvise", a);
        }
        let pages = file.from_disk_bytes / PAGE;
        let seq_majors = pages.div_ceil(FILE_READAHEAD_PAGES).max(1);
        if seq_majors < majors {
            f.expected_gain = Some(format!(
                "read in {} pieces, the {} it read from disk take about {seq_majors} waits instead of {majors} \
                 (of {} in all)",
                bytes(FILE_READAHEAD_PAGES * PAGE),
                bytes(file.from_disk_bytes),
                fmt_ns(file.faults.major_time_ns)
            ));
        }
        out.push(f);
    }
}

/// Large anonymous buffers faulted in 4 KiB pages while THP is `madvise`:
/// the program never asked for huge pages. A process that advised either
/// way (MADV_HUGEPAGE, MADV_NOHUGEPAGE) made its choice and is left alone.
fn huge_pages_unused(s: &Summary, out: &mut Vec<Finding>) {
    if s.thp_anon_mode.as_deref() != Some("madvise") {
        return;
    }
    let Some(regions) = &s.regions else { return };
    for p in &s.processes {
        let advised = p.mmap.as_ref().is_some_and(|m| {
            m.madvise_by_advice.contains_key("hugepage") || m.madvise_by_advice.contains_key("nohugepage")
        });
        if advised {
            continue;
        }
        // Regions of at least a huge page, none of whose faults got one.
        let big: Vec<_> = regions
            .iter()
            .filter(|r| {
                r.pid == p.pid
                    && matches!(r.kind, RegionKind::Anon | RegionKind::Heap)
                    && r.folded == 0
                    && r.faults.huge == Some(0)
                    && r.pages_touched >= THP_PAGES
                    // Copies of a parent's pages are 4 KiB whatever the mode.
                    && r.faults.cow * 2 < r.faults.total
            })
            .collect();
        let pages: u64 = big.iter().map(|r| r.pages_touched).sum();
        if pages * PAGE < THP_MIN_TOUCHED_BYTES {
            continue;
        }
        let faults: u64 = big.iter().map(|r| r.faults.total).sum();
        let time: u64 = big.iter().map(|r| r.faults.time_ns).sum();
        let Some(largest) = big.iter().max_by_key(|r| r.pages_touched) else { continue };
        let huge_faults = pages.div_ceil(THP_PAGES);
        let mut f = finding(
            s,
            "huge_pages_unused",
            p.pid,
            format!(
                "{} of anonymous memory ({}) was faulted in 4 KiB pages: {faults} faults, \
                {}. Transparent huge pages are `madvise` here and the program never asked for them.",
                bytes(pages * PAGE),
                match big.len() {
                    1 => format!("one region of {}", bytes(largest.size())),
                    n => format!("{n} regions, the largest {}", bytes(largest.size())),
                },
                fmt_ns(time)
            ),
            "Ask for huge pages on the large buffers: madvise(buf, len, MADV_HUGEPAGE) on a 2 MiB-aligned buffer \
            (posix_memalign(2 MiB) or mmap), before first touch; glibc 2.35+ malloc does it for its own mappings \
            with GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
                .into(),
        );
        ev(&mut f, "anon_bytes_touched", pages * PAGE);
        ev(&mut f, "faults", faults);
        ev(&mut f, "fault_time_ns", time);
        ev(&mut f, "regions", big.len() as u64);
        ev(&mut f, "largest_region_bytes", largest.size());
        ev(&mut f, "thp_anon_mode", "madvise");
        f.expected_gain = Some(format!(
            "about {huge_faults} faults instead of {faults} (each huge fault zeroes 2 MiB, so the time falls by less), \
            and one TLB entry per 2 MiB instead of 512"
        ));
        out.push(f);
    }
}

/// Major faults on code and libraries: executable file pages evicted and
/// read back, a sign that memory is too tight for the working set.
fn code_majors(s: &Summary, out: &mut Vec<Finding>) {
    let Some(regions) = &s.regions else { return };
    for p in &s.processes {
        let code: Vec<_> = regions
            .iter()
            .filter(|r| r.pid == p.pid && r.kind == RegionKind::File && r.perms.contains('x') && r.faults.major > 0)
            .collect();
        let majors: u64 = code.iter().map(|r| r.faults.major).sum();
        let pages: u64 = code.iter().map(|r| r.pages_touched).sum();
        // Under memory pressure: it stalled in reclaim, or code pages were
        // read in more than once (evicted and read back). A cold start's
        // majors, each page read once without a stall, are no finding.
        if majors < CODE_MIN_MAJORS || (p.reclaim.stalls == 0 && majors <= pages) {
            continue;
        }
        let time: u64 = code.iter().map(|r| r.faults.major_time_ns).sum();
        let mut by_path: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &code {
            *by_path.entry(r.path.as_deref().unwrap_or("?")).or_default() += r.faults.major;
        }
        let mut top: Vec<(&str, u64)> = by_path.into_iter().collect();
        top.sort_by_key(|t| std::cmp::Reverse(t.1));
        let names: Vec<String> = top.iter().take(3).map(|(path, n)| format!("{} {n}", short_path(path))).collect();
        let mut f = finding(
            s,
            "code_major_faults",
            p.pid,
            format!(
                "{majors} major faults on code and libraries ({}), {} waiting for the disk: their pages were evicted \
                 while the program ran{}.",
                names.join(", "),
                fmt_ns(time),
                if p.reclaim.stalls > 0 {
                    format!(", and it stalled {} times in reclaim ({})", p.reclaim.stalls, fmt_ns(p.reclaim.time_ns))
                } else {
                    String::new()
                }
            ),
            "Give the job memory for its working set: raise its memory cgroup's limit (memory.max / \
             memory.limit_in_bytes) or protect it (memory.low / memory.min), cut the other memory it holds, or \
             lock the hot libraries (mlockall(MCL_CURRENT), vmtouch -l)"
                .into(),
        );
        ev(&mut f, "code_major_faults", majors);
        ev(&mut f, "code_pages_touched", pages);
        ev(&mut f, "code_major_time_ns", time);
        ev(&mut f, "reclaim_stalls", p.reclaim.stalls);
        ev(&mut f, "reclaim_time_ns", p.reclaim.time_ns);
        if let Some((path, n)) = top.first() {
            ev(&mut f, "top_file", (*path).to_string());
            ev(&mut f, "top_file_majors", *n);
        }
        f.expected_gain = Some(format!("{} of waiting for code to be read back", fmt_ns(time)));
        out.push(f);
    }
}

fn short_path(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Resident memory held by one call site far above the others.
fn resident_sites(s: &Summary, out: &mut Vec<Finding>) {
    let Some(r) = &s.resident else { return };
    let mut by_pid: BTreeMap<u32, Vec<&super::ResidentSite>> = BTreeMap::new();
    // Not the other row (pid 0): its peak is a sum of many processes'
    // peaks, never held at once. Not the bytes no sampled page stood for
    // (`[no page sampled]`, no sampled pages): they are no call site. Not a
    // fork child's pages shared with its parent: they are the parent's, and
    // its site's (summary.json keeps them, per process).
    for site in r
        .top_at_peak
        .iter()
        .filter(|site| site.pid != 0 && site.sampled_pages > 0 && !super::resident::shared_with_parent(&site.frames))
    {
        by_pid.entry(site.pid).or_default().push(site);
    }
    for (pid, mut sites) in by_pid {
        sites.sort_by_key(|site| std::cmp::Reverse(site.bytes));
        let top = sites[0];
        let next = sites.get(1).map_or(0, |n| n.bytes);
        if top.bytes < RESIDENT_MIN_BYTES || (top.bytes as f64) < RESIDENT_DOMINANCE * next as f64 {
            continue;
        }
        let peak = s.processes.iter().find(|p| p.pid == pid).and_then(|p| p.resident.as_ref()).map(|r| r.peak_bytes);
        let site = super::oom::site_tail(&top.frames);
        let mut f = finding(
            s,
            "resident_site_dominant",
            pid,
            format!(
                "One call site held {} at the process's peak{}, {} the next one ({}): {site}.",
                bytes(top.bytes),
                peak.map_or(String::new(), |p| format!(" ({}% of its {})", pct(top.bytes, p), bytes(p))),
                if next == 0 {
                    "with no other site near".to_string()
                } else {
                    format!("{:.0}×", top.bytes as f64 / next as f64)
                },
                bytes(next)
            ),
            "Hold less at that site: free or reuse the buffer once used, load or process the data in pieces, map a \
             file read-only instead of copying it into memory, or keep it in a smaller type"
                .into(),
        );
        if f.comm.is_empty() {
            f.comm.clone_from(&top.comm);
        }
        ev(&mut f, "site_bytes", top.bytes);
        ev(&mut f, "next_site_bytes", next);
        ev(&mut f, "sampled_pages", top.sampled_pages);
        if let Some(p) = peak {
            ev(&mut f, "peak_bytes", p);
        }
        f.site = Some(site);
        out.push(f);
    }
}

/// The findings as summary.txt's opening section.
pub fn render_text(findings: &[Finding]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if findings.is_empty() {
        s.push_str("Findings: none (no rule of docs/findings.md passed its threshold)\n");
        return s;
    }
    let _ = writeln!(s, "Findings ({}):", findings.len());
    for (i, f) in findings.iter().enumerate() {
        let _ = writeln!(s, "{}. [{}] {}: {}", i + 1, f.kind, f.process, f.summary);
        if let Some(site) = &f.site {
            let _ = writeln!(s, "   at: {site}");
        }
        let _ = writeln!(s, "   fix: {}", f.fix);
        if let Some(g) = &f.expected_gain {
            let _ = writeln!(s, "   expected gain: {g}");
        }
        let evidence: Vec<String> = f.evidence.iter().map(|(k, v)| format!("{k}={}", plain(v))).collect();
        let _ = writeln!(s, "   evidence: {}", evidence.join(", "));
    }
    s
}

/// A JSON value as text without quotes around strings.
pub fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// One line per finding, for `top` and the demo's notes.
pub fn one_line(f: &Finding) -> String {
    format!("{} {}: {}", f.kind, f.process, f.summary)
}

#[cfg(test)]
#[path = "findings_tests.rs"]
mod tests;
