//! Checkpoints loaded through torch (privileged; the cached torch venv of
//! `common::torch_python`): both formats saved by torch itself, evicted from
//! the page cache, loaded the way PyTorch users load them. The file row keeps
//! its path however soon the program closes its descriptor, its tensors are
//! named by their state-dict keys, and "from disk" is what the kernel read
//! for the loading process (`/proc/self/io` `read_bytes`, counted where the
//! block layer is asked for the data), never pages the process wrote.
mod common;

use common::*;
use serde_json::Value;

/// Saves a ~104 MB state dict (13 float32 tensors of 8 MiB, two small ones)
/// with `torch.save` and `safetensors.torch.save_file`, flushed to disk.
const SAVE: &str = r#"
import os, sys, torch
from safetensors.torch import save_file
torch.manual_seed(0)
sd = {f"layers.{i}.weight": torch.randn(1024, 2048) for i in range(13)}
sd["head.bias"] = torch.randn(1000)
sd["embed.scale"] = torch.randn(3, 5)
d = sys.argv[1]
torch.save(sd, os.path.join(d, "model.pt"))
save_file(sd, os.path.join(d, "model.safetensors"))
os.sync()
"#;

/// Evicts each checkpoint, loads it as users do and touches every tensor;
/// writes its own `read_bytes` (block-layer reads) around each load to
/// io.json.
const LOAD: &str = r#"
import json, os, sys, torch
from safetensors import safe_open

def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)

def read_bytes():
    with open("/proc/self/io") as f:
        return int(next(l for l in f if l.startswith("read_bytes:")).split()[1])

d = sys.argv[1]
pt, st = os.path.join(d, "model.pt"), os.path.join(d, "model.safetensors")
evict(pt)
evict(st)
io = {}
before = read_bytes()
sd = torch.load(pt, mmap=True, weights_only=True)
total = sum(float(t.sum()) for t in sd.values())
io["pt"] = read_bytes() - before
before = read_bytes()
with safe_open(st, framework="pt") as f:
    ts = {k: f.get_tensor(k) for k in f.keys()}
total += sum(float(t.sum()) for t in ts.values())
io["safetensors"] = read_bytes() - before
json.dump(io, open(os.path.join(d, "io.json"), "w"))
"#;

fn file_row<'a>(run: &'a Run, path: &str) -> &'a Value {
    let files = run.summary["files"].as_array().expect("files[]");
    files.iter().find(|f| f["path"] == path).unwrap_or_else(|| {
        let names: Vec<&Value> = files.iter().map(|f| &f["path"]).collect();
        panic!("no files[] row for {path}: {names:?}")
    })
}

/// Rows of `files[]` named only by an inode.
fn unnamed(run: &Run) -> Vec<&Value> {
    run.summary["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().starts_with("[file "))
        .collect()
}

fn check_checkpoint(run: &Run, path: &std::path::Path, keys: &[String], read_bytes: u64) {
    let name = path.to_str().unwrap();
    let f = file_row(run, name);
    let faults = u(&f["faults"]["total"]);
    let size = std::fs::metadata(path).unwrap().len();
    assert!(faults > 0, "{name}: faults on its row: {f:#}");
    // Every mapping of the file (torch maps a safetensors file a second time
    // itself, and closes the descriptor) adds up under its path: nothing of
    // it is left in a row that knows only the inode.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
    let stray: u64 = unnamed(run)
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with(&format!(" inode {ino}]")))
        .map(|r| u(&r["faults"]["total"]))
        .sum();
    assert!(stray * 10 <= faults + stray, "{name}: {stray} faults under its inode only, {faults} under its path");
    // Tensors named by their keys, all of them.
    let tensors = f["tensors"].as_array().unwrap_or_else(|| panic!("{name}: no tensors: {f:#}"));
    let mut names: Vec<String> = tensors.iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, keys, "{name}: tensors by state-dict key");
    let sum = |k: &str| tensors.iter().map(|t| u(&t[k])).sum::<u64>();
    let (t_faults, t_major, t_disk) = (sum("faults"), sum("major"), sum("from_disk_bytes"));
    // Every tensor was touched: the faults on the file are in its tensors
    // (the zip entries' headers and the pickle, the JSON header, take few).
    assert!(t_faults <= faults && t_faults * 10 >= faults * 9, "{name}: tensors {t_faults} of {faults} faults");
    assert!(t_major <= u(&f["faults"]["major"]), "{name}: tensor majors {t_major}: {f:#}");
    assert!(u(&f["faults"]["major"]) > 0, "{name}: a cold load takes major faults: {f:#}");
    for t in tensors {
        // A small tensor may share its pages with a neighbour, whose fault
        // maps them (fault-around maps up to 64 KiB of cached pages).
        if u(&t["bytes"]) >= 1 << 20 {
            assert!(u(&t["faults"]) > 0 && u(&t["time_ns"]) > 0, "{name}: every tensor was touched: {t}");
        }
        assert!(u(&t["from_disk_bytes"]) <= u(&t["bytes"]), "{name}: never more from disk than the tensor: {t}");
    }
    // From disk: what the kernel read for the load, at most the file once.
    // Time, under the default (stratified where the memcg end serves: every
    // slow fault exact, fast ones sampled and weighted): the tensors' times
    // add up to at most their file's (the rest is the pages outside every
    // tensor: the header, the zip entries, the pickle). Each view scaled by
    // its own sample made a cold checkpoint's tensors sum more than the file.
    let (t_time, f_time) = (sum("time_ns"), u(&f["faults"]["time_ns"]));
    assert!(
        t_time <= f_time + f_time / 100 + 1000,
        "{name}: tensors' time {t_time} ns within the file's {f_time}: {f:#}"
    );
    assert!(t_time * 2 >= f_time, "{name}: tensors' time {t_time} ns is most of the file's {f_time}: {f:#}");
    let disk = u(&f["from_disk_bytes"]);
    assert!(t_disk <= disk, "{name}: tensors {t_disk} of the file's {disk} bytes from disk");
    assert!(disk <= size.next_multiple_of(4096), "{name}: {disk} bytes from disk for a {size}-byte file");
    assert!(disk * 10 >= size * 9, "{name}: evicted, the whole file was read: {disk} of {size}");
    assert!(disk <= read_bytes + (1 << 20), "{name}: {disk} bytes from disk, the block layer read {read_bytes}");
    assert!(u(&f["readahead_pages"]) * 4096 <= disk, "{name}: readahead is pages read: {f:#}");
    // The whole file read once: each tensor read whole, the one in the
    // file's last, partial chunk too (uc28: head.bias 4193157 of 4194304).
    if disk == size.next_multiple_of(4096) {
        for t in tensors {
            assert_eq!(u(&t["from_disk_bytes"]), u(&t["bytes"]), "{name}: the file came from disk: {t}");
        }
    }
}

#[test]
fn torch_checkpoints_are_attributed_per_tensor_with_what_came_from_disk() {
    privileged!();
    let Some(python) = torch_python() else { return };
    let dir = disk_dir();
    let py = python.to_str().unwrap();
    let d = dir.path().to_str().unwrap();
    let ok = std::process::Command::new(py).args(["-c", SAVE, d]).status().unwrap();
    assert!(ok.success(), "saving the checkpoints");
    let run = record(&[], &[py, "-c", LOAD, d]);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    if let Some(n) = run.summary["sampling"]["fast_sample_period"].as_u64() {
        assert_eq!(n, 16, "the default samples 1 in 16 fast faults: {:#}", run.summary["sampling"]);
    }
    let io: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("io.json")).unwrap()).unwrap();
    let mut keys: Vec<String> = (0..13).map(|i| format!("layers.{i}.weight")).collect();
    keys.extend(["head.bias".to_string(), "embed.scale".to_string()]);
    keys.sort();
    check_checkpoint(&run, &dir.path().join("model.pt"), &keys, u(&io["pt"]));
    check_checkpoint(&run, &dir.path().join("model.safetensors"), &keys, u(&io["safetensors"]));
}

/// Maps each file with libc's mmap, closes the descriptor at once, then
/// reads every page, and goes on running a moment, as a training job does
/// after loading (a process that exits before the collector has read its
/// mapping leaves only the inode: docs/design.md, "Regions").
const MAP_AND_CLOSE: &str = r"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for path in sys.argv[1:]:
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, size, 1, 2, fd, 0)  # PROT_READ, MAP_PRIVATE
    os.close(fd)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    buf = (ctypes.c_char * size).from_address(addr)
    s = sum(buf[i][0] for i in range(0, size, 4096))
time.sleep(0.5)
";

#[test]
fn a_file_closed_right_after_mmap_keeps_its_path() {
    privileged!();
    let dir = disk_dir();
    let paths: Vec<String> = (0..4)
        .map(|i| {
            let p = dir.path().join(format!("data-{i}.bin"));
            std::fs::write(&p, vec![i as u8 + 1; 4 << 20]).unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();
    let mut cmd = vec!["python3", "-c", MAP_AND_CLOSE];
    cmd.extend(paths.iter().map(String::as_str));
    let run = record(&[], &cmd);
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    for p in &paths {
        let f = file_row(&run, p);
        assert!(u(&f["faults"]["total"]) > 0, "{p}: {f:#}");
    }
    let stray: Vec<&Value> = unnamed(&run);
    let ours: Vec<&&Value> = stray
        .iter()
        .filter(|r| {
            paths.iter().any(|p| {
                let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
                r["path"].as_str().unwrap().ends_with(&format!(" inode {ino}]"))
            })
        })
        .collect();
    assert!(ours.is_empty(), "rows named only by inode: {ours:?}");
}

/// Writes 64 MiB with write(), then reads it back through mmap while it is
/// still in the page cache; the same for a torch checkpoint saved and loaded.
const WRITE_THEN_READ: &str = r#"
import mmap, os, sys, torch
path = os.path.join(sys.argv[1], "written.bin")
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
chunk = b"\x5a" * (1 << 20)
for _ in range(64):
    os.write(fd, chunk)
m = mmap.mmap(fd, 64 << 20, prot=mmap.PROT_READ)
os.close(fd)
s = sum(m[i] for i in range(0, 64 << 20, 4096))
ck = os.path.join(sys.argv[1], "saved.pt")
torch.save({"w": torch.randn(2048, 2048)}, ck)
sd = torch.load(ck, mmap=True, weights_only=True)
s += float(sd["w"].sum())
"#;

#[test]
fn pages_a_process_wrote_are_not_from_disk() {
    privileged!();
    let Some(python) = torch_python() else { return };
    // By default most fast faults are not timed: such a fault ends without
    // leaving its thread "in a fault" for the write() that follows. And with
    // every fault timed.
    for args in [&[][..], &["--fast-sample", "1"]] {
        let dir = disk_dir();
        let run = record(args, &[python.to_str().unwrap(), "-c", WRITE_THEN_READ, dir.path().to_str().unwrap()]);
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        for (name, size) in [("written.bin", 64u64 << 20), ("saved.pt", 16 << 20)] {
            let path = dir.path().join(name);
            let f = file_row(&run, path.to_str().unwrap());
            assert!(u(&f["faults"]["total"]) > 0, "{args:?} {name}: {f:#}");
            // The kernel read nothing: no major fault, no page read.
            assert_eq!(u(&f["faults"]["major"]), 0, "{args:?} {name}: cached: {f:#}");
            assert!(u(&f["from_disk_bytes"]) < 1 << 20, "{args:?} {name}: written, not read: {f:#}");
            assert!(u(&f["readahead_pages"]) < 256, "{args:?} {name}: no readahead of written pages: {f:#}");
            assert!(u(&f["page_cache_written"]) * 4096 >= size, "{args:?} {name}: counted as written: {f:#}");
            for t in f["tensors"].as_array().into_iter().flatten() {
                assert!(u(&t["from_disk_bytes"]) < 1 << 20, "{args:?} {name}: tensor not read: {t}");
            }
        }
    }
}
