//! The stacks of a recording as one tree of frames, for the flamegraphs and
//! pprof profiles of a long job: each distinct frame name is kept once (an
//! id), each stack is a path of nodes, and a folded line is a node. A stack
//! on every fault of a torch job makes ~280k stacks of ~100 frames; a string
//! per stack (its folded line) came to gigabytes before `fold_small` merged
//! them. Here the lines are ordered, weighed and folded on the tree, and
//! strings are made only for the lines a folded file keeps.
//!
//! What comes out is what `flamegraph::fold` and `flamegraph::fold_small`
//! make of `flamegraph::folded_by_pid`'s lines, byte for byte: lines in
//! byte order, weights rounded in that order (largest remainder), each line's
//! weight shared among its processes.
use crate::hash::HashMap;
use std::{borrow::Cow, cmp::Ordering, collections::BTreeMap, fmt::Write as _};

use super::{
    weight::{apportion, kept_leaf, Weight, SMALL_STACKS},
    Stack,
};

/// The node every process's frame hangs from.
const ROOT: u32 = 0;
/// No node.
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node {
    frame: u32,
    parent: u32,
    first_child: u32,
    next_sibling: u32,
}

/// Every stack's folded frames (`comm;[no user stack];user…;kernel…;leaf`,
/// cleaned as the folded files have them) as a path of a tree. The process
/// frame is its name, with its rank, pod and container where
/// [`Tree::with_identities`] knows them (`model::identity::named`).
pub struct Tree<'a> {
    /// Frame names by id.
    names: Vec<Cow<'a, str>>,
    ids: HashMap<Cow<'a, str>, u32>,
    /// A name's id by the address of the string it was read from: a frame
    /// shared by many stacks (`symbolize::Names`) is hashed once.
    by_ref: HashMap<(usize, usize), u32>,
    nodes: Vec<Node>,
    children: HashMap<(u32, u32), u32>,
    /// The node each stack ends at, in the order of the stacks.
    ends: Vec<u32>,
    /// The process's name alone, by the id of a process frame that also
    /// names its identity (the profiles carry that as labels).
    plain: HashMap<u32, Cow<'a, str>>,
}

/// ';' separates frames and a trailing space-number is the weight.
fn clean(frame: &str) -> Cow<'_, str> {
    if frame.contains([';', '\n']) {
        Cow::Owned(frame.replace(';', ":").replace('\n', " "))
    } else {
        Cow::Borrowed(frame)
    }
}

/// Siblings in the order of their lines: a node's own line is its name, the
/// lines below it its name and ';' (frames hold no ';'), so that the lines
/// of a tree walked in this order are in byte order.
fn key_order(a: &str, a_below: bool, b: &str, b_below: bool) -> Ordering {
    let semi = |below: bool| below.then_some(b';');
    a.bytes().chain(semi(a_below)).cmp(b.bytes().chain(semi(b_below)))
}

impl<'a> Tree<'a> {
    /// The tree of `stacks`' frames.
    pub fn new(stacks: &'a [Stack]) -> Self {
        Self::with_identities(stacks, &BTreeMap::new())
    }

    /// The tree of `stacks`' frames, each process frame naming the rank,
    /// pod and container `identities` gives its pid
    /// (`python3 [rank 0 pod 1f2e3d4c ctr 0123456789ab]`): the stacks of
    /// two pods or ranks stay apart. A process with none of them, or not
    /// in `identities`, keeps its name alone.
    pub fn with_identities(stacks: &'a [Stack], identities: &crate::export::pprof::Identities) -> Self {
        let root = Node { frame: NONE, parent: NONE, first_child: NONE, next_sibling: NONE };
        let mut t = Self {
            names: Vec::new(),
            ids: HashMap::default(),
            by_ref: HashMap::default(),
            nodes: vec![root],
            children: HashMap::default(),
            ends: Vec::with_capacity(stacks.len()),
            plain: HashMap::default(),
        };
        // The process frame of each pid (and name: an exec renames it) that
        // names an identity, made once.
        let mut named: HashMap<(u32, &'a str), Option<u32>> = HashMap::default();
        for s in stacks {
            let frame = match identities.get(&s.pid) {
                None => None,
                Some(id) => *named.entry((s.pid, &s.comm)).or_insert_with(|| {
                    match crate::model::identity::named(&s.comm, Some(id)) {
                        Cow::Borrowed(_) => None,
                        Cow::Owned(name) => Some(t.named_frame(name, &s.comm)),
                    }
                }),
            };
            let mut at = match frame {
                Some(f) => t.child_id(ROOT, f),
                None => t.child(ROOT, &s.comm),
            };
            if s.user_missing && s.user.is_empty() {
                at = t.child(at, "[no user stack]");
            }
            for f in s.user.iter().chain(s.kernel.iter()) {
                at = t.child(at, f);
            }
            if let Some(l) = &s.leaf {
                at = t.child(at, l);
            }
            t.ends.push(at);
        }
        t
    }

    fn id(&mut self, name: &'a str) -> u32 {
        let at = (name.as_ptr() as usize, name.len());
        if let Some(&id) = self.by_ref.get(&at) {
            return id;
        }
        let clean = clean(name);
        let id = if let Some(&id) = self.ids.get(clean.as_ref()) {
            id
        } else {
            let id = self.names.len() as u32;
            self.names.push(clean.clone());
            self.ids.insert(clean, id);
            id
        };
        self.by_ref.insert(at, id);
        id
    }

    /// The id of a process frame naming an identity (`name`, made for it:
    /// not kept by address as `id` keeps the stacks' own names), the
    /// process's name alone (`comm`) kept beside it.
    fn named_frame(&mut self, name: String, comm: &'a str) -> u32 {
        let name: Cow<'a, str> = match clean(&name) {
            Cow::Borrowed(_) => Cow::Owned(name),
            Cow::Owned(cleaned) => Cow::Owned(cleaned),
        };
        let id = if let Some(&id) = self.ids.get(name.as_ref()) {
            id
        } else {
            let id = self.names.len() as u32;
            self.names.push(name.clone());
            self.ids.insert(name, id);
            id
        };
        self.plain.insert(id, clean(comm));
        id
    }

    fn child(&mut self, parent: u32, name: &'a str) -> u32 {
        let frame = self.id(name);
        self.child_id(parent, frame)
    }

    fn child_id(&mut self, parent: u32, frame: u32) -> u32 {
        if let Some(&n) = self.children.get(&(parent, frame)) {
            return n;
        }
        let n = self.nodes.len() as u32;
        let first = self.nodes[parent as usize].first_child;
        self.nodes.push(Node { frame, parent, first_child: NONE, next_sibling: first });
        self.nodes[parent as usize].first_child = n;
        self.children.insert((parent, frame), n);
        n
    }

    /// A frame's name (as folded files write it) by id.
    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// The process's name of a process frame (`path`'s first) by id: the
    /// frame without the identity [`Tree::with_identities`] put in it.
    pub fn process_name(&self, id: u32) -> &str {
        self.plain.get(&id).map_or_else(|| self.name(id), |c| c.as_ref())
    }

    /// Number of distinct frames.
    pub fn frame_count(&self) -> usize {
        self.names.len()
    }

    /// Frame ids of `node`'s line, outermost (the process name) first, into `out`.
    pub fn path(&self, node: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut at = node;
        while at != ROOT {
            let n = &self.nodes[at as usize];
            out.push(n.frame);
            at = n.parent;
        }
        out.reverse();
    }

    /// The folded line of `node` (frames joined by ';').
    pub fn line(&self, node: u32) -> String {
        let mut ids = Vec::new();
        self.path(node, &mut ids);
        let mut line = String::new();
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            line.push_str(self.name(*id));
        }
        line
    }

    /// The lines of the graph `stacks` (those given to [`Tree::new`]) make
    /// weighted by `weight`.
    pub fn graph(&self, stacks: &'a [Stack], weight: Weight) -> Graph<'_, 'a> {
        // Each line's weight summed in stack order, its processes' shares
        // (pids ascending), its region leaf: as `flamegraph::folded_by_pid`.
        let mut index: HashMap<u32, u32> = HashMap::default();
        let mut lines: Vec<Line<'a>> = Vec::new();
        for (s, &end) in stacks.iter().zip(&self.ends) {
            let w = weight.of(&s.estimate);
            if w <= 0.0 {
                continue;
            }
            let i = *index.entry(end).or_insert_with(|| {
                lines.push(Line { node: end, sum: 0.0, pids: Vec::new(), region: None, weight: 0 });
                lines.len() as u32 - 1
            });
            let e = &mut lines[i as usize];
            e.sum += w;
            match e.pids.binary_search_by_key(&s.pid, |p| p.0) {
                Ok(i) => e.pids[i].1 += w,
                Err(i) => e.pids.insert(i, (s.pid, w)),
            }
            if e.region.is_none() {
                e.region = s.leaf.as_deref();
            }
        }
        // Lines in byte order: the tree walked with siblings in key order.
        // Bit 0: a line ends at the node; bit 1: a line ends below it.
        let mut marks = vec![0u8; self.nodes.len()];
        for l in &lines {
            marks[l.node as usize] |= 1;
            let mut at = self.nodes[l.node as usize].parent;
            while at != NONE && marks[at as usize] & 2 == 0 {
                marks[at as usize] |= 2;
                at = self.nodes[at as usize].parent;
            }
        }
        let mut order = Vec::with_capacity(lines.len());
        self.walk(ROOT, &marks, &mut |node| order.push(index[&node]));
        drop(index);
        drop(marks);
        let mut sorted: Vec<Line<'a>> = Vec::with_capacity(lines.len());
        let mut slots: Vec<Option<Line<'a>>> = lines.into_iter().map(Some).collect();
        for i in order {
            if let Some(l) = slots[i as usize].take() {
                sorted.push(l);
            }
        }
        drop(slots);
        let mut weights: Vec<f64> = sorted.iter().map(|l| l.sum).collect();
        crate::model::largest_remainder(&mut weights);
        for (l, w) in sorted.iter_mut().zip(weights) {
            l.weight = w as u64;
        }
        let total = sorted.iter().map(|l| l.weight).sum();
        Graph { tree: self, lines: sorted, total }
    }

    /// Calls `line` with every marked node where a line ends, in byte order of the lines.
    fn walk(&self, node: u32, marks: &[u8], line: &mut impl FnMut(u32)) {
        let mut items: Vec<(u32, bool)> = Vec::new();
        let mut c = self.nodes[node as usize].first_child;
        while c != NONE {
            let m = marks[c as usize];
            if m & 1 != 0 {
                items.push((c, false));
            }
            if m & 2 != 0 {
                items.push((c, true));
            }
            c = self.nodes[c as usize].next_sibling;
        }
        let name = |n: u32| self.name(self.nodes[n as usize].frame);
        items.sort_by(|a, b| key_order(name(a.0), a.1, name(b.0), b.1));
        for (c, below) in items {
            if below {
                self.walk(c, marks, line);
            } else {
                line(c);
            }
        }
    }
}

/// One folded line of a graph.
pub struct Line<'a> {
    /// Where the line ends in the tree.
    pub node: u32,
    /// Its weight before rounding.
    sum: f64,
    /// Its processes' weights before rounding, pids ascending.
    pids: Vec<(u32, f64)>,
    /// The faulting region's leaf frame (`--leaf region`), also the line's last frame.
    pub region: Option<&'a str>,
    /// Its whole weight: the lines add up to the estimated total.
    pub weight: u64,
}

impl Line<'_> {
    /// The line's weight shared among its processes: (pid, part), parts
    /// that are not 0, pids ascending (`flamegraph::apportion`).
    pub fn parts(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        let shares: Vec<f64> = self.pids.iter().map(|p| p.1).collect();
        self.pids.iter().zip(apportion(self.weight, &shares)).filter(|p| p.1 > 0).map(|(p, part)| (p.0, part))
    }
}

/// A graph's folded lines, in byte order, with their whole weights.
pub struct Graph<'t, 'a> {
    pub tree: &'t Tree<'a>,
    /// Every line with a weight before rounding; those rounded to 0 are in no folded file.
    pub lines: Vec<Line<'a>>,
    total: u64,
}

impl Graph<'_, '_> {
    /// What the folded lines add up to.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The folded text, every line (`flamegraph::fold` of `folded_by_pid`).
    pub fn folded(&self) -> String {
        let mut out = String::new();
        for l in self.lines.iter().filter(|l| l.weight > 0) {
            let _ = writeln!(out, "{} {}", self.tree.line(l.node), l.weight);
        }
        out
    }

    /// The folded text with frames under `min_share` of the total folded
    /// into their callers: `flamegraph::fold_small(&self.folded(), min_share)`,
    /// without a string for any line it folds.
    pub fn folded_small(&self, min_share: f64) -> String {
        let min = (self.total as f64 * min_share).ceil() as u64;
        if min <= 1 {
            return self.folded();
        }
        let tree = self.tree;
        // Each node's weight: every line through it.
        let mut weights = vec![0u64; tree.nodes.len()];
        for l in self.lines.iter().filter(|l| l.weight > 0) {
            let mut at = l.node;
            while at != ROOT {
                weights[at as usize] += l.weight;
                at = tree.nodes[at as usize].parent;
            }
        }
        // A line is kept whole, or cut at its first node past the process's
        // own that is too light, and ends in `SMALL_STACKS` under its caller.
        // Cut lines by their caller and the leaf they keep.
        let mut whole: HashMap<u32, u64> = HashMap::default();
        let mut cut: HashMap<(u32, Option<&str>), u64> = HashMap::default();
        let mut path = Vec::new();
        for l in self.lines.iter().filter(|l| l.weight > 0) {
            path.clear();
            let mut at = l.node;
            while at != ROOT {
                path.push(at);
                at = tree.nodes[at as usize].parent;
            }
            path.reverse();
            match path.iter().skip(1).position(|&n| weights[n as usize] < min) {
                None => *whole.entry(l.node).or_default() += l.weight,
                Some(i) => {
                    let leaf = path.last().and_then(|&n| kept_leaf(tree.name(tree.nodes[n as usize].frame)));
                    *cut.entry((path[i], leaf)).or_default() += l.weight;
                }
            }
        }
        drop(weights);
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for (node, w) in whole {
            *out.entry(tree.line(node)).or_default() += w;
        }
        for ((caller, leaf), w) in cut {
            let line = match leaf {
                Some(leaf) => format!("{};{SMALL_STACKS};{leaf}", tree.line(caller)),
                None => format!("{};{SMALL_STACKS}", tree.line(caller)),
            };
            *out.entry(line).or_default() += w;
        }
        let mut text = String::new();
        for (line, w) in out {
            let _ = writeln!(text, "{line} {w}");
        }
        text
    }
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
