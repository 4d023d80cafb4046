//! Faults attributed to memory regions, files and tensors (privileged).
mod common;

use common::*;
use serde_json::Value;

fn regions_of(run: &Run, pid: u32) -> Vec<&Value> {
    run.summary["regions"].as_array().expect("regions").iter().filter(|r| r["pid"] == pid).collect()
}

fn size(r: &Value) -> u64 {
    let p = |k: &str| u64::from_str_radix(r[k].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    p("end") - p("start")
}

fn file<'a>(run: &'a Run, path: &str) -> &'a Value {
    run.summary["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("{path} not in files"))
}

#[test]
fn anonymous_region_counts_every_page() {
    privileged!();
    let run = record(&[], &strs(&workload(&["touch", "--mib", "64"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let pid = run.report("first-touch").pid;
    let regions = regions_of(&run, pid);
    let r =
        regions.iter().find(|r| r["kind"] == "anon" && size(r) >= 64 << 20).unwrap_or_else(|| panic!("{regions:#?}"));
    assert_close("faults of the 64 MiB region", u(&r["faults"]["total"]), 64 * 256, 1.0);
    assert_close("pages touched", u(&r["pages_touched"]), 64 * 256, 1.0);
    // Every fault of the process lands in some region.
    let sum: u64 = regions.iter().map(|r| u(&r["faults"]["total"])).sum();
    assert_close("regions add up to the process", sum, u(&run.process(pid)["faults"]["total"]), 1.0);
    assert!(std::fs::read_to_string(run.out.path().join("regions.txt")).unwrap().contains("anon"));
}

#[test]
fn transparent_huge_pages_take_few_faults_each_one_huge() {
    privileged!();
    let small = record(&[], &strs(&workload(&["touch", "--mib", "64"])));
    let huge = record(&[], &strs(&workload(&["touch", "--mib", "64", "--huge"])));
    assert_eq!(huge.code(), Some(0), "{}", huge.stderr());
    let (s, h) = (
        &small.process(small.report("first-touch").pid)["faults"],
        &huge.process(huge.report("first-touch").pid)["faults"],
    );
    assert_eq!(s["huge"], 0, "MADV_NOHUGEPAGE: no huge faults");
    assert!(u(&h["total"]) * 20 < u(&s["total"]), "far fewer faults with THP: {} vs {}", h["total"], s["total"]);
    // THP is on (madvise mode here): 64 MiB in 2 MiB pages, if the kernel had
    // them to give; exactly as many as the workload's smaps shows at its end.
    let n = u(&h["huge"]);
    assert!((16..=32).contains(&n), "{n} huge faults for 64 MiB");
    assert_eq!(n, huge.report("first-touch").huge_pages, "huge faults against /proc/PID/smaps: {h:#}");
    let regions = huge.summary["regions"].as_array().unwrap();
    let r = regions
        .iter()
        .find(|r| r["kind"] == "anon" && r["faults"]["huge"].as_u64() > Some(0))
        .expect("the huge region");
    assert_eq!(u(&r["faults"]["huge"]), n, "{r:#}");
    // The summary's total is the processes' sum (it was null).
    let procs = huge.summary["processes"].as_array().unwrap();
    let sum: u64 = procs.iter().map(|p| u(&p["faults"]["huge"])).sum();
    assert_eq!(u(&huge.summary["totals"]["huge"]), sum);
}

#[test]
fn cold_random_file_reads_are_majors_warm_ones_are_not_and_readahead_shows() {
    privileged!();
    let dir = disk_dir();
    let path = dir.path().join("data.bin");
    assert!(vmtrace().args(["workload", "make-file"]).arg(&path).args(["--mib", "64"]).status().unwrap().success());
    let p = path.to_str().unwrap();
    let cold = record(&[], &strs(&workload(&["file-read", p, "--random", "--stride", "4", "--cold"])));
    assert_eq!(cold.code(), Some(0), "{}", cold.stderr());
    let f = file(&cold, p);
    assert!(u(&f["faults"]["major"]) * 10 >= u(&f["pages_touched"]) * 9, "cold: {f:#}");
    assert_close("pages touched: every 4th", u(&f["pages_touched"]), 64 * 256 / 4, 2.0);
    let warm = record(&[], &strs(&workload(&["file-read", p, "--random", "--stride", "4"])));
    let f = file(&warm, p);
    // ≈ 0 (the kernel also calls a fault major when it had to retry,
    // FAULT_FLAG_TRIED), but for the pages the kernel had to read again: on
    // a busy machine some of the file leaves the page cache between the two
    // runs (the full suite beside three builds: 149 majors of 1,143 faults,
    // and 149 pages added to the cache). The kernel's own count of pages it
    // added to the cache for the file (`mm_filemap_add_to_page_cache`)
    // decides.
    let added = u(&f["page_cache_added"]);
    assert!(u(&f["faults"]["major"]) * 20 <= u(&f["pages_touched"]) + added * 20, "warm: {f:#}");
    let seq = record(&[], &strs(&workload(&["file-read", p, "--cold"])));
    let f = file(&seq, p);
    assert!(u(&f["readahead_pages"]) >= 64 * 256 / 2, "a sequential cold read is mostly readahead: {f:#}");
}

#[test]
fn python_workers_copy_on_write_a_list_but_not_a_bytes_object() {
    privileged!();
    let script = r#"
import os, sys
data = list(range(2_000_000)) if sys.argv[1] == "list" else bytes(64 << 20)
pids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        total = 0
        if isinstance(data, list):
            for x in data:
                total += x
        else:
            total = data.count(1)
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
"#;
    // The interpreter itself, not a launcher script (pyenv shims are bash).
    let out = std::process::Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output();
    let python = String::from_utf8(out.expect("python3 is needed for this test").stdout).unwrap().trim().to_string();
    let cow = |kind: &str| {
        let run = record(&[], &[python.as_str(), "-c", script, kind]);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        let parent = run.summary["target"]["pid"].as_u64().unwrap();
        let workers: Vec<&Value> =
            run.summary["processes"].as_array().unwrap().iter().filter(|p| p["ppid"] == parent).collect();
        assert_eq!(workers.len(), 2, "two workers");
        let per_worker: Vec<u64> = workers.iter().map(|w| u(&w["faults"]["cow"])).collect();
        // The copies of the list land on the workers' anonymous memory: the
        // int objects in CPython's obmalloc arenas, the rest on the heap or
        // anonymous regions (the few of the bytes case are the interpreter's
        // own housekeeping).
        for w in workers.iter().filter(|_| kind == "list") {
            let pid = w["pid"].as_u64().unwrap() as u32;
            let on_data: u64 = regions_of(&run, pid)
                .iter()
                .filter(|r| ["anon", "heap", "python_arena"].iter().any(|k| r["kind"] == *k))
                .map(|r| u(&r["faults"]["cow"]))
                .sum();
            assert!(
                on_data * 10 >= u(&w["faults"]["cow"]) * 9,
                "COW on heap/anon: {on_data} of {}",
                w["faults"]["cow"]
            );
        }
        per_worker
    };
    let list = cow("list");
    let bytes = cow("bytes");
    for (l, b) in list.iter().zip(&bytes) {
        assert!(*l > 5000, "iterating a list writes every object's refcount: {l} COW faults");
        assert!(*b * 10 < *l, "one bytes object: far fewer ({b} vs {l})");
    }
}

#[test]
fn unmapped_mapping_and_short_lived_child_keep_their_faults() {
    privileged!();
    let run = record(&[], &strs(&workload(&["touch", "--mib", "16", "--unmap"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let pid = run.report("first-touch").pid;
    let regions = regions_of(&run, pid);
    // A maps read while it lived may show it merged with a neighbouring anonymous VMA.
    let r = regions
        .iter()
        .find(|r| r["kind"] == "anon" && size(r) >= 16 << 20 && u(&r["faults"]["total"]) >= 16 * 256 * 99 / 100)
        .unwrap_or_else(|| panic!("{regions:#?}"));
    assert_close("faults of the unmapped region", u(&r["faults"]["total"]), 16 * 256, 1.0);

    let run = record(&[], &strs(&workload(&["fork", "--children", "1", "--mib", "8"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let child = run.report("child").pid;
    let regions = regions_of(&run, child);
    let r = regions
        .iter()
        .find(|r| r["kind"] == "anon" && size(r) >= 8 << 20 && u(&r["faults"]["total"]) >= 8 * 256 * 99 / 100)
        .unwrap_or_else(|| panic!("{regions:#?}"));
    assert_close("faults of the exited child's region", u(&r["faults"]["total"]), 8 * 256, 1.0);
}

#[test]
fn safetensors_faults_land_on_their_tensors() {
    privileged!();
    let (_dir, path) = safetensors_on_disk(32);
    let p = path.to_str().unwrap();
    let run = record(&[], &strs(&workload(&["file-read", p, "--random", "--stride", "4", "--cold"])));
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = file(&run, p);
    let tensors = f["tensors"].as_array().expect("tensor view");
    assert_eq!(tensors.len(), 8);
    // Every 4th page of the file was read: a quarter of each 4 MiB tensor's 1024 pages.
    for t in tensors {
        let n = u(&t["faults"]);
        assert!((250..=260).contains(&n), "{}: {n} faults", t["name"]);
        assert_eq!(u(&t["major"]), n, "cold: all majors");
    }
    let sum: u64 = tensors.iter().map(|t| u(&t["faults"])).sum();
    // Only the header page is outside the tensors (shares are rounded per tensor).
    assert!(u(&f["faults"]["total"]).abs_diff(sum) <= 2, "file {} vs tensors {sum}", f["faults"]["total"]);
    let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(txt.contains("tensor lm_head.weight"), "{txt}");
}

/// COW faults split into copies and reuses as the kernel did them: a write
/// after the forked child exited reuses the page (no copy), one while a
/// child lives copies it. The fixture counts the kernel's copies itself from
/// the pages' frame numbers (/proc/self/pagemap) before and after each
/// write; `cow_from` must agree, region by region.
#[test]
fn cow_after_the_child_exited_is_a_reuse_not_a_fork_copy() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_c("cow_after_exit.c", dir.path());
    let run = record(&[], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = String::from_utf8_lossy(&run.output.stdout).to_string();
    // "A 0xSTART PAGES COPIED": the kernel's figures for each buffer.
    let kernel = |name: &str| -> (u64, u64, u64) {
        let line = out.lines().find(|l| l.starts_with(&format!("{name} 0x"))).unwrap_or_else(|| panic!("{out}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        let start = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
        (start, f[2].parse().unwrap(), f[3].parse().unwrap())
    };
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    let rows = regions_of(&run, pid);
    let hex = |r: &Value, k: &str| u64::from_str_radix(r[k].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let row_at = |a: u64| -> &Value {
        rows.iter().copied().find(|r| hex(r, "start") <= a && a < hex(r, "end")).unwrap_or_else(|| panic!("{rows:#?}"))
    };
    let slack = 8;
    let mut kernel_copies = 0;
    for name in ["A", "B"] {
        let (start, pages, copied) = kernel(name);
        kernel_copies += copied;
        // The fixture aligns each buffer to a region granule: a granule shared
        // with the other buffer would have its copies split by page share.
        assert_eq!(start % (1 << vmtrace_common::REGION_GRANULE_SHIFT), 0, "{name} at {start:#x}: {out}");
        let r = row_at(start);
        let c = &r["cow_from"];
        let n = |k: &str| c.get(k).map_or(0, u);
        let ours_copied = n("zero_page") + n("fork") + n("other") + n("file");
        eprintln!(
            "{name}: kernel {copied} of {pages} pages copied, {} reused; vmtrace {} COW faults: {c}",
            pages - copied,
            r["faults"]["cow"]
        );
        assert!(u(&r["faults"]["cow"]).abs_diff(pages) <= slack, "{name}: a COW fault per page written: {r:#}");
        assert!(ours_copied.abs_diff(copied) <= slack, "{name}: kernel copied {copied} pages: {c}");
        assert!(u(&c["reused"]).abs_diff(pages - copied) <= slack, "{name}: kernel reused {}: {c}", pages - copied);
    }
    // The buffers are the process's bulk: its fork copies are the kernel's
    // copies of B (and the few of A), not every COW fault after a fork.
    let p = run.process(pid);
    let fork = u(&p["cow_from"]["fork"]);
    assert!(fork <= kernel_copies + 64, "fork copies {fork}, the kernel copied {kernel_copies}: {:#}", p["cow_from"]);
}

/// A write to anonymous memory that a read mapped to the zero page copies
/// the zero page: the copies are told by their zeroed allocation, not
/// guessed from the reads, and none is taken for a copy of some other
/// shared page. Against the kernel's frames (pagemap).
#[test]
fn zero_page_copies_are_told_by_the_kernel_not_guessed() {
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_c("zero_page_copies.c", dir.path());
    let run = record(&[], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = String::from_utf8_lossy(&run.output.stdout).to_string();
    let f: Vec<&str> =
        out.lines().find(|l| l.starts_with("ZERO 0x")).unwrap_or_else(|| panic!("{out}")).split_whitespace().collect();
    let start = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
    let (pages, zero_mapped, copied): (u64, u64, u64) =
        (f[2].parse().unwrap(), f[3].parse().unwrap(), f[4].parse().unwrap());
    assert_eq!(zero_mapped, pages, "every page read maps the zero page: {out}");
    let pid = run.summary["target"]["pid"].as_u64().unwrap() as u32;
    let rows = regions_of(&run, pid);
    let hex = |r: &Value, k: &str| u64::from_str_radix(r[k].as_str().unwrap().trim_start_matches("0x"), 16).unwrap();
    let r = rows
        .iter()
        .copied()
        .find(|r| hex(r, "start") <= start && start < hex(r, "end"))
        .unwrap_or_else(|| panic!("{rows:#?}"));
    let c = &r["cow_from"];
    let n = |k: &str| c.get(k).map_or(0, u);
    eprintln!(
        "kernel: {zero_mapped} of {pages} pages mapped the zero page, {copied} copied; vmtrace: {c}, faults {}",
        r["faults"]
    );
    let slack = 8;
    assert!(n("zero_page").abs_diff(copied) <= slack, "zero-page copies: kernel {copied}: {c}");
    assert_eq!(n("other") + n("fork") + n("file"), 0, "{c}");
    assert_eq!(n("reused"), 0, "{c}");
}
