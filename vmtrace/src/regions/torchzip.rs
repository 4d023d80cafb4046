//! `torch.save` checkpoints (the zip format of torch ≥ 1.6): `PREFIX/data.pkl`
//! is a pickle of the saved object, each tensor in it a `_rebuild_tensor_v2`
//! reduce whose storage is a persistent id `('storage', StorageType, key,
//! location, numel)`; the storage's bytes are the zip entry `PREFIX/data/KEY`,
//! stored uncompressed (torch aligns each to 64 bytes), so every tensor is a
//! byte range of the file. The zip is read with the `zip` crate; the pickle
//! with the small bounded reader below (serde-pickle has no persistent ids).
use crate::hash::HashMap;
use std::{fs::File, io::Read as _, path::Path};

use super::safetensors::Tensor;

/// The largest `data.pkl` read (a state dict of 100k tensors is a few MB).
const MAX_PICKLE: u64 = 64 << 20;
/// Opcodes run at most (a bound on work, whatever the input).
const MAX_OPS: usize = 10_000_000;
/// Depth of nested containers named (`a.b.c`).
const MAX_DEPTH: usize = 8;

/// The tensors of a torch zip checkpoint, sorted by offset, named by their
/// key path in the saved object (`layer.0.weight`, `model.fc.bias` for a
/// dict nested in a dict); None if `path` is not one.
pub(crate) fn tensors(path: &Path) -> Option<Vec<Tensor>> {
    let mut zip = zip::ZipArchive::new(File::open(path).ok()?).ok()?;
    let pkl_name =
        zip.file_names().filter_map(Result::ok).find(|n| n.ends_with("/data.pkl") || n == "data.pkl")?.into_owned();
    let prefix = pkl_name.strip_suffix("data.pkl")?.to_string();
    let pkl = {
        let mut f = zip.by_name(&pkl_name).ok()?;
        if f.size() > MAX_PICKLE {
            log::warn!("{}: data.pkl of {} bytes is not read (at most {MAX_PICKLE})", path.display(), f.size());
            return None;
        }
        let mut v = Vec::with_capacity(f.size() as usize);
        f.read_to_end(&mut v).ok()?;
        v
    };
    let root = match unpickle(&pkl) {
        Ok(v) => v,
        Err(e) => {
            log::warn!("{}: no per-tensor view: data.pkl: {e}", path.display());
            return None;
        }
    };
    let mut found = Vec::new();
    collect(&root, String::new(), 0, &mut found);
    // Where each storage's bytes lie in the file.
    let mut storages: HashMap<String, Option<(u64, u64)>> = HashMap::default();
    let mut out = Vec::new();
    for (name, t) in found {
        let at = *storages.entry(t.storage.clone()).or_insert_with(|| {
            let f = zip.by_name(&format!("{prefix}data/{}", t.storage)).ok()?;
            // Compressed storages are no byte range of the file.
            (f.compression() == zip::CompressionMethod::Stored).then_some((f.data_start()?, f.size()))?.into()
        });
        let Some((start, len)) = at else { continue };
        let lo = t.offset.saturating_mul(t.elem);
        let hi = lo.saturating_add(t.extent().saturating_mul(t.elem)).min(len);
        if lo < hi {
            out.push(Tensor { name, start: start + lo, end: start + hi });
        }
    }
    out.sort_by_key(|t| (t.start, t.end));
    Some(out)
}

/// A tensor as the pickle rebuilds it.
#[derive(Clone, Debug, PartialEq)]
struct TensorRef {
    storage: String,
    /// Bytes per element of the storage type.
    elem: u64,
    /// Storage offset, in elements.
    offset: u64,
    size: Vec<u64>,
    stride: Vec<u64>,
}

impl TensorRef {
    /// Elements of the storage the tensor spans.
    fn extent(&self) -> u64 {
        if self.size.contains(&0) {
            return 0;
        }
        1 + self.size.iter().zip(&self.stride).map(|(s, st)| (s - 1).saturating_mul(*st)).sum::<u64>()
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float,
    Str(String),
    Bytes,
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Global(String, String),
    /// A persistent id `('storage', type, key, location, numel)`.
    Storage {
        key: String,
        elem: u64,
    },
    Tensor(TensorRef),
    /// Anything else reduced or built: kept only as a placeholder.
    Object,
    Mark,
}

/// Bytes per element of a torch storage class (`FloatStorage`, ...).
fn elem_size(class: &str) -> Option<u64> {
    Some(match class.strip_suffix("Storage")? {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" | "QInt32" => 4,
        "Half" | "BFloat16" | "Short" => 2,
        "Byte" | "Char" | "Bool" | "QUInt8" | "QInt8" | "QUInt4x2" | "QUInt2x4" | "Float8_e5m2" | "Float8_e4m3fn"
        | "Float8_e5m2fnuz" | "Float8_e4m3fnuz" | "Untyped" => 1,
        "ComplexDouble" => 16,
        _ => return None,
    })
}

fn as_u64s(v: &Value) -> Option<Vec<u64>> {
    match v {
        Value::Tuple(t) | Value::List(t) => {
            t.iter().map(|x| if let Value::Int(i) = x { u64::try_from(*i).ok() } else { None }).collect()
        }
        _ => None,
    }
}

/// `REDUCE` of `callable` on `args`.
fn reduce(callable: &Value, args: Value) -> Value {
    let Value::Global(module, name) = callable else { return Value::Object };
    let Value::Tuple(args) = args else { return Value::Object };
    match (module.as_str(), name.as_str()) {
        ("torch._utils", "_rebuild_tensor_v2" | "_rebuild_tensor" | "_rebuild_tensor_v3") => {
            let (Some(Value::Storage { key, elem }), Some(Value::Int(off)), Some(size), Some(stride)) =
                (args.first(), args.get(1), args.get(2).and_then(as_u64s), args.get(3).and_then(as_u64s))
            else {
                return Value::Object;
            };
            Value::Tensor(TensorRef {
                storage: key.clone(),
                elem: *elem,
                offset: u64::try_from(*off).unwrap_or(0),
                size,
                stride,
            })
        }
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
            args.into_iter().next().unwrap_or(Value::Object)
        }
        ("collections", "OrderedDict") | ("builtins", "dict") => Value::Dict(Vec::new()),
        _ => Value::Object,
    }
}

/// The persistent id `pid` as torch's `persistent_load` sees it.
fn persistent(pid: &Value) -> Value {
    if let Value::Tuple(t) = pid {
        if let (Some(Value::Str(kind)), Some(Value::Global(_, class)), Some(key)) = (t.first(), t.get(1), t.get(2)) {
            let key = match key {
                Value::Str(s) => s.clone(),
                Value::Int(i) => i.to_string(),
                _ => return Value::Object,
            };
            if kind == "storage" {
                return Value::Storage { key, elem: elem_size(class).unwrap_or(1) };
            }
        }
    }
    Value::Object
}

fn key_name(k: &Value) -> Option<String> {
    match k {
        Value::Str(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Every tensor under `v`, named by the keys leading to it.
fn collect(v: &Value, name: String, depth: usize, out: &mut Vec<(String, TensorRef)>) {
    let join = |k: &str| if name.is_empty() { k.to_string() } else { format!("{name}.{k}") };
    match v {
        Value::Tensor(t) => out.push((if name.is_empty() { "tensor".into() } else { name }, t.clone())),
        Value::Dict(items) if depth < MAX_DEPTH => {
            for (k, x) in items {
                if let Some(k) = key_name(k) {
                    collect(x, join(&k), depth + 1, out);
                }
            }
        }
        Value::List(items) | Value::Tuple(items) if depth < MAX_DEPTH => {
            for (i, x) in items.iter().enumerate() {
                collect(x, join(&i.to_string()), depth + 1, out);
            }
        }
        _ => {}
    }
}

/// Reads a pickle (protocols 0–5, the opcodes torch's checkpoints use) into
/// `Value`s; the memo holds copies (containers filled after being memoized
/// are seen filled only on the stack, enough for a saved state dict).
// One match arm per opcode: the dispatch table reads best whole.
#[allow(clippy::too_many_lines)]
fn unpickle(data: &[u8]) -> Result<Value, String> {
    let mut r = Reader { data, pos: 0 };
    let mut stack: Vec<Value> = Vec::new();
    let mut memo: HashMap<u64, Value> = HashMap::default();
    let pop = |stack: &mut Vec<Value>| stack.pop().ok_or_else(|| "stack underflow".to_string());
    let pop_mark = |stack: &mut Vec<Value>| -> Result<Vec<Value>, String> {
        let m = stack.iter().rposition(|v| *v == Value::Mark).ok_or("no mark")?;
        let items = stack.split_off(m + 1);
        stack.pop();
        Ok(items)
    };
    for _ in 0..MAX_OPS {
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?; // PROTO
            }
            0x95 => {
                r.take(8)?; // FRAME
            }
            b'.' => return pop(&mut stack),
            b'(' => stack.push(Value::Mark),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'J' => stack.push(Value::Int(i64::from(i32::from_le_bytes(r.arr()?)))),
            b'K' => stack.push(Value::Int(i64::from(r.u8()?))),
            b'M' => stack.push(Value::Int(i64::from(u16::from_le_bytes(r.arr()?)))),
            0x8a | 0x8b => {
                let n = if op == 0x8a { u64::from(r.u8()?) } else { u64::from(u32::from_le_bytes(r.arr()?)) };
                let b = r.take(n)?;
                // Little-endian two's complement; wider than 8 bytes is no size.
                let mut v = [if b.last().is_some_and(|x| x & 0x80 != 0) { 0xff } else { 0 }; 8];
                for (d, s) in v.iter_mut().zip(b) {
                    *d = *s;
                }
                stack.push(if b.len() <= 8 { Value::Int(i64::from_le_bytes(v)) } else { Value::Object });
            }
            b'I' | b'L' => {
                let line = r.line()?;
                let t = line.trim_end_matches('L');
                stack.push(match t {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    _ => t.parse().map_or(Value::Object, Value::Int),
                });
            }
            b'G' => {
                r.take(8)?;
                stack.push(Value::Float);
            }
            b'F' => {
                r.line()?;
                stack.push(Value::Float);
            }
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => u64::from(u32::from_le_bytes(r.arr()?)),
                    0x8c => u64::from(r.u8()?),
                    _ => u64::from_le_bytes(r.arr()?),
                };
                stack.push(Value::Str(String::from_utf8_lossy(r.take(n)?).into_owned()));
            }
            b'U' | b'T' => {
                let n = if op == b'U' { u64::from(r.u8()?) } else { u64::from(u32::from_le_bytes(r.arr()?)) };
                stack.push(Value::Str(String::from_utf8_lossy(r.take(n)?).into_owned()));
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => u64::from(r.u8()?),
                    b'B' => u64::from(u32::from_le_bytes(r.arr()?)),
                    _ => u64::from_le_bytes(r.arr()?),
                };
                r.take(n)?;
                stack.push(Value::Bytes);
            }
            b')' => stack.push(Value::Tuple(Vec::new())),
            b']' => stack.push(Value::List(Vec::new())),
            b'}' => stack.push(Value::Dict(Vec::new())),
            0x8f => stack.push(Value::Object), // EMPTY_SET
            b't' => {
                let items = pop_mark(&mut stack)?;
                stack.push(Value::Tuple(items));
            }
            b'l' => {
                let items = pop_mark(&mut stack)?;
                stack.push(Value::List(items));
            }
            b'd' => {
                let items = pop_mark(&mut stack)?;
                stack.push(Value::Dict(pairs(items)));
            }
            0x91 => {
                pop_mark(&mut stack)?; // FROZENSET
                stack.push(Value::Object);
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let at = stack.len().checked_sub(n).ok_or("stack underflow")?;
                let items = stack.split_off(at);
                stack.push(Value::Tuple(items));
            }
            b'a' => {
                let v = pop(&mut stack)?;
                if let Some(Value::List(l)) = stack.last_mut() {
                    l.push(v);
                }
            }
            b'e' => {
                let items = pop_mark(&mut stack)?;
                if let Some(Value::List(l)) = stack.last_mut() {
                    l.extend(items);
                }
            }
            0x90 => {
                pop_mark(&mut stack)?; // ADDITEMS
            }
            b's' => {
                let v = pop(&mut stack)?;
                let k = pop(&mut stack)?;
                if let Some(Value::Dict(d)) = stack.last_mut() {
                    d.push((k, v));
                }
            }
            b'u' => {
                let items = pop_mark(&mut stack)?;
                if let Some(Value::Dict(d)) = stack.last_mut() {
                    d.extend(pairs(items));
                }
            }
            b'c' => {
                let module = r.line()?;
                let name = r.line()?;
                stack.push(Value::Global(module, name));
            }
            0x93 => {
                let name = pop(&mut stack)?;
                let module = pop(&mut stack)?;
                let s = |v: Value| if let Value::Str(s) = v { s } else { String::new() };
                stack.push(Value::Global(s(module), s(name)));
            }
            b'Q' => {
                let pid = pop(&mut stack)?;
                stack.push(persistent(&pid));
            }
            b'R' => {
                let args = pop(&mut stack)?;
                let f = pop(&mut stack)?;
                stack.push(reduce(&f, args));
            }
            0x81 | 0x92 => {
                if op == 0x92 {
                    pop(&mut stack)?; // NEWOBJ_EX kwargs
                }
                pop(&mut stack)?;
                pop(&mut stack)?;
                stack.push(Value::Object);
            }
            b'b' => {
                // BUILD: a state set on the object below (a state dict's
                // `_metadata`): the object stays as it is.
                pop(&mut stack)?;
            }
            b'0' => {
                pop(&mut stack)?;
            }
            b'1' => {
                pop_mark(&mut stack)?;
            }
            b'2' => {
                let v = stack.last().cloned().ok_or("stack underflow")?;
                stack.push(v);
            }
            b'q' | b'r' | 0x94 => {
                let i = match op {
                    b'q' => u64::from(r.u8()?),
                    b'r' => u64::from(u32::from_le_bytes(r.arr()?)),
                    _ => memo.len() as u64,
                };
                let v = stack.last().cloned().ok_or("stack underflow")?;
                memo.insert(i, v);
            }
            b'h' | b'j' => {
                let i = if op == b'h' { u64::from(r.u8()?) } else { u64::from(u32::from_le_bytes(r.arr()?)) };
                stack.push(memo.get(&i).cloned().ok_or_else(|| format!("memo {i} unset"))?);
            }
            _ => return Err(format!("unsupported pickle opcode {op:#04x} at byte {}", r.pos - 1)),
        }
    }
    Err(format!("more than {MAX_OPS} opcodes"))
}

fn pairs(items: Vec<Value>) -> Vec<(Value, Value)> {
    let mut it = items.into_iter();
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    out
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let end = usize::try_from(n).ok().and_then(|n| self.pos.checked_add(n)).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn arr<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.take(N as u64)?.try_into().unwrap_or([0; N]))
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or("unterminated line")?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `torch.save({"w": t}, f)` pickles for a 2×3 float tensor at
    /// storage offset 1 (protocol 2, as torch writes it).
    fn state_dict_pickle() -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(b"ccollections\nOrderedDict\nq\x00)Rq\x01(");
        p.extend(b"X\x01\x00\x00\x00w");
        p.extend(b"ctorch._utils\n_rebuild_tensor_v2\nq\x02(");
        // The persistent id, memoized as 5.
        p.extend(b"(X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04");
        p.extend(b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x07tq\x05Q");
        p.extend(b"K\x01K\x02K\x03\x86K\x03K\x01\x86\x89ccollections\nOrderedDict\n)RtR");
        // A second tensor on the same storage, through the memo.
        p.extend(b"X\x01\x00\x00\x00vh\x02(h\x05QK\x00K\x01\x85K\x01\x85\x89)tR");
        p.extend(b"u}X\x09\x00\x00\x00_metadata}sb.");
        p
    }

    #[test]
    fn a_state_dict_pickle_gives_each_tensor_its_storage_range() {
        let v = unpickle(&state_dict_pickle()).unwrap();
        let mut found = Vec::new();
        collect(&v, String::new(), 0, &mut found);
        assert_eq!(found.len(), 2, "{v:?}");
        let (name, t) = &found[0];
        assert_eq!(name, "w");
        assert_eq!((t.storage.as_str(), t.elem, t.offset, t.extent()), ("0", 4, 1, 6));
        let (name, t) = &found[1];
        assert_eq!((name.as_str(), t.offset, t.extent()), ("v", 0, 1));
    }

    #[test]
    fn bad_pickles_are_errors_not_panics() {
        assert!(unpickle(b"").is_err());
        assert!(unpickle(b"\x80\x02X\xff\xff\xff\xff").is_err());
        assert!(unpickle(b"\x80\x02\xfe").unwrap_err().contains("unsupported"));
        assert!(unpickle(b"u.").is_err());
        assert_eq!(
            TensorRef { storage: "0".into(), elem: 4, offset: 0, size: vec![2, 0], stride: vec![1, 1] }.extent(),
            0
        );
    }
}
