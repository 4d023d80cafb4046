//! Hardware TLB-miss counters where a PMU exists, and the kernel's own
//! software fault counters always, for the same target as the trace: the
//! cross-check of vmtrace's counts against the kernel's accounting.
pub mod sampling;

use crate::model::PerfSummary;
use perf_event::{
    events::{Cache, CacheId, CacheOp, CacheResult, Event, Hardware, Raw, Software},
    Builder, Counter,
};
use std::os::fd::{AsRawFd as _, RawFd};

/// Which tasks the counters watch.
#[derive(Clone, Debug)]
pub enum Scope {
    /// These threads, and every task they create later (perf `inherit`).
    Tasks(Vec<u32>),
    /// Everything on these CPUs.
    Cpus(Vec<u32>),
}

impl Scope {
    /// Every thread of `pid` as it is now; later threads and children inherit.
    pub fn process(pid: u32) -> Self {
        let tids = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_or_else(|_| vec![pid], |d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect());
        Self::Tasks(tids)
    }

    pub fn system() -> Self {
        Self::Cpus(aya::util::online_cpus().unwrap_or_else(|_| vec![0]))
    }

    fn describe(&self) -> String {
        match self {
            Self::Tasks(t) if t.len() == 1 => "the target and its descendants".into(),
            Self::Tasks(t) => format!("the target's {} threads and their descendants", t.len()),
            Self::Cpus(c) => format!("all {} CPUs (system-wide)", c.len()),
        }
    }
}

/// One event, opened once per task or CPU of the scope.
struct Multi {
    counters: Vec<Counter>,
}

impl Multi {
    fn open<E: Event + Clone>(scope: &Scope, event: &E) -> std::io::Result<Self> {
        Self::open_with(scope, event, |_| {})
    }

    fn open_with<E: Event + Clone>(scope: &Scope, event: &E, extra: impl Fn(&mut Builder)) -> std::io::Result<Self> {
        let mut counters = Vec::new();
        let base = |b: &mut Builder| {
            // Faults taken in kernel mode on user memory count too, as in getrusage.
            b.include_kernel().enabled(true);
            extra(b);
        };
        match scope {
            Scope::Tasks(tids) => {
                for &tid in tids {
                    let mut b = Builder::new(event.clone());
                    base(&mut b);
                    match b.observe_pid(tid as i32).any_cpu().inherit(true).build() {
                        Ok(c) => counters.push(c),
                        // A thread that exited meanwhile is not an error.
                        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Scope::Cpus(cpus) => {
                for &cpu in cpus {
                    let mut b = Builder::new(event.clone());
                    base(&mut b);
                    counters.push(b.any_pid().one_cpu(cpu as usize).build()?);
                }
            }
        }
        Ok(Self { counters })
    }

    fn read(&mut self) -> u64 {
        self.counters.iter_mut().filter_map(|c| c.read().ok()).sum()
    }

    /// A software fault event sampled every `period`, running `prog` (a
    /// perf_event program) on each sample: a fault-end hook that is also a counter.
    fn open_end(scope: &Scope, event: Software, period: u64, prog: RawFd) -> std::io::Result<Self> {
        let mut m = Self::open_with(scope, &event, |b| {
            b.sample_period(period);
        })?;
        for c in &mut m.counters {
            // SAFETY: PERF_EVENT_IOC_SET_BPF takes a program fd; both fds are live.
            if unsafe { libc::ioctl(c.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(m)
    }
}

/// `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// The fault-end programs, loaded and waiting for the target's events.
#[derive(Clone, Copy, Debug)]
pub struct EndPrograms {
    /// PAGE_FAULTS_MIN's program and period; `None` when minor faults are not timed.
    pub min: Option<(RawFd, u64)>,
    /// PAGE_FAULTS_MAJ's program (period 1).
    pub maj: RawFd,
}

/// The fault-end hooks on the target's own tasks (inherited by every task
/// they create): only the target takes the software-event path, and the
/// events count the kernel's minor and major faults as well.
pub struct FaultEnd {
    min: Option<Multi>,
    maj: Multi,
}

impl FaultEnd {
    pub fn open(scope: &Scope, p: &EndPrograms) -> Result<Self, CountersError> {
        let err = |event| move |err| CountersError { event, err };
        let maj = Multi::open_end(scope, Software::PAGE_FAULTS_MAJ, 1, p.maj).map_err(err("major-faults"))?;
        let min = p
            .min
            .map(|(prog, period)| Multi::open_end(scope, Software::PAGE_FAULTS_MIN, period, prog))
            .transpose()
            .map_err(err("minor-faults"))?;
        Ok(Self { min, maj })
    }
}

/// Why a hardware event could not be opened, as a person needs to hear it.
pub fn explain(err: &std::io::Error) -> String {
    let hint = match err.raw_os_error() {
        Some(libc::ENOENT) => "no hardware PMU visible — a VM without PMU passthrough?",
        Some(libc::EOPNOTSUPP | libc::EINVAL) => "this PMU does not offer the event",
        Some(libc::ENODEV) => "the CPU has no such event",
        Some(libc::EACCES | libc::EPERM) => "not permitted: needs CAP_PERFMON, or kernel.perf_event_paranoid <= 1",
        Some(libc::EBUSY) => "the PMU is in use by someone else (e.g. a hypervisor or another profiler)",
        _ => "unexpected error",
    };
    format!("{hint} (perf_event_open: {err})")
}

const DTLB_LOAD_MISS: Cache = Cache { which: CacheId::DTLB, operation: CacheOp::READ, result: CacheResult::MISS };
const DTLB_STORE_MISS: Cache = Cache { which: CacheId::DTLB, operation: CacheOp::WRITE, result: CacheResult::MISS };
const ITLB_MISS: Cache = Cache { which: CacheId::ITLB, operation: CacheOp::READ, result: CacheResult::MISS };

/// Intel (Skylake and later) DTLB_LOAD_MISSES.WALK_ACTIVE: event 0x08,
/// umask 0x10, cmask 1 — cycles with a load page walk in progress.
const INTEL_DTLB_LOAD_WALK_ACTIVE: u64 = 0x08 | (0x10 << 8) | (1 << 24);

fn is_intel() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains("GenuineIntel"))
}

pub struct Counters {
    scope: Scope,
    /// `None`: minor faults are counted from the tasks' own counters
    /// (`PerfSummary::minor_from_tasks`).
    minor: Option<Multi>,
    major: Multi,
    switches: Multi,
    hw: Result<Hw, String>,
}

struct Hw {
    dtlb_load: Multi,
    dtlb_store: Option<Multi>,
    itlb: Option<Multi>,
    instructions: Option<Multi>,
    cycles: Option<Multi>,
    walk_active: Option<Multi>,
}

#[derive(Debug, thiserror::Error)]
#[error("software perf counter {event}: {err}\nhint: needs CONFIG_PERF_EVENTS and root/CAP_PERFMON")]
pub struct CountersError {
    event: &'static str,
    err: std::io::Error,
}

impl Counters {
    /// Opens every counter for `scope`. Software counters must work; hardware
    /// ones are optional and their absence is recorded with the reason.
    ///
    /// With the target's fault-end events (`end`), their counts are the minor
    /// and major counters: a second event of the same type would cost every
    /// fault once more.
    ///
    /// The kernel's `page-faults` event is not opened: it counts at fault
    /// entry, in the kernel's software-event path, which costs every fault of
    /// the target ~45 ns while an event of that type exists; vmtrace's start
    /// hook sees the same entries.
    ///
    /// `minor_from_tasks` (a command, whose task counters vmtrace reads when
    /// it ends): no counting PAGE_FAULTS_MIN event either, for the same
    /// reason; the minor count is then filled in from the task counters. The
    /// fault end's own sampled PAGE_FAULTS_MIN event, where there is one,
    /// still counts them.
    pub fn open(scope: Scope, end: Option<FaultEnd>, minor_from_tasks: bool) -> Result<Self, CountersError> {
        let sw = |event: &'static str, e: Software| Multi::open(&scope, &e).map_err(|err| CountersError { event, err });
        let minor_event = || -> Result<Option<Multi>, CountersError> {
            if minor_from_tasks {
                Ok(None)
            } else {
                sw("minor-faults", Software::PAGE_FAULTS_MIN).map(Some)
            }
        };
        let (minor, major) = match end {
            Some(FaultEnd { min: Some(min), maj }) => (Some(min), maj),
            Some(FaultEnd { min: None, maj }) => (minor_event()?, maj),
            None => (minor_event()?, sw("major-faults", Software::PAGE_FAULTS_MAJ)?),
        };
        let switches = sw("context-switches", Software::CONTEXT_SWITCHES)?;
        let hw = match Multi::open(&scope, &DTLB_LOAD_MISS) {
            Ok(dtlb_load) => Ok(Hw {
                dtlb_load,
                dtlb_store: Multi::open(&scope, &DTLB_STORE_MISS).ok(),
                itlb: Multi::open(&scope, &ITLB_MISS).ok(),
                instructions: Multi::open(&scope, &Hardware::INSTRUCTIONS).ok(),
                cycles: Multi::open(&scope, &Hardware::CPU_CYCLES).ok(),
                walk_active: is_intel()
                    .then(|| Multi::open(&scope, &Raw::new(INTEL_DTLB_LOAD_WALK_ACTIVE)).ok())
                    .flatten(),
            }),
            Err(e) => Err(format!("dTLB-load-misses: {}", explain(&e))),
        };
        Ok(Self { scope, minor, major, switches, hw })
    }

    pub fn hardware_supported(&self) -> bool {
        self.hw.is_ok()
    }

    pub fn read(&mut self) -> PerfSummary {
        let (minor, major) = (self.minor.as_mut().map_or(0, Multi::read), self.major.read());
        let mut s = PerfSummary {
            kernel_page_faults: minor + major,
            kernel_minor_faults: minor,
            kernel_major_faults: major,
            context_switches: self.switches.read(),
            scope: self.scope.describe(),
            minor_from_tasks: self.minor.is_none(),
            ..PerfSummary::default()
        };
        match &mut self.hw {
            Ok(hw) => {
                s.supported = true;
                s.dtlb_load_misses = Some(hw.dtlb_load.read());
                s.dtlb_store_misses = hw.dtlb_store.as_mut().map(Multi::read);
                s.itlb_misses = hw.itlb.as_mut().map(Multi::read);
                s.instructions = hw.instructions.as_mut().map(Multi::read);
                s.cycles = hw.cycles.as_mut().map(Multi::read);
                if let Some(ins) = s.instructions.filter(|&i| i > 0) {
                    let misses = s.dtlb_load_misses.unwrap_or(0) + s.dtlb_store_misses.unwrap_or(0);
                    s.dtlb_misses_per_kilo_instructions = Some(misses as f64 * 1000.0 / ins as f64);
                }
                if let (Some(w), Some(c)) = (hw.walk_active.as_mut().map(Multi::read), s.cycles.filter(|&c| c > 0)) {
                    s.page_walk_cycles_pct = Some(w as f64 * 100.0 / c as f64);
                }
            }
            Err(reason) => reason.clone_into(&mut s.reason),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_missing_pmu() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert!(explain(&e).contains("no hardware PMU visible"));
        let e = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(explain(&e).contains("CAP_PERFMON"));
    }
}
