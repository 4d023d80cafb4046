//! vmtrace kernel programs. One module per probe family under `probes/`,
//! each with the maps only it uses. Below them, with no cycles:
//! `globals` (loader-set config and BTF offsets) ← `shared` (traced set, drop
//! counters, event ring), `mapgen` (address-space generations) and
//! `inflight` (faults in flight) ← `samples` (copied user stacks) ← `stacks`
//! (stack ids and the user-stack walk) ← `probes`.
#![no_std]
#![no_main]
// An atomic add (mapgen.rs): core's atomics have no read-modify-write on BPF.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

mod arch;
mod globals;
mod inflight;
mod mapgen;
mod probes;
mod python;
mod samples;
mod shared;
mod stacks;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// GPL-compatible: bpf_probe_read_kernel and the tp_btf/perf_event helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
