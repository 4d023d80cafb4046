//! The code location of a stack (`model::CodeLocations`): its innermost
//! Python line, else its innermost native frame of the program's own code.
use crate::hash::HashMap;

use super::{flamegraph::Weight, Stack};
use crate::model::{locations::location, CodeLocation, CodeLocations};

/// The top locations of `stacks` by `weight` (each stack's estimate).
pub fn top<'a>(stacks: impl IntoIterator<Item = &'a Stack>, weight: Weight, limit: usize) -> Vec<CodeLocation> {
    let value = |s: &Stack| weight.of(&s.estimate);
    let mut by: HashMap<String, (f64, HashMap<&str, f64>)> = HashMap::default();
    let mut total = 0.0;
    for s in stacks {
        let v = value(s);
        total += v;
        let Some(loc) = location(&s.user) else { continue };
        let e = by.entry(loc).or_default();
        e.0 += v;
        *e.1.entry(s.comm.as_str()).or_default() += v;
    }
    let mut out: Vec<CodeLocation> = by
        .into_iter()
        .filter(|(_, (v, _))| *v >= 0.5)
        .map(|(location, (v, comms))| CodeLocation {
            no_symbols: crate::model::locations::unsymbolized_object(&location).map(str::to_string),
            location,
            comm: comms
                .into_iter()
                .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(a.0)))
                .map_or_else(String::new, |(c, _)| c.to_string()),
            value: v.round() as u64,
            share_pct: if total > 0.0 { (v * 1000.0 / total).round() / 10.0 } else { 0.0 },
        })
        .collect();
    out.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.location.cmp(&b.location)));
    out.truncate(limit);
    out
}

/// Whether a resident stack is a fork child's pages shared with its parent.
fn shared(s: &Stack) -> bool {
    s.leaf.as_deref() == Some(crate::model::resident::SHARED_WITH_PARENT)
}

/// The three lists of a recording: faults' stacks by time and count, and
/// the resident stacks at each process's peak by bytes. A page is counted
/// once there: a fork child's pages shared with its parent are its parent's
/// (the parent's stacks hold them), so they are left out of the list and its
/// whole, and their bytes summed apart (`resident_shared_bytes`). Listed,
/// they were the same pages once per process: uc30's 568.3 MiB under
/// `CDLL.__init__`, the main process's 301.7 MiB plus its workers' 265.9.
pub fn code_locations(faults: &[Stack], resident_peak: Option<&[Stack]>) -> CodeLocations {
    let resident = resident_peak.unwrap_or_default();
    CodeLocations {
        by_fault_time: top(faults, Weight::TimeNs, CodeLocations::TOP),
        by_faults: top(faults, Weight::Faults, CodeLocations::TOP),
        by_resident: top(resident.iter().filter(|s| !shared(s)), Weight::Faults, CodeLocations::TOP),
        resident_shared_bytes: resident.iter().filter(|s| shared(s)).map(|s| s.estimate.faults).sum::<f64>().round()
            as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_python_line_else_the_programs_own_frame() {
        let py = ["_start", "main", "_PyEval_EvalFrameDefault", "load (train.py:12)", "PyList_Append", "_int_malloc"];
        assert_eq!(location(&py).as_deref(), Some("load (train.py:12)"));
        let c = ["_start", "__libc_start_main_impl", "main", "fill_round", "__memset_avx2_unaligned_erms"];
        assert_eq!(location(&c).as_deref(), Some("fill_round"));
        let rust = ["main", "vmtrace::demo::workload::touch", "core::ptr::write_volatile"];
        assert_eq!(location(&rust).as_deref(), Some("vmtrace::demo::workload::touch"));
        let alloc = ["worker", "je_malloc", "libc.so.6+0x9a3c", "[no unwind info]"];
        assert_eq!(location(&alloc).as_deref(), Some("worker"));
        let cpp =
            ["main", "at::native::(anonymous namespace)::copy_impl<float, std::allocator<float> >(at::Tensor const&)"];
        assert!(!location(&cpp).unwrap().contains("std::allocator"), "{:?}", location(&cpp));
        assert_eq!(location(&["_start", "malloc", "[truncated]"]), None);
    }

    /// A parent's pages its fork children share are counted once, in the
    /// parent's row: the children's `[shared with parent]` stacks are not
    /// added to the location (uc30: 301.7 + 265.9 = 568.3 MiB under
    /// `CDLL.__init__`), nor to the whole the shares are of; their bytes are
    /// summed apart.
    #[test]
    fn resident_pages_shared_with_a_parent_are_counted_once() {
        let mib = (1u64 << 20) as f64;
        let stack = |pid: u32, user: &[&str], leaf: Option<&str>, bytes: f64| Stack {
            pid,
            comm: "python".into(),
            user: user.iter().map(|f| std::sync::Arc::<str>::from(*f)).collect(),
            leaf: leaf.map(str::to_string),
            estimate: crate::stacks::weight::Estimate { faults: bytes, ..Default::default() },
            ..Stack::default()
        };
        let load = ["_start", "main", "__init__ (ctypes/__init__.py:379)", "dlopen"];
        let batch = ["_start", "main", "collate (worker.py:20)", "memcpy"];
        let shared = Some(crate::model::resident::SHARED_WITH_PARENT);
        let peak = vec![
            stack(100, &load, None, 301.7 * mib),
            stack(101, &load, shared, 133.0 * mib),
            stack(102, &load, shared, 132.9 * mib),
            stack(101, &batch, None, 20.0 * mib),
            stack(102, &batch, None, 20.0 * mib),
        ];
        let l = code_locations(&[], Some(&peak));
        let row = |loc: &str| l.by_resident.iter().find(|c| c.location == loc).unwrap_or_else(|| panic!("{loc}"));
        assert_eq!(row("__init__ (ctypes/__init__.py:379)").value, (301.7 * mib).round() as u64);
        assert_eq!(row("collate (worker.py:20)").value, (40.0 * mib) as u64);
        // Shares of the pages counted once: 301.7 of 341.7 MiB.
        assert!((row("__init__ (ctypes/__init__.py:379)").share_pct - 88.3).abs() < 1e-9);
        assert_eq!(l.resident_shared_bytes, (265.9 * mib).round() as u64);
        let text = l.render_text();
        assert!(text.contains("265.9 MiB of fork children's pages shared with their parent"), "{text}");
    }
}
