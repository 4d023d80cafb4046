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

use super::model::{human, RegionRow, Snapshot, SortKey};
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

fn banner(text: &str, bg: Color) -> Line<'static> {
    Line::from(Span::styled(format!(" {text} "), Style::default().fg(Color::White).bg(bg).add_modifier(Modifier::BOLD)))
}

/// The end of `s` in at most `room` columns: of a path, the file name
/// matters most.
fn keep_tail(s: &str, room: usize) -> String {
    let n = s.chars().count();
    if n <= room {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - room + 1).collect();
    format!("…{tail}")
}

/// Right-aligned numeric cell of `w` columns.
fn num(s: &str, w: usize) -> Cell<'static> {
    Cell::from(format!("{s:>w$}"))
}

pub fn draw(frame: &mut Frame, snap: &Snapshot, view: ViewState) {
    let banners = banners(snap);
    let [head, ban, table, keys] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(banners.len() as u16),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header(snap, view)), head);
    frame.render_widget(Paragraph::new(banners), ban);
    match (view.pane, &snap.regions) {
        (Pane::Processes, _) => frame.render_widget(process_table(snap), table),
        (Pane::Regions, None) => frame.render_widget(Paragraph::new("regions are not traced"), table),
        (Pane::Regions, Some(regions)) => frame.render_widget(region_table(regions, table.width), table),
    }
    frame.render_widget(Paragraph::new(keys_line(view)), keys);
}

fn bold() -> Style {
    Style::default().add_modifier(Modifier::BOLD)
}

fn banners(snap: &Snapshot) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    if let Some(e) = &snap.ended {
        out.push(banner(e, Color::Blue));
    }
    for st in &snap.storms {
        out.push(banner(st, Color::Red));
    }
    if let Some(o) = &snap.oom {
        out.push(banner(o, Color::Magenta));
    }
    out
}

fn header(snap: &Snapshot, view: ViewState) -> Vec<Line<'static>> {
    let mut title = vec![
        Span::styled("vmtrace top", bold()),
        Span::raw(format!(
            " · {} · up {:.0}s · {} faults · sort {}",
            snap.target,
            snap.uptime_s,
            human(snap.total_faults as f64),
            view.sort.label()
        )),
    ];
    if view.paused {
        title.push(Span::styled(" · PAUSED", Style::default().add_modifier(Modifier::REVERSED)));
    }
    let total = &snap.total;
    vec![
        Line::from(title),
        Line::from(format!(
            "per s: faults {} maj {} COW {} munmap {} IPI {} · handler {}",
            human(total.faults),
            human(total.major),
            human(total.cow),
            human(total.munmap),
            human(total.ipis),
            pct(total.fault_pct)
        )),
        Line::from(format!("lost {} · {}", snap.lost_events, snap.dtlb)),
    ]
}

/// The header row: names right-aligned over numbers, `text_col` left.
fn head_row(names: &[&'static str], widths: &[usize], text_col: usize) -> Row<'static> {
    Row::new(names.iter().zip(widths).enumerate().map(
        |(i, (name, w))| {
            if i == text_col {
                Cell::from(*name)
            } else {
                num(name, *w)
            }
        },
    ))
    .style(Style::default().add_modifier(Modifier::REVERSED))
}

fn process_table(snap: &Snapshot) -> Table<'static> {
    let widths = [7, 14, 8, 7, 6, 7, 8, 7, 8];
    let head =
        head_row(&["PID", "COMM", "FAULT/s", "MAJ/s", "TIME%", "COW/s", "UNMAP/s", "IPI/s", "FAULTS"], &widths, 1);
    let rows: Vec<Row> = snap
        .procs
        .iter()
        .map(|p| {
            let r = &p.rates;
            Row::new([
                num(&p.pid.to_string(), widths[0]),
                Cell::from(p.comm.clone()),
                num(&human(r.faults), widths[2]),
                num(&human(r.major), widths[3]),
                num(&pct(r.fault_pct), widths[4]),
                num(&human(r.cow), widths[5]),
                num(&human(r.munmap), widths[6]),
                num(&human(r.ipis), widths[7]),
                num(&human(p.total_faults as f64), widths[8]),
            ])
        })
        .collect();
    Table::new(rows, widths.map(|w| Constraint::Length(w as u16))).header(head).column_spacing(1)
}

fn region_table(regions: &[RegionRow], width: u16) -> Table<'static> {
    // 0 = the region's name takes what is left.
    let widths = [7, 0, 9, 8, 7, 6, 8];
    let head = head_row(&["PID", "REGION", "SIZE", "FAULT/s", "MAJ/s", "TIME%", "FAULTS"], &widths, 1);
    let fixed: usize = widths.iter().sum::<usize>() + widths.len() - 1;
    let room = usize::from(width).saturating_sub(fixed).max(8);
    let rows: Vec<Row> = regions
        .iter()
        .map(|g| {
            let r = &g.rates;
            Row::new([
                num(&g.pid.to_string(), widths[0]),
                Cell::from(keep_tail(&format!("{} {}", g.comm, g.name), room)),
                num(&bytes(g.size), widths[2]),
                num(&human(r.faults), widths[3]),
                num(&human(r.major), widths[4]),
                num(&pct(r.fault_pct), widths[5]),
                num(&human(g.total_faults as f64), widths[6]),
            ])
        })
        .collect();
    let constraints = widths.map(|w| if w == 0 { Constraint::Fill(1) } else { Constraint::Length(w as u16) });
    Table::new(rows, constraints).header(head).column_spacing(1)
}

fn keys_line(view: ViewState) -> Line<'static> {
    let other = if view.pane == Pane::Processes { "regions" } else { "processes" };
    Line::from(vec![
        Span::styled("q", bold()),
        Span::raw(" quit  "),
        Span::styled("s", bold()),
        Span::raw(format!(" sort ({})  ", view.sort.next().label())),
        Span::styled("p", bold()),
        Span::raw(if view.paused { " resume  " } else { " pause  " }),
        Span::styled("r", bold()),
        Span::raw(format!(" {other}")),
    ])
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::{model::live::Rates, top::model::ProcRow};

    fn screen(s: &Snapshot, v: ViewState) -> String {
        let mut term = Terminal::new(TestBackend::new(80, 24)).unwrap();
        term.draw(|f| draw(f, s, v)).unwrap();
        let buf = term.backend().buffer().clone();
        (0..24).map(|y| (0..80).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>() + "\n").collect()
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            target: "pid 4242".into(),
            uptime_s: 12.0,
            total: Rates {
                faults: 612_300.0,
                major: 12_300.0,
                fault_pct: 143.0,
                cow: 12_300.0,
                munmap: 12_300.0,
                ipis: 12_300.0,
                ..Rates::default()
            },
            procs: vec![ProcRow {
                pid: 4242,
                comm: "python3".into(),
                rates: Rates { faults: 612_300.0, major: 3.0, fault_pct: 43.0, ipis: 15_200.0, ..Rates::default() },
                total_faults: 7_000_000,
            }],
            regions: Some(vec![RegionRow {
                pid: 4242,
                comm: "python3".into(),
                name: "/data/model.safetensors".into(),
                size: 512 << 20,
                rates: Rates { faults: 1000.0, ..Rates::default() },
                total_faults: 5000,
            }]),
            storms: vec!["STORM pid 4242 (python3)".into()],
            dtlb: "dTLB misses: unsupported".into(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn fits_80_by_24() {
        let text = screen(&snapshot(), ViewState::default());
        assert!(text.contains("4242"), "{text}");
        assert!(text.contains("612.3k"), "{text}");
        assert!(text.contains("STORM"), "{text}");
        assert!(text.lines().nth(1).unwrap().trim_end().ends_with("handler 143%"), "totals fit one line:\n{text}");
        assert!(text.contains("FAULTS"), "the last column fits in 80 columns:\n{text}");
        assert!(text.lines().last().unwrap().contains("q quit"), "{text}");
    }

    #[test]
    fn long_names_keep_their_end() {
        assert_eq!(keep_tail("python3 /a/b/model.safetensors", 12), "…safetensors");
        assert_eq!(keep_tail("short", 12), "short");
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
