//! `cargo xtask vmtest`: boots Debian's 6.1 and 6.12 kernels under qemu
//! (software emulation: this machine's KVM cannot run stock kernels) and runs
//! the privileged integration tests inside, on the host's own userspace: the
//! host `/` is mounted read-only over virtio-9p and the guest chroots into it,
//! with tmpfs where the tests write. Per kernel: `vmtrace check`, then each
//! test binary; stdout, stderr and exit codes come back through a second 9p
//! share. Nothing is installed into /boot.
use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

#[derive(clap::Args)]
pub struct VmtestArgs {
    /// Which kernel: 6.1, 6.12 or all.
    #[arg(long, default_value = "all")]
    pub kernel: String,
    /// Extra filter passed to every test binary (a test name substring).
    #[arg(long)]
    pub filter: Option<String>,
    /// Run this shell script in the guest instead of the tests (debugging;
    /// its output lands in target/vmtest/xchg-RELEASE/).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Minutes before a guest is given up on.
    #[arg(long, default_value_t = 30)]
    pub timeout_min: u64,
}

/// Tests run in each guest: the fault count, OOM (fentry, and kprobe via
/// --force-tracepoints), TLB and Perfetto-trace tests.
const TESTS: &[(&str, &str)] = &[
    ("record", "first_touch_total_equals_getrusage"),
    ("oom", "memcg_oom"),
    ("tlb", ""),
    // Loads the programs with majors streamed (`--perfetto`): their ring path verified.
    ("perfetto", "oom_kill_is_an_instant_on_the_victim"),
    // The guest has two NUMA nodes (one CPU each): numactl-bound placement.
    ("numa", ""),
    ("pinned", ""),
];

/// Debian package name pattern per kernel series.
fn package_pattern(series: &str) -> Result<&'static str> {
    Ok(match series {
        "6.1" => r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
        "6.12" => r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64-unsigned$",
        _ => bail!("unknown kernel `{series}`: choose 6.1, 6.12 or all"),
    })
}

fn sh(script: &str) -> Result<String> {
    crate::output(Command::new("sh").args(["-c", script]))
}

fn ensure_packages() -> Result<()> {
    let have = |b: &str| {
        Command::new("sh").args(["-c", &format!("command -v {b}")]).output().is_ok_and(|o| o.status.success())
    };
    if have("qemu-system-x86_64")
        && Path::new("/bin/busybox").exists()
        && have("cpio")
        && have("depmod")
        && have("numactl")
    {
        return Ok(());
    }
    eprintln!("xtask: installing qemu-system-x86, busybox-static, cpio, kmod");
    sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        qemu-system-x86 busybox-static cpio kmod xz-utils numactl")?;
    Ok(())
}

/// Downloads and unpacks the newest kernel of `series`; returns (dir, release).
fn kernel(work: &Path, series: &str) -> Result<(PathBuf, String)> {
    let pattern = package_pattern(series)?;
    let names = sh(&format!("apt-cache search --names-only '{pattern}' | awk '{{print $1}}' | sort -V"))?;
    let Some(pkg) = names.lines().last() else {
        bail!("no package matches {pattern}: run apt-get update (bookworm and bookworm-security sources)")
    };
    let dir = work.join(pkg);
    if !dir.join("boot").exists() {
        eprintln!("xtask: fetching {pkg}");
        fs::create_dir_all(&dir)?;
        sh(&format!(
            "cd '{}' && apt-get download {pkg} 2>/dev/null && dpkg-deb -x *.deb . && rm -f *.deb",
            dir.display()
        ))?;
    }
    let release = fs::read_dir(dir.join("lib/modules"))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .context("no lib/modules in the kernel package")?;
    // The packages ship no modules.dep.
    sh(&format!("depmod -b '{}' {release}", dir.display()))?;
    Ok((dir, release))
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do insmod /modules/$m; done
mkdir -p /host
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host; then
  echo "vmtest: cannot mount the host"; grep 9p /proc/filesystems; ls /sys/bus/virtio/devices; dmesg | tail -20
fi
H=/host
mount -t 9p -o trans=virtio,version=9p2000.L xchg $H/mnt
mount -t proc proc $H/proc
mount -t sysfs sys $H/sys
mount -t devtmpfs dev $H/dev
mount -t tmpfs tmp $H/tmp
mount -t tracefs tracefs $H/sys/kernel/tracing
mount -t debugfs debugfs $H/sys/kernel/debug
mount -t bpf bpf $H/sys/fs/bpf
mount -t cgroup2 cgroup2 $H/sys/fs/cgroup
echo +memory > $H/sys/fs/cgroup/cgroup.subtree_control
for d in $(cat $H/mnt/writable); do mount -t tmpfs w $H$d; done
chroot $H /bin/sh /mnt/run.sh > $H/mnt/stdout 2> $H/mnt/stderr
echo $? > $H/mnt/rc
sync
poweroff -f
"#;

/// A busybox initramfs that loads the 9p modules of `release` and runs /mnt/run.sh in the host chroot.
fn initramfs(kdir: &Path, release: &str, out: &Path) -> Result<()> {
    let root = out.with_extension("d");
    let _ = fs::remove_dir_all(&root);
    for d in ["bin", "proc", "sys", "dev", "modules"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy("/bin/busybox", root.join("bin/busybox"))?;
    fs::write(root.join("init"), INIT)?;
    sh(&format!("chmod +x '{}'", root.join("init").display()))?;
    let deps = sh(&format!(
        "for m in 9p 9pnet_virtio virtio_pci; do modprobe -d '{}' -S {release} --show-depends $m 2>/dev/null; done | awk '$1==\"insmod\"{{print $2}}'",
        kdir.display()
    ))?;
    let mut order = String::new();
    for ko in deps.lines() {
        let name = Path::new(ko).file_name().unwrap().to_string_lossy().trim_end_matches(".xz").to_string();
        if order.lines().any(|l| l == name) {
            continue;
        }
        let dst = root.join("modules").join(&name);
        if Path::new(ko).extension().is_some_and(|e| e == "xz") {
            sh(&format!("xz -dc '{ko}' > '{}'", dst.display()))?;
        } else {
            fs::copy(ko, &dst)?;
        }
        let _ = writeln!(order, "{name}");
    }
    fs::write(root.join("modules/order"), order)?;
    sh(&format!("cd '{}' && find . | cpio -o -H newc 2>/dev/null | gzip -1 > '{}'", root.display(), out.display()))?;
    Ok(())
}

/// Test binaries built by `cargo test --no-run`, by name.
fn test_binaries(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let out = Command::new("cargo")
        .current_dir(root)
        .args(["test", "--release", "-p", "vmtrace", "--no-run", "--message-format=json"])
        .output()?;
    if !out.status.success() {
        bail!("building the tests failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["profile"]["test"] == true && v["target"]["kind"][0] == "test" {
            if let Some(exe) = v["executable"].as_str() {
                bins.push((v["target"]["name"].as_str().unwrap_or_default().to_string(), PathBuf::from(exe)));
            }
        }
    }
    Ok(bins)
}

pub struct Outcome {
    pub series: String,
    pub release: String,
    pub passed: bool,
    pub check: String,
    pub summary: String,
}

#[allow(
    clippy::too_many_lines,
    reason = "one guest run, start to end: the qemu command with its NUMA nodes, then the console read; split with the arm64 work (91df0e5) when it comes back"
)]
fn run_guest(root: &Path, work: &Path, bins: &[(String, PathBuf)], series: &str, args: &VmtestArgs) -> Result<Outcome> {
    let (kdir, release) = kernel(work, series)?;
    let initrd = work.join(format!("initramfs-{release}.cpio.gz"));
    initramfs(&kdir, &release, &initrd)?;
    let xchg = work.join(format!("xchg-{release}"));
    let _ = fs::remove_dir_all(&xchg);
    fs::create_dir_all(&xchg)?;
    let vmtrace = root.join("target/release/vmtrace");
    let mut script =
        String::from("set -u\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp VMTRACE_TEST_SCALE=10\n");
    let _ = writeln!(script, "uname -r > /mnt/uname\n'{}' check > /mnt/check 2>&1", vmtrace.display());
    let _ = writeln!(script, "fail=0");
    for (bin, test) in TESTS {
        let Some((_, exe)) = bins.iter().find(|(n, _)| n == bin) else { bail!("no test binary `{bin}`") };
        let filter = args.filter.as_deref().unwrap_or(test);
        let _ = writeln!(script, "echo '=== {bin} {filter}' ; '{}' --test-threads 1 {filter} || fail=1", exe.display());
    }
    script.push_str("exit $fail\n");
    if let Some(custom) = &args.script {
        script = fs::read_to_string(custom).with_context(|| format!("reading {}", custom.display()))?;
    }
    fs::write(xchg.join("run.sh"), script)?;
    // Where the tests write inside the read-only host: cargo's test tmpdir.
    fs::write(xchg.join("writable"), format!("{}\n", root.join("target/tmp").display()))?;
    fs::create_dir_all(root.join("target/tmp"))?;
    let vmlinuz = kdir.join(format!("boot/vmlinuz-{release}"));
    let fsdev = |id: &str, path: &Path, ro: bool| {
        format!(
            "local,id={id},path={},security_model=none,multidevs=remap{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    eprintln!("xtask: booting {release} under qemu (TCG)");
    let t0 = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg,thread=single",
            "-machine",
            "q35",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "1G",
            // Two NUMA nodes, a CPU and 512 MiB each (tests/numa.rs).
            "-object",
            "memory-backend-ram,id=m0,size=512M",
            "-object",
            "memory-backend-ram,id=m1,size=512M",
            "-numa",
            "node,nodeid=0,cpus=0,memdev=m0",
            "-numa",
            "node,nodeid=1,cpus=1,memdev=m1",
            "-nographic",
            "-no-reboot",
        ])
        .arg("-kernel")
        .arg(&vmlinuz)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .args(["-fsdev", &fsdev("host", Path::new("/"), true), "-device", "virtio-9p-pci,fsdev=host,mount_tag=host"])
        .args(["-fsdev", &fsdev("xchg", &xchg, false), "-device", "virtio-9p-pci,fsdev=xchg,mount_tag=xchg"])
        .stdout(fs::File::create(work.join(format!("console-{release}.log")))?)
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let deadline = t0 + Duration::from_secs(args.timeout_min * 60);
    let timed_out = loop {
        if child.try_wait()?.is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break true;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let read = |n: &str| fs::read_to_string(xchg.join(n)).unwrap_or_default();
    let rc = read("rc").trim().parse::<i32>().ok();
    let stdout = read("stdout");
    let summary: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("===") || l.starts_with("test ") || l.contains("test result"))
        .collect();
    eprintln!(
        "xtask: {release}: {} after {:.0} s",
        match (timed_out, rc) {
            (true, _) => "TIMED OUT".to_string(),
            (_, Some(0)) => "passed".to_string(),
            (_, Some(c)) => format!("FAILED (exit {c})"),
            (_, None) => "no result (guest did not finish)".to_string(),
        },
        t0.elapsed().as_secs_f64()
    );
    if rc != Some(0) {
        eprintln!("{stdout}\n{}", read("stderr"));
        eprintln!("xtask: console log: {}", work.join(format!("console-{release}.log")).display());
    }
    Ok(Outcome {
        series: series.into(),
        release,
        passed: rc == Some(0) && !timed_out,
        check: read("check"),
        summary: summary.join("\n"),
    })
}

pub fn run(root: &Path, args: &VmtestArgs) -> Result<Vec<Outcome>> {
    ensure_packages()?;
    let work = root.join("target/vmtest");
    fs::create_dir_all(&work)?;
    let series: Vec<&str> = if args.kernel == "all" { vec!["6.1", "6.12"] } else { vec![args.kernel.as_str()] };
    let bins = test_binaries(root)?;
    let mut out = Vec::new();
    for s in series {
        out.push(run_guest(root, &work, &bins, s, args)?);
    }
    let mut report = String::new();
    for o in &out {
        let _ = writeln!(
            report,
            "## {} ({}): {}\n\n```\n{}\n```\n\n`vmtrace check`:\n\n```\n{}```\n",
            o.series,
            o.release,
            if o.passed { "pass" } else { "FAIL" },
            o.summary,
            o.check
        );
    }
    fs::write(work.join("report.md"), &report)?;
    eprintln!("xtask: wrote {}", work.join("report.md").display());
    if out.iter().any(|o| !o.passed) {
        bail!(
            "vmtest failed on: {}",
            out.iter().filter(|o| !o.passed).map(|o| o.release.as_str()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(out)
}
