//! Loads the embedded eBPF object, fills its read-only globals and attaches
//! each hook by the best program type this kernel allows.
//!
//! Kernel compatibility, one row per hook (see `HOOKS`):
//!
//! | hook | preferred | fallback | why |
//! |---|---|---|---|
//! | fault start | tp_btf `page_fault_user`/`_kernel` | classic tracepoint | tp_btf is ~30 ns/fault cheaper (docs/performance.md); needs BTF (5.5+) |
//! | fault end | fexit `handle_mm_fault` | perf_event on sw PAGE_FAULTS_MIN/MAJ | fexit: one program for every fault, no software-event path (~110 ns/fault here), classified as `mm_account_fault` does; needs BTF trampolines (5.5+) and no lockdown. The perf events are raised in `mm_account_fault` (5.9+) where getrusage counts. `--latency-sample 0` keeps the MAJ event only (cheapest). For a command or pid the events go on the target's tasks with `inherit` (`perf::FaultEnd`): other processes skip the path, and the perf counters read their counts |
//! | park in-flight | tp_btf `sched_switch` | classic tracepoint | same |
//! | fork/exec/exit | tp_btf `sched_process_*` | classic tracepoint | tp_btf sees the task pointer: child tgid, exit code, kernel fault counters; the classic format lacks them |
//! | OOM constraint + memcg | fentry `oom_kill_process` | kprobe, else none | reads `oc->constraint` and `oc->memcg` ([mm/oom_kill.c](https://elixir.bootlin.com/linux/v6.12/source/mm/oom_kill.c)); without either, userspace derives them from the victim's cgroup limit, OOM counter and peak |
//! | OOM victim's memcg | tp_btf `mark_victim` | /proc/PID/cgroup | tp_btf sees the victim task; /proc races its exit |
//! | TLB flushes, reclaim stalls | tp_btf `tlb_flush`, `mm_vmscan_*_reclaim_*` | classic tracepoint | tp_btf is cheaper to run and to detach (a classic tracepoint's detach waits for RCU grace periods under a kernel mutex); the mmap-family syscalls and `mark_victim`'s kill record have classic tracepoints only |
//! | shootdown IPIs | tp_btf `csd_queue_cpu` (6.6+), else the classic one | one per `tlb_flush` reason 4 | `ipi:ipi_send_cpu(mask)` (6.6+) carry the generic IPI handler as callback here, so csd's `func == flush_tlb_func` is what names a TLB IPI; before 6.6 neither exists |
//! | huge-page faults | tp_btf `mm_page_alloc` | classic tracepoint | PMD-order allocation during an in-flight fault, counted once per fault; not attached when THP is off for anonymous memory, shmem and every tmpfs (`kernel/thp.rs`): it runs on every page allocation in the system. PMD-order page-cache folios (large-folio filesystems, whatever the THP setting) are seen by the page-cache hook |
//! | user stacks | own frame-pointer walk (`bpf_task_pt_regs`, 5.15+) | `bpf_get_stackid` | the kernel's walker reads the frame at address 0 that ends every chain: a fault and its fixup per stack (~1 µs here) |
//!
//! `vmtrace check` loads everything and prints what each hook got on this
//! kernel, with the reason for every fallback.
//!
//! x86 only for now: `exceptions:page_fault_*` exist on x86 (arch/x86/mm/fault.c).
use std::os::fd::AsFd as _;

use aya::{
    maps::{MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, RingBuf, StackTraceMap},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, PerfEvent, TracePoint,
    },
    Btf, Ebpf, EbpfLoader,
};
use vmtrace_common::{
    Config, FaultStats, FileKey, GranuleCounts, GranuleCur, GranuleKey, Merge, MmStackCounts, MmStackKey, MmStats,
    StackCounts, StackCur, StackKey,
};

use crate::{kernel::btf as kbtf, perf::EndPrograms, stacks::StackMode};

/// A hook and how to attach it: tp_btf first (when it has one), then the
/// classic tracepoint.
pub struct Hook {
    pub what: &'static str,
    /// Empty for an optional tp_btf-only helper (`tp_btf_mark_victim`).
    pub btf_prog: Option<&'static str>,
    pub tp_prog: &'static str,
    pub category: &'static str,
    pub name: &'static str,
}

pub const HOOKS: &[Hook] = &[
    Hook {
        what: "fault start (user mode)",
        btf_prog: Some("tp_btf_page_fault_user"),
        tp_prog: "tp_exceptions_page_fault_user",
        category: "exceptions",
        name: "page_fault_user",
    },
    Hook {
        what: "fault start (kernel mode)",
        btf_prog: Some("tp_btf_page_fault_kernel"),
        tp_prog: "tp_exceptions_page_fault_kernel",
        category: "exceptions",
        name: "page_fault_kernel",
    },
    Hook {
        what: "park in-flight faults",
        btf_prog: Some("tp_btf_sched_switch"),
        tp_prog: "tp_sched_sched_switch",
        category: "sched",
        name: "sched_switch",
    },
    Hook {
        what: "follow forks",
        btf_prog: Some("tp_btf_sched_process_fork"),
        tp_prog: "tp_sched_sched_process_fork",
        category: "sched",
        name: "sched_process_fork",
    },
    Hook {
        what: "exec",
        btf_prog: Some("tp_btf_sched_process_exec"),
        tp_prog: "tp_sched_sched_process_exec",
        category: "sched",
        name: "sched_process_exec",
    },
    Hook {
        what: "exit",
        btf_prog: Some("tp_btf_sched_process_exit"),
        tp_prog: "tp_sched_sched_process_exit",
        category: "sched",
        name: "sched_process_exit",
    },
];

/// OOM kills and reclaim stalls: rare events, classic tracepoints only.
pub const OOM_HOOKS: &[Hook] = &[
    Hook {
        what: "OOM victim's cgroup",
        btf_prog: Some("tp_btf_mark_victim"),
        tp_prog: "",
        category: "oom",
        name: "mark_victim",
    },
    Hook { what: "OOM kills", btf_prog: None, tp_prog: "tp_oom_mark_victim", category: "oom", name: "mark_victim" },
    Hook {
        what: "direct reclaim start",
        btf_prog: Some("tp_btf_mm_vmscan_direct_reclaim_begin"),
        tp_prog: "tp_vmscan_mm_vmscan_direct_reclaim_begin",
        category: "vmscan",
        name: "mm_vmscan_direct_reclaim_begin",
    },
    Hook {
        what: "direct reclaim end",
        btf_prog: Some("tp_btf_mm_vmscan_direct_reclaim_end"),
        tp_prog: "tp_vmscan_mm_vmscan_direct_reclaim_end",
        category: "vmscan",
        name: "mm_vmscan_direct_reclaim_end",
    },
    Hook {
        what: "memcg reclaim start",
        btf_prog: Some("tp_btf_mm_vmscan_memcg_reclaim_begin"),
        tp_prog: "tp_vmscan_mm_vmscan_memcg_reclaim_begin",
        category: "vmscan",
        name: "mm_vmscan_memcg_reclaim_begin",
    },
    Hook {
        what: "memcg reclaim end",
        btf_prog: Some("tp_btf_mm_vmscan_memcg_reclaim_end"),
        tp_prog: "tp_vmscan_mm_vmscan_memcg_reclaim_end",
        category: "vmscan",
        name: "mm_vmscan_memcg_reclaim_end",
    },
];

macro_rules! syscall_hook_pair {
    ($call:literal) => {
        [
            Hook {
                what: concat!($call, " enter"),
                btf_prog: None,
                tp_prog: "tp_syscalls_sys_enter",
                category: "syscalls",
                name: concat!("sys_enter_", $call),
            },
            Hook {
                what: concat!($call, " exit"),
                btf_prog: None,
                tp_prog: "tp_syscalls_sys_exit",
                category: "syscalls",
                name: concat!("sys_exit_", $call),
            },
        ]
    };
}

/// mmap-family syscalls: per-syscall tracepoints, so nothing runs on other
/// syscalls; one enter and one exit program serve them all.
pub const MMAP_HOOKS: [[Hook; 2]; 6] = [
    syscall_hook_pair!("mmap"),
    syscall_hook_pair!("munmap"),
    syscall_hook_pair!("mremap"),
    syscall_hook_pair!("madvise"),
    syscall_hook_pair!("mprotect"),
    syscall_hook_pair!("brk"),
];

/// Page-cache additions per file (readahead), for the files view.
pub const FILEMAP_HOOK: Hook = Hook {
    what: "page-cache additions",
    btf_prog: None,
    tp_prog: "tp_filemap_mm_filemap_add_to_page_cache",
    category: "filemap",
    name: "mm_filemap_add_to_page_cache",
};

/// The fault end on every fault where fexit is refused (6.14+): PGFAULT as
/// `mm_account_fault()` counts it; see vmtrace-ebpf's fault probes.
pub const MEMCG_END_HOOK: Hook = Hook {
    what: "fault end (every fault)",
    btf_prog: Some("tp_btf_count_memcg_events"),
    tp_prog: "tp_memcg_count_memcg_events",
    category: "memcg",
    name: "count_memcg_events",
};

/// PMD-order allocations inside a fault: the fault is served by a huge page.
pub const HUGE_HOOK: Hook = Hook {
    what: "huge-page faults",
    btf_prog: Some("tp_btf_mm_page_alloc"),
    tp_prog: "tp_kmem_mm_page_alloc",
    category: "kmem",
    name: "mm_page_alloc",
};

/// TLB flushes, and shootdown requests per target CPU (`csd:csd_queue_cpu`,
/// 6.6+; optional: without it one IPI is counted per flush that sends any).
pub const TLB_HOOKS: &[Hook] = &[
    Hook {
        what: "TLB flushes",
        btf_prog: Some("tp_btf_tlb_flush"),
        tp_prog: "tp_tlb_tlb_flush",
        category: "tlb",
        name: "tlb_flush",
    },
    Hook {
        what: "shootdowns per target CPU",
        btf_prog: Some("tp_btf_csd_queue_cpu"),
        tp_prog: "tp_csd_csd_queue_cpu",
        category: "csd",
        name: "csd_queue_cpu",
    },
];

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Btf(#[from] kbtf::BtfError),
    #[error("loading the eBPF object failed: {0}")]
    Object(#[from] aya::EbpfError),
    #[error("{what}: neither tp_btf ({btf_err}) nor the tracepoint {category}:{name} ({tp_err}) could be attached")]
    Attach { what: &'static str, category: &'static str, name: &'static str, btf_err: String, tp_err: String },
    #[error("perf event {event}: {err}\nhint: needs CONFIG_PERF_EVENTS and CAP_PERFMON (or root)")]
    Perf { event: &'static str, err: String },
    #[error("map {0} missing or of the wrong type in the eBPF object")]
    Map(&'static str),
    #[error("cannot list online CPUs: {0}")]
    Cpus(String),
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Attached {
    pub what: &'static str,
    /// "tp_btf", "tracepoint" or "perf_event".
    pub program_type: &'static str,
    pub target: String,
    /// Why the preferred type was not used.
    pub fallback_reason: Option<String>,
}

#[allow(clippy::struct_excessive_bools, reason = "independent switches of one load")]
pub struct LoadOptions {
    pub trace_all: bool,
    /// Time 1 in N minor faults; 0 = do not time minor faults.
    pub minor_period: u32,
    /// Force classic tracepoints (tests the fallback path on kernels that have tp_btf).
    pub force_tracepoints: bool,
    /// Optional hook families to attach.
    pub families: Families,
    pub stacks: StackMode,
    /// Take a stack on 1 in N faults.
    pub stack_period: u32,
    /// Key stacks by address granule, for the region as leaf frame.
    pub leaf_region: bool,
    /// Where fexit is refused: put the fault-end perf events on the target's
    /// own tasks (`perf::FaultEnd`, opened by the caller) instead of every
    /// CPU. Other processes then skip the software-event path, and the perf
    /// counters' minor/major counts are the same events.
    pub end_on_tasks: bool,
}

/// Optional families of hooks.
#[derive(Clone, Copy, Debug, Default)]
#[allow(clippy::struct_excessive_bools, reason = "independent on/off switches, one per event family")]
pub struct Families {
    /// OOM kills and reclaim stalls.
    pub oom: bool,
    /// mmap-family syscalls.
    pub mmap: bool,
    /// TLB flushes and shootdown IPIs.
    pub tlb: bool,
    /// Faults per region granule (region attribution) and page-cache additions.
    pub regions: bool,
}

/// Kernel memory for the per-granule map: `REGION_STATS` is per CPU and
/// preallocated, so its size follows the CPU count.
const REGION_MAP_BUDGET: usize = 32 << 20;

fn region_map_entries() -> u32 {
    let cpus = aya::util::nr_cpus().unwrap_or(1).max(1);
    let per = std::mem::size_of::<GranuleCounts>() + std::mem::size_of::<GranuleKey>();
    (REGION_MAP_BUDGET / (per * cpus)).clamp(8192, 262_144) as u32
}

/// Address of a kernel symbol from /proc/kallsyms (root sees real addresses).
/// Reads only up to the symbol: the kernel generates the file 4 KiB at a time,
/// and the whole of it (modules last) took ~40 ms of start-up.
pub fn kernel_symbol(name: &str) -> Option<u64> {
    use std::io::BufRead as _;
    let file = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open("/proc/kallsyms").ok()?);
    file.lines().map_while(Result::ok).find_map(|l| {
        let mut it = l.split_whitespace();
        let (addr, _, sym) = (it.next()?, it.next()?, it.next()?);
        (sym == name).then(|| u64::from_str_radix(addr, 16).ok()).flatten().filter(|&a| a != 0)
    })
}

/// Loaded, attached programs and the maps userspace reads.
pub struct Probes {
    pub ebpf: Ebpf,
    pub attached: Vec<Attached>,
    /// 1 in how many minor faults is timed, as attached (fexit times every one).
    pub minor_period: u32,
    /// The fault-end programs for the target's own perf events, when
    /// `LoadOptions::end_on_tasks` and fexit is refused; `fault_end` holds
    /// those events when no perf counters do.
    pub end_programs: Option<EndPrograms>,
    pub fault_end: Option<crate::perf::FaultEnd>,
    pub fault_stats: PerCpuHashMap<MapData, u32, FaultStats>,
    pub drops: PerCpuArray<MapData, u64>,
    pub events: RingBuf<MapData>,
    pub fault_stacks: PerCpuHashMap<MapData, StackKey, StackCounts>,
    pub stack_traces: StackTraceMap<MapData>,
    /// User stacks walked by the programs; `None`: they are in `stack_traces`.
    pub user_stacks: Option<aya::maps::HashMap<MapData, u32, vmtrace_common::UserStack>>,
    pub mm_stats: PerCpuHashMap<MapData, u32, MmStats>,
    pub mm_stacks: PerCpuHashMap<MapData, MmStackKey, MmStackCounts>,
    pub totals: PerCpuArray<MapData, u64>,
    pub region_stats: PerCpuHashMap<MapData, GranuleKey, GranuleCounts>,
    pub granule_cur: PerCpuArray<MapData, GranuleCur>,
    pub stack_cur: PerCpuArray<MapData, StackCur>,
    pub control: aya::maps::Array<MapData, u32>,
    pub file_cache: PerCpuHashMap<MapData, FileKey, u64>,
    pub logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

impl Probes {
    pub fn load(opts: &LoadOptions) -> Result<Self, LoadError> {
        let BtfFacts { offsets, fault_bits, tp_btf, user_walk, pgfault } = btf_facts()?;
        let user_walk = user_walk_mode(user_walk && !opts.force_tracepoints);
        release_freed_memory();
        let btf = Btf::from_sys_fs().map_err(|e| kbtf::BtfError::Read(e.to_string()))?;
        let config = Config {
            trace_all: u32::from(opts.trace_all),
            minor_period: opts.minor_period,
            stack_mode: opts.stacks.bits(),
            stack_period: opts.stack_period.max(1),
            leaf_region: u32::from(opts.leaf_region),
            mm: if opts.families.mmap || opts.families.tlb {
                let csd = crate::kernel::preflight::tracepoint_exists("csd", "csd_queue_cpu");
                vmtrace_common::MM_ON | if csd { 0 } else { vmtrace_common::MM_IPI_FROM_FLUSH }
            } else {
                0
            },
            flush_tlb_func: if opts.families.tlb { kernel_symbol("flush_tlb_func").unwrap_or(0) } else { 0 },
            regions: u32::from(opts.families.regions),
            vm_fault_unaccounted: fault_bits.0,
            vm_fault_major: fault_bits.1,
            fault_flag_tried: fault_bits.2,
            user_walk,
            memcg_pgfault: memcg_end_item(opts, pgfault, &tp_btf),
        };
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("REGION_STATS", region_map_entries())
            .override_global("CONFIG", &config, true)
            .override_global("KOFFSETS", &offsets, true)
            .load(crate::EBPF_OBJECT)?;
        let logger = aya_log::EbpfLogger::init(&mut ebpf).ok();
        let mut attached = Vec::new();
        let oom_hooks = if opts.families.oom { OOM_HOOKS } else { &[] };
        let mmap_hooks: &[[Hook; 2]] = if opts.families.mmap { &MMAP_HOOKS } else { &[] };
        for hook in HOOKS.iter().chain(oom_hooks).chain(mmap_hooks.iter().flatten()) {
            attached.push(attach_hook(&mut ebpf, &btf, &tp_btf, hook, opts.force_tracepoints)?);
        }
        if opts.families.oom {
            attached.push(attach_oom_domain(&mut ebpf, &btf, opts.force_tracepoints));
            enable_oom_helper(&mut ebpf, &attached, &offsets);
        }
        if opts.families.regions {
            attached.extend(attach_region_hooks(&mut ebpf, &btf, &tp_btf, opts.force_tracepoints)?);
        }
        if opts.families.tlb {
            for hook in TLB_HOOKS {
                if hook.category == "csd" && !crate::kernel::preflight::tracepoint_exists(hook.category, hook.name) {
                    attached.push(Attached {
                        what: hook.what,
                        program_type: "none",
                        target: format!("{}:{}", hook.category, hook.name),
                        fallback_reason: Some(
                            "no csd:csd_queue_cpu on this kernel (before 6.6): one IPI is counted per flush that sends any".into(),
                        ),
                    });
                    continue;
                }
                attached.push(attach_hook(&mut ebpf, &btf, &tp_btf, hook, opts.force_tracepoints)?);
            }
        }
        let (ends, minor_period, end_programs) = attach_fault_end(&mut ebpf, &btf, &config, opts)?;
        attached.extend(ends);
        if opts.stacks.bits() & vmtrace_common::STACK_USER != 0 {
            attached.push(user_stack_selection(user_walk, opts.force_tracepoints));
        }
        // Maps first: `ebpf` moves into the value last.
        Ok(Self {
            attached,
            minor_period,
            end_programs,
            fault_end: None,
            fault_stats: take_map(&mut ebpf, "FAULT_STATS")?,
            drops: take_map(&mut ebpf, "DROPS")?,
            events: take_map(&mut ebpf, "EVENTS")?,
            fault_stacks: take_map(&mut ebpf, "FAULT_STACKS")?,
            stack_traces: take_map(&mut ebpf, "STACKS")?,
            user_stacks: if user_walk != 0 { Some(take_map(&mut ebpf, "USER_STACKS")?) } else { None },
            mm_stats: take_map(&mut ebpf, "MM_STATS")?,
            mm_stacks: take_map(&mut ebpf, "MM_STACKS")?,
            totals: take_map(&mut ebpf, "TOTALS")?,
            region_stats: take_map(&mut ebpf, "REGION_STATS")?,
            granule_cur: take_map(&mut ebpf, "GRANULE_CUR")?,
            stack_cur: take_map(&mut ebpf, "STACK_CUR")?,
            control: take_map(&mut ebpf, "CONTROL")?,
            file_cache: take_map(&mut ebpf, "FILE_CACHE")?,
            logger,
            ebpf,
        })
    }

    /// Adds a process to the traced set (a zeroed `FAULT_STATS` entry); its
    /// children follow in the kernel.
    pub fn trace_pid(&mut self, tgid: u32) -> Result<(), aya::maps::MapError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| {
            aya::maps::MapError::SyscallError(aya::sys::SyscallError { call: "nr_cpus", io_error: e })
        })?;
        let zero = PerCpuValues::try_from(vec![FaultStats::default(); cpus])?;
        self.fault_stats.insert(tgid, zero, 0)
    }

    /// Whether `tgid` is in the traced set.
    pub fn is_traced(&self, tgid: u32) -> bool {
        self.fault_stats.get(&tgid, 0).is_ok()
    }

    /// One process's aggregate, summed over CPUs, left in the map.
    pub fn stats_of(&self, tgid: u32) -> Option<FaultStats> {
        self.fault_stats.get(&tgid, 0).ok().map(|v| sum_cpus(v.iter()))
    }

    /// Reads and deletes an exited process's aggregate, summed over CPUs.
    pub fn take_stats(&mut self, tgid: u32) -> Option<FaultStats> {
        let per_cpu = self.fault_stats.get(&tgid, 0).ok()?;
        let _ = self.fault_stats.remove(&tgid);
        Some(sum_cpus(per_cpu.iter()))
    }

    /// Reads and deletes an exited process's mmap/TLB aggregate.
    pub fn take_mm(&mut self, tgid: u32) -> Option<MmStats> {
        let per_cpu = self.mm_stats.get(&tgid, 0).ok()?;
        let _ = self.mm_stats.remove(&tgid);
        Some(sum_cpus(per_cpu.iter()))
    }

    /// Every mmap/TLB aggregate still in the kernel map.
    pub fn all_mm(&self) -> Vec<(u32, MmStats)> {
        self.mm_stats.iter().filter_map(Result::ok).map(|(k, v)| (k, sum_cpus(v.iter()))).collect()
    }

    /// Call-site counts of mmap-family syscalls, summed over CPUs.
    pub fn all_mm_stacks(&self) -> Vec<(MmStackKey, MmStackCounts)> {
        self.mm_stacks.iter().filter_map(Result::ok).map(|(k, v)| (k, sum_cpus(v.iter()))).collect()
    }

    /// Every stack aggregate, summed over CPUs, with the keys each CPU is
    /// still counting into.
    pub fn all_stack_counts(&self) -> Vec<(StackKey, StackCounts)> {
        let mut all: std::collections::HashMap<StackKey, StackCounts> = std::collections::HashMap::new();
        for (k, v) in self.fault_stacks.iter().filter_map(Result::ok) {
            all.entry(k).or_default().merge(&sum_cpus(v.iter()));
        }
        for i in 0..vmtrace_common::STACK_CUR_SLOTS {
            let Ok(cur) = self.stack_cur.get(&i, 0) else { continue };
            for c in cur.iter().filter(|c| c.counts.faults | c.counts.major | c.counts.timed != 0) {
                all.entry(c.key).or_default().merge(&c.counts);
            }
        }
        all.into_iter().collect()
    }

    /// Instruction pointers of stack `id`, innermost first.
    pub fn stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        self.stack_traces.get(&id, 0).ok().map(|t| t.frames().iter().map(|f| f.ip).collect())
    }

    /// A user stack's frames, innermost first: walked by the programs
    /// (`OWN_STACK_ID` set), else by the kernel (32-bit tasks, old kernels).
    pub fn user_stack_ips(&self, id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        let Some(map) = self.user_stacks.as_ref().filter(|_| id & vmtrace_common::OWN_STACK_ID != 0) else {
            return self.stack_ips(id as i32);
        };
        let s = map.get(&id, 0).ok()?;
        Some(s.ips[..(s.nr as usize).min(s.ips.len())].to_vec())
    }

    /// Every aggregate still in the kernel map, summed over CPUs.
    pub fn all_stats(&self) -> Vec<(u32, FaultStats)> {
        let mut out = Vec::new();
        for item in self.fault_stats.iter() {
            match item {
                Ok((tgid, per_cpu)) => out.push((tgid, sum_cpus(per_cpu.iter()))),
                Err(e) => log::warn!("reading FAULT_STATS: {e}"),
            }
        }
        out
    }

    /// Stops all counting at once (every hook checks `CONTROL`): then the
    /// aggregates and the kernel's own counters cover the same moment.
    /// Opens the window for `-a` (see `CONTROL_*`): call it once the kernel's
    /// own counters are open, so both count the same faults.
    pub fn start_counting(&mut self) {
        if let Err(e) = self.control.set(0, vmtrace_common::CONTROL_RUNNING, 0) {
            log::warn!("cannot start the kernel programs: {e}");
        }
    }

    pub fn stop_counting(&mut self) {
        if let Err(e) = self.control.set(0, vmtrace_common::CONTROL_STOPPED, 0) {
            log::warn!("cannot stop the kernel programs: {e}");
        }
    }

    /// Detaches every program; maps stay readable. A classic tracepoint's
    /// detach waits for RCU grace periods (~75 ms here): hence tp_btf wherever
    /// a hook has it. `parallel`: a thread per program, which overlaps what the
    /// kernel does not serialize (1.15 s → ~0.65 s for the 14 classic ones);
    /// see `record::Detach` for when not to. Call `stop_counting` first.
    pub fn detach_all(&mut self, parallel: bool) {
        // Closing the target's end events detaches their programs.
        self.fault_end = None;
        let unload = |name: &str, prog: &mut aya::programs::Program| {
            let r = match prog {
                aya::programs::Program::TracePoint(p) => p.unload(),
                aya::programs::Program::BtfTracePoint(p) => p.unload(),
                aya::programs::Program::PerfEvent(p) => p.unload(),
                aya::programs::Program::FExit(p) => p.unload(),
                aya::programs::Program::FEntry(p) => p.unload(),
                aya::programs::Program::KProbe(p) => p.unload(),
                _ => Ok(()),
            };
            // Programs of families not asked for were never loaded.
            if let Err(e) = r {
                log::debug!("unloading {name}: {e}");
            }
        };
        if !parallel {
            for (name, prog) in self.ebpf.programs_mut() {
                unload(name, prog);
            }
            return;
        }
        std::thread::scope(|s| {
            for (name, prog) in self.ebpf.programs_mut() {
                s.spawn(move || unload(name, prog));
            }
        });
    }

    /// Forwards kernel-side log records (shown with `-v`).
    pub fn flush_logs(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Every granule's counts, summed over CPUs, with the granules each CPU
    /// is still counting into.
    pub fn all_granules(&self) -> Vec<(GranuleKey, GranuleCounts)> {
        let mut all: std::collections::BTreeMap<GranuleKey, GranuleCounts> = std::collections::BTreeMap::new();
        for (k, v) in self.region_stats.iter().filter_map(Result::ok) {
            all.entry(k).or_default().merge(&sum_cpus(v.iter()));
        }
        if let Ok(cur) = self.granule_cur.get(&0, 0) {
            for c in cur.iter().filter(|c| c.counts.faults | c.counts.major | c.counts.timed | c.counts.huge != 0) {
                all.entry(c.key).or_default().merge(&c.counts);
            }
        }
        all.into_iter().collect()
    }

    /// Pages the traced processes added to the page cache for a file.
    pub fn page_cache_added(&self, dev: u32, ino: u64) -> Option<u64> {
        self.file_cache.get(&FileKey { dev, _pad: 0, ino }, 0).ok().map(|v| v.iter().sum())
    }

    /// (faults, majors) of all traced processes so far.
    pub fn totals(&self) -> (u64, u64) {
        let get = |i: u32| self.totals.get(&i, 0).map_or(0, |v| v.iter().sum());
        (get(0), get(1))
    }

    /// Summed drop counters, indexed by `DropKind`.
    pub fn drops(&self) -> Vec<u64> {
        self.drops.iter().map(|v| v.map_or(0, |per_cpu| per_cpu.iter().sum())).collect()
    }

    pub fn ring_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.events.as_fd()
    }
}

/// One aggregate summed over the CPUs (or entries) it was kept on.
fn sum_cpus<'a, T: Merge + 'a>(values: impl Iterator<Item = &'a T>) -> T {
    let mut sum = T::default();
    for v in values {
        sum.merge(v);
    }
    sum
}

fn take_map<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, LoadError> {
    ebpf.take_map(name).and_then(|m| T::try_from(m).ok()).ok_or(LoadError::Map(name))
}

/// Tells the classic `mark_victim` hook when the tp_btf one is attached, so
/// it may leave an event for it to complete (`OOM_PENDING` in the programs).
fn enable_oom_helper(ebpf: &mut Ebpf, attached: &[Attached], offsets: &vmtrace_common::KernelOffsets) {
    // The tp_btf hook completes events only where it can read the victim's pid.
    let on_btf = attached.iter().any(|a| a.what == OOM_HOOKS[0].what && a.program_type == "tp_btf");
    if !on_btf || offsets.task_pid == vmtrace_common::KernelOffsets::MISSING {
        return;
    }
    let set = ebpf
        .map_mut("OOM_HELPER")
        .ok_or_else(|| "no OOM_HELPER map".to_string())
        .and_then(|m| aya::maps::Array::<_, u32>::try_from(m).map_err(|e| e.to_string()))
        .and_then(|mut a| a.set(0, 1, 0).map_err(|e| e.to_string()));
    if let Err(e) = set {
        log::warn!("OOM victims' cgroups will come from /proc: {e}");
    }
}

/// Page-cache insertions, and huge-page faults where THP can happen at all.
fn attach_region_hooks(
    ebpf: &mut Ebpf,
    btf: &Btf,
    tp_btf: &std::collections::HashSet<&'static str>,
    force_tp: bool,
) -> Result<Vec<Attached>, LoadError> {
    let filemap = attach_hook(ebpf, btf, tp_btf, &FILEMAP_HOOK, force_tp)?;
    let huge = match crate::kernel::thp::why_impossible() {
        None => attach_hook(ebpf, btf, tp_btf, &HUGE_HOOK, force_tp)?,
        Some(why) => Attached {
            what: HUGE_HOOK.what,
            program_type: "none",
            target: format!("{}:{}", HUGE_HOOK.category, HUGE_HOOK.name),
            fallback_reason: Some(format!(
                "not needed: {why}; no anonymous or shmem fault can map a huge page (PMD-order page-cache folios are seen by the page-cache hook)"
            )),
        },
    };
    Ok(vec![filemap, huge])
}

fn attach_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    tp_btf: &std::collections::HashSet<&'static str>,
    hook: &Hook,
    force_tp: bool,
) -> Result<Attached, LoadError> {
    // Why the tp_btf program was not used; None when the classic tracepoint is
    // the hook's only path (rare events), which is then no fallback.
    let btf_err = match hook.btf_prog {
        None => None,
        Some(_) if force_tp => Some("disabled by --force-tracepoints".to_string()),
        Some(_) if !tp_btf.contains(hook.name) => Some(format!("no btf_trace_{} in kernel BTF", hook.name)),
        Some(prog) => match try_btf(ebpf, btf, prog, hook) {
            Ok(()) => {
                return Ok(Attached {
                    what: hook.what,
                    program_type: "tp_btf",
                    target: hook.name.into(),
                    fallback_reason: None,
                })
            }
            Err(e) => Some(e),
        },
    };
    if let Some(e) = &btf_err {
        log::debug!("{}: tp_btf unavailable ({e}); trying the classic tracepoint", hook.what);
    }
    if hook.tp_prog.is_empty() {
        // An optional helper hook with no classic twin: recording goes on without it.
        return Ok(Attached {
            what: hook.what,
            program_type: "none",
            target: hook.name.into(),
            fallback_reason: Some(format!("{}; userspace reads /proc instead", btf_err.unwrap_or_default())),
        });
    }
    match try_tp(ebpf, hook) {
        Ok(()) => Ok(Attached {
            what: hook.what,
            program_type: "tracepoint",
            target: format!("{}:{}", hook.category, hook.name),
            fallback_reason: btf_err,
        }),
        Err(tp_err) => Err(LoadError::Attach {
            what: hook.what,
            category: hook.category,
            name: hook.name,
            btf_err: btf_err.unwrap_or_else(|| "no tp_btf program for this hook".into()),
            tp_err,
        }),
    }
}

fn try_btf(ebpf: &mut Ebpf, btf: &Btf, btf_prog: &str, hook: &Hook) -> Result<(), String> {
    let prog: &mut BtfTracePoint =
        ebpf.program_mut(btf_prog).ok_or("program missing")?.try_into().map_err(|e| format!("{e}"))?;
    prog.load(hook.name, btf).map_err(|e| format!("{e}"))?;
    prog.attach().map_err(|e| format!("{e}"))?;
    Ok(())
}

fn try_tp(ebpf: &mut Ebpf, hook: &Hook) -> Result<(), String> {
    let prog: &mut TracePoint =
        ebpf.program_mut(hook.tp_prog).ok_or("program missing")?.try_into().map_err(|e| format!("{e}"))?;
    // A program may serve several tracepoints (the mmap family's).
    if prog.fd().is_err() {
        prog.load().map_err(|e| format!("{e}"))?;
    }
    prog.attach(hook.category, hook.name).map_err(|e| format!("{e}"))?;
    Ok(())
}

/// The OOM domain (the kernel's constraint, the memcg that ran out) from
/// `oom_kill_process()`: fentry, else kprobe, else none — then userspace
/// derives both from the victim's cgroup counters.
fn attach_oom_domain(ebpf: &mut Ebpf, btf: &Btf, force_fallback: bool) -> Attached {
    let what = "OOM constraint and memcg";
    let fentry_err = if force_fallback {
        "disabled by --force-tracepoints".to_string()
    } else {
        let r = try_fentry(ebpf, btf, "fentry_oom_kill_process", "oom_kill_process");
        match r {
            Ok(()) => {
                return Attached {
                    what,
                    program_type: "fentry",
                    target: "oom_kill_process".into(),
                    fallback_reason: None,
                }
            }
            Err(e) => explain_attach(&e),
        }
    };
    let kprobe = (|| -> Result<(), String> {
        let p: &mut aya::programs::KProbe = ebpf
            .program_mut("kprobe_oom_kill_process")
            .ok_or("program missing")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        p.load().map_err(|e| format!("{e}"))?;
        p.attach("oom_kill_process", 0).map_err(|e| format!("{e}"))?;
        Ok(())
    })();
    match kprobe {
        Ok(()) => Attached {
            what,
            program_type: "kprobe",
            target: "oom_kill_process".into(),
            fallback_reason: Some(format!("fentry: {fentry_err}")),
        },
        Err(e) => Attached {
            what,
            program_type: "none",
            target: "oom_kill_process".into(),
            fallback_reason: Some(format!(
                "fentry: {fentry_err}; kprobe: {}; derived from the victim's cgroup limit, OOM counter and peak instead",
                explain_attach(&e)
            )),
        },
    }
}

/// What the loader needs from the kernel's BTF (parsed by btf-rs).
struct BtfFacts {
    offsets: vmtrace_common::KernelOffsets,
    /// `vm_fault_reason` bits: unaccounted (error | retry), major; FAULT_FLAG_TRIED.
    fault_bits: (u32, u32, u32),
    /// Hooks whose `btf_trace_*` typedef exists (tp_btf can attach).
    tp_btf: std::collections::HashSet<&'static str>,
    /// `bpf_task_pt_regs` exists: the programs walk user stacks themselves.
    user_walk: bool,
    /// `PGFAULT` in `enum vm_event_item`.
    pgfault: Option<u32>,
}

/// Reads the facts, then drops btf-rs's parse before aya parses its own copy:
/// both at once were the collector's peak RSS (84 MiB; 55 MiB since).
fn btf_facts() -> Result<BtfFacts, LoadError> {
    let kbtf = kbtf::load_vmlinux()?;
    let fault_bits = (
        vm_fault_bits(
            &kbtf,
            &[
                "VM_FAULT_OOM",
                "VM_FAULT_SIGBUS",
                "VM_FAULT_SIGSEGV",
                "VM_FAULT_HWPOISON",
                "VM_FAULT_HWPOISON_LARGE",
                "VM_FAULT_FALLBACK",
                "VM_FAULT_RETRY",
            ],
        ),
        vm_fault_bits(&kbtf, &["VM_FAULT_MAJOR"]),
        kbtf::enum_value(&kbtf, "fault_flag", "FAULT_FLAG_TRIED").unwrap_or(0),
    );
    let hooks = HOOKS.iter().chain(OOM_HOOKS).chain([&FILEMAP_HOOK, &HUGE_HOOK, &MEMCG_END_HOOK]).chain(TLB_HOOKS);
    let tp_btf = hooks.filter(|h| kbtf::has_btf_tracepoint(&kbtf, h.name)).map(|h| h.name).collect();
    // The programs walk user stacks themselves where bpf_task_pt_regs exists (5.15+).
    let user_walk = kbtf::enum_value(&kbtf, "bpf_func_id", "BPF_FUNC_task_pt_regs").is_some();
    let pgfault = kbtf::enum_value(&kbtf, "vm_event_item", "PGFAULT");
    Ok(BtfFacts { offsets: kbtf::kernel_offsets(&kbtf)?, fault_bits, tp_btf, user_walk, pgfault })
}

/// Hands memory freed after a large parse back to the system, so RSS shows
/// what the collector holds.
fn release_freed_memory() {
    // SAFETY: no preconditions; glibc only.
    unsafe { libc::malloc_trim(0) };
}

/// OR of `vm_fault_reason` bits from kernel BTF (0 for names it lacks).
fn vm_fault_bits(btf: &btf_rs::Btf, names: &[&str]) -> u32 {
    names.iter().filter_map(|n| kbtf::enum_value(btf, "vm_fault_reason", n)).fold(0, |a, b| a | b)
}

/// The end hook: fexit on `handle_mm_fault` where allowed, else software
/// perf events. Returns what was attached and the effective minor period.
fn attach_fault_end(
    ebpf: &mut Ebpf,
    btf: &Btf,
    config: &Config,
    opts: &LoadOptions,
) -> Result<(Vec<Attached>, u32, Option<EndPrograms>), LoadError> {
    let force_fallback = opts.force_tracepoints;
    // With minor latency off only majors need an end: the MAJ event costs
    // nothing on minor faults, while fexit runs on every fault.
    let fexit_err = if config.minor_period == 0 {
        "minor latency off (--latency-sample 0): the MAJ perf event alone is cheaper".to_string()
    } else if force_fallback {
        "disabled by --force-tracepoints".to_string()
    } else if config.vm_fault_major == 0 {
        "no enum vm_fault_reason in kernel BTF".to_string()
    } else {
        match try_fexit(ebpf, btf, "fexit_handle_mm_fault", "handle_mm_fault") {
            Ok(()) => {
                let a = Attached {
                    what: "fault end (every fault)",
                    program_type: "fexit",
                    target: "handle_mm_fault".into(),
                    fallback_reason: None,
                };
                return Ok((vec![a], 1, None));
            }
            Err(e) => explain_attach(&e),
        }
    };
    if config.memcg_pgfault != 0 {
        match attach_hook(ebpf, btf, &std::iter::once(MEMCG_END_HOOK.name).collect(), &MEMCG_END_HOOK, force_fallback) {
            Ok(mut memcg) => {
                memcg.fallback_reason = Some(format!("fexit handle_mm_fault: {fexit_err}"));
                let mut out = vec![memcg];
                let (maj, end_programs) =
                    if opts.end_on_tasks { load_perf_end(ebpf, 0)? } else { (attach_perf_end(ebpf, 0)?, None) };
                out.extend(maj);
                return Ok((out, 1, end_programs));
            }
            Err(e) => log::debug!("fault end: memcg:count_memcg_events unavailable ({e})"),
        }
    }
    log::debug!("fault end: fexit unavailable ({fexit_err}); using software perf events");
    let (mut out, end_programs) = if opts.end_on_tasks {
        load_perf_end(ebpf, config.minor_period)?
    } else {
        (attach_perf_end(ebpf, config.minor_period)?, None)
    };
    // Say why fexit was not used, unless the user chose the cheaper path.
    if config.minor_period > 0 {
        for a in &mut out {
            a.fallback_reason = Some(format!("fexit handle_mm_fault: {fexit_err}"));
        }
    }
    Ok((out, config.minor_period, end_programs))
}

/// `Config::memcg_pgfault`: PGFAULT + 1 where `memcg:count_memcg_events`
/// can end every fault — 6.14+ (the tracepoint), minor faults timed at all,
/// and the memory controller on (else `count_memcg_events()` returns before
/// its tracepoint).
fn memcg_end_item(opts: &LoadOptions, pgfault: Option<u32>, tp_btf: &std::collections::HashSet<&'static str>) -> u32 {
    let Some(item) = pgfault else { return 0 };
    let hook = tp_btf.contains(MEMCG_END_HOOK.name)
        || crate::kernel::preflight::tracepoint_exists(MEMCG_END_HOOK.category, MEMCG_END_HOOK.name);
    if opts.minor_period == 0 || !hook || !memory_controller_enabled() {
        return 0;
    }
    item + 1
}

/// The memory controller's `enabled` column in /proc/cgroups (v1 and v2).
fn memory_controller_enabled() -> bool {
    std::fs::read_to_string("/proc/cgroups").is_ok_and(|t| {
        t.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"memory") && f.get(3) == Some(&"1")
        })
    })
}

/// An attach error as a person needs to hear it.
fn explain_attach(e: &str) -> String {
    if e.contains("Operation not permitted") {
        match lockdown() {
            Some(mode) => format!("refused by kernel lockdown ({mode}), which forbids fentry/fexit"),
            None => "refused (EPERM): kernel lockdown or a security module forbids fentry/fexit here".into(),
        }
    } else if e.contains("devices/kprobe/type") {
        "no kprobe PMU (/sys/bus/event_source/devices/kprobe): kprobes are not available on this kernel".into()
    } else {
        e.trim_end_matches("Verifier output: ").trim_end_matches(". ").to_string()
    }
}

/// The kernel lockdown mode when one is active ("integrity", "confidentiality")
/// and securityfs shows it.
fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let mode = text.split_whitespace().find(|w| w.starts_with('['))?.trim_matches(['[', ']']).to_string();
    (mode != "none").then_some(mode)
}

/// Which program type each hook gets on this kernel: loads and attaches
/// everything `record` would (every family), then lets it go.
pub fn probe_selection() -> Result<Vec<Attached>, LoadError> {
    let probes = Probes::load(&LoadOptions {
        trace_all: false,
        minor_period: 1,
        force_tracepoints: false,
        families: Families { oom: true, mmap: true, tlb: true, regions: true },
        stacks: StackMode::User,
        stack_period: 64,
        leaf_region: false,
        end_on_tasks: false,
    })?;
    Ok(probes.attached.clone())
}

/// How the programs walk user stacks (`Config::user_walk`): 0 where they
/// cannot (the kernel's walker); by 1 KiB windows where the verifier is known
/// to take that loop (6.12+; 6.1's runs out of its 1M-instruction budget), else
/// a read per frame.
fn user_walk_mode(own: bool) -> u32 {
    match crate::kernel::preflight::kernel_release() {
        _ if !own => 0,
        Some(v) if v >= (6, 12) => vmtrace_common::USER_WALK_WINDOWS,
        _ => vmtrace_common::USER_WALK_FRAMES,
    }
}

/// How user stacks are taken: a row of the probe selection.
fn user_stack_selection(user_walk: u32, forced: bool) -> Attached {
    let (program_type, target, fallback_reason) = match user_walk {
        vmtrace_common::USER_WALK_WINDOWS => ("own walk", "frame pointers, 1 KiB reads, USER_STACKS", None),
        vmtrace_common::USER_WALK_FRAMES => (
            "own walk",
            "frame pointers, a read per frame, USER_STACKS",
            Some("1 KiB reads (several frames a read) are used from 6.12: 6.1's verifier gives up on that loop".into()),
        ),
        _ => (
            "stackid",
            "bpf_get_stackid, STACKS",
            Some(
                if forced { "forced (--force-tracepoints)" } else { "no bpf_task_pt_regs (before 5.15)" }.to_string()
                    + ": the kernel's walker, which faults on the frame at address 0 ending each chain (~1 µs per stack)",
            ),
        ),
    };
    Attached { what: "user stacks", program_type, target: target.into(), fallback_reason }
}

/// The probe-selection table of `vmtrace check`.
pub fn render_selection(attached: &[Attached]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\nprobe selection on this kernel (hook: program type → target):\n");
    for a in attached {
        let _ = writeln!(out, "  {:<28} {:<11} {}", a.what, a.program_type, a.target);
        if let Some(why) = &a.fallback_reason {
            let _ = writeln!(out, "  {:<28} {:<11} fallback: {why}", "", "");
        }
    }
    out
}

fn try_fentry(ebpf: &mut Ebpf, btf: &Btf, prog: &str, function: &str) -> Result<(), String> {
    let p: &mut aya::programs::FEntry =
        ebpf.program_mut(prog).ok_or("program missing")?.try_into().map_err(|e| format!("{e}"))?;
    p.load(function, btf).map_err(|e| format!("{e}"))?;
    p.attach().map_err(|e| format!("{e}"))?;
    Ok(())
}

fn try_fexit(ebpf: &mut Ebpf, btf: &Btf, prog: &str, function: &str) -> Result<(), String> {
    let p: &mut aya::programs::FExit =
        ebpf.program_mut(prog).ok_or("program missing")?.try_into().map_err(|e| format!("{e}"))?;
    p.load(function, btf).map_err(|e| format!("{e}"))?;
    p.attach().map_err(|e| format!("{e}"))?;
    Ok(())
}

/// The perf-event end hooks: program, event, label, period. Period 0 for
/// minor faults: they are counted at the start hook only, never timed (the
/// software-event path costs on every minor fault even when sampling).
fn perf_end_hooks(minor_period: u32) -> Vec<(&'static str, SoftwareEvent, &'static str, u64)> {
    let mut hooks = vec![("perf_event_page_faults_maj", SoftwareEvent::PageFaultsMaj, "PAGE_FAULTS_MAJ", 1)];
    if minor_period > 0 {
        hooks.push((
            "perf_event_page_faults_min",
            SoftwareEvent::PageFaultsMin,
            "PAGE_FAULTS_MIN",
            u64::from(minor_period),
        ));
    }
    hooks
}

/// Loads one perf-event end program.
fn load_perf_prog<'a>(
    ebpf: &'a mut Ebpf,
    prog_name: &str,
    label: &'static str,
) -> Result<&'a mut PerfEvent, LoadError> {
    let perf = |err: String| LoadError::Perf { event: label, err };
    let prog: &mut PerfEvent = ebpf
        .program_mut(prog_name)
        .ok_or_else(|| perf("program missing".into()))?
        .try_into()
        .map_err(|e| perf(format!("{e}")))?;
    prog.load().map_err(|e| perf(format!("{e}")))?;
    Ok(prog)
}

/// A fault-end row of the probe selection; `on` says where the events are.
fn perf_end_row(label: &str, period: u64, on: &str) -> Attached {
    Attached {
        what: if period == 1 { "fault end (every fault)" } else { "fault end (sampled)" },
        program_type: "perf_event",
        target: format!("sw {label} period {period} on {on}"),
        fallback_reason: None,
    }
}

/// The perf-event end hooks, one perf event per CPU and kind, system-wide
/// (filtered by tgid in the program), so children are covered from their
/// first instruction.
fn attach_perf_end(ebpf: &mut Ebpf, minor_period: u32) -> Result<Vec<Attached>, LoadError> {
    let cpus = aya::util::online_cpus().map_err(|(_, e)| LoadError::Cpus(e.to_string()))?;
    let mut out = Vec::new();
    for (prog_name, event, label, period) in perf_end_hooks(minor_period) {
        let prog = load_perf_prog(ebpf, prog_name, label)?;
        for &cpu in &cpus {
            prog.attach(
                PerfEventConfig::Software(event),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(period),
                false,
            )
            .map_err(|e| LoadError::Perf { event: label, err: format!("cpu {cpu}: {e}") })?;
        }
        out.push(perf_end_row(label, period, &format!("{} CPUs", cpus.len())));
    }
    Ok(out)
}

/// The perf-event end programs, loaded for the caller to put on the target's
/// tasks (`perf::FaultEnd`).
fn load_perf_end(ebpf: &mut Ebpf, minor_period: u32) -> Result<(Vec<Attached>, Option<EndPrograms>), LoadError> {
    let (mut out, mut maj, mut min) = (Vec::new(), None, None);
    for (prog_name, event, label, period) in perf_end_hooks(minor_period) {
        let prog = load_perf_prog(ebpf, prog_name, label)?;
        let fd = prog.fd().map_err(|e| LoadError::Perf { event: label, err: format!("{e}") })?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd());
        match event {
            SoftwareEvent::PageFaultsMaj => maj = Some(fd),
            _ => min = Some((fd, period)),
        }
        out.push(perf_end_row(label, period, "the target's tasks (inherited)"));
    }
    Ok((out, maj.map(|maj| EndPrograms { min, maj })))
}
