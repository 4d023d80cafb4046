//! A process's identity beyond its pid (`model::Identity`), read once from
//! `/proc/PID/cgroup` and `/proc/PID/environ`: its cgroup, the container
//! and Kubernetes pod the cgroup path names, its rank from its environment.
//!
//! Cgroup paths name containers in a few layouts, all handled by looking at
//! the path's components from the leaf up:
//! - kubelet, systemd driver: `/kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`
//!   (`crio-<id>.scope` under CRI-O, `docker-<id>.scope` under dockershim;
//!   guaranteed pods have no QoS level: `kubepods-pod<uid>.slice`);
//! - kubelet, cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`
//!   (`crio-<id>` under CRI-O);
//! - containerd's own systemd form: `…/kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`;
//! - Docker and Podman alone: `/docker/<id>`, `/system.slice/docker-<id>.scope`,
//!   `…/libpod-<id>.scope/container`.
//!
//! In a cgroup namespace (a DaemonSet without `hostCgroup`) the paths of
//! processes outside it start with `/..` components; those are skipped.
use std::fs;

use crate::model::{Identity, Rank};

/// The cgroup path `/proc/PID/cgroup` gives: the v1 memory controller's
/// line (the one memory is accounted in), else the v2 line (`0::`), else
/// the first line with a path. `None`: no line at all.
pub fn pick_cgroup(text: &str) -> Option<String> {
    let lines = text.lines().filter_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        Some((ctrls, path))
    });
    let mut v2 = None;
    let mut first = None;
    for (ctrls, path) in lines {
        if ctrls.split(',').any(|c| c == "memory") {
            return Some(path.to_string());
        }
        if ctrls.is_empty() && v2.is_none() {
            v2 = Some(path);
        }
        first.get_or_insert(path);
    }
    v2.or(first).map(str::to_string)
}

/// A container id: 64 lowercase hex digits.
fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A container id named by one path component, and who named it.
fn container_in(part: &str) -> Option<(&'static str, String)> {
    // containerd's systemd form: `slice:prefix:id`.
    if let Some((_, id)) = part.rsplit_once(':').filter(|(_, id)| is_id(id)) {
        let runtime = if part.contains(":crio:") { "cri-o" } else { "containerd" };
        return Some((runtime, id.to_string()));
    }
    let name = part.strip_suffix(".scope").unwrap_or(part);
    for (prefix, runtime) in
        [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker"), ("libpod-", "podman")]
    {
        if let Some(id) = name.strip_prefix(prefix).filter(|id| is_id(id)) {
            return Some((runtime, id.to_string()));
        }
    }
    is_id(name).then(|| ("kubepods", name.to_string()))
}

/// A pod uid named by one path component: `pod<uid>` (cgroupfs driver) or
/// `kubepods[-qos]-pod<uid_with_underscores>.slice` (systemd driver).
fn pod_in(part: &str) -> Option<String> {
    let part = part.split(':').next().unwrap_or(part);
    let uid = if let Some(slice) = part.strip_suffix(".slice") {
        slice.starts_with("kubepods").then(|| slice.rsplit_once("-pod").map(|(_, u)| u))??
    } else {
        part.strip_prefix("pod")?
    };
    let uid = uid.replace('_', "-");
    // A uid is 36 characters of hex and dashes (a static pod's is 32 hex digits).
    let ok = (uid.len() == 36 || uid.len() == 32) && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(uid)
}

/// (container runtime, container id, pod uid) named by a cgroup path.
pub fn parse_cgroup_path(path: &str) -> (Option<&'static str>, Option<String>, Option<String>) {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != "..").collect();
    let mut container = None;
    let mut pod = None;
    for (i, part) in parts.iter().enumerate().rev() {
        if container.is_none() && pod.is_none() {
            if let Some((runtime, id)) = container_in(part) {
                // A bare id is a container only under a pod or Docker's directory.
                let bare_ok = runtime != "kubepods"
                    || i.checked_sub(1).is_some_and(|j| pod_in(parts[j]).is_some() || parts[j] == "docker");
                if bare_ok {
                    let runtime =
                        if runtime == "kubepods" && i > 0 && parts[i - 1] == "docker" { "docker" } else { runtime };
                    container = Some((runtime, id));
                }
            }
        }
        if pod.is_none() {
            pod = pod_in(part);
        }
    }
    let (runtime, id) = container.map_or((None, None), |(r, id)| (Some(r), Some(id)));
    (runtime, id, pod)
}

/// The value of `key` among `environ`'s NUL-separated `KEY=VALUE` entries.
pub(crate) fn env_value<'a>(environ: &'a [u8], key: &str) -> Option<&'a str> {
    environ.split(|&b| b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        let (k, v) = kv.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// The first of `keys` set to a whole number.
fn env_number(environ: &[u8], keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| env_value(environ, k)?.trim().parse().ok())
}

/// (rank, local rank, world size) from a process's environment (as
/// `/proc/PID/environ` holds it): PyTorch's (`torchrun`), Slurm's and
/// Open MPI's names, in that order.
pub fn rank_from_environ(environ: &[u8]) -> (Option<u32>, Option<u32>, Option<u32>) {
    (
        env_number(environ, &["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"]),
        env_number(environ, &["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"]),
        env_number(environ, &["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"]),
    )
}

/// The identity given by a process's `/proc/PID/cgroup` text and environment.
pub fn identity_from(cgroup: Option<&str>, environ: Option<&[u8]>) -> Identity {
    let path = cgroup.and_then(pick_cgroup);
    let (runtime, container_id, pod_uid) = path.as_deref().map_or((None, None, None), parse_cgroup_path);
    let (rank, local_rank, world_size) = environ.map_or((None, None, None), rank_from_environ);
    let rank = Rank { rank, local_rank, world_size };
    Identity {
        cgroup: path,
        container_id,
        container_runtime: runtime.map(str::to_string),
        pod_uid,
        rank: (rank != Rank::default()).then_some(rank),
    }
}

/// `pid`'s identity now; `None` once it has begun to exit. An exiting
/// process gives up its memory (its environment reads empty) and then is
/// moved to the root cgroup, both before it is a zombie: a read counts only
/// when the process was not exiting after it (`PF_EXITING` clear in
/// `/proc/PID/stat`).
pub fn read(pid: u32) -> Option<Identity> {
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    read_with_cgroup(pid, &cgroup)
}

/// [`read`] with `/proc/PID/cgroup` already read (`cgroup`, its text).
pub fn read_with_cgroup(pid: u32, cgroup: &str) -> Option<Identity> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok();
    running(pid).then(|| identity_from(Some(cgroup), environ.as_deref()))
}

/// The kernel's `PF_EXITING` task flag (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// `pid` exists and has not begun to exit: `/proc/PID/stat`'s state (the
/// field after the name) is no zombie's, and its flags (the 7th after it)
/// lack `PF_EXITING`.
fn running(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    let f: Vec<&str> = rest.split_whitespace().take(7).collect();
    let flags = f.get(6).and_then(|v| v.parse::<u64>().ok());
    f.first().is_some_and(|st| *st != "Z" && *st != "X") && flags.is_some_and(|fl| fl & PF_EXITING == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "4e5b6f1a-2c3d-4e5f-8a9b-0c1d2e3f4a5b";

    fn parsed(path: &str) -> (Option<&'static str>, Option<String>, Option<String>) {
        parse_cgroup_path(path)
    }

    fn both(runtime: &'static str) -> (Option<&'static str>, Option<String>, Option<String>) {
        (Some(runtime), Some(ID.into()), Some(UID.into()))
    }

    #[test]
    fn kubelet_systemd_driver_v1_and_v2() {
        let u = UID.replace('-', "_");
        // cgroup v1, a memory line as containerd's systemd driver writes it.
        let v1 = format!(
            "12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope\n\
             11:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope\n\
             1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope\n\
             0::/\n"
        );
        let path = pick_cgroup(&v1).unwrap();
        assert!(path.starts_with("/kubepods.slice/kubepods-burstable.slice/"), "{path}");
        assert_eq!(parsed(&path), both("containerd"));
        // cgroup v2 only, a BestEffort pod under CRI-O; a Guaranteed one has no QoS level.
        let v2 =
            format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{ID}.scope\n");
        assert_eq!(parsed(&pick_cgroup(&v2).unwrap()), both("cri-o"));
        assert_eq!(
            parsed(&format!("/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope")),
            both("containerd")
        );
        // CRI-O's monitor process is in the pod, not in the container.
        assert_eq!(
            parsed(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/crio-conmon-{ID}.scope"
            )),
            (None, None, Some(UID.into()))
        );
        // Seen from inside a cgroup namespace (hostPID, no host cgroup namespace).
        assert_eq!(
            parsed(&format!("/../../kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope")),
            both("containerd")
        );
    }

    #[test]
    fn kubelet_cgroupfs_driver() {
        let v1 =
            format!("11:pids:/kubepods/burstable/pod{UID}/{ID}\n10:memory:/kubepods/burstable/pod{UID}/{ID}\n0::/\n");
        assert_eq!(pick_cgroup(&v1).unwrap(), format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(parsed(&format!("/kubepods/burstable/pod{UID}/{ID}")), both("kubepods"));
        assert_eq!(parsed(&format!("/kubepods/pod{UID}/{ID}")), both("kubepods"));
        assert_eq!(parsed(&format!("/kubepods/besteffort/pod{UID}/crio-{ID}")), both("cri-o"));
        // The pod's own cgroup (its pause container's parent): a pod, no container.
        assert_eq!(parsed(&format!("/kubepods/burstable/pod{UID}")), (None, None, Some(UID.into())));
    }

    #[test]
    fn containerd_colon_form_and_docker_and_podman() {
        let u = UID.replace('-', "_");
        assert_eq!(
            parsed(&format!("/system.slice/containerd.service/kubepods-burstable-pod{u}.slice:cri-containerd:{ID}")),
            both("containerd")
        );
        assert_eq!(parsed(&format!("/docker/{ID}")), (Some("docker"), Some(ID.into()), None));
        assert_eq!(parsed(&format!("/system.slice/docker-{ID}.scope")), (Some("docker"), Some(ID.into()), None));
        assert_eq!(
            parsed(&format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container")),
            (Some("podman"), Some(ID.into()), None)
        );
    }

    #[test]
    fn plain_cgroups_name_no_container() {
        for p in ["/", "/user.slice/user-0.slice/session-3.scope", "/system.slice/ssh.service", "/vmtrace-demo"] {
            assert_eq!(parsed(p), (None, None, None), "{p}");
        }
        // 64 hex digits not under a pod or Docker: some other tool's directory.
        assert_eq!(parsed(&format!("/machine/{ID}")), (None, None, None));
        // Not a uid.
        assert_eq!(parsed("/kubepods/burstable/podxyz/abc"), (None, None, None));
        // A hybrid machine: the v1 memory line wins over the v2 one.
        assert_eq!(pick_cgroup("4:memory:/a\n0::/b\n").as_deref(), Some("/a"));
        assert_eq!(pick_cgroup("0::/b\n").as_deref(), Some("/b"));
        assert_eq!(pick_cgroup("2:cpu,cpuacct:/c\n").as_deref(), Some("/c"));
        assert_eq!(pick_cgroup(""), None);
    }

    #[test]
    fn rank_from_the_environment() {
        let env = b"PATH=/usr/bin\0RANK=3\0LOCAL_RANK=1\0WORLD_SIZE=8\0";
        assert_eq!(rank_from_environ(env), (Some(3), Some(1), Some(8)));
        assert_eq!(
            rank_from_environ(b"SLURM_PROCID=5\0SLURM_LOCALID=1\0SLURM_NTASKS=16\0"),
            (Some(5), Some(1), Some(16))
        );
        assert_eq!(
            rank_from_environ(b"OMPI_COMM_WORLD_RANK=2\0OMPI_COMM_WORLD_LOCAL_RANK=0\0OMPI_COMM_WORLD_SIZE=4"),
            (Some(2), Some(0), Some(4))
        );
        // torchrun's names win over Slurm's when both are set.
        assert_eq!(rank_from_environ(b"SLURM_PROCID=9\0RANK=1\0").0, Some(1));
        // Not a number, a prefix of another name, or nothing: no rank.
        assert_eq!(rank_from_environ(b"RANK=abc\0GLOBAL_RANK=4\0XRANK=1\0"), (None, None, None));
        assert_eq!(rank_from_environ(b""), (None, None, None));
        // Not UTF-8 elsewhere in the environment does not hide the rank.
        assert_eq!(rank_from_environ(b"X=\xff\xfe\0RANK=0\0").0, Some(0));
    }

    #[test]
    fn this_process_reads() {
        let me = read(std::process::id()).expect("this process is alive");
        assert!(me.cgroup.is_some_and(|c| c.starts_with('/')));
        assert_eq!(read(u32::MAX), None);
        // A zombie has left its cgroup and its environment: not read.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        while running(pid) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(read(pid), None, "a zombie's identity is not its own");
        child.wait().unwrap();
    }
}
