//! Real Python workloads under each of pyenv's CPythons (privileged; built
//! without frame pointers, no `-X perf`): numpy and safetensors from the
//! package registry in a virtualenv per version. What a user asks of the
//! tool — which line of my script — is answered by the stacks.
mod common;

use common::*;

/// A storm needs both threads on CPUs at once: one storm test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// numpy temporaries freed in two threads (`MALLOC_MMAP_THRESHOLD_`: every
/// free unmaps): the storm's culprit names the Python function that makes them.
fn numpy_munmap_storm_is_blamed_on_the_python_function(minor: u32) {
    let Some(base) = pyenv_python(minor) else { return };
    let python = python_from(&base, &["numpy"]);
    let dir = disk_dir();
    let script = dir.path().join("temps.py");
    let text = "import threading, numpy as np\n\
                def work():\n    for _ in range(4000):\n        a = np.ones(40000)\n        b = a * 2.0\n        del a, b\n\
                ts = [threading.Thread(target=work) for _ in range(2)]\n\
                [t.start() for t in ts]\n[t.join() for t in ts]\n";
    std::fs::write(&script, text).unwrap();
    let threshold = 200 / scale();
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let ipis0 = tlb_ipis_received();
    let run = record(
        &["--storm-threshold", &threshold.to_string()],
        &["env", "MALLOC_MMAP_THRESHOLD_=131072", python.to_str().unwrap(), script.to_str().unwrap()],
    );
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let storms = run.summary["storms"].as_array().expect("storms");
    if kernel_saw_a_storm(&run, ipis0, threshold) {
        assert!(!storms.is_empty(), "3.{minor}: no storm: {}", run.summary["processes"]);
        let text = std::fs::read_to_string(run.out.path().join("summary.txt")).unwrap_or_default();
        assert!(text.contains("work (temps.py:"), "3.{minor}: the storm line names it: {text}");
    }
    for s in storms {
        let stack: Vec<&str> = s["top_stack"].as_array().unwrap().iter().filter_map(|f| f.as_str()).collect();
        assert!(stack.iter().any(|f| f.starts_with("work (temps.py:")), "3.{minor}: culprit names it: {stack:?}");
    }
    // Storm or not, the IPIs sent are blamed on the Python function.
    let folded = std::fs::read_to_string(run.out.path().join("shootdowns.folded")).unwrap_or_default();
    if vmtrace::stacks::flamegraph::total(&folded) >= 100 {
        let share = folded_share(&folded, |l| l.contains("work (temps.py:"));
        assert!(share >= 0.5, "3.{minor}: {:.1}% of the IPIs under work():\n{folded}", share * 100.0);
    }
}

/// Line 10 loads the checkpoint; `main` calls `load` at line 13.
const LOAD: &str = "\
import os, sys
from safetensors.numpy import load_file

def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

def load(path): return load_file(path)

def main(path):
    return load(path)

evict(sys.argv[1])
tensors = main(sys.argv[1])
";

/// A cold safetensors checkpoint (written back and evicted first, read by
/// safetensors' default mmap backend): its faults, major ones included, and
/// their time are under the line that loads it.
fn cold_safetensors_load_is_blamed_on_the_loading_line(minor: u32) {
    let Some(base) = pyenv_python(minor) else { return };
    let python = python_from(&base, &["numpy", "safetensors"]);
    let (dir, ckpt) = safetensors_on_disk(32);
    let script = dir.path().join("load.py");
    std::fs::write(&script, LOAD).unwrap();
    // Every fault's stack and time taken: the default samples (1 in 64
    // stacks, 1 in 16 fast faults timed, each standing for its CPU's fast
    // faults before it) estimate each stack's share, and in CI one sample
    // of the interpreter's start-up (a malloc under an import) stood for
    // 33 ms, more than the checkpoint's 27 ms: the check below is of
    // blame, not of the estimate's error.
    let exact = ["--stack-sample", "1", "--fast-sample", "1"];
    let run = record(&exact, &[python.to_str().unwrap(), script.to_str().unwrap(), ckpt.to_str().unwrap()]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let path = ckpt.to_str().unwrap();
    let file = run.summary["files"].as_array().unwrap().iter().find(|f| f["path"] == path).expect("checkpoint row");
    assert!(u(&file["faults"]["major"]) > 0, "3.{minor}: a cold load takes major faults: {file:#}");
    assert!(u(&file["from_disk_bytes"]) * 10 >= u(&file["file_bytes"]) * 9, "3.{minor}: cold: {file:#}");
    let chain = "main (load.py:13);load (load.py:10);load_file (numpy.py:";
    let under = |name: &str| {
        let f = std::fs::read_to_string(run.out.path().join(name)).unwrap();
        let weight = |l: &str| l.rsplit_once(' ').and_then(|(_, w)| w.parse::<u64>().ok()).unwrap_or(0);
        (f.lines().filter(|l| python_only(l).contains(chain)).map(weight).sum::<u64>(), f)
    };
    // Every fault on the checkpoint is taken by the loading line (with the
    // copies it makes of the tensors); the interpreter's start-up has the rest.
    for (name, of_file) in [("faults.folded", "total"), ("fault-time.folded", "time_ns")] {
        let (w, f) = under(name);
        let file_w = u(&file["faults"][of_file]);
        assert!(w * 10 >= file_w * 9, "3.{minor}: {w} of {name} under {chain}, the file has {file_w}:\n{f}");
    }
    let (majors, f) = under("major-faults.folded");
    assert!(majors > 0, "3.{minor}: the checkpoint's major faults under {chain}:\n{f}");
}

#[test]
fn python_3_10_numpy_munmap_storm_is_blamed_on_the_python_function() {
    privileged!();
    numpy_munmap_storm_is_blamed_on_the_python_function(10);
}

#[test]
fn python_3_11_numpy_munmap_storm_is_blamed_on_the_python_function() {
    privileged!();
    numpy_munmap_storm_is_blamed_on_the_python_function(11);
}

#[test]
fn python_3_12_numpy_munmap_storm_is_blamed_on_the_python_function() {
    privileged!();
    numpy_munmap_storm_is_blamed_on_the_python_function(12);
}

#[test]
fn python_3_13_numpy_munmap_storm_is_blamed_on_the_python_function() {
    privileged!();
    numpy_munmap_storm_is_blamed_on_the_python_function(13);
}

#[test]
fn python_3_10_cold_safetensors_load_is_blamed_on_the_loading_line() {
    privileged!();
    cold_safetensors_load_is_blamed_on_the_loading_line(10);
}

#[test]
fn python_3_11_cold_safetensors_load_is_blamed_on_the_loading_line() {
    privileged!();
    cold_safetensors_load_is_blamed_on_the_loading_line(11);
}

#[test]
fn python_3_12_cold_safetensors_load_is_blamed_on_the_loading_line() {
    privileged!();
    cold_safetensors_load_is_blamed_on_the_loading_line(12);
}

#[test]
fn python_3_13_cold_safetensors_load_is_blamed_on_the_loading_line() {
    privileged!();
    cold_safetensors_load_is_blamed_on_the_loading_line(13);
}

/// `--no-python-frames`: native stacks only, from the same interpreter.
#[test]
fn python_frames_can_be_left_out() {
    privileged!();
    let Some(python) = pyenv_python(12) else { return };
    let text = "def fill():\n    return [bytearray(4 << 20) for _ in range(20)]\nfill()\n";
    let run = record(&["--no-python-frames", "--stack-sample", "4"], &[python.to_str().unwrap(), "-c", text]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let st = &run.summary["stacks"];
    assert!(u(&st["sampled_faults"]) > 1000, "{st}");
    assert_eq!(u(&st["python_faults"]), 0, "{st}");
    let f = std::fs::read_to_string(run.out.path().join("faults.folded")).unwrap();
    assert!(f.contains("_PyEval_EvalFrameDefault"), "native frames stay:\n{f}");
}
