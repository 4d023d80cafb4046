//! Copied user stacks: what the kernel sends where a frame-pointer walk is
//! not whole, for userspace to unwind (`EventKind::StackSample`).
use crate::EventHeader;

/// Window sizes `Config::stack_window` may take: the kernel reserves a
/// constant-size record per size.
pub const STACK_WINDOWS: [u32; 3] = [8192, 16384, 32768];
/// The default window: enough for CPython re-entering numpy two or three
/// times (docs/unwind-spike.md).
pub const STACK_WINDOW_DEFAULT: u32 = 16384;

/// What precedes the copied stack in a `StackSample`: the user registers of
/// a task whose stack was taken, and which frame-pointer stack it refines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StackSampleHead {
    pub hdr: EventHeader,
    pub tgid: u32,
    pub tid: u32,
    /// The id the frame-pointer walk stored (`USER_STACKS`): every event
    /// counted under it in this process shares its unwound stacks.
    pub user_stack: i32,
    /// Bytes of `StackSample::stack` copied from `sp` (0: registers only).
    pub len: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The link register (x30) on arm64, where a leaf function's return
    /// address stays (its CFI says so); 0 on x86-64, which pushes it.
    pub lr: u64,
    /// How many events of its id this copy stands for: 1, then 2^k once the
    /// id had many copies (the kernel thins them at random, `samples.rs`).
    /// 0 for a copy of the resident sample alone (`addr` set): taken for
    /// a sampled page whose id's copies were being thinned; it names that
    /// page's stack and is not counted among its id's.
    pub weight: u32,
    pub _pad: u32,
    /// The faulting address (page-aligned) when the copy was taken for a
    /// fault on a page of the resident sample (`PAGE_STACK_COPY`): userspace
    /// makes this unwound stack the page's owner, not its id's mix. 0 else.
    pub addr: u64,
}
const _: () = assert!(core::mem::size_of::<StackSampleHead>() == 16 + 16 + 48);

/// A user stack to unwind in userspace: registers and up to `N` bytes of the
/// stack from `sp` (`EventKind::StackSample`, on its own ring).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackSample<const N: usize> {
    pub head: StackSampleHead,
    pub stack: [u8; N],
}
const _: () = assert!(core::mem::size_of::<StackSample<16384>>() == 80 + 16384);
