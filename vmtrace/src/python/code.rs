//! Code objects read from a live process's memory (`/proc/PID/mem`): name,
//! file, first line and line table, cached per process and address, so
//! stacks of a process that has exited are still named; and the line of an
//! instruction from the line table (CPython 3.11+ location table, 3.10's
//! PEP 626 table).
use crate::hash::HashMap;
use std::os::unix::fs::FileExt as _;

use vmtrace_common::{py_code_stamp, PyFrame, PY_STAMP_WORDS};

use super::detect::{CodeLayout, Lines};

/// A code object as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub name: String,
    /// The file's name without its directory.
    pub file: String,
    pub firstlineno: i64,
    pub linetable: Vec<u8>,
    /// Address of its first instruction (3.11+).
    pub first_instr: u64,
    pub lines: Lines,
}

impl Code {
    /// The line a frame of this code is at, from the frame's instruction
    /// value (`Lines`); `None` where the table has none.
    pub fn line(&self, instr: u64) -> Option<i64> {
        match self.lines {
            Lines::Locations => {
                let index = instr.checked_sub(self.first_instr)? / 2;
                line_of(&self.linetable, self.firstlineno, index)
            }
            // The kernel keeps f_lasti's 4 bytes; a frame not started yet
            // (-1) is at its first line, as PyCode_Addr2Line says.
            Lines::Lasti => match u64::try_from(instr as u32 as i32) {
                Ok(lasti) => line_of_pep626(&self.linetable, self.firstlineno, lasti * 2),
                Err(_) => Some(self.firstlineno),
            },
        }
    }
}

/// The Python frames recorded with one user stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyStack {
    pub tgid: u32,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
    /// Bit i: frame i is the outermost of its evaluation-loop call.
    pub ends: u32,
    /// The thread ran more frames than `frames` (`PY_TRUNCATED`): they are
    /// its innermost ones.
    pub truncated: bool,
}

/// What reading a frame's code object gave.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Read {
    Named(Code),
    /// The object at its address was another by the time it was read (its
    /// stamp differs): the frame's code object had been freed.
    Freed,
    /// Not readable: the process was gone, or the kernel could not read
    /// the object's stamp, so what lies there could not be checked.
    Unreadable,
}

/// The name of a frame whose code object was freed, and its memory reused,
/// before it could be read.
pub const FREED: &str = "[python code freed]";
/// The name of a frame whose code object could not be read.
pub const UNKNOWN: &str = "[unknown python]";

/// Code objects by (process, address, stamp): a code object's address is
/// taken by another once it is freed (a module's body after its import, a
/// class body, an `exec`), so the address alone does not name it; the stamp
/// the kernel read with the frame (`vmtrace_common::py_code_stamp`) tells
/// which object was there.
#[derive(Default)]
pub struct CodeCache {
    codes: HashMap<(u32, u64, u64), Read>,
    /// A process that read a code object at each (address, stamp): a forked
    /// child's frames are looked up there without a scan of every code
    /// object (a scan per frame of every stack took minutes on a torch
    /// job's 280k).
    by_addr: HashMap<(u64, u64), u32>,
    /// Layout of each Python process's code objects.
    layouts: HashMap<u32, CodeLayout>,
    /// Code objects freed and unreadable of processes let go (`forget_retired`).
    forgotten: (u64, u64),
}

/// Longest string or line table read.
const MAX_READ: u64 = 64 * 1024;

impl CodeCache {
    pub fn set_layout(&mut self, tgid: u32, layout: CodeLayout) {
        self.layouts.insert(tgid, layout);
    }

    /// Drops what was read of `tgid` (it exec'd: the same addresses now
    /// hold other objects).
    pub fn forget(&mut self, tgid: u32) {
        self.layouts.remove(&tgid);
        self.codes.retain(|(t, _, _), _| *t != tgid);
        self.by_addr.retain(|_, t| *t != tgid);
        for ((t, a, st), c) in &self.codes {
            if matches!(c, Read::Named(_)) {
                self.by_addr.entry((*a, *st)).or_insert(*t);
            }
        }
    }

    /// Drops what was read of retired processes whose stacks are named
    /// already; their unnamed code objects stay counted.
    pub fn forget_retired(&mut self, tgids: &crate::hash::HashSet<u32>) {
        if !self.codes.keys().any(|(t, _, _)| tgids.contains(t)) {
            for t in tgids {
                self.layouts.remove(t);
            }
            return;
        }
        for t in tgids {
            self.layouts.remove(t);
        }
        let forgotten = &mut self.forgotten;
        self.codes.retain(|(t, _, _), c| {
            let keep = !tgids.contains(t);
            if !keep {
                match c {
                    Read::Freed => forgotten.0 += 1,
                    Read::Unreadable => forgotten.1 += 1,
                    Read::Named(_) => {}
                }
            }
            keep
        });
        self.by_addr.retain(|_, t| !tgids.contains(t));
        for ((t, a, st), c) in &self.codes {
            if matches!(c, Read::Named(_)) {
                self.by_addr.entry((*a, *st)).or_insert(*t);
            }
        }
    }

    pub fn has_layout(&self, tgid: u32) -> bool {
        self.layouts.contains_key(&tgid)
    }

    /// Whether any process was registered.
    pub fn any(&self) -> bool {
        !self.layouts.is_empty()
    }

    /// Reads the code objects of `stack` not read yet (the process must be alive).
    pub fn resolve(&mut self, stack: &PyStack) {
        let Some(layout) = self.layouts.get(&stack.tgid).copied() else { return };
        let mut mem = None;
        for f in &stack.frames {
            let key = (stack.tgid, f.code, f.stamp);
            if f.code == 0 || self.codes.contains_key(&key) {
                continue;
            }
            if f.stamp == 0 {
                self.codes.insert(key, Read::Unreadable);
                continue;
            }
            if mem.is_none() {
                mem = std::fs::File::open(format!("/proc/{}/mem", stack.tgid)).ok();
            }
            let read = match &mem {
                Some(m) => read_code(m, f, &layout),
                None => Read::Unreadable,
            };
            if matches!(read, Read::Named(_)) {
                self.by_addr.entry((f.code, f.stamp)).or_insert(stack.tgid);
            }
            self.codes.insert(key, read);
        }
    }

    /// What was read of `f`'s code object as process `tgid` (or, failing
    /// that, a process forked with it, which shares its addresses) had it.
    fn code(&self, tgid: u32, f: &PyFrame) -> Option<&Read> {
        if let Some(c) = self.codes.get(&(tgid, f.code, f.stamp)).filter(|c| matches!(c, Read::Named(_))) {
            return Some(c);
        }
        let named = self.by_addr.get(&(f.code, f.stamp)).and_then(|t| self.codes.get(&(*t, f.code, f.stamp)));
        named.or_else(|| self.codes.get(&(tgid, f.code, f.stamp)))
    }

    /// How many code objects seen in stacks could not be named:
    /// `(freed, unreadable)` (see [`FREED`], [`UNKNOWN`]).
    pub fn unnamed(&self) -> (u64, u64) {
        let freed = self.codes.values().filter(|c| matches!(c, Read::Freed)).count();
        let unreadable = self.codes.values().filter(|c| matches!(c, Read::Unreadable)).count();
        (freed as u64 + self.forgotten.0, unreadable as u64 + self.forgotten.1)
    }

    /// `stack`'s frames as `function (file:line)`, split into the frames of
    /// each evaluation-loop call, outermost first; `tgid`: the process the
    /// stack was counted in. A frame not named is [`FREED`] or [`UNKNOWN`].
    pub fn segments(&self, tgid: u32, stack: &PyStack) -> Vec<Vec<String>> {
        let mut segs: Vec<Vec<String>> = Vec::new();
        let mut cur: Vec<String> = Vec::new();
        for (i, f) in stack.frames.iter().enumerate().rev() {
            let name = match self.code(tgid, f).or_else(|| self.code(stack.tgid, f)) {
                Some(Read::Named(c)) => match c.line(f.instr) {
                    Some(line) => format!("{} ({}:{line})", c.name, c.file),
                    None => format!("{} ({})", c.name, c.file),
                },
                Some(Read::Freed) => FREED.to_string(),
                Some(Read::Unreadable) | None => UNKNOWN.to_string(),
            };
            // Outermost first: a frame that ends a call (bit set) starts a segment.
            if stack.ends & (1 << (i as u32 & 31)) != 0 && !cur.is_empty() {
                segs.push(std::mem::take(&mut cur));
            }
            cur.push(name);
        }
        if !cur.is_empty() {
            segs.push(cur);
        }
        segs
    }

    /// Whether a frame of `stack` is not named (see [`Self::segments`]).
    pub fn any_unnamed(&self, tgid: u32, stack: &PyStack) -> bool {
        stack
            .frames
            .iter()
            .any(|f| !matches!(self.code(tgid, f).or_else(|| self.code(stack.tgid, f)), Some(Read::Named(_))))
    }
}

fn read_at(m: &std::fs::File, addr: u64, len: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    m.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

fn u64_at(b: &[u8], off: u64) -> Option<u64> {
    let o = usize::try_from(off).ok()?;
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Reads `f`'s code object: [`Read::Freed`] when the object now at its
/// address has another stamp than the kernel read with the frame.
fn read_code(m: &std::fs::File, f: &PyFrame, l: &CodeLayout) -> Read {
    // Up to the last field read (3.11+: the adaptive code, after them all).
    let fields = [l.name, l.qualname, l.filename, l.linetable].into_iter().max().unwrap_or(0) + 8;
    let Some(head) = read_at(m, f.code, fields.max(l.adaptive)) else { return Read::Unreadable };
    let (at, n) = l.stamp();
    let mut words = [0u64; PY_STAMP_WORDS];
    for (i, w) in words.iter_mut().enumerate().take(n as usize) {
        *w = u64_at(&head, at + 8 * i as u64).unwrap_or(0);
    }
    if py_code_stamp(&words, n) != f.stamp {
        return Read::Freed;
    }
    read_named(m, f.code, &head, l).map_or(Read::Unreadable, Read::Named)
}

fn read_named(m: &std::fs::File, addr: u64, head: &[u8], l: &CodeLayout) -> Option<Code> {
    let name = read_str(m, u64_at(head, l.qualname)?, l).or_else(|| read_str(m, u64_at(head, l.name)?, l))?;
    let path = read_str(m, u64_at(head, l.filename)?, l)?;
    let file = path.rsplit('/').next().unwrap_or(&path).to_string();
    let firstlineno = i64::from(u64_at(head, l.firstlineno)? as u32 as i32);
    let table = u64_at(head, l.linetable)?;
    // A bytes object: its size at 16, its bytes from 32.
    let size = u64_at(&read_at(m, table, 24)?, 16)?.min(MAX_READ);
    let linetable = read_at(m, table + 32, size)?;
    Some(Code { name, file, firstlineno, linetable, first_instr: addr + l.adaptive, lines: l.lines })
}

/// A compact ASCII string (every identifier and most paths); `None` for others.
fn read_str(m: &std::fs::File, addr: u64, l: &CodeLayout) -> Option<String> {
    let head = read_at(m, addr, l.ascii_data)?;
    let len = u64_at(&head, 16)?.min(MAX_READ);
    let state = u32::from_le_bytes(head.get(32..36)?.try_into().ok()?);
    // state: interned (2 bits, 3.11; 3.12+ as well), kind (3 bits), compact, ascii.
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if kind != 1 || compact != 1 || ascii != 1 {
        return None;
    }
    String::from_utf8(read_at(m, addr + l.ascii_data, len)?).ok()
}

/// The line of code unit `index` from a 3.11+ location table
/// (Objects/locations.md in CPython); `None` when the table has none.
pub fn line_of(table: &[u8], firstlineno: i64, index: u64) -> Option<i64> {
    let mut line = firstlineno;
    let mut addr = 0u64;
    let mut i = 0;
    while i < table.len() {
        let b = table[i];
        i += 1;
        let code = (b >> 3) & 15;
        let len = u64::from(b & 7) + 1;
        let delta = match code {
            15 => None,
            14 => {
                let d = svarint(table, &mut i)?;
                for _ in 0..3 {
                    varint(table, &mut i)?;
                }
                Some(d)
            }
            13 => Some(svarint(table, &mut i)?),
            10..=12 => {
                i += 2;
                Some(i64::from(code) - 10)
            }
            _ => {
                i += 1;
                Some(0)
            }
        };
        if let Some(d) = delta {
            line += d;
        }
        if index < addr + len {
            return delta.map(|_| line);
        }
        addr += len;
    }
    None
}

/// The line of the instruction at byte `offset` from a 3.10 (PEP 626)
/// `co_linetable`: pairs of (bytes covered, line delta as a signed byte),
/// -128 meaning "no line"; long jumps are split over several pairs (a range
/// of 0 bytes only moves the line). As 3.10's `PyCode_Addr2Line`; `None`
/// where the table has no line or ends first.
pub fn line_of_pep626(table: &[u8], firstlineno: i64, offset: u64) -> Option<i64> {
    let mut line = firstlineno;
    let mut end = 0u64;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = (delta != -128).then(|| {
            line += i64::from(delta);
            line
        });
        if (start..end).contains(&offset) {
            return here;
        }
    }
    None
}

fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = *t.get(*i)?;
        *i += 1;
        v |= u64::from(b & 63) << shift;
        shift += 6;
        if b & 64 == 0 || shift > 60 {
            return Some(v);
        }
    }
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let v = varint(t, i)?;
    Some(if v & 1 != 0 { -((v >> 1) as i64) } else { (v >> 1) as i64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_location_table() {
        // RESUME (no column form, line +0), then a one-line form +1 over 2
        // units, then a long form +3 over 1 unit, then "no location".
        let t = [0x80 | (13 << 3), 0, 0x80 | (11 << 3) | 1, 4, 9, 0x80 | (14 << 3), 6, 0, 1, 2, 0x80 | (15 << 3)];
        assert_eq!(line_of(&t, 10, 0), Some(10));
        assert_eq!(line_of(&t, 10, 1), Some(11));
        assert_eq!(line_of(&t, 10, 2), Some(11));
        assert_eq!(line_of(&t, 10, 3), Some(14));
        assert_eq!(line_of(&t, 10, 4), None);
        assert_eq!(line_of(&t, 10, 9), None);
    }

    /// Every instruction of real 3.10.13 code objects (dumped with
    /// `co_linetable.hex()`) gets the line `co_lines()` gives it: a 201-line
    /// jump split over two pairs, a 400-byte line split at 254, and
    /// instructions with no line (-128).
    #[test]
    fn lines_follow_the_pep626_table() {
        type Ranges<'a> = &'a [(u64, u64, Option<i64>)];
        let cases: [(&str, i64, Ranges); 4] = [
            (
                "04010c010a01007f0a4a060106ff",
                1,
                &[
                    (0, 4, Some(2)),
                    (4, 16, Some(3)),
                    (16, 26, Some(4)),
                    (26, 36, Some(205)),
                    (36, 42, Some(206)),
                    (42, 48, Some(205)),
                ],
            ),
            (
                "0801fe01fe0086000aff040212fe0402",
                1,
                &[
                    (0, 8, Some(2)),
                    (8, 650, Some(3)),
                    (650, 660, Some(2)),
                    (660, 664, Some(4)),
                    (664, 682, Some(2)),
                    (682, 686, Some(4)),
                ],
            ),
            (
                "02010c010e011601088002ff",
                1,
                &[
                    (0, 2, Some(2)),
                    (2, 14, Some(3)),
                    (14, 28, Some(4)),
                    (28, 50, Some(5)),
                    (50, 58, None),
                    (58, 60, Some(4)),
                ],
            ),
            ("02800e010c012eff", 1, &[(0, 2, None), (2, 16, Some(2)), (16, 28, Some(3)), (28, 74, Some(2))]),
        ];
        for (hex, first, ranges) in cases {
            let table: Vec<u8> =
                (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
            for &(start, end, line) in ranges {
                for off in (start..end).step_by(2) {
                    assert_eq!(line_of_pep626(&table, first, off), line, "{hex} at {off}");
                }
            }
            let end = ranges.last().map_or(0, |r| r.1);
            assert_eq!(line_of_pep626(&table, first, end), None, "{hex} past its end");
        }
    }

    /// A 3.10 frame's `f_lasti` as the kernel keeps it (4 bytes): in code
    /// units, and -1 (not started) at the first line.
    #[test]
    fn lasti_names_the_line_of_its_instruction() {
        let code = Code {
            name: "k".into(),
            file: "t.py".into(),
            firstlineno: 1,
            linetable: vec![0x02, 0x01, 0x0c, 0x01, 0x0e, 0x01, 0x16, 0x01, 0x08, 0x80, 0x02, 0xff],
            first_instr: 0,
            lines: Lines::Lasti,
        };
        assert_eq!(code.line(7), Some(4));
        assert_eq!(code.line(26), None);
        assert_eq!(code.line(29), Some(4));
        assert_eq!(code.line(u64::from(u32::MAX)), Some(1));
    }
}
