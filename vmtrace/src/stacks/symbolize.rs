//! Addresses to names. User frames are normalized to (ELF file, file offset)
//! through the process's memory map as it was while the process lived, so
//! processes that exited are symbolized too; JIT code through
//! `/tmp/perf-PID.map`; kernel frames through kallsyms. A frame that cannot be
//! named shows `module+0xoffset`: frames never vanish.
use crate::hash::ShrinkSparse as _;
use crate::hash::{HashMap, HashSet};
use std::{cell::RefCell, path::PathBuf};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    Input, Symbolized, Symbolizer,
};

use super::{Frame, Frames};
use crate::{
    model::RegionKind,
    procmaps::{self, root::RootDir, Region},
};

/// A `/tmp/perf-PID.map` of a JIT (e.g. Python 3.12+ with `-X perf`):
/// "START SIZE name" per line, hex without 0x.
#[derive(Default)]
pub struct PerfMap {
    entries: Vec<(u64, u64, String)>,
}

impl PerfMap {
    pub fn parse(text: &str) -> Self {
        let mut entries: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ' ');
                let start = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
                let size = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
                Some((start, size, it.next()?.trim().to_string()))
            })
            .collect();
        entries.sort_by_key(|e| e.0);
        Self { entries }
    }

    pub fn read(pid: u32) -> Option<Self> {
        std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).ok().map(|t| Self::parse(&t))
    }

    pub fn find(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= addr).checked_sub(1)?;
        let (start, size, name) = &self.entries[i];
        (addr < start + size).then_some(name.as_str())
    }
}

/// A separate debug file (`/usr/lib/debug/.build-id/NN/REST.debug`, or
/// what `.gnu_debuglink` names) and its object's loadable segments: the
/// debug file's segments have no bytes, so a file offset of the object is
/// turned into the address its symbol table uses through the object's own.
#[derive(Clone)]
struct DebugFile {
    path: PathBuf,
    /// (file offset, virtual address, size in the file) of each PT_LOAD.
    loads: Vec<(u64, u64, u64)>,
}

impl DebugFile {
    fn virt_offset(&self, off: u64) -> Option<u64> {
        self.loads.iter().find(|(o, _, size)| off >= *o && off < o + size).map(|(o, v, _)| off - o + v)
    }
}

/// The debug file of the object at `path`, where distributions install it
/// (Debian's `-dbgsym`: by build-id) or beside it as its `.gnu_debuglink`
/// names; `None` without one.
fn debug_file(path: &str) -> Option<DebugFile> {
    use object::{Object, ObjectSegment};
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only and private; only the headers and notes are read.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let obj = object::File::parse(&*map).ok()?;
    let loads: Vec<(u64, u64, u64)> = obj
        .segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (off, s.address(), size)
        })
        .filter(|l| l.2 > 0)
        .collect();
    let mut candidates = Vec::new();
    candidates.extend(super::unwind::elf::build_id_debug_path(&obj).map(PathBuf::from));
    if let Some((link, _crc)) = obj.gnu_debuglink().ok().flatten() {
        let link = String::from_utf8_lossy(link).into_owned();
        let dir = std::path::Path::new(path).parent().unwrap_or(std::path::Path::new("/"));
        candidates.push(dir.join(&link));
        candidates.push(dir.join(".debug").join(&link));
        candidates.push(std::path::Path::new("/usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(dir)).join(&link));
    }
    let real = std::fs::canonicalize(path).ok();
    let debug = candidates.into_iter().find(|c| c.is_file() && std::fs::canonicalize(c).ok() != real)?;
    Some(DebugFile { path: debug, loads })
}

/// Roots whose names are kept before those of roots no process holds go.
const MAX_ROOTS: usize = 64;

/// The key of the names under `root` (its address; 0: paths as here).
fn root_key(root: Option<&std::sync::Arc<RootDir>>) -> usize {
    root.map_or(0, |r| std::sync::Arc::as_ptr(r) as usize)
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Names for every address of a batch, resolved with as few symbolizer calls
/// as there are files.
/// Every name is kept once ([`Frame`]): a stack holds references to them,
/// so a job with hundreds of thousands of stacks keeps one string per
/// distinct frame, not one per frame of every stack.
pub struct Names {
    symbolizer: Symbolizer,
    /// Each object's separate debug file, if it has one (`debug_file`).
    /// By root (`root_key`) and the object's path here.
    debug: HashMap<(usize, String), Option<DebugFile>>,
    kernel: HashMap<u64, Frame>,
    /// By root (`root_key`), the object's path as the maps give it, and
    /// offset. Looked up without making a key: a `PathBuf` key hashed by
    /// its components was 3% of the collector's time beside a shell loop.
    user: HashMap<usize, HashMap<Box<str>, HashMap<u64, Frame>>>,
    /// The root of the process `prepare_user` last prepared, when not
    /// this process's: `user` and `caller` name its addresses.
    root: Option<std::sync::Arc<RootDir>>,
    /// Every root `user` has names under, by its key (its address: not
    /// another root's while this weak reference keeps the allocation).
    roots: HashMap<usize, std::sync::Weak<RootDir>>,
    /// Names made per address (JIT code, anonymous memory) and markers, once each.
    other: RefCell<HashSet<Frame>>,
    /// Whole stacks, once each.
    stacks: RefCell<HashSet<Frames>>,
}

impl Default for Names {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            debug: HashMap::default(),
            kernel: HashMap::default(),
            user: HashMap::default(),
            root: None,
            roots: HashMap::default(),
            other: RefCell::new(HashSet::default()),
            stacks: RefCell::new(HashSet::default()),
        }
    }
}

/// Where a user address lives, once normalized.
enum Place<'a> {
    File(&'a str, u64),
    Named(String),
}

fn place<'a>(addr: u64, maps: &'a [Region], jit: Option<&PerfMap>) -> Place<'a> {
    match procmaps::find(maps, addr) {
        Some(r) if r.kind == RegionKind::File => {
            Place::File(r.path.as_deref().unwrap_or("?"), addr - r.start + r.offset)
        }
        Some(r) if r.kind == RegionKind::Vdso => Place::Named(r.path.as_deref().unwrap_or("[vdso]").to_string()),
        r => match jit.and_then(|j| j.find(addr)) {
            Some(name) => Place::Named(name.to_string()),
            None => Place::Named(match r {
                Some(r) => format!("[{:?}]+{:#x}", r.kind, addr - r.start).to_lowercase(),
                None => format!("[unknown] {addr:#x}"),
            }),
        },
    }
}

impl Names {
    /// Lets go of the object files the symbolizer holds open and parsed
    /// (names already resolved stay): a recording that symbolizes as
    /// processes retire would otherwise keep every program it ever saw
    /// mapped.
    pub fn close_objects(&mut self) {
        self.symbolizer = Symbolizer::new();
        self.debug.clear();
    }

    /// Forgets the names and stacks kept once that nothing holds any more
    /// (those of processes folded away, whose raw addresses no other
    /// process shares): the sets then follow what is held.
    pub fn prune(&mut self) -> usize {
        let (other, stacks) = (self.other.get_mut(), self.stacks.get_mut());
        let before = other.len() + stacks.len();
        // Stacks first: they hold names.
        stacks.retain(|f| std::sync::Arc::strong_count(f) > 1);
        other.retain(|f| std::sync::Arc::strong_count(f) > 1);
        other.shrink_if_sparse();
        stacks.shrink_if_sparse();
        before - other.len() - stacks.len()
    }

    /// How many (user addresses, kernel addresses, other names, stacks) are
    /// kept (the debug log of `Session::fold_away`).
    pub fn sizes(&self) -> (usize, usize, usize, usize) {
        let user = self.user.values().flat_map(HashMap::values).map(HashMap::len).sum();
        (user, self.kernel.len(), self.other.borrow().len(), self.stacks.borrow().len())
    }

    /// Resolves user addresses of one process in bulk (call before `user`
    /// and `caller`, which then name that process's addresses). `root`:
    /// where its paths are, when not here (a container's files).
    pub fn prepare_user(&mut self, addrs: &[u64], maps: &[Region], root: Option<&std::sync::Arc<RootDir>>) {
        self.root = root.cloned();
        if let Some(r) = root {
            if self.roots.len() >= MAX_ROOTS {
                // The names under roots no process holds any more (their
                // containers are gone, their stacks named): let go.
                let gone: Vec<usize> =
                    self.roots.iter().filter(|(_, r)| r.strong_count() == 0).map(|(k, _)| *k).collect();
                for k in gone {
                    self.roots.remove(&k);
                    self.user.remove(&k);
                    self.debug.retain(|(root, _), _| *root != k);
                }
            }
            self.roots.entry(root_key(Some(r))).or_insert_with(|| std::sync::Arc::downgrade(r));
        }
        let mut by_file: HashMap<&str, Vec<u64>> = HashMap::default();
        for &a in addrs {
            if let Place::File(path, off) = place(a, maps, None) {
                if self.named(path, off).is_none() {
                    by_file.entry(path).or_default().push(off);
                }
            }
        }
        for (path, mut offs) in by_file {
            offs.sort_unstable();
            offs.dedup();
            let here = procmaps::root::here(self.root.as_deref(), path);
            let syms = self.symbolize_offsets(&here, &offs);
            let names: Vec<Frame> = offs
                .iter()
                .zip(&syms)
                .map(|(off, sym)| match sym {
                    Some(n) => self.intern(n),
                    None => self.intern(&format!("{}+{off:#x}", basename(path))),
                })
                .collect();
            let of_file = self.user.entry(root_key(self.root.as_ref())).or_default().entry(path.into()).or_default();
            of_file.extend(offs.into_iter().zip(names));
        }
    }

    /// The name of offset `off` of the prepared process's file `path`.
    fn named(&self, path: &str, off: u64) -> Option<&Frame> {
        self.user.get(&root_key(self.root.as_ref()))?.get(path)?.get(&off)
    }

    /// Symbols of file offsets `offs` (sorted) of the object at `path`, from
    /// the symbol table of its separate debug file when it has one (a
    /// distribution's stripped library), else from its own. Only symbol
    /// tables are read, never DWARF: a name is all a frame shows, and the
    /// DWARF of a few system libraries decompressed held ~13 MB of the
    /// collector's heap and ~15 MB of mapped files (docs/performance.md).
    fn symbolize_offsets(&mut self, path: &str, offs: &[u64]) -> Vec<Option<String>> {
        let elf = |p: &std::path::Path| {
            let mut e = Elf::new(p);
            e.debug_syms = false;
            Source::Elf(e)
        };
        let name = |s: &Symbolized<'_>| match s {
            Symbolized::Sym(sym) => Some(sym.name.to_string()),
            Symbolized::Unknown(..) => None,
        };
        let mut out = vec![None; offs.len()];
        let key = (root_key(self.root.as_ref()), path.to_string());
        let debug = self.debug.entry(key).or_insert_with(|| debug_file(path)).clone();
        if let Some(d) = debug {
            let virt: Vec<(usize, u64)> =
                offs.iter().enumerate().filter_map(|(i, &o)| d.virt_offset(o).map(|v| (i, v))).collect();
            let addrs: Vec<u64> = virt.iter().map(|v| v.1).collect();
            if let Ok(syms) = self.symbolizer.symbolize(&elf(&d.path), Input::VirtOffset(&addrs)) {
                for ((i, _), s) in virt.iter().zip(&syms) {
                    out[*i] = name(s);
                }
            }
        }
        // The object's own symbols: all of them without a debug file, those
        // the debug file lacked with one.
        let rest: Vec<usize> = (0..offs.len()).filter(|&i| out[i].is_none()).collect();
        if !rest.is_empty() {
            let left: Vec<u64> = rest.iter().map(|&i| offs[i]).collect();
            if let Ok(syms) = self.symbolizer.symbolize(&elf(std::path::Path::new(path)), Input::FileOffset(&left)) {
                for (i, s) in rest.iter().zip(&syms) {
                    out[*i] = name(s);
                }
            }
        }
        out
    }

    pub fn user(&self, addr: u64, maps: &[Region], jit: Option<&PerfMap>) -> Frame {
        match place(addr, maps, jit) {
            Place::File(path, off) => {
                self.named(path, off).cloned().unwrap_or_else(|| self.intern(&format!("{}+{off:#x}", basename(path))))
            }
            Place::Named(n) => self.intern(&n),
        }
    }

    /// The frame of a return address `ret`, named by its call (`ret - 1`),
    /// as debuggers and perf name it: a call that ends its function (to one
    /// that does not return: `exit`, `abort`, `_exit`) returns past it,
    /// into the next function (`main` ending in `exit()` was named `_fini`).
    /// An address no file, vDSO or JIT map names is shown as it is.
    pub fn caller(&self, ret: u64, maps: &[Region], jit: Option<&PerfMap>) -> Frame {
        let at = ret.wrapping_sub(1);
        let named = procmaps::find(maps, at).is_some_and(|r| matches!(r.kind, RegionKind::File | RegionKind::Vdso))
            || jit.is_some_and(|j| j.find(at).is_some());
        self.user(if named { at } else { ret }, maps, jit)
    }

    /// `name`, kept once: the same reference for every stack that shows it.
    pub fn intern(&self, name: &str) -> Frame {
        let mut other = self.other.borrow_mut();
        if let Some(f) = other.get(name) {
            return f.clone();
        }
        let f: Frame = name.into();
        other.insert(f.clone());
        f
    }

    /// `frames` kept once per distinct sequence: the same stack of another
    /// process, stratum or leaf shares it.
    pub fn intern_frames(&self, frames: Vec<Frame>) -> Frames {
        let mut stacks = self.stacks.borrow_mut();
        if let Some(f) = stacks.get(frames.as_slice()) {
            return f.clone();
        }
        let f: Frames = frames.into();
        stacks.insert(f.clone());
        f
    }

    /// Resolves kernel addresses in bulk (call before `kernel`).
    pub fn prepare_kernel(&mut self, addrs: &[u64]) {
        let mut todo: Vec<u64> = addrs.iter().copied().filter(|a| !self.kernel.contains_key(a)).collect();
        todo.sort_unstable();
        todo.dedup();
        if todo.is_empty() {
            return;
        }
        let src = Source::Kernel(Kernel::default());
        let syms = self.symbolizer.symbolize(&src, Input::AbsAddr(&todo));
        for (i, a) in todo.iter().enumerate() {
            let name = match syms.as_ref().ok().and_then(|s| s.get(i)) {
                Some(Symbolized::Sym(sym)) => self.intern(&sym.name),
                _ => self.intern(&format!("[kernel] {a:#x}")),
            };
            self.kernel.insert(*a, name);
        }
    }

    pub fn kernel(&self, addr: u64) -> Frame {
        self.kernel.get(&addr).cloned().unwrap_or_else(|| self.intern(&format!("[kernel] {addr:#x}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn marker_function_for_symbolization() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn own_function_is_named_through_file_offsets() {
        let maps = procmaps::read(std::process::id()).unwrap();
        let addr = marker_function_for_symbolization as *const () as u64 + 1;
        let mut n = Names::default();
        n.prepare_user(&[addr], &maps, None);
        let name = n.user(addr, &maps, None);
        assert!(name.contains("marker_function_for_symbolization"), "{name}");
        assert_eq!(marker_function_for_symbolization(), 42);
    }

    /// A function a stripped libc does not export is named from its debug
    /// file's symbol table (Debian's libc6-dbg; without it the test fails
    /// unless `VMTRACE_SKIP_DEBUG_FILES=1` lets it skip, and say so).
    #[test]
    fn a_stripped_librarys_local_function_is_named_from_its_debug_file() {
        use object::{Object, ObjectSymbol};
        let maps = procmaps::read(std::process::id()).unwrap();
        let Some(libc) = maps.iter().find(|r| r.path.as_deref().is_some_and(|p| p.contains("/libc.so"))) else {
            return eprintln!("skipped: no libc.so mapped");
        };
        let path = libc.path.clone().unwrap();
        let Some(debug) = debug_file(&path) else {
            assert!(
                std::env::var("VMTRACE_SKIP_DEBUG_FILES").as_deref() == Ok("1"),
                "no debug file for {path}: `apt install libc6-dbg`, or set VMTRACE_SKIP_DEBUG_FILES=1 to skip explicitly"
            );
            return eprintln!("SKIPPED: no debug file for {path} (VMTRACE_SKIP_DEBUG_FILES=1)");
        };
        let bytes = std::fs::read(&debug.path).unwrap();
        let obj = object::File::parse(&*bytes).unwrap();
        let sym = obj.symbols().find(|s| s.name() == Ok("_int_malloc") && s.size() > 0).expect("_int_malloc");
        let vaddr = sym.address() + 4;
        let (off, v, _) = debug.loads.iter().find(|(_, v, size)| vaddr >= *v && vaddr < v + size).unwrap();
        let file_off = vaddr - v + off;
        assert_eq!(debug.virt_offset(file_off), Some(vaddr));
        let map = maps
            .iter()
            .find(|r| {
                r.path.as_deref() == Some(&path) && file_off >= r.offset && file_off < r.offset + (r.end - r.start)
            })
            .unwrap();
        let addr = map.start + file_off - map.offset;
        let mut n = Names::default();
        n.prepare_user(&[addr], &maps, None);
        assert_eq!(&*n.user(addr, &maps, None), "_int_malloc");
    }

    #[test]
    fn unknown_addresses_keep_a_frame() {
        let n = Names::default();
        assert_eq!(&*n.user(0x10, &[], None), "[unknown] 0x10");
        let jit = PerfMap::parse("7f0000001000 100 py::train_step:/app/train.py\n");
        assert_eq!(&*n.user(0x7f00_0000_1050, &[], Some(&jit)), "py::train_step:/app/train.py");
        assert_eq!(&*n.user(0x7f00_0000_1100, &[], Some(&jit)), "[unknown] 0x7f0000001100");
    }
}
