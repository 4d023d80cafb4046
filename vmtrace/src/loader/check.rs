//! `vmtrace check`'s probe selection: load everything `record` could, report
//! what each hook got, let it go.
use super::{Attachment, Families, LoadError, LoadOptions, Probes};
use crate::stacks::StackMode;

/// Which program type each hook gets on this kernel: loads and attaches
/// everything `record` would (every family), then lets it go.
pub fn probe_selection() -> Result<Vec<Attachment>, LoadError> {
    let probes = Probes::load(&LoadOptions {
        trace_all: false,
        minor_period: 1,
        fast_period: crate::loader::DEFAULT_FAST_PERIOD,
        force_tracepoints: false,
        families: Families { oom: true, mmap: true, tlb: true, regions: true, resident: true },
        stacks: StackMode::User,
        stack_period: 64,
        stack_window: vmtrace_common::STACK_WINDOW_DEFAULT,
        leaf_region: false,
        end_on_tasks: false,
        stream_majors: false,
    })?;
    Ok(probes.attached().to_vec())
}

/// The probe-selection table of `vmtrace check`.
pub fn render_selection(attached: &[Attachment]) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\nprobe selection on this kernel (hook: program type → target):\n");
    for a in attached {
        let _ = writeln!(out, "  {:<30} {:<11} {}", a.what, a.program_type(), a.target);
        if let Some(why) = a.fallback_reason() {
            let _ = writeln!(out, "  {:<30} {:<11} fallback: {why}", "", "");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::{Outcome, ProgramKind};

    #[test]
    fn a_fallback_gets_its_own_line() {
        let rows = [
            Attachment {
                what: "exec",
                target: "sched_process_exec".into(),
                outcome: Outcome::Preferred(ProgramKind::TpBtf),
            },
            Attachment {
                what: "exit",
                target: "sched:sched_process_exit".into(),
                outcome: Outcome::Fallback {
                    kind: ProgramKind::Tracepoint,
                    reason: "disabled by --force-tracepoints".into(),
                },
            },
        ];
        assert_eq!(
            render_selection(&rows),
            "\nprobe selection on this kernel (hook: program type → target):\n\
             \x20 exec                           tp_btf      sched_process_exec\n\
             \x20 exit                           tracepoint  sched:sched_process_exit\n\
             \x20                                            fallback: disabled by --force-tracepoints\n"
        );
    }
}
