//! CPython frames taken with user stacks: where the kernel finds a process's
//! interpreter (`PyProc`, per process, from userspace) and what it records
//! per frame (`PyFrame`), for userspace to name (vmtrace/src/python/).

/// Python frames recorded per stack at most (innermost first).
pub const PY_DEPTH: usize = 32;

/// `UserStack::py_flags`: the thread ran more Python frames than `py`
/// holds (a frame beyond the `PY_DEPTH` innermost, or one the walk could not
/// read): `py` holds the innermost ones, and the outermost of them need not
/// start its evaluation-loop call.
pub const PY_TRUNCATED: u32 = 1;

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
    /// `PyThreadState.native_thread_id` (3.11+, the tid) or `.thread_id`
    /// (3.10, `pthread_self()`: see `PY_THREAD_BY_PTHREAD`).
    pub native_tid: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`; `PY_OFF_NONE`: `tstate_frame` is the frame.
    pub cframe_frame: u32,
    /// `_PyInterpreterFrame.f_code` / `.f_executable` (3.10: `PyFrameObject.f_code`).
    pub frame_code: u32,
    /// `.previous` (3.10: `.f_back`).
    pub frame_previous: u32,
    /// `.prev_instr` / `.instr_ptr` (3.10: `.f_lasti`, an `int`).
    pub frame_instr: u32,
    /// `.owner` (a byte): 3 is a C-stack shim, the entry of an eval call
    /// (3.12+); `PY_OFF_NONE` where frames have no owner (3.10).
    pub frame_owner: u32,
    /// `.is_entry` (a byte, 3.11); `PY_OFF_NONE` otherwise.
    pub frame_is_entry: u32,
    /// `PY_THREAD_BY_PTHREAD`, `PY_FRAME_OBJECTS`.
    pub flags: u32,
    /// Where a code object's stamp words start (`co_filename`; see
    /// [`py_code_stamp`]).
    pub code_stamp: u32,
    /// How many words the stamp mixes (at most [`PY_STAMP_WORDS`]).
    pub code_stamp_words: u32,
}
const _: () = assert!(core::mem::size_of::<PyProc>() == 64);

/// `native_tid` holds `pthread_self()`, not the tid (3.10): on x86-64 glibc
/// that is the thread's FS base, which the kernel keeps in
/// `task_struct.thread.fsbase`.
pub const PY_THREAD_BY_PTHREAD: u32 = 1;

/// Frames are `PyFrameObject`s (3.10): each is run by its own
/// `_PyEval_EvalFrameDefault` call, and `frame_instr` is `f_lasti`, a 4-byte
/// index in code units (-1 before the first instruction), read on its own as
/// it lies beyond `PY_FRAME_READ`.
pub const PY_FRAME_OBJECTS: u32 = 2;

/// Bytes of an interpreter frame the kernel reads at once: every field it
/// needs lies in them (3.11+; 3.10's `f_lasti` is read apart). No more:
/// a 3.11+ frame may be the last of its stack chunk, and a read past the
/// chunk's end fails as a whole.
pub const PY_FRAME_READ: usize = 72;

/// One Python frame: its code object, the code object's stamp and the
/// instruction pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
    /// [`py_code_stamp`] of the code object as the kernel read it with the
    /// frame; 0 where it could not be read.
    pub stamp: u64,
}

/// Words of a code object read for its stamp: `co_filename`, `co_name`,
/// `co_qualname`, `co_linetable` (3.11+); 3.10 has three (`co_filename`,
/// `co_name`, `co_linetable`).
pub const PY_STAMP_WORDS: usize = 4;

/// What tells one code object from another that later took its address:
/// its file name, name, qualified name and line table, all set when it is
/// made and kept for its life, as pointers (strings are shared, a line
/// table is its own). The kernel mixes them with each frame; userspace
/// mixes the same words of the object it reads at that address, and a
/// different stamp means the frame's code object was freed and its memory
/// reused (a module body or class body after its import) before it was
/// read. `n`: the words that count (`PyProc::code_stamp_words`). Never 0.
#[inline(always)]
pub fn py_code_stamp(words: &[u64; PY_STAMP_WORDS], n: u32) -> u64 {
    let mut h: u64 = 0x2545_f491_4f6c_dd1d;
    let mut i = 0;
    while i < PY_STAMP_WORDS {
        if (i as u32) < n {
            h = (h ^ words[i]).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
        }
        i += 1;
    }
    h | 1
}
