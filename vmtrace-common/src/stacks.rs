//! Call stacks: the stack keys and counts the fault programs aggregate, and the user stacks they walk.
use crate::{Merge, PyFrame, PY_DEPTH};

/// Key of the in-kernel stack aggregate (`FAULT_STACKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub tgid: u32,
    /// Id in `STACKS` or `USER_STACKS`, else `STACK_ID_NONE` / `STACK_ID_LOST`.
    pub user_stack: i32,
    pub kernel_stack: i32,
    /// `STRATUM_SAMPLED` or `STRATUM_EXACT`: how this stack's faults were
    /// chosen, so userspace weights each stratum by what it stands for.
    pub stratum: u32,
    /// `address >> LEAF_BLOCK_SHIFT` with `--leaf region`, else 0: userspace
    /// turns it into the memory region as the flamegraph's leaf.
    pub leaf_block: u64,
}
const _: () = assert!(core::mem::size_of::<StackKey>() == 24);

/// `StackKey::stratum`: a stack taken at random at 1 in `stack_period` fault
/// starts; it stands for the faults not in the exact stratum.
pub const STRATUM_SAMPLED: u32 = 0;
/// `StackKey::stratum`: a stack taken because its fault slept or was served
/// by a huge page; every such fault has one, so it stands for itself. Slow
/// faults carry most of the time and would be left to chance by sampling.
pub const STRATUM_EXACT: u32 = 1;

/// Address block of `StackKey::leaf_block`: 64 KiB. (A *granule* is the
/// region aggregate's unit, `REGION_GRANULE_SHIFT`.)
pub const LEAF_BLOCK_SHIFT: u32 = 16;

/// Faults seen with one stack pair.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCounts {
    pub faults: u64,
    pub major: u64,
    /// Latency measured for `timed` of them (minor latency may be sampled).
    pub time_ns: u64,
    pub timed: u64,
    /// Copy-on-write faults among `faults` (a write to a present page).
    pub cow: u64,
}
const _: () = assert!(core::mem::size_of::<StackCounts>() == 40);

impl Merge for StackCounts {
    fn merge(&mut self, o: &StackCounts) {
        self.faults += o.faults;
        self.major += o.major;
        self.time_ns += o.time_ns;
        self.timed += o.timed;
        self.cow += o.cow;
    }
}

/// A stack aggregate this CPU is counting into (`STACK_CUR`, per CPU, a few
/// slots): a fault loop repeats a few stacks, so their counts gather here and
/// reach `FAULT_STACKS` when a slot's key changes. Userspace adds the slots
/// at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackCur {
    pub key: StackKey,
    pub counts: StackCounts,
}
const _: () = assert!(core::mem::size_of::<StackCur>() == 24 + 40);

/// Slots of `STACK_CUR` per CPU.
pub const STACK_CUR_SLOTS: u32 = 16;

/// Which stacks to collect (`Config::stack_mode` bits).
pub const STACK_USER: u32 = 1;
pub const STACK_KERNEL: u32 = 2;

/// `Config::user_walk`: a 16-byte read per frame.
pub const USER_WALK_FRAMES: u32 = 1;
/// `Config::user_walk`: 1 KiB reads, each usually holding several frames. The
/// verifier of 6.1 gives up on this loop (its paths do not converge); 6.12's
/// takes it.
pub const USER_WALK_WINDOWS: u32 = 2;

/// Bit 30 of every id in `USER_STACKS`: ids in `STACKS` stay below it.
pub const OWN_STACK_ID: u32 = 1 << 30;

/// Stack id (`StackKey`, `InflightFault`, `MmStackKey`) of a stack not taken:
/// that kind of stack is off, or the fault was not sampled.
pub const STACK_ID_NONE: i32 = -1;
/// Stack id of a stack that was to be taken but could not be read or stored
/// (`DropKind::StackLost`): the event is counted without it.
pub const STACK_ID_LOST: i32 = -2;

/// Deepest user stack recorded: the kernel's own limit (PERF_MAX_STACK_DEPTH).
pub const USER_STACK_DEPTH: usize = 127;

/// A user stack walked through frame pointers by the programs (`USER_STACKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UserStack {
    /// 64-bit hash of the frames: the map is keyed by 30 bits of it, so this
    /// tells a stored stack from a colliding one.
    pub hash: u64,
    pub nr: u64,
    /// Innermost first: the faulting instruction, then return addresses.
    pub ips: [u64; USER_STACK_DEPTH],
    /// The process whose Python frames these are (the first to store the
    /// stack): where userspace reads their code objects.
    pub py_tgid: u32,
    /// [`crate::PY_TRUNCATED`] or 0.
    pub py_flags: u32,
    /// Python frames recorded in `py` (0: none, or not a known interpreter).
    pub py_nr: u32,
    /// Bit i: `py[i]` is the outermost Python frame of its
    /// `_PyEval_EvalFrameDefault` call.
    pub py_ends: u32,
    /// Innermost first.
    pub py: [PyFrame; PY_DEPTH],
}
const _: () = assert!(core::mem::size_of::<UserStack>() == 1032 + 16 + 24 * PY_DEPTH);
