//! Real torch code (privileged): a stack on every fault of a long training
//! job loses next to nothing, and the outputs of `import torch` stay small
//! and readable (report.html checked in a real browser); a re-recording
//! leaves nothing stale beside its outputs.
mod common;

use std::{path::Path, process::Command};

use common::*;

/// Bytes of every file in `dir`.
fn dir_bytes(dir: &Path) -> (u64, Vec<(String, u64)>) {
    let mut files: Vec<(String, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().map_or(0, |m| m.len())))
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    (files.iter().map(|f| f.1).sum(), files)
}

/// What the collector may take at most on the job below (KiB): it peaked
/// at 3.1 GB (7.8 GB before the tree of frames; docs/performance.md).
const PEAK_KIB: u64 = 4 * 1024 * 1024;

#[test]
fn a_stack_on_every_fault_of_a_torch_job_keeps_them_all() {
    privileged!();
    let Some(python) = torch_python() else { return };
    let stats = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    // 16 epochs of 8 fork workers: ~750k faults, most of them distinct stacks
    // (each Python bytecode offset is its own), 45 times the 16,384 the
    // kernel's stack map holds.
    let (epochs, workers) = (16 / scale().min(8), 8);
    let output = vmtrace()
        .env("VMTRACE_JOB_STATS", stats.path())
        // The collector says its own peak memory at the end.
        .env("RUST_LOG", "warn,vmtrace::record=info,vmtrace::tick=debug")
        .args(["record", "--stack-sample", "1", "--out"])
        .arg(out.path())
        .arg("--")
        .arg(&python)
        .arg(fixture("torch_job.py"))
        .args([epochs.to_string(), workers.to_string()])
        .output()
        .unwrap();
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    // The kernel's own counts: each process of the job wrote its
    // /proc/self/stat minflt + majflt as it exited.
    let mut kernel = 0;
    let mut procs = 0;
    for e in std::fs::read_dir(stats.path()).unwrap().filter_map(Result::ok) {
        if e.path().extension().is_some_and(|x| x == "txt") {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let f: Vec<u64> = text.split_whitespace().map(|w| w.parse().unwrap()).collect();
            kernel += f[2] + f[3];
            procs += 1;
        }
    }
    assert_eq!(procs, 1 + epochs * workers, "a stats file per process");
    let s = &run.summary;
    let st = &s["stacks"];
    // Counts left out of summary.json when 0.
    let n = |k: &str| st[k].as_u64().unwrap_or(0);
    let total = u(&s["totals"]["total"]);
    // vmtrace counts the job's own faults and those of its helpers (ldconfig).
    assert!(total >= kernel, "vmtrace {total} faults, the job's processes {kernel}");
    // Every fault took a stack: kept are those whose stack was stored and
    // counted (a stack not stored is counted under `[no user stack]`).
    let kept = u(&st["sampled_faults"]) - n("lost_not_stored");
    eprintln!(
        "faults: kernel {kernel} (job), vmtrace {total}; stacks kept {kept}, lost {} (not stored {}, not counted {}), \
         {} distinct drained, {} under a shared id",
        st["lost"], st["lost_not_stored"], st["lost_not_counted"], st["drained_stacks"], st["shared_id_faults"]
    );
    assert!(kept as f64 >= 0.99 * kernel as f64, "{kept} stacks kept of the job's {kernel} faults: {st}");
    assert!(kept as f64 >= 0.99 * total as f64, "{kept} stacks kept of {total} faults: {st}");
    assert!(n("drained_stacks") > 16_384, "more stacks than the kernel map holds: {st}");
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let missing = folded_share(&folded, |l| l.contains("[no user stack]"));
    assert!(missing < 0.01, "{:.2}% of the faults without a user stack", missing * 100.0);
    let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    // The frame-pointer note counts only stacks that were stored.
    assert!(n("lost") == 0 || txt.contains("stacks lost:"), "{txt}");
    assert!(st["shallow_user_stacks_pct"].as_f64().unwrap() < 50.0, "{st}");
    // The outputs of ~280k stacks are built from a tree of their frames, not
    // a string per stack: the collector stays well under what that took.
    let stderr = run.stderr();
    let peak_kib: u64 = stderr
        .split("collector peak memory ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the collector's peak memory is logged: {stderr}"));
    eprintln!("collector peak memory {} MiB", peak_kib / 1024);
    assert!(peak_kib < PEAK_KIB, "the collector peaked at {peak_kib} KiB: {stderr}");
}

/// (left, right, picture width) of the title lines of an SVG, as a browser lays them out.
fn title_boxes(svg: &str, scratch: &Path) -> Vec<(String, f64, f64, f64)> {
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
        .expect("headless Chromium is needed to check report.html (cargo xtask test installs the Debian package `chromium`)");
    let inline = &svg[svg.find("<svg").expect("an <svg> element")..];
    let page = scratch.join("titles.html");
    std::fs::write(
        &page,
        format!(
            "<!doctype html><html><body>{inline}<pre id='fit'></pre><script>(() => {{\
             const svg = document.querySelector('svg'); const out = [];\
             for (const id of ['title', 'subtitle']) {{ const t = document.getElementById(id); if (!t) continue;\
             const b = t.getBBox(); out.push(id + ' ' + b.x + ' ' + (b.x + b.width) + ' ' + svg.width.baseVal.value); }}\
             document.getElementById('fit').textContent = out.join('\\n'); }})();</script></body></html>"
        ),
    )
    .unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let fit = dom.split("<pre id=\"fit\">").nth(1).and_then(|r| r.split("</pre>").next()).unwrap_or_default();
    fit.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect()
}

/// Standard base64 (with padding) decoded.
fn unbase64(text: &str) -> Vec<u8> {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().take_while(|&c| c != b'=') {
        let v = T.iter().position(|&t| t == c).unwrap_or_else(|| panic!("not base64: {}", c as char)) as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The SVGs report.html embeds, decoded.
fn embedded_svgs(html: &str) -> Vec<String> {
    html.split("src='data:image/svg+xml;base64,")
        .skip(1)
        .map(|r| String::from_utf8(unbase64(&r[..r.find('\'').unwrap()])).unwrap())
        .collect()
}

#[test]
fn import_torch_writes_small_readable_outputs() {
    privileged!();
    let Some(python) = torch_python() else { return };
    let run = record(&[], &[python.to_str().unwrap(), "-c", "import torch"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let (bytes, files) = dir_bytes(run.out.path());
    // 5 MB when it was set (issue 32); the resident profiles that came
    // after (resident and resident-peak .svg/.folded/.pb.gz, ~1.2 MB here)
    // took an import to 4.4-5.06 MB from run to run (shootdowns.svg alone
    // 68-168 KB): 5,055,220 bytes failed the last suite's first try.
    assert!(bytes <= 6_000_000, "import torch wrote {bytes} bytes: {files:?}");
    // Lines people read stay readable: C++ names folded (`name<…>(…)`).
    let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    let longest = txt.lines().max_by_key(|l| l.chars().count()).unwrap_or_default();
    assert!(longest.chars().count() <= 400, "a {}-character line:\n{longest}", longest.chars().count());
    // Every flamegraph's title lines fit its picture, laid out by a browser.
    let html = std::fs::read_to_string(run.out.path().join("report.html")).unwrap();
    let svgs = embedded_svgs(&html);
    assert!(!svgs.is_empty(), "report.html embeds its flamegraphs");
    for svg in svgs {
        let boxes = title_boxes(&svg, run.out.path());
        assert!(boxes.iter().any(|b| b.0 == "title"), "no title laid out: {boxes:?}");
        for (id, left, right, width) in boxes {
            assert!(left >= 0.0 && right <= width, "{id} spans {left:.0}..{right:.0} px of {width:.0} px");
        }
    }
}

#[test]
fn a_recording_into_an_old_folder_leaves_nothing_stale() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let rec = |extra: &[&str]| {
        let out = vmtrace().arg("record").arg("--out").arg(dir.path()).args(extra).args(["--", "true"]).output();
        let out = out.unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    rec(&["--perfetto"]);
    assert!(dir.path().join("trace.perfetto-trace").is_file());
    // A file of the user's beside the outputs.
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    rec(&["--events", "faults"]);
    assert!(!dir.path().join("trace.perfetto-trace").exists(), "the earlier trace was left");
    // regions.txt and the mmap graphs belong to the earlier run's families.
    for f in ["regions.txt", "mmap.svg", "mmap.folded", "mmap.pb.gz", "shootdowns.svg"] {
        assert!(!dir.path().join(f).exists(), "the earlier {f} was left");
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(), "mine", "not vmtrace's file");
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(!html.contains("trace.perfetto-trace"), "report.html links a trace this recording did not write");
}
