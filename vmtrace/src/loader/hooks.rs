//! The hook table: every hook, the programs that can serve it in order of
//! preference, what each needs from the kernel, and why the order is what it
//! is. The loader attaches from it, `vmtrace check` reports against it, and
//! the kernel-compatibility table of docs/design.md is rendered from it
//! (`compat_table`, checked by a unit test).

/// A BPF program type, as `summary.json` `probes[].program_type` and `vmtrace
/// check` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ProgramKind {
    #[serde(rename = "tp_btf")]
    TpBtf,
    #[serde(rename = "tracepoint")]
    Tracepoint,
    #[serde(rename = "fentry")]
    Fentry,
    #[serde(rename = "fexit")]
    Fexit,
    #[serde(rename = "kprobe")]
    Kprobe,
    #[serde(rename = "perf_event")]
    PerfEvent,
    /// User stacks walked by the programs themselves (frame pointers).
    #[serde(rename = "own walk")]
    OwnWalk,
    /// User stacks from the kernel's walker (`bpf_get_stackid`).
    #[serde(rename = "stackid")]
    StackId,
}

impl ProgramKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
            Self::Fentry => "fentry",
            Self::Fexit => "fexit",
            Self::Kprobe => "kprobe",
            Self::PerfEvent => "perf_event",
            Self::OwnWalk => "own walk",
            Self::StackId => "stackid",
        }
    }

    /// `--force-tracepoints` turns it off, to exercise the fallbacks.
    pub const fn forced_off(self) -> bool {
        matches!(self, Self::TpBtf | Self::Fentry | Self::Fexit | Self::OwnWalk)
    }
}

impl std::fmt::Display for ProgramKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One way to serve a hook.
#[derive(Debug)]
pub struct Candidate {
    pub kind: ProgramKind,
    /// The program's name in the eBPF object.
    pub program: &'static str,
    /// tp_btf: the event; tracepoint: "category:name"; fentry, fexit,
    /// kprobe: the kernel function; otherwise a description.
    pub target: &'static str,
    /// What it needs from the kernel (minimum version or feature).
    pub needs: &'static str,
    /// How its refusal is named in a later candidate's fallback reason.
    pub label: &'static str,
}

impl Candidate {
    /// A classic tracepoint's (category, name).
    pub fn tracepoint(&self) -> Option<(&'static str, &'static str)> {
        (self.kind == ProgramKind::Tracepoint).then(|| self.target.split_once(':')).flatten()
    }
}

/// The families `LoadOptions::families` switches; `Core` is always on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Core,
    Oom,
    Mmap,
    Regions,
    Tlb,
    Resident,
}

/// A condition checked before any candidate is tried; when it does not hold,
/// the hook is skipped with the reason given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Always,
    /// The last candidate's tracefs event exists; else skipped: "no <event> on
    /// this kernel (<before>): <text>".
    TracefsEvent {
        before: &'static str,
        text: &'static str,
    },
    /// Some fault can map a huge page (`kernel::thp::why_impossible`).
    HugePagesPossible,
    /// Nothing on this architecture serves the hook: always skipped, with the reason.
    Unsupported(&'static str),
}

/// A row of the docs' compatibility table, on the first hook it covers.
#[derive(Debug)]
pub struct Doc {
    pub capability: &'static str,
    pub why: &'static str,
}

#[derive(Debug)]
pub struct Hook {
    pub what: &'static str,
    pub family: Family,
    pub candidates: &'static [Candidate],
    pub gate: Gate,
    /// When no candidate attaches, recording goes on and this does the job
    /// instead; `None`: loading fails.
    pub without: Option<&'static str>,
    pub doc: Option<Doc>,
}

const BTF: &str = "BTF, 5.5+";
const TRAMPOLINES: &str = "BTF trampolines, 5.5+; no lockdown";

const fn tp_btf(program: &'static str, event: &'static str) -> Candidate {
    Candidate { kind: ProgramKind::TpBtf, program, target: event, needs: BTF, label: "" }
}

const fn tp(program: &'static str, target: &'static str) -> Candidate {
    Candidate { kind: ProgramKind::Tracepoint, program, target, needs: "tracefs", label: "" }
}

const fn hook(what: &'static str, family: Family, candidates: &'static [Candidate]) -> Hook {
    Hook { what, family, candidates, gate: Gate::Always, without: None, doc: None }
}

#[allow(clippy::unnecessary_wraps, reason = "it fills an optional field")]
const fn doc(capability: &'static str, why: &'static str) -> Option<Doc> {
    Some(Doc { capability, why })
}

/// A shootdown counted without the csd tracepoint.
pub const IPI_FROM_FLUSH: &str =
    "IPIs are counted where they land (reason-1 flushes in the sender's threads): none to a lazy CPU";

macro_rules! syscall_pair {
    ($call:literal) => {
        syscall_pair!($call, None)
    };
    (lock $call:literal) => {
        [
            hook(
                concat!($call, " enter"),
                Family::Mmap,
                &[tp("tp_syscalls_sys_enter_lock", concat!("syscalls:sys_enter_", $call))],
            ),
            hook(
                concat!($call, " exit"),
                Family::Mmap,
                &[tp("tp_syscalls_sys_exit_lock", concat!("syscalls:sys_exit_", $call))],
            ),
        ]
    };
    ($call:literal, $doc:expr) => {
        syscall_pair!($call, $doc, None)
    };
    ($call:literal, $doc:expr, $without:expr) => {
        [
            Hook {
                doc: $doc,
                without: $without,
                ..hook(
                    concat!($call, " enter"),
                    Family::Mmap,
                    &[tp("tp_syscalls_sys_enter", concat!("syscalls:sys_enter_", $call))],
                )
            },
            Hook {
                without: $without,
                ..hook(
                    concat!($call, " exit"),
                    Family::Mmap,
                    &[tp("tp_syscalls_sys_exit", concat!("syscalls:sys_exit_", $call))],
                )
            },
        ]
    };
}

/// The OOM victim's memcg, read from the task where tp_btf allows it.
pub const OOM_VICTIM: Hook = Hook {
    without: Some("userspace reads /proc instead"),
    doc: doc("OOM victim's memcg", "tp_btf sees the victim task; /proc races its exit"),
    ..hook("OOM victim's cgroup", Family::Oom, &[tp_btf("tp_btf_mark_victim", "mark_victim")])
};

/// The fault start on x86-64: `exceptions:page_fault_*` (arch/x86/mm/fault.c).
pub const X86_FAULT_START: [Hook; 2] = [
    Hook {
        doc: doc(
            "fault start",
            "tp_btf is ~30 ns/fault cheaper (docs/performance.md). x86 only: `exceptions:page_fault_*` exist on x86 (arch/x86/mm/fault.c); arm64 has its own row",
        ),
        ..hook(
            "fault start (user mode)",
            Family::Core,
            &[
                tp_btf("tp_btf_page_fault_user", "page_fault_user"),
                tp("tp_exceptions_page_fault_user", "exceptions:page_fault_user"),
            ],
        )
    },
    hook(
        "fault start (kernel mode)",
        Family::Core,
        &[
            tp_btf("tp_btf_page_fault_kernel", "page_fault_kernel"),
            tp("tp_exceptions_page_fault_kernel", "exceptions:page_fault_kernel"),
        ],
    ),
];

/// The fault start on arm64, which has no fault tracepoints and whose fault
/// entry points cannot be kprobed; attached by `attach::fault_start_arm64`.
pub const ARM64_FAULT_START: Hook = Hook {
    doc: doc(
        "fault start (arm64)",
        "arm64 has no `exceptions:page_fault_*`, and `do_page_fault`/`do_mem_abort` cannot be kprobed. fentry sees the fault's flags (write, exec, user/kernel mode) and skips retries; the software event PAGE_FAULTS (raised once per fault in `do_page_fault`, with the address and registers) has no access type: write and exec faults are not counted there (WRITE is null in summary.json, and summary.txt says so). COW is the next row's",
    ),
    ..hook(
        crate::model::summary::FAULT_START_ARM64,
        Family::Core,
        &[
            Candidate {
                kind: ProgramKind::Fentry,
                program: "fentry_handle_mm_fault",
                target: "handle_mm_fault",
                needs: TRAMPOLINES,
                label: "fentry handle_mm_fault: ",
            },
            Candidate {
                kind: ProgramKind::PerfEvent,
                program: "perf_event_page_faults",
                target: "sw PAGE_FAULTS period 1",
                needs: "CONFIG_PERF_EVENTS",
                label: "",
            },
        ],
    )
};

/// What `ARM64_COW` says when neither program attaches.
pub const ARM64_NO_COW: &str = "COW faults are not counted (faults.cow is null)";

/// arm64's copy-on-write faults: neither fault start tells a write to a
/// present, write-protected page from one to an absent page (x86's
/// `X86_PF_PROT`); `do_wp_page`, which `handle_pte_fault` calls for those
/// alone, does.
pub const ARM64_COW: Hook = Hook {
    without: Some(ARM64_NO_COW),
    doc: doc(
        "COW faults (arm64)",
        "`handle_pte_fault` calls `do_wp_page` for a write to a present, write-protected pte: the fault in flight is counted COW once (the page-allocation hook then tells a copy from a reuse). fentry needs arm64 trampolines (6.4+: Debian's 6.1 refuses them); the kprobe costs more per COW fault but works on 6.1. A huge page's write-protect fault (`do_huge_pmd_wp_page`) is not counted; the fault's stacks, taken at its start, do not count it as COW",
    ),
    ..hook(
        crate::model::summary::COW_FAULTS_ARM64,
        Family::Core,
        &[
            Candidate {
                kind: ProgramKind::Fentry,
                program: "fentry_do_wp_page",
                target: "do_wp_page",
                needs: TRAMPOLINES,
                label: "fentry do_wp_page: ",
            },
            Candidate {
                kind: ProgramKind::Kprobe,
                program: "kprobe_do_wp_page",
                target: "do_wp_page",
                needs: "kprobe PMU",
                label: "kprobe do_wp_page: ",
            },
        ],
    )
};

/// arm64's fault start and its COW faults, in attach order.
pub const ARM64_FAULT_HOOKS: [Hook; 2] = [ARM64_FAULT_START, ARM64_COW];

/// The architectures the hook table knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The architecture this binary runs on.
    pub const HOST: Self = if cfg!(target_arch = "aarch64") { Self::Aarch64 } else { Self::X86_64 };
}

/// Hooks attached through `attach::attach`, in attach order (the order of
/// `probes[]` in summary.json), after the fault start.
pub const HOOKS: &[Hook] = &[
    Hook {
        doc: doc("park in-flight faults", "as above"),
        ..hook(
            "park in-flight faults",
            Family::Core,
            &[tp_btf("tp_btf_sched_switch", "sched_switch"), tp("tp_sched_sched_switch", "sched:sched_switch")],
        )
    },
    Hook {
        doc: doc(
            "fork, exec, exit",
            "tp_btf sees the task pointer: child tgid, exit code, kernel fault counters; with the classic format every child is recorded as its own group (a thread's stray entry is removed at its exit), its `child_pid` at the offset the loader reads from the tracepoint's format file (`char[16]` comms put it at 44 on 6.1 and 6.12, `__data_loc` ones at 20 on 6.18), exec and exit read `bpf_get_current_task()`",
        ),
        ..hook(
            "follow forks",
            Family::Core,
            &[
                tp_btf("tp_btf_sched_process_fork", "sched_process_fork"),
                tp("tp_sched_sched_process_fork", "sched:sched_process_fork"),
            ],
        )
    },
    hook(
        "exec",
        Family::Core,
        &[
            tp_btf("tp_btf_sched_process_exec", "sched_process_exec"),
            tp("tp_sched_sched_process_exec", "sched:sched_process_exec"),
        ],
    ),
    hook(
        "exit",
        Family::Core,
        &[
            tp_btf("tp_btf_sched_process_exit", "sched_process_exit"),
            tp("tp_sched_sched_process_exit", "sched:sched_process_exit"),
        ],
    ),
    OOM_VICTIM,
    Hook {
        doc: doc("OOM kills", "the kill record (pid, comm, sizes) has a classic tracepoint only"),
        ..hook("OOM kills", Family::Oom, &[tp("tp_oom_mark_victim", "oom:mark_victim")])
    },
    Hook {
        doc: doc(
            "reclaim stalls",
            "tp_btf is cheaper to run and to detach: a classic tracepoint's detach waits for RCU grace periods under a kernel mutex",
        ),
        ..hook(
            "direct reclaim start",
            Family::Oom,
            &[
                tp_btf("tp_btf_mm_vmscan_direct_reclaim_begin", "mm_vmscan_direct_reclaim_begin"),
                tp("tp_vmscan_mm_vmscan_direct_reclaim_begin", "vmscan:mm_vmscan_direct_reclaim_begin"),
            ],
        )
    },
    hook(
        "direct reclaim end",
        Family::Oom,
        &[
            tp_btf("tp_btf_mm_vmscan_direct_reclaim_end", "mm_vmscan_direct_reclaim_end"),
            tp("tp_vmscan_mm_vmscan_direct_reclaim_end", "vmscan:mm_vmscan_direct_reclaim_end"),
        ],
    ),
    hook(
        "memcg reclaim start",
        Family::Oom,
        &[
            tp_btf("tp_btf_mm_vmscan_memcg_reclaim_begin", "mm_vmscan_memcg_reclaim_begin"),
            tp("tp_vmscan_mm_vmscan_memcg_reclaim_begin", "vmscan:mm_vmscan_memcg_reclaim_begin"),
        ],
    ),
    hook(
        "memcg reclaim end",
        Family::Oom,
        &[
            tp_btf("tp_btf_mm_vmscan_memcg_reclaim_end", "mm_vmscan_memcg_reclaim_end"),
            tp("tp_vmscan_mm_vmscan_memcg_reclaim_end", "vmscan:mm_vmscan_memcg_reclaim_end"),
        ],
    ),
    Hook {
        gate: Gate::TracefsEvent { before: "an older kernel or no CONFIG_MIGRATION", text: NO_MIGRATIONS },
        doc: doc(
            "page migrations",
            "compaction, NUMA balancing, move_pages/mbind, long-term pins: pages, failures and time per process, for the thread that ran `migrate_pages()`; the end record's reason moves between kernels (`large_folio_split` came before it later), so the start gives it",
        ),
        ..hook(
            "page migration start",
            Family::Oom,
            &[
                tp_btf("tp_btf_mm_migrate_pages_start", "mm_migrate_pages_start"),
                tp("tp_migrate_mm_migrate_pages_start", "migrate:mm_migrate_pages_start"),
            ],
        )
    },
    Hook {
        gate: Gate::TracefsEvent { before: "no CONFIG_MIGRATION", text: NO_MIGRATIONS },
        ..hook(
            "page migration end",
            Family::Oom,
            &[
                tp_btf("tp_btf_mm_migrate_pages", "mm_migrate_pages"),
                tp("tp_migrate_mm_migrate_pages", "migrate:mm_migrate_pages"),
            ],
        )
    },
    Hook {
        gate: Gate::TracefsEvent { before: "not on this kernel", text: NO_NUMA_MOVES },
        doc: doc(
            "NUMA balancing task moves",
            "`sched:sched_move_numa`/`sched_swap_numa` name the tgid in their record (classic only: a tp_btf program would read it from the task)",
        ),
        ..hook("NUMA balancing task moves", Family::Oom, &[tp("tp_sched_sched_move_numa", "sched:sched_move_numa")])
    },
    Hook {
        gate: Gate::TracefsEvent { before: "not on this kernel", text: NO_NUMA_MOVES },
        ..hook("NUMA balancing task swaps", Family::Oom, &[tp("tp_sched_sched_swap_numa", "sched:sched_swap_numa")])
    },
];

/// Why a kernel without NUMA balancing has no task moves to count.
const NO_NUMA_MOVES: &str = "NUMA balancing does not move tasks here (nothing to count)";
/// What is not seen without the migration events.
const NO_MIGRATIONS: &str = "migrations (compaction, NUMA balancing, move_pages) are not timed or counted per process";

/// mmap-family syscalls: per-syscall tracepoints, so nothing runs on other
/// syscalls; one enter and one exit program serve them all.
pub const MMAP_HOOKS: [[Hook; 2]; 12] = [
    syscall_pair!(
        "mmap",
        doc(
            "mmap-family syscalls",
            "per-syscall tracepoints (classic only), so nothing runs on other syscalls; one enter and one exit program serve them all",
        )
    ),
    syscall_pair!("munmap"),
    syscall_pair!("mremap"),
    syscall_pair!("madvise"),
    syscall_pair!("mprotect"),
    syscall_pair!("brk"),
    // arm64 has the syscall from 6.12 (POE) only.
    syscall_pair!("pkey_mprotect", None, Some("no pkey_mprotect syscall on this kernel (arm64 before 6.12)")),
    syscall_pair!(lock "mlock"),
    syscall_pair!(lock "mlock2"),
    syscall_pair!(lock "munlock"),
    syscall_pair!(lock "mlockall"),
    syscall_pair!(lock "munlockall"),
];

/// The OOM domain (the kernel's constraint, the memcg that ran out).
pub const OOM_DOMAIN: Hook = Hook {
    without: Some("derived from the victim's cgroup limit, OOM counter and peak instead"),
    doc: doc(
        "OOM constraint + memcg",
        "reads `oc->constraint` and `oc->memcg` ([mm/oom_kill.c](https://elixir.bootlin.com/linux/v6.12/source/mm/oom_kill.c)), the kernel's own answer (`constraint_source` says which)",
    ),
    ..hook(
        "OOM constraint and memcg",
        Family::Oom,
        &[
            Candidate {
                kind: ProgramKind::Fentry,
                program: "fentry_oom_kill_process",
                target: "oom_kill_process",
                needs: TRAMPOLINES,
                label: "fentry: ",
            },
            Candidate {
                kind: ProgramKind::Kprobe,
                program: "kprobe_oom_kill_process",
                target: "oom_kill_process",
                needs: "kprobe PMU",
                label: "kprobe: ",
            },
        ],
    )
};

/// Page-cache additions per file (readahead), for the files view.
pub const FILEMAP_HOOK: Hook = Hook {
    doc: doc("page-cache additions", "a rare event: the classic tracepoint is its only path"),
    ..hook(
        "page-cache additions",
        Family::Regions,
        &[tp("tp_filemap_mm_filemap_add_to_page_cache", "filemap:mm_filemap_add_to_page_cache")],
    )
};

/// PMD-order allocations inside a fault: the fault is served by a huge page
/// (arm64; x86's `ALLOC_HOOK` does this too).
pub const HUGE_HOOK: Hook = Hook {
    gate: Gate::HugePagesPossible,
    doc: doc(
        "huge-page faults",
        "PMD-order allocation during an in-flight fault, counted once per fault; not attached when THP is off for anonymous memory, shmem and every tmpfs (`kernel/thp.rs`): it runs on every page allocation in the system (~60 ns). PMD-order page-cache folios (large-folio filesystems, whatever the THP setting) are seen by the page-cache hook",
    ),
    ..hook(
        "huge-page faults",
        Family::Regions,
        &[tp_btf("tp_btf_mm_page_alloc", "mm_page_alloc"), tp("tp_kmem_mm_page_alloc", "kmem:mm_page_alloc")],
    )
};

/// Page allocations inside a fault (x86): a PMD-order one serves the fault
/// with a huge page; a user page allocated in a copy-on-write fault is the
/// copy (a write that reuses its page allocates nothing), which tells
/// `cow_from`'s copies from reuses.
pub const ALLOC_HOOK: Hook = Hook {
    without: Some("no huge-page faults; COW copies inferred from forks and read faults"),
    doc: doc(
        "huge-page faults, COW copies",
        "PMD-order allocation during an in-flight fault, counted once per fault; an order-0 movable (user) page allocated during an in-flight copy-on-write fault: the kernel copied the page (`wp_page_copy`) rather than reusing it (`wp_page_reuse`, which allocates nothing), counted once per fault. It runs on every page allocation in the system (~60 ns). PMD-order page-cache folios (large-folio filesystems) are seen by the page-cache hook too",
    ),
    ..hook(
        "page allocations in faults",
        Family::Regions,
        &[tp_btf("tp_btf_mm_page_alloc", "mm_page_alloc"), tp("tp_kmem_mm_page_alloc", "kmem:mm_page_alloc")],
    )
};

/// Each address space's resident counters as they change.
pub const RSS_HOOK: Hook = Hook {
    doc: doc(
        "resident memory",
        "tp_btf reads the counter's global count from the mm (what `get_mm_counter()` reads; within nr_cpus × the counter's batch of pages of the sum); the classic event sums every CPU's share under the counter's lock and hashes the mm pointer on every change ([include/trace/events/kmem.h](https://elixir.bootlin.com/linux/v6.12/source/include/trace/events/kmem.h)): exact, ~100 ns more per first-touch fault",
    ),
    ..hook(
        "resident memory",
        Family::Resident,
        &[tp_btf("tp_btf_rss_stat", "rss_stat"), tp("tp_kmem_rss_stat", "kmem:rss_stat")],
    )
};

/// TLB flushes, and shootdown requests per target CPU.
pub const TLB_HOOKS: &[Hook] = &[
    Hook {
        doc: doc("TLB flushes", "tp_btf is cheaper to run and to detach"),
        ..hook(
            "TLB flushes",
            Family::Tlb,
            &[tp_btf("tp_btf_tlb_flush", "tlb_flush"), tp("tp_tlb_tlb_flush", "tlb:tlb_flush")],
        )
    },
    Hook {
        gate: Gate::TracefsEvent { before: "before 6.6", text: IPI_FROM_FLUSH },
        doc: doc(
            "shootdown IPIs per target CPU",
            "`ipi:ipi_send_cpu(mask)` (6.6+) carry the generic IPI handler as callback here, so csd's `func == flush_tlb_func` is what names a TLB IPI; before 6.6 neither exists",
        ),
        ..hook(
            "shootdowns per target CPU",
            Family::Tlb,
            &[
                Candidate { needs: "6.6+", ..tp_btf("tp_btf_csd_queue_cpu", "csd_queue_cpu") },
                Candidate { needs: "6.6+", ..tp("tp_csd_csd_queue_cpu", "csd:csd_queue_cpu") },
            ],
        )
    },
];

/// Why arm64 has no TLB hooks (`vmtrace check`, probes[], the summary).
pub const ARM64_NO_TLB: &str = "not on arm64: TLBs are flushed with broadcast TLBI instructions, so there are no shootdown IPIs to count, and there is no tlb:tlb_flush tracepoint";

/// arm64's TLB row: nothing to attach, said so.
pub const ARM64_TLB_HOOKS: &[Hook] = &[Hook {
    gate: Gate::Unsupported(ARM64_NO_TLB),
    doc: doc("TLB flushes, shootdown IPIs (arm64)", "broadcast TLBI: no IPIs exist to count"),
    ..hook("TLB flushes", Family::Tlb, &[tp_btf("tp_btf_tlb_flush", "tlb_flush")])
}];

/// The perf-event fault-end programs (minor, major): `FAULT_END`'s second
/// candidate is the two.
pub const PERF_END_PROGRAMS: [&str; 2] = ["perf_event_page_faults_min", "perf_event_page_faults_maj"];

/// The fault-end hook; attached by `attach::fault_end` (the perf events are
/// per CPU or per task, one row per event).
pub const FAULT_END: Hook = Hook {
    doc: doc(
        "fault end: latency, minor/major",
        "fexit is one program for every fault, classified from `vm_fault_t` as `mm_account_fault()` does (bits read from BTF), without the software-event path (~110 ns/fault here). The perf events are raised in `mm_account_fault` (5.9+) where getrusage counts; `--latency-sample 0` keeps the MAJ event only (cheapest). For a command or pid they go on the target's tasks with `inherit` (`perf::FaultEnd`): other processes skip the path, and the perf counters read their counts; `-a` and `serve` put them on every CPU",
    ),
    ..hook(
        "fault end",
        Family::Core,
        &[
            Candidate {
                kind: ProgramKind::Fexit,
                program: "fexit_handle_mm_fault",
                target: "handle_mm_fault",
                needs: TRAMPOLINES,
                label: "fexit handle_mm_fault: ",
            },
            Candidate {
                kind: ProgramKind::PerfEvent,
                program: "perf_event_page_faults_min/maj", // PERF_END_PROGRAMS
                target: "sw PAGE_FAULTS_MIN (1 in N) / MAJ",
                needs: "CONFIG_PERF_EVENTS",
                label: "",
            },
        ],
    )
};

/// The fault end on every fault where fexit is refused (6.14+): PGFAULT as
/// `mm_account_fault()` counts it; tried by `attach::fault_end` between fexit
/// and the perf events.
pub const MEMCG_END: Hook = Hook {
    without: Some("the perf events end the faults"),
    doc: doc(
        "fault end where fexit is refused",
        "`mm_account_fault()` counts PGFAULT through `count_memcg_events()` (6.14+, memory controller on) for every fault it accounts: one end hook on every fault, in place of the PAGE_FAULTS_MIN event (~100 ns a fault whether it fires or not); the MAJ perf event (period 1) then moves a major's time over. Used with `--latency-sample 1` (the default) only",
    ),
    ..hook(
        "fault end (every fault)",
        Family::Core,
        &[
            Candidate { needs: "6.14+", ..tp_btf("tp_btf_count_memcg_events", "count_memcg_events") },
            Candidate { needs: "6.14+", ..tp("tp_memcg_count_memcg_events", "memcg:count_memcg_events") },
        ],
    )
};

/// How user stacks are taken; chosen by `attach::user_stacks`.
pub const USER_STACKS: Hook = Hook {
    doc: doc(
        "user stacks",
        "the kernel's walker reads the frame at address 0 that ends every chain: a fault and its fixup per stack (~1 µs here); 1 KiB reads are used from 6.12 (6.1's verifier gives up on that loop), a read per frame before",
    ),
    ..hook(
        "user stacks",
        Family::Core,
        &[
            Candidate {
                kind: ProgramKind::OwnWalk,
                program: "(every program taking stacks)",
                target: "frame pointers, USER_STACKS",
                needs: "`bpf_task_pt_regs`, 5.15+",
                label: "",
            },
            Candidate {
                kind: ProgramKind::StackId,
                program: "(every program taking stacks)",
                target: "bpf_get_stackid, STACKS",
                needs: "",
                label: "",
            },
        ],
    )
};

/// Every hook of the table, in attach order: `Loader::load` walks it once,
/// so it is also the order of `probes[]` in summary.json and of the docs'
/// table.
pub fn all() -> impl Iterator<Item = &'static Hook> {
    all_for(Arch::HOST)
}

/// The hook table of `arch`.
pub fn all_for(arch: Arch) -> impl Iterator<Item = &'static Hook> {
    // arm64 has no protection bit at the fault start: COW faults come from
    // `do_wp_page` (ARM64_COW). Its allocation hook is gated on huge pages
    // (copies are told from reuses where THP makes it run).
    let (start, tlb, alloc): (&'static [Hook], &'static [Hook], &'static Hook) = match arch {
        Arch::X86_64 => (&X86_FAULT_START, TLB_HOOKS, &ALLOC_HOOK),
        Arch::Aarch64 => (&ARM64_FAULT_HOOKS, ARM64_TLB_HOOKS, &HUGE_HOOK),
    };
    start
        .iter()
        .chain(HOOKS)
        .chain(MMAP_HOOKS.iter().flatten())
        .chain([&OOM_DOMAIN, &FILEMAP_HOOK, alloc])
        .chain(tlb)
        .chain([&RSS_HOOK, &FAULT_END, &MEMCG_END, &USER_STACKS])
}

/// The kernel-compatibility table of docs/design.md, one row per documented
/// capability.
pub fn compat_table() -> String {
    compat_table_for(Arch::X86_64)
}

/// The compatibility table of `arch`'s hooks.
pub fn compat_table_for(arch: Arch) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("| capability | preferred | fallback | why |\n|---|---|---|---|\n");
    let show = |c: &Candidate| {
        let needs = if c.needs.is_empty() { String::new() } else { format!(" ({})", c.needs) };
        format!("{} `{}`{needs}", c.kind, c.target)
    };
    for h in all_for(arch) {
        let Some(doc) = &h.doc else { continue };
        let (first, rest) = h.candidates.split_first().map_or((String::new(), &[][..]), |(f, r)| (show(f), r));
        let mut fallback: Vec<String> = rest.iter().map(show).collect();
        if let Some(without) = h.without {
            fallback.push(format!("none: {without}"));
        }
        match h.gate {
            Gate::Always => {}
            Gate::TracefsEvent { before, text } => fallback.push(format!("{before}: {text}")),
            Gate::HugePagesPossible => fallback.push("none when THP is off everywhere".into()),
            Gate::Unsupported(why) => {
                let _ = writeln!(out, "| {} | none | — | {why} |", doc.capability);
                continue;
            }
        }
        let fallback = if fallback.is_empty() { "—".to_string() } else { fallback.join("; else ") };
        let _ = writeln!(out, "| {} | {first} | {fallback} | {} |", doc.capability, doc.why);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- compat-table: generated from vmtrace/src/loader/hooks.rs -->\n";
    const END: &str = "<!-- /compat-table -->";
    const BEGIN_ARM64: &str = "<!-- compat-table-arm64: generated from vmtrace/src/loader/hooks.rs -->\n";
    const END_ARM64: &str = "<!-- /compat-table-arm64 -->";

    /// The docs' tables are the hook table's, per architecture: regenerate
    /// them with `VMTRACE_WRITE_DOCS=1 cargo test -p vmtrace --lib compat_table`.
    #[test]
    fn docs_compat_table_is_the_hook_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/design.md");
        for (begin, end, arch) in [(BEGIN, END, Arch::X86_64), (BEGIN_ARM64, END_ARM64, Arch::Aarch64)] {
            let text = std::fs::read_to_string(path).expect("docs/design.md");
            let start = text.find(begin).expect("compat-table begin marker") + begin.len();
            let stop = start + text[start..].find(end).expect("compat-table end marker");
            let want = compat_table_for(arch);
            if std::env::var_os("VMTRACE_WRITE_DOCS").is_some() {
                let new = format!("{}{want}{}", &text[..start], &text[stop..]);
                std::fs::write(path, new).expect("writing docs/design.md");
                continue;
            }
            assert_eq!(
                &text[start..stop],
                want,
                "docs/design.md's {arch:?} table differs from the hooks; see this test's doc"
            );
        }
    }

    #[test]
    fn every_program_kind_renders_as_before() {
        for k in [
            ProgramKind::TpBtf,
            ProgramKind::Tracepoint,
            ProgramKind::Fentry,
            ProgramKind::Fexit,
            ProgramKind::Kprobe,
            ProgramKind::PerfEvent,
            ProgramKind::OwnWalk,
            ProgramKind::StackId,
        ] {
            assert_eq!(serde_json::to_value(k).ok(), Some(serde_json::Value::from(k.as_str())));
        }
    }

    /// Every program the table names is in the embedded eBPF object: a
    /// misspelled one would only fall back to the next candidate at run time.
    #[test]
    fn every_program_named_is_in_the_object() {
        use object::{Object as _, ObjectSymbol as _};
        let obj = object::File::parse(crate::EBPF_OBJECT).expect("the embedded eBPF object parses");
        let programs: std::collections::BTreeSet<&str> = obj
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.is_global())
            .filter_map(|s| s.name().ok())
            .collect();
        let pseudo = |c: &Candidate| matches!(c.kind, ProgramKind::OwnWalk | ProgramKind::StackId);
        let named: Vec<&str> = all()
            .flat_map(|h| h.candidates.iter())
            .filter(|c| !pseudo(c))
            .flat_map(|c| {
                if c.program == FAULT_END.candidates[1].program {
                    PERF_END_PROGRAMS.to_vec()
                } else {
                    vec![c.program]
                }
            })
            .collect();
        assert!(named.len() > 20, "{named:?}");
        let missing: Vec<&&str> = named.iter().filter(|p| !programs.contains(**p)).collect();
        assert!(
            missing.is_empty(),
            "named in the hook table, not in the eBPF object: {missing:?}\nits programs: {programs:?}"
        );
    }

    /// The loader tells the hooks it attaches its own way by `what`.
    #[test]
    fn every_hook_has_its_own_name() {
        let mut seen = crate::hash::HashSet::default();
        for h in all() {
            assert!(seen.insert(h.what), "two hooks named {:?}", h.what);
        }
    }

    /// preflight (in `kernel`, which must not depend on the loader) lists the
    /// tracepoints it checks; they are the hook table's (those a recording
    /// cannot do without, and some of the optional ones).
    #[test]
    fn preflight_tracepoints_are_hook_targets() {
        use crate::kernel::preflight::{OPTIONAL_TRACEPOINTS, TRACEPOINTS};
        let of = |core: bool| -> Vec<_> {
            all()
                .filter(|h| (h.family == Family::Core && h.without.is_none()) == core)
                .flat_map(|h| h.candidates.iter().filter_map(Candidate::tracepoint))
                .collect()
        };
        assert_eq!(of(true), TRACEPOINTS);
        let optional = of(false);
        for tp in OPTIONAL_TRACEPOINTS {
            assert!(optional.contains(tp), "{tp:?} is no optional hook's tracepoint");
        }
    }
}
