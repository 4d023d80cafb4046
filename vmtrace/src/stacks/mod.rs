//! Call stacks of faults: the kernel aggregates counts per (process, user
//! stack, kernel stack); here they are symbolized and written as folded stacks
//! and flamegraphs (`faults`, `fault-time`, `major-faults`).
pub mod drain;
pub mod flamegraph;
pub mod locations;
pub mod native;
pub mod objects;
pub mod symbolize;
pub mod tree;
pub mod unwind;
pub mod weight;

use serde::{Deserialize, Serialize};

use crate::model::BROKEN_CHAIN;
use vmtrace_common::{StackCounts, StackKey};

/// Which stacks `--stacks` collects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StackMode {
    User,
    Kernel,
    Both,
    None,
}

impl StackMode {
    pub fn bits(self) -> u32 {
        match self {
            Self::User => vmtrace_common::STACK_USER,
            Self::Kernel => vmtrace_common::STACK_KERNEL,
            Self::Both => vmtrace_common::STACK_USER | vmtrace_common::STACK_KERNEL,
            Self::None => 0,
        }
    }
}

/// A frame's name, kept once per distinct name (`symbolize::Names::intern`)
/// and shared by every stack that shows it.
pub type Frame = std::sync::Arc<str>;

/// The frames of one stack, outermost first, kept once per distinct
/// sequence (`symbolize::Names::intern_frames`) and shared by every stack
/// that shows it: a fork worker's stacks are its parent's and its siblings'
/// (one per process, sampling stratum and leaf), so a job with hundreds of
/// thousands of stack keys keeps one sequence per distinct stack.
pub type Frames = std::sync::Arc<[Frame]>;

/// One aggregated stack, symbolized: frames outermost first.
#[derive(Clone, Debug, Default, PartialEq)]
#[allow(clippy::struct_excessive_bools, reason = "independent facts about one stack, each read on its own")]
pub struct Stack {
    pub pid: u32,
    pub comm: String,
    pub user: Frames,
    pub kernel: Vec<Frame>,
    pub counts: StackCounts,
    /// The user stack could not be read (no frame pointers past a frame, or none at all).
    pub user_missing: bool,
    /// The frame chain left executable memory: its outer frames were dropped
    /// and `user` starts with `BROKEN_CHAIN` (see `plausible_len`).
    pub user_cut: bool,
    /// How the user stack was found: `None` by frame pointers alone, else
    /// unwound from a copied stack, `Some(None)` up to a thread root,
    /// `Some(Some(why))` cut (`native::Cut::reason`).
    pub unwound: Option<Option<&'static str>>,
    /// The faulting memory region, with `--leaf region`.
    pub leaf: Option<String>,
    /// `vmtrace_common::STRATUM_*`: how its faults were chosen.
    pub stratum: u32,
    /// What it stands for in its process (`weight::weigh`).
    pub estimate: weight::Estimate,
    /// Python frames were spliced into `user`.
    pub python: bool,
    /// One of them could not be named (`python::code::FREED`, `UNKNOWN`).
    pub python_unnamed: bool,
}

/// The leaf frame naming the region that holds `addr`: in the last map read
/// of the process, else among the regions its mapping events announced
/// (newest first), which covers mappings gone by the end.
pub fn region_leaf(maps: &[crate::procmaps::Region], mapped: &crate::procmaps::MappedRegions, addr: u64) -> String {
    let found = crate::procmaps::find(maps, addr).or_else(|| mapped.find(addr));
    match found {
        Some(r) => match &r.path {
            Some(p) if p.starts_with('/') => format!("[file {p}]"),
            Some(p) => p.to_string(),
            None => format!("[{:?} {:#x}-{:#x}]", r.kind, r.start, r.end).to_lowercase(),
        },
        None => "[unmapped region]".into(),
    }
}

/// How much of a user stack (innermost first) to keep. A frame-pointer walk
/// through code built without frame pointers reads data as return addresses,
/// and every frame past the first such one came through a broken link: a
/// return address must lie in executable memory, as the process's map or its
/// mapping events show it, or in JIT code. The innermost address (where the
/// fault or the call happened) is always kept; without any map, everything is.
pub fn plausible_len(
    ips: &[u64],
    maps: &[crate::procmaps::Region],
    mapped: &crate::procmaps::MappedRegions,
    jit: Option<&symbolize::PerfMap>,
) -> usize {
    if maps.is_empty() && mapped.is_empty() {
        return ips.len();
    }
    // A return address follows its call: the call itself may end a mapping.
    let in_code = |a: u64| {
        let a = a.wrapping_sub(1);
        crate::procmaps::find(maps, a).or_else(|| mapped.find(a)).is_some_and(|r| r.perms.contains('x'))
            || jit.is_some_and(|j| j.find(a).is_some())
    };
    ips.iter().skip(1).position(|&a| !in_code(a)).map_or(ips.len(), |i| i + 1)
}

/// A user stack's frames (innermost first in `ips`), outermost first, cut
/// where the chain broke (`plausible_len`), under `BROKEN_CHAIN` then; and
/// whether it was cut. Names come from `names` (prepared for `ips`).
pub fn user_frames(
    ips: &[u64],
    names: &symbolize::Names,
    maps: &[crate::procmaps::Region],
    mapped: &crate::procmaps::MappedRegions,
    jit: Option<&symbolize::PerfMap>,
) -> (Vec<Frame>, bool) {
    let keep = plausible_len(ips, maps, mapped, jit);
    let cut = keep < ips.len();
    let frames = cut.then(|| names.intern(BROKEN_CHAIN)).into_iter();
    (frames.chain(ips[..keep].iter().enumerate().rev().map(|(i, &a)| name(names, i, a, maps, jit))).collect(), cut)
}

/// The frame of `ips[i]` (innermost first): the instruction pointer as it
/// is, a return address by its call (`Names::caller`).
fn name(
    names: &symbolize::Names,
    i: usize,
    a: u64,
    maps: &[crate::procmaps::Region],
    jit: Option<&symbolize::PerfMap>,
) -> Frame {
    if i == 0 {
        names.user(a, maps, jit)
    } else {
        names.caller(a, maps, jit)
    }
}

/// The addresses `Names::prepare_user` must name for a stack `ips`
/// (innermost first): its instruction pointer, and each return address's
/// call (`Names::caller`).
pub fn lookup_addrs(ips: &[u64]) -> impl Iterator<Item = u64> + '_ {
    ips.iter().enumerate().map(|(i, &a)| if i == 0 { a } else { a.wrapping_sub(1) })
}

/// Functions that begin a thread's stack: a program's entry (`_start`, or
/// ld.so's before it), and glibc's thread start.
const THREAD_ROOTS: [&str; 6] = ["_start", "_dl_start_user", "clone3", "__clone3", "clone", "start_thread"];

/// An unwound user stack's frames (innermost first in `ips`), outermost
/// first, under the marker of its cut if it did not reach a thread root; and
/// why it was cut. A walk that went on past a thread root (an entry point
/// whose CFI does not end the stack: framehop tries frame pointers there)
/// reached it all the same.
pub fn native_frames(
    ips: &[u64],
    cut: Option<&native::Cut>,
    names: &symbolize::Names,
    maps: &[crate::procmaps::Region],
    jit: Option<&symbolize::PerfMap>,
) -> (Vec<Frame>, Option<&'static str>) {
    let named: Vec<Frame> = ips.iter().enumerate().rev().map(|(i, &a)| name(names, i, a, maps, jit)).collect();
    let at_root = named.first().is_some_and(|f| THREAD_ROOTS.contains(&&**f));
    let cut = cut.filter(|_| !at_root);
    let marker = cut.map(|c| names.intern(&c.marker)).into_iter();
    (marker.chain(named).collect(), cut.map(|c| c.reason))
}

/// How the sampled faults' user stacks ended, for summary.json's `stacks`:
/// faults whose stack was unwound to a thread root, cut (by why), and found
/// by frame pointers alone (whole chains, or samples not copied).
pub fn endings(stacks: &[Stack]) -> (u64, std::collections::BTreeMap<String, u64>, u64) {
    let (mut root, mut cut, mut fp) = (0, std::collections::BTreeMap::new(), 0);
    for s in stacks {
        match s.unwound {
            Some(None) => root += s.counts.faults,
            Some(Some(why)) => *cut.entry(why.to_string()).or_insert(0) += s.counts.faults,
            None if s.user_cut => *cut.entry("frame_chain_broken".to_string()).or_insert(0) += s.counts.faults,
            None if !s.user.is_empty() => fp += s.counts.faults,
            None => {}
        }
    }
    (root, cut, fp)
}

/// Share of stacks (by faults) whose user part was cut at a broken frame chain.
pub fn broken_pct(stacks: &[Stack]) -> f64 {
    pct_of_faults(stacks, |s| !s.user.is_empty(), |s| s.user_cut)
}

/// Share of user stacks (by faults) unwound up to a thread root.
pub fn reached_root_pct(stacks: &[Stack]) -> f64 {
    pct_of_faults(stacks, |s| !s.user.is_empty() || s.user_missing, |s| s.unwound == Some(None))
}

/// Share of user stacks (by faults) with at least one Python frame.
pub fn python_pct(stacks: &[Stack]) -> f64 {
    pct_of_faults(stacks, |s| !s.user.is_empty() || s.user_missing, |s| s.python)
}

/// Faults of the stacks whose Python walk was cut short (`[python truncated]`).
pub fn python_truncated_faults(stacks: &[Stack]) -> u64 {
    stacks
        .iter()
        .filter(|s| s.python && s.user.iter().any(|f| &**f == crate::python::TRUNCATED))
        .map(|s| s.counts.faults)
        .sum()
}

/// Of the stacks that pass `counted`, the share (in %, by faults) that pass `hit`.
fn pct_of_faults(stacks: &[Stack], counted: impl Fn(&Stack) -> bool, hit: impl Fn(&Stack) -> bool) -> f64 {
    let (mut hits, mut all) = (0u64, 0u64);
    for s in stacks.iter().filter(|s| counted(s)) {
        all += s.counts.faults;
        if hit(s) {
            hits += s.counts.faults;
        }
    }
    if all == 0 {
        0.0
    } else {
        hits as f64 * 100.0 / all as f64
    }
}

/// Raw stack ids to look up and the counts of each key.
pub type RawStacks = Vec<(StackKey, StackCounts)>;

/// Share of user stacks that are at most two frames deep. Stacks that were
/// not stored (`user_missing`) say nothing of frame pointers and are left out.
pub fn shallow_pct(stacks: &[Stack]) -> f64 {
    pct_of_faults(stacks, |s| !s.user.is_empty() && !s.user_missing, |s| s.user.len() <= 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::RegionKind,
        procmaps::{MappedRegions, Region},
    };

    fn region(start: u64, end: u64, perms: &str, kind: RegionKind) -> Region {
        Region { start, end, perms: perms.into(), offset: 0, kind, path: None }
    }

    fn maps() -> Vec<Region> {
        vec![
            region(0x1000, 0x2000, "r-xp", RegionKind::File),
            region(0x2000, 0x3000, "rw-p", RegionKind::File),
            region(0x10000, 0x20000, "rw-p", RegionKind::Stack),
        ]
    }

    #[test]
    fn a_chain_is_cut_at_its_first_return_address_outside_code() {
        let none = MappedRegions::default();
        // Leaf, two callers in code, then a stack address read as a return address.
        assert_eq!(plausible_len(&[0x1100, 0x1200, 0x1300, 0x10040, 0x1400], &maps(), &none, None), 3);
        // Small integers, as a walk through data reads them.
        assert_eq!(plausible_len(&[0x1100, 0x7], &maps(), &none, None), 1);
        assert_eq!(plausible_len(&[0x1100, 0x1200], &maps(), &none, None), 2);
    }

    #[test]
    fn the_leaf_is_kept_and_a_call_may_end_its_mapping() {
        let none = MappedRegions::default();
        // The faulting instruction is never judged; a return address just past
        // the end of the code follows a call that was its last instruction.
        assert_eq!(plausible_len(&[0x10040, 0x2000], &maps(), &none, None), 2);
    }

    #[test]
    fn endings_count_roots_cuts_and_frame_pointer_stacks_by_faults() {
        let s = |unwound, user_cut, faults| Stack {
            user: vec!["main".into()].into(),
            unwound,
            user_cut,
            counts: StackCounts { faults, ..Default::default() },
            ..Stack::default()
        };
        let stacks =
            [s(Some(None), false, 5), s(Some(Some("window_exhausted")), true, 2), s(None, true, 3), s(None, false, 7)];
        let (root, cut, fp) = endings(&stacks);
        assert_eq!((root, fp), (5, 7));
        assert_eq!(cut.get("window_exhausted"), Some(&2));
        assert_eq!(cut.get("frame_chain_broken"), Some(&3));
    }

    #[test]
    fn mapping_events_and_jit_code_count_as_code_and_no_map_cuts_nothing() {
        let mut mapped = MappedRegions::default();
        mapped.insert(region(0x50000, 0x60000, "r-xp", RegionKind::File));
        let jit = symbolize::PerfMap::parse("70000 100 jitted\n");
        assert_eq!(plausible_len(&[0x1100, 0x50010, 0x70010, 0x9], &maps(), &mapped, Some(&jit)), 3);
        assert_eq!(plausible_len(&[0x1100, 0x9, 0x8], &[], &MappedRegions::default(), None), 3);
    }
}
