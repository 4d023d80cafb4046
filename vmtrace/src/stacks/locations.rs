//! The code location of a stack (`model::CodeLocations`): its innermost
//! Python line, else its innermost native frame of the program's own code.
use crate::hash::HashMap;

use super::{flamegraph::Weight, Stack};
use crate::model::{locations::location, CodeLocation, CodeLocations};

/// The top locations of `stacks` by `weight` (each stack's estimate).
pub fn top(stacks: &[Stack], weight: Weight, limit: usize) -> Vec<CodeLocation> {
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

/// The three lists of a recording: faults' stacks by time and count, and
/// the resident stacks at each process's peak by bytes.
pub fn code_locations(faults: &[Stack], resident_peak: Option<&[Stack]>) -> CodeLocations {
    CodeLocations {
        by_fault_time: top(faults, Weight::TimeNs, CodeLocations::TOP),
        by_faults: top(faults, Weight::Faults, CodeLocations::TOP),
        by_resident: resident_peak.map_or_else(Vec::new, |r| top(r, Weight::Faults, CodeLocations::TOP)),
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
}
