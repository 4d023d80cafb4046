//! The one attach path: a hook's candidates in order, each refused for a
//! reason or attached; plus the two hooks whose rows depend on the load (the
//! fault end's perf events and the user-stack walker).
use crate::hash::HashSet;
use std::os::fd::AsFd as _;

use aya::{
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, ProgramError, TracePoint,
    },
    Btf, Ebpf,
};
use vmtrace_common::Config;

use super::{
    hooks::{Candidate, Gate, Hook, ProgramKind, FAULT_END, MEMCG_END, OOM_VICTIM},
    LoadError, LoadOptions,
};
use crate::perf::EndPrograms;

/// Why one program could not be attached; its text is what `probes[]` and
/// `vmtrace check` show.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("program missing")]
    ProgramMissing,
    #[error(transparent)]
    Program(#[from] ProgramError),
    /// The program is fine, attaching it to this CPU's perf event was refused.
    #[error("cpu {cpu}: {error}")]
    OnCpu { cpu: u32, error: ProgramError },
    #[error("{0} programs are not attached from the hook table")]
    NotInTable(ProgramKind),
    /// The program reads a field at a fixed offset where this kernel's
    /// record has something else (`vmtrace_common::TP_FIELDS`).
    #[error("refused: it would misread the record: {0}")]
    Layout(String),
}

/// Why a candidate was not used.
#[derive(Debug)]
pub(super) enum Refusal {
    /// Not tried: the kernel or the options rule it out.
    NotTried(String),
    /// Tried and refused.
    Failed { kind: ProgramKind, error: AttachError },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotTried(why) => f.write_str(why),
            // Trampolines and kprobes fail for reasons a person must be told
            // about (lockdown, no kprobe PMU); tracepoint errors are shown as aya words them.
            Self::Failed { kind: ProgramKind::Fentry | ProgramKind::Fexit | ProgramKind::Kprobe, error } => {
                f.write_str(&explain_attach(&error.to_string()))
            }
            Self::Failed { error, .. } => write!(f, "{error}"),
        }
    }
}

/// What a hook got on this kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The first candidate attached.
    Preferred(ProgramKind),
    /// A later one did; why the earlier ones were refused.
    Fallback { kind: ProgramKind, reason: String },
    /// None did, and recording goes on without the hook.
    Skipped { reason: String },
}

/// A row of the probe selection (`vmtrace check`, summary.json `probes[]`).
#[derive(Clone, Debug)]
pub struct Attachment {
    pub what: &'static str,
    pub target: String,
    pub outcome: Outcome,
}

impl Attachment {
    pub fn kind(&self) -> Option<ProgramKind> {
        match self.outcome {
            Outcome::Preferred(kind) | Outcome::Fallback { kind, .. } => Some(kind),
            Outcome::Skipped { .. } => None,
        }
    }

    /// `probes[].program_type`: the kind, or "none" when skipped.
    pub fn program_type(&self) -> &'static str {
        self.kind().map_or("none", ProgramKind::as_str)
    }

    /// `probes[].fallback_reason`: why the preferred program was not used.
    pub fn fallback_reason(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Preferred(_) => None,
            Outcome::Fallback { reason, .. } | Outcome::Skipped { reason } => Some(reason),
        }
    }
}

impl serde::Serialize for Attachment {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("Attachment", 4)?;
        st.serialize_field("what", self.what)?;
        st.serialize_field("program_type", self.program_type())?;
        st.serialize_field("target", &self.target)?;
        st.serialize_field("fallback_reason", &self.fallback_reason())?;
        st.end()
    }
}

/// What every attach needs.
pub(super) struct Context<'a> {
    pub ebpf: &'a mut Ebpf,
    pub btf: &'a Btf,
    /// Events whose `btf_trace_*` typedef exists.
    pub tp_btf: &'a HashSet<&'static str>,
    pub force_tracepoints: bool,
    /// The struct offsets the programs read (a tp_btf program that needs a
    /// field this kernel lacks is not tried).
    pub offsets: &'a vmtrace_common::KernelOffsets,
    /// `mark_victim` passes the victim's task (6.8+; `BtfFacts::victim_task`).
    pub victim_task: bool,
    /// The classic tracepoints' formats, read once (`Fixed` fields checked
    /// against them before attaching).
    pub formats: &'a mut crate::kernel::tpformat::Formats,
}

/// Why a tp_btf program cannot work on this kernel's structs, if it cannot.
fn missing_fields(c: &Candidate, o: &vmtrace_common::KernelOffsets, victim_task: bool) -> Option<&'static str> {
    use vmtrace_common::KernelOffsets as K;
    match c.program {
        // Attached there, it would read no pid, and the classic hook would
        // leave every kill for it to complete (`OOM_PENDING`): lost.
        "tp_btf_mark_victim" if !victim_task => {
            Some("mark_victim passes the victim's pid alone before 6.8 (TP_PROTO(int pid)), no task to read")
        }
        // arm64 keys mms by their pointer (its context.id is the ASID, reassigned).
        "tp_btf_rss_stat" if (cfg!(target_arch = "x86_64") && o.mm_ctx_id == K::MISSING) || o.task_mm == K::MISSING => {
            Some("no mm_struct.context.ctx_id or task_struct.mm in kernel BTF (the mm's id)")
        }
        "tp_btf_rss_stat"
            if o.pcpu_size != K::MISSING && (o.mm_rss_stat == K::MISSING || o.pcpu_count == K::MISSING) =>
        {
            Some("no mm_struct.rss_stat percpu counters in kernel BTF")
        }
        _ => None,
    }
}

/// Attaches the first candidate of `hook` that the kernel takes (arm64's
/// fault start its own way: its perf event is per CPU).
pub(super) fn attach(cx: &mut Context<'_>, hook: &'static Hook) -> Result<Attachment, LoadError> {
    if hook.what == super::hooks::ARM64_FAULT_START.what {
        return fault_start_arm64(cx);
    }
    let Some(last) = hook.candidates.last() else {
        return Err(LoadError::EmptyHook(hook.what));
    };
    let skipped = |reason: String| Attachment {
        what: hook.what,
        target: last.target.into(),
        outcome: Outcome::Skipped { reason },
    };
    match hook.gate {
        Gate::Always => {}
        Gate::TracefsEvent { before, text } => {
            let exists = last.tracepoint().is_some_and(|(c, n)| crate::kernel::preflight::tracepoint_exists(c, n));
            if !exists {
                return Ok(skipped(format!("no {} on this kernel ({before}): {text}", last.target)));
            }
        }
        Gate::Unsupported(why) => return Ok(skipped(why.into())),
        Gate::HugePagesPossible => {
            if let Some(why) = crate::kernel::thp::why_impossible() {
                return Ok(skipped(format!(
                    "{}{why}; no anonymous or shmem fault can map a huge page (PMD-order page-cache folios are seen by the page-cache hook)",
                    crate::model::summary::NOT_NEEDED
                )));
            }
        }
    }
    let mut refused: Vec<(&Candidate, Refusal)> = Vec::new();
    for c in hook.candidates {
        let refusal = if cx.force_tracepoints && c.kind.forced_off() {
            Refusal::NotTried("disabled by --force-tracepoints".into())
        } else if c.kind == ProgramKind::TpBtf && !cx.tp_btf.contains(c.target) {
            Refusal::NotTried(format!("no btf_trace_{} in kernel BTF", c.target))
        } else if let Some(why) = missing_fields(c, cx.offsets, cx.victim_task) {
            Refusal::NotTried(why.into())
        } else {
            match attach_one(cx, c) {
                Ok(()) => {
                    let outcome = if refused.is_empty() {
                        Outcome::Preferred(c.kind)
                    } else {
                        Outcome::Fallback { kind: c.kind, reason: reasons(&refused) }
                    };
                    return Ok(Attachment { what: hook.what, target: c.target.into(), outcome });
                }
                Err(error) => Refusal::Failed { kind: c.kind, error },
            }
        };
        log::debug!("{}: {} unavailable ({refusal})", hook.what, c.kind);
        refused.push((c, refusal));
    }
    if let Some(without) = hook.without {
        return Ok(skipped(format!("{}; {without}", reasons(&refused))));
    }
    let mut btf = "no tp_btf program for this hook".to_string();
    let mut tp = None;
    for (c, r) in refused {
        match c.kind {
            ProgramKind::TpBtf => btf = r.to_string(),
            _ => tp = Some(r),
        }
    }
    Err(LoadError::Attach {
        what: hook.what,
        target: last.target,
        btf,
        tp: tp.map_or_else(String::new, |r| r.to_string()),
    })
}

/// The refusals, as a fallback reason names them.
fn reasons(refused: &[(&Candidate, Refusal)]) -> String {
    refused.iter().map(|(c, r)| format!("{}{r}", c.label)).collect::<Vec<_>>().join("; ")
}

fn attach_one(cx: &mut Context<'_>, c: &Candidate) -> Result<(), AttachError> {
    let btf = cx.btf;
    let prog = cx.ebpf.program_mut(c.program).ok_or(AttachError::ProgramMissing)?;
    match c.kind {
        ProgramKind::TpBtf => {
            let p: &mut BtfTracePoint = prog.try_into()?;
            p.load(c.target, btf)?;
            p.attach()?;
        }
        ProgramKind::Tracepoint => {
            let (category, name) = c.tracepoint().ok_or(AttachError::NotInTable(c.kind))?;
            if let Some(why) = cx.formats.fixed_mismatch(category, name) {
                return Err(AttachError::Layout(why));
            }
            let p: &mut TracePoint = prog.try_into()?;
            // A program may serve several tracepoints (the mmap family's).
            if p.fd().is_err() {
                p.load()?;
            }
            p.attach(category, name)?;
        }
        ProgramKind::Fentry => {
            let p: &mut FEntry = prog.try_into()?;
            p.load(c.target, btf)?;
            p.attach()?;
        }
        ProgramKind::Fexit => {
            let p: &mut FExit = prog.try_into()?;
            p.load(c.target, btf)?;
            p.attach()?;
        }
        ProgramKind::Kprobe => {
            let p: &mut KProbe = prog.try_into()?;
            p.load()?;
            p.attach(c.target, 0)?;
        }
        kind @ (ProgramKind::PerfEvent | ProgramKind::OwnWalk | ProgramKind::StackId) => {
            return Err(AttachError::NotInTable(kind));
        }
    }
    Ok(())
}

/// An attach error as a person needs to hear it.
fn explain_attach(e: &str) -> String {
    if e.contains("Operation not permitted") {
        match lockdown() {
            Some(mode) => format!("refused by kernel lockdown ({mode}), which forbids fentry/fexit"),
            None => "refused (EPERM): kernel lockdown or a security module forbids fentry/fexit here".into(),
        }
    } else if e.contains("devices/kprobe/type") {
        "no kprobe PMU (/sys/bus/event_source/devices/kprobe): kprobes are not available on this kernel".into()
    } else {
        e.trim_end_matches("Verifier output: ").trim_end_matches(". ").to_string()
    }
}

/// The kernel lockdown mode when one is active ("integrity", "confidentiality")
/// and securityfs shows it.
fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let mode = text.split_whitespace().find(|w| w.starts_with('['))?.trim_matches(['[', ']']).to_string();
    (mode != "none").then_some(mode)
}

/// Tells the classic `mark_victim` hook when the tp_btf one is attached, so
/// it may leave an event for it to complete (`OOM_PENDING` in the programs).
pub(super) fn enable_oom_helper(ebpf: &mut Ebpf, attached: &[Attachment], offsets: &vmtrace_common::KernelOffsets) {
    // The tp_btf hook completes events only where it can read the victim's pid.
    let on_btf = attached.iter().any(|a| a.what == OOM_VICTIM.what && a.kind() == Some(ProgramKind::TpBtf));
    if !on_btf || offsets.task_pid == vmtrace_common::KernelOffsets::MISSING {
        return;
    }
    let set = ebpf
        .map_mut("OOM_HELPER")
        .ok_or_else(|| "no OOM_HELPER map".to_string())
        .and_then(|m| aya::maps::Array::<_, u32>::try_from(m).map_err(|e| e.to_string()))
        .and_then(|mut a| a.set(0, 1, 0).map_err(|e| e.to_string()));
    if let Err(e) = set {
        log::warn!("OOM victims' cgroups will come from /proc: {e}");
    }
}

/// arm64's fault start (`ARM64_FAULT_START`): fentry on `handle_mm_fault`
/// where the kernel allows trampolines, else the software event PAGE_FAULTS
/// (period 1) on every CPU, filtered by tgid in the program.
pub(super) fn fault_start_arm64(cx: &mut Context<'_>) -> Result<Attachment, LoadError> {
    let hook = &super::hooks::ARM64_FAULT_START;
    let [fentry, perf] = hook.candidates else { return Err(LoadError::EmptyHook(hook.what)) };
    let refusal = if cx.force_tracepoints {
        Refusal::NotTried("disabled by --force-tracepoints".into())
    } else {
        match attach_one(cx, fentry) {
            Ok(()) => {
                return Ok(Attachment {
                    what: hook.what,
                    target: fentry.target.into(),
                    outcome: Outcome::Preferred(ProgramKind::Fentry),
                })
            }
            Err(error) => Refusal::Failed { kind: fentry.kind, error },
        }
    };
    log::debug!("fault start: fentry unavailable ({refusal}); using the software event PAGE_FAULTS");
    let label = "PAGE_FAULTS";
    let cpus = aya::util::online_cpus().map_err(|(_, e)| LoadError::Cpus(e))?;
    let prog = load_perf_prog(cx.ebpf, perf.program, label)?;
    for &cpu in &cpus {
        prog.attach(
            PerfEventConfig::Software(SoftwareEvent::PageFaults),
            PerfEventScope::AllProcessesOneCpu { cpu },
            SamplePolicy::Period(1),
            false,
        )
        .map_err(|error| LoadError::Perf { event: label, err: AttachError::OnCpu { cpu, error } })?;
    }
    Ok(Attachment {
        what: hook.what,
        target: format!("{} on {} CPUs (no access type: write and exec faults not counted)", perf.target, cpus.len()),
        outcome: Outcome::Fallback { kind: ProgramKind::PerfEvent, reason: format!("{}{refusal}", fentry.label) },
    })
}

/// The fault end: fexit on `handle_mm_fault` where allowed, else software
/// perf events. Returns the rows, the effective minor period and, with
/// `end_on_tasks`, the programs for the caller's per-task events.
pub(super) fn fault_end(
    cx: &mut Context<'_>,
    config: &Config,
    opts: &LoadOptions,
) -> Result<(Vec<Attachment>, u32, Option<EndPrograms>), LoadError> {
    let fexit = &FAULT_END.candidates[0];
    // With minor latency off only majors need an end: the MAJ event costs
    // nothing on minor faults, while fexit runs on every fault. The perf
    // events are then the preferred end, not a fallback.
    let refusal = if config.minor_period == 0 {
        None
    } else if cx.force_tracepoints {
        Some(Refusal::NotTried("disabled by --force-tracepoints".into()))
    } else if config.vm_fault_major == 0 {
        Some(Refusal::NotTried("no enum vm_fault_reason in kernel BTF".into()))
    } else {
        match attach_one(cx, fexit) {
            Ok(()) => {
                let a = Attachment {
                    what: super::hooks::MEMCG_END.what,
                    target: fexit.target.into(),
                    outcome: Outcome::Preferred(ProgramKind::Fexit),
                };
                return Ok((vec![a], 1, None));
            }
            Err(error) => Some(Refusal::Failed { kind: fexit.kind, error }),
        }
    };
    if let (Some(r), true) = (&refusal, config.memcg_pgfault != 0) {
        let memcg = attach(cx, &MEMCG_END)?;
        if let Some(kind) = memcg.kind() {
            // Every fault ends at the memcg hook; the MAJ event tells majors.
            let why = format!("{}{r}", fexit.label);
            let reason = memcg.fallback_reason().map_or(why.clone(), |more| format!("{why}; {more}"));
            let mut rows = vec![Attachment { outcome: Outcome::Fallback { kind, reason: reason.clone() }, ..memcg }];
            let (maj, end_programs) =
                if opts.end_on_tasks { load_perf_end(cx.ebpf, 0)? } else { (attach_perf_end(cx.ebpf, 0)?, None) };
            let outcome = Outcome::Fallback { kind: ProgramKind::PerfEvent, reason };
            rows.extend(maj.into_iter().map(|(what, target)| Attachment { what, target, outcome: outcome.clone() }));
            return Ok((rows, 1, end_programs));
        }
        log::debug!("fault end: memcg:count_memcg_events unavailable ({:?})", memcg.fallback_reason());
    }
    if let Some(r) = &refusal {
        log::debug!("fault end: fexit unavailable ({r}); using software perf events");
    }
    let outcome = match refusal {
        None => Outcome::Preferred(ProgramKind::PerfEvent),
        Some(r) => Outcome::Fallback { kind: ProgramKind::PerfEvent, reason: format!("{}{r}", fexit.label) },
    };
    let (rows, end_programs) = if opts.end_on_tasks {
        load_perf_end(cx.ebpf, config.minor_period)?
    } else {
        (attach_perf_end(cx.ebpf, config.minor_period)?, None)
    };
    let rows = rows.into_iter().map(|(what, target)| Attachment { what, target, outcome: outcome.clone() }).collect();
    Ok((rows, config.minor_period, end_programs))
}

/// The perf-event end hooks: program, event, label, period. Period 0 for
/// minor faults: they are counted at the start hook only, never timed (the
/// software-event path costs on every minor fault even when sampling).
fn perf_end_hooks(minor_period: u32) -> Vec<(&'static str, SoftwareEvent, &'static str, u64)> {
    let [min, maj] = super::hooks::PERF_END_PROGRAMS;
    let mut hooks = vec![(maj, SoftwareEvent::PageFaultsMaj, "PAGE_FAULTS_MAJ", 1)];
    if minor_period > 0 {
        hooks.push((min, SoftwareEvent::PageFaultsMin, "PAGE_FAULTS_MIN", u64::from(minor_period)));
    }
    hooks
}

/// Loads one perf-event end program.
fn load_perf_prog<'a>(ebpf: &'a mut Ebpf, name: &str, event: &'static str) -> Result<&'a mut PerfEvent, LoadError> {
    let perf = |err: AttachError| LoadError::Perf { event, err };
    let prog: &mut PerfEvent = ebpf
        .program_mut(name)
        .ok_or(perf(AttachError::ProgramMissing))?
        .try_into()
        .map_err(|e| perf(AttachError::Program(e)))?;
    prog.load().map_err(|e| perf(AttachError::Program(e)))?;
    Ok(prog)
}

/// A fault-end row's (what, target); `on` says where the events are.
fn perf_end_row(label: &str, period: u64, on: &str) -> (&'static str, String) {
    let what = match (label, period) {
        ("PAGE_FAULTS_MAJ", _) => "major-fault end (every major)",
        (_, 1) => "minor-fault end (every minor)",
        _ => "minor-fault end (sampled)",
    };
    (what, format!("sw {label} period {period} on {on}"))
}

/// The perf-event end hooks, one perf event per CPU and kind, system-wide
/// (filtered by tgid in the program), so children are covered from their
/// first instruction.
fn attach_perf_end(ebpf: &mut Ebpf, minor_period: u32) -> Result<Vec<(&'static str, String)>, LoadError> {
    let cpus = aya::util::online_cpus().map_err(|(_, e)| LoadError::Cpus(e))?;
    let mut out = Vec::new();
    for (prog_name, event, label, period) in perf_end_hooks(minor_period) {
        let prog = load_perf_prog(ebpf, prog_name, label)?;
        for &cpu in &cpus {
            prog.attach(
                PerfEventConfig::Software(event),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(period),
                false,
            )
            .map_err(|error| LoadError::Perf { event: label, err: AttachError::OnCpu { cpu, error } })?;
        }
        out.push(perf_end_row(label, period, &format!("{} CPUs", cpus.len())));
    }
    Ok(out)
}

/// The perf-event end programs, loaded for the caller to put on the target's
/// tasks (`perf::FaultEnd`).
#[allow(clippy::type_complexity, reason = "private: rows and the programs, as both callers take them")]
fn load_perf_end(
    ebpf: &mut Ebpf,
    minor_period: u32,
) -> Result<(Vec<(&'static str, String)>, Option<EndPrograms>), LoadError> {
    let (mut out, mut maj, mut min) = (Vec::new(), None, None);
    for (prog_name, event, label, period) in perf_end_hooks(minor_period) {
        let prog = load_perf_prog(ebpf, prog_name, label)?;
        let fd = prog.fd().map_err(|e| LoadError::Perf { event: label, err: AttachError::Program(e) })?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd());
        match event {
            SoftwareEvent::PageFaultsMaj => maj = Some(fd),
            _ => min = Some((fd, period)),
        }
        out.push(perf_end_row(label, period, "the target's tasks (inherited)"));
    }
    Ok((out, maj.map(|maj| EndPrograms { min, maj })))
}

/// How user stacks are taken (`Config::user_walk`): a row of the probe selection.
pub(super) fn user_stacks(user_walk: u32, forced: bool) -> Attachment {
    let (target, outcome) = match user_walk {
        vmtrace_common::USER_WALK_WINDOWS => {
            ("frame pointers, 1 KiB reads, USER_STACKS", Outcome::Preferred(ProgramKind::OwnWalk))
        }
        vmtrace_common::USER_WALK_FRAMES => (
            "frame pointers, a read per frame, USER_STACKS",
            Outcome::Fallback {
                kind: ProgramKind::OwnWalk,
                reason: "1 KiB reads (several frames a read) are used from 6.12: 6.1's verifier gives up on that loop"
                    .into(),
            },
        ),
        _ => (
            "bpf_get_stackid, STACKS",
            Outcome::Fallback {
                kind: ProgramKind::StackId,
                reason: if forced {
                    "forced (--force-tracepoints)"
                } else {
                    "no bpf_task_pt_regs (before 5.15)"
                }
                .to_string()
                    + ": the kernel's walker, which faults on the frame at address 0 ending each chain (~1 µs per stack)",
            },
        ),
    };
    Attachment { what: "user stacks", target: target.into(), outcome }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_as_before() {
        let skipped = Attachment { what: "x", target: "t".into(), outcome: Outcome::Skipped { reason: "r".into() } };
        assert_eq!(skipped.program_type(), "none");
        assert_eq!(skipped.fallback_reason(), Some("r"));
        let json = serde_json::to_string(&user_stacks(vmtrace_common::USER_WALK_WINDOWS, false)).ok();
        assert_eq!(
            json.as_deref(),
            Some(
                r#"{"what":"user stacks","program_type":"own walk","target":"frame pointers, 1 KiB reads, USER_STACKS","fallback_reason":null}"#
            )
        );
    }

    #[test]
    fn refusals_join_with_their_labels() {
        let fentry = Candidate { kind: ProgramKind::Fentry, program: "p", target: "f", needs: "", label: "fentry: " };
        let kprobe = Candidate { kind: ProgramKind::Kprobe, program: "q", target: "f", needs: "", label: "kprobe: " };
        let refused = [
            (&fentry, Refusal::NotTried("disabled by --force-tracepoints".into())),
            (&kprobe, Refusal::Failed { kind: ProgramKind::Kprobe, error: AttachError::ProgramMissing }),
        ];
        assert_eq!(reasons(&refused), "fentry: disabled by --force-tracepoints; kprobe: program missing");
    }
}
