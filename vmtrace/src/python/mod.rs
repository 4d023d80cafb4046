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

/// Splices Python frames into a native stack (both outermost first).
/// `segments`: the Python frames of each evaluation-loop call, outermost call
/// first. Each `_PyEval_EvalFrameDefault` frame is replaced by its call's
/// frames; calls the native stack does not show (its unwinding stopped
/// short) go after the last one it shows, or first when it shows none, so a
/// Python frame is never dropped.
pub fn splice(native: Vec<String>, segments: &[Vec<String>]) -> Vec<String> {
    if segments.is_empty() {
        return native;
    }
    let evals = native.iter().filter(|f| is_eval(f)).count();
    let mut out = Vec::with_capacity(native.len() + segments.iter().map(Vec::len).sum::<usize>());
    let mut next = 0;
    if evals == 0 {
        out.extend(segments.iter().flatten().cloned());
        out.extend(native);
        return out;
    }
    let mut seen = 0;
    for f in native {
        if !is_eval(&f) {
            out.push(f);
            continue;
        }
        seen += 1;
        // The last evaluation frame takes every call still left.
        let upto = if seen == evals { segments.len() } else { (next + 1).min(segments.len()) };
        for seg in &segments[next..upto] {
            out.extend(seg.iter().cloned());
        }
        next = upto;
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
            splice(native, &segs),
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
        assert_eq!(splice(native, &segs), v(&["<module> (a.py:9)", "f (a.py:2)", "[frame chain broken]", "memset"]));
        let native = v(&["main", "_PyEval_EvalFrameDefault", "memset"]);
        assert_eq!(splice(native, &segs), v(&["main", "<module> (a.py:9)", "f (a.py:2)", "memset"]));
        assert_eq!(splice(v(&["main"]), &[]), v(&["main"]));
    }
}

#[cfg(test)]
mod walk_tests;
