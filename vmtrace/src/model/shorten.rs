//! Function names as people read them: a demangled C++ (or Rust) name with
//! its template arguments and parameter list folded, `at::native::foo<…>(…)`,
//! for summary.txt, report.html's tables and `top`. Folded stack files and
//! pprof profiles keep the full names for tools.
use std::borrow::Cow;

/// Characters that may end a name a template argument list or a parameter
/// list follows.
fn ends_name(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'>' || b == b')' || b == b']'
}

/// Operator characters after `operator` (`operator<<`, `operator()`).
fn is_operator_char(b: u8) -> bool {
    b"<>=!+-*/%&|^~[]()".contains(&b)
}

/// The index just past the bracket matching the one at `open` (`<`/`>` or
/// `(`/`)`, counting nested brackets of both kinds), if any.
fn matching(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut i = open;
    while i < b.len() {
        if b[i..].starts_with(b"operator") {
            // An operator's own brackets are not brackets: `foo<&operator<, int>`.
            i += "operator".len();
            while i < b.len() && is_operator_char(b[i]) && !(b[i] == b'>' && depth > 0 && b[open] == b'<') {
                i += 1;
            }
            continue;
        }
        match b[i] {
            b'<' | b'(' => depth += 1,
            b'>' if i > 0 && b[i - 1] == b'-' && b[open] == b'(' => {} // `->` in a parameter list
            b'>' | b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// `name` with every template argument list folded to `<…>` and every
/// parameter list to `(…)` (an empty one stays `()`). Names that are not
/// C++ are left alone: Python frames (`f (file.py:12)`, a space before the
/// parenthesis), region leaves (`[file …]`), `<module>`, `(anonymous
/// namespace)`.
pub fn short_name(name: &str) -> Cow<'_, str> {
    if !name.contains(['<', '(']) {
        return Cow::Borrowed(name);
    }
    let b = name.as_bytes();
    let mut out = String::with_capacity(name.len().min(160));
    let mut i = 0;
    let mut changed = false;
    while i < b.len() {
        if b[i..].starts_with(b"operator") {
            let start = i;
            i += "operator".len();
            while i < b.len() && is_operator_char(b[i]) {
                // `operator()(…)`: the operator's own pair, then the list.
                if b[i] == b'(' && b[i..].starts_with(b"()") {
                    i += 2;
                    break;
                }
                if b[i] == b'(' {
                    break;
                }
                i += 1;
            }
            out.push_str(&name[start..i]);
            continue;
        }
        let c = b[i];
        if (c == b'<' || c == b'(') && i > 0 && ends_name(b[i - 1]) {
            if let Some(end) = matching(b, i) {
                let folded = match (c, end - i) {
                    (b'(', 2) => "()",
                    (b'<', _) => "<…>",
                    _ => "(…)",
                };
                changed |= name[i..end] != *folded;
                out.push_str(folded);
                i = end;
                continue;
            }
        }
        // Copy one character (names may hold UTF-8).
        let len = name[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&name[i..i + len]);
        i += len;
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(name)
    }
}

#[cfg(test)]
mod tests {
    use super::short_name;

    /// A real symbol of torch's libtorch_cpu.so (torch 2.15, `nm -D -C`):
    /// 1,684 characters, as long as the storm line of issue 32.
    const TORCH: &str = "void std::_Hashtable<tensorpipe::Device, std::pair<tensorpipe::Device const, std::__cxx11::basic_string<char, \
std::char_traits<char>, std::allocator<char> > >, std::allocator<std::pair<tensorpipe::Device const, std::__cx\
x11::basic_string<char, std::char_traits<char>, std::allocator<char> > > >, std::__detail::_Select1st, std::eq\
ual_to<tensorpipe::Device>, std::hash<tensorpipe::Device>, std::__detail::_Mod_range_hashing, std::__detail::_\
Default_ranged_hash, std::__detail::_Prime_rehash_policy, std::__detail::_Hashtable_traits<false, false, true> \
>::_M_assign_elements<std::_Hashtable<tensorpipe::Device, std::pair<tensorpipe::Device const, std::__cxx11::ba\
sic_string<char, std::char_traits<char>, std::allocator<char> > >, std::allocator<std::pair<tensorpipe::Device \
const, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > > >, std::__detail::_Se\
lect1st, std::equal_to<tensorpipe::Device>, std::hash<tensorpipe::Device>, std::__detail::_Mod_range_hashing, \
std::__detail::_Default_ranged_hash, std::__detail::_Prime_rehash_policy, std::__detail::_Hashtable_traits<fal\
se, false, true> > const&>(std::_Hashtable<tensorpipe::Device, std::pair<tensorpipe::Device const, std::__cxx1\
1::basic_string<char, std::char_traits<char>, std::allocator<char> > >, std::allocator<std::pair<tensorpipe::D\
evice const, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > > >, std::__detai\
l::_Select1st, std::equal_to<tensorpipe::Device>, std::hash<tensorpipe::Device>, std::__detail::_Mod_range_has\
hing, std::__detail::_Default_ranged_hash, std::__detail::_Prime_rehash_policy, std::__detail::_Hashtable_trai\
ts<false, false, true> > const&)";

    #[test]
    fn a_long_torch_symbol_folds_to_its_name() {
        assert_eq!(TORCH.len(), 1684);
        let short = short_name(TORCH);
        assert_eq!(short, "void std::_Hashtable<…>::_M_assign_elements<…>(…)");
    }

    #[test]
    fn other_names_are_left_alone_or_folded_where_they_should() {
        for same in [
            "_PyEval_EvalFrameDefault",
            "<module> (<string>:1)",
            "_find_and_load (<frozen importlib._bootstrap>:1360)",
            "[file /usr/lib/libc.so.6]",
            "libtorch_cpu.so+0x1a2b3c",
            "(anonymous namespace)::init()",
            "operator new(unsigned long)",
        ] {
            let expect = if same.starts_with("operator new") {
                "operator new(…)"
            } else if same.starts_with("(anon") {
                "(anonymous namespace)::init()"
            } else {
                same
            };
            assert_eq!(short_name(same), expect, "{same}");
        }
        assert_eq!(
            short_name("std::vector<int, std::allocator<int> >::push_back(int&&)"),
            "std::vector<…>::push_back(…)"
        );
        assert_eq!(short_name("c10::Foo::operator()(int) const"), "c10::Foo::operator()(…) const");
        assert_eq!(short_name("std::operator<< <char>(std::ostream&, char const*)"), "std::operator<< <char>(…)");
        assert_eq!(short_name("core::ptr::drop_in_place<alloc::vec::Vec<u8>>"), "core::ptr::drop_in_place<…>");
    }
}
