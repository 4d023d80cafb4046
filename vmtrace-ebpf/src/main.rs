//! vmtrace kernel programs. One module per probe family under `probes/`;
//! the maps and read-only globals they share live in `maps.rs`; the user-stack
//! walker in `ustack.rs`.
#![no_std]
#![no_main]

mod maps;
mod probes;
mod ustack;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// GPL-compatible: bpf_probe_read_kernel and the tp_btf/perf_event helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
