//! The userspace half of a trace: drain the kernel's event stream into the
//! process table while the target runs, then read the in-kernel aggregates
//! once and turn them into a `Summary`.
//!
//! [`session`] runs the loop; it reads the kernel only through
//! [`AggregateSource`] (defined beside the maps it reads, in `loader`). Each job has its own file: [`timeline`],
//! [`flight`] (the OOM flight recorder), [`storms`], [`symbols`],
//! [`attribute`] (regions), [`session::live`] (the live snapshot), and
//! [`assemble`], the pure step from aggregates to the summary.
pub(crate) mod assemble;
pub(crate) mod attribute;
#[cfg(test)]
pub mod fake;
pub(crate) mod flight;
pub(crate) mod folded;
pub(crate) mod pinned;
pub(crate) mod placement;
pub(crate) mod process;
pub(crate) mod python;
pub(crate) mod resident;
pub(crate) mod session;
pub(crate) mod storms;
pub(crate) mod symbols;
pub(crate) mod timeline;
pub(crate) mod tracelog;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

pub(crate) use crate::loader::AggregateSource;

/// `--storm-threshold`'s default: TLB-flush IPIs per second above which a
/// process is in a shootdown storm.
pub(crate) const DEFAULT_STORM_THRESHOLD: f64 = 1000.0;
pub(crate) use session::{live, Session, SessionOptions};

use crate::model::MmSite;
use crate::{model::Summary, stacks::Stack};

/// Last SIGINT/SIGTERM received (0 = none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// How many SIGINT/SIGTERM were received.
static STOP_COUNT: AtomicU32 = AtomicU32::new(0);
/// Whether the first one came from the terminal (Ctrl-C: `si_code` SI_KERNEL,
/// sent by the tty to its whole foreground process group), not from kill(2).
static STOP_FROM_TERMINAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let code = if info.is_null() { libc::SI_USER } else { unsafe { (*info).si_code } };
    if STOP_COUNT.fetch_add(1, Ordering::SeqCst) == 0 {
        STOP_FROM_TERMINAL.store(code == libc::SI_KERNEL, Ordering::SeqCst);
    }
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the trace cleanly, with every output written.
pub(crate) fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe;
        // the sigaction is fully initialised (zeroed, empty mask).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&raw mut sa.sa_mask);
            libc::sigaction(sig, &raw const sa, std::ptr::null_mut());
        }
    }
}

pub(crate) fn stop_signal() -> Option<i32> {
    match STOP_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// How many stop signals (SIGINT/SIGTERM) vmtrace has received.
pub(crate) fn stop_signals_received() -> u32 {
    STOP_COUNT.load(Ordering::SeqCst)
}

/// Whether the first stop signal came from the terminal (Ctrl-C), which
/// sent it to every process of the foreground process group too.
pub(crate) fn stop_from_terminal() -> bool {
    STOP_FROM_TERMINAL.load(Ordering::SeqCst)
}

/// What a finished session hands to the reports.
pub struct Finished {
    pub summary: Summary,
    pub stacks: Vec<Stack>,
    pub mm_sites: Vec<MmSite>,
    /// The Perfetto trace's event log (`SessionOptions::trace_log`).
    pub trace: Option<crate::model::trace::TraceLog>,
    /// The resident profiles (`--events resident` with stacks).
    pub resident: Option<resident::ResidentProfiles>,
}

/// With `RUST_LOG=vmtrace::end=debug`: the collector's resident memory now
/// and at its peak, after the step `what` (where the end's memory goes).
pub(crate) fn log_own_memory(what: &str) {
    if !log::log_enabled!(target: "vmtrace::end", log::Level::Debug) {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |f: &str| pinned::status_kb(&status, f).map_or_else(|| "?".into(), |b| (b / 1024).to_string());
    log::debug!(target: "vmtrace::end", "after {what}: VmRSS {} kB, RssAnon {} kB, VmHWM {} kB", kb("VmRSS"), kb("RssAnon"), kb("VmHWM"));
}
