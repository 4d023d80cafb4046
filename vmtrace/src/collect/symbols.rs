//! Names for addresses: the memory maps of traced processes, kept fresh while
//! they live, and the symbolization of fault stacks, mmap call sites and
//! storm culprits from them.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use vmtrace_common::{StackCounts, StackKey, LEAF_BLOCK_SHIFT, MM_CALL_NAMES, STACK_ID_LOST};

use super::{process::ProcessTable, source::AggregateSource, storms::RawStorm, MmSite};
use crate::{
    model::Storm,
    stacks::{
        self,
        symbolize::{Names, PerfMap},
        Stack,
    },
};

/// How often memory maps of live processes are re-read (symbolization,
/// changes to the address space no event reports).
const MAPS_REFRESH: Duration = Duration::from_secs(1);
/// Processes younger than this have their maps re-read on every poll.
const YOUNG: Duration = Duration::from_secs(2);

/// When the maps of all live processes were last re-read.
pub struct MapsRefresh {
    last: Instant,
}

impl MapsRefresh {
    pub fn new(now: Instant) -> Self {
        Self { last: now }
    }

    /// Re-reads the maps of live traced processes: libraries load after exec,
    /// so young processes are re-read on every poll, older ones every second.
    /// `gen_of`: a process's address-space generation (for region history).
    pub fn run(&mut self, now: Instant, table: &mut ProcessTable, gen_of: &dyn Fn(u32) -> Option<u32>) {
        let all_due = now.saturating_duration_since(self.last) >= MAPS_REFRESH;
        if all_due {
            self.last = now;
        }
        let due: Vec<u32> = table
            .procs
            .iter()
            .filter(|(_, p)| p.exit_code.is_none() && (all_due || now.saturating_duration_since(p.first_seen) < YOUNG))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            table.snapshot_maps_at(pid, gen_of);
        }
    }
}

/// Reads `pid`'s maps unless some are known already.
fn ensure_maps(table: &mut ProcessTable, pid: u32) {
    if table.procs.get(&pid).is_none_or(|p| p.maps.is_empty()) {
        table.snapshot_maps(pid);
    }
}

/// One aggregated stack before symbolization: key, counts, user and kernel IPs.
type RawStack = (StackKey, StackCounts, Vec<u64>, Vec<u64>);

/// Symbolizes the in-kernel stack aggregate.
pub fn build_stacks(table: &mut ProcessTable, source: &impl AggregateSource) -> Vec<Stack> {
    let raw = source.all_stack_counts();
    let mut names = Names::default();
    let mut out = Vec::new();
    let mut by_pid: HashMap<u32, Vec<RawStack>> = HashMap::new();
    for (k, c) in raw {
        let user = if k.user_stack >= 0 { source.user_stack_ips(k.user_stack).unwrap_or_default() } else { vec![] };
        let kernel = if k.kernel_stack >= 0 { source.stack_ips(k.kernel_stack).unwrap_or_default() } else { vec![] };
        by_pid.entry(k.tgid).or_default().push((k, c, user, kernel));
    }
    for (pid, entries) in by_pid {
        ensure_maps(table, pid);
        let info = table.ensure(pid).clone();
        let jit = PerfMap::read(pid);
        let all_user: Vec<u64> = entries.iter().flat_map(|e| e.2.iter().copied()).collect();
        names.prepare_user(&all_user, &info.maps);
        let all_kernel: Vec<u64> = entries.iter().flat_map(|e| e.3.iter().copied()).collect();
        names.prepare_kernel(&all_kernel);
        for (k, counts, user, kernel) in entries {
            let (user, user_cut) = stacks::user_frames(&user, &names, &info.maps, &info.mapped, jit.as_ref());
            out.push(Stack {
                pid,
                comm: info.comm.clone(),
                user,
                kernel: kernel.iter().rev().map(|&a| names.kernel(a)).collect(),
                counts,
                stratum: k.stratum,
                estimate: stacks::weight::Estimate::default(),
                user_missing: k.user_stack == STACK_ID_LOST,
                user_cut,
                leaf: (k.leaf_block != 0).then(|| {
                    let a = k.leaf_block << LEAF_BLOCK_SHIFT;
                    let end = a + (1 << LEAF_BLOCK_SHIFT) - 1;
                    // A region may start inside the block: try its last byte too.
                    let leaf = stacks::region_leaf(&info.maps, &info.mapped, a);
                    if leaf == "[unmapped region]" {
                        stacks::region_leaf(&info.maps, &info.mapped, end)
                    } else {
                        leaf
                    }
                }),
            });
        }
    }
    out
}

/// Frames of a call site, outermost first, the syscall as leaf.
pub fn site_frames(
    table: &mut ProcessTable,
    source: &impl AggregateSource,
    names: &mut Names,
    tgid: u32,
    call: u32,
    user_stack: i32,
) -> Vec<String> {
    ensure_maps(table, tgid);
    let ips = if user_stack >= 0 { source.user_stack_ips(user_stack).unwrap_or_default() } else { vec![] };
    let info = table.ensure(tgid);
    names.prepare_user(&ips, &info.maps);
    let (mut frames, _) = stacks::user_frames(&ips, names, &info.maps, &info.mapped, None);
    if user_stack == STACK_ID_LOST {
        frames.push("[no user stack]".into());
    }
    frames.push(format!("[{}]", call_name(call)));
    frames
}

fn call_name(call: u32) -> &'static str {
    MM_CALL_NAMES.get(call as usize).copied().unwrap_or("?")
}

/// Call sites of mmap-family syscalls, symbolized, with calls and IPIs sent.
pub fn build_mm_sites(table: &mut ProcessTable, source: &impl AggregateSource) -> Vec<MmSite> {
    let raw = source.all_mm_stacks();
    let mut names = Names::default();
    let mut out = Vec::new();
    for (k, c) in raw {
        let frames = site_frames(table, source, &mut names, k.tgid, k.call, k.user_stack);
        let comm = table.ensure(k.tgid).comm.clone();
        out.push(MmSite { comm, frames, calls: c.calls, ipis: c.ipis });
    }
    out
}

/// Storms as summary.json reports them: each with its busiest call site.
pub fn name_storms(table: &mut ProcessTable, source: &impl AggregateSource, raw: Vec<RawStorm>) -> Vec<Storm> {
    let mut names = Names::default();
    raw.into_iter()
        .map(|s| {
            let top = s.sites.iter().max_by_key(|(_, n)| **n).map(|(site, n)| (*site, *n));
            let (top_stack, top_call, top_share) = match top {
                Some(((call, stack), n)) => (
                    site_frames(table, source, &mut names, s.pid, call, stack),
                    call_name(call).to_string(),
                    // Call-site and process totals are read a moment apart.
                    (n as f64 / s.ipis.max(1) as f64).min(1.0),
                ),
                None => (Vec::new(), "other".into(), 0.0),
            };
            Storm {
                pid: s.pid,
                comm: table.ensure(s.pid).comm.clone(),
                start_s: s.start_s,
                end_s: s.end_s,
                peak_per_s: s.peak_per_s.round() as u64,
                shootdowns: s.ipis,
                top_stack,
                top_call,
                top_share,
            }
        })
        .collect()
}
