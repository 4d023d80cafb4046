//! Numbers for docs/unwind-spike.md, printed by an ignored test:
//! `cargo test --release -p vmtrace --lib stacks::unwind::measure -- --ignored --nocapture`.
use std::{path::Path, time::Instant};

use super::{elf::ObjectInfo, tests::capture, *};

fn median_us(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_us(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e6
}

#[test]
#[ignore = "measurement, prints numbers"]
fn measure() {
    for mode in [&["chain"][..], &["deep", "40"][..], &["qsort"][..]] {
        let cap = capture(mode);
        let mut u = Unwinder::new();
        let space = u.address_space(&cap.maps, None);
        let frames = u.unwind(&space, &cap.sample()).frames.len();
        let warm: Vec<f64> = (0..10_000)
            .map(|_| {
                time_us(|| {
                    std::hint::black_box(u.unwind(&space, &cap.sample()));
                })
            })
            .collect();
        // Rule cache cold, objects cached: a new framehop cache every time.
        let rules_cold: Vec<f64> = (0..2_000)
            .map(|_| {
                u.cache = CacheNative::new();
                time_us(|| {
                    std::hint::black_box(u.unwind(&space, &cap.sample()));
                })
            })
            .collect();
        // Address space built again (per new process), objects cached.
        let space_us: Vec<f64> = (0..200).map(|_| time_us(|| drop(u.address_space(&cap.maps, None)))).collect();
        // Everything cold: objects read from the (page-cached) files.
        let cold: Vec<f64> = (0..50)
            .map(|_| {
                time_us(|| {
                    let mut u = Unwinder::new();
                    let space = u.address_space(&cap.maps, None);
                    std::hint::black_box(u.unwind(&space, &cap.sample()));
                })
            })
            .collect();
        println!(
            "{mode:?}: {frames} frames, window {} B; unwind warm {:.2} µs, rule cache cold {:.2} µs; \
             address space (objects cached) {:.1} µs; all cold {:.0} µs; {:?}",
            cap.stack.len(),
            median_us(warm),
            median_us(rules_cold),
            median_us(space_us),
            median_us(cold),
            u.stats(),
        );
    }
    for path in
        ["/lib/x86_64-linux-gnu/libc.so.6", concat!(env!("HOME"), "/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0")]
    {
        let t = Instant::now();
        match ObjectInfo::load(Path::new(path)) {
            Ok(info) => println!(
                "{path}: {} B of unwind sections (eh_frame {} + hdr {} + debug_frame {}), read in {:.0} µs",
                info.bytes(),
                info.eh_frame.as_ref().map_or(0, |s| s.data.len()),
                info.eh_frame_hdr.as_ref().map_or(0, |s| s.data.len()),
                info.debug_frame.as_ref().map_or(0, |d| d.len()),
                t.elapsed().as_secs_f64() * 1e6
            ),
            Err(e) => println!("{path}: {e}"),
        }
    }
}

/// Python code that captures (through `py_capture` in a ctypes-loaded build
/// of the fixture) at the top level, under a numpy callback and under an
/// object sort's `__lt__`, one directory each.
const PY_SCENARIOS: &str = r#"
import ctypes, os, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1]); out = sys.argv[2]
def cap(name):
    d = os.path.join(out, name); os.makedirs(d, exist_ok=True); lib.py_capture(d.encode())
cap("top")
np.frompyfunc(lambda x: cap("frompyfunc") or x, 1, 1)(np.arange(1))
class K:
    def __init__(s, v): s.v = v
    def __lt__(s, o):
        if s.v == 3 and o.v == 1: cap("sort_lt")
        return s.v < o.v
np.sort(np.array([K(i % 7) for i in range(50)], dtype=object))
"#;

/// How deep a CPython 3.11 stack under numpy is: the smallest window that
/// still unwinds to the thread root, found by bisection. Skips without
/// pyenv's 3.11 or numpy.
#[test]
#[ignore = "measurement, needs pyenv 3.11 with numpy"]
fn measure_python_window() {
    let py = concat!(env!("HOME"), "/.pyenv/versions/3.11.7/bin/python3");
    let dir = tempfile::tempdir().expect("temp dir");
    let so = dir.path().join("cap.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/stacks/unwind/fixtures/capture.c");
    let ok = std::process::Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-DSHARED", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cc failed");
    let run = std::process::Command::new(py).arg("-c").arg(PY_SCENARIOS).arg(&so).arg(dir.path()).output();
    if !run.is_ok_and(|r| r.status.success()) {
        println!("skipped: {py} with numpy not usable");
        return;
    }
    for name in ["top", "frompyfunc", "sort_lt"] {
        let cap = super::tests::read_capture(&dir.path().join(name));
        let mut u = Unwinder::new();
        let space = u.address_space(&cap.maps, None);
        let full = u.unwind(&space, &cap.sample());
        let (mut lo, mut hi) = (0, cap.stack.len());
        while lo < hi {
            let mid = usize::midpoint(lo, hi);
            let s = Sample { regs: cap.regs, stack: &cap.stack[..mid] };
            if u.unwind(&space, &s).stop == Stop::Root {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let in_python = full
            .frames
            .iter()
            .filter(|&&a| {
                crate::procmaps::find(&cap.maps, a)
                    .and_then(|r| r.path.as_deref())
                    .is_some_and(|p| p.contains("libpython"))
            })
            .count();
        let warm: Vec<f64> = (0..2_000)
            .map(|_| {
                time_us(|| {
                    std::hint::black_box(u.unwind(&space, &cap.sample()));
                })
            })
            .collect();
        println!(
            "python {name}: {} frames ({in_python} in libpython), stop {:?}, smallest window reaching the root {lo} B, unwind warm {:.2} µs",
            full.frames.len(),
            full.stop,
            median_us(warm)
        );
    }
}
