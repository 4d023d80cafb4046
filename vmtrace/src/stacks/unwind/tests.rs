//! Real code nobody wrote for these tests: a C program built by the system
//! compiler without frame pointers, and Debian's libc (built without them
//! too), captured by the program itself and unwound offline.
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use super::*;
use crate::{procmaps, stacks::symbolize::Names};

/// A captured sample: registers, the copied stack and the memory map.
pub(super) struct Capture {
    pub regs: Regs,
    pub stack: Vec<u8>,
    pub maps: Vec<Region>,
    _dir: tempfile::TempDir,
}

impl Capture {
    pub fn sample(&self) -> Sample<'_> {
        Sample { regs: self.regs, stack: &self.stack }
    }
}

/// The fixture, compiled once per test binary (`-O2 -fomit-frame-pointer`).
fn binary() -> &'static Path {
    static BIN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, bin) = BIN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = dir.path().join("capture");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/stacks/unwind/fixtures/capture.c");
        let out = Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .expect("the tests need a C compiler: cc");
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        (dir, bin)
    });
    bin
}

/// Runs the fixture in `mode` (e.g. `["chain"]`) and reads what it captured.
pub(super) fn capture(mode: &[&str]) -> Capture {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(binary()).args(mode).arg(dir.path()).output().expect("run the fixture");
    assert!(out.status.code().is_some(), "fixture crashed: {out:?}");
    let (regs, stack, maps) = read_files(dir.path());
    Capture { regs, stack, maps, _dir: dir }
}

/// A capture left in `dir` by someone else (the Python measurement).
pub(super) fn read_capture(dir: &Path) -> Capture {
    let (regs, stack, maps) = read_files(dir);
    Capture { regs, stack, maps, _dir: tempfile::tempdir().expect("temp dir") }
}

fn read_files(dir: &Path) -> (Regs, Vec<u8>, Vec<Region>) {
    let regs = std::fs::read_to_string(dir.join("regs")).expect("regs written");
    let v: Vec<u64> = regs.split_whitespace().map(|x| u64::from_str_radix(x, 16).expect("hex")).collect();
    let stack = std::fs::read(dir.join("stack")).expect("stack written");
    assert_eq!(stack.len() as u64, v[3]);
    let maps = procmaps::parse(&std::fs::read_to_string(dir.join("maps")).expect("maps written"));
    (Regs { ip: v[0], sp: v[1], bp: v[2], lr: 0 }, stack, maps)
}

/// Names of the frames, call sites for return addresses.
fn names(frames: &[u64], maps: &[Region]) -> Vec<String> {
    let lookup: Vec<u64> = frames.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a - 1 }).collect();
    let mut n = Names::default();
    n.prepare_user(&lookup, maps, None);
    lookup.iter().map(|&a| n.user(a, maps, None).to_string()).collect()
}

fn in_libc(a: u64, maps: &[Region]) -> bool {
    procmaps::find(maps, a).and_then(|r| r.path.as_deref()).is_some_and(|p| p.contains("libc.so"))
}

#[test]
fn chain_without_frame_pointers_unwinds_to_the_thread_root() {
    let cap = capture(&["chain"]);
    let mut u = Unwinder::new();
    let space = u.address_space(&cap.maps, None);
    let got = u.unwind(&space, &cap.sample());
    let n = names(&got.frames, &cap.maps);
    assert_eq!(got.stop, Stop::Root, "{n:?}");
    assert_eq!(&n[..4], ["leaf_c", "mid_b", "outer_a", "main"], "{n:?}");
    // main returns into libc's start code, then _start ends the stack.
    assert!(got.frames[4..].iter().any(|&a| in_libc(a, &cap.maps)), "{n:?}");
    assert!(n.last().is_some_and(|l| l == "_start"), "{n:?}");
}

#[test]
fn qsort_callback_unwinds_through_libc_to_main() {
    let cap = capture(&["qsort"]);
    let mut u = Unwinder::new();
    let space = u.address_space(&cap.maps, None);
    let got = u.unwind(&space, &cap.sample());
    let n = names(&got.frames, &cap.maps);
    assert_eq!(got.stop, Stop::Root, "{n:?}");
    assert_eq!(n[0], "cmp", "{n:?}");
    let main = n.iter().position(|f| f == "main").unwrap_or_else(|| panic!("no main in {n:?}"));
    let through = &got.frames[1..main];
    assert!(!through.is_empty() && through.iter().all(|&a| in_libc(a, &cap.maps)), "{n:?}");
    assert!(n[1..main].iter().any(|f| f.contains("qsort")), "{n:?}");
}

#[test]
fn a_short_window_stops_with_window_end_and_keeps_the_inner_frames() {
    let cap = capture(&["chain"]);
    let mut u = Unwinder::new();
    let space = u.address_space(&cap.maps, None);
    // Enough for c's frame and b's, not for a's.
    let full = u.unwind(&space, &cap.sample());
    let short = Sample { regs: cap.regs, stack: &cap.stack[..160] };
    let got = u.unwind(&space, &short);
    assert!(matches!(got.stop, Stop::WindowEnd { .. }), "{got:?}");
    assert!(got.frames.len() >= 2 && got.frames.len() < full.frames.len(), "{got:?} vs {full:?}");
    assert_eq!(got.frames[..], full.frames[..got.frames.len()]);
    assert_eq!(got.stop.marker().as_deref(), Some("[stack window exhausted]"));
}

#[test]
fn code_without_unwind_info_is_a_named_marker_not_a_garbage_chain() {
    let cap = capture(&["chain"]);
    let mut u = Unwinder::new();
    // The fixture's executable as anonymous memory: JIT code as far as the
    // unwinder knows, and rbp holds no frame chain (-fomit-frame-pointer).
    let maps: Vec<Region> = cap
        .maps
        .iter()
        .cloned()
        .map(|mut r| {
            if r.path.as_deref().is_some_and(|p| p.ends_with("/capture")) {
                r.kind = RegionKind::Anon;
                r.path = None;
            }
            r
        })
        .collect();
    let space = u.address_space(&maps, None);
    let got = u.unwind(&space, &cap.sample());
    assert_eq!(
        got.stop,
        Stop::NoUnwindInfo { addr: *got.frames.last().expect("leaf kept"), code: Code::Anonymous },
        "{got:?}"
    );
    assert_eq!(got.frames[0], cap.regs.ip);
    assert!(got.frames.iter().all(|&a| space.code_at(a).is_some()), "{got:?}");
    assert_eq!(got.stop.marker().as_deref(), Some("[jit code: no unwind info]"));
}

#[test]
fn objects_are_read_once_and_shared_between_address_spaces() {
    let cap = capture(&["chain"]);
    let mut u = Unwinder::new();
    let _ = u.address_space(&cap.maps, None);
    let first = u.stats();
    let space = u.address_space(&cap.maps, None);
    assert_eq!(u.stats(), first);
    assert!(first.objects >= 3 && first.bytes > 0, "{first:?}"); // capture, libc, ld.so
    assert!(space.code_ranges().filter(|r| r.2 == Code::Cfi).count() >= 3);
}

#[test]
fn load_bias_follows_the_segment_that_holds_the_offset() {
    let info =
        ObjectInfo { loads: vec![(0..0x1000, 0, false), (0x1000..0x5000, 0x20_1000, true)], ..Default::default() };
    // A text mapping from file offset 0x1000 at 0x7f00_0000_1000: SVMA 0x20_1000.
    assert_eq!(info.bias(0x7f00_0000_1000, 0x1000), Some(0x7f00_0000_1000 - 0x20_1000));
    assert_eq!(info.bias(0x5555_0000_0000, 0), Some(0x5555_0000_0000));
    assert_eq!(info.bias(0x1000, 0x9000), None);
}

/// The test binary itself is linked as Rust programs are (lld: the code's
/// segment starts in the file page that ends the read-only one, at a vaddr
/// one page above its offset). The bias of its code mapping puts a function's
/// symbol where the function runs.
#[test]
fn a_program_whose_code_shares_a_file_page_with_the_segment_before_gets_its_bias() {
    use object::{Object as _, ObjectSymbol as _};
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let info = elf::ObjectInfo::load(&exe).unwrap();
    let maps = procmaps::read(std::process::id()).unwrap();
    let here = a_program_whose_code_shares_a_file_page_with_the_segment_before_gets_its_bias as fn() as usize as u64;
    let text = maps
        .iter()
        .find(|r| r.perms.contains('x') && (r.start..r.end).contains(&here))
        .expect("the mapping this code runs from");
    let bias = info.bias(text.start, text.offset).expect("a bias");
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let symbol = file
        .symbols()
        .find(|s| s.name().is_ok_and(|n| n.contains("a_program_whose_code_shares_a_file_page")))
        .expect("this test's symbol");
    assert_eq!(symbol.address().wrapping_add(bias), here, "bias {bias:#x} for {text:?}");
}

/// A small program linked by lld: its read-only headers (0x568 bytes) and
/// its code (from file offset 0x570, at 0x1570) start on the same file
/// page, so the code's mapping has offset 0 like the headers': the code
/// segment gives the bias.
#[test]
fn code_sharing_the_first_page_with_the_headers_is_biased_by_the_code_segment() {
    let info = elf::ObjectInfo {
        loads: vec![(0..0x568, 0, false), (0x570..0x2000, 0x1570, true), (0x2000..0x2100, 0x3000, false)],
        ..elf::ObjectInfo::default()
    };
    let start = 0x5555_5555_5000;
    assert_eq!(info.bias(start, 0), Some(start - 0x1000));
}
