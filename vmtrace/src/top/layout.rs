//! Fitting `vmtrace top` to the terminal: a number is never cut. Table
//! columns are as wide as their widest value; when they do not all fit, the
//! least important ones drop out, and the one text column (a name) shrinks
//! down to a minimum with an ellipsis. Header lines break between their
//! " · " parts instead of running off the edge.

/// The smallest terminal the view draws in; below it a message says so.
pub const MIN_WIDTH: u16 = 40;

/// One table column as the layout sees it.
#[derive(Clone, Copy, Debug)]
pub struct Col {
    /// Widest of the header and every value.
    pub natural: usize,
    /// 0: always shown; otherwise higher numbers drop first.
    pub drop_order: u8,
    /// The text column: shrinks (never below this) instead of dropping.
    pub shrink_to: Option<usize>,
}

/// The width of every column in a table `room` wide (None: dropped), or None
/// when even the columns that are always shown do not fit.
pub fn fit(cols: &[Col], room: usize) -> Option<Vec<Option<usize>>> {
    let min_of = |c: &Col| c.shrink_to.map_or(c.natural, |m| m.min(c.natural));
    let mut kept: Vec<bool> = vec![true; cols.len()];
    let need = |kept: &[bool]| -> usize {
        let n = kept.iter().filter(|k| **k).count();
        cols.iter().zip(kept).filter(|(_, k)| **k).map(|(c, _)| min_of(c)).sum::<usize>() + n.saturating_sub(1)
    };
    while need(&kept) > room {
        let victim = cols
            .iter()
            .enumerate()
            .filter(|(i, c)| kept[*i] && c.drop_order > 0)
            .max_by_key(|(i, c)| (c.drop_order, *i))
            .map(|(i, _)| i)?;
        kept[victim] = false;
    }
    let spare = room - need(&kept);
    Some(
        cols.iter()
            .zip(&kept)
            .map(|(c, k)| {
                k.then(|| match c.shrink_to {
                    Some(_) => (min_of(c) + spare).min(c.natural),
                    None => c.natural,
                })
            })
            .collect(),
    )
}

/// `s` in at most `room` columns, keeping its start (a process name).
pub fn keep_head(s: &str, room: usize) -> String {
    if s.chars().count() <= room {
        return s.to_string();
    }
    let head: String = s.chars().take(room.saturating_sub(1)).collect();
    format!("{head}…")
}

/// The end of `s` in at most `room` columns: of a path, the file name
/// matters most.
pub fn keep_tail(s: &str, room: usize) -> String {
    let n = s.chars().count();
    if n <= room {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - room.saturating_sub(1)).collect();
    format!("…{tail}")
}

/// Groups `parts` into lines of at most `room` columns, joined by `sep`;
/// returns the index ranges of each line. A part wider than `room` gets a
/// line of its own (the caller wraps it).
pub fn pack(widths: &[usize], sep: usize, room: usize) -> Vec<std::ops::Range<usize>> {
    let mut lines = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, w) in widths.iter().enumerate() {
        if i > start && used + sep + w > room {
            lines.push(start..i);
            (start, used) = (i, 0);
        }
        used += if i > start { sep + w } else { *w };
    }
    if start < widths.len() {
        lines.push(start..widths.len());
    }
    lines
}

/// `text` broken at spaces into lines of at most `room` columns (a word wider
/// than that is cut, with an ellipsis: only paths are that long).
pub fn wrap(text: &str, room: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let (lw, ww) = (line.chars().count(), word.chars().count());
        if lw > 0 && lw + 1 + ww > room {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&if ww > room { keep_tail(word, room) } else { word.to_string() });
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(natural: usize, drop_order: u8) -> Col {
        Col { natural, drop_order, shrink_to: None }
    }

    #[test]
    fn columns_drop_by_priority_and_the_name_shrinks() {
        let cols = [col(5, 0), Col { natural: 15, drop_order: 0, shrink_to: Some(6) }, col(6, 0), col(6, 2), col(6, 1)];
        // Everything: 5+15+6+6+6 + 4 gaps = 42.
        assert_eq!(fit(&cols, 42).unwrap(), [Some(5), Some(15), Some(6), Some(6), Some(6)]);
        // The name gives up 4 columns first.
        assert_eq!(fit(&cols, 38).unwrap(), [Some(5), Some(11), Some(6), Some(6), Some(6)]);
        // Then the highest drop order goes, and the name gets room back.
        assert_eq!(fit(&cols, 32).unwrap(), [Some(5), Some(12), Some(6), None, Some(6)]);
        assert_eq!(fit(&cols, 20).unwrap(), [Some(5), Some(7), Some(6), None, None]);
        assert!(fit(&cols, 18).is_none(), "below the essentials");
    }

    #[test]
    fn names_keep_their_informative_end() {
        assert_eq!(keep_tail("python3 /a/b/model.safetensors", 12), "…safetensors");
        assert_eq!(keep_tail("short", 12), "short");
        assert_eq!(keep_head("kworker/u8:3-events", 8), "kworker…");
    }

    #[test]
    fn lines_break_between_parts() {
        // "aaaa · bb · cccccc" in 10 columns: [aaaa · bb] [cccccc].
        assert_eq!(pack(&[4, 2, 6], 3, 10), [0..2, 2..3]);
        assert_eq!(pack(&[12, 2], 3, 10), [0..1, 1..2]);
        assert_eq!(pack(&[], 3, 10), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(wrap("STORM pid 42 (x) 12.3k IPIs/s", 12), ["STORM pid 42", "(x) 12.3k", "IPIs/s"]);
    }
}
