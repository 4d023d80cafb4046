//! Formatting shared by several outputs (summary.txt, report.html, `top`,
//! the OOM paragraph) and by the collector's naming of processes.

/// A duration for people: "512 ns", "2.0 µs", "1.3 ms", "1.07 s".
pub fn fmt_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// A size for people: "12 KiB", "3.4 MiB", "1.0 GiB".
pub fn bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30))
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// Text for an HTML or SVG page: `&`, `<`, `>` and `"` as entities.
pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A kernel `comm` (NUL-padded bytes) as text.
pub fn comm_str(c: &[u8]) -> String {
    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
    String::from_utf8_lossy(&c[..end]).into_owned()
}

/// `text` cut to `max` characters, with an ellipsis where it was cut: a
/// folded C++ name can still be long (lambdas, `[clone .isra.0]`).
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(max - 1).collect();
        s.push('…');
        s
    }
}
