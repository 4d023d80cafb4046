//! The top code locations: where in the program's own code the faults, their
//! time and the resident memory come from, so "which line?" needs no
//! flamegraph. A location is the stack's innermost Python line, else its
//! innermost native frame that is not libc's, the allocator's or a language
//! runtime's ([`location`] picks it).
use serde::{Deserialize, Serialize};

/// A list with its title and how its values read.
pub type Listed<'a> = (&'a str, &'a Vec<CodeLocation>, fn(u64) -> String);

/// Frames that are libc's, the allocator's, the dynamic loader's or a
/// language runtime's, by name: never the answer to "which line?".
fn is_runtime(frame: &str) -> bool {
    const PREFIXES: [&str; 24] = [
        "__",
        "_int_",
        "_IO_",
        "_dl_",
        "je_",
        "mi_",
        "_mi_",
        "tc_",
        "tcmalloc::",
        "core::",
        "std::",
        "alloc::",
        "<core::",
        "<std::",
        "<alloc::",
        "pymalloc",
        "_PyObject_Malloc",
        "_PyMem_",
        "PyMem_",
        "PyObject_Malloc",
        "PyObject_Calloc",
        "PyObject_Realloc",
        "_PyObject_GC_",
        "_start",
    ];
    const EXACT: [&str; 23] = [
        // The dynamic loader's (ld-linux), relocating the program before main.
        "dl_main",
        "malloc",
        "calloc",
        "realloc",
        "free",
        "memset",
        "memcpy",
        "memmove",
        "memcmp",
        "strlen",
        "sysmalloc",
        "brk",
        "sbrk",
        "mmap",
        "mmap64",
        "munmap",
        "madvise",
        "posix_memalign",
        "aligned_alloc",
        "valloc",
        "operator new",
        "start_thread",
        "clone3",
    ];
    const MODULES: [&str; 6] = ["libc.so", "libc-", "ld-linux", "libjemalloc", "libmimalloc", "libtcmalloc"];
    let name = frame.split(" (").next().unwrap_or(frame);
    frame.starts_with('[')
        || PREFIXES.iter().any(|p| name.starts_with(p))
        || EXACT.iter().any(|e| name == *e || name.starts_with(&format!("{e}(")))
        || MODULES.iter().any(|m| name.starts_with(m))
        || name.contains("malloc")
        || name.contains("calloc")
        || name.contains("realloc")
        || name.starts_with("operator new")
}

/// The location of a user stack (outermost first), or `None` when every
/// frame is the runtime's.
pub fn location(user: &[impl AsRef<str>]) -> Option<String> {
    let frames: Vec<&str> = user.iter().map(AsRef::as_ref).collect();
    if let Some(py) = frames.iter().rev().find(|f| crate::python::is_python_frame(f)) {
        return Some((*py).to_string());
    }
    let native = frames.iter().rev().find(|f| !is_runtime(f))?;
    Some(super::clip(&super::short_name(native), 100))
}

/// One code location and its share of a total.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CodeLocation {
    /// `function (file.py:LINE)`, or a native function (short name).
    pub location: String,
    /// The process name with most of its weight.
    pub comm: String,
    /// Faults, ns, or bytes, as the list says (estimated from the sampled stacks).
    pub value: u64,
    /// Of the list's whole (every stack's weight), in %.
    pub share_pct: f64,
    /// When the location is code no symbol covers (`object+0xOFF`, as the
    /// folded files and pprof name it): the object, by path where the
    /// recording's regions name it. Its row is an offset in that file, not
    /// a function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_symbols: Option<String>,
}

/// The object of a frame no symbol covers: `sort+0x77b8` → `sort` (as
/// `stacks::symbolize` writes them; markers in brackets and `[kernel]
/// 0x…` are not objects).
pub fn unsymbolized_object(frame: &str) -> Option<&str> {
    let (object, off) = frame.rsplit_once('+')?;
    let hex = off.strip_prefix("0x")?;
    (!object.is_empty()
        && !object.starts_with('[')
        && !object.contains(' ')
        && !hex.is_empty()
        && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    .then_some(object)
}

/// How to get symbols for `object`, for the note under the lists.
pub fn symbols_hint(object: &str) -> String {
    format!(
        "{object} is stripped: its rows are offsets in that file, not functions. For names, install its debug \
         symbols (the distro's -dbgsym or debuginfo package of what ships it, or `debuginfod-find debuginfo \
         {object}`) as /usr/lib/debug/.build-id/NN/REST.debug, or beside it as its .gnu_debuglink names, and \
         record again."
    )
}

/// `text` in lines of at most `width` characters (words are not split),
/// each after `indent`.
pub fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(indent);
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(indent);
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `code_locations` in summary.json (with `--stacks`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CodeLocations {
    /// By time in the fault handler (ns).
    pub by_fault_time: Vec<CodeLocation>,
    /// By faults.
    pub by_faults: Vec<CodeLocation>,
    /// By bytes resident at each process's peak (`--events resident`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_resident: Vec<CodeLocation>,
    /// Bytes of fork children's pages shared with their parent at their
    /// peaks (`[shared with parent]`), summed over the children: left out of
    /// `by_resident` and its whole, because the parent's rows count those
    /// pages. 0 (absent): none.
    #[serde(default, skip_serializing_if = "super::summary::is_zero")]
    pub resident_shared_bytes: u64,
}

impl CodeLocations {
    /// The note under the resident list on what it leaves out; `None` when nothing.
    pub fn resident_shared_note(&self) -> Option<String> {
        (self.resident_shared_bytes > 0).then(|| {
            format!(
                "{} of fork children's pages shared with their parent (summed over the children) are not in \
                 this list: each page is counted once, in its parent's row.",
                super::bytes(self.resident_shared_bytes)
            )
        })
    }
}

impl CodeLocations {
    /// At most this many per list.
    pub const TOP: usize = 10;

    /// The lists as summary.txt shows them, after the findings.
    pub fn render_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s =
            String::from("Top code locations (the Python line, else the first frame of the program's own code):\n");
        let lists: [Listed<'_>; 3] = [
            ("by fault time", &self.by_fault_time, super::fmt_ns),
            ("by faults", &self.by_faults, |v| v.to_string()),
            ("by resident bytes at peak", &self.by_resident, super::bytes),
        ];
        for (what, list, fmt) in lists {
            if list.is_empty() {
                continue;
            }
            let _ = writeln!(s, "  {what}:");
            for l in list.iter().take(5) {
                let stripped = if l.no_symbols.is_some() { " (no symbols)" } else { "" };
                let _ = writeln!(
                    s,
                    "    {:>10} {:>5.1}%  {}{stripped} [{}]",
                    fmt(l.value),
                    l.share_pct,
                    l.location,
                    l.comm
                );
            }
            if what.starts_with("by resident") {
                if let Some(note) = self.resident_shared_note() {
                    s.push_str(&wrap(&note, 100, "    "));
                }
            }
        }
        for object in self.unsymbolized() {
            s.push_str(&wrap(&format!("no symbols: {}", symbols_hint(object)), 100, "  "));
        }
        s
    }

    /// The objects of the shown rows that have no symbols, each once.
    pub fn unsymbolized(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for l in [&self.by_fault_time, &self.by_faults, &self.by_resident].into_iter().flat_map(|v| v.iter().take(5)) {
            if let Some(o) = l.no_symbols.as_deref().filter(|o| !out.contains(o)) {
                out.push(o);
            }
        }
        out
    }

    /// Names each unsymbolized object by its path, from the regions of the
    /// recording (a frame names only the file's base name).
    pub fn name_objects(&mut self, paths: &[&str]) {
        for l in self.by_fault_time.iter_mut().chain(self.by_faults.iter_mut()).chain(self.by_resident.iter_mut()) {
            if let Some(o) = l.no_symbols.as_mut().filter(|o| !o.contains('/')) {
                if let Some(p) = paths.iter().find(|p| p.rsplit('/').next() == Some(o.as_str())) {
                    *o = p.to_string();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_in_an_object_is_told_from_a_function() {
        assert_eq!(unsymbolized_object("sort+0x77b8"), Some("sort"));
        assert_eq!(unsymbolized_object("libtorch_cpu.so+0x1a2b3c"), Some("libtorch_cpu.so"));
        for named in ["fill_round", "operator+", "a+b", "[anon]+0x40", "[kernel] 0xffff", "f (x.py:3)", "x+0x"] {
            assert_eq!(unsymbolized_object(named), None, "{named}");
        }
    }

    /// A stripped program's row says it is an offset in a file with no
    /// symbols, names the file by path and says how to get symbols, once.
    #[test]
    fn rows_without_symbols_name_their_object_and_how_to_get_symbols() {
        let row = |location: &str| CodeLocation {
            location: location.into(),
            comm: "sort".into(),
            value: 10,
            share_pct: 50.0,
            no_symbols: unsymbolized_object(location).map(str::to_string),
        };
        let mut l = CodeLocations {
            by_fault_time: vec![row("sort+0x77b8"), row("main")],
            by_faults: vec![row("sort+0x77b8"), row("sort+0x1000")],
            by_resident: Vec::new(),
            resident_shared_bytes: 0,
        };
        l.name_objects(&["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/sort"]);
        assert_eq!(l.by_faults[1].no_symbols.as_deref(), Some("/usr/bin/sort"));
        assert_eq!(l.unsymbolized(), ["/usr/bin/sort"]);
        let text = l.render_text();
        assert!(text.contains("sort+0x77b8 (no symbols) [sort]") && text.contains("main [sort]"), "{text}");
        assert_eq!(text.matches("no symbols: /usr/bin/sort is stripped").count(), 1, "{text}");
        assert!(text.contains("-dbgsym") && text.contains("debuginfod-find"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= 102), "wrapped at 100 columns:\n{text}");
    }
}
