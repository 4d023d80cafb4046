//! `vmtrace check`'s probe-selection table (`trace::probe_selection` loads
//! everything `record` could and lets it go).
use super::Attachment;

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
