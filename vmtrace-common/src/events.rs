//! The event ring: its header, and the task, major-fault, Python-stack and OOM events.

/// Event kinds in the stream. Ranges per family; a retired number is never reused.
/// 1..=99 tasks, 100..=199 faults, 200..=299 mmap, 300..=399 tlb, 400..=499 oom,
/// 500..=599 stacks, 600..=699 resident memory.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    TaskFork = 1,
    TaskExec = 2,
    TaskExit = 3,
    FaultMajor = 100,
    GranuleNew = 101,
    MmMapChange = 200,
    MmLock = 201,
    OomMarkVictim = 400,
    StackSample = 500,
    PyStackStored = 501,
    ResidentPeak = 600,
    ResidentEnd = 601,
    PageSample = 602,
}

impl EventKind {
    #[must_use]
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::TaskFork),
            2 => Some(Self::TaskExec),
            3 => Some(Self::TaskExit),
            100 => Some(Self::FaultMajor),
            101 => Some(Self::GranuleNew),
            200 => Some(Self::MmMapChange),
            201 => Some(Self::MmLock),
            400 => Some(Self::OomMarkVictim),
            500 => Some(Self::StackSample),
            501 => Some(Self::PyStackStored),
            600 => Some(Self::ResidentPeak),
            601 => Some(Self::ResidentEnd),
            602 => Some(Self::PageSample),
            _ => None,
        }
    }
}

/// Fixed header first in every streamed event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// An [`EventKind`].
    pub kind: u32,
    /// Size of the whole event in bytes, header included.
    pub size: u32,
    /// `bpf_ktime_get_ns()` when it happened (CLOCK_MONOTONIC).
    pub ts_ns: u64,
}
const _: () = assert!(core::mem::size_of::<EventHeader>() == 16);

pub const COMM_LEN: usize = 16;

/// A user stack with Python frames was stored under `id` in the user stack
/// map: userspace reads its code objects at once, while `tgid` lives (a
/// script that faults just before it exits left them unread).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStackEvent {
    pub hdr: EventHeader,
    pub id: u32,
    pub tgid: u32,
}
const _: () = assert!(core::mem::size_of::<PyStackEvent>() == 24);

/// Process life-cycle event (fork, exec, exit). Fields a kind does not use are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TaskEvent {
    pub hdr: EventHeader,
    /// Thread id of the task (fork: the child).
    pub pid: u32,
    /// Thread-group id of the task (fork: the child's).
    pub tgid: u32,
    /// Fork: the parent's tgid. Otherwise 0.
    pub ppid: u32,
    /// Exit: `task->exit_code` as wait(2) encodes it.
    pub exit_code: u32,
    /// Exit: 1 when this was the last thread of its group.
    pub group_dead: u32,
    /// Fork: the parent's address-space generation, which the child's
    /// generation 0 continues; exec: the generation of the new address space.
    pub gen: u32,
    /// Exit with `group_dead`: the group's fault counters as the kernel keeps them
    /// (`signal->{min,maj}_flt` + the last thread's), the getrusage ground truth.
    pub kernel_min_flt: u64,
    pub kernel_maj_flt: u64,
    /// Exec: the new program's image as the kernel mapped it, which no mmap
    /// event shows: the program file's inode and device (`mm->exe_file`),
    /// `mm->start_code` (its lowest executable segment's address, load
    /// bias included) and the dynamic loader's load address (`AT_BASE` of
    /// the auxiliary vector; 0 for a static program). Userspace lays out
    /// both files' segments from them (`procmaps::exec_image`), so a
    /// process that exits before its maps are read still has its program
    /// and loader named. 0 where unknown.
    pub exe_ino: u64,
    pub start_code: u64,
    pub at_base: u64,
    pub exe_dev: u32,
    pub _pad: u32,
    /// The running task's name; at a group's exit (`group_dead`) the
    /// process's: its leader's, whichever thread left last (all zeros when
    /// the leader's could not be read).
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(core::mem::size_of::<TaskEvent>() == 16 + 24 + 16 + 32 + 16);

impl TaskEvent {
    /// Every field zero: the start of an event that sets only what its kind
    /// uses (`TaskEvent { pid, tgid, ..TaskEvent::EMPTY }`), so a new field
    /// is one edit here, not one in each place that builds an event.
    pub const EMPTY: Self = Self {
        hdr: EventHeader { kind: 0, size: 0, ts_ns: 0 },
        pid: 0,
        tgid: 0,
        ppid: 0,
        exit_code: 0,
        group_dead: 0,
        gen: 0,
        kernel_min_flt: 0,
        kernel_maj_flt: 0,
        exe_ino: 0,
        start_code: 0,
        at_base: 0,
        exe_dev: 0,
        _pad: 0,
        comm: [0; COMM_LEN],
    };
}

/// A major fault, streamed when `Config::stream_majors` is set: majors are
/// rare (each waits for I/O), so one record each is cheap. `hdr.ts_ns` is
/// when the fault entered the handler.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FaultMajorEvent {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub tid: u32,
    /// Time in the handler.
    pub duration_ns: u64,
    /// Page-aligned faulting address.
    pub addr: u64,
    /// The fault's user stack id (`StackKey::user_stack`; `STACK_ID_NONE`: none taken).
    pub user_stack: i32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<FaultMajorEvent>() == 16 + 8 + 16 + 8);

/// A key entered `REGION_STATS` (`late` = 0) or `REGION_LATE` (1): the
/// loader keeps an index of each process's keys from these, so that taking
/// an exited process's granules is a lookup per key, not a walk of the
/// whole map. Lost records (`DropKind::GranuleKeyRingFull`) make the loader
/// walk the maps once and rebuild its index. `hdr.ts_ns` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GranuleNewEvent {
    pub hdr: EventHeader,
    pub key: crate::GranuleKey,
    pub late: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<GranuleNewEvent>() == 16 + 16 + 8);

/// An OOM kill, from `oom:mark_victim`, which runs in the task that invoked
/// the OOM killer: the trigger. Sizes are in kB, as the tracepoint reports them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OomEvent {
    pub hdr: EventHeader,
    pub victim_pid: u32,
    pub trigger_tgid: u32,
    pub trigger_tid: u32,
    pub uid: u32,
    pub oom_score_adj: i32,
    /// From `oom_kill_process()` where a kprobe/fentry runs there: the kernel's
    /// `enum oom_constraint` + 1 (1 none, 2 cpuset, 3 mempolicy, 4 memcg); 0 unknown.
    pub constraint: u32,
    pub total_vm_kb: u64,
    pub anon_rss_kb: u64,
    pub file_rss_kb: u64,
    pub shmem_rss_kb: u64,
    pub pgtables_kb: u64,
    pub victim_comm: [u8; COMM_LEN],
    pub trigger_comm: [u8; COMM_LEN],
    /// kernfs id (= inode number of the cgroup directory) of the victim's and the
    /// trigger's memory cgroup, read in the kernel at the kill; 0 when unknown.
    pub victim_memcg_id: u64,
    pub trigger_memcg_id: u64,
    /// kernfs id of the memory cgroup that ran out (`oc->memcg`); 0 when the
    /// OOM was not a memcg one or `oom_kill_process()` could not be probed.
    pub oom_memcg_id: u64,
}
const _: () = assert!(core::mem::size_of::<OomEvent>() == 16 + 24 + 40 + 32 + 24);
