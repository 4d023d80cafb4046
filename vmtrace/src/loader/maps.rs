//! The maps userspace reads, behind the methods the collector uses: each
//! reader sums per-CPU values and folds in what the programs still hold in
//! their per-CPU "current" slots.
use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use aya::{
    maps::{ring_buf::RingBufItem, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf, StackTraceMap},
    Ebpf,
};
use vmtrace_common::{
    FaultStats, FileKey, GranuleCounts, GranuleCur, GranuleKey, Merge, MmStackCounts, MmStackKey, MmStats, StackCounts,
    StackCur, StackKey,
};

use super::{
    batch::{self, Values},
    AggregateSource, LoadError, Probes,
};
use crate::model::ProbeInfo;

pub(super) struct Maps {
    fault_stats: PerCpuHashMap<MapData, u32, FaultStats>,
    drops: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
    /// Copied user stacks (`StackSample`), to unwind.
    stack_samples: RingBuf<MapData>,
    /// Buffers of the samples `drain_events` read ahead (`copy_buffer`),
    /// kept for the next drain's: freshly allocated each time, their pages
    /// were faulted in anew after each trim, most of the collector's own
    /// faults under churn (mem32: 470k of 718k in 150 s, the memcpy and
    /// malloc under `PageCopies::copy_for`).
    spare_copies: Vec<Vec<u8>>,
    fault_stacks: PerCpuHashMap<MapData, StackKey, StackCounts>,
    stack_traces: StackTraceMap<MapData>,
    /// User stacks walked by the programs; `None`: they are in `stack_traces`.
    user_stacks: Option<aya::maps::HashMap<MapData, u32, vmtrace_common::UserStack>>,
    mm_stats: PerCpuHashMap<MapData, u32, MmStats>,
    /// Counts of processes whose `MM_STATS` entry the kernel refused
    /// (preallocated; added to theirs).
    mm_spill: PerCpuHashMap<MapData, u32, MmStats>,
    mm_stacks: PerCpuHashMap<MapData, MmStackKey, MmStackCounts>,
    totals: PerCpuArray<MapData, u64>,
    region_stats: PerCpuHashMap<MapData, GranuleKey, GranuleCounts>,
    region_late: PerCpuHashMap<MapData, GranuleKey, GranuleCounts>,
    granule_cur: PerCpuArray<MapData, GranuleCur>,
    stack_cur: PerCpuArray<MapData, StackCur>,
    control: aya::maps::Array<MapData, u32>,
    file_cache: PerCpuHashMap<MapData, FileKey, u64>,
    file_chunks: PerCpuHashMap<MapData, vmtrace_common::FileChunkKey, u64>,
    map_gen: aya::maps::Array<MapData, vmtrace_common::MapGenSlot>,
    map_gen_overflow: aya::maps::HashMap<MapData, u32, u32>,
    /// Python processes the programs take frames of (`PY_PROCS`).
    py_procs: aya::maps::HashMap<MapData, u32, vmtrace_common::PyProc>,
    /// `USER_STACKS` ids already looked at for Python frames.
    py_seen: crate::hash::HashSet<u32>,
    /// What `drain_stacks` moved out of `FAULT_STACKS` and `USER_STACKS`.
    drained: crate::stacks::drain::Drained,
    /// Resident counters per address space (`RSS_MM`).
    rss_mm: aya::maps::HashMap<MapData, u32, vmtrace_common::RssMm>,
    /// Each CPU's stacks stored lately (`RECENT`: hash, id, clean), to be
    /// cleared when drained stacks are let go.
    recent: Option<PerCpuArray<MapData, [u64; 2]>>,
    /// Each process's keys in `region_stats`/`region_late`.
    granule_index: super::granules::GranuleIndex,
    /// Second handles on `region_stats`/`region_late`, for
    /// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (aya 0.14 offers it for queues and
    /// stacks only); `None` once the kernel refused it (before 5.14).
    granule_fds: Option<[std::os::fd::OwnedFd; 2]>,
    /// Second handles on the maps read in batches (`batch`).
    batch: Batches,
}

/// Second handles on the hash maps read in batches (`loader::batch`), and
/// whether the kernel refused a batch once (then every map is walked key by
/// key, as aya does).
struct Batches {
    fault_stacks: Option<std::os::fd::OwnedFd>,
    user_stacks: Option<std::os::fd::OwnedFd>,
    mm_stacks: Option<std::os::fd::OwnedFd>,
    mm_stats: Option<std::os::fd::OwnedFd>,
    /// Possible CPUs: the per-CPU maps' value arrays.
    cpus: usize,
    refused: std::cell::Cell<bool>,
}

impl Batches {
    fn new(ebpf: &Ebpf) -> Self {
        Self {
            fault_stacks: map_fd(ebpf, "FAULT_STACKS"),
            user_stacks: map_fd(ebpf, "USER_STACKS"),
            mm_stacks: map_fd(ebpf, "MM_STACKS"),
            mm_stats: map_fd(ebpf, "MM_STATS"),
            cpus: aya::util::nr_cpus().unwrap_or(0),
            refused: std::cell::Cell::new(false),
        }
    }

    /// Every entry of the map `fd` (per-CPU values summed by `each` where
    /// `per_cpu`), removed when `delete`; false when it could not be read
    /// in batches (nothing was read or removed: walk it key by key).
    fn run<K: Copy, V: Copy>(
        &self,
        fd: Option<&std::os::fd::OwnedFd>,
        per_cpu: bool,
        delete: bool,
        each: impl FnMut(K, &[V]),
    ) -> bool {
        let Some(fd) = fd.filter(|_| !self.refused.get() && self.cpus > 0) else { return false };
        let values = if per_cpu { Values::PerCpu(self.cpus) } else { Values::Plain };
        if batch::for_each(fd.as_fd(), values, delete, each).is_some() {
            return true;
        }
        log::debug!("batched map reads refused: maps are walked key by key");
        self.refused.set(true);
        false
    }

    /// The keys of the per-CPU hash `map` (`fd`: its second handle) that
    /// `of` picks: in batches, else key by key.
    fn keys<K: aya::Pod, V: aya::Pod>(
        &self,
        fd: Option<&std::os::fd::OwnedFd>,
        map: &PerCpuHashMap<MapData, K, V>,
        of: impl Fn(&K) -> bool,
    ) -> Vec<K> {
        let mut keys = Vec::new();
        let batched = self.run(fd, true, false, |k: K, _: &[V]| {
            if of(&k) {
                keys.push(k);
            }
        });
        if !batched {
            keys = map.keys().filter_map(Result::ok).filter(|k| of(k)).collect();
        }
        keys
    }

    /// Every entry of the per-CPU hash `map` (`fd`: its second handle),
    /// its values summed over CPUs: in batches, else key by key.
    fn summed<K: aya::Pod, V: aya::Pod + Merge>(
        &self,
        fd: Option<&std::os::fd::OwnedFd>,
        map: &PerCpuHashMap<MapData, K, V>,
        mut each: impl FnMut(K, V),
    ) {
        if !self.run(fd, true, false, |k, v: &[V]| each(k, sum_cpus(v.iter()))) {
            for (k, v) in map.iter().filter_map(Result::ok) {
                each(k, sum_cpus(v.iter()));
            }
        }
    }
}

impl Maps {
    /// Takes the maps out of the loaded object; `own_user_stacks`: the
    /// programs walk user stacks into `USER_STACKS`.
    pub(super) fn take(ebpf: &mut Ebpf, own_user_stacks: bool) -> Result<Self, LoadError> {
        let batch = Batches::new(ebpf);
        Ok(Self {
            batch,
            fault_stats: take_map(ebpf, "FAULT_STATS")?,
            drops: take_map(ebpf, "DROPS")?,
            events: take_map(ebpf, "EVENTS")?,
            stack_samples: take_map(ebpf, "STACK_SAMPLES")?,
            spare_copies: Vec::new(),
            fault_stacks: take_map(ebpf, "FAULT_STACKS")?,
            stack_traces: take_map(ebpf, "STACKS")?,
            user_stacks: if own_user_stacks { Some(take_map(ebpf, "USER_STACKS")?) } else { None },
            mm_stats: take_map(ebpf, "MM_STATS")?,
            mm_spill: take_map(ebpf, "MM_SPILL")?,
            mm_stacks: take_map(ebpf, "MM_STACKS")?,
            totals: take_map(ebpf, "TOTALS")?,
            granule_fds: (|| Some([map_fd(ebpf, "REGION_STATS")?, map_fd(ebpf, "REGION_LATE")?]))(),
            region_stats: take_map(ebpf, "REGION_STATS")?,
            region_late: take_map(ebpf, "REGION_LATE")?,
            granule_cur: take_map(ebpf, "GRANULE_CUR")?,
            stack_cur: take_map(ebpf, "STACK_CUR")?,
            control: take_map(ebpf, "CONTROL")?,
            file_cache: take_map(ebpf, "FILE_CACHE")?,
            file_chunks: take_map(ebpf, "FILE_CHUNKS")?,
            map_gen: take_map(ebpf, "MAP_GEN")?,
            map_gen_overflow: take_map(ebpf, "MAP_GEN_OVERFLOW")?,
            py_procs: take_map(ebpf, "PY_PROCS")?,
            py_seen: crate::hash::HashSet::default(),
            drained: crate::stacks::drain::Drained::default(),
            rss_mm: take_map(ebpf, "RSS_MM")?,
            recent: take_map(ebpf, "RECENT").ok(),
            granule_index: super::granules::GranuleIndex::default(),
        })
    }
}

impl Probes {
    /// Empties every CPU's `RECENT` slots: a slot hands out an id without
    /// looking in `USER_STACKS`, so after ids were let go, a process walking
    /// one of those stacks again stores it again.
    fn clear_recent(&mut self) {
        if let (Some(recent), Ok(n)) = (self.maps.recent.as_mut(), aya::util::nr_cpus()) {
            for slot in 0..recent.len() {
                if let Ok(zeros) = aya::maps::PerCpuValues::try_from(vec![[0u64; 2]; n]) {
                    let _ = recent.set(slot, zeros, 0);
                }
            }
        }
    }

    /// The keys each CPU is still counting into (`STACK_CUR`), with counts
    /// not yet added to `FAULT_STACKS`.
    fn stack_keys_in_flight(&self) -> Vec<StackKey> {
        let mut out = Vec::new();
        for i in 0..vmtrace_common::STACK_CUR_SLOTS {
            let Ok(cur) = self.maps.stack_cur.get(&i, 0) else { continue };
            out.extend(cur.iter().filter(|c| c.counts.faults | c.counts.major | c.counts.timed != 0).map(|c| c.key));
        }
        out
    }

    /// The user stack ids the kernel still holds keys under for the
    /// processes `of` picks: counted (`FAULT_STACKS`), being counted
    /// (`STACK_CUR`) or call sites (`MM_STACKS`).
    fn kernel_stack_ids(&self, of: impl Fn(u32) -> bool) -> crate::hash::HashSet<u32> {
        let id = |s: i32| u32::try_from(s).ok();
        let b = &self.maps.batch;
        let fault = b.keys(b.fault_stacks.as_ref(), &self.maps.fault_stacks, |k| of(k.tgid));
        let mut ids: crate::hash::HashSet<u32> = fault.iter().filter_map(|k| id(k.user_stack)).collect();
        ids.extend(self.stack_keys_in_flight().iter().filter(|k| of(k.tgid)).filter_map(|k| id(k.user_stack)));
        let mm = b.keys(b.mm_stacks.as_ref(), &self.maps.mm_stacks, |k| of(k.tgid));
        ids.extend(mm.iter().filter_map(|k| id(k.user_stack)));
        ids
    }
}

fn take_map<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError> {
    ebpf.take_map(name).and_then(|m| T::try_from(m).ok()).ok_or(LoadError::Map(name))
}

/// A second handle on the per-CPU hash map `name`, still in `ebpf`.
fn map_fd(ebpf: &Ebpf, name: &str) -> Option<std::os::fd::OwnedFd> {
    match ebpf.map(name)? {
        aya::maps::Map::PerCpuHashMap(d) | aya::maps::Map::HashMap(d) => d.fd().as_fd().try_clone_to_owned().ok(),
        _ => None,
    }
}

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` on a per-CPU hash map: the entry's
/// per-CPU values, summed, and the entry gone, in one system call and
/// atomically (a lookup then a delete is two, and loses what a CPU adds
/// between them). `Ok(None)`: no such key. An error: the kernel does not
/// offer it for this map type (before 5.14) or another failure.
fn take_per_cpu<K: Copy, V: Copy + Default + Merge>(
    fd: std::os::fd::BorrowedFd,
    key: &K,
) -> std::io::Result<Option<V>> {
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    let stride = std::mem::size_of::<V>().next_multiple_of(8);
    let mut buf = vec![0u64; cpus * stride / 8];
    // `union bpf_attr` for element commands: map_fd (u32, padded), key, value, flags.
    let attr: [u64; 4] = [u64::from(fd.as_raw_fd() as u32), std::ptr::from_ref(key) as u64, buf.as_mut_ptr() as u64, 0];
    // SAFETY: `attr` points at a live key and a buffer the size of the map's
    // per-CPU value array (`round_up(value_size, 8)` per possible CPU).
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_AND_DELETE_ELEM, attr.as_ptr(), std::mem::size_of_val(&attr))
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) { Ok(None) } else { Err(e) };
    }
    let mut sum = V::default();
    for cpu in 0..cpus {
        // SAFETY: within `buf`; the values are plain integers (Pod).
        let v: V = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<u8>().add(cpu * stride).cast::<V>()) };
        sum.merge(&v);
    }
    Ok(Some(sum))
}

impl AggregateSource for Probes {
    fn wait_for_events(&self, timeout: Duration) {
        let mut pfd = [
            libc::pollfd { fd: self.ring_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.samples_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two valid pollfds; EINTR (a stop signal) simply returns early.
        unsafe { libc::poll(pfd.as_mut_ptr(), 2, timeout.as_millis() as i32) };
    }

    fn drain_events(&mut self, on_event: &mut dyn FnMut(&[u8])) {
        let mut copies = crate::stacks::native::PageCopies::default();
        let maps = &mut self.maps;
        // Before the drain: an event submitted after this wakes the
        // collector again (`CONTROL_WOKEN`); one submitted before is drained
        // now, or found by the next poll, which returns at once on a ring
        // that is not empty.
        if let Err(e) = maps.control.set(vmtrace_common::CONTROL_WOKEN, 0, 0) {
            log::debug!("cannot clear the wakeup flag: {e}");
        }
        while let Some(item) = maps.events.next() {
            // The granule keys' records stay here, in the loader's index.
            if let Some(ev) = granule_new(&item) {
                maps.granule_index.note(&ev.key, ev.late != 0);
                continue;
            }
            // A page whose fault's stack was copied: the copy (on the
            // samples ring, taken before the page's record was written) just
            // before it, so the page is owned by its own stack.
            if let Some(page) = crate::stacks::native::page_with_copy(&item) {
                let (samples, spare) = (&mut maps.stack_samples, &mut maps.spare_copies);
                if let Some(copy) = copies.copy_for(page, || samples.next().map(|s| copy_buffer(spare, &s))) {
                    on_event(&copy);
                    keep_buffer(&mut maps.spare_copies, copy);
                }
            }
            on_event(&item);
        }
        // After the events: a sample's process is known (and its maps read) first.
        for item in copies.rest() {
            on_event(&item);
            keep_buffer(&mut maps.spare_copies, item);
        }
        while let Some(item) = self.next_sample() {
            on_event(&item);
        }
    }

    fn probe_info(&self) -> Vec<ProbeInfo> {
        self.attached()
            .iter()
            .map(|a| ProbeInfo {
                what: a.what.into(),
                program_type: a.program_type().into(),
                target: a.target.clone(),
                fallback_reason: a.fallback_reason().map(Into::into),
            })
            .collect()
    }

    fn flush_logs(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    fn minor_period(&self) -> u32 {
        self.minor_period
    }

    fn populated_seen(&self) -> bool {
        Probes::populated_seen(self)
    }

    fn cow_copies_seen(&self) -> bool {
        Probes::cow_copies_seen(self)
    }

    fn fast_period(&self) -> u32 {
        self.fast_period
    }

    fn page_salt(&self) -> u64 {
        self.page_salt
    }

    fn tp_offsets(&self) -> vmtrace_common::TpOffsets {
        self.tp_offsets
    }

    /// Every address space's resident counters (`RSS_MM`), by `mm_id`.
    fn all_rss(&self) -> Vec<(u32, vmtrace_common::RssMm)> {
        self.maps.rss_mm.iter().filter_map(Result::ok).collect()
    }

    /// Forgets an address space's resident counters.
    fn forget_rss(&mut self, mm_id: u32) {
        let _ = self.maps.rss_mm.remove(&mm_id);
    }

    /// Whether `tgid` is in the traced set.
    fn is_traced(&self, tgid: u32) -> bool {
        self.maps.fault_stats.get(&tgid, 0).is_ok()
    }

    /// One process's aggregate, summed over CPUs, left in the map.
    fn stats_of(&self, tgid: u32) -> Option<FaultStats> {
        self.maps.fault_stats.get(&tgid, 0).ok().map(|v| sum_cpus(v.iter()))
    }

    /// Reads and deletes an exited process's aggregate, summed over CPUs.
    fn take_stats(&mut self, tgid: u32) -> Option<FaultStats> {
        let per_cpu = self.maps.fault_stats.get(&tgid, 0).ok()?;
        let _ = self.maps.fault_stats.remove(&tgid);
        Some(sum_cpus(per_cpu.iter()))
    }

    /// Every aggregate still in the kernel map, summed over CPUs.
    fn all_stats(&self) -> Vec<(u32, FaultStats)> {
        let mut out = Vec::new();
        for item in self.maps.fault_stats.iter() {
            match item {
                Ok((tgid, per_cpu)) => out.push((tgid, sum_cpus(per_cpu.iter()))),
                Err(e) => log::warn!("reading FAULT_STATS: {e}"),
            }
        }
        out
    }

    /// Reads and deletes an exited process's mmap/TLB aggregate.
    fn take_mm(&mut self, tgid: u32) -> Option<MmStats> {
        let mut out: Option<MmStats> = None;
        for map in [&mut self.maps.mm_stats, &mut self.maps.mm_spill] {
            if let Ok(per_cpu) = map.get(&tgid, 0) {
                let _ = map.remove(&tgid);
                let v = sum_cpus(per_cpu.iter());
                match out.as_mut() {
                    Some(o) => o.merge(&v),
                    None => out = Some(v),
                }
            }
        }
        out
    }

    /// Every mmap/TLB aggregate still in the kernel map.
    fn all_mm(&self) -> Vec<(u32, MmStats)> {
        let mut out = Vec::new();
        let b = &self.maps.batch;
        b.summed(b.mm_stats.as_ref(), &self.maps.mm_stats, |k, v| out.push((k, v)));
        for (tgid, per_cpu) in self.maps.mm_spill.iter().filter_map(Result::ok) {
            let v = sum_cpus(per_cpu.iter());
            match out.iter_mut().find(|(k, _)| *k == tgid) {
                Some((_, o)) => o.merge(&v),
                None => out.push((tgid, v)),
            }
        }
        out
    }

    /// Shootdowns received (`tlb_flush` reason 1) per CPU, over every
    /// mmap/TLB aggregate still held.
    fn received_per_cpu(&self) -> Vec<u64> {
        let mut per_cpu: Vec<Vec<MmStats>> = Vec::new();
        let b = &self.maps.batch;
        if !b.run(b.mm_stats.as_ref(), true, false, |_: u32, v: &[MmStats]| per_cpu.push(v.to_vec())) {
            per_cpu =
                self.maps.mm_stats.iter().filter_map(Result::ok).map(|(_, v)| v.iter().copied().collect()).collect();
        }
        per_cpu.extend(self.maps.mm_spill.iter().filter_map(Result::ok).map(|(_, v)| v.iter().copied().collect()));
        received_by_cpu(per_cpu.iter().map(Vec::as_slice))
    }

    /// Call-site counts of mmap-family syscalls, summed over CPUs.
    fn all_mm_stacks(&self) -> Vec<(MmStackKey, MmStackCounts)> {
        let mut out = Vec::new();
        let b = &self.maps.batch;
        b.summed(b.mm_stacks.as_ref(), &self.maps.mm_stacks, |k, v| out.push((k, v)));
        out
    }

    fn stack_keys_of(&self, tgids: &crate::hash::HashSet<u32>) -> Vec<StackKey> {
        let mut keys: crate::hash::HashSet<StackKey> = self.maps.drained.keys_of(tgids).collect();
        let b = &self.maps.batch;
        keys.extend(b.keys(b.fault_stacks.as_ref(), &self.maps.fault_stacks, |k| tgids.contains(&k.tgid)));
        keys.into_iter().collect()
    }

    fn stacks_in_flight(&self) -> crate::hash::HashSet<u32> {
        self.stack_keys_in_flight().iter().map(|k| k.tgid).collect()
    }

    /// A released process's keys were drained long before (every 100 ms):
    /// the drained tables hold all of them.
    fn take_stack_counts(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(StackKey, StackCounts)> {
        self.maps.drained.take_counts(tgids)
    }

    fn take_settled_counts(&mut self, tgid: u32, min_age: u64) -> Vec<(StackKey, StackCounts)> {
        self.maps.drained.take_settled(tgid, min_age)
    }

    fn take_mm_stacks(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(MmStackKey, MmStackCounts)> {
        let b = &self.maps.batch;
        let keys = b.keys(b.mm_stacks.as_ref(), &self.maps.mm_stacks, |k| tgids.contains(&k.tgid));
        self.take_mm_sites(keys)
    }

    fn take_mm_sites(&mut self, keys: Vec<MmStackKey>) -> Vec<(MmStackKey, MmStackCounts)> {
        let b = &self.maps.batch;
        let mut out = Vec::new();
        let mut rest = Vec::new();
        match b.mm_stacks.as_ref().filter(|_| self.maps.granule_fds.is_some()) {
            // One system call per key, and nothing a CPU adds in between lost.
            Some(fd) => {
                for k in keys {
                    match take_per_cpu::<MmStackKey, MmStackCounts>(fd.as_fd(), &k) {
                        Ok(Some(v)) => out.push((k, v)),
                        Ok(None) => {}
                        Err(_) => rest.push(k),
                    }
                }
            }
            None => rest = keys,
        }
        for k in rest {
            if let Ok(v) = self.maps.mm_stacks.get(&k, 0) {
                if self.maps.mm_stacks.remove(&k).is_ok() {
                    out.push((k, sum_cpus(v.iter())));
                }
            }
        }
        out
    }

    /// Every stack aggregate, summed over CPUs, with the keys each CPU is
    /// still counting into.
    fn all_stack_counts(&self) -> Vec<(StackKey, StackCounts)> {
        let mut all: crate::hash::HashMap<StackKey, StackCounts> = crate::hash::HashMap::default();
        self.maps.drained.merge_into(&mut all);
        let b = &self.maps.batch;
        b.summed(b.fault_stacks.as_ref(), &self.maps.fault_stacks, |k, v| all.entry(k).or_default().merge(&v));
        for i in 0..vmtrace_common::STACK_CUR_SLOTS {
            let Ok(cur) = self.maps.stack_cur.get(&i, 0) else { continue };
            for c in cur.iter().filter(|c| c.counts.faults | c.counts.major | c.counts.timed != 0) {
                all.entry(c.key).or_default().merge(&c.counts);
            }
        }
        all.into_iter().collect()
    }

    /// Instruction pointers of stack `id`, innermost first.
    fn stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        self.maps.stack_traces.get(&id, 0).ok().map(|t| t.frames().iter().map(|f| f.ip).collect())
    }

    /// A user stack's frames, innermost first: walked by the programs
    /// (`OWN_STACK_ID` set), else by the kernel (32-bit tasks, old kernels).
    fn user_stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        let Some(map) = self.maps.user_stacks.as_ref().filter(|_| id & vmtrace_common::OWN_STACK_ID != 0) else {
            return self.stack_ips(id as i32);
        };
        let Ok(s) = map.get(&id, 0) else { return self.maps.drained.ips(id) };
        Some(s.ips[..(s.nr as usize).min(s.ips.len())].to_vec())
    }

    /// Moves the stack counts and the walked user stacks out of the kernel
    /// maps into userspace tables (`stacks::drain`), so the maps only hold
    /// what came since the last drain; returns the Python frames of stacks
    /// not looked at yet, for their code objects to be read. A count the
    /// programs add to a key between its read and its removal (a few
    /// instructions' window) is lost: the stacks test measures it.
    fn drain_stacks(&mut self) -> Vec<crate::python::PyStack> {
        self.maps.drained.next_drain();
        let mut moved = false;
        let (b, drained) = (&self.maps.batch, &mut self.maps.drained);
        let batched = b.run(b.fault_stacks.as_ref(), true, true, |k, v: &[StackCounts]| {
            moved = true;
            drained.add_counts(k, &sum_cpus(v.iter()));
        });
        if !batched {
            let keys: Vec<StackKey> = self.maps.fault_stacks.keys().filter_map(Result::ok).collect();
            moved = !keys.is_empty();
            for k in keys {
                if let Ok(v) = self.maps.fault_stacks.get(&k, 0) {
                    if self.maps.fault_stacks.remove(&k).is_ok() {
                        self.maps.drained.add_counts(k, &sum_cpus(v.iter()));
                    }
                }
            }
        }
        let mut fresh = Vec::new();
        let (b, drained, seen) = (&self.maps.batch, &mut self.maps.drained, &mut self.maps.py_seen);
        let batched = self.maps.user_stacks.is_some()
            && b.run(b.user_stacks.as_ref(), false, true, |id: u32, s: &[vmtrace_common::UserStack]| {
                let s = &s[0];
                moved = true;
                let py = py_stack(s);
                let ips = &s.ips[..(s.nr as usize).min(s.ips.len())];
                drained.add_stack(id, s.hash, ips, py.as_ref());
                if let Some(p) = py.filter(|_| seen.insert(id)) {
                    fresh.push(p);
                }
            });
        if let Some(map) = self.maps.user_stacks.as_mut().filter(|_| !batched) {
            let ids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
            moved |= !ids.is_empty();
            for id in ids {
                let Ok(s) = map.get(&id, 0) else { continue };
                let py = py_stack(&s);
                let ips = &s.ips[..(s.nr as usize).min(s.ips.len())];
                self.maps.drained.add_stack(id, s.hash, ips, py.as_ref());
                let _ = map.remove(&id);
                if let Some(p) = py.filter(|_| self.maps.py_seen.insert(id)) {
                    fresh.push(p);
                }
            }
        }
        self.maps.drained.drains += u64::from(moved);
        fresh
    }

    /// A CPU's `RECENT` slot hands out an id without looking in
    /// `USER_STACKS`: once ids are let go, the slots are cleared, so that a
    /// live process walking the same stack (a fork child of the one
    /// released) stores it again instead of counting under a forgotten id.
    fn forget_stacks(&mut self, users: &super::source::StackUsers, keep: &dyn Fn(u32) -> bool) -> usize {
        let gone = &users.gone;
        if gone.is_empty() && users.also.is_empty() {
            return 0;
        }
        // First the slots, then the keys still in the kernel (counted, or
        // in flight in a CPU's `STACK_CUR`): an id handed out before the
        // slots were cleared is in one of them.
        self.clear_recent();
        // The call sites of processes still running count as theirs.
        let mut kept = self.kernel_stack_ids(|t| !gone.contains(&t));
        kept.extend(users.in_use.iter().copied());
        let ids = self.maps.drained.forget_stacks(gone, keep, &kept, &users.also);
        for id in &ids {
            self.maps.py_seen.remove(id);
        }
        ids.len()
    }

    fn sweep_stacks(&mut self, mut referenced: crate::hash::HashSet<u32>, min_age: u64) -> usize {
        // As `forget_stacks`: first the slots (no CPU hands out an id
        // unstored from then on), then the keys still in the kernel, where
        // an id handed out before is: counted or in flight, or a running
        // process's call site.
        self.clear_recent();
        referenced.extend(self.kernel_stack_ids(|_| true));
        let ids = self.maps.drained.sweep(&referenced, min_age);
        for id in &ids {
            self.maps.py_seen.remove(id);
        }
        ids.len()
    }

    fn swept_stacks(&self) -> u64 {
        self.maps.drained.swept
    }

    /// Faults counted under a stack id that two stacks came to share
    /// across a drain (`stacks::drain`), and the distinct stacks drained.
    fn drained_stacks(&self) -> (u64, usize, usize) {
        let d = &self.maps.drained;
        (d.reused_faults(), d.stacks(), d.frame_bytes())
    }

    fn drained_by_tgid(&self) -> Vec<(u32, usize, usize)> {
        self.maps.drained.keys_by_tgid()
    }

    fn drained_stacks_of(&self, tgids: &crate::hash::HashSet<u32>, mut ids: crate::hash::HashSet<u32>) -> usize {
        ids.extend(self.maps.drained.keys_of(tgids).filter_map(|k| u32::try_from(k.user_stack).ok()));
        ids.extend(self.kernel_stack_ids(|t| tgids.contains(&t)));
        self.maps.drained.held_of(&ids)
    }

    /// Has the programs take the Python frames of `tgid`.
    fn register_python(&mut self, tgid: u32, p: &vmtrace_common::PyProc) -> bool {
        self.maps.user_stacks.is_some() && self.maps.py_procs.insert(tgid, *p, 0).is_ok()
    }

    /// Stops taking the Python frames of `tgid` (it exited or exec'd).
    fn forget_python(&mut self, tgid: u32) {
        let _ = self.maps.py_procs.remove(&tgid);
    }

    /// The Python frames of stacks stored since the last call.
    fn new_python_stacks(&mut self) -> Vec<crate::python::PyStack> {
        let Some(map) = self.maps.user_stacks.as_ref() else { return Vec::new() };
        let mut out = Vec::new();
        let (b, seen) = (&self.maps.batch, &mut self.maps.py_seen);
        let batched = b.run(b.user_stacks.as_ref(), false, false, |id: u32, s: &[vmtrace_common::UserStack]| {
            if seen.insert(id) {
                out.extend(py_stack(&s[0]));
            }
        });
        if batched {
            return out;
        }
        let fresh: Vec<u32> = map.keys().filter_map(Result::ok).filter(|k| !self.maps.py_seen.contains(k)).collect();
        for id in fresh {
            let Ok(s) = map.get(&id, 0) else { continue };
            self.maps.py_seen.insert(id);
            if let Some(p) = py_stack(&s) {
                out.push(p);
            }
        }
        out
    }

    /// The Python frames of the stacks `ids` (the programs announced them).
    fn stored_python_stacks(&mut self, ids: &[u32]) -> Vec<crate::python::PyStack> {
        let Some(map) = self.maps.user_stacks.as_ref() else { return Vec::new() };
        let mut out = Vec::new();
        for &id in ids {
            if !self.maps.py_seen.insert(id) {
                continue;
            }
            if let Some(p) = map.get(&id, 0).ok().as_ref().and_then(py_stack) {
                out.push(p);
            }
        }
        out
    }

    /// The Python frames stored with user stack `id`.
    fn python_stack(&self, id: i32) -> Option<crate::python::PyStack> {
        let id = u32::try_from(id).ok().filter(|id| id & vmtrace_common::OWN_STACK_ID != 0)?;
        match self.maps.user_stacks.as_ref()?.get(&id, 0) {
            Ok(s) => py_stack(&s),
            Err(_) => self.maps.drained.python(id),
        }
    }

    /// Every granule's counts, summed over CPUs, with the granules each CPU
    /// is still counting into.
    fn all_granules(&self) -> Vec<(GranuleKey, GranuleCounts)> {
        let mut all: std::collections::BTreeMap<GranuleKey, GranuleCounts> = std::collections::BTreeMap::new();
        for (k, v) in self.maps.region_stats.iter().chain(self.maps.region_late.iter()).filter_map(Result::ok) {
            all.entry(k).or_default().merge(&sum_cpus(v.iter()));
        }
        if let Ok(cur) = self.maps.granule_cur.get(&0, 0) {
            for c in
                cur.iter().filter(|c| c.counts.faults | c.counts.major | c.counts.timed | u64::from(c.counts.huge) != 0)
            {
                all.entry(c.key).or_default().merge(&c.counts);
            }
        }
        all.into_iter().collect()
    }

    /// Takes the granules of exited processes `tgids` out of the kernel maps
    /// (`REGION_STATS`, `REGION_LATE`), summed over CPUs: their counts are
    /// final, and the maps then hold what is live. A process whose granule a
    /// CPU still counts into (`GRANULE_CUR`) is left for a later call
    /// ([`Self::granules_in_flight`]).
    fn take_granules(&mut self, tgids: &crate::hash::HashSet<u32>) -> Vec<(GranuleKey, GranuleCounts)> {
        let lost = self
            .maps
            .drops
            .get(&(vmtrace_common::DropKind::GranuleKeyRingFull as u32), 0)
            .map_or(0, |v| v.iter().sum());
        if self.maps.granule_index.needs_walk(lost) {
            // Records were lost: the index may miss keys, a walk finds them all.
            let t = std::time::Instant::now();
            let stats = self.maps.region_stats.keys().filter_map(Result::ok).map(|k| (k, false));
            let walked: Vec<_> =
                stats.chain(self.maps.region_late.keys().filter_map(Result::ok).map(|k| (k, true))).collect();
            self.maps.granule_index.rebuild(walked, lost);
            log::debug!(
                target: "vmtrace::retire",
                "granule key records lost ({lost} so far): the maps walked in {:?}, {} keys",
                t.elapsed(),
                self.maps.granule_index.len()
            );
        }
        let mut out: std::collections::BTreeMap<GranuleKey, GranuleCounts> = std::collections::BTreeMap::new();
        for (k, late) in self.maps.granule_index.take(tgids) {
            if let Some(fds) = &self.maps.granule_fds {
                match take_per_cpu::<GranuleKey, GranuleCounts>(fds[usize::from(late)].as_fd(), &k) {
                    Ok(Some(v)) => {
                        out.entry(k).or_default().merge(&v);
                        continue;
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        log::debug!(target: "vmtrace::retire", "lookup-and-delete refused ({e}): lookup, then delete");
                        self.maps.granule_fds = None;
                    }
                }
            }
            let map = if late { &mut self.maps.region_late } else { &mut self.maps.region_stats };
            if let Ok(v) = map.get(&k, 0) {
                if map.remove(&k).is_ok() {
                    out.entry(k).or_default().merge(&sum_cpus(v.iter()));
                }
            }
        }
        out.into_iter().collect()
    }

    /// Processes a CPU's current granule still holds counts of (not yet
    /// moved into `REGION_STATS`).
    fn granules_in_flight(&self) -> crate::hash::HashSet<u32> {
        let Ok(cur) = self.maps.granule_cur.get(&0, 0) else { return crate::hash::HashSet::default() };
        cur.iter()
            .filter(|c| c.counts.faults | c.counts.major | c.counts.timed | u64::from(c.counts.huge) != 0)
            .map(|c| c.key.tgid)
            .collect()
    }

    /// `tgid`'s address-space generation now (see vmtrace-ebpf/src/mapgen.rs);
    /// `None` once counting stopped, when changes go unseen.
    fn map_gen(&self, tgid: u32) -> Option<u32> {
        if self.maps.control.get(&0, 0).ok()? == vmtrace_common::CONTROL_STOPPED {
            return None;
        }
        let v = self.maps.map_gen.get(&(tgid & (vmtrace_common::MAP_GEN_SLOTS - 1)), 0).ok()?.tag_gen;
        if (v >> 32) as u32 == tgid {
            return Some(v as u32);
        }
        Some(self.maps.map_gen_overflow.get(&tgid, 0).unwrap_or(0))
    }

    /// Page-cache additions per file chunk, summed over CPUs.
    fn page_cache_chunks(&self) -> Vec<(vmtrace_common::FileChunkKey, u64)> {
        self.maps.file_chunks.iter().filter_map(Result::ok).map(|(k, v)| (k, v.iter().sum())).collect()
    }

    /// Pages traced processes added to the page cache for a file to be read
    /// from storage.
    fn page_cache_added(&self, dev: u32, ino: u64) -> Option<u64> {
        let key = FileKey { dev, kind: vmtrace_common::FILE_KEY_READ, ino };
        self.maps.file_cache.get(&key, 0).ok().map(|v| v.iter().sum())
    }

    /// Pages their write syscalls added to the page cache for a file.
    fn page_cache_written(&self, dev: u32, ino: u64) -> Option<u64> {
        let key = FileKey { dev, kind: vmtrace_common::FILE_KEY_WRITTEN, ino };
        self.maps.file_cache.get(&key, 0).ok().map(|v| v.iter().sum())
    }

    /// (faults, majors) of all traced processes so far.
    fn totals(&self) -> (u64, u64) {
        let get = |i: u32| self.maps.totals.get(&i, 0).map_or(0, |v| v.iter().sum());
        (get(0), get(1))
    }

    /// Summed drop counters, indexed by `DropKind`.
    fn drops(&self) -> Vec<u64> {
        self.maps.drops.iter().map(|v| v.map_or(0, |per_cpu| per_cpu.iter().sum())).collect()
    }
}

/// What only the loaded programs do: the traced set, the counting switch,
/// the rings' fds (`trace::Tracer` and the source methods use them).
impl Probes {
    /// Adds a process to the traced set (a zeroed `FAULT_STATS` entry); its
    /// children follow in the kernel. One already there (a command followed
    /// from its fork, `follow_forks_of`) keeps what it counted.
    pub fn trace_pid(&mut self, tgid: u32) -> Result<(), aya::maps::MapError> {
        const BPF_NOEXIST: u64 = 1;
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| {
            aya::maps::MapError::SyscallError(aya::sys::SyscallError { call: "nr_cpus", io_error: e })
        })?;
        let zero = PerCpuValues::try_from(vec![FaultStats::default(); cpus])?;
        match self.maps.fault_stats.insert(tgid, zero, BPF_NOEXIST) {
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    /// While `Some(tgid)`, the kernel follows the forks of `tgid` as a
    /// traced process's (`CONTROL_LAUNCHER`): vmtrace sets its own pid
    /// around forking the command it starts, which is then counted from its
    /// fork, its first faults before the gate included (they were counted
    /// only when the pid was added before the child ran them: 8 of
    /// `/bin/true`'s 58 in one run of two).
    pub fn follow_forks_of(&mut self, tgid: Option<u32>) {
        if let Err(e) = self.maps.control.set(vmtrace_common::CONTROL_LAUNCHER, tgid.unwrap_or(0), 0) {
            log::warn!("cannot set the launcher whose forks are followed: {e}");
        }
    }

    /// Opens the window for `-a` (see `CONTROL_*`): call it once the kernel's
    /// own counters are open, so both count the same faults.
    pub fn start_counting(&mut self) {
        if let Err(e) = self.maps.control.set(0, vmtrace_common::CONTROL_RUNNING, 0) {
            log::warn!("cannot start the kernel programs: {e}");
        }
    }

    /// Stops all counting at once (every hook checks `CONTROL`): then the
    /// aggregates and the kernel's own counters cover the same moment.
    pub fn stop_counting(&mut self) {
        if let Err(e) = self.maps.control.set(0, vmtrace_common::CONTROL_STOPPED, 0) {
            log::warn!("cannot stop the kernel programs: {e}");
        }
    }

    /// The event ring's fd, to poll.
    pub fn ring_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.maps.events.as_fd()
    }

    /// The next record of the event ring, if one is there.
    pub fn next_event(&mut self) -> Option<RingBufItem<'_>> {
        self.maps.events.next()
    }

    /// The stack-sample ring's fd, to poll.
    pub fn samples_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.maps.stack_samples.as_fd()
    }

    /// The next copied user stack, if one is there.
    pub fn next_sample(&mut self) -> Option<RingBufItem<'_>> {
        self.maps.stack_samples.next()
    }
}

/// Spare sample buffers kept between drains (`Maps::spare_copies`): 128
/// of the default 16 KiB window, 2 MiB.
const SPARE_COPIES: usize = 128;

/// `bytes` in a spare buffer (a new one when none is left). A copied stack
/// keeps its head and the bytes of its window that were filled
/// (`StackSampleHead::len`, all the unwinder reads), not the whole record.
fn copy_buffer(spare: &mut Vec<Vec<u8>>, bytes: &[u8]) -> Vec<u8> {
    let head = std::mem::size_of::<vmtrace_common::StackSampleHead>();
    let used = bytes
        .get(..head)
        .map(|b| {
            // SAFETY: length checked; the head is Pod (plain integers).
            unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<vmtrace_common::StackSampleHead>()) }
        })
        .filter(|h| h.hdr.kind == vmtrace_common::EventKind::StackSample as u32)
        .map_or(bytes.len(), |h| bytes.len().min(head + h.len as usize));
    let mut b = spare.pop().unwrap_or_default();
    b.clear();
    b.extend_from_slice(&bytes[..used]);
    b
}

/// Keeps a sample's buffer for the next copy, up to `SPARE_COPIES`.
fn keep_buffer(spare: &mut Vec<Vec<u8>>, b: Vec<u8>) {
    if spare.len() < SPARE_COPIES {
        spare.push(b);
    }
}

/// A `GranuleNew` record, if `bytes` is one.
fn granule_new(bytes: &[u8]) -> Option<vmtrace_common::GranuleNewEvent> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    if kind != vmtrace_common::EventKind::GranuleNew as u32
        || bytes.len() < std::mem::size_of::<vmtrace_common::GranuleNewEvent>()
    {
        return None;
    }
    // SAFETY: long enough, and a plain repr(C) record of integers.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<vmtrace_common::GranuleNewEvent>()) })
}

fn py_stack(s: &vmtrace_common::UserStack) -> Option<crate::python::PyStack> {
    let nr = (s.py_nr as usize).min(s.py.len());
    (nr > 0).then(|| crate::python::PyStack {
        tgid: s.py_tgid,
        frames: s.py[..nr].to_vec(),
        ends: s.py_ends,
        truncated: s.py_flags & vmtrace_common::PY_TRUNCATED != 0,
    })
}

/// One aggregate summed over the CPUs (or entries) it was kept on.
fn sum_cpus<'a, T: Merge + 'a>(values: impl Iterator<Item = &'a T>) -> T {
    let mut sum = T::default();
    for v in values {
        sum.merge(v);
    }
    sum
}

/// Shootdowns received (`tlb_flush` reason 1) per CPU, from per-CPU values.
pub(super) fn received_by_cpu<'a>(per_cpu: impl Iterator<Item = &'a [MmStats]>) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for cpus in per_cpu {
        out.resize(out.len().max(cpus.len()), 0);
        for (o, m) in out.iter_mut().zip(cpus) {
            *o += m.tlb_reason[1];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{copy_buffer, keep_buffer, SPARE_COPIES};
    use vmtrace_common::{EventHeader, EventKind, StackSampleHead};

    fn sample(len: u32, window: usize) -> Vec<u8> {
        let head = StackSampleHead {
            hdr: EventHeader { kind: EventKind::StackSample as u32, size: 0, ts_ns: 1 },
            len,
            ..Default::default()
        };
        // SAFETY: a Pod value viewed as its bytes.
        let mut v = unsafe {
            std::slice::from_raw_parts((&raw const head).cast::<u8>(), std::mem::size_of::<StackSampleHead>())
        }
        .to_vec();
        v.extend((0..window).map(|i| i as u8));
        v
    }

    #[test]
    fn a_sample_read_ahead_keeps_its_filled_window_in_a_spare_buffer() {
        let head = std::mem::size_of::<StackSampleHead>();
        let mut spare = Vec::new();
        let r = sample(100, 4096);
        let b = copy_buffer(&mut spare, &r);
        assert_eq!(b, r[..head + 100]);
        keep_buffer(&mut spare, b);
        let reused = spare[0].as_ptr();
        // Not a sample: copied whole, into the spare buffer.
        let other = [7u8; 40];
        let b = copy_buffer(&mut spare, &other);
        assert_eq!((b.as_slice(), b.as_ptr()), (other.as_slice(), reused));
        // A length past the record's end: the record.
        let r = sample(9000, 64);
        assert_eq!(copy_buffer(&mut spare, &r), r);
        for _ in 0..SPARE_COPIES + 5 {
            keep_buffer(&mut spare, Vec::new());
        }
        assert_eq!(spare.len(), SPARE_COPIES);
    }
}
