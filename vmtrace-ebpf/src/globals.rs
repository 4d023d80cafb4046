//! Read-only globals the loader sets before load (`CONFIG`, `KOFFSETS`) and
//! the one control word userspace writes while the programs run (`CONTROL`).
use aya_ebpf::{macros::map, maps::Array};
use vmtrace_common::{Config, KernelOffsets};

/// Written by userspace: 1 = stop counting. Set at the end so every aggregate
/// and the kernel's own counters cover the same moment.
#[map]
pub static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
pub fn stopped() -> bool {
    CONTROL.get(0).is_some_and(|v| *v != 0)
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
    _pad: 0,
};

/// Kernel struct offsets from BTF, set by the loader.
#[unsafe(no_mangle)]
static KOFFSETS: KernelOffsets = KernelOffsets::UNKNOWN;

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
