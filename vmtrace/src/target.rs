//! What to trace: a command vmtrace starts, a running pid, or the whole system.
//!
//! A command is forked first and held at a pipe before `exec`, so its pid is in
//! the kernel's traced set before it runs its first instruction: the very first
//! fault of the new program is seen.
use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

#[derive(Clone, Debug)]
pub enum Target {
    Command(Vec<String>),
    Pid(u32),
    System,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("command not found: {0}\nhint: check the name, or give a path (./prog)")]
    NotFound(String),
    #[error("cannot execute {0}: {1}")]
    Exec(String, std::io::Error),
    #[error("no such process: {0}\nhint: list processes with `ps -e`")]
    NoSuchPid(u32),
    #[error("empty command: give one after `--`, e.g. vmtrace record -- python3 train.py")]
    Empty,
    #[error("{0}: {1}")]
    Sys(&'static str, std::io::Error),
}

/// `program` resolved the way execvp would: a path when it contains '/', else via $PATH.
pub fn resolve_program(program: &str) -> Result<PathBuf, TargetError> {
    let is_exec = |p: &Path| {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: valid C string.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        if !p.exists() {
            return Err(TargetError::NotFound(program.into()));
        }
        if !is_exec(&p) {
            return Err(TargetError::Exec(program.into(), std::io::Error::from_raw_os_error(libc::EACCES)));
        }
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_exec(p))
        .ok_or_else(|| TargetError::NotFound(program.into()))
}

pub fn check_pid(pid: u32) -> Result<(), TargetError> {
    if pid > 0 && Path::new(&format!("/proc/{pid}")).exists() {
        Ok(())
    } else {
        Err(TargetError::NoSuchPid(pid))
    }
}

/// A forked child waiting at a pipe to `exec` the command.
pub struct GatedChild {
    pub pid: u32,
    go: Option<OwnedFd>,
    status: OwnedFd,
    program: String,
}

fn pipe(flags: i32) -> Result<(OwnedFd, OwnedFd), TargetError> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } != 0 {
        return Err(TargetError::Sys("pipe2", std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl GatedChild {
    pub fn spawn(argv: &[String]) -> Result<Self, TargetError> {
        Self::spawn_with_output(argv, None)
    }

    /// Like `spawn`, with stdin from /dev/null and stdout+stderr into `output`
    /// (a full-screen view owns the terminal).
    pub fn spawn_with_output(argv: &[String], output: Option<&std::fs::File>) -> Result<Self, TargetError> {
        let program = argv.first().ok_or(TargetError::Empty)?;
        let path = resolve_program(program)?;
        // Everything the child needs is allocated before fork: after it, only
        // async-signal-safe calls.
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| TargetError::NotFound(program.clone()))?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| TargetError::NotFound(program.clone())))
            .collect::<Result<_, _>>()?;
        let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_argv.push(std::ptr::null());
        let devnull = match output {
            Some(_) => Some(std::fs::File::open("/dev/null").map_err(|e| TargetError::Sys("open /dev/null", e))?),
            None => None,
        };
        let redirect = output.zip(devnull.as_ref()).map(|(o, n)| (n.as_raw_fd(), o.as_raw_fd()));
        let (go_r, go_w) = pipe(libc::O_CLOEXEC)?;
        let (st_r, st_w) = pipe(libc::O_CLOEXEC)?;
        // SAFETY: the child only calls async-signal-safe functions before exec/_exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(TargetError::Sys("fork", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: child side; raw syscalls on descriptors we own.
            unsafe {
                let mut b = 0u8;
                libc::close(go_w.as_raw_fd());
                // Parent gone before releasing us (EOF): never run untraced.
                if libc::read(go_r.as_raw_fd(), (&raw mut b).cast(), 1) != 1 {
                    libc::_exit(127);
                }
                if let Some((input, out)) = redirect {
                    libc::dup2(input, 0);
                    libc::dup2(out, 1);
                    libc::dup2(out, 2);
                }
                libc::execv(c_path.as_ptr(), c_argv.as_ptr());
                let err = *libc::__errno_location();
                libc::write(st_w.as_raw_fd(), (&raw const err).cast(), 4);
                libc::_exit(127);
            }
        }
        drop(go_r);
        drop(st_w);
        Ok(Self { pid: pid as u32, go: Some(go_w), status: st_r, program: program.clone() })
    }

    /// Lets the child exec; returns once exec succeeded (or why it failed).
    pub fn release(&mut self) -> Result<(), TargetError> {
        if let Some(go) = self.go.take() {
            let b = 1u8;
            // SAFETY: writing one byte from a valid buffer.
            unsafe { libc::write(go.as_raw_fd(), (&raw const b).cast(), 1) };
        }
        let mut err = 0i32;
        // SAFETY: reading at most 4 bytes into an i32. EOF = exec succeeded (CLOEXEC).
        let n = unsafe { libc::read(self.status.as_raw_fd(), (&raw mut err).cast(), 4) };
        if n == 4 {
            let _ = wait_exit(self.pid, true);
            return Err(TargetError::Exec(self.program.clone(), std::io::Error::from_raw_os_error(err)));
        }
        Ok(())
    }
}

impl Drop for GatedChild {
    fn drop(&mut self) {
        // Never released (vmtrace failed before tracing): closing `go` makes it exit 127.
        if self.go.take().is_some() {
            let _ = wait_exit(self.pid, true);
        }
    }
}

/// Shell-style status from a wait(2) status word: the code, or 128+signal.
pub fn shell_status(wstatus: i32) -> i32 {
    if libc::WIFEXITED(wstatus) {
        libc::WEXITSTATUS(wstatus)
    } else if libc::WIFSIGNALED(wstatus) {
        128 + libc::WTERMSIG(wstatus)
    } else {
        wstatus
    }
}

/// Reaps `pid` if it has exited; `block` waits for it.
pub fn wait_exit(pid: u32, block: bool) -> Option<i32> {
    let mut st = 0;
    // SAFETY: plain waitpid on our own child.
    let r = unsafe { libc::waitpid(pid as i32, &raw mut st, if block { 0 } else { libc::WNOHANG }) };
    (r == pid as i32).then(|| shell_status(st))
}

/// Like `wait_exit`, with the child's fault counts (`StatFaults`), read from
/// /proc/PID/stat while it is a zombie, before reaping it. By then every
/// thread has folded its counts into the process's, which a read at the exit
/// tracepoint cannot promise.
pub fn wait_exit_usage(pid: u32, block: bool) -> Option<(i32, StatFaults)> {
    // SAFETY: zeroed siginfo is a valid out-parameter.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOWAIT | if block { 0 } else { libc::WNOHANG };
    // SAFETY: waitid on our own child with a valid out-pointer; WNOWAIT leaves it unreaped.
    let r = unsafe { libc::waitid(libc::P_PID, pid, &raw mut info, flags) };
    // SAFETY: si_pid is valid for a CLD_* siginfo; 0 when nothing has exited (WNOHANG).
    if r != 0 || unsafe { info.si_pid() } == 0 {
        return None;
    }
    let usage = stat_faults(pid).unwrap_or_default();
    wait_exit(pid, true).map(|st| (st, usage))
}

/// A process's fault counts from /proc/PID/stat: the kernel's task counters
/// (`min_flt`/`maj_flt`, what getrusage reads), its own (every thread,
/// live or gone) and its waited-for children's (`cminflt`: the children it
/// reaped, with theirs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFaults {
    pub minor: u64,
    pub major: u64,
    pub children_minor: u64,
}

/// `StatFaults` of `pid`, while it exists (a zombie too).
pub fn stat_faults(pid: u32) -> Option<StatFaults> {
    let stat = proc_stat_after_comm(pid)?;
    // After "(comm)": state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt, cminflt, majflt.
    let f: Vec<&str> = stat.split_whitespace().collect();
    Some(StatFaults {
        minor: f.get(7)?.parse().ok()?,
        children_minor: f.get(8)?.parse().ok()?,
        major: f.get(9)?.parse().ok()?,
    })
}

/// `/proc/PID/stat` after its `(comm)` field (a comm may hold spaces and
/// parentheses: the last `)` ends it): state, ppid, pgrp, … .
pub(crate) fn proc_stat_after_comm(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')').map(|(_, rest)| rest.to_string())
}

/// True while a (non-child) process exists.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::kill(pid as i32, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_execvp() {
        assert!(resolve_program("sh").unwrap().ends_with("sh"));
        assert!(matches!(resolve_program("no-such-cmd-vmtrace"), Err(TargetError::NotFound(_))));
        assert!(matches!(resolve_program("./no/such/path"), Err(TargetError::NotFound(_))));
        let plain = std::env::temp_dir().join(format!("vmtrace-noexec-{}", std::process::id()));
        std::fs::write(&plain, "x").unwrap();
        let r = resolve_program(plain.to_str().unwrap());
        std::fs::remove_file(&plain).unwrap();
        assert!(matches!(r, Err(TargetError::Exec(..))), "{r:?}");
    }

    #[test]
    fn shell_status_of_exit_and_signal() {
        assert_eq!(shell_status(3 << 8), 3);
        assert_eq!(shell_status(9), 137);
    }

    #[test]
    fn gated_child_runs_only_when_released() {
        let mut c = GatedChild::spawn(&["sh".into(), "-c".into(), "exit 7".into()]).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(wait_exit(c.pid, false), None, "child ran before release");
        c.release().unwrap();
        assert_eq!(wait_exit(c.pid, true), Some(7));
    }

    #[test]
    fn exited_child_is_reaped_with_its_status_and_faults() {
        let mut c = GatedChild::spawn(&["sh".into(), "-c".into(), "exit 3".into()]).unwrap();
        c.release().unwrap();
        let (st, f) = wait_exit_usage(c.pid, true).unwrap();
        assert_eq!(st, 3);
        assert!(f.minor > 0, "a shell takes some faults of its own: {f:?}");
        assert_eq!(wait_exit_usage(c.pid, false), None, "reaped");
    }

    #[test]
    fn unreleased_child_exits_127() {
        let c = GatedChild::spawn(&["true".into()]).unwrap();
        let pid = c.pid;
        drop(c);
        assert!(!pid_alive(pid), "unreleased child was not reaped");
    }
}
