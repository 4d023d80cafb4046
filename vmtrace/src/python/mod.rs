//! CPython frames in user stacks: finding a process's interpreter
//! (`detect`), naming the frames the kernel recorded (`code`), and splicing
//! them into the native frames at the evaluation loop (`splice`). The
//! session's use of them (which processes to look at, when) is
//! `collect::python`.
pub mod code;
pub mod detect;

pub use code::{CodeCache, PyStack};

/// The native frame that runs Python frames: each call of it is replaced by
/// the Python frames it ran, as `py-spy --native` shows them.
const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// The frame put where a stack's Python frames were cut short: the thread
/// ran more than the kernel keeps (`PY_DEPTH`), or the walk could not read
/// further. The Python frames after it are the innermost ones; the
/// evaluation-loop frames before it ran the ones not kept.
pub const TRUNCATED: &str = "[python truncated]";

/// Splices Python frames into a native stack (both outermost first).
/// `segments`: the Python frames of each evaluation-loop call, outermost call
/// first; `truncated`: the kernel kept only the innermost frames
/// ([`vmtrace_common::PY_TRUNCATED`]), so `segments[0]` need not be the
/// thread's outermost call, nor start at its call's first frame.
///
/// Each `_PyEval_EvalFrameDefault` frame is replaced by its call's frames.
/// A complete walk pairs its calls with the evaluation frames from the
/// outermost (`segments[0]` ran in the outermost; an inner evaluation frame
/// left over is a call that has not pushed a frame yet, and goes). A
/// truncated walk, or one with more calls than the native stack shows (its
/// unwinding stopped short: it keeps the innermost frames), pairs them from
/// the innermost; the evaluation frames left outside keep their native name
/// and [`TRUNCATED`] precedes the kept frames. Calls the native stack does
/// not show go with the outermost evaluation frame it shows, or first when
/// it shows none, so a Python frame is never dropped.
pub fn splice(native: Vec<String>, segments: &[Vec<String>], truncated: bool) -> Vec<String> {
    if segments.is_empty() {
        return native;
    }
    let evals = native.iter().filter(|f| is_eval(f)).count();
    let calls = segments.len();
    let mut out = Vec::with_capacity(native.len() + segments.iter().map(Vec::len).sum::<usize>() + 1);
    let mut marker = truncated.then(|| TRUNCATED.to_string());
    if evals == 0 {
        out.extend(marker);
        out.extend(segments.iter().flatten().cloned());
        out.extend(native);
        return out;
    }
    let from_inner = truncated || evals < calls;
    // The calls the i-th evaluation frame (outermost first) ran.
    let calls_of = |i: usize| -> std::ops::Range<usize> {
        if !from_inner {
            i.min(calls)..(i + 1).min(calls)
        } else if evals >= calls {
            (i + calls).saturating_sub(evals)..(i + 1 + calls).saturating_sub(evals)
        } else {
            let unseen = calls - evals;
            if i == 0 {
                0..unseen + 1
            } else {
                i + unseen..i + unseen + 1
            }
        }
    };
    let mut i = 0;
    for f in native {
        if !is_eval(&f) {
            out.push(f);
            continue;
        }
        let ran = calls_of(i);
        i += 1;
        if ran.is_empty() {
            if from_inner {
                out.push(f);
            }
            continue;
        }
        out.extend(marker.take());
        out.extend(segments[ran].iter().flatten().cloned());
    }
    out
}

/// Whether a named frame is a Python one (`function (file:line)`).
pub fn is_python_frame(frame: &str) -> bool {
    let Some(inner) = frame.strip_suffix(')').and_then(|f| f.rsplit_once(" (")).map(|(_, loc)| loc) else {
        return false;
    };
    let file = inner.rsplit_once(':').map_or(inner, |(f, _)| f);
    std::path::Path::new(file).extension().is_some_and(|e| e.eq_ignore_ascii_case("py")) || file.starts_with('<')
}

/// The innermost Python frame of a stack (outermost first), to name a
/// culprit by the Python code behind it.
pub fn innermost_python(frames: &[String]) -> Option<&str> {
    frames.iter().rev().find(|f| is_python_frame(f)).map(String::as_str)
}

fn is_eval(frame: &str) -> bool {
    frame == EVAL_FRAME
        || frame.starts_with("_PyEval_EvalFrameDefault ")
        || frame.starts_with("_PyEval_EvalFrameDefault+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(f: &[&str]) -> Vec<String> {
        f.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn python_frames_replace_the_eval_loop() {
        let native = v(&["_start", "main", "_PyEval_EvalFrameDefault", "call", "_PyEval_EvalFrameDefault", "memset"]);
        let segs = vec![v(&["<module> (a.py:9)"]), v(&["f (a.py:2)", "g (a.py:5)"])];
        assert_eq!(
            splice(native, &segs, false),
            v(&["_start", "main", "<module> (a.py:9)", "call", "f (a.py:2)", "g (a.py:5)", "memset"])
        );
    }

    #[test]
    fn python_frames_are_told_from_native_ones() {
        let f = v(&["main", "<module> (a.py:9)", "f (<string>:2)", "g (x.py)", "array_dealloc", "[munmap]"]);
        assert_eq!(innermost_python(&f), Some("g (x.py)"));
        assert!(!is_python_frame("operator() (int)"));
        assert_eq!(innermost_python(&v(&["main", "[munmap]"])), None);
    }

    #[test]
    fn calls_the_native_stack_misses_are_kept() {
        let segs = vec![v(&["<module> (a.py:9)"]), v(&["f (a.py:2)"])];
        let native = v(&["[frame chain broken]", "memset"]);
        assert_eq!(
            splice(native, &segs, false),
            v(&["<module> (a.py:9)", "f (a.py:2)", "[frame chain broken]", "memset"])
        );
        let native = v(&["main", "_PyEval_EvalFrameDefault", "memset"]);
        assert_eq!(splice(native, &segs, false), v(&["main", "<module> (a.py:9)", "f (a.py:2)", "memset"]));
        assert_eq!(splice(v(&["main"]), &[], false), v(&["main"]));
        // A native stack cut short keeps its innermost frames: its evaluation
        // frames ran the innermost calls, and `h`'s native caller stays
        // beneath the call that made it.
        let segs = vec![v(&["<module> (a.py:9)"]), v(&["f (a.py:2)"]), v(&["g (a.py:4)"])];
        let native = v(&["[no unwind info]", "x", EVAL_FRAME, "h", EVAL_FRAME, "memset"]);
        assert_eq!(
            splice(native, &segs, false),
            v(&["[no unwind info]", "x", "<module> (a.py:9)", "f (a.py:2)", "h", "g (a.py:4)", "memset"])
        );
    }

    #[test]
    fn an_evaluation_frame_with_no_call_yet_goes() {
        // A complete walk: its first call is the outermost evaluation frame's;
        // the inner one has not pushed a frame yet (its prologue faulted).
        let native = v(&["main", EVAL_FRAME, "call", EVAL_FRAME]);
        assert_eq!(splice(native, &[v(&["<module> (a.py:9)"])], false), v(&["main", "<module> (a.py:9)", "call"]));
    }

    /// What the kernel keeps of a thread's calls (outermost first, each its
    /// Python frames outermost first): the `PY_DEPTH` innermost frames, in
    /// the calls they belong to, and whether any was left out.
    fn kept(calls: &[Vec<String>]) -> (Vec<Vec<String>>, bool) {
        let mut left = vmtrace_common::PY_DEPTH;
        let mut out = Vec::new();
        for call in calls.iter().rev() {
            if left == 0 {
                break;
            }
            let n = call.len().min(left);
            out.push(call[call.len() - n..].to_vec());
            left -= n;
        }
        out.reverse();
        let all: usize = calls.iter().map(Vec::len).sum();
        (out, all > vmtrace_common::PY_DEPTH)
    }

    /// A DataLoader worker's stack (uc28): the script's `<module>` and `main`
    /// in the outermost evaluation call, a C slot (`PyObject_GetIter`)
    /// entering `DataLoader.__iter__`, a recursion of `depth` frames beneath
    /// it, and an `exec` of one more frame that faults.
    fn deep(depth: usize) -> (Vec<String>, Vec<Vec<String>>) {
        let native = v(&[
            "_start",
            "PyEval_EvalCode",
            EVAL_FRAME,
            "PyObject_GetIter",
            "slot_tp_iter",
            EVAL_FRAME,
            "builtin_exec",
            EVAL_FRAME,
            "memset",
        ]);
        let mut iter = v(&["DataLoader.__iter__ (dataloader.py:505)"]);
        iter.extend((0..depth).map(|i| format!("down (deep.py:{})", 100 + i)));
        let calls = vec![v(&["<module> (torchjob.py:74)", "main (torchjob.py:69)"]), iter, v(&["g (x.py:3)"])];
        (native, calls)
    }

    #[test]
    fn a_stack_cut_short_keeps_its_innermost_frames_where_they_ran() {
        // 2 + 1 + 40 + 1 = 44 frames: the kernel keeps 32.
        let (native, calls) = deep(40);
        let (segs, truncated) = kept(&calls);
        assert!(truncated);
        assert_eq!(segs.len(), 2, "{segs:?}");
        let out = splice(native, &segs, truncated);
        let mut want = v(&["_start", "PyEval_EvalCode", EVAL_FRAME, "PyObject_GetIter", "slot_tp_iter", TRUNCATED]);
        want.extend((9..40).map(|i| format!("down (deep.py:{})", 100 + i)));
        want.extend(v(&["builtin_exec", "g (x.py:3)", "memset"]));
        assert_eq!(out, want);
        // Python frames never sit above the outermost frame the native
        // stack names as entering the interpreter's loop.
        let first_py = out.iter().position(|f| is_python_frame(f)).unwrap();
        assert!(first_py > out.iter().position(|f| f == "slot_tp_iter").unwrap(), "{out:?}");

        // A cut at a call's start leaves the outer calls' evaluation frames.
        let (native, calls) = deep(30);
        let (segs, truncated) = kept(&calls);
        assert!(truncated);
        let out = splice(native, &segs, truncated);
        assert_eq!(
            out[..7],
            v(&[
                "_start",
                "PyEval_EvalCode",
                EVAL_FRAME,
                "PyObject_GetIter",
                "slot_tp_iter",
                TRUNCATED,
                "DataLoader.__iter__ (dataloader.py:505)"
            ])
        );
        assert_eq!(out.last().map(String::as_str), Some("memset"));
        assert_eq!(out.iter().filter(|f| is_python_frame(f)).count(), vmtrace_common::PY_DEPTH);
    }

    #[test]
    fn a_stack_of_exactly_the_depth_is_whole() {
        // 2 + 1 + 28 + 1 = 32 frames: all kept, no marker, paired from the outermost.
        let (native, calls) = deep(28);
        let (segs, truncated) = kept(&calls);
        assert!(!truncated);
        let out = splice(native, &segs, truncated);
        assert_eq!(out[..4], v(&["_start", "PyEval_EvalCode", "<module> (torchjob.py:74)", "main (torchjob.py:69)"]));
        assert!(!out.iter().any(|f| f == TRUNCATED || f == EVAL_FRAME), "{out:?}");
    }

    #[test]
    fn a_cut_stack_without_evaluation_frames_starts_with_the_marker() {
        let segs = vec![v(&["f (a.py:2)"]), v(&["g (a.py:4)"])];
        assert_eq!(
            splice(v(&["[frame chain broken]", "memset"]), &segs, true),
            v(&[TRUNCATED, "f (a.py:2)", "g (a.py:4)", "[frame chain broken]", "memset"])
        );
        // Fewer evaluation frames than calls kept: the outermost shown takes the rest.
        assert_eq!(
            splice(v(&["[no unwind info]", "x", EVAL_FRAME, "memset"]), &segs, true),
            v(&["[no unwind info]", "x", TRUNCATED, "f (a.py:2)", "g (a.py:4)", "memset"])
        );
    }
}

#[cfg(test)]
mod walk_tests;
