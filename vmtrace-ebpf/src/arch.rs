//! What differs between the architectures the programs are built for
//! (`bpf_target_arch`, set by aya-build from the userspace target): where a
//! task's user registers sit in `struct pt_regs`, what marks a 32-bit task,
//! the syscall number's slot and the write-family syscall numbers.
//! Everything else in the programs is the same on x86-64 and arm64.
use aya_ebpf::helpers::{bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs};

/// The current task's user-mode registers, saved at kernel entry.
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer (rbp; x29 on arm64).
    pub fp: u64,
    /// The link register (x30 on arm64: a leaf function's return address);
    /// 0 on x86-64, where every call pushes it.
    pub lr: u64,
    /// A 64-bit task (the frame-pointer walk reads 8-byte frames).
    pub is64: bool,
}

/// The current task's user registers, through the BTF pointer
/// `bpf_task_pt_regs` returns: the verifier makes the loads fault-safe,
/// without a `bpf_probe_read_kernel` call each.
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
pub fn user_regs() -> UserRegs {
    use aya_ebpf::bindings::pt_regs;
    /// x86-64 user code segment selector (`__USER_CS`): any other is a 32-bit task.
    const USER_CS_64: u64 = 0x33;
    // SAFETY: the current task is valid for the program's run; its user-mode
    // registers are at the top of its kernel stack (BTF pointer).
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
        UserRegs {
            ip: core::ptr::read_volatile(&raw const (*regs).rip),
            sp: core::ptr::read_volatile(&raw const (*regs).rsp),
            fp: core::ptr::read_volatile(&raw const (*regs).rbp),
            lr: 0,
            is64: core::ptr::read_volatile(&raw const (*regs).cs) & 0xffff == USER_CS_64,
        }
    }
}

/// arm64: `struct pt_regs` begins with `struct user_pt_regs` (x0..x30, sp,
/// pc, pstate); x29 is the frame pointer; pstate's M[4] (`PSR_MODE32_BIT`)
/// marks an AArch32 task.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub fn user_regs() -> UserRegs {
    use aya_ebpf::bindings::user_pt_regs;
    const PSR_MODE32_BIT: u64 = 0x10;
    // SAFETY: as on x86-64; user_pt_regs is the head of the kernel's pt_regs.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const user_pt_regs;
        UserRegs {
            ip: core::ptr::read_volatile(&raw const (*regs).pc),
            sp: core::ptr::read_volatile(&raw const (*regs).sp),
            fp: core::ptr::read_volatile(&raw const (*regs).regs[29]),
            lr: core::ptr::read_volatile(&raw const (*regs).regs[30]),
            is64: core::ptr::read_volatile(&raw const (*regs).pstate) & PSR_MODE32_BIT == 0,
        }
    }
}

/// Byte offset of the syscall number in `struct pt_regs`, and its width.
/// x86-64: `orig_ax`, the 16th 8-byte slot. arm64: `syscallno` (s32) after
/// user_pt_regs (34 × 8 bytes) and `orig_x0`.
#[cfg(not(bpf_target_arch = "aarch64"))]
const SYSCALL_NR: usize = 15 * 8;
#[cfg(bpf_target_arch = "aarch64")]
const SYSCALL_NR: usize = 35 * 8;

/// write, pwrite64, writev, pwritev, pwritev2 (x86-64 numbers).
#[cfg(not(bpf_target_arch = "aarch64"))]
const WRITE_SYSCALLS: [i64; 5] = [1, 18, 20, 296, 328];
/// write, writev, pwrite64, pwritev, pwritev2 (asm-generic numbers).
#[cfg(bpf_target_arch = "aarch64")]
const WRITE_SYSCALLS: [i64; 5] = [64, 66, 68, 70, 287];

/// Whether the current task is in a syscall that writes file data from a
/// buffer, by the syscall number its entry saved in its user registers.
#[inline(always)]
pub fn in_write_syscall() -> bool {
    // SAFETY: no preconditions (the helper wants the trusted BTF pointer of
    // the task, not bpf_get_current_task's scalar); the registers are only
    // read through bpf_probe_read_kernel.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    if regs.is_null() {
        return false;
    }
    // SAFETY: a kernel address read with the checked helper.
    let nr = unsafe { bpf_probe_read_kernel(regs.wrapping_add(SYSCALL_NR).cast::<i64>()) }.unwrap_or(-1);
    // arm64's syscallno is an s32 (followed by padding): the low half.
    #[cfg(bpf_target_arch = "aarch64")]
    let nr = i64::from(nr as i32);
    let [a, b, c, d, e] = WRITE_SYSCALLS;
    nr == a || nr == b || nr == c || nr == d || nr == e
}

/// Whether a frame-pointer chain whose first return address is `first_ret`
/// can hold every frame (arm64 only: on x86-64 a call pushes its return
/// address, so the chain misses nothing it can see, and `stacks::walk` has
/// no such term there). A leaf function (no frame record) keeps its return
/// address in x30 only, and a chain through x29 passes over its caller (code
/// built `-O2 -fomit-frame-pointer` leaves x29 at libc's last frame record, a
/// chain that looks whole); trust it only where x30 is the chain's first
/// return address, else userspace unwinds a copy.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
pub const fn chain_holds_leaf(lr: u64, first_ret: u64) -> bool {
    lr == first_ret
}
