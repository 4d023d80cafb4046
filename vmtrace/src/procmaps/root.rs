//! The directory a process's paths are relative to. The paths in a
//! process's maps are its own: a process in a container (another mount
//! namespace) or a chroot names files of its image, which the same path
//! here may not be (another version of libc, or nothing). Its files are
//! reached through its root, `/proc/PID/root`, and after it exits through a
//! descriptor of that root held open (`RootDir`): stacks are named once a
//! process is gone, and naming a container's libtorch from the host's file
//! of the same path would give wrong names without a word.
use std::{
    collections::HashMap,
    ffi::CString,
    os::fd::{FromRawFd as _, OwnedFd},
    path::PathBuf,
    sync::Arc,
};

/// A root directory held open: its files are `prefix` + their path.
/// /proc/PID/maps gives paths from the root of the process's mount
/// namespace, not from its root: a chroot's files show under the chroot's
/// directory (`inside`), which comes off; a path outside it is taken as it
/// is here. The namespace is held open too: its number is not given to
/// another while it keys this root, and its mounts (a container's volumes)
/// stay reachable after its processes exit.
#[derive(Debug)]
pub struct RootDir {
    fd: OwnedFd,
    _ns: Option<OwnedFd>,
    prefix: String,
    inside: String,
}

impl RootDir {
    /// `path` (absolute, as the process's maps give it) under this root.
    pub fn path(&self, path: &str) -> String {
        if self.inside.is_empty() {
            return format!("{}{path}", self.prefix);
        }
        match path.strip_prefix(self.inside.as_str()) {
            Some(rest) if rest.starts_with('/') => format!("{}{rest}", self.prefix),
            _ => path.to_string(),
        }
    }

    /// Whether the held directory is still the one `stat` describes.
    fn is(&self, stat: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        // SAFETY: zeroed stat is a valid out-parameter; the descriptor is ours.
        let mut held: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let ok = unsafe { libc::fstat(std::os::fd::AsRawFd::as_raw_fd(&self.fd), &raw mut held) } == 0;
        ok && (held.st_dev, held.st_ino) == (stat.dev(), stat.ino())
    }
}

/// `path` (as a process's maps give it) here: under `root`, when its
/// process has one of its own, else as it is.
pub fn here(root: Option<&RootDir>, path: &str) -> String {
    root.map_or_else(|| path.to_string(), |r| r.path(path))
}

/// Where a process's paths are.
pub enum Root {
    /// They name the same files as here: this mount namespace.
    Here,
    /// Under its root, held open (a container, a chroot).
    Under(Arc<RootDir>),
}

/// Most roots held open at once: a node runs a few hundred containers at
/// most; past this, the roots no process holds any more are closed.
const MAX_ROOTS: usize = 256;

/// Roots held open, one per (mount namespace, root) that is not this
/// process's: every process of a container shares one.
#[derive(Debug, Default)]
pub struct Roots {
    /// This process's mount namespace (the link's text), once read.
    own: std::sync::OnceLock<Option<PathBuf>>,
    by_ns: HashMap<(PathBuf, PathBuf), Arc<RootDir>>,
    /// Roots that could not be opened (the process was gone).
    failed: u64,
}

impl Roots {
    /// `pid`'s root; `None` when it cannot be told (the process is gone).
    /// In this mount namespace the paths of maps are as here, chroot or
    /// not (the kernel writes them from the reader's root).
    pub fn of(&mut self, pid: u32) -> Option<Root> {
        let own = self.own.get_or_init(|| std::fs::read_link("/proc/self/ns/mnt").ok()).clone();
        let ns_link = format!("/proc/{pid}/ns/mnt");
        let ns = std::fs::read_link(&ns_link).ok()?;
        if own.as_ref() == Some(&ns) {
            return Some(Root::Here);
        }
        let link = format!("/proc/{pid}/root");
        let root = std::fs::read_link(&link).ok()?;
        let stat = std::fs::metadata(&link).ok()?;
        let key = (ns, root);
        if let Some(r) = self.by_ns.get(&key).filter(|r| r.is(&stat)) {
            return Some(Root::Under(Arc::clone(r)));
        }
        let Some(fd) = open_path(&link) else {
            self.failed += 1;
            return None;
        };
        if self.by_ns.len() >= MAX_ROOTS {
            self.by_ns.retain(|_, r| Arc::strong_count(r) > 1);
        }
        let ns_fd = std::fs::File::open(&ns_link).ok().map(OwnedFd::from);
        let prefix = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        log::debug!("{pid}: paths under {} ({}, root {})", prefix, key.0.display(), key.1.display());
        let inside = key.1.to_string_lossy().trim_end_matches('/').to_string();
        let r = Arc::new(RootDir { fd, _ns: ns_fd, prefix, inside });
        self.by_ns.insert(key, Arc::clone(&r));
        Some(Root::Under(r))
    }

    /// Roots held open.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.by_ns.len()
    }
}

/// `path` opened as a directory to walk through (`O_PATH`: no read of it).
fn open_path(path: &str) -> Option<OwnedFd> {
    let c = CString::new(path).ok()?;
    // SAFETY: a valid C string; the descriptor returned is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    // SAFETY: a descriptor just opened, owned by nothing else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_no_root_of_its_own() {
        let mut roots = Roots::default();
        assert!(matches!(roots.of(std::process::id()), Some(Root::Here)), "here");
        assert_eq!(roots.held(), 0);
        assert!(roots.of(u32::MAX - 7).is_none(), "gone: not known");
    }

    #[test]
    fn a_root_dir_prefixes_paths() {
        let fd = open_path("/").unwrap();
        let prefix = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        let r = RootDir { fd, _ns: None, prefix: prefix.clone(), inside: String::new() };
        let p = r.path("/proc/self/status");
        assert!(p.ends_with("/proc/self/status") && p.starts_with("/proc/self/fd/"), "{p}");
        // A chroot's files, as maps name them, from the namespace's root.
        let chroot =
            RootDir { fd: open_path("/").unwrap(), _ns: None, prefix: "/R".into(), inside: "/srv/jail".into() };
        assert_eq!(chroot.path("/srv/jail/opt/prog"), "/R/opt/prog");
        // Outside the chroot's directory: as it is here.
        assert_eq!(chroot.path("/srv/jailbreak/x"), "/srv/jailbreak/x");
        assert!(chroot.is(&std::fs::metadata("/").unwrap()) && !chroot.is(&std::fs::metadata("/proc").unwrap()));
        assert!(std::fs::metadata(r.path("/etc")).is_ok(), "{} walks into the directory", r.path("/etc"));
    }
}
