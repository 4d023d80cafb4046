//! The process table: who was traced, with what name, parent and exit status.
//! Built from the kernel's task events while processes live, so short-lived
//! ones keep their identity after they are gone.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    sync::Arc,
};

use vmtrace_common::{EventKind, FaultStats, TaskEvent};

use crate::model::{comm_str, Identity};
use crate::{model::KernelAccounting, target::shell_status};

// `exited`, `retired` and `released` are stages of one life (an enum would
// say so; 36 uses read them as bools today) and `maps_stale` is apart.
#[allow(clippy::struct_excessive_bools)]
#[derive(Clone, Debug)]
pub struct ProcInfo {
    pub ppid: Option<u32>,
    pub comm: String,
    pub cmdline: Option<String>,
    pub exit_code: Option<i32>,
    pub kernel: Option<KernelAccounting>,
    /// Fault aggregate taken from the kernel when the process exited.
    pub stats: Option<FaultStats>,
    /// Its memory cgroup, read while it lived (for OOM reports).
    pub cgroup: Option<(crate::oom::CgroupVersion, String)>,
    /// Its cgroup, container, pod and rank (`crate::identity`): read at its
    /// exec (a new environment) or when first seen, inherited at fork.
    /// `None`: not read yet; an empty identity: read, nothing known.
    pub identity: Option<Arc<Identity>>,
    /// Its memory map, read while it lived (to symbolize its stacks after it exits).
    pub maps: Vec<crate::procmaps::Region>,
    pub maps_read: Option<std::time::Instant>,
    /// Its address-space generation at the last maps read, when the kernel
    /// counts them: the same generation later means the same maps.
    pub maps_gen: Option<u32>,
    /// It mapped something (a library, JIT code) or exec'd since its maps
    /// were read: an unwinder missing its code may read them again at once.
    pub maps_stale: bool,
    /// When vmtrace first heard of it.
    pub first_seen: std::time::Instant,
    /// The root its paths are relative to, when not this process's (a
    /// container, a chroot): held open to name its files after it exits.
    pub root: Option<Arc<crate::procmaps::root::RootDir>>,
    /// Whether `root` was looked at (at its first maps read after an exec).
    pub root_checked: bool,
    /// Regions it mapped, from mapping-change events (newest last, bounded):
    /// they stay known after they are unmapped or the process is gone.
    pub mapped: crate::procmaps::MappedRegions,
    /// A region of `mapped` or `maps` is named only by its file's (device,
    /// inode): `ProcessTable::name_files` looks for its path again.
    pub unnamed_files: bool,
    /// mmap/TLB aggregate taken from the kernel when it exited.
    pub mm: Option<vmtrace_common::MmStats>,
    /// Its mapping changes and maps reads, by address-space generation: where
    /// each fault is placed (regions/history.rs).
    pub history: crate::regions::history::History,
    /// Execs seen while traced: what ran before one is another program.
    pub execs: u32,
    /// Its group's exit was seen.
    pub exited: bool,
    /// Its faults were placed in its regions after its exit, and its
    /// mapping history dropped (`Session::retire_exited`).
    pub retired: bool,
    /// Its maps and mapping log were let go after its stacks were symbolized
    /// (`Session::retire_exited`): they are not read again.
    pub released: bool,
    /// What its COW faults copied, when its regions were folded into the
    /// other process's as it retired (they no longer carry its pid).
    pub cow_from: Option<crate::model::CowFrom>,
    /// Its program break as the last `brk` returned it (a forked child
    /// starts from its parent's; an exec forgets it).
    pub brk: Option<u64>,
    /// `brk` calls that moved the break down: heap trims (glibc's free and
    /// malloc_trim give the heap top back this way). Calls that grow the
    /// heap or only ask where the break is are not counted.
    pub brk_shrinks: u64,
}

impl Default for ProcInfo {
    fn default() -> Self {
        Self {
            ppid: None,
            comm: String::new(),
            cmdline: None,
            exit_code: None,
            kernel: None,
            stats: None,
            cgroup: None,
            identity: None,
            maps: Vec::new(),
            maps_read: None,
            maps_gen: None,
            maps_stale: false,
            first_seen: std::time::Instant::now(),
            root: None,
            root_checked: false,
            mapped: crate::procmaps::MappedRegions::default(),
            unnamed_files: false,
            mm: None,
            history: crate::regions::history::History::default(),
            execs: 0,
            exited: false,
            retired: false,
            released: false,
            cow_from: None,
            brk: None,
            brk_shrinks: 0,
        }
    }
}

/// Parents outside the table whose identity is kept (`outside_parents`).
const MAX_OUTSIDE_PARENTS: usize = 4096;

#[derive(Default)]
pub(crate) struct ProcessTable {
    procs: BTreeMap<u32, ProcInfo>,
    /// The processes not known to have exited: the periodic jobs (maps
    /// re-reads, Python detection) walk these, not every process the
    /// recording has seen, so their cost follows what is live.
    live: BTreeSet<u32>,
    /// Every distinct identity, kept once: the processes of a container share one.
    identities: HashSet<Arc<Identity>>,
    /// Identities of parents not in the table, read at a child's fork
    /// (`parents_identity`); dropped at their exec or exit.
    outside_parents: HashMap<u32, Arc<Identity>>,
    /// Mapped files' paths, named once for every process mapping them.
    file_names: FileNames,
    /// Programs' and loaders' segments, laid out at exec.
    exec_images: crate::procmaps::exec_image::ExecImages,
    /// Roots of processes in other mount namespaces, held open.
    roots: crate::procmaps::root::Roots,
    /// The last `maps_for_stacks`, by (pid, maps, mapped, read).
    #[allow(clippy::type_complexity, reason = "a one-entry cache")]
    stack_maps:
        std::cell::RefCell<Option<((u32, usize, usize, Option<std::time::Instant>), Arc<[crate::procmaps::Region]>)>>,
}

/// Reading the table, and the changes the session makes to it besides the
/// task and mapping events (`ProcessTable::apply` and friends): every
/// change of an entry goes through a method here.
impl ProcessTable {
    /// What the table knows of `pid`.
    pub(crate) fn get(&self, pid: u32) -> Option<&ProcInfo> {
        self.procs.get(&pid)
    }

    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Every process seen (and not forgotten), by pid.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u32, &ProcInfo)> {
        self.procs.iter()
    }

    /// The pids of [`Self::iter`].
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// The pids of the processes not known to have exited.
    pub(crate) fn live_pids(&self) -> &BTreeSet<u32> {
        &self.live
    }

    /// Records who started `pid` (a command vmtrace spawned).
    pub(crate) fn set_parent(&mut self, pid: u32, ppid: u32) {
        self.procs.entry(pid).or_default().ppid = Some(ppid);
    }

    /// The kernel's own fault counts of `pid` (its exit, or the command's rusage).
    pub(crate) fn set_kernel_accounting(&mut self, pid: u32, k: crate::model::KernelAccounting) {
        self.procs.entry(pid).or_default().kernel = Some(k);
    }

    pub(crate) fn set_cgroup(&mut self, pid: u32, cgroup: (crate::oom::CgroupVersion, String)) {
        self.procs.entry(pid).or_default().cgroup = Some(cgroup);
    }

    /// Adds an exited process's final aggregates, taken out of the kernel's maps.
    pub(crate) fn add_final_counts(
        &mut self,
        pid: u32,
        stats: Option<&vmtrace_common::FaultStats>,
        mm: Option<&vmtrace_common::MmStats>,
    ) {
        use vmtrace_common::Merge as _;
        let p = self.procs.entry(pid).or_default();
        if let Some(m) = mm {
            p.mm.get_or_insert_with(Default::default).merge(m);
        }
        if let Some(s) = stats {
            p.stats.get_or_insert_with(Default::default).merge(s);
        }
    }

    /// Where an exited process's copy-on-write faults came from, once its
    /// regions are placed and folded.
    pub(crate) fn set_cow_from(&mut self, pid: u32, cow: Option<crate::model::CowFrom>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.cow_from = cow;
        }
    }

    /// An exited process whose faults are placed: its mapping log goes.
    /// Lets go of the memory maps of retired processes whose stacks were
    /// symbolized: what is kept of them is their counts and identity.
    pub(crate) fn release(&mut self, pids: &crate::hash::HashSet<u32>) {
        for pid in pids {
            if let Some(p) = self.procs.get_mut(pid) {
                p.released = true;
                p.root = None;
                p.maps = Vec::new();
                p.mapped = crate::procmaps::MappedRegions::default();
            }
        }
    }

    /// Forgets the released processes `pids` (folded away: the summary
    /// holds them in its other process row).
    pub(crate) fn remove(&mut self, pids: &crate::hash::HashSet<u32>) {
        for pid in pids {
            self.procs.remove(pid);
            self.live.remove(pid);
        }
    }

    pub(crate) fn mark_retired(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.retired = true;
            p.history.forget_log();
        }
    }

    /// `pid`'s identity, read from /proc the first time it is asked for
    /// (a process the trace has not seen start or exec). One gone or
    /// exiting before it was read (its /proc unreadable, or showing the
    /// root cgroup as it exits) takes its nearest known ancestor's, which
    /// it inherited at its fork (`ancestors_identity`); with none known, an
    /// exited one has none and one exiting an empty identity.
    pub(crate) fn identify(&mut self, pid: u32) -> Option<Arc<Identity>> {
        if let Some(id) = self.procs.get(&pid).and_then(|p| p.identity.clone()) {
            return Some(id);
        }
        let exited = self.procs.get(&pid).is_some_and(|p| p.exited);
        let read = if exited { None } else { crate::identity::read(pid) };
        let id = match read {
            Some(id) => self.intern(id),
            None => match self.ancestors_identity(pid) {
                Some(id) => {
                    log::debug!(target: "vmtrace::identity", "{pid} gone or exiting unread: its ancestor's identity");
                    id
                }
                None if exited => return None,
                // Exiting, its ancestors unknown: looked at again (its
                // exit, or its fork's event, may come with the next drain).
                None => return Some(self.intern(Identity::default())),
            },
        };
        self.procs.entry(pid).or_default().identity = Some(Arc::clone(&id));
        Some(id)
    }

    /// The identity a child of `ppid` inherits at its fork: the parent's,
    /// read now if not yet. A parent not in the table (it started before
    /// the trace and has not faulted since) is not added to it: what was
    /// read is kept aside for its next children until it execs or exits.
    fn parents_identity(&mut self, ppid: u32) -> Option<Arc<Identity>> {
        match self.procs.get(&ppid) {
            Some(pp) if pp.identity.is_some() || pp.exited => pp.identity.clone(),
            Some(_) => self.identify(ppid),
            None if ppid == 0 => None,
            None => {
                if let Some(id) = self.outside_parents.get(&ppid) {
                    return Some(Arc::clone(id));
                }
                let id = self.intern(crate::identity::read(ppid)?);
                if self.outside_parents.len() >= MAX_OUTSIDE_PARENTS {
                    self.outside_parents.clear();
                }
                self.outside_parents.insert(ppid, Arc::clone(&id));
                Some(id)
            }
        }
    }

    /// The identity of `pid`'s nearest ancestor in the table that has one,
    /// reading a live ancestor's from /proc if not read yet (at most
    /// `MAX_UP` generations up).
    fn ancestors_identity(&mut self, pid: u32) -> Option<Arc<Identity>> {
        const MAX_UP: usize = 8;
        let mut at = pid;
        for _ in 0..MAX_UP {
            let ppid = self.procs.get(&at)?.ppid.filter(|pp| *pp != 0 && *pp != at)?;
            let Some(parent) = self.procs.get(&ppid) else {
                // Not in the table (started before the trace, quiet since).
                return self.parents_identity(ppid);
            };
            if let Some(id) = parent.identity.clone() {
                return Some(id);
            }
            if !parent.exited {
                if let Some(id) = crate::identity::read(ppid) {
                    let id = self.intern(id);
                    self.procs.entry(ppid).or_default().identity = Some(Arc::clone(&id));
                    return Some(id);
                }
            }
            at = ppid;
        }
        None
    }

    /// Gives `pid` the identity `id`, as if read from /proc (tests).
    #[cfg(test)]
    pub(crate) fn set_identity(&mut self, pid: u32, id: Identity) {
        let id = self.intern(id);
        self.procs.entry(pid).or_default().identity = Some(id);
    }

    fn intern(&mut self, id: Identity) -> Arc<Identity> {
        if let Some(known) = self.identities.get(&id) {
            return Arc::clone(known);
        }
        let id = Arc::new(id);
        self.identities.insert(Arc::clone(&id));
        id
    }

    /// Forgets `pid` altogether (`top -a`: exited processes are not shown again).
    pub(crate) fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.live.remove(&pid);
    }
}

fn read_cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let parts: Vec<_> = raw.split(|&b| b == 0).filter(|p| !p.is_empty()).map(String::from_utf8_lossy).collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// (comm, ppid) from /proc/PID/stat; comm may hold spaces and parentheses.
fn read_stat(pid: u32) -> Option<(String, u32)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let ppid = s[close + 2..].split_whitespace().nth(1)?.parse().ok()?;
    Some((comm, ppid))
}

/// True when `pid` is a live thread that is not its group's leader.
pub(crate) fn is_thread(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse::<u32>().ok()))
        .is_some_and(|tgid| tgid != pid)
}

impl ProcessTable {
    /// Reads `pid`'s memory map now if it lives; a child without one of its own
    /// yet starts from its parent's (fork copies the address space). False
    /// when it could not be read (gone).
    pub(crate) fn snapshot_maps(&mut self, pid: u32) -> bool {
        self.snapshot_maps_at(pid, &|_| None)
    }

    /// As `snapshot_maps`; the read is also logged in the process's history
    /// when `gen_of` gives the same address-space generation before and
    /// after it (no mapping change was in flight).
    pub(crate) fn snapshot_maps_at(&mut self, pid: u32, gen_of: &dyn Fn(u32) -> Option<u32>) -> bool {
        let before = gen_of(pid);
        let read = crate::procmaps::read_with_files(pid);
        let after = gen_of(pid);
        let read_at_ns = crate::kernel::monotonic_ns();
        match read {
            Ok(m) if !m.is_empty() => {
                log::debug!(target: "vmtrace::maps", "maps of {pid} read: {} regions, {} executable, generation {before:?} → {after:?}", m.len(), m.iter().filter(|(r, _)| r.perms.contains('x')).count());
                if !self.procs.get(&pid).is_some_and(|p| p.exited) {
                    self.live.insert(pid);
                }
                if !self.procs.get(&pid).is_some_and(|p| p.root_checked) {
                    self.check_root(pid);
                }
                // Its paths name its files here unless it has another root.
                if self.root_of(pid).is_none() {
                    self.file_names.learn_maps(m.iter().map(|(r, id)| (r, *id)));
                }
                let m: Vec<crate::procmaps::Region> = m.into_iter().map(|(r, _)| r).collect();
                let p = self.procs.entry(pid).or_default();
                if let (Some(b), Some(a)) = (before, after) {
                    p.history.snapshot(a, &m, a == b, read_at_ns);
                }
                p.maps_gen = after.filter(|a| before == Some(*a));
                // Regions gone since the last read are history, not forgotten:
                // faults taken in them must still find them.
                for old in std::mem::replace(&mut p.maps, m) {
                    if !p.maps.iter().any(|r| r.start == old.start && r.end == old.end) {
                        p.mapped.insert(old);
                    }
                }
                p.maps_read = Some(std::time::Instant::now());
                p.maps_stale = false;
                // Once the read has replaced the maps: what is kept is
                // named (the read's own regions have their paths; the old
                // ones it did not replace are history now), and a
                // placeholder it replaced (same span) is not looked for.
                self.name_files(pid);
                true
            }
            _ => {
                // Only fork copies the parent's address space: after an
                // exec it is the new program's, which is not known. A
                // parent whose maps were never read (a shell script's bash
                // forking a subshell) is known from its exec's image and
                // its mapping events.
                let parent = self.procs.get(&pid).filter(|p| p.execs == 0).and_then(|p| p.ppid);
                let inherited = parent.and_then(|pp| self.procs.get(&pp)).map(maps_with_history);
                let p = self.procs.entry(pid).or_default();
                if p.maps.is_empty() {
                    p.maps = inherited.unwrap_or_default();
                }
                false
            }
        }
    }

    /// For a process whose maps can no longer be read (it exited before the
    /// collector re-read them): adds the regions its mapping events mapped
    /// (ld.so's libraries, dlopen) that no region of its last read covers,
    /// so a stack sample drained late still unwinds through them. True when
    /// any was added or named (`name_files`; the maps then count as read
    /// now).
    pub(crate) fn add_mapped_to_maps(&mut self, pid: u32) -> bool {
        // Files named since (a maps read of another process) change the
        // maps as much as regions added: address spaces built from them
        // are built again (`maps_read`).
        let named = self.name_files(pid) > 0;
        let Some(p) = self.procs.get_mut(&pid) else { return false };
        // Nothing more to learn until it maps something else.
        p.maps_stale = false;
        if p.released {
            return false;
        }
        let missing = trusted_mapped(&p.mapped, &p.maps);
        let added = !missing.is_empty() || named;
        p.maps.extend(missing);
        if added {
            p.maps.sort_by_key(|r| r.start);
            p.maps_read = Some(std::time::Instant::now());
        }
        added
    }

    /// Names `pid`'s regions known only by their file's (device, inode)
    /// (`region_from_event`'s placeholders) where that file's path is known
    /// now (`FileNames::find`: a later maps read of any process, the
    /// collector's own maps). A path is used only while its `stat` is that
    /// file. How many were named.
    pub(crate) fn name_files(&mut self, pid: u32) -> usize {
        let Self { procs, file_names, .. } = self;
        let Some(p) = procs.get_mut(&pid).filter(|p| p.unnamed_files && !p.released) else { return 0 };
        let (mut named, mut left) = (0, 0);
        for r in p.mapped.iter_mut().chain(p.maps.iter_mut()) {
            let Some(name) = r.path.as_deref().filter(|n| n.starts_with("[file ")) else { continue };
            match file_names.name_placeholder(name) {
                Some(path) => {
                    log::debug!(target: "vmtrace::maps", "{pid}: {name} at {:#x}-{:#x} is {path}", r.start, r.end);
                    r.path = Some(path.into());
                    named += 1;
                }
                None => left += 1,
            }
        }
        p.unnamed_files = left > 0;
        named
    }

    /// Applies one task event from the kernel.
    pub(crate) fn apply(&mut self, ev: &TaskEvent) {
        let Some(kind) = EventKind::from_u32(ev.hdr.kind) else {
            return;
        };
        match kind {
            EventKind::TaskFork => {
                self.live.insert(ev.tgid);
                // fork copies the address space, its break included; a child
                // starts in its parent's cgroup with its environment.
                // A parent whose identity was not read yet (it started
                // before the trace and has not faulted since) is read now,
                // while it lives: its child, a shell's short command, may
                // be gone before its own exec is applied and its /proc read.
                let inherited = self.parents_identity(ev.ppid);
                let parent = self.procs.get(&ev.ppid);
                let brk = parent.and_then(|p| p.brk);
                // And its mount namespace: a child that exits before its
                // maps are read is named from its parent's root.
                let root = parent.and_then(|pp| pp.root.clone());
                // And its command line, until it execs: not read again from
                // /proc for every child a shell forks.
                let cmdline = parent.and_then(|pp| pp.cmdline.clone());
                let p = self.procs.entry(ev.tgid).or_default();
                if p.cmdline.is_none() && p.execs == 0 {
                    p.cmdline = cmdline;
                }
                p.brk = p.brk.or(brk);
                // Looked at again at its first maps read or exec.
                (p.root, p.root_checked) = (root, false);
                if p.identity.is_none() {
                    p.identity = inherited;
                }
                p.ppid = Some(ev.ppid);
                p.comm = comm_str(&ev.comm);
                p.history.forked_from =
                    Some(crate::regions::history::Fork { parent: ev.ppid, gen: ev.gen, at_ns: ev.hdr.ts_ns });
            }
            EventKind::TaskExec => {
                self.outside_parents.remove(&ev.tgid);
                self.live.insert(ev.tgid);
                let before = self.forked_space(ev.tgid);
                let image = self.exec_image(ev);
                let p = self.procs.entry(ev.tgid).or_default();
                p.comm = comm_str(&ev.comm);
                p.execs += 1;
                // A new address space: the first brk (glibc's brk(0)) tells its break.
                p.brk = None;
                p.history.push(ev.gen, ev.gen, crate::regions::history::Change::Exec);
                // The maps read before (the launcher's, copied at fork) are
                // another program's: history, as a later read would make them.
                for old in std::mem::take(&mut p.maps).into_iter().chain(before) {
                    p.mapped.insert(old);
                }
                // The program and its loader, where the exec put them: named
                // even if it exits before its maps are read.
                for r in image {
                    p.mapped.insert(r);
                }
                p.maps_read = None;
                p.maps_gen = None;
                p.maps_stale = true;
                // An exec may follow a change of mount namespace or root (a
                // container's runtime joins it, then execs the entrypoint;
                // `chroot DIR PROG`): looked at again while it runs.
                p.root_checked = false;
                // Read now, while it lives: after exit /proc has nothing.
                p.cmdline = read_cmdline(ev.tgid).or_else(|| p.cmdline.take());
                // A launcher moves itself into a cgroup and then execs (systemd-run,
                // cgexec, a test's scratch memcg): the cgroup seen at fork is stale,
                // and an OOM victim is often gone before its /proc can be read.
                // One read of /proc/PID/cgroup for both.
                let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", ev.tgid)).ok();
                if let Some(cg) = cgroup.as_deref().and_then(crate::oom::memory_cgroup_in) {
                    p.cgroup = Some(cg);
                }
                // exec gave it a new environment (a launcher sets RANK for it);
                // one already gone keeps what it inherited.
                if let Some(id) = cgroup.and_then(|text| crate::identity::read_with_cgroup(ev.tgid, &text)) {
                    let id = self.intern(id);
                    if let Some(p) = self.procs.get_mut(&ev.tgid) {
                        p.identity = Some(id);
                    }
                }
                self.check_root(ev.tgid);
            }
            EventKind::TaskExit if ev.group_dead == 0 => {
                // A thread the fallback fork hook took for a process.
                if ev.pid != ev.tgid {
                    self.procs.remove(&ev.pid);
                    self.live.remove(&ev.pid);
                }
            }
            EventKind::OomMarkVictim
            | EventKind::MmMapChange
            | EventKind::MmLock
            | EventKind::StackSample
            | EventKind::PyStackStored
            | EventKind::FaultMajor
            | EventKind::GranuleNew
            | EventKind::ResidentPeak
            | EventKind::ResidentEnd
            | EventKind::PageSample => {}
            EventKind::TaskExit => {
                self.outside_parents.remove(&ev.tgid);
                self.live.remove(&ev.tgid);
                let p = self.procs.entry(ev.tgid).or_default();
                p.exited = true;
                // Its name as it left, its leader's (the kernel sends that
                // one, whichever thread left last): a worker renamed by
                // prctl(PR_SET_NAME) after its fork is named as `ps` showed
                // it, not as its parent. Empty when the leader's was unread.
                let comm = comm_str(&ev.comm);
                if !comm.is_empty() {
                    p.comm = comm;
                }
                if ev.exit_code != u32::MAX {
                    p.exit_code = Some(shell_status(ev.exit_code as i32));
                }
                if ev.kernel_min_flt + ev.kernel_maj_flt > 0 {
                    p.kernel = Some(KernelAccounting { minor: ev.kernel_min_flt, major: ev.kernel_maj_flt });
                }
            }
        }
    }

    /// Looks at the root `pid`'s paths are under; a process gone keeps the
    /// one it had (its parent's at the fork).
    fn check_root(&mut self, pid: u32) {
        use crate::procmaps::root::Root;
        if let Some(root) = self.roots.of(pid) {
            let p = self.procs.entry(pid).or_default();
            p.root = match root {
                Root::Here => None,
                Root::Under(dir) => Some(dir),
            };
            p.root_checked = true;
        }
    }

    /// The root `pid`'s paths are under, when not this process's.
    pub(crate) fn root_of(&self, pid: u32) -> Option<&Arc<crate::procmaps::root::RootDir>> {
        self.procs.get(&pid).and_then(|p| p.root.as_ref())
    }

    /// `pid`'s maps, with the regions its history adds that none of them
    /// covers (mapping events, its exec's program and loader, the address
    /// space it had before an exec): what its stacks need, taken at any
    /// time of its life, once its maps were last read after an exec (the
    /// stacks of a shell's child before it exec'd another program).
    pub(crate) fn maps_for_stacks(&self, pid: u32) -> Arc<[crate::procmaps::Region]> {
        let Some(p) = self.procs.get(&pid) else { return Arc::from(Vec::new()) };
        // One process's call sites and stacks are symbolized one after
        // another: its merged maps are made once.
        let key = (pid, p.maps.len(), p.mapped.len(), p.maps_read);
        let mut last = self.stack_maps.borrow_mut();
        if let Some((_, maps)) = last.as_ref().filter(|(k, _)| *k == key) {
            return Arc::clone(maps);
        }
        let maps: Arc<[crate::procmaps::Region]> = maps_with_history(p).into();
        *last = Some((key, Arc::clone(&maps)));
        maps
    }

    /// A forked child's address space before its first exec, when its own
    /// maps were never read: its parent's, which fork copied (what its
    /// stacks before the exec need; a shell's child forks and execs within
    /// a millisecond).
    fn forked_space(&self, pid: u32) -> Vec<crate::procmaps::Region> {
        let Some(p) = self.procs.get(&pid).filter(|p| p.execs == 0 && p.maps.is_empty()) else { return Vec::new() };
        p.ppid.and_then(|pp| self.procs.get(&pp)).map_or_else(Vec::new, maps_with_history)
    }

    /// The regions of the program and loader an exec mapped
    /// (`procmaps::exec_image`); none when the program file cannot be
    /// named (the process gone before its `/proc/PID/exe` was read, the
    /// first time that file is seen) or read.
    fn exec_image(&mut self, ev: &TaskEvent) -> Vec<crate::procmaps::Region> {
        let (dev, ino) = (ev.exe_dev, ev.exe_ino);
        if ino == 0 || ev.start_code == 0 {
            return Vec::new();
        }
        let path = self.file_names.get(dev, ino).or_else(|| {
            let link = fs::read_link(format!("/proc/{}/exe", ev.tgid)).ok()?.display().to_string();
            // The link is the path in the process's mount namespace: used
            // only where it is the same file here.
            crate::regions::is_file(&link, dev, ino).then(|| self.file_names.learn(dev, ino, link))
        });
        path.map_or_else(Vec::new, |exe| self.exec_images.regions(&exe, ev.start_code, ev.at_base))
    }

    /// Live processes, with their entries.
    pub(crate) fn live(&self) -> impl Iterator<Item = (u32, &ProcInfo)> {
        self.live.iter().filter_map(|pid| self.procs.get(pid).map(|p| (*pid, p)))
    }

    /// Once `pid` has exited: drops what only a live process needs (the
    /// bookkeeping that folds an allocator's munmap/mmap churn) and the
    /// spare capacity of what the summary still reads.
    pub(crate) fn retire(&mut self, pid: u32) {
        self.live.remove(&pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.history.retire();
            p.maps.shrink_to_fit();
        }
    }

    /// Re-reads each live process's name from `/proc/PID/comm` (its
    /// leader's, as `ps` shows it): a process renamed after its fork or exec
    /// by prctl(PR_SET_NAME) (a DataLoader worker's "pt_data_worker") still
    /// has the name the fork or exec event gave it until its exit (which
    /// carries the last one). Returns how many were renamed.
    pub(crate) fn rename_live(&mut self) -> usize {
        self.rename_live_from(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).ok())
    }

    /// [`Self::rename_live`] with the names given (tests).
    fn rename_live_from(&mut self, comm_of: impl Fn(u32) -> Option<String>) -> usize {
        let mut renamed = 0;
        for pid in &self.live {
            let Some(p) = self.procs.get_mut(pid).filter(|p| !p.exited) else { continue };
            let Some(name) = comm_of(*pid) else { continue };
            let name = name.trim_end_matches('\n');
            if !name.is_empty() && name != p.comm {
                p.comm = name.to_string();
                renamed += 1;
            }
        }
        renamed
    }

    /// Makes sure `pid` has an entry, filling what /proc still tells.
    pub(crate) fn ensure(&mut self, pid: u32) -> &mut ProcInfo {
        let p = self.procs.entry(pid).or_default();
        if p.comm.is_empty() || p.ppid.is_none() {
            if let Some((comm, ppid)) = read_stat(pid) {
                if !p.exited {
                    self.live.insert(pid);
                }
                if p.comm.is_empty() {
                    p.comm = comm;
                }
                p.ppid.get_or_insert(ppid);
            }
        }
        if p.cmdline.is_none() {
            p.cmdline = read_cmdline(pid);
        }
        if p.comm.is_empty() {
            p.comm = "?".into();
        }
        if p.identity.is_none() {
            self.identify(pid);
        }
        self.procs.entry(pid).or_default()
    }
}

/// "rwx" flags of mmap/mprotect `prot`, as /proc/PID/maps shows them.
fn rwx(prot: u64) -> String {
    let p = |bit: i32, c: char| if prot & bit as u64 != 0 { c } else { '-' };
    format!("{}{}{}", p(libc::PROT_READ, 'r'), p(libc::PROT_WRITE, 'w'), p(libc::PROT_EXEC, 'x'))
}

/// A region as an mmap/mremap event describes it (the path of a file mapping
/// is read from /proc/PID/fd while it is still open).
pub(crate) fn region_from_event(ev: &vmtrace_common::MmEvent, names: &mut FileNames) -> crate::procmaps::Region {
    use crate::{model::RegionKind, procmaps::Region};
    let shared = ev.flags & libc::MAP_SHARED as u64 != 0;
    let anon = ev.fd == u64::MAX || ev.flags & libc::MAP_ANONYMOUS as u64 != 0;
    let (kind, path) = if anon {
        (if shared { RegionKind::Shmem } else { RegionKind::Anon }, None)
    } else if let Some(known) = names.get(ev.dev, ev.ino) {
        (RegionKind::File, Some(known))
    } else {
        // The fd may be closed, or reused for another file, by now: the kernel
        // said which file it was; a name that is not that file is not used.
        let fd = format!("/proc/{}/fd/{}", ev.tgid, ev.fd);
        let named = fs::read_link(&fd).ok().map(|p| p.display().to_string());
        let is_it = |p: &str| ev.ino == 0 || crate::regions::is_file(p, ev.dev, ev.ino);
        // An unlinked file (a shared-memory segment) has no path to look at:
        // the descriptor is the file. Named without " (deleted)", as maps are.
        let path = named.and_then(|p| match p.strip_suffix(" (deleted)") {
            Some(gone) => is_it(&fd).then(|| gone.to_string()),
            None => is_it(&p).then(|| names.learn(ev.dev, ev.ino, p)),
        });
        // A program may close the fd right after mmap (torch does): the
        // mapping itself still names its file.
        let path = path.or_else(|| mapped_file_name(ev).map(|p| names.learn(ev.dev, ev.ino, p)));
        // Gone (the process exited before its events were drained): the
        // same file mapped elsewhere, the collector's own libc among them.
        let path = path.or_else(|| names.find(ev.dev, ev.ino)).unwrap_or_else(|| {
            if ev.ino == 0 {
                format!("[fd {}]", ev.fd as i64)
            } else {
                // Closed before it could be named (a later maps read names it
                // if it is still mapped; `ProcessTable::name_files`).
                let name = crate::regions::placeholder(ev.dev, ev.ino);
                log::debug!(target: "vmtrace::maps", "{}: mapping {:#x}-{:#x} named {name}: no path left for it (descriptor, mapping and maps gone)", ev.tgid, ev.addr, ev.addr + ev.len);
                name
            }
        });
        (RegionKind::File, Some(path))
    };
    let perms = format!("{}{}", rwx(ev.prot), if shared { 's' } else { 'p' }).into();
    Region { start: ev.addr, end: ev.addr + ev.len, perms, offset: ev.offset, kind, path: path.map(Into::into) }
}

/// A process's maps with the regions of its history they lack
/// (`trusted_mapped`), by start.
fn maps_with_history(p: &ProcInfo) -> Vec<crate::procmaps::Region> {
    let mut maps = p.maps.clone();
    maps.extend(trusted_mapped(&p.mapped, &p.maps));
    maps.sort_by_key(|r| r.start);
    maps
}

/// The regions of `mapped` (mapping events, exec images, in the order the
/// process made them: `MappedRegions::insert`) that no region of `maps`
/// covers. They used to be left out where two overlapped, as if the order
/// were unknown: ld.so maps a library's text over the span it reserved and
/// its data over the text's tail, so a process that exited before its maps
/// were read after its exec lost its libraries' code (arm64 6.12: its
/// stacks stopped at `[unwind left code]` after `main`).
fn trusted_mapped(
    mapped: &crate::procmaps::MappedRegions,
    maps: &[crate::procmaps::Region],
) -> Vec<crate::procmaps::Region> {
    // `maps` (a maps read) is sorted and its regions do not overlap: the
    // first ending past a region's start is the only one that may.
    let sorted = maps.is_sorted_by_key(|m| m.start);
    let overlaps = |r: &crate::procmaps::Region| {
        if sorted {
            let i = maps.partition_point(|m| m.end <= r.start);
            maps[i..].iter().take_while(|m| m.start < r.end).any(|m| r.start < m.end)
        } else {
            maps.iter().any(|m| m.start < r.end && r.start < m.end)
        }
    };
    mapped.iter().filter(|r| !overlaps(r)).cloned().collect()
}

/// The paths of files mmap events named, by the kernel's (device, inode):
/// every process of a node maps the same libraries, and naming each mapping
/// from /proc (a readlink and a stat, then the mapping's own link or the
/// whole maps file once the descriptor is closed) was a tenth of the
/// collector's time under process churn. A name is used again while it
/// still is that file: checked by a stat at most once per `RECHECK` (the
/// stat of every mapping of a library was 3% of the collector's time beside
/// a shell loop). A file replaced under its name within that second keeps
/// the name for the old one's mappings, as /proc/PID/maps shows them (the
/// name, "(deleted)", which vmtrace drops). The table is emptied when full.
///
/// Maps reads name files too (`learn_maps`): a process that mapped a
/// library and exited before its events were drained (the descriptor, the
/// mapping and /proc/PID gone) has it named by any other mapping of the
/// same (device, inode) the collector read, its own included (`find`).
/// Every maps read is learned from, not only for files a placeholder asked
/// for: a short-lived process's library is often asked for after the last
/// read that named it. It costs one `stat` per file not known yet (beside
/// a shell and Python loop, `record -a` for 30 s: 43 to 189 stats, each of
/// a distinct file, in 16,047 maps reads; the collector made ~840 `stat`s a
/// second in all, most an `fstat` of a /proc file it read).
#[derive(Default)]
pub(crate) struct FileNames {
    by_file: HashMap<(u32, u64), (String, std::time::Instant)>,
    /// Files a maps read named by a path that is another file here (a
    /// deleted or replaced file, another mount namespace): not looked at
    /// again at every read. Emptied when full.
    refused: std::collections::HashSet<(u32, u64)>,
    /// When the collector's own maps were last read for a file not named.
    own_read: Option<std::time::Instant>,
    /// Files the collector's own maps were read for (`find`): a file they
    /// did not name does not have them read again (a later read made for
    /// another file, or any maps read, still names it). Emptied when full.
    own_looked: std::collections::HashSet<(u32, u64)>,
}

impl FileNames {
    const MAX: usize = 4096;
    const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

    /// The path last seen for the file, if it still names it.
    fn get(&mut self, dev: u32, ino: u64) -> Option<String> {
        if ino == 0 {
            return None;
        }
        let (path, checked) = self.by_file.get_mut(&(dev, ino))?;
        if checked.elapsed() < Self::RECHECK {
            return Some(path.clone());
        }
        if crate::regions::is_file(path, dev, ino) {
            *checked = std::time::Instant::now();
            return Some(path.clone());
        }
        self.by_file.remove(&(dev, ino));
        None
    }

    /// Remembers a path checked to be the file; gives it back.
    fn learn(&mut self, dev: u32, ino: u64, path: String) -> String {
        if ino != 0 && path.starts_with('/') {
            if self.by_file.len() >= Self::MAX {
                self.by_file.clear();
            }
            self.refused.remove(&(dev, ino));
            self.by_file.insert((dev, ino), (path.clone(), std::time::Instant::now()));
        }
        path
    }

    /// Learns the files a maps read names (regions with their (device,
    /// inode), `procmaps::parse_with_files`), as paths of this mount
    /// namespace: a path is taken only where its `stat` here is that
    /// (device, inode). Files known already are not looked at. How many
    /// were learned.
    fn learn_maps<'a>(&mut self, files: impl IntoIterator<Item = (&'a crate::procmaps::Region, (u32, u64))>) -> usize {
        let mut learned = 0;
        for (r, (dev, ino)) in files {
            let Some(path) = r.path.as_deref().filter(|p| p.starts_with('/')) else { continue };
            if ino == 0 || self.by_file.contains_key(&(dev, ino)) || self.refused.contains(&(dev, ino)) {
                continue;
            }
            if crate::regions::is_file(path, dev, ino) {
                self.learn(dev, ino, path.to_string());
                learned += 1;
            } else {
                if self.refused.len() >= Self::MAX {
                    self.refused.clear();
                }
                self.refused.insert((dev, ino));
            }
        }
        learned
    }

    /// The path of the file, as `get`, else from the collector's own maps:
    /// vmtrace maps libc and the other system libraries its targets map.
    /// They are read once for each file not named otherwise, and at most
    /// once per `RECHECK` (a file asked for within it has them read at a
    /// later call): a file they do not name, looked for at every maps read
    /// of its process, costs one read, not one a second.
    fn find(&mut self, dev: u32, ino: u64) -> Option<String> {
        if ino == 0 {
            return None;
        }
        if let Some(path) = self.get(dev, ino) {
            return Some(path);
        }
        if self.own_looked.contains(&(dev, ino)) || self.own_read.is_some_and(|t| t.elapsed() < Self::RECHECK) {
            return None;
        }
        if self.own_looked.len() >= Self::MAX {
            self.own_looked.clear();
        }
        self.own_looked.insert((dev, ino));
        self.own_read = Some(std::time::Instant::now());
        let own = crate::procmaps::read_with_files(std::process::id()).unwrap_or_default();
        let learned = self.learn_maps(own.iter().map(|(r, id)| (r, *id)));
        log::debug!(target: "vmtrace::maps", "own maps read for file {}:{} inode {ino}: {learned} files learned", dev >> 20, dev & 0xf_ffff);
        self.get(dev, ino)
    }

    /// The path of the file a placeholder name (`[file MAJOR:MINOR inode
    /// N]`, a mapping whose path was not found when it was made) stands
    /// for, if a path to that file is known now (`find`).
    fn name_placeholder(&mut self, name: &str) -> Option<String> {
        let (dev, ino) = crate::regions::placeholder_id(name)?;
        self.find(dev, ino)
    }
}

/// The path of the file an mmap event mapped, from the mapping while it is
/// still there: `/proc/PID/map_files/START-END` (whose `stat` is the mapped
/// file's, so a file renamed or replaced since is told apart), else the line
/// of `/proc/PID/maps` that covers the address with the same inode (the
/// kernel may have merged the mapping with a neighbour).
fn mapped_file_name(ev: &vmtrace_common::MmEvent) -> Option<String> {
    if ev.ino == 0 {
        return None;
    }
    let end = ev.addr + ((ev.len + 4095) & !4095);
    let link = format!("/proc/{}/map_files/{:x}-{:x}", ev.tgid, ev.addr, end);
    if crate::regions::is_file(&link, ev.dev, ev.ino) {
        if let Ok(target) = fs::read_link(&link) {
            return Some(target.display().to_string());
        }
    }
    let maps = crate::procmaps::read_with_files(ev.tgid).ok()?;
    maps.into_iter().find_map(|(r, id)| {
        let path = r.path.as_deref().filter(|p| p.starts_with('/'))?;
        (r.contains(ev.addr) && id == (ev.dev, ev.ino)).then(|| path.to_string())
    })
}

impl ProcessTable {
    /// Logs a mapping change; remembers a region mapped (mmap, mremap) for
    /// symbolization.
    pub(crate) fn note_change(&mut self, ev: &vmtrace_common::MmEvent) {
        use crate::regions::history::Change;
        use vmtrace_common::MmCall;
        if !self.procs.get(&ev.tgid).is_some_and(|p| p.exited) {
            self.live.insert(ev.tgid);
        }
        let change = match ev.call {
            c if c == MmCall::Mmap as u32 => {
                let r = region_from_event(ev, &mut self.file_names);
                let p = self.procs.entry(ev.tgid).or_default();
                if r.path.as_deref().is_some_and(|n| crate::regions::placeholder_id(n).is_some()) {
                    p.unnamed_files = true;
                }
                p.mapped.insert(r.clone());
                p.maps_stale = true;
                Change::Map { region: r, flags: ev.flags }
            }
            c if c == MmCall::Munmap as u32 => Change::Unmap { start: ev.addr, end: ev.addr + ev.len },
            c if c == MmCall::Mprotect as u32 => {
                Change::Protect { start: ev.addr, end: ev.addr + ev.len, perms: rwx(ev.prot) }
            }
            c if c == MmCall::Mremap as u32 => {
                let p = self.procs.entry(ev.tgid).or_default();
                if let Some(old) = p.mapped.find(ev.old_addr).cloned() {
                    let r = crate::procmaps::Region { start: ev.addr, end: ev.addr + ev.len, ..old };
                    p.mapped.insert(r);
                }
                p.maps_stale = true;
                Change::Remap { old_start: ev.old_addr, old_len: ev.old_len, new_start: ev.addr, new_len: ev.len }
            }
            c if c == MmCall::Brk as u32 => {
                // The event's address is what brk returned: the break in force after it.
                let p = self.procs.entry(ev.tgid).or_default();
                if p.brk.is_some_and(|old| ev.addr < old) {
                    p.brk_shrinks += 1;
                }
                p.brk = Some(ev.addr);
                Change::Brk { brk: ev.addr }
            }
            _ => return,
        };
        self.procs.entry(ev.tgid).or_default().history.push_at(ev.gen_exit, ev.gen_enter, ev.hdr.ts_ns, change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind, tgid: u32) -> TaskEvent {
        TaskEvent { group_dead: 1, ..crate::collect::fake::task(kind, tgid, tgid, 1, "work") }
    }

    #[test]
    fn a_file_name_is_used_again_only_while_it_is_that_file() {
        let dir = std::env::temp_dir().join(format!("vmtrace-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lib.so");
        std::fs::write(&path, b"one").unwrap();
        let p = path.display().to_string();
        let (dev, ino, _) = crate::regions::kernel_dev_ino(&p).unwrap();
        let mut names = FileNames::default();
        assert_eq!(names.get(dev, ino), None);
        assert_eq!(names.learn(dev, ino, p.clone()), p);
        assert_eq!(names.get(dev, ino).as_deref(), Some(p.as_str()));
        // Replaced under the same name: another inode, the name is not used
        // once it is checked again.
        let other = dir.join("new.so");
        std::fs::write(&other, b"two").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(names.get(dev, ino).as_deref(), Some(p.as_str()), "checked at most once a second");
        for (_, checked) in names.by_file.values_mut() {
            *checked -= FileNames::RECHECK;
        }
        assert_eq!(names.get(dev, ino), None);
        assert!(names.by_file.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A maps line of `path` as (dev, ino).
    fn maps_line(dev: u32, ino: u64, path: &str) -> String {
        format!("7f0000000000-7f0000001000 r-xp 00000000 {:02x}:{:02x} {ino} {path}\n", dev >> 20, dev & 0xf_ffff)
    }

    #[test]
    fn a_maps_read_names_a_file_only_where_its_path_is_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let [a, b] = ["liba.so", "libb.so"].map(|n| {
            let p = dir.path().join(n);
            std::fs::write(&p, n).unwrap();
            p.display().to_string()
        });
        let (da, ia, _) = crate::regions::kernel_dev_ino(&a).unwrap();
        let (db, ib, _) = crate::regions::kernel_dev_ino(&b).unwrap();
        // Another process's maps: `a` as it is here; `b`'s path for a file
        // that is not `b` (replaced since, or another mount namespace's).
        let text = maps_line(da, ia, &a) + &maps_line(db, ib + 1000, &b) + &maps_line(da, ia, &a);
        let mut names = FileNames { own_read: Some(std::time::Instant::now()), ..FileNames::default() };
        let files = crate::procmaps::parse_with_files(&text);
        assert_eq!(names.learn_maps(files.iter().map(|(r, id)| (r, *id))), 1);
        assert_eq!(names.find(da, ia).as_deref(), Some(a.as_str()));
        assert_eq!(names.find(db, ib + 1000), None, "a path that is another file is not used");
        assert_eq!(names.find(db, ib), None, "nothing named b's own inode");
        assert!(names.refused.contains(&(db, ib + 1000)));
        assert_eq!(names.learn_maps(files.iter().map(|(r, id)| (r, *id))), 0, "neither is looked at again");
    }

    #[test]
    fn a_file_the_collector_maps_is_named_from_its_own_maps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libown.so");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is the test's own and not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let (dev, ino, _) = crate::regions::kernel_dev_ino(&path.display().to_string()).unwrap();
        let mut names = FileNames::default();
        assert_eq!(names.find(dev, ino), Some(path.display().to_string()));
        let first = names.own_read;
        assert_eq!(names.find(dev, ino + 1000), None);
        assert_eq!(names.own_read, first, "read once per second at most");
        drop(map);
    }

    /// A file the collector's own maps do not name has them read once, not
    /// once a second at every maps read of the process that mapped it; a
    /// file asked for later has them read again, and that read names every
    /// file they map then.
    #[test]
    fn the_collectors_own_maps_are_read_once_for_a_file_they_do_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("liblater.so");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let p = path.display().to_string();
        let (dev, ino, _) = crate::regions::kernel_dev_ino(&p).unwrap();
        let mut names = FileNames::default();
        let a_second_ago = |names: &mut FileNames| {
            names.own_read = names.own_read.and_then(|t| t.checked_sub(FileNames::RECHECK));
            names.own_read
        };
        assert_eq!(names.find(dev, ino), None, "not mapped yet");
        let read = a_second_ago(&mut names);
        assert!(read.is_some(), "read for it");
        assert_eq!(names.find(dev, ino), None);
        assert_eq!(names.own_read, read, "not read again for it, a second later");
        // Mapped since: a read made for another file names it.
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is the test's own and not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert_eq!(names.find(dev, ino), None, "still not read again for it");
        assert_eq!(names.find(dev, ino + 1000), None);
        assert_ne!(names.own_read, read, "another file has them read");
        assert_eq!(names.find(dev, ino), Some(p), "learned from that read");
        drop(map);
        // Bounded: emptied when full, so a file looked for long ago is looked for again.
        names.own_looked = (0..FileNames::MAX as u64).map(|i| (1, i)).collect();
        a_second_ago(&mut names);
        assert_eq!(names.find(1, u64::MAX), None);
        assert_eq!(names.own_looked.len(), 1);
    }

    /// A process that mapped a library and exited before its mapping events
    /// were drained (its descriptor, mapping and /proc entry gone): the
    /// library is named by its file's (dev, inode) only, until any maps read
    /// names that file.
    #[test]
    fn a_gone_processs_unnamed_library_is_named_once_a_maps_read_names_its_file() {
        use vmtrace_common::MmCall;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libgone.so");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let p = path.display().to_string();
        let (dev, ino, _) = crate::regions::kernel_dev_ino(&p).unwrap();
        let mut t = ProcessTable::default();
        // Not mapped by the collector yet: its own maps do not name it.
        assert_eq!(t.file_names.find(dev, ino), None);
        let mmap = |addr: u64, len: u64, dev: u32, ino: u64| vmtrace_common::MmEvent {
            call: MmCall::Mmap as u32,
            addr,
            len,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u64,
            flags: libc::MAP_PRIVATE as u64,
            fd: 3,
            dev,
            ino,
            ..brk(u32::MAX, 0)
        };
        t.note_change(&mmap(0x3000, 0x2000, dev, ino));
        t.note_change(&mmap(0x8000, 0x1000, dev, ino + 1000));
        let unnamed = crate::regions::placeholder(dev, ino);
        let other = crate::regions::placeholder(dev, ino + 1000);
        let gone = &t.procs[&u32::MAX];
        assert_eq!(gone.mapped.find(0x3000).and_then(|r| r.path.as_deref()), Some(unnamed.as_str()));
        assert!(gone.unnamed_files);
        // The collector's maps read (any process's would do) sees the file.
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the file is the test's own and not changed while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert!(t.snapshot_maps(std::process::id()));
        drop(map);
        assert!(t.add_mapped_to_maps(u32::MAX));
        let gone = &t.procs[&u32::MAX];
        let name = |addr| crate::procmaps::find(&gone.maps, addr).and_then(|r| r.path.as_deref());
        assert_eq!(name(0x3000), Some(p.as_str()));
        assert_eq!(gone.mapped.find(0x4fff).and_then(|r| r.path.as_deref()), Some(p.as_str()));
        assert_eq!(name(0x8000), Some(other.as_str()), "no file here is that inode: it stays unnamed");
        assert!(gone.unnamed_files, "looked for again");
    }

    /// A maps read names the regions kept after it: a placeholder it
    /// replaced (a region at the same span) is dropped, not looked for and
    /// not left to be looked for again; one it did not (history now) is
    /// named.
    #[test]
    fn a_maps_read_names_the_regions_it_keeps() {
        use crate::{model::RegionKind, procmaps::Region};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libkept.so");
        std::fs::write(&path, b"kept").unwrap();
        let lib = path.display().to_string();
        let (dev, ino, _) = crate::regions::kernel_dev_ino(&lib).unwrap();
        let pid = std::process::id();
        let exe = std::env::current_exe().unwrap().display().to_string();
        let own = crate::procmaps::read_with_files(pid).unwrap();
        let (text, _) =
            own.iter().find(|(r, _)| r.path.as_deref() == Some(exe.as_str())).expect("the test's own program");
        let placeholder = |ino: u64| Some(crate::regions::placeholder(dev, ino).into());
        let mut t = ProcessTable::default();
        t.file_names.learn(dev, ino, lib.clone());
        let p = t.procs.entry(pid).or_default();
        p.maps = vec![
            Region {
                start: 0x1000,
                end: 0x2000,
                perms: "r-xp".into(),
                offset: 0,
                kind: RegionKind::File,
                path: placeholder(ino),
            },
            // At the span of the program's text: the read replaces it. Its
            // inode is no file here: it could never be named.
            Region { path: placeholder(ino + 1000), ..text.clone() },
        ];
        p.unnamed_files = true;
        assert!(t.snapshot_maps(pid));
        let p = &t.procs[&pid];
        assert_eq!(p.mapped.find(0x1800).and_then(|r| r.path.as_deref()), Some(lib.as_str()), "history, named");
        assert_eq!(crate::procmaps::find(&p.maps, text.start).and_then(|r| r.path.as_deref()), Some(exe.as_str()));
        assert!(
            !p.maps.iter().chain(p.mapped.iter()).any(|r| r.path.as_deref().is_some_and(|n| n.starts_with("[file "))),
            "no placeholder kept"
        );
        assert!(!p.unnamed_files, "nothing left to name: the replaced placeholder is not looked for again");
    }

    /// #36: a shell started before the trace (not in the table) forks a
    /// short command that exits before its exec is applied (its /proc
    /// gone): the command has the shell's identity, read at the fork, and
    /// keeps it through its exec and exit. The shell is not added to the
    /// table for it.
    #[test]
    fn a_short_child_of_an_unknown_parent_has_the_parents_identity() {
        let me = std::process::id();
        let mine = crate::identity::read(me).expect("the test's own identity");
        assert!(mine.cgroup.is_some());
        let child = u32::MAX - 1;
        let mut t = ProcessTable::default();
        t.apply(&TaskEvent { ppid: me, ..ev(EventKind::TaskFork, child) });
        assert!(!t.contains(me), "the parent is not added");
        t.apply(&TaskEvent { ppid: me, ..ev(EventKind::TaskFork, child - 1) });
        t.apply(&ev(EventKind::TaskExec, child));
        t.apply(&ev(EventKind::TaskExit, child));
        assert_eq!(t.identify(child).as_deref(), Some(&mine));
        assert_eq!(t.identify(child - 1).as_deref(), Some(&mine), "read once, kept for its next child");
        t.apply(&ev(EventKind::TaskExit, me));
        assert!(t.outside_parents.is_empty(), "forgotten at its exit");
    }

    /// An exited process whose identity was never read (its fork not seen,
    /// its parent's unknown then) takes its nearest known ancestor's; so
    /// does one gone before its exit is applied (its /proc unreadable, on
    /// cgroup v1 the root cgroup as it exits); with no ancestor known, an
    /// exited one has none.
    #[test]
    fn a_process_gone_before_its_identity_was_read_takes_its_ancestors() {
        let mut t = ProcessTable::default();
        let rank = |r: u32| Identity {
            cgroup: Some("/job".into()),
            rank: Some(crate::model::identity::Rank { rank: Some(r), ..Default::default() }),
            ..Identity::default()
        };
        let (grandparent, parent, child, gone) = (u32::MAX - 10, u32::MAX - 11, u32::MAX - 12, u32::MAX - 13);
        t.set_identity(grandparent, rank(7));
        for (pid, ppid) in [(parent, grandparent), (child, parent), (gone, parent)] {
            let p = t.procs.entry(pid).or_default();
            p.ppid = Some(ppid);
            p.exited = pid != gone;
        }
        assert_eq!(t.identify(child).as_deref(), Some(&rank(7)));
        assert_eq!(t.identify(gone).as_deref(), Some(&rank(7)), "unreadable, not exited yet");
        let orphan = u32::MAX - 14;
        t.procs.entry(orphan).or_default().exited = true;
        assert_eq!(t.identify(orphan), None);
    }

    #[test]
    fn fork_then_exit_keeps_identity_and_status() {
        let mut t = ProcessTable::default();
        t.apply(&ev(EventKind::TaskFork, 4242));
        let mut e = ev(EventKind::TaskExit, 4242);
        e.exit_code = 9; // killed by SIGKILL
        e.kernel_min_flt = 10;
        t.apply(&e);
        let p = &t.procs[&4242];
        assert_eq!((p.ppid, p.comm.as_str(), p.exit_code), (Some(1), "work", Some(137)));
        assert_eq!(p.kernel, Some(KernelAccounting { minor: 10, major: 0 }));
    }

    #[test]
    fn the_name_at_exit_is_the_processs_name() {
        let mut t = ProcessTable::default();
        // Renamed after its fork (prctl(PR_SET_NAME), as a DataLoader worker):
        // the group's exit carries the leader's name.
        t.apply(&ev(EventKind::TaskFork, 4242));
        let mut e = ev(EventKind::TaskExit, 4242);
        e.comm = *b"pt_data_worker\0\0";
        t.apply(&e);
        assert_eq!(t.procs[&4242].comm, "pt_data_worker");
        // The leader's name unread (all zeros): the name it had stays.
        t.apply(&ev(EventKind::TaskFork, 4343));
        t.apply(&TaskEvent { pid: 4344, comm: [0; 16], ..ev(EventKind::TaskExit, 4343) });
        assert_eq!(t.procs[&4343].comm, "work");
        // A thread's own exit (not the group's) names nothing.
        t.apply(&ev(EventKind::TaskFork, 4545));
        t.apply(&TaskEvent {
            pid: 4546,
            group_dead: 0,
            comm: *b"helper\0\0\0\0\0\0\0\0\0\0",
            ..ev(EventKind::TaskExit, 4545)
        });
        assert_eq!((t.procs[&4545].comm.as_str(), t.procs[&4545].exited), ("work", false));
    }

    /// uc30: a worker renamed after its fork and still running at the end
    /// kept its fork-time name; the live ones are named afresh, an exited
    /// one keeps its name at exit.
    #[test]
    fn live_processes_are_renamed_from_proc() {
        let mut t = ProcessTable::default();
        t.apply(&ev(EventKind::TaskFork, 4242));
        t.apply(&ev(EventKind::TaskFork, 4343));
        t.apply(&ev(EventKind::TaskExit, 4343));
        let comm_of = |pid| Some(if pid == 4242 { "pt_data_worker\n" } else { "reused\n" }.to_string());
        assert_eq!(t.rename_live_from(comm_of), 1);
        assert_eq!((t.procs[&4242].comm.as_str(), t.procs[&4343].comm.as_str()), ("pt_data_worker", "work"));
        // Gone (unreadable) or unchanged: nothing.
        assert_eq!(t.rename_live_from(|_| None), 0);
        assert_eq!(t.rename_live_from(comm_of), 0);
        assert_eq!(t.procs[&4242].comm, "pt_data_worker");
    }

    fn brk(tgid: u32, returned: u64) -> vmtrace_common::MmEvent {
        let mut ev = crate::collect::fake::mm_change(tgid, vmtrace_common::MmCall::Brk, returned, 0);
        ev.hdr.ts_ns = 1;
        ev
    }

    /// Only a break moved down is a trim: glibc's brk(0) query, its grows, a
    /// failed grow (the old break returned) are not. A forked child starts
    /// from its parent's break; an exec from none.
    #[test]
    fn brk_shrinks_count_the_breaks_moved_down() {
        let mut t = ProcessTable::default();
        let base = 0x5555_0000_0000;
        for addr in [base, base + 0x21000, base + 0x42000, base + 0x42000, base + 0x10000, base + 0x30000, base] {
            t.note_change(&brk(4242, addr));
        }
        assert_eq!(t.procs[&4242].brk_shrinks, 2);
        let mut fork = ev(EventKind::TaskFork, 4243);
        fork.ppid = 4242;
        t.apply(&fork);
        t.note_change(&brk(4243, base - 0x1000));
        assert_eq!(t.procs[&4243].brk_shrinks, 1, "the child's first brk, below its parent's break");
        t.apply(&ev(EventKind::TaskExec, 4243));
        t.note_change(&brk(4243, 0x1000));
        assert_eq!(t.procs[&4243].brk_shrinks, 1, "a new program's first break is no shrink");
        assert_eq!(t.procs[&4242].brk_shrinks, 2);
    }

    #[test]
    fn thread_mistaken_for_a_process_is_dropped_at_its_exit() {
        let mut t = ProcessTable::default();
        t.apply(&ev(EventKind::TaskFork, 4243));
        let mut e = ev(EventKind::TaskExit, 4242);
        e.pid = 4243;
        e.group_dead = 0;
        t.apply(&e);
        assert!(t.procs.is_empty());
    }

    #[test]
    fn regions_gone_from_a_later_maps_read_stay_known() {
        use crate::{model::RegionKind, procmaps::Region};
        let mut t = ProcessTable::default();
        let pid = std::process::id();
        let gone =
            Region { start: 0x1000, end: 0x2000, perms: "rw-p".into(), offset: 0, kind: RegionKind::Anon, path: None };
        t.procs.entry(pid).or_default().maps = vec![gone.clone()];
        t.snapshot_maps(pid);
        assert_eq!(t.procs[&pid].mapped.find(0x1800), Some(&gone));
    }

    #[test]
    fn maps_read_before_an_exec_are_history_and_a_mapping_makes_them_stale() {
        use crate::{model::RegionKind, procmaps::Region};
        let mut t = ProcessTable::default();
        let launcher =
            Region { start: 0x1000, end: 0x2000, perms: "r-xp".into(), offset: 0, kind: RegionKind::File, path: None };
        let p = t.procs.entry(u32::MAX).or_default();
        p.maps = vec![launcher.clone()];
        p.maps_read = Some(std::time::Instant::now());
        t.apply(&ev(EventKind::TaskExec, u32::MAX));
        let p = &t.procs[&u32::MAX];
        assert!(
            p.maps.is_empty() && p.maps_read.is_none() && p.maps_stale,
            "the launcher's maps are not the program's"
        );
        assert_eq!(p.mapped.find(0x1800), Some(&launcher), "kept as history");
        t.procs.get_mut(&u32::MAX).unwrap().maps_stale = false;
        t.note_change(&vmtrace_common::MmEvent { call: vmtrace_common::MmCall::Mmap as u32, ..brk(u32::MAX, 0x5000) });
        assert!(t.procs[&u32::MAX].maps_stale, "a library mapped since the read");
    }

    #[test]
    fn a_gone_process_unwinds_through_the_libraries_it_mapped() {
        use crate::{model::RegionKind, procmaps::Region};
        let r = |start: u64, end: u64, path: &str| Region {
            start,
            end,
            perms: "r-xp".into(),
            offset: 0,
            kind: RegionKind::File,
            path: Some(path.into()),
        };
        let mut t = ProcessTable::default();
        // Read at exec: the program and ld.so; then ld.so mapped libc over
        // the span it reserved, and its data over the text's tail; and a
        // mapping made over another (the later one holds what they share).
        let p = t.procs.entry(u32::MAX).or_default();
        p.maps = vec![r(0x1000, 0x2000, "/bin/prog"), r(0x9000, 0xa000, "/lib/ld.so")];
        for m in [
            Region { perms: "---p".into(), ..r(0x3000, 0x7000, "/lib/libc.so") },
            r(0x3000, 0x6000, "/lib/libc.so"),
            Region { perms: "rw-p".into(), offset: 0x2800, ..r(0x5800, 0x6800, "/lib/libc.so") },
            r(0x1000, 0x2000, "/bin/prog"),
            r(0x7000, 0x8000, "/a"),
            r(0x7800, 0x8800, "/b"),
        ] {
            p.mapped.insert(m);
        }
        assert!(t.add_mapped_to_maps(u32::MAX));
        let got: Vec<_> = (t.procs[&u32::MAX].maps.iter())
            .map(|m| (m.start, m.end, m.perms.to_string(), m.offset, m.path.as_deref().unwrap()))
            .collect();
        let want = [
            (0x1000, 0x2000, "r-xp", 0, "/bin/prog"),
            (0x3000, 0x5800, "r-xp", 0, "/lib/libc.so"),
            (0x5800, 0x6800, "rw-p", 0x2800, "/lib/libc.so"),
            (0x6800, 0x7000, "---p", 0x3800, "/lib/libc.so"),
            (0x7000, 0x7800, "r-xp", 0, "/a"),
            (0x7800, 0x8800, "r-xp", 0, "/b"),
            (0x9000, 0xa000, "r-xp", 0, "/lib/ld.so"),
        ];
        let want: Vec<_> = want.iter().map(|(s, e, p, o, n)| (*s, *e, p.to_string(), *o, *n)).collect();
        assert_eq!(got, want);
        assert!(t.procs[&u32::MAX].maps_read.is_some());
        assert!(!t.add_mapped_to_maps(u32::MAX), "nothing new the second time");
    }

    #[test]
    fn stat_parsing_handles_odd_comm() {
        let (comm, ppid) = read_stat(std::process::id()).unwrap();
        assert!(!comm.is_empty());
        assert!(ppid > 0);
    }
}
