//! A hand-filled [`AggregateSource`] for unit tests: events replayed from a
//! queue, aggregates read from plain maps. Pids above the kernel's
//! `PID_MAX_LIMIT` (4194304) keep /proc out of the picture.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use vmtrace_common::{
    EventHeader, EventKind, FaultStats, GranuleCounts, GranuleKey, MmStackCounts, MmStackKey, MmStats, OomEvent,
    StackCounts, StackKey, TaskEvent, COMM_LEN,
};

use super::AggregateSource;
use crate::model::ProbeInfo;

/// The first pid no kernel can have.
pub const NO_SUCH_PID: u32 = 4_194_305;

#[derive(Default)]
pub struct FakeSource {
    pub events: VecDeque<Vec<u8>>,
    pub minor_period: u32,
    pub fast_period: u32,
    pub traced: BTreeSet<u32>,
    pub stats: BTreeMap<u32, FaultStats>,
    pub mm: BTreeMap<u32, MmStats>,
    pub totals: (u64, u64),
    pub drops: Vec<u64>,
    pub stack_counts: Vec<(StackKey, StackCounts)>,
    pub mm_stacks: Vec<(MmStackKey, MmStackCounts)>,
    pub kernel_stacks: HashMap<i32, Vec<u64>>,
    pub user_stacks: HashMap<i32, Vec<u64>>,
    pub granules: Vec<(GranuleKey, GranuleCounts)>,
    pub probes: Vec<ProbeInfo>,
    /// `TP_OFFSETS`; `None`: the table's (every field in the records, as on 6.18).
    pub tp_offsets: Option<vmtrace_common::TpOffsets>,
    /// `AggregateSource::cow_copies_seen`.
    pub cow_copies: bool,
    /// `RSS_MM`: (mm id, counters).
    pub rss: Vec<(u32, vmtrace_common::RssMm)>,
    /// User stacks `forget_stacks` (when among its `also`) and
    /// `sweep_stacks` let go, unless in use: taken out of `user_stacks`,
    /// as the drained tables let a stack go once nothing counts under it.
    /// Empty: every stack is kept.
    pub let_go: crate::hash::HashSet<i32>,
}

/// The bytes of a `#[repr(C)]` event, as the ring buffer carries them.
pub fn bytes_of<T: aya::Pod>(v: &T) -> Vec<u8> {
    // SAFETY: T is Pod: plain integers, no padding the kernel would not also send.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

fn comm(name: &str) -> [u8; COMM_LEN] {
    let mut c = [0u8; COMM_LEN];
    let n = name.len().min(COMM_LEN - 1);
    c[..n].copy_from_slice(&name.as_bytes()[..n]);
    c
}

fn header(kind: EventKind, ts_ns: u64, size: usize) -> EventHeader {
    EventHeader { kind: kind as u32, size: size as u32, ts_ns }
}

/// A task event with the given identity; exit fields left at "alive".
pub fn task(kind: EventKind, pid: u32, tgid: u32, ppid: u32, name: &str) -> TaskEvent {
    TaskEvent {
        hdr: header(kind, 0, std::mem::size_of::<TaskEvent>()),
        pid,
        tgid,
        ppid,
        comm: comm(name),
        ..TaskEvent::EMPTY
    }
}

/// The last thread of `tgid` exiting with wait(2)'s `status`.
pub fn exit(tgid: u32, status: u32, name: &str) -> TaskEvent {
    TaskEvent { exit_code: status, group_dead: 1, ..task(EventKind::TaskExit, tgid, tgid, 0, name) }
}

/// A mapping change (`call`) of `[addr, addr + len)` by `tgid` (its
/// leader thread) at kernel time 2: anonymous (`fd` -1), no protection,
/// flags or generations.
pub fn mm_change(tgid: u32, call: vmtrace_common::MmCall, addr: u64, len: u64) -> vmtrace_common::MmEvent {
    vmtrace_common::MmEvent {
        hdr: header(EventKind::MmMapChange, 2, std::mem::size_of::<vmtrace_common::MmEvent>()),
        tgid,
        call: call as u32,
        addr,
        len,
        prot: 0,
        flags: 0,
        fd: u64::MAX,
        offset: 0,
        old_addr: 0,
        old_len: 0,
        gen_enter: 0,
        gen_exit: 0,
        dev: 0,
        tid: tgid,
        ino: 0,
        start_ns: 0,
    }
}

/// An OOM kill of `victim` at kernel time `ts_ns`.
pub fn oom_kill(victim: u32, name: &str, ts_ns: u64, anon_rss_kb: u64) -> OomEvent {
    // SAFETY: OomEvent is Pod (integers and byte arrays): all zeros is valid.
    let mut ev: OomEvent = unsafe { std::mem::zeroed() };
    ev.hdr = header(EventKind::OomMarkVictim, ts_ns, std::mem::size_of::<OomEvent>());
    ev.victim_pid = victim;
    ev.trigger_tgid = victim;
    ev.trigger_tid = victim;
    ev.victim_comm = comm(name);
    ev.trigger_comm = comm(name);
    ev.anon_rss_kb = anon_rss_kb;
    ev.total_vm_kb = anon_rss_kb * 2;
    ev
}

/// A call of the locking family by pid `NO_SUCH_PID` (thread 1)
/// returning `ret`, with `locked_pages` of `mm->locked_vm` after it.
pub fn lock_call(call: vmtrace_common::MmCall, ret: i64, len: u64, locked_pages: u64) -> vmtrace_common::MmLockEvent {
    vmtrace_common::MmLockEvent {
        hdr: header(EventKind::MmLock, 2_000_000_000, std::mem::size_of::<vmtrace_common::MmLockEvent>()),
        tgid: NO_SUCH_PID,
        tid: 1,
        call: call as u32,
        user_stack: 7,
        ret,
        addr: 0x1000,
        len,
        flags: 0,
        locked_pages,
        pinned_pages: 0,
        start_ns: 0,
        memlock_cur: 0,
        memlock_max: 0,
        memlock_read: 0,
        _pad: 0,
    }
}

impl FakeSource {
    pub fn new(minor_period: u32) -> Self {
        Self { minor_period, ..Self::default() }
    }

    /// Queues one event for the next drain.
    pub fn push<T: aya::Pod>(&mut self, ev: &T) {
        self.events.push_back(bytes_of(ev));
    }
}

impl AggregateSource for FakeSource {
    fn wait_for_events(&self, _timeout: Duration) {}

    fn drain_events(&mut self, on_event: &mut dyn FnMut(&[u8])) {
        while let Some(e) = self.events.pop_front() {
            on_event(&e);
        }
    }

    fn minor_period(&self) -> u32 {
        self.minor_period
    }

    fn fast_period(&self) -> u32 {
        self.fast_period
    }

    fn page_salt(&self) -> u64 {
        // Fixed: the fake's pages are sampled the same way in every run.
        0x5eed
    }

    fn tp_offsets(&self) -> vmtrace_common::TpOffsets {
        self.tp_offsets.unwrap_or(vmtrace_common::TpOffsets::TABLE)
    }

    fn cow_copies_seen(&self) -> bool {
        self.cow_copies
    }

    fn probe_info(&self) -> Vec<ProbeInfo> {
        self.probes.clone()
    }

    fn is_traced(&self, tgid: u32) -> bool {
        self.traced.contains(&tgid) || self.stats.contains_key(&tgid)
    }

    fn stats_of(&self, tgid: u32) -> Option<FaultStats> {
        self.stats.get(&tgid).copied()
    }

    fn all_stats(&self) -> Vec<(u32, FaultStats)> {
        self.stats.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn take_stats(&mut self, tgid: u32) -> Option<FaultStats> {
        self.stats.remove(&tgid)
    }

    fn all_mm(&self) -> Vec<(u32, MmStats)> {
        self.mm.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn take_mm(&mut self, tgid: u32) -> Option<MmStats> {
        self.mm.remove(&tgid)
    }

    fn totals(&self) -> (u64, u64) {
        self.totals
    }

    fn drops(&self) -> Vec<u64> {
        self.drops.clone()
    }

    fn all_stack_counts(&self) -> Vec<(StackKey, StackCounts)> {
        self.stack_counts.clone()
    }

    fn stack_keys_of(&self, tgids: &crate::hash::HashSet<u32>) -> Vec<StackKey> {
        self.stack_counts.iter().map(|(k, _)| *k).filter(|k| tgids.contains(&k.tgid)).collect()
    }

    fn stacks_in_flight(&self) -> crate::hash::HashSet<u32> {
        crate::hash::HashSet::default()
    }

    fn take_stack_counts(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(StackKey, StackCounts)> {
        let (out, kept) =
            std::mem::take(&mut self.stack_counts).into_iter().partition(|(k, _)| tgids.contains(&k.tgid));
        self.stack_counts = kept;
        out
    }

    /// The fake drains nothing: every count of `tgid` is settled.
    fn take_settled_counts(&mut self, tgid: u32, _min_age: u64) -> Vec<(StackKey, StackCounts)> {
        let (out, kept) = std::mem::take(&mut self.stack_counts).into_iter().partition(|(k, _)| k.tgid == tgid);
        self.stack_counts = kept;
        out
    }

    fn all_mm_stacks(&self) -> Vec<(MmStackKey, MmStackCounts)> {
        self.mm_stacks.clone()
    }

    fn take_mm_stacks(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(MmStackKey, MmStackCounts)> {
        let (taken, kept) = std::mem::take(&mut self.mm_stacks).into_iter().partition(|(k, _)| tgids.contains(&k.tgid));
        self.mm_stacks = kept;
        taken
    }

    fn take_mm_sites(&mut self, keys: Vec<MmStackKey>) -> Vec<(MmStackKey, MmStackCounts)> {
        let (taken, kept) = std::mem::take(&mut self.mm_stacks).into_iter().partition(|(k, _)| keys.contains(k));
        self.mm_stacks = kept;
        taken
    }

    fn stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        self.kernel_stacks.get(&id).cloned()
    }

    fn user_stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        self.user_stacks.get(&id).cloned()
    }

    fn all_granules(&self) -> Vec<(GranuleKey, GranuleCounts)> {
        self.granules.clone()
    }

    fn take_granules(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(GranuleKey, GranuleCounts)> {
        let (taken, kept) = std::mem::take(&mut self.granules).into_iter().partition(|(k, _)| tgids.contains(&k.tgid));
        self.granules = kept;
        taken
    }

    fn page_cache_chunks(&self) -> Vec<(vmtrace_common::FileChunkKey, u64)> {
        Vec::new()
    }

    fn page_cache_added(&self, _dev: u32, _ino: u64) -> Option<u64> {
        None
    }

    // What the fake has none of: Python frames, stored stacks, per-CPU
    // shootdowns, in-flight granules, generations, written pages, resident
    // counters and kernel-side logs.
    fn flush_logs(&mut self) {}

    fn received_per_cpu(&self) -> Vec<u64> {
        Vec::new()
    }

    fn register_python(&mut self, _tgid: u32, _p: &vmtrace_common::PyProc) -> bool {
        false
    }

    fn forget_python(&mut self, _tgid: u32) {}

    fn new_python_stacks(&mut self) -> Vec<crate::python::PyStack> {
        Vec::new()
    }

    fn stored_python_stacks(&mut self, _ids: &[u32]) -> Vec<crate::python::PyStack> {
        Vec::new()
    }

    fn python_stack(&self, _id: i32) -> Option<crate::python::PyStack> {
        None
    }

    fn drain_stacks(&mut self) -> Vec<crate::python::PyStack> {
        Vec::new()
    }

    fn forget_stacks(&mut self, users: &crate::loader::StackUsers, _keep: &dyn Fn(u32) -> bool) -> usize {
        let go = |id: &i32| u32::try_from(*id).is_ok_and(|u| users.also.contains(&u) && !users.in_use.contains(&u));
        let ids: Vec<i32> = self.let_go.iter().copied().filter(go).collect();
        ids.iter().filter(|id| self.user_stacks.remove(id).is_some()).count()
    }

    fn sweep_stacks(&mut self, in_use: crate::hash::HashSet<u32>, _min_age: u64) -> usize {
        let go = |id: &i32| u32::try_from(*id).is_ok_and(|u| !in_use.contains(&u));
        let ids: Vec<i32> = self.let_go.iter().copied().filter(go).collect();
        ids.iter().filter(|id| self.user_stacks.remove(id).is_some()).count()
    }

    fn drained_stacks(&self) -> (u64, usize, usize) {
        (0, 0, 0)
    }

    fn drained_stacks_of(&self, _: &crate::hash::HashSet<u32>, _: crate::hash::HashSet<u32>) -> usize {
        0
    }

    fn granules_in_flight(&self) -> crate::hash::HashSet<u32> {
        crate::hash::HashSet::default()
    }

    fn map_gen(&self, _tgid: u32) -> Option<u32> {
        None
    }

    fn page_cache_written(&self, _dev: u32, _ino: u64) -> Option<u64> {
        None
    }

    fn all_rss(&self) -> Vec<(u32, vmtrace_common::RssMm)> {
        self.rss.clone()
    }

    fn forget_rss(&mut self, _mm_id: u32) {}
}
