//! Draws one `vmtrace top` frame with ratatui. Laid out for 80×24 first:
//! three header lines, a line per banner, the table, one line of keys.
//! ratatui redraws only the cells that changed, so nothing flickers over ssh.
use ratatui::{
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Cell, Paragraph, Row, Table},
    Frame,
};

use super::{
    layout,
    model::{human, human_bytes, human_growth, RegionRow, Snapshot, SortKey},
};
use crate::model::bytes;

/// Which table is on screen (`r` switches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pane {
    #[default]
    Processes,
    Regions,
}

/// What the keys change.
#[derive(Clone, Copy, Debug, Default)]
pub struct ViewState {
    pub sort: SortKey,
    pub paused: bool,
    pub pane: Pane,
}

fn pct(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}%")
    } else {
        format!("{v:.1}%")
    }
}

/// Right-aligned numeric cell of `w` columns.
fn num(s: &str, w: usize) -> Cell<'static> {
    Cell::from(format!("{s:>w$}"))
}

/// One piece of a header line: it moves to the next line whole.
type Part = Vec<Span<'static>>;

fn plain(s: String) -> Part {
    vec![Span::raw(s)]
}

/// `parts` joined by `sep`, broken into lines of at most `room` columns. A
/// part that starts a line drops a leading "· " (it only joins).
fn lines_of(parts: &[Part], sep: &'static str, room: usize) -> Vec<Line<'static>> {
    let width = |p: &Part| p.iter().map(Span::width).sum::<usize>();
    let widths: Vec<usize> = parts.iter().map(width).collect();
    let mut out = Vec::new();
    for range in layout::pack(&widths, sep.chars().count(), room) {
        let mut spans: Vec<Span<'static>> = Vec::new();
        for (i, part) in parts[range.clone()].iter().enumerate() {
            if i > 0 {
                spans.push(Span::raw(sep));
            }
            for (j, sp) in part.iter().enumerate() {
                let mut sp = sp.clone();
                if i == 0 && j == 0 {
                    if let Some(rest) = sp.content.strip_prefix("· ") {
                        sp.content = rest.to_string().into();
                    }
                }
                spans.push(sp);
            }
        }
        let line = Line::from(spans);
        if line.width() <= room {
            out.push(line);
        } else {
            // One part wider than the screen: its words wrap, in its first style.
            let style = line.spans.first().map(|s| s.style).unwrap_or_default();
            let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
            out.extend(layout::wrap(&text, room).into_iter().map(|l| Line::from(Span::styled(l, style))));
        }
    }
    out
}

pub fn draw(frame: &mut Frame, snap: &Snapshot, view: ViewState) {
    let area = frame.area();
    let room = usize::from(area.width);
    let head = header(snap, view, room);
    let mut banners = banners(snap, room);
    let keys = keys_lines(view, room);
    let fixed = head.len() + keys.len();
    // The table keeps 3 lines (header and 2 rows); banners past that wait.
    banners.truncate(usize::from(area.height).saturating_sub(fixed + 3));
    let table = match (view.pane, &snap.regions) {
        (Pane::Processes, _) => process_table(snap, room).map(Some),
        (Pane::Regions, None) => Some(None),
        (Pane::Regions, Some(regions)) => region_table(regions, room).map(Some),
    };
    let (Some(table), true) = (table, area.width >= layout::MIN_WIDTH && usize::from(area.height) >= fixed + 3) else {
        let msg = format!(
            "terminal too small ({}×{}): vmtrace top needs at least {} columns and {} lines",
            area.width,
            area.height,
            layout::MIN_WIDTH,
            fixed + 3
        );
        let lines: Vec<Line> = layout::wrap(&msg, room.max(1)).into_iter().map(Line::from).collect();
        frame.render_widget(Paragraph::new(lines), area);
        return;
    };
    let as_u16 = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
    let [head_a, ban_a, table_a, keys_a] = Layout::vertical([
        Constraint::Length(as_u16(head.len())),
        Constraint::Length(as_u16(banners.len())),
        Constraint::Min(3),
        Constraint::Length(as_u16(keys.len())),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(head), head_a);
    frame.render_widget(Paragraph::new(banners), ban_a);
    match table {
        Some(t) => frame.render_widget(t, table_a),
        None => frame.render_widget(Paragraph::new("regions are not traced"), table_a),
    }
    frame.render_widget(Paragraph::new(keys), keys_a);
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

fn banners(snap: &Snapshot, room: usize) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut add = |text: &str, bg: Color| {
        let style = Style::default().fg(Color::White).bg(bg).add_modifier(Modifier::BOLD);
        for l in layout::wrap(text, room.saturating_sub(2).max(1)) {
            out.push(Line::from(Span::styled(format!(" {l} "), style)));
        }
    };
    if let Some(e) = &snap.ended {
        add(e, Color::Blue);
    }
    for st in &snap.storms {
        add(st, Color::Red);
    }
    if let Some(o) = &snap.oom {
        add(o, Color::Magenta);
    }
    for f in snap.findings.iter().take(3) {
        add(&format!("FINDING {f}"), Color::Yellow);
    }
    if snap.findings.len() > 3 {
        add(
            &format!("FINDING … {} more (summary.txt of `vmtrace record` lists them all)", snap.findings.len() - 3),
            Color::Yellow,
        );
    }
    out
}

fn header(snap: &Snapshot, view: ViewState, room: usize) -> Vec<Line<'static>> {
    let mut title = vec![
        vec![Span::styled("vmtrace top", bold())],
        plain(snap.target.clone()),
        plain(format!("up {:.0}s", snap.uptime_s)),
        plain(format!("{} faults", human(snap.total_faults as f64))),
        plain(format!("sort {}", view.sort.label())),
    ];
    if view.paused {
        title.push(vec![Span::styled("PAUSED", Style::default().add_modifier(Modifier::REVERSED))]);
    }
    let total = &snap.total;
    let per_s = vec![
        plain(format!("per s: faults {}", human(total.faults))),
        plain(format!("maj {}", human(total.major))),
        plain(format!("COW {}", human(total.cow))),
        plain(format!("munmap {}", human(total.munmap))),
        plain(format!("IPI {}", human(total.ipis))),
        plain(format!("· handler {}", pct(total.fault_pct))),
    ];
    let mut out = lines_of(&title, " · ", room);
    out.extend(lines_of(&per_s, " ", room));
    out.extend(lines_of(&[plain(format!("lost {}", snap.lost_events)), plain(snap.dtlb.clone())], " · ", room));
    if let Some(numa) = &snap.numa {
        let parts: Vec<Part> = numa.parts().into_iter().map(plain).collect();
        out.extend(lines_of(&parts, " · ", room));
    }
    out
}

/// The text column of a table and how it is cut when narrowed.
struct TextCol {
    index: usize,
    shrink_to: usize,
    elide: fn(&str, usize) -> String,
}

/// A table of `names` over `rows` of preformatted cells, fitted to `room`
/// columns by [`layout::fit`]; None when not even its essentials fit.
fn fitted_table(
    names: &[&'static str],
    drop_order: &[u8],
    text: &TextCol,
    rows: &[Vec<String>],
    room: usize,
) -> Option<Table<'static>> {
    let cols: Vec<layout::Col> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            // Numbers get 6 columns at least ("999.9k"), so widths hold still
            // from one refresh to the next.
            let floor = if i == text.index { 0 } else { 6 };
            let widest = rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
            layout::Col {
                natural: widest.max(name.len()).max(floor),
                drop_order: drop_order[i],
                shrink_to: (i == text.index).then_some(text.shrink_to),
            }
        })
        .collect();
    let widths = layout::fit(&cols, room)?;
    let shown: Vec<(usize, usize)> = widths.iter().enumerate().filter_map(|(i, w)| w.map(|w| (i, w))).collect();
    let cell = |i: usize, w: usize, s: &str| {
        if i == text.index {
            Cell::from((text.elide)(s, w))
        } else {
            num(s, w)
        }
    };
    let head = Row::new(shown.iter().map(|&(i, w)| cell(i, w, names[i])))
        .style(Style::default().add_modifier(Modifier::REVERSED));
    let body: Vec<Row> = rows.iter().map(|r| Row::new(shown.iter().map(|&(i, w)| cell(i, w, &r[i])))).collect();
    let constraints: Vec<Constraint> =
        shown.iter().map(|&(_, w)| Constraint::Length(u16::try_from(w).unwrap_or(u16::MAX))).collect();
    Some(Table::new(body, constraints).header(head).column_spacing(1))
}

/// The process table's NODE column (hosts with two NUMA nodes or more):
/// where it goes and when it drops (after the time share, before the
/// resident growth).
const NODE_COL: (usize, u8) = (4, 3);

fn process_table(snap: &Snapshot, room: usize) -> Option<Table<'static>> {
    let mut names =
        vec!["PID", "COMM", "RSS", "ΔRSS/s", "FAULT/s", "MAJ/s", "TIME%", "COW/s", "UNMAP/s", "IPI/s", "FAULTS"];
    // What goes first when narrow: munmap and COW rates, then IPIs, majors,
    // the time share, the resident growth, the total; pid, name, resident
    // size and fault rate stay.
    let mut drop_order = vec![0, 0, 0, 2, 0, 4, 3, 6, 7, 5, 1];
    let numa = snap.numa.is_some();
    if numa {
        names.insert(NODE_COL.0, "NODE");
        drop_order.insert(NODE_COL.0, NODE_COL.1);
    }
    let rows: Vec<Vec<String>> = snap
        .procs
        .iter()
        .map(|p| {
            let r = &p.rates;
            let mut row = vec![
                p.pid.to_string(),
                p.comm.clone(),
                p.resident.map_or_else(|| "-".into(), |b| human_bytes(b as f64)),
                p.resident_per_s.map_or_else(|| "-".into(), human_growth),
                human(r.faults),
                human(r.major),
                pct(r.fault_pct),
                human(r.cow),
                human(r.munmap),
                human(r.ipis),
                human(p.total_faults as f64),
            ];
            if numa {
                row.insert(NODE_COL.0, p.node.clone().unwrap_or_else(|| "-".into()));
            }
            row
        })
        .collect();
    let text = TextCol { index: 1, shrink_to: 8, elide: layout::keep_head };
    fitted_table(&names, &drop_order, &text, &rows, room)
}

fn region_table(regions: &[RegionRow], room: usize) -> Option<Table<'static>> {
    let names = ["PID", "REGION", "KIND", "SIZE", "FAULT/s", "MAJ/s", "COW/s", "TIME%", "FAULTS", "COW"];
    // What goes first when narrow: majors, the COW rate, the time share,
    // the size, the kind; pid, name, fault rate and the totals stay longest.
    let drop_order = [0, 0, 3, 4, 0, 7, 6, 5, 1, 2];
    let rows: Vec<Vec<String>> = regions
        .iter()
        .map(|g| {
            let r = &g.rates;
            vec![
                g.pid.to_string(),
                format!("{} {}", g.comm, g.name),
                g.kind.label().to_string(),
                bytes(g.size),
                human(r.faults),
                human(r.major),
                human(r.cow),
                pct(r.fault_pct),
                human(g.total_faults as f64),
                human(g.total_cow as f64),
            ]
        })
        .collect();
    // The name shrinks to 20 (a file name, `[python arena] ×96`) before
    // the rates drop.
    let text = TextCol { index: 1, shrink_to: 20, elide: layout::keep_tail };
    fitted_table(&names, &drop_order, &text, &rows, room)
}

fn keys_lines(view: ViewState, room: usize) -> Vec<Line<'static>> {
    let other = if view.pane == Pane::Processes { "regions" } else { "processes" };
    let key = |k: &'static str, what: String| vec![Span::styled(k, bold()), Span::raw(format!(" {what}"))];
    let parts = vec![
        key("q", "quit".into()),
        key("s", format!("sort ({})", view.sort.next().label())),
        key("p", (if view.paused { "resume" } else { "pause" }).into()),
        key("r", other.into()),
    ];
    lines_of(&parts, "  ", room)
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::{model::live::Rates, top::model::ProcRow};

    fn screen_at(s: &Snapshot, v: ViewState, w: u16, h: u16) -> String {
        let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| draw(f, s, v)).unwrap();
        let buf = term.backend().buffer().clone();
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>() + "\n").collect()
    }

    fn screen(s: &Snapshot, v: ViewState) -> String {
        screen_at(s, v, 80, 24)
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            target: "pid 4242".into(),
            uptime_s: 12.0,
            total_faults: 7_000_000,
            total: Rates {
                faults: 612_300.0,
                major: 12_300.0,
                fault_pct: 143.0,
                cow: 12_300.0,
                munmap: 12_300.0,
                ipis: 12_300.0,
                ..Rates::default()
            },
            procs: vec![
                ProcRow {
                    pid: 4242,
                    comm: "python3".into(),
                    rates: Rates { faults: 612_300.0, major: 3.0, fault_pct: 43.0, ipis: 15_200.0, ..Rates::default() },
                    total_faults: 7_000_000,
                    resident: Some(130 << 20),
                    resident_per_s: Some(16.0 * 1_048_576.0),
                    node: Some("1:97%".into()),
                },
                ProcRow {
                    pid: 4_194_303,
                    comm: "pt_data_worker7".into(),
                    rates: Rates {
                        faults: 999_900.0,
                        major: 9_999.0,
                        fault_pct: 1234.0,
                        cow: 123_456.0,
                        munmap: 54_321.0,
                        ipis: 98_765.0,
                        ..Rates::default()
                    },
                    total_faults: 123_456_789,
                    resident: Some(2560 << 20),
                    resident_per_s: Some(-96.0 * 1_048_576.0),
                    node: Some("0:100%".into()),
                },
            ],
            regions: Some(vec![
                RegionRow {
                    pid: 4242,
                    comm: "python3".into(),
                    name: "/data/model.safetensors".into(),
                    kind: crate::model::RegionKind::File,
                    size: 512 << 20,
                    rates: Rates { faults: 1000.0, ..Rates::default() },
                    total_faults: 5000,
                    total_cow: 0,
                },
                RegionRow {
                    pid: 4243,
                    comm: "pt_data_worker0".into(),
                    name: "[python arena] ×96".into(),
                    kind: crate::model::RegionKind::PythonArena,
                    size: 96 << 20,
                    rates: Rates { faults: 800.0, cow: 790.0, ..Rates::default() },
                    total_faults: 22_211,
                    total_cow: 22_147,
                },
            ]),
            storms: vec!["STORM pid 4242 (python3) 15.2k IPIs/s peak, for 3 s: munmap ← free ← worker_loop".into()],
            findings: vec![
                "heap_trim_refault python3 (pid 4242): The heap took 601688 faults on 1521 distinct pages".into()
            ],
            dtlb: "dTLB misses: unsupported".into(),
            ..Snapshot::default()
        }
    }

    /// The cells of the table row that starts with `pid`, and the header.
    fn row(text: &str, pid: &str) -> (Vec<String>, Vec<String>) {
        let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        let head = text.lines().find(|l| l.trim_start().starts_with("PID")).map(words).unwrap_or_default();
        let row = text.lines().find(|l| l.split_whitespace().next() == Some(pid)).map(words).unwrap_or_default();
        (head, row)
    }

    #[test]
    fn fits_80_by_24() {
        let text = screen(&snapshot(), ViewState::default());
        assert!(text.contains("4242"), "{text}");
        assert!(text.contains("612.3k"), "{text}");
        assert!(text.contains("STORM"), "{text}");
        assert!(text.lines().nth(1).unwrap().trim_end().ends_with("handler 143%"), "totals fit one line:\n{text}");
        assert!(text.contains("FAULTS"), "the last column fits in 80 columns:\n{text}");
        let (head, python) = row(&text, "4242");
        let at = |name: &str| head.iter().position(|h| h == name).and_then(|i| python.get(i)).cloned();
        assert_eq!((at("RSS"), at("ΔRSS/s")), (Some("130M".into()), Some("+16M".into())), "{text}");
        assert!(text.lines().last().unwrap().contains("q quit"), "{text}");
    }

    /// Whatever the width, a number on screen is whole: every cell of a row
    /// is the value it stands for, and columns drop (lowest priority first)
    /// rather than cut.
    #[test]
    fn no_number_is_ever_cut_at_60_80_or_200_columns() {
        let snap = snapshot();
        let whole = [
            ("PID", "4194303"),
            ("COMM", "pt_data_worker7"),
            ("RSS", "2.5G"),
            ("ΔRSS/s", "-96M"),
            ("FAULT/s", "999.9k"),
            ("MAJ/s", "9999"),
            ("TIME%", "1234%"),
            ("COW/s", "123.5k"),
            ("UNMAP/s", "54.3k"),
            ("IPI/s", "98.8k"),
            ("FAULTS", "123M"),
        ];
        for (w, dropped) in [(200, 0), (80, 1), (60, 3), (50, 5)] {
            let text = screen_at(&snap, ViewState::default(), w, 24);
            let (head, row) = row(&text, "4194303");
            assert_eq!(head.len(), whole.len() - dropped, "{w} columns:\n{text}");
            assert_eq!(head.len(), row.len(), "{w} columns:\n{text}");
            for (name, cell) in head.iter().zip(&row) {
                let (_, want) = whole.iter().find(|(n, _)| n == name).unwrap();
                // A narrowed name ends in an ellipsis; numbers never change.
                let ok = cell == want
                    || (*name == "COMM" && cell.ends_with('…') && want.starts_with(cell.trim_end_matches('…')));
                assert!(ok, "{w} columns: {name} shows {cell:?}, not {want:?}:\n{text}");
            }
            for line in text.lines() {
                assert!(line.trim_end().chars().count() <= usize::from(w), "{line}");
            }
            // The header lines break between parts, never inside one.
            assert!(text.contains("handler 143%") && text.contains("7.0M faults"), "{w} columns:\n{text}");
        }
        // The least important columns are the ones gone: at 80 the munmap
        // rate, at 60 the COW and IPI rates too, at 50 the majors and the
        // time share; the resident size and its growth stay.
        let heads = |w| row(&screen_at(&snap, ViewState::default(), w, 24), "4194303").0.join(" ");
        assert_eq!(heads(80), "PID COMM RSS ΔRSS/s FAULT/s MAJ/s TIME% COW/s IPI/s FAULTS");
        assert_eq!(heads(60), "PID COMM RSS ΔRSS/s FAULT/s MAJ/s TIME% FAULTS");
        assert_eq!(heads(50), "PID COMM RSS ΔRSS/s FAULT/s FAULTS");
    }

    /// With two NUMA nodes or more: a header line with the nodes and the
    /// shown processes' pages on each, and a NODE column beside the
    /// resident size that drops after the time share when narrow. With one
    /// node (`numa` None, every other test) neither.
    #[test]
    fn numa_header_and_node_column() {
        use crate::top::numa::NodeTotals;
        let mut snap = snapshot();
        snap.numa = Some(NodeTotals { nodes: vec![0, 1], pages: [(0, 256), (1, 970)].into(), processes: 2 });
        let text = screen(&snap, ViewState::default());
        assert!(text.contains("NUMA nodes 0,1 · node 0 1.0M · node 1 3.8M · resident, 2 processes shown"), "{text}");
        let cells = |text: &str, pid: &str| {
            let (head, row) = row(text, pid);
            assert_eq!(head.len(), row.len(), "{text}");
            head.into_iter().zip(row).collect::<Vec<_>>()
        };
        let at = |cells: &[(String, String)], name: &str| cells.iter().find(|c| c.0 == name).map(|c| c.1.clone());
        let python = cells(&text, "4242");
        assert_eq!(at(&python, "NODE").as_deref(), Some("1:97%"), "{text}");
        assert_eq!(at(&python, "FAULT/s").as_deref(), Some("612.3k"), "{text}");
        let wide = screen_at(&snap, ViewState::default(), 200, 24);
        let heads = |text: &str| row(text, "4194303").0.join(" ");
        assert_eq!(heads(&wide), "PID COMM RSS ΔRSS/s NODE FAULT/s MAJ/s TIME% COW/s UNMAP/s IPI/s FAULTS");
        assert_eq!(at(&cells(&wide, "4194303"), "NODE").as_deref(), Some("0:100%"));
        let narrow = screen_at(&snap, ViewState::default(), 60, 24);
        assert_eq!(heads(&narrow), "PID COMM RSS ΔRSS/s NODE FAULT/s TIME% FAULTS", "{narrow}");
        let narrower = screen_at(&snap, ViewState::default(), 50, 24);
        assert_eq!(heads(&narrower), "PID COMM RSS ΔRSS/s FAULT/s FAULTS", "{narrower}");
        // A row not read yet.
        snap.procs[0].node = None;
        assert_eq!(at(&cells(&screen(&snap, ViewState::default()), "4242"), "NODE").as_deref(), Some("-"));
        assert!(!screen(&snapshot(), ViewState::default()).contains("NUMA"), "one node: no header line");
    }

    #[test]
    fn the_regions_pane_fits_narrow_screens_too() {
        let v = ViewState { pane: Pane::Regions, ..ViewState::default() };
        for w in [60, 80, 200] {
            let text = screen_at(&snapshot(), v, w, 24);
            let (head, row) = row(&text, "4242");
            // The region's name and size hold spaces: the totals are the last two cells.
            assert!(head.ends_with(&["FAULTS".to_string(), "COW".to_string()]), "{w}:\n{text}");
            assert_eq!(row[row.len() - 2..], ["5000", "0"], "{w}:\n{text}");
            assert!(text.contains("safetensors"), "{w}: the file name survives:\n{text}");
            // A worker's Python arenas: one row, of its own kind, with its COW.
            assert!(head.contains(&"KIND".to_string()), "{w}:\n{text}");
            let (_, arenas) = self::row(&text, "4243");
            assert!(arenas.contains(&"python".to_string()), "{w}:\n{text}");
            assert_eq!(arenas[arenas.len() - 2..], ["22.2k", "22.1k"], "{w}:\n{text}");
        }
    }

    #[test]
    fn below_the_minimum_a_message_says_how_big() {
        let text = screen_at(&snapshot(), ViewState::default(), 30, 24);
        assert!(text.contains("terminal too small (30×24)"), "{text}");
        assert!(!text.contains("4242"), "no table at all rather than a cut one:\n{text}");
        let text = screen_at(&snapshot(), ViewState::default(), 80, 6);
        assert!(text.contains("too small"), "{text}");
    }

    #[test]
    fn regions_pane_and_pause() {
        let v = ViewState { pane: Pane::Regions, paused: true, ..ViewState::default() };
        let text = screen(&snapshot(), v);
        assert!(text.contains("model.safetensors"), "{text}");
        assert!(text.contains("512.0 MiB"), "{text}");
        assert!(text.contains("PAUSED"), "{text}");
    }
}
