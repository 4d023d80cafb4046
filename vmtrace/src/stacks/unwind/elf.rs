//! The unwind sections of one ELF object, mapped once and shared by every
//! process that maps it: `.eh_frame_hdr` + `.eh_frame` as compilers emit them for every
//! function, `.debug_frame` where `.eh_frame` is missing (from the object or
//! its build-id debug file).
//!
//! `.gnu_debugdata` (xz "mini debuginfo") is not read: by its design it holds
//! only a `.symtab` of the functions `.dynsym` lacks, never call-frame
//! information, so it helps naming frames, not finding them.
use std::{fs::File, ops::Range, path::Path, sync::Arc};

use object::{Object, ObjectSection, ObjectSegment};

/// Why an object's unwind sections could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot open: {0}")]
    Open(#[from] std::io::Error),
    #[error("not a readable ELF object: {0}")]
    Parse(#[from] object::Error),
}

/// Section bytes as framehop reads them (`Deref<Target = [u8]>`): a range of
/// the object's file, mapped read-only and shared between the modules built
/// for each process. Mapped, not copied: only the pages an unwind touches are
/// resident, and the kernel may drop them again (a compiler's `.eh_frame` is
/// tens of MB, of which a few pages are read).
#[derive(Clone)]
pub(super) struct Bytes {
    file: Arc<memmap2::Mmap>,
    range: Range<usize>,
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.file[self.range.clone()]
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({:?})", self.range)
    }
}

/// Maps `file` read-only.
fn map(file: &File) -> std::io::Result<Arc<memmap2::Mmap>> {
    // SAFETY: the map is read-only and private to vmtrace. An object is
    // replaced by a new file on upgrade (a new inode, a new cache entry);
    // one truncated in place while mapped would fault on access, as it would
    // for the processes running it.
    Ok(Arc::new(unsafe { memmap2::Mmap::map(file) }?))
}

/// The bytes of an uncompressed, non-empty section of the object in `file`.
fn section_bytes(file: &Arc<memmap2::Mmap>, s: &object::Section<'_, '_>) -> Option<Bytes> {
    let c = s.compressed_file_range().ok()?;
    if c.format != object::CompressionFormat::None || c.compressed_size == 0 {
        // Compressed `.debug_frame` (some debug files) is not read: the
        // object crate is built without decompression.
        return None;
    }
    let start = usize::try_from(c.offset).ok()?;
    let end = start.checked_add(usize::try_from(c.compressed_size).ok()?)?;
    (end <= file.len()).then(|| Bytes { file: file.clone(), range: start..end })
}

/// One section: its address as stated in the object (SVMA) and its bytes.
#[derive(Clone, Debug)]
pub(super) struct Section {
    pub svma: Range<u64>,
    pub data: Bytes,
}

/// What framehop needs of an object, independent of where it is mapped.
#[derive(Debug, Default)]
pub(super) struct ObjectInfo {
    pub eh_frame: Option<Section>,
    pub eh_frame_hdr: Option<Section>,
    pub debug_frame: Option<Bytes>,
    pub text_svma: Option<Range<u64>>,
    pub got_svma: Option<Range<u64>>,
    /// PT_LOAD segments as (file offset range, SVMA of its first byte,
    /// executable): a mapping's file offset gives its load bias through them.
    pub loads: Vec<(Range<u64>, u64, bool)>,
}

impl ObjectInfo {
    pub(super) fn has_cfi(&self) -> bool {
        self.eh_frame.is_some() || self.debug_frame.is_some()
    }

    /// Bytes of the mapped sections (address space; resident only as read).
    pub(super) fn bytes(&self) -> usize {
        let sec = |s: &Option<Section>| s.as_ref().map_or(0, |s| s.data.len());
        sec(&self.eh_frame) + sec(&self.eh_frame_hdr) + self.debug_frame.as_ref().map_or(0, |d| d.len())
    }

    /// The load bias of a mapping at `start` of the file from `offset`:
    /// what is added to an SVMA to get the address in the process.
    ///
    /// A mapping of a segment starts at the page of the segment's offset, and
    /// that page may hold the end of the segment before it too (lld packs
    /// segments into the file, `p_vaddr` = `p_offset` + 0x1000 for the code
    /// of a Rust or C++ program): the segment that starts on the mapping's
    /// page is the one mapped; a segment that merely covers it (a mapping
    /// split by mprotect) only where none starts there. Taking the first
    /// that covers it put every frame of such a program's code one page off
    /// its call-frame information.
    ///
    /// Two segments may start on one page (a small binary's read-only
    /// headers and its code): the caller maps code, so an executable one is
    /// taken first.
    pub(super) fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let page = crate::kernel::page_size().max(4096) - 1;
        let covers = |r: &Range<u64>| {
            // Mappings start on page boundaries below the segment's offset.
            let page_start = r.start & !page;
            (page_start..r.end.max(page_start + 1)).contains(&offset)
        };
        let starts = |r: &Range<u64>| r.start & !page == offset;
        let (range, vaddr, _) = self
            .loads
            .iter()
            .find(|(r, _, x)| *x && starts(r))
            .or_else(|| self.loads.iter().find(|(r, _, _)| starts(r)))
            .or_else(|| self.loads.iter().find(|(r, _, _)| covers(r)))?;
        let svma = vaddr.wrapping_sub(range.start).wrapping_add(offset);
        Some(start.wrapping_sub(svma))
    }

    pub(super) fn load(path: &Path) -> Result<Self, LoadError> {
        let file = map(&File::open(path)?)?;
        let obj = object::File::parse(&**file)?;
        let mut info = Self::from_object(&file, &obj);
        if !info.has_cfi() {
            info.debug_frame = separate_debug_frame(&obj);
        }
        Ok(info)
    }

    fn from_object(file: &Arc<memmap2::Mmap>, obj: &object::File<'_>) -> Self {
        let section = |name: &str| {
            let s = obj.section_by_name(name)?;
            Some(Section { svma: s.address()..s.address() + s.size(), data: section_bytes(file, &s)? })
        };
        let svma = |name: &str| obj.section_by_name(name).map(|s| s.address()..s.address() + s.size());
        let loads = obj
            .segments()
            .map(|seg| {
                let (off, size) = seg.file_range();
                let exec =
                    matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0);
                (off..off + size, seg.address(), exec)
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

/// Where distributions install the debug file of `obj` by its build-id:
/// `/usr/lib/debug/.build-id/NN/REST.debug`.
pub(crate) fn build_id_debug_path(obj: &object::File<'_>) -> Option<String> {
    let id = obj.build_id().ok()??;
    let (first, rest) = id.split_first()?;
    let hex = rest.iter().fold(String::new(), |mut s, b| {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
        s
    });
    (!hex.is_empty()).then(|| format!("/usr/lib/debug/.build-id/{first:02x}/{hex}.debug"))
}

/// `.debug_frame` of the object's debug file under `/usr/lib/debug/.build-id`,
/// where distributions install it (e.g. Debian's `-dbgsym` packages).
fn separate_debug_frame(obj: &object::File<'_>) -> Option<Bytes> {
    let path = build_id_debug_path(obj)?;
    let file = map(&File::open(path).ok()?).ok()?;
    let dbg = object::File::parse(&**file).ok()?;
    section_bytes(&file, &dbg.section_by_name(".debug_frame")?)
}
