//! `summary.txt`: the summary for people, also printed at exit.
use std::fmt::Write as _;

use crate::model::fmt_ns;
use crate::model::{bytes, Faults, Hist, Summary, BROKEN_CHAIN};
use crate::model::{clip, short_name, TargetKind};

/// Upper bound of the 4× latency bucket holding quantile `q`, as "≤4.1 µs"
/// ("-" when empty, ">1.07 s" for +inf): one scale in every table.
pub(crate) fn fmt_bound(h: &Hist, q: f64) -> String {
    if h.count() == 0 {
        "-".into()
    } else {
        match h.table_quantile_bound(q) {
            Some(b) => format!("≤{}", fmt_ns(b)),
            None => format!(">{}", fmt_ns(Hist::bucket_bound(h.0.len() - 2).unwrap_or(0))),
        }
    }
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        None => "running".into(),
        Some(c) if c > 128 => format!("{c} (signal {})", c - 128),
        Some(c) => c.to_string(),
    }
}

fn row(out: &mut String, pid: &str, (comm, w): (&str, usize), f: &Faults, exit: &str) {
    use crate::model::faults::{UNCOUNTED_COW, UNCOUNTED_WRITE};
    // A count the probes cannot take is "-", not a 0 that reads as measured.
    let counted = |bit: u8, v: u64| f.shown(bit, v, |v| v.to_string());
    let line = format!(
        "{pid:>7}  {comm:<w$} {:>10} {:>10} {:>8} {:>10} {:>8} {:>10} {:>9} {:>9}  {exit}",
        f.total,
        f.minor,
        f.major,
        counted(UNCOUNTED_WRITE, f.write),
        counted(UNCOUNTED_COW, f.cow),
        fmt_ns(f.time_ns),
        fmt_bound(&f.latency_hist_ns, 0.5),
        fmt_bound(&f.latency_hist_ns, 0.99),
    );
    let _ = writeln!(out, "{}", line.trim_end());
}

fn histogram(out: &mut String, title: &str, h: &Hist) {
    let n = h.count();
    if n == 0 {
        return;
    }
    let _ = writeln!(out, "\n{title} ({n} timed)");
    let max = h.0.iter().copied().max().unwrap_or(1).max(1);
    let first = h.0.iter().position(|&c| c > 0).unwrap_or(0);
    let last = h.0.iter().rposition(|&c| c > 0).unwrap_or(0);
    for i in first..=last {
        let label = Hist::bucket_bound(i).map_or_else(|| "> 1.07 s".to_string(), |b| format!("≤ {}", fmt_ns(b)));
        let bar = "#".repeat(((h.0[i] * 40).div_ceil(max)) as usize);
        let _ = writeln!(out, "  {label:>10} {:>10}  {bar}", h.0[i]);
    }
}

const MAX_ROWS: usize = 30;
/// Shootdown storms listed in summary.txt.
const MAX_STORMS: usize = 20;
/// regions.txt lists this many rows at most: a table people read.
pub const REGIONS_TXT_ROWS: usize = 500;

/// The PID and COMM columns of a process row: its name with its rank, pod
/// and container where known (`python3 [rank 6/8 pod 7a8b9c0d ctr
/// c0ffee001122]`, as the folded files and `top` name it); the "other" row
/// of folded processes says how many it sums.
fn who(p: &crate::model::Process) -> (String, String) {
    if p.folded > 0 {
        ("other".into(), format!("{} processes", p.folded))
    } else {
        (p.pid.to_string(), super::process_name(p).into_owned())
    }
}

/// A COMM column's width: `min` characters, or the longest name in it
/// (names with an identity are longer than a comm's 15 characters).
fn name_width<'a>(names: impl Iterator<Item = &'a str>, min: usize) -> usize {
    names.map(|n| n.chars().count()).max().unwrap_or(0).max(min)
}

/// The folded processes' most common names, for the other row.
fn folded_names(p: &crate::model::Process) -> String {
    let mut names: Vec<(&String, &u64)> = p.folded_comms.iter().collect();
    names.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = names.iter().take(6).map(|(c, n)| format!("{c}×{n}")).collect();
    let more = if names.len() > 6 { ", …" } else { "" };
    format!("under the folding threshold: {}{more}", shown.join(", "))
}

pub fn render(s: &Summary) -> String {
    let mut out = String::new();
    if let Some(f) = &s.findings {
        out.push_str(&crate::model::findings::render_text(f));
        out.push('\n');
    }
    if let Some(l) = &s.code_locations {
        out.push_str(&l.render_text());
        out.push('\n');
    }
    header(&mut out, s);
    process_table(&mut out, s);
    resident_section(&mut out, s);
    regions_section(&mut out, s, 10);
    files_section(&mut out, s);
    perf_section(&mut out, s);
    tlb_section(&mut out, s);
    oom_section(&mut out, s);
    placement_section(&mut out, s);
    stacks_section(&mut out, s);
    histogram(&mut out, "Minor-fault latency", &s.totals.minor_latency_hist_ns);
    histogram(&mut out, "Major-fault latency", &s.totals.major_latency_hist_ns);
    out
}

/// Locked and pinned memory, then NUMA placement (or that there is one node).
fn placement_section(out: &mut String, s: &Summary) {
    if let Some(p) = &s.pinned {
        let t = crate::model::pinned::render_text(p);
        if t.is_empty() {
            let _ = writeln!(out, "\nLocked and pinned memory: none");
        } else {
            out.push('\n');
            out.push_str(&t);
        }
    }
    if let Some(n) = &s.numa {
        out.push('\n');
        out.push_str(&crate::model::numa::render_text(n));
    }
    migration_section(out, s);
}

/// Page migrations the traced processes ran, and NUMA balancing's task
/// moves (`--events oom`).
fn migration_section(out: &mut String, s: &Summary) {
    if s.oom.is_none() {
        return;
    }
    let (rows, n) = crate::model::summary::migrating(&s.processes, 10);
    if rows.is_empty() {
        let _ = writeln!(out, "\nPage migrations: {}", crate::model::summary::no_migrations(&s.probes));
        return;
    }
    let _ = writeln!(out, "\nPage migrations (run by the process's threads, whoever's pages they moved):");
    for p in rows {
        let _ = writeln!(out, "  pid {} {}: {}", p.pid, p.comm, p.migration.describe());
    }
    if n > 10 {
        let _ = writeln!(out, "  … and {} more processes", n - 10);
    }
}

/// Resident memory: the call sites holding the most at their process's
/// peak first, then each process's end and peak (exact, from the kernel).
fn resident_section(out: &mut String, s: &Summary) {
    use crate::model::bytes;
    let (procs, more) = super::resident_rows(s);
    if procs.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nResident memory");
    if let Some(r) = &s.resident {
        if !r.top_at_peak.is_empty() {
            let _ = writeln!(out, "  top call sites at the peak (estimated, 1 in {} faults' pages):", r.sample_period);
            // Not a fork child's pages shared with its parent: the parent's
            // own site holds the same pages.
            for site in r.top_at_peak.iter().filter(|s| !crate::model::resident::shared_with_parent(&s.frames)) {
                let tail = crate::model::oom::site_tail(&site.frames);
                let _ = writeln!(out, "    {:>10}  {} [{}]  {tail}", bytes(site.bytes), site.comm, site.pid);
            }
        }
    }
    if s.drops.page_copies > 0 {
        let _ = writeln!(
            out,
            "  {} sampled pages are under their frame-pointer stack's unwound stacks, not their own (the collector was behind: their stack copies were left out)",
            s.drops.page_copies
        );
    }
    let names: Vec<String> = procs.iter().map(|(p, _)| super::process_name(p).into_owned()).collect();
    let w = name_width(names.iter().map(String::as_str), 16);
    let _ = writeln!(
        out,
        "  {:>8} {:<w$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "PID", "COMM", "END", "PEAK", "ANON", "FILE", "SHARED", "PRIVATE"
    );
    for ((p, r), name) in procs.into_iter().zip(&names) {
        let _ = writeln!(
            out,
            "  {:>8} {:<w$} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            p.pid,
            name,
            bytes(r.end_bytes),
            bytes(r.peak_bytes),
            bytes(r.anon_bytes),
            bytes(r.file_bytes),
            bytes(r.shared_with_parent_bytes),
            bytes(r.private_bytes)
        );
    }
    if more > 0 {
        let _ = writeln!(out, "  {:>8}  ({more} more processes in summary.json)", "…");
    }
}

fn header(out: &mut String, s: &Summary) {
    let target = match s.target.kind {
        TargetKind::Command => format!("command `{}`", s.target.command.as_deref().unwrap_or_default().join(" ")),
        TargetKind::Pid => format!("pid {}", s.target.pid.unwrap_or(0)),
        TargetKind::System => "the whole system".into(),
    };
    let _ = writeln!(out, "vmtrace {} — {target}, {:.2} s, kernel {}", s.vmtrace_version, s.duration_s, s.kernel);
    if let Some(st) = s.target.exit_status {
        let _ = writeln!(out, "exit status: {}", exit_text(Some(st)));
    }
    for line in super::words::probe_lines(s) {
        let _ = writeln!(out, "{line}");
    }
    if let (Some(n), Some(err), Some(pct)) =
        (s.sampling.fast_sample_period, s.sampling.time_error_ns, s.sampling.time_error_pct)
    {
        let _ = writeln!(
            out,
            "latency: every slow fault (slept, huge page, major) timed exactly; fast minor faults 1 in {n} ({} of {}), their time estimated: error ±{:.3} ms ({pct}% of the fault time, one sigma)",
            s.sampling.fast_samples.unwrap_or(0),
            s.sampling.fast_faults.unwrap_or(0),
            err as f64 / 1e6
        );
    } else if s.sampling.minor_latency_period == 0 {
        let _ = writeln!(out, "latency: minor faults not timed (--latency-sample 0): TIME is major faults only");
    } else if s.sampling.minor_latency_period > 1 {
        let _ = writeln!(
            out,
            "latency: minor faults timed 1 in {} (fault time scaled up); majors timed every one",
            s.sampling.minor_latency_period
        );
    }
    if s.lost_events == 0 {
        let _ = writeln!(out, "lost events: 0");
    } else {
        let _ = writeln!(
            out,
            "LOST EVENTS: {} (task events {}, stats map full {}, traced map full {})",
            s.lost_events, s.drops.task_events, s.drops.fault_stats_full, s.drops.traced_full
        );
    }
    if s.drops.untimed_faults > 0 {
        let _ = writeln!(out, "untimed faults: {} (counted, but their start was not seen)", s.drops.untimed_faults);
    }
    if let Some(line) = unended_line(s) {
        let _ = writeln!(out, "{line}");
    }
}

fn process_table(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "\nPage faults by process (p50/p99: upper bounds of 4× latency buckets)");
    let mut procs: Vec<_> = s.processes.iter().collect();
    procs.sort_by(|a, b| b.faults.time_ns.cmp(&a.faults.time_ns).then(a.pid.cmp(&b.pid)));
    procs.truncate(MAX_ROWS.max(procs.len()));
    // Nine rows that all say `git`: their command lines tell them apart.
    let shared = |comm: &str| s.processes.iter().filter(|p| p.comm == comm).nth(1).is_some();
    let any_shared = procs.iter().take(MAX_ROWS).any(|p| shared(&p.comm));
    let names: Vec<(String, String)> = procs.iter().take(MAX_ROWS).map(|p| who(p)).collect();
    let w = name_width(names.iter().map(|(_, n)| n.as_str()), 16);
    let _ = writeln!(
        out,
        "{:>7}  {:<w$} {:>10} {:>10} {:>8} {:>10} {:>8} {:>10} {:>9} {:>9}  {}",
        "PID",
        "COMM",
        "FAULTS",
        "MINOR",
        "MAJOR",
        "WRITE",
        "COW",
        "TIME",
        "p50",
        "p99",
        if any_shared { format!("{:<14}  COMMAND", "EXIT") } else { "EXIT".into() }
    );
    for (p, (pid, comm)) in procs.iter().take(MAX_ROWS).zip(&names) {
        let apart = if shared(&p.comm) { super::words::told_apart(s, p, 60) } else { None };
        let exit = match apart {
            _ if p.folded > 0 => folded_names(p),
            Some(who) => format!("{:<14}  {who}", exit_text(p.exit_code)),
            None => exit_text(p.exit_code),
        };
        row(out, pid, (comm, w), &p.faults, &exit);
    }
    if procs.len() > MAX_ROWS {
        let _ = writeln!(out, "{:>7}  ({} more processes in summary.json)", "…", procs.len() - MAX_ROWS);
    }
    if procs.len() > 1 {
        let n: u64 = procs.iter().map(|p| p.folded.max(1)).sum();
        row(out, "all", (&format!("{n} processes"), w), &s.totals, "");
    }
    if let Some(f) = s.folding.as_ref().filter(|f| f.while_recording > 0) {
        let _ = writeln!(
            out,
            "  {} exited processes under {}% were folded into \"other\" while recording (their stacks are \
             under their names in the flamegraphs; --fold-below 0 keeps each, and the collector's memory then \
             grows with every process seen)",
            f.while_recording, f.below_pct
        );
    }
    if let Some(n) = s.totals.populated.filter(|n| *n > 0) {
        let _ = writeln!(
            out,
            "  and {n} faults the kernel took for them through get_user_pages() (mlock, MAP_POPULATE, \
             MADV_POPULATE_*, pinning): no exception, so in no row above, but in their getrusage counts"
        );
    }
    if let Some(line) = uncounted_line(s.totals.uncounted) {
        let _ = writeln!(out, "  {line}");
    }
    let mut cow = crate::model::CowFrom::default();
    for c in s.processes.iter().filter_map(|p| p.cow_from.as_ref()) {
        cow.add(c);
    }
    cow_line(out, &cow);
}

/// Faults counted at their start whose end was never seen, where every
/// fault is meant to be timed (`--latency-sample 1`, not stratified): said,
/// so a time total short of them does not read as complete. On the
/// perf-event fault end (no fexit: arm64 6.1, lockdown before 6.14) the end
/// events are opened on a command's process after its fork, so the faults it
/// takes between its fork and its exec are counted but not timed.
pub fn unended_line(s: &Summary) -> Option<String> {
    if s.sampling.minor_latency_period != 1 || s.sampling.fast_sample_period.is_some() {
        return None;
    }
    let n = s.totals.total.saturating_sub(s.totals.timed);
    (n > 0).then(|| {
        format!(
            "not timed: {n} of {} faults (their end was not seen: on the perf-event fault end, a command's faults \
             between its fork and its exec, before its end events are opened; or faults in flight at the stop)",
            s.totals.total
        )
    })
}

/// What the "-" columns mean: the counts this kernel's probes cannot take.
pub fn uncounted_line(bits: u8) -> Option<String> {
    use crate::model::faults::{UNCOUNTED_COW, UNCOUNTED_EXEC, UNCOUNTED_WRITE};
    let mut why = Vec::new();
    if bits & (UNCOUNTED_WRITE | UNCOUNTED_EXEC) != 0 {
        why.push(
            "WRITE (and exec) not counted: the fault start is the software event PAGE_FAULTS, which has no access type \
             (arm64 without fentry on handle_mm_fault)",
        );
    }
    if bits & UNCOUNTED_COW != 0 {
        why.push(
            "COW not counted: neither fentry nor a kprobe on do_wp_page attached (arm64; `vmtrace check` says why)",
        );
    }
    (!why.is_empty()).then(|| format!("{} (\"-\"; null in summary.json)", why.join("; ")))
}

/// What the COW faults copied (docs/design.md, "What COW copied").
fn cow_line(out: &mut String, c: &crate::model::CowFrom) {
    if c.total() > 0 {
        let _ = writeln!(
            out,
            "  COW: {} zero-page copies (anonymous memory read, then written), {} copies of pages shared since a fork, {} of private file pages, {} without a copy (write access given back)",
            c.zero_page, c.fork, c.file, c.reused
        );
        if c.other > 0 {
            let _ = writeln!(
                out,
                "  COW: {} copies of other shared pages (KSM, pinned, swap cache) in processes that share nothing since a fork",
                c.other
            );
        }
        if c.python_objects > 0 {
            let _ = writeln!(
                out,
                "  COW in Python object memory (CPython's obmalloc arenas, \"[python arena]\" regions): {} of {} ({:.1}%)",
                c.python_objects,
                c.total(),
                c.python_objects as f64 * 100.0 / c.total() as f64
            );
        }
    }
}

/// Gap between vmtrace's count and the kernel's, in percent of the kernel's.
pub fn gap_pct(ours: u64, kernel: u64) -> f64 {
    (ours as f64 - kernel as f64) * 100.0 / kernel.max(1) as f64
}

/// The likeliest cause of a gap between vmtrace's count and the kernel's,
/// both counted over the same window and process set.
fn gap_cause(s: &Summary, kernel: u64) -> String {
    let ours = s.totals.total + s.totals.populated.unwrap_or(0);
    if s.lost_events > 0 {
        return format!("vmtrace lost {} events (see drops in summary.json)", s.lost_events);
    }
    if ours > kernel {
        // Every fault is counted at its start; the kernel counts at the end
        // only the faults it accounts.
        let unaccounted = ours.saturating_sub(s.totals.timed);
        if s.sampling.minor_latency_period == 1 && unaccounted > 0 {
            return format!(
                "{unaccounted} faults entered the handler and never completed (bad addresses: SIGSEGV, EFAULT)"
            );
        }
        return "faults that entered the handler without being accounted (bad addresses, or in flight at the stop)"
            .into();
    }
    "faults the kernel counted without a fault exception vmtrace sees (none expected: report it)".into()
}

fn perf_section(out: &mut String, s: &Summary) {
    let Some(p) = &s.perf else { return };
    let _ = writeln!(out, "\nKernel counters ({})", p.scope);
    let kernel = p.kernel_minor_faults + p.kernel_major_faults;
    // The faults taken through get_user_pages() have no exception (no row
    // counts them) but are in the kernel's getrusage counts: compared with
    // them in (uc30: kernel 577; vmtrace 569 + 8 populated, a false gap).
    let populated = s.totals.populated.unwrap_or(0);
    let gap = gap_pct(s.totals.total + populated, kernel);
    let _ = writeln!(
        out,
        "  page faults: kernel {kernel} ({} minor, {} major); vmtrace {}{} ({gap:+.2}%){}",
        p.kernel_minor_faults,
        p.kernel_major_faults,
        s.totals.total,
        if populated > 0 { format!(" + {populated} through get_user_pages()") } else { String::new() },
        if gap.abs() > 1.0 { format!("  <-- GAP > 1%: {}", gap_cause(s, kernel)) } else { String::new() }
    );
    let _ = writeln!(out, "  context switches: {}", p.context_switches);
    if p.supported {
        let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), |v| v.to_string());
        let _ = writeln!(
            out,
            "  dTLB load misses {}, store misses {}, iTLB misses {}",
            opt(p.dtlb_load_misses),
            opt(p.dtlb_store_misses),
            opt(p.itlb_misses)
        );
        if let Some(mpki) = p.dtlb_misses_per_kilo_instructions {
            let _ = writeln!(out, "  dTLB misses per 1k instructions: {mpki:.2}");
        }
        if let Some(w) = p.page_walk_cycles_pct {
            let _ = writeln!(out, "  cycles in page walks: {w:.1}%");
        }
        for r in p.tlb_miss_regions.iter().take(5) {
            let _ = writeln!(
                out,
                "  TLB-miss samples {:>8}  pid {} {}-{} {:?} {}",
                r.samples,
                r.pid,
                r.start,
                r.end,
                r.kind,
                r.path.as_deref().unwrap_or("")
            );
        }
    } else {
        let _ = writeln!(out, "  TLB-miss counters: unsupported — {}", p.reason);
    }
}

fn oom_section(out: &mut String, s: &Summary) {
    let Some(ooms) = &s.oom else { return };
    let stalls: Vec<_> = s.processes.iter().filter(|p| p.reclaim.stalls > 0).collect();
    if ooms.is_empty() && stalls.is_empty() {
        let _ = writeln!(out, "\nOOM kills: none");
        return;
    }
    let _ = writeln!(out, "\nOOM kills: {}", ooms.len());
    for r in ooms {
        let _ = writeln!(out, "  {}", crate::model::oom::render(r));
    }
    for p in stalls {
        let _ = writeln!(
            out,
            "  reclaim: pid {} {} stalled {} times, {} in reclaim",
            p.pid,
            p.comm,
            p.reclaim.stalls,
            fmt_ns(p.reclaim.time_ns)
        );
    }
}

fn stacks_section(out: &mut String, s: &Summary) {
    let Some(st) = &s.stacks else { return };
    let sampling = if st.sample_period > 1 {
        format!("1 in {} faults (counts scaled)", st.sample_period)
    } else {
        "every fault".into()
    };
    let _ = writeln!(
        out,
        "\nStacks: {} stacks of {sampling}, {} distinct; flamegraphs: faults.svg, fault-time.svg, major-faults.svg, cow.svg",
        st.mode, st.distinct_stacks
    );
    if st.lost > 0 {
        let _ = writeln!(out, "  {}", lost_line(st));
    }
    if st.python_unnamed_faults > 0 {
        let _ = writeln!(out, "  {}", python_unnamed_line(st));
    }
    if st.python_truncated_faults > 0 {
        let _ = writeln!(
            out,
            "  Python stacks cut short ({} sampled faults, {:.2}%: deeper than the kernel reads, or a frame\n  \
             not readable at the fault): their innermost frames (up to {}) are shown under {}, the outer\n  \
             callers are not.",
            st.python_truncated_faults,
            st.python_truncated_faults as f64 * 100.0 / st.sampled_faults.max(1) as f64,
            vmtrace_common::PY_DEPTH,
            crate::python::TRUNCATED
        );
    }
    // Both are what code built without frame pointers does to a walk: the
    // chain ends at once (shallow), or runs into data (broken, then cut).
    if st.broken_chain_pct >= 1.0 || st.shallow_user_stacks_pct > 50.0 {
        let _ = writeln!(
            out,
            "  NOTE: {:.0}% of user stacks were cut where their frame chain left executable memory (under\n  \
             {}), {:.0}% have at most two frames: code built without frame pointers, so callers are\n  \
             missing (C/C++: -fno-omit-frame-pointer; Rust: -C force-frame-pointers=yes).",
            st.broken_chain_pct, BROKEN_CHAIN, st.shallow_user_stacks_pct
        );
        if st.unwound_samples == 0 {
            let _ = writeln!(out, "  Copied stacks unwind them with their .eh_frame: --stack-window 16 (the default).");
        }
    }
    native_stacks_line(out, st);
}

/// Python frames that could not be named, and why.
fn python_unnamed_line(st: &crate::model::StacksSummary) -> String {
    let mut why = Vec::new();
    if st.python_codes_freed > 0 {
        why.push(format!(
            "{} code objects freed before they were read, their address taken by another ({})",
            st.python_codes_freed,
            crate::python::code::FREED
        ));
    }
    if st.python_codes_unreadable > 0 {
        why.push(format!(
            "{} code objects not readable: the process was gone, or the kernel could not read them ({})",
            st.python_codes_unreadable,
            crate::python::code::UNKNOWN
        ));
    }
    format!(
        "Python frames not named in stacks of {} sampled faults ({:.2}%): {}",
        st.python_unnamed_faults,
        st.python_unnamed_faults as f64 * 100.0 / st.sampled_faults.max(1) as f64,
        why.join("; ")
    )
}

/// What stacks were lost and why (their faults are counted all the same).
fn lost_line(st: &crate::model::StacksSummary) -> String {
    let mut why = Vec::new();
    if st.lost_not_stored > 0 {
        why.push(format!(
            "{} not stored: the stack map filled within one 100 ms drain, or the stack could not be read",
            st.lost_not_stored
        ));
    }
    if st.lost_not_counted > 0 {
        why.push(format!("{} not counted: the per-stack count map filled within one drain", st.lost_not_counted));
    }
    if why.is_empty() {
        why.push("stack map full".into());
    }
    // A stack not stored is counted under `[no user stack]`, one not counted is not.
    let taken = st.sampled_faults + st.lost_not_counted;
    format!(
        "stacks lost: {} of {} taken ({:.2}%; {}); those faults are still counted",
        st.lost,
        taken,
        st.lost as f64 * 100.0 / taken.max(1) as f64,
        why.join("; ")
    )
}

/// How the unwound stacks ended: thread roots reached, cuts by why.
fn native_stacks_line(out: &mut String, st: &crate::model::StacksSummary) {
    if st.unwound_samples == 0 {
        return;
    }
    let pct = |n: u64| n as f64 * 100.0 / st.sampled_faults.max(1) as f64;
    let mut cuts: Vec<(&String, &u64)> = st.cut.iter().collect();
    cuts.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
    let why: Vec<String> = cuts.iter().map(|(k, n)| format!("{k} {:.1}%", pct(**n))).collect();
    let _ = writeln!(
        out,
        "  user stacks: {:.1}% unwound to a thread root{}{} ({} copied stacks unwound)",
        pct(st.reached_root),
        if why.is_empty() { String::new() } else { format!("; cut: {}", why.join(", ")) },
        if st.frame_pointer_only > 0 {
            format!("; {:.1}% by frame pointers alone", pct(st.frame_pointer_only))
        } else {
            String::new()
        },
        st.unwound_samples
    );
    if pct(st.cut.get("window_exhausted").copied().unwrap_or(0)) >= 5.0 {
        let _ =
            writeln!(out, "  hint: stacks deeper than the copied window lose their outer frames: --stack-window 32");
    }
}

fn tlb_section(out: &mut String, s: &Summary) {
    let any_mm = s.processes.iter().any(|p| p.mmap.is_some() || p.tlb.is_some());
    if !any_mm {
        return;
    }
    let _ = writeln!(out, "\nMemory-map calls and TLB");
    // A TLB hook with nothing to attach (arm64's broadcast TLBI): its zeros
    // below are not measurements.
    for p in s.probes.iter().filter(|p| p.what == "TLB flushes" && p.program_type == "none") {
        let why = p.fallback_reason.as_deref().unwrap_or("no hook on this kernel");
        let _ = writeln!(out, "  TLB flushes and shootdown IPIs not recorded: {why}");
    }
    let mut procs: Vec<_> = s.processes.iter().collect();
    procs.sort_by_key(|p| std::cmp::Reverse(p.tlb.as_ref().map_or(0, |t| t.ipis_sent)));
    let w =
        name_width(procs.iter().take(MAX_ROWS).map(|p| who(p).1).collect::<Vec<_>>().iter().map(String::as_str), 16);
    let _ = writeln!(
        out,
        "{:>7}  {:<w$} {:>8} {:>8} {:>10} {:>8} {:>9} {:>9} {:>10} {:>10}  SENT DURING",
        "PID", "COMM", "MMAP", "MUNMAP", "UNMAPPED", "MADVISE", "MPROTECT", "IPIS SENT", "RECEIVED", "LOCAL"
    );
    for p in procs.iter().take(MAX_ROWS) {
        let m = p.mmap.clone().unwrap_or_default();
        let t = p.tlb.clone().unwrap_or_default();
        if m.mmap + m.munmap + m.madvise + m.mprotect + t.ipis_sent + t.remote_shootdown + t.local_shootdown == 0 {
            continue;
        }
        let during: Vec<String> = t.ipis_by_call.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let (pid, comm) = who(p);
        let _ = writeln!(
            out,
            "{:>7}  {:<w$} {:>8} {:>8} {:>10} {:>8} {:>9} {:>9} {:>10} {:>10}  {}",
            pid,
            comm,
            m.mmap,
            m.munmap,
            format!("{} MiB", m.munmap_bytes >> 20),
            m.madvise,
            m.mprotect,
            t.ipis_sent,
            t.remote_shootdown,
            t.local_shootdown + t.local_mm_shootdown,
            during.join(", ")
        );
    }
    let _ = writeln!(out, "  (RECEIVED: flushes other CPUs forced on this process's CPU, not its own doing)");
    if s.drops.mm_sites > 0 {
        let _ = writeln!(
            out,
            "  {} calls counted above are under no call site (the call-site map was full): mmap.folded and shootdowns.folded add up to less",
            s.drops.mm_sites
        );
    }
    if let Some(storms) = &s.storms {
        if storms.is_empty() {
            let _ = writeln!(out, "Shootdown storms: none");
        }
        // A long recording can have thousands: the largest, in time order.
        let mut shown: Vec<&crate::model::Storm> = storms.iter().collect();
        shown.sort_by_key(|st| std::cmp::Reverse(st.shootdowns));
        shown.truncate(MAX_STORMS);
        shown.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
        for st in shown {
            let _ = writeln!(
                out,
                "STORM {:.2}-{:.2} s: pid {} {} sent {} TLB-flush IPIs, peak {}/s; {:.0}% from {} at {}",
                st.start_s,
                st.end_s,
                st.pid,
                st.comm,
                st.shootdowns,
                st.peak_per_s,
                st.top_share * 100.0,
                st.top_call,
                st.top_stack
                    .iter()
                    .rev()
                    .skip(1)
                    .take(4)
                    .map(|f| clip(&short_name(f), 100))
                    .collect::<Vec<_>>()
                    .join(" <- ")
            );
            // Past the native callers shown: the Python code behind them.
            if let Some(py) = crate::python::innermost_python(&st.top_stack) {
                if !st.top_stack.iter().rev().skip(1).take(4).any(|f| f == py) {
                    let py = short_name(py);
                    let _ = writeln!(out, "      in Python: {py}");
                }
            }
        }
        if storms.len() > MAX_STORMS {
            let _ = writeln!(out, "{:>7}  ({} more storms in summary.json)", "…", storms.len() - MAX_STORMS);
        }
    }
}

/// The region table: all of them in regions.txt, the top ones in summary.txt.
pub fn regions_table(out: &mut String, s: &Summary, limit: usize) {
    let Some(regions) = &s.regions else { return };
    let names = super::process_names(s);
    let comm = |pid: u32| names.get(&pid).map_or("?", |n| n.as_ref());
    let w = name_width(regions.iter().take(limit).map(|r| comm(r.pid)), 14);
    let _ = writeln!(
        out,
        "{:>7}  {:<w$} {:<29} {:>9} {:<5} {:<7} {:>9} {:>8} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}  PATH",
        "PID",
        "COMM",
        "RANGE",
        "SIZE",
        "PERMS",
        "KIND",
        "FAULTS",
        "MINOR",
        "MAJOR",
        "COW",
        "HUGE",
        "FAULTED",
        "TIME",
        "p50",
        "p99"
    );
    for r in regions.iter().take(limit) {
        let f = &r.faults;
        // An "other" row has no one range: it says how many rows it sums.
        let (range, size) = if r.folded > 0 {
            (format!("({} regions)", r.folded), "-".to_string())
        } else {
            (format!("{}-{}", r.start, r.end), bytes(r.size()))
        };
        let _ = writeln!(
            out,
            "{:>7}  {:<w$} {:<29} {:>9} {:<5} {:<7} {:>9} {:>8} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9}  {}",
            r.pid,
            comm(r.pid),
            range,
            size,
            r.perms,
            r.kind.label(),
            f.total,
            f.minor,
            f.major,
            f.shown(crate::model::faults::UNCOUNTED_COW, f.cow, |v| v.to_string()),
            f.huge.map_or("-".into(), |h| h.to_string()),
            r.pages_touched,
            fmt_ns(f.time_ns),
            fmt_bound(&f.latency_hist_ns, 0.5),
            fmt_bound(&f.latency_hist_ns, 0.99),
            r.path.as_deref().unwrap_or("")
        );
    }
    if regions.len() > limit {
        let _ = writeln!(out, "{:>7}  ({} more regions)", "…", regions.len() - limit);
    }
    if let Some(f) = s.folding.as_ref().filter(|f| f.regions > 0) {
        let _ = writeln!(
            out,
            "  {} regions under {}% of the faults and of the time are summed in \"(N regions)\" rows (--regions all lists each)",
            f.regions, f.below_pct
        );
    }
    if let Some(p) = &s.region_placement {
        if p.approximate + p.unplaced > 0 {
            let _ = writeln!(
                out,
                "  placement: {} faults in the mapping of their time, {} approximately (a mapping change raced them or was seen late), {} in no known mapping",
                p.exact, p.approximate, p.unplaced
            );
        }
    }
}

fn regions_section(out: &mut String, s: &Summary, limit: usize) {
    let Some(regions) = &s.regions else { return };
    if regions.is_empty() {
        return;
    }
    let all = if regions.len() > REGIONS_TXT_ROWS {
        format!("the first {REGIONS_TXT_ROWS} in regions.txt")
    } else {
        "all in regions.txt".to_string()
    };
    let _ = writeln!(out, "\nTop regions by fault time ({all})");
    regions_table(out, s, limit);
}

/// regions.txt: the regions by fault time, the first [`REGIONS_TXT_ROWS`].
pub fn render_regions(s: &Summary) -> String {
    let mut out = String::from(
        "Faults per memory region, by time in the fault handler (p50/p99: upper bounds of 4× latency buckets; HUGE: faults served by a transparent huge page; FAULTED: pages faulted in, a huge page counting its 512, fault-around pages not)\n",
    );
    regions_table(&mut out, s, REGIONS_TXT_ROWS);
    out
}

fn files_section(out: &mut String, s: &Summary) {
    let Some(files) = &s.files else { return };
    if files.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nFiles (all processes)");
    let _ = writeln!(
        out,
        "  {:>9} {:>8} {:>9} {:>9} {:>10} {:>16}  PATH",
        "FAULTS", "MAJOR", "FAULTED", "READAHEAD", "TIME", "FROM DISK"
    );
    for f in files.iter().take(20) {
        // How much of the file came from disk during the recording.
        let disk = if f.file_bytes > 0 {
            format!(
                "{} {:>3.0}%",
                bytes(f.from_disk_bytes),
                (f.from_disk_bytes as f64 * 100.0 / f.file_bytes as f64).min(100.0)
            )
        } else {
            bytes(f.from_disk_bytes)
        };
        let _ = writeln!(
            out,
            "  {:>9} {:>8} {:>9} {:>9} {:>10} {:>16}  {}",
            f.faults.total,
            f.faults.major,
            f.pages_touched,
            f.readahead_pages,
            fmt_ns(f.faults.time_ns),
            disk,
            f.path
        );
        let mut tensors: Vec<_> = f.tensors.iter().filter(|t| t.faults > 0).collect();
        tensors.sort_by_key(|t| std::cmp::Reverse(t.time_ns));
        for t in tensors.iter().take(8) {
            let _ = writeln!(
                out,
                "      tensor {:<32} {:>8} faults {:>7} major {:>10}  {} of {} from disk",
                t.name,
                t.faults,
                t.major,
                fmt_ns(t.time_ns),
                bytes(t.from_disk_bytes),
                bytes(t.bytes)
            );
        }
    }
}
