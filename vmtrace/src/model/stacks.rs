//! Call stacks as the outputs see them: the `stacks` section of
//! summary.json, and the symbolized mmap/TLB call sites behind `mmap.folded`
//! and `shootdowns.folded`.
use serde::{Deserialize, Serialize};

/// The `stacks` section of summary.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StacksSummary {
    pub mode: String,
    /// One fault in N had its stack taken; folded weights are scaled by N.
    pub sample_period: u32,
    /// Faults whose stack was taken.
    pub sampled_faults: u64,
    /// Of those: slow faults (slept, or a huge page), every one of which has
    /// its stack; the rest stand for the faults of no stack.
    #[serde(default)]
    pub exact_faults: u64,
    pub distinct_stacks: u64,
    /// Sampled stacks lost (their faults still count): `lost_not_stored` +
    /// `lost_not_counted`.
    pub lost: u64,
    /// Stacks the programs could not store: `USER_STACKS` full within one
    /// 100 ms drain, the kernel's stack map (kernel stacks, 32-bit tasks)
    /// full, or a user stack unreadable.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_not_stored: u64,
    /// Stacks not counted: `FAULT_STACKS` full within one drain.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_not_counted: u64,
    /// Faults counted under a stack id that two stacks came to share
    /// across a drain (see vmtrace/src/stacks/drain.rs): shown under the first.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared_id_faults: u64,
    /// Distinct user stacks moved out of the kernel map and still held at
    /// the end (those of released processes, and those nothing referred
    /// to any more, were let go while recording).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub drained_stacks: usize,
    /// Drained stacks let go while recording because nothing referred to
    /// them any more (`stacks::drain::Drained::sweep`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub swept_stacks: u64,
    /// Of `drained_stacks`, those of processes alive at the end (counted
    /// for them, their call sites or the owners of their resident pages):
    /// the rest are exited processes' not yet let go.
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub drained_stacks_of_live: usize,
    /// Keys of live processes whose drained counts were sealed while
    /// recording: symbolized once no count had come for 5 s, and added to
    /// the process's sealed stacks (`collect::symbols::Sealed`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sealed_keys: u64,
    /// Drained stacks let go once their keys were sealed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sealed_stacks: u64,
    /// Distinct sealed stacks held at the end (at most 2,048 a process:
    /// past that, the lightest add into a `[lighter stacks]` one).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub sealed_shapes: usize,
    /// Share of sampled user stacks with at most two frames: a sign of code
    /// built without frame pointers.
    pub shallow_user_stacks_pct: f64,
    /// Share of sampled user stacks cut where their frame chain left
    /// executable memory: code built without frame pointers.
    #[serde(default)]
    pub broken_chain_pct: f64,
    /// Sampled faults whose user stack was unwound (from a copy of the stack,
    /// with the objects' call-frame information) up to a thread root
    /// (`_start`, `clone3`/`start_thread`).
    #[serde(default)]
    pub reached_root: u64,
    /// `reached_root` as a share (%) of the sampled faults with a user stack.
    #[serde(default)]
    pub reached_root_pct: f64,
    /// Sampled faults whose user stack was cut, by why: `window_exhausted`
    /// (deeper than `--stack-window`), `jit_code` / `no_unwind_info` / `vdso`
    /// (code without unwind information), `left_code`, `unmapped_code`,
    /// `unwind_error`, `too_many_frames`, `frame_chain_broken` (frame
    /// pointers only, the chain ran into data).
    #[serde(default)]
    pub cut: std::collections::BTreeMap<String, u64>,
    /// Sampled faults whose user stack came from frame pointers alone and
    /// looks whole: a chain that ended at a zero frame pointer, or one whose
    /// copy was not made (`--stack-window 0`, ring full: `drops.stack_samples`).
    #[serde(default)]
    pub frame_pointer_only: u64,
    /// Copied user stacks unwound in userspace.
    #[serde(default)]
    pub unwound_samples: u64,
    /// Sampled faults whose user stack has Python frames.
    #[serde(default)]
    pub python_faults: u64,
    /// `python_faults` as a share (%) of the sampled faults with a user stack.
    #[serde(default)]
    pub python_pct: f64,
    /// Sampled faults whose user stack has a Python frame that could not be
    /// named: `[python code freed]` (its code object was freed, and another
    /// took its address, before vmtrace read it) or `[unknown python]`
    /// (unreadable: the process was gone).
    #[serde(default)]
    pub python_unnamed_faults: u64,
    /// Sampled faults whose Python walk was cut short (`PY_TRUNCATED`: the
    /// thread ran more frames than the kernel's walk reads, or a frame could
    /// not be read at the fault); `[python truncated]` stands for the outer
    /// frames: the innermost frames and lines are right, the callers missing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub python_truncated_faults: u64,
    /// Code objects seen in stacks that were freed before they were read
    /// (each named `[python code freed]`).
    #[serde(default)]
    pub python_codes_freed: u64,
    /// Code objects seen in stacks that could not be read (`[unknown python]`).
    #[serde(default)]
    pub python_codes_unreadable: u64,
    /// Pythons seen whose version vmtrace has no structure offsets for:
    /// their stacks are native only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python_native_only: Vec<String>,
    pub files: Vec<String>,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)] // as above
fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

/// The outermost frame of a stack whose frame chain broke.
pub const BROKEN_CHAIN: &str = "[frame chain broken]";

/// mmap/TLB call-site stacks, symbolized, for `mmap.folded` and `shootdowns.folded`.
pub struct MmSite {
    pub pid: u32,
    pub comm: String,
    /// Kept once per distinct frame and stack (`symbolize::Names`): a
    /// `record -a` under process churn ends with tens of thousands of
    /// sites of a few hundred Python start-ups.
    pub frames: crate::stacks::Frames,
    pub calls: u64,
    pub ipis: u64,
}
