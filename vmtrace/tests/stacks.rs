//! Fault stacks, symbols and flamegraphs on a C program built with -g and
//! frame pointers (privileged).
mod common;

use std::{path::PathBuf, process::Command};

use common::*;

const FAULTER_C: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE (32UL << 20)

__attribute__((noinline)) void fill_buffer_with_faults(volatile char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
}

static void touch_fresh_mapping(void) {
    char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) _exit(2);
    madvise(p, SIZE, MADV_NOHUGEPAGE);
    fill_buffer_with_faults(p, SIZE);
}

/* As code built without frame pointers may leave it: rbp holds data while the
   faults happen, so a frame-pointer walk reads 0x5 as the caller. */
static unsigned long fake_frame[2] = {0, 0x5};

__attribute__((noinline)) void fault_with_rbp_on_data(volatile char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096)
        __asm__ volatile("mov %%rbp, %%r12\n\tmov %1, %%rbp\n\tmovb $1, (%0)\n\tmov %%r12, %%rbp"
                         :: "r"(p + i), "r"(fake_frame) : "r12", "memory");
}

int fault_at_stack_top(void *arg) {
    (void)arg;
    touch_fresh_mapping();
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "attop") == 0) {
        /* The faults happen in a child whose stack ends right above its outermost frames, under a
           PROT_NONE page: a stack read past the top fails there. */
        size_t size = 64 << 10;
        char *stack = mmap(NULL, size + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stack == MAP_FAILED || mprotect(stack + size, 4096, PROT_NONE) != 0) _exit(2);
        pid_t pid = clone(fault_at_stack_top, stack + size, SIGCHLD, NULL);
        if (pid < 0) _exit(3);
        waitpid(pid, NULL, 0);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "nofp") == 0) {
        char *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) _exit(2);
        madvise(p, SIZE, MADV_NOHUGEPAGE);
        fault_with_rbp_on_data(p, SIZE);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        /* The faults happen in a short-lived child that is gone before the trace ends. */
        pid_t pid = fork();
        if (pid == 0) { touch_fresh_mapping(); _exit(0); }
        waitpid(pid, NULL, 0);
        usleep(200000);
        return 0;
    }
    touch_fresh_mapping();
    return 0;
}
"#;

/// Builds the C workload into a scratch directory (kept alive by the caller).
fn faulter() -> (tempfile::TempDir, PathBuf) {
    let dir = disk_dir();
    let bin = compile_source(dir.path(), "faulter", FAULTER_C);
    (dir, bin)
}

/// Compiles the C program `source` as `dir/name` (-g -O1, frame pointers).
fn compile_source(dir: &std::path::Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let ok = Command::new("cc")
        .args(["-g", "-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) is needed for the stack tests");
    assert!(ok.success(), "compiling {name}.c failed");
    bin
}

/// A 32-bit program without libc (no multilib needed): 4-byte frames.
const FAULTER32_C: &str = r#"
static volatile char buf[16 << 20];
__attribute__((noinline)) static void touch32(void) { for (unsigned i = 0; i < sizeof buf; i += 4096) buf[i] = 1; }
void _start(void) {
    touch32();
    __asm__ volatile("movl $1, %%eax; xorl %%ebx, %%ebx; int $0x80" ::: "eax", "ebx");
}
"#;

/// The faulter in `mode` under `record --stacks user --stack-sample 1`: the
/// run, and its faults.folded.
fn every_stack(bin: &std::path::Path, mode: &str) -> (Run, String) {
    let run = record(&["--stacks", "user", "--stack-sample", "1"], &[bin.to_str().unwrap(), mode]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    (run, folded)
}

fn share_under(folded: &str, function: &str) -> f64 {
    share_where(folded, |l| l.contains(function))
}

/// Share of the samples whose folded line passes `pred`.
fn share_where(folded: &str, pred: impl Fn(&str) -> bool) -> f64 {
    let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok()).unwrap_or(0);
    let total: u64 = folded.lines().map(weight).sum();
    let under: u64 = folded.lines().filter(|l| pred(l)).map(weight).sum();
    under as f64 / total.max(1) as f64
}

#[test]
fn faults_flamegraph_names_the_faulting_function() {
    privileged!();
    let (_dir, bin) = faulter();
    let run = record(&["--stacks", "user", "--stack-sample", "1", "--latency-sample", "1"], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let share = share_under(&folded, "fill_buffer_with_faults");
    assert!(share >= 0.85, "{:.1}% of fault samples under fill_buffer_with_faults:\n{folded}", share * 100.0);
    assert!(
        folded.contains("main;touch_fresh_mapping;fill_buffer_with_faults")
            || folded.contains("main;fill_buffer_with_faults"),
        "the caller chain is there:\n{folded}"
    );
    // Every fault carries a stack (sampling 1): the folded total is the summary's total.
    assert_eq!(vmtrace::stacks::flamegraph::total(&folded), u(&run.summary["totals"]["total"]));
    for svg in ["faults.svg", "fault-time.svg", "major-faults.svg"] {
        let text = std::fs::read_to_string(run.out.path().join(svg)).unwrap();
        // inferno's SVG carries a DOCTYPE.
        let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
        roxmltree::Document::parse_with_options(&text, opts)
            .unwrap_or_else(|e| panic!("{svg} is not well-formed XML: {e}"));
        if svg != "major-faults.svg" {
            assert!(text.contains("fill_buffer_with_faults"), "{svg} names the function");
        }
    }
    let time = std::fs::read_to_string(run.out.path().join("fault-time.folded")).unwrap();
    assert!(share_under(&time, "fill_buffer_with_faults") >= 0.85, "{time}");
    assert_eq!(run.summary["stacks"]["sample_period"], 1);
}

/// A function whose last instruction calls one that does not return (`main`
/// ending in `exit()`, a helper ending in `abort()`) returns past its own
/// end, into the next function: its frame is named by the call, as
/// debuggers and perf name it, not by what follows (it read
/// `_fini;next_function` for `main;ends_in_a_noreturn_call`).
const NORETURN_C: &str = r"
#include <sys/mman.h>
#include <unistd.h>
__attribute__((noinline, noreturn)) void touch_then_exit(void) {
    volatile char *p = mmap(0, 16 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (long i = 0; i < (16 << 20); i += 4096) p[i] = 1;
    _exit(0);
}
__attribute__((noinline)) void ends_in_a_noreturn_call(void) { touch_then_exit(); }
__attribute__((noinline)) int next_function(int x) { return x * 3 + 1; }
int main(int argc, char **argv) {
    if (argc > 5) return next_function(argc);
    ends_in_a_noreturn_call();
}
";

#[test]
fn a_call_that_ends_its_function_is_named_by_its_caller() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_source(dir.path(), "noreturn", NORETURN_C);
    let (_run, folded) = every_stack(&bin, "");
    let share = share_under(&folded, "main;ends_in_a_noreturn_call;touch_then_exit");
    assert!(share >= 0.85, "{:.1}% of the faults under main;ends_in_a_noreturn_call:\n{folded}", share * 100.0);
    assert!(!folded.contains("next_function") && !folded.contains("_fini"), "{folded}");
}

/// A walk that runs into data (code without frame pointers) is cut there: the
/// flamegraph shows the faulting function under the broken-chain marker, not
/// data read as callers. Frame pointers only (`--stack-window 0`): with the
/// copy, the same stacks unwind whole (tests/native_stacks.rs).
#[test]
fn a_frame_chain_through_data_is_cut() {
    privileged!();
    let (_dir, bin) = faulter();
    let run =
        record(&["--stacks", "user", "--stack-sample", "1", "--stack-window", "0"], &[bin.to_str().unwrap(), "nofp"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let cut = share_where(&folded, |l| l.contains("[frame chain broken];fault_with_rbp_on_data "));
    assert!(cut >= 0.9, "{:.1}% of fault samples cut at fault_with_rbp_on_data:\n{folded}", cut * 100.0);
    assert!(!folded.contains("0x5;") && !folded.contains("0x5 "), "data shown as a caller:\n{folded}");
    let pct = run.summary["stacks"]["broken_chain_pct"].as_f64().unwrap();
    assert!(pct >= 90.0, "broken_chain_pct {pct}");
    let text = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(text.contains("cut where their frame chain left executable memory"), "{text}");
    // Counts are untouched by the cut: every fault still has its (shorter) stack.
    assert_eq!(vmtrace::stacks::flamegraph::total(&folded), u(&run.summary["totals"]["total"]));
}

/// The programs' own frame-pointer walk and the kernel's (`bpf_get_stackid`,
/// the fallback, taken with `--force-tracepoints`) give the same chain.
#[test]
fn own_user_stack_walk_matches_the_kernels() {
    privileged!();
    let (_dir, bin) = faulter();
    let walker = |run: &Run| {
        let p = run.summary["probes"].as_array().unwrap().iter().find(|p| p["what"] == "user stacks").cloned();
        p.unwrap_or_else(|| panic!("no user-stack probe row: {}", run.summary["probes"]))["program_type"].clone()
    };
    for (args, kind) in [(&[][..], "own walk"), (&["--force-tracepoints"][..], "stackid")] {
        let mut a = vec!["--stacks", "user", "--stack-sample", "1"];
        a.extend_from_slice(args);
        let run = record(&a, &[bin.to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        assert_eq!(walker(&run), kind);
        let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
        // touch_fresh_mapping may be inlined.
        let share = share_where(&folded, |l| l.contains(";main;") && l.contains("fill_buffer_with_faults"));
        assert!(share >= 0.85, "{kind}: {:.1}% under main…fill_buffer_with_faults:\n{folded}", share * 100.0);
        let total = vmtrace::stacks::flamegraph::total(&folded);
        // bpf_get_stackid loses a stack whose hash bucket another one holds
        // (counted); the own walk probes on.
        let lost = u(&run.summary["stacks"]["lost"]);
        assert!(lost == 0 || (kind == "stackid" && lost * 100 <= total), "{kind}: {lost} stacks lost");
        // Every fault's stack is counted once: the counts still in the
        // programs' per-CPU stack slots reach the report too.
        let faults = u(&run.summary["totals"]["total"]);
        assert!(total + lost >= faults - faults / 1000, "{kind}: stacks of {total} faults (+{lost} lost) of {faults}");
    }
}

/// A stack whose outermost frames sit right under the end of its mapping: a
/// 1 KiB read from there fails, and the walk reads again up to the end of the
/// frame's page instead of losing every frame but the faulting one.
#[test]
fn frames_at_the_top_of_a_stack_are_walked() {
    privileged!();
    let (_dir, bin) = faulter();
    let (_run, folded) = every_stack(&bin, "attop");
    // touch_fresh_mapping may be inlined.
    let share = share_where(&folded, |l| l.contains("fault_at_stack_top;") && l.contains("fill_buffer_with_faults"));
    assert!(share >= 0.85, "{:.1}% under fault_at_stack_top…fill_buffer_with_faults:\n{folded}", share * 100.0);
}

/// A 32-bit task's stack is the kernel's walk (it reads 4-byte frames), not
/// the programs' 64-bit one.
#[test]
fn thirty_two_bit_task_gets_the_kernels_walk() {
    privileged!();
    let dir = disk_dir();
    let (src, bin) = (dir.path().join("f32.c"), dir.path().join("f32"));
    std::fs::write(&src, FAULTER32_C).unwrap();
    let ok = Command::new("cc")
        .args(["-m32", "-O1", "-fno-omit-frame-pointer", "-nostdlib", "-static", "-ffreestanding", "-no-pie", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(ok.success(), "cc -m32 -nostdlib failed (needs gcc with i386 support, no libc)");
    let run = record(&["--stack-sample", "1"], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let share = share_under(&folded, "touch32");
    assert!(share >= 0.9, "{:.1}% under touch32:\n{folded}", share * 100.0);
    // A 64-bit walk of 4-byte frames ends at touch32 (or pairs two words into
    // one address); the kernel's compat walk reads its caller's frame.
    for line in folded.lines().filter(|l| l.contains("touch32")) {
        let depth = line.split(';').position(|f| f.starts_with("touch32")).unwrap_or(0);
        assert!(depth >= 2, "no caller above touch32: {line}");
        for frame in line.split(';').filter_map(|f| f.split_whitespace().last()?.strip_prefix("0x")) {
            let a = u64::from_str_radix(frame, 16).unwrap_or(0);
            assert!(a < 1 << 32, "a 64-bit frame in a 32-bit stack: {line}");
        }
    }
    // The faults with a stack are the buffer loop's. Under load, a run now
    // and then also counts ~120 faults of the task whose stack could not be
    // stored (`lost_not_stored`, no drop counter moves), outside touch32:
    // not yet explained (docs/performance.md). They must be counted and
    // shown, never silently missing.
    let lost = u(&run.summary["stacks"]["lost"]);
    let under = vmtrace::stacks::flamegraph::total(
        &folded.lines().filter(|l| l.contains("touch32")).collect::<Vec<_>>().join("\n"),
    );
    let total = u(&run.summary["totals"]["total"]);
    assert!(
        under as f64 >= 0.95 * total.saturating_sub(lost) as f64,
        "the faults with a stack are the buffer loop's: {under} of {total} ({lost} lost)\n{folded}"
    );
    let shown = folded
        .lines()
        .filter(|l| l.contains("[no user stack]"))
        .map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0));
    assert_eq!(shown.sum::<u64>(), lost, "the lost stacks are shown as [no user stack]:\n{folded}");
}

#[test]
fn sampled_stacks_are_scaled_to_the_total() {
    privileged!();
    let (_dir, bin) = faulter();
    let run = record(&["--stack-sample", "8"], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    assert_close(
        "scaled folded total",
        vmtrace::stacks::flamegraph::total(&folded),
        u(&run.summary["totals"]["total"]),
        5.0,
    );
    let svg = std::fs::read_to_string(run.out.path().join("faults.svg")).unwrap();
    assert!(svg.contains("the rest from 1 in 8 faults"), "the title says how it was estimated");
}

#[test]
fn short_lived_child_is_symbolized_after_it_exited() {
    privileged!();
    let (_dir, bin) = faulter();
    let run = record(&[], &[bin.to_str().unwrap(), "child"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let procs = run.summary["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "parent and child");
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let share = share_under(&folded, "fill_buffer_with_faults");
    assert!(share >= 0.85, "{:.1}% under the child's function:\n{folded}", share * 100.0);
}

/// Distro programs a shell starts and that exit within a millisecond or
/// two, before the collector reads their maps: their program and loader are
/// named from what their exec mapped (the exec hook's image), and what a
/// child ran before its exec from its parent's maps. Without that, most of
/// their frames were `[unknown] 0xADDR` (18% of the faults beside a shell
/// loop, docs/performance.md).
#[test]
fn short_lived_programs_are_named_from_their_exec_image() {
    privileged!();
    // A launcher as version managers (pyenv's shims) write them: a bash
    // script that runs subshells and execs itself, then the program.
    let dir = tempfile::tempdir().unwrap();
    let step = dir.path().join("step");
    std::fs::write(
        &step,
        "#!/usr/bin/env bash\nset -e\nme=$(basename \"$(readlink -f \"$0\")\")\nn=${1:-0}\n\
         if [ \"$n\" -lt 2 ]; then exec \"$0\" $((n + 1)); fi\nx=$(cut -d' ' -f1 /proc/self/stat)\nexec ls / >/dev/null\n",
    )
    .unwrap();
    std::fs::set_permissions(&step, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = format!("for i in $(seq 20); do {}; cat /proc/self/stat >/dev/null; done", step.display());
    let run = record(&["--stack-sample", "1", "--fold-below", "0"], &["/bin/sh", "-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let children = folded
        .lines()
        .filter(|l| ["ls;", "cat;", "step;", "cut;", "basename;", "readlink;"].iter().any(|c| l.starts_with(c)))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(share_where(&folded, |l| l.starts_with("ls;")) > 0.0, "no stack of ls:\n{folded}");
    let unknown = share_where(&children, |l| l.contains("[unknown] 0x"));
    assert!(unknown < 0.05, "{:.1}% of the children's faults under an unnamed frame:\n{children}", unknown * 100.0);
    // The loader's own work (relocations) is named.
    assert!(share_where(&children, |l| l.contains(";_dl_")) > 0.0, "no frame of ld.so named:\n{children}");
}

#[test]
fn leaf_region_shows_the_faulting_mapping() {
    privileged!();
    let (_dir, bin) = faulter();
    let run = record(&["--leaf", "region", "--stack-sample", "4"], &[bin.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let share = share_under(&folded, "fill_buffer_with_faults;[anon ");
    assert!(share >= 0.85, "{:.1}% land on the anonymous mapping as leaf:\n{folded}", share * 100.0);
}

#[test]
fn no_stacks_means_no_flamegraphs() {
    privileged!();
    let run = record(&["--stacks", "none"], &["true"]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(run.summary.get("stacks").is_none());
    assert!(!run.out.path().join("faults.svg").exists());
}

const FAMILY_C: &str = r#"
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) void touch_in_family(size_t n) {
    volatile char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) _exit(2);
    madvise((void *)p, n, MADV_NOHUGEPAGE);
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    munmap((void *)p, n);
}

/* Faults at `depth` frames below its first call: each depth is another stack. */
__attribute__((noinline)) void fault_at_depth(volatile char *p, int depth) {
    if (depth > 0) {
        fault_at_depth(p, depth - 1);
        return;
    }
    *p = 1;
}

/* Faults on every CPU from 256 other stacks: each CPU's slots of stack
   counts (`STACK_CUR`, direct-mapped, 16 a CPU) then hold none of the
   children's keys, which would keep them "in flight", and their last
   counts are counted: they can retire. */
__attribute__((noinline)) void fault_on_every_cpu(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long cpu = 0; cpu < n; cpu++) {
        pid_t c = fork();
        if (c == 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu, &set);
            sched_setaffinity(0, sizeof set, &set);
            volatile char *p = mmap(NULL, 256 << 12, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) _exit(2);
            for (int d = 0; d < 256; d++) fault_at_depth(p + ((size_t)d << 12), d);
            _exit(0);
        }
        waitpid(c, NULL, 0);
    }
}

/* 24 children take their faults and exit; once the collector let go of
   their stacks (the test creates the file $GO when its log says so; 120 s
   at most), the parent takes its own from the same call site: the same
   stack. Until then it faults on every CPU each 200 ms, so that no CPU
   holds the children's last counts. */
int main(void) {
    const char *go = getenv("GO");
    for (int i = 0; i <= 24; i++) {
        pid_t c = i < 24 ? fork() : 0;
        if (i == 24) {
            for (int t = 0; t < 600 && (!go || access(go, F_OK) != 0); t++) {
                fault_on_every_cpu();
                usleep(200 * 1000);
            }
        }
        if (c == 0) {
            touch_in_family(i < 24 ? 8UL << 20 : 64UL << 20);
            if (i < 24) _exit(0);
            break;
        }
        waitpid(c, NULL, 0);
    }
    return 0;
}
"#;

/// Retired processes' drained stacks are let go once symbolized: fork
/// children that exited (and were let go) shared their stack with their
/// parent, which walks it again later. The parent's faults keep their
/// stack, and the children's theirs. The parent waits for the collector's
/// log to say it let go of drained stacks (however long a loaded machine
/// takes to retire the children), then faults.
#[test]
fn stacks_of_released_children_go_and_their_parent_keeps_the_same_stack() {
    use std::io::BufRead as _;
    privileged!();
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_source(dir.path(), "family", FAMILY_C);
    let go = dir.path().join("go");
    let out = tempfile::tempdir().unwrap();
    let mut child = vmtrace()
        .env("VMTRACE_RELEASE_ABOVE", "0")
        .env("RUST_LOG", "warn,vmtrace::release=debug")
        .env("GO", &go)
        .args(["record", "--stack-sample", "1", "--out"])
        .arg(out.path())
        .arg("--")
        .arg(&bin)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut { stdout }, &mut v).unwrap();
        v
    });
    // The log, line by line: the first "N drained stacks let go" with N > 0
    // lets the parent go on.
    let (mut stderr, mut let_go) = (Vec::new(), 0);
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        let n: u64 = line
            .split_once(" drained stacks let go")
            .and_then(|(l, _)| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0);
        if n > 0 && let_go == 0 {
            std::fs::write(&go, b"").unwrap();
        }
        let_go += n;
        stderr.extend_from_slice(line.as_bytes());
        stderr.push(b'\n');
    }
    let output = std::process::Output { status: child.wait().unwrap(), stdout: reader.join().unwrap(), stderr };
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert!(let_go > 0, "the children's stacks were never let go in 120 s:\n{}", run.stderr());
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let under: u64 = folded
        .lines()
        .filter(|l| l.contains(";touch_in_family"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    // 24 × 8 MiB and 64 MiB of 4 KiB pages.
    let want = 24 * 2048 + 16_384;
    assert!(under * 100 >= want * 95, "{under} of {want} faults under touch_in_family:\n{folded}");
}

/// The process frame of the folded files names a process's rank, pod and
/// container: the faulter run in a Kubernetes-style memory cgroup
/// (`kubepods/burstable/pod<uid>/<container id>`) with `RANK` and
/// `WORLD_SIZE` in its environment, beside a faulter of the same name
/// outside it and without them, whose lines stay as they were. The pprof
/// profile keeps the process frame a name and carries the identity as
/// labels, on the same weights, also when `vmtrace report` rebuilds it from
/// the folded file.
#[test]
fn folded_lines_name_the_pod_container_and_rank_of_their_process() {
    privileged!();
    let (_dir, bin) = faulter();
    let cg = PodCgroup::new();
    // A faulter outside the pod and without a rank, then the shell moves
    // itself into the pod's container and becomes the other faulter.
    let script = format!(
        "env -u RANK -u WORLD_SIZE {bin} && echo $$ > {}/cgroup.procs && exec {bin}",
        cg.leaf.display(),
        bin = bin.display()
    );
    let out = tempfile::tempdir().unwrap();
    let output = vmtrace()
        .args(["record", "--events", "faults", "--stacks", "user", "--stack-sample", "1", "--out"])
        .arg(out.path())
        .args(["--", "sh", "-c", &script])
        .env("RANK", "3")
        .env("WORLD_SIZE", "4")
        .output()
        .unwrap();
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let procs = run.summary["processes"].as_array().unwrap();
    let row = procs
        .iter()
        .find(|p| p["pod_uid"] == cg.uid.as_str())
        .unwrap_or_else(|| panic!("no process of pod {} in {procs:#?}", cg.uid));
    assert_eq!((row["comm"].as_str(), row["container_id"].as_str()), (Some("faulter"), Some(cg.id.as_str())), "{row}");
    assert_eq!((&row["rank"]["rank"], &row["rank"]["world_size"]), (&3.into(), &4.into()), "{row}");
    let frame = format!("faulter [rank 3/4 pod {} ctr {}]", &cg.uid[..8], &cg.id[..12]);
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let weight = |pred: &dyn Fn(&str) -> bool| -> u64 {
        vmtrace::export::pprof::parse_folded(&folded).filter(|(l, _)| pred(l)).map(|(_, w)| w).sum()
    };
    let in_pod = weight(&|l| l.starts_with(&format!("{frame};")));
    let outside = weight(&|l| l.starts_with("faulter;"));
    eprintln!("{frame}: {in_pod} faults; faulter outside the pod: {outside}\n{folded}");
    // Each touched 32 MiB (8,192 pages) under fill_buffer_with_faults.
    for (what, n) in [("in the pod", in_pod), ("outside it", outside)] {
        assert!(n >= 8192, "{what}: {n} faults\n{folded}");
    }
    assert!(
        weight(&|l| l.starts_with(&format!("{frame};")) && l.contains("fill_buffer_with_faults")) >= 8192,
        "{folded}"
    );
    // No line carries a rank, pod or container but the pod's faulter's.
    assert!(folded.lines().all(|l| !l.contains(" [rank ") || l.starts_with(&format!("{frame};"))), "{folded}");
    // The profiles: the same faults under the pod's labels, no frame naming them.
    let labelled = |dir: &std::path::Path| {
        use prost::Message as _;
        use std::io::Read as _;
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(dir.join("faults.pb.gz")).unwrap())
            .read_to_end(&mut raw)
            .unwrap();
        let p = vmtrace::export::pprof::Profile::decode(raw.as_slice()).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert!(p.function.iter().all(|f| !s(f.name).contains(" [rank ")), "a frame names the identity");
        let has = |x: &vmtrace_protos::pprof::Sample, k: &str, v: &str| {
            x.label.iter().any(|l| s(l.key) == k && s(l.str) == v)
        };
        p.sample
            .iter()
            .filter(|x| has(x, "pod_uid", &cg.uid) && has(x, "container_id", &cg.id) && has(x, "rank", "3"))
            .map(|x| x.value[0] as u64)
            .sum::<u64>()
    };
    assert_eq!(labelled(run.out.path()), in_pod, "faults.pb.gz against faults.folded");
    let rebuilt = vmtrace().arg("report").arg(run.out.path()).output().unwrap();
    assert!(rebuilt.status.success(), "{}", String::from_utf8_lossy(&rebuilt.stderr));
    assert_eq!(labelled(run.out.path()), in_pod, "faults.pb.gz rebuilt from faults.folded");
}

/// 1,024 distinct call paths (10 levels of `left`/`right`), each faulting
/// four fresh pages from the same call site, twice, with a pause after
/// each round; then the program's own getrusage counts.
const PATHS_C: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define DEPTH 10
static volatile char *buf;
static unsigned long next_page;

__attribute__((noinline)) void touch_a_page(void) { buf[next_page++ * 4096] = 1; }
__attribute__((noinline)) void left(int d, unsigned bits);
__attribute__((noinline)) void right(int d, unsigned bits);

__attribute__((noinline)) void step(int d, unsigned bits) {
    if (d == 0) {
        for (int i = 0; i < 4; i++) touch_a_page();
        return;
    }
    if (bits & 1) left(d - 1, bits >> 1); else right(d - 1, bits >> 1);
    __asm__ volatile("" ::: "memory");
}
void left(int d, unsigned bits) { step(d, bits); __asm__ volatile("" ::: "memory"); }
void right(int d, unsigned bits) { step(d, bits); __asm__ volatile("" ::: "memory"); }

int main(void) {
    unsigned long pages = 2UL * (1UL << DEPTH) * 4 + 16;
    char *p = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    madvise(p, pages * 4096, MADV_NOHUGEPAGE);
    buf = p;
    for (int round = 0; round < 2; round++) {
        for (unsigned b = 0; b < (1U << DEPTH); b++) step(DEPTH, b);
        sleep(3);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("rusage %ld %ld\n", ru.ru_minflt, ru.ru_majflt);
    fflush(stdout);
    /* Its own resident memory as it ends. */
    static char own[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY);
    ssize_t n = fd < 0 ? 0 : read(fd, own, sizeof own - 1);
    if (n > 0) write(1, own, n);
    return 0;
}
"#;

/// A process that lives on with thousands of distinct stacks has its
/// settled keys sealed while recording (`VMTRACE_STACK_SEAL_MS`, every
/// 500 ms here, whatever the drained stacks held): their drained stacks
/// go, the same stacks counted again afterwards are stored again, and the
/// outputs still add up to the kernel's counts: the process's faults to
/// its getrusage, faults.folded to the summary's total, and the faults
/// under the paths to the pages touched. (Resident memory off; with it
/// on, the next test.)
#[test]
fn a_live_processs_settled_stacks_are_sealed_and_still_add_up() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_source(dir.path(), "paths", PATHS_C);
    let out = tempfile::tempdir().unwrap();
    let output = vmtrace()
        .env("VMTRACE_STACK_SEAL_MS", "500")
        .env("VMTRACE_STACK_SEAL_ABOVE", "0")
        .args(["record", "--events", "faults", "--stacks", "user", "--stack-sample", "1", "--out"])
        .arg(out.path())
        .arg("--")
        .arg(&bin)
        .output()
        .unwrap();
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let stdout = String::from_utf8_lossy(&run.output.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("rusage ")).unwrap_or_else(|| panic!("{stdout}"));
    let kernel: u64 = line.split_whitespace().map(|x| x.parse::<u64>().unwrap()).sum();
    let pid = u32::try_from(run.summary["target"]["pid"].as_u64().unwrap()).unwrap();
    let ours = u(&run.process(pid)["faults"]["total"]);
    // The kernel also counts faults of get_user_pages() and those after
    // getrusage (the printf, the exit): a handful.
    assert!(ours.abs_diff(kernel) <= 200, "vmtrace {ours} faults, getrusage {kernel}");
    let st = &run.summary["stacks"];
    let (keys, let_go) = (u(&st["sealed_keys"]), u(&st["sealed_stacks"]));
    eprintln!("sealed {keys} keys, {let_go} drained stacks let go; {st}");
    assert!(keys >= 1024 && let_go >= 1024, "sealed {keys} keys, {let_go} drained stacks let go: {st}");
    // What is held at the end: the stacks counted since the last sealing.
    assert!(u(&st["drained_stacks"]) < 512, "{st}");
    // A shape per path, both rounds in one (two rounds kept apart would be
    // 2,048), and some more: a copied stack cut short (`[unwind left code]`,
    // more of them beside a build: 491 cut, 1,169 shapes) is a shape of its
    // own.
    let cut: u64 = st["cut"].as_object().map_or(0, |c| c.values().map(u).sum());
    let shapes = u(&st["sealed_shapes"]);
    assert!(shapes >= 1024 && shapes < 1024 + 64 + cut, "{shapes} shapes, {cut} stacks cut: {st}");
    let folded = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let total = u(&run.summary["totals"]["total"]);
    assert_close("faults.folded", vmtrace::stacks::flamegraph::total(&folded), total, 0.5);
    let under: u64 = folded
        .lines()
        .filter(|l| l.contains(";main;step;"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    let want = 2 * 1024 * 4;
    assert!(under * 100 >= want * 98 && under <= want + 64, "{under} of {want} faults under the paths:\n{folded}");
    assert!(!folded.contains(vmtrace::stacks::native::LIGHTER), "{folded}");
}

/// A /proc line's value in kB ("Anonymous:   114792 kB"), as bytes.
fn kb(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.trim_start_matches(':').split_whitespace().next()))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        * 1024
}

/// The program of `a_live_processs_settled_stacks_are_sealed_and_still_add_up`
/// with the default events (resident memory on, every page sampled at
/// `--stack-sample 1`): when a key is sealed, the sampled pages its stack
/// owns (and the peak snapshot's) take the stack as an owner shape, so the
/// drained stacks go all the same (4,117 keys sealed, 13 stacks let go,
/// before), and the process's resident profile still adds up to its
/// resident end and peak, its end matches its own smaps_rollup read as it
/// ended, and the pages under the paths are the buffer it touched.
#[test]
fn a_live_processs_sealed_stacks_go_with_resident_memory_on_and_its_resident_profile_adds_up() {
    privileged!();
    let dir = disk_dir();
    let bin = compile_source(dir.path(), "paths", PATHS_C);
    let out = tempfile::tempdir().unwrap();
    let output = vmtrace()
        .env("VMTRACE_STACK_SEAL_MS", "500")
        .env("VMTRACE_STACK_SEAL_ABOVE", "0")
        .args(["record", "--stacks", "user", "--stack-sample", "1", "--out"])
        .arg(out.path())
        .arg("--")
        .arg(&bin)
        .output()
        .unwrap();
    let run = finish(out, output);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let stdout = String::from_utf8_lossy(&run.output.stdout).to_string();
    let st = &run.summary["stacks"];
    let (keys, let_go) = (u(&st["sealed_keys"]), u(&st["sealed_stacks"]));
    eprintln!("sealed {keys} keys, {let_go} drained stacks let go; {st}");
    assert!(keys >= 1024 && let_go >= 1024, "sealed {keys} keys, {let_go} drained stacks let go: {st}");
    assert!(u(&st["drained_stacks"]) < 512, "{st}");
    let pid = u32::try_from(run.summary["target"]["pid"].as_u64().unwrap()).unwrap();
    let r = &run.process(pid)["resident"];
    assert!(r.is_object(), "no resident figures: {:#}", run.process(pid));
    let (end_bytes, peak_bytes) = (u(&r["end_bytes"]), u(&r["peak_bytes"]));
    assert_close("resident at the end", end_bytes, kb(&stdout, "Rss"), 5.0);
    assert_close("resident at the end (anon)", u(&r["anon_bytes"]), kb(&stdout, "Anonymous"), 5.0);
    let read = |f: &str| std::fs::read_to_string(run.out.path().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let (end, peak) = (read("resident.folded"), read("resident-peak.folded"));
    let weight = |folded: &str, pred: &dyn Fn(&str) -> bool| -> u64 {
        folded.lines().filter(|l| pred(l)).filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok()).sum()
    };
    let mine = |l: &str| l.split(';').next() == Some("paths");
    // Rounding: a byte or so a stack.
    let near = |what: &str, got: u64, want: u64, lines: &str| {
        let slack = lines.lines().count() as u64 + 16;
        assert!(got.abs_diff(want) <= slack, "{what}: {got} against {want}:\n{lines}");
    };
    near("resident.folded against end_bytes", weight(&end, &mine), end_bytes, &end);
    near("resident-peak.folded against peak_bytes", weight(&peak, &mine), peak_bytes, &peak);
    let under = weight(&end, &|l: &str| mine(l) && l.contains(";main;step;"));
    let want = 2 * 1024 * 4 * 4096;
    assert_close("resident bytes under the paths", under, want, 10.0);
    assert!(!end.contains(vmtrace::stacks::native::LIGHTER), "{end}");
}
