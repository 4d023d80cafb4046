//! Names for addresses: the memory maps of traced processes, kept fresh while
//! they live, and the symbolization of fault stacks, mmap call sites and
//! storm culprits from them.
use crate::hash::ShrinkSparse as _;
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use vmtrace_common::{StackCounts, StackKey, LEAF_BLOCK_SHIFT, MM_CALL_NAMES, STACK_ID_LOST};

use super::{process::ProcessTable, storms::RawStorm, AggregateSource, MmSite};
use crate::{
    model::Storm,
    procmaps::Region,
    python::{CodeCache, PyStack},
    stacks::{
        self,
        native::{shares, NativeStack, NativeStacks, ProcessMaps},
        symbolize::{Names, PerfMap},
        Stack,
    },
};

/// How long after a read of a process's maps a sample whose code is missing
/// from them may read them again: a JIT process would otherwise read its maps
/// on every sample.
const MAPS_RETRY: Duration = Duration::from_millis(250);
const MAPS_RETRY_YOUNG: Duration = Duration::from_millis(5);

impl ProcessMaps for ProcessTable {
    fn root(&self, tgid: u32) -> Option<std::sync::Arc<crate::procmaps::root::RootDir>> {
        self.root_of(tgid).cloned()
    }

    fn maps(&mut self, tgid: u32) -> (&[Region], Option<Instant>) {
        ensure_maps(self, tgid);
        match self.get(tgid) {
            Some(p) => (&p.maps, p.maps_read),
            None => (&[], None),
        }
    }

    fn refresh(&mut self, tgid: u32) {
        // A young process maps its libraries (exec, ld.so, dlopen) faster
        // than the polls re-read its maps.
        let young = self.get(tgid).is_some_and(|p| p.first_seen.elapsed() < YOUNG);
        let retry = if young { MAPS_RETRY_YOUNG } else { MAPS_RETRY };
        let recent = self.get(tgid).and_then(|p| p.maps_read).is_some_and(|t| t.elapsed() < retry);
        // A library ld.so mapped a moment ago is not waited for.
        let stale = self.get(tgid).is_some_and(|p| p.maps_stale);
        // Not read (gone): the libraries its mapping events mapped.
        if (!recent || stale) && !self.snapshot_maps(tgid) {
            self.add_mapped_to_maps(tgid);
        }
    }
}

/// How often memory maps of live processes are re-read (symbolization,
/// changes to the address space no event reports).
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// Processes younger than this have their maps re-read on every poll.
const YOUNG: Duration = Duration::from_secs(2);

/// When the maps of all live processes were last re-read.
pub(crate) struct MapsRefresh {
    last: Instant,
}

impl MapsRefresh {
    pub(crate) fn new(now: Instant) -> Self {
        Self { last: now }
    }

    /// Re-reads the maps of live traced processes: libraries load after exec,
    /// so young processes are re-read on every poll, older ones every second.
    /// `gen_of`: a process's address-space generation (for region history).
    pub(crate) fn run(&mut self, now: Instant, table: &mut ProcessTable, gen_of: &dyn Fn(u32) -> Option<u32>) {
        let all_due = now.saturating_duration_since(self.last) >= MAPS_REFRESH;
        if all_due {
            self.last = now;
        }
        // Live processes only; a young one whose address-space generation
        // is the one of its last read has the same maps (every mapping change
        // and exec bumps it): not read again until the next full round.
        let due: Vec<u32> = table
            .live()
            .filter(|(_, p)| p.exit_code.is_none())
            .filter(|(pid, p)| {
                all_due
                    || (now.saturating_duration_since(p.first_seen) < YOUNG
                        && (p.maps_gen.is_none() || p.maps_gen != gen_of(*pid)))
            })
            .map(|(pid, _)| pid)
            .collect();
        for pid in due {
            table.snapshot_maps_at(pid, gen_of);
        }
    }
}

/// Reads `pid`'s maps unless some are known already.
fn ensure_maps(table: &mut ProcessTable, pid: u32) {
    // A released process's pid may be another process's now.
    if table.get(pid).is_none_or(|p| p.maps.is_empty() && !p.released) && !table.snapshot_maps(pid) {
        table.add_mapped_to_maps(pid);
    }
}

/// The counts of one frame-pointer stack shared out over the unwound
/// stacks its samples gave (`native::shares`).
fn split_counts(c: &StackCounts, weights: &[u64]) -> Vec<StackCounts> {
    let [faults, major, time, timed, cow] = [c.faults, c.major, c.time_ns, c.timed, c.cow].map(|v| shares(v, weights));
    (0..weights.len())
        .map(|i| StackCounts { faults: faults[i], major: major[i], time_ns: time[i], timed: timed[i], cow: cow[i] })
        .collect()
}

/// What a stack key's frames depend on: its process, its user and kernel
/// stacks and its leaf block (not its stratum, which only sorts counts).
pub(crate) type SymKey = (u32, i32, i32, u64);

pub(crate) fn sym_key(k: &StackKey) -> SymKey {
    (k.tgid, k.user_stack, k.kernel_stack, k.leaf_block)
}

/// A key's stacks without their counts, and the weights its counts are
/// shared out by: one stack, or the unwound stacks a frame-pointer stack's
/// samples gave (`split`: a part that gets nothing is left out).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Symbolized {
    variants: Box<[(Template, u64)]>,
    split: bool,
}

/// A symbolized stack without its process and counts: what is kept per
/// key of a retired process (a fifth of a `Stack`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[allow(clippy::struct_excessive_bools, reason = "the flags of `Stack`, kept as they are")]
#[allow(clippy::option_option, reason = "`Stack::unwound` as it is")]
struct Template {
    user: stacks::Frames,
    kernel: stacks::Frames,
    leaf: Option<stacks::Frame>,
    unwound: Option<Option<&'static str>>,
    python: bool,
    python_unnamed: bool,
    user_missing: bool,
    user_cut: bool,
}

impl Template {
    fn stack(&self, pid: u32, comm: &str, counts: StackCounts, stratum: u32) -> Stack {
        Stack {
            pid,
            comm: comm.to_string(),
            user: self.user.clone(),
            kernel: self.kernel.to_vec(),
            counts,
            user_missing: self.user_missing,
            user_cut: self.user_cut,
            unwound: self.unwound,
            leaf: self.leaf.as_deref().map(ToString::to_string),
            stratum,
            estimate: stacks::weight::Estimate::default(),
            python: self.python,
            python_unnamed: self.python_unnamed,
        }
    }
}

/// The symbol caches of the whole recording (one ELF read per object, one
/// kallsyms read per kernel address), and the stacks and call sites of the
/// processes that retired, symbolized as they retired: their memory maps,
/// unwound stacks and Python code objects are let go then
/// (`Session::retire_exited`), so the collector holds those for live
/// processes only.
#[derive(Default)]
pub(crate) struct Symbols {
    names: Names,
    stacks: HashMap<SymKey, Symbolized>,
    sites: HashMap<(u32, u32, i32), Vec<(stacks::Frames, u64)>>,
    /// The settled counts of live processes, symbolized (`seal`).
    sealed: Sealed,
    /// The stacks of resident pages whose owners were sealed (`owner_shapes`).
    owners: OwnerShapes,
    /// The settled call sites of live processes taken out of the kernel's
    /// map (`seal_sites`): calls and IPIs by process and frames.
    sealed_sites: HashMap<u32, HashMap<stacks::Frames, (u64, u64)>>,
}

/// The symbolized stacks (with their leaf) of sampled resident pages whose
/// owners' stack ids were sealed or released, interned across processes
/// (no pid in a shape): a page then names its stacks by a shape id
/// (`resident::Owner::shape`) and no drained stack id, so the drained
/// stack can go. Shapes no page or snapshot refers to any more are let go
/// (`retain_owner_shapes`).
#[derive(Default)]
struct OwnerShapes {
    by_id: HashMap<u32, std::sync::Arc<Symbolized>>,
    index: HashMap<std::sync::Arc<Symbolized>, u32>,
    next: u32,
}

impl OwnerShapes {
    fn intern(&mut self, sym: Symbolized) -> u32 {
        if let Some(id) = self.index.get(&sym) {
            return *id;
        }
        let id = self.next;
        self.next += 1;
        let sym = std::sync::Arc::new(sym);
        self.by_id.insert(id, sym.clone());
        self.index.insert(sym, id);
        id
    }
}

/// Sealed shapes one process keeps before its lightest are added into one
/// `[lighter stacks]` stack per stratum and kind (`Sealed::compact`).
const MAX_SEALED: usize = 2048;

/// The fault counts of live processes' settled keys, symbolized when they
/// were taken out of the drained tables (`Drained::take_settled`), summed
/// by what their stacks show (their shape) per process: the drained
/// stacks only they were counted under can then go, and what a process
/// that lives on keeps grows with its distinct shapes (bounded), not with
/// every stack id it was counted under. Each sealing splits a key's
/// counts by the unwound stacks its samples gave until then; counts
/// drained for the key later are symbolized afresh (never from a frozen
/// cache), so sealed and fresh add up to the key's counts.
#[derive(Default)]
pub(crate) struct Sealed {
    by_pid: HashMap<u32, HashMap<(Template, u32), StackCounts>>,
    /// Keys of live processes whose counts were sealed, keys of released
    /// processes sealed as they were released, and shapes added into a
    /// lighter one.
    pub keys: u64,
    pub released_keys: u64,
    pub lightened: u64,
}

impl Sealed {
    fn add(&mut self, pid: u32, t: &Template, counts: StackCounts, stratum: u32) {
        use vmtrace_common::Merge as _;
        self.by_pid.entry(pid).or_default().entry((t.clone(), stratum)).or_default().merge(&counts);
    }

    /// Keeps `pid`'s `keep` heaviest shapes (by faults, then time) and adds
    /// the others into one `[lighter stacks]` shape per stratum and kind:
    /// counts stay whole (`folded::StackSums::compact` does the same).
    fn compact(&mut self, pid: u32, keep: usize) {
        use vmtrace_common::Merge as _;
        let Some(m) = self.by_pid.get_mut(&pid) else { return };
        if m.len() <= keep {
            return;
        }
        let mut all: Vec<_> = m.drain().collect();
        all.sort_by(|a, b| b.1.faults.cmp(&a.1.faults).then(b.1.time_ns.cmp(&a.1.time_ns)));
        let light = all.split_off(keep);
        self.lightened += light.len() as u64;
        m.extend(all);
        let lighter: stacks::Frames = vec![stacks::Frame::from(stacks::native::LIGHTER)].into();
        for ((t, stratum), c) in light {
            let into = Template { user: lighter.clone(), kernel: Vec::new().into(), leaf: None, ..t };
            m.entry((into, stratum)).or_default().merge(&c);
        }
        m.shrink_to_fit();
    }

    fn stacks_of<'a>(
        &'a self,
        pids: impl Fn(u32) -> bool + 'a,
        comm_of: &'a mut dyn FnMut(u32) -> String,
    ) -> impl Iterator<Item = Stack> + 'a {
        self.by_pid.iter().filter(move |(p, _)| pids(**p)).flat_map(move |(pid, m)| {
            let comm = comm_of(*pid);
            m.iter().map(move |((t, stratum), c)| t.stack(*pid, &comm, *c, *stratum)).collect::<Vec<_>>()
        })
    }

    /// (processes, shapes) held.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.by_pid.len(), self.by_pid.values().map(HashMap::len).sum())
    }
}

impl Symbols {
    /// Symbolizes `keys` now, while their processes' maps are still known
    /// (what `symbolize_counts` does later with their counts).
    pub(crate) fn keep_stacks(
        &mut self,
        keys: impl IntoIterator<Item = SymKey>,
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) {
        let todo: Vec<SymKey> = keys.into_iter().filter(|k| !self.stacks.contains_key(k)).collect();
        let done = symbolize_keys(todo, &mut self.names, table, source, native, py);
        self.stacks.extend(done);
    }

    /// Symbolizes the settled counts `raw` of live processes with the
    /// unwound stacks their ids have now, not cached (counts drained later
    /// for the same keys are symbolized afresh), and adds them to the
    /// processes' sealed shapes.
    /// `live`: the keys of live processes (`Sealed::keys`), else of
    /// processes released (`Sealed::released_keys`).
    pub(crate) fn seal(
        &mut self,
        raw: Vec<(StackKey, StackCounts)>,
        live: bool,
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) {
        let keys: Vec<SymKey> = raw.iter().map(|(k, _)| sym_key(k)).collect();
        let done = symbolize_keys(keys, &mut self.names, table, source, native, py);
        if live {
            self.sealed.keys += raw.len() as u64;
        } else {
            self.sealed.released_keys += raw.len() as u64;
        }
        for (k, c) in raw {
            let Some(sym) = done.get(&sym_key(&k)) else { continue };
            each_part(sym, c, |t, counts| self.sealed.add(k.tgid, t, counts, k.stratum));
        }
    }

    /// Keeps the sealed shapes of `pids` within `MAX_SEALED`: once after
    /// all the `seal` calls of one sealing (which seals a slice at a time).
    pub(crate) fn compact_sealed(&mut self, pids: &crate::hash::HashSet<u32>) {
        for pid in pids {
            if self.sealed.by_pid.get(pid).is_some_and(|m| m.len() > MAX_SEALED) {
                self.sealed.compact(*pid, MAX_SEALED * 3 / 4);
            }
        }
    }

    /// Symbolizes the resident owners `keys` (with their leaf blocks) now
    /// with the unwound stacks their ids have, not cached, and interns them
    /// as owner shapes: returns each key's shape id (`resident::Owner::shape`).
    pub(crate) fn owner_shapes(
        &mut self,
        keys: Vec<SymKey>,
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) -> crate::hash::HashMap<SymKey, u32> {
        let done = symbolize_keys(keys, &mut self.names, table, source, native, py);
        done.into_iter().map(|(k, sym)| (k, self.owners.intern(sym))).collect()
    }

    /// Lets go of the owner shapes not in `referenced`; returns how many are held.
    pub(crate) fn retain_owner_shapes(&mut self, referenced: &crate::hash::HashSet<u32>) -> usize {
        let o = &mut self.owners;
        o.by_id.retain(|id, _| referenced.contains(id));
        o.index.retain(|_, id| referenced.contains(id));
        o.by_id.shrink_if_sparse();
        o.index.shrink_if_sparse();
        o.by_id.len()
    }

    /// Owner shapes held.
    pub(crate) fn owner_shapes_held(&self) -> usize {
        self.owners.by_id.len()
    }

    /// The sealed stacks of the processes `pids` picks, named by `comm_of`.
    pub(crate) fn sealed_stacks(
        &self,
        pids: impl Fn(u32) -> bool,
        comm_of: &mut dyn FnMut(u32) -> String,
    ) -> Vec<Stack> {
        self.sealed.stacks_of(pids, comm_of).collect()
    }

    /// The sealing's counts and sizes.
    pub(crate) fn sealed(&self) -> &Sealed {
        &self.sealed
    }

    /// Symbolizes the settled call sites `raw` of live processes (taken out
    /// of the kernel's map) with the unwound stacks their ids have now, not
    /// cached, and adds their calls and IPIs to each process's sealed call
    /// sites, by frames: the drained stacks they named can go. Shared out
    /// over a frame-pointer stack's unwound stacks as `build_mm_sites` does.
    pub(crate) fn seal_sites(
        &mut self,
        raw: Vec<(vmtrace_common::MmStackKey, vmtrace_common::MmStackCounts)>,
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) {
        for (k, c) in raw {
            let key = (k.tgid, k.call, k.user_stack);
            let variants = self.site_variants_of(key, table, source, native, py);
            let m = self.sealed_sites.entry(k.tgid).or_default();
            each_site_part(variants, c, |frames, calls, ipis| {
                let e = m.entry(frames).or_default();
                e.0 += calls;
                e.1 += ipis;
            });
        }
    }

    /// A call site's interned unwound variants: as kept at its process's
    /// release, else symbolized now.
    fn site_variants_of(
        &mut self,
        key: (u32, u32, i32),
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) -> Vec<(stacks::Frames, u64)> {
        match self.sites.get(&key) {
            Some(v) => v.clone(),
            None => site_variants(table, source, &mut self.names, key, native, py)
                .into_iter()
                .map(|(f, n)| (intern_strings(&self.names, &f), n))
                .collect(),
        }
    }

    /// The sealed call sites of the processes `pids` picks, named by `comm_of`.
    pub(crate) fn sealed_sites(
        &self,
        pids: impl Fn(u32) -> bool,
        comm_of: &mut dyn FnMut(u32) -> String,
    ) -> Vec<MmSite> {
        let mut out = Vec::new();
        for (pid, m) in self.sealed_sites.iter().filter(|(p, _)| pids(**p)) {
            let comm = comm_of(*pid);
            out.extend(m.iter().map(|(frames, (calls, ipis))| MmSite {
                pid: *pid,
                comm: comm.clone(),
                frames: frames.clone(),
                calls: *calls,
                ipis: *ipis,
            }));
        }
        out
    }

    /// (processes, call sites) sealed and held.
    pub(crate) fn sealed_sites_sizes(&self) -> (usize, usize) {
        (self.sealed_sites.len(), self.sealed_sites.values().map(HashMap::len).sum())
    }

    /// Forgets the stacks, call sites and sealed shapes of `pids` (folded
    /// away: their counts were symbolized into the other process's).
    /// (Their owner shapes go once no page refers to them:
    /// `retain_owner_shapes`.)
    pub(crate) fn forget(&mut self, pids: &crate::hash::HashSet<u32>) {
        self.sealed.by_pid.retain(|p, _| !pids.contains(p));
        self.sealed.by_pid.shrink_if_sparse();
        self.sealed_sites.retain(|p, _| !pids.contains(p));
        self.sealed_sites.shrink_if_sparse();
        self.stacks.retain(|k, _| !pids.contains(&k.0));
        self.sites.retain(|k, _| !pids.contains(&k.0));
        self.stacks.shrink_if_sparse();
        self.sites.shrink_if_sparse();
    }

    /// Closes the object files read for the last symbolization.
    /// Forgets the names nothing holds any more (`Names::prune`).
    pub(crate) fn prune(&mut self) -> usize {
        self.names.prune()
    }

    /// Kept stacks and call sites, and the names' sizes (`Names::sizes`).
    pub(crate) fn sizes(&self) -> (usize, usize, (usize, usize, usize, usize)) {
        (self.stacks.len(), self.sites.len(), self.names.sizes())
    }

    pub(crate) fn close_objects(&mut self) {
        self.names.close_objects();
    }

    /// Symbolizes the call sites `keys` (tgid, call, user stack) now.
    pub(crate) fn keep_sites(
        &mut self,
        keys: impl IntoIterator<Item = (u32, u32, i32)>,
        table: &mut ProcessTable,
        source: &impl AggregateSource,
        native: &NativeStacks,
        py: &CodeCache,
    ) {
        for key in keys {
            if self.sites.contains_key(&key) {
                continue;
            }
            let v = site_variants(table, source, &mut self.names, key, native, py);
            let v = v.into_iter().map(|(f, w)| (intern_strings(&self.names, &f), w)).collect();
            self.sites.insert(key, v);
        }
    }
}

/// Frames given as strings, kept once (`Names::intern_frames`).
fn intern_strings(names: &Names, frames: &[String]) -> stacks::Frames {
    names.intern_frames(frames.iter().map(|f| names.intern(f)).collect())
}

/// Symbolizes the in-kernel stack aggregate; user stacks with copied samples
/// are replaced by their unwound stacks.
pub(crate) fn build_stacks(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    syms: &mut Symbols,
) -> Vec<Stack> {
    symbolize_counts(source.all_stack_counts(), table, source, native, py, syms)
}

/// Symbolizes stacks given as (key, counts), as the fault aggregate's are
/// (the resident profiles weigh their owners' pages the same way). Keys
/// of retired processes were symbolized as they retired (`Symbols`).
pub(crate) fn symbolize_counts(
    raw: Vec<(StackKey, StackCounts)>,
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    syms: &mut Symbols,
) -> Vec<Stack> {
    let todo: Vec<SymKey> = raw.iter().map(|(k, _)| sym_key(k)).filter(|k| !syms.stacks.contains_key(k)).collect();
    let mut fresh = symbolize_keys(todo, &mut syms.names, table, source, native, py);
    let mut out = Vec::new();
    let mut comms: HashMap<u32, String> = HashMap::default();
    for (k, c) in raw {
        let key = sym_key(&k);
        let Some(sym) = syms.stacks.get(&key).or_else(|| fresh.get(&key)) else { continue };
        let comm = comms.entry(k.tgid).or_insert_with(|| table.ensure(k.tgid).comm.clone());
        each_part(sym, c, |t, counts| out.push(t.stack(k.tgid, comm, counts, k.stratum)));
    }
    fresh.clear();
    out
}

/// `symbolize_counts` for the resident profiles' owners: a key of the
/// stratum `resident::STRATUM_SHAPE` names an owner shape
/// (`Symbols::owner_shapes`) by its `user_stack`, its leaf kept where its
/// `leaf_block` is set (as a key's leaf is made from it).
pub(crate) fn symbolize_owner_counts(
    raw: Vec<(StackKey, StackCounts)>,
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    syms: &mut Symbols,
) -> Vec<Stack> {
    use super::resident::STRATUM_SHAPE;
    let (shaped, raw): (Vec<_>, Vec<_>) = raw.into_iter().partition(|(k, _)| k.stratum & STRATUM_SHAPE != 0);
    let mut out = symbolize_counts(raw, table, source, native, py, syms);
    let mut comms: HashMap<u32, String> = HashMap::default();
    for (k, c) in shaped {
        let Some(sym) = u32::try_from(k.user_stack).ok().and_then(|id| syms.owners.by_id.get(&id)) else { continue };
        let comm = comms.entry(k.tgid).or_insert_with(|| table.ensure(k.tgid).comm.clone());
        let stratum = k.stratum & !STRATUM_SHAPE;
        each_part(sym, c, |t, counts| {
            let mut s = t.stack(k.tgid, comm, counts, stratum);
            if k.leaf_block == 0 {
                s.leaf = None;
            }
            out.push(s);
        });
    }
    out
}

/// A key's counts `c` as its stacks show them: whole on each of its
/// stacks, or shared out over the unwound stacks of a frame-pointer stack
/// by their weights (a part that gets nothing is left out).
fn each_part(sym: &Symbolized, c: StackCounts, mut f: impl FnMut(&Template, StackCounts)) {
    if !sym.split {
        for (t, _) in &sym.variants {
            f(t, c);
        }
        return;
    }
    let weights: Vec<u64> = sym.variants.iter().map(|(_, n)| *n).collect();
    for ((t, _), counts) in sym.variants.iter().zip(split_counts(&c, &weights)) {
        if counts.faults | counts.timed | counts.major == 0 {
            continue;
        }
        f(t, counts);
    }
}

/// One stack to symbolize: its user and kernel IPs, how the user stack ended
/// when it was unwound from a copy (`None`: frame pointers only), and the
/// weight of this unwound stack among its key's.
type RawVariant = (StackOf, Vec<u64>, Vec<u64>, Option<Option<stacks::native::Cut>>, u64);

/// What a key's stacks depend on besides its leaf block: its process, its
/// user and kernel stacks.
type StackOf = (u32, i32, i32);

/// The stacks of `keys`, without counts (`Symbolized`). Keys that differ in
/// their leaf block alone share their stacks, symbolized once: a resident
/// owner is keyed by its page's block, and a sealing's owners were mostly
/// the same stacks over many blocks (the torch job's first sealing made
/// 30,042 owners shapes in 46 s, each stack symbolized again per block).
#[allow(clippy::too_many_lines, reason = "one pass per process: the stacks, then each key's leaf")]
fn symbolize_keys(
    keys: Vec<SymKey>,
    names: &mut Names,
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
) -> HashMap<SymKey, Symbolized> {
    // The leaf blocks of each stack, and whether its counts are split.
    let mut blocks: HashMap<StackOf, (Vec<u64>, bool)> = HashMap::default();
    let mut stacks_of: HashMap<u32, Vec<StackOf>> = HashMap::default();
    let mut by_pid: HashMap<u32, Vec<RawVariant>> = HashMap::default();
    for key in keys {
        let (tgid, user_stack, kernel_stack, leaf_block) = key;
        let of = (tgid, user_stack, kernel_stack);
        if let Some((b, _)) = blocks.get_mut(&of) {
            // Deduplicated once all are in (sorted): a `contains` here
            // was quadratic in a stack's leaf blocks.
            b.push(leaf_block);
            continue;
        }
        let kernel = if kernel_stack >= 0 { source.stack_ips(kernel_stack).unwrap_or_default() } else { vec![] };
        let variants = native.variants(tgid, user_stack);
        blocks.insert(of, (vec![leaf_block], !variants.is_empty()));
        stacks_of.entry(tgid).or_default().push(of);
        if variants.is_empty() {
            let user = if user_stack >= 0 { source.user_stack_ips(user_stack).unwrap_or_default() } else { vec![] };
            by_pid.entry(tgid).or_default().push((of, user, kernel, None, 1));
            continue;
        }
        for (v, n) in variants {
            by_pid.entry(tgid).or_default().push((of, v.frames.clone(), kernel.clone(), Some(v.cut.clone()), *n));
        }
    }
    for (b, _) in blocks.values_mut() {
        b.sort_unstable();
        b.dedup();
    }
    // Each stack's templates, leaf not set yet.
    let mut done: HashMap<StackOf, Vec<(Template, u64)>> = HashMap::default();
    let mut out: HashMap<SymKey, Symbolized> = HashMap::default();
    for (pid, entries) in by_pid {
        ensure_maps(table, pid);
        table.ensure(pid);
        let table = &*table;
        let Some(info) = table.get(pid) else { continue };
        let maps = table.maps_for_stacks(pid);
        let jit = PerfMap::read(pid);
        let all_user: Vec<u64> = entries.iter().flat_map(|e| stacks::lookup_addrs(&e.1)).collect();
        names.prepare_user(&all_user, &maps, table.root_of(pid));
        let all_kernel: Vec<u64> = entries.iter().flat_map(|e| e.2.iter().copied()).collect();
        names.prepare_kernel(&all_kernel);
        // The Python frames of each user stack (a pinned stack's are its
        // frame-pointer id's): looked up once, not once per unwound stack.
        let mut py_of: HashMap<i32, Option<PyStack>> = HashMap::default();
        for (of, user, kernel, unwound, weight) in entries {
            let (_, user_stack, _) = of;
            let (user, user_cut, unwound) = match &unwound {
                None => {
                    let (frames, cut) = stacks::user_frames(&user, names, &maps, &info.mapped, jit.as_ref());
                    (frames, cut, None)
                }
                Some(cut) => {
                    let (frames, why) = stacks::native_frames(&user, cut.as_ref(), names, &maps, jit.as_ref());
                    (frames, why.is_some(), Some(why))
                }
            };
            let py_stack = py_of
                .entry(user_stack)
                .or_insert_with(|| source.python_stack(native.original(pid, user_stack)))
                .as_ref();
            let python = py_stack.is_some();
            let python_unnamed = py_stack.as_ref().is_some_and(|ps| py.any_unnamed(pid, ps));
            let user = match py_stack {
                // Python frames are named per stack: kept once each all the same.
                Some(ps) => {
                    let native = user.iter().map(ToString::to_string).collect();
                    with_python(native, py, pid, Some(ps)).iter().map(|f| names.intern(f)).collect()
                }
                None => user,
            };
            let stack = Template {
                unwound,
                user: names.intern_frames(user),
                kernel: names.intern_frames(kernel.iter().rev().map(|&a| names.kernel(a)).collect()),
                python,
                python_unnamed,
                user_missing: user_stack == STACK_ID_LOST,
                user_cut,
                leaf: None,
            };
            done.entry(of).or_default().push((stack, weight));
        }
        // Then each key: its stack's templates with its leaf.
        let mut leaves: HashMap<u64, stacks::Frame> = HashMap::default();
        let mut leaf_of = |block: u64| -> Option<stacks::Frame> {
            if block == 0 {
                return None;
            }
            let leaf = leaves.entry(block).or_insert_with(|| {
                let a = block << LEAF_BLOCK_SHIFT;
                let end = a + (1 << LEAF_BLOCK_SHIFT) - 1;
                // A region may start inside the block: try its last byte too.
                let leaf = stacks::region_leaf(&info.maps, &info.mapped, a);
                let leaf =
                    if leaf == "[unmapped region]" { stacks::region_leaf(&info.maps, &info.mapped, end) } else { leaf };
                names.intern(&leaf)
            });
            Some(leaf.clone())
        };
        for of in stacks_of.remove(&pid).unwrap_or_default() {
            let Some((bs, split)) = blocks.remove(&of) else { continue };
            let templates = done.remove(&of).unwrap_or_default();
            for block in bs {
                let leaf = leaf_of(block);
                let variants: Box<[(Template, u64)]> =
                    templates.iter().map(|(t, w)| (Template { leaf: leaf.clone(), ..t.clone() }, *w)).collect();
                out.insert((of.0, of.1, of.2, block), Symbolized { variants, split });
            }
        }
    }
    // A key whose process is not known: no stacks.
    for (of, (bs, split)) in blocks {
        for block in bs {
            out.insert((of.0, of.1, of.2, block), Symbolized { variants: Box::new([]), split });
        }
    }
    out
}

/// Frames of a call site, outermost first, the syscall as leaf: the unwound
/// stack `native` when its samples gave one, else the frame-pointer stack.
pub(crate) fn site_frames(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    names: &mut Names,
    (tgid, call, user_stack): (u32, u32, i32),
    native: Option<&NativeStack>,
    py: &CodeCache,
) -> Vec<String> {
    ensure_maps(table, tgid);
    let ips = match native {
        Some(n) => n.frames.clone(),
        None if user_stack >= 0 => source.user_stack_ips(user_stack).unwrap_or_default(),
        None => vec![],
    };
    table.ensure(tgid);
    let table = &*table;
    let maps = table.maps_for_stacks(tgid);
    let mapped = table.get(tgid).map(|p| &p.mapped);
    names.prepare_user(&stacks::lookup_addrs(&ips).collect::<Vec<_>>(), &maps, table.root_of(tgid));
    let frames = match (native, mapped) {
        (Some(n), _) => stacks::native_frames(&ips, n.cut.as_ref(), names, &maps, None).0,
        (None, Some(mapped)) => stacks::user_frames(&ips, names, &maps, mapped, None).0,
        (None, None) => Vec::new(),
    };
    let mut frames = frames.iter().map(ToString::to_string).collect();
    frames = with_python(frames, py, tgid, source.python_stack(user_stack).as_ref());
    if user_stack == STACK_ID_LOST {
        frames.push("[no user stack]".into());
    }
    frames.push(format!("[{}]", call_name(call)));
    frames
}

/// Native frames with the Python frames of their stack spliced in.
fn with_python(frames: Vec<String>, py: &CodeCache, tgid: u32, stack: Option<&PyStack>) -> Vec<String> {
    match stack {
        Some(s) => crate::python::splice(frames, &py.segments(tgid, s), s.truncated),
        None => frames,
    }
}

/// The syscall of a call site; `other` for IPIs sent outside any (call
/// `MM_CALLS`: a fault, migration, reclaim), as `ipis_by_call` names them.
fn call_name(call: u32) -> &'static str {
    MM_CALL_NAMES.get(call as usize).copied().unwrap_or("other")
}

/// A call site's frames (`site_frames`) for each unwound stack its
/// frame-pointer stack's samples gave, with the weight its calls and IPIs
/// are shared out by; one with weight 1 when none was unwound.
fn site_variants(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    names: &mut Names,
    key: (u32, u32, i32),
    native: &NativeStacks,
    py: &CodeCache,
) -> Vec<(Vec<String>, u64)> {
    let variants = native.variants(key.0, key.2);
    if variants.is_empty() {
        return vec![(site_frames(table, source, names, key, None, py), 1)];
    }
    variants.iter().map(|(v, n)| (site_frames(table, source, names, key, Some(v), py), *n)).collect()
}

/// Call sites of mmap-family syscalls, symbolized, with calls and IPIs sent
/// (shared out over the unwound stacks of a frame-pointer stack); sites of
/// retired processes were symbolized as they retired (`Symbols`).
pub(crate) fn build_mm_sites(
    raw: Vec<(vmtrace_common::MmStackKey, vmtrace_common::MmStackCounts)>,
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    syms: &mut Symbols,
) -> Vec<MmSite> {
    let mut out = Vec::new();
    for (k, c) in raw {
        let key = (k.tgid, k.call, k.user_stack);
        let variants = syms.site_variants_of(key, table, source, native, py);
        let comm = table.ensure(k.tgid).comm.clone();
        each_site_part(variants, c, |frames, calls, ipis| {
            out.push(MmSite { pid: k.tgid, comm: comm.clone(), frames, calls, ipis });
        });
    }
    out
}

/// A call site's calls and IPIs `c` on its unwound variants: whole on its
/// one stack, else shared out by the variants' weights (a part that gets
/// nothing is left out).
fn each_site_part(
    variants: Vec<(stacks::Frames, u64)>,
    c: vmtrace_common::MmStackCounts,
    mut f: impl FnMut(stacks::Frames, u64, u64),
) {
    if variants.len() == 1 {
        if let Some((frames, _)) = variants.into_iter().next() {
            f(frames, c.calls, c.ipis);
        }
        return;
    }
    let weights: Vec<u64> = variants.iter().map(|(_, n)| *n).collect();
    let (calls, ipis) = (shares(c.calls, &weights), shares(c.ipis, &weights));
    for (i, (frames, _)) in variants.into_iter().enumerate() {
        if calls[i] | ipis[i] == 0 {
            continue;
        }
        f(frames, calls[i], ipis[i]);
    }
}

/// A call site's frames as a storm culprit: the syscall, then the first
/// callers that are not libc's wrappers of it (`__GI_munmap`, `mmap64`, …),
/// which say nothing about who called.
pub(crate) fn culprit_frames(frames: Vec<String>) -> Vec<String> {
    let Some((leaf, callers)) = frames.split_last() else { return frames };
    let mut keep: Vec<String> = callers.to_vec();
    while keep.last().is_some_and(|f| is_syscall_wrapper(f)) {
        keep.pop();
    }
    if keep.is_empty() {
        return frames;
    }
    keep.push(leaf.clone());
    keep
}

/// libc's thin wrappers of the mmap-family syscalls, by name.
fn is_syscall_wrapper(frame: &str) -> bool {
    let name = frame.trim_start_matches('_');
    let name = name.strip_prefix("GI_").unwrap_or(name).trim_start_matches('_');
    let name = name.strip_prefix("libc_").unwrap_or(name);
    let name = name.trim_end_matches("64");
    MM_CALL_NAMES.contains(&name) || matches!(name, "syscall" | "sbrk" | "mmap_internal")
}

/// Storms as summary.json reports them: each with its busiest call site.
pub(crate) fn name_storms(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    native: &NativeStacks,
    py: &CodeCache,
    raw: Vec<RawStorm>,
) -> Vec<Storm> {
    let mut names = Names::default();
    raw.into_iter()
        .map(|s| {
            let top = s.sites.iter().max_by_key(|(_, n)| **n).map(|(site, n)| (*site, *n));
            let (top_stack, top_call, top_share) = match top {
                Some(((call, stack), n)) => (
                    culprit_frames(site_frames(
                        table,
                        source,
                        &mut names,
                        (s.pid, call, stack),
                        native.dominant(s.pid, stack),
                        py,
                    )),
                    call_name(call).to_string(),
                    // Call-site and process totals are read a moment apart.
                    (n as f64 / s.ipis.max(1) as f64).min(1.0),
                ),
                None => (Vec::new(), "other".into(), 0.0),
            };
            Storm {
                pid: s.pid,
                comm: table.ensure(s.pid).comm.clone(),
                start_s: s.start_s,
                end_s: s.end_s,
                peak_per_s: s.peak_per_s.round() as u64,
                shootdowns: s.ipis,
                top_stack,
                top_call,
                top_share,
                malloc_settings: s.malloc.unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(frames: &[&str]) -> Vec<String> {
        frames.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_culprit_starts_past_libcs_syscall_wrappers() {
        let f = v(&["main", "array_dealloc", "__GI___libc_free", "__GI_munmap", "[munmap]"]);
        assert_eq!(culprit_frames(f), v(&["main", "array_dealloc", "__GI___libc_free", "[munmap]"]));
        let f = v(&["main", "outer", "__GI___mmap64", "[mmap]"]);
        assert_eq!(culprit_frames(f), v(&["main", "outer", "[mmap]"]));
        let f = v(&["worker", "__GI_mprotect", "[mprotect]"]);
        assert_eq!(culprit_frames(f), v(&["worker", "[mprotect]"]));
        // Nothing but the wrapper: kept, rather than an empty culprit.
        assert_eq!(culprit_frames(v(&["__GI_munmap", "[munmap]"])), v(&["__GI_munmap", "[munmap]"]));
        assert_eq!(culprit_frames(Vec::new()), Vec::<String>::new());
    }

    /// A live process's key sealed, then counted again after its id's
    /// samples gave another unwound stack: each epoch is shared out by the
    /// weights of its own time, and the two add up to the key's counts.
    #[test]
    fn each_sealing_splits_by_the_unwound_stacks_of_its_time() {
        use crate::collect::fake::{FakeSource, NO_SUCH_PID};
        let (pid, id) = (NO_SUCH_PID + 7, 5);
        let key = StackKey { tgid: pid, user_stack: id, kernel_stack: -1, ..StackKey::default() };
        let c = StackCounts { faults: 8, timed: 8, time_ns: 800, ..StackCounts::default() };
        let (mut table, src, py) = (ProcessTable::default(), FakeSource::new(1), CodeCache::default());
        let mut native = NativeStacks::default();
        let (a, b) = (
            NativeStack { frames: vec![0x1000, 0x2000], cut: None },
            NativeStack { frames: vec![0x1000, 0x3000], cut: None },
        );
        native.add_variant(pid, id, a.clone(), 3);
        let mut syms = Symbols::default();
        syms.seal(vec![(key, c)], true, &mut table, &src, &native, &py);
        // Later samples: b, a third of them.
        native.add_variant(pid, id, b, 1);
        native.add_variant(pid, id, a, 1);
        let fresh = symbolize_counts(vec![(key, c)], &mut table, &src, &native, &py, &mut syms);
        let sealed = syms.sealed_stacks(|p| p == pid, &mut |_| "work".into());
        let faults = |v: &[Stack]| {
            let mut f: Vec<(String, u64)> = v.iter().map(|s| (s.user.join(";"), s.counts.faults)).collect();
            f.sort();
            f
        };
        // Sealed: a alone then; fresh: 2:1 (a:b), not frozen at a alone.
        assert_eq!(faults(&sealed).iter().map(|f| f.1).collect::<Vec<_>>(), [8]);
        assert_eq!(faults(&fresh).iter().map(|f| f.1).sum::<u64>(), 8);
        assert_eq!(fresh.len(), 2, "{fresh:?}");
        assert_eq!(faults(&fresh).iter().map(|f| f.1).max(), Some(6));
        let all: u64 = sealed.iter().chain(&fresh).map(|s| s.counts.time_ns).sum();
        assert_eq!(all, 1600);
        assert_eq!((syms.sealed().keys, syms.sealed().sizes()), (1, (1, 1)));
        // Sealed again with today's weights: added to the same shapes by what they show.
        syms.seal(vec![(key, c)], true, &mut table, &src, &native, &py);
        let sealed = syms.sealed_stacks(|_| true, &mut |_| "work".into());
        assert_eq!(sealed.iter().map(|s| s.counts.faults).sum::<u64>(), 16);
        assert_eq!(syms.sealed().sizes(), (1, 2));
        syms.forget(&[pid].into_iter().collect());
        assert_eq!(syms.sealed().sizes(), (0, 0));
    }

    /// One stack keyed by many leaf blocks (an owner per 64 KiB block),
    /// given again and again: one entry per distinct block, each with the
    /// stack's frames and its own leaf.
    #[test]
    fn a_stack_over_many_leaf_blocks_gives_one_entry_per_block() {
        use crate::collect::fake::{FakeSource, NO_SUCH_PID};
        let (pid, id) = (NO_SUCH_PID + 7, 5);
        let (mut table, mut src, py) = (ProcessTable::default(), FakeSource::new(1), CodeCache::default());
        src.user_stacks.insert(id, vec![0x1000, 0x2000]);
        let native = NativeStacks::default();
        let mut names = Names::default();
        let blocks = 5000u64;
        let keys: Vec<SymKey> = (0..4 * blocks).map(|i| (pid, id, -1, blocks - i % blocks)).collect();
        let out = symbolize_keys(keys, &mut names, &mut table, &src, &native, &py);
        assert_eq!(out.len(), blocks as usize);
        assert!((1..=blocks).all(|b| out.get(&(pid, id, -1, b)).is_some_and(|s| s.variants.len() == 1 && !s.split)));
        let frames = |b: u64| out[&(pid, id, -1, b)].variants[0].0.user.clone();
        assert_eq!(frames(1), frames(blocks));
    }

    #[test]
    fn the_lightest_sealed_shapes_add_into_one() {
        let mut sealed = Sealed::default();
        let t = |leaf: &str| Template {
            user: vec![stacks::Frame::from("main"), stacks::Frame::from(leaf)].into(),
            kernel: Vec::new().into(),
            leaf: None,
            unwound: None,
            python: false,
            python_unnamed: false,
            user_missing: false,
            user_cut: false,
        };
        for i in 0..20u64 {
            sealed.add(1, &t(&format!("f{i}")), StackCounts { faults: i + 1, ..StackCounts::default() }, 0);
        }
        sealed.compact(1, 5);
        let out = sealed.stacks_of(|_| true, &mut |_| "x".into()).collect::<Vec<_>>();
        assert_eq!(out.len(), 6);
        assert_eq!(out.iter().map(|s| s.counts.faults).sum::<u64>(), (1..=20).sum::<u64>());
        let lighter = out.iter().find(|s| &*s.user[0] == stacks::native::LIGHTER).unwrap();
        assert_eq!(lighter.counts.faults, (1..=15).sum::<u64>());
        assert_eq!(sealed.lightened, 15);
    }

    #[test]
    fn counts_are_shared_out_whole() {
        let c = StackCounts { faults: 10, major: 1, time_ns: 1001, timed: 10, cow: 0 };
        let parts = split_counts(&c, &[3, 1]);
        assert_eq!(parts.iter().map(|p| p.faults).sum::<u64>(), 10);
        assert_eq!(parts.iter().map(|p| p.time_ns).sum::<u64>(), 1001);
        assert_eq!(parts.iter().map(|p| p.major).sum::<u64>(), 1);
        assert_eq!(parts[0].faults, 8);
    }
}
