//! CPython frames taken with user stacks: where the kernel finds a process's
//! interpreter (`PyProc`, per process, from userspace) and what it records
//! per frame (`PyFrame`), for userspace to name (vmtrace/src/python/).

/// Python frames recorded per stack at most (innermost first).
pub const PY_DEPTH: usize = 32;

/// `PyProc` offsets that a version does not have.
pub const PY_OFF_NONE: u32 = u32::MAX;

/// Where the kernel finds the current thread's Python frames in process
/// `tgid` (`PY_PROCS`): the address of `_PyRuntime` and the version's
/// structure offsets, in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    pub runtime: u64,
    /// `_PyRuntimeState.interpreters.head`.
    pub interp_head: u32,
    /// `PyInterpreterState.threads.head`.
    pub threads_head: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.native_thread_id`.
    pub native_tid: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`; `PY_OFF_NONE`: `tstate_frame` is the frame.
    pub cframe_frame: u32,
    /// `_PyInterpreterFrame.f_code` / `.f_executable`.
    pub frame_code: u32,
    pub frame_previous: u32,
    /// `.prev_instr` / `.instr_ptr`.
    pub frame_instr: u32,
    /// `.owner` (a byte): 3 is a C-stack shim, the entry of an eval call (3.12+).
    pub frame_owner: u32,
    /// `.is_entry` (a byte, 3.11); `PY_OFF_NONE` otherwise.
    pub frame_is_entry: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<PyProc>() == 56);

/// Bytes of an interpreter frame the kernel reads at once: every field it
/// needs lies in them (all versions).
pub const PY_FRAME_READ: usize = 72;

/// One Python frame: its code object and instruction pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
}
