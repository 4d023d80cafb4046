//! Loads the embedded eBPF object, fills its read-only globals and attaches
//! each hook by the best program type this kernel allows.
//!
//! - `hooks`: the hook table — every hook's candidate programs in order of
//!   preference, what each needs and why (the docs' compatibility table is
//!   rendered from it);
//! - `attach`: the one attach path and the typed outcome of each hook;
//! - `btf`: what the loader reads from the kernel's BTF;
//! - `maps`: the maps, behind the methods the collector reads them with;
//! - `check`: `vmtrace check`'s probe-selection table.
use aya::{Btf, Ebpf, EbpfLoader};
use vmtrace_common::Config;

use crate::{kernel::btf as kbtf, perf::EndPrograms, stacks::StackMode};

mod attach;
mod batch;
mod btf;
mod check;
mod granules;
pub mod hooks;
mod maps;
pub mod sizes;
mod source;

pub use attach::{AttachError, Attachment, Outcome};
pub use check::render_selection;
pub use hooks::{Family, Hook, ProgramKind};
pub use source::{AggregateSource, StackUsers};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Btf(#[from] kbtf::BtfError),
    #[error("loading the eBPF object failed: {0}")]
    Object(#[from] aya::EbpfError),
    // The refusals are part of the message (as `vmtrace check` prints it):
    // as `#[source]`s too, `{:#}` would print them twice.
    #[error("{what}: neither tp_btf ({btf}) nor the tracepoint {target} ({tp}) could be attached")]
    Attach { what: &'static str, target: &'static str, btf: String, tp: String },
    #[error("perf event {event}: {err}\nhint: needs CONFIG_PERF_EVENTS and CAP_PERFMON (or root)")]
    Perf { event: &'static str, err: AttachError },
    #[error("map {0} missing or of the wrong type in the eBPF object")]
    Map(&'static str),
    #[error("cannot list online CPUs: {0}")]
    Cpus(std::io::Error),
    #[error("hook {0} has no candidate program")]
    EmptyHook(&'static str),
    #[error("cannot turn on the kernel's BPF run-time statistics: {0}\nhint: --probe-stats needs CAP_SYS_ADMIN and kernel 5.8+")]
    Stats(String),
}

/// Has the kernel count every program's runs and run time while the
/// returned fd is open (`BPF_ENABLE_STATS`; the sysctl stays as it was).
pub fn enable_run_stats() -> Result<std::os::fd::OwnedFd, LoadError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| LoadError::Stats(e.to_string()))
}

/// `record`'s default `--fast-sample`: stratified fault time where the memcg
/// end serves, every slow fault exact and 1 in 16 fast minors timed and
/// weighted (docs/design.md). A fast fault left unsampled stays in its CPU's
/// slot marked ended: the page-cache hook takes it for over (`in_fault`), so
/// a file a process wrote is not read from disk (`checkpoints`
/// `pages_a_process_wrote_are_not_from_disk`, under both periods).
pub const DEFAULT_FAST_PERIOD: u32 = 16;

/// Why the huge-page hook is left out where the memcg fault end serves.
const HUGE_SEEN_BY_MEMCG_END: &str = "the memcg fault end sees the THP_FAULT_ALLOC of the fault in flight (shmem and tmpfs cannot map huge pages here), without a program on every page allocation";

#[allow(clippy::struct_excessive_bools, reason = "independent switches of one load")]
pub struct LoadOptions {
    pub trace_all: bool,
    /// Time 1 in N minor faults; 0 = do not time minor faults.
    pub minor_period: u32,
    /// With the memcg end (`minor_period` 1): time every slow fault exactly
    /// and 1 in N fast minor faults, weighted (`Config::fast_period`); 0 or
    /// 1 = every fault.
    pub fast_period: u32,
    /// Force classic tracepoints (tests the fallback path on kernels that have tp_btf).
    pub force_tracepoints: bool,
    /// Optional hook families to attach.
    pub families: Families,
    pub stacks: StackMode,
    /// Take a stack on 1 in N faults.
    pub stack_period: u32,
    /// Bytes of user stack copied with the registers where a frame-pointer
    /// walk is not whole (`vmtrace_common::STACK_WINDOWS`), 0 = none.
    pub stack_window: u32,
    /// Key stacks by address granule, for the region as leaf frame.
    pub leaf_region: bool,
    /// Where fexit is refused: put the fault-end perf events on the target's
    /// own tasks (`perf::FaultEnd`, opened by the caller) instead of every
    /// CPU. Other processes then skip the software-event path, and the perf
    /// counters' minor/major counts are the same events.
    pub end_on_tasks: bool,
    /// Stream every major fault (`EventKind::FaultMajor`) for the Perfetto trace.
    pub stream_majors: bool,
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
    /// Resident memory per process (`kmem:rss_stat`), and with stacks the
    /// sampled pages for the resident profiles.
    pub resident: bool,
    /// The kernel's own fault counters (and TLB-miss counters where a PMU
    /// exists), opened by the tracer, not the loader.
    pub perf: bool,
}

impl Families {
    /// Every family.
    pub const ALL: Self = Self { oom: true, mmap: true, tlb: true, regions: true, resident: true, perf: true };

    /// Whether a hook of `family` is attached.
    pub fn has(self, family: Family) -> bool {
        match family {
            Family::Core => true,
            Family::Oom => self.oom,
            Family::Mmap => self.mmap,
            Family::Regions => self.regions,
            Family::Tlb => self.tlb,
            Family::Resident => self.resident,
        }
    }
}

/// A random salt per recording for the resident sample's page hash: each
/// page is then in the sample with probability 1/N whatever its address.
fn random_salt() -> u64 {
    use std::hash::BuildHasher as _;
    // RandomState is seeded from the OS's random source.
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// Address of a kernel symbol from /proc/kallsyms (root sees real addresses).
/// Reads only up to the symbol: the kernel generates the file 4 KiB at a time,
/// and reading all of it (modules last) showed in start-up time.
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
    ebpf: Ebpf,
    attached: Vec<Attachment>,
    /// 1 in how many minor faults is timed, as attached (fexit times every one).
    minor_period: u32,
    /// 1 in how many fast minor faults is timed, every slow one exactly (the
    /// memcg end with `LoadOptions::fast_period` > 1); 0 = not stratified.
    fast_period: u32,
    /// The fault-end programs for the target's own perf events, when
    /// `LoadOptions::end_on_tasks` and fexit is refused; `fault_end` holds
    /// those events when no perf counters do.
    end_programs: Option<EndPrograms>,
    fault_end: Option<crate::perf::FaultEnd>,
    maps: maps::Maps,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// The salt of the resident sample's page hash (`RESIDENT_SALT`).
    page_salt: u64,
    /// The classic tracepoint fields' offsets the programs were loaded
    /// with (`TP_OFFSETS`): which fields this kernel's records lack.
    tp_offsets: vmtrace_common::TpOffsets,
}

impl Probes {
    /// Runs and run time of each program that ran (counted only while
    /// [`enable_run_stats`] is held).
    pub fn program_stats(&self) -> Vec<crate::model::ProgramStats> {
        let mut v: Vec<_> = self
            .ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                let runs = info.run_count();
                (runs > 0).then(|| crate::model::ProgramStats {
                    program: name.to_string(),
                    runs,
                    run_time_ns: info.run_time().as_nanos() as u64,
                })
            })
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.run_time_ns));
        v
    }

    pub fn load(opts: &LoadOptions) -> Result<Self, LoadError> {
        let btf::BtfFacts { offsets, fault_bits, tp_btf, user_walk, pgfault, thp_items, victim_task } =
            btf::btf_facts()?;
        let user_walk = user_walk_mode(user_walk && !opts.force_tracepoints);
        btf::release_freed_memory();
        let btf = Btf::from_sys_fs().map_err(|e| kbtf::BtfError::Read(e.to_string()))?;
        let memcg_pgfault = memcg_end_item(opts, pgfault, &tp_btf);
        let config = program_config(opts, fault_bits, user_walk, memcg_pgfault, thp_items);
        let page_salt = random_salt();
        // Each classic tracepoint's format, read once: the `Loaded` fields'
        // offsets now, the `Fixed` ones' check as each program attaches.
        let mut formats = crate::kernel::tpformat::Formats::kernel();
        let tp_offsets = formats.offsets_logged();
        let mut loader = EbpfLoader::new();
        arch_globals(&mut loader);
        sizes::apply(&mut loader);
        let mut ebpf = loader
            .btf(Some(&btf))
            .override_global("CONFIG", &config, true)
            .override_global("KOFFSETS", &offsets, true)
            // Classic tracepoint fields at this kernel's offsets (`TP_FIELDS`).
            .override_global("TP_OFFSETS", &tp_offsets, true)
            .override_global(
                "RESIDENT_PAGES",
                &u32::from(opts.families.resident && opts.stacks != StackMode::None),
                true,
            )
            .override_global("RESIDENT_SALT", &page_salt, true)
            .load(crate::EBPF_OBJECT)?;
        // aya holds its own copies of what it parsed.
        crate::stacks::objects::drop_pages_of(crate::EBPF_OBJECT);
        let logger = aya_log::EbpfLogger::init(&mut ebpf).ok();
        let wanted = |h: &&Hook| opts.families.has(h.family);
        let mut cx = attach::Context {
            ebpf: &mut ebpf,
            btf: &btf,
            tp_btf: &tp_btf,
            force_tracepoints: opts.force_tracepoints,
            offsets: &offsets,
            victim_task,
            formats: &mut formats,
        };
        // The memcg end marks anonymous huge faults itself (THP_FAULT_ALLOC);
        // where shmem or a tmpfs may map huge pages too, or the end is not the
        // memcg one, the `mm_page_alloc` hook does. That is arm64's
        // `HUGE_HOOK`: x86's `ALLOC_HOOK` is attached always, for the COW
        // copies, and marks huge faults too (once per fault either way).
        let memcg_huge = config.memcg_thp_fault != 0 && !crate::kernel::thp::shmem_huge_possible();
        let mut huge_row = None;
        let mut attached = Vec::new();
        let (mut minor_period, mut fast_period, mut end_programs) = (0, 0, None);
        // One walk of the table, in its order; the hooks named below are the
        // ones attached their own way (a hook is known by its unique `what`:
        // the table's items are constants, without one address).
        for hook in hooks::all().filter(wanted) {
            let is = |h: &Hook| hook.what == h.what;
            if is(&hooks::FAULT_END) {
                // fexit, else the memcg end (MEMCG_END), else the perf events.
                let (ends, minor, programs) = attach::fault_end(&mut cx, &config, opts)?;
                let memcg_attached = ends.iter().any(|a| a.target.contains("count_memcg_events") && a.kind().is_some());
                if let (Some(i), false) = (huge_row, memcg_attached) {
                    attached[i] = attach::attach(&mut cx, &hooks::HUGE_HOOK)?;
                }
                (minor_period, end_programs) = (minor, programs);
                fast_period = if memcg_attached { config.fast_period } else { 0 };
                attached.extend(ends);
            } else if is(&hooks::MEMCG_END) {
                // Tried by `attach::fault_end` above.
            } else if is(&hooks::USER_STACKS) {
                if opts.stacks.bits() & vmtrace_common::STACK_USER != 0 {
                    attached.push(attach::user_stacks(user_walk, opts.force_tracepoints));
                }
            } else if is(&hooks::HUGE_HOOK) && memcg_huge {
                huge_row = Some(attached.len());
                attached.push(Attachment {
                    what: hook.what,
                    target: "count_memcg_events".into(),
                    outcome: attach::Outcome::Skipped {
                        reason: format!("{}{HUGE_SEEN_BY_MEMCG_END}", crate::model::summary::NOT_NEEDED),
                    },
                });
            } else {
                attached.push(attach::attach(&mut cx, hook)?);
                if is(&hooks::OOM_DOMAIN) {
                    attach::enable_oom_helper(cx.ebpf, &attached, &offsets);
                }
            }
        }
        let maps = maps::Maps::take(&mut ebpf, user_walk != 0)?;
        Ok(Self {
            ebpf,
            attached,
            minor_period,
            fast_period,
            end_programs,
            fault_end: None,
            maps,
            logger,
            page_salt,
            tp_offsets,
        })
    }

    /// Whether copy-on-write faults that copied are told from those that
    /// reused their page (`GranuleCounts::cow_copied`): the `mm_page_alloc`
    /// programs count the copies wherever they run, as x86's `ALLOC_HOOK` or
    /// as arm64's `HUGE_HOOK` (the same programs, attached where THP is
    /// possible; their COW faults come from `ARM64_COW`).
    pub fn cow_copies_seen(&self) -> bool {
        self.attached
            .iter()
            .any(|a| (a.what == hooks::ALLOC_HOOK.what || a.what == hooks::HUGE_HOOK.what) && a.kind().is_some())
    }

    /// Whether the fault end sees `get_user_pages()` faults
    /// (`FaultStats::populated`): fexit and the memcg end do, perf events not.
    pub fn populated_seen(&self) -> bool {
        // Both attach as the row `MEMCG_END.what` (`attach::fault_end`).
        self.attached.iter().any(|a| a.what == hooks::MEMCG_END.what && a.kind().is_some())
    }

    /// What each hook got, in attach order (summary.json `probes[]`).
    pub fn attached(&self) -> &[Attachment] {
        &self.attached
    }

    /// The fault-end programs the caller puts on the target's tasks, when the
    /// loader left that to it (`LoadOptions::end_on_tasks`, no fexit).
    pub fn end_programs(&self) -> Option<EndPrograms> {
        self.end_programs
    }

    /// Keeps the target's fault-end events open as long as the probes (when no
    /// perf counters hold them); `detach_all` closes them.
    pub fn keep_fault_end(&mut self, end: Option<crate::perf::FaultEnd>) {
        self.fault_end = end;
    }

    /// Detaches every program; maps stay readable. A classic tracepoint's
    /// detach waits for RCU grace periods: hence tp_btf wherever a hook has
    /// it. `parallel`: a thread per program, which overlaps what the kernel
    /// does not serialize (docs/performance.md has the times); see
    /// `record::Detach` for when not to. Call `stop_counting` first.
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
}

/// The programs' globals only one architecture has. arm64 kernels run 4,
/// 16 or 64 KiB pages; the resident counters count them (`RSS_PAGE_SHIFT`).
#[allow(clippy::missing_const_for_fn, clippy::needless_pass_by_ref_mut, reason = "empty on x86-64")]
fn arch_globals(loader: &mut EbpfLoader<'_>) {
    #[cfg(target_arch = "aarch64")]
    {
        static SHIFT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let shift = SHIFT.get_or_init(|| {
            // SAFETY: sysconf has no preconditions.
            let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if n > 0 {
                (n as u64).trailing_zeros()
            } else {
                12
            }
        });
        loader.override_global("RSS_PAGE_SHIFT", shift, true);
    }
    let _ = loader;
}

/// The programs' `CONFIG`: the options, and what the kernel offers
/// (`btf::BtfFacts`, the memcg end's item, the user-stack walk).
fn program_config(
    opts: &LoadOptions,
    fault_bits: (u32, u32, u32),
    user_walk: u32,
    memcg_pgfault: u32,
    thp_items: (Option<u32>, Option<u32>),
) -> Config {
    // The memcg end sees THP allocations in a fault too (THP_FAULT_ALLOC;
    // shmem's THP_FILE_ALLOC): no hook on every page allocation then.
    let item = |v: Option<u32>| if memcg_pgfault != 0 { v.map_or(0, |v| v + 1) } else { 0 };
    Config {
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
        memcg_pgfault,
        // The copy needs the user registers (bpf_task_pt_regs), as the own walk does.
        stack_window: if user_walk != 0 && opts.stacks.bits() & vmtrace_common::STACK_USER != 0 {
            opts.stack_window
        } else {
            0
        },
        stream_majors: u32::from(opts.stream_majors),
        fast_period: if memcg_pgfault != 0 && opts.fast_period > 1 { opts.fast_period } else { 0 },
        memcg_thp_fault: item(thp_items.0),
        memcg_thp_file: item(thp_items.1),
        _pad: 0,
    }
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

/// `Config::memcg_pgfault`: PGFAULT + 1 where `memcg:count_memcg_events` can
/// end every fault — 6.14+ (the tracepoint), every minor fault to be timed
/// (`--latency-sample 1`, the default; a larger N asks for the sampled perf
/// end), and the memory controller on (else `count_memcg_events()` returns
/// before its tracepoint).
fn memcg_end_item(opts: &LoadOptions, pgfault: Option<u32>, tp_btf: &crate::hash::HashSet<&'static str>) -> u32 {
    let Some(item) = pgfault else { return 0 };
    let hook = tp_btf.contains("count_memcg_events")
        || crate::kernel::preflight::tracepoint_exists("memcg", "count_memcg_events");
    if opts.minor_period != 1 || !hook || !memory_controller_enabled() {
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
