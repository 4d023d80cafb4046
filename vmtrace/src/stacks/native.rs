//! Native stacks: the kernel's copied user stacks (`StackSample` records),
//! unwound as they arrive with the objects' call-frame information
//! (`unwind`), while the process and its maps are still there.
//!
//! A sample refines the frame-pointer stack id the kernel counted its event
//! under: one id can stand for many real stacks (code without frame pointers
//! ends the walk at its leaf), so each id keeps how often each unwound stack
//! was seen, and the counts of the id are shared out in those proportions
//! (`shares`): exact in events for the faults and calls whose sample arrived,
//! an estimate for latency and majors when an id mixes several stacks.
use crate::hash::HashMap;
use crate::hash::ShrinkSparse as _;
use std::{fmt::Write as _, time::Instant};

use vmtrace_common::{StackSampleHead, STACK_ID_LOST};

use super::unwind::{AddressSpace, Regs, Sample, Stop, Unwinder};
use crate::procmaps::Region;

/// How an unwound stack ended: `None` at a thread root, else why it was cut
/// (a name for summary.json and a marker frame).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cut {
    pub reason: &'static str,
    pub marker: String,
}

/// The why of a cut, as summary.json's `stacks.cut` counts it.
fn reason(stop: &Stop) -> &'static str {
    use super::unwind::Code;
    match stop {
        Stop::Root => "root",
        Stop::WindowEnd { .. } => "window_exhausted",
        Stop::NoUnwindInfo { code: Code::Anonymous, .. } => "jit_code",
        Stop::NoUnwindInfo { code: Code::Vdso, .. } => "vdso",
        Stop::NoUnwindInfo { .. } => "no_unwind_info",
        Stop::LeftCode { .. } => "left_code",
        Stop::Error(_) => "unwind_error",
        Stop::MaxFrames => "too_many_frames",
    }
}

/// One unwound user stack: return addresses innermost first (`frames[0]` the
/// instruction pointer), and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NativeStack {
    pub frames: Vec<u64>,
    pub cut: Option<Cut>,
}

/// An address space built from the maps read at `maps_read`.
struct Space {
    maps_read: Option<Instant>,
    addresses: AddressSpace,
    /// Whether a walk that left code logged this space (once per space).
    logged: bool,
}

/// Distinct unwound stacks held (all processes) before the lightest are
/// added into one `[lighter stacks]` stack per id ([`NativeStacks::compact`]):
/// a compiler beside the recording (rustc, no frame pointers: its faults'
/// frame-pointer walks end at the leaf, so one id stands for thousands of
/// deep stacks) held 14 MB of them after two minutes. ~300 bytes each.
const MAX_UNWOUND: usize = 16_384;
/// Distinct stacks one id holds before its lightest half is added up: the
/// search for a sample's stack among its id's stays short.
const MAX_PER_ID: usize = 1024;
/// The marker and `stacks.cut` reason of stacks added up by `compact` (the
/// folded processes' bound, `collect::folded`, uses the same marker).
pub const LIGHTER: &str = "[lighter stacks]";
pub const LIGHTER_REASON: &str = "lighter_stacks";

/// The first id of an unwound stack pinned to the pages it faulted in
/// ([`NativeStacks::pin`]); later ones count down from it. Below every id
/// the kernel gives (`STACK_ID_NONE`, `STACK_ID_LOST` are -1 and -2).
pub const PINNED_FIRST: i32 = -16;

/// Distinct pinned stacks held (all processes): past this, a page is owned
/// by its frame-pointer id's mix as before.
const MAX_PINNED: usize = 65_536;

/// Whether `id` is a pinned stack's (`NativeStacks::pin`).
pub fn is_pinned(id: i32) -> bool {
    id <= PINNED_FIRST
}

/// A pinned stack: the frame-pointer id it refines, and the stack with
/// weight 1 (as `NativeStacks::variants` gives stacks).
type Pinned = (i32, [(NativeStack, u64); 1]);

/// Unwound stacks of every traced process, by (tgid, frame-pointer id).
#[derive(Default)]
pub struct NativeStacks {
    unwinder: Option<Unwinder>,
    spaces: HashMap<u32, Space>,
    by_id: HashMap<(u32, i32), Vec<(NativeStack, u64)>>,
    /// The unwound stacks of single faults on pages of the resident sample
    /// (copies with `StackSampleHead::addr`), by (tgid, pinned id): each the
    /// frame-pointer id it refines and the stack (weight 1). A page is owned
    /// by its own fault's stack, not by its id's mix over the whole run.
    pinned: HashMap<(u32, i32), Pinned>,
    /// The pinned ids of each (tgid, frame-pointer id): one per distinct stack.
    pins_of: HashMap<(u32, i32), Vec<i32>>,
    /// The next pinned id (counting down).
    next_pin: i32,
    /// Distinct stacks in `by_id`, `[lighter stacks]` ones not counted (at
    /// most one per id).
    held: usize,
    /// Samples unwound, and records too short to read.
    pub samples: u64,
    pub malformed: u64,
    /// Distinct stacks added into a `[lighter stacks]` stack.
    pub lightened: u64,
}

/// What `add` needs of a process: its maps and when they were read, and a
/// way to read them again (a library loaded since).
pub trait ProcessMaps {
    fn maps(&mut self, tgid: u32) -> (&[Region], Option<Instant>);
    fn refresh(&mut self, tgid: u32);
    /// Its root held open when it is in a container or chroot
    /// (`procmaps::root`); none: its paths are as here.
    fn root(&self, tgid: u32) -> Option<std::sync::Arc<crate::procmaps::root::RootDir>>;
}

/// A copy taken for a fault on a page of the resident sample, unwound: the
/// page (`addr`, in `tgid`) is owned by the pinned stack `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePin {
    pub tgid: u32,
    pub addr: u64,
    pub id: i32,
}

impl NativeStacks {
    /// Unwinds one `StackSample` record and counts its stack under its id
    /// (unless it weighs 0: a copy for its page alone). A copy taken for a
    /// page of the resident sample also pins its stack for that page.
    pub fn add(&mut self, bytes: &[u8], procs: &mut impl ProcessMaps) -> Option<PagePin> {
        let head_len = std::mem::size_of::<StackSampleHead>();
        let Some(head) = bytes.get(..head_len).map(|b| {
            // SAFETY: length checked; the head is Pod (plain integers).
            unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<StackSampleHead>()) }
        }) else {
            self.malformed += 1;
            return None;
        };
        let Some(stack) = bytes.get(head_len..head_len + head.len as usize) else {
            self.malformed += 1;
            return None;
        };
        if head.user_stack < 0 {
            return None;
        }
        let sample = Sample { regs: Regs { ip: head.ip, sp: head.sp, bp: head.bp, lr: head.lr }, stack };
        let (mut unwound, mut covered) = self.unwind(head.tgid, &sample, procs);
        // Code mapped since the maps were read (a library loaded, JIT code)
        // is missing from the space: read them again (`refresh` limits how
        // often) and retry.
        if !covered || matches!(unwound.stop, Stop::NoUnwindInfo { .. } | Stop::LeftCode { .. }) {
            procs.refresh(head.tgid);
            (unwound, covered) = self.unwind(head.tgid, &sample, procs);
            if let Stop::LeftCode { addr } = unwound.stop {
                self.log_space(head.tgid, addr, procs);
            }
        }
        self.samples += 1;
        let stop = unwound.stop;
        let cut = if covered {
            (stop != Stop::Root).then(|| Cut { reason: reason(&stop), marker: stop.marker().unwrap_or_default() })
        } else {
            Some(Cut { reason: "unmapped_code", marker: "[unmapped code]".into() })
        };
        let native = NativeStack { frames: unwound.frames.into_boxed_slice().into_vec(), cut };
        let pin = (head.addr != 0).then(|| self.pin(head.tgid, head.user_stack, &native)).flatten().map(|id| PagePin {
            tgid: head.tgid,
            addr: head.addr,
            id,
        });
        if head.weight > 0 {
            self.count(head.tgid, head.user_stack, native, u64::from(head.weight));
        }
        pin
    }

    /// Counts `weight` events of `native` under `(tgid, user_stack)`.
    fn count(&mut self, tgid: u32, user_stack: i32, native: NativeStack, weight: u64) {
        let seen = self.by_id.entry((tgid, user_stack)).or_default();
        if let Some((_, n)) = seen.iter_mut().find(|(s, _)| *s == native) {
            *n += weight;
            return;
        }
        seen.push((native, weight));
        self.held += 1;
        if seen.len() > MAX_PER_ID {
            let n = lighten(seen, MAX_PER_ID / 2);
            self.lightened += n;
            self.held -= n as usize;
        }
        if self.held > MAX_UNWOUND {
            self.compact();
        }
    }

    /// The pinned id of `native` under `(tgid, user_stack)`, made at need:
    /// one per distinct stack; `None` past the bounds (`MAX_PINNED`, or
    /// `MAX_PER_ID` for one frame-pointer id).
    pub fn pin(&mut self, tgid: u32, user_stack: i32, native: &NativeStack) -> Option<i32> {
        let ids = self.pins_of.entry((tgid, user_stack)).or_default();
        if let Some(&id) = ids.iter().find(|id| self.pinned.get(&(tgid, **id)).is_some_and(|p| p.1[0].0 == *native)) {
            return Some(id);
        }
        if ids.len() >= MAX_PER_ID || self.pinned.len() >= MAX_PINNED {
            return None;
        }
        if self.next_pin > PINNED_FIRST || self.next_pin == 0 {
            self.next_pin = PINNED_FIRST;
        }
        let id = self.next_pin;
        self.next_pin = id.checked_sub(1)?;
        ids.push(id);
        self.pinned.insert((tgid, id), (user_stack, [(native.clone(), 1)]));
        Some(id)
    }

    /// The frame-pointer id a pinned id refines (`pin`); any other id as it is.
    pub fn original(&self, tgid: u32, id: i32) -> i32 {
        if is_pinned(id) {
            self.pinned.get(&(tgid, id)).map_or(id, |p| p.0)
        } else {
            id
        }
    }

    /// Keeps the `MAX_UNWOUND / 2` heaviest distinct stacks (by the events
    /// their samples stand for) and adds each id's others into one stack
    /// of its own: its leaf under `[lighter stacks]`, cut for that reason.
    /// An id's counts are shared out in the same proportions as before
    /// among what is left: no event goes missing, the light stacks lose
    /// their callers.
    fn compact(&mut self) {
        let keep = MAX_UNWOUND / 2;
        let mut weights: Vec<u64> =
            self.by_id.values().flatten().filter(|(s, _)| !is_lighter(s)).map(|(_, w)| *w).collect();
        if weights.len() <= keep {
            return;
        }
        let (_, floor, _) = weights.select_nth_unstable_by(keep, |a, b| b.cmp(a));
        let floor = *floor;
        let before = self.held;
        for v in self.by_id.values_mut() {
            let heavier = v.iter().filter(|(s, w)| *w > floor && !is_lighter(s)).count();
            let n = lighten(v, heavier);
            self.lightened += n;
            self.held -= n as usize;
            v.shrink_to_fit();
        }
        log::debug!(target: "vmtrace::release", "unwound stacks: {before} held, {} after adding up the lightest", self.held);
    }

    /// The unwound sample, and whether its leaf is in code the maps know.
    fn unwind(&mut self, tgid: u32, sample: &Sample, procs: &mut impl ProcessMaps) -> (super::unwind::Unwound, bool) {
        let unwinder = self.unwinder.get_or_insert_with(Unwinder::new);
        let maps_read = procs.maps(tgid).1;
        let stale = self.spaces.get(&tgid).is_none_or(|s| s.maps_read != maps_read);
        if stale {
            // Paths in the maps are the process's own: through its root when
            // it lives in another mount namespace or a chroot
            // (`procmaps::root`).
            let root = procs.root(tgid);
            let (maps, maps_read) = procs.maps(tgid);
            let space = unwinder.address_space(maps, root.as_deref());
            self.spaces.insert(tgid, Space { maps_read, addresses: space, logged: false });
        }
        let space = &self.spaces[&tgid].addresses;
        (unwinder.unwind(space, sample), space.covers(sample.regs.ip))
    }

    /// Logs (debug, once per address space) the maps and code ranges a walk
    /// of `tgid` left code in at `addr`: what to compare with the process's
    /// /proc/PID/maps when a return address falls outside them.
    fn log_space(&mut self, tgid: u32, addr: u64, procs: &mut impl ProcessMaps) {
        if !log::log_enabled!(target: "vmtrace::unwind", log::Level::Debug) {
            return;
        }
        let Some(space) = self.spaces.get_mut(&tgid).filter(|s| !s.logged) else { return };
        space.logged = true;
        let mut s = format!("tgid {tgid} left code at {addr:#x}; code ranges:");
        for (start, end, code) in space.addresses.code_ranges() {
            let _ = write!(s, "\n  {start:x}-{end:x} {code:?}");
        }
        let (maps, read) = procs.maps(tgid);
        let _ = write!(s, "\nfrom the maps read {:?} ago:", read.map(|t| t.elapsed()));
        for r in maps {
            let _ = write!(
                s,
                "\n  {:x}-{:x} {} {:x} {:?} {}",
                r.start,
                r.end,
                r.perms.as_str(),
                r.offset,
                r.kind,
                r.path.as_deref().unwrap_or("")
            );
        }
        log::debug!(target: "vmtrace::unwind", "{s}");
    }

    /// The unwound stacks counted under `user_stack` in `tgid`, with how many
    /// events their samples stand for (`StackSampleHead::weight`); empty when none arrived (a whole frame-pointer
    /// chain, copies off, or every sample dropped).
    pub fn variants(&self, tgid: u32, user_stack: i32) -> &[(NativeStack, u64)] {
        if user_stack == STACK_ID_LOST {
            return &[];
        }
        if is_pinned(user_stack) {
            return self.pinned.get(&(tgid, user_stack)).map_or(&[], |p| p.1.as_slice());
        }
        self.by_id.get(&(tgid, user_stack)).map_or(&[], Vec::as_slice)
    }

    /// Counts `weight` more events of `stack` under `user_stack` (tests).
    #[cfg(test)]
    pub fn add_variant(&mut self, tgid: u32, user_stack: i32, stack: NativeStack, weight: u64) {
        let seen = self.by_id.entry((tgid, user_stack)).or_default();
        match seen.iter_mut().find(|(s, _)| *s == stack) {
            Some((_, n)) => *n += weight,
            None => seen.push((stack, weight)),
        }
    }

    /// The stack seen most often under `user_stack` (a storm's culprit).
    pub fn dominant(&self, tgid: u32, user_stack: i32) -> Option<&NativeStack> {
        self.variants(tgid, user_stack).iter().max_by_key(|(_, n)| *n).map(|(s, _)| s)
    }

    /// Forgets the unwound stacks counted under the frame-pointer ids
    /// `ids` (tgid, id) of live processes: ids whose drained stack the
    /// session let go (sealed or swept, `Session::forget_unwound`), which
    /// nothing symbolizes any more. Without it a live process kept an entry
    /// for every id it was ever counted under until its exit (a
    /// `[lighter stacks]` stack at least, once `compact` had run: 4,805 ids
    /// at 10 s, 61,411 at 140 s beside the churn loop, mem32). An id
    /// counted again later is unwound afresh from its new samples. Pinned
    /// stacks stay (their pages name them). Returns how many ids went.
    pub fn forget_ids(&mut self, ids: &[(u32, i32)]) -> usize {
        let mut n = 0;
        for key in ids {
            if let Some(v) = self.by_id.remove(key) {
                self.held -= v.iter().filter(|(s, _)| !is_lighter(s)).count();
                n += 1;
            }
        }
        if n > 0 {
            crate::hash::ShrinkSparse::shrink_if_sparse(&mut self.by_id);
        }
        n
    }

    /// Frame-pointer ids holding unwound stacks (all processes).
    pub fn ids_held(&self) -> usize {
        self.by_id.len()
    }

    /// Forgets a process's address space (it exited: its stacks are unwound
    /// already and keep their addresses; its maps stay in the process table
    /// for symbolization).
    pub fn forget_space(&mut self, tgid: u32) {
        self.spaces.remove(&tgid);
    }

    /// Forgets the unwound stacks of retired processes (their stacks are
    /// symbolized already).
    pub fn forget_retired(&mut self, tgids: &crate::hash::HashSet<u32>) {
        for t in tgids {
            self.spaces.remove(t);
        }
        self.by_id.retain(|(t, _), _| !tgids.contains(t));
        self.pinned.retain(|(t, _), _| !tgids.contains(t));
        self.pins_of.retain(|(t, _), _| !tgids.contains(t));
        self.held = self.by_id.values().flatten().filter(|(s, _)| !is_lighter(s)).count();
        self.shrink();
    }

    /// Gives back what the tables grew to under a burst of processes: a
    /// retain keeps a table's capacity, and `by_id` alone was a 4.3 MB
    /// table after 150 s of the churn loop (heaptrack, mem32).
    fn shrink(&mut self) {
        self.spaces.shrink_if_sparse();
        self.by_id.shrink_if_sparse();
        self.pinned.shrink_if_sparse();
        self.pins_of.shrink_if_sparse();
    }

    /// (frame-pointer ids, distinct unwound stacks held, pinned stacks):
    /// what the weights log prints.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (self.by_id.len(), self.held, self.pinned.len())
    }

    /// Forgets `tgid`'s unwound stacks too (nothing will read them).
    pub fn forget(&mut self, tgid: u32) {
        self.spaces.remove(&tgid);
        self.by_id.retain(|(t, _), _| *t != tgid);
        self.pinned.retain(|(t, _), _| *t != tgid);
        self.pins_of.retain(|(t, _), _| *t != tgid);
        self.held = self.by_id.values().flatten().filter(|(s, _)| !is_lighter(s)).count();
        self.shrink();
    }
}

/// Copied stacks taken out of their ring while the event ring is drained:
/// a page sample whose fault's stack was copied (`PAGE_STACK_COPY`) comes on
/// the event ring, its copy on the samples ring, which is read after it;
/// the loader hands the copy over just before the page (`copy_for`), so
/// the page's owner is its own fault's unwound stack. The others go after
/// the events, in their order, as before (`rest`).
#[derive(Default)]
pub struct PageCopies {
    held: std::collections::VecDeque<Vec<u8>>,
}

/// How far apart a page's fault start and its copy may be (the copy is
/// taken at the fault's start, or at its huge page's allocation).
const COPY_SLACK_NS: u64 = 50_000_000;

/// (tgid, addr, ts) of a copy taken for a page, if `bytes` is one.
fn copy_of_page(bytes: &[u8]) -> Option<(u32, u64, u64)> {
    let head = bytes.get(..std::mem::size_of::<StackSampleHead>()).map(|b| {
        // SAFETY: length checked; the head is Pod (plain integers).
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<StackSampleHead>()) }
    })?;
    (head.hdr.kind == vmtrace_common::EventKind::StackSample as u32 && head.addr != 0).then_some((
        head.tgid,
        head.addr,
        head.hdr.ts_ns,
    ))
}

/// (tgid, addr, ts) of a page sample whose stack was copied, if `bytes` is one.
pub fn page_with_copy(bytes: &[u8]) -> Option<(u32, u64, u64)> {
    use vmtrace_common::{EventKind, PageSample, PAGE_STACK_COPY};
    let ev = bytes.get(..std::mem::size_of::<PageSample>()).map(|b| {
        // SAFETY: length checked; a plain repr(C) record of integers.
        unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<PageSample>()) }
    })?;
    (ev.hdr.kind == EventKind::PageSample as u32 && ev.flags & PAGE_STACK_COPY != 0).then_some((
        ev.tgid,
        ev.addr,
        ev.hdr.ts_ns,
    ))
}

impl PageCopies {
    /// The copy of the page sample `page` (`page_with_copy`): among those
    /// held, else read on from the samples ring (`pull`) until it comes or
    /// the ring is empty (lost to a full ring: the page keeps its id's mix).
    /// Every copy read meanwhile is held.
    pub fn copy_for(
        &mut self,
        (tgid, addr, ts): (u32, u64, u64),
        mut pull: impl FnMut() -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let fits = |b: &[u8]| {
            copy_of_page(b).is_some_and(|(t, a, c)| t == tgid && a == addr && c.abs_diff(ts) < COPY_SLACK_NS)
        };
        if let Some(i) = self.held.iter().position(|b| fits(b)) {
            return self.held.remove(i);
        }
        while let Some(b) = pull() {
            if fits(&b) {
                return Some(b);
            }
            self.held.push_back(b);
        }
        None
    }

    /// The copies held, in ring order (then the ring's own are read).
    pub fn rest(&mut self) -> impl Iterator<Item = Vec<u8>> + '_ {
        self.held.drain(..)
    }
}

fn is_lighter(s: &NativeStack) -> bool {
    s.cut.as_ref().is_some_and(|c| c.reason == LIGHTER_REASON)
}

/// Keeps the `keep` heaviest stacks of one id and adds the others into its
/// `[lighter stacks]` stack (made at need: the id's leaf, which all its
/// stacks share). How many distinct stacks were added.
fn lighten(v: &mut Vec<(NativeStack, u64)>, keep: usize) -> u64 {
    let mut order: Vec<usize> = (0..v.len()).filter(|&i| !is_lighter(&v[i].0)).collect();
    if order.len() <= keep {
        return 0;
    }
    order.sort_by_key(|&i| std::cmp::Reverse(v[i].1));
    let gone: crate::hash::HashSet<usize> = order[keep..].iter().copied().collect();
    let leaf = v[order[keep]].0.frames.first().copied();
    let mut added = 0;
    let mut i = 0;
    v.retain(|(_, w)| {
        let drop = gone.contains(&i);
        i += 1;
        if drop {
            added += w;
        }
        !drop
    });
    match v.iter_mut().find(|(s, _)| is_lighter(s)) {
        Some((_, w)) => *w += added,
        None => v.push((
            NativeStack {
                frames: leaf.into_iter().collect(),
                cut: Some(Cut { reason: LIGHTER_REASON, marker: LIGHTER.into() }),
            },
            added,
        )),
    }
    gone.len() as u64
}

/// `total` shared out in proportion to `weights`, the parts summing to it
/// (largest remainders get the leftover units).
pub fn shares(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u64 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<u128> = weights.iter().map(|&w| u128::from(total) * u128::from(w)).collect();
    let mut parts: Vec<u64> = exact.iter().map(|&e| (e / u128::from(sum)) as u64).collect();
    let mut left = total - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(exact[i] % u128::from(sum)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i] += 1;
        left -= 1;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_sum_to_the_total_in_proportion() {
        assert_eq!(shares(10, &[1, 1]), vec![5, 5]);
        assert_eq!(shares(10, &[3, 1]).iter().sum::<u64>(), 10);
        assert_eq!(shares(7, &[1, 1, 1]).iter().sum::<u64>(), 7);
        assert_eq!(shares(1000, &[3, 1]), vec![750, 250]);
        assert_eq!(shares(5, &[0, 0]), vec![0, 0]);
        assert_eq!(shares(0, &[2, 3]), vec![0, 0]);
    }

    struct NoMaps(Vec<Region>);
    impl ProcessMaps for NoMaps {
        fn maps(&mut self, _: u32) -> (&[Region], Option<Instant>) {
            (&self.0, None)
        }
        fn refresh(&mut self, _: u32) {}
        fn root(&self, _: u32) -> Option<std::sync::Arc<crate::procmaps::root::RootDir>> {
            None
        }
    }

    fn record(tgid: u32, id: i32, ip: u64, stack: &[u8]) -> Vec<u8> {
        let head = StackSampleHead {
            tgid,
            user_stack: id,
            len: stack.len() as u32,
            ip,
            sp: 0x1000,
            weight: 1,
            ..Default::default()
        };
        // SAFETY: a Pod value viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const head).cast::<u8>(), std::mem::size_of::<StackSampleHead>())
        };
        [bytes, stack].concat()
    }

    fn page_record(tgid: u32, id: i32, ip: u64, weight: u32, addr: u64, ts: u64) -> Vec<u8> {
        let mut r = record(tgid, id, ip, &[0; 64]);
        let head = StackSampleHead {
            hdr: vmtrace_common::EventHeader {
                kind: vmtrace_common::EventKind::StackSample as u32,
                size: 0,
                ts_ns: ts,
            },
            tgid,
            user_stack: id,
            len: 64,
            ip,
            sp: 0x1000,
            weight,
            addr,
            ..Default::default()
        };
        // SAFETY: a Pod value viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const head).cast::<u8>(), std::mem::size_of::<StackSampleHead>())
        };
        r[..bytes.len()].copy_from_slice(bytes);
        r
    }

    /// uc30 (mun.c, no frame pointers): one id for site_a's and site_b's
    /// memset. Each page's copy pins its own stack; a copy the thinning
    /// would have left out (weight 0) pins without counting.
    #[test]
    fn a_page_copy_pins_its_own_stack_and_a_weightless_one_is_not_counted() {
        let mut n = NativeStacks::default();
        let mut maps = NoMaps(Vec::new());
        let a = n.add(&page_record(7, 5, 0x400_000, 1, 0x10_000, 1), &mut maps).unwrap();
        let b = n.add(&page_record(7, 5, 0x500_000, 0, 0x20_000, 2), &mut maps).unwrap();
        let a2 = n.add(&page_record(7, 5, 0x400_000, 0, 0x30_000, 3), &mut maps).unwrap();
        assert!(n.add(&page_record(7, 5, 0x400_000, 1, 0, 4), &mut maps).is_none(), "not a page's copy");
        assert_eq!((a.tgid, a.addr, b.addr), (7, 0x10_000, 0x20_000));
        assert!(is_pinned(a.id) && is_pinned(b.id) && a.id != b.id);
        assert_eq!(a2.id, a.id, "one pinned id per distinct stack");
        assert_eq!(n.variants(7, a.id).len(), 1);
        assert_eq!(n.variants(7, a.id)[0].0.frames, [0x400_000]);
        assert_eq!(n.variants(7, b.id)[0].0.frames, [0x500_000]);
        assert_eq!(n.original(7, b.id), 5);
        assert_eq!(n.original(7, 5), 5);
        // Counted: the two weighing 1, both the first stack's.
        assert_eq!(n.variants(7, 5), [(n.variants(7, a.id)[0].0.clone(), 2)]);
        n.forget(7);
        assert!(n.variants(7, a.id).is_empty());
    }

    fn page_event(tgid: u32, addr: u64, ts: u64) -> Vec<u8> {
        let ev = vmtrace_common::PageSample {
            hdr: vmtrace_common::EventHeader {
                kind: vmtrace_common::EventKind::PageSample as u32,
                size: 48,
                ts_ns: ts,
            },
            tgid,
            flags: vmtrace_common::PAGE_STACK_COPY,
            addr,
            user_stack: 5,
            kernel_stack: -1,
            cpu: 0,
            _pad: 0,
        };
        // SAFETY: a Pod value viewed as its bytes.
        unsafe { std::slice::from_raw_parts((&raw const ev).cast::<u8>(), std::mem::size_of_val(&ev)) }.to_vec()
    }

    #[test]
    fn a_page_gets_its_own_copy_from_the_samples_ring_and_the_rest_keep_their_order() {
        let mut ring: std::collections::VecDeque<Vec<u8>> = [
            record(7, 9, 0x100, &[0; 8]),
            page_record(7, 5, 0x400_000, 1, 0x20_000, 10),
            page_record(7, 5, 0x500_000, 1, 0x10_000, 20),
            page_record(8, 5, 0x600_000, 1, 0x10_000, 30),
        ]
        .into();
        let mut c = PageCopies::default();
        let page = page_with_copy(&page_event(7, 0x10_000, 25)).unwrap();
        let got = c.copy_for(page, || ring.pop_front()).unwrap();
        assert_eq!(got, page_record(7, 5, 0x500_000, 1, 0x10_000, 20));
        // Held: the ones read on the way, found without reading further.
        let got = c.copy_for(page_with_copy(&page_event(7, 0x20_000, 12)).unwrap(), || ring.pop_front()).unwrap();
        assert_eq!(got, page_record(7, 5, 0x400_000, 1, 0x20_000, 10));
        assert_eq!(ring.len(), 1);
        // Lost (or too far in time): none, and the ring read to its end.
        assert!(c.copy_for((7, 0x30_000, 40), || ring.pop_front()).is_none());
        assert!(c.copy_for((8, 0x10_000, 30 + COPY_SLACK_NS), || None).is_none());
        let rest: Vec<Vec<u8>> = c.rest().collect();
        assert_eq!(rest, [record(7, 9, 0x100, &[0; 8]), page_record(8, 5, 0x600_000, 1, 0x10_000, 30)]);
        assert!(page_with_copy(&record(7, 9, 0x100, &[0; 8])).is_none());
    }

    #[test]
    fn samples_of_one_id_are_counted_per_unwound_stack_and_short_records_are_malformed() {
        let mut n = NativeStacks::default();
        let mut maps = NoMaps(Vec::new());
        n.add(&record(7, 5, 0x400_000, &[0; 64]), &mut maps);
        n.add(&record(7, 5, 0x400_000, &[0; 64]), &mut maps);
        n.add(&record(7, 5, 0x500_000, &[0; 64]), &mut maps);
        n.add(&record(7, 5, 0x500_000, &[0; 8])[..60], &mut maps);
        assert_eq!((n.samples, n.malformed), (3, 1));
        let v = n.variants(7, 5);
        assert_eq!(v.len(), 2);
        assert_eq!(n.dominant(7, 5).map(|s| s.frames[0]), Some(0x400_000));
        // No code mapped at all: the leaf is kept, the stack is marked cut.
        assert!(v
            .iter()
            .all(|(s, _)| s.frames.len() == 1 && s.cut.as_ref().is_some_and(|c| c.reason == "unmapped_code")));
        assert!(n.variants(7, 6).is_empty());
    }

    #[test]
    fn the_lightest_stacks_of_an_id_add_into_one_and_every_event_still_counts() {
        let mut n = NativeStacks::default();
        let mut maps = NoMaps(Vec::new());
        // Ten heavy stacks (5 samples each), then light ones until the id overflows.
        for i in 0..10u64 {
            for _ in 0..5 {
                n.add(&record(7, 5, 0x400_000 + i * 16, &[0; 64]), &mut maps);
            }
        }
        let light = MAX_PER_ID as u64 + 100;
        for i in 0..light {
            n.add(&record(7, 5, 0x800_000 + i * 16, &[0; 64]), &mut maps);
        }
        let v = n.variants(7, 5);
        assert!(v.len() <= MAX_PER_ID, "{}", v.len());
        assert_eq!(v.iter().map(|(_, w)| w).sum::<u64>(), 50 + light, "no event lost");
        for i in 0..10u64 {
            assert!(v.iter().any(|(s, w)| s.frames == [0x400_000 + i * 16] && *w == 5), "heavy stack {i} kept whole");
        }
        let lighter: Vec<_> = v.iter().filter(|(s, _)| is_lighter(s)).collect();
        assert_eq!(lighter.len(), 1);
        assert_eq!(lighter[0].0.cut.as_ref().map(|c| c.marker.as_str()), Some(LIGHTER));
        assert_eq!(n.lightened as usize + v.len() - 1, 10 + light as usize);
    }

    #[test]
    fn past_the_bound_only_the_heaviest_unwound_stacks_stay_whole() {
        let mut n = NativeStacks::default();
        let mut maps = NoMaps(Vec::new());
        // One heavy stack in each of 100 ids, then light ones in others.
        for id in 0..100 {
            for _ in 0..3 {
                n.add(&record(7, id, 0x400_000 + id as u64 * 16, &[0; 64]), &mut maps);
            }
        }
        let light = MAX_UNWOUND as i32 + 10;
        for id in 100..100 + light {
            n.add(&record(7, id, 0x400_000 + id as u64 * 16, &[0; 64]), &mut maps);
        }
        assert!(n.held <= MAX_UNWOUND, "{}", n.held);
        assert!(n.lightened > 0);
        for id in 0..100 {
            assert_eq!(
                n.variants(7, id),
                [(
                    NativeStack { frames: vec![0x400_000 + id as u64 * 16], cut: n.variants(7, id)[0].0.cut.clone() },
                    3
                )]
            );
            assert!(!is_lighter(&n.variants(7, id)[0].0));
        }
        let total: u64 = (0..100 + light).map(|id| n.variants(7, id).iter().map(|(_, w)| w).sum::<u64>()).sum();
        assert_eq!(total, 300 + light as u64, "no event lost");
    }
}
