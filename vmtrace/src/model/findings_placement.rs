//! Findings on where memory sits: locked and pinned memory (`pinned`) and
//! NUMA placement (`numa`). A child of `findings.rs`: the same helpers, the
//! thresholds written in docs/findings.md.
use super::{bytes, ev, finding, pct, Finding, Summary};

/// A locked or pinned pool of at least this many bytes…
pub const PINNED_MIN_BYTES: u64 = 64 << 20;
/// …at least this many times the rest of the process's resident memory
/// (what it otherwise holds, read in the same /proc read).
pub const PINNED_OVER_REST: f64 = 4.0;

/// A process with at least this many sampled pages whose node was read…
pub const NUMA_MIN_SAMPLED: u64 = 256;
/// …of which at least this share was placed off the faulting CPU's node.
pub const NUMA_REMOTE_SHARE: f64 = 0.5;

/// NUMA balancing moved at least this many pages in a process's threads…
pub const NUMA_CHURN_MIN_PAGES: u64 = 4096;
/// …at least this many times what it held at its peak: its pages moved back
/// and forth (or followed threads that kept changing nodes).
pub const NUMA_CHURN_OVER_RESIDENT: f64 = 2.0;

pub(super) fn run(s: &Summary, out: &mut Vec<Finding>) {
    memlock_limit(s, out);
    pinned_pool(s, out);
    numa_remote(s, out);
    numa_churn(s, out);
}

/// A process whose pages NUMA balancing kept moving: more pages migrated
/// than it ever held, several times over.
fn numa_churn(s: &Summary, out: &mut Vec<Finding>) {
    for p in s.processes.iter().filter(|p| p.pid != crate::model::OTHER_PID) {
        let moved = p.migration.numa_balancing();
        if moved < NUMA_CHURN_MIN_PAGES {
            continue;
        }
        // What it held at most: the kernel's peak, else its last numa_maps read.
        let held = p.resident.as_ref().map(|r| r.peak_bytes / 4096).or_else(|| {
            let n = s.numa.as_ref()?.processes.iter().find(|q| q.pid == p.pid)?;
            Some(n.pages_by_node.values().sum())
        });
        let Some(held) = held.filter(|h| *h > 0) else { continue };
        if (moved as f64) < NUMA_CHURN_OVER_RESIDENT * held as f64 {
            continue;
        }
        let mut f = finding(
            s,
            "numa_migration_churn",
            p.pid,
            format!(
                "NUMA balancing migrated {} pages ({}) in its threads, {:.1}× the {} it held at most: its memory moved \
                 back and forth between nodes, {} spent in migration{}.",
                moved,
                bytes(moved * 4096),
                moved as f64 / held as f64,
                bytes(held * 4096),
                super::fmt_ns(p.migration.time_ns),
                if p.migration.numa_moves > 0 {
                    format!(", and its threads were moved to another node {} times", p.migration.numa_moves)
                } else {
                    String::new()
                }
            ),
            "Keep its threads and memory on one node: `numactl --cpunodebind=N --membind=N` (or `taskset` plus \
             `--preferred=N`); for threads that share memory across nodes, interleave it (`numactl --interleave=all`) \
             instead of letting NUMA balancing chase it; or turn balancing off host-wide \
             (`kernel.numa_balancing=0`)"
                .into(),
        );
        ev(&mut f, "numa_balancing_pages", moved);
        ev(&mut f, "held_pages", held);
        ev(&mut f, "migration_ns", p.migration.time_ns);
        ev(&mut f, "numa_moves", p.migration.numa_moves);
        f.expected_gain =
            Some(format!("{} of migration, and the remote accesses between moves", super::fmt_ns(p.migration.time_ns)));
        out.push(f);
    }
}

/// A locking call refused for `RLIMIT_MEMLOCK`.
fn memlock_limit(s: &Summary, out: &mut Vec<Finding>) {
    let Some(p) = &s.pinned else { return };
    let mut seen = std::collections::BTreeSet::new();
    for fl in p.failures.iter().filter(|f| f.rlimit_memlock) {
        if !seen.insert(fl.pid) {
            continue;
        }
        let refused = p.failures.iter().filter(|f| f.pid == fl.pid && f.rlimit_memlock).count();
        // The finding names the process already: the cause without it.
        let cause = fl.cause.strip_prefix(&format!("{} (pid {}) ", fl.comm, fl.pid)).unwrap_or(&fl.cause);
        let mut chars = cause.chars();
        let first = chars.next().map(|c| c.to_uppercase().to_string()).unwrap_or_default();
        let summary = format!("{first}{} ({refused} refused).", chars.as_str());
        let mut f = finding(s, "memlock_limit", fl.pid, summary, fl.fix.clone());
        if f.comm.is_empty() {
            f.comm.clone_from(&fl.comm);
        }
        ev(&mut f, "call", fl.call.clone());
        ev(&mut f, "errno", fl.errno.clone());
        ev(&mut f, "bytes_asked", fl.bytes_asked);
        ev(&mut f, "locked_bytes_before", fl.locked_bytes_before);
        ev(&mut f, "limit_soft_bytes", fl.limit_soft_bytes);
        ev(&mut f, "limit_hard_bytes", fl.limit_hard_bytes);
        ev(&mut f, "refused", refused as u64);
        if !fl.frames.is_empty() {
            f.site = Some(crate::model::oom::site_tail(&fl.frames));
        }
        f.expected_gain = Some("the call succeeds instead of failing (or the program's fallback)".into());
        out.push(f);
    }
}

/// A locked or pinned pool far above the rest of what the process holds.
fn pinned_pool(s: &Summary, out: &mut Vec<Finding>) {
    let Some(p) = &s.pinned else { return };
    for q in &p.processes {
        let pool = q.locked_bytes_peak.max(q.pinned_bytes_peak);
        let Some(rss) = q.rss_bytes_at_peak else { continue };
        let rest = rss.saturating_sub(q.locked_bytes_peak);
        if pool < PINNED_MIN_BYTES || (pool as f64) < PINNED_OVER_REST * rest.max(4096) as f64 {
            continue;
        }
        let site = p
            .sites
            .iter()
            .filter(|x| x.pid == q.pid && x.call != "munlock" && x.call != "munlockall")
            .max_by_key(|x| x.bytes);
        let mut f = finding(
            s,
            "pinned_pool_oversized",
            q.pid,
            format!(
                "{} locked or pinned at its peak, {:.0}× the {} of everything else it held: memory the kernel can \
                 neither reclaim, swap nor migrate for the whole machine.",
                bytes(pool),
                pool as f64 / rest.max(4096) as f64,
                bytes(rest)
            ),
            "Size the pool to what one step uses: lock or pin the buffers in flight, not a reserve (PyTorch: \
             `pin_memory=True` pins each batch, prefetch_factor × num_workers of them; a cudaHostAlloc/mlock pool: \
             the largest transfer; `mlockall(MCL_FUTURE)` locks every later allocation, lock the buffers that need \
             it with mlock instead)"
                .into(),
        );
        if f.comm.is_empty() {
            f.comm.clone_from(&q.comm);
        }
        ev(&mut f, "locked_bytes_peak", q.locked_bytes_peak);
        ev(&mut f, "pinned_bytes_peak", q.pinned_bytes_peak);
        ev(&mut f, "rss_bytes_at_peak", rss);
        ev(&mut f, "rest_bytes", rest);
        if let Some(site) = site {
            f.site = Some(crate::model::oom::site_tail(&site.frames));
        }
        f.expected_gain =
            Some(format!("up to {} back to the page cache and other processes", bytes(pool.saturating_sub(rest))));
        out.push(f);
    }
}

/// A process whose sampled pages landed mostly off the faulting CPU's node.
fn numa_remote(s: &Summary, out: &mut Vec<Finding>) {
    let Some(n) = &s.numa else { return };
    for p in &n.processes {
        if p.sampled_pages < NUMA_MIN_SAMPLED
            || (p.remote_first_touch as f64) < NUMA_REMOTE_SHARE * p.sampled_pages as f64
        {
            continue;
        }
        let cpu_node = p.faulting_cpu_node.iter().max_by_key(|(_, c)| **c).map(|(k, _)| k.clone()).unwrap_or_default();
        let mem_node = p.sampled_by_node.iter().max_by_key(|(_, c)| **c).map(|(k, _)| k.clone()).unwrap_or_default();
        let pol: Vec<&str> = p.policies.keys().map(String::as_str).collect();
        let mut f = finding(
            s,
            "numa_remote_memory",
            p.pid,
            format!(
                "{}% of its sampled pages ({} of {}) were placed on a node other than the faulting CPU's: it ran \
                 mostly on node {cpu_node} and its memory is mostly on node {mem_node} (policy {}); every access to \
                 them crosses the interconnect.",
                pct(p.remote_first_touch, p.sampled_pages),
                p.remote_first_touch,
                p.sampled_pages,
                pol.join(", ")
            ),
            format!(
                "Run and allocate on the same node: `numactl --cpunodebind={cpu_node} --membind={cpu_node}` (or \
                 `--cpunodebind={mem_node} --membind={mem_node}`); drop a `--membind`/`set_mempolicy` that points \
                 elsewhere; for DataLoader workers feeding a GPU, bind them to that GPU's node"
            ),
        );
        if f.comm.is_empty() {
            f.comm.clone_from(&p.comm);
        }
        ev(&mut f, "sampled_pages", p.sampled_pages);
        ev(&mut f, "remote_first_touch", p.remote_first_touch);
        // The call site that placed the most remote pages.
        if let Some(site) = n.sites.iter().filter(|t| t.pid == p.pid).max_by_key(|t| t.remote_first_touch) {
            f.site = Some(crate::model::oom::site_tail(&site.frames));
        }
        ev(&mut f, "cpu_node", cpu_node);
        ev(&mut f, "memory_node", mem_node);
        f.expected_gain = Some("remote accesses cost 1.5–3× a local one on two-socket hosts".into());
        out.push(f);
    }
}
