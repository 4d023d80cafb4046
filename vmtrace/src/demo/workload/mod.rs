//! Built-in workloads (`vmtrace workload …`, hidden): the demo runs them and the
//! tests use them as ground truth, since each reports the kernel's own
//! `getrusage` counts for itself as one JSON line on stdout.
use std::{
    fs::OpenOptions,
    io::Write as _,
    os::fd::AsRawFd as _,
    path::Path,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

pub const PAGE: usize = 4096;

/// When set, workloads append their report lines to this file instead of stdout.
pub const REPORT_ENV: &str = "VMTRACE_REPORT";

/// What a workload process reports about itself.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    pub role: String,
    pub pid: u32,
    /// `getrusage(RUSAGE_SELF)` at the end: every fault of this process.
    pub minflt: u64,
    pub majflt: u64,
    pub pages: u64,
    /// Time of the measured loop only (start-up excluded), for benchmarks.
    pub loop_ns: u64,
    /// PMD-sized pages in this process's MADV_HUGEPAGE regions at the end
    /// (/proc/self/smaps), where the workload asked for huge pages.
    #[serde(default)]
    pub huge_pages: u64,
}

/// Parses the JSON lines the built-in workloads print; other lines are the
/// workload's own output and are skipped.
pub fn parse_reports(text: &str) -> Vec<Report> {
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn rusage() -> (u64, u64) {
    rusage_of(libc::RUSAGE_SELF)
}

fn rusage_of(who: i32) -> (u64, u64) {
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(who, &raw mut ru) };
    (ru.ru_minflt as u64, ru.ru_majflt as u64)
}

fn emit(role: &str, pages: u64, loop_ns: u64) {
    emit_huge(role, pages, loop_ns, 0);
}

fn emit_huge(role: &str, pages: u64, loop_ns: u64, huge_pages: u64) {
    emit_into(report_file(), role, pages, loop_ns, huge_pages);
}

/// The report file of `REPORT_ENV`, opened for one append.
fn report_file() -> Option<std::fs::File> {
    OpenOptions::new().create(true).append(true).open(std::env::var_os(REPORT_ENV)?).ok()
}

/// [`emit_huge`] into a report file opened before (a workload that gives up
/// its privileges may no longer open it); stdout without one.
fn emit_into(file: Option<std::fs::File>, role: &str, pages: u64, loop_ns: u64, huge_pages: u64) {
    let (minflt, majflt) = rusage();
    let r = Report { role: role.into(), pid: std::process::id(), minflt, majflt, pages, loop_ns, huge_pages };
    let line = format!("{}\n", serde_json::to_string(&r).unwrap_or_default());
    // One append per line: forked children share the file without interleaving.
    if let Some(mut f) = file {
        let _ = f.write_all(line.as_bytes());
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// Anonymous private mapping of `bytes`, with THP advice.
fn map_anon(bytes: usize, huge: bool) -> Result<*mut u8, String> {
    map_anon_advised(bytes, Some(huge))
}

/// Anonymous private mapping of `bytes`: `Some(huge)` advises for or
/// against transparent huge pages, `None` leaves it to the system's mode.
fn map_anon_advised(bytes: usize, huge: Option<bool>) -> Result<*mut u8, String> {
    // SAFETY: anonymous mapping, no fd.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap {bytes} bytes: {}", std::io::Error::last_os_error()));
    }
    if let Some(huge) = huge {
        let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: advising our own fresh mapping.
        unsafe { libc::madvise(p, bytes, advice) };
    }
    Ok(p.cast())
}

/// Writes one byte per page: one first-touch fault per 4 KiB page.
fn touch(p: *mut u8, bytes: usize) {
    for off in (0..bytes).step_by(PAGE) {
        // SAFETY: inside the mapping.
        unsafe { p.add(off).write_volatile(1) };
    }
}

/// First touch of `mib` MiB of anonymous memory, by `threads` threads;
/// `pace_ms` > 0 sleeps that long after each MiB (a slowly growing hog).
/// `huge`: advice for (`Some(true)`) or against huge pages, or none.
pub fn first_touch(mib: usize, huge: Option<bool>, threads: usize, pace_ms: u64, unmap: bool) -> Result<(), String> {
    let bytes = mib << 20;
    let p = map_anon_advised(bytes, huge)? as usize;
    let t0 = Instant::now();
    if pace_ms > 0 {
        for m in 0..mib {
            touch((p + (m << 20)) as *mut u8, 1 << 20);
            std::thread::sleep(std::time::Duration::from_millis(pace_ms));
        }
    } else {
        let threads = threads.max(1);
        let chunk = (bytes / threads) & !(PAGE - 1);
        std::thread::scope(|s| {
            for i in 0..threads {
                let len = if i + 1 == threads { bytes - chunk * i } else { chunk };
                s.spawn(move || touch((p + chunk * i) as *mut u8, len));
            }
        });
    }
    let loop_ns = t0.elapsed().as_nanos() as u64;
    let huge_pages =
        if huge == Some(true) { crate::kernel::thp::advised_huge_pages(std::process::id()).unwrap_or(0) } else { 0 };
    if unmap {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(p as *mut libc::c_void, bytes) };
    }
    emit_huge("first-touch", (bytes / PAGE) as u64, loop_ns, huge_pages);
    Ok(())
}

/// `mib` MiB of anonymous memory written and held until the process exits:
/// all of it at one call site (`hold_at_one_site`), or half at each of two
/// (`hold_first_half`, `hold_second_half`). 4 KiB pages (MADV_NOHUGEPAGE):
/// the demo's huge-page rule stays out of it.
pub fn hold(mib: usize, sites: u8) -> Result<(), String> {
    let t0 = Instant::now();
    let held = if sites >= 2 {
        let half = mib / 2;
        vec![hold_first_half(half)?, hold_second_half(mib - half)?]
    } else {
        vec![hold_at_one_site(mib)?]
    };
    let loop_ns = t0.elapsed().as_nanos() as u64;
    let pages: usize = held.iter().map(|(_, bytes)| bytes / PAGE).sum();
    emit("hold", pages as u64, loop_ns);
    // Held to the end: the exit frees it.
    drop(held);
    Ok(())
}

#[inline(never)]
fn hold_at_one_site(mib: usize) -> Result<(usize, usize), String> {
    // Not a tail call: this function stays in the stack.
    std::hint::black_box(written(mib, 1))
}

#[inline(never)]
fn hold_first_half(mib: usize) -> Result<(usize, usize), String> {
    // Not a tail call: this function stays in the stack.
    std::hint::black_box(written(mib, 2))
}

#[inline(never)]
fn hold_second_half(mib: usize) -> Result<(usize, usize), String> {
    // Not a tail call: this function stays in the stack.
    std::hint::black_box(written(mib, 3))
}

/// A fresh mapping of `mib` MiB, every page written, the first byte `tag`
/// (the sites differ: identical functions would be merged into one):
/// (address, bytes).
#[inline(never)]
fn written(mib: usize, tag: u8) -> Result<(usize, usize), String> {
    let bytes = mib << 20;
    let p = map_anon(bytes, false)?;
    touch(p, bytes);
    // SAFETY: inside the mapping.
    unsafe { p.write_volatile(tag) };
    Ok((p as usize, bytes))
}

/// A locked pool (`pinned_pool_oversized`, `memlock_limit`): `mib` MiB
/// mapped and mlock'ed (`lock_the_pool`), as a pinned-memory reserve is,
/// and `rest_mib` MiB of other memory written beside it (`use_the_rest`,
/// 4 KiB pages), both held for 1.5 s: vmtrace reads `VmLck` and `VmRSS`
/// every half second. With `limit_kib`: `RLIMIT_MEMLOCK` set to it and run
/// as user nobody (no `CAP_IPC_LOCK`) before the lock, which the kernel then
/// refuses with ENOMEM: the lesson, so that is a success.
pub fn lock(mib: usize, rest_mib: usize, limit_kib: Option<u64>) -> Result<(), String> {
    let t0 = Instant::now();
    // Opened while this process may still write where the report goes.
    let report = report_file();
    if let Some(kib) = limit_kib {
        let rl = libc::rlimit { rlim_cur: kib << 10, rlim_max: kib << 10 };
        // SAFETY: plain system calls on this process.
        let dropped = unsafe {
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const rl) == 0
                && (libc::geteuid() != 0 || (libc::setgid(65534) == 0 && libc::setuid(65534) == 0))
        };
        if !dropped {
            return Err(format!("could not set RLIMIT_MEMLOCK and become nobody: {}", std::io::Error::last_os_error()));
        }
    }
    let bytes = mib << 20;
    let pool = map_anon(bytes, false)?;
    let mut locked = bytes;
    match (lock_the_pool(pool, bytes), limit_kib) {
        (0, None) => {}
        (0, Some(kib)) => return Err(format!("the kernel locked {mib} MiB beyond RLIMIT_MEMLOCK {kib} KiB")),
        (libc::ENOMEM, Some(kib)) => {
            eprintln!("workload lock: mlock of {mib} MiB refused (ENOMEM) under RLIMIT_MEMLOCK {kib} KiB, as expected");
            locked = 0;
        }
        (e, _) => return Err(format!("mlock {bytes} bytes: {}", std::io::Error::from_raw_os_error(e))),
    }
    let rest = use_the_rest(rest_mib)?;
    std::thread::sleep(Duration::from_millis(1500));
    emit_into(report, "lock", ((locked + (rest_mib << 20)) / PAGE) as u64, t0.elapsed().as_nanos() as u64, 0);
    std::hint::black_box(rest);
    Ok(())
}

/// mlock of the pool: 0, or the errno.
#[inline(never)]
fn lock_the_pool(p: *mut u8, bytes: usize) -> i32 {
    // SAFETY: locking our own mapping.
    let r = unsafe { libc::mlock(p.cast(), bytes) };
    std::hint::black_box(if r == 0 { 0 } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) })
}

/// `mib` MiB of other memory, written (none for 0).
#[inline(never)]
fn use_the_rest(mib: usize) -> Result<Option<(usize, usize)>, String> {
    if mib == 0 {
        return Ok(None);
    }
    std::hint::black_box(written(mib, 4).map(Some))
}

/// Drops `path` from the page cache so the next access faults it in from disk.
pub fn evict(path: &Path) -> Result<(), String> {
    let f = OpenOptions::new().read(true).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: valid fd.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    Ok(())
}

/// Maps `path` and reads one byte of every `stride`-th page, in a shuffled
/// order with MADV_RANDOM (no readahead) or sequentially.
pub fn file_read(path: &Path, random: bool, stride: usize, cold: bool) -> Result<(), String> {
    if cold {
        evict(path)?;
    }
    let f = OpenOptions::new().read(true).open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
    if len == 0 {
        return Err(format!("{} is empty", path.display()));
    }
    // SAFETY: read-only shared mapping of a regular file.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    // SAFETY: advising our own mapping.
    unsafe { libc::madvise(p, len, if random { libc::MADV_RANDOM } else { libc::MADV_SEQUENTIAL }) };
    let mut pages: Vec<usize> = (0..len / PAGE).step_by(stride.max(1)).collect();
    if random {
        // Fisher-Yates with a fixed LCG: the same order every run.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in (1..pages.len()).rev() {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            pages.swap(i, (x >> 33) as usize % (i + 1));
        }
    }
    let t0 = Instant::now();
    let mut sum = 0u64;
    for &pg in &pages {
        // SAFETY: inside the mapping.
        sum += u64::from(unsafe { p.cast::<u8>().add(pg * PAGE).read_volatile() });
    }
    std::hint::black_box(sum);
    emit("file-read", pages.len() as u64, t0.elapsed().as_nanos() as u64);
    Ok(())
}

/// Writes a file of `mib` MiB of non-zero data (so no page is a hole).
pub fn make_file(path: &Path, mib: usize) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let block = vec![0xA5u8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&block).map_err(|e| e.to_string())?;
    }
    f.sync_all().map_err(|e| e.to_string())
}

/// Forks `children` processes that each touch `mib` MiB and exit with code
/// 10+i; the parent waits and exits with `exit_code`.
pub fn fork_children(children: usize, mib: usize, exit_code: i32) -> Result<(), String> {
    let bytes = mib << 20;
    fork_workers(children, |i| match map_anon(bytes, false) {
        Ok(p) => {
            let t0 = Instant::now();
            touch(p, bytes);
            emit("child", (bytes / PAGE) as u64, t0.elapsed().as_nanos() as u64);
            10 + i as i32
        }
        Err(_) => 1,
    })?;
    emit("parent", 0, 0);
    std::process::exit(exit_code);
}

/// Forks `n` workers, each running `body(i)` and exiting with its result,
/// and waits for all of them.
fn fork_workers(n: usize, body: impl Fn(usize) -> i32) -> Result<(), String> {
    let mut pids = Vec::new();
    for i in 0..n {
        let _ = std::io::stdout().flush();
        // SAFETY: the child runs `body` (memory work and a report) and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            let code = body(i);
            // SAFETY: leave without running the parent's destructors twice.
            unsafe { libc::_exit(code) };
        }
        pids.push(pid);
    }
    for pid in pids {
        let mut st = 0;
        // SAFETY: waiting for our own children.
        unsafe { libc::waitpid(pid, &raw mut st, 0) };
    }
    Ok(())
}

/// Pins the calling thread to one CPU.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; pid 0 is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set);
    }
}

/// Unmaps one region. A frame-pointer walk from inside the libc wrapper
/// (which has no frame) skips the wrapper's direct caller: this function, so
/// that `churn_munmap_loop` shows. Using the result keeps it from becoming a
/// tail call, which would hide the loop too.
#[inline(never)]
fn unmap_one(p: *mut libc::c_void, bytes: usize) -> i32 {
    // SAFETY: `p` is a mapping of `bytes` made by the caller.
    std::hint::black_box(unsafe { libc::munmap(p, bytes) })
}

#[inline(never)]
fn dontneed_one(p: *mut libc::c_void, bytes: usize) -> i32 {
    // SAFETY: `p` is a mapping of `bytes`.
    std::hint::black_box(unsafe { libc::madvise(p, bytes, libc::MADV_DONTNEED) })
}

/// mmap, touch, munmap, `n` times: each munmap flushes the TLB of every CPU
/// where this process runs.
#[inline(never)]
pub fn churn_munmap_loop(n: usize, bytes: usize) -> Result<(), String> {
    for _ in 0..n {
        let p = map_anon(bytes, false)?;
        touch(p, bytes);
        if unmap_one(p.cast(), bytes) != 0 {
            return Err(format!("munmap: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// touch, MADV_DONTNEED, `n` times on one mapping: the same flushes, by madvise.
#[inline(never)]
pub fn churn_madvise_loop(n: usize, bytes: usize) -> Result<(), String> {
    let p = map_anon(bytes, false)?;
    for _ in 0..n {
        touch(p, bytes);
        if dontneed_one(p.cast(), bytes) != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Mapping churn on CPU 0; with `threads` = 2 a second thread spins on CPU 1,
/// so the process's TLB entries live there too and every flush needs an IPI.
/// Each region is `bytes` long.
pub fn churn(threads: usize, iterations: usize, madvise: bool, bytes: usize) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        if threads >= 2 {
            s.spawn(|| {
                pin_to_cpu(1);
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            });
        }
        pin_to_cpu(0);
        let r = if madvise { churn_madvise_loop(iterations, bytes) } else { churn_munmap_loop(iterations, bytes) };
        stop.store(true, Ordering::Relaxed);
        r
    })?;
    emit("churn", iterations as u64, t0.elapsed().as_nanos() as u64);
    Ok(())
}

/// Blocks of one heap round: 32 × 96 KiB, each under glibc's mmap threshold
/// (128 KiB), so they come from the heap; all freed, their 3 MiB join the
/// heap's free top, past M_TRIM_THRESHOLD (128 KiB): glibc trims it.
const HEAP_BLOCKS: usize = 32;
const HEAP_BLOCK: usize = 96 << 10;

/// One round: malloc, write a byte per page, free. Not inlined, so the
/// faults have a frame of their own (`heap_round`) in the stacks.
#[inline(never)]
fn heap_round() -> Result<(), String> {
    let mut blocks = [std::ptr::null_mut::<u8>(); HEAP_BLOCKS];
    for b in &mut blocks {
        // SAFETY: plain malloc; checked for null below.
        *b = unsafe { libc::malloc(HEAP_BLOCK) }.cast();
        if b.is_null() {
            return Err(format!("malloc {HEAP_BLOCK} bytes failed"));
        }
        touch(*b, HEAP_BLOCK);
    }
    for b in std::hint::black_box(blocks) {
        // SAFETY: each block came from malloc above and is freed once.
        unsafe { libc::free(b.cast()) };
    }
    Ok(())
}

/// glibc's heap trimmed and faulted in again (`heap_trim_refault` in
/// docs/findings.md): `rounds` of [`heap_round`]. With glibc's defaults the
/// heap's free top goes back to the kernel at each round's last free and the
/// next round faults it in again; run with `MALLOC_TRIM_THRESHOLD_` (and
/// `MALLOC_TOP_PAD_`) raised, the rounds reuse the same pages.
pub fn heap_trim(rounds: usize) -> Result<(), String> {
    let t0 = Instant::now();
    for _ in 0..rounds {
        heap_round()?;
    }
    emit("heap-trim", (HEAP_BLOCKS * HEAP_BLOCK / PAGE) as u64, t0.elapsed().as_nanos() as u64);
    Ok(())
}

/// One `ret` instruction, repeated to fill a code page.
#[cfg(target_arch = "x86_64")]
const RET: &[u8] = &[0xc3];
#[cfg(target_arch = "aarch64")]
const RET: &[u8] = &0xd65f_03c0_u32.to_le_bytes();

/// Pages of code `code_evicted` maps: 64 KiB, one read of the file.
const CODE_PAGES: usize = 16;

/// Calls into every page of `code` (a mapping of `ret` instructions). Not
/// inlined: the faults have a frame of their own.
#[inline(never)]
fn call_every_page(code: *const u8) {
    for i in 0..CODE_PAGES {
        // SAFETY: each page of the executable mapping starts with `ret`.
        let f: extern "C" fn() = unsafe { std::mem::transmute(code.add(i * PAGE)) };
        f();
    }
}

/// Code evicted and read back (`code_major_faults` in docs/findings.md):
/// writes 64 KiB of `ret` instructions to `path`, maps it executable and
/// calls into each of its pages `rounds` times. Before each round but the
/// first the pages are evicted, as memory pressure evicts a hot library's
/// pages: MADV_DONTNEED drops this process's mappings of them and
/// posix_fadvise(DONTNEED) the clean page cache, so the next call reads the
/// file back (one major fault a round: the kernel reads a small executable
/// file in one go). `keep`: nothing is evicted, the file is read once.
pub fn code_evicted(path: &Path, rounds: usize, keep: bool) -> Result<(), String> {
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return Err("code-evicted writes x86_64 or aarch64 instructions".into());
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let bytes: Vec<u8> = RET.iter().copied().cycle().take(CODE_PAGES * PAGE).collect();
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(&bytes).map_err(|e| e.to_string())?;
        // Written back first: dirty pages cannot be dropped.
        f.sync_all().map_err(|e| e.to_string())?;
        let len = CODE_PAGES * PAGE;
        let fd = f.as_raw_fd();
        // SAFETY: a private read-only executable mapping of a regular file of `len` bytes.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE, fd, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap {} executable: {}", path.display(), std::io::Error::last_os_error()));
        }
        let t0 = Instant::now();
        // SAFETY: plain advice on our own file.
        unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        for r in 0..rounds {
            if !keep && r > 0 {
                // SAFETY: advice on our own mapping and file; the pages are read back on the next call.
                unsafe {
                    libc::madvise(p, len, libc::MADV_DONTNEED);
                    libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
                }
            }
            call_every_page(p.cast());
        }
        emit("code-evicted", CODE_PAGES as u64, t0.elapsed().as_nanos() as u64);
        Ok(())
    }
}

/// Reads `path` with read(2) into a fresh buffer: the buffer's first-touch
/// faults are taken by the kernel while it copies (kernel-mode faults).
pub fn read_file(path: &Path, cold: bool) -> Result<(), String> {
    use std::io::Read as _;
    if cold {
        evict(path)?;
    }
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len() as usize;
    let buf = map_anon(len.max(PAGE), false)?;
    // SAFETY: the mapping is `len` bytes, exclusively ours.
    let slice = unsafe { std::slice::from_raw_parts_mut(buf, len) };
    let t0 = Instant::now();
    let mut done = 0;
    while done < len {
        let n = f.read(&mut slice[done..(done + (1 << 20)).min(len)]).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        done += n;
    }
    emit("read-file", (len / PAGE) as u64, t0.elapsed().as_nanos() as u64);
    Ok(())
}

/// Writes a small safetensors checkpoint of about `mib` MiB: an 8-byte
/// little-endian header length, a JSON header with each tensor's dtype, shape
/// and `data_offsets`, then the data.
pub fn make_safetensors(path: &Path, mib: usize) -> Result<(), String> {
    let tensors = 8usize;
    let per = (mib << 20) / tensors;
    let mut header = String::from("{");
    for t in 0..tensors {
        let name = if t == tensors - 1 { "lm_head.weight".to_string() } else { format!("layers.{t}.mlp.weight") };
        let _ = std::fmt::Write::write_fmt(
            &mut header,
            format_args!(
                "\"{name}\":{{\"dtype\":\"F32\",\"shape\":[{},256],\"data_offsets\":[{},{}]}},",
                per / 1024,
                t * per,
                (t + 1) * per
            ),
        );
    }
    header.push_str("\"__metadata__\":{\"format\":\"pt\"}}");
    // The data starts 8-byte aligned, as writers pad the header with spaces.
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(&(header.len() as u64).to_le_bytes()).map_err(|e| e.to_string())?;
    f.write_all(header.as_bytes()).map_err(|e| e.to_string())?;
    let block = vec![0x3Fu8; 1 << 20];
    let mut left = per * tensors;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n]).map_err(|e| e.to_string())?;
        left -= n;
    }
    f.sync_all().map_err(|e| e.to_string())
}

/// fork + copy-on-write: the parent fills `mib` MiB, then `children` workers
/// walk it. `refcount` writes one word per page, as CPython's reference counts
/// do when a worker iterates a list of objects; otherwise the workers only read
/// it, as with one flat bytes object.
pub fn cow(children: usize, mib: usize, refcount: bool) -> Result<(), String> {
    let bytes = mib << 20;
    let p = map_anon(bytes, false)?;
    touch(p, bytes);
    fork_workers(children, |_| {
        let t0 = Instant::now();
        walk_shared(p, bytes, refcount);
        emit(
            if refcount { "cow-refcount" } else { "cow-readonly" },
            (bytes / PAGE) as u64,
            t0.elapsed().as_nanos() as u64,
        );
        0
    })?;
    emit("cow-parent", (bytes / PAGE) as u64, 0);
    Ok(())
}

#[inline(never)]
fn walk_shared(p: *mut u8, bytes: usize, refcount: bool) {
    let mut sum = 0u64;
    for off in (0..bytes).step_by(PAGE) {
        // SAFETY: inside the mapping.
        unsafe {
            // Page-aligned (mmap), so 8-byte aligned.
            #[allow(clippy::cast_ptr_alignment)]
            let w = p.add(off).cast::<u64>();
            if refcount {
                w.write_volatile(w.read_volatile() + 1);
            } else {
                sum += w.read_volatile();
            }
        }
    }
    std::hint::black_box(sum);
}

/// Maps, touches and unmaps `mib` MiB over and over for `seconds`: a steady
/// fault storm (and munmap flushes) for load tests.
pub fn fault_loop(mib: usize, seconds: f64, rate: Option<u64>) -> Result<(), String> {
    const CHUNK: usize = 1 << 20;
    let bytes = (mib << 20).max(CHUNK);
    let t0 = Instant::now();
    let mut pages = 0u64;
    while t0.elapsed().as_secs_f64() < seconds {
        let p = map_anon(bytes, false)?;
        for off in (0..bytes).step_by(CHUNK) {
            // SAFETY: `off` + CHUNK stays inside the mapping.
            touch(unsafe { p.add(off) }, CHUNK.min(bytes - off));
            pages += (CHUNK / PAGE) as u64;
            // Paced: sleep until the rate says the next MiB is due.
            if let Some(r) = rate.filter(|&r| r > 0) {
                let due = std::time::Duration::from_secs_f64(pages as f64 / r as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(p.cast(), bytes) };
    }
    emit("fault-loop", pages, t0.elapsed().as_nanos() as u64);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's checkpoint is one the regions' safetensors reader reads.
    #[test]
    fn make_safetensors_writes_what_the_reader_reads() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.safetensors");
        make_safetensors(&p, 8).unwrap();
        let t = crate::regions::safetensors::tensors(&p).unwrap();
        assert_eq!(t.len(), 8);
        assert_eq!(t.last().unwrap().name, "lm_head.weight");
        assert_eq!(t[0].start % 8, 0, "data 8-byte aligned");
        assert_eq!(t.last().unwrap().end, std::fs::metadata(&p).unwrap().len());
    }

    #[test]
    fn first_touch_faults_match_rusage_delta() {
        // This thread only: other tests run beside it.
        let (before, _) = rusage_of(libc::RUSAGE_THREAD);
        let p = map_anon(8 << 20, false).unwrap();
        touch(p, 8 << 20);
        let (after, _) = rusage_of(libc::RUSAGE_THREAD);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p.cast(), 8 << 20) };
        // 2048 pages; allow a little for the test harness's own faults.
        assert!((2048..2048 + 200).contains(&(after - before)), "delta {}", after - before);
    }
}
