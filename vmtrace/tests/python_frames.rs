//! Python frames in user stacks (privileged): pyenv's CPythons (built
//! without frame pointers, no `-X perf`) running a script whose faults come
//! from one known function; its faults are named by that function's line,
//! with its callers' lines beneath.
mod common;

use common::*;

/// Line 5 takes the faults; `main` calls it at line 10, the module `main` at 14.
const FILL: &str = "\
import sys

def fill_buffers(n):
    bufs = []
    for _ in range(n): bufs.append(bytearray(4 << 20))
    return bufs

def main(rounds):
    for _ in range(rounds):
        b = fill_buffers(40)
        del b

if __name__ == '__main__':
    main(int(sys.argv[1]))
";

/// The chain every fill_buffers fault should show.
const CHAIN: &str = "<module> (fill.py:14);main (fill.py:10);fill_buffers (fill.py:5)";

/// `FILL`'s functions run in a thread, then in two forked workers.
const SPREAD: &str = "\
import sys, threading, multiprocessing as mp

def fill_buffers(n):
    bufs = []
    for _ in range(n): bufs.append(bytearray(4 << 20))
    return bufs

def main(rounds):
    for _ in range(rounds):
        b = fill_buffers(40)
        del b

if __name__ == '__main__':
    rounds = int(sys.argv[1])
    t = threading.Thread(target=main, args=(rounds,)); t.start(); t.join()
    ps = [mp.get_context('fork').Process(target=main, args=(rounds,)) for _ in range(2)]
    [p.start() for p in ps]; [p.join() for p in ps]
";

fn record_fill(minor: u32) -> Option<(Run, String)> {
    record_script(minor, FILL)
}

fn record_script(minor: u32, text: &str) -> Option<(Run, String)> {
    let python = pyenv_python(minor)?;
    let dir = disk_dir();
    let script = dir.path().join("fill.py");
    std::fs::write(&script, text).unwrap();
    let rounds = (12 / scale()).max(2).to_string();
    let run = record(
        &["--stacks", "user", "--stack-sample", "4"],
        &[python.to_str().unwrap(), script.to_str().unwrap(), &rounds],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    Some((run, f))
}

fn fill_buffers_is_named(minor: u32) {
    let Some((run, f)) = record_fill(minor) else { return };
    // A shallow script's walks are cut only where a frame could not be read
    // (3.11's start-up took 277 of them once).
    eprintln!("3.{minor}: python_truncated_faults {}", run.summary["stacks"]["python_truncated_faults"]);
    let named = folded_share(&f, |l| python_only(l).contains(CHAIN));
    eprintln!("3.{minor}: {:.1}% of fault weight under {CHAIN}", named * 100.0);
    assert!(named >= 0.9, "3.{minor}: {:.1}% of fault weight under {CHAIN}:\n{f}", named * 100.0);
    // Python frames replace the evaluation loop's, not add to them.
    let doubled = folded_share(&f, |l| l.contains("fill_buffers (") && l.contains("_PyEval_EvalFrameDefault;"));
    assert!(doubled < 0.05, "3.{minor}: evaluation-loop frames left among Python ones:\n{f}");
}

#[test]
fn python_3_10_faults_are_named_by_line() {
    privileged!();
    fill_buffers_is_named(10);
}

#[test]
fn python_3_11_faults_are_named_by_line() {
    privileged!();
    fill_buffers_is_named(11);
}

#[test]
fn python_3_12_faults_are_named_by_line() {
    privileged!();
    fill_buffers_is_named(12);
}

#[test]
fn python_3_13_faults_are_named_by_line() {
    privileged!();
    fill_buffers_is_named(13);
}

/// `Thread.run` and `Process._bootstrap` as version `minor` names them: 3.10's
/// code objects have no qualified name.
fn run_and_bootstrap(minor: u32) -> (&'static str, &'static str) {
    if minor == 10 {
        (";run (threading.py:", ";_bootstrap (process.py:")
    } else {
        ("Thread.run (threading.py:", "Process._bootstrap (process.py:")
    }
}

/// A thread's faults and forked workers' faults, each under their own
/// Python frames: the thread's beneath `Thread.run`, the workers' beneath
/// `Process._bootstrap`.
fn threads_and_workers_are_named(minor: u32) {
    let Some((run, f)) = record_script(minor, SPREAD) else { return };
    let inner = "main (fill.py:10);fill_buffers (fill.py:5)";
    let named = folded_share(&f, |l| python_only(l).contains(inner));
    assert!(named >= 0.85, "3.{minor}: {:.1}% of fault weight under {inner}:\n{f}", named * 100.0);
    let (run_frame, bootstrap) = run_and_bootstrap(minor);
    let thread = folded_share(&f, |l| python_only(l).contains(run_frame) && python_only(l).contains(inner));
    let workers = folded_share(&f, |l| python_only(l).contains(bootstrap) && python_only(l).contains(inner));
    eprintln!(
        "3.{minor}: {:.1}% under {inner}, {:.1}% of it in the thread, {:.1}% in the workers",
        named * 100.0,
        thread * 100.0,
        workers * 100.0
    );
    assert!(thread >= 0.2, "3.{minor}: {:.1}% under the thread's frames:\n{f}", thread * 100.0);
    assert!(workers >= 0.4, "3.{minor}: {:.1}% under the workers' frames:\n{f}", workers * 100.0);
    let st = &run.summary["stacks"];
    assert!(u(&st["python_faults"]) * 10 >= u(&st["sampled_faults"]) * 8, "{st}");
}

#[test]
fn python_3_10_threads_and_forked_workers_are_named() {
    privileged!();
    threads_and_workers_are_named(10);
}

#[test]
fn python_3_11_threads_and_forked_workers_are_named() {
    privileged!();
    threads_and_workers_are_named(11);
}

#[test]
fn python_3_12_threads_and_forked_workers_are_named() {
    privileged!();
    threads_and_workers_are_named(12);
}

#[test]
fn python_3_13_threads_and_forked_workers_are_named() {
    privileged!();
    threads_and_workers_are_named(13);
}

/// `fill_buffers` (line 5) faults 55 Python frames deep: `<module>`, `main`,
/// `Deep.__iter__` (entered from C: `for` calls `PyObject_GetIter`, whose
/// slot runs a new evaluation-loop call) and 51 frames of `down`.
const DEEP: &str = "\
import sys

def fill_buffers(n):
    bufs = []
    for _ in range(n): bufs.append(bytearray(4 << 20))
    return bufs

def down(d, rounds):
    if d == 0:
        for _ in range(rounds):
            b = fill_buffers(40)
            del b
        return
    down(d - 1, rounds)

class Deep:
    def __iter__(self):
        down(50, int(sys.argv[1]))
        return iter(())

def main():
    for _ in Deep():
        pass

if __name__ == '__main__':
    main()
";

/// A stack deeper than the kernel keeps (`PY_DEPTH`): its innermost frames,
/// after one `[python truncated]` frame, where they ran (beneath the C slot
/// that entered `Deep.__iter__`'s call), never in the outer calls' place
/// (uc28: `DataLoader.__iter__` sat under `PyEval_EvalCode`).
fn deep_stacks_keep_their_innermost_frames(minor: u32) {
    let Some((run, f)) = record_script(minor, DEEP) else { return };
    let depth = vmtrace_common::PY_DEPTH;
    // summary.json counts the cut stacks' faults, within the Python ones,
    // and summary.txt says so.
    let st = &run.summary["stacks"];
    let (cut, python) = (st["python_truncated_faults"].as_u64().unwrap(), st["python_faults"].as_u64().unwrap());
    assert!(cut > 0 && cut <= python, "3.{minor}: python_truncated_faults {cut} of python_faults {python}");
    let text = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
    assert!(text.contains("Python stacks cut short"), "3.{minor}: summary.txt:\n{text}");
    let inner = format!("{}fill_buffers (fill.py:5)", "down (fill.py:14);".repeat(depth - 2) + "down (fill.py:11);");
    let stack = |l: &str| l.rsplit_once(' ').map_or(l, |(s, _)| s).split(';').map(str::to_string).collect::<Vec<_>>();
    // The kept frames, right after the marker and nothing Python before it.
    let cut_right = |l: &str| {
        let frames = stack(l);
        let Some(first) = frames.iter().position(|f| vmtrace::python::is_python_frame(f)) else { return false };
        first > 0 && frames[first - 1] == "[python truncated]" && python_only(l) == inner
    };
    let named = folded_share(&f, cut_right);
    assert!(named >= 0.9, "3.{minor}: {:.1}% under [python truncated];{inner}:\n{f}", named * 100.0);
    // Where the native stack shows the C slot that entered `Deep.__iter__`,
    // every Python frame sits beneath it.
    let through_slot = |l: &str| stack(l).iter().any(|f| f == "slot_tp_iter") && python_only(l) == inner;
    let misplaced: Vec<&str> = f
        .lines()
        .filter(|l| through_slot(l))
        .filter(|l| {
            let frames = stack(l);
            let slot = frames.iter().position(|f| f == "slot_tp_iter").unwrap();
            frames[..slot].iter().any(|f| vmtrace::python::is_python_frame(f) || f == "[python truncated]")
        })
        .collect();
    assert!(misplaced.is_empty(), "3.{minor}: Python frames above the slot that ran them:\n{}", misplaced.join("\n"));
    // 3.11+ runs Python calls without C recursion: its native stacks reach
    // the slot (3.10's, three C frames a call, end in the stack window).
    let shown = folded_share(&f, through_slot);
    eprintln!(
        "3.{minor}: {:.1}% of fault weight under [python truncated] and the {depth} innermost frames, {:.1}% through slot_tp_iter",
        named * 100.0,
        shown * 100.0
    );
    if minor >= 11 {
        assert!(shown >= 0.5, "3.{minor}: {:.1}% of fault weight through slot_tp_iter:\n{f}", shown * 100.0);
    }
}

#[test]
fn python_3_10_deep_stacks_keep_their_innermost_frames() {
    privileged!();
    deep_stacks_keep_their_innermost_frames(10);
}

#[test]
fn python_3_11_deep_stacks_keep_their_innermost_frames() {
    privileged!();
    deep_stacks_keep_their_innermost_frames(11);
}

#[test]
fn python_3_12_deep_stacks_keep_their_innermost_frames() {
    privileged!();
    deep_stacks_keep_their_innermost_frames(12);
}

#[test]
fn python_3_13_deep_stacks_keep_their_innermost_frames() {
    privileged!();
    deep_stacks_keep_their_innermost_frames(13);
}

/// 3.9 has no table here: native stacks only, and summary.json says so.
#[test]
fn python_3_9_stays_native_with_a_note() {
    privileged!();
    let Some((run, f)) = record_fill(9) else { return };
    assert!(!f.contains("fill_buffers ("), "{f}");
    let note = run.summary["stacks"]["python_native_only"].to_string();
    assert!(note.contains("python3.9"), "{}", run.summary["stacks"]);
}

/// Workers started by `multiprocessing`'s spawn (a fresh Python, exec'd):
/// found as their maps are read, their faults under their own frames.
fn spawned_workers_are_named(minor: u32) {
    let text = SPREAD.replace("mp.get_context('fork')", "mp.get_context('spawn')");
    let Some((_run, f)) = record_script(minor, &text) else { return };
    let inner = "main (fill.py:10);fill_buffers (fill.py:5)";
    let (_, bootstrap) = run_and_bootstrap(minor);
    let workers = folded_share(&f, |l| python_only(l).contains(bootstrap) && python_only(l).contains(inner));
    eprintln!("3.{minor}: {:.1}% under the spawned workers' frames", workers * 100.0);
    // A spawned worker first imports its modules again: those faults (their
    // share varies with timing, 37–60% here) are under the import machinery.
    assert!(workers >= 0.25, "3.{minor}: {:.1}% under the spawned workers' frames:\n{f}", workers * 100.0);
}

#[test]
fn python_3_10_spawned_workers_are_named() {
    privileged!();
    spawned_workers_are_named(10);
}

#[test]
fn python_3_12_spawned_workers_are_named() {
    privileged!();
    spawned_workers_are_named(12);
}

/// `alpha` faults (line 7), is freed, then copies of `betaa` are made until
/// one's code object takes the freed one's address (the interpreter's own
/// `id()` says when), and that `betaa` faults (line 18).
const REUSE: &str = "\
import sys, time
A = 'def alpha():\\n    return bytearray(8 << 20)\\n'
B = 'def betaa():\\n    return bytearray(8 << 20)\\n'
ns = {}; exec(A, ns); f = ns.pop('alpha'); old = id(f.__code__)
# Given time to be found, then to have its code object read while it lives.
time.sleep(0.3)
f()
time.sleep(0.3)
del f, ns
kept = []
for _ in range(5000):
    ns = {}; exec(B, ns); g = ns['betaa']
    if id(g.__code__) == old:
        break
    kept.append(g)
else:
    sys.exit('no code object took the address of the freed one')
g()
";

/// A code object's address is taken by another once it is freed: the
/// frames of each are named by their own code (the kernel stamps each
/// frame's code object, `py_code_stamp`), never by the one read earlier at
/// that address; a frame whose code object was gone before it was read is
/// named `[python code freed]` and counted in summary.json.
fn a_freed_code_objects_address_names_its_new_code(minor: u32) {
    let Some(python) = pyenv_python(minor) else { return };
    let dir = disk_dir();
    let script = dir.path().join("reuse.py");
    std::fs::write(&script, REUSE).unwrap();
    let run =
        record(&["--stacks", "user", "--stack-sample", "1"], &[python.to_str().unwrap(), script.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "3.{minor}: {}", run.stderr());
    let f = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let chain = |l: &str| python_only(l);
    let (alpha_call, betaa_call) = ("<module> (reuse.py:7)", "<module> (reuse.py:18)");
    let misnamed: Vec<&str> = f
        .lines()
        .filter(|l| {
            (chain(l).contains(betaa_call) && l.contains("alpha ("))
                || (chain(l).contains(alpha_call) && l.contains("betaa ("))
        })
        .collect();
    assert!(misnamed.is_empty(), "3.{minor}: frames named by another code object:\n{}", misnamed.join("\n"));
    let share = |call: &str, name: &str| folded_share(&f, |l| chain(l).contains(call) && l.contains(name));
    let st = &run.summary["stacks"];
    eprintln!(
        "3.{minor}: {:.1}% of fault weight named alpha, {:.1}% betaa; unnamed: faults {}, codes freed {}, unreadable {}",
        share(alpha_call, "alpha (<string>:2)") * 100.0,
        share(betaa_call, "betaa (<string>:2)") * 100.0,
        st["python_unnamed_faults"],
        st["python_codes_freed"],
        st["python_codes_unreadable"]
    );
    // What could not be named is said, never left silent.
    let unnamed = folded_share(&f, |l| l.contains("[python code freed]") || l.contains("[unknown python]"));
    if unnamed > 0.0 {
        assert!(u(&st["python_unnamed_faults"]) > 0, "3.{minor}: unnamed frames not counted: {st}");
        let txt = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap();
        assert!(txt.contains("Python frames not named"), "3.{minor}: summary.txt does not say so:\n{txt}");
    }
    if f.contains("[python code freed]") {
        assert!(u(&st["python_codes_freed"]) > 0, "3.{minor}: {st}");
    }
}

#[test]
fn python_3_10_a_freed_code_objects_address_names_its_new_code() {
    privileged!();
    a_freed_code_objects_address_names_its_new_code(10);
}

#[test]
fn python_3_11_a_freed_code_objects_address_names_its_new_code() {
    privileged!();
    a_freed_code_objects_address_names_its_new_code(11);
}

#[test]
fn python_3_12_a_freed_code_objects_address_names_its_new_code() {
    privileged!();
    a_freed_code_objects_address_names_its_new_code(12);
}

#[test]
fn python_3_13_a_freed_code_objects_address_names_its_new_code() {
    privileged!();
    a_freed_code_objects_address_names_its_new_code(13);
}

/// A Python in a container's files: its own mount namespace (`unshare -m`)
/// and root (`chroot` into a tmpfs holding a copy of pyenv's 3.12 and
/// libpython, its stdlib bound in, /usr bound in). Its interpreter is found
/// and read through its root (`procmaps::root`); the paths its maps name do
/// not exist here. Its faults are named by the Python function and line.
#[test]
fn a_python_in_its_own_mount_namespace_and_root_is_named_by_line() {
    privileged!();
    let Some(python) = pyenv_python(12) else { return };
    let home = python.parent().and_then(std::path::Path::parent).unwrap().to_path_buf();
    let dir = disk_dir();
    let jail = dir.path().join("jail");
    std::fs::create_dir_all(&jail).unwrap();
    let script = format!(
        "set -e; J={j}; H={h}\n\
         mount -t tmpfs none $J\n\
         mkdir -p $J/usr $J/opt/py/bin $J/opt/py/lib/python3.12 $J/tmp\n\
         mount --bind /usr $J/usr\n\
         ln -s usr/lib $J/lib; ln -s usr/lib64 $J/lib64; ln -s usr/bin $J/bin\n\
         cp $H/bin/python3.12 $J/opt/py/bin/; cp $H/lib/libpython3.12.so.1.0 $J/opt/py/lib/\n\
         mount --bind $H/lib/python3.12 $J/opt/py/lib/python3.12\n\
         exec chroot $J /usr/bin/env PYTHONHOME=/opt/py LD_LIBRARY_PATH=/opt/py/lib /opt/py/bin/python3.12 -c '{py}'\n",
        j = jail.display(),
        h = home.display(),
        py = "def touch_in_jail(n):\n    b = bytearray(n)\n    for i in range(0, n, 4096):\n        b[i] = 1\n    return b\nx = touch_in_jail(64 << 20)\n"
    );
    let run = record(&["--stack-sample", "4"], &["unshare", "-m", "--propagation", "private", "sh", "-c", &script]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let f = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok()).unwrap_or(0);
    let named: u64 = f.lines().filter(|l| l.contains(";touch_in_jail (<string>:")).map(weight).sum();
    // 64 MiB written page by page from that line: 16,384 faults, sampled 1 in 4.
    assert!(named >= 2000, "{named} sampled faults named touch_in_jail:\n{f}");
}
