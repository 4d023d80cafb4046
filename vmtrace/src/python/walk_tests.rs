//! The kernel's walk (vmtrace-ebpf/src/python.rs) done from userspace on a
//! live pyenv Python, through /proc/PID/mem: checks each version's offsets
//! without loading BPF. Skipped (with a note) where pyenv lacks the version;
//! an installed version with no row (3.9) is detected as unknown.
use std::os::unix::fs::FileExt as _;

use vmtrace_common::{py_code_stamp, PyFrame, PY_FRAME_OBJECTS, PY_OFF_NONE, PY_STAMP_WORDS, PY_THREAD_BY_PTHREAD};

use super::{
    detect::{Detected, Detector},
    CodeCache, PyStack,
};

fn word(m: &std::fs::File, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    m.read_exact_at(&mut b, addr).map_or(0, |()| u64::from_le_bytes(b))
}

fn byte(m: &std::fs::File, addr: u64) -> u8 {
    let mut b = [0u8; 1];
    m.read_exact_at(&mut b, addr).map_or(0, |()| b[0])
}

/// Prints its thread's `threading.get_ident()`: `pthread_self()`, which 3.10
/// keys thread states by (the kernel reads it as the FS base).
const SCRIPT: &str = "import sys, time, threading\n\ndef sleeper():\n    sys.stdout.write('%d\\n' % threading.get_ident()); sys.stdout.flush()\n    time.sleep(30)\n\ndef outer():\n    sleeper()\n\nouter()\n";

fn walk_live(minor: u32) {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let Some(python) = std::fs::read_dir(format!("{root}/versions")).ok().and_then(|d| {
        d.filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with(&format!("3.{minor}.")))
            .map(|e| e.path().join(format!("bin/python3.{minor}")))
    }) else {
        eprintln!("SKIPPED: no pyenv Python 3.{minor}");
        return;
    };
    let mut child = std::process::Command::new(python)
        .args(["-c", SCRIPT])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python starts");
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut line);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let ident: u64 = line.trim().parse().expect("thread ident");
    let pid = child.id();
    let maps = crate::procmaps::read(pid).expect("maps");
    let Detected::Known(found) = Detector::default().detect(&maps, None) else { panic!("3.{minor} not detected") };
    let p = found.proc;
    let m = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let interp = word(&m, p.runtime + u64::from(p.interp_head));
    let mut t = word(&m, interp + u64::from(p.threads_head));
    let key = if p.flags & PY_THREAD_BY_PTHREAD != 0 { ident } else { u64::from(pid) };
    while t != 0 && word(&m, t + u64::from(p.native_tid)) != key {
        t = word(&m, t + u64::from(p.tstate_next));
    }
    assert_ne!(t, 0, "3.{minor}: no thread state for the main thread");
    let mut f = word(&m, t + u64::from(p.tstate_frame));
    if p.cframe_frame != PY_OFF_NONE {
        f = word(&m, f + u64::from(p.cframe_frame));
    }
    let mut frames = Vec::new();
    while f != 0 && frames.len() < 32 {
        if p.frame_owner == PY_OFF_NONE || byte(&m, f + u64::from(p.frame_owner)) != 3 {
            let instr = word(&m, f + u64::from(p.frame_instr));
            let instr = if p.flags & PY_FRAME_OBJECTS != 0 { instr & 0xffff_ffff } else { instr };
            let code = word(&m, f + u64::from(p.frame_code));
            let words: [u64; PY_STAMP_WORDS] =
                std::array::from_fn(|i| word(&m, code + u64::from(p.code_stamp) + 8 * i as u64));
            frames.push(PyFrame { code, instr, stamp: py_code_stamp(&words, p.code_stamp_words) });
        }
        f = word(&m, f + u64::from(p.frame_previous));
    }
    // The same frames as if their code objects had been other ones (another
    // stamp at the same addresses): what lies there now does not name them.
    let other: Vec<PyFrame> = frames.iter().map(|f| PyFrame { stamp: f.stamp ^ 2, ..*f }).collect();
    let stack = PyStack { tgid: pid, frames, ends: 0, truncated: false };
    let freed = PyStack { tgid: pid, frames: other, ends: 0, truncated: false };
    let mut codes = CodeCache::default();
    codes.set_layout(pid, found.code);
    codes.resolve(&stack);
    codes.resolve(&freed);
    let _ = child.kill();
    let _ = child.wait();
    let names: Vec<String> = codes.segments(pid, &stack).concat();
    assert_eq!(names, ["<module> (<string>:10)", "outer (<string>:8)", "sleeper (<string>:5)"], "3.{minor}");
    assert_eq!(codes.segments(pid, &freed).concat(), [super::code::FREED; 3], "3.{minor}");
    assert_eq!(codes.unnamed(), (3, 0), "3.{minor}");
    assert!(codes.any_unnamed(pid, &freed) && !codes.any_unnamed(pid, &stack), "3.{minor}");
}

#[test]
fn python_3_10_offsets_walk_a_live_interpreter() {
    walk_live(10);
}

#[test]
fn python_3_11_offsets_walk_a_live_interpreter() {
    walk_live(11);
}

#[test]
fn python_3_12_offsets_walk_a_live_interpreter() {
    walk_live(12);
}

#[test]
fn python_3_13_offsets_walk_a_live_interpreter() {
    walk_live(13);
}

/// 3.13's own offsets (`_Py_DebugOffsets`) agree with the table's row.
#[test]
fn python_3_13_debug_offsets_agree_with_the_table() {
    let lib = std::path::Path::new("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0");
    if !lib.exists() {
        eprintln!("SKIPPED: no pyenv 3.13.0");
        return;
    }
    let maps = [crate::procmaps::Region {
        start: 0x1000,
        end: 0x2000,
        offset: 0,
        perms: "r--p".into(),
        kind: crate::model::RegionKind::File,
        path: Some(lib.to_string_lossy().into()),
    }];
    let Detected::Known(found) = Detector::default().detect(&maps, None) else { panic!("3.13 not detected") };
    let (table, _) = super::detect::layout((3, 13), found.proc.runtime).expect("row");
    assert_eq!(found.proc, table);
}

/// A Python with no row (pyenv's 3.9, which has `_PyRuntime` but neither
/// `Py_Version` nor `Py_IsNone`) is named, not given offsets.
#[test]
fn python_3_9_is_unknown() {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    let Some(lib) = std::fs::read_dir(format!("{root}/versions")).ok().and_then(|d| {
        d.filter_map(Result::ok)
            .find(|e| e.file_name().to_string_lossy().starts_with("3.9."))
            .map(|e| e.path().join("lib/libpython3.9.so.1.0"))
            .filter(|p| p.exists())
    }) else {
        eprintln!("SKIPPED: no pyenv 3.9 with libpython");
        return;
    };
    let path = lib.to_string_lossy().into_owned();
    let maps = [crate::procmaps::Region {
        start: 0x1000,
        end: 0x2000,
        offset: 0,
        perms: "r--p".into(),
        kind: crate::model::RegionKind::File,
        path: Some(path.as_str().into()),
    }];
    assert_eq!(Detector::default().detect(&maps, None), Detected::Unknown(path));
}
