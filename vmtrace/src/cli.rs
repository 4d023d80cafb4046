//! Command line (clap derive). Validators live beside it and are tested.
use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "vmtrace",
    version,
    about = "Where does my memory time go? Page faults, per process, from the kernel."
)]
pub struct Cli {
    /// More output: -v shows progress and kernel-side diagnostics, -vv debug detail.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Trace a command (and every process it forks), a running pid, or the system.
    Record(RecordArgs),
    /// Rebuild the human outputs of a recorded directory.
    Report {
        /// A directory written by `vmtrace record`.
        dir: PathBuf,
        /// Write the Perfetto trace (only `record --perfetto` can: see its help).
        #[arg(long)]
        perfetto: bool,
    },
    /// List each prerequisite: ok, or missing with the fix.
    Check,
    /// Live full-screen view: faults/s, fault time, COW, munmap, shootdowns per
    /// process or region (q quit, s sort, p pause, r regions/processes).
    Top(TopArgs),
    /// OpenMetrics endpoint for Prometheus at http://ADDR/metrics.
    Serve {
        /// Address to listen on; anything but loopback needs --allow-remote.
        #[arg(long, default_value = "127.0.0.1:9464", value_parser = parse_listen)]
        listen: std::net::SocketAddr,
        /// Allow listening on a non-loopback address.
        #[arg(long)]
        allow_remote: bool,
        /// Serve the metrics of this process (and its later children) instead of the whole system.
        #[arg(short, long, value_parser = parse_pid, allow_negative_numbers = true)]
        pid: Option<u32>,
        /// Trace the whole system (the default).
        #[arg(short, long)]
        all: bool,
        /// Processes with series of their own (the busiest, as places free up); the rest add into comm="other".
        #[arg(long, default_value_t = 20, value_parser = parse_count, allow_negative_numbers = true)]
        top: usize,
        /// Cgroups (with ranks) with series of their own; later ones add into cgroup="other".
        #[arg(long, default_value_t = 200, value_parser = parse_count, allow_negative_numbers = true)]
        cgroups: usize,
        /// Take no fault stacks: no profiles at /debug/pprof/ (cheaper).
        #[arg(long)]
        no_profiles: bool,
    },
    /// Run the built-in workload under trace and write a report.
    Demo {
        #[arg(long, default_value = "vmtrace-demo")]
        out: PathBuf,
    },
    /// Built-in workloads (used by the demo, the tests and the benchmarks).
    #[command(hide = true, subcommand)]
    Workload(WorkloadCmd),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StreamFormat {
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Leaf {
    None,
    Region,
}

/// Which rows of processes and regions summary.json lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RegionRows {
    /// The heaviest rows; those under `--fold-below` add into "other" rows.
    Top,
    /// Every process and every region (a long `-a` recording: tens of MB and more).
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EventFamily {
    /// Page faults: counts, kinds, latency (eBPF).
    Faults,
    /// Faults per memory region (VMA) and per file, with readahead and the
    /// tensors of safetensors checkpoints.
    Regions,
    /// mmap, munmap (+bytes), mremap, madvise (by advice), mprotect, brk, with call sites.
    Mmap,
    /// TLB flushes by reason, shootdown IPIs by initiator and call, storms.
    Tlb,
    /// Hardware TLB-miss counters where a PMU exists, and the kernel's software
    /// fault counters as an accounting check.
    Perf,
    /// OOM kills system-wide (victim, trigger, cgroup, what it held) and the
    /// reclaim stalls before them.
    Oom,
    /// Resident memory per process (kernel counters: end, peak, anon/file/
    /// shmem), and with stacks the `resident*` profiles by call site.
    Resident,
}

impl EventFamily {
    /// The families a `--events` list names, as the trace takes them (the
    /// fault probes are always there: every family builds on them).
    pub fn families(events: &[Self]) -> crate::trace::Families {
        let has = |f| events.contains(&f);
        crate::trace::Families {
            oom: has(Self::Oom),
            mmap: has(Self::Mmap),
            tlb: has(Self::Tlb),
            regions: has(Self::Regions),
            resident: has(Self::Resident),
            perf: has(Self::Perf),
        }
    }
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "all", "command"])))]
#[allow(clippy::struct_excessive_bools, reason = "command-line switches")]
pub struct RecordArgs {
    /// Output directory.
    #[arg(short, long, default_value = "vmtrace-out")]
    pub out: PathBuf,
    /// Stop after this many seconds (decimals allowed).
    #[arg(short, long, value_parser = parse_duration, allow_negative_numbers = true)]
    pub duration: Option<Duration>,
    /// Event families to trace (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "faults,regions,mmap,tlb,oom,perf,resident")]
    pub events: Vec<EventFamily>,
    /// Time 1 in N minor faults; 0 = do not time them (cheapest). Every major
    /// fault is timed and every fault counted whatever N is. N > 1 leaves slow
    /// faults to chance: the default times every one (fexit, or
    /// memcg:count_memcg_events on 6.14+, at about the cost of sampling).
    #[arg(long, default_value_t = 1, value_parser = parse_period, allow_negative_numbers = true)]
    pub latency_sample: u32,
    /// Where the fault end sees every fault (memcg:count_memcg_events, 6.14+):
    /// time every slow fault (it slept, a huge page, a major) exactly and 1 in
    /// N of the fast minor faults, each standing for the fast faults before
    /// it; the estimate's error is stated (`sampling.time_error_ns`). 1 =
    /// time every fault.
    #[arg(long, default_value_t = crate::loader::DEFAULT_FAST_PERIOD, value_parser = parse_period, allow_negative_numbers = true)]
    pub fast_sample: u32,
    /// Call stacks to collect for faults.
    #[arg(long, value_enum, default_value = "user")]
    pub stacks: crate::stacks::StackMode,
    /// Take a stack on 1 in N faults, at random (flamegraph counts are scaled by
    /// N). A user-stack walk costs ~0.2-0.5 µs (deeper stacks more): 1 = every fault.
    #[arg(long, default_value_t = 64, value_parser = parse_stack_period, allow_negative_numbers = true)]
    pub stack_sample: u32,
    /// KiB of user stack copied with the registers at each stack taken whose
    /// frame-pointer chain is not whole, to unwind code built without frame
    /// pointers (distro libraries, CPython) with its `.eh_frame`: 8, 16 or 32;
    /// 0 = frame pointers only. A copy costs a few µs, on sampled events only.
    #[arg(long, default_value_t = 16, value_parser = parse_stack_window, allow_negative_numbers = true)]
    pub stack_window: u32,
    /// Leave Python frames out of stacks: native frames only, and no walk of
    /// the interpreter's frames at each stack taken (to measure its cost).
    #[arg(long)]
    pub no_python_frames: bool,
    /// Count each program's runs and time in them (the kernel's BPF run-time
    /// statistics, on while recording): `program_stats` in summary.json.
    #[arg(long)]
    pub probe_stats: bool,
    /// Extra leaf frame in flamegraphs: `region` adds the faulting memory
    /// region (file, heap, anon, stack…), so one picture shows code → mapping.
    #[arg(long, value_enum, default_value = "none")]
    pub leaf: Leaf,
    /// TLB-flush IPIs per second (over 100 ms windows) above which a process is
    /// in a shootdown storm.
    #[arg(long, default_value_t = crate::collect::DEFAULT_STORM_THRESHOLD, value_parser = parse_rate, allow_negative_numbers = true)]
    pub storm_threshold: f64,
    /// Also write trace.perfetto-trace, a timeline for ui.perfetto.dev: tracks
    /// per process and thread, fault/COW/shootdown rates every 100 ms, a slice
    /// per major fault and per mapping change, storms, fork/exec/exit and OOM
    /// kills, on CLOCK_MONOTONIC (lines up with perf and PyTorch profiler traces).
    #[arg(long)]
    pub perfetto: bool,
    /// Live output: one JSON object per interval on stdout (the summary goes to stderr).
    #[arg(long, value_enum)]
    pub stream: Option<StreamFormat>,
    /// Seconds between streamed objects.
    #[arg(long, default_value = "1", value_parser = parse_duration, allow_negative_numbers = true)]
    pub interval: Duration,
    /// Processes and regions with less than this percentage of all faults and
    /// of all fault time are summed into "other" rows (a process's regions
    /// per kind; the processes into one pid-0 row): totals still add up.
    /// The 20 heaviest processes and 100 heaviest regions are always listed.
    #[arg(long, value_name = "PCT", default_value = "0.1", value_parser = parse_pct, allow_negative_numbers = true)]
    pub fold_below: f64,
    /// `all`: list every process and region (no folding, as --fold-below 0).
    #[arg(long, value_enum, default_value = "top")]
    pub regions: RegionRows,
    /// Indent summary.json (it is written compact by default).
    #[arg(long)]
    pub pretty: bool,
    /// Take every fallback: classic tracepoints even where tp_btf is
    /// available, kprobe for the OOM domain, the kernel's user-stack walker.
    #[arg(long)]
    pub force_tracepoints: bool,
    /// Trace a running process (and its later children) until it exits.
    #[arg(short, long, value_parser = parse_pid, allow_negative_numbers = true)]
    pub pid: Option<u32>,
    /// Trace the whole system.
    #[arg(short, long)]
    pub all: bool,
    /// The command to run under trace, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").args(["pid", "all", "command"])))]
pub struct TopArgs {
    /// Watch a running process (and its later children).
    #[arg(short, long, value_parser = parse_pid, allow_negative_numbers = true)]
    pub pid: Option<u32>,
    /// Watch the whole system (the default).
    #[arg(short, long)]
    pub all: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value = "1", value_parser = parse_duration, allow_negative_numbers = true)]
    pub interval: Duration,
    /// TLB-flush IPIs per second above which a process is in a shootdown storm.
    #[arg(long, default_value_t = crate::collect::DEFAULT_STORM_THRESHOLD, value_parser = parse_rate, allow_negative_numbers = true)]
    pub storm_threshold: f64,
    /// Where a command's stdout and stderr go [default: $TMPDIR/vmtrace-top-PID.log].
    #[arg(long, value_name = "FILE")]
    pub command_output: Option<PathBuf>,
    /// A command to start and watch, after `--` (quitting stops it).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum WorkloadCmd {
    /// First touch of anonymous memory.
    Touch {
        #[arg(long, default_value_t = 256)]
        mib: usize,
        /// Ask for transparent huge pages (default: MADV_NOHUGEPAGE).
        #[arg(long)]
        huge: bool,
        /// Give no huge-page advice at all: the system's THP mode decides.
        #[arg(long, conflicts_with = "huge")]
        no_advice: bool,
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Sleep this many ms after each MiB (a slowly growing hog).
        #[arg(long, default_value_t = 0)]
        pace_ms: u64,
        /// munmap the memory when done (the region is gone before the trace ends).
        #[arg(long)]
        unmap: bool,
    },
    /// Read a mapped file, one byte per page.
    FileRead {
        path: PathBuf,
        #[arg(long)]
        random: bool,
        #[arg(long, default_value_t = 1)]
        stride: usize,
        /// Evict the file from the page cache first.
        #[arg(long)]
        cold: bool,
    },
    /// mmap/touch/munmap (or MADV_DONTNEED) churn on CPU 0; --threads 2 adds a
    /// spinning thread on CPU 1 so every flush needs an IPI.
    Churn {
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value_t = 20_000)]
        iterations: usize,
        /// Churn with MADV_DONTNEED instead of munmap.
        #[arg(long)]
        madvise: bool,
        /// Size of each region (KiB). Past the kernel's
        /// tlb_single_page_flush_ceiling (33 pages) a flush is a full one.
        #[arg(long, default_value_t = 64)]
        kib: usize,
    },
    /// glibc's heap trimmed and faulted in again: ROUNDS times, 32 blocks of
    /// 96 KiB malloc'd, written and freed (glibc gives the heap top back with
    /// brk each round unless MALLOC_TRIM_THRESHOLD_ is raised).
    HeapTrim {
        #[arg(long, default_value_t = 100)]
        rounds: usize,
    },
    /// Code evicted and read back: writes PATH (64 KiB of `ret`
    /// instructions), maps it executable and calls into each page ROUNDS
    /// times, evicting its pages before each round (as memory pressure
    /// evicts a hot library's), unless --keep.
    CodeEvicted {
        path: PathBuf,
        #[arg(long, default_value_t = 200)]
        rounds: usize,
        /// Evict nothing: the file is read once.
        #[arg(long)]
        keep: bool,
    },
    /// A locked pool: MIB MiB mlock'ed, REST_MIB MiB of other memory written
    /// beside it, both held 1.5 s; with --limit-kib, RLIMIT_MEMLOCK set to it
    /// and run as user nobody, so the kernel refuses the lock (the lesson).
    Lock {
        #[arg(long, default_value_t = 128)]
        mib: usize,
        #[arg(long, default_value_t = 0)]
        rest_mib: usize,
        #[arg(long)]
        limit_kib: Option<u64>,
    },
    /// Memory held until exit: MIB MiB of anonymous memory (MADV_NOHUGEPAGE)
    /// written at one call site, or split evenly between two (--sites 2).
    Hold {
        #[arg(long, default_value_t = 1280)]
        mib: usize,
        /// Call sites the memory is written from: 1 or 2.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        sites: u8,
    },
    /// read(2) a file into a fresh buffer.
    ReadFile {
        path: PathBuf,
        /// Evict the file from the page cache first.
        #[arg(long)]
        cold: bool,
    },
    /// Write a safetensors checkpoint of about MIB MiB.
    MakeSafetensors {
        path: PathBuf,
        #[arg(long, default_value_t = 64)]
        mib: usize,
    },
    /// fork workers over a parent's memory: copy-on-write by refcount writes or none.
    Cow {
        #[arg(long, default_value_t = 2)]
        children: usize,
        #[arg(long, default_value_t = 64)]
        mib: usize,
        /// Write one word per page (as CPython refcounts do); else only read.
        #[arg(long)]
        refcount: bool,
    },
    /// Map, touch and unmap MIB MiB over and over for SECONDS.
    FaultLoop {
        #[arg(long, default_value_t = 64)]
        mib: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Pace to about this many faults per second (default: as fast as it can).
        #[arg(long)]
        rate: Option<u64>,
    },
    /// Create a file of MIB MiB.
    MakeFile {
        path: PathBuf,
        #[arg(long, default_value_t = 64)]
        mib: usize,
    },
    /// Fork children that touch memory and exit 10, 11, …; exit with --exit.
    Fork {
        #[arg(long, default_value_t = 2)]
        children: usize,
        #[arg(long, default_value_t = 16)]
        mib: usize,
        #[arg(long, default_value_t = 0)]
        exit: i32,
    },
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.trim_end_matches('s').parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("duration must be positive, got `{s}`"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A process id: a whole number from 1 (`-p -5` is not a process group).
pub fn parse_pid(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= 1 && u32::try_from(n).is_ok() => Ok(n as u32),
        Ok(n) if n < 0 => Err(format!("`{s}`: a process id is a positive whole number (a pid, not a process group)")),
        _ => Err(format!("`{s}`: give a process id, a whole number from 1 (as `pgrep` or `ps` print)")),
    }
}

/// An address to listen on: `IP:PORT`, or `HOST:PORT` with the host name
/// resolved (`localhost:9464`; uc30: refused as "invalid socket address
/// syntax"). A name resolving to loopback among others listens on
/// loopback: what the name is for on this machine.
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs as _;
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(a);
    }
    let all: Vec<std::net::SocketAddr> =
        s.to_socket_addrs().map_err(|e| format!("`{s}`: give HOST:PORT or IP:PORT ({e})"))?.collect();
    all.iter()
        .find(|a| a.ip().is_loopback())
        .or_else(|| all.first())
        .copied()
        .ok_or_else(|| format!("`{s}`: the name resolves to no address"))
}

/// A number of rows: a whole number, 0 or more.
pub fn parse_count(s: &str) -> Result<usize, String> {
    s.parse::<usize>().map_err(|_| format!("`{s}`: give a whole number, 0 or more"))
}

/// A rate (per second): a positive number.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("`{s}`: give a positive number per second (e.g. 1000)")),
    }
}

pub fn parse_stack_period(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!("`{s}`: give a whole number from 1 (every fault) to 1000000")),
    }
}

/// `--stack-window` in KiB, returned in bytes.
pub fn parse_stack_window(s: &str) -> Result<u32, String> {
    match s.trim_end_matches("KiB").parse::<u32>() {
        Ok(0) => Ok(0),
        Ok(k) if vmtrace_common::STACK_WINDOWS.contains(&(k * 1024)) => Ok(k * 1024),
        _ => Err(format!("`{s}`: give 8, 16 or 32 (KiB of stack copied), or 0 for frame pointers only")),
    }
}

/// A percentage from 0 to 100.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("`{s}`: give a percentage from 0 (keep every row) to 100")),
    }
}

pub fn parse_period(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n <= 1_000_000 => Ok(n),
        _ => Err(format!("`{s}`: give a whole number from 0 (no minor latency) or 1 (time every fault) to 1000000")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn listen_takes_a_host_name() {
        let a = super::parse_listen("localhost:9464").unwrap();
        assert!(a.ip().is_loopback() && a.port() == 9464, "{a}");
        assert_eq!(super::parse_listen("[::1]:80").unwrap().to_string(), "[::1]:80");
        assert!(super::parse_listen("localhost").is_err(), "no port");
    }

    use super::*;
    use clap::CommandFactory;

    #[test]
    fn stack_windows_are_the_kernel_sizes_or_off() {
        assert_eq!(parse_stack_window("16"), Ok(16384));
        assert_eq!(parse_stack_window("32KiB"), Ok(32768));
        assert_eq!(parse_stack_window("0"), Ok(0));
        assert!(parse_stack_window("12").is_err());
        assert!(parse_stack_window("x").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_rate("2500"), Ok(2500.0));
        assert!(parse_rate("-1").is_err() && parse_rate("0").is_err() && parse_rate("inf").is_err());
    }

    #[test]
    fn periods() {
        assert_eq!(parse_period("1"), Ok(1));
        assert_eq!(parse_period("0"), Ok(0));
        assert!(parse_period("1000001").is_err());
        assert!(parse_period("x").is_err());
    }

    #[test]
    fn percentages() {
        assert_eq!(parse_pct("0.1"), Ok(0.1));
        assert_eq!(parse_pct("5%"), Ok(5.0));
        assert_eq!(parse_pct("0"), Ok(0.0));
        assert!(parse_pct("101").is_err());
        assert!(parse_pct("-1").is_err());
        assert!(parse_pct("NaN").is_err());
        let c = Cli::try_parse_from(["vmtrace", "record", "-a"]).unwrap();
        let Command::Record(r) = c.command else { panic!() };
        assert_eq!((r.fold_below, r.regions, r.pretty), (0.1, RegionRows::Top, false));
    }

    #[test]
    fn record_needs_exactly_one_target() {
        assert!(Cli::try_parse_from(["vmtrace", "record"]).is_err());
        assert!(Cli::try_parse_from(["vmtrace", "record", "-a", "-p", "1"]).is_err());
        let c = Cli::try_parse_from(["vmtrace", "record", "--", "ls", "-l"]).unwrap();
        let Command::Record(r) = c.command else { panic!() };
        assert_eq!(r.command, ["ls", "-l"]);
        assert_eq!(r.latency_sample, 1);
    }

    /// A negative number given to a numeric option is refused with what the
    /// option needs, not clap's tip to write `-- -5` (which would make it
    /// the command to run).
    #[test]
    fn negative_numbers_are_refused_with_what_the_option_needs() {
        let err = |args: &[&str]| {
            let e = Cli::try_parse_from(args).expect_err("refused");
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{args:?}: {e}");
            let text = e.to_string();
            assert!(!text.contains("-- -"), "{args:?}: clap's tip: {text}");
            text
        };
        for args in [
            &["vmtrace", "record", "-p", "-5"][..],
            &["vmtrace", "record", "--pid", "-5"],
            &["vmtrace", "top", "-p", "-5"],
            &["vmtrace", "serve", "-p", "-5"],
        ] {
            let text = err(args);
            assert!(text.contains("`-5`: a process id is a positive whole number"), "{args:?}: {text}");
        }
        assert!(err(&["vmtrace", "record", "-p", "0"]).contains("give a process id"));
        assert!(err(&["vmtrace", "record", "-p", "x"]).contains("give a process id"));
        assert!(err(&["vmtrace", "record", "-p", "4294967296"]).contains("give a process id"));
        for (opt, says) in [
            ("--duration", "duration must be positive"),
            ("--stack-sample", "give a whole number from 1"),
            ("--latency-sample", "give a whole number from 0"),
            ("--fast-sample", "give a whole number from 0"),
            ("--stack-window", "give 8, 16 or 32"),
            ("--storm-threshold", "give a positive number per second"),
            ("--interval", "duration must be positive"),
            ("--fold-below", "give a percentage"),
        ] {
            let text = err(&["vmtrace", "record", opt, "-1", "-a"]);
            assert!(text.contains(says), "{opt}: {text}");
        }
        for opt in ["--top", "--cgroups"] {
            assert!(err(&["vmtrace", "serve", opt, "-1"]).contains("give a whole number, 0 or more"), "{opt}");
        }
        for opt in ["--interval", "--storm-threshold"] {
            err(&["vmtrace", "top", opt, "-1"]);
        }
        let c = Cli::try_parse_from(["vmtrace", "record", "-p", "42"]).unwrap();
        let Command::Record(r) = c.command else { panic!() };
        assert_eq!(r.pid, Some(42));
    }

    #[test]
    fn unknown_event_family_is_rejected() {
        assert!(Cli::try_parse_from(["vmtrace", "record", "--events", "bogus", "-a"]).is_err());
    }
}
