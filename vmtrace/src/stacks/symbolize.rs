//! Addresses to names. User frames are normalized to (ELF file, file offset)
//! through the process's memory map as it was while the process lived, so
//! processes that exited are symbolized too; JIT code through
//! `/tmp/perf-PID.map`; kernel frames through kallsyms. A frame that cannot be
//! named shows `module+0xoffset`: frames never vanish.
use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use blazesym::symbolize::{
    source::{Elf, Kernel, Source},
    Input, Symbolized, Symbolizer,
};

use super::{Frame, Frames};
use crate::{
    model::RegionKind,
    procmaps::{self, Region},
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
    kernel: HashMap<u64, Frame>,
    user: HashMap<(PathBuf, u64), Frame>,
    /// Names made per address (JIT code, anonymous memory) and markers, once each.
    other: RefCell<HashSet<Frame>>,
    /// Whole stacks, once each.
    stacks: RefCell<HashSet<Frames>>,
}

impl Default for Names {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            kernel: HashMap::new(),
            user: HashMap::new(),
            other: RefCell::new(HashSet::new()),
            stacks: RefCell::new(HashSet::new()),
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
        Some(r) if r.kind == RegionKind::Vdso => Place::Named(r.path.clone().unwrap_or_else(|| "[vdso]".into())),
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
        if other.capacity() > 4 * other.len().max(1024) {
            other.shrink_to_fit();
        }
        if stacks.capacity() > 4 * stacks.len().max(1024) {
            stacks.shrink_to_fit();
        }
        before - other.len() - stacks.len()
    }

    /// Resolves user addresses of one process in bulk (call before `user`).
    pub fn prepare_user(&mut self, addrs: &[u64], maps: &[Region]) {
        let mut by_file: HashMap<&str, Vec<u64>> = HashMap::new();
        for &a in addrs {
            if let Place::File(path, off) = place(a, maps, None) {
                if !self.user.contains_key(&(PathBuf::from(path), off)) {
                    by_file.entry(path).or_default().push(off);
                }
            }
        }
        for (path, mut offs) in by_file {
            offs.sort_unstable();
            offs.dedup();
            let src = Source::Elf(Elf::new(path));
            let syms = self.symbolizer.symbolize(&src, Input::FileOffset(&offs));
            for (i, off) in offs.iter().enumerate() {
                let name = match syms.as_ref().ok().and_then(|s| s.get(i)) {
                    Some(Symbolized::Sym(sym)) => self.intern(&sym.name),
                    _ => self.intern(&format!("{}+{off:#x}", basename(path))),
                };
                self.user.insert((PathBuf::from(path), *off), name);
            }
        }
    }

    pub fn user(&self, addr: u64, maps: &[Region], jit: Option<&PerfMap>) -> Frame {
        match place(addr, maps, jit) {
            Place::File(path, off) => self
                .user
                .get(&(PathBuf::from(path), off))
                .cloned()
                .unwrap_or_else(|| self.intern(&format!("{}+{off:#x}", basename(path)))),
            Place::Named(n) => self.intern(&n),
        }
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
        n.prepare_user(&[addr], &maps);
        let name = n.user(addr, &maps, None);
        assert!(name.contains("marker_function_for_symbolization"), "{name}");
        assert_eq!(marker_function_for_symbolization(), 42);
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
