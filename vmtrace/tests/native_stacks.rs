//! User stacks through code built without frame pointers (privileged): the
//! kernel copies a window of the stack, userspace unwinds it with the
//! objects' `.eh_frame`. On code nobody wrote for these tests: Debian's
//! stripped `sort`, a C program built `-O2 -fomit-frame-pointer`, pyenv's
//! CPython (built without frame pointers).
mod common;

use std::{fmt::Write as _, process::Command};

use common::*;

/// Share of the folded weight whose line passes `pred`.
fn share_where(folded: &str, pred: impl Fn(&str) -> bool) -> f64 {
    let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok()).unwrap_or(0);
    let total: u64 = folded.lines().map(weight).sum();
    let hit: u64 = folded.lines().filter(|l| pred(l)).map(weight).sum();
    hit as f64 / total.max(1) as f64
}

fn folded(run: &Run, name: &str) -> String {
    std::fs::read_to_string(run.out.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The summary's account of how sampled stacks ended adds up, and most
/// reached a thread root.
fn check_endings(run: &Run, min_root: f64) {
    let st = &run.summary["stacks"];
    let cut: u64 = st["cut"].as_object().expect("stacks.cut").values().map(u).sum();
    let (root, fp) = (u(&st["reached_root"]), u(&st["frame_pointer_only"]));
    let sampled = u(&st["sampled_faults"]);
    assert!(root + cut + fp <= sampled, "endings {root}+{cut}+{fp} > sampled {sampled}: {st}");
    assert!(root as f64 >= min_root * sampled as f64, "only {root} of {sampled} stacks reached a thread root: {st}");
    // A busy machine may drop copies (ring full): counted, and their stacks
    // share out over the copies of the same frame-pointer stack that arrived.
    let (unwound, dropped) = (u(&st["unwound_samples"]), u(&run.summary["drops"]["stack_samples"]));
    assert!(unwound > dropped, "{unwound} samples unwound, {dropped} dropped: {st}");
}

/// Every frame of a program built without frame pointers, from the fault
/// to `main` and on to `_start`: a frame-pointer walk names only the leaf.
#[test]
fn omitted_frame_pointers_unwind_to_main() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_c_with("nofp.c", &["-O2", "-fomit-frame-pointer"], dir.path());
    let run = record(&["--stacks", "user", "--stack-sample", "4"], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = folded(&run, "faults.folded");
    // The compiler may fold some of the recursion: any number of mid_layer.
    let chain = |l: &str| l.contains(";main;outer_layer;mid_layer;") && l.contains(";leaf_touch ");
    let whole = share_where(&f, chain);
    assert!(whole >= 0.9, "{:.1}% of fault weight shows main…leaf_touch:\n{f}", whole * 100.0);
    assert!(share_where(&f, |l| l.contains(";_start;") && chain(l)) >= 0.9, "{f}");
    check_endings(&run, 0.9);
    // The mmap call sites unwind too (munmap, outer_layer's tail call, is main's).
    let m = folded(&run, "mmap.folded");
    assert!(m.lines().any(|l| l.contains(";main;outer_layer;") && l.contains("[mmap]")), "{m}");
}

/// Debian's `sort` (stripped: its own frames are `sort+0x…`) sorting a file
/// too big for one buffer: the stacks reach `__libc_start_main` (main
/// thread) or `start_thread` (its sort threads).
#[test]
fn stripped_sort_reaches_libc_start_main() {
    privileged!();
    let dir = disk_dir();
    let input = dir.path().join("lines.txt");
    let mut text = String::with_capacity(24 << 20);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..(1_000_000 / scale()) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let _ = writeln!(text, "{x:016x} {i}");
    }
    std::fs::write(&input, text).unwrap();
    let out = dir.path().join("sorted.txt");
    let run = record(
        &["--stacks", "user", "--stack-sample", "8"],
        &["sort", "-o", out.to_str().unwrap(), input.to_str().unwrap()],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = folded(&run, "faults.folded");
    let main = share_where(&f, |l| l.contains("__libc_start_main") && l.contains(";sort+0x"));
    let threads = share_where(&f, |l| l.contains("start_thread;sort+0x"));
    assert!(main >= 0.5, "{:.1}% of fault weight reaches __libc_start_main through sort's frames:\n{f}", main * 100.0);
    assert!(main + threads >= 0.9, "{:.1}% + {:.1}% reach a thread root:\n{f}", main * 100.0, threads * 100.0);
    check_endings(&run, 0.9);
}

/// pyenv's CPython, built without frame pointers: the native stacks of
/// faults under Python code reach `Py_RunMain` and `main`'s caller.
#[test]
fn pyenv_python_native_stacks_reach_py_runmain() {
    privileged!();
    let out = Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output();
    let python = String::from_utf8(out.expect("python3 is needed for this test").stdout).unwrap().trim().to_string();
    let script = "def build(n):\n    return [bytearray(65536) for _ in range(n)]\nfor _ in range(3):\n    b = build(1500)\n    del b\n";
    let run = record(&["--stacks", "user", "--stack-sample", "8"], &[&python, "-c", script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = folded(&run, "faults.folded");
    let under = share_where(&f, |l| l.contains(";Py_RunMain;") && l.contains("__libc_start_main"));
    assert!(under >= 0.8, "{:.1}% of fault weight reaches Py_RunMain and __libc_start_main:\n{f}", under * 100.0);
    assert!(share_where(&f, |l| l.contains("Py_RunMain;") && l.contains("bytearray")) >= 0.5, "{f}");
    check_endings(&run, 0.8);
}

/// `--stack-window 0`: frame pointers only, as before; no samples copied.
#[test]
fn stack_window_zero_copies_nothing() {
    privileged!();
    let run = record(&["--stacks", "user", "--stack-sample", "4", "--stack-window", "0"], &["sort", "/etc/services"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(u(&run.summary["stacks"]["unwound_samples"]), 0, "{}", run.summary["stacks"]);
    assert_eq!(u(&run.summary["stacks"]["reached_root"]), 0, "{}", run.summary["stacks"]);
}

/// numpy temporaries freed in two threads with a fixed mmap threshold: every
/// free unmaps, and each munmap sends a shootdown to the other thread's CPU.
/// The storm is blamed through numpy's own C code (`array_dealloc`), past
/// libc's `free` and `munmap` wrappers.
#[test]
fn numpy_munmap_storm_is_blamed_through_numpys_c_functions() {
    privileged!();
    let python = python_with(&["numpy"]);
    let script = "import threading, numpy as np\n\
                  def work():\n    for _ in range(4000):\n        a = np.ones(40000)\n        b = a * 2.0\n        del a, b\n\
                  ts = [threading.Thread(target=work) for _ in range(2)]\n\
                  [t.start() for t in ts]\n[t.join() for t in ts]\n";
    let threshold = 200 / scale();
    let ipis0 = tlb_ipis_received();
    let run = record(
        &["--storm-threshold", &threshold.to_string()],
        &["env", "MALLOC_MMAP_THRESHOLD_=131072", python.to_str().unwrap(), "-c", script],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let storms = run.summary["storms"].as_array().expect("storms");
    if kernel_saw_a_storm(&run, ipis0, threshold) {
        assert!(!storms.is_empty(), "no storm: {}", run.summary["processes"]);
    }
    let stack_of = |s: &serde_json::Value| -> Vec<String> {
        s["top_stack"].as_array().unwrap().iter().filter_map(|f| f.as_str().map(str::to_owned)).collect()
    };
    for s in storms {
        let stack = stack_of(s);
        assert!(s["top_share"].as_f64().unwrap() > 0.0, "{s:#}");
        // The frame under the syscall is a caller, not libc's wrapper of it.
        let caller = stack.iter().rev().nth(1).map_or("", String::as_str);
        assert!(!caller.contains("munmap"), "culprit starts at a syscall wrapper: {stack:?}");
    }
    // The work's storm, the largest, is blamed through numpy's C code.
    // Another may be real and elsewhere: `import numpy` relocating its
    // libraries (mprotect) while OpenBLAS's threads already run (the full
    // suite on a quiet machine: a storm under `_dl_relocate_object`).
    if let Some(s) = storms.iter().max_by_key(|s| s["shootdowns"].as_u64().unwrap_or(0)) {
        let stack = stack_of(s);
        assert!(stack.iter().any(|f| f.contains("array_dealloc")), "culprit names numpy's C code: {stack:?}");
    }
    // Every IPI sent has a call site in the shootdown flamegraph.
    let folded = folded(&run, "shootdowns.folded");
    let sent: u64 =
        run.summary["processes"].as_array().unwrap().iter().map(|p| p["tlb"]["ipis_sent"].as_u64().unwrap_or(0)).sum();
    let total = vmtrace::stacks::flamegraph::total(&folded);
    assert!(total * 100 >= sent * 95, "shootdowns.folded holds {total} of {sent} IPIs:\n{folded}");
    // Storm or not, the IPIs are blamed through numpy's C code.
    if sent >= 100 {
        let numpy = share_where(&folded, |l| l.contains("array_dealloc"));
        assert!(numpy >= 0.5, "{:.1}% of the IPIs under array_dealloc:\n{folded}", numpy * 100.0);
    }
}

/// A program in a container's files: another mount namespace and a root of
/// its own (`unshare -m`, a tmpfs, `chroot`), exiting before the recording
/// ends, as a job's processes do. Its maps name `/JAIL/opt/prog`, a path
/// that here holds another program (a decoy with other functions): its
/// stacks are unwound and named from its own file, through its root held
/// open (`procmaps::root`), never from the file of the same path here.
#[test]
fn a_program_in_its_own_mount_namespace_and_root_is_named_from_its_own_files() {
    privileged!();
    let dir = disk_dir();
    let cc = |name: &str, code: &str| {
        let (src, bin) = (dir.path().join(format!("{name}.c")), dir.path().join(name));
        std::fs::write(&src, code).unwrap();
        let ok = Command::new("cc").args(["-O1", "-static", "-fomit-frame-pointer", "-o"]).arg(&bin).arg(&src).status();
        assert!(ok.is_ok_and(|s| s.success()), "compiling {name} (static) failed");
        bin
    };
    let real = cc(
        "jailed",
        "#include <sys/mman.h>\n\
         __attribute__((noinline)) void jailed_touch(char *p, long n) { for (long i = 0; i < n; i += 4096) p[i] = 1; }\n\
         __attribute__((noinline)) void jailed_layer(long n) {\n\
           char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);\n\
           jailed_touch(p, n); __asm__ volatile(\"\" ::: \"memory\"); }\n\
         int main(void) { jailed_layer(64L << 20); return 0; }\n",
    );
    let decoy = cc(
        "decoy",
        "__attribute__((noinline)) int decoy_function(int x) { return x * 3; }\n\
         int main(int c, char **v) { (void)v; return decoy_function(c) == 1234; }\n",
    );
    let jail = dir.path().join("jail");
    std::fs::create_dir_all(jail.join("opt")).unwrap();
    std::fs::copy(&decoy, jail.join("opt/prog")).unwrap();
    let script = format!(
        "mount -t tmpfs none {j} && mkdir {j}/opt && cp {r} {j}/opt/prog && exec chroot {j} /opt/prog",
        j = jail.display(),
        r = real.display()
    );
    let run = record(
        &["--stacks", "user", "--stack-sample", "4"],
        &["unshare", "-m", "--propagation", "private", "sh", "-c", &script],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = folded(&run, "faults.folded");
    assert!(!f.contains("decoy_function"), "named from the file of the same path here:\n{f}");
    let named = share_where(&f, |l| l.starts_with("prog;") && l.contains(";main;") && l.contains(";jailed_touch "));
    let prog = share_where(&f, |l| l.starts_with("prog;"));
    assert!(prog > 0.5 && named >= 0.9 * prog, "{named:.3} of {prog:.3} named main…jailed_touch:\n{f}");
}
