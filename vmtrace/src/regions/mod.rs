//! Which memory region took each fault: the kernel counts faults per 256 KiB
//! granule of each process and address-space generation (with a bitmap of
//! the pages touched); each touched page is placed in the mapping that held
//! it at that generation (`place.rs`, replaying `history.rs`), and counts
//! follow the pages. Then per file (by device and inode) across processes,
//! and per tensor of a safetensors or torch zip checkpoint.
pub(crate) mod history;
mod place;
pub(crate) mod python;
pub(crate) mod replay;
pub(crate) mod safetensors;
pub(crate) mod shm;
pub(crate) mod torchzip;

use std::{collections::BTreeMap, sync::Arc};

use vmtrace_common::{GranuleCounts, GranuleKey, FILE_CHUNK_SHIFT, GRANULE_HIST};

use crate::model::{FileSummary, RegionSummary, TensorSummary};
use crate::{
    model::RegionKind,
    model::{largest_remainder, scale, Faults, Hist},
    procmaps::Region,
};

/// Counts of a share of a granule, accumulated per region.
#[derive(Clone, Debug, Default)]
pub(crate) struct Acc {
    faults: f64,
    major: f64,
    write: f64,
    exec: f64,
    cow: f64,
    cow_copied: f64,
    cow_zero: f64,
    huge: f64,
    time_ns: f64,
    timed: f64,
    major_time_ns: f64,
    hist: [f64; GRANULE_HIST],
    pages: u64,
    /// Of `cow`, the faults at a generation before the exec of a process
    /// forked while traced: it shared its parent's pages then (`cow_from`).
    cow_forked: f64,
}

impl Acc {
    pub(crate) fn add_share(&mut self, g: &GranuleCounts, share: f64, pages: u64) {
        self.faults += g.faults as f64 * share;
        self.major += g.major as f64 * share;
        self.write += g.write as f64 * share;
        self.exec += f64::from(g.exec) * share;
        self.cow += g.cow as f64 * share;
        self.cow_copied += f64::from(g.cow_copied) * share;
        self.cow_zero += f64::from(g.cow_zero) * share;
        self.huge += f64::from(g.huge) * share;
        self.time_ns += g.time_ns as f64 * share;
        self.timed += g.timed as f64 * share;
        self.major_time_ns += g.major_time_ns as f64 * share;
        for (a, h) in self.hist.iter_mut().zip(g.hist.iter()) {
            *a += f64::from(*h) * share;
        }
        self.pages += pages;
    }

    pub(crate) fn merge(&mut self, o: &Acc) {
        self.faults += o.faults;
        self.major += o.major;
        self.write += o.write;
        self.exec += o.exec;
        self.cow += o.cow;
        self.cow_copied += o.cow_copied;
        self.cow_zero += o.cow_zero;
        self.huge += o.huge;
        self.time_ns += o.time_ns;
        self.timed += o.timed;
        self.major_time_ns += o.major_time_ns;
        for (x, y) in self.hist.iter_mut().zip(o.hist.iter()) {
            *x += y;
        }
        self.pages += o.pages;
        self.cow_forked += o.cow_forked;
    }

    /// Pages faulted in: those that took a fault, a huge page's 511 others too.
    fn pages_faulted_in(&self) -> u64 {
        self.pages + (self.huge.round().max(0.0) as u64) * 511
    }

    /// `weighted`: the kernel weighted each timed fault by the faults it
    /// stands for (stratified timing, `--fast-sample N`), so the time is
    /// summed as is and every view of it (region, file, tensor) adds up;
    /// else minor time measured on 1 in N faults is scaled to all of them.
    fn faults(&self, weighted: bool) -> Faults {
        let total = self.faults.round() as u64;
        let major = (self.major.round() as u64).min(total);
        let round = |v: f64| v.round().max(0.0) as u64;
        let (major_time, timed) = (round(self.major_time_ns), round(self.timed));
        let minor_time = round(self.time_ns).saturating_sub(major_time);
        // Sampled minor latency: its time alone is scaled to all minor faults
        // (majors are all timed), as for the process (`scale`). Scaling each
        // view by its own sample would not add up: a tensor with one exact
        // slow fault and few weighted samples would multiply the slow one.
        let minor_time =
            if weighted { minor_time } else { scale(minor_time, timed.saturating_sub(major), total - major) };
        let time_ns = minor_time + major_time;
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

pub(crate) use place::{regions_at, Placement, ProcessInput};

/// Where each file page that faulted went, for the file and tensor views.
struct FileHit {
    path: Arc<str>,
    file_offset: u64,
    share: f64,
}

pub(crate) struct Attributed {
    pub regions: Vec<RegionSummary>,
    pub files: Vec<FileSummary>,
    /// How sure the placement of the faults in regions is.
    pub placement: Placement,
}

/// Regions placed so far, and the files they sum into: a recording places
/// each exited process's faults as it retires (`collect::retire`) and the
/// live ones at the end, into one of these; [`Partial::finish`] then sums
/// the files and tensors.
#[derive(Default)]
pub(crate) struct Partial {
    /// Timed faults carry their weights (stratified timing): see `Acc::faults`.
    weighted: bool,
    /// The programs told COW faults that copied from those that reused their
    /// page (`GranuleCounts::cow_copied`): see `cow_from`.
    copies_seen: bool,
    regions: Vec<RegionSummary>,
    files: BTreeMap<Arc<str>, Acc>,
    /// File pages hit, kept for the files that may be checkpoints only.
    file_pages: Vec<(GranuleCounts, FileHit)>,
    /// Whether a path is a checkpoint (read once per path).
    checkpoint: crate::hash::HashMap<Arc<str>, bool>,
    placement: Placement,
    /// Faults and fault time of every row added, and the 100 largest of
    /// each (what [`Partial::fold_small`] needs to know a row will be folded).
    sum: (u64, u64),
    top: (TopN, TopN),
    /// The regions of the processes the end's fold is sure to fold, summed
    /// per kind as it would (`model::fold`): pid 0 rows.
    other: BTreeMap<u8, RegionSummary>,
}

/// The `n` largest values seen.
#[derive(Default)]
pub(crate) struct TopN(std::collections::BinaryHeap<std::cmp::Reverse<u64>>);

impl TopN {
    pub(crate) fn push(&mut self, v: u64, n: usize) {
        self.0.push(std::cmp::Reverse(v));
        if self.0.len() > n {
            self.0.pop();
        }
    }

    /// Whether `n` values seen are larger than `v`.
    pub(crate) fn n_above(&self, v: u64, n: usize) -> bool {
        self.0.len() >= n && self.0.peek().is_some_and(|m| m.0 > v)
    }
}

impl Partial {
    /// `weighted`: stratified fault time (`AggregateSource::fast_period` > 1),
    /// whose timed faults carry their weights.
    pub(crate) fn new(weighted: bool) -> Self {
        Self { weighted, ..Self::default() }
    }

    /// `seen`: the granules' `cow_copied` counts the copies
    /// (`AggregateSource::cow_copies_seen`).
    pub(crate) fn with_cow_copies(self, seen: bool) -> Self {
        Self { copies_seen: seen, ..self }
    }

    /// Places the faults of the processes of `granules` and adds their rows.
    pub(crate) fn add<'a>(
        &mut self,
        granules: &[(GranuleKey, GranuleCounts)],
        mut input_of: impl FnMut(u32) -> Option<ProcessInput<'a>>,
    ) {
        let mut by_pid: BTreeMap<u32, Vec<(GranuleKey, GranuleCounts)>> = BTreeMap::new();
        for (k, g) in granules {
            by_pid.entry(k.tgid).or_default().push((*k, *g));
        }
        let empty = history::History::default();
        let mut shares_after_fork = std::collections::BTreeSet::new();
        let mut placed = Vec::new();
        for (pid, gs) in &by_pid {
            let input = input_of(*pid).unwrap_or(ProcessInput {
                history: &empty,
                start: None,
                final_maps: &[],
                shares_after_fork: false,
            });
            if input.shares_after_fork {
                shares_after_fork.insert(*pid);
            }
            let (rows, how) = place::place(*pid, gs, &input);
            self.placement.add(&how);
            placed.push((*pid, rows));
        }
        // One file is one row whatever each mapping knew of its name: a mapping
        // named only by its inode takes the path another mapping of the same
        // (dev, inode) had.
        let names = same_files(placed.iter().flat_map(|(_, rows)| rows.iter()).filter_map(|r| {
            match (r.region.kind, &r.region.path) {
                (RegionKind::File, Some(p)) => Some(&**p),
                _ => None,
            }
        }));
        let mut acc: Vec<(u32, Region, Acc)> = Vec::new();
        for (pid, rows) in placed {
            for mut row in rows {
                if let (RegionKind::File, Some(path)) = (row.region.kind, &mut row.region.path) {
                    if let Some(name) = names.get(&**path) {
                        *path = Arc::from(name.as_str());
                    }
                    let checkpoint = *self
                        .checkpoint
                        .entry(path.clone())
                        .or_insert_with(|| path.starts_with('/') && checkpoint_tensors(path).is_some());
                    if checkpoint {
                        for (g, off, share) in row.file_hits {
                            self.file_pages.push((g, FileHit { path: path.clone(), file_offset: off, share }));
                        }
                    }
                }
                acc.push((pid, row.region, row.acc));
            }
        }
        acc.sort_by_key(|a| (a.0, a.1.start, a.1.end));
        apportion_per_process(&mut acc);
        for (pid, r, a) in acc {
            if let (RegionKind::File, Some(p)) = (r.kind, &r.path) {
                self.files.entry(p.clone()).or_default().merge(&a);
            }
            let mut faults = a.faults(self.weighted);
            if r.kind == RegionKind::Hugetlb {
                // A hugetlb mapping has no small pages: every fault maps a huge one.
                faults.huge = Some(faults.total);
            }
            self.regions.push(RegionSummary {
                pid,
                start: format!("{:#x}", r.start),
                end: format!("{:#x}", r.end),
                perms: r.perms.to_string(),
                kind: r.kind,
                path: r.path.as_deref().map(String::from),
                offset: r.offset,
                faults,
                // A huge page freed and faulted again counts again: never
                // more pages than the region has.
                pages_touched: a.pages_faulted_in().min((r.end - r.start) / 4096),
                cow_from: cow_from(&r, &a, shares_after_fork.contains(&pid), self.copies_seen),
                folded: 0,
            });
        }
    }

    /// Folds the rows added from index `from` that the end's fold below
    /// `pct` percent is sure to fold ([`crate::model::fold`]): each holds less
    /// than `pct` of the faults and of the time of the rows added so far
    /// (the end's totals can only be larger), and 100 rows added have more
    /// faults and 100 more time (those are never folded here, so they are
    /// rows at the end: it is not among the heaviest). Segments the end
    /// groups per program (`shm`) are left to it.
    pub(crate) fn fold_small(&mut self, from: usize, pct: f64, folded_pid: impl Fn(u32) -> bool) {
        let keep = crate::model::fold::KEEP_TOP_REGIONS;
        for r in &self.regions[from..] {
            self.sum.0 += r.faults.total;
            self.sum.1 += r.faults.time_ns;
            self.top.0.push(r.faults.total, keep);
            self.top.1.push(r.faults.time_ns, keep);
        }
        if pct <= 0.0 {
            return;
        }
        let new = self.regions.split_off(from);
        self.fold_rows_of(new, pct, folded_pid);
    }

    /// Folds again every row held, by the faults and time of all the rows
    /// added so far: a row or a process that was not sure to be folded when
    /// it was placed (early in a recording every row is a large share) is
    /// once the recording has grown. What the rows hold is then bounded by
    /// the rows that are heavy, not by the processes seen.
    pub(crate) fn refold(&mut self, pct: f64, folded_pid: impl Fn(u32) -> bool) {
        if pct <= 0.0 {
            return;
        }
        let all = std::mem::take(&mut self.regions);
        self.fold_rows_of(all, pct, folded_pid);
    }

    /// Folds `rows` into the rows held: those of `folded_pid` processes into
    /// the pid 0 rows per kind, the light ones per (process, kind, named kind).
    fn fold_rows_of(&mut self, rows: Vec<RegionSummary>, pct: f64, folded_pid: impl Fn(u32) -> bool) {
        let keep = crate::model::fold::KEEP_TOP_REGIONS;
        let (sum, top) = (self.sum, &self.top);
        let light = |x: u64, of: u64| (x as f64) * 100.0 < of as f64 * pct || of == 0;
        let foldable = |r: &RegionSummary| {
            let segment = r
                .path
                .as_deref()
                .is_some_and(|p| p.starts_with("/dev/shm/") || p.starts_with("/memfd:") || p.starts_with("[file "));
            !segment
                && light(r.faults.total, sum.0)
                && light(r.faults.time_ns, sum.1)
                && top.0.n_above(r.faults.total, keep)
                && top.1.n_above(r.faults.time_ns, keep)
        };
        let (gone, kept): (Vec<RegionSummary>, Vec<RegionSummary>) = rows.into_iter().partition(|r| folded_pid(r.pid));
        self.regions.extend(crate::model::fold::fold_rows(kept, foldable));
        let mut by_kind: BTreeMap<u8, Vec<RegionSummary>> = BTreeMap::new();
        for r in gone {
            by_kind.entry(r.kind as u8).or_default().push(r);
        }
        for (kind, mut rows) in by_kind {
            rows.extend(self.other.remove(&kind));
            self.other.insert(kind, crate::model::fold::other_region(crate::model::OTHER_PID, None, &rows));
        }
        // What a batch added and folded leaves spare (a row is ~600 bytes:
        // 4,096 spare rows were 2.5 MB of the heap under churn).
        if self.regions.capacity() > 2 * self.regions.len() + 256 {
            self.regions.shrink_to(self.regions.len() * 3 / 2);
        }
    }

    /// The rows placed so far.
    pub(crate) fn regions(&self) -> &[RegionSummary] {
        &self.regions
    }

    /// The files and tensors; `page_cache` gives pages added per file path
    /// (readahead).
    pub(crate) fn finish(self, page_cache: impl Fn(&str) -> Option<PageCache>) -> Attributed {
        let Partial { mut regions, files, file_pages, placement, other, weighted, .. } = self;
        regions.extend(other.into_values());
        let mut files: Vec<FileSummary> = files
            .into_iter()
            .map(|(path, a)| {
                let faults = a.faults(weighted);
                let cache = page_cache(&path).unwrap_or_default();
                let added = cache.added;
                let tensors = tensor_view(&path, &file_pages, &cache, weighted);
                FileSummary {
                    cold_fraction: if faults.total > 0 { faults.major as f64 / faults.total as f64 } else { 0.0 },
                    readahead_pages: added.saturating_sub(faults.major),
                    page_cache_added: added,
                    page_cache_written: cache.written,
                    file_bytes: cache.file_bytes,
                    from_disk_bytes: added * 4096,
                    pages_touched: a.pages_faulted_in(),
                    faults,
                    path: path.to_string(),
                    tensors,
                }
            })
            .collect();
        // Unlinked shared-memory segments (a DataLoader's per-batch ones): a row
        // per program, not per segment.
        shm::group(&mut regions, &mut files, shm::ShmDevice::here());
        Attributed { regions, files, placement }
    }
}

/// The region table's order: costliest in fault time first, then in
/// faults, then by process and address (whatever order the rows were
/// placed in: the exited processes' as they retired, the live ones' at the
/// end).
pub(crate) fn table_order(x: &RegionSummary, y: &RegionSummary) -> std::cmp::Ordering {
    let start = |r: &RegionSummary| u64::from_str_radix(r.start.trim_start_matches("0x"), 16).unwrap_or(0);
    (y.faults.time_ns.cmp(&x.faults.time_ns))
        .then(y.faults.total.cmp(&x.faults.total))
        .then(x.pid.cmp(&y.pid))
        .then(start(x).cmp(&start(y)))
}

/// Places every process's faults in its regions (`place.rs`), then sums
/// files and tensors. `page_cache` gives pages added per file path (readahead).
#[cfg(test)]
pub fn attribute<'a>(
    granules: &[(GranuleKey, GranuleCounts)],
    input_of: impl Fn(u32) -> Option<ProcessInput<'a>>,
    page_cache: impl Fn(&str) -> Option<PageCache>,
) -> Attributed {
    let mut p = Partial::default();
    p.add(granules, input_of);
    p.finish(page_cache)
}

/// What a region's COW faults copied. Each fault says read or write and
/// whether the page was present; where `copies_seen`, the programs also
/// counted the COW faults in which the kernel allocated the copy
/// (`cow_copied`), and the others reused their page; of the copies, those
/// allocated zeroed (`cow_zero`, `__GFP_ZERO`) copied the zero page, which a
/// read fault on anonymous memory maps. The rest copied a page shared since
/// a fork when the process forked or was forked (and did not exec since),
/// else some other shared page (`other`: KSM, pinned, swap cache); a row
/// whose COW faults came mostly before the exec of a process forked while
/// traced (`Acc::cow_forked`: a shell's child writing its stack and libc
/// data between fork and exec) counts as one that shares since a fork. In a
/// private file mapping a copy copied a file page. Without `copies_seen`, as
/// many copies as there were read faults are taken for zero-page copies
/// (a granule shared with a neighbour can put the reads in one region and
/// the copies in the other), and every COW
/// fault of an anonymous region that is not a zero-page copy is taken for a
/// fork copy when the process shares since a fork (a write after the child
/// exited is then miscounted), else for a reuse, and every one in a private
/// file mapping for a copy.
fn cow_from(r: &Region, a: &Acc, shares_after_fork: bool, copies_seen: bool) -> Option<crate::model::CowFrom> {
    let round = |v: f64| v.round().max(0.0) as u64;
    let cow = round(a.cow);
    if cow == 0 {
        return None;
    }
    let mut c = crate::model::CowFrom::default();
    match r.kind {
        RegionKind::File if copies_seen => {
            c.file = round(a.cow_copied).min(cow);
            c.reused = cow - c.file;
        }
        RegionKind::File => c.file = cow,
        k if k.is_anon_like() => {
            let shares_after_fork = shares_after_fork || (a.cow_forked > 0.0 && 2.0 * a.cow_forked >= a.cow);
            let reads = round(a.faults - a.write - a.exec);
            let copied = if copies_seen {
                round(a.cow_copied).min(cow)
            } else if shares_after_fork {
                cow
            } else {
                reads.min(cow)
            };
            c.zero_page = if copies_seen { round(a.cow_zero) } else { reads }.min(copied);
            let rest = copied - c.zero_page;
            if shares_after_fork {
                c.fork = rest;
            } else {
                c.other = rest;
            }
            c.reused = cow - copied;
        }
        // Shared memory is never copied: a write fault there is dirty tracking.
        _ => c.reused = cow,
    }
    if r.kind == RegionKind::PythonArena {
        c.python_objects = cow - c.reused;
    }
    Some(c)
}

/// Rounds each region's share of faults and majors so that a process's
/// regions add up to its granules' counts exactly (largest remainder): a
/// granule split between regions gives each a fraction.
fn apportion_per_process(acc: &mut [(u32, Region, Acc)]) {
    for rows in acc.chunk_by_mut(|a, b| a.0 == b.0) {
        let mut faults: Vec<f64> = rows.iter().map(|r| r.2.faults).collect();
        let mut major: Vec<f64> = rows.iter().map(|r| r.2.major).collect();
        largest_remainder(&mut faults);
        largest_remainder(&mut major);
        for (r, (f, m)) in rows.iter_mut().zip(faults.into_iter().zip(major)) {
            r.2.faults = f;
            r.2.major = m.min(f);
        }
    }
}

/// What the traced processes brought into the page cache for one file.
#[derive(Clone, Debug, Default)]
pub(crate) struct PageCache {
    /// Pages added to be read from storage (readahead, faults, reads).
    pub added: u64,
    /// Pages a write syscall added (what the process wrote: not read).
    pub written: u64,
    /// (chunk, pages) per `FILE_CHUNK_SHIFT` chunk of the file.
    pub chunks: Vec<(u64, u64)>,
    /// The file's size now (0: gone).
    pub file_bytes: u64,
}

/// Bytes of `chunks` (see `PageCache`) that fall in `[start, end)` of the
/// file, a chunk's pages spread evenly over its part of the file: the
/// last chunk ends at the file's last page (`file_bytes` rounded up; 0,
/// not known: the whole chunk), so a range all of whose pages came from
/// disk gets its whole size. Spread over the whole 1 MiB, the one page of
/// a 64 MiB + 2,111-byte checkpoint's last chunk gave the tensor ending
/// 1,152 bytes into it 4.5 of them: `head.bias` 4,193,157 of 4,194,304
/// bytes. A page read twice (evicted under memory pressure, then read
/// again) is added twice: the file's `added` counts every read, a range's
/// share at most each page once.
fn from_disk_in(chunks: &[(u64, u64)], file_bytes: u64, start: u64, end: u64) -> u64 {
    let size = 4096u64 << FILE_CHUNK_SHIFT;
    let file_end = file_bytes.div_ceil(4096) * 4096;
    let bytes: f64 = chunks
        .iter()
        .map(|&(c, pages)| {
            let lo = c * size;
            let hi = match (c + 1) * size {
                hi if file_end > lo && file_end < hi => file_end,
                hi => hi,
            };
            let overlap = hi.min(end).saturating_sub(lo.max(start));
            let extent = hi - lo;
            (pages.min(extent / 4096) * 4096) as f64 * overlap as f64 / extent as f64
        })
        .sum();
    bytes.round() as u64
}

/// The placeholder name of a mapped file known only by its kernel (dev,
/// inode): `[file MAJOR:MINOR inode N]`, what `find -inum` needs.
pub(crate) fn placeholder(dev: u32, ino: u64) -> String {
    format!("[file {}:{} inode {ino}]", dev >> 20, dev & 0xf_ffff)
}

/// The (dev, inode) a placeholder name (`placeholder`) stands for.
pub(crate) fn placeholder_id(path: &str) -> Option<(u32, u64)> {
    let rest = path.strip_prefix("[file ")?.strip_suffix(']')?;
    let (dev, ino) = rest.split_once(" inode ")?;
    let (major, minor) = dev.split_once(':')?;
    Some(((major.parse::<u32>().ok()? << 20) | minor.parse::<u32>().ok()?, ino.parse().ok()?))
}

/// For each name of a mapped file that is only its inode, the path of
/// another mapping of the same (dev, inode), if any (`stat` of each path).
fn same_files<'a>(paths: impl Iterator<Item = &'a str>) -> crate::hash::HashMap<String, String> {
    use crate::hash::HashMap;
    use std::collections::BTreeSet;
    let paths: BTreeSet<&str> = paths.collect();
    let unnamed: HashMap<(u32, u64), &str> = paths.iter().filter_map(|p| Some((placeholder_id(p)?, *p))).collect();
    let mut out = HashMap::default();
    if unnamed.is_empty() {
        return out;
    }
    for p in paths.iter().filter(|p| p.starts_with('/')) {
        if let Some((dev, ino, _)) = kernel_dev_ino(p) {
            if let Some(u) = unnamed.get(&(dev, ino)) {
                out.entry((*u).to_string()).or_insert_with(|| (*p).to_string());
            }
        }
    }
    out
}

/// The tensors of a checkpoint: a `*.safetensors` file, or a torch zip
/// checkpoint (any name: `.pt`, `.pth`, `.bin`, ... starting with a zip
/// header).
fn checkpoint_tensors(path: &str) -> Option<Vec<safetensors::Tensor>> {
    let p = std::path::Path::new(path);
    if p.extension().is_some_and(|e| e == "safetensors") {
        return safetensors::tensors(p);
    }
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open(p).ok()?, &mut magic).ok()?;
    if magic != *b"PK\x03\x04" {
        return None;
    }
    torchzip::tensors(p)
}

/// Per-tensor faults of a checkpoint, from the file pages that faulted, and
/// how much of each came from disk (`cache`'s chunks).
fn tensor_view(path: &str, hits: &[(GranuleCounts, FileHit)], cache: &PageCache, weighted: bool) -> Vec<TensorSummary> {
    if !path.starts_with('/') || !hits.iter().any(|(_, h)| &*h.path == path) {
        return Vec::new();
    }
    let Some(tensors) = checkpoint_tensors(path) else { return Vec::new() };
    let mut acc = vec![Acc::default(); tensors.len()];
    for (g, hit) in hits.iter().filter(|(_, h)| &*h.path == path) {
        if let Some(i) = safetensors::find(&tensors, hit.file_offset) {
            acc[i].add_share(g, hit.share, 1);
        }
    }
    tensors
        .iter()
        .zip(acc)
        .map(|(t, a)| {
            let f = a.faults(weighted);
            TensorSummary {
                name: t.name.clone(),
                offset: t.start,
                bytes: t.end - t.start,
                faults: f.total,
                major: f.major,
                time_ns: f.time_ns,
                pages_touched: a.pages,
                from_disk_bytes: from_disk_in(&cache.chunks, cache.file_bytes, t.start, t.end),
            }
        })
        .collect()
}

/// (dev, inode, size) of a mapped file's name: its `stat`, or what a
/// placeholder name `[file MAJOR:MINOR inode N]` says (size 0: not known).
pub(crate) fn file_identity(path: &str) -> Option<(u32, u64, u64)> {
    if let Some((dev, ino)) = placeholder_id(path) {
        return Some((dev, ino, 0));
    }
    kernel_dev_ino(path)
}

/// The kernel's dev_t of a file (major << 20 | minor), as tracepoints report
/// it, its inode and its size.
pub(crate) fn kernel_dev_ino(path: &str) -> Option<(u32, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    let dev = m.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Some(((major << 20) | minor, m.ino(), m.len()))
}

/// True when `path` (followed, as `stat` does) is the file the kernel
/// reported as (`dev`, `ino`): a name taken from /proc or a maps read is
/// used for a file only while it is that file here.
pub(crate) fn is_file(path: &str, dev: u32, ino: u64) -> bool {
    kernel_dev_ino(path).is_some_and(|(d, i, _)| (d, i) == (dev, ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Start of granule 1.
    const G: u64 = 1 << vmtrace_common::REGION_GRANULE_SHIFT;

    /// A process known only from a maps read.
    fn input(maps: &[Region]) -> ProcessInput<'_> {
        static EMPTY: std::sync::LazyLock<history::History> = std::sync::LazyLock::new(history::History::default);
        ProcessInput { history: &EMPTY, start: None, final_maps: maps, shares_after_fork: false }
    }

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
        let key = GranuleKey { tgid: 5, gen: 0, granule: 1 };
        let a = attribute(&[(key, g)], |_| Some(input(&maps)), |_| None);
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
        use history::Change;
        let mut h = history::History::default();
        h.push(2, 1, Change::Map { region: region(4 * G, 4 * G + 0x10000, RegionKind::Anon, None), flags: 0 });
        h.push(4, 3, Change::Unmap { start: 4 * G, end: 4 * G + 0x10000 });
        let g = GranuleCounts { faults: 16, touched: 0xffff, ..Default::default() };
        let keys = [(GranuleKey { tgid: 1, gen: 2, granule: 4 }, g), (GranuleKey { tgid: 1, gen: 2, granule: 9 }, g)];
        let a = attribute(
            &keys,
            |_| Some(ProcessInput { history: &h, start: None, final_maps: &[], shares_after_fork: false }),
            |_| None,
        );
        assert_eq!(a.regions.len(), 2);
        assert_eq!(a.regions[0].kind, RegionKind::Anon);
        assert_eq!(a.regions[0].faults.total, 16);
        assert_eq!(a.regions[1].kind, RegionKind::Other, "faults outside every known region are kept, not dropped");
        assert_eq!((a.placement.exact.round() as u64, a.placement.unplaced.round() as u64), (16, 16));
    }

    /// `/bin/ls` run by a shell (or by `vmtrace record`): the forked child
    /// writes its stack and libc data before it execs, copies of its
    /// parent's pages (`cow.folded` `ls;[unmapped code];__GI__Fork`). They
    /// are fork copies, not `other`, though the process exec'd (it shares
    /// nothing since a fork at its end); its copies after the exec are not.
    #[test]
    fn a_forked_childs_copies_before_its_exec_are_fork_copies() {
        use history::{Change, Fork};
        let parents = [region(2 * G, 4 * G, RegionKind::Anon, None)];
        let mut hist = history::History::default();
        hist.forked_from = Some(Fork { parent: 1, gen: 9, at_ns: 0 });
        hist.push(3, 3, Change::Exec);
        hist.push(4, 3, Change::Map { region: region(8 * G, 9 * G, RegionKind::Anon, None), flags: 0x22 });
        let cow = |pages: u64| GranuleCounts {
            faults: pages,
            write: pages,
            cow: pages,
            cow_copied: pages as u32,
            touched: (1 << pages) - 1,
            ..Default::default()
        };
        let keys = [
            (GranuleKey { tgid: 6, gen: 2, granule: 2 }, cow(5)),
            (GranuleKey { tgid: 6, gen: 4, granule: 8 }, cow(3)),
        ];
        let start: Option<std::sync::Arc<[Region]>> = Some(parents.to_vec().into());
        let mut p = Partial::new(false).with_cow_copies(true);
        p.add(&keys, |_| {
            Some(ProcessInput { history: &hist, start: start.clone(), final_maps: &[], shares_after_fork: false })
        });
        let a = p.finish(|_| None);
        let cow_at = |start: u64| {
            let r = a
                .regions
                .iter()
                .find(|r| r.start == format!("{start:#x}"))
                .unwrap_or_else(|| panic!("{:?}", a.regions));
            let c = r.cow_from.unwrap();
            (c.fork, c.other)
        };
        assert_eq!(cow_at(2 * G), (5, 0), "before the exec: copies of the parent's pages");
        assert_eq!(cow_at(8 * G), (0, 3), "after it: nothing shared since a fork");
    }

    /// The regions of a long `-a` recording: processes retire one by one,
    /// their small rows folded then ([`Partial::fold_small`]), and the
    /// summary folded at the end reads as if every row had been kept.
    #[test]
    fn rows_folded_as_processes_retire_give_the_end_fold_its_result() {
        use crate::model::{fold, RegionSummary};
        let whole = crate::model::fold::tests::summary();
        let mut expected = whole.clone();
        expected.regions.as_mut().unwrap().sort_by(table_order);
        fold(&mut expected, 0.1);
        let listed: std::collections::BTreeSet<u32> = expected.processes.iter().map(|p| p.pid).collect();
        let key = |r: &RegionSummary| {
            (
                r.pid,
                r.kind as u8,
                r.path.clone(),
                r.start.clone(),
                r.faults.total,
                r.faults.time_ns,
                r.folded,
                r.perms.clone(),
            )
        };
        let rows = |s: &crate::model::Summary| {
            let mut v: Vec<_> = s.regions.as_ref().unwrap().iter().map(key).collect();
            v.sort();
            v
        };
        // Folding again after every batch (`refold`: rows and processes
        // light by the totals grown since they were placed) changes nothing
        // the end's fold gives.
        for (fold_processes, refold) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut by_pid: BTreeMap<u32, Vec<RegionSummary>> = BTreeMap::new();
            for r in whole.regions.clone().unwrap() {
                by_pid.entry(r.pid).or_default().push(r);
            }
            let mut p = Partial::default();
            // The target lives to the end; the others retire in pid order.
            let live = by_pid.remove(&100).unwrap();
            for (_, batch) in by_pid {
                let from = p.regions.len();
                p.regions.extend(batch);
                p.fold_small(from, 0.1, |pid| fold_processes && !listed.contains(&pid));
                if refold {
                    p.refold(0.1, |pid| fold_processes && !listed.contains(&pid));
                }
            }
            if fold_processes {
                // The listed processes' rows, and one per kind for the rest.
                assert!(p.regions.len() + p.other.len() < 100, "{} rows kept", p.regions.len());
            }
            p.regions.extend(live);
            let mut got = whole.clone();
            let mut regions = p.finish(|_| None).regions;
            regions.sort_by(table_order);
            got.regions = Some(regions);
            fold(&mut got, 0.1);
            assert_eq!(got.processes, expected.processes);
            assert_eq!(
                rows(&got),
                rows(&expected),
                "folding processes as they retire: {fold_processes}, refold {refold}"
            );
            assert_eq!(got.folding, expected.folding);
        }
    }

    #[test]
    fn tensors_get_the_chunks_that_came_from_disk() {
        let mib = 1u64 << 20;
        // Chunk 0 fully read (256 pages), chunk 1 half (128 pages).
        let chunks = [(0, 256), (1, 128)];
        assert_eq!(from_disk_in(&chunks, 0, 0, mib), mib);
        assert_eq!(from_disk_in(&chunks, 0, mib, 2 * mib), mib / 2);
        assert_eq!(from_disk_in(&chunks, 0, mib / 2, mib + mib / 2), mib / 2 + mib / 4);
        assert_eq!(from_disk_in(&chunks, 0, 2 * mib, 3 * mib), 0);
        // Pages read twice (evicted and read again): a range gets each once.
        assert_eq!(from_disk_in(&[(0, 264)], 0, 4096 * 3, 4096 * 3 + mib / 2), mib / 2);
    }

    /// A file read whole whose last chunk is a page (t1's ckpt.pt: 2,111
    /// bytes over 64 MiB, 16,385 pages read): each tensor gets its size,
    /// the one ending 1,152 bytes into the last chunk too (4,193,157 of
    /// 4,194,304 when the page was spread over the whole chunk); and
    /// safetensors' 264-byte header shifting a 16 MiB tensor into the
    /// file's last, partial page.
    #[test]
    fn a_tensor_read_whole_gets_its_size_up_to_the_files_last_page() {
        let mib = 1u64 << 20;
        let file = 64 * mib + 2111;
        let mut chunks: Vec<(u64, u64)> = (0..64).map(|c| (c, 256)).collect();
        chunks.push((64, 1));
        for (start, bytes) in
            [(960, 16_777_216), (16_778_240, 33_554_432), (50_332_736, 12_582_912), (62_915_712, 4_194_304)]
        {
            assert_eq!(from_disk_in(&chunks, file, start, start + bytes), bytes, "tensor at {start}");
        }
        let file = 33_554_696;
        let chunks: Vec<(u64, u64)> = (0..32).map(|c| (c, 256)).chain([(32, 1)]).collect();
        assert_eq!(from_disk_in(&chunks, file, 16_777_480, file), 16_777_216);
        // Half the last page's chunk read: half of what falls in it.
        let chunks = [(0, 256), (1, 2)];
        assert_eq!(from_disk_in(&chunks, mib + 4 * 4096, mib, mib + 4 * 4096), 2 * 4096);
        // A file truncated since (its size before the chunk): the whole chunk.
        assert_eq!(from_disk_in(&[(1, 128)], mib / 2, mib, 2 * mib), mib / 2);
    }

    /// A path names a file only while its `stat` is that (device, inode): a
    /// file replaced under its name, or a path that is gone, does not.
    #[test]
    fn a_path_is_a_file_only_while_its_stat_is_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"one").unwrap();
        let p = path.to_str().unwrap();
        let (dev, ino, _) = kernel_dev_ino(p).unwrap();
        assert!(is_file(p, dev, ino));
        assert!(!is_file(p, dev, ino + 1), "another inode");
        assert!(!is_file(p, dev + 1, ino), "another device");
        let other = dir.path().join("new.so");
        std::fs::write(&other, b"two").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!is_file(p, dev, ino), "replaced under its name");
        std::fs::remove_file(&path).unwrap();
        assert!(!is_file(p, dev, ino), "gone");
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

    /// Stratified timing (the default where the memcg end serves): a
    /// checkpoint's tensors add up to their file's time. One slow fault
    /// (1 ms, timed exactly) and one sample standing for 20 fast faults in
    /// the first tensor's granule; samples standing for the other 106 fast
    /// faults (the first granule's among them: a CPU's weight runs across
    /// granules) in the second. Scaling each view by its own sample made the
    /// first tensor 3x its measured time, the tensors more than their file.
    #[test]
    fn a_files_tensors_add_up_to_its_time_when_samples_carry_weights() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let json = format!(
            r#"{{"a":{{"dtype":"F32","shape":[64512],"data_offsets":[0,{a}]}},"b":{{"dtype":"F32","shape":[65536],"data_offsets":[{a},{b}]}}}}"#,
            a = 63 * 4096,
            b = 127 * 4096
        );
        // The data starts at the second page: the header is the first.
        let mut header = json.into_bytes();
        header.resize(4096 - 8, b' ');
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend(header);
        bytes.resize(128 * 4096, 0);
        std::fs::write(&path, bytes).unwrap();
        let name = path.to_str().unwrap();
        let maps = vec![region(G, 3 * G, RegionKind::File, Some(name))];
        let first = GranuleCounts {
            faults: 63,
            touched: !1,
            timed: 21,
            time_ns: 1_000_000 + 20 * 1_000,
            hist: [20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            ..Default::default()
        };
        let second = GranuleCounts {
            faults: 64,
            touched: !0,
            timed: 106,
            time_ns: 106 * 1_000,
            hist: [106, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..Default::default()
        };
        let keys =
            [(GranuleKey { tgid: 1, gen: 0, granule: 1 }, first), (GranuleKey { tgid: 1, gen: 0, granule: 2 }, second)];
        for weighted in [true, false] {
            let mut p = Partial::new(weighted);
            p.add(&keys, |_| Some(input(&maps)));
            let a = p.finish(|_| None);
            let f = a.files.iter().find(|f| f.path == name).expect("the file's row");
            let tensors: u64 = f.tensors.iter().map(|t| t.time_ns).sum();
            let regions: u64 = a.regions.iter().map(|r| r.faults.time_ns).sum();
            assert_eq!(f.tensors.len(), 2, "{:?}", f.tensors);
            if weighted {
                assert_eq!(f.faults.time_ns, 1_126_000, "the file's time as measured, weights carried");
                assert_eq!(tensors, f.faults.time_ns, "the tensors add up to their file: {:?}", f.tensors);
                assert_eq!(regions, f.faults.time_ns, "the region adds up to its file");
                assert_eq!(f.tensors[0].time_ns, 1_020_000, "the slow fault counted once: {:?}", f.tensors[0]);
            } else {
                // What the scaling per view gave (why it is not used for weighted time).
                assert!(tensors > f.faults.time_ns * 2, "{tensors} vs {}", f.faults.time_ns);
            }
        }
    }

    #[test]
    fn files_sum_across_processes_with_readahead() {
        let mut r = region(G, G + 0x10000, RegionKind::File, Some("/ckpt/x.bin"));
        r.offset = 0x1000;
        let maps = vec![r];
        let g = GranuleCounts { faults: 16, major: 4, touched: 0xffff, ..Default::default() };
        let keys = [(GranuleKey { tgid: 1, gen: 0, granule: 1 }, g), (GranuleKey { tgid: 2, gen: 0, granule: 1 }, g)];
        let a = attribute(
            &keys,
            |_| Some(input(&maps)),
            |p| (p == "/ckpt/x.bin").then(|| PageCache { added: 40, ..PageCache::default() }),
        );
        assert_eq!(a.files.len(), 1);
        let f = &a.files[0];
        assert_eq!((f.faults.total, f.faults.major, f.pages_touched), (32, 8, 32));
        assert_eq!((f.page_cache_added, f.readahead_pages), (40, 32));
        assert!((f.cold_fraction - 0.25).abs() < 1e-9);
    }
}
