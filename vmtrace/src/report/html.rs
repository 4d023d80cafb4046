//! `report.html`: one self-contained page (no network loads, no scripts): a
//! section per finding (processes, OOM kills, storms, the fault rate,
//! latency, regions, files and tensors, flamegraphs) as real tables and
//! inline SVG charts ([`super::charts`]), the flamegraphs as embedded images,
//! and summary.txt in full at the end, folded.
use crate::model::{short_name, TargetKind};
use std::{fmt::Write as _, path::Path};

use super::{
    charts::{histogram_svg, timeline_svg},
    text,
    words::{self, approx, short_cmdline, thousands},
};
use crate::{
    model::{bytes, escape_html as escape, fmt_ns, Summary},
    stacks::flamegraph,
};

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(T[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1280px;padding:0 16px;color:#222}\
h1{font-size:22px;overflow-wrap:anywhere}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}\
h3{font-size:15px}.scroll{overflow-x:auto}\
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right;\
vertical-align:top}td{white-space:nowrap}td:first-child,th:first-child,td.l,th.l{text-align:left}\
th{background:#f4f4f4}td.w{white-space:normal;overflow-wrap:anywhere;min-width:16em;max-width:40em}\
pre{background:#f8f8f8;padding:10px;overflow-x:auto;font-size:12px}pre.wrap{white-space:pre-wrap}img.flame{width:100%;border:1px solid #ddd}\
svg.chart{width:100%;max-width:1100px;height:auto}li.w{overflow-wrap:anywhere}details p{overflow-wrap:anywhere;font-family:monospace;font-size:12px}\
.note{color:#666}.bad{color:#b00;font-weight:bold}\
.finding{border-left:4px solid #c60;background:#fff8f0;padding:2px 12px;margin:10px 0;overflow-wrap:anywhere}.finding p{margin:4px 0}";

/// A flamegraph SVG of `dir` as an embedded image (static; the .svg beside it is interactive).
pub fn flame_img(dir: &Path, file: &str) -> String {
    match std::fs::read(dir.join(file)) {
        Ok(svg) => format!(
            "<p><img class='flame' alt='{file}' src='data:image/svg+xml;base64,{}'></p>\
             <p class='note'>Interactive version: <code>{file}</code> beside this report; folded stacks in <code>{}</code>.</p>",
            base64(&svg),
            file.replace(".svg", ".folded")
        ),
        Err(_) => String::new(),
    }
}

/// Locked and pinned memory, then NUMA placement.
fn placement_sections(s: &Summary) -> String {
    pinned_section(s) + &numa_section(s) + &migration_section(s)
}

/// Page migrations the traced processes ran, and NUMA balancing's task moves.
fn migration_section(s: &Summary) -> String {
    if s.oom.is_none() {
        return String::new();
    }
    let (rows, n) = crate::model::summary::migrating(&s.processes, 20);
    if rows.is_empty() {
        return format!("<h2>Page migrations: {}</h2>", crate::model::summary::no_migrations(&s.probes));
    }
    let mut out = format!("<h2>Page migrations ({n} processes)</h2>");
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            let m = &p.migration;
            let why: Vec<String> = m.pages_by_reason.iter().map(|(k, v)| format!("{k} {}", thousands(*v))).collect();
            vec![
                p.pid.to_string(),
                escape(&super::process_name(p)),
                thousands(m.pages),
                escape(&why.join(", ")),
                thousands(m.failed),
                thousands(m.calls),
                escape(&fmt_ns(m.time_ns)),
                thousands(m.numa_moves),
            ]
        })
        .collect();
    out.push_str(&table(
        &["pid", "l comm", "pages", "l by reason", "failed", "calls", "time", "NUMA task moves"],
        &rows,
    ));
    out.push_str(
        "<p class='note'>Counted for the process whose thread ran the migration (compaction and NUMA balancing \
         stall it), whoever's pages it moved.</p>",
    );
    out
}

/// Locked and pinned memory: each process, the call sites that locked, the calls refused.
fn pinned_section(s: &Summary) -> String {
    let Some(p) = &s.pinned else { return String::new() };
    if p.processes.is_empty() && p.failures.is_empty() {
        return "<h2>Locked and pinned memory: none</h2>".into();
    }
    let mut out = String::from("<h2>Locked and pinned memory</h2>");
    let rows: Vec<Vec<String>> = p
        .processes
        .iter()
        .map(|q| {
            vec![
                q.pid.to_string(),
                escape(&q.comm),
                bytes(q.locked_bytes_peak),
                bytes(q.locked_bytes_last),
                bytes(q.pinned_bytes_peak),
                q.memlock_limit_bytes.map_or_else(|| "unlimited".into(), bytes),
            ]
        })
        .collect();
    out.push_str(&table(&["pid", "l comm", "locked peak", "locked last", "pinned peak", "RLIMIT_MEMLOCK"], &rows));
    let rows: Vec<Vec<String>> = p
        .sites
        .iter()
        .take(20)
        .map(|site| {
            vec![
                site.pid.to_string(),
                escape(&site.call),
                thousands(site.calls),
                bytes(site.bytes),
                thousands(site.failed),
                format!("\u{1}{}", escape(&crate::model::pinned::short_stack(&site.frames))),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str("<h3>Locking call sites</h3>");
        out.push_str(&table(&["pid", "l call", "calls", "bytes", "refused", "l call site (innermost first)"], &rows));
    }
    if !p.failures.is_empty() {
        out.push_str("<ul>");
        for f in &p.failures {
            let _ = write!(out, "<li class='bad'>{:.2} s: {}<br>fix: {}</li>", f.t_s, escape(&f.cause), escape(&f.fix));
        }
        out.push_str("</ul>");
    }
    if let Some(m) = &p.machine {
        let _ = write!(out, "<p class='note'>The machine {}.</p>", escape(&m.describe()));
    }
    out
}

/// NUMA placement, or a plain line that the host has one node.
fn numa_section(s: &Summary) -> String {
    let Some(n) = &s.numa else { return String::new() };
    if let Some(note) = &n.note {
        return format!("<h2>NUMA</h2><p class='note'>{}</p>", escape(note));
    }
    let mut out = format!("<h2>NUMA placement ({} nodes)</h2>", n.nodes);
    let rows: Vec<Vec<String>> = n
        .processes
        .iter()
        .map(|p| {
            let nodes: Vec<String> = p.pages_by_node.iter().map(|(k, v)| format!("{k}: {}", bytes(v * 4096))).collect();
            let pol: Vec<&str> = p.policies.keys().map(String::as_str).collect();
            vec![
                p.pid.to_string(),
                escape(&p.comm),
                escape(&nodes.join(", ")),
                thousands(p.sampled_pages),
                thousands(p.remote_first_touch),
                escape(&pol.join(", ")),
            ]
        })
        .collect();
    out.push_str(&table(
        &["pid", "l comm", "l resident by node", "sampled pages", "remote first touch", "l policy"],
        &rows,
    ));
    if !n.sites.is_empty() {
        let rows: Vec<Vec<String>> = n
            .sites
            .iter()
            .map(|t| {
                let nodes: Vec<String> =
                    t.sampled_by_node.iter().map(|(k, v)| format!("{k}: {}", thousands(*v))).collect();
                vec![
                    t.pid.to_string(),
                    escape(&t.comm),
                    escape(&nodes.join(", ")),
                    thousands(t.remote_first_touch),
                    format!("\u{1}{}", escape(&crate::model::oom::site_tail(&t.frames))),
                ]
            })
            .collect();
        out.push_str("<h3>By call site (sampled pages)</h3>");
        out.push_str(&table(&["pid", "l comm", "l sampled pages by node", "remote first touch", "l call site"], &rows));
    }
    let v: Vec<String> = n.vmstat_delta.iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{k} +{v}")).collect();
    if !v.is_empty() {
        let _ = write!(out, "<p class='note'>/proc/vmstat over the recording: {}</p>", escape(&v.join(", ")));
    }
    out
}

/// A table: header cells (an `l ` prefix: left-aligned text), then rows of
/// preformatted, escaped cells (a cell starting with `\u{1}` wraps).
fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = String::from("<div class='scroll'><table><tr>");
    for h in head {
        match h.strip_prefix("l ") {
            Some(name) => {
                let _ = write!(t, "<th class='l'>{name}</th>");
            }
            None => {
                let _ = write!(t, "<th>{h}</th>");
            }
        }
    }
    t.push_str("</tr>");
    for r in rows {
        t.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let left = head.get(i).is_some_and(|h| h.starts_with("l "));
            match (c.strip_prefix('\u{1}'), left) {
                (Some(w), _) => {
                    let _ = write!(t, "<td class='l w'>{w}</td>");
                }
                (None, true) => {
                    let _ = write!(t, "<td class='l'>{c}</td>");
                }
                (None, false) => {
                    let _ = write!(t, "<td>{c}</td>");
                }
            }
        }
        t.push_str("</tr>");
    }
    t.push_str("</table></div>");
    t
}

/// Text for a cell that may be long (paths, command lines): wraps anywhere.
fn wrapping(s: &str) -> String {
    format!("\u{1}{}", escape(s))
}

fn exit_text(code: Option<i32>) -> String {
    match code {
        None => "running".into(),
        Some(c) if c > 128 => format!("{c} (signal {})", c - 128),
        Some(c) => c.to_string(),
    }
}

fn process_section(s: &Summary) -> String {
    let shared = |comm: &str| s.processes.iter().filter(|p| p.comm == comm).nth(1).is_some();
    let mut procs: Vec<_> = s.processes.iter().collect();
    procs.sort_by(|a, b| b.faults.time_ns.cmp(&a.faults.time_ns).then(a.pid.cmp(&b.pid)));
    let rows: Vec<Vec<String>> = procs
        .iter()
        .take(30)
        .map(|p| {
            let f = &p.faults;
            let cmd = match shared(&p.comm).then(|| super::words::told_apart(s, p, 100)).flatten() {
                Some(who) => wrapping(&who),
                None => String::new(),
            };
            vec![
                p.pid.to_string(),
                escape(&super::process_name(p)),
                thousands(f.total),
                thousands(f.minor),
                thousands(f.major),
                f.shown(crate::model::faults::UNCOUNTED_WRITE, f.write, thousands),
                f.shown(crate::model::faults::UNCOUNTED_COW, f.cow, thousands),
                fmt_ns(f.time_ns),
                escape(&text::fmt_bound(&f.latency_hist_ns, 0.5)),
                escape(&text::fmt_bound(&f.latency_hist_ns, 0.99)),
                exit_text(p.exit_code),
                cmd,
            ]
        })
        .collect();
    let mut head = vec![
        "pid",
        "l comm",
        "faults",
        "minor",
        "major",
        "write",
        "COW",
        "fault time",
        "p50",
        "p99",
        "exit",
        "l command",
    ];
    let mut rows = rows;
    // No shared names: no command column.
    if rows.iter().all(|r| r.last().is_some_and(String::is_empty)) {
        head.pop();
        for r in &mut rows {
            r.pop();
        }
    }
    let mut out = String::from("<h2>Processes</h2>");
    out.push_str(&table(&head, &rows));
    if procs.len() > 30 {
        let _ = write!(out, "<p class='note'>{} more processes in summary.json.</p>", procs.len() - 30);
    }
    out.push_str(
        "<p class='note'>p50/p99: upper bounds of 4× latency buckets, the same scale as the regions'. \
         Where processes share a name, the command line tells them apart, and a worker forked by a traced \
         process of the same program is \"worker N of PPID\".</p>",
    );
    out
}

/// Resident memory: the call sites holding the most at their process's
/// peak first (estimated), then each process's end, peak and kinds, and
/// what it shares with its parent (exact, from the kernel).
fn resident_section(s: &Summary) -> String {
    let (procs, more) = super::resident_rows(s);
    if procs.is_empty() {
        return String::new();
    }
    let mut out = String::from("<h2>Resident memory</h2>");
    if let Some(r) = s.resident.as_ref().filter(|r| !r.top_at_peak.is_empty()) {
        let _ = write!(
            out,
            "<p class='note'>Top call sites at each process's peak (estimated from 1 in {} faults' pages, scaled to \
             the kernel's totals; a site with n sampled pages is within about ±2/√n).</p>",
            r.sample_period
        );
        let rows: Vec<Vec<String>> = r
            .top_at_peak
            .iter()
            .filter(|site| !crate::model::resident::shared_with_parent(&site.frames))
            .map(|site| {
                vec![
                    bytes(site.bytes),
                    format!("{} ({})", site.pid, escape(&site.comm)),
                    wrapping(&crate::model::oom::site_tail(&site.frames)),
                    site.sampled_pages.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(&["bytes", "l process", "l call site", "sampled pages"], &rows));
    }
    let rows: Vec<Vec<String>> = procs
        .iter()
        .map(|(p, r)| {
            vec![
                p.pid.to_string(),
                escape(&super::process_name(p)),
                bytes(r.end_bytes),
                bytes(r.peak_bytes),
                bytes(r.anon_bytes),
                bytes(r.file_bytes),
                bytes(r.shmem_bytes),
                bytes(r.shared_with_parent_bytes),
                bytes(r.private_bytes),
            ]
        })
        .collect();
    out.push_str(&table(
        &["pid", "l comm", "end", "peak", "anon", "file", "shmem", "shared with parent", "private"],
        &rows,
    ));
    if more > 0 {
        let _ = write!(out, "<p class='note'>{more} more processes in summary.json.</p>");
    }
    out
}

fn oom_section(s: &Summary) -> String {
    let Some(ooms) = s.oom.as_ref().filter(|o| !o.is_empty()) else { return String::new() };
    let mib = |kb: u64| format!("{:.1} MiB", kb as f64 / 1024.0);
    // A field the kernel's record lacks (before 6.8) reads 0: not a size.
    let known = |o: &crate::model::OomRecord, field: &str, v: String| if o.known(field) { v } else { "unknown".into() };
    let rows: Vec<Vec<String>> = ooms
        .iter()
        .map(|o| {
            vec![
                format!("{:.2} s", o.time_s),
                format!("{} ({})", o.victim_pid, escape(&o.victim_comm)),
                format!("{} ({})", o.trigger_pid, escape(&o.trigger_comm)),
                escape(&o.constraint),
                wrapping(o.cgroup.as_deref().unwrap_or("")),
                o.cgroup_limit_bytes.map_or_else(String::new, bytes),
                known(o, "anon_rss_kb", mib(o.anon_rss_kb)),
                known(o, "file_rss_kb", mib(o.file_rss_kb)),
                known(o, "shmem_rss_kb", mib(o.shmem_rss_kb)),
                known(o, "oom_score_adj", o.oom_score_adj.to_string()),
                if o.in_target { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    let mut out = format!("<h2>OOM kills: {}</h2>", ooms.len());
    out.push_str(&table(
        &[
            "l at",
            "l victim (killed)",
            "l triggered by",
            "l constraint",
            "l memory cgroup",
            "limit",
            "anon",
            "file",
            "shmem",
            "oom_score_adj",
            "l traced",
        ],
        &rows,
    ));
    // What each victim held, largest first: a list, too long for a cell.
    out.push_str("<ul>");
    for o in ooms {
        let held: Vec<String> = o
            .top_regions
            .iter()
            .flatten()
            .map(|r| format!("{} {}", r.path.as_deref().unwrap_or("[anon]"), mib(r.rss_kb)))
            .collect();
        if !held.is_empty() {
            let _ = write!(
                out,
                "<li class='w'>pid {} ({}) held: {}</li>",
                o.victim_pid,
                escape(&o.victim_comm),
                escape(&held.join(", "))
            );
        }
        if let Some(sites) = o.resident_sites.as_ref().filter(|v| !v.is_empty()) {
            let grew: Vec<String> = sites
                .iter()
                .take(5)
                .map(|site| format!("{} {}", bytes(site.bytes), crate::model::oom::site_tail(&site.frames)))
                .collect();
            let _ = write!(
                out,
                "<li class='w'>pid {} ({}) what grew (resident by call site at the kill, estimated): {}</li>",
                o.victim_pid,
                escape(&o.victim_comm),
                escape(&grew.join(", "))
            );
        }
    }
    out.push_str("</ul>");
    out
}

fn storms_section(s: &Summary) -> String {
    let Some(storms) = s.storms.as_ref().filter(|v| !v.is_empty()) else { return String::new() };
    let rows: Vec<Vec<String>> = storms
        .iter()
        .map(|st| {
            vec![
                format!("{} ({})", st.pid, escape(&st.comm)),
                format!("{:.2}–{:.2} s", st.start_s, st.end_s),
                thousands(st.peak_per_s),
                thousands(st.shootdowns),
                format!("{} ({:.0}%)", escape(&st.top_call), st.top_share * 100.0),
                wrapping(&st.top_stack.iter().rev().take(4).map(|f| short_name(f)).collect::<Vec<_>>().join(" ← ")),
            ]
        })
        .collect();
    format!(
        "<h2>Shootdown storms: {}</h2>{}",
        storms.len(),
        table(&["l process", "l when", "peak IPIs/s", "IPIs", "l from", "l call site (innermost first)"], &rows)
    )
}

fn regions_section(s: &Summary) -> String {
    let Some(regions) = s.regions.as_ref().filter(|r| !r.is_empty()) else { return String::new() };
    let names = super::process_names(s);
    let comm = |pid: u32| names.get(&pid).map_or("?", |n| n.as_ref());
    let rows: Vec<Vec<String>> = regions
        .iter()
        .take(15)
        .map(|r| {
            let f = &r.faults;
            vec![
                r.pid.to_string(),
                escape(comm(r.pid)),
                r.kind.label().to_string(),
                if r.folded > 0 { format!("{} regions", r.folded) } else { bytes(r.size()) },
                escape(&r.perms),
                thousands(f.total),
                thousands(f.major),
                f.shown(crate::model::faults::UNCOUNTED_COW, f.cow, thousands),
                f.huge.map_or_else(|| "-".into(), thousands),
                thousands(r.pages_touched),
                fmt_ns(f.time_ns),
                escape(&text::fmt_bound(&f.latency_hist_ns, 0.5)),
                escape(&text::fmt_bound(&f.latency_hist_ns, 0.99)),
                wrapping(r.path.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    let more = if regions.len() > 15 {
        format!("<p class='note'>{} more in regions.txt.</p>", regions.len() - 15)
    } else {
        String::new()
    };
    format!(
        "<h2>Regions by fault time</h2>{}{more}",
        table(
            &[
                "pid",
                "l comm",
                "l kind",
                "size",
                "l perms",
                "faults",
                "major",
                "COW",
                "huge",
                "pages faulted in",
                "fault time",
                "p50",
                "p99",
                "l path",
            ],
            &rows
        )
    )
}

fn files_section(s: &Summary) -> String {
    let Some(files) = s.files.as_ref().filter(|f| !f.is_empty()) else { return String::new() };
    let rows: Vec<Vec<String>> = files
        .iter()
        .take(20)
        .map(|f| {
            let disk = if f.file_bytes > 0 {
                let pct = (f.from_disk_bytes as f64 * 100.0 / f.file_bytes as f64).min(100.0);
                format!("{} ({pct:.0}%)", bytes(f.from_disk_bytes))
            } else {
                bytes(f.from_disk_bytes)
            };
            vec![
                wrapping(&f.path),
                thousands(f.faults.total),
                thousands(f.faults.major),
                thousands(f.pages_touched),
                thousands(f.readahead_pages),
                fmt_ns(f.faults.time_ns),
                disk,
            ]
        })
        .collect();
    let mut out = format!(
        "<h2>Files (all processes)</h2>{}",
        table(&["l path", "faults", "major", "pages faulted in", "readahead pages", "fault time", "from disk"], &rows)
    );
    for f in files.iter().filter(|f| !f.tensors.is_empty()) {
        let mut tensors: Vec<_> = f.tensors.iter().collect();
        tensors.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(b.faults.cmp(&a.faults)));
        let rows: Vec<Vec<String>> = tensors
            .iter()
            .take(40)
            .map(|t| {
                vec![
                    wrapping(&t.name),
                    thousands(t.faults),
                    thousands(t.major),
                    fmt_ns(t.time_ns),
                    thousands(t.pages_touched),
                    bytes(t.from_disk_bytes),
                    bytes(t.bytes),
                ]
            })
            .collect();
        let _ = write!(
            out,
            "<h3>Tensors of {}</h3>{}",
            escape(&f.path),
            table(&["l tensor", "faults", "major", "fault time", "pages faulted in", "from disk", "size"], &rows)
        );
    }
    out
}

/// "— ≈66.8k faults (estimated from 1 in 16 stacks; 65,710 counted)": what
/// the picture's total is, and how much of it is measured.
fn flame_heading(s: &Summary, dir: &Path, file: &str, title: &str) -> String {
    let folded = std::fs::read_to_string(dir.join(file.replace(".svg", ".folded"))).unwrap_or_default();
    let total = flamegraph::total(&folded);
    let period = s.stacks.as_ref().map_or(1, |st| st.sample_period.max(1));
    let what = match file {
        "resident.svg" | "resident-peak.svg" => return format!("{title} — {}", bytes(total)),
        "mmap.svg" => return format!("{title} — {} calls", thousands(total)),
        "major-faults.svg" => return format!("{title} — {} major faults", thousands(total)),
        "fault-time.svg" if period > 1 => format!("≈{}", fmt_ns(total)),
        "fault-time.svg" => fmt_ns(total),
        "shootdowns.svg" => format!("{} IPIs", thousands(total)),
        _ if period > 1 => format!("{} faults", approx(total)),
        _ => format!("{} faults", thousands(total)),
    };
    let how = match file {
        "shootdowns.svg" => String::new(),
        _ if period > 1 => {
            // The graph's own total, as summary.json counts it.
            let counted = match file {
                "fault-time.svg" => format!("{} measured", fmt_ns(s.totals.time_ns)),
                "cow.svg" => format!("{} counted", thousands(s.totals.cow)),
                _ => format!("{} counted", thousands(s.totals.total)),
            };
            format!(" (estimated from 1 in {period} stacks; {counted})")
        }
        _ => " (a stack on every fault)".into(),
    };
    format!("{title} — {what}{how}")
}

/// The body of one recording: everything about it, for its own page or a demo section.
/// The findings, first on the page: what is wrong, the fix, the evidence.
pub fn findings_section(findings: &[crate::model::Finding]) -> String {
    if findings.is_empty() {
        return "<h2>Findings: none</h2><p class='note'>No rule of docs/findings.md passed its threshold.</p>".into();
    }
    let mut b = format!("<h2>Findings ({})</h2>", findings.len());
    for f in findings {
        let _ = write!(
            b,
            "<div class='finding'><p><b>{}</b> <code>{}</code> — {}</p>",
            escape(&f.process),
            escape(&f.kind),
            escape(&f.summary)
        );
        if let Some(site) = &f.site {
            let _ = write!(b, "<p>At <code>{}</code></p>", escape(site));
        }
        let _ = write!(b, "<p><b>Fix:</b> {}</p>", escape(&f.fix));
        if let Some(g) = &f.expected_gain {
            let _ = write!(b, "<p><b>Expected gain:</b> {}</p>", escape(g));
        }
        let ev: Vec<String> =
            f.evidence.iter().map(|(k, v)| format!("{k} = {}", escape(&crate::model::findings::plain(v)))).collect();
        let _ = write!(b, "<p class='note'>Evidence: {}</p></div>", ev.join(" · "));
    }
    b
}

/// The top code locations by fault time, faults and resident bytes.
fn locations_section(l: &crate::model::CodeLocations) -> String {
    let mut b = String::from(
        "<h2>Top code locations</h2><p class='note'>The Python line, else the first frame of the program's own \
         code (not libc's or the allocator's); estimated from the sampled stacks.</p>",
    );
    let lists: [crate::model::locations::Listed<'_>; 3] = [
        ("By fault time", &l.by_fault_time, fmt_ns),
        ("By faults", &l.by_faults, |v| thousands(v)),
        ("By resident bytes at peak", &l.by_resident, bytes),
    ];
    for (what, list, fmt) in lists {
        if list.is_empty() {
            continue;
        }
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|c| {
                let stripped = if c.no_symbols.is_some() { " (no symbols)" } else { "" };
                vec![
                    format!("{}{stripped}", wrapping(&c.location)),
                    escape(&c.comm),
                    fmt(c.value),
                    format!("{:.1}%", c.share_pct),
                ]
            })
            .collect();
        let _ = write!(b, "<h3>{what}</h3>{}", table(&["l location", "l process", "value", "share"], &rows));
        if what.starts_with("By resident") {
            if let Some(note) = l.resident_shared_note() {
                let _ = write!(b, "<p class='note'>{}</p>", escape(&note));
            }
        }
    }
    for object in l.unsymbolized() {
        let _ = write!(b, "<p class='note'>No symbols: {}</p>", escape(&crate::model::locations::symbols_hint(object)));
    }
    b
}

/// What the page opens with: the findings, then the top code locations.
fn opening(s: &Summary) -> String {
    let mut b = String::new();
    if let Some(f) = &s.findings {
        b.push_str(&findings_section(f));
    }
    if let Some(l) = &s.code_locations {
        b.push_str(&locations_section(l));
    }
    b
}

/// The flamegraphs (as images) and the links to the pprof profiles.
fn flames_section(s: &Summary, dir: &Path, flame_prefix: &str) -> String {
    let mut flames = String::new();
    for (file, title) in [
        ("faults.svg", "Page faults by call stack"),
        ("fault-time.svg", "Time in the fault handler by call stack"),
        ("cow.svg", "Copy-on-write faults by call stack"),
        ("shootdowns.svg", "TLB shootdown IPIs by initiating call site"),
    ] {
        // A graph of nothing says nothing.
        if file == "cow.svg" && s.totals.cow == 0 {
            continue;
        }
        let img = flame_img(dir, file);
        if !img.is_empty() {
            let _ = write!(
                flames,
                "<h3>{}</h3>{}",
                escape(&flame_heading(s, dir, file, title)),
                img.replace(file, &format!("{flame_prefix}{file}"))
            );
        }
    }
    // The others are linked, not embedded: a torch import's mmap.svg alone
    // is 790 KB, and the page is meant to stay small.
    let linked: Vec<String> = [
        ("major-faults.svg", "major faults"),
        ("mmap.svg", "mmap-family calls"),
        ("resident-peak.svg", "resident memory at each process's peak"),
        ("resident.svg", "resident memory at each process's end"),
    ]
    .iter()
    .filter(|(f, _)| dir.join(f).is_file() && (*f != "major-faults.svg" || s.totals.major > 0))
    .map(|(f, what)| {
        format!("<a href='{flame_prefix}{f}'><code>{f}</code></a> ({})", escape(&flame_heading(s, dir, f, what)))
    })
    .collect();
    if !linked.is_empty() {
        let _ = write!(flames, "<p class='note'>Interactive flamegraphs of {}.</p>", linked.join(", "));
    }
    let profiles: Vec<String> = super::GRAPHS
        .iter()
        .map(|g| g.kind.file())
        .filter(|f| dir.join(f).is_file())
        .map(|f| format!("<a href='{flame_prefix}{f}'><code>{f}</code></a>"))
        .collect();
    if !profiles.is_empty() {
        let _ = write!(
            flames,
            "<p class='note'>pprof profiles of the same stacks: {} (<code>go tool pprof -http=: faults.pb.gz</code>, \
             or open them in speedscope, Pyroscope or Grafana).</p>",
            profiles.join(", ")
        );
    }
    flames
}

pub fn recording_body(s: &Summary, dir: &Path, flame_prefix: &str) -> String {
    let mut b = opening(s);
    let status = s.target.exit_status.map(|c| format!(" · exit status {}", exit_text(Some(c)))).unwrap_or_default();
    let _ = write!(
        b,
        "<p>{:.2} s of tracing{status} · {} faults · kernel {} · lost events: {}</p>",
        s.duration_s,
        thousands(s.totals.total),
        escape(&s.kernel),
        s.lost_events
    );
    if s.lost_events > 0 {
        let _ = write!(b, "<p class='bad'>{} events were lost (see drops in summary.json)</p>", s.lost_events);
    }
    if dir.join(crate::export::perfetto::FILE).is_file() {
        let f = crate::export::perfetto::FILE;
        let _ = write!(
            b,
            "<p>Timeline: <a href=\"{flame_prefix}{f}\">{f}</a> (a Perfetto trace: open it in \
             ui.perfetto.dev, “Open trace file”; see the README).</p>"
        );
    }
    let probes = words::probe_lines(s);
    if let Some((head, items)) = probes.split_first() {
        let _ = write!(b, "<p class='note'>{}</p><ul class='note'>", escape(head));
        for i in items {
            let _ = write!(b, "<li>{}</li>", escape(i.trim()));
        }
        b.push_str("</ul>");
    }
    if s.sampling.minor_latency_period > 1 {
        let _ = write!(
            b,
            "<p class='note'>Minor faults timed 1 in {} (fault time scaled up); majors timed every one.</p>",
            s.sampling.minor_latency_period
        );
    }
    b.push_str(&process_section(s));
    b.push_str(&resident_section(s));
    b.push_str(&(oom_section(s) + &placement_sections(s)));
    b.push_str(&storms_section(s));
    if let Some(t) = &s.timeline {
        let svg = timeline_svg(t);
        if !svg.is_empty() {
            let _ = write!(b, "<h2>Fault rate</h2>{svg}");
        }
    }
    let minor = histogram_svg(&s.totals.minor_latency_hist_ns, "minor-fault latency");
    let major = histogram_svg(&s.totals.major_latency_hist_ns, "major-fault latency");
    if !minor.is_empty() || !major.is_empty() {
        b.push_str("<h2>Fault latency</h2>");
        if !minor.is_empty() {
            let _ =
                write!(b, "<h3>Minor faults ({} timed)</h3>{minor}", thousands(s.totals.minor_latency_hist_ns.count()));
        }
        if !major.is_empty() {
            let _ =
                write!(b, "<h3>Major faults ({} timed)</h3>{major}", thousands(s.totals.major_latency_hist_ns.count()));
        }
    }
    b.push_str(&regions_section(s));
    b.push_str(&files_section(s));
    let flames = flames_section(s, dir, flame_prefix);
    if !flames.is_empty() {
        let _ = write!(b, "<h2>Flamegraphs</h2>{flames}");
    }
    let _ = write!(
        b,
        "<details><summary>The text summary (summary.txt)</summary><pre>{}</pre></details>",
        escape(&text::render(s))
    );
    b
}

pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{}</title><style>{STYLE}</style></head>\
         <body><h1>{}</h1>{body}<p class='note'>Written by vmtrace {}.</p></body></html>\n",
        escape(title),
        escape(title),
        env!("CARGO_PKG_VERSION")
    )
}

/// `report.html` of one recording directory. A long command line is elided
/// in the title, and shown whole (wrapped) in a fold below it.
pub fn render(s: &Summary, dir: &Path) -> String {
    let (target, full) = match s.target.kind {
        TargetKind::Command => {
            let cmd = s.target.command.as_deref().unwrap_or_default().join(" ");
            (short_cmdline(&cmd, 100), (cmd.chars().count() > 100).then_some(cmd))
        }
        TargetKind::Pid => (format!("pid {}", s.target.pid.unwrap_or(0)), None),
        TargetKind::System => ("the whole system".into(), None),
    };
    let mut body = String::new();
    if let Some(cmd) = full {
        let _ = write!(
            body,
            "<details><summary>The whole command line ({} characters)</summary><p>{}</p></details>",
            cmd.chars().count(),
            escape(&cmd)
        );
    }
    body.push_str(&recording_body(s, dir, ""));
    page(&format!("vmtrace: {target} ({:.2} s)", s.duration_s), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    /// Each flamegraph's heading gives its own total: the COW graph's
    /// "counted" is the COW faults (totals.cow), not all faults.
    #[test]
    fn each_flamegraph_heading_counts_its_own_total() {
        let mut s: Summary = serde_json::from_str(include_str!("../../tests/golden/summary.json")).expect("golden");
        s.stacks.as_mut().expect("golden has stacks").sample_period = 16;
        (s.totals.total, s.totals.cow, s.totals.major, s.totals.time_ns) = (189_685, 73_332, 293, 1_315_735_832);
        let dir = tempfile::tempdir().unwrap();
        for (stem, total) in [
            ("faults", 189_700),
            ("cow", 73_300),
            ("major-faults", 293),
            ("fault-time", 1_315_000_000),
            ("shootdowns", 16),
        ] {
            std::fs::write(dir.path().join(format!("{stem}.folded")), format!("prog;main {total}\n")).unwrap();
        }
        let heading = |file| flame_heading(&s, dir.path(), file, "T");
        assert_eq!(heading("faults.svg"), "T — ≈189.7k faults (estimated from 1 in 16 stacks; 189,685 counted)");
        assert_eq!(heading("cow.svg"), "T — ≈73.3k faults (estimated from 1 in 16 stacks; 73,332 counted)");
        assert_eq!(heading("major-faults.svg"), "T — 293 major faults");
        assert_eq!(heading("fault-time.svg"), "T — ≈1.31 s (estimated from 1 in 16 stacks; 1.32 s measured)");
        assert_eq!(heading("shootdowns.svg"), "T — 16 IPIs");
    }

    /// A size the kernel's record lacks (before 6.8) reads "unknown", not 0.0 MiB.
    #[test]
    fn an_oom_kills_unknown_sizes_say_unknown() {
        let mut s: Summary = serde_json::from_str(include_str!("../../tests/golden/summary.json")).expect("golden");
        let known = oom_section(&s);
        assert!(known.contains("31.8 MiB") && !known.contains("unknown"), "{known}");
        let o = &mut s.oom.as_mut().expect("golden has a kill")[0];
        o.unknown = ["anon_rss_kb", "file_rss_kb", "shmem_rss_kb", "oom_score_adj"].map(String::from).to_vec();
        (o.anon_rss_kb, o.file_rss_kb) = (0, 0);
        let html = oom_section(&s);
        assert_eq!(html.matches("<td>unknown</td>").count(), 4, "{html}");
        assert!(!html.contains("0.0 MiB"), "{html}");
    }
}
