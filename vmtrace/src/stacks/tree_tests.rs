use std::collections::BTreeMap;

use super::*;
use crate::stacks::{
    flamegraph::{self, fold, fold_small, PidLine},
    weight::Estimate,
    Frames,
};

/// A line's weight, its processes' shares and its region leaf.
type Shares = (f64, Vec<(u32, f64)>, Option<String>);

/// The folded lines by process as they were made before the tree: a string
/// per stack, merged in a map by line.
fn by_strings(stacks: &[Stack], weight: Weight) -> Vec<PidLine> {
    let clean = |f: &str| f.replace(';', ":").replace('\n', " ");
    let mut merged: BTreeMap<String, Shares> = BTreeMap::new();
    for s in stacks {
        let w = match weight {
            Weight::Faults => s.estimate.faults,
            Weight::TimeNs => s.estimate.time_ns,
            Weight::Major => s.estimate.major,
            Weight::Cow => s.estimate.cow,
        };
        if w <= 0.0 {
            continue;
        }
        let mut line = clean(&s.comm);
        if s.user_missing && s.user.is_empty() {
            line.push_str(";[no user stack]");
        }
        for f in s.user.iter().chain(s.kernel.iter()).map(|f| &**f).chain(s.leaf.as_deref()) {
            line.push(';');
            line.push_str(&clean(f));
        }
        let e = merged.entry(line).or_default();
        e.0 += w;
        match e.1.binary_search_by_key(&s.pid, |p| p.0) {
            Ok(i) => e.1[i].1 += w,
            Err(i) => e.1.insert(i, (s.pid, w)),
        }
        if e.2.is_none() {
            e.2.clone_from(&s.leaf);
        }
    }
    let mut weights: Vec<f64> = merged.values().map(|e| e.0).collect();
    crate::model::largest_remainder(&mut weights);
    let mut out = Vec::new();
    for ((line, e), w) in merged.iter().zip(weights) {
        let shares: Vec<f64> = e.1.iter().map(|p| p.1).collect();
        for ((pid, _), part) in e.1.iter().zip(apportion(w as u64, &shares)) {
            if part > 0 {
                out.push(PidLine { line: line.clone(), pid: *pid, region: e.2.clone(), weight: part });
            }
        }
    }
    out
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Names whose bytes sort around ';' (digits, '+', ':', ' ', '.' sort
/// before it, letters and '[' after), prefixes of each other, and some
/// that clean to the same text.
const NAMES: [&str; 16] = [
    "a",
    "a0",
    "a+0x1",
    "a:b",
    "a;b",
    "a b",
    "a.py",
    "ab",
    "A",
    "[heap]",
    "_start",
    "main",
    "f (x.py:3)",
    "f",
    "b\nc",
    "b c",
];

fn random_stacks(rng: &mut Rng, n: usize) -> Vec<Stack> {
    let comms = ["train", "train0", "pt_data_worker", "a;x"];
    (0..n)
        .map(|_| {
            let depth = rng.next(7) as usize;
            let user: Vec<crate::stacks::Frame> =
                (0..depth).map(|_| NAMES[rng.next(NAMES.len() as u64) as usize].into()).collect();
            let kernel = (0..rng.next(3)).map(|_| NAMES[rng.next(4) as usize].into()).collect();
            let missing = rng.next(10) == 0;
            let leaf = (rng.next(4) == 0).then(|| {
                ["[heap]", "[file /x]", "[anon 0x1-0x2]", crate::model::resident::SHARED_WITH_PARENT]
                    [rng.next(4) as usize]
                    .into()
            });
            // Weights of many sizes, some zero, some fractional.
            let w = |r: &mut Rng| match r.next(5) {
                0 => 0.0,
                1 => r.next(3) as f64 * 0.37,
                2 => r.next(1000) as f64,
                _ => r.next(20) as f64,
            };
            Stack {
                pid: 100 + rng.next(3) as u32,
                comm: comms[rng.next(comms.len() as u64) as usize].into(),
                user: if missing { Frames::default() } else { user.into() },
                kernel,
                user_missing: missing,
                leaf,
                estimate: Estimate { faults: w(rng), time_ns: w(rng) * 1000.0, major: w(rng), cow: w(rng) },
                ..Stack::default()
            }
        })
        .collect()
}

#[test]
fn the_tree_gives_the_lines_a_string_per_stack_gave_byte_for_byte() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..60 {
        let n = [1, 3, 10, 50, 400][round % 5];
        let stacks = random_stacks(&mut rng, n);
        let tree = Tree::new(&stacks);
        for weight in [Weight::Faults, Weight::TimeNs, Weight::Major, Weight::Cow] {
            let want = by_strings(&stacks, weight);
            assert_eq!(flamegraph::folded_by_pid(&stacks, weight), want, "round {round}");
            let graph = tree.graph(&stacks, weight);
            let text = fold(&want);
            assert_eq!(graph.folded(), text, "round {round}");
            assert_eq!(graph.total(), flamegraph::total(&text));
            for share in [0.0, 1.0 / 300.0, 0.01, 0.05, 0.2, 0.6] {
                assert_eq!(graph.folded_small(share), fold_small(&text, share), "round {round} share {share}");
            }
        }
    }
}

#[test]
fn each_frame_name_is_kept_once() {
    let main: crate::stacks::Frame = "main".into();
    let stacks: Vec<Stack> = (0..100)
        .map(|i| Stack {
            comm: "train".into(),
            user: vec![main.clone(), format!("f{}", i % 10).into()].into(),
            estimate: Estimate { faults: 1.0, ..Estimate::default() },
            ..Stack::default()
        })
        .collect();
    let tree = Tree::new(&stacks);
    // train, main and f0..f9.
    assert_eq!(tree.frame_count(), 12);
    let graph = tree.graph(&stacks, Weight::Faults);
    assert_eq!(graph.lines.len(), 10);
    assert_eq!(graph.total(), 100);
    assert_eq!(graph.folded_small(0.5), "train;main;[small stacks folded] 100\n");
}

#[test]
fn a_profile_from_the_tree_is_the_one_the_folded_lines_made() {
    use crate::export::pprof;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..20 {
        let stacks = random_stacks(&mut rng, [5, 60, 300][round % 3]);
        let tree = Tree::new(&stacks);
        for (weight, kind) in [(Weight::Faults, pprof::FAULTS), (Weight::TimeNs, pprof::FAULT_TIME)] {
            let meta = pprof::Meta {
                period: 1,
                comment: "c",
                duration_s: 1.0,
                main: "train",
                identities: &crate::export::pprof::Identities::new(),
            };
            let parts = flamegraph::folded_by_pid(&stacks, weight);
            let samples = parts
                .iter()
                .map(|p| pprof::sample(kind, &p.line, Some(p.pid), p.region.as_deref(), vec![p.weight as i64]));
            let want = pprof::profile(kind, &meta, samples);
            assert_eq!(pprof::graph_profile(kind, &meta, &tree.graph(&stacks, weight)), want, "round {round}");
        }
    }
}

#[test]
fn process_frames_name_their_identity_and_the_profile_keeps_it_in_labels() {
    use crate::export::pprof;
    use crate::model::{Identity, Rank};
    let pod = Identity {
        cgroup: Some("/kubepods/burstable/pod4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b/".to_string() + &"c".repeat(64)),
        pod_uid: Some("4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".into()),
        container_id: Some("c".repeat(64)),
        rank: Some(Rank { rank: Some(0), ..Rank::default() }),
        ..Identity::default()
    };
    let rank =
        Identity { rank: Some(Rank { rank: Some(1), world_size: Some(2), ..Rank::default() }), ..Identity::default() };
    let cgroup = Identity { cgroup: Some("/system.slice/x.service".into()), ..Identity::default() };
    let ids: pprof::Identities = [(100, &pod), (101, &rank), (102, &cgroup)].into_iter().collect();
    let stack = |pid: u32, comm: &str, user: &[&str], faults: f64| Stack {
        pid,
        comm: comm.into(),
        user: user.iter().map(|f| (*f).into()).collect(),
        estimate: Estimate { faults, ..Estimate::default() },
        ..Stack::default()
    };
    let stacks = [
        stack(100, "train", &["main", "load"], 6.0),
        // Its shell before the exec: the same process, under that name.
        stack(100, "sh", &["main"], 1.0),
        stack(101, "train", &["main", "load"], 4.0),
        // A cgroup alone, or no identity: the name as before, the lines merged.
        stack(102, "train", &["main", "load"], 3.0),
        stack(103, "train", &["main", "load"], 2.0),
    ];
    let tree = Tree::with_identities(&stacks, &ids);
    let graph = tree.graph(&stacks, Weight::Faults);
    let folded = graph.folded();
    assert_eq!(
        folded,
        "sh [rank 0 pod 4e5b6f1a ctr cccccccccccc];main 1\n\
         train [rank 0 pod 4e5b6f1a ctr cccccccccccc];main;load 6\n\
         train [rank 1/2];main;load 4\n\
         train;main;load 5\n"
    );
    assert_eq!(
        graph.folded_small(0.5),
        folded.replace(";main;load", ";[small stacks folded]").replace(";main 1", ";[small stacks folded] 1")
    );
    // Without identities, the lines of today.
    assert_eq!(Tree::new(&stacks).graph(&stacks, Weight::Faults).folded(), "sh;main 1\ntrain;main;load 15\n");
    // The profile: the same samples, the process frames by name alone, the identity in labels.
    let meta = pprof::Meta { period: 1, comment: "c", duration_s: 1.0, main: "train", identities: &ids };
    let p = pprof::graph_profile(pprof::FAULTS, &meta, &graph);
    assert_eq!(p, pprof::profile(pprof::FAULTS, &meta, pprof::graph_samples(pprof::FAULTS, &graph)));
    let s = |i: i64| p.string_table[i as usize].as_str();
    let names: std::collections::BTreeSet<&str> = p.function.iter().map(|f| s(f.name)).collect();
    assert_eq!(names, ["load", "main", "sh", "train"].into_iter().collect());
    let label = |x: &vmtrace_protos::pprof::Sample, k: &str| {
        x.label
            .iter()
            .find(|l| s(l.key) == k)
            .map(|l| if l.str == 0 { l.num.to_string() } else { s(l.str).to_string() })
    };
    for x in &p.sample {
        let pid = label(x, "pid").unwrap();
        let comm = label(x, "comm").unwrap();
        assert!(comm == "train" || comm == "sh", "{comm}");
        let want = match pid.as_str() {
            "100" => (Some("0".to_string()), Some("4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b".to_string())),
            "101" => (Some("1".to_string()), None),
            _ => (None, None),
        };
        assert_eq!((label(x, "rank"), label(x, "pod_uid")), want, "pid {pid}");
    }
    assert_eq!(p.sample.iter().map(|x| x.value[0]).sum::<i64>(), 16);
}
