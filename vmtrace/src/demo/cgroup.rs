//! A scratch memory cgroup for the demo's OOM scenario and the OOM tests.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::oom::{parse_proc_cgroup, v2_memory_root, CgroupVersion, V1_MEMORY_ROOT};

/// A child memory cgroup with a byte limit and no swap, under the caller's
/// own (v1) or off the v2 root (v2 forbids processes in inner cgroups);
/// removed on drop. For the demo and the tests: a hog in it never causes a
/// global OOM.
pub struct ScratchCgroup {
    pub dir: PathBuf,
}

impl ScratchCgroup {
    pub fn new(name: &str, limit_bytes: u64) -> Result<Self, String> {
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let limit = limit_bytes.to_string();
        let err = |what: &str, e: std::io::Error| format!("{what}: {e}");
        if let Some((CgroupVersion::V1, path)) = parse_proc_cgroup(&own, false) {
            let dir = Path::new(V1_MEMORY_ROOT).join(path.trim_start_matches('/')).join(name);
            fs::create_dir_all(&dir).map_err(|e| err("creating a v1 memory cgroup", e))?;
            fs::write(dir.join("memory.limit_in_bytes"), &limit).map_err(|e| err("setting its limit", e))?;
            let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), &limit);
            return Ok(Self { dir });
        }
        let root = v2_memory_root().ok_or("no memory cgroup (v1 or v2) on this machine")?;
        let dir = root.join(name);
        fs::create_dir_all(&dir).map_err(|e| err("creating a v2 memory cgroup", e))?;
        fs::write(dir.join("memory.max"), &limit).map_err(|e| err("setting its limit", e))?;
        let _ = fs::write(dir.join("memory.swap.max"), "0");
        Ok(Self { dir })
    }

    /// A shell command that joins this cgroup, then execs `argv`. Paths are
    /// passed as arguments, never pasted into the script: they may hold spaces.
    pub fn run_inside<S: AsRef<str>>(&self, argv: &[S]) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs").display().to_string();
        let mut v = vec!["sh".into(), "-c".into(), "echo $$ > \"$0\" && exec \"$@\"".into(), procs];
        v.extend(argv.iter().map(|a| a.as_ref().to_string()));
        v
    }
}

impl Drop for ScratchCgroup {
    fn drop(&mut self) {
        // The killed hog may take a moment to leave.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        log::warn!("could not remove {}", self.dir.display());
    }
}
