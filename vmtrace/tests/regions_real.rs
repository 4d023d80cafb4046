//! Regions through time on real allocators and on a random sequence of
//! mapping changes whose ground truth the workload logs itself (privileged).
mod common;

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use common::*;
use serde_json::Value;

/// Random mmap (MAP_FIXED over whatever is there), munmap, mprotect and
/// mremap (grown in place, or moved over other mappings) in a 32 MiB window,
/// with first writes to pages it knows are not present; it prints, per
/// (mapping, permissions), the faults it took: one per page written.
const CHURN_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#define PAGES 8192
#define PG 4096UL
static int id[PAGES], perm[PAGES], present[PAGES];
static long faults[4096][4];
static unsigned long seed;
static unsigned rnd(unsigned n) { seed = seed * 6364136223846793005UL + 1442695040888963407UL; return (seed >> 33) % n; }
int main(int argc, char **argv) {
    seed = strtoul(argv[1], 0, 10);
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
    char *w = mmap(0, PAGES * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    int next = 1;
    for (int i = 0; i < PAGES; i++) { id[i] = 0; perm[i] = 0; present[i] = 0; }
    printf("{\"window\":[%lu,%lu],", (unsigned long)w, (unsigned long)w + PAGES * PG);
    for (int op = 0; op < 600; op++) {
        unsigned s = rnd(PAGES), l = 1 + rnd(256);
        if (s + l > PAGES) l = PAGES - s;
        switch (rnd(5)) {
        case 0: { /* a new mapping over [s, s+l) */
            int p = rnd(4) ? 3 : 0;
            if (mmap(w + s * PG, l * PG, p == 3 ? PROT_READ | PROT_WRITE : PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) return 2;
            for (unsigned i = s; i < s + l; i++) { id[i] = next; perm[i] = p; present[i] = 0; }
            next++;
            break; }
        case 1: /* a hole */
            if (munmap(w + s * PG, l * PG)) return 3;
            for (unsigned i = s; i < s + l; i++) { id[i] = -1; perm[i] = 0; present[i] = 0; }
            break;
        case 2: { /* new permissions on a run of one mapping */
            if (id[s] < 0) break;
            unsigned e = s;
            while (e < s + l && id[e] == id[s]) e++;
            int p = rnd(3) ? 3 : (rnd(2) ? 1 : 0);
            if (mprotect(w + s * PG, (e - s) * PG, p == 3 ? PROT_READ | PROT_WRITE : p == 1 ? PROT_READ : PROT_NONE)) return 4;
            for (unsigned i = s; i < e; i++) perm[i] = p;
            break; }
        case 3: { /* mremap a run of one mapping with one permission */
            if (id[s] < 0) break;
            unsigned e = s;
            while (e < s + l && id[e] == id[s] && perm[e] == perm[s]) e++;
            unsigned n = e - s, d = rnd(PAGES), nl = n + rnd(64);
            if (d + nl > PAGES) break;
            if (d < e && d + nl > s) break; /* no overlap of old and new */
            if (mremap(w + s * PG, n * PG, nl * PG, MREMAP_MAYMOVE | MREMAP_FIXED, w + d * PG) == MAP_FAILED) break;
            int ni[320], np[320], nq[320];
            for (unsigned i = 0; i < nl; i++) {
                ni[i] = id[s]; np[i] = perm[s]; nq[i] = i < n ? present[s + i] : 0;
            }
            for (unsigned i = s; i < e; i++) { id[i] = -1; perm[i] = 0; present[i] = 0; }
            for (unsigned i = 0; i < nl; i++) { id[d + i] = ni[i]; perm[d + i] = np[i]; present[d + i] = nq[i]; }
            break; }
        default: /* first writes */
            for (unsigned i = s; i < s + l; i++)
                if (id[i] >= 0 && perm[i] == 3 && !present[i]) {
                    w[i * PG] = 1;
                    present[i] = 1;
                    faults[id[i]][3]++;
                }
        }
    }
    printf("\"faults\":[");
    int first = 1;
    for (int i = 0; i < next; i++)
        if (faults[i][3]) { printf("%s[%d,%ld]", first ? "" : ",", i, faults[i][3]); first = 0; }
    printf("]}\n");
    return 0;
}
"#;

/// Threads that malloc small blocks until glibc gives each an arena.
const ARENAS_C: &str = r"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
static void *work(void *arg) {
    for (int i = 0; i < 256; i++) { char *p = malloc(32 << 10); memset(p, 1, 32 << 10); }
    return arg;
}
int main(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, work, 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    return 0;
}
";

fn build(name: &str, src: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = disk_dir();
    let (c, bin) = (dir.path().join(format!("{name}.c")), dir.path().join(name));
    std::fs::write(&c, src).unwrap();
    let ok = Command::new("cc").args(["-O2", "-o"]).arg(&bin).arg(&c).args(extra).status().expect("a C compiler (cc)");
    assert!(ok.success(), "compiling {name}.c failed");
    (dir, bin)
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

fn regions_of(run: &Run, pid: u32) -> Vec<&Value> {
    run.summary["regions"].as_array().expect("regions").iter().filter(|r| r["pid"] == pid).collect()
}

/// Per process: its regions add up to its faults exactly, and no fault is in
/// a mapping without access.
fn assert_regions_true(run: &Run) {
    for p in run.summary["processes"].as_array().unwrap() {
        let pid = u(&p["pid"]) as u32;
        let regions = regions_of(run, pid);
        let sum: u64 = regions.iter().map(|r| u(&r["faults"]["total"])).sum();
        assert_eq!(sum, u(&p["faults"]["total"]), "regions of {pid} add up to its faults");
        // `[unknown region of PID]` rows are no mapping (region_placement.unplaced).
        let none: Vec<_> = regions
            .iter()
            .filter(|r| r["perms"].as_str().unwrap().starts_with("---") && r["kind"] != "other")
            .collect();
        assert!(none.is_empty(), "faults placed in mappings without access: {none:#?}");
    }
}

#[test]
fn random_mapping_changes_place_every_fault_in_its_mapping() {
    privileged!();
    let (_dir, bin) = build("churn", CHURN_C, &[]);
    for seed in ["1", "7", "42"] {
        // Every mapping's own row, the small ones too.
        let run = record(&["--regions", "all"], &[bin.to_str().unwrap(), seed]);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        let truth: Value = serde_json::from_slice(&run.output.stdout).expect("the workload's JSON");
        let (lo, hi) = (u(&truth["window"][0]), u(&truth["window"][1]));
        let mut want: Vec<u64> = truth["faults"].as_array().unwrap().iter().map(|f| u(&f[1])).collect();
        let pid = u(&run.summary["target"]["pid"]) as u32;
        let rows: Vec<&Value> =
            regions_of(&run, pid).into_iter().filter(|r| hex(&r["start"]) >= lo && hex(&r["start"]) < hi).collect();
        let mut got: Vec<u64> = rows.iter().map(|r| u(&r["faults"]["total"])).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "seed {seed}: faults per mapping, vmtrace vs the workload's log: {rows:#?}");
        assert_regions_true(&run);
        // The few approximate ones are ld.so's and the program's RELRO pages,
        // written before the mprotect that makes them read-only, in mappings
        // exec made (docs/design.md, "Regions through time").
        let placement = &run.summary["region_placement"];
        assert!(u(&placement["approximate"]) <= 8, "seed {seed}: {placement}");
        // At most a fault of the exec itself (in neither address space's
        // maps as read) stays unplaced, counted.
        assert!(u(&placement["unplaced"]) <= 2, "seed {seed}: {placement}");
    }
}

#[test]
fn malloc_arenas_of_threads_take_their_faults_in_read_write_rows() {
    privileged!();
    let (_dir, bin) = build("arenas", ARENAS_C, &["-pthread"]);
    let run = record(&[], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_regions_true(&run);
    let pid = u(&run.summary["target"]["pid"]) as u32;
    let regions = regions_of(&run, pid);
    let named =
        |name: &str| -> u64 { regions.iter().filter(|r| r["path"] == name).map(|r| u(&r["faults"]["total"])).sum() };
    // 4 threads × 8 MiB: the threads that got an arena of their own fault
    // there; one may share the main arena ([heap]).
    let arenas = named("[malloc arena]");
    assert!(arenas >= 3 * 2048 * 9 / 10, "{arenas} faults in arenas: {regions:#?}");
    assert!(arenas + named("[heap]") >= 4 * 2048 * 9 / 10, "{regions:#?}");
    assert!(named("[thread stack]") > 0, "thread stacks are named: {regions:#?}");
}

#[test]
fn numpy_in_threads_places_every_fault_exactly() {
    privileged!();
    let python = python_with(&["numpy"]);
    let script = "import numpy as np, threading\n\
        def work(seed):\n    r = np.random.default_rng(seed)\n    for _ in range(10):\n        a = r.random((300, 300)); (a @ a.T * 2.0 + 1.0).sum()\n\
        ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]\n\
        [t.start() for t in ts]; [t.join() for t in ts]\n";
    let run = record(&[], &[python.to_str().unwrap(), "-c", script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_regions_true(&run);
    let p = &run.summary["region_placement"];
    let total = u(&p["exact"]) + u(&p["approximate"]) + u(&p["unplaced"]);
    assert_eq!(u(&p["unplaced"]), 0, "{p}");
    assert!(u(&p["approximate"]) * 100 <= total, "at most 1% placed approximately: {p}");
    let mut by_path: BTreeMap<String, u64> = BTreeMap::new();
    for r in run.summary["regions"].as_array().unwrap() {
        *by_path.entry(r["path"].as_str().unwrap_or("").into()).or_default() += u(&r["faults"]["total"]);
    }
    assert!(by_path.get("[malloc arena]").is_some_and(|n| *n > 1000), "numpy's threads fault in arenas: {by_path:#?}");
    // A file mapped and closed between two maps reads has no path to show;
    // every file a maps read saw is named.
    let unnamed: u64 =
        by_path.iter().filter(|(k, _)| k.starts_with("[fd ") || k.starts_with("[file ")).map(|(_, n)| n).sum();
    assert!(unnamed * 100 <= total, "{unnamed} faults in unnamed files: {by_path:#?}");
    // No fork after the exec: no COW fault of Python's is called a copy of
    // a page shared since a fork. Between record's fork and the exec the
    // child writes a few pages of the collector's own stack and libc data
    // (copies of its parent's pages, counted as fork copies since 33d6634;
    // `record -- /bin/ls /` shows 1-2): a handful, not Python's arenas.
    for proc in run.summary["processes"].as_array().unwrap() {
        if let Some(c) = proc.get("cow_from") {
            assert!(u(&c["fork"]) <= 8, "only the launcher's pre-exec copies are fork copies: {c}");
        }
    }
}
