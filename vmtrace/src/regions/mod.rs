//! Which memory region took each fault: the kernel counts faults per 256 KiB
//! granule of each process (with a bitmap of the pages touched); here each
//! touched page is placed in the region (VMA) that held it — from the last
//! read of `/proc/PID/maps`, else from the mapping events (regions gone by
//! the end) — and counts follow the pages. Then per file across processes,
//! and per tensor of a safetensors checkpoint.
pub mod safetensors;

use std::collections::{BTreeMap, HashMap};

use vmtrace_common::{GranuleCounts, GranuleKey, FILE_CHUNK_SHIFT, GRANULE_HIST, GRANULE_PAGES, REGION_GRANULE_SHIFT};

use crate::model::{FileSummary, RegionSummary, TensorSummary};
use crate::{
    model::RegionKind,
    model::{largest_remainder, scale, Faults, Hist},
    procmaps::{self, Region},
};

/// Counts of a share of a granule, accumulated per region.
#[derive(Clone, Debug, Default)]
struct Acc {
    faults: f64,
    major: f64,
    write: f64,
    exec: f64,
    cow: f64,
    huge: f64,
    time_ns: f64,
    timed: f64,
    major_time_ns: f64,
    hist: [f64; GRANULE_HIST],
    pages: u64,
}

impl Acc {
    fn add_share(&mut self, g: &GranuleCounts, share: f64, pages: u64) {
        self.faults += g.faults as f64 * share;
        self.major += g.major as f64 * share;
        self.write += g.write as f64 * share;
        self.exec += g.exec as f64 * share;
        self.cow += g.cow as f64 * share;
        self.huge += g.huge as f64 * share;
        self.time_ns += g.time_ns as f64 * share;
        self.timed += g.timed as f64 * share;
        self.major_time_ns += g.major_time_ns as f64 * share;
        for (a, h) in self.hist.iter_mut().zip(g.hist.iter()) {
            *a += f64::from(*h) * share;
        }
        self.pages += pages;
    }

    /// Pages faulted in: those that took a fault, a huge page's 511 others too.
    fn pages_faulted_in(&self) -> u64 {
        self.pages + (self.huge.round().max(0.0) as u64) * 511
    }

    fn faults(&self) -> Faults {
        let total = self.faults.round() as u64;
        let major = (self.major.round() as u64).min(total);
        // Minor latency may be sampled: its time alone is scaled to all minor
        // faults (majors are all timed), as for the process (`scale`).
        let round = |v: f64| v.round().max(0.0) as u64;
        let (major_time, timed) = (round(self.major_time_ns), round(self.timed));
        let minor_time = round(self.time_ns).saturating_sub(major_time);
        let time_ns = scale(minor_time, timed.saturating_sub(major), total - major) + major_time;
        let mut hist = Hist::default();
        for (i, v) in self.hist.iter().enumerate() {
            // Coarse bucket i is fine bucket 2i (upper bound 1024 << 2i ns).
            let fine = (2 * i).min(hist.0.len() - 1);
            hist.0[fine] += v.round() as u64;
        }
        Faults {
            total,
            minor: total - major,
            major,
            write: self.write.round() as u64,
            exec: self.exec.round() as u64,
            cow: self.cow.round() as u64,
            huge: Some(self.huge.round() as u64),
            time_ns,
            minor_time_ns: time_ns - major_time,
            major_time_ns: major_time,
            timed: self.timed.round() as u64,
            latency_hist_ns: hist,
            ..Faults::default()
        }
    }
}

/// The regions of one process to place its pages in.
pub struct ProcessRegions<'a> {
    pub maps: &'a [Region],
    pub mapped: &'a procmaps::MappedRegions,
}

/// How far below its start, as last read, a stack may have grown (the default
/// RLIMIT_STACK).
const STACK_GROWTH: u64 = 8 << 20;

impl ProcessRegions<'_> {
    fn find(&self, addr: u64) -> Option<&Region> {
        procmaps::find(self.maps, addr).or_else(|| self.mapped.find(addr)).or_else(|| {
            self.maps.iter().find(|r| r.kind == RegionKind::Stack && addr < r.start && r.start - addr <= STACK_GROWTH)
        })
    }
}

/// Where each file page that faulted went, for the file and tensor views.
struct FileHit {
    path: String,
    file_offset: u64,
    share: f64,
}

pub struct Attributed {
    pub regions: Vec<RegionSummary>,
    pub files: Vec<FileSummary>,
}

/// Places every granule's faults in regions, then sums files and tensors.
/// `page_cache` gives pages added per file path (readahead).
pub fn attribute<'a>(
    granules: &[(GranuleKey, GranuleCounts)],
    regions_of: impl Fn(u32) -> Option<ProcessRegions<'a>>,
    page_cache: impl Fn(&str) -> Option<PageCache>,
) -> Attributed {
    let unknown = |pid: u32, addr: u64| Region {
        start: addr >> REGION_GRANULE_SHIFT << REGION_GRANULE_SHIFT,
        end: (addr >> REGION_GRANULE_SHIFT << REGION_GRANULE_SHIFT) + (1 << REGION_GRANULE_SHIFT),
        perms: "----".into(),
        offset: 0,
        kind: RegionKind::Other,
        path: Some(format!("[unknown region of {pid}]")),
    };
    let mut acc: BTreeMap<(u32, u64, u64), (Region, Acc)> = BTreeMap::new();
    let mut file_pages: Vec<(GranuleCounts, FileHit)> = Vec::new();
    for (k, g) in granules {
        let base = k.granule << REGION_GRANULE_SHIFT;
        let regs = regions_of(k.tgid);
        let pages: Vec<u64> =
            (0..GRANULE_PAGES).filter(|i| g.touched & (1 << i) != 0).map(|i| base + i * 4096).collect();
        let n = pages.len().max(1) as f64;
        let mut per_region: HashMap<(u64, u64), (Region, u64)> = HashMap::new();
        for &addr in &pages {
            let r = regs.as_ref().and_then(|rs| rs.find(addr)).cloned().unwrap_or_else(|| unknown(k.tgid, addr));
            if r.kind == RegionKind::File {
                if let Some(path) = &r.path {
                    file_pages.push((
                        *g,
                        FileHit { path: path.clone(), file_offset: r.offset + (addr - r.start), share: 1.0 / n },
                    ));
                }
            }
            per_region.entry((r.start, r.end)).or_insert_with(|| (r, 0)).1 += 1;
        }
        for ((start, end), (r, cnt)) in per_region {
            let e = acc.entry((k.tgid, start, end)).or_insert_with(|| (r, Acc::default()));
            e.1.add_share(g, cnt as f64 / n, cnt);
        }
    }
    apportion_per_process(&mut acc);
    let mut files: BTreeMap<String, Acc> = BTreeMap::new();
    let regions: Vec<RegionSummary> = acc
        .into_iter()
        .map(|((pid, _, _), (r, a))| {
            if let (RegionKind::File, Some(p)) = (r.kind, &r.path) {
                let f = files.entry(p.clone()).or_default();
                f.faults += a.faults;
                f.major += a.major;
                f.write += a.write;
                f.exec += a.exec;
                f.cow += a.cow;
                f.huge += a.huge;
                f.time_ns += a.time_ns;
                f.timed += a.timed;
                f.major_time_ns += a.major_time_ns;
                for (x, y) in f.hist.iter_mut().zip(a.hist.iter()) {
                    *x += y;
                }
                f.pages += a.pages;
            }
            let mut faults = a.faults();
            if r.kind == RegionKind::Hugetlb {
                // A hugetlb mapping has no small pages: every fault maps a huge one.
                faults.huge = Some(faults.total);
            }
            RegionSummary {
                pid,
                start: format!("{:#x}", r.start),
                end: format!("{:#x}", r.end),
                perms: r.perms.clone(),
                kind: r.kind,
                path: r.path.clone(),
                offset: r.offset,
                faults,
                // A huge page freed and faulted again counts again: never
                // more pages than the region has.
                pages_touched: a.pages_faulted_in().min((r.end - r.start) / 4096),
            }
        })
        .collect();
    let files = files
        .into_iter()
        .map(|(path, a)| {
            let faults = a.faults();
            let cache = page_cache(&path).unwrap_or_default();
            let added = cache.added;
            let tensors = tensor_view(&path, &file_pages, &cache.chunks);
            FileSummary {
                cold_fraction: if faults.total > 0 { faults.major as f64 / faults.total as f64 } else { 0.0 },
                readahead_pages: added.saturating_sub(faults.major),
                page_cache_added: added,
                file_bytes: cache.file_bytes,
                from_disk_bytes: added * 4096,
                pages_touched: a.pages_faulted_in(),
                faults,
                path,
                tensors,
            }
        })
        .collect();
    Attributed { regions, files }
}

/// Rounds each region's share of faults and majors so that a process's
/// regions add up to its granules' counts exactly (largest remainder): a
/// granule split between regions gives each a fraction.
fn apportion_per_process(acc: &mut BTreeMap<(u32, u64, u64), (Region, Acc)>) {
    let pids: std::collections::BTreeSet<u32> = acc.keys().map(|k| k.0).collect();
    for pid in pids {
        let mine = || (pid, 0, 0)..=(pid, u64::MAX, u64::MAX);
        let mut faults: Vec<f64> = acc.range(mine()).map(|(_, v)| v.1.faults).collect();
        let mut major: Vec<f64> = acc.range(mine()).map(|(_, v)| v.1.major).collect();
        largest_remainder(&mut faults);
        largest_remainder(&mut major);
        for ((_, (_, a)), (f, m)) in acc.range_mut(mine()).zip(faults.into_iter().zip(major)) {
            a.faults = f;
            a.major = m.min(f);
        }
    }
}

/// What the traced processes brought into the page cache for one file.
#[derive(Clone, Debug, Default)]
pub struct PageCache {
    /// Pages in all.
    pub added: u64,
    /// (chunk, pages) per `FILE_CHUNK_SHIFT` chunk of the file.
    pub chunks: Vec<(u64, u64)>,
    /// The file's size now (0: gone).
    pub file_bytes: u64,
}

/// Bytes of `chunks` (see `PageCache`) that fall in `[start, end)` of the
/// file, a chunk's pages spread evenly over it.
fn from_disk_in(chunks: &[(u64, u64)], start: u64, end: u64) -> u64 {
    let size = 4096u64 << FILE_CHUNK_SHIFT;
    let bytes: f64 = chunks
        .iter()
        .map(|&(c, pages)| {
            let (lo, hi) = (c * size, (c + 1) * size);
            let overlap = hi.min(end).saturating_sub(lo.max(start));
            (pages * 4096) as f64 * overlap as f64 / size as f64
        })
        .sum();
    bytes.round() as u64
}

/// Per-tensor faults of a safetensors file, from the file pages that faulted,
/// and how much of each came from disk (`chunks`).
fn tensor_view(path: &str, hits: &[(GranuleCounts, FileHit)], chunks: &[(u64, u64)]) -> Vec<TensorSummary> {
    if std::path::Path::new(path).extension().is_none_or(|e| e != "safetensors") {
        return Vec::new();
    }
    let Some(tensors) = safetensors::tensors(std::path::Path::new(path)) else { return Vec::new() };
    let mut acc = vec![Acc::default(); tensors.len()];
    for (g, hit) in hits.iter().filter(|(_, h)| h.path == path) {
        if let Some(i) = safetensors::find(&tensors, hit.file_offset) {
            acc[i].add_share(g, hit.share, 1);
        }
    }
    tensors
        .iter()
        .zip(acc)
        .map(|(t, a)| {
            let f = a.faults();
            TensorSummary {
                name: t.name.clone(),
                offset: t.start,
                bytes: t.end - t.start,
                faults: f.total,
                major: f.major,
                time_ns: f.time_ns,
                pages_touched: a.pages,
                from_disk_bytes: from_disk_in(chunks, t.start, t.end),
            }
        })
        .collect()
}

/// The kernel's dev_t of a file (major << 20 | minor), as tracepoints report
/// it, its inode and its size.
pub fn kernel_dev_ino(path: &str) -> Option<(u32, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    let dev = m.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Some(((major << 20) | minor, m.ino(), m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Start of granule 1.
    const G: u64 = 1 << REGION_GRANULE_SHIFT;

    fn region(start: u64, end: u64, kind: RegionKind, path: Option<&str>) -> Region {
        Region { start, end, perms: "rw-p".into(), offset: 0, kind, path: path.map(Into::into) }
    }

    #[test]
    fn pages_follow_their_regions_and_counts_split_by_pages() {
        // One granule straddling two regions: 12 touched pages in the first, 4 in the second.
        let maps = vec![
            region(G, G + 0xc000, RegionKind::Anon, None),
            region(G + 0xc000, 3 * G, RegionKind::Heap, Some("[heap]")),
        ];
        let g = GranuleCounts {
            faults: 32,
            major: 0,
            write: 32,
            timed: 16,
            time_ns: 16_000,
            touched: 0xffff,
            hist: [16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        let key = GranuleKey { tgid: 5, _pad: 0, granule: 1 };
        let none = procmaps::MappedRegions::default();
        let a = attribute(&[(key, g)], |_| Some(ProcessRegions { maps: &maps, mapped: &none }), |_| None);
        assert_eq!(a.regions.len(), 2);
        let anon = a.regions.iter().find(|r| r.kind == RegionKind::Anon).unwrap();
        let heap = a.regions.iter().find(|r| r.kind == RegionKind::Heap).unwrap();
        assert_eq!((anon.pages_touched, anon.faults.total), (12, 24));
        assert_eq!((heap.pages_touched, heap.faults.total), (4, 8));
        // 16 timed of 32: time scaled to all faults.
        assert_eq!(anon.faults.time_ns, 24_000);
        assert_eq!(anon.faults.latency_hist_ns.0[0], 12);
    }

    #[test]
    fn unmapped_regions_come_from_mapping_events_and_unknown_is_kept() {
        let mapped = procmaps::MappedRegions::from(vec![region(4 * G, 4 * G + 0x10000, RegionKind::Anon, None)]);
        let g = GranuleCounts { faults: 16, touched: 0xffff, ..Default::default() };
        let keys = [(GranuleKey { tgid: 1, _pad: 0, granule: 4 }, g), (GranuleKey { tgid: 1, _pad: 0, granule: 9 }, g)];
        let a = attribute(&keys, |_| Some(ProcessRegions { maps: &[], mapped: &mapped }), |_| None);
        assert_eq!(a.regions.len(), 2);
        assert_eq!(a.regions[0].kind, RegionKind::Anon);
        assert_eq!(a.regions[0].faults.total, 16);
        assert_eq!(a.regions[1].kind, RegionKind::Other, "faults outside every known region are kept, not dropped");
    }

    #[test]
    fn tensors_get_the_chunks_that_came_from_disk() {
        let mib = 1u64 << 20;
        // Chunk 0 fully read (256 pages), chunk 1 half (128 pages).
        let chunks = [(0, 256), (1, 128)];
        assert_eq!(from_disk_in(&chunks, 0, mib), mib);
        assert_eq!(from_disk_in(&chunks, mib, 2 * mib), mib / 2);
        assert_eq!(from_disk_in(&chunks, mib / 2, mib + mib / 2), mib / 2 + mib / 4);
        assert_eq!(from_disk_in(&chunks, 2 * mib, 3 * mib), 0);
    }

    #[test]
    fn shares_are_rounded_so_a_process_adds_up() {
        let mut v = [1.5, 1.5, 1.0 / 3.0, 2.0 / 3.0];
        largest_remainder(&mut v);
        let ints: Vec<u64> = v.iter().map(|x| x.round() as u64).collect();
        assert!(v.iter().zip(&ints).all(|(x, i)| (x - *i as f64).abs() < 1e-12), "{v:?}");
        assert_eq!(ints.iter().sum::<u64>(), 4);
        let mut thirds = [10.0 / 3.0; 3];
        largest_remainder(&mut thirds);
        assert_eq!(thirds.map(|x| x.round() as u64), [4, 3, 3]);
    }

    #[test]
    fn files_sum_across_processes_with_readahead() {
        let mut r = region(G, G + 0x10000, RegionKind::File, Some("/ckpt/x.bin"));
        r.offset = 0x1000;
        let maps = vec![r];
        let g = GranuleCounts { faults: 16, major: 4, touched: 0xffff, ..Default::default() };
        let keys = [(GranuleKey { tgid: 1, _pad: 0, granule: 1 }, g), (GranuleKey { tgid: 2, _pad: 0, granule: 1 }, g)];
        let none = procmaps::MappedRegions::default();
        let a = attribute(
            &keys,
            |_| Some(ProcessRegions { maps: &maps, mapped: &none }),
            |p| (p == "/ckpt/x.bin").then(|| PageCache { added: 40, ..PageCache::default() }),
        );
        assert_eq!(a.files.len(), 1);
        let f = &a.files[0];
        assert_eq!((f.faults.total, f.faults.major, f.pages_touched), (32, 8, 32));
        assert_eq!((f.page_cache_added, f.readahead_pages), (40, 32));
        assert!((f.cold_fraction - 0.25).abs() < 1e-9);
    }
}
