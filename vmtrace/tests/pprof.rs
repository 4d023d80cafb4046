//! pprof profiles beside the folded files: `go tool pprof` (Debian's
//! golang-go) reads every one, and its total is its folded file's, as
//! `record` writes them and as `report DIR` rebuilds them (privileged).
mod common;

use std::{path::Path, process::Command};

use common::*;

/// The profiles, the value `-sample_index` picks and pprof's `-unit` for it.
const PROFILES: [(&str, &str, &str); 5] = [
    ("faults", "faults", "count"),
    ("fault-time", "fault_time", "nanoseconds"),
    ("major-faults", "major_faults", "count"),
    ("mmap", "calls", "count"),
    ("shootdowns", "ipis", "count"),
];

/// `go tool pprof -top`'s "… of TOTAL total" for one value of a profile.
fn pprof_total(file: &Path, index: &str, unit: &str) -> u64 {
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", &format!("-sample_index={index}"), &format!("-unit={unit}")])
        .arg(file)
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "go tool pprof {}: {}\n{text}", file.display(), String::from_utf8_lossy(&out.stderr));
    let total = text
        .lines()
        .find_map(|l| l.split(" of ").nth(1)?.strip_suffix(" total"))
        .unwrap_or_else(|| panic!("no total in pprof's output for {}:\n{text}", file.display()));
    total.trim_end_matches("ns").parse().unwrap_or_else(|_| panic!("total {total:?} of {}:\n{text}", file.display()))
}

fn folded_total(dir: &Path, stem: &str) -> u64 {
    let f = std::fs::read_to_string(dir.join(format!("{stem}.folded"))).expect("folded file");
    vmtrace::stacks::flamegraph::total(&f)
}

/// Each file of a directory and its bytes, by name.
fn files_in(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
        })
        .collect()
}

fn check_totals(dir: &Path, when: &str) {
    for (stem, index, unit) in PROFILES {
        let file = dir.join(format!("{stem}.pb.gz"));
        assert!(file.is_file(), "{when}: no {stem}.pb.gz");
        let want = folded_total(dir, stem);
        assert_eq!(pprof_total(&file, index, unit), want, "{when}: {stem}.pb.gz against {stem}.folded");
        if stem != "major-faults" {
            assert!(want > 0, "{when}: {stem}.folded is empty");
        }
    }
}

#[test]
fn every_profile_reads_in_pprof_with_its_folded_total() {
    privileged!();
    if !have_go("every_profile_reads_in_pprof_with_its_folded_total") {
        return;
    }
    let dir = disk_dir();
    let file = dir.path().join("data.bin");
    let made = Command::new(BIN).args(["workload", "make-file", "--mib", "16"]).arg(&file).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // Cold file faults (some major) under their region, then munmap churn
    // with a second thread, so that every munmap sends a shootdown.
    let iterations = (2000 / scale()).to_string();
    let script = format!(
        "{BIN} workload file-read {} --cold && {BIN} workload churn --threads 2 --iterations {iterations}",
        file.display()
    );
    let run = record(&["--leaf", "region", "--stack-sample", "4"], &["sh", "-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let out = run.out.path();
    check_totals(out, "record");
    // Labels: the process, and the region of the `--leaf region` leaf.
    let tags = Command::new("go").args(["tool", "pprof", "-tags"]).arg(out.join("faults.pb.gz")).output().unwrap();
    let tags = String::from_utf8_lossy(&tags.stdout);
    for key in ["pid:", "comm:", "region:", "region_kind:", "region_path:"] {
        assert!(tags.contains(key), "no {key} label in faults.pb.gz:\n{tags}");
    }
    assert!(tags.contains(&file.display().to_string()), "the file's region is a label:\n{tags}");
    // `report DIR` writes every file again from summary.json and the folded
    // files: each flamegraph (mmap, shootdowns and resident ones too, not
    // only the fault ones), each profile, the text and the page.
    let recorded = files_in(out);
    for f in recorded.keys().filter(|f| *f != "summary.json" && !f.ends_with(".folded")) {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    let rebuilt = vmtrace().arg("report").arg(out).output().unwrap();
    assert!(rebuilt.status.success(), "{}", String::from_utf8_lossy(&rebuilt.stderr));
    let again = files_in(out);
    assert_eq!(again.keys().collect::<Vec<_>>(), recorded.keys().collect::<Vec<_>>(), "report DIR: the same files");
    for stem in ["faults", "mmap", "shootdowns", "resident", "resident-peak"] {
        assert!(again.contains_key(&format!("{stem}.svg")), "report DIR wrote no {stem}.svg");
    }
    for (f, bytes) in &recorded {
        if Path::new(f).extension().is_some_and(|e| e == "txt" || e == "folded" || e == "json") {
            assert!(again[f] == *bytes, "{f} rebuilt is not the same bytes");
        }
    }
    check_totals(out, "report DIR");
    let html = std::fs::read_to_string(out.join("report.html")).expect("report DIR writes report.html again");
    assert!(
        html.contains("faults.pb.gz") && html.contains("<svg"),
        "the page embeds the graphs and links the profiles"
    );
}
