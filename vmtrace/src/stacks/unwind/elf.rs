//! The unwind sections of one ELF object, read once and shared by every
//! process that maps it. Only the sections are copied (never the whole
//! file): `.eh_frame_hdr` + `.eh_frame` as compilers emit them for every
//! function, `.debug_frame` where `.eh_frame` is missing (from the object or
//! its build-id debug file).
//!
//! `.gnu_debugdata` (xz "mini debuginfo") is not read: by its design it holds
//! only a `.symtab` of the functions `.dynsym` lacks, never call-frame
//! information, so it helps naming frames, not finding them.
use std::{fs::File, ops::Range, path::Path, sync::Arc};

use object::{Object, ObjectSection, ObjectSegment, ReadCache};

/// Why an object's unwind sections could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot open: {0}")]
    Open(#[from] std::io::Error),
    #[error("not a readable ELF object: {0}")]
    Parse(#[from] object::Error),
}

/// Section bytes as framehop reads them (`Deref<Target = [u8]>`), shared
/// between the modules built for each process.
pub type Bytes = Arc<[u8]>;

/// One section: its address as stated in the object (SVMA) and its bytes.
#[derive(Clone, Debug)]
pub struct Section {
    pub svma: Range<u64>,
    pub data: Bytes,
}

/// What framehop needs of an object, independent of where it is mapped.
#[derive(Debug, Default)]
pub struct ObjectInfo {
    pub eh_frame: Option<Section>,
    pub eh_frame_hdr: Option<Section>,
    pub debug_frame: Option<Bytes>,
    pub text_svma: Option<Range<u64>>,
    pub got_svma: Option<Range<u64>>,
    /// PT_LOAD segments as (file offset range, SVMA of its first byte): a
    /// mapping's file offset gives its load bias through them.
    pub loads: Vec<(Range<u64>, u64)>,
}

impl ObjectInfo {
    pub fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// Bytes held by the copied sections.
    pub fn bytes(&self) -> usize {
        let sec = |s: &Option<Section>| s.as_ref().map_or(0, |s| s.data.len());
        sec(&self.eh_frame) + sec(&self.eh_frame_hdr) + self.debug_frame.as_ref().map_or(0, |d| d.len())
    }

    /// The load bias of a mapping at `start` of the file from `offset`:
    /// what is added to an SVMA to get the address in the process.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let (range, vaddr) = self.loads.iter().find(|(r, _)| {
            // Mappings start on page boundaries below the segment's offset.
            let page_start = r.start & !0xfff;
            (page_start..r.end.max(page_start + 1)).contains(&offset)
        })?;
        let svma = vaddr.wrapping_sub(range.start).wrapping_add(offset);
        Some(start.wrapping_sub(svma))
    }

    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let file = File::open(path)?;
        let cache = ReadCache::new(file);
        let obj = object::File::parse(&cache)?;
        let mut info = Self::from_object(&obj);
        if !info.has_cfi() {
            info.debug_frame = separate_debug_frame(&obj);
        }
        Ok(info)
    }

    fn from_object<'d>(obj: &object::File<'d, &'d ReadCache<File>>) -> Self {
        let section = |name: &str| {
            let s = obj.section_by_name(name)?;
            let data = s.data().ok()?;
            (!data.is_empty()).then(|| Section { svma: s.address()..s.address() + s.size(), data: Bytes::from(data) })
        };
        let svma = |name: &str| obj.section_by_name(name).map(|s| s.address()..s.address() + s.size());
        let loads = obj
            .segments()
            .map(|seg| {
                let (off, size) = seg.file_range();
                (off..off + size, seg.address())
            })
            .collect();
        Self {
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|s| s.data),
            text_svma: svma(".text"),
            got_svma: svma(".got"),
            loads,
        }
    }
}

/// `.debug_frame` of the object's debug file under `/usr/lib/debug/.build-id`,
/// where distributions install it (e.g. Debian's `-dbgsym` packages).
fn separate_debug_frame<'d>(obj: &object::File<'d, &'d ReadCache<File>>) -> Option<Bytes> {
    let id = obj.build_id().ok()??;
    let (first, rest) = id.split_first()?;
    let hex = rest.iter().fold(String::new(), |mut s, b| {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
        s
    });
    let path = format!("/usr/lib/debug/.build-id/{first:02x}/{hex}.debug");
    let file = File::open(path).ok()?;
    let cache = ReadCache::new(file);
    let dbg = object::File::parse(&cache).ok()?;
    let data = dbg.section_by_name(".debug_frame")?.data().ok()?;
    (!data.is_empty()).then(|| Bytes::from(data))
}
