//! safetensors checkpoints: an 8-byte little-endian header length, a JSON
//! header mapping each tensor to `{"dtype", "shape", "data_offsets": [begin, end]}`
//! (relative to the data, which starts right after the header), then the data.
use std::{fs::File, io::Read as _, path::Path};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    pub name: String,
    /// Byte range in the file.
    pub start: u64,
    pub end: u64,
}

/// The tensors of a safetensors file, sorted by offset; None if it is not one.
pub(crate) fn tensors(path: &Path) -> Option<Vec<Tensor>> {
    let mut f = File::open(path).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len);
    // Headers are small; anything huge is not a safetensors file.
    if n == 0 || n > 100 << 20 {
        return None;
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).ok()?;
    parse_header(&header, 8 + n)
}

pub(crate) fn parse_header(json: &[u8], data_start: u64) -> Option<Vec<Tensor>> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let mut out: Vec<Tensor> = v
        .as_object()?
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(name, t)| {
            let o = t["data_offsets"].as_array()?;
            let (b, e) = (o.first()?.as_u64()?, o.get(1)?.as_u64()?);
            Some(Tensor { name: name.clone(), start: data_start + b, end: data_start + e })
        })
        .collect();
    out.sort_by_key(|t| t.start);
    Some(out)
}

/// The tensor holding file offset `off`.
pub(crate) fn find(tensors: &[Tensor], off: u64) -> Option<usize> {
    let i = tensors.partition_point(|t| t.start <= off).checked_sub(1)?;
    (off < tensors[i].end).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_offsets_are_relative_to_the_data() {
        let h = br#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#;
        let t = parse_header(h, 100).unwrap();
        assert_eq!(t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!((t[0].start, t[0].end, t[1].start, t[1].end), (100, 108, 108, 116));
        assert_eq!(find(&t, 107), Some(0));
        assert_eq!(find(&t, 108), Some(1));
        assert_eq!(find(&t, 116), None);
        assert_eq!(find(&t, 50), None, "the header is no tensor");
        assert!(parse_header(b"not json", 8).is_none());
    }
}
