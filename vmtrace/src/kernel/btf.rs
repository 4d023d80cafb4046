//! Kernel struct field offsets from the running kernel's BTF, handed to the
//! eBPF programs as the read-only global `KOFFSETS` (no CO-RE in aya-ebpf 0.2),
//! and the few other facts the loader asks of it.
//!
//! A reader of its own rather than a BTF library: the loader asks ~40
//! questions of 100k+ types, and a full parse (btf-rs) took ~190 ms of the
//! start-up here and held tens of MiB; this one indexes the raw bytes (the
//! file, ~6 MiB, plus 12 bytes a type) in ~10 ms and answers by name.
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

// BTF kinds (include/uapi/linux/btf.h) this reader looks at or must skip over.
const INT: u32 = 1;
const PTR: u32 = 2;
const ARRAY: u32 = 3;
const STRUCT: u32 = 4;
const UNION: u32 = 5;
const ENUM: u32 = 6;
const TYPEDEF: u32 = 8;
const VOLATILE: u32 = 9;
const CONST: u32 = 10;
const FUNC_PROTO: u32 = 13;
const VAR: u32 = 14;
const DATASEC: u32 = 15;
const DECL_TAG: u32 = 17;
const TYPE_TAG: u32 = 18;
const ENUM64: u32 = 19;

/// One type's header, where its kind-specific data starts, and its name.
#[derive(Clone, Copy)]
struct TypeRef {
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    name_off: u32,
    /// `type` of a typedef or modifier (the third word of the header).
    size_or_type: u32,
    /// Byte offset of the data after the 12-byte header.
    data: usize,
}

/// The kernel's BTF as bytes, with the start of every type indexed.
pub struct Btf {
    data: Vec<u8>,
    strings: std::ops::Range<usize>,
    /// Type id `i` is `types[i - 1]` (id 0 is void).
    types: Vec<TypeRef>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let bad = |what: &str| BtfError::Read(format!("malformed BTF: {what}"));
        let magic = data.get(0..2).map(|m| u16::from_le_bytes([m[0], m[1]]));
        if magic != Some(0xeb9f) {
            return Err(bad("bad magic (not little-endian BTF)"));
        }
        let word = |at| u32_at(&data, at).map(|v| v as usize).ok_or_else(|| bad("short header"));
        let (hdr_len, type_off, type_len, str_off, str_len) = (word(4)?, word(8)?, word(12)?, word(16)?, word(20)?);
        let types_at = hdr_len + type_off..hdr_len + type_off + type_len;
        let strings = hdr_len + str_off..hdr_len + str_off + str_len;
        if types_at.end > data.len() || strings.end > data.len() {
            return Err(bad("sections past the end"));
        }
        let mut types = Vec::with_capacity(type_len / 24);
        let mut at = types_at.start;
        while at < types_at.end {
            let (Some(name_off), Some(info), Some(size_or_type)) =
                (u32_at(&data, at), u32_at(&data, at + 4), u32_at(&data, at + 8))
            else {
                return Err(bad("truncated type"));
            };
            let (kind, vlen) = ((info >> 24) & 0x1f, info & 0xffff);
            let extra = match kind {
                INT | VAR | DECL_TAG => 4,
                ARRAY => 12,
                STRUCT | UNION | DATASEC | ENUM64 => 12 * vlen as usize,
                ENUM | FUNC_PROTO => 8 * vlen as usize,
                _ => 0,
            };
            types.push(TypeRef { kind, vlen, kind_flag: info >> 31 == 1, name_off, size_or_type, data: at + 12 });
            at += 12 + extra;
        }
        Ok(Self { data, strings, types })
    }

    fn name(&self, off: u32) -> &[u8] {
        let start = self.strings.start + off as usize;
        let s = self.data.get(start..self.strings.end).unwrap_or_default();
        &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
    }

    fn by_id(&self, id: u32) -> Option<&TypeRef> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    /// Every type named `name`.
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a TypeRef> + 'a {
        self.types.iter().filter(move |t| t.name_off != 0 && self.name(t.name_off) == name.as_bytes())
    }

    /// (name offset, type id, bit offset) of each member of a struct or union.
    fn members(&self, t: &TypeRef) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        let (data, flag) = (t.data, t.kind_flag);
        (0..t.vlen as usize).filter_map(move |i| {
            let at = data + 12 * i;
            let off = u32_at(&self.data, at + 8)?;
            // With kind_flag set, the top 8 bits are a bitfield's size.
            let bits = if flag { off & 0x00ff_ffff } else { off };
            Some((u32_at(&self.data, at)?, u32_at(&self.data, at + 4)?, bits))
        })
    }

    /// The struct or union a member's type is, through typedefs and modifiers.
    fn resolve_composite(&self, mut id: u32) -> Option<&TypeRef> {
        for _ in 0..8 {
            let t = self.by_id(id)?;
            match t.kind {
                STRUCT | UNION => return Some(t),
                TYPEDEF | VOLATILE | CONST | TYPE_TAG => id = t.size_or_type,
                _ => return None,
            }
        }
        None
    }
}

/// Size in bytes of `struct name`, if this kernel has it.
pub fn struct_size(btf: &Btf, name: &str) -> Option<u32> {
    btf.named(name).find(|t| t.kind == STRUCT && t.vlen > 0).map(|t| t.size_or_type)
}

/// Byte offset of `field` in `struct name`, looking through anonymous members.
pub fn field_offset(btf: &Btf, name: &str, field: &str) -> Result<Option<u32>, BtfError> {
    let st = btf.named(name).find(|t| t.kind == STRUCT && t.vlen > 0).ok_or_else(|| BtfError::NoStruct(name.into()))?;
    Ok(find_member(btf, st, field, 0, 0))
}

fn find_member(btf: &Btf, st: &TypeRef, field: &str, base_bits: u32, depth: u32) -> Option<u32> {
    find_member_typed(btf, st, field, base_bits, depth).map(|(off, _)| off)
}

/// (byte offset, type id) of `field`.
fn find_member_typed(btf: &Btf, st: &TypeRef, field: &str, base_bits: u32, depth: u32) -> Option<(u32, u32)> {
    for (name_off, ty, bit_off) in btf.members(st) {
        let name = if name_off == 0 { &[][..] } else { btf.name(name_off) };
        let bits = base_bits + bit_off;
        if name == field.as_bytes() {
            return Some((bits / 8, ty));
        }
        if name.is_empty() && depth < 4 {
            // Anonymous struct/union: its members sit at this member's offset.
            if let Some(inner) = btf.resolve_composite(ty) {
                if let Some(found) = find_member_typed(btf, inner, field, bits, depth + 1) {
                    return Some(found);
                }
            }
        }
    }
    None
}

/// Byte offset of `a.b.c…` in `struct name`, through members whose types
/// are structs (or typedefs of anonymous ones, as `mm_context_t`).
pub fn path_offset(btf: &Btf, name: &str, path: &[&str]) -> Result<Option<u32>, BtfError> {
    let mut st =
        btf.named(name).find(|t| t.kind == STRUCT && t.vlen > 0).ok_or_else(|| BtfError::NoStruct(name.into()))?;
    let mut total = 0;
    for (i, field) in path.iter().enumerate() {
        let Some((off, ty)) = find_member_typed(btf, st, field, 0, 0) else { return Ok(None) };
        total += off;
        if i + 1 < path.len() {
            match btf.resolve_composite(ty) {
                Some(inner) => st = inner,
                None => return Ok(None),
            }
        }
    }
    Ok(Some(total))
}

/// Read from the file in one go and indexed ([`Btf`]); the bytes are freed
/// when the loader drops it, before aya parses its own copy.
pub fn load_vmlinux() -> Result<Btf, BtfError> {
    let data = std::fs::read(VMLINUX_BTF).map_err(|e| BtfError::Read(e.to_string()))?;
    Btf::parse(data)
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
        // The exit hook's walk of the thread list verifies on 6.18; 6.1's
        // verifier gives up on it (E2BIG, `cargo xtask vmtest`): left out
        // (MISSING, the walk is dead code to the verifier) before 6.18.
        signal_thread_head: if walk_threads() { o("signal_struct", "thread_head")? } else { KernelOffsets::MISSING },
        task_thread_node: if walk_threads() { o("task_struct", "thread_node")? } else { KernelOffsets::MISSING },
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
        task_fsbase: match (
            field_offset(btf, "task_struct", "thread")?,
            field_offset(btf, "thread_struct", "fsbase").ok().flatten(),
        ) {
            (Some(t), Some(f)) => t + f,
            _ => KernelOffsets::MISSING,
        },
        task_mm: o("task_struct", "mm")?,
        // x86's per-mm id, from a counter never reused in a boot.
        mm_ctx_id: path_offset(btf, "mm_struct", &["context", "ctx_id"])?.unwrap_or(KernelOffsets::MISSING),
        mm_rss_stat: o("mm_struct", "rss_stat")?,
        mm_locked_vm: o("mm_struct", "locked_vm")?,
        mm_pinned_vm: o("mm_struct", "pinned_vm")?,
        signal_rlim: o("signal_struct", "rlim")?,
        task_pagefault_disabled: o("task_struct", "pagefault_disabled")?,
        mm_start_code: o("mm_struct", "start_code")?,
        mm_exe_file: o("mm_struct", "exe_file")?,
        mm_saved_auxv: o("mm_struct", "saved_auxv")?,
        mm_users: o("mm_struct", "mm_users")?,
        task_group_leader: o("task_struct", "group_leader")?,
        task_comm: o("task_struct", "comm")?,
        pcpu_count: o("percpu_counter", "count")?,
        // Before 6.2 `rss_stat` is a `struct mm_rss_stat` of atomics, and
        // the tracepoint carries the count (`TP_PROTO(mm, member, count)`).
        pcpu_size: if struct_size(btf, "mm_rss_stat").is_some() {
            KernelOffsets::MISSING
        } else {
            struct_size(btf, "percpu_counter").unwrap_or(KernelOffsets::MISSING)
        },
    })
}

/// Whether this kernel's verifier takes the exit hook's thread-list walk
/// (verified on 6.18; refused on 6.1).
fn walk_threads() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.trim().split(['.', '-']).map(|n| n.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 18)
}

/// Value of enumerator `name` in `enum ty` (e.g. a cgroup subsystem's index).
pub fn enum_value(btf: &Btf, ty: &str, name: &str) -> Option<u32> {
    btf.named(ty).filter(|t| t.kind == ENUM).find_map(|t| {
        (0..t.vlen as usize).find_map(|i| {
            let at = t.data + 8 * i;
            let n = u32_at(&btf.data, at)?;
            (btf.name(n) == name.as_bytes()).then(|| u32_at(&btf.data, at + 4)).flatten()
        })
    })
}

/// Whether BTF names `btf_trace_<tp>`, the typedef every tp_btf target has.
pub fn has_btf_tracepoint(btf: &Btf, tp: &str) -> bool {
    btf.named(&format!("btf_trace_{tp}")).next().is_some()
}

/// Whether argument `i` of tracepoint `tp` (after the hidden `void *__data`)
/// is a pointer, from the prototype `btf_trace_<tp>` names; `None` where BTF
/// does not say. (`mark_victim` passes the victim's `task_struct *` since 6.8,
/// its pid before.)
pub fn tracepoint_arg_is_pointer(btf: &Btf, tp: &str, i: usize) -> Option<bool> {
    let name = format!("btf_trace_{tp}");
    let td = btf.named(&name).find(|t| t.kind == TYPEDEF)?;
    let proto = btf.by_id(td.size_or_type).filter(|t| t.kind == PTR)?;
    let proto = btf.by_id(proto.size_or_type).filter(|t| t.kind == FUNC_PROTO)?;
    if i + 1 >= proto.vlen as usize {
        return None;
    }
    // FUNC_PROTO params: (name_off, type) pairs.
    let mut t = btf.by_id(u32_at(&btf.data, proto.data + 8 * (i + 1) + 4)?)?;
    for _ in 0..8 {
        match t.kind {
            TYPEDEF | VOLATILE | CONST | TYPE_TAG => t = btf.by_id(t.size_or_type)?,
            kind => return Some(kind == PTR),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(b: &btf_rs::Btf, ms: &[btf_rs::Member], f: &str, base: u32, d: u32) -> Option<u32> {
        for m in ms {
            let n = b.resolve_name(m).unwrap_or_default();
            let bits = base + m.bit_offset();
            if n == f {
                return Some(bits / 8);
            }
            if n.is_empty() && d < 4 {
                if let Ok(btf_rs::Type::Struct(s) | btf_rs::Type::Union(s)) = b.resolve_chained_type(m) {
                    if let Some(o) = walk(b, &s.members, f, bits, d + 1) {
                        return Some(o);
                    }
                }
            }
        }
        None
    }

    /// The same answers as btf-rs, the library this reader replaced, on the
    /// running kernel's BTF (skipped where there is none).
    #[test]
    fn agrees_with_btf_rs_on_this_kernel() {
        let Ok(data) = std::fs::read(VMLINUX_BTF) else { return };
        let ours = Btf::parse(data).unwrap();
        let theirs = btf_rs::Btf::from_file(VMLINUX_BTF).unwrap();
        let their_offset = |s: &str, f: &str| -> Option<u32> {
            let st = theirs.resolve_types_by_name(s).ok()?.into_iter().find_map(|t| match t {
                btf_rs::Type::Struct(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })?;
            walk(&theirs, &st.members, f, 0, 0)
        };
        for (s, f) in [
            ("task_struct", "pid"),
            ("task_struct", "tgid"),
            ("task_struct", "signal"),
            ("task_struct", "cgroups"),
            ("task_struct", "maj_flt"),
            ("signal_struct", "live"),
            ("css_set", "subsys"),
            ("cgroup", "kn"),
            ("kernfs_node", "id"),
            ("oom_control", "chosen"),
            ("mem_cgroup", "css"),
            ("mm_struct", "mmap_base"),
            ("task_struct", "thread"),
            ("thread_struct", "fsbase"),
        ] {
            assert_eq!(field_offset(&ours, s, f).unwrap(), their_offset(s, f), "{s}.{f}");
        }
        let fsbase = their_offset("task_struct", "thread").zip(their_offset("thread_struct", "fsbase"));
        assert_eq!(Some(kernel_offsets(&ours).unwrap().task_fsbase), fsbase.map(|(t, f)| t + f), "thread.fsbase");
        assert!(field_offset(&ours, "task_struct", "no_such_field").unwrap().is_none());
        assert!(field_offset(&ours, "no_such_struct_vmtrace", "x").is_err());
        let their_enum = |t: &str, n: &str| {
            theirs.resolve_types_by_name(t).ok()?.into_iter().find_map(|ty| match ty {
                btf_rs::Type::Enum(e) => e
                    .members
                    .iter()
                    .find(|m| theirs.resolve_name(*m).is_ok_and(|x| x == n))
                    .map(btf_rs::EnumMember::val),
                _ => None,
            })
        };
        for (t, n) in [
            ("vm_fault_reason", "VM_FAULT_MAJOR"),
            ("vm_fault_reason", "VM_FAULT_RETRY"),
            ("fault_flag", "FAULT_FLAG_TRIED"),
            ("bpf_func_id", "BPF_FUNC_task_pt_regs"),
            ("vm_event_item", "PGFAULT"),
            ("cgroup_subsys_id", "memory_cgrp_id"),
        ] {
            assert_eq!(enum_value(&ours, t, n), their_enum(t, n), "{t}::{n}");
        }
        assert!(has_btf_tracepoint(&ours, "sched_switch"));
        assert!(!has_btf_tracepoint(&ours, "no_such_tracepoint_vmtrace"));
    }

    /// BTF of types (name offset, kind, vlen, size or type, extra words)
    /// and a string section.
    fn blob(types: &[(u32, u32, u32, u32, &[u32])], strings: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        for &(name, kind, vlen, size_or_type, extra) in types {
            for w in [name, (kind << 24) | vlen, size_or_type].iter().chain(extra) {
                t.extend_from_slice(&w.to_le_bytes());
            }
        }
        let mut b = vec![0x9f, 0xeb, 1, 0];
        for w in [24, 0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend(t);
        b.extend_from_slice(strings);
        b
    }

    /// `mark_victim`'s argument: the victim's task since 6.8, its pid before.
    #[test]
    fn tells_a_tracepoints_pointer_argument_from_an_integer() {
        let strings = b"\0int\0btf_trace_mark_victim\0task_struct\0";
        let (int, tp, task) = (1, 5, 27);
        // 1 int, 2 void *, 3 proto, 4 pointer to it, 5 the typedef, 6 struct task_struct (empty), 7 pointer to it.
        let with = |arg: u32| {
            Btf::parse(blob(
                &[
                    (int, INT, 0, 4, &[32]),
                    (0, PTR, 0, 0, &[]),
                    (0, FUNC_PROTO, 2, 0, &[0, 2, 0, arg]),
                    (0, PTR, 0, 3, &[]),
                    (tp, TYPEDEF, 0, 4, &[]),
                    (task, STRUCT, 0, 0, &[]),
                    (0, PTR, 0, 6, &[]),
                ],
                strings,
            ))
            .unwrap()
        };
        // Before 6.8: TP_PROTO(int pid).
        assert_eq!(tracepoint_arg_is_pointer(&with(1), "mark_victim", 0), Some(false));
        // 6.8: TP_PROTO(struct task_struct *task, uid_t uid) (its first argument here).
        assert_eq!(tracepoint_arg_is_pointer(&with(7), "mark_victim", 0), Some(true));
        assert_eq!(tracepoint_arg_is_pointer(&with(7), "mark_victim", 1), None);
        assert_eq!(tracepoint_arg_is_pointer(&with(7), "no_such", 0), None);
        // The running kernel's (skipped without BTF).
        if let Ok(data) = std::fs::read(VMLINUX_BTF) {
            let btf = Btf::parse(data).unwrap();
            let release = crate::kernel::preflight::kernel_release();
            if release.is_some_and(|v| v >= (6, 8)) {
                assert_eq!(tracepoint_arg_is_pointer(&btf, "mark_victim", 0), Some(true));
            }
            // sched_switch(bool preempt, struct task_struct *prev, ...).
            assert_eq!(tracepoint_arg_is_pointer(&btf, "sched_switch", 0), Some(false));
            assert_eq!(tracepoint_arg_is_pointer(&btf, "sched_switch", 1), Some(true));
        }
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(Btf::parse(b"not btf at all, not at all".to_vec()).is_err());
        assert!(Btf::parse(vec![0x9f, 0xeb, 1, 0]).is_err(), "a header cut short");
    }
}
