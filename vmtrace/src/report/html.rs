//! `report.html`: one self-contained page (no network loads, no scripts):
//! tables, latency histograms and the fault-rate timeline as inline SVG, the
//! flamegraphs as embedded images, and summary.txt in full.
use std::{fmt::Write as _, path::Path};

use super::text;
use crate::model::{fmt_ns, Hist, Summary, Timeline};

pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

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

pub const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1280px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}\
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right}\
td:first-child,th:first-child,td.l,th.l{text-align:left}th{background:#f4f4f4}\
pre{background:#f8f8f8;padding:10px;overflow-x:auto;font-size:12px}img.flame{width:100%;border:1px solid #ddd}\
.note{color:#666}.bad{color:#b00;font-weight:bold}";

/// Bars of a log2 latency histogram.
pub fn histogram_svg(h: &Hist, title: &str) -> String {
    let n = h.count();
    if n == 0 {
        return String::new();
    }
    let first = h.0.iter().position(|&c| c > 0).unwrap_or(0);
    let last = h.0.iter().rposition(|&c| c > 0).unwrap_or(0);
    let max = h.0.iter().copied().max().unwrap_or(1).max(1);
    let (bw, hgt) = (56.0, 140.0);
    let width = (last - first + 1) as f64 * bw + 20.0;
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{}' role='img'><title>{}</title>",
        hgt + 40.0,
        escape(title)
    );
    for (k, i) in (first..=last).enumerate() {
        let c = h.0[i];
        let bh = c as f64 / max as f64 * hgt;
        let x = 10.0 + k as f64 * bw;
        let label = Hist::bucket_bound(i).map_or_else(|| "more".into(), |b| format!("≤{}", fmt_ns(b)));
        let _ = write!(
            svg,
            "<rect x='{x}' y='{}' width='{}' height='{bh}' fill='#e8743b'><title>{label}: {c}</title></rect>\
             <text x='{}' y='{}' font-size='9' text-anchor='middle'>{}</text>\
             <text x='{}' y='{}' font-size='9' text-anchor='middle'>{c}</text>",
            10.0 + hgt - bh,
            bw - 6.0,
            x + bw / 2.0 - 3.0,
            hgt + 24.0,
            escape(&label),
            x + bw / 2.0 - 3.0,
            (10.0 + hgt - bh - 2.0).max(9.0),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Faults per second over the trace, as a line.
pub fn timeline_svg(t: &Timeline) -> String {
    if t.faults.is_empty() || t.faults.iter().all(|&f| f == 0) {
        return String::new();
    }
    let rate: Vec<f64> = t.faults.iter().map(|&f| f as f64 / t.interval_s).collect();
    let max = rate.iter().copied().fold(1.0, f64::max);
    let (w, h) = (1100.0, 160.0);
    let step = w / rate.len().max(2).saturating_sub(1) as f64;
    let pts: Vec<String> = rate
        .iter()
        .enumerate()
        .map(|(i, r)| format!("{:.1},{:.1}", 50.0 + i as f64 * step, 10.0 + h - r / max * h))
        .collect();
    format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' role='img'><title>faults per second</title>\
         <polyline fill='none' stroke='#3b7be8' stroke-width='1.5' points='{}'/>\
         <text x='2' y='16' font-size='10'>{:.0}/s</text><text x='2' y='{}' font-size='10'>0</text>\
         <text x='50' y='{}' font-size='10'>0 s</text><text x='{}' y='{}' font-size='10' text-anchor='end'>{:.1} s</text></svg>",
        w + 60.0,
        h + 34.0,
        pts.join(" "),
        max,
        h + 10.0,
        h + 28.0,
        w + 50.0,
        h + 28.0,
        rate.len() as f64 * t.interval_s
    )
}

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

fn process_table(s: &Summary) -> String {
    let mut t = String::from(
        "<table><tr><th class='l'>pid</th><th class='l'>comm</th><th>faults</th><th>minor</th><th>major</th>\
         <th>write</th><th>COW</th><th>fault time</th><th>p50</th><th>p99</th><th>exit</th></tr>",
    );
    let mut procs: Vec<_> = s.processes.iter().collect();
    procs.sort_by_key(|p| std::cmp::Reverse(p.faults.time_ns));
    for p in procs.iter().take(30) {
        let f = &p.faults;
        let q = |q: f64| f.latency_hist_ns.table_quantile_bound(q).map_or("-".into(), fmt_ns);
        let _ = write!(
            t,
            "<tr><td>{}</td><td class='l'>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>≤{}</td><td>≤{}</td><td>{}</td></tr>",
            p.pid,
            escape(&p.comm),
            f.total,
            f.minor,
            f.major,
            f.write,
            f.cow,
            fmt_ns(f.time_ns),
            q(0.5),
            q(0.99),
            p.exit_code.map_or("running".into(), |c| c.to_string())
        );
    }
    t.push_str("</table>");
    t
}

/// The body of one recording: everything about it, for its own page or a demo section.
pub fn recording_body(s: &Summary, dir: &Path, flame_prefix: &str) -> String {
    let mut b = String::new();
    if s.lost_events > 0 {
        let _ = write!(b, "<p class='bad'>{} events were lost (see drops in summary.json)</p>", s.lost_events);
    }
    b.push_str(&process_table(s));
    if let Some(t) = &s.timeline {
        let svg = timeline_svg(t);
        if !svg.is_empty() {
            let _ = write!(b, "<h3>Fault rate</h3>{svg}");
        }
    }
    let minor = histogram_svg(&s.totals.minor_latency_hist_ns, "minor-fault latency");
    let major = histogram_svg(&s.totals.major_latency_hist_ns, "major-fault latency");
    if !minor.is_empty() || !major.is_empty() {
        let _ = write!(b, "<h3>Fault latency</h3><p>minor faults</p>{minor}");
        if !major.is_empty() {
            let _ = write!(b, "<p>major faults</p>{major}");
        }
    }
    if let Some(regions) = s.regions.as_ref().filter(|r| !r.is_empty()) {
        let _ = write!(
            b,
            "<h3>Top regions</h3><table><tr><th class='l'>pid</th><th class='l'>range</th><th class='l'>kind</th>\
             <th>faults</th><th>major</th><th>COW</th><th>pages faulted in</th><th>fault time</th><th class='l'>path</th></tr>"
        );
        for r in regions.iter().take(15) {
            let _ = write!(
                b,
                "<tr><td>{}</td><td class='l'>{}-{}</td><td class='l'>{:?}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class='l'>{}</td></tr>",
                r.pid,
                r.start,
                r.end,
                r.kind,
                r.faults.total,
                r.faults.major,
                r.faults.cow,
                r.pages_touched,
                fmt_ns(r.faults.time_ns),
                escape(r.path.as_deref().unwrap_or(""))
            );
        }
        b.push_str("</table>");
    }
    for f in s.files.iter().flatten().filter(|f| !f.tensors.is_empty()) {
        let _ = write!(
            b,
            "<h3>Tensors of {}</h3><table><tr><th class='l'>tensor</th><th>faults</th><th>major</th><th>fault time</th><th>pages faulted in</th><th>from disk</th><th>size</th></tr>",
            escape(&f.path)
        );
        for t in &f.tensors {
            let _ = write!(
                b,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&t.name),
                t.faults,
                t.major,
                fmt_ns(t.time_ns),
                t.pages_touched,
                crate::model::bytes(t.from_disk_bytes),
                crate::model::bytes(t.bytes)
            );
        }
        b.push_str("</table>");
    }
    for (file, title) in [
        ("faults.svg", "Page faults by call stack"),
        ("fault-time.svg", "Time in the fault handler by call stack"),
        ("shootdowns.svg", "TLB shootdowns by initiating call site"),
    ] {
        let img = flame_img(dir, file);
        if !img.is_empty() {
            let _ = write!(b, "<h3>{title}</h3>{}", img.replace(file, &format!("{flame_prefix}{file}")));
        }
    }
    let _ = write!(b, "<h3>Summary</h3><pre>{}</pre>", escape(&text::render(s)));
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

/// `report.html` of one recording directory.
pub fn render(s: &Summary, dir: &Path) -> String {
    let target = match s.target.kind.as_str() {
        "command" => s.target.command.as_deref().unwrap_or_default().join(" "),
        "pid" => format!("pid {}", s.target.pid.unwrap_or(0)),
        _ => "the whole system".into(),
    };
    page(&format!("vmtrace: {target} ({:.2} s)", s.duration_s), &recording_body(s, dir, ""))
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

    #[test]
    fn charts_are_empty_without_data_and_escape_text() {
        assert!(histogram_svg(&Hist::default(), "x").is_empty());
        assert!(timeline_svg(&Timeline::default()).is_empty());
        let mut h = Hist::default();
        h.0[1] = 5;
        let svg = histogram_svg(&h, "a<b");
        assert!(svg.contains("a&lt;b") && svg.contains("<rect"));
        let t = Timeline { interval_s: 0.1, faults: vec![10, 20, 0], major: vec![0, 0, 0] };
        assert!(timeline_svg(&t).contains("polyline"));
    }
}
