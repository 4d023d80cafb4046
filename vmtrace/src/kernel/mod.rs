//! What the running kernel offers: BTF offsets, tracefs, capabilities, THP.
pub mod btf;
pub mod preflight;
pub mod thp;
pub mod tpformat;

/// CLOCK_MONOTONIC now, in ns: the kernel's clock, as `bpf_ktime_get_ns`
/// and the Perfetto trace read it.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel's page size (4 KiB on x86-64; 4, 16 or 64 KiB on arm64).
#[must_use]
pub fn page_size() -> u64 {
    // SAFETY: no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|p| *p > 0).unwrap_or(4096)
}
