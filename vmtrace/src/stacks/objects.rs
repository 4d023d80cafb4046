//! The object files mapped to unwind and name user stacks (`unwind::elf`'s
//! programs and libraries, the symbolizer's debug files, blazesym's own
//! maps) stay mapped while their processes run. What a lookup touched
//! stays resident in the collector: beside a `cargo build`, 14 MB of
//! librustc_driver's, libLLVM's and cargo's `.eh_frame` and symbol pages
//! (docs/performance.md). Those pages are the page cache's, shared with the
//! programs that run them; when they grew (`ObjectPages`, checked once a
//! second) the collector drops its own mappings of them (`MADV_DONTNEED`
//! on a read-only shared file mapping only unmaps: the next lookup maps
//! the page again from the page cache, a minor fault, with the same bytes).

/// How much the collector's file pages (`RssFile`) may grow after a drop
/// before the object pages are dropped again. Under churn the lookups of
/// one second touch 4-7 MB of them (smaps of the `r--s` mappings, sampled
/// a second after a drop), so 1 MiB dropped every second all the same.
const GROWN_KB: u64 = 8 << 10;

/// When to drop the object pages: only when the collector's own file-backed
/// resident pages grew by `GROWN_KB` since the last drop. Dropping once a
/// second whatever they held was one `MADV_DONTNEED` per object mapping a
/// second, each a call the collector traces for itself (mem32: 65k of the
/// two collectors' 73k madvise calls in 150 s of churn), and the pages a
/// lookup needs again faulted back in; 11,130 such calls against 15,978 in
/// 150 s side by side (docs/performance.md, "Object pages dropped when they
/// grew").
#[derive(Default)]
pub struct ObjectPages {
    /// `RssFile` (kB) just after the last drop. Not lowered when it falls:
    /// the objects closed and mapped again (`CLOSE_OBJECTS_EVERY`) would
    /// count as growth.
    after_drop_kb: Option<u64>,
}

impl ObjectPages {
    /// Drops the object pages (`drop_object_pages`) if they may have grown
    /// by `GROWN_KB`: how many mappings, `None` when not due.
    pub fn tick(&mut self) -> Option<usize> {
        if !self.due(file_rss_kb()) {
            return None;
        }
        let n = drop_object_pages();
        self.after_drop_kb = file_rss_kb();
        Some(n)
    }

    /// Whether `now_kb` of file pages calls for a drop (always when either
    /// reading failed).
    fn due(&mut self, now_kb: Option<u64>) -> bool {
        let (Some(now), Some(base)) = (now_kb, self.after_drop_kb) else { return true };
        now >= base + GROWN_KB
    }
}

/// This process's resident file-backed pages in kB (`/proc/self/statm`'s
/// third field, shared: file and shmem pages; the collector maps no shmem).
fn file_rss_kb() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(2)?.parse().ok()?;
    Some(pages * crate::kernel::page_size() / 1024)
}

/// Drops the collector's page mappings of every read-only shared file
/// mapping it holds (`r--s` with a path: the object files; never the ring
/// buffers, which are `anon_inode:` mappings). Returns how many mappings.
pub fn drop_object_pages() -> usize {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return 0 };
    let mut n = 0;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        // offset, device, inode, then the path.
        let path = f.nth(3).unwrap_or("");
        if perms != "r--s" || !path.starts_with('/') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16)) else {
            continue;
        };
        if unmap_pages(start, end) {
            n += 1;
        }
    }
    n
}

/// Drops this process's mappings of the whole pages of `bytes`, part of a
/// read-only file mapping (the binary's own `.rodata`): the embedded eBPF
/// object, 4.3 MB with its BTF and debug sections, is read once by the
/// loader and stayed resident (3.9 MB of the binary's resident pages).
/// Read again, the pages come back from the file.
pub fn drop_pages_of(bytes: &'static [u8]) {
    let page = 4096;
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end > start {
        unmap_pages(start, end);
    }
}

/// `MADV_DONTNEED` on `[start, end)`, whole pages of a read-only file
/// mapping (a shared map of an object, or the executable's own): this
/// process's page table entries go, and a later read faults the same file
/// bytes back in from the page cache. Whether the kernel took it.
fn unmap_pages(start: usize, end: usize) -> bool {
    // SAFETY: as above: read-only file pages, nothing of ours is lost.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) == 0 }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    /// Dropped again only once the file pages grew by `GROWN_KB` over the
    /// level just after the last drop.
    #[test]
    fn object_pages_are_dropped_again_only_once_they_grew() {
        let mut o = super::ObjectPages::default();
        assert!(o.due(Some(5000)), "the first time");
        o.after_drop_kb = Some(5000);
        assert!(!o.due(Some(5000 + super::GROWN_KB - 1)));
        assert!(!o.due(Some(4000)), "fell");
        assert!(!o.due(Some(4000 + super::GROWN_KB)), "grew back: from the level after the drop");
        assert!(o.due(Some(5000 + super::GROWN_KB)));
        assert!(o.due(None), "unread");
        // The real one: a first tick drops, and the level after it is kept.
        let mut o = super::ObjectPages::default();
        assert!(o.tick().is_some());
        assert!(o.after_drop_kb.is_some_and(|kb| kb > 0));
    }

    /// A shared read-only map of a file reads the same after its pages
    /// were dropped, and holds none of them in between (smaps' `Rss`).
    #[test]
    fn a_mapped_files_pages_are_dropped_and_read_back_the_same() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        // SAFETY: the file is ours and not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let sum = |m: &[u8]| m.iter().map(|&b| u64::from(b)).sum::<u64>();
        let before = sum(&map);
        // This mapping's resident kB, as smaps counts it.
        let rss_kb = |m: &memmap2::Mmap| -> u64 {
            let start = format!("{:x}-", m.as_ptr() as usize);
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let at = smaps.lines().position(|l| l.starts_with(&start)).expect("the mapping in smaps");
            let rss = smaps.lines().skip(at + 1).find(|l| l.starts_with("Rss:")).unwrap();
            rss.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        assert_eq!(rss_kb(&map), 1024, "every page read");
        assert!(super::drop_object_pages() >= 1);
        assert_eq!(rss_kb(&map), 0, "none mapped after the drop");
        assert_eq!(sum(&map), before, "the same bytes read back");
        assert_eq!(rss_kb(&map), 1024);
    }
}
