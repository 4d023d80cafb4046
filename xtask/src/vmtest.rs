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

use crate::Arch;

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
    /// Minutes before a guest is given up on. A TCG guest runs at half its
    /// speed beside a build: 6.1's tests took more than 30 minutes so.
    #[arg(long, default_value_t = 60)]
    pub timeout_min: u64,
    /// Guest architecture: x86_64 (the host's userspace over 9p), or arm64
    /// (Debian's arm64 kernel under qemu-system-aarch64, a minimal arm64
    /// userspace, the cross-built vmtrace and test binaries).
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,
}

/// Tests run in each guest: the fault count, OOM (fentry, and kprobe via
/// --force-tracepoints), TLB, Perfetto-trace and COW-copy tests.
const TESTS: &[(&str, &str)] = &[
    ("record", "first_touch_total_equals_getrusage"),
    ("oom", "memcg_oom"),
    ("tlb", ""),
    // Loads the programs with majors streamed (`--perfetto`): their ring path verified.
    ("perfetto", "oom_kill_is_an_instant_on_the_victim"),
    // The guest has two NUMA nodes (one CPU each): numactl-bound placement.
    ("numa", ""),
    ("pinned", ""),
    // The resident end read through `mm_users` (a BTF offset per kernel).
    ("resident", "torn_down_by_another"),
    // COW copies marked in mm_page_alloc, against the kernel's pagemap frame numbers.
    ("regions", "cow_after_the_child_exited"),
    // The live view's HTTP endpoint on the guest's loopback (brought up by the init).
    ("serve", "serve_exposes_rising_fault_counters_with_bounded_labels"),
];

/// Tests run in each arm64 guest (TCG emulation of arm64 is slow): the
/// fault count against getrusage, regions, huge pages, resident memory,
/// memcg OOM kills, user stacks of code built without frame
/// pointers, the perf counters, COW faults and the live view.
const ARM64_TESTS: &[(&str, &str)] = &[
    ("record", "first_touch_total_equals_getrusage"),
    ("regions", "anonymous_region_counts_every_page"),
    ("regions", "unmapped_mapping_and_short_lived_child_keep_their_faults"),
    // THP faults (Debian's arm64 config: THP always, 4 KiB pages) against the workload's smaps.
    ("regions", "transparent_huge_pages_take_few_faults_each_one_huge"),
    // COW faults from do_wp_page (fentry on 6.12, a kprobe on 6.1), against pagemap.
    ("regions", "cow_after_the_child_exited"),
    // Resident end against the worker's own smaps_rollup, through the classic
    // `kmem:rss_stat` (the verifier refuses the tp_btf program on arm64).
    ("resident", "torn_down_by_another_process_keeps_its_owners_end_classic"),
    ("oom", "memcg_oom"),
    ("native_stacks", "omitted_frame_pointers_unwind_to_main"),
    // Debian's arm64 CPython 3.11, laid out as pyenv's (`arm64_python`).
    ("python_frames", "python_3_11_faults_are_named_by_line"),
    ("perf", ""),
    // The live view's HTTP endpoint on the guest's loopback (brought up by the init).
    ("serve", "serve_exposes_rising_fault_counters_with_bounded_labels"),
];

/// The C fixtures (vmtrace/tests/fixtures) the arm64 tests compile, with the
/// flags the tests give `compile_c_with`: the guest has no compiler, so they
/// are cross-built on the host and the tests pick them up through
/// `VMTRACE_PREBUILT_FIXTURES`.
const ARM64_FIXTURES: &[(&str, &[&str])] = &[
    ("oom_grow.c", &["-O0", "-fno-omit-frame-pointer"]),
    ("nofp.c", &["-O2", "-fomit-frame-pointer"]),
    ("resident_clone_vm.c", &["-O0", "-fno-omit-frame-pointer"]),
    ("cow_after_exit.c", &["-O0", "-fno-omit-frame-pointer"]),
    ("resident_vfork.c", &["-O0", "-fno-omit-frame-pointer"]),
];

/// Cross-builds [`ARM64_FIXTURES`] into `out` (under the workspace, which the
/// guest sees at its own path).
fn cross_fixtures(root: &Path, out: &Path, arch: Arch) -> Result<()> {
    let (gcc, _, _) = crate::cross_gcc(arch);
    fs::create_dir_all(out)?;
    for (name, flags) in ARM64_FIXTURES {
        let src = root.join("vmtrace/tests/fixtures").join(name);
        let bin = out.join(name.trim_end_matches(".c"));
        crate::run(Command::new(gcc).args(*flags).arg("-o").arg(&bin).arg(&src))
            .with_context(|| format!("cross-building the fixture {name}"))?;
    }
    Ok(())
}

/// Debian package name pattern per kernel series.
fn package_pattern(series: &str, arch: Arch) -> Result<&'static str> {
    Ok(match (series, arch) {
        ("6.1", Arch::X86_64) => r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
        ("6.12", Arch::X86_64) => r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-amd64-unsigned$",
        ("6.1", Arch::Arm64) => r"^linux-image-6\.1\.0-[0-9]+-arm64-unsigned$",
        ("6.12", Arch::Arm64) => r"^linux-image-6\.12\.[0-9]+\+deb[0-9]+-arm64-unsigned$",
        _ => bail!("unknown kernel `{series}`: choose 6.1, 6.12 or all"),
    })
}

fn sh(script: &str) -> Result<String> {
    crate::output(Command::new("sh").args(["-c", script]))
}

fn ensure_packages(arch: Arch) -> Result<()> {
    let have = |b: &str| {
        Command::new("sh").args(["-c", &format!("command -v {b}")]).output().is_ok_and(|o| o.status.success())
    };
    if arch == Arch::Arm64 {
        // Debian's arm64 kernels and userspace come from the arm64 archive.
        if !sh("dpkg --print-foreign-architectures")?.lines().any(|l| l.trim() == "arm64") {
            eprintln!("xtask: adding the arm64 architecture (dpkg --add-architecture arm64; apt-get update)");
            sh("dpkg --add-architecture arm64 && apt-get update -qq")?;
        }
        if !have("qemu-system-aarch64") {
            eprintln!("xtask: installing qemu-system-arm");
            sh("DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-arm")?;
        }
    }
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
fn kernel(work: &Path, series: &str, arch: Arch) -> Result<(PathBuf, String)> {
    let pattern = package_pattern(series, arch)?;
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
# Loopback up: `serve` listens on localhost (its test scrapes it there).
ip link set lo up
mkdir -p /host
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host; then
  echo "vmtest: cannot mount the host"; grep 9p /proc/filesystems; ls /sys/bus/virtio/devices; dmesg | tail -20
fi
H=/host
WS=$(sed -n 's/.*vmtest_ws=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$WS" ]; then mount -t 9p -o trans=virtio,version=9p2000.L,ro ws $H$WS; fi
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
fn initramfs(kdir: &Path, release: &str, out: &Path, busybox: &Path) -> Result<()> {
    let root = out.with_extension("d");
    let _ = fs::remove_dir_all(&root);
    for d in ["bin", "proc", "sys", "dev", "modules"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy(busybox, root.join("bin/busybox"))?;
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

/// A minimal arm64 userspace for the guest to chroot into: Debian's arm64
/// glibc, libgcc and static busybox, unpacked (nothing runs on the host),
/// with the workspace's path as a mount point for its 9p share.
fn arm64_rootfs(work: &Path, root: &Path) -> Result<PathBuf> {
    let dir = work.join("rootfs-arm64");
    if !["bin/busybox", "usr/bin/busybox"].iter().any(|b| dir.join(b).exists()) {
        eprintln!("xtask: building the arm64 guest userspace (libc6, libgcc-s1, busybox-static for arm64)");
        let debs = work.join("debs-arm64");
        fs::create_dir_all(&debs)?;
        fs::create_dir_all(&dir)?;
        sh(&format!(
            "cd '{}' && apt-get download libc6:arm64 libgcc-s1:arm64 busybox-static:arm64 2>/dev/null && for d in *.deb; do dpkg-deb -x $d '{}'; done",
            debs.display(),
            dir.display()
        ))?;
    }
    // Debian 12's packages ship /bin and /lib (usrmerge links them on a
    // system); busybox's applets the run script uses, as links to it.
    let busybox = ["bin/busybox", "usr/bin/busybox"]
        .iter()
        .map(|b| dir.join(b))
        .find(|b| b.exists())
        .context("busybox-static:arm64 has no bin/busybox")?;
    let bin = busybox.parent().unwrap_or(&dir).to_path_buf();
    for applet in ["sh", "uname", "cat", "echo", "ls", "mkdir", "sleep", "id", "env", "sed", "grep", "true"] {
        let link = bin.join(applet);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("busybox", &link)?;
        }
    }
    for d in ["mnt", "proc", "sys", "dev", "tmp"] {
        fs::create_dir_all(dir.join(d))?;
    }
    arm64_python(work, &dir)?;
    fs::create_dir_all(dir.join(root.strip_prefix("/").unwrap_or(root)))?;
    Ok(dir)
}

/// Where the arm64 guest's pyenv root is (`PYENV_ROOT`, in the guest).
const ARM64_PYENV_ROOT: &str = "/opt/pyenv";

/// Debian's arm64 CPython 3.11 in the arm64 userspace (`python3.11-minimal`,
/// its standard library's core, expat and zlib, unpacked as libc6 is), and a
/// pyenv-like `versions/3.11.N/bin/python3.11` link to it under
/// [`ARM64_PYENV_ROOT`], where the Python-frame tests look for their
/// interpreters.
fn arm64_python(work: &Path, dir: &Path) -> Result<()> {
    let python = dir.join("usr/bin/python3.11");
    let debs = work.join("debs-arm64-python");
    let have_deb = fs::read_dir(&debs).is_ok_and(|d| {
        d.filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().starts_with("python3.11-minimal_"))
    });
    if !python.exists() || !have_deb {
        eprintln!("xtask: adding Debian's arm64 python3.11 to the guest userspace");
        let _ = fs::remove_dir_all(&debs);
        fs::create_dir_all(&debs)?;
        sh(&format!(
            "cd '{}' && apt-get download python3.11-minimal:arm64 libpython3.11-minimal:arm64 libexpat1:arm64 zlib1g:arm64 2>/dev/null \
             && for d in *.deb; do dpkg-deb -x $d '{}'; done",
            debs.display(),
            dir.display()
        ))?;
    }
    // 3.11.2-6+deb12u6 → 3.11.2, as pyenv names its versions.
    let version = sh(&format!("dpkg-deb -f '{}'/python3.11-minimal_*.deb Version", debs.display()))?;
    let version = version.trim().split(['-', '+']).next().unwrap_or_default().to_string();
    if !version.starts_with("3.11.") {
        bail!("python3.11-minimal:arm64 has version `{version}`");
    }
    let bin = dir.join(ARM64_PYENV_ROOT.trim_start_matches('/')).join("versions").join(&version).join("bin");
    fs::create_dir_all(&bin)?;
    let link = bin.join("python3.11");
    if fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("/usr/bin/python3.11", &link)?;
    }
    Ok(())
}

/// Test binaries built by `cargo test --no-run`, by name (for arm64: cross-built, only `names`).
fn test_binaries(root: &Path, arch: Arch, names: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let mut c = Command::new("cargo");
    c.current_dir(root).args(["test", "--release", "-p", "vmtrace", "--no-run", "--message-format=json"]);
    if arch != Arch::X86_64 {
        let (gcc, _, cc_var) = crate::cross_gcc(arch);
        c.args(["--target", arch.triple()]).env(cc_var, gcc);
        for n in names {
            c.args(["--test", n]);
        }
    }
    let out = c.output()?;
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

fn run_guest(root: &Path, work: &Path, bins: &[(String, PathBuf)], series: &str, args: &VmtestArgs) -> Result<Outcome> {
    let (kdir, release) = kernel(work, series, args.arch)?;
    let initrd = work.join(format!("initramfs-{release}.cpio.gz"));
    // The guest's root: the host's own (x86_64), or a minimal arm64 one.
    let (guest_root, busybox) = match args.arch {
        Arch::X86_64 => (PathBuf::from("/"), PathBuf::from("/bin/busybox")),
        Arch::Arm64 => {
            let r = arm64_rootfs(work, root)?;
            let b = if r.join("bin/busybox").exists() { r.join("bin/busybox") } else { r.join("usr/bin/busybox") };
            (r, b)
        }
    };
    initramfs(&kdir, &release, &initrd, &busybox)?;
    let xchg = work.join(format!("xchg-{release}"));
    let _ = fs::remove_dir_all(&xchg);
    fs::create_dir_all(&xchg)?;
    let vmtrace = args.arch.binary(root);
    let mut script =
        String::from("set -u\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp VMTRACE_TEST_SCALE=10\n");
    if args.arch == Arch::Arm64 {
        let _ = writeln!(script, "export VMTRACE_PREBUILT_FIXTURES='{}'", work.join("fixtures").display());
        let _ = writeln!(script, "export PYENV_ROOT={ARM64_PYENV_ROOT}");
    }
    let _ = writeln!(script, "uname -r > /mnt/uname\n'{}' check > /mnt/check 2>&1", vmtrace.display());
    let _ = writeln!(script, "fail=0");
    for (bin, test) in if args.arch == Arch::Arm64 { ARM64_TESTS } else { TESTS } {
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
    // (CARGO_TARGET_TMPDIR: target/tmp, or target/TRIPLE/tmp for a cross build.)
    let tmp = match args.arch {
        Arch::X86_64 => root.join("target/tmp"),
        Arch::Arm64 => root.join("target").join(args.arch.triple()).join("tmp"),
    };
    fs::write(xchg.join("writable"), format!("{}\n", tmp.display()))?;
    fs::create_dir_all(&tmp)?;
    let vmlinuz = kdir.join(format!("boot/vmlinuz-{release}"));
    eprintln!("xtask: booting {release} under qemu (TCG)");
    let t0 = Instant::now();
    let (mut qemu_cmd, qemu) = qemu_command(args.arch, root, &vmlinuz, &initrd, &guest_root, &xchg);
    let mut child = qemu_cmd
        .stdout(fs::File::create(work.join(format!("console-{release}.log")))?)
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {qemu}"))?;
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

/// The qemu command line of a guest of `arch` (without its console log), and
/// the qemu binary's name.
fn qemu_command(
    arch: Arch,
    root: &Path,
    vmlinuz: &Path,
    initrd: &Path,
    guest_root: &Path,
    xchg: &Path,
) -> (Command, &'static str) {
    let fsdev = |id: &str, path: &Path, ro: bool| {
        format!(
            "local,id={id},path={},security_model=none,multidevs=remap{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    let (qemu, machine, console): (&str, &[&str], &str) = match arch {
        Arch::X86_64 => ("qemu-system-x86_64", &["-machine", "q35", "-cpu", "max"], "ttyS0"),
        // cortex-a72: no pointer authentication to emulate (much slower under TCG).
        Arch::Arm64 => ("qemu-system-aarch64", &["-machine", "virt", "-cpu", "cortex-a72"], "ttyAMA0"),
    };
    let mut append = format!("console={console} quiet panic=-1");
    let mut qemu_cmd = Command::new(qemu);
    qemu_cmd
        .args(["-accel", "tcg,thread=single"])
        .args(machine)
        .args(["-smp", "2", "-m", "1G", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-fsdev", &fsdev("host", guest_root, true), "-device", "virtio-9p-pci,fsdev=host,mount_tag=host"])
        .args(["-fsdev", &fsdev("xchg", xchg, false), "-device", "virtio-9p-pci,fsdev=xchg,mount_tag=xchg"]);
    if arch == Arch::X86_64 {
        // Two NUMA nodes, a CPU and 512 MiB each (tests/numa.rs).
        qemu_cmd.args([
            "-object",
            "memory-backend-ram,id=m0,size=512M",
            "-object",
            "memory-backend-ram,id=m1,size=512M",
            "-numa",
            "node,nodeid=0,cpus=0,memdev=m0",
            "-numa",
            "node,nodeid=1,cpus=1,memdev=m1",
        ]);
    }
    if arch == Arch::Arm64 {
        // The workspace (vmtrace, the test binaries) at its own path in the guest.
        qemu_cmd.args(["-fsdev", &fsdev("ws", root, true), "-device", "virtio-9p-pci,fsdev=ws,mount_tag=ws"]);
        let _ = write!(append, " vmtest_ws={}", root.display());
    }
    qemu_cmd.args(["-append", &append]);
    (qemu_cmd, qemu)
}

pub fn run(root: &Path, args: &VmtestArgs) -> Result<Vec<Outcome>> {
    ensure_packages(args.arch)?;
    let work = match args.arch {
        Arch::X86_64 => root.join("target/vmtest"),
        Arch::Arm64 => root.join("target/vmtest-arm64"),
    };
    fs::create_dir_all(&work)?;
    let series: Vec<&str> = if args.kernel == "all" { vec!["6.1", "6.12"] } else { vec![args.kernel.as_str()] };
    let mut names: Vec<&str> = ARM64_TESTS.iter().map(|(n, _)| *n).collect();
    names.dedup();
    let bins = test_binaries(root, args.arch, &names)?;
    if args.arch == Arch::Arm64 {
        cross_fixtures(root, &work.join("fixtures"), args.arch)?;
    }
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
