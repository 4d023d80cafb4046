//! User stacks without frame pointers: a sample is the user registers (ip,
//! sp, bp) and a bounded copy of the stack from sp, taken by the kernel; here
//! framehop walks it with the objects' DWARF call-frame information
//! (`.eh_frame`, `.debug_frame`), the way samply does. Frame pointers are only
//! a fallback where an object has no CFI, and a chain built from them is kept
//! only while it stays in executable code.
//!
//! Recording feeds it through `stacks::native`.
pub(crate) mod elf;
#[cfg(test)]
mod measure;
#[cfg(test)]
mod tests;

use crate::hash::HashMap;
use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{
    CacheNative, Error as FhError, ExplicitModuleSectionInfo, FrameAddress, MayAllocateDuringUnwind, Module,
    UnwindRegsNative, Unwinder as _, UnwinderNative,
};

pub use elf::LoadError;
use elf::{Bytes, ObjectInfo};

use crate::{
    model::RegionKind,
    procmaps::{root::RootDir, Region},
};

/// User registers at the sampled instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// arm64's link register (x30): a leaf function's return address.
    pub lr: u64,
}

/// One sample: registers and the bytes of the stack copied from `regs.sp`.
#[derive(Clone, Copy, Debug)]
pub struct Sample<'a> {
    pub regs: Regs,
    pub stack: &'a [u8],
}

/// What kind of executable code holds an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// An ELF object with call-frame information.
    Cfi,
    /// An ELF object without any (or one that could not be read).
    NoCfi,
    /// Anonymous executable memory: JIT code (Python's perf trampolines, V8, …).
    Anonymous,
    /// The kernel's vDSO (its CFI lives only in memory; not read yet).
    Vdso,
}

/// Why the walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A thread root: the CFI marks the return address undefined (`_start`,
    /// `clone3`/`start_thread`), framehop's end of stack.
    Root,
    /// The next read fell beyond the copied window at this address: a
    /// deeper stack than the window, the outer frames are missing.
    WindowEnd { addr: u64 },
    /// The last frame is in code without unwind information and frame
    /// pointers did not lead back into code from there.
    NoUnwindInfo { addr: u64, code: Code },
    /// A return address found through CFI lies outside executable code; the
    /// frames from there on were dropped (the copied stack was stale, or the CFI
    /// is wrong).
    LeftCode { addr: u64 },
    /// framehop failed (e.g. it would loop, or the stack pointer went down).
    Error(FhError),
    /// `Unwinder::max_frames` frames were found.
    MaxFrames,
}

impl Stop {
    /// The outermost frame to show for a stack that did not reach its root,
    /// so a cut stack never looks complete.
    pub fn marker(&self) -> Option<String> {
        match self {
            Self::Root => None,
            Self::WindowEnd { .. } => Some("[stack window exhausted]".into()),
            Self::NoUnwindInfo { code: Code::Anonymous, .. } => Some("[jit code: no unwind info]".into()),
            Self::NoUnwindInfo { code: Code::Vdso, .. } => Some("[vdso: no unwind info]".into()),
            Self::NoUnwindInfo { .. } => Some("[no unwind info]".into()),
            Self::LeftCode { .. } => Some("[unwind left code]".into()),
            Self::Error(e) => Some(format!("[unwind error: {e}]")),
            Self::MaxFrames => Some("[too many frames]".into()),
        }
    }
}

/// The result of one unwind: `frames[0]` is the instruction pointer, the
/// others are return addresses (as in a kernel stack map; look up
/// `addr - 1` to name the call site), innermost first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwound {
    pub frames: Vec<u64>,
    pub stop: Stop,
}

/// A code range of one process and what unwinds it.
#[derive(Clone, Debug)]
struct CodeRange {
    start: u64,
    end: u64,
    code: Code,
    /// Added (wrapping) to an address of the range to get its address in
    /// the object's place among all objects (`Unwinder::modules`); `Cfi`
    /// ranges only.
    delta: u64,
}

/// One process's executable ranges: which object holds each and where that
/// object sits among all objects. Build it again when the process maps new
/// code. Holds no unwind data: that is the `Unwinder`'s, once per object.
pub struct AddressSpace {
    code: Vec<CodeRange>,
}

impl AddressSpace {
    fn range_at(&self, addr: u64) -> Option<&CodeRange> {
        let i = self.code.partition_point(|c| c.start <= addr).checked_sub(1)?;
        let c = &self.code[i];
        (addr < c.end).then_some(c)
    }

    fn code_at(&self, addr: u64) -> Option<Code> {
        self.range_at(addr).map(|c| c.code)
    }

    /// Whether `addr` lies in executable code this space knows.
    pub fn covers(&self, addr: u64) -> bool {
        self.code_at(addr).is_some()
    }

    /// Executable ranges and whether each has CFI (for tests and reports).
    pub fn code_ranges(&self) -> impl Iterator<Item = (u64, u64, Code)> + '_ {
        self.code.iter().map(|c| (c.start, c.end, c.code))
    }

    /// `frame` as the objects' unwinder looks it up: in its object's place,
    /// or (code without CFI, or no code) at `NOWHERE`, below every object,
    /// where framehop's fallback rule (frame pointers) applies.
    /// `range`: the code range holding the frame (`range_at` of its
    /// lookup address), found once for its code and its place.
    fn placed(frame: FrameAddress, range: Option<&CodeRange>) -> FrameAddress {
        let delta = match range {
            Some(c) if c.code == Code::Cfi => Some(c.delta),
            _ => None,
        };
        match frame {
            FrameAddress::InstructionPointer(a) => {
                FrameAddress::InstructionPointer(delta.map_or(NOWHERE, |d| a.wrapping_add(d)))
            }
            FrameAddress::ReturnAddress(a) => {
                let a = delta.map_or(NOWHERE + 1, |d| a.get().wrapping_add(d));
                FrameAddress::from_return_address(a).unwrap_or(FrameAddress::InstructionPointer(NOWHERE))
            }
        }
    }
}

/// Each object's place among all objects (`Unwinder::modules`): the n-th
/// object read with CFI sits at `(n + 1) * SLOT`, its SVMAs as offsets, so
/// an address of any process maps to one address per (object, offset)
/// whatever the process's layout (ASLR), and framehop's rule cache serves
/// every process of a binary. framehop looks addresses up as u32 offsets
/// from a module's base: an object's code lies below 4 GiB of SVMA.
const SLOT: u64 = 1 << 32;
/// Where code without CFI is looked up: below every object.
const NOWHERE: u64 = 0x1000;

/// How long a path is taken to name the object a stat found (`Unwinder::named`).
const RECHECK: Duration = Duration::from_secs(1);
/// Paths remembered at most (the table is emptied when full).
const NAMED_MAX: usize = 4096;

/// Identity of an object file: replaced files (upgrades) get new entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ObjectKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
}

impl ObjectKey {
    /// The identity of the file `path` names now (one stat).
    pub(crate) fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        })
    }
}

/// Cache and counters, for the measurement note and a future summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Objects whose unwind sections are cached.
    pub objects: usize,
    /// Bytes of unwind sections held.
    pub bytes: usize,
    /// Objects that could not be read (they unwind with frame pointers).
    pub unreadable: usize,
}

/// An object read: its unwind sections, and where it sits among all
/// objects (`SLOT`) when it has CFI.
#[derive(Clone)]
struct Loaded {
    info: Arc<ObjectInfo>,
    base: Option<u64>,
}

/// Unwind sections per object, shared by all processes: every object with
/// CFI is one module of one framehop unwinder, at its own place
/// (`SLOT`), and one rule cache serves all of them. A short-lived process
/// of a binary seen before unwinds from cached rules: with a module list per
/// process, each one's fresh generation missed every rule, and one rule
/// lookup (`.eh_frame_hdr`, FDE, CFI rows) per frame was most of the
/// unwinding beside a shell loop. The generation now changes only when a
/// new object is read, far from the wrap of framehop's 16-bit counter
/// (a process's fresh list bumped it once per module).
pub struct Unwinder {
    objects: HashMap<ObjectKey, Option<Loaded>>,
    /// Which object a path named when last checked (a stat at most once
    /// per `RECHECK` per path: every process's address space names the
    /// same libraries, and their stats were 2% of the collector's time
    /// beside a shell loop). A file replaced under its name (an upgrade) is
    /// seen within that second.
    named: HashMap<PathBuf, (ObjectKey, Instant)>,
    modules: UnwinderNative<Bytes, MayAllocateDuringUnwind>,
    placed: u64,
    cache: CacheNative<MayAllocateDuringUnwind>,
    /// Frames per stack at most (the kernel's stack maps keep 127).
    pub max_frames: usize,
}

impl Default for Unwinder {
    fn default() -> Self {
        Self::new()
    }
}

impl Unwinder {
    pub fn new() -> Self {
        Self {
            objects: HashMap::default(),
            named: HashMap::default(),
            modules: UnwinderNative::new(),
            placed: 0,
            cache: CacheNative::new(),
            max_frames: 127,
        }
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for o in self.objects.values() {
            match o {
                Some(o) => {
                    s.objects += 1;
                    s.bytes += o.info.bytes();
                }
                None => s.unreadable += 1,
            }
        }
        s
    }

    /// The object at `path`, read on first use (and placed among all
    /// objects when it has CFI).
    fn object(&mut self, path: &Path) -> Option<Loaded> {
        let key = match self.named.get(path) {
            Some((key, checked)) if checked.elapsed() < RECHECK => key.clone(),
            _ => {
                let key = ObjectKey::of(path)?;
                if self.named.len() >= NAMED_MAX {
                    self.named.clear();
                }
                self.named.insert(path.to_path_buf(), (key.clone(), Instant::now()));
                key
            }
        };
        if let Some(o) = self.objects.get(&key) {
            return o.clone();
        }
        let loaded = match ObjectInfo::load(path) {
            Ok(info) => {
                let base = info.has_cfi().then(|| {
                    self.placed += 1;
                    let base = self.placed * SLOT;
                    self.modules.add_module(module(&path.to_string_lossy(), base..base + SLOT, base, &info));
                    base
                });
                Some(Loaded { info: Arc::new(info), base })
            }
            Err(e) => {
                log::debug!("unwind: {}: {e}", path.display());
                None
            }
        };
        self.objects.insert(key, loaded.clone());
        loaded
    }

    /// The address space of a process from its memory map; `root`: where
    /// its paths are, for a process in a container or chroot
    /// (`procmaps::root`), else they are as here. Objects are read on first
    /// sight and cached across processes.
    pub fn address_space(&mut self, maps: &[Region], root: Option<&RootDir>) -> AddressSpace {
        let mut code = Vec::new();
        let mut i = 0;
        while i < maps.len() {
            let r = &maps[i];
            if !r.perms.contains('x') {
                i += 1;
                continue;
            }
            // Consecutive executable mappings of one file form one module.
            let mut j = i + 1;
            while j < maps.len() && maps[j].perms.contains('x') && maps[j].path == r.path && r.kind == RegionKind::File
            {
                j += 1;
            }
            let (start, end) = (r.start, maps[j - 1].end);
            i = j;
            let mut delta = 0;
            let kind = match (r.kind, r.path.as_deref()) {
                (RegionKind::File, Some(path)) => {
                    let full = PathBuf::from(crate::procmaps::root::here(root, path));
                    match self.object(&full) {
                        Some(Loaded { info, base: Some(base) }) => match info.bias(r.start, r.offset) {
                            // Its code's SVMAs must fit the object's place.
                            Some(bias) if end.wrapping_sub(bias) <= SLOT && start.wrapping_sub(bias) < SLOT => {
                                delta = base.wrapping_sub(bias);
                                Code::Cfi
                            }
                            _ => Code::NoCfi,
                        },
                        _ => Code::NoCfi,
                    }
                }
                (RegionKind::Vdso, _) => Code::Vdso,
                _ => Code::Anonymous,
            };
            code.push(CodeRange { start, end, code: kind, delta });
        }
        AddressSpace { code }
    }

    /// Walks one sample of a process whose address space is `space`.
    pub fn unwind(&mut self, space: &AddressSpace, sample: &Sample) -> Unwound {
        let Regs { ip, sp, bp, lr } = sample.regs;
        let window_end = sp.saturating_add(sample.stack.len() as u64);
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let bytes = sample.stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames: Vec<u64> = Vec::new();
        let mut last: Option<(u64, Option<Code>)> = None;
        let mut regs = native_regs(ip, sp, bp, lr);
        // framehop's `UnwindIterator`, each frame looked up in its object's
        // place (`AddressSpace::placed`); the registers and the stack read
        // stay the process's own.
        let mut step = |frame: FrameAddress,
                        range: Option<&CodeRange>,
                        regs: &mut UnwindRegsNative|
         -> Result<Option<FrameAddress>, FhError> {
            match self.modules.unwind_frame(AddressSpace::placed(frame, range), regs, &mut self.cache, &mut read)? {
                Some(ret) => FrameAddress::from_return_address(ret).map(Some).ok_or(FhError::ReturnAddressIsNull),
                None => Ok(None),
            }
        };
        let mut prev: Option<(FrameAddress, Option<&CodeRange>)> = None;
        let stop = loop {
            if frames.len() >= self.max_frames {
                break Stop::MaxFrames;
            }
            // A chain through code without CFI is as good as its frame
            // pointers: it ends at the last frame that was still code.
            let no_cfi = |last: Option<(u64, Option<Code>)>| match last {
                Some((addr, Some(code))) if code != Code::Cfi => Some(Stop::NoUnwindInfo { addr, code }),
                _ => None,
            };
            let frame = match prev {
                None => FrameAddress::InstructionPointer(ip),
                Some((prev, range)) => match step(prev, range, &mut regs) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break no_cfi(last).unwrap_or(Stop::Root),
                    Err(FhError::CouldNotReadStack(addr)) if addr >= window_end => {
                        break no_cfi(last).unwrap_or(Stop::WindowEnd { addr })
                    }
                    Err(e) => break no_cfi(last).unwrap_or(Stop::Error(e)),
                },
            };
            let addr = frame.address();
            let range = space.range_at(frame.address_for_lookup());
            let code = range.map(|c| c.code);
            if code.is_none() && !frames.is_empty() {
                log::debug!(target: "vmtrace::unwind", "left code at {addr:#x}: ip {ip:#x} sp {sp:#x} bp {bp:#x}, {} bytes copied, frames {frames:x?}", sample.stack.len());
                break no_cfi(last).unwrap_or(Stop::LeftCode { addr });
            }
            frames.push(addr);
            last = Some((addr, code));
            prev = Some((frame, range));
        };
        Unwound { frames, stop }
    }
}

/// framehop's registers at the sampled instant: x86-64 unwinds from the
/// instruction pointer, sp and rbp; arm64 from the link register (where a
/// leaf function's return address stays), sp and x29.
#[cfg(target_arch = "aarch64")]
fn native_regs(_ip: u64, sp: u64, bp: u64, lr: u64) -> UnwindRegsNative {
    UnwindRegsNative::new(lr, sp, bp)
}

#[cfg(not(target_arch = "aarch64"))]
fn native_regs(ip: u64, sp: u64, bp: u64, _lr: u64) -> UnwindRegsNative {
    UnwindRegsNative::new(ip, sp, bp)
}

/// framehop's module for one mapping of an object: SVMAs of the sections plus
/// the bias as `base_avma` (ELF's base SVMA is 0).
fn module(name: &str, avma: std::ops::Range<u64>, bias: u64, info: &ObjectInfo) -> Module<Bytes> {
    let sections = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: info.text_svma.clone(),
        got_svma: info.got_svma.clone(),
        eh_frame_svma: info.eh_frame.as_ref().map(|s| s.svma.clone()),
        eh_frame: info.eh_frame.as_ref().map(|s| s.data.clone()),
        eh_frame_hdr_svma: info.eh_frame_hdr.as_ref().map(|s| s.svma.clone()),
        eh_frame_hdr: info.eh_frame_hdr.as_ref().map(|s| s.data.clone()),
        debug_frame: info.debug_frame.clone(),
        text: None,
        stubs_svma: None,
        stub_helper_svma: None,
        unwind_info: None,
        text_segment_svma: None,
        text_segment: None,
    };
    Module::new(name.to_string(), avma, bias, sections)
}

impl Drop for Unwinder {
    fn drop(&mut self) {
        let s = self.cache.stats();
        log::debug!(target: "vmtrace::unwind_cache", "rule cache: {} lookups, {} hits; {} objects placed", s.total(), s.hits(), self.placed);
    }
}
