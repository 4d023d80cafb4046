//! Kernel struct field offsets from the running kernel's BTF, handed to the
//! eBPF programs as the read-only global `KOFFSETS` (no CO-RE in aya-ebpf 0.2).
use btf_rs::{Btf, Type};
use vmtrace_common::KernelOffsets;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error(
        "cannot read kernel BTF at {VMLINUX_BTF}: {0}\nhint: vmtrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    Read(String),
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
}

/// Byte offset of `field` in `struct name`, looking through anonymous members.
pub fn field_offset(btf: &Btf, name: &str, field: &str) -> Result<Option<u32>, BtfError> {
    let types = btf.resolve_types_by_name(name).map_err(|_| BtfError::NoStruct(name.into()))?;
    let st = types
        .into_iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
        .ok_or_else(|| BtfError::NoStruct(name.into()))?;
    Ok(find_member(btf, &st.members, field, 0, 0))
}

fn find_member(btf: &Btf, members: &[btf_rs::Member], field: &str, base_bits: u32, depth: u32) -> Option<u32> {
    for m in members {
        let name = btf.resolve_name(m).unwrap_or_default();
        let bits = base_bits + m.bit_offset();
        if name == field {
            return Some(bits / 8);
        }
        if name.is_empty() && depth < 4 {
            // Anonymous struct/union: its members sit at this member's offset.
            let inner = btf.resolve_chained_type(m).ok()?;
            if let Type::Struct(s) | Type::Union(s) = inner {
                if let Some(off) = find_member(btf, &s.members, field, bits, depth + 1) {
                    return Some(off);
                }
            }
        }
    }
    None
}

/// Parsed from the file, not from memory, although btf-rs then asks its
/// `BufReader<File>` for its position once per type: parsing from bytes holds
/// them beside the parse, and peak RSS counts more than start-up time
/// (docs/performance.md).
pub fn load_vmlinux() -> Result<Btf, BtfError> {
    Btf::from_file(VMLINUX_BTF).map_err(|e| BtfError::Read(e.to_string()))
}

/// Offsets of every field the task probes read; a field this kernel lacks is `MISSING`.
pub fn kernel_offsets(btf: &Btf) -> Result<KernelOffsets, BtfError> {
    let o =
        |s: &str, f: &str| -> Result<u32, BtfError> { Ok(field_offset(btf, s, f)?.unwrap_or(KernelOffsets::MISSING)) };
    Ok(KernelOffsets {
        task_pid: o("task_struct", "pid")?,
        task_tgid: o("task_struct", "tgid")?,
        task_exit_code: o("task_struct", "exit_code")?,
        task_signal: o("task_struct", "signal")?,
        task_min_flt: o("task_struct", "min_flt")?,
        task_maj_flt: o("task_struct", "maj_flt")?,
        signal_live: o("signal_struct", "live")?,
        signal_min_flt: o("signal_struct", "min_flt")?,
        signal_maj_flt: o("signal_struct", "maj_flt")?,
        task_cgroups: o("task_struct", "cgroups")?,
        css_set_memory: match (
            field_offset(btf, "css_set", "subsys")?,
            enum_value(btf, "cgroup_subsys_id", "memory_cgrp_id"),
        ) {
            (Some(off), Some(idx)) => off + idx * 8,
            _ => KernelOffsets::MISSING,
        },
        css_cgroup: o("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: o("cgroup", "kn")?,
        kernfs_id: o("kernfs_node", "id")?,
        oom_memcg: o("oom_control", "memcg")?,
        oom_constraint: o("oom_control", "constraint")?,
        oom_chosen: o("oom_control", "chosen")?,
        memcg_css: o("mem_cgroup", "css")?,
        task_files: o("task_struct", "files")?,
        files_fdt: o("files_struct", "fdt")?,
        fdtable_fd: o("fdtable", "fd")?,
        fdtable_max_fds: o("fdtable", "max_fds")?,
        file_inode: o("file", "f_inode")?,
        inode_ino: o("inode", "i_ino")?,
        inode_sb: o("inode", "i_sb")?,
        sb_dev: o("super_block", "s_dev")?,
    })
}

/// Value of enumerator `name` in `enum ty` (e.g. a cgroup subsystem's index).
pub fn enum_value(btf: &Btf, ty: &str, name: &str) -> Option<u32> {
    btf.resolve_types_by_name(ty).ok()?.into_iter().find_map(|t| match t {
        Type::Enum(e) => {
            e.members.iter().find(|m| btf.resolve_name(*m).is_ok_and(|n| n == name)).map(btf_rs::EnumMember::val)
        }
        _ => None,
    })
}

/// Whether BTF names `btf_trace_<tp>`, the typedef every tp_btf target has.
pub fn has_btf_tracepoint(btf: &Btf, tp: &str) -> bool {
    btf.resolve_ids_by_name(&format!("btf_trace_{tp}")).is_ok_and(|ids| !ids.is_empty())
}
