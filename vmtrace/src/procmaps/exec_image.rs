//! The program and dynamic loader an exec mapped, laid out without reading
//! `/proc/PID/maps`. The kernel maps both itself (no mmap event shows
//! them); the exec hook sends the program file's (device, inode),
//! `mm->start_code` and the loader's `AT_BASE` (`TaskEvent::start_code`),
//! and each file's loadable segments say the rest. A short-lived process
//! (a shell's `ls`, pyenv's dozens of bash scripts per `python3`) exits
//! before a maps read: without this its program's and loader's frames were
//! `[unknown] 0xADDR`, 18% of the faults of a recording beside a shell loop,
//! and a name per address kept by the collector.
use crate::hash::HashMap;
use std::sync::Arc;

use super::Region;
use crate::model::RegionKind;

const PAGE: u64 = 4096;

/// One `PT_LOAD` of a file: what of it is mapped from the file.
#[derive(Clone, Debug)]
struct Load {
    vaddr: u64,
    offset: u64,
    filesz: u64,
    flags: u32,
}

/// A file's loadable segments and the loader it asks for.
#[derive(Debug)]
struct Image {
    loads: Vec<Load>,
    /// `PT_INTERP`: the dynamic loader (a program only).
    interp: Option<String>,
}

impl Image {
    fn read(path: &str) -> Option<Self> {
        use object::{elf, read::elf::ProgramHeader as _, Endianness};
        let f = std::fs::File::open(path).ok()?;
        // SAFETY: read-only and private; only the headers are read.
        let data = unsafe { memmap2::Mmap::map(&f) }.ok()?;
        let file = object::read::elf::ElfFile64::<Endianness>::parse(&*data).ok()?;
        let e = file.endian();
        let mut loads = Vec::new();
        let mut interp = None;
        for ph in file.elf_program_headers() {
            match ph.p_type(e) {
                elf::PT_LOAD => loads.push(Load {
                    vaddr: ph.p_vaddr(e),
                    offset: ph.p_offset(e),
                    filesz: ph.p_filesz(e),
                    flags: ph.p_flags(e),
                }),
                elf::PT_INTERP => {
                    let bytes = ph.data(e, &*data).ok()?;
                    let s = std::str::from_utf8(bytes).ok()?.trim_end_matches('\0');
                    interp = Some(s.to_string());
                }
                _ => {}
            }
        }
        (!loads.is_empty()).then_some(Self { loads, interp })
    }

    /// The regions of the file's segments mapped at `bias`.
    fn layout(&self, path: &str, bias: u64) -> Vec<Region> {
        use object::elf::{PF_R, PF_W, PF_X};
        self.loads
            .iter()
            .filter(|l| l.filesz > 0)
            .map(|l| {
                let flag = |f: u32, c: char| if l.flags & f != 0 { c } else { '-' };
                Region {
                    start: bias.wrapping_add(l.vaddr & !(PAGE - 1)),
                    end: bias.wrapping_add((l.vaddr + l.filesz).div_ceil(PAGE) * PAGE),
                    perms: format!("{}{}{}p", flag(PF_R, 'r'), flag(PF_W, 'w'), flag(PF_X, 'x')).into(),
                    offset: l.offset & !(PAGE - 1),
                    kind: RegionKind::File,
                    path: Some(path.into()),
                }
            })
            .collect()
    }
}

/// The images read so far, by path (a node starts the same few programs
/// over and over); emptied when full.
#[derive(Default)]
pub(crate) struct ExecImages {
    by_path: HashMap<String, Option<Arc<Image>>>,
}

impl ExecImages {
    const MAX: usize = 1024;

    fn image(&mut self, path: &str) -> Option<Arc<Image>> {
        if let Some(i) = self.by_path.get(path) {
            return i.clone();
        }
        if self.by_path.len() >= Self::MAX {
            self.by_path.clear();
        }
        let i = Image::read(path).map(Arc::new);
        self.by_path.insert(path.to_string(), i.clone());
        i
    }

    /// The regions of the program at `exe` whose lowest executable segment
    /// starts at `start_code`, and of its loader at `at_base` (0: none).
    /// Empty when the file cannot be read or does not match.
    pub(crate) fn regions(&mut self, exe: &str, start_code: u64, at_base: u64) -> Vec<Region> {
        let Some(image) = self.image(exe) else { return Vec::new() };
        // load_elf_binary: start_code is the lowest p_vaddr of an
        // executable segment, plus the load bias.
        let Some(text) = image.loads.iter().filter(|l| l.flags & object::elf::PF_X != 0).map(|l| l.vaddr).min() else {
            return Vec::new();
        };
        let mut out = image.layout(exe, start_code.wrapping_sub(text));
        if let (Some(interp), true) = (image.interp.as_deref(), at_base != 0) {
            if let Some(loader) = self.image(interp) {
                // AT_BASE is where the loader's first page went.
                let first = loader.loads.iter().map(|l| l.vaddr & !(PAGE - 1)).min().unwrap_or(0);
                out.extend(loader.layout(interp, at_base.wrapping_sub(first)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (start_code, AT_BASE) of this process, as the kernel keeps them.
    fn own_image() -> (u64, u64) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        // Field 26 (startcode) is the 24th after the command.
        let start_code: u64 = after.split_whitespace().nth(23).unwrap().parse().unwrap();
        let auxv = std::fs::read("/proc/self/auxv").unwrap();
        let at_base = auxv
            .chunks_exact(16)
            .map(|c| (u64::from_ne_bytes(c[..8].try_into().unwrap()), u64::from_ne_bytes(c[8..].try_into().unwrap())))
            .find(|(k, _)| *k == 7)
            .map_or(0, |(_, v)| v);
        (start_code, at_base)
    }

    /// The test binary's and its loader's segments, laid out from
    /// `start_code` and `AT_BASE`, are where the kernel's own maps put
    /// them: every page of each names the same file at the same offset.
    #[test]
    fn the_program_and_loader_lie_where_the_kernel_mapped_them() {
        let (start_code, at_base) = own_image();
        let exe = std::fs::read_link("/proc/self/exe").unwrap().display().to_string();
        let maps = crate::procmaps::read(std::process::id()).unwrap();
        let regions = ExecImages::default().regions(&exe, start_code, at_base);
        let loader = regions.iter().filter(|r| r.path.as_deref() != Some(&exe)).count();
        assert!(regions.len() - loader >= 2, "the program's segments: {regions:?}");
        assert!(at_base == 0 || loader >= 2, "the loader's segments: {regions:?}");
        for r in &regions {
            let mut a = r.start;
            while a < r.end {
                let m = crate::procmaps::find(&maps, a).unwrap_or_else(|| panic!("{a:#x} of {r:?} is not mapped"));
                let want = std::fs::canonicalize(r.path.as_deref().unwrap()).unwrap();
                let got = std::fs::canonicalize(m.path.as_deref().unwrap()).unwrap();
                assert_eq!(want, got, "{a:#x}: {r:?} against {m:?}");
                assert_eq!(a - r.start + r.offset, a - m.start + m.offset, "{a:#x}: {r:?} against {m:?}");
                a += PAGE;
            }
        }
        // The executable segments are whole mappings of their own.
        for r in regions.iter().filter(|r| r.perms.contains('x')) {
            assert!(maps.iter().any(|m| (m.start, m.end, m.offset) == (r.start, r.end, r.offset)), "{r:?}");
        }
    }

    #[test]
    fn a_file_that_is_not_a_program_gives_nothing() {
        let mut images = ExecImages::default();
        assert!(images.regions("/proc/self/status", 0x1000, 0).is_empty());
        assert!(images.regions("/nonexistent/vmtrace-test", 0x1000, 0).is_empty());
    }
}
