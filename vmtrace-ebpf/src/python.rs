//! The current thread's CPython frames, taken with its user stack: from
//! `_PyRuntime` (its address and the version's offsets come from userspace,
//! `PY_PROCS`) to the thread's `PyThreadState` (matched by native thread id,
//! or by `pthread_self()` for 3.10; remembered per thread), then up the
//! `_PyInterpreterFrame` chain (3.10: `PyFrameObject`s). Each frame gives its
//! code object and instruction pointer (3.10: `f_lasti`), and the code
//! object's stamp (`py_code_stamp`, one more read); userspace names them
//! (docs/design.md, "Python frames").
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_kernel, bpf_probe_read_user},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use vmtrace_common::{
    py_code_stamp, KernelOffsets, PyFrame, PyProc, UserStack, PY_DEPTH, PY_FRAME_OBJECTS, PY_FRAME_READ, PY_OFF_NONE,
    PY_STAMP_WORDS, PY_THREAD_BY_PTHREAD, PY_TRUNCATED,
};

/// Python processes by tgid (set by userspace once it found `_PyRuntime`).
#[map]
pub static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(4096, 0);

/// Each thread's `PyThreadState`, by tid: the list walk that finds it is
/// done once per thread; a stale entry (tid reused, thread state freed) no
/// longer matches its thread's key and is looked up again.
#[map]
static PY_TSTATES: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16_384, 0);

/// A forked child runs its parent's interpreter at the same addresses: its
/// frames are taken from its first fault, before userspace has seen it.
#[inline(always)]
pub fn on_fork(parent: u32, child: u32) {
    // SAFETY: a plain value read.
    if let Some(p) = unsafe { PY_PROCS.get(parent) } {
        let p = *p;
        let _ = PY_PROCS.insert(child, p, 0);
    }
}

/// After an exec the process runs another program: its old offsets would
/// read whatever now lies there. Userspace registers it again if it is a
/// Python.
#[inline(always)]
pub fn on_exec(tgid: u32) {
    let _ = PY_PROCS.remove(tgid);
}

/// Thread states looked at per interpreter at most.
const THREADS_MAX: u32 = 64;

/// Frames looked at per walk at most: `PY_DEPTH` Python frames, a shim
/// after each (3.12+: one per evaluation-loop call), and the frame that tells
/// the walk was cut short.
const WALK_STEPS: usize = 2 * PY_DEPTH + 1;

/// A frame owned by the C stack: the shim that starts a
/// `_PyEval_EvalFrameDefault` call (3.12+).
const OWNED_BY_CSTACK: u64 = 3;

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user faults safely.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// What the current thread's `PyThreadState` holds at `p.native_tid`: its
/// tid (3.11+) or its `pthread_self()` (3.10). For the latter: glibc on
/// x86-64 points the FS base at the thread's `struct pthread`, which is its
/// `pthread_t`, and the kernel saves the FS base in `thread.fsbase` whenever
/// it is set (`arch_prctl(ARCH_SET_FS)` at start-up, `clone(CLONE_SETTLS)`
/// for a thread), so the running task's copy is current. Chosen over
/// reading CPython's TLS (`_Py_tss_tstate` is 3.12+; 3.10's
/// `autoTSSkey` needs glibc's TLS layout) and over asking userspace (a thread
/// would stay native until the next tick): one kernel read per event, and
/// the key cannot name another live thread, as pthread ids are unique among
/// a process's live threads. `None` when the kernel has no `fsbase` field
/// (not x86-64): no Python frames rather than a guess.
#[inline(always)]
fn thread_key(p: &PyProc, pid_tgid: u64) -> Option<u64> {
    if p.flags & PY_THREAD_BY_PTHREAD == 0 {
        return Some(pid_tgid & 0xffff_ffff);
    }
    let off = crate::globals::koffset_task_fsbase();
    if off == KernelOffsets::MISSING {
        return None;
    }
    // SAFETY: the current task is valid for the program's run;
    // bpf_probe_read_kernel faults safely.
    let task = unsafe { bpf_get_current_task() };
    let fsbase = unsafe { bpf_probe_read_kernel((task + u64::from(off)) as *const u64) }.ok()?;
    (fsbase != 0).then_some(fsbase)
}

/// The current thread's `PyThreadState` in process `p`: the one whose
/// `native_tid` field holds `key` (`thread_key`), cached by `tid`.
#[inline(always)]
fn tstate(p: &PyProc, tid: u32, key: u64) -> Option<u64> {
    // SAFETY: a plain value read.
    if let Some(&t) = unsafe { PY_TSTATES.get(tid) } {
        if read_u64(t + u64::from(p.native_tid)) == Some(key) {
            return Some(t);
        }
    }
    let interp = read_u64(p.runtime + u64::from(p.interp_head))?;
    let mut t = read_u64(interp + u64::from(p.threads_head))?;
    for _ in 0..THREADS_MAX {
        if t == 0 {
            return None;
        }
        if read_u64(t + u64::from(p.native_tid))? == key {
            let _ = PY_TSTATES.insert(tid, t, 0);
            return Some(t);
        }
        t = read_u64(t + u64::from(p.tstate_next))?;
    }
    None
}

/// The byte at `off` of a frame read as words.
#[inline(always)]
fn byte_at(buf: &[u64; PY_FRAME_READ / 8], off: u32) -> u64 {
    let w = buf.get((off as usize / 8) & 15).copied().unwrap_or(0);
    (w >> ((off & 7) * 8)) & 0xff
}

#[inline(always)]
fn word_at(buf: &[u64; PY_FRAME_READ / 8], off: u32) -> u64 {
    buf.get((off as usize / 8) & 15).copied().unwrap_or(0)
}

/// Records the current thread's Python frames in `s` (none where the process
/// is not a known Python or the thread runs none) and mixes them into `h`.
#[inline(always)]
pub fn walk(s: &mut UserStack, mut h: u64) -> u64 {
    s.py_nr = 0;
    s.py_ends = 0;
    s.py_flags = 0;
    let pid_tgid = bpf_get_current_pid_tgid();
    s.py_tgid = (pid_tgid >> 32) as u32;
    // SAFETY: a plain value read.
    let Some(p) = (unsafe { PY_PROCS.get((pid_tgid >> 32) as u32) }) else { return h };
    let Some(key) = thread_key(p, pid_tgid) else { return h };
    let Some(t) = tstate(p, pid_tgid as u32, key) else { return h };
    let objects = p.flags & PY_FRAME_OBJECTS != 0;
    let Some(mut f) = read_u64(t + u64::from(p.tstate_frame)) else { return h };
    if p.cframe_frame != PY_OFF_NONE {
        if f == 0 {
            return h;
        }
        let Some(cf) = read_u64(f + u64::from(p.cframe_frame)) else { return h };
        f = cf;
    }
    // The depth and entry bits live in the map value, not in registers: the
    // verifier then does not tell apart the paths by which bits were set,
    // and the loop's iterations converge (1M instructions otherwise).
    let nr_p = &raw mut s.py_nr;
    let ends_p = &raw mut s.py_ends;
    for _ in 0..WALK_STEPS {
        // SAFETY: fields of this CPU's scratch value.
        let nr = unsafe { core::ptr::read_volatile(nr_p) } as usize;
        if f == 0 {
            break;
        }
        // SAFETY: bpf_probe_read_user faults safely.
        let Ok(buf) = (unsafe { bpf_probe_read_user(f as *const [u64; PY_FRAME_READ / 8]) }) else { break };
        let mut bit = 0u32;
        if p.frame_owner != PY_OFF_NONE && byte_at(&buf, p.frame_owner) == OWNED_BY_CSTACK {
            // The frame below it was the first of an eval call.
            if nr > 0 {
                bit = 1 << ((nr - 1) & 31);
            }
        } else {
            if nr >= PY_DEPTH {
                // A Python frame beyond those kept (a shim is still taken,
                // as it only ends the call of the frame below it).
                break;
            }
            let code = word_at(&buf, p.frame_code);
            let instr = if objects {
                // f_lasti, an int: its 4 bytes, sign dropped (userspace
                // reads -1, "not started", back from them). Unreadable: the
                // walk stops rather than guess a line.
                let Some(v) = read_u64(f + u64::from(p.frame_instr)) else { break };
                v & 0xffff_ffff
            } else {
                word_at(&buf, p.frame_instr)
            };
            // The code object's stamp, read now: by the time userspace reads
            // the object at `code`, another may have taken its address.
            // SAFETY: bpf_probe_read_user faults safely.
            let stamp =
                unsafe { bpf_probe_read_user((code + u64::from(p.code_stamp)) as *const [u64; PY_STAMP_WORDS]) }
                    .map_or(0, |w| py_code_stamp(&w, p.code_stamp_words));
            // The slot from the depth read again and masked where it is
            // used: `nr < PY_DEPTH` above lets LLVM drop a mask of `nr`, and
            // 6.1's verifier loses the bound of `nr` spilled across the reads
            // ("R3 unbounded memory access" at this store).
            // SAFETY: as above.
            let at = unsafe { core::ptr::read_volatile(nr_p) } as usize & (PY_DEPTH - 1);
            if let Some(slot) = s.py.get_mut(at) {
                *slot = PyFrame { code, instr, stamp };
            }
            // A frame object is its own evaluation-loop call.
            if objects || (p.frame_is_entry != PY_OFF_NONE && byte_at(&buf, p.frame_is_entry) != 0) {
                bit = 1 << (nr & 31);
            }
            h = crate::shared::mix(h ^ code ^ instr.rotate_left(32) ^ stamp.rotate_left(16));
            // SAFETY: as above.
            unsafe { core::ptr::write_volatile(nr_p, nr as u32 + 1) };
        }
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(ends_p, core::ptr::read_volatile(ends_p) | bit) };
        f = word_at(&buf, p.frame_previous);
    }
    // Stopped before the chain's end: by depth, by steps, or at a frame it
    // could not read. `py` holds the innermost frames; userspace pairs them
    // with the innermost evaluation-loop frames and marks the cut.
    if f != 0 {
        s.py_flags = PY_TRUNCATED;
        h = crate::shared::mix(h ^ u64::from(PY_TRUNCATED));
    }
    h
}
