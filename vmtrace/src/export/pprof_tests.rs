use std::io::Read as _;

use super::*;

fn frame(function: &str) -> Frame<'_> {
    Frame { function, file: None, line: 0, object: None, address: 0 }
}

#[test]
fn frames_are_taken_apart_by_their_form() {
    assert_eq!(
        parse_frame("train_step (train.py:42)"),
        Frame { function: "train_step", file: Some("train.py"), line: 42, ..frame("") }
    );
    assert_eq!(
        parse_frame("<module> (/app/my run.py:7)"),
        Frame { function: "<module>", file: Some("/app/my run.py"), line: 7, ..frame("") }
    );
    assert_eq!(
        parse_frame("load (/app/train.py)"),
        Frame { function: "load", file: Some("/app/train.py"), ..frame("") }
    );
    assert_eq!(
        parse_frame("libc.so.6+0x9a3f0"),
        Frame { object: Some("libc.so.6"), address: 0x9a3f0, ..frame("libc.so.6+0x9a3f0") }
    );
    assert_eq!(parse_frame("[anon]+0x40"), Frame { object: Some("[anon]"), address: 0x40, ..frame("[anon]+0x40") });
    assert_eq!(
        parse_frame("[kernel] 0xffffffff81000000"),
        Frame { object: Some("[kernel]"), address: 0xffff_ffff_8100_0000, ..frame("[kernel] 0xffffffff81000000") }
    );
    assert_eq!(parse_frame("[unknown] 0x10"), Frame { address: 0x10, ..frame("[unknown] 0x10") });
    // Names and markers stay whole.
    for f in [
        "main",
        "handle_mm_fault",
        "[no unwind info]",
        "[file /data/w.bin]",
        "[unwind error: bad cfa (at 0x10)]",
        "std::vector<int>::operator+(int) const",
        "foo (anonymous namespace)",
        "f ()",
        "py::train_step:/app/train.py",
        "x+0xzz",
    ] {
        assert_eq!(parse_frame(f), frame(f), "{f}");
    }
}

#[test]
fn region_leaves_become_labels() {
    let l = |s| region_labels(s).map(|v| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>());
    assert_eq!(
        l("[file /data/model weights.bin]").unwrap(),
        ["region=[file /data/model weights.bin]", "region_kind=file", "region_path=/data/model weights.bin"]
    );
    assert_eq!(l("[anon 0x7f00-0x7f80]").unwrap(), ["region=[anon 0x7f00-0x7f80]", "region_kind=anon"]);
    assert_eq!(l("[heap]").unwrap(), ["region=[heap]", "region_kind=heap"]);
    assert_eq!(l("[anon:arena]").unwrap(), ["region=[anon:arena]", "region_kind=anon", "region_path=anon:arena"]);
    assert_eq!(l("[unmapped region]").unwrap(), ["region=[unmapped region]", "region_kind=unmapped"]);
    for not in ["[no stack sampled]", "[frame chain broken]", "[unwind error: a-b]", "main", "[vdso]", "[mmap]"] {
        assert_eq!(l(not), None, "{not}");
    }
}

fn sample_of(line: &str, pid: u32, v: i64) -> Sample {
    sample(FAULTS, line, Some(pid), None, vec![v])
}

#[test]
fn builder_keeps_each_string_function_location_and_mapping_once() {
    let mut b = Builder::new(FAULTS, 16);
    b.add(&sample_of("train;main;step (t.py:3);libc.so.6+0x10", 7, 5));
    b.add(&sample_of("train;main;step (t.py:4);libc.so.6+0x30", 7, 2));
    b.add(&sample_of("train;main;step (t.py:3);libc.so.6+0x10", 8, 1));
    let p = b.finish();
    assert_eq!(p.string_table[0], "");
    let mut uniq = p.string_table.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), p.string_table.len(), "{:?}", p.string_table);
    let s = |i: i64| p.string_table[i as usize].as_str();
    // train, main, step (one function, two lines), two libc offsets.
    assert_eq!(p.function.len(), 5);
    assert_eq!(p.location.len(), 6);
    assert_eq!(p.mapping.len(), 1);
    assert_eq!(s(p.mapping[0].filename), "libc.so.6");
    assert_eq!(p.mapping[0].memory_limit, 0x31);
    assert!(p.mapping[0].has_functions);
    let step = p.function.iter().find(|f| s(f.name) == "step").unwrap();
    assert_eq!(s(step.filename), "t.py");
    // pprof leaves a name alone only without a system name (else `<module>` loses its `<…>`).
    assert!(p.function.iter().all(|f| f.system_name == 0));
    // Leaf first: the libc frame, then step at its line, …, the process.
    let first = &p.sample[0];
    let loc = |id: u64| &p.location[id as usize - 1];
    assert_eq!(loc(first.location_id[0]).address, 0x10);
    assert_eq!(loc(first.location_id[0]).mapping_id, 1);
    assert_eq!(loc(first.location_id[1]).line[0].line, 3);
    assert_eq!(loc(p.sample[1].location_id[1]).line[0].line, 4);
    let root = loc(*first.location_id.last().unwrap()).line[0].function_id;
    assert_eq!(s(p.function[root as usize - 1].name), "train");
    assert_eq!(p.sample.iter().map(|x| x.value[0]).sum::<i64>(), 8);
    assert_eq!(first.label.iter().find(|l| s(l.key) == "pid").unwrap().num, 7);
    assert_eq!(s(first.label.iter().find(|l| s(l.key) == "comm").unwrap().str), "train");
    assert_eq!((s(p.sample_type[0].r#type), s(p.sample_type[0].unit)), ("faults", "count"));
    assert_eq!(p.period, 16);
    assert_eq!(s(p.default_sample_type), "faults");
}

#[test]
fn written_profiles_decode_with_their_totals() {
    let dir = tempfile::tempdir().unwrap();
    let folded = "train;main;load;[file /w.bin] 9\ntrain;main;init 3\nworker;run 5\n";
    let samples = folded_samples(FAULT_TIME, folded, |c| (c == "train").then_some(11), |_| Vec::new(), None);
    let meta = Meta {
        period: 4,
        comment: "fault time",
        duration_s: 1.5,
        main: "train",
        identities: &crate::export::pprof::Identities::new(),
    };
    let p = profile(FAULT_TIME, &meta, samples);
    let path = dir.path().join("fault-time.pb.gz");
    write(&path, &p).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap()).read_to_end(&mut raw).unwrap();
    let back = pb::Profile::decode(raw.as_slice()).unwrap();
    assert_eq!(back, p);
    let total: i64 = back.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total as u64, crate::stacks::flamegraph::total(folded));
    let s = |i: i64| back.string_table[i as usize].as_str();
    assert_eq!(s(back.sample_type[0].unit), "nanoseconds");
    assert_eq!(back.duration_nanos, 1_500_000_000);
    assert_eq!(s(back.comment[0]), "fault time");
    // The first mapping names the recording, and holds no location.
    assert_eq!(s(back.mapping[0].filename), "train");
    assert!(back.location.iter().all(|l| l.mapping_id != 1));
    let labels = |i: usize| {
        back.sample[i]
            .label
            .iter()
            .map(|l| if l.str == 0 { format!("{}={}", s(l.key), l.num) } else { format!("{}={}", s(l.key), s(l.str)) })
            .collect::<Vec<_>>()
    };
    assert_eq!(labels(0), ["pid=11", "comm=train", "region=[file /w.bin]", "region_kind=file", "region_path=/w.bin"]);
    // A name no single process had: no pid.
    assert_eq!(labels(2), ["comm=worker"]);
}

#[test]
fn shootdowns_carry_their_sites_calls() {
    let mmap = "a;f;[munmap] 10\na;g;[mmap] 4\n";
    let shoot = "a;f;[munmap] 30\n";
    let s = folded_samples(SHOOTDOWNS, shoot, |_| None, |_| Vec::new(), Some(mmap));
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].values, [30, 10]);
    assert!(s[0].labels.contains(&("syscall", "munmap".into())));
    // No region is read into a syscall leaf.
    assert!(!s[0].labels.iter().any(|l| l.0 == "region"));
    assert_eq!(folded_samples(MMAP, mmap, |_| None, |_| Vec::new(), None).iter().map(|s| s.values[0]).sum::<i64>(), 14);
}

#[test]
fn samples_carry_their_process_identity() {
    let id = crate::model::Identity {
        cgroup: Some("/kubepods/burstable/pod4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b/c0".into()),
        pod_uid: Some("4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".into()),
        rank: Some(crate::model::Rank { rank: Some(2), ..crate::model::Rank::default() }),
        ..crate::model::Identity::default()
    };
    let ids: crate::export::pprof::Identities = [(11, &id)].into_iter().collect();
    let meta = Meta { period: 1, comment: "", duration_s: 1.0, main: "train", identities: &ids };
    let samples =
        folded_samples(FAULTS, "train;main 9\nworker;run 5\n", |c| (c == "train").then_some(11), |_| Vec::new(), None);
    let p = profile(FAULTS, &meta, samples);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let labels = |i: usize| p.sample[i].label.iter().map(|l| format!("{}={}", s(l.key), s(l.str))).collect::<Vec<_>>();
    assert!(labels(0).contains(&"pod_uid=4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".to_string()), "{:?}", labels(0));
    assert!(labels(0).contains(&"rank=2".to_string()));
    assert!(labels(0).iter().any(|l| l.starts_with("cgroup=/kubepods/")));
    assert!(!labels(1).iter().any(|l| l.starts_with("rank")));
    // A folded file whose process frame names the identity (`stacks::tree`):
    // its pid found by that frame, the frame itself the name alone.
    let samples = folded_samples(
        FAULTS,
        "train [rank 2 pod 4e5b6f1a];main 9\n",
        |c| (c == "train [rank 2 pod 4e5b6f1a]").then_some(11),
        |_| Vec::new(),
        None,
    );
    assert_eq!((&*samples[0].frames[0], samples[0].pid), ("train", Some(11)));
    assert!(samples[0].labels.contains(&("comm", "train".into())));
    let p = profile(FAULTS, &meta, samples);
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert!(p.sample[0].label.iter().any(|l| s(l.key) == "rank" && s(l.str) == "2"));
}
