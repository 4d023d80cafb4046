//! Sizes of the per-CPU hash maps, the kernel memory vmtrace holds.
//!
//! A per-CPU entry holds its value once per CPU: `FAULT_STATS`' 560 bytes are
//! 72 KiB an entry on a 128-CPU host. The two per-process aggregates
//! (`FAULT_STATS`, `MM_STATS`), an entry per live process, are not
//! preallocated (`BPF_F_NO_PREALLOC`): the kernel holds their live entries
//! only. The others take new entries on the fault path (a granule, a stack,
//! a file chunk), where a not-preallocated insert allocates a per-CPU value:
//! a warm mmap read with the granule map not preallocated took 16.5 ms
//! against 12.4 (medians of 9 interleaved runs), so they stay preallocated.
//! Every map's ceiling is the number of entries its budget holds on this
//! host's CPUs (never more than the compiled size, never fewer than its
//! floor). A map that is full, or whose entry the kernel could not allocate,
//! counts a drop (see `DropKind`), as before.

use vmtrace_common::{
    FaultStats, FileChunkKey, FileKey, GranuleCounts, GranuleKey, MmStackCounts, MmStackKey, MmStats, StackCounts,
    StackKey,
};

/// One per-CPU hash map and its bound.
#[derive(Clone, Copy)]
pub struct PerCpuHash {
    pub name: &'static str,
    /// Entries compiled into the eBPF object: the most on any host.
    pub max: u32,
    pub key: usize,
    pub value: usize,
    /// Worst-case kernel memory, all entries live.
    pub budget: usize,
    /// Entries kept on any host, whatever the budget.
    pub floor: u32,
    /// Preallocated (its ceiling is held from the start), else live
    /// entries only (as the eBPF object declares it).
    pub prealloc: bool,
}

const MIB: usize = 1 << 20;

const fn map(name: &'static str, max: u32, key: usize, value: usize, budget: usize, floor: u32) -> PerCpuHash {
    PerCpuHash { name, max, key, value, budget, floor, prealloc: true }
}

/// A map of live entries only (`BPF_F_NO_PREALLOC` in the eBPF object).
const fn live(m: PerCpuHash) -> PerCpuHash {
    PerCpuHash { prealloc: false, ..m }
}

/// Every per-CPU hash map of the eBPF object (their `max` is the object's).
pub const PER_CPU_HASHES: &[PerCpuHash] = &[
    // One entry per traced process alive.
    live(map("FAULT_STATS", 32_768, 4, size_of::<FaultStats>(), 256 * MIB, 1024)),
    live(map("MM_STATS", 16_384, 4, size_of::<MmStats>(), 128 * MIB, 1024)),
    // Preallocated: what `MM_STATS` could not allocate (a process at a
    // time, until it exits; the kernel's error is counted).
    map("MM_SPILL", 256, 4, size_of::<MmStats>(), MIB, 16),
    // Drained while recording (exited processes, then every few seconds).
    map("FAULT_STACKS", 65_536, size_of::<StackKey>(), size_of::<StackCounts>(), 64 * MIB, 4096),
    map("MM_STACKS", 16_384, size_of::<MmStackKey>(), size_of::<MmStackCounts>(), 16 * MIB, 1024),
    map("REGION_STATS", 262_144, size_of::<GranuleKey>(), size_of::<GranuleCounts>(), 32 * MIB, 8192),
    map("REGION_LATE", 16_384, size_of::<GranuleKey>(), size_of::<GranuleCounts>(), 2 * MIB, 1024),
    map("FILE_CACHE", 16_384, size_of::<FileKey>(), 8, 8 * MIB, 1024),
    map("FILE_CHUNKS", 65_536, size_of::<FileChunkKey>(), 8, 16 * MIB, 4096),
];

/// The kernel's bytes for one live entry: its `htab_elem` (hash node, hash,
/// key, per-CPU pointer) and the value on every CPU.
pub fn entry_bytes(m: &PerCpuHash, cpus: usize) -> usize {
    let up8 = |n: usize| n.div_ceil(8) * 8;
    48 + up8(m.key) + 8 + up8(m.value) * cpus
}

/// The entries `m` may hold on `cpus` CPUs.
pub fn entries(m: &PerCpuHash, cpus: usize) -> u32 {
    let fit = m.budget / entry_bytes(m, cpus.max(1));
    u32::try_from(fit).unwrap_or(u32::MAX).clamp(m.floor, m.max)
}

/// Sets every per-CPU hash's ceiling for this host's CPUs (possible CPUs,
/// as the kernel sizes per-CPU values).
pub fn apply(loader: &mut aya::EbpfLoader<'_>) {
    let cpus = aya::util::nr_cpus().unwrap_or(1).max(1);
    for m in PER_CPU_HASHES {
        loader.map_max_entries(m.name, entries(m, cpus));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_hosts_keep_every_entry_and_large_ones_stay_in_budget() {
        for m in PER_CPU_HASHES {
            assert!(m.floor <= m.max, "{}", m.name);
            // Two CPUs (this machine): the compiled size, apart from the region maps.
            if !m.name.starts_with("REGION") {
                assert_eq!(entries(m, 2), m.max, "{}", m.name);
            }
            for cpus in [1, 2, 8, 64, 128, 256, 1024] {
                let n = entries(m, cpus);
                let worst = n as usize * entry_bytes(m, cpus);
                assert!(n == m.floor || worst <= m.budget, "{} at {cpus} CPUs: {worst} B", m.name);
            }
        }
        let stats = &PER_CPU_HASHES[0];
        // Preallocated at 32,768 entries, 128 CPUs took 2.3 GB; now at most 256 MiB.
        assert_eq!(entries(stats, 128), 3741);
        // All full at once on 128 CPUs: 633 MiB (preallocated before: 3,823 MiB, always);
        // of it, what is held from the start: 249 MiB.
        let held: usize =
            PER_CPU_HASHES.iter().filter(|m| m.prealloc).map(|m| entries(m, 128) as usize * entry_bytes(m, 128)).sum();
        assert!(held < 250 * MIB, "{held}");
        let total: usize = PER_CPU_HASHES.iter().map(|m| entries(m, 128) as usize * entry_bytes(m, 128)).sum();
        // Before, all preallocated: the compiled sizes, the region maps at their floors.
        let before: usize = PER_CPU_HASHES
            .iter()
            .map(|m| if m.name.starts_with("REGION") { m.floor } else { m.max } as usize * entry_bytes(m, 128))
            .sum();
        assert!(total < 640 * MIB && before > 3800 * MIB, "{total} {before}");
    }
}
