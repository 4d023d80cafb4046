//! What the loader needs from the kernel's BTF (read by
//! `kernel::btf`).
use crate::hash::HashSet;

use super::{hooks, LoadError};
use crate::kernel::btf as kbtf;

pub(super) struct BtfFacts {
    pub offsets: vmtrace_common::KernelOffsets,
    /// `vm_fault_reason` bits: unaccounted (error | retry), major; FAULT_FLAG_TRIED.
    pub fault_bits: (u32, u32, u32),
    /// tp_btf events of the hook table whose `btf_trace_*` typedef exists.
    pub tp_btf: HashSet<&'static str>,
    /// `bpf_task_pt_regs` exists (5.15+): the programs walk user stacks themselves.
    pub user_walk: bool,
    /// `PGFAULT` in `enum vm_event_item`.
    pub pgfault: Option<u32>,
    /// `THP_FAULT_ALLOC` and `THP_FILE_ALLOC` in `enum vm_event_item`.
    pub thp_items: (Option<u32>, Option<u32>),
    /// `mark_victim` passes the victim's `task_struct *` (6.8+), which
    /// `tp_btf_mark_victim` reads; before 6.8 it passes the pid alone.
    pub victim_task: bool,
}

/// Reads the facts, then drops the BTF bytes before aya parses its own copy:
/// holding both at once set the collector's peak RSS.
pub(super) fn btf_facts() -> Result<BtfFacts, LoadError> {
    let kbtf = kbtf::load_vmlinux()?;
    let fault_bits = (
        vm_fault_bits(
            &kbtf,
            &[
                "VM_FAULT_OOM",
                "VM_FAULT_SIGBUS",
                "VM_FAULT_SIGSEGV",
                "VM_FAULT_HWPOISON",
                "VM_FAULT_HWPOISON_LARGE",
                "VM_FAULT_FALLBACK",
                "VM_FAULT_RETRY",
            ],
        ),
        vm_fault_bits(&kbtf, &["VM_FAULT_MAJOR"]),
        kbtf::enum_value(&kbtf, "fault_flag", "FAULT_FLAG_TRIED").unwrap_or(0),
    );
    let tp_btf = hooks::all()
        .flat_map(|h| h.candidates)
        .filter(|c| c.kind == hooks::ProgramKind::TpBtf && kbtf::has_btf_tracepoint(&kbtf, c.target))
        .map(|c| c.target)
        .collect();
    let user_walk = kbtf::enum_value(&kbtf, "bpf_func_id", "BPF_FUNC_task_pt_regs").is_some();
    let pgfault = kbtf::enum_value(&kbtf, "vm_event_item", "PGFAULT");
    let thp_items = (
        kbtf::enum_value(&kbtf, "vm_event_item", "THP_FAULT_ALLOC"),
        kbtf::enum_value(&kbtf, "vm_event_item", "THP_FILE_ALLOC"),
    );
    let victim_task = kbtf::tracepoint_arg_is_pointer(&kbtf, "mark_victim", 0) == Some(true);
    let offsets = kbtf::kernel_offsets(&kbtf)?;
    Ok(BtfFacts { offsets, fault_bits, tp_btf, user_walk, pgfault, thp_items, victim_task })
}

/// OR of `vm_fault_reason` bits from kernel BTF (0 for names it lacks).
fn vm_fault_bits(btf: &kbtf::Btf, names: &[&str]) -> u32 {
    names.iter().filter_map(|n| kbtf::enum_value(btf, "vm_fault_reason", n)).fold(0, |a, b| a | b)
}

/// Hands memory freed after a large parse back to the system, so RSS shows
/// what the collector holds.
pub(super) fn release_freed_memory() {
    // SAFETY: no preconditions; glibc only.
    unsafe { libc::malloc_trim(0) };
}
