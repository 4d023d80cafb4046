//! Outputs of a real recording kept byte for byte (no root needed): the
//! `summary.json` of `vmtrace/tests/golden/` (a recording of a touch, a mapped
//! safetensors read and a memcg OOM kill, its regions cut to a few of each
//! kind) must load and serialize back unchanged, and the text and HTML
//! renderers must reproduce the files beside it. Set `VMTRACE_BLESS=1` to
//! rewrite them (summary.json gains added fields) after an intended change
//! of output, and commit the difference with why.
use std::{fs, path::Path};

use vmtrace::{
    model::Summary,
    report::{html, text},
};

fn golden(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name)
}

fn load() -> (String, Summary) {
    let json = fs::read_to_string(golden("summary.json")).expect("tests/golden/summary.json");
    let s: Summary = serde_json::from_str(&json).expect("the golden summary.json loads into the model");
    (json, s)
}

fn check(name: &str, actual: &str) {
    let path = golden(name);
    if std::env::var_os("VMTRACE_BLESS").is_some() {
        fs::write(&path, actual).expect("writing a golden file");
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if expected != actual {
        let at = expected.lines().zip(actual.lines()).position(|(a, b)| a != b);
        panic!(
            "{name} differs from its golden file (first differing line {at:?}):\n--- expected\n{expected}\n--- actual\n{actual}"
        );
    }
}

#[test]
fn summary_json_round_trips_byte_for_byte() {
    let (json, s) = load();
    let again = serde_json::to_string_pretty(&s).expect("serializing the summary");
    if std::env::var_os("VMTRACE_BLESS").is_some() {
        // Fields the model added since the recording, at their defaults.
        fs::write(golden("summary.json"), again + "\n").expect("writing the golden summary.json");
        return;
    }
    assert_eq!(json.trim_end_matches('\n'), again, "summary.json changed on a load/serialize round trip");
}

#[test]
fn summary_txt_is_unchanged() {
    check("summary.txt", &text::render(&load().1));
}

#[test]
fn regions_txt_is_unchanged() {
    check("regions.txt", &text::render_regions(&load().1));
}

#[test]
fn report_html_is_unchanged() {
    // A directory without flamegraphs: the page links none, so it is the same wherever it is rendered.
    check("report.html", &html::render(&load().1, Path::new("/nonexistent/vmtrace-golden")));
}

#[test]
fn a_version_1_summary_reads_as_its_version_2_form() {
    // The golden recording as version 1 wrote it: dense histograms, every
    // bucket and split written out, compact.
    let v1 = fs::read_to_string(golden("summary-v1.json")).expect("tests/golden/summary-v1.json");
    let mut old: Summary = serde_json::from_str(&v1).expect("a version-1 summary.json still loads");
    assert_eq!(old.version, 1);
    let (_, new) = load();
    assert_eq!(new.version, vmtrace::model::SUMMARY_VERSION);
    old.version = new.version;
    assert_eq!(old, new, "the dense file and the sparse one hold the same recording");
    assert_eq!(text::render(&old), text::render(&new));
    assert_eq!(text::render_regions(&old), text::render_regions(&new));
}

/// The findings of the golden recording (its memcg OOM kill), as summary.txt
/// opens with them.
#[test]
fn findings_txt_is_unchanged() {
    let s = load().1;
    let findings = vmtrace::model::findings::diagnose(&s);
    assert!(findings.iter().any(|f| f.kind == "oom_kill"), "{findings:#?}");
    check("findings.txt", &vmtrace::model::findings::render_text(&findings));
}

/// A process with a rank, pod and container (uc30's k1: `record` of a pod's
/// rank-2 job) is named with them in summary.txt's and regions.txt's tables
/// and report.html's, as the folded files, pprof and Perfetto name it; the
/// columns after the name stay aligned, and a process without stays as it was.
#[test]
fn tables_name_a_process_with_its_rank_pod_and_container() {
    use vmtrace::model::{Identity, Rank};
    let mut s = load().1;
    let p = s.processes.iter_mut().find(|p| p.pid == 13787).expect("pid 13787 in the golden recording");
    p.identity = Identity {
        cgroup: Some(
            "/kubepods/pod7a8b9c0d-1111-2222-3333-444455556666/".to_string() + "c0ffee001122" + &"0".repeat(52),
        ),
        pod_uid: Some("7a8b9c0d-1111-2222-3333-444455556666".into()),
        container_id: Some("c0ffee001122".to_string() + &"0".repeat(52)),
        container_runtime: Some("kubepods".into()),
        rank: Some(Rank { rank: Some(6), local_rank: Some(6), world_size: Some(8) }),
    };
    let who = "vmtrace [rank 6/8 pod 7a8b9c0d ctr c0ffee001122]";
    let txt = text::render(&s);
    let regions = text::render_regions(&s);
    // Each table: its header's FAULTS column ends where each row's count does.
    for (out, head) in [(&txt, "    PID  COMM "), (&regions, "    PID  COMM ")] {
        let mut lines = out.lines().skip_while(|l| !l.starts_with(head));
        let header = lines.next().expect("a process table");
        let end = header.find("FAULTS").unwrap() + "FAULTS".len();
        let rows: Vec<&str> = lines.take_while(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
        assert!(rows.iter().any(|r| r.contains(who)), "{who} in\n{out}");
        for r in &rows {
            assert!(r.starts_with("  137"), "{r}");
            let at: usize = r.char_indices().nth(header[..end].chars().count()).map_or(r.len(), |(i, _)| i);
            assert!(r[..at].ends_with(|c: char| c.is_ascii_digit()), "misaligned:\n{header}\n{r}");
            assert!(r[at..].starts_with(' '), "misaligned:\n{header}\n{r}");
        }
        // The others keep their bare name.
        assert!(rows.iter().any(|r| r.contains("  sh  ")), "{out}");
    }
    let html = html::render(&s, Path::new("/nonexistent/vmtrace-golden"));
    // Its rows in the process table and the regions table (4 regions).
    assert_eq!(html.matches(&format!("<td>13787</td><td class='l'>{who}</td>")).count(), 5, "{who} in report.html");
    // Without the identity, the golden outputs are as they were.
    assert_eq!(text::render(&load().1), fs::read_to_string(golden("summary.txt")).unwrap());
}
