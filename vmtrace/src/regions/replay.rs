//! The replay of one process's history (`history.rs`): the address space
//! as it was at each generation, the rows of the region table, and where
//! each fault was placed. Changes are applied in generation order
//! (`history::ordered`); a fault is placed in the piece that covered its page
//! at its generation, or, when a change raced it or was seen late, in the
//! nearest mapping in time (the birth index).
use crate::hash::HashMap;
use std::collections::BTreeMap;

use super::history::{page_up, Change};
use crate::{
    model::RegionKind,
    procmaps::{Perms, Region},
};

/// What a fault's page was placed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// The mapping that covered it at its generation.
    Exact(usize),
    /// A change raced the fault, or was seen late: the nearest mapping in time.
    Approximate(usize),
}

/// A row of the region table while replaying.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub region: Region,
    lineage: u32,
    /// mmap flags of the mapping (MAP_STACK, MAP_NORESERVE).
    pub flags: u64,
    /// Its mapping was created with no access (a reservation, e.g. a malloc arena).
    pub reserved: bool,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    end: u64,
    /// File offset at the piece's start.
    offset: u64,
    row: usize,
}

/// A piece as it came to be, for faults placed after the fact.
#[derive(Clone, Copy, Debug)]
struct Birth {
    gen: u32,
    /// Exec count: nothing is placed across an exec.
    epoch: u32,
    start: u64,
    end: u64,
    row: usize,
    /// Backdated: it existed since the last reset, untouched by any change.
    exact_from: Option<u32>,
}

/// Disjoint ranges, merged.
#[derive(Clone, Debug, Default)]
struct RangeSet(BTreeMap<u64, u64>);

impl RangeSet {
    fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // Ranges are disjoint: those merged start at or below `end`, from
        // the highest down, until one ends before `start`.
        while let Some((&s, &e)) = self.0.range(..=end).next_back() {
            if e < start {
                break;
            }
            self.0.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.0.insert(start, end);
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.0.range(..end).next_back().is_some_and(|(_, e)| *e > start)
    }
}

#[cfg(test)]
pub const MAP_NORESERVE: u64 = 0x4000;
pub(crate) const MAP_STACK: u64 = 0x20000;

/// Births looked at after a page's generation before it is given up on (a
/// churning process maps the same chunk again and again).
const LATER_SCAN: usize = 4096;

/// Address chunk of the birth index: 2 MiB.
const BIRTH_CHUNK_SHIFT: u32 = 21;

/// glibc's HEAP_MAX_SIZE on 64-bit.
const ARENA: u64 = 64 << 20;

/// How far below a stack's start, as last known, it may have grown (the
/// default RLIMIT_STACK).
const STACK_GROWTH: u64 = 8 << 20;

/// Anonymous-like kinds are one class: the kernel names some ([heap],
/// [stack], [anon:…]) and not others.
fn same_class(a: RegionKind, b: RegionKind) -> bool {
    a == b || (a.is_anon_like() && b.is_anon_like())
}

/// The name of a mapped file whose path was not known when it was mapped.
fn placeholder(path: &str) -> bool {
    path.starts_with("[fd ") || path.starts_with("[file ")
}

fn can_serve(perms: &str) -> bool {
    perms.chars().take(3).any(|c| c != '-')
}

/// The replayed address space of one process.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    model: BTreeMap<u64, Piece>,
    pub rows: Vec<Row>,
    by_lineage: HashMap<(u32, Perms), usize>,
    next_lineage: u32,
    touched: RangeSet,
    reset_gen: u32,
    epoch: u32,
    brk: Option<u64>,
    births: Vec<Birth>,
    /// Births by `BIRTH_CHUNK_SHIFT` chunk of address, and those too large to index.
    birth_index: HashMap<u64, Vec<usize>>,
    /// Births backdated to the exec (mappings there all along), by chunk.
    backdated_index: HashMap<u64, Vec<usize>>,
    big_births: Vec<usize>,
    /// The generation of each exec: epoch i + 1 began at `resets[i]`.
    resets: Vec<u32>,
    /// Snapshots that disagreed with the replayed changes (a change not seen).
    pub reconciled: u64,
    /// The process runs a CPython whose obmalloc arenas are this large: its
    /// mmaps of that size are named (`python.rs`).
    python_arena: Option<u64>,
    /// The last maps read replayed (the next may be logged as what changed since).
    last_read: Vec<Region>,
}

impl Replay {
    /// Starts from `pieces` (a parent's address space at the fork).
    pub(crate) fn from_regions(regions: &[Region]) -> Self {
        let mut r = Self::default();
        for reg in regions {
            let row = r.new_row(reg.clone(), 0, false);
            r.insert(reg.start, reg.end, reg.offset, row, 0, Some(0));
        }
        r
    }

    /// Names the obmalloc arenas of a CPython with arenas of `size` as it
    /// maps them.
    #[must_use]
    pub(crate) fn with_python_arenas(mut self, size: Option<u64>) -> Self {
        self.python_arena = size;
        self
    }

    /// The mappings now, as regions.
    pub(crate) fn regions(&self) -> Vec<Region> {
        self.model
            .iter()
            .map(|(&start, p)| Region { start, end: p.end, offset: p.offset, ..self.rows[p.row].region.clone() })
            .collect()
    }

    fn new_row(&mut self, region: Region, flags: u64, reserved: bool) -> usize {
        self.next_lineage += 1;
        let lineage = self.next_lineage;
        let perms = region.perms;
        self.rows.push(Row { region, lineage, flags, reserved });
        let i = self.rows.len() - 1;
        self.by_lineage.insert((lineage, perms), i);
        i
    }

    /// The row of `row`'s mapping with permissions `perms`.
    fn row_with_perms(&mut self, row: usize, perms: &str) -> usize {
        let r = &self.rows[row];
        if r.region.perms == perms {
            return row;
        }
        let key = (r.lineage, Perms::from(perms));
        if let Some(&i) = self.by_lineage.get(&key) {
            return i;
        }
        // Its span is where pages got these permissions, not the mapping's.
        let region = Region { start: 0, end: 0, perms: key.1, ..r.region.clone() };
        let (flags, reserved) = (r.flags, r.reserved);
        self.rows.push(Row { region, lineage: key.0, flags, reserved });
        let i = self.rows.len() - 1;
        self.by_lineage.insert(key, i);
        i
    }

    /// Removes `[start, end)` from the model, splitting pieces at its edges;
    /// returns the parts removed, by start.
    fn cut(&mut self, start: u64, end: u64) -> Vec<(u64, Piece)> {
        let mut out = Vec::new();
        self.cut_with(start, end, |s, p| out.push((s, p)));
        out
    }

    /// Cuts `[start, end)` out of the model, giving each piece cut out (its
    /// start and the piece, lowest first) to `f`, without a list of keys: a
    /// replay cuts at every change, mostly one piece or none.
    fn cut_with(&mut self, start: u64, end: u64, mut f: impl FnMut(u64, Piece)) {
        if start >= end {
            return;
        }
        // The piece starting below `start` that reaches past it, then each
        // starting within; what is put back starts below `start` or at `end`.
        let mut from = match self.model.range(..start).next_back() {
            Some((&s, p)) if p.end > start => s,
            _ => start,
        };
        while let Some((&s, &p)) = self.model.range(from..end).next() {
            self.model.remove(&s);
            if s < start {
                self.model.insert(s, Piece { end: start, ..p });
            }
            if p.end > end {
                self.model.insert(end, Piece { offset: p.offset + (end - s), ..p });
            }
            let (a, b) = (s.max(start), p.end.min(end));
            f(a, Piece { end: b, offset: p.offset + (a - s), row: p.row });
            from = (s + 1).max(start);
        }
    }

    fn insert(&mut self, start: u64, end: u64, offset: u64, row: usize, gen: u32, exact_from: Option<u32>) {
        if start >= end {
            return;
        }
        self.model.insert(start, Piece { end, offset, row });
        let r = &mut self.rows[row].region;
        if r.start >= r.end || start < r.start {
            if r.start < r.end {
                r.offset = r.offset.saturating_sub(r.start - start);
            } else {
                r.offset = offset;
            }
            r.start = if r.start >= r.end { start } else { r.start.min(start) };
        }
        r.end = r.end.max(end);
        self.births.push(Birth { gen, epoch: self.epoch, start, end, row, exact_from });
    }

    /// Applies one change in effect from `gen`.
    pub(crate) fn apply(&mut self, gen: u32, change: &Change) {
        match change {
            Change::Map { region, flags } => {
                let (start, end) = (region.start, page_up(region.end));
                self.cut_with(start, end, |_, _| {});
                self.touched.insert(start, end);
                let reserved = !can_serve(&region.perms);
                let mut region = region.clone();
                region.end = end;
                if self.python_arena.is_some_and(|size| super::python::is_arena_mmap(&region, *flags, size)) {
                    region.kind = RegionKind::PythonArena;
                    region.path = Some(super::python::NAME.into());
                }
                let row = self.new_row(Region { start, end: start, ..region.clone() }, *flags, reserved);
                self.insert(start, end, region.offset, row, gen, None);
            }
            Change::Unmap { start, end } => {
                let end = page_up(*end);
                self.cut_with(*start, end, |_, _| {});
                self.touched.insert(*start, end);
            }
            Change::Protect { start, end, perms } => {
                let end = page_up(*end);
                self.touched.insert(*start, end);
                for (s, p) in self.cut(*start, end) {
                    let old = &self.rows[p.row].region.perms;
                    let perms = format!("{}{}", perms, old.get(3..4).unwrap_or("p"));
                    let row = self.row_with_perms(p.row, &perms);
                    self.insert(s, p.end, p.offset, row, gen, None);
                }
            }
            Change::Remap { old_start, old_len, new_start, new_len } => {
                let (old_end, new_end) = (page_up(old_start + old_len), page_up(new_start + new_len));
                self.touched.insert(*old_start, old_end);
                self.touched.insert(*new_start, new_end);
                let parts = self.cut(*old_start, old_end);
                if *new_start != *old_start {
                    self.cut_with(*new_start, new_end, |_, _| {});
                    // Moved: the rows show where the mapping is now.
                    for (_, p) in &parts {
                        let r = &mut self.rows[p.row].region;
                        r.end = r.start;
                    }
                }
                let mut last: Option<(u64, Piece)> = None;
                for (s, p) in parts {
                    let (ns, ne) = (s - old_start + new_start, (p.end - old_start + new_start).min(new_end));
                    if ns < ne {
                        self.insert(ns, ne, p.offset, p.row, gen, None);
                        last = Some((ne, Piece { end: ne, offset: p.offset + (ne - ns), row: p.row }));
                    }
                }
                // Grown: the new pages belong to the mapping's last piece.
                if let Some((at, p)) = last.filter(|(at, _)| *at < new_end) {
                    self.insert(at, new_end, p.offset, p.row, gen, None);
                }
            }
            Change::Brk { brk } => self.brk(gen, *brk),
            Change::Exec => {
                self.model.clear();
                self.touched = RangeSet::default();
                self.reset_gen = gen;
                self.epoch += 1;
                self.resets.push(gen);
                self.brk = None;
            }
            Change::Snapshot(read) => {
                let regions = self.read(read);
                self.reconcile(gen, &regions);
            }
            Change::Backdate(read) => {
                let regions = self.read(read);
                self.backdate_gaps(&regions);
            }
            Change::Nothing => {}
        }
    }

    /// As `apply`, for a change logged at a generation some other change was
    /// in flight: a maps read is then only good for backdating.
    pub(crate) fn apply_raced(&mut self, gen: u32, change: &Change) {
        match change {
            Change::Snapshot(read) => {
                let regions = self.read(read);
                self.backdate_gaps(&regions);
            }
            c => self.apply(gen, c),
        }
    }

    /// A maps read whole, rebuilt from the one replayed before it.
    fn read(&mut self, read: &super::history::MapsRead) -> Vec<Region> {
        let regions = read.rebuild(&self.last_read);
        self.last_read.clone_from(&regions);
        regions
    }

    fn brk(&mut self, gen: u32, brk: u64) {
        let new = page_up(brk);
        let Some(old) = self.brk.replace(new) else { return };
        if new < old {
            self.cut_with(new, old, |_, _| {});
            self.touched.insert(new, old);
        } else if new > old {
            self.touched.insert(old, new);
            let below = self.model.range(..old).next_back().filter(|(_, p)| p.end == old).map(|(_, p)| p.row);
            let row = match below.filter(|&r| self.rows[r].region.kind == RegionKind::Heap) {
                Some(r) => r,
                None => self.new_row(
                    Region {
                        start: old,
                        end: old,
                        perms: "rw-p".into(),
                        offset: 0,
                        kind: RegionKind::Heap,
                        path: Some("[heap]".into()),
                    },
                    0,
                    false,
                ),
            };
            self.insert(old, new, 0, row, gen, None);
        }
    }

    /// Makes the model agree with a maps read at `gen`. Where it already does,
    /// rows go on; a region over addresses no change touched since the last
    /// exec existed all along (exec's own mappings, stack growth) and is
    /// backdated; anything else is a change not seen, in effect from `gen`.
    fn reconcile(&mut self, gen: u32, regions: &[Region]) {
        if let Some(heap) = regions.iter().find(|r| r.kind == RegionKind::Heap) {
            self.brk.get_or_insert(heap.end);
        }
        // Pieces no region covers are gone.
        let mut covered = RangeSet::default();
        for r in regions {
            covered.insert(r.start, r.end);
        }
        let gone: Vec<(u64, u64)> = self
            .model
            .iter()
            .filter(|(s, p)| {
                let (s, e) = (**s, p.end);
                covered.0.range(..=s).next_back().is_none_or(|(_, ce)| *ce < e)
            })
            .map(|(s, p)| (*s, p.end))
            .collect();
        for (s, e) in gone {
            // Keep the parts a region covers.
            let parts = self.cut(s, e);
            for (ps, p) in parts {
                let mut at = ps;
                for (&cs, &ce) in covered.0.range(..p.end) {
                    let (a, b) = (cs.max(at), ce.min(p.end));
                    if a < b {
                        self.model.insert(a, Piece { end: b, offset: p.offset + (a - ps), row: p.row });
                        at = b;
                    }
                }
            }
            self.reconciled += 1;
        }
        for (i, r) in regions.iter().enumerate() {
            // A malloc arena read, not seen made: rw-p then the rest of its
            // 64 MiB reserved without access.
            let arena = regions.get(i + 1).is_some_and(|n| {
                r.kind == RegionKind::Anon
                    && n.kind == RegionKind::Anon
                    && n.start == r.end
                    && !can_serve(&n.perms)
                    && r.start.is_multiple_of(ARENA)
                    && n.end - r.start == ARENA
            });
            self.reconcile_region(gen, r, arena);
        }
    }

    fn reconcile_region(&mut self, gen: u32, r: &Region, arena: bool) {
        let parts = self.cut(r.start, r.end);
        let mut at = r.start;
        let mut fill: Vec<(u64, u64, Option<usize>)> = Vec::new();
        for (s, p) in &parts {
            if *s > at {
                fill.push((at, *s, None));
            }
            fill.push((*s, p.end, Some(p.row)));
            at = p.end;
        }
        if at < r.end {
            fill.push((at, r.end, None));
        }
        let mut prev_row: Option<usize> = None;
        for (s, e, row) in fill {
            let offset = r.offset + (s - r.start);
            let agree = row.filter(|&i| {
                let m = &self.rows[i].region;
                m.perms == r.perms
                    && same_class(m.kind, r.kind)
                    && (m.kind != RegionKind::File || m.path == r.path || m.path.as_deref().is_some_and(placeholder))
            });
            if let Some(i) = agree {
                // The kernel's name is the better one ([heap], [anon:…], a
                // file whose fd was closed before its path was read).
                let m = &mut self.rows[i].region;
                if r.path.is_some() && (m.path.is_none() || m.path.as_deref().is_some_and(placeholder)) {
                    m.path.clone_from(&r.path);
                    m.kind = r.kind;
                }
                self.model.insert(s, Piece { end: e, offset, row: i });
                prev_row = Some(i);
                continue;
            }
            let untouched = row.is_none() && !self.touched.overlaps(s, e);
            // An extension of the row beside it (a stack that grew), or a new one.
            let beside =
                prev_row.or_else(|| self.model.range(e..).next().filter(|(ns, _)| **ns == e).map(|(_, p)| p.row));
            let same = beside.filter(|&i| {
                let m = &self.rows[i].region;
                m.perms == r.perms && m.kind == r.kind && m.path == r.path
            });
            let i = match same {
                Some(i) => i,
                None => self.new_row(Region { start: s, end: s, ..r.clone() }, 0, arena || !can_serve(&r.perms)),
            };
            if untouched {
                let from = self.reset_gen;
                self.insert(s, e, offset, i, from, Some(from));
            } else {
                self.reconciled += 1;
                self.insert(s, e, offset, i, gen, None);
            }
            prev_row = Some(i);
        }
    }

    /// Adds the regions of a late maps read over addresses that are empty
    /// in the model and that no change touched since the last exec, as
    /// there since then.
    /// Also names files whose fd was closed before their path was read, and
    /// indexes what `later` looks up.
    pub(crate) fn backdate(&mut self, regions: &[Region]) {
        self.finish(regions);
        self.backdate_gaps(regions);
        self.index_births();
    }

    fn backdate_gaps(&mut self, regions: &[Region]) {
        for r in regions {
            let mut at = r.start;
            let pieces: Vec<(u64, u64)> =
                self.model.range(..r.end).filter(|(_, p)| p.end > r.start).map(|(s, p)| (*s, p.end)).collect();
            let mut gaps = Vec::new();
            for (s, e) in pieces {
                if s > at {
                    gaps.push((at, s));
                }
                at = at.max(e);
            }
            if at < r.end {
                gaps.push((at, r.end));
            }
            for (s, e) in gaps {
                if self.touched.overlaps(s, e) {
                    continue;
                }
                let row = self.new_row(Region { start: s, end: s, ..r.clone() }, 0, !can_serve(&r.perms));
                let from = self.reset_gen;
                self.insert(s, e, r.offset + (s - r.start), row, from, Some(from));
            }
        }
    }

    fn finish(&mut self, regions: &[Region]) {
        for r in regions.iter().filter(|r| r.kind == RegionKind::File) {
            let rows: Vec<usize> = self.model.range(r.start..r.end).map(|(_, p)| p.row).collect();
            for i in rows {
                let m = &mut self.rows[i].region;
                if m.kind == RegionKind::File && m.path.as_deref().is_some_and(placeholder) {
                    m.path.clone_from(&r.path);
                }
            }
        }
        // A row still mapped spans its pieces now, not every address it held.
        let mut live: HashMap<usize, (u64, u64, u64)> = HashMap::default();
        for (&s, p) in &self.model {
            let e = live.entry(p.row).or_insert((s, p.end, p.offset));
            if s < e.0 {
                (e.0, e.2) = (s, p.offset);
            }
            e.1 = e.1.max(p.end);
        }
        for (i, (s, e, off)) in live {
            let r = &mut self.rows[i].region;
            (r.start, r.end, r.offset) = (s, e, off);
        }
    }

    /// The row that held `addr` at the current generation, if it could serve
    /// a fault (a reservation with no access cannot).
    /// With the file offset of `addr` in it.
    pub(crate) fn find(&self, addr: u64) -> Option<(usize, u64)> {
        let (s, p) = self.model.range(..=addr).next_back().filter(|(_, p)| p.end > addr)?;
        if can_serve(&self.rows[p.row].region.perms) {
            return Some((p.row, p.offset + (addr - s)));
        }
        None
    }

    /// A stack piece just above `addr`: the stack grew down to it.
    pub(crate) fn grown_stack(&self, addr: u64) -> Option<usize> {
        let (s, p) = self.model.range(addr..).next()?;
        (self.rows[p.row].region.kind == RegionKind::Stack && s - addr <= STACK_GROWTH).then_some(p.row)
    }

    /// For a page no mapping held at `gen`: a mapping backdated over it (it
    /// was there all along), else the first to cover it after `gen`, before
    /// the next exec.
    pub(crate) fn later(&self, addr: u64, gen: u32, epoch: u32) -> Option<Placed> {
        self.later_in(addr, gen, epoch).or_else(|| {
            // A fault during execve, after the new address space was made and
            // before the exec hook bumped the generation: in the new one.
            let next_exec = self.resets.get(epoch as usize)?;
            (gen + 1 == *next_exec).then(|| self.later_in(addr, *next_exec, epoch + 1)).flatten()
        })
    }

    fn later_in(&self, addr: u64, gen: u32, epoch: u32) -> Option<Placed> {
        let chunk = addr >> BIRTH_CHUNK_SHIFT;
        let fits = |b: &Birth| {
            b.epoch == epoch && b.start <= addr && addr < b.end && can_serve(&self.rows[b.row].region.perms)
        };
        let backdated = self.backdated_index.get(&chunk).into_iter().flatten().chain(&self.big_births);
        if let Some(b) = backdated.map(|&i| &self.births[i]).find(|b| fits(b) && b.exact_from.is_some_and(|f| f <= gen))
        {
            return Some(Placed::Exact(b.row));
        }
        // Births are in generation order: the first after `gen` that fits.
        let later = |list: &[usize]| {
            let from = list.partition_point(|&i| self.births[i].gen <= gen);
            list[from..].iter().take(LATER_SCAN).map(|&i| &self.births[i]).find(|b| fits(b)).map(|b| (b.gen, b.row))
        };
        let near = self.birth_index.get(&chunk).and_then(|l| later(l));
        let big = later(&self.big_births);
        [near, big].into_iter().flatten().min_by_key(|(g, _)| *g).map(|(_, row)| Placed::Approximate(row))
    }

    /// Indexes the births by address for `later` (call once, at the end).
    fn index_births(&mut self) {
        self.birth_index.clear();
        self.backdated_index.clear();
        self.big_births.clear();
        for (i, b) in self.births.iter().enumerate() {
            let (first, last) = (b.start >> BIRTH_CHUNK_SHIFT, (b.end - 1) >> BIRTH_CHUNK_SHIFT);
            let index = if b.exact_from.is_some() { &mut self.backdated_index } else { &mut self.birth_index };
            if last - first > 512 {
                self.big_births.push(i);
                continue;
            }
            for c in first..=last {
                index.entry(c).or_default().push(i);
            }
        }
        // Births are pushed as the replay goes, in generation order, but
        // backdated ones carry their earlier generation.
        let births = &self.births;
        self.big_births.sort_by_key(|&i| births[i].gen);
    }

    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }
}

/// The row kind and name a user looks for: thread stacks (MAP_STACK), malloc
/// arena heaps (a reservation grown by mprotect), JIT code (anonymous and
/// executable).
pub(crate) fn label(row: &Row) -> (RegionKind, Option<std::sync::Arc<str>>) {
    let r = &row.region;
    if super::python::is_kernel_named(r) {
        return (RegionKind::PythonArena, Some(super::python::NAME.into()));
    }
    if r.kind != RegionKind::Anon || r.path.is_some() {
        return (r.kind, r.path.clone());
    }
    if row.flags & MAP_STACK != 0 {
        return (RegionKind::Stack, Some("[thread stack]".into()));
    }
    if r.perms.contains('x') {
        return (RegionKind::Anon, Some("[jit code]".into()));
    }
    // glibc's malloc reserves 64 MiB per arena without access, aligned to
    // its size, and opens it with mprotect as the arena grows.
    if row.reserved && r.perms.starts_with("rw") {
        let arena = r.start.is_multiple_of(ARENA) && r.end - r.start <= ARENA;
        let name = if arena { "[malloc arena]" } else { "[reserved, opened by mprotect]" };
        return (RegionKind::Heap, Some(name.into()));
    }
    (r.kind, None)
}
