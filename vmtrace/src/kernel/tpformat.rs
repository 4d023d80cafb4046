//! Classic tracepoint record layouts, from their tracefs `format` files, held
//! against the fields the kernel programs read (`vmtrace_common::TP_FIELDS`):
//! a `Loaded` field's offset on this kernel (or `TpOffsets::MISSING`), and,
//! for a program reading `Fixed` offsets, whether this kernel's record has
//! them where the program reads them.
use std::{collections::BTreeMap, fmt};

use vmtrace_common::{Tp, TpField, TpOffsets, TpRead, TP_FIELDS, TP_FIELD_COUNT};

use super::preflight::tracepoint_dir;

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    /// The declaration, as `unsigned long total_vm` or `__data_loc char[] comm`.
    pub decl: String,
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

/// The fields of a format file, in order, the `common_*` ones included.
pub fn parse(text: &str) -> Vec<FormatField> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<FormatField> {
    let mut decl = None;
    let (mut offset, mut size) = (None, None);
    for part in line.trim().split(';') {
        let part = part.trim();
        if let Some(d) = part.strip_prefix("field:") {
            decl = Some(d.trim());
        } else if let Some(o) = part.strip_prefix("offset:") {
            offset = o.trim().parse().ok();
        } else if let Some(s) = part.strip_prefix("size:") {
            size = s.trim().parse().ok();
        }
    }
    let decl = decl?;
    // `char parent_comm[16]`, `__data_loc char[] comm`, `void * func`.
    let last = decl.rsplit([' ', '*']).next()?;
    let name = last.split('[').next()?.trim();
    if name.is_empty() {
        return None;
    }
    Some(FormatField { decl: decl.into(), name: name.into(), offset: offset?, size: size? })
}

/// A `Fixed` field that this kernel's record has elsewhere, in another
/// size, or not at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub tracepoint: String,
    pub field: &'static str,
    /// Where the program reads it (offset, size).
    pub expected: (u16, u8),
    /// Where the format file has it; `None`: not in the record.
    pub actual: Option<(u32, u32)>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (eo, es) = self.expected;
        match self.actual {
            Some((o, s)) => write!(
                f,
                "tracepoint {}: field {} is at offset {o} (size {s}) in this kernel's format, the program reads offset {eo} (size {es})",
                self.tracepoint, self.field
            ),
            None => write!(
                f,
                "tracepoint {}: no field {} in this kernel's format, the program reads offset {eo} (size {es})",
                self.tracepoint, self.field
            ),
        }
    }
}

/// Where `spec` is in `fields`: (offset, size), or `None`.
fn find(spec: &TpField, fields: &[FormatField]) -> Option<(u32, u32)> {
    fields.iter().find(|f| f.name == spec.field).map(|f| (f.offset, f.size))
}

/// The `Fixed` fields of `category:name` that `fields` (its format) does not
/// have where the programs read them.
pub fn check_fixed(category: &str, name: &str, fields: &[FormatField]) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for spec in TP_FIELDS.iter().filter(|s| s.read == TpRead::Fixed && s.is_of(category, name)) {
        let mismatch = |actual| Mismatch {
            tracepoint: format!("{category}:{name}"),
            field: spec.field,
            expected: (spec.offset, spec.size),
            actual,
        };
        if spec.field == TpField::ARGS {
            // A syscall's arguments: every field after `__syscall_nr`, 8 bytes apart.
            let args = fields.iter().skip_while(|f| f.name != "__syscall_nr").skip(1);
            for (i, f) in args.enumerate() {
                let want = u32::from(spec.offset) + 8 * i as u32;
                if f.offset != want || f.size != u32::from(spec.size) {
                    out.push(Mismatch {
                        field: "argument",
                        expected: (want as u16, spec.size),
                        ..mismatch(Some((f.offset, f.size)))
                    });
                }
            }
            continue;
        }
        match find(spec, fields) {
            Some((o, s)) if o == u32::from(spec.offset) && s == u32::from(spec.size) => {}
            actual => out.push(mismatch(actual)),
        }
    }
    out
}

/// A `Loaded` field's offset in `fields`: `TpOffsets::MISSING` when the
/// record lacks it or has it in another size.
pub fn loaded_offset(spec: &TpField, fields: &[FormatField]) -> u16 {
    match find(spec, fields) {
        Some((o, s)) if s == u32::from(spec.size) => u16::try_from(o).unwrap_or(TpOffsets::MISSING),
        Some((o, s)) => {
            log::warn!(
                "tracepoint {}: field {} is {s} bytes at offset {o} here, the programs read {} bytes: left unknown",
                spec.tracepoint,
                spec.field,
                spec.size
            );
            TpOffsets::MISSING
        }
        None => TpOffsets::MISSING,
    }
}

/// The offsets for `TP_OFFSETS`, from `formats` ("category:name" → its
/// fields; `None` where the format could not be read). A `Loaded` field of a
/// tracepoint whose format is unreadable keeps the table's offset (the
/// program cannot attach there anyway); `Fixed` rows keep theirs.
pub fn offsets<'a>(formats: impl Fn(&str) -> Option<&'a [FormatField]>) -> TpOffsets {
    let mut out = TpOffsets::TABLE;
    for (i, spec) in TP_FIELDS.iter().enumerate() {
        if spec.read == TpRead::Loaded {
            if let Some(fields) = formats(spec.tracepoint) {
                out.offsets[i] = loaded_offset(spec, fields);
            }
        }
    }
    out
}

/// Reads a format file's text by (category, name).
type ReadFormat = Box<dyn FnMut(&str, &str) -> Option<String>>;

/// The format files of one run, each read and parsed once: the loader takes
/// `TP_OFFSETS` from them, then checks each classic program's `Fixed`
/// fields against them as it attaches it.
pub struct Formats {
    /// A format file's text by (category, name): tracefs, or a test's.
    read: ReadFormat,
    /// "category:name" → its fields; `None`: unreadable.
    parsed: BTreeMap<String, Option<Vec<FormatField>>>,
}

impl Formats {
    /// The running kernel's (tracefs `events/<category>/<name>/format`).
    pub fn kernel() -> Self {
        Self::with(|c, n| std::fs::read_to_string(tracepoint_dir(c, n).join("format")).ok())
    }

    /// Formats read by `read` (category, name) → the file's text.
    pub fn with(read: impl FnMut(&str, &str) -> Option<String> + 'static) -> Self {
        Self { read: Box::new(read), parsed: BTreeMap::new() }
    }

    /// Reads and parses `tracepoint` ("category:name") unless done before.
    fn load(&mut self, tracepoint: &str) {
        if !self.parsed.contains_key(tracepoint) {
            let fields = tracepoint.split_once(':').and_then(|(c, n)| (self.read)(c, n)).map(|t| parse(&t));
            self.parsed.insert(tracepoint.to_string(), fields);
        }
    }

    fn cached(&self, tracepoint: &str) -> Option<&[FormatField]> {
        self.parsed.get(tracepoint)?.as_deref()
    }

    /// The fields of `category:name`; `None` when its format is unreadable.
    pub fn get(&mut self, category: &str, name: &str) -> Option<&[FormatField]> {
        let tp = format!("{category}:{name}");
        self.load(&tp);
        self.cached(&tp)
    }

    /// The `TP_OFFSETS` of these formats.
    pub fn offsets(&mut self) -> TpOffsets {
        for spec in TP_FIELDS.iter().filter(|s| s.read == TpRead::Loaded) {
            self.load(spec.tracepoint);
        }
        offsets(|tp| self.cached(tp))
    }

    /// `offsets`, with the fields the records lack logged.
    pub fn offsets_logged(&mut self) -> TpOffsets {
        let o = self.offsets();
        let missing = missing_loaded(&o);
        if !missing.is_empty() {
            log::info!("not in this kernel's tracepoint records (read as unknown): {}", missing.join(", "));
        }
        o
    }

    /// The `Fixed` fields `category:name` has elsewhere, as one message;
    /// `None` when all match (or the format is unreadable: attaching then
    /// fails on its own).
    pub fn fixed_mismatch(&mut self, category: &str, name: &str) -> Option<String> {
        let m = check_fixed(category, name, self.get(category, name)?);
        (!m.is_empty()).then(|| m.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
    }
}

/// The `Loaded` fields the running kernel's records lack, as "tracepoint
/// field" (for `vmtrace check` and the log).
pub fn missing_loaded(offsets: &TpOffsets) -> Vec<String> {
    (0..TP_FIELD_COUNT)
        .filter(|&i| TP_FIELDS[i].read == TpRead::Loaded && offsets.offsets[i] == TpOffsets::MISSING)
        .map(|i| format!("{} {}", TP_FIELDS[i].tracepoint, TP_FIELDS[i].field))
        .collect()
}

/// The `OomRecord` fields that `offsets` has no offset for.
pub fn oom_unknown_in(offsets: &TpOffsets) -> Vec<&'static str> {
    [
        (Tp::OomTotalVm, "total_vm_kb"),
        (Tp::OomAnonRss, "anon_rss_kb"),
        (Tp::OomFileRss, "file_rss_kb"),
        (Tp::OomShmemRss, "shmem_rss_kb"),
        (Tp::OomPgtables, "pgtables_kb"),
        (Tp::OomUid, "uid"),
        (Tp::OomScoreAdj, "oom_score_adj"),
    ]
    .into_iter()
    .filter(|&(f, _)| !offsets.known(f))
    .map(|(_, name)| name)
    .collect()
}

/// Whether the OOM kill record's sizes (total_vm … pgtables) were read.
pub fn oom_sizes_known(offsets: &TpOffsets) -> bool {
    [Tp::OomTotalVm, Tp::OomAnonRss, Tp::OomFileRss, Tp::OomShmemRss, Tp::OomPgtables].iter().all(|&f| offsets.known(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6.18's `oom:mark_victim`.
    const MARK_VICTIM_618: &str = "name: mark_victim
ID: 520
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long file_rss;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long shmem_rss;\toffset:40;\tsize:8;\tsigned:0;
\tfield:uid_t uid;\toffset:48;\tsize:4;\tsigned:0;
\tfield:unsigned long pgtables;\toffset:56;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;

print fmt: \"pid=%d\", REC->pid
";

    /// Upstream 6.1's (before 6.8): the pid alone. (Debian's 6.1 has the
    /// 6.8 record: tests/tracefs/formats-6.1.txt.)
    const MARK_VICTIM_61: &str = "name: mark_victim
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;

print fmt: \"pid=%d\", REC->pid
";

    /// 6.1's `sched_process_fork`: `char[16]` comms.
    const FORK_61: &str = "\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;
";

    /// Formats from a table of ("category:name", text); the others unreadable.
    fn formats(table: &'static [(&'static str, &'static str)]) -> Formats {
        Formats::with(move |c, n| {
            table.iter().find(|(t, _)| *t == format!("{c}:{n}")).map(|(_, text)| (*text).to_string())
        })
    }

    #[test]
    fn parses_fields() {
        let f = parse(MARK_VICTIM_618);
        assert_eq!(f.len(), 13);
        assert_eq!(
            f[5],
            FormatField { decl: "__data_loc char[] comm".into(), name: "comm".into(), offset: 12, size: 4 }
        );
        assert_eq!((f[12].name.as_str(), f[12].offset, f[12].size), ("oom_score_adj", 64, 2));
        let fork = parse(FORK_61);
        assert_eq!(fork[0].name, "parent_comm");
        assert_eq!((fork[3].name.as_str(), fork[3].offset), ("child_pid", 44));
        let csd = parse("\tfield:void * func;\toffset:24;\tsize:8;\tsigned:0;");
        assert_eq!((csd[0].name.as_str(), csd[0].offset), ("func", 24));
    }

    #[test]
    fn loaded_offsets_follow_the_format_and_mark_missing_fields() {
        let o = formats(&[("oom:mark_victim", MARK_VICTIM_618), ("sched:sched_process_fork", FORK_61)]).offsets();
        assert_eq!(o.get(Tp::OomAnonRss), 24);
        assert_eq!(o.get(Tp::OomScoreAdj), 64);
        assert_eq!(o.get(Tp::ForkChildPid), 44);
        assert!(oom_sizes_known(&o));
        let o = formats(&[("oom:mark_victim", MARK_VICTIM_61)]).offsets();
        assert_eq!(o.get(Tp::OomPid), 8);
        assert_eq!(o.get(Tp::OomComm), TpOffsets::MISSING);
        assert_eq!(o.get(Tp::OomAnonRss), TpOffsets::MISSING);
        assert!(!oom_sizes_known(&o));
        assert_eq!(oom_unknown_in(&o).len(), 7);
        assert!(missing_loaded(&o).contains(&"oom:mark_victim total_vm".to_string()));
        // Unreadable formats: the table's own offsets.
        assert_eq!(o.get(Tp::ForkChildPid), 20);
        // Another size: unknown, not misread.
        let o = formats(&[(
            "filemap:mm_filemap_add_to_page_cache",
            "\tfield:unsigned int order;\toffset:36;\tsize:4;\tsigned:0;",
        )])
        .offsets();
        assert_eq!(o.get(Tp::AddToCacheOrder), TpOffsets::MISSING);
    }

    #[test]
    fn fixed_fields_are_checked() {
        let rss = "\tfield:unsigned int mm_id;\toffset:8;\tsize:4;\tsigned:0;
\tfield:unsigned int curr;\toffset:12;\tsize:4;\tsigned:0;
\tfield:int member;\toffset:16;\tsize:4;\tsigned:1;
\tfield:long size;\toffset:24;\tsize:8;\tsigned:1;";
        assert!(check_fixed("kmem", "rss_stat", &parse(rss)).is_empty());
        let moved = rss.replace("offset:24", "offset:32");
        let m = check_fixed("kmem", "rss_stat", &parse(&moved));
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].to_string(),
            "tracepoint kmem:rss_stat: field size is at offset 32 (size 8) in this kernel's format, the program reads offset 24 (size 8)"
        );
        let gone = check_fixed("kmem", "rss_stat", &parse(&rss.replace("curr", "other")));
        assert_eq!(gone[0].actual, None);
        assert!(gone[0].to_string().contains("no field curr"), "{}", gone[0]);
        // Loaded fields are never refused.
        assert!(check_fixed("oom", "mark_victim", &parse(MARK_VICTIM_61)).is_empty());
    }

    #[test]
    fn syscall_arguments_are_checked_by_position() {
        let enter = "\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:unsigned long addr;\toffset:16;\tsize:8;\tsigned:0;
\tfield:size_t len;\toffset:24;\tsize:8;\tsigned:0;";
        assert!(check_fixed("syscalls", "sys_enter_munmap", &parse(enter)).is_empty());
        let packed = enter.replace("offset:24", "offset:20");
        let m = check_fixed("syscalls", "sys_enter_munmap", &parse(&packed));
        assert_eq!((m.len(), m[0].expected, m[0].actual), (1, (24, 8), Some((20, 8))));
        let exit = "\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;";
        assert!(check_fixed("syscalls", "sys_exit_munmap", &parse(exit)).is_empty());
        // An enter record is not checked for `ret`.
        assert!(check_fixed("syscalls", "sys_enter_munlockall", &parse(&exit.replace("ret", "x")))
            .iter()
            .all(|m| m.field == "argument"));
    }

    /// The captured format files (vmtrace/tests/tracefs): "category/name" → fields.
    fn captured(text: &str) -> Vec<(String, Vec<FormatField>)> {
        let mut out: Vec<(String, Vec<FormatField>)> = Vec::new();
        for line in text.lines() {
            if let Some(tp) = line.strip_prefix("### ") {
                out.push((tp.to_string(), Vec::new()));
            } else if let (Some(f), Some(last)) = (parse_line(line), out.last_mut()) {
                last.1.push(f);
            }
        }
        out
    }

    /// Every field the programs read, against the real format files of the
    /// kernels the matrix runs: the fixed offsets match everywhere, and the
    /// loaded ones are where each kernel has them.
    #[test]
    fn the_tables_offsets_hold_on_61_612_and_618() {
        for (kernel, text, fork_child_pid) in [
            ("6.1", include_str!("../../tests/tracefs/formats-6.1.txt"), 44),
            ("6.12", include_str!("../../tests/tracefs/formats-6.12.txt"), 44),
            ("6.18", include_str!("../../tests/tracefs/formats-6.18.txt"), 20),
        ] {
            let formats = captured(text);
            let mut seen = 0;
            for (tp, fields) in &formats {
                let (c, n) = tp.split_once('/').unwrap();
                assert_eq!(check_fixed(c, n, fields), vec![], "{kernel} {tp}");
                seen += usize::from(TP_FIELDS.iter().any(|s| s.is_of(c, n)));
            }
            assert!(seen > 30, "{kernel}: {seen} tracepoints");
            let o = offsets(|tp| formats.iter().find(|(t, _)| *t == tp.replace(':', "/")).map(|(_, f)| f.as_slice()));
            assert_eq!(o.get(Tp::ForkChildPid), fork_child_pid, "{kernel}");
            assert!(oom_sizes_known(&o), "{kernel}");
            assert_eq!(missing_loaded(&o), Vec::<String>::new(), "{kernel}");
            for (i, spec) in TP_FIELDS.iter().enumerate() {
                if spec.read == TpRead::Loaded && i != Tp::ForkChildPid as usize {
                    assert_eq!(o.offsets[i], spec.offset, "{kernel} {spec:?}");
                }
            }
        }
    }

    /// Formats served from a capture's sections, and how many reads they took.
    fn from_capture(text: &str) -> (Formats, std::rc::Rc<std::cell::Cell<usize>>) {
        let mut sections: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(tp) = line.strip_prefix("### ") {
                sections.push((tp.replace('/', ":"), String::new()));
            } else if let Some((_, t)) = sections.last_mut() {
                t.push_str(line);
                t.push('\n');
            }
        }
        let reads = std::rc::Rc::new(std::cell::Cell::new(0));
        let counted = reads.clone();
        let formats = Formats::with(move |c, n| {
            counted.set(counted.get() + 1);
            sections.iter().find(|(t, _)| *t == format!("{c}:{n}")).map(|(_, t)| t.clone())
        });
        (formats, reads)
    }

    /// The loader's offsets and its attach checks share one read of each file.
    #[test]
    fn each_format_is_read_once_per_run() {
        let text = include_str!("../../tests/tracefs/formats-6.18.txt");
        let (mut formats, reads) = from_capture(text);
        let loaded: std::collections::BTreeSet<_> =
            TP_FIELDS.iter().filter(|s| s.read == TpRead::Loaded).map(|s| s.tracepoint).collect();
        assert_eq!(formats.offsets(), formats.offsets());
        assert_eq!(reads.get(), loaded.len());
        let all: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("### ")).collect();
        for _ in 0..2 {
            for tp in &all {
                let (c, n) = tp.split_once('/').unwrap();
                assert_eq!(formats.fixed_mismatch(c, n), None, "{tp}");
            }
        }
        assert_eq!(reads.get(), all.len(), "a format read twice");
        // An unreadable one is not read again either.
        assert_eq!(formats.fixed_mismatch("no", "such"), None);
        assert_eq!(formats.get("no", "such"), None);
        assert_eq!(reads.get(), all.len() + 1);
    }

    /// Debian's 6.1 capture with `oom:mark_victim` trimmed to upstream 6.1's
    /// record (the pid alone): every other field the OOM programs read is
    /// unknown, nothing is refused, and the rest of the table is unchanged.
    #[test]
    fn a_61_record_without_the_oom_fields_leaves_them_unknown() {
        let full = include_str!("../../tests/tracefs/formats-6.1.txt");
        let (head, rest) = full.split_once("### oom/mark_victim\n").unwrap();
        let (dropped, after) = rest.split_once("### ").unwrap();
        assert!(dropped.contains("total_vm"), "{dropped}");
        let trimmed =
            format!("{head}### oom/mark_victim\n\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;\n### {after}");
        let (mut formats, _) = from_capture(&trimmed);
        let o = formats.offsets();
        assert_eq!(o.get(Tp::OomPid), 8);
        assert!(!o.known(Tp::OomComm));
        assert!(!oom_sizes_known(&o));
        assert_eq!(
            oom_unknown_in(&o),
            ["total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb", "pgtables_kb", "uid", "oom_score_adj"]
        );
        assert_eq!(missing_loaded(&o).len(), 8, "{:?}", missing_loaded(&o));
        assert!(missing_loaded(&o).iter().all(|m| m.starts_with("oom:mark_victim ")));
        assert_eq!(o.get(Tp::ForkChildPid), 44);
        assert_eq!(formats.fixed_mismatch("oom", "mark_victim"), None);
    }

    #[test]
    fn every_row_is_named_once() {
        for (i, a) in TP_FIELDS.iter().enumerate() {
            assert!(a.tracepoint.contains(':'), "{a:?}");
            for b in &TP_FIELDS[i + 1..] {
                assert!(!(a.tracepoint == b.tracepoint && a.field == b.field), "{a:?} twice");
            }
        }
    }
}
