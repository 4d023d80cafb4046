//! The allocator settings a process started with, from its environment
//! (`/proc/PID/environ`, which keeps what the process was exec'd with: what
//! glibc read at its start). A finding names the one that caused what it
//! saw: a low `MALLOC_MMAP_THRESHOLD_` turns every freed temporary into an
//! munmap, and so a shootdown storm.
use std::collections::BTreeMap;

use crate::identity::env_value;

/// glibc's malloc variables (`man 3 mallopt`, "Environment variables").
const GLIBC_VARS: [&str; 6] = [
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
    "MALLOC_ARENA_MAX",
    "MALLOC_ARENA_TEST",
];

/// Other allocators' settings, and the variable that loads one.
const OTHER_VARS: [&str; 4] = ["MALLOC_CONF", "JE_MALLOC_CONF", "TCMALLOC_RELEASE_RATE", "LD_PRELOAD"];

/// Each allocator setting in `environ` (NUL-separated `KEY=VALUE`), by
/// name: glibc's variables, each `glibc.malloc.*` tunable of
/// `GLIBC_TUNABLES` (by the tunable's name), jemalloc's and tcmalloc's, and
/// `LD_PRELOAD` when it names an allocator.
pub fn settings(environ: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for key in GLIBC_VARS.iter().chain(&OTHER_VARS) {
        let Some(v) = env_value(environ, key) else { continue };
        if *key == "LD_PRELOAD" && !["malloc", "jemalloc", "tcmalloc", "mimalloc"].iter().any(|a| v.contains(a)) {
            continue;
        }
        out.insert((*key).to_string(), v.to_string());
    }
    if let Some(t) = env_value(environ, "GLIBC_TUNABLES") {
        for item in t.split(':') {
            if let Some((k, v)) = item.split_once('=') {
                if k.starts_with("glibc.malloc.") {
                    out.insert(k.to_string(), v.to_string());
                }
            }
        }
    }
    out
}

/// [`settings`] of a running process; empty when its environment cannot be
/// read (gone, or another user's without root).
pub fn of(pid: u32) -> BTreeMap<String, String> {
    std::fs::read(format!("/proc/{pid}/environ")).map(|e| settings(&e)).unwrap_or_default()
}

/// The mmap threshold the settings fix, as (bytes, how it was set: the text
/// to quote). A tunable wins over the variable, as in glibc.
pub fn mmap_threshold(settings: &BTreeMap<String, String>) -> Option<(u64, String)> {
    let from = |key: &str, shown: &dyn Fn(&str) -> String| {
        let v = settings.get(key)?;
        Some((number(v)?, shown(v)))
    };
    from("glibc.malloc.mmap_threshold", &|v| format!("GLIBC_TUNABLES=glibc.malloc.mmap_threshold={v}"))
        .or_else(|| from("MALLOC_MMAP_THRESHOLD_", &|v| format!("MALLOC_MMAP_THRESHOLD_={v}")))
}

/// A size as glibc reads one: decimal, or hex after `0x`.
fn number(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_glibcs_variables_and_tunables_and_other_allocators() {
        let env = b"PATH=/bin\0MALLOC_MMAP_THRESHOLD_=131072\0GLIBC_TUNABLES=glibc.malloc.trim_threshold=0x100000:glibc.rtld.nns=8\0LD_PRELOAD=/usr/lib/libjemalloc.so.2\0HOME=/root\0";
        let s = settings(env);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s["MALLOC_MMAP_THRESHOLD_"], "131072");
        assert_eq!(s["glibc.malloc.trim_threshold"], "0x100000");
        assert_eq!(s["LD_PRELOAD"], "/usr/lib/libjemalloc.so.2");
        assert_eq!(mmap_threshold(&s), Some((131_072, "MALLOC_MMAP_THRESHOLD_=131072".into())));
        let tun = settings(b"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=0x20000\0MALLOC_MMAP_THRESHOLD_=1\0");
        assert_eq!(mmap_threshold(&tun), Some((131_072, "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=0x20000".into())));
        // Not an allocator, nothing set.
        assert!(settings(b"LD_PRELOAD=/usr/lib/libfakeroot.so\0").is_empty());
        assert_eq!(mmap_threshold(&settings(b"")), None);
    }
}
