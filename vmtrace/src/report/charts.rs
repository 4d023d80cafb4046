//! The report's inline SVG charts: the fault-rate timeline with its axes,
//! and latency histograms that show the time each bucket holds beside its
//! count (a few slow faults can carry most of the time and be invisible bars
//! by count).
use std::fmt::Write as _;

use crate::model::{escape_html as escape, fmt_ns, Hist, Timeline};

/// A round step for about `n` ticks over `0..=max`: 1, 2 or 5 times a power of ten.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10.0 * p)
}

/// 1234 → "1,234"; 12345 → "12.3k"; 1.5e6 → "1.5M" (axis labels).
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Faults per second over the trace: a line over labelled axes (faults/s up,
/// seconds since the start across), majors as a second line when any.
pub fn timeline_svg(t: &Timeline) -> String {
    if t.faults.is_empty() || t.faults.iter().all(|&f| f == 0) {
        return String::new();
    }
    let per_s = |v: &[u64]| -> Vec<f64> { v.iter().map(|&f| f as f64 / t.interval_s).collect() };
    let (rate, major) = (per_s(&t.faults), per_s(&t.major));
    let top = nice_step(rate.iter().copied().fold(1.0, f64::max), 4.0) * 4.0;
    let end_s = rate.len() as f64 * t.interval_s;
    let (x0, y0, width, height) = (64.0, 12.0, 1000.0, 160.0);
    // A point at the middle of its interval.
    let x = |i: usize| x0 + (i as f64 + 0.5) * t.interval_s / end_s * width;
    let y = |r: f64| y0 + height - r / top * height;
    let line = |v: &[f64]| v.iter().enumerate().map(|(i, r)| format!("{:.1},{:.1}", x(i), y(*r))).collect::<Vec<_>>();
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {} {}' class='chart' role='img'>\
         <title>page faults per second over the recording</title>",
        x0 + width + 20.0,
        y0 + height + 44.0
    );
    let ystep = top / 4.0;
    for k in 0..=4 {
        let v = ystep * f64::from(k);
        let _ = write!(
            svg,
            "<line x1='{x0}' x2='{}' y1='{yy:.1}' y2='{yy:.1}' stroke='#e5e5e5'/>\
             <text x='{}' y='{:.1}' font-size='11' text-anchor='end'>{}</text>",
            x0 + width,
            x0 - 6.0,
            y(v) + 4.0,
            short(v),
            yy = y(v)
        );
    }
    let xstep = nice_step(end_s, 8.0);
    let mut s = 0.0;
    while s <= end_s + 1e-9 {
        let xx = x0 + s / end_s * width;
        let _ = write!(
            svg,
            "<line x1='{xx:.1}' x2='{xx:.1}' y1='{}' y2='{}' stroke='#999'/>\
             <text x='{xx:.1}' y='{}' font-size='11' text-anchor='middle'>{}</text>",
            y0 + height,
            y0 + height + 4.0,
            y0 + height + 17.0,
            short((s * 1000.0).round() / 1000.0)
        );
        s += xstep;
    }
    let _ = write!(
        svg,
        "<line x1='{x0}' x2='{x0}' y1='{y0}' y2='{}' stroke='#999'/><line x1='{x0}' x2='{}' y1='{}' y2='{}' stroke='#999'/>\
         <text x='{}' y='{}' font-size='11' text-anchor='middle'>seconds since tracing began ({} ms bins)</text>\
         <text x='12' y='{}' font-size='11' transform='rotate(-90 12 {})' text-anchor='middle'>faults / s</text>\
         <polyline fill='none' stroke='#3b7be8' stroke-width='1.5' points='{}'><title>all faults</title></polyline>",
        y0 + height,
        x0 + width,
        y0 + height,
        y0 + height,
        x0 + width / 2.0,
        y0 + height + 36.0,
        (t.interval_s * 1000.0).round(),
        y0 + height / 2.0,
        y0 + height / 2.0,
        line(&rate).join(" ")
    );
    if major.iter().any(|&m| m > 0.0) {
        let _ = write!(
            svg,
            "<polyline fill='none' stroke='#d0342c' stroke-width='1.5' points='{}'><title>major faults</title></polyline>\
             <text x='{}' y='{}' font-size='11' fill='#d0342c' text-anchor='end'>major faults</text>",
            line(&major).join(" "),
            x0 + width,
            y0 + 10.0
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Time a bucket holds, estimated as its count at the middle of its range
/// (the histogram keeps counts, not sums): the overflow bucket at its floor.
fn bucket_time_ns(i: usize, count: u64) -> f64 {
    let hi = Hist::bucket_bound(i).map_or(0.0, |b| b as f64);
    let lo = if i == 0 { 0.0 } else { Hist::bucket_bound(i - 1).map_or(0.0, |b| b as f64) };
    let mid = if hi == 0.0 { lo } else { f64::midpoint(lo, hi) };
    count as f64 * mid
}

/// A log2 latency histogram: per bucket a bar by count and a bar by the
/// (estimated) time it holds, each scaled to its own largest bucket, with
/// the count and the share of the time written out.
pub fn histogram_svg(hist: &Hist, title: &str) -> String {
    let n = hist.count();
    if n == 0 {
        return String::new();
    }
    let first = hist.0.iter().position(|&c| c > 0).unwrap_or(0);
    let last = hist.0.iter().rposition(|&c| c > 0).unwrap_or(0);
    let times: Vec<f64> = (0..hist.0.len()).map(|i| bucket_time_ns(i, hist.0[i])).collect();
    let total_time: f64 = times.iter().sum::<f64>().max(1.0);
    let max_c = hist.0.iter().copied().max().unwrap_or(1).max(1) as f64;
    let max_t = times.iter().copied().fold(1.0, f64::max);
    let (bw, hgt, top) = (64.0, 120.0, 30.0);
    // Wide enough for the legend even with one bucket.
    let width = ((last - first + 1) as f64 * bw + 20.0).max(260.0);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{}' role='img'><title>{}</title>\
         <rect x='10' y='2' width='9' height='9' fill='#e8743b'/><text x='23' y='10' font-size='10'>faults</text>\
         <rect x='70' y='2' width='9' height='9' fill='#6a51a3'/><text x='83' y='10' font-size='10'>time (≈ count × bucket middle)</text>",
        top + hgt + 46.0,
        escape(title)
    );
    for (k, i) in (first..=last).enumerate() {
        let (count, time) = (hist.0[i], times[i]);
        let x = 10.0 + k as f64 * bw;
        let (hc, ht) = (count as f64 / max_c * hgt, time / max_t * hgt);
        let label = Hist::bucket_bound(i).map_or_else(|| "more".into(), |b| format!("≤{}", fmt_ns(b)));
        let share = time / total_time * 100.0;
        let _ = write!(
            svg,
            "<g><title>{label}: {count} faults, ≈{share:.0}% of the time</title>\
             <rect x='{x}' y='{:.1}' width='27' height='{hc:.1}' fill='#e8743b'/>\
             <rect x='{:.1}' y='{:.1}' width='27' height='{ht:.1}' fill='#6a51a3'/></g>\
             <text x='{:.1}' y='{}' font-size='10' text-anchor='middle'>{}</text>\
             <text x='{:.1}' y='{}' font-size='10' text-anchor='middle'>{count}</text>\
             <text x='{:.1}' y='{}' font-size='10' text-anchor='middle' fill='#6a51a3'>{share:.0}%</text>",
            top + hgt - hc,
            x + 28.0,
            top + hgt - ht,
            x + 27.5,
            top + hgt + 14.0,
            escape(&label),
            x + 27.5,
            top + hgt + 27.0,
            x + 27.5,
            top + hgt + 40.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_empty_without_data_and_escape_text() {
        assert!(histogram_svg(&Hist::default(), "x").is_empty());
        assert!(timeline_svg(&Timeline::default()).is_empty());
        let mut h = Hist::default();
        h.0[1] = 5;
        let svg = histogram_svg(&h, "a<b");
        assert!(svg.contains("a&lt;b") && svg.contains("<rect"));
    }

    #[test]
    fn the_timeline_has_labelled_axes_and_a_point_per_bin() {
        let t = Timeline { interval_s: 0.02, faults: vec![100, 200, 0, 50, 10], major: vec![0, 1, 0, 0, 0] };
        let svg = timeline_svg(&t);
        assert!(svg.contains("faults / s") && svg.contains("seconds since tracing began (20 ms bins)"), "{svg}");
        // 200 faults in 20 ms is 10,000/s: the axis reaches a round 10k or more.
        assert!(svg.contains(">10.0k<") || svg.contains(">12.0k<") || svg.contains(">16.0k<"), "{svg}");
        let points = svg.split("points='").nth(1).unwrap().split('\'').next().unwrap();
        assert_eq!(points.split(' ').count(), 5);
        assert!(svg.contains("major faults"), "majors drawn when there are any");
    }

    #[test]
    fn a_few_slow_faults_show_their_share_of_the_time() {
        let mut h = Hist::default();
        // 10,000 faults of ≤1 µs and 32 of 8–17 ms: by count the slow ones
        // vanish, by time they are nearly all of it.
        h.0[0] = 10_000;
        h.0[14] = 32;
        let svg = histogram_svg(&h, "minor");
        assert!(svg.contains(">32<") && svg.contains(">10000<"), "{svg}");
        assert!(svg.contains("≈99% of the time") || svg.contains("≈100% of the time"), "{svg}");
    }

    #[test]
    fn axis_steps_are_round() {
        assert!((nice_step(128_270.0, 4.0) - 50_000.0).abs() < 1e-6);
        assert!((nice_step(0.3, 8.0) - 0.05).abs() < 1e-9);
        assert!((nice_step(7.0, 8.0) - 1.0).abs() < 1e-9);
    }
}
