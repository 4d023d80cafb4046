//! Who a process is beyond its pid: its cgroup, the container and
//! Kubernetes pod that cgroup path names, and its rank in a distributed job
//! (from its environment). Read by `crate::identity`, carried by every
//! output: summary.json's process rows (flattened into them), the profiles'
//! labels, the Perfetto process tracks, `top` and `serve`.
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// Its cgroup path as `/proc/PID/cgroup` gives it: the v1 memory
    /// controller's line, else the v2 (unified) line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The container id the cgroup path names (64 hex digits, as `crictl ps`
    /// and `docker ps --no-trunc` show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Who made that container's cgroup: "containerd", "cri-o", "docker",
    /// "podman", or "kubepods" (a bare id under a pod's cgroup, cgroupfs driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_runtime: Option<String>,
    /// The Kubernetes pod's uid (`kubectl get pod -o jsonpath='{.metadata.uid}'`),
    /// with dashes (the systemd driver's slice names write underscores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Its rank in the job: `RANK`, else `SLURM_PROCID`, else `OMPI_COMM_WORLD_RANK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its rank on this node: `LOCAL_RANK`, `SLURM_LOCALID`, `OMPI_COMM_WORLD_LOCAL_RANK`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<u32>,
    /// Ranks in the job: `WORLD_SIZE`, `SLURM_NTASKS`, `OMPI_COMM_WORLD_SIZE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

impl Identity {
    /// Nothing known.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
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
        put("rank", self.rank.map(|r| r.to_string()));
        put("local_rank", self.local_rank.map(|r| r.to_string()));
        put("world_size", self.world_size.map(|r| r.to_string()));
        l
    }

    /// A short text for a view: `rank 3/8 pod 1f2e… ctr 0123456789ab`, empty when nothing is known
    /// but the cgroup (the cgroup is shown on its own).
    pub fn short(&self) -> String {
        let mut parts = Vec::new();
        match (self.rank, self.world_size) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattened_fields_are_left_out_when_unknown() {
        #[derive(Serialize, Deserialize)]
        struct Row {
            pid: u32,
            #[serde(flatten)]
            identity: Identity,
        }
        let row = Row { pid: 7, identity: Identity { rank: Some(3), ..Identity::default() } };
        assert_eq!(serde_json::to_string(&row).unwrap(), r#"{"pid":7,"rank":3}"#);
        let back: Row = serde_json::from_str(r#"{"pid":7}"#).unwrap();
        assert!(back.identity.is_empty());
    }

    #[test]
    fn short_text() {
        let id = Identity {
            pod_uid: Some("1f2e3d4c-0000-1111-2222-333344445555".into()),
            container_id: Some("a".repeat(64)),
            rank: Some(3),
            world_size: Some(8),
            ..Identity::default()
        };
        assert_eq!(id.short(), "rank 3/8 pod 1f2e3d4c ctr aaaaaaaaaaaa");
        assert_eq!(Identity::default().short(), "");
    }
}
