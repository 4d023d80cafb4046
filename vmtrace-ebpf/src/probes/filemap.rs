//! Page-cache additions by traced processes, per file: the pages readahead
//! brought in around the faults (and reads) that asked for them. Pages a
//! write syscall adds hold what the process wrote, not data read from
//! storage: they are counted apart (`FILE_KEY_WRITTEN`).
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, tracepoint},
    maps::PerCpuHashMap,
    programs::TracePointContext,
};
use vmtrace_common::{DropKind, FileChunkKey, FileKey, FILE_CHUNK_SHIFT, FILE_KEY_READ, FILE_KEY_WRITTEN, PMD_ORDER};

use super::fault::try_huge_alloc;
use crate::{
    globals::config,
    inflight::in_fault,
    shared::{count_drop, is_traced, tp_fixed, tp_loaded},
};

/// Pages added to the page cache per file by traced processes (readahead).
#[map]
static FILE_CACHE: PerCpuHashMap<FileKey, u64> = PerCpuHashMap::with_max_entries(16_384, 0);

/// The same per 1 MiB chunk of a file (64 GiB of file data in all).
#[map]
static FILE_CHUNKS: PerCpuHashMap<FileChunkKey, u64> = PerCpuHashMap::with_max_entries(65_536, 0);

// /sys/kernel/tracing/events/filemap/mm_filemap_add_to_page_cache/format:
//   field:unsigned long pfn;   offset:8;  size:8; signed:0;
//   field:unsigned long i_ino; offset:16; size:8; signed:0;
//   field:unsigned long index; offset:24; size:8; signed:0;
//   field:dev_t s_dev;         offset:32; size:4; signed:0;
//   field:unsigned char order; offset:36; size:1; signed:0;
// 6.1's record ends at s_dev: `order` is read where the loader found it
// (`Tp::AddToCacheOrder`), and each folio counts as one page without it.
#[tracepoint(category = "filemap", name = "mm_filemap_add_to_page_cache")]
pub fn tp_filemap_mm_filemap_add_to_page_cache(ctx: TracePointContext) -> u32 {
    let _ = try_add_to_page_cache(&ctx);
    0
}

#[inline(always)]
fn try_add_to_page_cache(ctx: &TracePointContext) -> Option<()> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if config().regions == 0 || !is_traced(tgid) {
        return None;
    }
    let (ino, index, dev) =
        (tp_fixed!(ctx, AddToCacheIno: u64), tp_fixed!(ctx, AddToCacheIndex: u64), tp_fixed!(ctx, AddToCacheDev: u32));
    let order = tp_loaded!(ctx, AddToCacheOrder: u8).unwrap_or(0);
    if u32::from(order) >= PMD_ORDER {
        // A PMD-order folio: page-cache folios reach it on filesystems with
        // large folios whatever transparent_hugepage/enabled says, so the
        // huge-page hook on every allocation is not needed to see them.
        let _ = try_huge_alloc(ctx);
    }
    let pages = 1u64 << (order & 15);
    // A fault in flight reads its page from storage even inside a write
    // syscall (the source buffer of a write() mapped from a file); a fast
    // fault that ended before the write is not in flight.
    if !in_fault(bpf_get_current_pid_tgid() as u32) && crate::arch::in_write_syscall() {
        // The page holds what the process wrote (write_begin): no read from
        // storage, and no chunk of the file read either.
        let key = FileKey { dev, kind: FILE_KEY_WRITTEN, ino };
        if let Some(p) = FILE_CACHE.get_ptr_mut(key) {
            // SAFETY: this CPU's value of a live entry.
            unsafe { *p += pages };
        } else {
            let _ = FILE_CACHE.insert(key, pages, 1);
        }
        return Some(());
    }
    let key = FileKey { dev, kind: FILE_KEY_READ, ino };
    if let Some(p) = FILE_CACHE.get_ptr_mut(key) {
        // SAFETY: this CPU's value of a live entry.
        unsafe { *p += pages };
    } else {
        let _ = FILE_CACHE.insert(key, pages, 1);
    }
    // Folios are naturally aligned: one of up to 256 pages lies inside one
    // chunk; a PMD-order one (512 pages) covers two whole chunks, and each
    // gets its half (all of it in the first put a tensor there at twice its
    // bytes read from disk).
    let first = (index >> FILE_CHUNK_SHIFT) as u32;
    let per_chunk = 1u64 << FILE_CHUNK_SHIFT;
    if pages > per_chunk {
        add_chunk(FileChunkKey { dev, chunk: first, ino }, per_chunk);
        add_chunk(FileChunkKey { dev, chunk: first + 1, ino }, pages - per_chunk);
    } else {
        add_chunk(FileChunkKey { dev, chunk: first, ino }, pages);
    }
    Some(())
}

/// Adds `pages` to this CPU's count of `chunk` (made at need).
#[inline(always)]
fn add_chunk(chunk: FileChunkKey, pages: u64) {
    if let Some(p) = FILE_CHUNKS.get_ptr_mut(chunk) {
        // SAFETY: this CPU's value of a live entry.
        unsafe { *p += pages };
    } else if FILE_CHUNKS.insert(chunk, pages, 1).is_err() {
        match FILE_CHUNKS.get_ptr_mut(chunk) {
            // SAFETY: as above (inserted meanwhile on another CPU).
            Some(p) => unsafe { *p += pages },
            None => count_drop(DropKind::FileChunksFull),
        }
    }
}
