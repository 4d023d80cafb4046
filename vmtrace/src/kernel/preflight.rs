//! Prerequisites, checked before loading anything: each is ok, or missing with
//! the fix. `vmtrace check` prints the same table `record` enforces.
use std::{
    fmt, fs,
    path::{Path, PathBuf},
};

use super::btf;

pub const TRACEFS: &str = "/sys/kernel/tracing";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Needed: recording cannot start without it.
    Missing,
    /// Optional: a feature degrades, recording works.
    Degraded,
    /// Informational.
    Info,
}

#[derive(Clone, Debug)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub detail: String,
    pub fix: Option<String>,
}

impl Check {
    fn new(name: &str, status: Status, detail: impl Into<String>, fix: Option<&str>) -> Self {
        Self { name: name.into(), status, detail: detail.into(), fix: fix.map(Into::into) }
    }
}

/// Tracepoints the fault and task probes attach to (category, name).
#[cfg(not(target_arch = "aarch64"))]
pub const TRACEPOINTS: &[(&str, &str)] = &[
    ("exceptions", "page_fault_user"),
    ("exceptions", "page_fault_kernel"),
    ("sched", "sched_switch"),
    ("sched", "sched_process_fork"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
];

/// arm64 has no `exceptions:page_fault_*`: the fault start is fentry on
/// `handle_mm_fault` or the software event PAGE_FAULTS (`arm64_checks`).
#[cfg(target_arch = "aarch64")]
pub const TRACEPOINTS: &[(&str, &str)] = &[
    ("sched", "sched_switch"),
    ("sched", "sched_process_fork"),
    ("sched", "sched_process_exec"),
    ("sched", "sched_process_exit"),
];

/// Tracepoints of the optional families (mmap, tlb, oom): a missing one fails
/// only when its family is asked for.
#[cfg(not(target_arch = "aarch64"))]
pub const OPTIONAL_TRACEPOINTS: &[(&str, &str)] = &[
    ("syscalls", "sys_enter_munmap"),
    ("tlb", "tlb_flush"),
    ("csd", "csd_queue_cpu"),
    ("oom", "mark_victim"),
    ("vmscan", "mm_vmscan_direct_reclaim_begin"),
];

/// arm64: no `tlb:tlb_flush` and no shootdown IPIs (`arm64_checks`).
#[cfg(target_arch = "aarch64")]
pub const OPTIONAL_TRACEPOINTS: &[(&str, &str)] =
    &[("syscalls", "sys_enter_munmap"), ("oom", "mark_victim"), ("vmscan", "mm_vmscan_direct_reclaim_begin")];

/// What arm64 offers in place of x86's fault tracepoints and TLB hooks,
/// said plainly: `vmtrace check` prints these rows.
#[cfg(target_arch = "aarch64")]
fn arm64_checks() -> Vec<Check> {
    let mut start = sw_event_check("perf sw PAGE_FAULTS (fault start)", PERF_COUNT_SW_PAGE_FAULTS);
    if start.status == Status::Ok {
        start.detail = "software perf event available: the fault start where fentry on handle_mm_fault is \
                        refused (no access type there: write and exec faults are not counted; COW faults come from \
                        do_wp_page, see probe selection)"
            .into();
    }
    vec![
        Check::new(
            "exceptions:page_fault_*",
            Status::Info,
            "not on arm64: faults start at fentry handle_mm_fault, else the software event PAGE_FAULTS \
             (probe selection below says which)",
            None,
        ),
        start,
        Check::new(
            "TLB shootdowns (arm64)",
            Status::Info,
            "not counted: arm64 flushes TLBs with broadcast TLBI instructions, so there are no shootdown \
             IPIs, and it has no tlb:tlb_flush tracepoint; the TLB family records nothing here",
            None,
        ),
    ]
}

/// Mounts tracefs at its usual place when it is not there (a fresh machine).
pub fn ensure_tracefs() -> Result<(), String> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    let src = c"tracefs";
    let dst = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), src.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 {
        log::info!("mounted tracefs at {TRACEFS}");
        Ok(())
    } else {
        Err(format!(
            "tracefs is not mounted and mounting it failed: {}\nhint: mount -t tracefs tracefs {TRACEFS}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Effective capability bits of this process.
fn cap_eff() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

pub fn privileges() -> Check {
    let caps = cap_eff();
    let has = |c: u32| caps & (1 << c) != 0;
    let ok = has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
    if ok {
        // SAFETY: geteuid has no preconditions.
        let who = if unsafe { libc::geteuid() } == 0 { "root" } else { "CAP_BPF+CAP_PERFMON" };
        Check::new("privileges", Status::Ok, who, None)
    } else {
        Check::new(
            "privileges",
            Status::Missing,
            "not root and lacking CAP_BPF+CAP_PERFMON",
            Some("run as root (sudo vmtrace …) or grant: setcap cap_bpf,cap_perfmon,cap_sys_resource+ep $(which vmtrace)"),
        )
    }
}

/// (major, minor) of the running kernel, from a release such as "6.18.44-fc".
pub fn kernel_release() -> Option<(u32, u32)> {
    parse_release(&fs::read_to_string("/proc/sys/kernel/osrelease").ok()?)
}

fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

pub fn kernel_version() -> Check {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    Check::new("kernel", Status::Info, release.trim(), None)
}

pub fn btf_check() -> Check {
    if Path::new(btf::VMLINUX_BTF).exists() {
        Check::new("BTF", Status::Ok, btf::VMLINUX_BTF, None)
    } else {
        Check::new(
            "BTF",
            Status::Missing,
            format!("{} not found", btf::VMLINUX_BTF),
            Some("use a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's since 2021)"),
        )
    }
}

pub fn tracefs_check() -> Check {
    match ensure_tracefs() {
        Ok(()) => Check::new("tracefs", Status::Ok, TRACEFS, None),
        Err(e) => Check::new("tracefs", Status::Missing, e, Some("mount -t tracefs tracefs /sys/kernel/tracing")),
    }
}

/// The tracefs directory of tracepoint `category:name` (its `format`, `id`, `enable`).
pub fn tracepoint_dir(category: &str, name: &str) -> PathBuf {
    Path::new(TRACEFS).join("events").join(category).join(name)
}

pub fn tracepoint_exists(category: &str, name: &str) -> bool {
    tracepoint_dir(category, name).is_dir()
}

pub fn tracepoint_check(category: &str, name: &str) -> Check {
    let path = tracepoint_dir(category, name);
    let label = format!("tracepoint {category}:{name}");
    if path.is_dir() {
        Check::new(&label, Status::Ok, "present", None)
    } else if category == "exceptions" {
        Check::new(
            &label,
            Status::Missing,
            "absent (the exceptions tracepoints exist on x86 only)",
            Some("vmtrace's fault start hook needs x86-64 for now"),
        )
    } else {
        Check::new(&label, Status::Missing, "absent", Some("use a kernel with CONFIG_TRACEPOINTS=y"))
    }
}

/// Opens a counting perf event system-wide on CPU 0 to see whether it exists.
pub fn perf_event_available(type_: u32, config: u64) -> Result<(), std::io::Error> {
    // perf_event_attr, first 64 bytes (PERF_ATTR_SIZE_VER0): type, size, config, then zeros.
    let mut attr = [0u64; 8];
    attr[0] = u64::from(type_) | (64u64 << 32);
    attr[1] = config;
    // SAFETY: attr is a valid, 64-byte perf_event_attr; the fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), -1, 0, -1, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by the kernel.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_HW_CACHE: u32 = 3;
/// Every fault (arm64's fault start where fentry is refused).
pub const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;
pub const PERF_COUNT_SW_PAGE_FAULTS_MIN: u64 = 5;
pub const PERF_COUNT_SW_PAGE_FAULTS_MAJ: u64 = 6;
/// dTLB read misses: PERF_COUNT_HW_CACHE_DTLB | OP_READ << 8 | RESULT_MISS << 16.
pub const HW_CACHE_DTLB_LOAD_MISS: u64 = 3 | (1 << 16);

pub fn sw_event_check(label: &str, config: u64) -> Check {
    match perf_event_available(PERF_TYPE_SOFTWARE, config) {
        Ok(()) => Check::new(label, Status::Ok, "software perf event available", None),
        Err(e) => Check::new(
            label,
            Status::Missing,
            format!("perf_event_open failed: {e}"),
            Some("needs CONFIG_PERF_EVENTS and root/CAP_PERFMON; check /proc/sys/kernel/perf_event_paranoid"),
        ),
    }
}

pub fn pmu_check() -> Check {
    match perf_event_available(PERF_TYPE_HW_CACHE, HW_CACHE_DTLB_LOAD_MISS) {
        Ok(()) => Check::new("PMU (dTLB-load-misses)", Status::Ok, "hardware counters available", None),
        Err(e) => Check::new(
            "PMU (dTLB-load-misses)",
            Status::Degraded,
            format!("unsupported ({e}): no hardware PMU visible — a VM without PMU passthrough?"),
            Some("TLB-miss counters need a PMU; everything else works without one"),
        ),
    }
}

/// Every check, in the order problems should be fixed.
pub fn run_all() -> Vec<Check> {
    let mut checks = vec![privileges(), kernel_version(), btf_check(), tracefs_check()];
    for (c, n) in TRACEPOINTS {
        checks.push(tracepoint_check(c, n));
    }
    for (c, n) in OPTIONAL_TRACEPOINTS {
        let mut chk = tracepoint_check(c, n);
        if chk.status == Status::Missing {
            chk.status = Status::Degraded;
            chk.fix = Some(match *c {
                "csd" => "csd tracepoints arrived in 6.6: IPIs are counted where they land, none to a lazy CPU".into(),
                _ => format!("the {c} family needs it; record without it via --events"),
            });
        }
        checks.push(chk);
    }
    #[cfg(target_arch = "aarch64")]
    checks.extend(arm64_checks());
    checks.push(sw_event_check("perf sw PAGE_FAULTS_MIN", PERF_COUNT_SW_PAGE_FAULTS_MIN));
    checks.push(sw_event_check("perf sw PAGE_FAULTS_MAJ", PERF_COUNT_SW_PAGE_FAULTS_MAJ));
    checks.push(pmu_check());
    checks
}

/// The first missing prerequisite as an error naming the fix.
pub fn require(checks: &[Check]) -> Result<(), String> {
    match checks.iter().find(|c| c.status == Status::Missing) {
        None => Ok(()),
        Some(c) => Err(format!(
            "{}: {}{}",
            c.name,
            c.detail,
            c.fix.as_ref().map(|f| format!("\nhint: {f}")).unwrap_or_default()
        )),
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Missing => "MISSING",
            Status::Degraded => "degraded",
            Status::Info => "info",
        })
    }
}

pub fn render(checks: &[Check]) -> String {
    use fmt::Write as _;
    let w = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(out, "{:<w$}  {:<8}  {}", c.name, c.status.to_string(), c.detail);
        if let (Some(fix), Status::Missing | Status::Degraded) = (&c.fix, c.status) {
            let _ = writeln!(out, "{:<w$}  {:<8}  fix: {fix}", "", "");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_to_major_minor() {
        assert_eq!(parse_release("6.18.44-fc-v657\n"), Some((6, 18)));
        assert_eq!(parse_release("6.1.0-57-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.15.0"), Some((5, 15)));
        assert_eq!(parse_release("garbage"), None);
    }
}
