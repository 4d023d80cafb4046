//! Which processes run a CPython this module knows, and where its runtime
//! is: the ELF symbol `_PyRuntime` (in the executable or libpython), the
//! version from `Py_Version` (3.11+; 3.10 has none, see `read_obj`), and the
//! version's structure offsets. Offsets were taken with `offsetof` from each
//! version's own headers (pyenv builds, default configure options; 3.10.13's
//! from its debug info with gdb); a version not in the table gets no Python
//! frames, never guessed ones.
use crate::hash::HashMap;
use std::path::Path;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use vmtrace_common::{PyProc, PY_FRAME_OBJECTS, PY_OFF_NONE, PY_THREAD_BY_PTHREAD};

use crate::{procmaps::Region, stacks::unwind::ObjectKey};

/// Offsets of a code object and of strings and bytes objects, per version
/// (for reading code objects in userspace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeLayout {
    pub name: u64,
    pub qualname: u64,
    pub filename: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// `co_code_adaptive`: instruction pointers count code units from here
    /// (3.11+; 0 for 3.10, whose frames give `f_lasti`).
    pub adaptive: u64,
    /// Where a compact ASCII string's characters start.
    pub ascii_data: u64,
    pub lines: Lines,
}

impl CodeLayout {
    /// Where the words of a code object's stamp start, and how many there
    /// are (`vmtrace_common::py_code_stamp`): `co_filename` up to
    /// `co_linetable`, immutable pointers, contiguous in every version here.
    pub fn stamp(&self) -> (u64, u32) {
        (self.filename, u32::try_from((self.linetable - self.filename) / 8 + 1).unwrap_or(0))
    }
}

/// What a frame's instruction value is, and which line table its code has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// 3.11+: the instruction's address; the location table
    /// (Objects/locations.md).
    Locations,
    /// 3.10: `f_lasti`, in 2-byte code units, -1 before the first; PEP 626's
    /// `co_linetable` (Objects/lnotab_notes.txt), in bytes.
    Lasti,
}

/// A Python found in a process: its version (major, minor) and layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub version: (u8, u8),
    pub proc: PyProc,
    pub code: CodeLayout,
}

/// Offsets per known version; `None` for others.
pub fn layout(version: (u8, u8), runtime: u64) -> Option<(PyProc, CodeLayout)> {
    let n = PY_OFF_NONE;
    // (interp_head, threads_head, tstate_next, native_tid, tstate_frame,
    //  cframe_frame, frame_code, frame_previous, frame_instr, frame_owner,
    //  frame_is_entry), then the code object's (name, qualname, filename,
    //  firstlineno, linetable, adaptive, ascii_data).
    // 3.10: `interpreters.head`, `tstate_head`, `next`, `thread_id`, `frame`,
    // then `PyFrameObject`'s `f_code`, `f_back`, `f_lasti`; its code objects
    // have no `co_qualname` (the name stands in) and no adaptive code.
    let (t, c) = match version {
        (3, 10) => ([32, 8, 8, 176, 24, n, 32, 24, 96, n, n], [112, 112, 104, 40, 120, 0, 48]),
        (3, 11) => ([40, 16, 8, 160, 56, 8, 32, 48, 56, 69, 68], [120, 128, 112, 72, 136, 184, 48]),
        (3, 12) => ([40, 72, 8, 144, 56, 0, 0, 8, 56, 70, n], [120, 128, 112, 68, 136, 192, 40]),
        (3, 13) => ([632, 7344, 8, 160, 72, n, 0, 8, 56, 70, n], [120, 128, 112, 68, 136, 200, 40]),
        _ => return None,
    };
    let proc = PyProc {
        runtime,
        interp_head: t[0],
        threads_head: t[1],
        tstate_next: t[2],
        native_tid: t[3],
        tstate_frame: t[4],
        cframe_frame: t[5],
        frame_code: t[6],
        frame_previous: t[7],
        frame_instr: t[8],
        frame_owner: t[9],
        frame_is_entry: t[10],
        flags: if version == (3, 10) { PY_THREAD_BY_PTHREAD | PY_FRAME_OBJECTS } else { 0 },
        code_stamp: u32::try_from(c[2]).ok()?,
        code_stamp_words: u32::try_from((c[4] - c[2]) / 8 + 1).ok()?,
    };
    let code = CodeLayout {
        name: c[0],
        qualname: c[1],
        filename: c[2],
        firstlineno: c[3],
        linetable: c[4],
        adaptive: c[5],
        ascii_data: c[6],
        lines: if version == (3, 10) { Lines::Lasti } else { Lines::Locations },
    };
    Some((proc, code))
}

/// What an object file says about the Python in it.
#[derive(Clone, Debug)]
enum ObjInfo {
    NotPython,
    /// `_PyRuntime` at this link-time address; version (None: unknown, e.g.
    /// 3.9); whether addresses are absolute.
    Python {
        runtime: u64,
        version: Option<(u8, u8)>,
        absolute: bool,
        /// The first words of `_PyRuntime`'s initializer (`_Py_DebugOffsets` from 3.13).
        debug: Option<Vec<u64>>,
    },
}

/// What each object file said, by its identity (device, inode, size,
/// mtime): the same file for every process that maps it, whichever path
/// (a container's root, `procmaps::root`) it was reached by.
#[derive(Default)]
pub struct Detector {
    objs: HashMap<ObjectKey, ObjInfo>,
}

/// Outcome of looking at a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detected {
    /// No Python in its maps (yet).
    None,
    Known(Found),
    /// A Python whose version has no table here: native frames only.
    Unknown(String),
}

impl Detector {
    /// Looks for a Python in a process's maps; `root`: where its files
    /// are, when not here (a container's, a chroot's in another mount
    /// namespace): its interpreter is read there, not from the file of
    /// the same path here (another version, or none).
    pub fn detect(&mut self, maps: &[Region], root: Option<&crate::procmaps::root::RootDir>) -> Detected {
        let mut seen: Vec<&str> = Vec::new();
        for r in maps {
            let Some(path) = r.path.as_deref() else { continue };
            if seen.contains(&path) || !looks_like_python(path) {
                continue;
            }
            seen.push(path);
            let here = crate::procmaps::root::here(root, path);
            let Some(id) = ObjectKey::of(Path::new(&here)) else { continue };
            let info = self.objs.entry(id).or_insert_with(|| read_obj(&here)).clone();
            let ObjInfo::Python { runtime, version, absolute, debug } = info else { continue };
            let Some(version) = version else { return Detected::Unknown(path.to_string()) };
            let bias = if absolute {
                0
            } else {
                match maps.iter().find(|m| m.path.as_deref() == Some(path) && m.offset == 0) {
                    Some(m) => m.start,
                    None => continue,
                }
            };
            let unknown = || Detected::Unknown(format!("{path} (Python {}.{})", version.0, version.1));
            let Some((mut proc, code)) = layout(version, bias + runtime) else { return unknown() };
            if version >= (3, 13) {
                // The interpreter's own description wins over the table; a
                // free-threaded build (other layouts) or a missing one has none.
                match debug.as_deref().and_then(|d| from_debug_offsets(d, version)) {
                    Some(p) if (p.code_stamp, p.code_stamp_words) == (proc.code_stamp, proc.code_stamp_words) => {
                        proc = PyProc { runtime: proc.runtime, ..p };
                    }
                    // (Code objects read with another layout than the table's
                    // would never agree with their stamps.)
                    Some(_) | None => return unknown(),
                }
            }
            return Detected::Known(Found { version, proc, code });
        }
        Detected::None
    }
}

/// Words of `_Py_DebugOffsets` (3.13's layout) read here.
const DEBUG_WORDS: usize = 44;

/// 3.13's `_Py_DebugOffsets`, the first bytes of `_PyRuntime` (as words):
/// the offsets the kernel needs, or `None` when the cookie, version or
/// build (free-threaded) is not the one this layout is for.
fn from_debug_offsets(d: &[u64], version: (u8, u8)) -> Option<PyProc> {
    if d.len() < DEBUG_WORDS || d[0].to_le_bytes() != *b"xdebugpy" || version != (3, 13) {
        return None;
    }
    let hex = d[1];
    if ((hex >> 24) as u8, (hex >> 16) as u8) != version || d[2] != 0 {
        return None;
    }
    let w = |i: usize| u32::try_from(d[i]).ok();
    // The code object's `co_filename`, `co_name`, `co_qualname`,
    // `co_linetable`: the stamp's words, one after the other.
    let (file, last) = (w(35)?, w(38)?);
    if (w(36)?, w(37)?) != (file + 8, file + 16) || last != file + 24 {
        return None;
    }
    Some(PyProc {
        runtime: 0,
        interp_head: w(5)?,
        threads_head: w(9)?,
        tstate_next: w(21)?,
        native_tid: w(25)?,
        tstate_frame: w(23)?,
        cframe_frame: PY_OFF_NONE,
        frame_code: w(30)?,
        frame_previous: w(29)?,
        frame_instr: w(31)?,
        frame_owner: w(33)?,
        frame_is_entry: PY_OFF_NONE,
        flags: 0,
        code_stamp: file,
        code_stamp_words: 4,
    })
}

fn looks_like_python(path: &str) -> bool {
    let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with("python") || name.starts_with("libpython")
}

fn read_obj(path: &str) -> ObjInfo {
    let Ok(data) = std::fs::read(path) else { return ObjInfo::NotPython };
    let Ok(file) = object::File::parse(&*data) else { return ObjInfo::NotPython };
    let mut runtime = None;
    let mut version = None;
    let mut debug = None;
    let mut py_is = false;
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        match sym.name() {
            Ok("Py_IsNone") => py_is = true,
            Ok("_PyRuntime") => {
                runtime = Some(sym.address());
                debug = sym.section_index().and_then(|i| file.section_by_index(i).ok()).and_then(|s| {
                    let d = s.data().ok()?;
                    let at = usize::try_from(sym.address().checked_sub(s.address())?).ok()?;
                    let bytes = d.get(at..at + DEBUG_WORDS * 8)?;
                    Some(bytes.chunks_exact(8).filter_map(|c| c.try_into().ok().map(u64::from_le_bytes)).collect())
                });
            }
            Ok("Py_Version") => {
                let hex = sym.section_index().and_then(|i| file.section_by_index(i).ok()).and_then(|s| {
                    let d = s.data().ok()?;
                    let at = usize::try_from(sym.address().checked_sub(s.address())?).ok()?;
                    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
                });
                version = hex.map(|h| ((h >> 24) as u8, (h >> 16) as u8));
            }
            _ => {}
        }
    }
    // 3.10 has no `Py_Version`; it is the one version that has `_PyRuntime`
    // and `Py_IsNone` (new in 3.10's API) but no `Py_Version` (new in 3.11).
    if version.is_none() && py_is {
        version = Some((3, 10));
    }
    match runtime {
        Some(runtime) => {
            ObjInfo::Python { runtime, version, absolute: file.kind() == object::ObjectKind::Executable, debug }
        }
        None => ObjInfo::NotPython,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_checked_versions_have_offsets() {
        assert!(layout((3, 10), 1).is_some());
        assert!(layout((3, 12), 1).is_some());
        assert!(layout((3, 9), 1).is_none());
        assert!(layout((3, 14), 1).is_none());
    }
}
