//! Read-only globals the loader sets before load (`CONFIG`, `KOFFSETS`) and
//! the one control word userspace writes while the programs run (`CONTROL`).
use aya_ebpf::{macros::map, maps::Array};
use vmtrace_common::{
    Config, KernelOffsets, Tp, TpOffsets, CONTROL_ENTRIES, CONTROL_LAUNCHER, CONTROL_RUNNING, CONTROL_STOPPED,
};

/// Written by userspace, `CONTROL_*`: the window every aggregate covers, the
/// same as the kernel's own counters' (opened at its start, read at its end).
#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(CONTROL_ENTRIES, 0);

#[inline(always)]
fn control() -> u32 {
    CONTROL.get(0).copied().unwrap_or(CONTROL_STOPPED)
}

#[inline(always)]
pub fn stopped() -> bool {
    control() == CONTROL_STOPPED
}

/// Whether `tgid` is the launcher whose forks are followed now
/// (`CONTROL_LAUNCHER`: vmtrace, while it forks the command it starts).
#[inline(always)]
pub fn is_launcher(tgid: u32) -> bool {
    tgid != 0 && CONTROL.get(CONTROL_LAUNCHER).is_some_and(|l| *l == tgid) && !stopped()
}

/// `-a` counts a process only inside the window; a traced target is counted
/// from the moment it is added, which userspace does inside it.
#[inline(always)]
pub fn system_wide_counting() -> bool {
    conf(|c| &c.trace_all) != 0 && control() == CONTROL_RUNNING
}

/// Set by the loader before load; never written here.
#[unsafe(no_mangle)]
static CONFIG: Config = Config {
    trace_all: 0,
    minor_period: 1,
    stack_mode: 0,
    stack_period: 1,
    leaf_region: 0,
    mm: 0,
    flush_tlb_func: 0,
    regions: 0,
    vm_fault_unaccounted: 0,
    vm_fault_major: 0,
    fault_flag_tried: 0,
    user_walk: 0,
    memcg_pgfault: 0,
    stack_window: 0,
    stream_majors: 0,
    fast_period: 0,
    memcg_thp_fault: 0,
    memcg_thp_file: 0,
    _pad: 0,
};

/// Kernel struct offsets from BTF, set by the loader.
#[unsafe(no_mangle)]
static KOFFSETS: KernelOffsets = KernelOffsets::UNKNOWN;

/// The running kernel's offsets of the classic tracepoint fields read at a
/// loaded offset (`vmtrace_common::TP_FIELDS`), set by the loader from the
/// format files; `TpOffsets::MISSING` where the record lacks the field.
#[unsafe(no_mangle)]
static TP_OFFSETS: TpOffsets = TpOffsets::TABLE;

/// One offset of `TP_OFFSETS`, read alone.
#[inline(always)]
pub fn tp_offset(f: Tp) -> u16 {
    // SAFETY: as for `config`.
    unsafe { core::ptr::read_volatile(&raw const TP_OFFSETS.offsets[f as usize]) }
}

/// One field of `CONFIG`, read alone: `config()` copies all of it (a load
/// per field, in every hook that calls it). `conf(|c| &c.regions)`.
#[inline(always)]
// Through a raw pointer, as `config` does: a plain `&CONFIG` lets the
// compiler read the loader-patched static as its compile-time value.
#[allow(clippy::deref_addrof)]
pub fn conf<T: Copy>(field: impl FnOnce(&Config) -> &T) -> T {
    // SAFETY: as `config`; volatile, so the loader's value is read.
    unsafe { core::ptr::read_volatile(field(&*(&raw const CONFIG))) }
}

#[inline(always)]
pub fn config() -> Config {
    // SAFETY: a global the loader rewrites before load; volatile so the compiler
    // does not fold the default value in.
    unsafe { core::ptr::read_volatile(&raw const CONFIG) }
}

#[inline(always)]
pub fn koffsets() -> KernelOffsets {
    // SAFETY: as for `config`.
    unsafe { core::ptr::read_volatile(&raw const KOFFSETS) }
}

/// `task_struct.thread.fsbase` read alone: the Python walk, inside the user
/// stack walk, needs this one offset and not a stack copy of them all.
#[inline(always)]
pub fn koffset_task_fsbase() -> u32 {
    // SAFETY: as for `config`.
    unsafe { core::ptr::read_volatile(&raw const KOFFSETS.task_fsbase) }
}

/// `task_struct.pagefault_disabled` read alone: the fault start hook checks
/// it on each kernel-mode fault (`inflight::nofault_read`).
#[inline(always)]
pub fn koffset_task_pagefault_disabled() -> u32 {
    // SAFETY: as for `config`.
    unsafe { core::ptr::read_volatile(&raw const KOFFSETS.task_pagefault_disabled) }
}
