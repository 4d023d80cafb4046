//! Can an anonymous or shmem fault map a PMD-sized transparent huge page on
//! this system? When none can, the huge-page hook (a program on every page
//! allocation in the system, ~60 ns each here) is not attached. Page-cache
//! folios of PMD order need no setting (filesystems with large folios make
//! them): the page-cache hook sees those.
use std::path::Path;

const SYSFS: &str = "/sys/kernel/mm/transparent_hugepage";

/// Why no fault can map a huge page, or `None` when one can.
pub fn why_impossible() -> Option<String> {
    let root = Path::new(SYSFS);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let Some(enabled) = read("enabled") else {
        return Some("the kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)".into());
    };
    // Per-size controls (6.8+) name the PMD size's directory after it in kB.
    let pmd_dir = format!("hugepages-{}kB", pmd_kb());
    let settings = Settings {
        enabled: selected(&enabled),
        pmd_enabled: read(&format!("{pmd_dir}/enabled")).map(|s| selected(&s)),
        shmem: read("shmem_enabled").map(|s| selected(&s)),
        pmd_shmem: read(&format!("{pmd_dir}/shmem_enabled")).map(|s| selected(&s)),
        mounts: std::fs::read_to_string("/proc/mounts").unwrap_or_default(),
    };
    settings.why_impossible()
}

/// The setting that decides whether an anonymous fault of PMD size may map
/// a huge page: `always`, `madvise` or `never` (the PMD size's own control,
/// 6.8+, unless it says `inherit`); `None` without THP.
pub fn anon_mode() -> Option<String> {
    let root = Path::new(SYSFS);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let enabled = selected(&read("enabled")?);
    let pmd = read(&format!("hugepages-{}kB/enabled", pmd_kb())).map(|s| selected(&s));
    Some(match pmd {
        Some(m) if m != "inherit" => m,
        _ => enabled,
    })
}

/// Whether shmem or a tmpfs mount may map huge pages (whatever the anonymous
/// setting): only then does a huge fault allocate outside THP_FAULT_ALLOC.
pub fn shmem_huge_possible() -> bool {
    let root = Path::new(SYSFS);
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    if read("enabled").is_none() {
        return false;
    }
    let pmd_dir = format!("hugepages-{}kB", pmd_kb());
    let settings = Settings {
        enabled: "never".into(),
        pmd_enabled: None,
        shmem: read("shmem_enabled").map(|s| selected(&s)),
        pmd_shmem: read(&format!("{pmd_dir}/shmem_enabled")).map(|s| selected(&s)),
        mounts: std::fs::read_to_string("/proc/mounts").unwrap_or_default(),
    };
    settings.why_impossible().is_none()
}

/// Huge pages in `pid`'s MADV_HUGEPAGE regions now, from /proc/PID/smaps
/// (anonymous memory, in PMD-sized pages); `None` when the process is gone.
pub fn advised_huge_pages(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    Some(advised_huge_kb(&text) / pmd_kb())
}

/// The PMD (huge page) size in kB, 2048 where the kernel does not say.
fn pmd_kb() -> u64 {
    std::fs::read_to_string(Path::new(SYSFS).join("hpage_pmd_size"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(2048, |b| b / 1024)
}

/// AnonHugePages of the regions whose VmFlags have `hg` (MADV_HUGEPAGE).
fn advised_huge_kb(smaps: &str) -> u64 {
    let (mut total, mut region) = (0, 0);
    for line in smaps.lines() {
        if let Some(v) = line.strip_prefix("AnonHugePages:") {
            region = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            // The last line of a region's block.
            if flags.split_whitespace().any(|w| w == "hg") {
                total += region;
            }
            region = 0;
        }
    }
    total
}

/// The bracketed choice of a sysfs multiple-choice file: "always [madvise] never".
fn selected(s: &str) -> String {
    s.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']')).unwrap_or_else(|| s.trim()).to_string()
}

struct Settings {
    enabled: String,
    pmd_enabled: Option<String>,
    shmem: Option<String>,
    pmd_shmem: Option<String>,
    mounts: String,
}

impl Settings {
    fn why_impossible(&self) -> Option<String> {
        let inherit = |own: &Option<String>, top: &str| match own.as_deref() {
            None | Some("inherit") => top.to_string(),
            Some(v) => v.to_string(),
        };
        let anon = inherit(&self.pmd_enabled, &self.enabled);
        let shmem_top = self.shmem.clone().unwrap_or_else(|| "never".into());
        let shmem = inherit(&self.pmd_shmem, &shmem_top);
        if anon != "never" {
            return None;
        }
        // "deny" turns huge pages off for every tmpfs mount too.
        if shmem_top == "deny" {
            return Some("transparent_hugepage/enabled and shmem_enabled are off (never, deny)".into());
        }
        if shmem != "never" {
            return None;
        }
        let huge_tmpfs = self.mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&"tmpfs")
                && f.get(3).is_some_and(|o| o.split(',').any(|o| o.starts_with("huge=") && o != "huge=never"))
        });
        if huge_tmpfs {
            return None;
        }
        Some("transparent_hugepage/enabled and shmem_enabled are never, and no tmpfs is mounted with huge=".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(enabled: &str, pmd: Option<&str>, shmem: &str, mounts: &str) -> Settings {
        Settings {
            enabled: enabled.into(),
            pmd_enabled: pmd.map(Into::into),
            shmem: Some(shmem.into()),
            pmd_shmem: Some("inherit".into()),
            mounts: mounts.into(),
        }
    }

    #[test]
    fn reads_the_bracketed_choice() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(selected("always within_size advise [never] deny force"), "never");
    }

    #[test]
    fn any_anonymous_policy_but_never_allows_huge_faults() {
        assert!(s("madvise", Some("inherit"), "never", "").why_impossible().is_none());
        assert!(s("always", None, "never", "").why_impossible().is_none());
        // The PMD size's own control wins over the top-level one.
        assert!(s("never", Some("madvise"), "never", "").why_impossible().is_none());
        assert!(s("always", Some("never"), "never", "").why_impossible().is_some());
    }

    #[test]
    fn shmem_and_huge_tmpfs_mounts_count() {
        let tmpfs = "tmpfs /dev/shm tmpfs rw,relatime,size=1024k 0 0\n";
        assert!(s("never", None, "never", tmpfs).why_impossible().is_some());
        assert!(s("never", None, "advise", tmpfs).why_impossible().is_none());
        let huge = "tmpfs /mnt/h tmpfs rw,relatime,huge=within_size 0 0\n";
        assert!(s("never", None, "never", huge).why_impossible().is_none());
        assert!(s("never", None, "deny", huge).why_impossible().is_some());
        let off = "tmpfs /mnt/h tmpfs rw,relatime,huge=never 0 0\n";
        assert!(s("never", None, "never", off).why_impossible().is_some());
    }

    #[test]
    fn huge_pages_of_advised_regions_from_smaps() {
        let smaps = "\
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
AnonHugePages:     36864 kB
VmFlags: rd wr mr mw me ac hg 
7f1000000000-7f1000400000 rw-p 00000000 00:00 0 
AnonHugePages:      4096 kB
VmFlags: rd wr mr mw me ac 
";
        // The other region's huge page (MADV_COLLAPSE, say) came from no fault.
        assert_eq!(advised_huge_kb(smaps), 36864);
    }
}
