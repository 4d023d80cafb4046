//! Memory-management syscalls of traced processes: counts, advice, bytes
//! unmapped, call-site stacks, and a bracket (enter → exit) per thread so TLB
//! shootdowns sent meanwhile are blamed on the call (see `tlb.rs`). Mapping
//! changes are streamed with their address-space generations (`mapgen`), so
//! userspace knows which mapping covered each address at each generation.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap},
    programs::TracePointContext,
    EbpfContext as _,
};
use vmtrace_common::{
    DropKind, EventHeader, EventKind, InsertMap, KernelOffsets, MmCall, MmEvent, MmInflight, MmLockEvent,
    MmStackCounts, MmStackKey, MmStats, Tp, ADVICE_SLOTS, MAP_LOCKED, STACK_ID_NONE, STACK_USER,
};

use crate::{
    globals::{config, koffsets},
    mapgen::{bump_gen, map_gen, mark_gen},
    probes::task::read_field,
    shared::{
        batched_wakeup, count_drop, get_or_insert, get_or_insert_counted, is_traced, tp_fixed, wake_once, EVENTS,
    },
    stacks::user_stack_id,
};

/// `RLIMIT_MEMLOCK`'s index in `signal_struct.rlim` (the same on every architecture).
const RLIMIT_MEMLOCK: u32 = 8;

/// Per-process mmap-family and TLB aggregate, keyed by tgid (processes in the
/// traced set only). Userspace takes an exited process's entry, as for faults.
#[map]
static MM_STATS: PerCpuHashMap<u32, MmStats> = PerCpuHashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// Where a process's mmap/TLB counts go when the kernel refused its
/// `MM_STATS` entry (the error is counted in `DROPS`): preallocated, so an
/// insert takes an element made at load and never allocates. `MM_STATS`
/// allocates an element and a per-CPU value without sleeping for each new
/// process, from per-CPU caches the kernel refills afterwards (for per-CPU
/// values: 1 to 3 of them), so a new process's first flush can find none.
/// Userspace adds a process's entry here to its `MM_STATS` one, and takes
/// both when it exits. Sized by the loader (vmtrace/src/loader/sizes.rs).
#[map]
static MM_SPILL: PerCpuHashMap<u32, MmStats> = PerCpuHashMap::with_max_entries(256, 0);

/// All-zero `MmStats` to insert from (too big for the BPF stack).
#[map]
static ZERO_MM: PerCpuArray<MmStats> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's aggregate for `tgid`, created on first use: in `MM_STATS`,
/// else in `MM_SPILL`; lost (`MmStatsFull`) only when both refuse it.
#[inline(always)]
pub fn mm_stats(tgid: u32) -> Option<&'static mut MmStats> {
    let zero = ZERO_MM.get(0)?;
    if let Some(m) = get_or_insert_counted(&MM_STATS, InsertMap::MmStats, &tgid, zero) {
        return Some(m);
    }
    let m = get_or_insert(&MM_SPILL, &tgid, zero);
    if m.is_none() {
        count_drop(DropKind::MmStatsFull);
    }
    m
}

/// Calls and IPIs per (process, syscall, user call site).
#[map]
static MM_STACKS: PerCpuHashMap<MmStackKey, MmStackCounts> = PerCpuHashMap::with_max_entries(16_384, 0);

pub fn stack_key(tgid: u32, call: u32, user_stack: i32) -> MmStackKey {
    MmStackKey { tgid, call, user_stack, _pad: 0 }
}

pub fn mm_stack_counts(key: &MmStackKey) -> Option<&'static mut MmStackCounts> {
    let c = get_or_insert(&MM_STACKS, key, &MmStackCounts::default());
    if c.is_none() {
        count_drop(DropKind::MmStacksFull);
    }
    c
}

/// The memory-management syscall in flight on this CPU (`tid` 0: none): TLB
/// IPIs sent meanwhile are blamed on it and its call site. A per-CPU slot, as
/// for faults: a hash insert and delete per call would cost more than the
/// rest of the hook.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MmSlot {
    pub tid: u32,
    pub _pad: u32,
    pub call: MmInflight,
}

#[map]
static MM_SLOT: PerCpuArray<MmSlot> = PerCpuArray::with_max_entries(1, 0);

/// Calls whose thread was switched out mid-call (they sleep on locks and
/// I/O), by tid. LRU: a call that never returns (its task was killed) ages out.
#[map]
static MM_PARKED: LruHashMap<u32, MmInflight> = LruHashMap::with_max_entries(16_384, 0);

/// Starts `call` on thread `tid`.
#[inline(always)]
fn mm_begin(tid: u32, call: &MmInflight) {
    if let Some(s) = MM_SLOT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs on one CPU do not interleave.
        unsafe { *s = MmSlot { tid, _pad: 0, call: *call } };
    }
}

/// Ends thread `tid`'s call in flight and returns it.
#[inline(always)]
fn mm_end(tid: u32) -> Option<MmInflight> {
    if let Some(s) = MM_SLOT.get_ptr_mut(0) {
        // SAFETY: as above.
        let s = unsafe { &mut *s };
        if s.tid == tid {
            s.tid = 0;
            return Some(s.call);
        }
    }
    // SAFETY: copied out before removal.
    let parked = unsafe { MM_PARKED.get(tid) }.copied()?;
    let _ = MM_PARKED.remove(tid);
    Some(parked)
}

/// Thread `tid`'s call in flight: (call, user stack id).
#[inline(always)]
pub fn mm_current(tid: u32) -> Option<(u32, i32)> {
    if let Some(s) = MM_SLOT.get_ptr(0) {
        // SAFETY: as above.
        let s = unsafe { &*s };
        if s.tid == tid {
            return Some((s.call.call, s.call.user_stack));
        }
    }
    // SAFETY: a live map value, read at once.
    MM_PARKED.get_ptr(tid).map(|p| unsafe { ((*p).call, (*p).user_stack) })
}

/// Moves the leaving thread's call in flight to `MM_PARKED` (`sched_switch`).
#[inline(always)]
pub fn mm_park(tid: u32) {
    let Some(s) = MM_SLOT.get_ptr_mut(0) else { return };
    // SAFETY: as above; preemption is off in __schedule.
    let s = unsafe { &mut *s };
    if s.tid != 0 && s.tid == tid {
        s.tid = 0;
        // LRU map: insertion cannot fail for lack of room. Inserted from the
        // slot itself, not a copy on the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = MM_PARKED.insert(tid, &s.call, 0);
    }
}

// /sys/kernel/tracing/events/syscalls/sys_enter_*/format: `int __syscall_nr`
// at 8, then the arguments as 8-byte fields from offset 16:
//   mmap(addr, len, prot, flags, fd, off)      munmap(addr, len)
//   mremap(addr, old_len, new_len, flags, new_addr)
//   madvise(start, len_in, behavior)           mprotect(start, len, prot)
//   brk(brk)                                   pkey_mprotect(start, len, prot, pkey)
//   mlock(start, len)  mlock2(start, len, flags)  munlock(start, len)
//   mlockall(flags)    munlockall()
// sys_exit_*: `long ret` at 16.
// (`Tp::SysEnterNr`, `Tp::SysEnterArgs`, `Tp::SysExitRet` in vmtrace-common's
// table, checked at attach.)
const ARG0: usize = Tp::SysEnterArgs.fixed_offset();
const MAP_ANONYMOUS: u64 = 0x20;

/// The family's arm64 (asm-generic) syscall numbers, and how many arguments each has.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn call_of(nr: i32) -> Option<(MmCall, usize)> {
    Some(match nr {
        222 => (MmCall::Mmap, 6),
        226 => (MmCall::Mprotect, 3),
        215 => (MmCall::Munmap, 2),
        214 => (MmCall::Brk, 1),
        216 => (MmCall::Mremap, 5),
        233 => (MmCall::Madvise, 3),
        288 => (MmCall::Mprotect, 4),
        _ => return None,
    })
}

/// The family's x86-64 syscall numbers, and how many arguments each has.
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn call_of(nr: i32) -> Option<(MmCall, usize)> {
    Some(match nr {
        9 => (MmCall::Mmap, 6),
        10 => (MmCall::Mprotect, 3),
        11 => (MmCall::Munmap, 2),
        12 => (MmCall::Brk, 1),
        25 => (MmCall::Mremap, 5),
        28 => (MmCall::Madvise, 3),
        // Counted as mprotect: the same change to the address space.
        329 => (MmCall::Mprotect, 4),
        _ => return None,
    })
}

/// The locking calls' x86-64 syscall numbers (their own enter and exit
/// programs: in the family's, five more calls made the verifier's walk of
/// the enter program pass its 1M-instruction limit).
#[inline(always)]
fn lock_call_of(nr: i32) -> Option<(MmCall, usize)> {
    Some(match nr {
        149 => (MmCall::Mlock, 2),
        150 => (MmCall::Munlock, 2),
        151 => (MmCall::Mlockall, 1),
        152 => (MmCall::Munlockall, 0),
        // mlock2: mlock with flags (MLOCK_ONFAULT), counted as mlock.
        325 => (MmCall::Mlock, 3),
        _ => return None,
    })
}

fn enter(pid_tgid: u64, call: MmCall, a: [u64; 6], user_stack: i32) {
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(m) = mm_stats(tgid) {
        if let Some(c) = m.calls.get_mut(call as usize) {
            *c += 1;
        }
        match call {
            MmCall::Munmap => m.munmap_bytes += a[1],
            MmCall::Madvise => {
                let slot = if a[2] < ADVICE_SLOTS as u64 { a[2] as usize } else { ADVICE_SLOTS - 1 };
                if let Some(c) = m.advice.get_mut(slot) {
                    *c += 1;
                }
            }
            _ => {}
        }
    }
    if let Some(c) = mm_stack_counts(&stack_key(tgid, call as u32, user_stack)) {
        c.calls += 1;
    }
    // Every call but madvise may change the mappings: faults of other threads
    // from here to the exit are marked as racing it (see `mapgen`). Not an
    // munmap (no fault can follow it in what it removed), nor an mmap likely
    // to make again what the last munmap removed (see `same_again`).
    let gen = match call {
        MmCall::Madvise => 0,
        MmCall::Munmap => map_gen(tgid),
        MmCall::Mmap if same_again(pid_tgid as u32, &a, None) => map_gen(tgid),
        _ => bump_gen(tgid, false),
    };
    // SAFETY: no preconditions.
    let start_ns = unsafe { bpf_ktime_get_ns() };
    mm_begin(pid_tgid as u32, &MmInflight { call: call as u32, user_stack, args: a, gen, _pad: 0, start_ns });
}

/// `madvise` advice after which the range holds no pages until touched
/// again: MADV_DONTNEED (4), MADV_FREE (8, freed lazily: the kernel's
/// counters drop only at reclaim), MADV_REMOVE (9), MADV_DONTNEED_LOCKED (24).
#[inline(always)]
fn gives_back(advice: u64) -> bool {
    matches!(advice, 4 | 8 | 9 | 24)
}

fn try_sys_exit(ctx: &TracePointContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    let f = mm_end(tid)?;
    let ret = tp_fixed!(ctx, SysExitRet: i64);
    let ok = !(-4095..0).contains(&ret);
    let a = f.args;
    if f.call == MmCall::Mmap as u32 && a[3] & MAP_LOCKED != 0 {
        emit_lock(tgid, tid, &f, ret, ok);
    }
    // madvise changes no mapping; only advice that gives memory back is
    // streamed, for resident attribution (`probes/rss.rs`).
    if f.call == MmCall::Madvise as u32 && (ret != 0 || !gives_back(a[2])) {
        return None;
    }
    let gen_exit = if f.call == MmCall::Madvise as u32 {
        // No generation: the mappings stay as they were.
        f.gen
    } else if f.call == MmCall::Munmap as u32 {
        if ret == 0 {
            note_unmap(tid, a[0], a[1]);
        }
        mark_gen(tgid);
        f.gen
    } else if f.call == MmCall::Mmap as u32 && ok && same_again(tid, &a, Some(ret as u64)) {
        // The same mapping made again where the last munmap removed it: its
        // faults are the old one's row anyway; no new granule keys (a
        // churning allocator would fill the map).
        note_map(tid, ret as u64, &a);
        f.gen
    } else {
        if f.call == MmCall::Mmap as u32 && ok {
            note_map(tid, ret as u64, &a);
        } else {
            forget_map(tid);
        }
        // Forced when the enter did not bump (it guessed "the same again").
        bump_gen(tgid, f.call == MmCall::Mmap as u32 && f.gen == map_gen(tgid))
    };
    // (addr, len, prot, flags, fd, offset, old_addr, old_len)
    let change = match f.call {
        c if c == MmCall::Mmap as u32 && ok => (ret as u64, a[1], a[2], a[3], a[4], a[5], 0, 0),
        c if c == MmCall::Munmap as u32 && ret == 0 => (a[0], a[1], 0, 0, u64::MAX, 0, 0, 0),
        c if c == MmCall::Mremap as u32 && ok => (ret as u64, a[2], 0, a[3], u64::MAX, 0, a[0], a[1]),
        c if c == MmCall::Mprotect as u32 && ret == 0 => (a[0], a[1], a[2], 0, u64::MAX, 0, 0, 0),
        // brk returns the break in force, moved or not.
        c if c == MmCall::Brk as u32 => (ret as u64, 0, 0, 0, u64::MAX, 0, a[0], 0),
        // The advice in `prot`.
        c if c == MmCall::Madvise as u32 => (a[0], a[1], a[2], 0, u64::MAX, 0, 0, 0),
        _ => return None,
    };
    let Some(mut slot) = EVENTS.reserve::<MmEvent>(0) else {
        count_drop(DropKind::MmEventRingFull);
        return None;
    };
    let (addr, len, prot, flags, fd, offset, old_addr, old_len) = change;
    let file_backed = f.call == MmCall::Mmap as u32 && (fd as i64) >= 0 && flags & MAP_ANONYMOUS == 0;
    let (dev, ino) = if file_backed { file_of(fd as u32).unwrap_or((0, 0)) } else { (0, 0) };
    slot.write(MmEvent {
        hdr: EventHeader {
            kind: EventKind::MmMapChange as u32,
            size: core::mem::size_of::<MmEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        tgid,
        call: f.call,
        addr,
        len,
        prot,
        flags,
        fd,
        offset,
        old_addr,
        old_len,
        gen_enter: f.gen,
        gen_exit,
        dev,
        tid,
        ino,
        start_ns: f.start_ns,
    });
    // A file mapping is named from /proc/PID/fd/FD while the fd is open:
    // wake the collector soon. Other changes can wait for its next poll.
    slot.submit(if file_backed { wake_once() } else { batched_wakeup() });
    Some(())
}

/// Streams a locking call at its return, with the process's locked and
/// pinned pages as the kernel now counts them.
#[inline(always)]
fn emit_lock(tgid: u32, tid: u32, f: &MmInflight, ret: i64, ok: bool) {
    let a = f.args;
    let (addr, len, flags) = match f.call {
        c if c == MmCall::Mmap as u32 => (if ok { ret as u64 } else { a[0] }, a[1], a[3]),
        c if c == MmCall::Mlock as u32 || c == MmCall::Munlock as u32 => (a[0], a[1], a[2]),
        c if c == MmCall::Mlockall as u32 => (0, 0, a[0]),
        _ => (0, 0, 0),
    };
    let off = koffsets();
    // SAFETY: no preconditions; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm: u64 = read_field(task, off.task_mm).unwrap_or(0);
    let locked_pages: u64 = read_field(mm as *const u8, off.mm_locked_vm).unwrap_or(u64::MAX);
    let pinned_pages: u64 = read_field(mm as *const u8, off.mm_pinned_vm).unwrap_or(u64::MAX);
    // A refusal is explained by the limit in force: read it now, as the
    // process may exit before userspace reads /proc/PID/limits.
    let (mut memlock_cur, mut memlock_max, mut memlock_read) = (0u64, 0u64, 0u32);
    if !ok && off.signal_rlim != KernelOffsets::MISSING {
        let signal: u64 = read_field(task, off.task_signal).unwrap_or(0);
        // struct rlimit { rlim_cur; rlim_max; }, RLIMIT_MEMLOCK = 8.
        let at = off.signal_rlim.wrapping_add(RLIMIT_MEMLOCK * 16);
        if let (Some(c), Some(m)) =
            (read_field::<u64>(signal as *const u8, at), read_field::<u64>(signal as *const u8, at.wrapping_add(8)))
        {
            (memlock_cur, memlock_max, memlock_read) = (c, m, 1);
        }
    }
    let Some(mut slot) = EVENTS.reserve::<MmLockEvent>(0) else {
        count_drop(DropKind::MmEventRingFull);
        return;
    };
    slot.write(MmLockEvent {
        hdr: EventHeader {
            kind: EventKind::MmLock as u32,
            size: core::mem::size_of::<MmLockEvent>() as u32,
            // SAFETY: no preconditions.
            ts_ns: unsafe { bpf_ktime_get_ns() },
        },
        tgid,
        tid,
        call: f.call,
        user_stack: f.user_stack,
        ret,
        addr,
        len,
        flags,
        locked_pages,
        pinned_pages,
        start_ns: f.start_ns,
        memlock_cur,
        memlock_max,
        memlock_read,
        _pad: 0,
    });
    // Userspace reads the process's RLIMIT_MEMLOCK while it lives.
    slot.submit(wake_once());
}

/// (dev, inode) of the current task's open file `fd`, as `stat` reports
/// them: userspace checks that /proc/PID/fd/FD still names that file.
#[inline(always)]
fn file_of(fd: u32) -> Option<(u32, u64)> {
    let off = koffsets();
    // SAFETY: no preconditions; the pointer is only read through bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files: u64 = read_field(task, off.task_files)?;
    let fdt: u64 = read_field(files as *const u8, off.files_fdt)?;
    let max: u32 = read_field(fdt as *const u8, off.fdtable_max_fds)?;
    if fd >= max {
        return None;
    }
    let fds: u64 = read_field(fdt as *const u8, off.fdtable_fd)?;
    let file: u64 = read_field((fds + u64::from(fd) * 8) as *const u8, 0)?;
    let inode: u64 = read_field(file as *const u8, off.file_inode)?;
    let ino: u64 = read_field(inode as *const u8, off.inode_ino)?;
    let sb: u64 = read_field(inode as *const u8, off.inode_sb)?;
    let dev: u32 = read_field(sb as *const u8, off.sb_dev)?;
    Some((dev, ino))
}

/// The last anonymous private mapping a thread made, and whether its munmap
/// removed exactly it since (per thread: threads of an allocator churn on
/// their own).
#[repr(C)]
#[derive(Clone, Copy)]
struct LastMap {
    addr: u64,
    len: u64,
    prot: u64,
    flags: u64,
    unmapped: u64,
}

#[map]
static LAST_MAP: LruHashMap<u32, LastMap> = LruHashMap::with_max_entries(16_384, 0);

/// Whether mmap arguments `a` (and its result, once known) make again the
/// anonymous private mapping the last munmap removed.
#[inline(always)]
fn same_again(tid: u32, a: &[u64; 6], ret: Option<u64>) -> bool {
    if a[3] & MAP_ANONYMOUS == 0 || a[3] & 0x3 != 0x2 {
        return false;
    }
    // SAFETY: a live map value, read at once.
    let Some(l) = LAST_MAP.get_ptr(tid).map(|p| unsafe { *p }) else { return false };
    l.unmapped != 0 && l.len == a[1] && l.prot == a[2] && l.flags == a[3] && ret.is_none_or(|r| r == l.addr)
}

#[inline(always)]
fn note_map(tid: u32, addr: u64, a: &[u64; 6]) {
    if a[3] & MAP_ANONYMOUS != 0 && a[3] & 0x3 == 0x2 {
        let _ = LAST_MAP.insert(tid, LastMap { addr, len: a[1], prot: a[2], flags: a[3], unmapped: 0 }, 0);
    } else {
        forget_map(tid);
    }
}

#[inline(always)]
fn note_unmap(tid: u32, addr: u64, len: u64) {
    if let Some(l) = LAST_MAP.get_ptr_mut(tid) {
        // SAFETY: a live map value.
        let l = unsafe { &mut *l };
        l.unmapped = u64::from(l.addr == addr && l.len == len);
    }
}

#[inline(always)]
fn forget_map(tid: u32) {
    if let Some(l) = LAST_MAP.get_ptr_mut(tid) {
        // SAFETY: a live map value.
        unsafe { (*l).unmapped = 0 };
    }
}

// One enter program on every sys_enter_* of the family (and one exit program
// on every sys_exit_*): the verifier checks the stack walk once, not six times
// (each check is slow at start-up). The arguments are copied with one read: a direct
// load past the shortest record (brk's, one argument) would keep the program
// off that tracepoint, as the kernel compares a program's deepest context
// load with each record's size at attach. The names below only name the
// sections: userspace attaches each program to every tracepoint by name.
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn tp_syscalls_sys_enter(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter(&ctx, false);
    0
}

/// The locking calls' enter: the same counts, call-site stack and bracket
/// as the family's (`enter`), in a program of its own.
#[tracepoint(category = "syscalls", name = "sys_enter_mlock")]
pub fn tp_syscalls_sys_enter_lock(ctx: TracePointContext) -> u32 {
    let _ = try_sys_enter(&ctx, true);
    0
}

/// The locking calls' exit: each streamed with the locked and pinned pages after it.
#[tracepoint(category = "syscalls", name = "sys_exit_mlock")]
pub fn tp_syscalls_sys_exit_lock(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit_lock(&ctx);
    0
}

fn try_sys_exit_lock(ctx: &TracePointContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let f = mm_end(pid_tgid as u32)?;
    let ret = tp_fixed!(ctx, SysExitRet: i64);
    emit_lock((pid_tgid >> 32) as u32, pid_tgid as u32, &f, ret, !(-4095..0).contains(&ret));
    Some(())
}

#[inline(always)]
fn try_sys_enter(ctx: &TracePointContext, lock: bool) -> Option<()> {
    // Every process's calls come here: the walk and copy below are for traced ones only.
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_traced((pid_tgid >> 32) as u32) {
        return None;
    }
    // The call site first, while nothing of the call is known: the verifier
    // checks the walk once. Walked after the syscall was told apart, it was
    // checked once per call (each a constant of its own path), and the
    // program passed the 1M-instruction limit on 6.1 and 6.12. The program
    // is attached to the family's syscalls only, so no walk is wasted.
    // Syscalls are far rarer than faults: every call site is taken.
    let user_stack = if config().stack_mode & STACK_USER != 0 { user_stack_id(ctx) } else { STACK_ID_NONE };
    let nr = tp_fixed!(ctx, SysEnterNr: i32);
    let (call, n) = if lock { lock_call_of(nr)? } else { call_of(nr)? };
    // SAFETY: the record lies in the kernel's per-CPU trace buffer, which
    // extends past the shortest record; a failed read leaves zeros.
    let mut a: [u64; 6] =
        unsafe { bpf_probe_read_kernel(ctx.as_ptr().cast::<u8>().add(ARG0).cast::<[u64; 6]>()) }.unwrap_or([0; 6]);
    for (i, v) in a.iter_mut().enumerate() {
        if i >= n {
            *v = 0;
        }
    }
    if lock {
        enter_lock(pid_tgid, call, a, user_stack);
    } else {
        enter(pid_tgid, call, a, user_stack);
    }
    Some(())
}

/// `enter` for a locking call: the same count, call-site stack and bracket;
/// no address-space generation (locking changes no mapping). Apart from
/// `enter` so the family's program stays as the verifier accepted it.
fn enter_lock(pid_tgid: u64, call: MmCall, a: [u64; 6], user_stack: i32) {
    let tgid = (pid_tgid >> 32) as u32;
    if let Some(m) = mm_stats(tgid) {
        if let Some(c) = m.calls.get_mut(call as usize) {
            *c += 1;
        }
    }
    if let Some(c) = mm_stack_counts(&stack_key(tgid, call as u32, user_stack)) {
        c.calls += 1;
    }
    // SAFETY: no preconditions.
    let start_ns = unsafe { bpf_ktime_get_ns() };
    mm_begin(pid_tgid as u32, &MmInflight { call: call as u32, user_stack, args: a, gen: 0, _pad: 0, start_ns });
}

#[tracepoint(category = "syscalls", name = "sys_exit_mmap")]
pub fn tp_syscalls_sys_exit(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit(&ctx);
    0
}
