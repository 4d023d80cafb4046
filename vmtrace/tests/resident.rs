//! Resident memory by call site against what the process itself reads in
//! /proc just before it exits (smaps_rollup, VmHWM).
mod common;

use std::process::Command;

use common::{assert_close, disk_dir, fixture, privileged, record, u};

/// A /proc line's value in kB ("Anonymous:   114792 kB"), as bytes.
fn kb(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.trim_start_matches(':').split_whitespace().next()))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        * 1024
}

/// A folded file's weight on the lines `pred` picks.
fn weight(folded: &str, pred: impl Fn(&str) -> bool) -> u64 {
    folded.lines().filter(|l| pred(l)).filter_map(|l| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok())).sum()
}

/// A C program keeps 64 MiB of malloc'd heap and 48 MiB of mmap, and frees
/// a 96 MiB buffer before its end: the end matches its smaps_rollup, the
/// peak its VmHWM, and the freed buffer's call site holds nothing at the end
/// and its whole size at the peak.
#[test]
fn glibc_heap_and_mmap_at_end_and_peak() {
    privileged!();
    let dir = disk_dir();
    let bin = dir.path().join("resident_heap");
    // -O0: the compiler would drop the freed buffer's malloc/memset/free.
    let ok = Command::new("cc")
        .args(["-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(fixture("resident_heap.c"))
        .status()
        .expect("a C compiler (cc)");
    assert!(ok.success(), "compiling the C workload failed");
    let run = record(&["--stack-sample", "16"], &[bin.to_str().unwrap(), dir.path().to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let own = std::fs::read_to_string(dir.path().join("status.txt")).expect("the workload's status.txt");
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    let r = &run.process(pid)["resident"];
    assert!(r.is_object(), "no resident figures: {:#}", run.process(pid));
    assert_close("resident at the end (anon)", u(&r["anon_bytes"]), kb(&own, "Anonymous"), 5.0);
    assert_close("resident at the end", u(&r["end_bytes"]), kb(&own, "Rss"), 5.0);
    assert_close("peak resident", u(&r["peak_bytes"]), kb(&own, "VmHWM"), 5.0);
    let read = |f: &str| std::fs::read_to_string(run.out.path().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let (end, peak) = (read("resident.folded"), read("resident-peak.folded"));
    let mib = 1u64 << 20;
    let temp = |l: &str| l.contains(";temp_buffer;");
    assert_eq!(weight(&end, temp), 0, "the freed buffer holds nothing at the end:\n{end}");
    assert_close("freed buffer at the peak", weight(&peak, temp), 96 * mib, 10.0);
    assert_close("heap at the end", weight(&end, |l| l.contains(";keep_heap;")), 64 * mib, 10.0);
    assert_close("mmap at the end", weight(&end, |l| l.contains(";keep_mmap;")), 48 * mib, 10.0);
    // The profiles add up to the kernel's totals.
    assert_close("resident.folded total", weight(&end, |_| true), u(&r["end_bytes"]), 1.0);
    for f in ["resident.svg", "resident.pb.gz", "resident-peak.svg", "resident-peak.pb.gz"] {
        assert!(run.out.path().join(f).exists(), "{f} missing");
    }
}
