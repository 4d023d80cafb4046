//! The fields of classic tracepoint records that the kernel programs read:
//! one table, `TP_FIELDS`, which both sides use. Record layouts differ
//! between kernels (`sched_process_fork`'s comms are `char[16]` on 6.1 and
//! `__data_loc` strings on 6.18, moving `child_pid`; `oom:mark_victim` has
//! only `pid` before 6.8), so every field is one of two kinds:
//!
//! - `Fixed`: read at the row's offset, a constant load (the hot paths: a
//!   helper call per field would cost on every fault). The loader compares
//!   the offset and size with the running kernel's format file when it
//!   attaches the program, and refuses the program on a mismatch.
//! - `Loaded`: read at the offset the loader found in the format file
//!   (`TpOffsets`, a read-only global), through `bpf_probe_read_kernel`.
//!   Offset 0 (`TpOffsets::MISSING`) says that the kernel's record lacks the
//!   field (or has it in another size): the program leaves the value 0, and
//!   userspace reports it unknown.
//!
//! A new field read is one row here, and the read in the program
//! (`tp_fixed!` or `tp_loaded!` in vmtrace-ebpf's `shared.rs`).

/// How a program reads a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpRead {
    Fixed,
    Loaded,
}

/// One field of a classic tracepoint's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpField {
    /// "category:name"; a trailing `*` stands for every name it begins
    /// (the syscall tracepoints, served by one program each way).
    pub tracepoint: &'static str,
    /// The field's name in the format file. `ARGS` is every field of a
    /// `sys_enter_*` record after `__syscall_nr`: argument i at `offset + 8i`.
    pub field: &'static str,
    /// Where the programs were written to read it (6.18's layout): `Fixed`
    /// reads there; a `Loaded` one where the format file says.
    pub offset: u16,
    /// Its size in bytes, which the format file must match.
    pub size: u8,
    pub read: TpRead,
}

impl TpField {
    /// The pseudo-field of a syscall's arguments.
    pub const ARGS: &'static str = "$args";

    /// Whether this row is about `category:name`.
    pub fn is_of(&self, category: &str, name: &str) -> bool {
        let Some((c, n)) = self.tracepoint.split_once(':') else { return false };
        c == category
            && match n.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => n == name,
            }
    }
}

macro_rules! tp_fields {
    ($($(#[$doc:meta])* $name:ident: $read:ident $tracepoint:literal $field:literal @ $offset:literal : $size:literal;)+) => {
        /// A row of `TP_FIELDS`, by name (its index there and in `TpOffsets`).
        #[repr(usize)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Tp {
            $($(#[$doc])* $name,)+
        }

        /// Every classic tracepoint field the programs read.
        pub const TP_FIELDS: [TpField; TP_FIELD_COUNT] = [
            $(TpField { tracepoint: $tracepoint, field: $field, offset: $offset, size: $size, read: TpRead::$read },)+
        ];

    };
}

/// Rows of `TP_FIELDS`.
pub const TP_FIELD_COUNT: usize = 37;

tp_fields! {
    // Syscalls (the mmap family): the same layout on every kernel.
    SysEnterNr: Fixed "syscalls:sys_enter_*" "__syscall_nr" @ 8 : 4;
    SysEnterArgs: Fixed "syscalls:sys_enter_*" "$args" @ 16 : 8;
    SysExitRet: Fixed "syscalls:sys_exit_*" "ret" @ 16 : 8;
    // Fault start (x86), every fault: fixed.
    FaultUserAddress: Fixed "exceptions:page_fault_user" "address" @ 8 : 8;
    FaultUserErrorCode: Fixed "exceptions:page_fault_user" "error_code" @ 24 : 8;
    FaultKernelAddress: Fixed "exceptions:page_fault_kernel" "address" @ 8 : 8;
    FaultKernelErrorCode: Fixed "exceptions:page_fault_kernel" "error_code" @ 24 : 8;
    /// Fault end (6.14+), every fault.
    MemcgEventItem: Fixed "memcg:count_memcg_events" "item" @ 16 : 4;
    /// Every page allocation in the system.
    PageAllocOrder: Fixed "kmem:mm_page_alloc" "order" @ 16 : 4;
    PageAllocGfp: Fixed "kmem:mm_page_alloc" "gfp_flags" @ 24 : 8;
    RssMmId: Fixed "kmem:rss_stat" "mm_id" @ 8 : 4;
    RssCurr: Fixed "kmem:rss_stat" "curr" @ 12 : 4;
    RssMember: Fixed "kmem:rss_stat" "member" @ 16 : 4;
    RssSize: Fixed "kmem:rss_stat" "size" @ 24 : 8;
    TlbFlushReason: Fixed "tlb:tlb_flush" "reason" @ 8 : 4;
    TlbFlushPages: Fixed "tlb:tlb_flush" "pages" @ 16 : 8;
    CsdFunc: Fixed "csd:csd_queue_cpu" "func" @ 24 : 8;
    MigrateStartReason: Fixed "migrate:mm_migrate_pages_start" "reason" @ 12 : 4;
    MigrateSucceeded: Fixed "migrate:mm_migrate_pages" "succeeded" @ 8 : 8;
    MigrateFailed: Fixed "migrate:mm_migrate_pages" "failed" @ 16 : 8;
    MoveNumaTgid: Fixed "sched:sched_move_numa" "tgid" @ 12 : 4;
    SwapNumaSrcTgid: Fixed "sched:sched_swap_numa" "src_tgid" @ 12 : 4;
    SwapNumaDstTgid: Fixed "sched:sched_swap_numa" "dst_tgid" @ 32 : 4;
    AddToCacheIno: Fixed "filemap:mm_filemap_add_to_page_cache" "i_ino" @ 16 : 8;
    AddToCacheIndex: Fixed "filemap:mm_filemap_add_to_page_cache" "index" @ 24 : 8;
    AddToCacheDev: Fixed "filemap:mm_filemap_add_to_page_cache" "s_dev" @ 32 : 4;
    /// 6.6+; before it every folio added is read as one page.
    AddToCacheOrder: Loaded "filemap:mm_filemap_add_to_page_cache" "order" @ 36 : 1;
    /// `char[16]` comms before it up to 6.x (44), `__data_loc` ones later (20).
    ForkChildPid: Loaded "sched:sched_process_fork" "child_pid" @ 20 : 4;
    // oom:mark_victim: only `pid` before 6.8.
    OomPid: Loaded "oom:mark_victim" "pid" @ 8 : 4;
    OomComm: Loaded "oom:mark_victim" "comm" @ 12 : 4;
    OomTotalVm: Loaded "oom:mark_victim" "total_vm" @ 16 : 8;
    OomAnonRss: Loaded "oom:mark_victim" "anon_rss" @ 24 : 8;
    OomFileRss: Loaded "oom:mark_victim" "file_rss" @ 32 : 8;
    OomShmemRss: Loaded "oom:mark_victim" "shmem_rss" @ 40 : 8;
    OomUid: Loaded "oom:mark_victim" "uid" @ 48 : 4;
    OomPgtables: Loaded "oom:mark_victim" "pgtables" @ 56 : 8;
    OomScoreAdj: Loaded "oom:mark_victim" "oom_score_adj" @ 64 : 2;
}

impl Tp {
    pub const fn spec(self) -> TpField {
        TP_FIELDS[self as usize]
    }

    /// The offset of a `Fixed` field (a compile error, in a const, for a
    /// `Loaded` one).
    pub const fn fixed_offset(self) -> usize {
        let f = self.spec();
        assert!(matches!(f.read, TpRead::Fixed), "a Loaded field is read at the loader's offset");
        f.offset as usize
    }

    /// The size of the field (for the programs' compile-time check of the type they read).
    pub const fn size(self) -> usize {
        self.spec().size as usize
    }

    pub const fn is_loaded(self) -> bool {
        matches!(self.spec().read, TpRead::Loaded)
    }
}

/// The running kernel's offsets of the `TP_FIELDS`, by `Tp` (a read-only
/// global, `TP_OFFSETS`, set by the loader). `Fixed` rows hold their
/// table offset (the programs do not read them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpOffsets {
    pub offsets: [u16; TP_FIELD_COUNT],
}
const _: () = assert!(core::mem::size_of::<TpOffsets>() == 2 * TP_FIELD_COUNT);

impl TpOffsets {
    /// The record has no such field (0 is `common_type`'s offset, never a field read).
    pub const MISSING: u16 = 0;

    /// The table's own offsets (the 6.18 layout).
    pub const TABLE: Self = {
        let mut offsets = [0; TP_FIELD_COUNT];
        let mut i = 0;
        while i < TP_FIELD_COUNT {
            offsets[i] = TP_FIELDS[i].offset;
            i += 1;
        }
        Self { offsets }
    };

    pub const fn get(&self, f: Tp) -> u16 {
        self.offsets[f as usize]
    }

    pub const fn known(&self, f: Tp) -> bool {
        self.get(f) != Self::MISSING
    }
}
