//! Who a process is beyond its pid: its cgroup, the container and
//! Kubernetes pod that cgroup path names, and its rank in a distributed job
//! (from its environment). Read by `crate::identity`, carried by every
//! output: summary.json's process rows (flattened into them), the profiles'
//! labels, the Perfetto process tracks, `top` and `serve`.
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// Its cgroup path as `/proc/PID/cgroup` gives it: the v1 memory
    /// controller's line, else the v2 (unified) line; null: not read.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// The container id the cgroup path names (64 hex digits, as `crictl ps`
    /// and `docker ps --no-trunc` show it); null: none named.
    #[serde(default)]
    pub container_id: Option<String>,
    /// Who made that container's cgroup: "containerd", "cri-o", "docker",
    /// "podman", or "kubepods" (a bare id under a pod's cgroup, cgroupfs driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_runtime: Option<String>,
    /// The Kubernetes pod's uid (`kubectl get pod -o jsonpath='{.metadata.uid}'`),
    /// with dashes (the systemd driver's slice names write underscores); null: none named.
    #[serde(default)]
    pub pod_uid: Option<String>,
    /// Its place in a distributed job, from its environment; null: none named.
    #[serde(default)]
    pub rank: Option<Rank>,
}

/// A process's rank, as its environment names it (each null where unset).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank {
    /// `RANK`, else `SLURM_PROCID`, else `OMPI_COMM_WORLD_RANK`.
    pub rank: Option<u32>,
    /// `LOCAL_RANK`, `SLURM_LOCALID`, `OMPI_COMM_WORLD_LOCAL_RANK`.
    pub local_rank: Option<u32>,
    /// `WORLD_SIZE`, `SLURM_NTASKS`, `OMPI_COMM_WORLD_SIZE`.
    pub world_size: Option<u32>,
}

impl Identity {
    /// Nothing known.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The rank number, where one is named.
    pub fn rank_number(&self) -> Option<u32> {
        self.rank.and_then(|r| r.rank)
    }

    /// The container id shortened as `docker ps` and `crictl ps` show it (12 digits).
    pub fn short_container(&self) -> Option<&str> {
        self.container_id.as_deref().map(|c| c.get(..12).unwrap_or(c))
    }

    /// Labels for a profile or a trace: (key, value) of every known field.
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        let mut l = Vec::new();
        let mut put = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                l.push((k, v));
            }
        };
        put("cgroup", self.cgroup.clone());
        put("pod_uid", self.pod_uid.clone());
        put("container_id", self.container_id.clone());
        let r = self.rank.unwrap_or_default();
        put("rank", r.rank.map(|r| r.to_string()));
        put("local_rank", r.local_rank.map(|r| r.to_string()));
        put("world_size", r.world_size.map(|r| r.to_string()));
        l
    }

    /// A short text for a view: `rank 3/8 pod 1f2e3d4c ctr 0123456789ab`;
    /// empty when only the cgroup is known.
    pub fn short(&self) -> String {
        let mut parts = Vec::new();
        let r = self.rank.unwrap_or_default();
        match (r.rank, r.world_size) {
            (Some(r), Some(n)) => parts.push(format!("rank {r}/{n}")),
            (Some(r), None) => parts.push(format!("rank {r}")),
            _ => {}
        }
        if let Some(p) = &self.pod_uid {
            parts.push(format!("pod {}", p.get(..8).unwrap_or(p)));
        }
        if let Some(c) = self.short_container() {
            parts.push(format!("ctr {c}"));
        }
        parts.join(" ")
    }
}

/// A process's name with its identity's short text in brackets
/// (`python3 [rank 0/8 pod 1f2e3d4c ctr 0123456789ab]`, [`Identity::short`]),
/// the name alone when none of rank, pod and container is known: `top`'s
/// rows and the folded files' process frames. The text holds no `;` and
/// ends in `]`, so a folded line keeps its syntax.
pub fn named<'a>(comm: &'a str, id: Option<&Identity>) -> std::borrow::Cow<'a, str> {
    match id.map(Identity::short).filter(|s| !s.is_empty()) {
        Some(who) => std::borrow::Cow::Owned(format!("{comm} [{who}]")),
        None => std::borrow::Cow::Borrowed(comm),
    }
}

/// A [`named`] process frame taken apart: (the process's name, its identity's
/// short text), the frame whole and `None` when it carries none (a folded
/// file written before identities, or a process without one).
pub fn split_named(frame: &str) -> (&str, Option<&str>) {
    let Some((comm, who)) = frame.strip_suffix(']').and_then(|f| f.rsplit_once(" [")) else {
        return (frame, None);
    };
    // Only what `Identity::short` writes: `rank N[/M]`, `pod HEX`, `ctr HEX`, in that order.
    let words: Vec<&str> = who.split(' ').collect();
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hex =
        |s: &str, n: usize| !s.is_empty() && s.len() <= n && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    let mut last = 0;
    let ok = !words.is_empty()
        && words.len().is_multiple_of(2)
        && words.chunks(2).all(|kv| {
            let (order, fits) = match kv[0] {
                "rank" => (1, kv[1].split_once('/').map_or(number(kv[1]), |(r, n)| number(r) && number(n))),
                "pod" => (2, hex(kv[1], 8)),
                "ctr" => (3, hex(kv[1], 12)),
                _ => (0, false),
            };
            let in_order = order > last;
            last = order;
            fits && in_order
        });
    if ok {
        (comm, Some(who))
    } else {
        (frame, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattened_fields_are_null_when_unknown() {
        #[derive(Serialize, Deserialize)]
        struct Row {
            pid: u32,
            #[serde(flatten)]
            identity: Identity,
        }
        let rank = Rank { rank: Some(3), ..Rank::default() };
        let row = Row { pid: 7, identity: Identity { rank: Some(rank), ..Identity::default() } };
        // As vmtrace-contract.md writes them: null where unknown, the runtime absent.
        assert_eq!(
            serde_json::to_string(&row).unwrap(),
            r#"{"pid":7,"cgroup":null,"container_id":null,"pod_uid":null,"rank":{"rank":3,"local_rank":null,"world_size":null}}"#
        );
        // A summary written before identities reads.
        let back: Row = serde_json::from_str(r#"{"pid":7}"#).unwrap();
        assert!(back.identity.is_empty());
    }

    #[test]
    fn short_text() {
        let id = Identity {
            pod_uid: Some("1f2e3d4c-0000-1111-2222-333344445555".into()),
            container_id: Some("a".repeat(64)),
            rank: Some(Rank { rank: Some(3), local_rank: None, world_size: Some(8) }),
            ..Identity::default()
        };
        assert_eq!(id.short(), "rank 3/8 pod 1f2e3d4c ctr aaaaaaaaaaaa");
        assert_eq!(Identity::default().short(), "");
    }

    #[test]
    fn a_named_frame_carries_only_what_is_known_and_reads_back() {
        let pod = Identity {
            cgroup: Some("/kubepods/burstable/pod1f2e3d4c-0000-1111-2222-333344445555/".to_string() + &"b".repeat(64)),
            pod_uid: Some("1f2e3d4c-0000-1111-2222-333344445555".into()),
            container_id: Some("b".repeat(64)),
            container_runtime: Some("kubepods".into()),
            rank: Some(Rank { rank: Some(0), local_rank: Some(0), world_size: None }),
        };
        let rank_only = Identity {
            rank: Some(Rank { rank: Some(7), world_size: Some(16), ..Rank::default() }),
            ..Identity::default()
        };
        let cgroup_only = Identity { cgroup: Some("/user.slice/session-1.scope".into()), ..Identity::default() };
        let cases = [
            (Some(&pod), "python3 [rank 0 pod 1f2e3d4c ctr bbbbbbbbbbbb]"),
            (Some(&rank_only), "python3 [rank 7/16]"),
            // Nothing but a cgroup, or nothing at all: the name as it was.
            (Some(&cgroup_only), "python3"),
            (None, "python3"),
        ];
        for (id, want) in cases {
            let frame = named("python3", id);
            assert_eq!(frame, want);
            // A frame of a folded line: no separator, no trailing weight.
            assert!(!frame.contains(';') && frame.rsplit_once(' ').is_none_or(|(_, w)| w.parse::<u64>().is_err()));
            assert_eq!(split_named(&frame), ("python3", id.map(Identity::short).filter(|s| !s.is_empty()).as_deref()));
        }
        // A name that only looks like one keeps its brackets.
        for name in ["[kworker]", "app [beta]", "app [rank x]", "app [pod 1 rank 2]", "app []", "app [rank 1 rank 2]"] {
            assert_eq!(split_named(name), (name, None), "{name}");
        }
    }
}
