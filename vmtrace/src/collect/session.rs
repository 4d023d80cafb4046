//! The collection loop: polls the source, applies its events to the process
//! table and runs the periodic jobs (timeline, storms, flight recorder, maps
//! refresh); at the end reads the aggregates once and assembles the summary.
use crate::hash::ShrinkSparse as _;
use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use vmtrace_common::{
    EventHeader, EventKind, FaultMajorEvent, FaultStats, Merge, MmEvent, MmStackCounts, MmStackKey, MmStats, OomEvent,
    PyStackEvent, StackCounts, StackKey, TaskEvent,
};

use super::{
    assemble::{self, Inputs},
    attribute,
    flight::FlightRecorder,
    process::{self, ProcInfo, ProcessTable},
    resident::ResidentTracker,
    storms::StormDetector,
    symbols::{self, MapsRefresh},
    timeline::TimelineRecorder,
    tracelog::{self, TraceRecorder},
    AggregateSource, Finished,
};
use crate::{
    loader::Families,
    model::{DropCounts, KernelAccounting, OomRecord, TargetInfo},
    oom,
    regions::Attributed,
    stacks::{native::NativeStacks, symbolize::Names, StackMode},
};

/// The storm detector's window (IPIs per second are judged over it), and the
/// cadence of the other housekeeping (flight recorder, maps of young processes).
const STORM_TICK: Duration = Duration::from_millis(100);

/// How often the kernel's resident counters are read without the Perfetto
/// trace (`Session::resident_counters`).
const RESIDENT_EVERY: Duration = Duration::from_secs(1);
/// How often the collector checks whether its mappings of the object files'
/// pages grew enough to drop them (`stacks::objects::ObjectPages`).
const DROP_OBJECT_PAGES_EVERY: Duration = Duration::from_secs(1);
/// How often exited processes are retired (each time walks the keys of the
/// kernel's granule maps, a system call per live entry: every 4 s let 700
/// churning processes fill `REGION_STATS` between two walks), and how long
/// after its exit one is: its last samples and mapping events have arrived
/// by then.
const RETIRE_EVERY: Duration = Duration::from_secs(1);
const RETIRE_AFTER: Duration = Duration::from_secs(1);
/// Held region rows at which the retired ones are first folded again
/// (`Session::refold`); then each time they have doubled.
const REFOLD_FIRST: usize = 4096;
/// Retired processes left unfolded (`Session::unfolded`: each holds its
/// symbolized stacks and call sites, ~90 and ~110 for a Python start-up)
/// at which they are first looked at again; then each time this many more
/// are. Rows alone let them pile up: beside a shell loop, the rows of
/// 80 processes a second grew by 165 a second, and 200 unfolded processes
/// held 18k stacks, 24k call sites and 73k names (docs/performance.md).
const REFOLD_PROCESSES_FIRST: usize = 64;
/// Retired processes whose maps are kept (symbolized at the end) before the
/// oldest are symbolized and let go (`Session::release_some`): ~100 KB each
/// with their unwound stacks and mapping history (512 held 13 MB more than
/// 128 beside a shell loop of ~70 processes a second, docs/performance.md).
pub(crate) const RELEASE_ABOVE: usize = 128;
/// Processes folded away at once (`Session::fold_away`).
const FOLD_AWAY_SLICE: usize = 64;
/// Processes symbolized at once, and the time a tick may spend on them.
const RELEASE_SLICE: usize = 32;
/// A tick that takes this long says where its time went (debug).
const SLOW_TICK: Duration = Duration::from_millis(200);
/// Retired processes placed in their regions (and their rows folded) at a
/// time: up to `PLACE_SLICE` of them, and no more once `PLACE_GRANULES` of
/// their granules are in the slice (a torch worker has thousands: eight of
/// them placed at once held the ring buffer's drain for seconds on a busy
/// machine). A process's granules are never split.
const PLACE_SLICE: usize = 64;
const PLACE_GRANULES: usize = 2048;
const RELEASE_BUDGET: Duration = Duration::from_millis(250);
/// Slices after which the symbolizer's object files are closed: parsing
/// them again costs more than symbolizing a slice, holding them all keeps
/// every program ever seen mapped.
const CLOSE_OBJECTS_EVERY: u64 = 16;
/// Free bytes glibc keeps at the top of the collector's heap: each brk
/// that grows it takes this much more (`M_TOP_PAD`, set as a session
/// starts), and the trim once a tick leaves this much. With glibc's 128 KiB
/// and a trim to 0, the collector's heap top went down and up again 10 times
/// a second under churn (1,451 brk calls in 150 s, each a mapping call it
/// traces and logs for itself, and fresh pages faulted in after it).
const HEAP_TOP_PAD: usize = 1 << 20;
/// How often the drained stacks nothing refers to are let go
/// (`sweep_stacks`), and how long one is held first: a ring record or a
/// fault in flight naming it has long been seen by then.
pub const STACK_SWEEP: Duration = Duration::from_secs(10);
/// How often live processes' settled stack keys are sealed
/// (`Session::seal_live`), once more than `SEAL_ABOVE` drained stacks are
/// held; a key must have gone without a count for as long (in drains, at
/// least `SEAL_MIN_AGE`: 50 by default).
pub const STACK_SEAL: Duration = Duration::from_secs(5);
pub const SEAL_ABOVE: usize = 8192;
const SEAL_MIN_AGE: u64 = 5;
/// Stack keys (or call sites, or resident owners) a sealing symbolizes at
/// a time (`Session::seal_slices`): between two slices the kernel's stack
/// maps are drained if `SEAL_DRAIN_EVERY` has passed since the last drain.
/// Sealed whole, the 6,931 settled keys of a torch job's main process took
/// 1.96 s in one tick (`tests/torch_outputs.rs`, `--stack-sample 1`), in
/// which `FAULT_STACKS` (filled by that job in about a second) lost 164,229
/// faults.
const SEAL_SLICE: usize = 256;
const SEAL_DRAIN_EVERY: Duration = Duration::from_millis(50);
/// A drain of the stack maps this long after the last is logged
/// (`RUST_LOG=vmtrace::tick=debug`): the torch job fills `FAULT_STACKS` in
/// about a second.
const SLOW_STACK_DRAIN: Duration = Duration::from_millis(400);
/// Owner shapes held before the first that no page refers to go
/// (`Session::gc_owner_shapes`).
const OWNER_SHAPES_GC_FIRST: usize = 4096;

/// The live snapshot: a child module, for the session's private state.
#[path = "live.rs"]
pub(crate) mod live;

/// How a session collects, fixed for its life.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::struct_excessive_bools, reason = "independent on/off switches, one per behaviour")]
pub struct SessionOptions {
    /// Which optional families are traced.
    pub families: Families,
    /// Stacks are collected (mode, 1 in N faults): memory maps of live
    /// processes are kept for symbolization.
    pub stacks: Option<(StackMode, u32)>,
    /// TLB-flush IPIs per second above which a process is in a storm.
    pub storm_threshold: f64,
    /// Python frames are walked in the stacks taken (`--no-python-frames`).
    pub python_frames: bool,
    /// Keep the event log of the Perfetto trace (`model::trace`).
    pub trace_log: bool,
    /// Forget an exited process once its exit is applied (`top -a`, which
    /// shows live processes only and never builds a summary): its entry,
    /// maps, mapping history, unwound stacks and code objects go, so the
    /// collector holds what is live, however many processes came and went.
    pub forget_exited: bool,
    /// Place an exited process's faults in its regions a moment after its
    /// exit (`record`): its granules leave the kernel's maps and its
    /// mapping history goes, so neither grows with every process the
    /// recording has seen (see [`Session::retire_exited`]).
    pub retire_exited: bool,
    /// Symbolize an exited process's stacks and call sites a moment after
    /// its exit, then let go of its maps, mapping history and unwound
    /// stacks (`serve`, whose profiles keep every process's stacks and
    /// which places no faults in regions): see [`Session::release_exited`].
    pub release_exited: bool,
    /// The summary's rows under this percentage are folded at the end
    /// (`record --fold-below`; 0: none): the retired processes' regions that
    /// fold is sure to fold are folded as they retire.
    pub fold_below: f64,
    /// The whole system is traced (no target to keep listed): a retired
    /// process the end's fold is sure to fold has its regions summed into
    /// the other process's as it retires.
    pub fold_processes: bool,
    /// Retired processes whose maps are kept for the end before the oldest
    /// are symbolized and let go (`Session::release_some`).
    pub release_above: usize,
    /// How often the drained stacks nothing refers to are let go, and how
    /// long one must have been held first (`Session::sweep_stacks`).
    pub stack_sweep: Duration,
    /// How often live processes' settled stack keys are sealed, and the
    /// drained stacks held above which they are (`Session::seal_live`);
    /// zero: never.
    pub stack_seal: (Duration, usize),
}

impl SessionOptions {
    /// No stacks, and no storm ever.
    pub fn new(families: Families) -> Self {
        Self {
            families,
            stacks: None,
            storm_threshold: f64::MAX,
            python_frames: true,
            trace_log: false,
            forget_exited: false,
            retire_exited: false,
            release_exited: false,
            fold_below: 0.0,
            fold_processes: false,
            release_above: RELEASE_ABOVE,
            stack_sweep: STACK_SWEEP,
            stack_seal: (STACK_SEAL, SEAL_ABOVE),
        }
    }
}

pub struct Session<S: AggregateSource> {
    source: S,
    opts: SessionOptions,
    table: ProcessTable,
    /// Ring-buffer records too short for their kind.
    malformed_events: u64,
    started: Instant,
    /// When the trace proper ended (see [`Self::stop_clock`]); until then the
    /// summary's duration runs to when it is built.
    stopped: Option<Instant>,
    /// CLOCK_MONOTONIC at `started`, the clock of kernel event timestamps.
    started_mono_ns: u64,
    /// 1 in how many minor faults is timed, as the kernel programs were attached.
    minor_period: u32,
    fast_period: u32,
    flight: FlightRecorder,
    maps_refresh: MapsRefresh,
    storms: StormDetector,
    /// The storm detector's last window, and the last housekeeping.
    last_storm_tick: Instant,
    /// When the kernel's resident counters were last read.
    last_resident: Instant,
    last_object_drop: Instant,
    /// Whether the object pages grew enough to drop them again.
    object_pages: crate::stacks::objects::ObjectPages,
    /// IPIs per call site (syscall, user stack) at the last tick, by
    /// process (for storm culprits): an exited process's go at once.
    last_sites: HashMap<u32, HashMap<(u32, i32), u64>>,
    /// Processes that sent IPIs since the last walk of the call-site map.
    stale_sites: crate::hash::HashSet<u32>,
    timeline: TimelineRecorder,
    /// Copied user stacks, unwound as they arrive.
    native: NativeStacks,
    /// Python processes and the code objects of their frames.
    python: super::python::Tracker,
    /// The Perfetto trace's event log, when asked for.
    trace: Option<TraceRecorder>,
    /// Sampled pages and their owners (`--events resident`).
    resident: Option<ResidentTracker>,
    /// Locked and pinned memory, NUMA placement (`collect/placement.rs`).
    placement: Option<super::placement::Placement>,
    /// Exited processes not retired yet, with when their exit was applied.
    retiring: Vec<(u32, Instant)>,
    /// Exited processes forgotten (`forget_exited`) whose granules are still
    /// to leave the kernel maps, and when each exited.
    forgotten_granules: Vec<(u32, Instant)>,
    /// Exited processes to release (`release_exited`), and when each exited.
    exited_to_release: Vec<(u32, Instant)>,
    last_retire: Instant,
    /// The last sweep of the drained stacks nothing refers to (`let_go`).
    last_sweep: Instant,
    /// The last sealing of live processes' settled keys (`seal_live`), and
    /// the drained stacks it let go.
    last_seal: Instant,
    /// The last drain of the kernel's stack maps (`take_stacks`).
    last_stacks_drain: Instant,
    /// When live processes' names were last read from /proc (`Session::rename_live`).
    pub(super) last_names: Option<Instant>,
    sealed_stacks: u64,
    /// The user stack ids of the keys sealed as their processes were
    /// released (`release_retired`): let go with them (`let_go`).
    released_ids: crate::hash::HashSet<u32>,
    /// (tgid, user stack id) of live processes' keys and call sites sealed
    /// whose unwound stacks (`NativeStacks`) wait for their drained stack
    /// to be let go (`forget_unwound`).
    unwound_sealed: crate::hash::HashSet<(u32, i32)>,
    /// Owner shapes held above which the unreferenced go (`gc_owner_shapes`).
    owner_shapes_gc_at: usize,
    /// The regions of the retired processes, placed.
    placed: crate::regions::Partial,
    /// Replayed starts of forked processes, kept between placements.
    starts: attribute::Starts,
    /// Processes retired (their regions placed before the end).
    pub retired: u64,
    /// Faults and fault time of the retired processes, the 20 largest of
    /// each.
    retired_sum: (u64, u64),
    retired_top: (crate::regions::TopN, crate::regions::TopN),
    /// The first retired process sure to be folded (left unfolded).
    first_sure: Option<u32>,
    /// Retired processes not folded whole yet, with their faults and fault
    /// time: looked at again when the held region rows have doubled
    /// (`refold`).
    unfolded: Vec<(u32, u64, u64)>,
    /// The held region rows at which they are folded again.
    refold_at: usize,
    /// The unfolded processes at which they are folded again.
    refold_procs_at: usize,
    /// Symbol caches, and the stacks and call sites of retired processes
    /// symbolized as they retired (`release_retired`).
    syms: symbols::Symbols,
    /// The call-site counts of retired processes, taken out of the kernel's map.
    retired_mm: Vec<(MmStackKey, MmStackCounts)>,
    /// The call sites of live processes at the last sealing, with their
    /// counts then: one found unchanged at the next is settled, and sealed
    /// (`seal_sites`).
    sites_seen: HashMap<MmStackKey, MmStackCounts>,
    /// Retired processes whose maps, unwound stacks and code objects were let go.
    pub released: u64,
    /// Retired processes whose maps are still held, oldest first.
    to_release: std::collections::VecDeque<u32>,
    release_slices: u64,
    /// Call-site counts of retired processes waiting to be released, by process.
    mm_waiting: HashMap<u32, Vec<(MmStackKey, MmStackCounts)>>,
    /// Retired processes folded whole, to be folded away once released.
    whole: crate::hash::HashSet<u32>,
    /// When `log_weights` last logged.
    last_weights: Instant,
    /// What is kept of the processes folded away (`fold_away`).
    folded: super::folded::FoldedAway,
    /// A fault stack with a region leaf was seen (`--leaf region`): the
    /// resident profiles of processes folded away keep theirs too.
    leaf_seen: bool,
}

use crate::kernel::monotonic_ns;

/// Copies a `T` out of a ring-buffer record after checking its length.
fn read_event<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    // SAFETY: length checked; T is Pod (plain integers, any bit pattern valid).
    (bytes.len() >= std::mem::size_of::<T>()).then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Whether a call of the locking family locked memory: a successful mlock,
/// mlock2, mlockall or mmap with `MAP_LOCKED` (not munlock, munlockall).
fn locks_memory(ev: &vmtrace_common::MmLockEvent) -> bool {
    use vmtrace_common::MmCall;
    let call = ev.call;
    ev.ret >= 0 && (call == MmCall::Mlock as u32 || call == MmCall::Mlockall as u32 || call == MmCall::Mmap as u32)
}

/// What one drain saw, applied once the ring buffer is empty.
#[derive(Default)]
struct Batch {
    exited: Vec<u32>,
    born: Vec<u32>,
    /// Those of `born` that exec'd: the table read their memory cgroup then.
    execd: Vec<u32>,
    ooms: Vec<OomEvent>,
    /// User stacks with Python frames, new in the map.
    py_stored: Vec<u32>,
    /// Processes that made a call of the locking family: their maps are
    /// read at once, so the call site is named even if they exit right after.
    locked: Vec<u32>,
    /// Those whose call locked memory (a successful mlock, mlockall or
    /// MAP_LOCKED mmap): their NUMA placement is read after the drain. An
    /// unlock is not read: the pages it leaves are about to go (a read
    /// then would replace the locked set with what is left of it).
    locking: Vec<u32>,
    malformed: u64,
    /// The copy of the next page sample's fault, unwound (the loader hands
    /// it over just before the page: `stacks::native::PageCopies`).
    page_pin: Option<crate::stacks::native::PagePin>,
}

impl Batch {
    /// Decodes one record; task and mapping events go to the table at once,
    /// in ring order; copied stacks are unwound at once, while their
    /// process's maps are there to read.
    fn take(
        &mut self,
        bytes: &[u8],
        table: &mut ProcessTable,
        native: &mut NativeStacks,
        mut trace: Option<&mut TraceRecorder>,
        resident: Option<&mut ResidentTracker>,
        placement: Option<&mut super::placement::Placement>,
    ) {
        let Some(hdr) = read_event::<EventHeader>(bytes) else {
            self.malformed += 1;
            return;
        };
        match EventKind::from_u32(hdr.kind) {
            Some(EventKind::TaskFork | EventKind::TaskExec | EventKind::TaskExit) => {
                let Some(ev) = read_event::<TaskEvent>(bytes) else {
                    self.malformed += 1;
                    return;
                };
                if ev.hdr.kind == EventKind::TaskExit as u32 && ev.group_dead != 0 {
                    self.exited.push(ev.tgid);
                } else if ev.hdr.kind != EventKind::TaskExit as u32 {
                    self.born.push(ev.tgid);
                    if ev.hdr.kind == EventKind::TaskExec as u32 {
                        self.execd.push(ev.tgid);
                    }
                }
                if let (Some(t), Some(kind)) = (trace, tracelog::task_kind(ev.hdr.kind)) {
                    t.task(&ev, kind);
                }
                if let Some(r) = resident {
                    r.task(&ev);
                }
                table.apply(&ev);
            }
            Some(EventKind::MmMapChange) => match read_event::<MmEvent>(bytes) {
                Some(ev) => {
                    if let Some(r) = resident {
                        r.mm_change(&ev);
                    }
                    // madvise (memory given back) is streamed for the resident
                    // profiles only: it changes no mapping.
                    if ev.call == vmtrace_common::MmCall::Madvise as u32 {
                        return;
                    }
                    if let Some(t) = trace.as_deref_mut() {
                        t.mm_change(&ev);
                    }
                    table.note_change(&ev);
                }
                None => self.malformed += 1,
            },
            Some(EventKind::FaultMajor) => match (read_event::<FaultMajorEvent>(bytes), trace) {
                (Some(ev), Some(t)) => t.major(&ev),
                (Some(_), None) => {}
                (None, _) => self.malformed += 1,
            },
            Some(EventKind::OomMarkVictim) => match read_event::<OomEvent>(bytes) {
                Some(ev) => {
                    if let Some(r) = resident {
                        r.oom_kill(&ev);
                    }
                    self.ooms.push(ev);
                }
                None => self.malformed += 1,
            },
            Some(EventKind::StackSample) => {
                if let Some(pin) = native.add(bytes, table) {
                    self.page_pin = Some(pin);
                }
            }
            Some(EventKind::PyStackStored) => match read_event::<PyStackEvent>(bytes) {
                Some(ev) => self.py_stored.push(ev.id),
                None => self.malformed += 1,
            },
            Some(EventKind::MmLock) => match read_event::<vmtrace_common::MmLockEvent>(bytes) {
                Some(ev) => {
                    if let Some(p) = placement {
                        p.lock(&ev);
                    }
                    self.locked.push(ev.tgid);
                    if locks_memory(&ev) {
                        self.locking.push(ev.tgid);
                    }
                }
                None => self.malformed += 1,
            },
            Some(EventKind::PageSample) => self.page_sample(bytes, table, resident, placement),
            Some(EventKind::ResidentPeak | EventKind::ResidentEnd) => {
                match read_event::<vmtrace_common::RssEvent>(bytes) {
                    Some(ev) => {
                        if let Some(r) = resident {
                            r.rss(&ev);
                        }
                    }
                    None => self.malformed += 1,
                }
            }
            // The loader's granule index keeps these (`loader::granules`).
            Some(EventKind::GranuleNew) => {}
            None => self.malformed += 1,
        }
    }
}

impl Batch {
    /// A sampled page: its NUMA placement, and its owner (its own fault's
    /// unwound stack where that was copied: `page_pin`).
    fn page_sample(
        &mut self,
        bytes: &[u8],
        table: &ProcessTable,
        resident: Option<&mut ResidentTracker>,
        placement: Option<&mut super::placement::Placement>,
    ) {
        let Some(ev) = read_event::<vmtrace_common::PageSample>(bytes) else {
            self.malformed += 1;
            return;
        };
        if let Some(p) = placement {
            p.page(&ev);
        }
        let pin = self
            .page_pin
            .take()
            .filter(|p| ev.flags & vmtrace_common::PAGE_STACK_COPY != 0 && p.tgid == ev.tgid && p.addr == ev.addr);
        if let Some(r) = resident {
            let anon = vmtrace_common::RSS_ANON as u8;
            let read = r.read_only_fault(ev.flags);
            let kind = table.get(ev.tgid).map_or(anon, |p| super::resident::page_kind(p, ev.addr, read));
            r.page(&ev, kind, pin.map(|p| p.id));
        }
    }
}

impl<S: AggregateSource> Session<S> {
    pub fn new(source: S, opts: SessionOptions) -> Self {
        // Setting the pad also fixes glibc's mmap threshold (no longer
        // raised to the size of each mapped block freed): set it too, so
        // blocks of 4 MiB and more (the largest tables) are mapped and go
        // back whole when freed, and smaller ones stay on the heap as they
        // mostly did.
        // SAFETY: mallopt only changes glibc's growth step and threshold.
        unsafe {
            libc::mallopt(libc::M_TOP_PAD, HEAP_TOP_PAD as i32);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        }
        let now = Instant::now();
        let (page_salt, tp_offsets, cow_copies) = (source.page_salt(), source.tp_offsets(), source.cow_copies_seen());
        let writes_seen =
            crate::model::summary::uncounted_of(&source.probe_info()) & crate::model::faults::UNCOUNTED_WRITE == 0;
        let placed = crate::regions::Partial::new(attribute::weighted_time(&source)).with_cow_copies(cow_copies);
        Self {
            minor_period: source.minor_period(),
            fast_period: source.fast_period(),
            source,
            opts,
            table: ProcessTable::default(),
            malformed_events: 0,
            started: now,
            stopped: None,
            started_mono_ns: monotonic_ns(),
            flight: FlightRecorder::new(now),
            maps_refresh: MapsRefresh::new(now),
            storms: StormDetector::new(opts.storm_threshold),
            last_storm_tick: now,
            last_resident: now,
            last_object_drop: now,
            object_pages: crate::stacks::objects::ObjectPages::default(),
            last_sites: HashMap::default(),
            stale_sites: crate::hash::HashSet::default(),
            timeline: TimelineRecorder::new(now),
            native: NativeStacks::default(),
            python: super::python::Tracker::default(),
            trace: opts.trace_log.then(|| TraceRecorder::new(monotonic_ns())),
            resident: opts.families.resident.then(|| {
                ResidentTracker::new(opts.stacks.map_or(1, |(_, period)| period), page_salt)
                    .with_oom_sizes(&tp_offsets)
                    .with_cow_copies(cow_copies)
                    .with_writes_seen(writes_seen)
            }),
            placement: Some(super::placement::Placement::new(opts.families.mmap, opts.trace_log)),
            retiring: Vec::new(),
            forgotten_granules: Vec::new(),
            exited_to_release: Vec::new(),
            last_retire: now,
            last_sweep: now,
            last_seal: now,
            last_stacks_drain: now,
            last_names: None,
            sealed_stacks: 0,
            released_ids: crate::hash::HashSet::default(),
            unwound_sealed: crate::hash::HashSet::default(),
            owner_shapes_gc_at: OWNER_SHAPES_GC_FIRST,
            placed,
            starts: attribute::Starts::default(),
            retired: 0,
            retired_sum: (0, 0),
            retired_top: Default::default(),
            first_sure: None,
            unfolded: Vec::new(),
            refold_at: REFOLD_FIRST,
            refold_procs_at: REFOLD_PROCESSES_FIRST,
            syms: symbols::Symbols::default(),
            retired_mm: Vec::new(),
            sites_seen: HashMap::default(),
            released: 0,
            to_release: std::collections::VecDeque::new(),
            release_slices: 0,
            mm_waiting: HashMap::default(),
            whole: crate::hash::HashSet::default(),
            last_weights: Instant::now(),
            folded: super::folded::FoldedAway::default(),
            leaf_seen: false,
        }
    }

    /// The kernel side, for what only the loaded programs do (tracing a pid,
    /// stopping, detaching).
    pub fn source(&self) -> &S {
        &self.source
    }

    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    pub fn families(&self) -> Families {
        self.opts.families
    }

    /// 1 in how many minor faults is timed.
    pub fn minor_period(&self) -> u32 {
        self.minor_period
    }

    /// When the trace proper started (see [`Self::start_clock`]).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// OOM kills seen so far.
    pub fn ooms(&self) -> &[OomRecord] {
        self.flight.ooms()
    }

    /// Storms open and closed so far.
    pub fn storms(&self) -> &StormDetector {
        &self.storms
    }

    /// What the table knows of `pid`, without asking /proc.
    pub fn known(&self, pid: u32) -> Option<&ProcInfo> {
        self.table.get(pid)
    }

    /// `pid`'s entry, made and filled from /proc if need be.
    pub fn process(&mut self, pid: u32) -> &ProcInfo {
        self.table.ensure(pid)
    }

    /// Reads `pid`'s maps now, into its region history: a command vmtrace
    /// holds before its exec, whose faults until the exec are in this
    /// address space.
    pub fn read_maps(&mut self, pid: u32) {
        let source = &self.source;
        self.table.snapshot_maps_at(pid, &|p| source.map_gen(p));
    }

    /// Records who started `pid` (a command vmtrace spawned).
    pub fn set_parent(&mut self, pid: u32, ppid: u32) {
        self.table.set_parent(pid, ppid);
    }

    /// The traced processes not known to have exited.
    pub fn live_pids(&self) -> Vec<u32> {
        self.table.live_pids().iter().copied().collect()
    }

    /// Replaces the exit hook's read of `pid`'s kernel fault counters.
    pub fn set_kernel_accounting(&mut self, pid: u32, k: KernelAccounting) {
        self.table.set_kernel_accounting(pid, k);
    }

    /// Marks the start of the trace proper. The timeline starts from zero,
    /// not from the totals now: a started command was released (and
    /// exec'd, and `/bin/true` ran to its end) before this, and its first
    /// faults are in the totals; the first bin holds them, so that the
    /// timeline adds up to `totals`.
    pub fn start_clock(&mut self) {
        self.started = Instant::now();
        self.timeline.restart(self.started, (0, 0));
        self.last_storm_tick = self.started;
        self.started_mono_ns = monotonic_ns();
        if let Some(t) = self.trace.as_mut() {
            t.restart(self.started_mono_ns);
        }
    }

    /// Marks the end of the trace proper: the summary's duration is from
    /// `start_clock` to here, not to the end of detaching and report building.
    pub fn stop_clock(&mut self) {
        self.stopped = Some(Instant::now());
    }

    /// Seconds since the start for a kernel timestamp.
    fn since_start(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.started_mono_ns) as f64 / 1e9
    }

    fn seconds_at(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.started).as_secs_f64()
    }

    /// Waits up to `timeout` for kernel events, then applies all that arrived.
    pub fn poll(&mut self, timeout: Duration) {
        self.source.wait_for_events(timeout);
        self.step(Instant::now());
    }

    /// Everything a poll does once the wait is over, as of `now`.
    fn step(&mut self, now: Instant) {
        // First, while `now` is still the time the totals are read at.
        if self.timeline.due(now) {
            self.timeline.push(now, self.source.totals());
        }
        self.drain_at(now);
        if self.wants_python() {
            self.python.look_at_young(now, &mut self.table, &mut self.source);
        }
        // The rest keeps its 100 ms cadence however often `record` polls for
        // the timeline: the maps of young processes are re-read on each of these.
        if now.saturating_duration_since(self.last_storm_tick) < STORM_TICK {
            return;
        }
        self.last_storm_tick = now;
        // Where a slow tick's time went (`RUST_LOG=vmtrace::tick=debug`).
        let mut marks = [Duration::ZERO; 5];
        let mut at = Instant::now();
        let mut mark = |i: usize| {
            let t = Instant::now();
            marks[i] = t.saturating_duration_since(at);
            at = t;
        };
        if self.opts.families.tlb || self.opts.families.mmap {
            self.mm_tick(self.seconds_at(now));
        }
        self.record_history(now);
        self.trace_interval();
        if self.trace.is_some() || now.saturating_duration_since(self.last_resident) >= RESIDENT_EVERY {
            self.resident_counters(now);
        }
        if let Some(p) = self.placement.as_mut() {
            let live: Vec<u32> = self.table.live_pids().iter().copied().collect();
            p.tick(now, &live);
        }
        if self.opts.stacks.is_some() && now.saturating_duration_since(self.last_object_drop) >= DROP_OBJECT_PAGES_EVERY
        {
            self.last_object_drop = now;
            if let Some(n) = self.object_pages.tick() {
                log::trace!(target: "vmtrace::tick", "object pages dropped from {n} mappings");
            }
        }
        mark(0);
        if self.opts.stacks.is_some() || self.opts.families.regions {
            let source = &self.source;
            self.maps_refresh.run(now, &mut self.table, &|pid| source.map_gen(pid));
        }
        mark(1);
        if self.wants_python() {
            self.python.tick(now, &self.table, &mut self.source);
        }
        mark(2);
        self.retire_exited(now);
        self.drop_forgotten_granules(now);
        self.release_exited(now);
        mark(3);
        self.take_stacks(now);
        self.seal_live(now);
        mark(4);
        self.log_weights(now);
        let took = now.elapsed();
        if took >= SLOW_TICK {
            let [counts, maps, python, retire, stacks] = marks;
            log::debug!(
                target: "vmtrace::tick",
                "slow tick {took:?}: counters {counts:?}, maps {maps:?}, python {python:?}, retire {retire:?}, stacks {stacks:?}"
            );
        }
    }

    /// Moves the fault stacks counted since the last drain out of the
    /// kernel's maps (and reads the code objects of new Python frames), so
    /// that the maps have room: a torch job with a stack on every fault
    /// fills `FAULT_STACKS` in about a second.
    fn take_stacks(&mut self, now: Instant) {
        if self.opts.stacks.is_none() {
            return;
        }
        let at = Instant::now();
        let gap = at.saturating_duration_since(self.last_stacks_drain);
        self.last_stacks_drain = at;
        if gap >= SLOW_STACK_DRAIN {
            log::debug!(target: "vmtrace::tick", "stack maps drained {gap:?} after the last drain");
        }
        let fresh = self.source.drain_stacks();
        if self.wants_python() {
            self.python.read_drained(now, fresh);
        }
    }

    /// Whether any user stack is symbolized: fault stacks, or the call sites
    /// of mmap-family calls and shootdowns (`top`'s banners take those).
    fn wants_python(&self) -> bool {
        self.opts.python_frames && (self.opts.stacks.is_some() || self.opts.families.mmap || self.opts.families.tlb)
    }

    /// The last timeline point and storm window (at the end of the trace).
    fn tick(&mut self, now: Instant) {
        // The axis ends where the trace proper did (the summary's duration).
        let end = self.stopped.map_or(now, |s| s.min(now));
        self.timeline.push(end, self.source.totals());
        if self.opts.families.tlb || self.opts.families.mmap {
            self.mm_tick(self.seconds_at(now));
        }
    }

    /// Every interval, each process's counters for the Perfetto trace.
    fn trace_interval(&mut self) {
        if let Some(t) = self.trace.as_mut() {
            tracelog::interval(t, &self.source, self.minor_period, monotonic_ns());
        }
    }

    /// Every `RESIDENT_EVERY` (every tick with the Perfetto trace, which
    /// draws them), and before exited processes are retired: the kernel's
    /// resident counters, each process's figures, and the address spaces
    /// long torn down leave the map. The kernel keeps each one's peak and
    /// end itself, so a slower read loses neither; the map holds every
    /// address space on the machine with `-a`, and walking it every 100 ms
    /// was 4% of the collector's time beside a shell loop.
    pub(super) fn resident_counters(&mut self, now: Instant) {
        self.last_resident = now;
        let Some(r) = self.resident.as_mut() else { return };
        let all = self.source.all_rss();
        let now_ns = monotonic_ns();
        if let Some(t) = self.trace.as_mut() {
            t.resident(now_ns, &all);
        }
        for mm_id in r.kernel_counters(&all, now_ns) {
            self.source.forget_rss(mm_id);
        }
        fill_unseen(r);
    }

    /// The kernel's resident counters read now unless read within the last
    /// tick: `top` and `serve` show each process's resident size at every
    /// refresh, from the first.
    pub(super) fn fresh_resident_counters(&mut self) {
        let now = Instant::now();
        if self.resident.is_some() && now.saturating_duration_since(self.last_resident) >= STORM_TICK {
            self.resident_counters(now);
        }
    }

    /// The resident profiles, from the live sets and the kernel's counters.
    fn build_resident(&mut self, leaf: bool) -> Option<super::resident::ResidentProfiles> {
        let mut tracker = self.resident.take()?;
        let all = self.source.all_rss();
        for (id, m) in &all {
            log::debug!("rss mm {id:#x}: {m:?}");
        }
        // Nothing is forgotten now: every address space's figures are wanted.
        let _ = tracker.kernel_counters(&all, 0);
        fill_unseen(&mut tracker);
        // A live process whose resident size never changed while traced has
        // no entry in the kernel's map: its /proc figures stand in.
        let unseen: Vec<u32> =
            self.table.live_pids().iter().copied().filter(|p| tracker.kernel_of(*p).is_none()).collect();
        for pid in unseen {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if tracker.fill_from_status(pid, &status) {
                    log::debug!("resident {pid}: no rss_stat event while traced, figures from /proc/{pid}/status");
                }
            }
        }
        let (procs, counts, ooms) = tracker.finish(monotonic_ns());
        let period = self.opts.stacks.map_or(0, |(_, n)| n);
        let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
        let comms: HashMap<u32, String> = table.iter().map(|(p, i)| (*p, i.comm.clone())).collect();
        let syms = &mut self.syms;
        let mut symbolize = |raw| symbols::symbolize_owner_counts(raw, table, source, native, py, syms);
        let comm_of = |pid: u32| comms.get(&pid).cloned().unwrap_or_default();
        let params = (leaf, period, self.started_mono_ns);
        let mut profiles = super::resident::build((&procs, counts, &ooms), params, &mut symbolize, &comm_of);
        if let Some(r) = self.folded.row().and_then(|row| row.resident) {
            let (end, peak, live_pages) = self.folded.resident();
            profiles.add_folded(r, end, peak, live_pages);
        }
        Some(profiles)
    }

    /// Every few hundred ms, the fault count of each live traced process.
    fn record_history(&mut self, now: Instant) {
        if !self.opts.families.oom || !self.flight.due(now) {
            return;
        }
        let now_s = self.seconds_at(now);
        self.flight.sample(now, now_s, &self.source.all_stats());
    }

    /// Every tick, the mmap/TLB aggregates. What the kernel counted for a
    /// process after its exit was applied (the TLB flushes of its address
    /// space's teardown) is taken into its final counts, so that the map
    /// holds live processes only: it filled with one exited process in three
    /// under churn, and its walk with it. Then the storm detector is fed.
    fn mm_tick(&mut self, now: f64) {
        let all = self.source.all_mm();
        let (table, forget) = (&self.table, self.opts.forget_exited);
        // Not in the table: started before the trace and not seen since, or
        // (`top`, `serve`) forgotten at exit: then gone if the kernel no
        // longer has it.
        let gone = |pid: u32| table.get(pid).map_or_else(|| forget && !crate::target::pid_alive(pid), |p| p.exited);
        let (late, live): (Vec<_>, Vec<_>) = all.into_iter().partition(|(pid, _)| gone(*pid));
        for (pid, _) in &late {
            let mm = self.source.take_mm(*pid);
            if !(forget && self.table.get(*pid).is_none()) {
                self.table.add_final_counts(*pid, None, mm.as_ref());
            }
        }
        log::trace!(target: "vmtrace::storms", "{} mm aggregates, {} taken late", live.len(), late.len());
        if self.opts.families.tlb {
            self.storm_tick(now, &live);
        }
    }

    /// Feeds the storm detector: IPIs sent per process, and per call site.
    ///
    /// The call-site map holds every process's sites, and is walked only
    /// on a tick where a process sent IPIs at an eighth of the storm rate or
    /// more, or is in a storm: a process starting up sends a few, and
    /// walking the map for those was a tenth of the collector's time beside
    /// a shell loop. A walk takes every site's count as its baseline. A
    /// process that sent IPIs on a tick without a walk has a stale baseline:
    /// should its first walk find it in a storm, its sites' deltas also hold
    /// IPIs from before the storm, and are scaled to the storm's own count
    /// for the tick, which is exact.
    fn storm_tick(&mut self, now: f64, all: &[(u32, MmStats)]) {
        let totals: Vec<(u32, u64)> = all.iter().map(|(pid, m)| (*pid, m.ipis_sent)).collect();
        let rose: HashMap<u32, u64> = totals
            .iter()
            .filter_map(|(pid, n)| {
                let d = n.saturating_sub(self.storms.last_total(*pid));
                (d > 0).then_some((*pid, d))
            })
            .collect();
        self.storms.tick(now, &totals);
        // Read while the process lives: the setting that may drive its storm.
        for pid in self.storms.settings_unread() {
            self.storms.set_settings(pid, crate::malloc_env::of(pid));
        }
        if rose.is_empty() {
            return;
        }
        let warm = (self.storms.threshold() * STORM_TICK.as_secs_f64() / 8.0).max(1.0) as u64;
        let walk = rose.iter().any(|(pid, d)| *d >= warm || self.storms.in_storm(*pid));
        if !walk {
            self.stale_sites.extend(rose.keys());
            return;
        }
        let mut deltas: HashMap<u32, Vec<(super::storms::Site, u64)>> = HashMap::default();
        // The walk sees the sites of processes that exited and are not yet
        // retired: their baselines were dropped at the exit and must not
        // come back (they grew by every exited process beside a shell loop).
        let live: crate::hash::HashSet<u32> = all.iter().map(|(pid, _)| *pid).collect();
        for (k, c) in self.source.all_mm_stacks().into_iter().filter(|(k, _)| live.contains(&k.tgid)) {
            let before = self.last_sites.entry(k.tgid).or_default().insert((k.call, k.user_stack), c.ipis).unwrap_or(0);
            if c.ipis > before && self.storms.in_storm(k.tgid) && rose.contains_key(&k.tgid) {
                deltas.entry(k.tgid).or_default().push(((k.call, k.user_stack), c.ipis - before));
            }
        }
        for (pid, sites) in deltas {
            let sum: u64 = sites.iter().map(|(_, d)| d).sum();
            let exact = rose[&pid];
            let scale = self.stale_sites.contains(&pid) && sum > exact;
            for (site, d) in sites {
                let d = if scale {
                    ((u128::from(d) * u128::from(exact) + u128::from(sum) / 2) / u128::from(sum)) as u64
                } else {
                    d
                };
                self.storms.add_site(pid, site, d);
            }
        }
        self.last_sites.retain(|pid, _| live.contains(pid));
        self.last_sites.shrink_if_sparse();
        self.stale_sites.clear();
    }

    /// Every drop counter so far, and the ring records that could not be read.
    pub fn drop_counts(&self) -> DropCounts {
        DropCounts { by_kind: self.source.drops(), malformed_events: self.malformed_events }
    }

    /// Events and samples lost so far ([`DropCounts::lost`]).
    pub fn lost_events(&self) -> u64 {
        self.drop_counts().lost()
    }

    fn on_oom(&mut self, ev: &OomEvent, now: Instant) {
        let victim = ev.victim_pid;
        // Read now: the victim is on its way out.
        // A victim already exiting may read as the root cgroup: then what it was
        // seen in while it lived (at its last exec or fork) is the better answer.
        let seen = self.table.get(victim).and_then(|p| p.cgroup.clone());
        let cgroup = match (oom::memory_cgroup_of(victim), seen) {
            (Some(now), Some(seen)) if now.1 == "/" && seen.1 != "/" => Some(seen),
            (now, seen) => now.or(seen),
        };
        let in_target = self.table.contains(victim) || self.source.is_traced(victim);
        let mut rec = oom::describe(ev, cgroup, in_target, self.since_start(ev.hdr.ts_ns), &self.source.tp_offsets());
        // No comm in the record (before 6.8, where no hook sees the victim's
        // task) and /proc already gone: the name the table knew it by.
        if rec.victim_comm == oom::UNKNOWN_COMM {
            if let Some(p) = self.table.get(victim).filter(|p| !p.comm.is_empty()) {
                rec.victim_comm.clone_from(&p.comm);
            }
        }
        // Its count is read once more at the kill.
        rec.fault_rate_per_s = self.source.stats_of(victim).and_then(|s| {
            let now_s = self.seconds_at(now);
            let first_seen_s =
                self.table.get(victim).map(|p| now_s - now.saturating_duration_since(p.first_seen).as_secs_f64());
            self.flight.rate(victim, now_s, s.started, first_seen_s)
        });
        self.flight.record(rec);
    }

    /// Applies every event waiting in the ring buffer.
    pub fn drain(&mut self) {
        self.drain_at(Instant::now());
    }

    fn drain_at(&mut self, now: Instant) {
        let mut batch = Batch::default();
        let (table, native, trace) = (&mut self.table, &mut self.native, &mut self.trace);
        let (resident, placement) = (&mut self.resident, &mut self.placement);
        let malformed_samples = native.malformed;
        self.source.drain_events(&mut |bytes| {
            batch.take(bytes, table, native, trace.as_mut(), resident.as_mut(), placement.as_mut());
        });
        self.malformed_events += batch.malformed + (self.native.malformed - malformed_samples);
        for ev in &batch.ooms {
            self.on_oom(ev, now);
        }
        if !batch.py_stored.is_empty() {
            self.python.read_stored(now, &batch.py_stored, &mut self.source);
        }
        if !batch.locking.is_empty() {
            let mut locking = batch.locking;
            locking.sort_unstable();
            locking.dedup();
            if let Some(p) = self.placement.as_mut() {
                p.locked(&locking, now);
            }
        }
        let mut born = batch.born;
        born.extend(batch.locked.iter().filter(|p| !born.contains(p)).copied().collect::<Vec<_>>());
        // A thread the fallback fork hook reported, and whose exit came in the
        // same batch, is gone from the table: reading its /proc now would fail
        // and give it back an entry (its parent's maps) as a process.
        born.retain(|tgid| self.table.contains(*tgid));
        // A fork and its exec in one batch: one process to read.
        born.sort_unstable();
        born.dedup();
        if self.opts.stacks.is_some() || self.opts.families.regions {
            let source = &self.source;
            for &tgid in &born {
                self.table.snapshot_maps_at(tgid, &|pid| source.map_gen(pid));
            }
        }
        if self.opts.families.oom {
            // An exec'd process's cgroup was read as the exec was applied.
            batch.execd.sort_unstable();
            for tgid in born.into_iter().filter(|p| batch.execd.binary_search(p).is_err()) {
                if let Some(cg) = oom::memory_cgroup_of(tgid) {
                    self.table.set_cgroup(tgid, cg);
                }
            }
        }
        // Take an exited process's aggregate out of the kernel map: it is final,
        // and the map stays bounded however many processes come and go.
        for &tgid in &batch.exited {
            self.table.retire(tgid);
            self.python.exited(tgid, &mut self.source);
            self.storms.forget(tgid);
        }
        for tgid in &batch.exited {
            self.last_sites.remove(tgid);
            self.stale_sites.remove(tgid);
        }
        if self.opts.retire_exited && self.opts.families.regions && !self.opts.forget_exited {
            self.retiring.extend(batch.exited.iter().map(|&tgid| (tgid, now)));
        }
        if self.opts.forget_exited && !self.unwound_sealed.is_empty() {
            let gone: crate::hash::HashSet<u32> = batch.exited.iter().copied().collect();
            self.unwound_sealed.retain(|(t, _)| !gone.contains(t));
        }
        for tgid in batch.exited {
            self.native.forget_space(tgid);
            let (stats, mm) = (self.source.take_stats(tgid), self.source.take_mm(tgid));
            self.table.add_final_counts(tgid, stats.as_ref(), mm.as_ref());
            if let (Some(t), Some(p)) = (self.trace.as_mut(), self.table.get(tgid)) {
                tracelog::exited(t, tgid, p, self.minor_period, monotonic_ns());
            }
            if self.opts.release_exited {
                self.exited_to_release.push((tgid, now));
            }
            if self.opts.forget_exited {
                if self.opts.families.regions {
                    self.forgotten_granules.push((tgid, now));
                }
                self.table.forget(tgid);
                self.native.forget(tgid);
                self.python.codes.forget(tgid);
            }
        }
        self.source.flush_logs();
    }

    /// Between the slices of a tick's long work (placing and releasing
    /// hundreds of exited processes can take half a second under churn):
    /// the events that came meanwhile are applied, so that the ring buffer
    /// does not fill while the tick works; nor do the stack maps.
    fn keep_up(&mut self) {
        let now = Instant::now();
        self.drain_at(now);
        self.take_stacks(now);
    }

    /// `keep_up` between the slices of a sealing (`seal_slices`), once
    /// `SEAL_DRAIN_EVERY` has passed since the stack maps' last drain: a
    /// drain more per slice would age the drained keys (`SEAL_MIN_AGE`
    /// counts drains) faster than the ticks do.
    fn keep_up_if_due(&mut self) -> bool {
        if Instant::now().saturating_duration_since(self.last_stacks_drain) < SEAL_DRAIN_EVERY {
            return false;
        }
        self.keep_up();
        true
    }

    /// Seals the counts `raw` (`Symbols::seal`) `SEAL_SLICE` keys at a
    /// time, draining the kernel's maps between slices when due
    /// (`keep_up_if_due`), then keeps each process's shapes within
    /// `MAX_SEALED` once (as one call would have). Returns how many drains
    /// it made.
    fn seal_slices(&mut self, raw: Vec<(StackKey, StackCounts)>, live: bool) -> usize {
        let pids: crate::hash::HashSet<u32> = raw.iter().map(|(k, _)| k.tgid).collect();
        let mut rest = raw.into_iter();
        let mut drains = 0;
        loop {
            let slice: Vec<(StackKey, StackCounts)> = rest.by_ref().take(SEAL_SLICE).collect();
            if slice.is_empty() {
                break;
            }
            let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
            self.syms.seal(slice, live, table, source, native, py);
            drains += usize::from(self.keep_up_if_due());
        }
        self.syms.compact_sealed(&pids);
        drains
    }

    /// Fault aggregates of every process: taken at exit, or still in the map.
    pub(crate) fn stats_totals(&self) -> BTreeMap<u32, FaultStats> {
        let mut all: BTreeMap<u32, FaultStats> =
            self.table.iter().filter_map(|(pid, p)| p.stats.map(|s| (*pid, s))).collect();
        for (tgid, s) in self.source.all_stats() {
            all.entry(tgid).or_default().merge(&s);
        }
        all
    }

    /// mmap/TLB aggregates of every process: taken at exit, or still in the map.
    pub(crate) fn mm_totals(&self) -> BTreeMap<u32, MmStats> {
        let mut all: BTreeMap<u32, MmStats> =
            self.table.iter().filter_map(|(pid, p)| p.mm.map(|m| (*pid, m))).collect();
        for (tgid, m) in self.source.all_mm() {
            all.entry(tgid).or_default().merge(&m);
        }
        all
    }

    /// Faults per region of every process, then per file and tensor. The
    /// processes still unplaced (the live ones, and those that exited too
    /// recently to be retired) are placed a slice at a time, and each
    /// slice's rows that the end's fold is sure to fold are folded before
    /// the next: placed at once, the rows of a `record -a`'s live processes
    /// were 68 of the 190 MB the end's heap peaked at (heaptrack, 120 s
    /// beside a shell loop).
    pub(crate) fn build_regions(&mut self) -> Attributed {
        let mut granules = self.source.all_granules();
        granules.sort_by_key(|(k, _)| k.tgid);
        // What is left for the next call (`top` builds the regions at every
        // refresh once its command ended) is placed with the same settings:
        // a default one took every copy-on-write fault of an anonymous
        // region for a copy (`copies_seen` false), so `top` said a parent
        // copied 38,164 pages of Python objects where `record` said 1,175
        // (uc32 bug 6).
        let fresh = crate::regions::Partial::new(attribute::weighted_time(&self.source))
            .with_cow_copies(self.source.cow_copies_seen());
        let mut placed = std::mem::replace(&mut self.placed, fresh);
        for slice in place_slices(&granules) {
            let from = placed.regions().len();
            attribute::place_into(&mut placed, &mut self.table, &mut self.starts, slice);
            placed.fold_small(from, self.opts.fold_below, |_| false);
        }
        drop(granules);
        attribute::finish(placed, &self.source)
    }

    /// The processes of `batch` (retiring) that the end's fold below
    /// `fold_below` is sure to fold into the other process: not named by a
    /// storm or an OOM kill, under that share of the faults and of the time
    /// of the processes retired so far (the end's totals are larger), and
    /// 20 retired processes have more faults and 20 more time (they are
    /// rows at the end: it is not among the heaviest). The first such
    /// process is left as it is, so that the end's fold has two to fold.
    fn sure_to_fold(&mut self, batch: &crate::hash::HashSet<u32>) -> crate::hash::HashSet<u32> {
        let mut faults = Vec::new();
        for pid in batch {
            let st = self.table.get(*pid).and_then(|p| p.stats).unwrap_or_default();
            let f = self.count_retired(&st);
            faults.push((*pid, f.total, f.time_ns));
        }
        self.pick_sure_to_fold(faults)
    }

    /// Adds a process's faults to the totals `pick_sure_to_fold` judges by.
    fn count_retired(&mut self, st: &FaultStats) -> crate::model::Faults {
        let keep = crate::model::fold::KEEP_TOP_PROCESSES;
        let f = crate::model::Faults::from_stats(st, self.minor_period);
        self.retired_sum.0 += f.total;
        self.retired_sum.1 += f.time_ns;
        self.retired_top.0.push(f.total, keep);
        self.retired_top.1.push(f.time_ns, keep);
        f
    }

    /// Of `faults` (pid, faults, fault time), the processes the end's fold
    /// is sure to fold by the retired processes' totals now; the others are
    /// kept in `unfolded` to be looked at again.
    fn pick_sure_to_fold(&mut self, faults: Vec<(u32, u64, u64)>) -> crate::hash::HashSet<u32> {
        let keep = crate::model::fold::KEEP_TOP_PROCESSES;
        let pct = self.opts.fold_below;
        if !self.opts.fold_processes || pct <= 0.0 {
            return crate::hash::HashSet::default();
        }
        let (sum, top) = (self.retired_sum, &self.retired_top);
        let light = |x: u64, of: u64| (x as f64) * 100.0 < of as f64 * pct || of == 0;
        let mut out = crate::hash::HashSet::default();
        for (pid, total, time_ns) in faults {
            let sure = !self.named_by_storm_or_oom(pid)
                && light(total, sum.0)
                && light(time_ns, sum.1)
                && top.0.n_above(total, keep)
                && top.1.n_above(time_ns, keep);
            // The first process sure to be folded is left as it is, so that
            // the end's fold has two to fold (looked at again, it is still
            // the first).
            if sure && self.first_sure.is_some_and(|first| first != pid) {
                out.insert(pid);
                continue;
            }
            if sure && self.first_sure.is_none() {
                self.first_sure = Some(pid);
            }
            self.unfolded.push((pid, total, time_ns));
        }
        out
    }

    /// Folds whole the processes `pids` whose rows are placed from row
    /// `from` on: what their COW faults copied stays with the process (its
    /// rows no longer carry its pid).
    fn fold_whole(&mut self, pids: &crate::hash::HashSet<u32>, from: usize) {
        for pid in pids {
            let mut cow = crate::model::CowFrom::default();
            for c in self.placed.regions()[from..].iter().filter(|r| r.pid == *pid).filter_map(|r| r.cow_from.as_ref())
            {
                cow.add(c);
            }
            self.table.set_cow_from(*pid, (cow.total() > 0).then_some(cow));
        }
        // Without the Perfetto trace (which names every process's call
        // sites at the end), they go once released (`fold_away`).
        if self.trace.is_none() {
            self.whole.extend(pids);
        }
    }

    /// Folds away the processes folded whole that have been released: their
    /// rows, stacks, resident profiles and call sites go into the other
    /// process's (`collect::folded`), and the collector forgets them.
    fn fold_away(&mut self) {
        let table = &self.table;
        let mut ready: Vec<u32> = (self.whole.iter().copied())
            .filter(|p| table.get(*p).is_none_or(|i| i.released) && !self.named_by_storm_or_oom(*p))
            .collect();
        // In slices: a refold that finds hundreds of waiting processes
        // light at once made them all ready together, and folding them at
        // once held all their symbolized stacks and resident profiles
        // together (VmHWM 205 MB beside the light loop, where the heap held
        // ~60 MB before and after).
        ready.sort_unstable();
        for slice in ready.chunks(FOLD_AWAY_SLICE) {
            self.fold_away_slice(&slice.iter().copied().collect());
        }
    }

    /// `fold_away` for the processes `ready`.
    fn fold_away_slice(&mut self, ready: &crate::hash::HashSet<u32>) {
        if ready.is_empty() {
            return;
        }
        let t = Instant::now();
        self.whole.retain(|p| !ready.contains(p));
        let (families, minor_period) = (self.opts.families, self.minor_period);
        let mut rows: BTreeMap<u32, crate::model::Process> = BTreeMap::new();
        let mut totals = BTreeMap::new();
        // Who each was (cgroup, rank): serve's profiles keep it on their stacks.
        let identities: HashMap<u32, std::sync::Arc<crate::model::Identity>> =
            ready.iter().filter_map(|p| Some((*p, self.table.get(*p)?.identity.clone()?))).collect();
        let identity_of = |pid: u32| identities.get(&pid).cloned();
        for pid in ready {
            let Some(info) = self.table.get(*pid) else { continue };
            let st = info.stats.unwrap_or_default();
            let row = assemble::process_row(*pid, info, &st, &info.mm.unwrap_or_default(), families, minor_period);
            let f = &row.faults;
            totals.insert(*pid, crate::stacks::weight::Totals::of(f));
            self.folded.fast.add(&st);
            self.folded.add_counters(&st, &info.mm.unwrap_or_default());
            rows.insert(*pid, row);
        }
        let (table, source, native, py) = (&mut self.table, &mut self.source, &self.native, &self.python.codes);
        if self.opts.stacks.is_some() {
            let raw = source.take_stack_counts(ready);
            let mut stacks = symbols::symbolize_counts(raw, table, source, native, py, &mut self.syms);
            let mut comm = |pid: u32| table.ensure(pid).comm.clone();
            stacks.extend(self.syms.sealed_stacks(|p| ready.contains(&p), &mut comm));
            self.leaf_seen |= stacks.iter().any(|s| s.leaf.is_some());
            let comm_of = |pid: u32| rows.get(&pid).map_or_else(String::new, |r| r.comm.clone());
            crate::stacks::weight::weigh(&mut stacks, &totals, &comm_of);
            self.folded.add_stacks(stacks, &identity_of);
        }
        if let Some(r) = self.resident.as_mut() {
            let now_ns = monotonic_ns();
            let procs: BTreeMap<u32, super::resident::ProcResident> =
                ready.iter().filter_map(|pid| Some((*pid, r.take(*pid, now_ns)?))).collect();
            let comms: HashMap<u32, String> =
                ready.iter().filter_map(|p| Some((*p, table.get(*p)?.comm.clone()))).collect();
            let syms = &mut self.syms;
            let mut symbolize = |raw| symbols::symbolize_owner_counts(raw, table, source, native, py, syms);
            let comm_of = |pid: u32| comms.get(&pid).cloned().unwrap_or_default();
            let period = self.opts.stacks.map_or(0, |(_, n)| n);
            let params = (self.leaf_seen, period, self.started_mono_ns);
            let counts = super::resident::ResidentCounts::default();
            let p = super::resident::build((&procs, counts, &[]), params, &mut symbolize, &comm_of);
            for (pid, r) in p.per_process {
                if let Some(row) = rows.get_mut(&pid) {
                    row.resident = Some(r);
                }
            }
            self.folded.add_resident(p.end, p.peak, p.summary.live_pages_at_end);
        }
        if families.mmap {
            let (taken, kept) =
                std::mem::take(&mut self.retired_mm).into_iter().partition(|(k, _)| ready.contains(&k.tgid));
            self.retired_mm = kept;
            let mut sites = symbols::build_mm_sites(taken, table, source, native, py, &mut self.syms);
            sites.extend(self.syms.sealed_sites(|p| ready.contains(&p), &mut |pid| table.ensure(pid).comm.clone()));
            self.folded.add_sites(sites, &identity_of);
        }
        for row in rows.values() {
            self.folded.add_row(row);
        }
        self.syms.forget(ready);
        self.table.remove(ready);
        let pruned = self.syms.prune();
        let (stacks, resident, sites) = self.folded.sizes();
        log::debug!(
            target: "vmtrace::release",
            "folded away {} in {:?}: {} so far; {stacks} fault stacks, {resident} resident stacks, {sites} call sites; \
             {pruned} names let go; kept {:?} (stacks, sites, (user, kernel, other names, stacks)), {} in the \
             table, {} unfolded, {} whole",
            ready.len(),
            t.elapsed(),
            self.folded.processes(),
            self.syms.sizes(),
            self.table.iter().count(),
            self.unfolded.len(),
            self.whole.len()
        );
    }

    /// Once the held region rows have doubled or `REFOLD_PROCESSES_FIRST`
    /// more processes wait unfolded:
    /// the retired processes and rows that have become light as the
    /// recording grew are folded.
    fn refold(&mut self) {
        if self.placed.regions().len() < self.refold_at && self.unfolded.len() < self.refold_procs_at {
            return;
        }
        let t = Instant::now();
        let before = self.placed.regions().len();
        let waiting = std::mem::take(&mut self.unfolded);
        let n = waiting.len();
        let folded = self.pick_sure_to_fold(waiting);
        self.fold_whole(&folded, 0);
        self.placed.refold(self.opts.fold_below, |pid| folded.contains(&pid));
        self.refold_at = (2 * self.placed.regions().len()).max(REFOLD_FIRST);
        self.refold_procs_at = self.unfolded.len() + REFOLD_PROCESSES_FIRST;
        log::debug!(
            target: "vmtrace::retire",
            "refolded {before} region rows to {} in {:?}: {} of {n} retired processes folded whole",
            self.placed.regions().len(),
            t.elapsed(),
            folded.len()
        );
    }

    /// At the end, the exited processes still waiting unfolded that the
    /// end's fold is sure to fold by the end's totals (those of the retired
    /// processes and of the live ones, now known) are folded away first, in
    /// slices, as while recording. Built with the rest, the call sites and
    /// stacks of the few hundred Python start-ups a 5-minute `record -a`
    /// of the light loop leaves unfolded took VmRSS from 104 MB to 355 MB
    /// while the outputs were written.
    fn fold_before_end(&mut self) {
        if self.unfolded.is_empty() {
            return;
        }
        let waiting: crate::hash::HashSet<u32> = self.unfolded.iter().map(|u| u.0).collect();
        for (tgid, st) in self.source.all_stats() {
            if !waiting.contains(&tgid) {
                self.count_retired(&st);
            }
        }
        let waiting = std::mem::take(&mut self.unfolded);
        let n = waiting.len();
        let folded = self.pick_sure_to_fold(waiting);
        self.fold_whole(&folded, 0);
        self.placed.refold(self.opts.fold_below, |pid| folded.contains(&pid));
        log::debug!(target: "vmtrace::retire", "at the end, {} of {n} retired processes folded whole", folded.len());
        // Those whose maps are still held (the newest `RELEASE_ABOVE`) are
        // released a slice at a time, each folded away before the next.
        let held: Vec<u32> = self.to_release.iter().copied().filter(|p| folded.contains(p)).collect();
        self.to_release.retain(|p| !folded.contains(p));
        for slice in held.chunks(FOLD_AWAY_SLICE) {
            self.release_retired(&slice.iter().copied().collect());
            self.fold_away();
        }
        self.fold_away();
    }

    /// Places the faults of processes that exited a moment ago in their
    /// regions, takes their granules out of the kernel's maps and drops
    /// their mapping history: what the recording holds of them is then
    /// their region rows. A process waits while a child it forked is still
    /// to be placed (the child's first faults are in its parent's mappings),
    /// and while a CPU still counts into one of its granules.
    fn retire_exited(&mut self, now: Instant) {
        if self.retiring.is_empty() || now.saturating_duration_since(self.last_retire) < RETIRE_EVERY {
            return;
        }
        self.last_retire = now;
        let mut in_flight = self.source.granules_in_flight();
        if self.opts.stacks.is_some() {
            in_flight.extend(self.source.stacks_in_flight());
        }
        let table = &self.table;
        let parent = |pid: u32| table.get(pid)?.history.forked_from.map(|f| f.parent);
        let needed = still_needed(table.live_pids().iter().copied(), &self.retiring, now, &in_flight, parent);
        let batch = take_ready(&mut self.retiring, now, |pid| !needed.contains(&pid) && !in_flight.contains(&pid));
        if batch.is_empty() {
            return;
        }
        // Their end figures, read after their exit.
        self.resident_counters(now);
        let t = Instant::now();
        // The ring holds the key records of granules flushed since the last
        // drain (the loader's index takes them): none of the batch's can
        // come after `in_flight` was read.
        self.keep_up();
        let mut granules = self.source.take_granules(&batch);
        let taken_in = t.elapsed();
        self.keep_up();
        granules.sort_by_key(|(k, _)| k.tgid);
        let folded = self.sure_to_fold(&batch);
        // Placed and folded a slice of processes at a time: a tick that
        // retires hundreds would otherwise hold all their rows at once (a
        // heap peak the allocator keeps).
        let mut added = 0;
        let mut unplaced = folded.clone();
        for slice in place_slices(&granules) {
            let from = self.placed.regions().len();
            attribute::place_into(&mut self.placed, &mut self.table, &mut self.starts, slice);
            added += self.placed.regions().len().saturating_sub(from);
            let whole: crate::hash::HashSet<u32> =
                slice.iter().map(|(k, _)| k.tgid).filter(|p| unplaced.remove(p)).collect();
            self.fold_whole(&whole, from);
            self.placed.fold_small(from, self.opts.fold_below, |pid| folded.contains(&pid));
            self.keep_up();
        }
        // Those with no granule (no fault).
        let from = self.placed.regions().len();
        self.fold_whole(&unplaced, from);
        log::debug!(
            target: "vmtrace::retire",
            "retired {} ({} folded whole) in {:?} (granules taken in {taken_in:?}): {} region rows added, {} held; \
             fork starts found replayed so far: {}",
            batch.len(),
            folded.len(),
            t.elapsed(),
            added,
            self.placed.regions().len(),
            self.starts.hits
        );
        self.refold();
        for pid in &batch {
            self.table.mark_retired(*pid);
        }
        self.retired += batch.len() as u64;
        let came = if self.trace.is_none() { batch.len() } else { 0 };
        if self.trace.is_none() {
            if self.opts.families.mmap {
                // One walk of the kernel's call-site map per tick, not per slice.
                for (k, c) in self.source.take_mm_stacks(&batch) {
                    self.mm_waiting.entry(k.tgid).or_default().push((k, c));
                }
            }
            let mut pids: Vec<u32> = batch.into_iter().collect();
            pids.sort_unstable();
            self.to_release.extend(pids);
        }
        self.release_some(now, came);
    }

    /// `serve`: a second after its exit, once no CPU counts into its
    /// stacks, an exited process's fault stacks and call sites are
    /// symbolized (`release_retired`, as a recording's retired processes
    /// are) and its maps, mapping history and unwound stacks let go. Its
    /// counts stay, so the served profiles and metrics keep their totals;
    /// kept whole, every process the machine started stayed in the table
    /// with its maps (a node with process churn grew by ~500 KB a process).
    fn release_exited(&mut self, now: Instant) {
        if self.exited_to_release.is_empty() {
            return;
        }
        let in_flight =
            if self.opts.stacks.is_some() { self.source.stacks_in_flight() } else { crate::hash::HashSet::default() };
        let batch = take_ready(&mut self.exited_to_release, now, |pid| !in_flight.contains(&pid));
        if batch.is_empty() {
            return;
        }
        // Their last stacks and events, drained first.
        self.keep_up();
        if self.opts.families.mmap {
            for (k, c) in self.source.take_mm_stacks(&batch) {
                self.mm_waiting.entry(k.tgid).or_default().push((k, c));
            }
        }
        for pid in &batch {
            self.table.mark_retired(*pid);
        }
        log::debug!(target: "vmtrace::release", "releasing {} exited processes", batch.len());
        self.release_retired(&batch);
        // Then folded away: their counters, stacks and call sites add into
        // the other process's, under their names, and the collector
        // forgets them, so that what `serve` holds follows what is live,
        // not every process the node ever started.
        let whole: Vec<u32> = batch.iter().copied().filter(|p| !self.named_by_storm_or_oom(*p)).collect();
        self.whole.extend(whole);
        let gone: crate::hash::HashSet<u32> = batch.into_iter().collect();
        self.let_go(gone, true, now);
    }

    /// `top`: the granules of exited processes leave the kernel maps once
    /// no CPU counts into them, as a retired process's do. `top` shows no
    /// exited process again, and each refresh reads the maps whole: kept,
    /// they grew with every process the machine started (29% of a core
    /// beside a shell loop, half of it in that read).
    fn drop_forgotten_granules(&mut self, now: Instant) {
        if self.forgotten_granules.is_empty() {
            return;
        }
        let in_flight = self.source.granules_in_flight();
        let live = self.table.live_pids();
        let mut batch = take_ready(&mut self.forgotten_granules, now, |pid| !in_flight.contains(&pid));
        // A pid reused by a live process keeps its granules.
        batch.retain(|pid| !live.contains(pid));
        if !batch.is_empty() {
            // Their key records may still be in the ring (`retire_exited`).
            self.keep_up();
            let dropped = self.source.take_granules(&batch);
            log::debug!(target: "vmtrace::retire", "{} exited processes' {} granules dropped", batch.len(), dropped.len());
        }
    }

    /// Lets go of retired processes' maps (`release_retired`) once more than
    /// `RELEASE_ABOVE` wait, oldest first, in slices of `RELEASE_SLICE`
    /// within `RELEASE_BUDGET` a tick: a short recording symbolizes at its
    /// end as before, and a long one under process churn keeps the maps of
    /// a bounded number of exited processes, without stalling the ring
    /// buffer's drain.
    fn release_some(&mut self, now: Instant, came: usize) {
        let before = self.released;
        let above = self.opts.release_above;
        // At least as many as came in this tick, so that the queue cannot
        // grow past `above` however slow the machine; the budget then
        // works through a backlog.
        let floor = self.to_release.len().saturating_sub(above).min(came);
        let mut gone = crate::hash::HashSet::default();
        while self.to_release.len() > above && (self.released - before < floor as u64 || now.elapsed() < RELEASE_BUDGET)
        {
            let n = RELEASE_SLICE.min(self.to_release.len() - above);
            let slice: crate::hash::HashSet<u32> = self.to_release.drain(..n).collect();
            self.release_retired(&slice);
            gone.extend(slice);
            self.keep_up();
        }
        let released_now = self.released > before;
        self.let_go(gone, released_now, now);
    }

    /// After processes `gone` were released (`release_retired`): lets go
    /// of the drained stacks only they were counted under, folds away
    /// those folded whole, and gives the freed heap back to the kernel.
    fn let_go(&mut self, mut gone: crate::hash::HashSet<u32>, released_now: bool, now: Instant) {
        if released_now {
            // Their stacks are templates now: the drained frames go, once
            // per tick (one walk of the unreleased processes' keys).
            let table = &self.table;
            gone.retain(|pid| table.get(*pid).is_some_and(|p| p.released));
            let id = |s: i32| u32::try_from(s).ok();
            let mut users = crate::loader::StackUsers::default();
            // Call sites: of the released (just taken), of those waiting.
            users.also.extend(
                self.retired_mm.iter().filter(|(k, _)| gone.contains(&k.tgid)).filter_map(|(k, _)| id(k.user_stack)),
            );
            // Their keys sealed as they were released.
            users.also.extend(self.released_ids.drain());
            users.in_use.extend(self.mm_waiting.values().flatten().filter_map(|(k, _)| id(k.user_stack)));
            if let Some(r) = self.resident.as_ref() {
                users.also.extend(r.stack_ids(|p| gone.contains(&p)));
                users.in_use.extend(r.stack_ids(|p| !gone.contains(&p) && table.get(p).is_none_or(|i| !i.released)));
            }
            // NUMA placement's sampled stacks are named at the end: kept.
            if let Some(p) = self.placement.as_ref() {
                users.in_use.extend(p.numa_stack_ids());
            }
            let users_gone = gone.len();
            users.gone = gone;
            let forgot = self.source.forget_stacks(&users, &|t| table.get(t).is_none_or(|p| !p.released));
            // The table sizes walk every drained stack: only when logged.
            if log::log_enabled!(target: "vmtrace::release", log::Level::Debug) {
                let (_, held, bytes) = self.source.drained_stacks();
                log::debug!(
                    target: "vmtrace::release",
                    "released {} in {:?}; {} released, {} waiting; {forgot} drained stacks let go, {held} held \
                     ({bytes} bytes); {} processes in the table, {} live",
                    users_gone,
                    now.elapsed(),
                    self.released,
                    self.to_release.len(),
                    self.table.iter().count(),
                    self.table.live_pids().len()
                );
            }
        }
        if released_now
            && self.trace.is_none()
            && now.saturating_duration_since(self.last_sweep) >= self.opts.stack_sweep
        {
            self.sweep_stacks(now);
        }
        self.fold_away();
        if released_now {
            // What was let go lies scattered through the heap, between what
            // is kept: glibc gives back only the heap's top by itself. Once a
            // tick, not once a slice: each trim's pages were faulted back in
            // by the next slice (the collector's own faults under churn).
            // SAFETY: malloc_trim only returns free pages to the kernel.
            unsafe { libc::malloc_trim(HEAP_TOP_PAD) };
        }
        if released_now {
            self.gc_owner_shapes();
        }
    }

    /// Every 10 s with `RUST_LOG=vmtrace::weights=debug`: what the processes
    /// still held weigh (their mapping logs, drained stack keys and the
    /// stacks only they count under), live and exited, and the heaviest.
    fn log_weights(&mut self, now: Instant) {
        if !log::log_enabled!(target: "vmtrace::weights", log::Level::Debug)
            || now.saturating_duration_since(self.last_weights) < Duration::from_secs(10)
        {
            return;
        }
        self.last_weights = now;
        let drained: crate::hash::HashMap<u32, (usize, usize)> =
            self.source.drained_by_tgid().into_iter().map(|(t, k, s)| (t, (k, s))).collect();
        let mut rows: Vec<(u32, bool, usize, usize, usize, usize, usize)> = Vec::new();
        let mut sums = [[0usize; 5]; 2];
        for (pid, p) in self.table.iter() {
            let (entries, regions) = p.history.weight();
            let (keys, own) = drained.get(pid).copied().unwrap_or_default();
            let live = !p.exited;
            let s = &mut sums[usize::from(live)];
            for (i, v) in [1, entries, regions, keys, own].into_iter().enumerate() {
                s[i] += v;
            }
            rows.push((*pid, live, entries, regions, keys, own, p.maps.len()));
        }
        let not_in_table =
            drained.iter().filter(|(t, _)| self.table.get(**t).is_none()).map(|(_, v)| v.0).sum::<usize>();
        rows.sort_by_key(|r| std::cmp::Reverse(r.3 + r.4));
        // The call sites of live processes still in the kernel's map, and
        // the drained stacks their ids name (held while the site is there).
        let live: crate::hash::HashSet<u32> = self.table.iter().filter(|(_, p)| !p.exited).map(|(t, _)| *t).collect();
        let sites: Vec<MmStackKey> =
            self.source.all_mm_stacks().into_iter().map(|(k, _)| k).filter(|k| live.contains(&k.tgid)).collect();
        let site_ids: crate::hash::HashSet<u32> =
            sites.iter().filter_map(|k| u32::try_from(k.user_stack).ok()).collect();
        let site_stacks = self.source.drained_stacks_of(&crate::hash::HashSet::default(), site_ids);
        let comm = |pid: u32| self.table.get(pid).map_or("?", |p| p.comm.as_str()).to_string();
        let top: Vec<String> = rows
            .iter()
            .take(6)
            .map(|r| {
                format!(
                    "{}({}{}): log {}/{} regions, {} keys, {} own stacks, {} maps",
                    r.0,
                    comm(r.0),
                    if r.1 { "" } else { ", exited" },
                    r.2,
                    r.3,
                    r.4,
                    r.5,
                    r.6
                )
            })
            .collect();
        log::debug!(
            target: "vmtrace::weights",
            "live [procs, log entries, log regions, keys, own stacks] {:?}, exited {:?}, keys of processes not in the table {not_in_table}; \
             live call sites {} naming {site_stacks} drained stacks, sealed call sites {:?}; \
             unwound (ids, stacks, pinned) {:?}; retired kept (stacks, sites, (user, kernel, other names, stacks)) {:?}; heaviest: {}",
            sums[1],
            sums[0],
            sites.len(),
            self.syms.sealed_sites_sizes(),
            self.native.sizes(),
            self.syms.sizes(),
            top.join("; ")
        );
    }

    /// With `RUST_LOG=vmtrace::weights=debug`, at the end: the drained
    /// stacks held for processes not alive, by where those processes are
    /// (exited a moment ago and not retired yet, retired and kept as their
    /// own rows, anything else), to tell which one holds them.
    fn log_held_at_end(&self, live: &crate::hash::HashSet<u32>) {
        if !log::log_enabled!(target: "vmtrace::weights", log::Level::Debug) {
            return;
        }
        let retiring: crate::hash::HashSet<u32> = self.retiring.iter().map(|r| r.0).collect();
        let unfolded: crate::hash::HashSet<u32> = self.unfolded.iter().map(|u| u.0).collect();
        let mut rest = crate::hash::HashSet::default();
        for (tgid, _, _) in self.source.drained_by_tgid() {
            if !live.contains(&tgid) && !retiring.contains(&tgid) && !unfolded.contains(&tgid) {
                rest.insert(tgid);
            }
        }
        let held =
            |set: &crate::hash::HashSet<u32>| self.source.drained_stacks_of(set, crate::hash::HashSet::default());
        let now = Instant::now();
        let young = self.retiring.iter().filter(|r| now.saturating_duration_since(r.1) < RETIRE_AFTER).count();
        let heaviest: Vec<String> = {
            let mut v: Vec<(u32, usize)> = self
                .source
                .drained_by_tgid()
                .into_iter()
                .filter(|(t, _, _)| !live.contains(t))
                .map(|(t, k, _)| (t, k))
                .collect();
            v.sort_by_key(|r| std::cmp::Reverse(r.1));
            v.iter()
                .take(8)
                .map(|&(t, k)| {
                    let comm = self.table.get(t).map_or("?", |p| p.comm.as_str());
                    let state = if retiring.contains(&t) {
                        "retiring"
                    } else if unfolded.contains(&t) {
                        "unfolded"
                    } else if self.table.get(t).is_some_and(|p| p.released) {
                        "released"
                    } else {
                        "retired"
                    };
                    format!("{t}({comm}, {state}): {k} keys")
                })
                .collect()
        };
        log::debug!(
            target: "vmtrace::weights",
            "at the end, drained stacks of processes not alive: retiring {} ({} exited under {:?} ago) hold {}, \
             retired and waiting to be folded {} hold {}, others (retired) {} hold {}; heaviest: {}",
            retiring.len(),
            young,
            RETIRE_AFTER,
            held(&retiring),
            unfolded.len(),
            held(&unfolded),
            rest.len(),
            held(&rest),
            heaviest.join("; ")
        );
    }

    /// Lets go of the drained stacks nothing refers to any more
    /// (`Drained::sweep`): what the session holds besides the counts is
    /// every call site not folded away, every resident page and snapshot,
    /// and what the placement trackers name at the end. (With the Perfetto
    /// trace every stack is kept for the end: not called.)
    fn sweep_stacks(&mut self, now: Instant) {
        self.last_sweep = now;
        let in_use = self.stack_ids_held();
        let t = Instant::now();
        // In drains (one a tick).
        let min_age = (self.opts.stack_sweep.as_millis() / STORM_TICK.as_millis()).max(10) as u64;
        let swept = self.source.sweep_stacks(in_use, min_age);
        let unwound = if swept > 0 { self.forget_unwound() } else { 0 };
        log::debug!(
            target: "vmtrace::release",
            "swept {swept} drained stacks nothing refers to in {:?}; unwound stacks of {unwound} ids let go, {} ids held",
            t.elapsed(),
            self.native.ids_held()
        );
    }

    /// The stack ids the session refers to besides the drained counts:
    /// call sites not folded away, resident pages and snapshots, and what
    /// the placement trackers name at the end.
    fn stack_ids_held(&self) -> crate::hash::HashSet<u32> {
        let id = |s: i32| u32::try_from(s).ok();
        let mut in_use: crate::hash::HashSet<u32> =
            self.retired_mm.iter().filter_map(|(k, _)| id(k.user_stack)).collect();
        in_use.extend(self.mm_waiting.values().flatten().filter_map(|(k, _)| id(k.user_stack)));
        if let Some(r) = self.resident.as_ref() {
            in_use.extend(r.stack_ids(|_| true));
        }
        if let Some(p) = self.placement.as_ref() {
            in_use.extend(p.stack_ids());
        }
        in_use
    }

    /// Every `stack_seal` once more than its threshold of drained stacks
    /// are held: the keys of live processes that no drain added to for
    /// the sealing's period (5 s) are taken out of the drained tables,
    /// symbolized with the unwound stacks their ids have now and added to
    /// each process's sealed shapes (`symbols::Sealed`); then the drained
    /// stacks only they were counted under go (`forget_stacks`, nothing
    /// gone: those of the kernel's keys, call sites, resident pages and
    /// placements stay). Without it, a process that lives on (a compiler,
    /// a server) held every stack it was ever counted under until its exit
    /// (a rustc 3,709 keys after 4 minutes). Within `RELEASE_BUDGET`; not
    /// with the Perfetto trace (which keeps every stack for the end).
    fn seal_live(&mut self, now: Instant) {
        let (every, above) = self.opts.stack_seal;
        if self.opts.stacks.is_none()
            || self.trace.is_some()
            || every.is_zero()
            || now.saturating_duration_since(self.last_seal) < every
        {
            return;
        }
        self.last_seal = now;
        if self.source.drained_stacks().1 < above {
            return;
        }
        let t = Instant::now();
        // In drains (one a tick): as long as the sealing's period.
        let min_age = ((every.as_millis() / STORM_TICK.as_millis()) as u64).max(SEAL_MIN_AGE);
        let live = self.live_pids();
        // Where the sealing's time went, and the stack maps' drains made
        // meanwhile (`RUST_LOG=vmtrace::release=debug`).
        let mut drains = 0;
        let (sites, mut ids) = self.seal_sites(&live, &mut drains);
        let sites_in = t.elapsed();
        let (mut keys, mut procs) = (0, 0);
        for pid in live {
            if t.elapsed() >= RELEASE_BUDGET {
                break;
            }
            let raw = self.source.take_settled_counts(pid, min_age);
            if raw.is_empty() {
                continue;
            }
            keys += raw.len();
            procs += 1;
            ids.extend(raw.iter().filter_map(|(k, _)| u32::try_from(k.user_stack).ok()));
            self.unwound_sealed
                .extend(raw.iter().filter(|(k, _)| k.user_stack >= 0).map(|(k, _)| (k.tgid, k.user_stack)));
            drains += self.seal_slices(raw, true);
        }
        let keys_in = t.elapsed();
        if keys == 0 && sites == 0 {
            return;
        }
        // Between the phases not sliced (the walk of the resident pages,
        // their re-keying, the letting go), the stack maps drained when due.
        drains += usize::from(self.keep_up_if_due());
        // The resident pages (and snapshots) owned by those stacks, in any
        // process not released (a fork child's inherited pages name its
        // parent's ids), take their stacks as owner shapes: else they held
        // the stacks (4,117 keys sealed, 13 stacks let go, with the default
        // events). So do the pages whose stacks no key counts under: a
        // page of the address sample has its fault's stack walked whether
        // or not the fault was in the stack sample (beside the churn loop,
        // 21,098 drained stacks were held for live processes at the end,
        // their keys ~900).
        let table = &self.table;
        let unreleased: crate::hash::HashSet<u32> =
            table.iter().filter(|(_, i)| !i.released).map(|(p, _)| *p).collect();
        let counted: crate::hash::HashSet<u32> =
            self.source.stack_keys_of(&unreleased).iter().filter_map(|k| u32::try_from(k.user_stack).ok()).collect();
        let owner_keys = self.resident.as_ref().map(|r| {
            let settled = |id: i32| u32::try_from(id).is_ok_and(|id| ids.contains(&id) || !counted.contains(&id));
            r.owners_to_shape(|p| table.get(p).is_none_or(|i| !i.released), settled)
        });
        drains += usize::from(self.keep_up_if_due());
        let found_in = t.elapsed();
        let (owners, d) = self.shape_owners(owner_keys.unwrap_or_default());
        drains += d + usize::from(self.keep_up_if_due());
        let owners_in = t.elapsed();
        let users = crate::loader::StackUsers {
            gone: crate::hash::HashSet::default(),
            also: ids,
            in_use: self.stack_ids_held(),
        };
        let table = &self.table;
        let forgot = self.source.forget_stacks(&users, &|t| table.get(t).is_none_or(|p| !p.released));
        self.sealed_stacks += forgot as u64;
        let unwound = self.forget_unwound();
        self.gc_owner_shapes();
        log::debug!(
            target: "vmtrace::release",
            "sealed {keys} settled keys of {procs} live processes and {sites} settled call sites in {:?} \
             (sites by {sites_in:?}, keys by {keys_in:?}, owners found by {found_in:?}, shaped by {owners_in:?}; \
             {drains} stack drains between): {forgot} drained stacks let go, the unwound stacks of {unwound} ids \
             ({} ids held); (processes, shapes) sealed {:?}, (processes, call sites) {:?}; \
             {owners} resident owners made shapes, {} held",
            t.elapsed(),
            self.native.ids_held(),
            self.syms.sealed().sizes(),
            self.syms.sealed_sites_sizes(),
            self.syms.owner_shapes_held()
        );
    }

    /// Lets go of the unwound stacks (`NativeStacks::forget_ids`) of the
    /// sealed keys and call sites (`unwound_sealed`) whose drained stack is
    /// gone (`forget_stacks` or `sweep_stacks` let it go: nothing counts
    /// under the id, no page or call site names it). Those still held
    /// (another key counts under the id, a page names it, or it was stored
    /// again) wait for a later sealing or sweep. Returns how many ids went.
    fn forget_unwound(&mut self) -> usize {
        if self.unwound_sealed.is_empty() {
            return 0;
        }
        let source = &self.source;
        let mut gone = Vec::new();
        self.unwound_sealed.retain(|&(tgid, id)| {
            let held = source.user_stack_ips(id).is_some();
            if !held {
                gone.push((tgid, id));
            }
            held
        });
        self.unwound_sealed.shrink_if_sparse();
        self.native.forget_ids(&gone)
    }

    /// The call sites (`MM_STACKS`) of the live processes `live` whose
    /// calls and IPIs did not change since the last sealing are taken out
    /// of the kernel's map and sealed (`symbols::Symbols::seal_sites`):
    /// else each held its stack id, and so its drained stack, until its
    /// process exited (a Python program that maps from a new function
    /// every 25 ms held ~14,000 beside the churn loop; the map holds
    /// 16,384). A site called again later is a new key, counted from 0.
    /// Not those of a process a storm or an OOM kill names (the end names
    /// their culprits by stack id). Returns how many were sealed, and
    /// their stack ids.
    /// `drains`: the stack maps' drains between its slices are added.
    fn seal_sites(&mut self, live: &[u32], drains: &mut usize) -> (usize, crate::hash::HashSet<u32>) {
        if !self.opts.families.mmap {
            return (0, crate::hash::HashSet::default());
        }
        let live: crate::hash::HashSet<u32> =
            live.iter().copied().filter(|p| !self.named_by_storm_or_oom(*p)).collect();
        let now: HashMap<MmStackKey, MmStackCounts> =
            self.source.all_mm_stacks().into_iter().filter(|(k, _)| live.contains(&k.tgid)).collect();
        let settled: Vec<MmStackKey> =
            now.iter().filter(|(k, c)| self.sites_seen.get(k) == Some(c)).map(|(k, _)| *k).collect();
        self.sites_seen = now;
        if settled.is_empty() {
            return (0, crate::hash::HashSet::default());
        }
        let mut ids = crate::hash::HashSet::default();
        let mut n = 0;
        // A slice at a time, the stack maps drained between when due.
        for settled in settled.chunks(SEAL_SLICE) {
            let raw = self.source.take_mm_sites(settled.to_vec());
            for (k, _) in &raw {
                self.sites_seen.remove(k);
                // A site called again starts from 0: no baseline for storms.
                if let Some(m) = self.last_sites.get_mut(&k.tgid) {
                    m.remove(&(k.call, k.user_stack));
                }
            }
            ids.extend(raw.iter().filter_map(|(k, _)| u32::try_from(k.user_stack).ok()));
            self.unwound_sealed
                .extend(raw.iter().filter(|(k, _)| k.user_stack >= 0).map(|(k, _)| (k.tgid, k.user_stack)));
            n += raw.len();
            let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
            self.syms.seal_sites(raw, table, source, native, py);
            *drains += usize::from(self.keep_up_if_due());
        }
        self.sites_seen.shrink_if_sparse();
        (n, ids)
    }

    /// Makes the resident owners `keys` (`ResidentTracker::owners_to_shape`;
    /// their processes' maps still held) owner shapes
    /// (`resident::Owner::shape`): symbolized now, with the unwound stacks
    /// and maps of now, `SEAL_SLICE` keys at a time, the stack maps
    /// drained between slices when due (`keep_up_if_due`). Returns how many
    /// owner keys were, and the drains made.
    fn shape_owners(&mut self, keys: crate::hash::HashSet<symbols::SymKey>) -> (usize, usize) {
        if self.resident.is_none() || keys.is_empty() {
            return (0, 0);
        }
        // By process: a slice then symbolizes with few processes' maps
        // (each read and prepared once a slice). In the order of the set,
        // every slice named most of the processes holding pages: beside the
        // torch job's 128 workers waiting to be released, 3,805 owners took
        // 15.5 s in 15 slices.
        let mut keys: Vec<symbols::SymKey> = keys.into_iter().collect();
        keys.sort_unstable();
        let mut drains = 0;
        // The pages and snapshots are re-keyed once, after the last slice:
        // a walk of every page of the processes holding some, which re-keyed
        // after each slice took a third of the sealing's time (perf, the
        // torch job: 118 walks for 30,042 owners).
        let mut shapes = crate::hash::HashMap::default();
        for slice in keys.chunks(SEAL_SLICE) {
            let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
            shapes.extend(self.syms.owner_shapes(slice.to_vec(), table, source, native, py));
            drains += usize::from(self.keep_up_if_due());
        }
        if let Some(r) = self.resident.as_mut() {
            r.rekey(&shapes);
        }
        (keys.len(), drains)
    }

    /// Lets go of the owner shapes no page or snapshot refers to any more,
    /// once their number has doubled since the last time.
    fn gc_owner_shapes(&mut self) {
        let Some(r) = self.resident.as_ref() else { return };
        if self.syms.owner_shapes_held() < self.owner_shapes_gc_at {
            return;
        }
        let held = self.syms.retain_owner_shapes(&r.shape_ids());
        self.owner_shapes_gc_at = (2 * held).max(OWNER_SHAPES_GC_FIRST);
    }

    /// Whether stack keys are sealed (`seal_live`), and released processes'
    /// keys sealed as they are released (`release_retired`).
    fn sealing(&self) -> bool {
        self.opts.stacks.is_some() && self.trace.is_none() && !self.opts.stack_seal.0.is_zero()
    }

    /// A storm or an OOM kill names `pid`: its row is never folded, and its
    /// maps stay for the end to name its culprit.
    fn named_by_storm_or_oom(&self, pid: u32) -> bool {
        self.storms.in_storm(pid)
            || self.storms.closed.iter().any(|s| s.pid == pid)
            || self.flight.ooms().iter().any(|o| o.victim_pid == pid || o.trigger_pid == pid)
    }

    /// Symbolizes what the end will need of retired processes' maps (their
    /// fault stacks, call sites and resident owners), then lets go of the
    /// maps, unwound stacks and Python code objects: of an exited process
    /// the collector then holds its counts, identity and named stacks.
    /// Processes a storm or an OOM kill names keep theirs (the end names
    /// their culprits), as does every process when the Perfetto trace is
    /// kept (it names call sites at the end).
    fn release_retired(&mut self, batch: &crate::hash::HashSet<u32>) {
        if self.trace.is_some() {
            return;
        }
        let pids: crate::hash::HashSet<u32> =
            batch.iter().copied().filter(|p| !self.named_by_storm_or_oom(*p)).collect();
        if pids.is_empty() {
            return;
        }
        let sealing = self.sealing();
        if sealing {
            // Their counts summed by shape, their resident owners made
            // shapes: the drained stacks of an exited process kept as a row
            // (a heavy one, or one waiting to be folded) go now, and what it
            // holds is its distinct shapes (within `MAX_SEALED`), not every
            // key it was counted under (2,137 keys of exited processes at
            // 30 s, 8,157 at 270 s beside the churn loop, before).
            let raw = self.source.take_stack_counts(&pids);
            self.released_ids.extend(raw.iter().filter_map(|(k, _)| u32::try_from(k.user_stack).ok()));
            let t = Instant::now();
            let n = raw.len();
            self.seal_slices(raw, false);
            // The stacks of their pages go with them (as their keys'), not
            // at the next sweep.
            if let Some(r) = self.resident.as_ref() {
                self.released_ids.extend(r.stack_ids(|p| pids.contains(&p)));
            }
            let keys = self.resident.as_ref().map(|r| r.owners_to_shape(|p| pids.contains(&p), |_| true));
            let (owners, _) = self.shape_owners(keys.unwrap_or_default());
            log::trace!(
                target: "vmtrace::release",
                "{n} stack keys and {owners} resident owners of {} processes sealed in {:?}",
                pids.len(),
                t.elapsed()
            );
        }
        let (table, source, native, py) = (&mut self.table, &self.source, &self.native, &self.python.codes);
        if self.opts.stacks.is_some() && !sealing {
            let mut keys: Vec<symbols::SymKey> = source.stack_keys_of(&pids).iter().map(symbols::sym_key).collect();
            if let Some(r) = &self.resident {
                keys.extend(r.owner_keys(&pids));
            }
            let t = Instant::now();
            let n = keys.len();
            self.syms.keep_stacks(keys, table, source, native, py);
            log::trace!(target: "vmtrace::release", "{} stack keys of {} processes in {:?}", n, pids.len(), t.elapsed());
        }
        if self.opts.families.mmap {
            let taken: Vec<_> = pids.iter().filter_map(|p| self.mm_waiting.remove(p)).flatten().collect();
            let (table, source) = (&mut self.table, &self.source);
            let t = Instant::now();
            self.syms.keep_sites(taken.iter().map(|(k, _)| (k.tgid, k.call, k.user_stack)), table, source, native, py);
            log::trace!(target: "vmtrace::release", "{} call sites in {:?}", taken.len(), t.elapsed());
            self.retired_mm.extend(taken);
        }
        self.release_slices += 1;
        if self.release_slices.is_multiple_of(CLOSE_OBJECTS_EVERY) {
            self.syms.close_objects();
        }
        self.table.release(&pids);
        self.native.forget_retired(&pids);
        self.unwound_sealed.retain(|(t, _)| !pids.contains(t));
        self.python.codes.forget_retired(&pids);
        self.released += pids.len() as u64;
    }

    /// `build_regions` for live processes only.
    pub(crate) fn build_live_regions(&mut self) -> Attributed {
        let live = self.table.live_pids().clone();
        attribute::build_regions_of(&mut self.table, &self.source, &mut self.starts, |pid| live.contains(&pid))
    }

    /// Frames of a call site, outermost first, the syscall as leaf.
    pub(crate) fn site_frames(&mut self, names: &mut Names, tgid: u32, call: u32, user_stack: i32) -> Vec<String> {
        let native = self.native.dominant(tgid, user_stack);
        let py = &self.python.codes;
        symbols::site_frames(&mut self.table, &self.source, names, (tgid, call, user_stack), native, py)
    }

    /// A storm's culprit: its call site's frames without libc's syscall
    /// wrappers (`symbols::culprit_frames`).
    pub(crate) fn culprit_frames(&mut self, names: &mut Names, tgid: u32, call: u32, user_stack: i32) -> Vec<String> {
        symbols::culprit_frames(self.site_frames(names, tgid, call, user_stack))
    }

    /// Locked and pinned memory and NUMA placement into the summary, the
    /// pages per node into the trace log.
    fn finish_placement(
        &mut self,
        summary: &mut crate::model::Summary,
        trace: Option<&mut crate::model::trace::TraceLog>,
    ) {
        let Some(placement) = self.placement.take() else { return };
        let live: Vec<u32> = self.table.live_pids().iter().copied().collect();
        let comms: HashMap<u32, String> = self.table.iter().map(|(p, i)| (*p, i.comm.clone())).collect();
        let comm_of = |pid: u32| comms.get(&pid).cloned().unwrap_or_default();
        let (started, started_ns) = (self.started, self.started_mono_ns);
        let since = move |ts: u64| ts.saturating_sub(started_ns) as f64 / 1e9;
        let mut names = Names::default();
        let mut frames = |pid: u32, call: u32, stack: i32| self.site_frames(&mut names, pid, call, stack);
        placement.finish(summary, trace, (started, &live), &comm_of, &mut frames, &since);
    }

    /// Reads the aggregates one last time and builds the summary.
    pub fn finish(self, target: TargetInfo) -> Finished {
        self.finish_with(target, Instant::now)
    }

    /// `finish` with its clock given (tests).
    fn finish_with(mut self, target: TargetInfo, now: impl Fn() -> Instant) -> Finished {
        self.drain_at(now());
        // The last, partial interval.
        self.tick(now());
        self.trace_interval();
        self.resident_counters(now());
        let while_recording = self.folded.processes();
        super::log_own_memory("the last tick");
        self.fold_before_end();
        super::log_own_memory("folding the retired");
        let families = self.opts.families;
        if self.wants_python() {
            self.python.tick(now(), &self.table, &mut self.source);
        }
        let native = &self.native;
        let py = &self.python.codes;
        let stacks = if self.opts.stacks.is_some() {
            let mut stacks = symbols::build_stacks(&mut self.table, &self.source, native, py, &mut self.syms);
            let table = &mut self.table;
            stacks.extend(self.syms.sealed_stacks(|_| true, &mut |pid| table.ensure(pid).comm.clone()));
            stacks
        } else {
            Vec::new()
        };
        super::log_own_memory("the fault stacks");
        let mm_sites = if families.mmap {
            let mut raw = std::mem::take(&mut self.retired_mm);
            raw.extend(std::mem::take(&mut self.mm_waiting).into_values().flatten());
            raw.extend(self.source.all_mm_stacks());
            let mut sites = symbols::build_mm_sites(raw, &mut self.table, &self.source, native, py, &mut self.syms);
            let table = &mut self.table;
            sites.extend(self.syms.sealed_sites(|_| true, &mut |pid| table.ensure(pid).comm.clone()));
            sites
        } else {
            Vec::new()
        };
        let storms = families.tlb.then(|| {
            let raw = std::mem::replace(&mut self.storms, StormDetector::new(f64::MAX)).finish();
            symbols::name_storms(&mut self.table, &self.source, native, py, raw)
        });
        let trace = self.trace.take().map(|t| {
            let (source, table) = (&self.source, &mut self.table);
            tracelog::finish(t, table, source, native, py, monotonic_ns())
        });
        super::log_own_memory("call sites, storms, trace");
        let leaf = stacks.iter().any(|s| s.leaf.is_some());
        // The drained stacks of the processes alive at the end: theirs to hold.
        let live: crate::hash::HashSet<u32> = self.table.live_pids().iter().copied().collect();
        let live_ids = self.resident.as_ref().map(|r| r.stack_ids(|p| live.contains(&p))).unwrap_or_default();
        let held_of_live = self.source.drained_stacks_of(&live, live_ids);
        self.log_held_at_end(&live);
        let resident = self.build_resident(leaf);
        super::log_own_memory("the resident profiles");
        let attributed = families.regions.then(|| self.build_regions());
        super::log_own_memory("the regions");
        let mm = self.mm_totals();
        let duration_s = self.seconds_at(self.stopped.unwrap_or_else(&now));
        let stats = self.stats_totals();
        let drops = self.source.drops();
        let drop_kinds = drops.clone();
        let counted = assemble::counted_pids(&stats, &mm);
        let pids = assemble::summary_pids(&target, counted, self.table.pids(), process::is_thread);
        let processes = pids.into_iter().map(|pid| (pid, self.table.ensure(pid).clone())).collect();
        let mut finished = assemble::assemble(Inputs {
            target,
            duration_s,
            families,
            minor_period: self.minor_period,
            populated_seen: self.source.populated_seen(),
            fast_period: self.fast_period,
            stack_mode: self.opts.stacks,
            processes,
            stats,
            mm,
            stacks,
            mm_sites,
            storms,
            attributed,
            ooms: self.flight.take_ooms(),
            timeline: self.timeline.take(),
            drops,
            malformed_events: self.malformed_events,
            unwound_samples: self.native.samples,
            python_native_only: std::mem::take(&mut self.python.unknown),
            python_unnamed: self.python.codes.unnamed(),
            probes: self.source.probe_info(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().into(),
            folded: (self.folded.processes() > 0).then(|| std::mem::take(&mut self.folded)),
        });
        if let Some(t) = &trace {
            finished.summary.drops.trace_events += t.dropped;
        }
        self.note_folding_and_stacks(&mut finished.summary, while_recording, &drop_kinds, held_of_live);
        super::log_own_memory("the summary");
        finished.trace = trace;
        self.finish_placement(&mut finished.summary, finished.trace.as_mut());
        if let Some(r) = resident {
            super::resident::apply(&mut finished.summary, &r, &self.source.drops());
            finished.resident = Some(r);
        }
        finished
    }

    /// The end's notes on folding (how many processes "other" sums, of
    /// which `while_recording` were folded as they retired) and on the
    /// stacks lost, drained and swept.
    fn note_folding_and_stacks(
        &self,
        summary: &mut crate::model::Summary,
        while_recording: u64,
        drop_kinds: &[u64],
        held_of_live: usize,
    ) {
        if let Some(other) = summary.processes.iter().find(|p| p.pid == crate::model::OTHER_PID && p.folded > 0) {
            summary.folding = Some(crate::model::Folding {
                below_pct: self.opts.fold_below,
                processes: other.folded,
                regions: 0,
                while_recording,
            });
        }
        if let Some(st) = summary.stacks.as_mut() {
            let by_kind = |k: vmtrace_common::DropKind| drop_kinds.get(k as usize).copied().unwrap_or(0);
            st.lost_not_stored = by_kind(vmtrace_common::DropKind::StackLost);
            st.lost_not_counted = by_kind(vmtrace_common::DropKind::StackCountsFull);
            (st.shared_id_faults, st.drained_stacks, _) = self.source.drained_stacks();
            st.swept_stacks = self.source.swept_stacks();
            st.drained_stacks_of_live = held_of_live;
            let sealed = self.syms.sealed();
            (st.sealed_keys, st.sealed_stacks, st.sealed_shapes) = (sealed.keys, self.sealed_stacks, sealed.sizes().1);
        }
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;

/// `granules`, sorted by process, in the slices they are placed in:
/// `PLACE_SLICE` processes at most, and no more once `PLACE_GRANULES`
/// granules are in the slice; a process's granules are never split.
fn place_slices(
    granules: &[(vmtrace_common::GranuleKey, vmtrace_common::GranuleCounts)],
) -> impl Iterator<Item = &[(vmtrace_common::GranuleKey, vmtrace_common::GranuleCounts)]> {
    let mut rest = granules;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut end, mut pids) = (0, 0);
        while end < rest.len()
            && ((pids < PLACE_SLICE && end < PLACE_GRANULES) || rest[end].0.tgid == rest[end - 1].0.tgid)
        {
            if end == 0 || rest[end].0.tgid != rest[end - 1].0.tgid {
                pids += 1;
            }
            end += 1;
        }
        let (slice, more) = rest.split_at(end);
        rest = more;
        Some(slice)
    })
}

/// The processes of `waiting` (pid, exit time) that exited `RETIRE_AFTER`
/// ago or more and `free` lets go; they leave `waiting`.
/// The exited processes that cannot retire yet because a child of theirs
/// is still to be placed (its first faults are in its parent's mappings):
/// the parents of live processes, and of exited ones that do not retire
/// in this pass (too young, a CPU still counting into them, or needed
/// themselves). A child that retires in the same pass is placed with its
/// parent's history still held (a batch is placed before any of it is
/// released), so a chain that exited together (rustc, cc, collect2, ld)
/// retires in one pass: it took one pass a generation, a second each,
/// and a compiler that linked in a recording's last seconds held its
/// stacks at the end (`sizes` `nothing_is_lost_beside_heavy_process_churn`).
fn still_needed(
    live: impl Iterator<Item = u32>,
    retiring: &[(u32, Instant)],
    now: Instant,
    in_flight: &crate::hash::HashSet<u32>,
    parent: impl Fn(u32) -> Option<u32>,
) -> crate::hash::HashSet<u32> {
    let mut needed: crate::hash::HashSet<u32> = live.filter_map(&parent).collect();
    loop {
        let more: Vec<u32> = retiring
            .iter()
            .filter(|(pid, at)| {
                now.saturating_duration_since(*at) < RETIRE_AFTER || in_flight.contains(pid) || needed.contains(pid)
            })
            .filter_map(|(pid, _)| parent(*pid))
            .filter(|p| !needed.contains(p))
            .collect();
        if more.is_empty() {
            return needed;
        }
        needed.extend(more);
    }
}

fn take_ready(
    waiting: &mut Vec<(u32, Instant)>,
    now: Instant,
    free: impl Fn(u32) -> bool,
) -> crate::hash::HashSet<u32> {
    let mut batch = crate::hash::HashSet::default();
    waiting.retain(|(pid, at)| {
        let ready = now.saturating_duration_since(*at) >= RETIRE_AFTER && free(*pid);
        if ready {
            batch.insert(*pid);
        }
        !ready
    });
    batch
}

/// The processes that started before the trace: their `/proc/PID/status`
/// once per address space, for the members no event changed (the classic
/// tracepoint's entry starts from one) and the peak before the trace
/// (`VmHWM`). uc30: a `-p` target mapping a file had file_bytes 0 and its
/// peak from the trace's start only.
fn fill_unseen(r: &mut super::resident::ResidentTracker) {
    for pid in r.status_wanted() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
        r.fill_unseen(pid, status.as_deref());
    }
}
