//! What userspace tells the programs and what they count as lost: the control word, the configuration, kernel offsets read from BTF, drop kinds.

/// `CONTROL[0]` before the window: processes added to the traced set are
/// counted, `-a` counts nothing yet.
pub const CONTROL_READY: u32 = 0;
/// `CONTROL[0]` inside the window: `-a` counts every process.
pub const CONTROL_RUNNING: u32 = 1;
/// `CONTROL[0]` after it: nothing is counted, so the aggregates and the
/// kernel's own counters, read after, cover the same moment.
pub const CONTROL_STOPPED: u32 = 2;
/// `CONTROL[CONTROL_LAUNCHER]`: while nonzero, the tgid (vmtrace's own)
/// whose forks are followed, as a traced process's are: a started command
/// is counted from its fork (its first faults, before it reaches the gate
/// where it waits to exec, included), not from the moment userspace added
/// its pid. 0: none.
pub const CONTROL_LAUNCHER: u32 = 1;
/// `CONTROL[CONTROL_WOKEN]`: 1 once a program has forced a wakeup of the
/// collector since userspace last cleared it, which it does just before
/// each drain of the event ring. Task and file-mapping events force one
/// only while it is 0: a forced wakeup is an interrupt and the collector's
/// wakeup, ~10 µs of the program's run on a busy machine (2026-12-07,
/// cost32), and a second one before the drain wakes nobody.
pub const CONTROL_WOKEN: u32 = 2;
/// Entries of `CONTROL`.
pub const CONTROL_ENTRIES: u32 = 3;

/// Why something was dropped; index into the per-CPU `DROPS` array.
/// `FaultStatsFull`, `TracedFull` and `MmStatsFull` are also an entry the
/// kernel could not allocate: `FAULT_STATS` and `MM_STATS` are not
/// preallocated (vmtrace/src/loader/sizes.rs); which it was is counted by
/// error after the drop kinds (`insert_error_slot`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropKind {
    /// The task-event ring buffer was full.
    TaskEventRingFull = 0,
    /// `FAULT_STATS` was full: a process's faults were not counted.
    FaultStatsFull = 1,
    /// `FAULT_STATS` (the traced set) was full: a new child could not be followed.
    TracedFull = 2,
    /// A fault ended with no recorded start (start hook missed it): counted, not timed.
    FaultUntimed = 3,
    /// The ring buffer was full when an OOM kill was reported.
    OomRingFull = 4,
    /// A stack could not be stored (`STACKS` full or a collision): counted without it.
    StackLost = 5,
    /// `FAULT_STACKS` was full: a sampled stack was not counted.
    StackCountsFull = 6,
    /// `MM_STATS` refused a process's entry (full, or not allocated: the
    /// error is counted, `insert_error_slot`) and so did the preallocated
    /// `MM_SPILL`: its mmap/TLB counts are missing.
    MmStatsFull = 7,
    /// The ring buffer was full when a mapping change was reported.
    MmEventRingFull = 8,
    /// Retired, never counted: syscalls in flight are in a per-CPU slot, parked
    /// in an LRU map when their thread sleeps. The number is not reused.
    RetiredMmInflightFull = 9,
    /// `REGION_STATS` was full: a fault was counted, but not per region.
    RegionStatsFull = 10,
    /// `FILE_CHUNKS` was full: a page-cache addition counted for its file, not
    /// for the part of the file it was.
    FileChunksFull = 11,
    /// The stack-sample ring buffer was full: a user stack kept only its
    /// frame-pointer walk (not unwound through code without frame pointers).
    StackSampleRingFull = 12,
    /// The ring buffer was full when a major fault was to be streamed: it is
    /// counted, but has no slice in the Perfetto trace.
    FaultMajorRingFull = 13,
    /// `RSS_MM` was full: an address space's resident counters are missing.
    RssMmFull = 14,
    /// The ring buffer was full when a resident peak or end was reported:
    /// that snapshot of the sampled pages is missing (the totals are not).
    RssRingFull = 15,
    /// The ring buffer was full when a sampled page was to be streamed: it
    /// owns nothing in the resident profiles (the totals are exact anyway).
    PageSampleRingFull = 16,
    /// The ring buffer was full when a new granule key was reported: the
    /// loader walks the granule maps once to find the keys again. Nothing
    /// is lost.
    GranuleKeyRingFull = 17,
    /// `MM_STACKS` was full: a memory-map call was counted for its process
    /// (`MM_STATS`) but not for its call site (`mmap.folded` falls short).
    MmStacksFull = 18,
    /// A fault on a page of the resident sample had no copy of its own user
    /// stack (one the thinning would have left out): the samples ring had
    /// the quarter waiting that wakes the collector, or was full. The page
    /// is named by its frame-pointer id's unwound stacks, like a page whose
    /// walk was whole; the weighted copies keep the rest of the ring.
    PageCopySkipped = 19,
}
pub const DROP_KINDS: u32 = 20;

/// Maps whose failed inserts are also counted by the kernel's error code,
/// in `DROPS` after the drop kinds (`insert_error_slot`): a drop kind says
/// what was lost, this says why the kernel refused (a full map is `E2BIG`;
/// a not-preallocated map whose element or per-CPU value could not be
/// allocated without sleeping is `ENOMEM`; a bucket lock taken on this CPU
/// already, `EBUSY` before 6.15, `EDEADLK`/`ETIMEDOUT` after).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertMap {
    MmStats = 0,
    FaultStats = 1,
    UserStacks = 2,
}
pub const INSERT_MAP_NAMES: [&str; 3] = ["MM_STATS", "FAULT_STATS", "USER_STACKS"];
/// The error codes told apart (positive errno values); any other is counted
/// in the last slot.
pub const INSERT_ERRNOS: [(i32, &str); 5] =
    [(12, "ENOMEM"), (7, "E2BIG"), (16, "EBUSY"), (35, "EDEADLK"), (110, "ETIMEDOUT")];
/// Slots per map: the errors above and one for any other.
pub const INSERT_ERROR_SLOTS: u32 = INSERT_ERRNOS.len() as u32 + 1;
/// Entries of `DROPS`: the drop kinds, then each map's error slots.
pub const DROPS_ENTRIES: u32 = DROP_KINDS + INSERT_MAP_NAMES.len() as u32 * INSERT_ERROR_SLOTS;

/// `DROPS` index counting an insert into `map` refused with `ret` (the
/// helper's negative return).
#[inline(always)]
pub fn insert_error_slot(map: InsertMap, ret: i32) -> u32 {
    let errno = ret.wrapping_neg();
    let class = match errno {
        12 => 0,
        7 => 1,
        16 => 2,
        35 => 3,
        110 => 4,
        _ => 5,
    };
    DROP_KINDS + map as u32 * INSERT_ERROR_SLOTS + class
}

/// Kernel struct field offsets read from BTF at load time, passed as a read-only
/// global (`KOFFSETS`). `u32::MAX` marks a field this kernel lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    pub task_signal: u32,
    pub task_min_flt: u32,
    pub task_maj_flt: u32,
    pub signal_live: u32,
    pub signal_min_flt: u32,
    pub signal_maj_flt: u32,
    /// `signal_struct.thread_head` and `task_struct.thread_node`: the list
    /// of a group's live threads, whose own counts are not yet in
    /// `signal->min_flt` (`getrusage(RUSAGE_SELF)` sums them the same way).
    pub signal_thread_head: u32,
    pub task_thread_node: u32,
    /// `task_struct.cgroups` (struct css_set *).
    pub task_cgroups: u32,
    /// `css_set.subsys[memory_cgrp_id]`: offset of the memory controller's css pointer.
    pub css_set_memory: u32,
    /// `cgroup_subsys_state.cgroup`.
    pub css_cgroup: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`.
    pub kernfs_id: u32,
    /// `oom_control.memcg`, `.constraint`, `.chosen`: the OOM domain at
    /// `oom_kill_process()`.
    pub oom_memcg: u32,
    pub oom_constraint: u32,
    pub oom_chosen: u32,
    /// `mem_cgroup.css`.
    pub memcg_css: u32,
    /// The file behind an fd: `task_struct.files`, `files_struct.fdt`,
    /// `fdtable.fd` and `.max_fds`, `file.f_inode`, `inode.i_ino` and
    /// `.i_sb`, `super_block.s_dev` (names a mapped file whose fd is closed
    /// or reused by the time userspace looks).
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `task_struct.thread.fsbase` (x86-64): the user FS base, which glibc
    /// sets to the thread's `pthread_t` (CPython 3.10's thread states name
    /// their thread by it).
    pub task_fsbase: u32,
    /// Resident counters, read by the `rss_stat` tp_btf program:
    /// `task_struct.mm`, `mm_struct.rss_stat` (an array of `struct
    /// percpu_counter` since 6.2), and in a `percpu_counter` its `count`
    /// and its size (the array's stride). `pcpu_size` is `MISSING` where
    /// `rss_stat` is the older `struct mm_rss_stat` (6.1): the tracepoint
    /// then passes the count itself as its third argument.
    pub task_mm: u32,
    /// `mm_struct.context.ctx_id` (x86-64): an id per address space, from a
    /// counter never reused in a boot; the resident counters' key.
    pub mm_ctx_id: u32,
    pub mm_rss_stat: u32,
    pub pcpu_count: u32,
    pub pcpu_size: u32,
    /// `mm_struct.locked_vm` (unsigned long) and `.pinned_vm` (atomic64_t):
    /// pages locked (mlock, `MAP_LOCKED`, mlockall) and pinned long-term
    /// (RDMA, io_uring, vfio), read at each mlock-family call's return.
    pub mm_locked_vm: u32,
    pub mm_pinned_vm: u32,
    /// `signal_struct.rlim` (`struct rlimit[RLIM_NLIMITS]`): a failed
    /// locking call's `RLIMIT_MEMLOCK`, read as it returns.
    pub signal_rlim: u32,
    /// `task_struct.pagefault_disabled`: nonzero while the task runs with
    /// page faults disabled (a nofault user read, an atomic copy), where a
    /// kernel-mode fault is fixed up, never handled or accounted.
    pub task_pagefault_disabled: u32,
    /// `mm_struct.start_code`, `.exe_file` and `.saved_auxv`: the program
    /// image an exec mapped (`TaskEvent::start_code`).
    pub mm_start_code: u32,
    pub mm_exe_file: u32,
    pub mm_saved_auxv: u32,
    /// `mm_struct.mm_users` (atomic_t): 0 once the address space is being
    /// torn down, whichever task drops the last reference (the owner at its
    /// exit, or another process that held it: a /proc reader, a CLONE_VM
    /// sibling).
    pub mm_users: u32,
    /// `task_struct.group_leader` and `.comm`: the process's own name at
    /// its group's exit, the leader's (what `/proc/PID/comm` shows, a
    /// `prctl(PR_SET_NAME)` included) when another thread leaves last.
    pub task_group_leader: u32,
    pub task_comm: u32,
}
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 176);

impl KernelOffsets {
    pub const MISSING: u32 = u32::MAX;
    pub const UNKNOWN: Self = Self {
        task_pid: Self::MISSING,
        task_tgid: Self::MISSING,
        task_exit_code: Self::MISSING,
        task_signal: Self::MISSING,
        task_min_flt: Self::MISSING,
        task_maj_flt: Self::MISSING,
        signal_live: Self::MISSING,
        signal_min_flt: Self::MISSING,
        signal_maj_flt: Self::MISSING,
        signal_thread_head: Self::MISSING,
        task_thread_node: Self::MISSING,
        task_cgroups: Self::MISSING,
        css_set_memory: Self::MISSING,
        css_cgroup: Self::MISSING,
        cgroup_kn: Self::MISSING,
        kernfs_id: Self::MISSING,
        oom_memcg: Self::MISSING,
        oom_constraint: Self::MISSING,
        oom_chosen: Self::MISSING,
        memcg_css: Self::MISSING,
        task_files: Self::MISSING,
        files_fdt: Self::MISSING,
        fdtable_fd: Self::MISSING,
        fdtable_max_fds: Self::MISSING,
        file_inode: Self::MISSING,
        inode_ino: Self::MISSING,
        inode_sb: Self::MISSING,
        sb_dev: Self::MISSING,
        task_fsbase: Self::MISSING,
        task_mm: Self::MISSING,
        mm_ctx_id: Self::MISSING,
        mm_rss_stat: Self::MISSING,
        pcpu_count: Self::MISSING,
        pcpu_size: Self::MISSING,
        mm_locked_vm: Self::MISSING,
        mm_pinned_vm: Self::MISSING,
        signal_rlim: Self::MISSING,
        task_pagefault_disabled: Self::MISSING,
        mm_start_code: Self::MISSING,
        mm_exe_file: Self::MISSING,
        mm_saved_auxv: Self::MISSING,
        mm_users: Self::MISSING,
        task_group_leader: Self::MISSING,
        task_comm: Self::MISSING,
    };
}

/// Run-time settings, a read-only global (`CONFIG`) set by the loader.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// 1: trace every process (`-a`); 0: only tgids with a `FAULT_STATS` entry.
    pub trace_all: u32,
    /// Period of the minor-fault end hook (1 = every minor fault timed).
    pub minor_period: u32,
    /// `STACK_USER | STACK_KERNEL` bits; 0 = no stacks.
    pub stack_mode: u32,
    /// Take a stack on 1 in N faults (per CPU).
    pub stack_period: u32,
    /// 1: key stacks by address block too (`--leaf region`, `LEAF_BLOCK_SHIFT`).
    pub leaf_region: u32,
    /// `MM_*` bits: mmap-family/TLB tracing on, IPI counting fallback.
    pub mm: u32,
    /// Address of the kernel's `flush_tlb_func`: IPIs with this callback are TLB shootdowns.
    pub flush_tlb_func: u64,
    /// 1: count faults per region granule (`REGION_GRANULE_SHIFT`) for region attribution.
    pub regions: u32,
    /// For the fexit end hook on `handle_mm_fault`, from kernel BTF: the
    /// `vm_fault_t` bits of faults the kernel does not account (VM_FAULT_ERROR
    /// | VM_FAULT_RETRY), VM_FAULT_MAJOR, and FAULT_FLAG_TRIED (a retried fault
    /// counts as major), as `mm_account_fault()` decides.
    pub vm_fault_unaccounted: u32,
    pub vm_fault_major: u32,
    pub fault_flag_tried: u32,
    /// How user stacks are taken: 0 = `bpf_get_stackid` into `STACKS`; else
    /// walked by the programs themselves into `USER_STACKS` (needs
    /// `bpf_task_pt_regs`, 5.15+), `USER_WALK_FRAMES` or `USER_WALK_WINDOWS`.
    pub user_walk: u32,
    /// `PGFAULT`'s value in the kernel's `enum vm_event_item`, plus one; 0 when
    /// the fault end is not `memcg:count_memcg_events` (see the fault probes).
    pub memcg_pgfault: u32,
    /// Bytes of user stack copied with the registers where a frame-pointer
    /// walk did not end cleanly (`StackSample`), one of `STACK_WINDOWS`; 0 = none.
    pub stack_window: u32,
    /// 1: every major fault is streamed (`EventKind::FaultMajor`) for the
    /// Perfetto trace; 0: majors are only counted.
    pub stream_majors: u32,
    /// With the memcg end: every slow fault (slept, huge, major) is timed
    /// exactly and 1 in `fast_period` of the fast minor faults (per CPU,
    /// random stride), weighted by the faults it stands for; 0 or 1 = every
    /// fault timed.
    pub fast_period: u32,
    /// `THP_FAULT_ALLOC` and `THP_FILE_ALLOC` in `enum vm_event_item`, plus
    /// one (0: not known): the memcg end marks the fault in flight huge on
    /// them, in place of the `mm_page_alloc` hook.
    pub memcg_thp_fault: u32,
    pub memcg_thp_file: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Config>() == 80);
