//! Plain words for what the tables and the report say about a recording:
//! probes that differ from the preferred ones, long command lines, counts
//! and estimates.
use crate::model::{Process, Summary};

/// What differs from the preferred probes on this kernel, each once, and
/// what it means for the numbers; nothing when every probe is the preferred one.
pub fn probe_lines(s: &Summary) -> Vec<String> {
    let mut items: Vec<String> = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    for p in s.probes.iter() {
        let Some(reason) = &p.fallback_reason else { continue };
        // Left out with nothing lost (another program sees its events, or
        // they cannot happen here): no different numbers, nothing to say.
        if p.not_needed() {
            continue;
        }
        // "fault end (every fault)" and "(sampled)" are one thing to a reader.
        let what = p.what.split(" (").next().unwrap_or(&p.what);
        let item = if p.program_type == "none" {
            // The reason's last clause says what stands in, when anything does.
            let instead = reason.rsplit("; ").next().filter(|c| c.ends_with("instead"));
            match instead {
                Some(c) => format!("{what}: not hooked; {c}"),
                None => format!("{what}: not recorded on this kernel"),
            }
        } else {
            // A fallback that sees less says what (arm64's PAGE_FAULTS start:
            // "… (no access type: write and exec faults not counted)").
            let less = p.target.split_once(" (").map(|(_, r)| r).filter(|r| r.ends_with("not counted)"));
            match less {
                Some(r) => format!("{what}: taken through {} instead ({r}", program_name(&p.program_type)),
                None => format!("{what}: taken through {} instead (same data)", program_name(&p.program_type)),
            }
        };
        if !items.contains(&item) {
            items.push(item);
        }
        // "fexit handle_mm_fault: refused (EPERM): kernel lockdown or …": the last part is why.
        // A verifier's refusal carries its whole log (summary.json keeps it):
        // the cause is the sentence before it.
        let head = reason.split("Verifier output").next().and_then(|h| h.lines().next()).unwrap_or_default();
        let head = head.trim_end().trim_end_matches('.');
        let cause = head.split("; ").next().and_then(|c| c.rsplit(": ").next()).unwrap_or_default().to_string();
        if !cause.is_empty() && !causes.contains(&cause) {
            causes.push(cause);
        }
    }
    if items.is_empty() {
        return Vec::new();
    }
    let mut out = vec![format!(
        "probes: {} work differently on this kernel ({}); `vmtrace check` says more",
        items.len(),
        causes.join("; ")
    )];
    out.extend(items.into_iter().map(|i| format!("  {i}")));
    out
}

fn program_name(t: &str) -> &str {
    match t {
        "perf_event" => "perf events",
        "tracepoint" => "classic tracepoints",
        "kprobe" => "a kprobe",
        "tp_btf" => "BTF tracepoints",
        other => other,
    }
}

/// A command line in at most `max` characters: the program's file name, then
/// its arguments, the middle elided when too long (the end often names the
/// input).
pub fn short_cmdline(cmdline: &str, max: usize) -> String {
    let mut words = cmdline.split_whitespace();
    let program = words.next().map(|p| p.rsplit('/').next().unwrap_or(p)).unwrap_or_default();
    let s = std::iter::once(program).chain(words).collect::<Vec<_>>().join(" ");
    let n = s.chars().count();
    if n <= max {
        return s;
    }
    let head = max.saturating_sub(1) / 2;
    let tail = max.saturating_sub(1) - head;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// What tells a process apart from others of its name, in at most `max`
/// characters: "worker N of PPID" for a worker its traced parent forked
/// (same program: its command line is the parent's), else its command line.
pub fn told_apart(s: &Summary, p: &Process, max: usize) -> Option<String> {
    match crate::model::findings::worker_of(s, p) {
        Some((n, ppid)) => Some(format!("worker {n} of {ppid}")),
        None => p.cmdline.as_deref().map(|c| short_cmdline(c, max)),
    }
}

/// 65710 → "65,710": counts people read.
pub fn thousands(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An estimate, to the precision it has: 66752 → "≈66.8k", 742 → "≈742".
pub fn approx(v: u64) -> String {
    let f = v as f64;
    if f >= 1e6 {
        format!("≈{:.1}M", f / 1e6)
    } else if f >= 1e4 {
        format!("≈{:.1}k", f / 1e3)
    } else {
        format!("≈{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProbeInfo;

    fn probe(what: &str, program_type: &str, reason: Option<&str>) -> ProbeInfo {
        ProbeInfo {
            what: what.into(),
            program_type: program_type.into(),
            target: String::new(),
            fallback_reason: reason.map(str::to_string),
        }
    }

    #[test]
    fn preferred_probes_say_nothing_and_fallbacks_say_what_they_change() {
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/summary.json");
        let mut s: Summary = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
        s.probes = vec![probe("fault start (user mode)", "tp_btf", None)];
        assert!(probe_lines(&s).is_empty(), "nothing to say when every probe is the preferred one");
        let lockdown = "fexit handle_mm_fault: refused (EPERM): kernel lockdown forbids fentry/fexit here";
        s.probes.push(probe("fault end (every fault)", "perf_event", Some(lockdown)));
        s.probes.push(probe("fault end (sampled)", "perf_event", Some(lockdown)));
        s.probes.push(probe(
            "OOM constraint and memcg",
            "none",
            Some("fentry: refused (EPERM): kernel lockdown forbids fentry/fexit here; kprobe: none; derived from the cgroup instead"),
        ));
        // Not needed: the memcg end sees the huge-page faults, or THP is off.
        // Nothing is missing: neither "not recorded" nor a cause.
        let memcg = "not needed: the memcg fault end sees the THP_FAULT_ALLOC of the fault in flight";
        s.probes.push(probe("huge-page faults", "none", Some(memcg)));
        let thp_off = "not needed: THP is never for anonymous memory; no anonymous or shmem fault can map a huge page";
        s.probes.push(probe("huge-page faults", "none", Some(thp_off)));
        let lines = probe_lines(&s);
        assert_eq!(
            lines,
            [
                "probes: 2 work differently on this kernel (kernel lockdown forbids fentry/fexit here); `vmtrace check` says more",
                "  fault end: taken through perf events instead (same data)",
                "  OOM constraint and memcg: not hooked; derived from the cgroup instead",
            ]
        );
        // A hook the kernel lacks, with nothing in its place: not recorded.
        let none = "no migrate:mm_migrate_pages on this kernel (6.1): migrations are not counted";
        s.probes.push(probe("page migrations", "none", Some(none)));
        assert_eq!(probe_lines(&s)[3], "  page migrations: not recorded on this kernel");
        assert!(probe_lines(&s)[0].starts_with("probes: 3 work differently"), "{:?}", probe_lines(&s));
        s.probes.retain(|p| p.not_needed() || p.fallback_reason.is_none());
        assert!(probe_lines(&s).is_empty(), "only probes not needed: nothing to say");
        // arm64 6.12's verifier refused tp_btf rss_stat (vm32): its log is
        // no cause to print.
        let refused = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: 0: R1=ctx() R10=fp0\n; intrinsics::volatile_load(src) @ mod.rs:2107\n0: (18) r3 = 0xffff";
        s.probes.push(probe("resident memory", "tracepoint", Some(refused)));
        assert_eq!(
            probe_lines(&s),
            [
                "probes: 1 work differently on this kernel (the BPF_PROG_LOAD syscall returned Permission denied (os error 13)); `vmtrace check` says more",
                "  resident memory: taken through classic tracepoints instead (same data)",
            ]
        );
    }

    #[test]
    fn numbers_in_words() {
        assert_eq!(thousands(65_710), "65,710");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000_000), "1,000,000");
        assert_eq!(approx(66_752), "≈66.8k");
        assert_eq!(approx(742), "≈742");
        assert_eq!(approx(2_500_000), "≈2.5M");
    }

    #[test]
    fn command_lines_are_shortened_in_the_middle() {
        assert_eq!(short_cmdline("/usr/bin/git gc --auto", 60), "git gc --auto");
        let long = format!("/usr/bin/python3 train.py {} --out model.bin", "--flag ".repeat(40));
        let s = short_cmdline(&long, 40);
        assert_eq!(s.chars().count(), 40, "{s}");
        assert!(s.starts_with("python3 train.py") && s.ends_with("--out model.bin") && s.contains('…'), "{s}");
    }
}
