//! Resident memory by call site. The kernel keeps each address space's exact
//! resident counters (`probes/rss.rs`); the fault path streams every fault
//! on a page of the address sample (1 in N pages by a hash of the virtual
//! page address, `vmtrace_common::page_sampled`) and every huge-page fault,
//! with its stack (`PageSample`). Here each such page is owned by its stack
//! until the memory is given back (munmap, mremap, madvise
//! DONTNEED/REMOVE, brk shrink, exec, exit); a later fault on the same
//! page (a copy-on-write copy) takes it over. Pages given back with
//! MADV_FREE stay, marked lazily freed (`Owner::lazy`): the kernel counts
//! them resident until it reclaims them. The sample being of addresses,
//! a fork child's copy of a sampled page always lands on a page the parent
//! sampled too. The live set of a process is
//! snapshotted at its peaks (as the kernel reports them) and at its end,
//! and the snapshot is scaled to the kernel's exact totals when the
//! profiles are written.
use crate::hash::HashMap;
use crate::hash::ShrinkSparse as _;
use std::collections::BTreeMap;

use vmtrace_common::{
    page_sampled, EventKind, MmCall, MmEvent, OomEvent, PageSample, RssEvent, RssMm, TaskEvent, LEAF_BLOCK_SHIFT,
    PAGE_COPIED, PAGE_COW, PAGE_EXACT, PAGE_HUGE, PAGE_WRITE, RSS_ANON, RSS_ENDED, RSS_FILE, RSS_MEMBERS, RSS_SHMEM,
};

/// Sampled pages followed at once over all processes (~48 bytes each): at
/// 1 in 64 faults, 64 GiB of resident memory.
pub(crate) const MAX_LIVE_PAGES: usize = 262_144;

/// How long an address space's counters stay in the kernel map after its
/// teardown began (or, never claimed by a process, after it was first seen).
const FORGET_AFTER_NS: u64 = 2_000_000_000;

/// OOM victims whose live set is kept (a system-wide recording may see
/// many kills; the first ones are usually the story).
pub(crate) const MAX_OOM_SNAPSHOTS: usize = 32;

/// Who brought a page in: the fault's stacks, whether the stack was of the
/// exact stratum (it stands for itself), and whether the page came from the
/// parent at fork and was never written since (still shared with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(clippy::struct_excessive_bools, reason = "independent facts about one page's owner, each read on its own")]
pub(crate) struct Owner {
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub exact: bool,
    pub inherited: bool,
    /// Given back with MADV_FREE and not faulted in again since: the
    /// kernel still counts it resident until reclaim takes it, which only
    /// the anon counter's drop tells (`scaled`: these go first).
    pub lazy: bool,
    /// `address >> LEAF_BLOCK_SHIFT`: the region leaf where asked for.
    pub leaf_block: u64,
    /// Which of the kernel's counters the page is in (`RSS_ANON`,
    /// `RSS_FILE`, `RSS_SHMEM`), from its mapping: each kind's pages are
    /// scaled to that counter.
    pub kind: u8,
    /// The process whose fault this stack is: its maps and unwound stacks
    /// name it. A fork child's inherited pages stay its parent's (uc30: a
    /// child's shared part was named with the child's own stacks, under a
    /// function that never touched it).
    pub stack_pid: u32,
    /// The unwound stack of the page's own fault (`NativeStacks::pin`, an id
    /// of `stack_pid`'s), where its stack was copied; 0: none, the page is
    /// owned by its frame-pointer id's mix of unwound stacks over the run.
    /// Code without frame pointers gives one id to every call site of a
    /// leaf (memset): the mix put freed memory, and other sites' pages,
    /// under the sites that kept memory (uc30).
    pub pinned: i32,
    /// Its stacks were symbolized into an owner shape (its fault's key
    /// sealed, or its process released): `user_stack` is the shape's id
    /// (`symbols::Symbols::owner_shapes`), `kernel_stack` `STACK_ID_NONE`,
    /// and no drained stack is held for it.
    pub shape: bool,
}

impl Owner {
    /// The stack key its pages are symbolized under: the pinned stack where
    /// there is one, in the process whose fault it was. An owner shape has
    /// no process's context: its shape id, under the row's process.
    fn stack(&self, row_pid: u32) -> (u32, i32) {
        if self.shape {
            return (row_pid, self.user_stack);
        }
        let pid = if self.stack_pid == 0 { row_pid } else { self.stack_pid };
        (pid, if self.pinned != 0 { self.pinned } else { self.user_stack })
    }
}

/// The counter a page faulted in at `addr` lands in, from the process's
/// mappings: pages of shared file mappings and read-only private ones are
/// file pages (a read fault maps up to 16 of them: fault-around); in a
/// writable private file mapping a read (`read`: the fault was known not to
/// be a write) maps the file's page too, and a write a copy, anonymous (a
/// checkpoint `torch.load(mmap=True)` maps `rw-p` and only reads: its pages
/// are file memory; its 128 MiB were put among the anonymous pages, at one
/// page each instead of their fault-around window); tmpfs, memfd and SysV
/// segments mapped shared are shmem (mapped private, shmem when read); the
/// rest is anonymous, as is an address no known mapping holds.
pub(crate) fn page_kind(p: &super::process::ProcInfo, addr: u64, read: bool) -> u8 {
    use crate::model::RegionKind;
    // The last maps read first: regions gone since are kept among the
    // announced ones, whose range a later mapping may have taken.
    let at = p.maps.partition_point(|r| r.end <= addr);
    let region = p.maps.get(at).filter(|r| r.contains(addr)).or_else(|| p.mapped.find(addr));
    let Some(r) = region else { return RSS_ANON as u8 };
    let perm = |i: usize, c: u8| r.perms.as_bytes().get(i) == Some(&c);
    let kind = match r.kind {
        RegionKind::Shmem if read || perm(3, b's') || !perm(1, b'w') => RSS_SHMEM,
        RegionKind::File if read || perm(3, b's') || !perm(1, b'w') => RSS_FILE,
        _ => RSS_ANON,
    };
    kind as u8
}

#[derive(Clone, Copy, Debug)]
struct Page {
    bytes: u64,
    owner: Owner,
}

/// A process's sampled pages at one moment, by owner: (bytes, pages).
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    /// The kernel's counters then (`RSS_*` members), bytes.
    pub size: [u64; 4],
    pub ts_ns: u64,
    pub by_owner: BTreeMap<Owner, (u64, u64)>,
    /// The address sample's period (1 in N pages): what a sampled page
    /// stands for, so that lazily freed pages can be counted against the
    /// rest (`scaled`). 0: unknown.
    pub period: u32,
}

impl Snapshot {
    pub(crate) fn resident(&self) -> u64 {
        RssMm::resident(&self.size)
    }
}

#[derive(Debug, Default)]
struct Proc {
    live: BTreeMap<u64, Page>,
    brk: Option<u64>,
    peak: Option<Snapshot>,
    end: Option<Snapshot>,
    /// The kernel's counters of its current address space, as last read.
    kernel: Option<RssMm>,
    /// Its `mm_id`: a later read of the same address space replaces it.
    kernel_mm: Option<u32>,
    /// `/proc/PID/status` read once for an address space that existed
    /// before it was first seen (`RSS_OWN_FIRST`), by `mm_id`: its members
    /// no event changed, and its `VmHWM` (`None`: the read failed).
    status: Option<(u32, Option<StatusFill>)>,
    exited: bool,
    /// The last ranges given back, with when the call returned: a page
    /// whose fault began before that cannot still be there.
    given_back: std::collections::VecDeque<(u64, u64, u64)>,
    /// The same for the last MADV_FREE ranges: a page whose fault began
    /// before the call is lazily freed, however late its record comes.
    lazy_freed: std::collections::VecDeque<(u64, u64, u64)>,
    /// Its last children, with when each forked: a page of its own whose
    /// record comes after a child's fork (pages and forks come on separate
    /// rings) but faulted before it is the child's too.
    forked: std::collections::VecDeque<(u32, u64)>,
    /// Whether it may hold pages under another process's stacks (a fork
    /// child's inherited pages): `owner_keys` looks at it when that one goes.
    foreign: bool,
}

/// What `/proc/PID/status` gave for an address space first seen mid-life.
#[derive(Clone, Copy, Debug)]
struct StatusFill {
    size: [u64; RSS_MEMBERS],
    hwm: u64,
    /// The members no event had changed when it was read (`RSS_SEEN_SHIFT`).
    unseen: u32,
}

impl StatusFill {
    /// The kernel map's entry `m` with what its events could not tell: an
    /// address space that existed before it was first seen starts in the
    /// map from the member whose event made the entry alone (the classic
    /// tracepoint; the tp_btf program reads them all), and its peak from
    /// then. A member no event changed is what status gave (unchanged
    /// since: each change fires the event), at every moment: in the peak
    /// too. The peak is at least `VmHWM`, the high-water mark since the
    /// address space began (its time unknown).
    fn apply(&self, m: &mut RssMm) {
        use vmtrace_common::{RSS_SEEN_ALL, RSS_SEEN_SHIFT};
        let unseen_now = !m.flags & RSS_SEEN_ALL;
        let mut added = 0;
        for i in 0..RSS_MEMBERS {
            let bit = 1 << (RSS_SEEN_SHIFT + i as u32);
            if unseen_now & bit != 0 {
                m.size[i] = self.size[i];
                m.peak_size[i] = self.size[i];
                if i != vmtrace_common::RSS_SWAP {
                    added += self.size[i];
                }
            }
            // Its teardown began before the member's first event could be
            // seen: the end holds 0 for it.
            if m.flags & RSS_ENDED != 0 && self.unseen & bit != 0 && m.end[i] == 0 {
                m.end[i] = self.size[i];
            }
        }
        m.peak = (m.peak + added).max(RssMm::resident(&m.size));
        if self.hwm > m.peak.max(RssMm::resident(&m.size)) {
            m.peak = self.hwm;
            m.peak_ns = 0;
        }
    }
}

/// `madvise` advice giving pages back lazily (`MmEvent::prot` of a madvise).
const MADV_FREE: u64 = 8;

/// Forks remembered per process (`Proc::forked`).
const FORKS: usize = 16;

/// Ranges given back remembered per process.
const GIVEN_BACK: usize = 32;

/// Everything the resident profiles need at the end, per process.
#[derive(Debug, Default)]
pub(crate) struct ProcResident {
    pub peak: Option<Snapshot>,
    pub end: Option<Snapshot>,
    pub kernel: Option<RssMm>,
    pub exited: bool,
}

#[derive(Debug, Default)]
pub(crate) struct ResidentTracker {
    procs: HashMap<u32, Proc>,
    /// Processes taken out (`take`) whose ended address space the kernel's
    /// counters may still hold for a while: not made an entry again.
    taken: crate::hash::HashSet<u32>,
    live_pages: usize,
    /// The address sample: 1 in `period` pages, by `page_sampled` with `salt`
    /// (the programs' `RESIDENT_SALT`).
    period: u32,
    salt: u64,
    /// Sampled pages streamed, and those not followed (`MAX_LIVE_PAGES`).
    pub sampled_pages: u64,
    pub dropped_pages: u64,
    /// Whether a copy-on-write fault's page sample says if it copied.
    cow_copies_seen: bool,
    /// Whether a page sample says if its fault wrote (`PAGE_WRITE`): not
    /// where the fault start has no access type (arm64's software event).
    writes_seen: bool,
    /// Sampled copy-on-write faults that reused a followed page (its owner kept).
    pub reused_pages: u64,
    /// Each OOM victim's live set at its kill, scaled later to the kernel's
    /// counters the kill reported.
    ooms: Vec<(u32, Snapshot)>,
    /// The kill's sizes (by `RSS_*` member) that this kernel's
    /// `oom:mark_victim` record lacks (before 6.8, all): the sample's own
    /// estimate stands in for them.
    oom_unknown: [bool; RSS_MEMBERS],
}

/// Bytes of a sampled fault's page.
fn page_bytes(flags: u32) -> u64 {
    if flags & PAGE_HUGE != 0 {
        2 << 20
    } else {
        4096
    }
}

impl ResidentTracker {
    /// A tracker of the pages the programs sample: 1 in `period` by the page
    /// hash salted with `salt`.
    pub fn new(period: u32, salt: u64) -> Self {
        Self { period: period.max(1), salt, ..Self::default() }
    }

    /// Takes which of an OOM kill's sizes the kernel's record has from the
    /// offsets the programs read it at (`TP_OFFSETS`).
    pub fn with_oom_sizes(mut self, tp: &vmtrace_common::TpOffsets) -> Self {
        use vmtrace_common::Tp;
        for (kind, field) in [(RSS_ANON, Tp::OomAnonRss), (RSS_FILE, Tp::OomFileRss), (RSS_SHMEM, Tp::OomShmemRss)] {
            self.oom_unknown[kind] = !tp.known(field);
        }
        self
    }

    /// Copy-on-write faults that reused their page are told from copies
    /// (`PAGE_COPIED`; the loader's `cow_copies_seen`).
    pub fn with_cow_copies(mut self, seen: bool) -> Self {
        self.cow_copies_seen = seen;
        self
    }

    /// Page samples say whether their fault wrote (`PAGE_WRITE`).
    pub fn with_writes_seen(mut self, seen: bool) -> Self {
        self.writes_seen = seen;
        self
    }

    /// Whether a sampled fault is known to have only read its page (for
    /// `page_kind`): no write flag, no copy-on-write, where writes are seen.
    pub(crate) fn read_only_fault(&self, flags: u32) -> bool {
        self.writes_seen && flags & (PAGE_WRITE | PAGE_COW) == 0
    }

    /// A sampled fault: its page is the stack's now (a copy-on-write copy
    /// of an inherited page becomes the writer's). A copy-on-write fault
    /// that reused its page allocated nothing: the page stays its owner's,
    /// the process's alone now.
    /// `pinned`: the unwound stack of the page's own fault (`Owner::pinned`).
    pub(crate) fn page(&mut self, ev: &PageSample, kind: u8, pinned: Option<i32>) {
        self.sampled_pages += 1;
        let (period, salt) = (self.period, self.salt);
        let p = self.procs.entry(ev.tgid).or_default();
        let bytes = page_bytes(ev.flags);
        let addr = if ev.flags & PAGE_HUGE != 0 { ev.addr & !(bytes - 1) } else { ev.addr };
        // A fault holds the address space's lock for reading, an munmap for
        // writing: a fault that began before a call that gave its page back
        // ended before it, yet its record may come after the call's (the
        // fault's end is seen late). Its page is gone.
        if p.given_back.iter().any(|&(start, end, ts)| (start..end).contains(&addr) && ev.hdr.ts_ns < ts) {
            return;
        }
        // A fork child faulting again, without a copy, a file or shmem page
        // it inherited: the fork left that mapping's page tables to be
        // faulted again (`dup_mmap`), and the page is the page-cache page
        // its parent maps still (smaps: Shared_Clean in both). It stays
        // inherited, under its parent's stack. (uc32 bug 5: it became the
        // child's own, and `private_bytes` was over the child's
        // Private_Dirty by its refaulted library pages.)
        if kind != RSS_ANON as u8
            && ev.flags & (PAGE_COW | PAGE_HUGE) == 0
            && p.live.get(&addr).is_some_and(|pg| pg.owner.inherited && pg.owner.kind == kind && pg.bytes == bytes)
        {
            return;
        }
        let reused = self.cow_copies_seen && ev.flags & (PAGE_COW | PAGE_COPIED | PAGE_HUGE) == PAGE_COW;
        if let Some(page) = reused.then(|| p.live.get_mut(&addr)).flatten().filter(|page| page.bytes == bytes) {
            // (uc29: a program that wrote its 64 MiB after its fork child
            // exited had it all under the writing function, none under the
            // allocating one.)
            page.owner.inherited = false;
            // Written again: no longer free to reclaim.
            page.owner.lazy = false;
            self.reused_pages += 1;
            return;
        }
        let owner = Owner {
            user_stack: ev.user_stack,
            kernel_stack: ev.kernel_stack,
            // Every huge-page fault is streamed (an exact stack, or the one
            // sampled at its start): a census, each standing for itself. A
            // sampled one scaled like a small page stood for 1 in N faults
            // of 2 MiB (numpy's THP arrays came out 10% too large).
            // (`PAGE_EXACT` is no longer sent; taken as before if it comes.)
            exact: ev.flags & (PAGE_EXACT | PAGE_HUGE) != 0,
            inherited: false,
            lazy: p.lazy_freed.iter().any(|&(start, end, ts)| (start..end).contains(&addr) && ev.hdr.ts_ns < ts),
            leaf_block: addr >> LEAF_BLOCK_SHIFT,
            kind,
            stack_pid: ev.tgid,
            pinned: pinned.unwrap_or(0),
            shape: false,
        };
        if bytes > 4096 {
            // A huge page replaces the small pages it covers.
            let gone = remove_range(&mut p.live, addr, addr + bytes);
            self.live_pages -= gone;
        } else {
            // A small page inside a huge one: the kernel split it (a
            // copy-on-write copy of part of it, in a fork child or its
            // parent). The huge page's other pages are now followed as the
            // sample follows small pages.
            self.live_pages = add(self.live_pages, split_huge(&mut p.live, addr, period, salt));
        }
        let page = Page { bytes, owner };
        let later_forks: Vec<u32> = p.forked.iter().filter(|f| f.1 > ev.hdr.ts_ns).map(|f| f.0).collect();
        self.insert(ev.tgid, addr, page);
        // Faulted before a fork the tracker has seen already: the children
        // forked since hold it too, as their parent's, unless they made it
        // their own or gave it back meanwhile.
        for child in later_forks {
            let Some(c) = self.procs.get_mut(&child).filter(|c| !c.exited && !c.live.contains_key(&addr)) else {
                continue;
            };
            if c.given_back.iter().any(|&(start, end, _)| (start..end).contains(&addr)) {
                continue;
            }
            c.foreign = true;
            self.insert(child, addr, Page { owner: Owner { inherited: true, ..owner }, ..page });
        }
    }

    /// `page` at `addr` in `pid`'s live set, within `MAX_LIVE_PAGES`.
    fn insert(&mut self, pid: u32, addr: u64, page: Page) {
        let p = self.procs.entry(pid).or_default();
        match p.live.insert(addr, page) {
            Some(_) => {}
            None if self.live_pages >= MAX_LIVE_PAGES => {
                p.live.remove(&addr);
                self.dropped_pages += 1;
            }
            None => self.live_pages += 1,
        }
    }

    /// A mapping change: what it gives back leaves the live set.
    pub(crate) fn mm_change(&mut self, ev: &MmEvent) {
        let Some(p) = self.procs.get_mut(&ev.tgid) else {
            if ev.call == MmCall::Brk as u32 {
                self.procs.entry(ev.tgid).or_default().brk = Some(ev.addr);
            }
            return;
        };
        // A huge page given back in part is split first: its pages inside
        // the range leave, the sampled ones outside stay.
        let cuts = match ev.call {
            c if c == MmCall::Munmap as u32 || c == MmCall::Madvise as u32 => {
                vec![ev.addr, ev.addr.saturating_add(ev.len)]
            }
            c if c == MmCall::Mremap as u32 => {
                vec![ev.old_addr, ev.old_addr.saturating_add(ev.old_len), ev.old_addr.saturating_add(ev.len)]
            }
            c if c == MmCall::Brk as u32 => [Some(ev.addr), p.brk].into_iter().flatten().collect(),
            _ => Vec::new(),
        };
        for cut in cuts {
            // The page before the cut: a huge page holding both sides of it.
            let n = split_huge_across(&mut p.live, cut, self.period, self.salt);
            self.live_pages = add(self.live_pages, n);
        }
        let gone = match ev.call {
            c if c == MmCall::Madvise as u32 && ev.prot == MADV_FREE => {
                // The pages stay resident until the kernel reclaims them:
                // marked, not removed. Pages shared with another process
                // (a fork child's inherited ones) the kernel leaves as they
                // are.
                let end = ev.addr.saturating_add(ev.len);
                if p.lazy_freed.len() >= GIVEN_BACK {
                    p.lazy_freed.pop_front();
                }
                p.lazy_freed.push_back((ev.addr, end, ev.hdr.ts_ns));
                for page in p.live.range_mut(ev.addr..end).map(|(_, pg)| pg) {
                    page.owner.lazy |= !page.owner.inherited;
                }
                0
            }
            c if c == MmCall::Munmap as u32 || c == MmCall::Madvise as u32 => {
                if p.given_back.len() >= GIVEN_BACK {
                    p.given_back.pop_front();
                }
                p.given_back.push_back((ev.addr, ev.addr.saturating_add(ev.len), ev.hdr.ts_ns));
                remove_range(&mut p.live, ev.addr, ev.addr.saturating_add(ev.len))
            }
            c if c == MmCall::Mremap as u32 => {
                let old_end = ev.old_addr.saturating_add(ev.old_len);
                let moved: Vec<(u64, Page)> = p.live.range(ev.old_addr..old_end).map(|(a, pg)| (*a, *pg)).collect();
                let n = moved.len();
                for (a, _) in &moved {
                    p.live.remove(a);
                }
                let mut kept = 0;
                for (a, pg) in moved {
                    let off = a - ev.old_addr;
                    if off < ev.len {
                        p.live.insert(ev.addr + off, pg);
                        kept += 1;
                    }
                }
                n - kept
            }
            c if c == MmCall::Brk as u32 => {
                let gone = match p.brk {
                    Some(old) if ev.addr < old => remove_range(&mut p.live, ev.addr, old),
                    _ => 0,
                };
                p.brk = Some(ev.addr);
                gone
            }
            _ => 0,
        };
        self.live_pages -= gone;
    }

    /// Fork: the child starts with its parent's pages, still shared; exec:
    /// a new address space with nothing in it.
    pub(crate) fn task(&mut self, ev: &TaskEvent) {
        match EventKind::from_u32(ev.hdr.kind) {
            Some(EventKind::TaskFork) if ev.tgid != ev.ppid => {
                // The child's own pages may have come first (pages and forks
                // come on separate rings): they stay its own, over what it
                // inherits. An entry of an exited process is another's pid.
                let own = self.procs.remove(&ev.tgid).filter(|c| !c.exited && c.end.is_none());
                if let Some(c) = &own {
                    self.live_pages -= c.live.len();
                }
                let Some(parent) = self.procs.get_mut(&ev.ppid) else {
                    if let Some(c) = own {
                        self.live_pages += c.live.len();
                        self.procs.insert(ev.tgid, c);
                    }
                    return;
                };
                if parent.forked.len() >= FORKS {
                    parent.forked.pop_front();
                }
                parent.forked.push_back((ev.tgid, ev.hdr.ts_ns));
                let room = MAX_LIVE_PAGES.saturating_sub(self.live_pages);
                let mut live = BTreeMap::new();
                for (a, pg) in parent.live.iter().take(room) {
                    live.insert(*a, Page { owner: Owner { inherited: true, ..pg.owner }, ..*pg });
                }
                self.dropped_pages += (parent.live.len() - live.len()) as u64;
                let brk = parent.brk;
                let foreign = !live.is_empty();
                let mut child = Proc { live, brk, foreign, ..Proc::default() };
                if let Some(c) = own {
                    child.live.extend(c.live);
                    child.given_back = c.given_back;
                    child.kernel = c.kernel;
                    child.kernel_mm = c.kernel_mm;
                }
                self.live_pages += child.live.len();
                if let Some(old) = self.procs.insert(ev.tgid, child) {
                    self.live_pages -= old.live.len();
                }
            }
            Some(EventKind::TaskExec) => {
                if let Some(old) = self.procs.insert(ev.tgid, Proc::default()) {
                    self.live_pages -= old.live.len();
                }
            }
            Some(EventKind::TaskExit) if ev.group_dead != 0 => {
                let Some(p) = self.procs.get_mut(&ev.tgid) else { return };
                p.exited = true;
                // Its pages as it exits; the kernel's figures follow with
                // the teardown (`ResidentEnd`), or are read at the end.
                if p.end.is_none() {
                    p.end = Some(snapshot(&p.live, [0; 4], ev.hdr.ts_ns, self.period));
                }
                self.live_pages -= p.live.len();
                p.live = BTreeMap::new();
                // Nothing of it is followed any more (~800 bytes a process).
                p.given_back = std::collections::VecDeque::new();
            }
            _ => {}
        }
    }

    /// A new peak or the start of a teardown, from the kernel.
    pub(crate) fn rss(&mut self, ev: &RssEvent) {
        let period = self.period;
        let p = self.procs.entry(ev.tgid).or_default();
        match EventKind::from_u32(ev.hdr.kind) {
            Some(EventKind::ResidentPeak) => {
                p.peak = Some(snapshot(&p.live, ev.size, ev.hdr.ts_ns, period));
            }
            Some(EventKind::ResidentEnd) => match p.end.as_mut() {
                // Exit already took the pages: the figures complete it.
                Some(e) if e.resident() == 0 => e.size = ev.size,
                _ => p.end = Some(snapshot(&p.live, ev.size, ev.hdr.ts_ns, period)),
            },
            _ => {}
        }
    }

    /// An OOM kill: the victim's pages as it is chosen (in ring order, so
    /// every page it faulted in before is there), with the kernel's counters
    /// the kill reports; where the record has none (before 6.8), the
    /// sample's own estimate (each sampled page standing for `period`), not
    /// a 0 that would scale every page away. Victims with no sampled page
    /// (not traced) are left.
    pub(crate) fn oom_kill(&mut self, ev: &OomEvent) {
        let Some(p) = self.procs.get(&ev.victim_pid).filter(|p| !p.live.is_empty()) else { return };
        if self.ooms.len() >= MAX_OOM_SNAPSHOTS {
            return;
        }
        let mut snap = snapshot(&p.live, [0; RSS_MEMBERS], ev.hdr.ts_ns, self.period);
        for (kind, kb) in [(RSS_FILE, ev.file_rss_kb), (RSS_ANON, ev.anon_rss_kb), (RSS_SHMEM, ev.shmem_rss_kb)] {
            snap.size[kind] = if self.oom_unknown[kind] { sampled_bytes(&snap, kind, self.period) } else { kb * 1024 };
        }
        self.ooms.push((ev.victim_pid, snap));
    }

    /// Takes in the kernel's counters (`RSS_MM`, by `mm_id`) and returns the
    /// entries to delete from the map: address spaces long torn down, and
    /// ones no process claimed.
    pub(crate) fn kernel_counters(&mut self, all: &[(u32, RssMm)], now_ns: u64) -> Vec<u32> {
        let mut forget = Vec::new();
        // The taken processes whose ended address space stays in the map.
        let mut lingering = crate::hash::HashSet::default();
        for (mm_id, m) in all {
            let old = |t: u64| now_ns.saturating_sub(t) > FORGET_AFTER_NS;
            if m.tgid == 0 {
                if old(m.first_ns) {
                    forget.push(*mm_id);
                }
                continue;
            }
            let ended = m.flags & RSS_ENDED != 0;
            if ended && self.taken.contains(&m.tgid) && !self.procs.contains_key(&m.tgid) {
                if old(m.end_ns) {
                    forget.push(*mm_id);
                } else {
                    lingering.insert(m.tgid);
                }
                continue;
            }
            if !ended {
                // The pid reused by a new process.
                self.taken.remove(&m.tgid);
            }
            let p = self.procs.entry(m.tgid).or_default();
            // A process's address space is the one it still runs in, else
            // the last one torn down (an exec tears the old one down; copying
            // the arguments can touch the old one after the new one exists).
            let rank = |k: &RssMm| (k.flags & RSS_ENDED == 0, k.end_ns, k.first_ns);
            if p.kernel_mm == Some(*mm_id) || p.kernel.is_none_or(|k| rank(&k) <= rank(m)) {
                let mut m = *m;
                if let Some((_, Some(fill))) = p.status.filter(|(id, _)| id == mm_id) {
                    fill.apply(&mut m);
                }
                p.kernel = Some(m);
                p.kernel_mm = Some(*mm_id);
            }
            if m.flags & RSS_ENDED != 0 && old(m.end_ns) {
                forget.push(*mm_id);
            }
        }
        self.taken.retain(|t| lingering.contains(t));
        forget
    }

    /// The stacks the snapshots of `pids` hold pages under, as
    /// `symbols::SymKey`s (what the profiles will symbolize); and those
    /// other processes hold in the context of one of `pids` (a fork child's
    /// pages inherited from a parent about to be let go). Owner shapes are
    /// symbolized already.
    pub(crate) fn owner_keys(&self, pids: &crate::hash::HashSet<u32>) -> Vec<super::symbols::SymKey> {
        let mut out = Vec::new();
        let mut key = |pid: u32, o: &Owner| {
            let (stack_pid, user_stack) = o.stack(pid);
            out.push((stack_pid, user_stack, o.kernel_stack, o.leaf_block));
            if o.leaf_block != 0 {
                // The profiles leave the leaf out unless the fault stacks end in one.
                out.push((stack_pid, user_stack, o.kernel_stack, 0));
            }
        };
        for pid in pids {
            let Some(p) = self.procs.get(pid) else { continue };
            for s in [&p.peak, &p.end].into_iter().flatten() {
                for o in s.by_owner.keys().filter(|o| !o.shape) {
                    key(*pid, o);
                }
            }
        }
        for (pid, p) in self.procs.iter().filter(|(pid, p)| p.foreign && !pids.contains(pid)) {
            let snaps = [&p.peak, &p.end].into_iter().flatten().flat_map(|s| s.by_owner.keys());
            for o in p.live.values().map(|page| &page.owner).chain(snaps) {
                if !o.shape && o.stack_pid != *pid && pids.contains(&o.stack_pid) {
                    key(*pid, o);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Each owner, not an owner shape yet, whose user stack `id` picks, of
    /// a page or snapshot of a process `of` picks or named in the context
    /// of one (a fork child's inherited pages, under its parent's stacks:
    /// made shapes while the parent's maps and unwound stacks are there),
    /// as the `symbols::SymKey` (in the context `Owner::stack` names, with
    /// its leaf block) its shape is made from (`rekey`). The OOM victims'
    /// snapshots too.
    pub(crate) fn owners_to_shape(
        &self,
        of: impl Fn(u32) -> bool,
        id: impl Fn(i32) -> bool,
    ) -> crate::hash::HashSet<super::symbols::SymKey> {
        let mut out = crate::hash::HashSet::default();
        let mut add = |row: u32, o: &Owner| {
            if o.shape || !id(o.user_stack) {
                return;
            }
            let (pid, stack) = o.stack(row);
            if of(row) || of(pid) {
                out.insert((pid, stack, o.kernel_stack, o.leaf_block));
            }
        };
        for (pid, p) in self.procs.iter().filter(|(pid, p)| p.foreign || of(**pid)) {
            for page in p.live.values() {
                add(*pid, &page.owner);
            }
            for s in [&p.peak, &p.end].into_iter().flatten() {
                for o in s.by_owner.keys() {
                    add(*pid, o);
                }
            }
        }
        for (pid, s) in &self.ooms {
            for o in s.by_owner.keys() {
                add(*pid, o);
            }
        }
        out
    }

    /// Re-keys the owners `shapes` names (by `owners_to_shape`'s keys) to
    /// their owner shapes: the pages, the snapshots (owners made one add
    /// up) and the OOM victims' snapshots of their processes and of the
    /// processes holding pages in their context. A shape owner keeps no
    /// process context (`stack_pid`, `pinned`: 0), so owners of one shape
    /// add up.
    pub(crate) fn rekey(&mut self, shapes: &HashMap<super::symbols::SymKey, u32>) {
        if shapes.is_empty() {
            return;
        }
        let pids: crate::hash::HashSet<u32> = shapes.keys().map(|k| k.0).collect();
        let to = |row: u32, o: &Owner| -> Option<Owner> {
            if o.shape {
                return None;
            }
            let (pid, stack) = o.stack(row);
            let id = *shapes.get(&(pid, stack, o.kernel_stack, o.leaf_block))?;
            let id = i32::try_from(id).ok()?;
            let kernel_stack = vmtrace_common::STACK_ID_NONE;
            Some(Owner { user_stack: id, kernel_stack, shape: true, stack_pid: 0, pinned: 0, ..*o })
        };
        // Only the owners re-keyed move (a shape owner is never re-keyed, so
        // none moves onto another that moves): rebuilt whole, the snapshots
        // of the processes holding pages in a sealed process's context were
        // most of a sealing's re-keying (perf, the torch job).
        let rekey_snapshot = |pid: u32, s: &mut Snapshot| {
            let moved: Vec<(Owner, Owner)> = s.by_owner.keys().filter_map(|o| Some((*o, to(pid, o)?))).collect();
            for (from, into) in moved {
                let Some((bytes, pages)) = s.by_owner.remove(&from) else { continue };
                let e = s.by_owner.entry(into).or_default();
                e.0 += bytes;
                e.1 += pages;
            }
        };
        for (pid, p) in self.procs.iter_mut().filter(|(pid, p)| p.foreign || pids.contains(pid)) {
            for page in p.live.values_mut() {
                if let Some(o) = to(*pid, &page.owner) {
                    page.owner = o;
                }
            }
            for s in [&mut p.peak, &mut p.end].into_iter().flatten() {
                rekey_snapshot(*pid, s);
            }
        }
        for (pid, s) in &mut self.ooms {
            rekey_snapshot(*pid, s);
        }
    }

    /// The owner shapes the pages and snapshots refer to.
    pub(crate) fn shape_ids(&self) -> crate::hash::HashSet<u32> {
        let snaps = self.procs.values().flat_map(|p| [&p.peak, &p.end].into_iter().flatten());
        let owners = self.procs.values().flat_map(|p| p.live.values().map(|page| &page.owner));
        let owners = owners.chain(snaps.chain(self.ooms.iter().map(|o| &o.1)).flat_map(|s| s.by_owner.keys()));
        owners.filter(|o| o.shape).filter_map(|o| u32::try_from(o.user_stack).ok()).collect()
    }

    /// The user stack ids the pages and snapshots of the processes `of`
    /// picks are owned by (owner shapes hold none), and those of the OOM
    /// victims' snapshots.
    pub(crate) fn stack_ids(&self, of: impl Fn(u32) -> bool) -> crate::hash::HashSet<u32> {
        let mut out = crate::hash::HashSet::default();
        for (_, p) in self.procs.iter().filter(|(pid, _)| of(**pid)) {
            let snaps = [&p.peak, &p.end].into_iter().flatten().flat_map(|s| s.by_owner.keys());
            for o in p.live.values().map(|page| &page.owner).chain(snaps).filter(|o| !o.shape) {
                if let Ok(id) = u32::try_from(o.user_stack) {
                    out.insert(id);
                }
            }
        }
        let ooms = self.ooms.iter().filter(|(pid, _)| of(*pid)).flat_map(|(_, s)| s.by_owner.keys());
        out.extend(ooms.filter(|o| !o.shape).filter_map(|o| u32::try_from(o.user_stack).ok()));
        out
    }

    /// The processes whose address space existed before the map first saw
    /// it (`RSS_OWN_FIRST`: they started before the trace) and whose
    /// `/proc/PID/status` was not read for it yet (`fill_unseen`).
    pub(crate) fn status_wanted(&self) -> Vec<u32> {
        let mut out: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| {
                !p.exited
                    && p.kernel.is_some_and(|k| {
                        k.flags & (RSS_ENDED | vmtrace_common::RSS_OWN_FIRST) == vmtrace_common::RSS_OWN_FIRST
                    })
                    && p.status.map(|(id, _)| id) != p.kernel_mm
            })
            .map(|(pid, _)| *pid)
            .collect();
        out.sort_unstable();
        out
    }

    /// Takes in `pid`'s `/proc/PID/status` (`None`: it could not be read)
    /// for its address space as last read (`status_wanted`): the members
    /// no event changed, and its `VmHWM` as its peak at least.
    pub(crate) fn fill_unseen(&mut self, pid: u32, status: Option<&str>) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let (Some(mm_id), Some(k)) = (p.kernel_mm, p.kernel.as_mut()) else { return };
        let fill = status.and_then(|s| status_counters(pid, s)).map(|m| StatusFill {
            size: m.size,
            hwm: m.peak,
            unseen: !k.flags & vmtrace_common::RSS_SEEN_ALL,
        });
        if let Some(f) = fill {
            f.apply(k);
        }
        p.status = Some((mm_id, fill));
    }

    /// A traced process still running whose address space the kernel map
    /// never held (its resident size did not change while traced: `-p` of
    /// an idle process) gets the kernel's figures from `/proc/PID/status`:
    /// `RssAnon`/`RssFile`/`RssShmem`/`VmSwap` now, `VmHWM` as its peak
    /// (since it started, with no time).
    pub(crate) fn fill_from_status(&mut self, pid: u32, status: &str) -> bool {
        if self.procs.get(&pid).is_some_and(|p| p.kernel.is_some()) {
            return false;
        }
        let Some(m) = status_counters(pid, status) else { return false };
        self.procs.entry(pid).or_default().kernel = Some(m);
        true
    }

    /// Each running process's sampled pages now, with the kernel's counters
    /// of its address space as last read (`kernel_counters`): what `serve`'s
    /// live resident profile scales. Processes that exited, or whose counters
    /// were never read, are left out.
    pub(crate) fn live_snapshots(&self, now_ns: u64) -> Vec<(u32, Snapshot)> {
        let mut out: Vec<(u32, Snapshot)> = self
            .procs
            .iter()
            .filter(|(_, p)| !p.exited)
            .filter_map(|(pid, p)| {
                let k = p.kernel.filter(|k| k.flags & RSS_ENDED == 0)?;
                Some((*pid, snapshot(&p.live, k.size, now_ns, self.period)))
            })
            .collect();
        out.sort_unstable_by_key(|(pid, _)| *pid);
        out
    }

    /// `pid`'s address space's counters as last read (`kernel_counters`).
    pub fn kernel_of(&self, pid: u32) -> Option<RssMm> {
        self.procs.get(&pid).and_then(|p| p.kernel)
    }

    /// Each process's snapshots; processes still running get their end now.
    /// Also the OOM victims' live sets at their kills.
    pub(crate) fn finish(mut self, now_ns: u64) -> (BTreeMap<u32, ProcResident>, ResidentCounts, Vec<(u32, Snapshot)>) {
        let counts = ResidentCounts { sampled_pages: self.sampled_pages, dropped_pages: self.dropped_pages };
        let ooms = std::mem::take(&mut self.ooms);
        let period = self.period;
        let out = self.procs.drain().map(|(pid, p)| (pid, p.ended(now_ns, period))).collect();
        (out, counts, ooms)
    }

    /// Takes `pid`'s snapshots out (an exited process folded away).
    pub(crate) fn take(&mut self, pid: u32, now_ns: u64) -> Option<ProcResident> {
        let p = self.procs.remove(&pid)?;
        self.procs.shrink_if_sparse();
        self.taken.insert(pid);
        Some(p.ended(now_ns, self.period))
    }
}

impl Proc {
    /// Its snapshots, with its end taken now if it has none.
    fn ended(self, now_ns: u64, period: u32) -> ProcResident {
        let mut end = self.end;
        if end.is_none() {
            let size = self.kernel.map_or([0; 4], |k| if k.flags & RSS_ENDED != 0 { k.end } else { k.size });
            end = Some(snapshot(&self.live, size, now_ns, period));
        } else if let (Some(e), Some(k)) = (end.as_mut(), self.kernel) {
            if e.resident() == 0 && k.flags & RSS_ENDED != 0 {
                e.size = k.end;
            }
        }
        ProcResident { peak: self.peak, end, kernel: self.kernel, exited: self.exited }
    }
}

/// A live process's counters as its `/proc/PID/status` gives them (kB
/// lines), in the shape the kernel map's entries have; `None` without
/// `RssAnon` (a kernel thread, or a process gone).
pub(crate) fn status_counters(pid: u32, status: &str) -> Option<RssMm> {
    let kb = |key: &str| super::pinned::status_kb(status, key);
    let mut size = [0; RSS_MEMBERS];
    size[RSS_ANON] = kb("RssAnon")?;
    size[RSS_FILE] = kb("RssFile").unwrap_or(0);
    size[RSS_SHMEM] = kb("RssShmem").unwrap_or(0);
    size[vmtrace_common::RSS_SWAP] = kb("VmSwap").unwrap_or(0);
    let hwm = kb("VmHWM").unwrap_or(0).max(RssMm::resident(&size));
    Some(RssMm { tgid: pid, size, peak: hwm, peak_size: size, ..RssMm::default() })
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ResidentCounts {
    pub sampled_pages: u64,
    pub dropped_pages: u64,
}

/// `n + delta`, never below 0.
fn add(n: usize, delta: isize) -> usize {
    n.saturating_add_signed(delta)
}

/// Small pages of a huge one.
const SMALL_PER_HUGE: u64 = 512;

/// Turns the huge page holding `addr`, if any, into the small pages of it
/// in the address sample (`page_sampled`), each of the same owner but no
/// longer standing for itself: part of it is no longer the huge page's (the
/// kernel split it), and the sample follows its small pages as it follows
/// any. Returns the change in the number of live entries.
fn split_huge(live: &mut BTreeMap<u64, Page>, addr: u64, period: u32, salt: u64) -> isize {
    let Some((&base, &pg)) = live.range(..=addr).next_back() else { return 0 };
    if pg.bytes <= 4096 || addr >= base + pg.bytes {
        return 0;
    }
    live.remove(&base);
    let owner = Owner { exact: false, ..pg.owner };
    let mut n = -1;
    for i in 0..(pg.bytes / 4096).min(SMALL_PER_HUGE) {
        let a = base + i * 4096;
        if page_sampled(a >> 12, salt, period) {
            live.insert(a, Page { bytes: 4096, owner });
            n += 1;
        }
    }
    n
}

/// `split_huge` of the huge page holding both `cut - 4096` and `cut`, if any:
/// a range starting or ending at `cut` takes part of it.
fn split_huge_across(live: &mut BTreeMap<u64, Page>, cut: u64, period: u32, salt: u64) -> isize {
    let Some(before) = cut.checked_sub(4096) else { return 0 };
    match live.range(..=before).next_back() {
        Some((&base, pg)) if pg.bytes > 4096 && base < cut && cut < base + pg.bytes => {
            split_huge(live, before, period, salt)
        }
        _ => 0,
    }
}

/// Removes the pages in `[start, end)`; returns how many.
fn remove_range(live: &mut BTreeMap<u64, Page>, start: u64, end: u64) -> usize {
    if start >= end {
        return 0;
    }
    let keys: Vec<u64> = live.range(start..end).map(|(a, _)| *a).collect();
    for k in &keys {
        live.remove(k);
    }
    keys.len()
}

fn snapshot(live: &BTreeMap<u64, Page>, size: [u64; 4], ts_ns: u64, period: u32) -> Snapshot {
    let mut by_owner: BTreeMap<Owner, (u64, u64)> = BTreeMap::new();
    for pg in live.values() {
        let e = by_owner.entry(pg.owner).or_default();
        e.0 += pg.bytes;
        e.1 += 1;
    }
    Snapshot { size, ts_ns, by_owner, period }
}

/// The bytes of `kind` a snapshot's pages stand for with no kernel total:
/// exact-stratum pages themselves, sampled ones 1 in `period` pages each.
fn sampled_bytes(s: &Snapshot, kind: usize, period: u32) -> u64 {
    s.by_owner
        .iter()
        .filter(|(o, _)| usize::from(o.kind) == kind)
        .map(|(o, v)| if o.exact { v.0 } else { v.0 * u64::from(period) })
        .sum()
}

/// A snapshot's owners weighted to the kernel's totals, kind by kind
/// (anon, file, shmem: a file fault maps up to 16 pages, an anonymous one
/// one, so one kind's sampled pages cannot stand for another's): within a
/// kind, exact-stratum pages stand for themselves and sampled ones share
/// what is left (a ratio estimate, as `stacks::weight` does for faults).
/// Lazily freed pages (MADV_FREE, `Owner::lazy`) are counted as the others
/// while the total holds them all; when it is below what the pages stand
/// for (each sampled one `period` pages), reclaim took lazily freed pages
/// (the kernel drops those first, and vmtrace sees no event for it): they
/// get what the total leaves above the other pages' estimate, down to 0.
/// Returns (owner, bytes, pages) and the bytes no sampled page was left to
/// stand for.
pub(crate) fn scaled(s: &Snapshot) -> (Vec<(Owner, f64, u64)>, f64) {
    // (exact, sampled) factors by kind, of pages kept [0] and lazily freed [1].
    let mut factors = [[(1.0, 0.0); 2]; RSS_MEMBERS];
    let mut unsampled = 0.0;
    let period = f64::from(s.period);
    for kind in [RSS_ANON, RSS_FILE, RSS_SHMEM] {
        let mut total = s.size[kind] as f64;
        let of_kind = || s.by_owner.iter().filter(move |(o, _)| usize::from(o.kind) == kind);
        let stand_for = |lazy: bool| -> f64 {
            let pages = of_kind().filter(|(o, _)| o.lazy == lazy);
            pages.map(|(o, v)| v.0 as f64 * if o.exact { 1.0 } else { period }).sum()
        };
        let (lazy, kept) = (stand_for(true), stand_for(false));
        let lazy_first = s.period > 0 && lazy > 0.0 && total < kept + lazy;
        if lazy_first {
            let f = ((total - kept).max(0.0) / lazy).min(1.0);
            factors[kind][1] = (f, f * period);
            total -= lazy * f;
        }
        let counted = || of_kind().filter(move |(o, _)| !(lazy_first && o.lazy));
        let exact: f64 = counted().filter(|(o, _)| o.exact).map(|(_, v)| v.0 as f64).sum();
        let sampled: f64 = counted().filter(|(o, _)| !o.exact).map(|(_, v)| v.0 as f64).sum();
        // Exact pages beyond the total (counted, then reclaimed) are scaled down.
        let exact_factor = if exact > total && exact > 0.0 { total / exact } else { 1.0 };
        let left = (total - exact * exact_factor).max(0.0);
        factors[kind][0] = (exact_factor, if sampled > 0.0 { left / sampled } else { 0.0 });
        if !lazy_first {
            factors[kind][1] = factors[kind][0];
        }
        if sampled == 0.0 {
            unsampled += left;
        }
    }
    let out = s
        .by_owner
        .iter()
        .map(|(o, v)| {
            let (exact, sampled) = factors[usize::from(o.kind).min(RSS_MEMBERS - 1)][usize::from(o.lazy)];
            (*o, v.0 as f64 * if o.exact { exact } else { sampled }, v.1)
        })
        .filter(|(_, b, _)| *b > 0.0)
        .collect();
    (out, unsampled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtrace_common::EventHeader;

    impl ResidentTracker {
        fn page_anon(&mut self, ev: &PageSample) {
            self.page(ev, RSS_ANON as u8, None);
        }
    }

    fn sample(tgid: u32, addr: u64, stack: i32) -> PageSample {
        PageSample {
            hdr: EventHeader { kind: EventKind::PageSample as u32, size: 48, ts_ns: 1 },
            tgid,
            flags: 0,
            addr,
            user_stack: stack,
            kernel_stack: -1,
            cpu: 0,
            _pad: 0,
        }
    }

    /// A writable private file mapping (a checkpoint `torch.load(mmap=True)`
    /// maps `rw-p`): a read maps the file's page, a write or a COW a copy;
    /// where writes are not seen every fault there is taken for a copy.
    #[test]
    fn a_read_of_a_writable_private_file_mapping_is_file_memory() {
        use crate::{model::RegionKind, procmaps::Region};
        let region = |start: u64, perms: &str, kind| Region {
            start,
            end: start + 0x10000,
            perms: perms.into(),
            offset: 0,
            kind,
            path: Some("/ck.pt".into()),
        };
        let p = super::super::process::ProcInfo {
            maps: vec![
                region(0x10000, "rw-p", RegionKind::File),
                region(0x20000, "r--p", RegionKind::File),
                region(0x30000, "rw-s", RegionKind::File),
                region(0x40000, "rw-p", RegionKind::Shmem),
                region(0x50000, "rw-p", RegionKind::Anon),
            ],
            ..Default::default()
        };
        let (anon, file, shmem) = (RSS_ANON as u8, RSS_FILE as u8, RSS_SHMEM as u8);
        let t = ResidentTracker::new(1, 0);
        assert!(!t.read_only_fault(0), "writes not seen: every fault may have written");
        let t = t.with_writes_seen(true);
        for (flags, read) in [(0, true), (PAGE_WRITE, false), (PAGE_COW, false), (PAGE_WRITE | PAGE_COW, false)] {
            assert_eq!(t.read_only_fault(flags), read, "flags {flags}");
        }
        for (addr, read, kind) in [
            (0x10000, true, file),
            (0x10000, false, anon),
            (0x20000, false, file),
            (0x30000, false, file),
            (0x40000, true, shmem),
            (0x40000, false, anon),
            (0x50000, true, anon),
            (0x90000, true, anon),
        ] {
            assert_eq!(page_kind(&p, addr, read), kind, "{addr:#x} read {read}");
        }
    }

    fn mm(tgid: u32, call: MmCall, addr: u64, len: u64) -> MmEvent {
        MmEvent { prot: 4, ..crate::collect::fake::mm_change(tgid, call, addr, len) }
    }

    fn rss(kind: EventKind, tgid: u32, anon: u64) -> RssEvent {
        RssEvent { hdr: EventHeader { kind: kind as u32, size: 56, ts_ns: 3 }, tgid, mm_id: 7, size: [0, anon, 0, 0] }
    }

    #[test]
    fn an_idle_process_gets_its_figures_from_proc_status() {
        let status = "Name:\tpython3\nVmHWM:\t  104000 kB\nVmRSS:\t   60000 kB\nRssAnon:\t   50000 kB\n\
                      RssFile:\t    9000 kB\nRssShmem:\t    1000 kB\nVmSwap:\t       8 kB\n";
        let mut t = ResidentTracker::new(1, 0);
        assert!(t.fill_from_status(7, status));
        let (procs, _, _) = t.finish(10);
        let p = &procs[&7];
        let end = p.end.as_ref().unwrap();
        assert_eq!(end.size[RSS_ANON], 50_000 * 1024);
        assert_eq!(end.resident(), 60_000 * 1024);
        assert_eq!(p.kernel.unwrap().peak, 104_000 * 1024);
        // The kernel's own counters are not replaced.
        let mut t = ResidentTracker::new(1, 0);
        let _ = t.kernel_counters(&[(1, RssMm { tgid: 7, size: [1, 2, 0, 0], ..RssMm::default() })], 0);
        assert!(!t.fill_from_status(7, status));
        assert!(status_counters(8, "Name:\tkthreadd\n").is_none(), "a kernel thread has no RssAnon");
    }

    #[test]
    fn a_process_first_seen_mid_life_gets_its_unseen_members_and_hwm_from_status() {
        use vmtrace_common::{RSS_OWN_FIRST, RSS_SEEN_ALL, RSS_SEEN_SHIFT};
        let status = "Name:\tfaulter\nVmHWM:\t    2336 kB\nVmRSS:\t    1272 kB\nRssAnon:\t      92 kB\n\
                      RssFile:\t    1180 kB\nRssShmem:\t       0 kB\nVmSwap:\t       0 kB\n";
        // The classic event's entry: made by an anon fault of its own, the
        // file member never seen.
        let anon_seen = RSS_OWN_FIRST | (1 << (RSS_SEEN_SHIFT + RSS_ANON as u32));
        let k = RssMm {
            tgid: 7,
            flags: anon_seen,
            size: [0, 300 << 10, 0, 0],
            peak: 1000 << 10,
            peak_size: [0, 1000 << 10, 0, 0],
            peak_ns: 5,
            first_ns: 1,
            ..RssMm::default()
        };
        let mut t = ResidentTracker::new(1, 0);
        let _ = t.kernel_counters(&[(3, k)], 10);
        assert_eq!(t.status_wanted(), vec![7]);
        t.fill_unseen(7, Some(status));
        assert!(t.status_wanted().is_empty(), "read once per address space");
        let m = t.kernel_of(7).unwrap();
        assert_eq!(m.size, [1180 << 10, 300 << 10, 0, 0], "the anon member is the kernel map's");
        assert_eq!(m.peak, 2336 << 10, "VmHWM: above the trace's peak with the file pages");
        assert_eq!(m.peak_ns, 0, "its time unknown");
        // Every later read gets the same fill, a file change seen replaces it.
        let later = RssMm { size: [0, 400 << 10, 0, 0], peak: 3000 << 10, ..k };
        let _ = t.kernel_counters(&[(3, later)], 20);
        let m = t.kernel_of(7).unwrap();
        assert_eq!(m.size[RSS_FILE], 1180 << 10);
        assert_eq!(m.peak, (3000 + 1180) << 10, "the file pages were there at the trace's peak too");
        let seen = RssMm { flags: anon_seen | (1 << RSS_SEEN_SHIFT), size: [900 << 10, 400 << 10, 0, 0], ..later };
        let _ = t.kernel_counters(&[(3, seen)], 30);
        assert_eq!(t.kernel_of(7).unwrap().size[RSS_FILE], 900 << 10);
        // A teardown whose file event came first: the end holds 0 for it.
        let ended = RssMm { flags: anon_seen | RSS_ENDED, end: [0, 400 << 10, 0, 0], end_ns: 40, ..later };
        let _ = t.kernel_counters(&[(3, ended)], 40);
        assert_eq!(t.kernel_of(7).unwrap().end[RSS_FILE], 1180 << 10);
        // tp_btf: every member read when the entry was made; only VmHWM is wanted.
        let mut t = ResidentTracker::new(1, 0);
        let all = RssMm { flags: RSS_OWN_FIRST | RSS_SEEN_ALL, size: [1180 << 10, 300 << 10, 0, 0], ..k };
        let _ = t.kernel_counters(&[(3, all)], 10);
        t.fill_unseen(7, Some(status));
        let m = t.kernel_of(7).unwrap();
        assert_eq!((m.size, m.peak), ([1180 << 10, 300 << 10, 0, 0], 2336 << 10));
        // A new address space (a fork child, an exec): nothing read.
        let mut t = ResidentTracker::new(1, 0);
        let _ = t.kernel_counters(&[(3, RssMm { flags: anon_seen & !RSS_OWN_FIRST, ..k })], 10);
        assert!(t.status_wanted().is_empty());
    }

    #[test]
    fn a_process_taken_out_is_not_made_again_from_its_ended_address_space() {
        let mut t = ResidentTracker::new(1, 0);
        let live = RssMm { tgid: 7, size: [1, 2, 0, 0], first_ns: 1, ..RssMm::default() };
        let _ = t.kernel_counters(&[(1, live)], 10);
        assert!(t.take(7, 10).is_some());
        // Its ended address space stays in the map for FORGET_AFTER_NS.
        let ended = RssMm { flags: RSS_ENDED, end_ns: 20, ..live };
        assert!(t.kernel_counters(&[(1, ended)], 30).is_empty());
        assert!(t.take(7, 30).is_none(), "not made again");
        assert_eq!(t.kernel_counters(&[(1, ended)], 30 + FORGET_AFTER_NS), vec![1], "forgotten");
        assert!(t.taken.is_empty());
        // The pid reused by a new process.
        let _ = t.kernel_counters(&[(2, RssMm { first_ns: 40, ..live })], 50);
        assert!(t.take(7, 50).is_some());
    }

    #[test]
    fn a_freed_buffer_holds_its_size_at_the_peak_and_nothing_at_the_end() {
        let mut t = ResidentTracker::default();
        for i in 0..10 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
        }
        for i in 0..10 {
            t.page_anon(&sample(5, 0x90_0000 + i * 4096, 2));
        }
        t.rss(&rss(EventKind::ResidentPeak, 5, 20 * 64 * 4096));
        t.mm_change(&mm(5, MmCall::Munmap, 0x90_0000, 10 * 4096));
        t.rss(&rss(EventKind::ResidentEnd, 5, 10 * 64 * 4096));
        let (procs, counts, _) = t.finish(10);
        assert_eq!(counts.sampled_pages, 20);
        let p = &procs[&5];
        let (peak, _) = scaled(p.peak.as_ref().unwrap());
        let (end, _) = scaled(p.end.as_ref().unwrap());
        let of = |v: &[(Owner, f64, u64)], s: i32| v.iter().filter(|o| o.0.user_stack == s).map(|o| o.1).sum::<f64>();
        let whole = 10.0 * 64.0 * 4096.0;
        assert!((of(&peak, 2) - whole).abs() < 0.5);
        assert!(of(&end, 2).abs() < 0.5);
        assert!((of(&end, 1) - whole).abs() < 0.5);
    }

    #[test]
    fn a_childs_copy_is_its_own_and_the_rest_stays_shared() {
        let mut t = ResidentTracker::default();
        for i in 0..4 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
        }
        let mut ev = fork(6, 5);
        t.task(&ev);
        // The child writes one page: a copy under its own stack.
        t.page_anon(&sample(6, 0x10_0000, 9));
        ev.hdr.kind = EventKind::TaskExit as u32;
        ev.group_dead = 1;
        t.task(&ev);
        t.rss(&rss(EventKind::ResidentEnd, 6, 4 * 4096));
        let (procs, _, _) = t.finish(10);
        let end = procs[&6].end.as_ref().unwrap();
        let inherited: u64 = end.by_owner.iter().filter(|(o, _)| o.inherited).map(|(_, v)| v.0).sum();
        let own: u64 = end.by_owner.iter().filter(|(o, _)| o.user_stack == 9 && !o.inherited).map(|(_, v)| v.0).sum();
        assert_eq!((inherited, own), (3 * 4096, 4096));
        assert_eq!(end.resident(), 4 * 4096);
    }

    /// A fork child reading a library page again (the fork copies no page
    /// tables of a file mapping): the page-cache page its parent maps, still
    /// shared and its parent's (uc32 bug 5); a write to a private file page
    /// copies it, the child's own; an anonymous fault replaces as before.
    #[test]
    fn a_childs_refault_of_an_inherited_file_page_stays_shared() {
        let mut t = ResidentTracker::default();
        let file = RSS_FILE as u8;
        for i in 0..4 {
            t.page(&sample(5, 0x40_0000 + i * 4096, 1), file, None);
        }
        t.task(&fork(6, 5));
        // Read again in the child: no copy.
        t.page(&sample(6, 0x40_0000, 9), file, None);
        t.page(&sample(6, 0x40_1000, 9), file, None);
        // Written in the child: a copy.
        t.page(&PageSample { flags: PAGE_COW | PAGE_COPIED, ..sample(6, 0x40_2000, 9) }, file, None);
        let mut ev = fork(6, 5);
        ev.hdr.kind = EventKind::TaskExit as u32;
        ev.group_dead = 1;
        t.task(&ev);
        let (procs, _, _) = t.finish(10);
        let end = procs[&6].end.as_ref().unwrap();
        let by = |inherited: bool, stack: i32| -> u64 {
            end.by_owner
                .iter()
                .filter(|(o, _)| o.inherited == inherited && o.user_stack == stack)
                .map(|(_, v)| v.0)
                .sum()
        };
        assert_eq!(by(true, 1), 3 * 4096, "the pages read again are the parent's still: {:?}", end.by_owner);
        assert_eq!(by(false, 9), 4096, "the copy is the child's: {:?}", end.by_owner);
        assert!(end.by_owner.keys().filter(|o| o.inherited).all(|o| o.stack_pid == 5));
    }

    /// Owners re-keyed to owner shapes: the pages, the peak snapshot (two
    /// stacks of one shape add up) and a fork child's inherited pages (its
    /// parent's stack ids) hold no stack id any more; the shapes are what
    /// the pages and snapshots refer to; the bytes stay the same.
    #[test]
    fn owners_made_shapes_hold_no_stack_id_and_keep_their_bytes() {
        let mut t = ResidentTracker::default();
        for i in 0..4 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1 + (i % 2) as i32));
        }
        t.page_anon(&sample(5, 0x20_0000, 3));
        t.rss(&rss(EventKind::ResidentPeak, 5, 5 * 4096));
        t.task(&fork(6, 5));
        let ids = |t: &ResidentTracker, pid: u32| {
            let mut v: Vec<u32> = t.stack_ids(|p| p == pid).into_iter().collect();
            v.sort_unstable();
            v
        };
        assert_eq!((ids(&t, 5), ids(&t, 6)), (vec![1, 2, 3], vec![1, 2, 3]));
        // Stacks 1 and 2 sealed, one shape (the same frames); 3 not.
        let keys = t.owners_to_shape(|_| true, |id| id == 1 || id == 2);
        // The fork child's inherited pages are its parent's stacks, in the
        // parent's context (`Owner::stack`): one key each for both.
        assert_eq!(keys.len(), 2, "{keys:?}: two stacks, all pages in one leaf block");
        assert!(keys.iter().all(|k| k.0 == 5), "{keys:?}: in the parent's context");
        let shapes: crate::hash::HashMap<_, u32> = keys.into_iter().map(|k| (k, 40)).collect();
        t.rekey(&shapes);
        assert_eq!((ids(&t, 5), ids(&t, 6)), (vec![3], vec![3]));
        assert_eq!(t.shape_ids().into_iter().collect::<Vec<_>>(), [40]);
        assert!(t.owners_to_shape(|_| true, |_| true).iter().all(|k| k.1 == 3), "shapes are not made again");
        let (procs, _, _) = t.finish(10);
        let peak = procs[&5].peak.as_ref().unwrap();
        let shaped: Vec<(&Owner, &(u64, u64))> = peak.by_owner.iter().filter(|(o, _)| o.shape).collect();
        assert_eq!(shaped.len(), 1, "{peak:?}");
        assert_eq!((shaped[0].0.user_stack, shaped[0].0.kernel_stack), (40, vmtrace_common::STACK_ID_NONE));
        assert_eq!(*shaped[0].1, (4 * 4096, 4));
        assert_eq!(peak.by_owner.values().map(|v| v.0).sum::<u64>(), 5 * 4096);
        let end = procs[&6].end.as_ref().unwrap();
        assert!(end.by_owner.keys().filter(|o| o.shape).all(|o| o.inherited), "{end:?}");
        assert_eq!(end.by_owner.values().map(|v| v.1).sum::<u64>(), 5);
    }

    /// A write after the fork child exited reuses the page (uc29): it stays
    /// under the stack that faulted it in, no longer shared. A copy goes to
    /// the writer; where copies are not told apart, every write does.
    #[test]
    fn a_reused_page_stays_its_owners_and_a_copy_is_the_writers() {
        let cow = |tgid: u32, addr: u64, stack: i32, copied: bool| PageSample {
            flags: PAGE_COW | if copied { PAGE_COPIED } else { 0 },
            ..sample(tgid, addr, stack)
        };
        for seen in [true, false] {
            let mut t = ResidentTracker::default().with_cow_copies(seen);
            for i in 0..4 {
                t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
            }
            let mut ev = fork(6, 5);
            t.task(&ev);
            ev.hdr.kind = EventKind::TaskExit as u32;
            ev.group_dead = 1;
            t.task(&ev);
            // The parent writes three pages alone (reused) and a fourth it
            // copies (a read-only file page, say); a page never seen is the
            // writer's whatever it was.
            for i in 0..3 {
                t.page_anon(&cow(5, 0x10_0000 + i * 4096, 7, false));
            }
            t.page_anon(&cow(5, 0x10_3000, 7, true));
            t.page_anon(&cow(5, 0x50_0000, 7, false));
            t.rss(&rss(EventKind::ResidentEnd, 5, 5 * 4096));
            assert_eq!(t.reused_pages, if seen { 3 } else { 0 });
            let (procs, _, _) = t.finish(10);
            let end = procs[&5].end.as_ref().unwrap();
            let of = |stack: i32| -> u64 {
                end.by_owner.iter().filter(|(o, _)| o.user_stack == stack && !o.inherited).map(|(_, v)| v.1).sum()
            };
            let want = if seen { (3, 2) } else { (0, 5) };
            assert_eq!((of(1), of(7)), want, "copies seen: {seen}");
        }
    }

    /// Pages and forks come on separate rings: a child's copy that comes
    /// before its fork stays its own, and a parent's page faulted before
    /// the fork that comes after it is the child's too.
    #[test]
    fn a_fork_and_the_pages_around_it_agree_in_any_order() {
        let mut t = ResidentTracker::default();
        let at = |mut s: PageSample, ts: u64| {
            s.hdr.ts_ns = ts;
            s
        };
        for i in 0..4 {
            t.page_anon(&at(sample(5, 0x10_0000 + i * 4096, 1), 1));
        }
        // The child's copy of the first page, before its fork (ts 2) is seen.
        t.page_anon(&at(sample(6, 0x10_0000, 9), 3));
        t.task(&fork(6, 5));
        // The parent's page faulted before the fork, seen after it; and one
        // faulted after the fork, the parent's alone.
        t.page_anon(&at(sample(5, 0x20_0000, 1), 1));
        t.page_anon(&at(sample(5, 0x30_0000, 1), 4));
        let (procs, _, _) = t.finish(10);
        let end = procs[&6].end.as_ref().unwrap();
        let pages = |inherited: bool, stack: i32| -> u64 {
            end.by_owner
                .iter()
                .filter(|(o, _)| o.inherited == inherited && o.user_stack == stack)
                .map(|(_, v)| v.1)
                .sum()
        };
        assert_eq!((pages(true, 1), pages(false, 9)), (4, 1), "{:?}", end.by_owner);
        assert_eq!(procs[&5].end.as_ref().unwrap().by_owner.values().map(|v| v.1).sum::<u64>(), 6);
    }

    fn fork(child: u32, parent: u32) -> TaskEvent {
        let mut ev = crate::collect::fake::task(EventKind::TaskFork, child, child, parent, "");
        ev.hdr.ts_ns = 2;
        ev
    }

    /// Owner bytes (scaled) at `pid`'s end: (its own under `stack`, inherited).
    fn own_and_shared(procs: &BTreeMap<u32, ProcResident>, pid: u32, stack: i32) -> (f64, f64) {
        let (owners, _) = scaled(procs[&pid].end.as_ref().unwrap());
        let own = owners.iter().filter(|o| o.0.user_stack == stack && !o.0.inherited).map(|o| o.1).sum();
        let shared = owners.iter().filter(|o| o.0.inherited).map(|o| o.1).sum();
        (own, shared)
    }

    #[test]
    fn a_childs_copies_are_its_own_when_pages_are_sampled_by_address() {
        // 1 in 8 pages by address: the parent's sampled pages and the child's
        // sampled copies are the same addresses, so the child's quarter of
        // copies comes out a quarter of its memory (random sampling of the
        // faults made it an eighth, and its shared part too large).
        let (period, salt) = (8, 0x1234_5678_9abc_def1);
        let mut t = ResidentTracker::new(period, salt);
        let base = 0x7f00_0000_0000u64;
        let pages = 8192u64;
        let sampled = |i: u64| page_sampled((base + i * 4096) >> 12, salt, period);
        for i in (0..pages).filter(|&i| sampled(i)) {
            t.page_anon(&sample(5, base + i * 4096, 1));
        }
        t.task(&fork(6, 5));
        for i in (0..pages / 4).filter(|&i| sampled(i)) {
            t.page_anon(&sample(6, base + i * 4096, 9));
        }
        t.rss(&rss(EventKind::ResidentEnd, 6, pages * 4096));
        let (procs, _, _) = t.finish(10);
        let (own, shared) = own_and_shared(&procs, 6, 9);
        let whole = (pages * 4096) as f64;
        assert!((own / (whole / 4.0) - 1.0).abs() < 0.1, "own {own} of {whole}");
        assert!((own + shared - whole).abs() < 1.0);
    }

    /// uc30 forkcow: the child's pages still shared with its parent are
    /// symbolized in the parent's context (its pid, so its maps and unwound
    /// stacks), yet listed under the child; its own copies in its own. A
    /// page whose fault's stack was copied is owned by that stack (pinned),
    /// not by its frame-pointer id's mix (uc30 mun.c).
    #[test]
    fn inherited_pages_are_named_in_the_parents_context_and_pinned_pages_by_their_own_stack() {
        let mut t = ResidentTracker::default();
        for i in 0..4 {
            t.page(&sample(5, 0x10_0000 + i * 4096, 1), RSS_ANON as u8, Some(-20));
        }
        t.page(&sample(5, 0x20_0000, 1), RSS_ANON as u8, None);
        t.task(&fork(6, 5));
        t.page(&sample(6, 0x10_0000, 1), RSS_ANON as u8, Some(-21));
        let mut retiring = crate::hash::HashSet::default();
        retiring.insert(5);
        let keys = t.owner_keys(&retiring);
        assert!(keys.contains(&(5, -20, -1, 0x10_0000 >> LEAF_BLOCK_SHIFT)), "the child's inherited pages: {keys:?}");
        let (procs, _, _) = t.finish(10);
        let mut asked = Vec::new();
        let mut symbolize = |raw: Vec<(vmtrace_common::StackKey, vmtrace_common::StackCounts)>| {
            raw.into_iter()
                .map(|(k, c)| {
                    asked.push((k.tgid, k.user_stack));
                    crate::stacks::Stack {
                        pid: k.tgid,
                        comm: format!("comm{}", k.tgid),
                        user: vec![crate::stacks::Frame::from(format!("s{}", k.user_stack).as_str())].into(),
                        counts: c,
                        stratum: k.stratum,
                        ..crate::stacks::Stack::default()
                    }
                })
                .collect()
        };
        let snaps: Vec<(u32, &Snapshot)> = procs.iter().map(|(p, r)| (*p, r.end.as_ref().unwrap())).collect();
        let mut with_size: Vec<(u32, Snapshot)> = snaps.iter().map(|(p, s)| (*p, (*s).clone())).collect();
        for (_, s) in &mut with_size {
            s.size[RSS_ANON] = s.by_owner.values().map(|v| v.0).sum();
        }
        let stacks = profile(&refs(&with_size), false, &mut symbolize, &|p| format!("row{p}"));
        asked.sort_unstable();
        asked.dedup();
        assert_eq!(asked, [(5, -20), (5, 1), (6, -21)], "pinned ids, and the parent's for its pages");
        let of = |pid: u32, frame: &str, shared: bool| -> u64 {
            stacks
                .iter()
                .filter(|s| s.pid == pid && s.user[0].as_ref() == frame && s.leaf.is_some() == shared)
                .map(|s| s.counts.major)
                .sum()
        };
        assert_eq!((of(5, "s-20", false), of(5, "s1", false)), (4, 1));
        assert_eq!((of(6, "s-20", true), of(6, "s1", true), of(6, "s-21", false)), (3, 1, 1));
        assert!(stacks.iter().filter(|s| s.pid == 6).all(|s| s.comm == "row6" || s.comm == "comm6"));
    }

    #[test]
    fn a_huge_page_copied_in_part_is_split_into_its_sampled_small_pages() {
        let (period, salt) = (4, 77);
        let mut t = ResidentTracker::new(period, salt);
        let base = 0x4000_0000u64;
        let mut huge = sample(5, base + 0x3000, 1);
        huge.flags = PAGE_HUGE;
        t.page_anon(&huge);
        t.task(&fork(6, 5));
        let small: Vec<u64> =
            (0..512).map(|i| base + i * 4096).filter(|a| page_sampled(a >> 12, salt, period)).collect();
        // The child copies the first sampled page of the huge one.
        t.page_anon(&sample(6, small[0], 9));
        // The parent gives back the second half of its huge page.
        t.mm_change(&mm(5, MmCall::Munmap, base + (1 << 20), 1 << 20));
        let (procs, _, _) = t.finish(10);
        let child = procs[&6].end.as_ref().unwrap();
        let of = |s: &Snapshot, inherited: bool, stack: i32| -> u64 {
            s.by_owner.iter().filter(|(o, _)| o.inherited == inherited && o.user_stack == stack).map(|(_, v)| v.1).sum()
        };
        assert_eq!(of(child, false, 9), 1);
        assert_eq!(of(child, true, 1), small.len() as u64 - 1);
        assert!(child.by_owner.keys().all(|o| !o.exact), "split pages stand for the sample: {child:?}");
        let parent = procs[&5].end.as_ref().unwrap();
        let first_half = small.iter().filter(|&&a| a < base + (1 << 20)).count() as u64;
        assert_eq!(of(parent, false, 1), first_half);
    }

    #[test]
    fn an_oom_victims_pages_at_the_kill_are_scaled_to_what_the_kill_reported() {
        let mut t = ResidentTracker::default();
        for i in 0..30 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, if i < 10 { 1 } else { 2 }));
        }
        // Pages freed before the kill are not in it.
        t.mm_change(&mm(5, MmCall::Munmap, 0x10_0000, 5 * 4096));
        let mut ev = crate::collect::fake::oom_kill(5, "hog", 4, 25 * 64 * 4);
        t.oom_kill(&ev);
        // A victim with no sampled page has no snapshot.
        ev.victim_pid = 77;
        t.oom_kill(&ev);
        let (_, _, ooms) = t.finish(10);
        assert_eq!(ooms.len(), 1);
        let (owners, left) = scaled(&ooms[0].1);
        assert!(left.abs() < 0.5);
        let of = |s: i32| owners.iter().filter(|o| o.0.user_stack == s).map(|o| o.1).sum::<f64>();
        assert!((of(1) - 5.0 * 64.0 * 4096.0).abs() < 0.5);
        assert!((of(2) - 20.0 * 64.0 * 4096.0).abs() < 0.5);
    }

    /// Before 6.8 the kill's record has no sizes (read as 0): the victim's
    /// sampled pages stand for the sample period's, not for nothing.
    #[test]
    fn an_oom_kill_without_sizes_is_the_samples_own_estimate() {
        use vmtrace_common::{Tp, TpOffsets};
        let mut tp = TpOffsets::TABLE;
        for f in [Tp::OomAnonRss, Tp::OomFileRss, Tp::OomShmemRss] {
            tp.offsets[f as usize] = TpOffsets::MISSING;
        }
        let mut t = ResidentTracker::new(64, 0).with_oom_sizes(&tp);
        for i in 0..30 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, if i < 10 { 1 } else { 2 }));
        }
        // A huge page stands for itself.
        t.page_anon(&PageSample { flags: PAGE_HUGE, ..sample(5, 0x4000_0000, 3) });
        t.oom_kill(&crate::collect::fake::oom_kill(5, "hog", 4, 0));
        let (_, _, ooms) = t.finish(10);
        let s = &ooms[0].1;
        assert_eq!(s.size[RSS_ANON], 30 * 64 * 4096 + (2 << 20));
        assert_eq!((s.size[RSS_FILE], s.size[RSS_SHMEM]), (0, 0));
        let (owners, left) = scaled(s);
        assert!(left.abs() < 0.5);
        let of = |s: i32| owners.iter().filter(|o| o.0.user_stack == s).map(|o| o.1).sum::<f64>();
        assert!((of(1) - 10.0 * 64.0 * 4096.0).abs() < 0.5, "{}", of(1));
        assert!((of(2) - 20.0 * 64.0 * 4096.0).abs() < 0.5, "{}", of(2));
        assert!((of(3) - f64::from(2 << 20)).abs() < 0.5, "{}", of(3));
        // With the sizes in the record, the record's figures.
        let mut t = ResidentTracker::new(64, 0).with_oom_sizes(&TpOffsets::TABLE);
        t.page_anon(&sample(5, 0x10_0000, 1));
        t.oom_kill(&crate::collect::fake::oom_kill(5, "hog", 4, 0));
        assert_eq!(t.finish(10).2[0].1.size[RSS_ANON], 0);
    }

    #[test]
    fn a_page_whose_fault_began_before_its_munmap_is_gone_however_late_it_comes() {
        let mut t = ResidentTracker::default();
        t.page_anon(&sample(5, 0x10_0000, 1));
        t.mm_change(&mm(5, MmCall::Munmap, 0x10_0000, 2 * 4096));
        // Began at 1, before the munmap returned at 2: late, and gone.
        t.page_anon(&sample(5, 0x10_1000, 1));
        let mut after = sample(5, 0x10_1000, 3);
        after.hdr.ts_ns = 5;
        t.page_anon(&after);
        let (procs, _, _) = t.finish(10);
        let end = procs[&5].end.as_ref().unwrap();
        assert_eq!(end.by_owner.iter().map(|(o, v)| (o.user_stack, v.1)).collect::<Vec<_>>(), [(3, 1)]);
    }

    /// The profiles `build` makes of `procs`: (end, peak) totals by pid.
    fn profile_totals(procs: &BTreeMap<u32, ProcResident>) -> (ResidentProfiles, BTreeMap<u32, (f64, f64)>) {
        let mut symbolize = |raw: Vec<(vmtrace_common::StackKey, vmtrace_common::StackCounts)>| {
            raw.into_iter()
                .map(|(k, counts)| crate::stacks::Stack {
                    pid: k.tgid,
                    user: vec![format!("s{}", k.user_stack).into()].into(),
                    stratum: k.stratum,
                    counts,
                    ..crate::stacks::Stack::default()
                })
                .collect()
        };
        let r = build((procs, ResidentCounts::default(), &[]), (false, 64, 0), &mut symbolize, &|_| String::new());
        let mut by: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        for s in &r.end {
            by.entry(s.pid).or_default().0 += s.estimate.faults;
        }
        for s in &r.peak {
            by.entry(s.pid).or_default().1 += s.estimate.faults;
        }
        (r, by)
    }

    /// A child forked then exec'd (`ldconfig` of a Python job) whose new
    /// address space peaks under `RSS_PEAK_MIN_STEP`: no peak event comes,
    /// yet its peak profile holds its peak, from its pages at the end; and
    /// the parent's, whose peak event came a step below its peak, is scaled
    /// to it. The peak profile adds up to the processes' `peak_bytes`.
    #[test]
    fn the_peak_profile_adds_up_to_each_processs_peak_without_a_peak_event() {
        let mut t = ResidentTracker::new(64, 0);
        for i in 0..8 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
        }
        t.rss(&rss(EventKind::ResidentPeak, 5, 8 << 20));
        t.task(&fork(6, 5));
        let mut exec = fork(6, 5);
        exec.hdr.kind = EventKind::TaskExec as u32;
        t.task(&exec);
        t.page_anon(&sample(6, 0x40_0000, 2));
        t.page_anon(&sample(6, 0x50_0000, 3));
        let mut exit = exec;
        (exit.hdr.kind, exit.group_dead) = (EventKind::TaskExit as u32, 1);
        t.task(&exit);
        t.rss(&rss(EventKind::ResidentEnd, 6, 700 << 10));
        // The kernel's counters: the child's new address space peaked at
        // 784 KiB (anon 600, file 184), the parent's at 9 MiB.
        let child = RssMm {
            tgid: 6,
            flags: RSS_ENDED,
            size: [0, 700 << 10, 0, 0],
            end: [0, 700 << 10, 0, 0],
            peak: 784 << 10,
            peak_size: [184 << 10, 600 << 10, 0, 0],
            first_ns: 2,
            end_ns: 3,
            ..RssMm::default()
        };
        let parent = RssMm { tgid: 5, size: [0, 9 << 20, 0, 0], peak: 9 << 20, peak_size: [0, 9 << 20, 0, 0], ..child };
        let parent = RssMm { flags: 0, first_ns: 1, ..parent };
        let _ = t.kernel_counters(&[(1, parent), (2, child)], 4);
        let (procs, _, _) = t.finish(10);
        assert!(procs[&6].peak.is_none(), "no peak event for the child");
        let (r, by) = profile_totals(&procs);
        for (pid, want) in [(5, 9 << 20), (6, 784 << 10)] {
            assert_eq!(r.per_process[&pid].peak_bytes, want);
            let (_, peak) = by[&pid];
            assert!((peak - want as f64).abs() < 1.5, "pid {pid}: peak profile {peak} of {want}: {:?}", r.peak);
        }
        // The child's file pages at the peak: no sampled page stands for them.
        let unsampled: f64 =
            r.peak.iter().filter(|s| s.pid == 6 && &*s.user[0] == UNSAMPLED_PAGES).map(|s| s.estimate.faults).sum();
        assert!((unsampled - f64::from(184 << 10)).abs() < 1.5, "{unsampled}");
    }

    /// A peak reading below the end's, and a peak (VmHWM) without its
    /// counters of then (an idle `-p` target): the peak profile is taken
    /// to `peak_bytes` kind by kind.
    #[test]
    fn a_peak_snapshot_is_scaled_to_peak_bytes() {
        let end = Snapshot {
            size: [100, 300, 0, 0],
            ts_ns: 1,
            by_owner: BTreeMap::from([(
                Owner {
                    user_stack: 1,
                    kernel_stack: -1,
                    exact: false,
                    inherited: false,
                    lazy: false,
                    leaf_block: 0,
                    kind: 1,
                    stack_pid: 5,
                    pinned: 0,
                    shape: false,
                },
                (4096, 1),
            )]),
            period: 0,
        };
        let s = peak_snapshot(None, &end, [100, 300, 0, 0], 1000).unwrap();
        assert_eq!(s.size, [250, 750, 0, 0]);
        let s = peak_snapshot(None, &end, [10, 20, 0, 0], 400).unwrap();
        assert_eq!(s.size, [100, 300, 0, 0], "the end above the peak's reading");
        let s = peak_snapshot(None, &end, [1, 1, 1, 0], 1000).unwrap();
        assert_eq!(s.resident(), 1000);
        assert!(peak_snapshot(None, &end, [0; 4], 0).is_none());
    }

    /// MADV_FREE (issue #34): the pages stay under the stack that faulted
    /// them in, lazily freed (a fault that began before the call too,
    /// however late its record), scaled with the rest while the anon
    /// counter holds them all; when it drops (reclaim, which no event
    /// tells) they go first. A page faulted in again, or written again
    /// through a reusing copy-on-write fault, is taken back.
    #[test]
    fn lazily_freed_pages_stay_until_the_anon_counter_drops_and_go_first() {
        let page = 4096.0;
        // 1 in 4 pages: 17 sampled under stack 1 (68 pages), 4 under 2 (16).
        let run = |anon_pages: u64| {
            let mut t = ResidentTracker::new(4, 0);
            for i in 0..16 {
                t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
            }
            for i in 0..4 {
                t.page_anon(&sample(5, 0x90_0000 + i * 4096, 2));
            }
            let mut free = mm(5, MmCall::Madvise, 0x10_0000, 17 * 4096);
            free.prot = MADV_FREE;
            t.mm_change(&free);
            // Faulted before the call (ts 1 < 2), seen after it.
            t.page_anon(&sample(5, 0x10_0000 + 16 * 4096, 1));
            t.rss(&rss(EventKind::ResidentEnd, 5, anon_pages * 4096));
            let (procs, _, _) = t.finish(10);
            let (r, _) = profile_totals(&procs);
            let of = |stack: &str, lazy: bool| -> f64 {
                r.end
                    .iter()
                    .filter(|s| &*s.user[0] == stack && (s.leaf.as_deref() == Some(LAZY_LEAF)) == lazy)
                    .map(|s| s.estimate.faults / page)
                    .sum()
            };
            assert!(of("s1", false).abs() < 1e-9, "{:?}", r.end);
            assert!(of("s2", true).abs() < 1e-9, "{:?}", r.end);
            (of("s1", true), of("s2", false))
        };
        // Not reclaimed: the total holds them all (68 + 16 pages).
        assert_eq!(run(84), (68.0, 16.0));
        // Under the sample's own estimate by a little (its error): scaled alike.
        assert_eq!(run(42), (26.0, 16.0), "reclaim takes the lazily freed pages first");
        assert_eq!(run(10), (0.0, 10.0), "all of them, then the others");
        // Above the estimate (pages faulted before the trace): proportionally.
        let (lazy, kept) = run(105);
        assert!((lazy - 85.0).abs() < 0.5 && (kept - 20.0).abs() < 0.5, "{lazy} {kept}");

        // Faulted in again after reclaim, or written again (reused): taken back.
        let mut t = ResidentTracker::new(4, 0).with_cow_copies(true);
        for i in 0..3 {
            t.page_anon(&sample(5, 0x10_0000 + i * 4096, 1));
        }
        let mut free = mm(5, MmCall::Madvise, 0x10_0000, 3 * 4096);
        free.prot = MADV_FREE;
        t.mm_change(&free);
        let mut again = sample(5, 0x10_0000, 3);
        again.hdr.ts_ns = 5;
        t.page_anon(&again);
        let mut reused = PageSample { flags: PAGE_COW, ..sample(5, 0x10_1000, 4) };
        reused.hdr.ts_ns = 5;
        t.page_anon(&reused);
        let (procs, _, _) = t.finish(10);
        let end = procs[&5].end.as_ref().unwrap();
        let owners: Vec<(i32, bool)> = end.by_owner.keys().map(|o| (o.user_stack, o.lazy)).collect();
        assert_eq!(owners, [(1, false), (1, true), (3, false)]);
    }

    #[test]
    fn brk_shrink_and_mremap_move_or_drop_pages() {
        let mut t = ResidentTracker::default();
        t.mm_change(&mm(5, MmCall::Brk, 0x20_0000, 0));
        t.page_anon(&sample(5, 0x20_0000, 1));
        t.mm_change(&mm(5, MmCall::Brk, 0x40_0000, 0));
        t.page_anon(&sample(5, 0x30_0000, 1));
        t.mm_change(&mm(5, MmCall::Brk, 0x28_0000, 0));
        let mut r = mm(5, MmCall::Mremap, 0x80_0000, 4096);
        (r.old_addr, r.old_len) = (0x20_0000, 8192);
        t.mm_change(&r);
        let (procs, _, _) = t.finish(1);
        let end = procs[&5].end.as_ref().unwrap();
        assert_eq!(end.by_owner.values().map(|v| v.1).sum::<u64>(), 1);
    }
}

/// `StackKey::stratum` bit marking an owner's pages as inherited from the
/// parent (only between `owner_counts` and `build`).
const STRATUM_INHERITED: u32 = 2;

/// Stratum bit of an owner's key whose `user_stack` is an owner shape's id
/// (`Owner::shape`; `symbols::symbolize_owner_counts` takes it off).
pub(crate) const STRATUM_SHAPE: u32 = 1 << 8;

/// The frame standing for resident bytes no sampled page was left to stand for.
pub(crate) const UNSAMPLED_PAGES: &str = "[no page sampled]";
/// The leaf of pages a child got from its parent at fork and never wrote.
pub(crate) const SHARED_LEAF: &str = crate::model::resident::SHARED_WITH_PARENT;
/// The leaf of pages given back with MADV_FREE the kernel has not reclaimed.
pub(crate) const LAZY_LEAF: &str = crate::model::resident::FREED_LAZILY;
/// `StackKey::stratum` bit of lazily freed pages (`Owner::lazy`; only
/// between `owner_counts` and `profile`, as `STRATUM_INHERITED`).
const STRATUM_LAZY: u32 = 4;

/// The resident profiles and per-process figures of a recording.
#[derive(Debug, Default)]
pub struct ResidentProfiles {
    /// Stacks weighted (`estimate.faults`) by bytes resident at each
    /// process's end, and at its peak.
    pub end: Vec<crate::stacks::Stack>,
    pub peak: Vec<crate::stacks::Stack>,
    pub per_process: BTreeMap<u32, crate::model::Resident>,
    pub summary: crate::model::ResidentSummary,
    /// Each OOM victim's resident memory by call site at its kill.
    pub ooms: Vec<OomResident>,
}

/// An OOM victim's call sites at its kill ("what grew"), scaled to the
/// kernel's anon + file + shmem the kill reported.
#[derive(Debug, Default)]
pub struct OomResident {
    pub victim_pid: u32,
    /// Seconds from the start of the trace, as `OomRecord::time_s`.
    pub time_s: f64,
    pub sites: Vec<crate::model::ResidentSite>,
}

/// Call sites listed for an OOM victim.
const OOM_SITES: usize = 10;

/// A snapshot's scaled owners as stack counts: `faults` carries the bytes,
/// `major` the sampled pages behind them.
fn owner_counts(
    pid: u32,
    s: &Snapshot,
    leaf: bool,
) -> (Vec<(vmtrace_common::StackKey, vmtrace_common::StackCounts)>, f64) {
    let (owners, left) = scaled(s);
    let mut weights: Vec<f64> = owners.iter().map(|o| o.1).collect();
    crate::model::largest_remainder(&mut weights);
    let raw = owners
        .iter()
        .zip(weights)
        .filter(|(_, w)| *w >= 1.0)
        .map(|((o, _, pages), w)| {
            let stratum = if o.exact { vmtrace_common::STRATUM_EXACT } else { vmtrace_common::STRATUM_SAMPLED }
                | if o.inherited { STRATUM_INHERITED } else { 0 }
                | if o.shape { STRATUM_SHAPE } else { 0 };
            // In the context of the process whose fault it was (a fork
            // child's inherited pages: its parent's); `profile` puts the
            // stack back under `pid`. An owner shape's id under `pid`.
            let (stack_pid, user_stack) = o.stack(pid);
            let key = vmtrace_common::StackKey {
                tgid: stack_pid,
                user_stack,
                kernel_stack: o.kernel_stack,
                stratum: stratum | if o.lazy { STRATUM_LAZY } else { 0 },
                leaf_block: if leaf { o.leaf_block } else { 0 },
            };
            (key, vmtrace_common::StackCounts { faults: w as u64, major: *pages, ..Default::default() })
        })
        .collect();
    (raw, left)
}

/// Sampled stacks symbolized at once by `profile`.
const PROFILE_SLICE: usize = 2048;

/// What makes two symbolized stacks one in a resident profile: all but
/// their counts.
#[derive(PartialEq, Eq, Hash)]
struct SameStack {
    pid: u32,
    user: crate::stacks::Frames,
    kernel: Vec<crate::stacks::Frame>,
    leaf: Option<String>,
    stratum: u32,
    flags: (bool, bool, bool, bool),
    /// `Stack::unwound`: whether unwound from a copy, and how it was cut.
    unwound: (bool, Option<&'static str>),
}

impl SameStack {
    fn of(s: &crate::stacks::Stack) -> Self {
        Self {
            pid: s.pid,
            user: s.user.clone(),
            kernel: s.kernel.clone(),
            leaf: s.leaf.clone(),
            stratum: s.stratum,
            flags: (s.user_missing, s.user_cut, s.python, s.python_unnamed),
            unwound: (s.unwound.is_some(), s.unwound.flatten()),
        }
    }
}

/// Symbolized stacks of one kind of snapshot, weighted by bytes.
pub(crate) fn profile(
    snaps: &[(u32, &Snapshot)],
    leaf: bool,
    symbolize: &mut dyn FnMut(
        Vec<(vmtrace_common::StackKey, vmtrace_common::StackCounts)>,
    ) -> Vec<crate::stacks::Stack>,
    comm_of: &dyn Fn(u32) -> String,
) -> Vec<crate::stacks::Stack> {
    let mut raw = Vec::new();
    // Keys symbolized in another process's context (a fork child's
    // inherited pages, in its parent's), by the process they belong to.
    let mut foreign: Vec<(u32, Vec<_>)> = Vec::new();
    let mut unsampled = Vec::new();
    for (pid, s) in snaps {
        let (r, left) = owner_counts(*pid, s, leaf);
        let (own, other): (Vec<_>, Vec<_>) = r.into_iter().partition(|(k, _)| k.tgid == *pid);
        raw.extend(own);
        if !other.is_empty() {
            foreign.push((*pid, other));
        }
        if left >= 1.0 {
            unsampled.push((*pid, left));
        }
    }
    let n_raw = raw.len() + foreign.iter().map(|f| f.1.len()).sum::<usize>();
    // Symbolized a slice of keys at a time, and the stacks that come out
    // the same merged as they come: a key whose native stack was unwound
    // several ways is one stack per way (`symbols::symbolize_counts`), most
    // of which name the same frames. All at once, the 10,857 keys of a
    // 2-minute `record -a` beside a shell loop were 72,125 stacks, the end's
    // largest allocation.
    let mut stacks: Vec<crate::stacks::Stack> = Vec::new();
    let mut index: HashMap<SameStack, usize> = HashMap::default();
    // (the process the keys belong to when symbolized in another's context, keys)
    let groups = std::iter::once((None, raw)).chain(foreign.into_iter().map(|(pid, k)| (Some(pid), k)));
    let slices = groups.flat_map(|(row, keys)| {
        let mut keys = keys.into_iter().peekable();
        std::iter::from_fn(move || keys.peek().is_some().then(|| (row, keys.by_ref().take(PROFILE_SLICE).collect())))
    });
    for (row, slice) in slices {
        for mut s in symbolize(slice) {
            if let Some(pid) = row {
                s.pid = pid;
                s.comm = comm_of(pid);
            }
            if s.stratum & STRATUM_INHERITED != 0 {
                s.stratum &= !STRATUM_INHERITED;
                s.leaf = Some(SHARED_LEAF.to_string());
            }
            // Shared with the parent first: each such page is counted once,
            // in the parent's row, under its own leaf there.
            if s.stratum & STRATUM_LAZY != 0 {
                s.stratum &= !STRATUM_LAZY;
                if s.leaf.as_deref() != Some(SHARED_LEAF) {
                    s.leaf = Some(LAZY_LEAF.to_string());
                }
            }
            match index.entry(SameStack::of(&s)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    vmtrace_common::Merge::merge(&mut stacks[*e.get()].counts, &s.counts);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(stacks.len());
                    stacks.push(s);
                }
            }
        }
    }
    drop(index);
    log::debug!(
        target: "vmtrace::end",
        "resident profile of {} snapshots: {n_raw} sampled stacks, {} symbolized and merged",
        snaps.len(),
        stacks.len()
    );
    for s in &mut stacks {
        s.estimate = crate::stacks::weight::Estimate { faults: s.counts.faults as f64, ..Default::default() };
    }
    for (pid, left) in unsampled {
        stacks.push(crate::stacks::Stack {
            pid,
            comm: comm_of(pid),
            user: vec![UNSAMPLED_PAGES.into()].into(),
            estimate: crate::stacks::weight::Estimate { faults: left.round(), ..Default::default() },
            ..crate::stacks::Stack::default()
        });
    }
    stacks
}

/// Bytes of a snapshot's inherited owners by kind (`RSS_*`), scaled.
fn inherited_by_kind(s: &Snapshot) -> [f64; RSS_MEMBERS] {
    let mut out = [0.0; RSS_MEMBERS];
    for (o, bytes, _) in scaled(s).0.iter().filter(|o| o.0.inherited) {
        out[usize::from(o.kind).min(RSS_MEMBERS - 1)] += bytes;
    }
    out
}

/// What a child at its end still shares with its parent: its inherited
/// anonymous pages, no more than it had at the fork (a copy replaces one),
/// and its inherited file and shmem pages, which the fork does not copy
/// (`dup_mmap` leaves a file mapping's page tables to be faulted again):
/// faulted again in the child they are the parent's pages still, mapped by
/// both, as the kernel's Shared_Clean counts them.
fn shared_with_parent(end: &Snapshot, at_fork: Option<[u64; RSS_MEMBERS]>) -> u64 {
    use vmtrace_common::RSS_ANON;
    let by = inherited_by_kind(end);
    let anon = match at_fork {
        Some(f) if RssMm::resident(&f) > 0 => by[RSS_ANON].min(f[RSS_ANON] as f64),
        _ => by[RSS_ANON],
    };
    let other: f64 = by.iter().enumerate().filter(|(k, _)| *k != RSS_ANON).map(|(_, b)| b).sum();
    ((anon + other).round() as u64).min(end.resident())
}

/// The call sites holding the most, by process and frames.
fn top_sites(stacks: &[crate::stacks::Stack], n: usize) -> Vec<crate::model::ResidentSite> {
    // Frames borrowed: strings only for the sites listed (a stack on every
    // fault gives hundreds of thousands of stacks).
    let mut by: BTreeMap<(u32, Vec<&str>), (&str, f64, u64)> = BTreeMap::new();
    // A fork child's pages shared with its parent stay, under their
    // `[shared with parent]` leaf: each process's own view (summary.json).
    // The lists people read rank them out (`ResidentSite::shared_with_parent`).
    for s in stacks {
        let frames: Vec<&str> = s.user.iter().chain(s.kernel.iter()).map(|f| &**f).chain(s.leaf.as_deref()).collect();
        let e = by.entry((s.pid, frames)).or_insert_with(|| (&s.comm, 0.0, 0));
        e.1 += s.estimate.faults;
        e.2 += s.counts.major;
    }
    let mut v: Vec<_> = by
        .into_iter()
        .map(|((pid, frames), (comm, bytes, pages))| (pid, frames, comm, bytes.round() as u64, pages))
        .filter(|s| s.3 > 0)
        .collect();
    v.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v.into_iter()
        .map(|(pid, frames, comm, bytes, pages)| crate::model::ResidentSite {
            pid,
            comm: comm.to_string(),
            frames: frames.into_iter().map(str::to_string).collect(),
            bytes,
            sampled_pages: pages,
        })
        .collect()
}

/// The pages a process's peak profile is made of, with the sizes they are
/// scaled to, so that it adds up to the process's `peak_bytes`: its live
/// set when the peak passed the last snapshot by a step (`ResidentPeak`),
/// else its live set at its end: a process whose resident size never
/// reached `RSS_PEAK_MIN_STEP` (1 MiB) gets no peak event (`ldconfig`
/// exec'd by a Python job: 802,816 bytes at its peak, left out of
/// resident-peak.folded before). Scaled to the counters at the peak
/// (`peak_size`) taken to `peak_bytes` where those differ from it (the
/// end above the peak's reading; an idle `-p` target's VmHWM with only
/// its counters of now), kind by kind in proportion. `None` at 0 bytes.
fn peak_snapshot(
    at_peak: Option<&Snapshot>,
    end: &Snapshot,
    peak_size: [u64; RSS_MEMBERS],
    peak_bytes: u64,
) -> Option<Snapshot> {
    use vmtrace_common::{RSS_ANON, RSS_FILE, RSS_SHMEM};
    if peak_bytes == 0 {
        return None;
    }
    let mut s = at_peak.unwrap_or(end).clone();
    let from = if RssMm::resident(&peak_size) >= end.resident() { peak_size } else { end.size };
    let mut size = from;
    let had = RssMm::resident(&from);
    if had != peak_bytes {
        let kinds = [RSS_ANON, RSS_FILE, RSS_SHMEM];
        if had == 0 {
            size[RSS_ANON] = peak_bytes;
        } else {
            for k in kinds {
                size[k] = (u128::from(from[k]) * u128::from(peak_bytes) / u128::from(had)) as u64;
            }
            // What the rounding down left, to the largest kind.
            let largest = kinds.into_iter().max_by_key(|&k| size[k]).unwrap_or(RSS_ANON);
            size[largest] += peak_bytes - RssMm::resident(&size);
        }
    }
    s.size = size;
    Some(s)
}

fn refs(v: &[(u32, Snapshot)]) -> Vec<(u32, &Snapshot)> {
    v.iter().map(|(p, s)| (*p, s)).collect()
}

/// Everything the reports need: per-process figures (exact, from the
/// kernel) and the two profiles (estimated, scaled to them).
pub(crate) fn build(
    (procs, counts, oom_snaps): (&BTreeMap<u32, ProcResident>, ResidentCounts, &[(u32, Snapshot)]),
    (leaf, sample_period, started_mono_ns): (bool, u32, u64),
    symbolize: &mut dyn FnMut(
        Vec<(vmtrace_common::StackKey, vmtrace_common::StackCounts)>,
    ) -> Vec<crate::stacks::Stack>,
    comm_of: &dyn Fn(u32) -> String,
) -> ResidentProfiles {
    use vmtrace_common::{RSS_ANON, RSS_FILE, RSS_SHMEM, RSS_SWAP};
    let mut per_process = BTreeMap::new();
    let mut ends = Vec::new();
    let mut peaks = Vec::new();
    let mut live_at_end = 0;
    for (pid, p) in procs {
        let Some(end) = p.end.as_ref() else { continue };
        if log::log_enabled!(log::Level::Debug) {
            let mut kinds = [0u64; RSS_MEMBERS];
            for (o, v) in &end.by_owner {
                kinds[usize::from(o.kind).min(RSS_MEMBERS - 1)] += v.1;
            }
            log::debug!(
                "resident {pid}: sampled pages at the end by kind {kinds:?}, kernel {:?}, inherited bytes by kind {:?}",
                end.size,
                inherited_by_kind(end)
            );
        }
        let k = p.kernel;
        if k.is_none() && end.resident() == 0 {
            continue;
        }
        let (peak, peak_size, peak_ns) = match (k, p.peak.as_ref()) {
            (Some(k), _) if k.peak > 0 => (k.peak, k.peak_size, Some(k.peak_ns).filter(|&t| t > 0)),
            (_, Some(s)) => (s.resident(), s.size, Some(s.ts_ns)),
            _ => (end.resident(), end.size, None),
        };
        live_at_end += end.by_owner.values().map(|v| v.1).sum::<u64>();
        let shared = shared_with_parent(end, k.map(|k| k.at_fork));
        per_process.insert(
            *pid,
            crate::model::Resident {
                end_bytes: end.resident(),
                peak_bytes: peak.max(end.resident()),
                anon_bytes: end.size[RSS_ANON],
                file_bytes: end.size[RSS_FILE],
                shmem_bytes: end.size[RSS_SHMEM],
                shared_with_parent_bytes: shared,
                private_bytes: end.resident() - shared,
                swap_bytes: end.size[RSS_SWAP],
                peak_anon_bytes: peak_size[RSS_ANON],
                peak_file_bytes: peak_size[RSS_FILE],
                peak_shmem_bytes: peak_size[RSS_SHMEM],
                peak_at_s: peak_ns.map(|t| t.saturating_sub(started_mono_ns) as f64 / 1e9),
                exited: p.exited,
            },
        );
        ends.push((*pid, end.clone()));
        if let Some(s) = peak_snapshot(p.peak.as_ref(), end, peak_size, peak.max(end.resident())) {
            peaks.push((*pid, s));
        }
    }
    let end = profile(&refs(&ends), leaf, symbolize, comm_of);
    let peak = profile(&refs(&peaks), leaf, symbolize, comm_of);
    let ooms = oom_snaps
        .iter()
        .map(|(pid, s)| OomResident {
            victim_pid: *pid,
            time_s: s.ts_ns.saturating_sub(started_mono_ns) as f64 / 1e9,
            sites: top_sites(&profile(&[(*pid, s)], leaf, symbolize, comm_of), OOM_SITES),
        })
        .collect();
    let summary = crate::model::ResidentSummary {
        files: Vec::new(),
        sample_period,
        sampled_pages: counts.sampled_pages,
        live_pages_at_end: live_at_end,
        counter_error_bytes: 0,
        estimate: format!(
            "exact: each process's resident bytes at its end and peak, by kind (the kernel's rss_stat counters, \
             within counter_error_bytes); \
             estimated: their split by call site, from 1 in {sample_period} pages chosen by a hash of their \
             virtual address (the same pages in a fork child as in its parent, so its copy-on-write copies are \
             seen) and every huge page, followed until given back, scaled to the exact totals; a site with n \
             sampled pages is within about ±2/√n of its bytes (95%)"
        ),
        dropped_pages: counts.dropped_pages,
        dropped_snapshots: 0,
        top_at_peak: top_sites(&peak, 10),
        top_at_end: top_sites(&end, 10),
    };
    ResidentProfiles { end, peak, per_process, summary, ooms }
}

impl ResidentProfiles {
    /// Adds the processes folded away while recording: the other
    /// process's figures and stacks (`collect::folded`).
    pub(crate) fn add_folded(
        &mut self,
        r: crate::model::Resident,
        end: Vec<crate::stacks::Stack>,
        peak: Vec<crate::stacks::Stack>,
        live_pages: u64,
    ) {
        self.per_process.insert(crate::model::OTHER_PID, r);
        self.end.extend(end);
        self.peak.extend(peak);
        self.summary.live_pages_at_end += live_pages;
        self.summary.top_at_peak = top_sites(&self.peak, 10);
        self.summary.top_at_end = top_sites(&self.end, 10);
    }
}

/// `ResidentSummary::counter_error_bytes` for the hook that ran: the tp_btf
/// program reads a `percpu_counter`'s global count, which each CPU's share
/// (under `percpu_counter_batch` = max(32, 2 × CPUs) pages) has not reached.
fn counter_error_bytes(probes: &[crate::model::ProbeInfo]) -> u64 {
    let btf = probes.iter().any(|p| p.what == "resident memory" && p.program_type == "tp_btf");
    if !btf {
        return 0;
    }
    // Possible CPUs: at least the online ones the batch is computed from.
    let cpus = aya::util::nr_cpus().map_or(1, |n| n as u64);
    cpus * (2 * cpus).max(32) * 4096
}

/// Puts the figures into the summary: `processes[].resident`, `resident`.
pub(crate) fn apply(summary: &mut crate::model::Summary, r: &ResidentProfiles, drops: &[u64]) {
    use vmtrace_common::DropKind;
    for p in &mut summary.processes {
        p.resident = r.per_process.get(&p.pid).cloned();
    }
    // The kill's record and its snapshot share the event's timestamp.
    for o in summary.oom.iter_mut().flatten() {
        let at_kill = r.ooms.iter().find(|k| k.victim_pid == o.victim_pid && (k.time_s - o.time_s).abs() < 1e-3);
        if let Some(k) = at_kill {
            o.resident_sites = Some(k.sites.clone());
        }
    }
    let d = |k: DropKind| drops.get(k as usize).copied().unwrap_or(0);
    let mut s = r.summary.clone();
    s.counter_error_bytes = counter_error_bytes(&summary.probes);
    s.dropped_pages += d(DropKind::PageSampleRingFull);
    s.dropped_snapshots += d(DropKind::RssRingFull);
    if s.sample_period > 0 {
        s.files = crate::report::resident_files();
        summary.resident = Some(s);
    }
}
