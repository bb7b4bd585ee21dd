//! Spawning and stopping the control-plane processes.
//!
//! Every child runs in its own process group (so signals reach anything it forks, and the
//! terminal's Ctrl-C does not race the harness's own teardown) and asks the kernel to
//! SIGKILL it when the thread that spawned it dies (`PR_SET_PDEATHSIG`), a backstop for a
//! test binary that is killed before its `atexit` teardown can run.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// How many log lines a startup error quotes.
const LOG_TAIL_LINES: usize = 40;

/// A running child process and where its output goes.
#[derive(Debug)]
pub(crate) struct ManagedProcess {
    name: String,
    child: Child,
    /// `None` when output is attached to the test's stdout/stderr.
    log: Option<PathBuf>,
    /// What started it, to start it again after a simulated crash.
    binary: PathBuf,
    args: Vec<OsString>,
}

impl ManagedProcess {
    /// Starts `binary` with `args`, writing its output to `<log_dir>/<name>.log`, or
    /// inheriting the harness's stdout/stderr when `attach_output` is set.
    pub(crate) fn spawn<I, S>(
        name: &str,
        binary: &Path,
        args: I,
        log_dir: &Path,
        attach_output: bool,
    ) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let log = if attach_output {
            None
        } else {
            Some(log_dir.join(format!("{name}.log")))
        };
        let child = launch(binary, &args, log.as_deref(), false)?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log,
            binary: binary.to_owned(),
            args,
        })
    }

    /// Simulates a crash: SIGKILLs the process group (no chance to clean up), waits
    /// `down_for`, and starts the process again with the same arguments, appending to
    /// its log. Must run on the thread that started it (see the module doc).
    pub(crate) fn crash_and_restart(&mut self, down_for: Duration) -> Result<(), Error> {
        if self.exited().is_none() {
            self.signal_group(libc::SIGKILL);
            let _ = self.child.wait();
        }
        std::thread::sleep(down_for);
        self.child = launch(&self.binary, &self.args, self.log.as_deref(), true)?;
        Ok(())
    }

    /// The process's name (its log file's stem).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The operating system's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last lines of the process's log, formatted for an error message.
    pub(crate) fn log_tail(&self) -> String {
        match &self.log {
            None => format!("{}'s output was attached to the test's output", self.name),
            Some(path) => match tail(path, LOG_TAIL_LINES) {
                Ok(text) if text.trim().is_empty() => format!("{} is empty", path.display()),
                Ok(text) => format!("last lines of {}:\n{text}", path.display()),
                Err(e) => format!("could not read {}: {e}", path.display()),
            },
        }
    }

    /// SIGTERMs the process group, waits up to `grace`, then SIGKILLs it.
    pub(crate) fn stop(&mut self, grace: Duration) {
        // Once the leader is reaped its group id may be reused, so signal only a live leader.
        // (etcd and kube-apiserver do not fork, so the group is just the leader.)
        if self.exited().is_some() {
            return;
        }
        self.signal_group(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "banlieue-testenv: {} did not exit within {grace:?} of SIGTERM; killing it",
            self.name
        );
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
    }

    fn signal_group(&self, signal: libc::c_int) {
        let Ok(pgid) = libc::pid_t::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) has no memory-safety preconditions. The group id is the child's pid
        // (process_group(0)); callers only signal while the leader is unreaped, so it is ours.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Spawns `binary` in its own process group with `PR_SET_PDEATHSIG`, its output going to
/// `log` (truncated, or appended to when `append`) or inherited when `None`.
fn launch(
    binary: &Path,
    args: &[OsString],
    log: Option<&Path>,
    append: bool,
) -> Result<Child, Error> {
    let mut command = Command::new(binary);
    command.args(args).stdin(Stdio::null()).process_group(0);
    if let Some(path) = log {
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(Error::io(format!("creating {}", path.display())))?;
        let stderr = file
            .try_clone()
            .map_err(Error::io("duplicating a log file handle"))?;
        command.stdout(file).stderr(stderr);
    }
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, kill).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent as libc::pid_t {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    command
        .spawn()
        .map_err(Error::io(format!("starting {}", binary.display())))
}

/// The last `lines` lines of the file at `path` (reading at most its last 64 KiB).
pub fn tail(path: &Path, lines: usize) -> io::Result<String> {
    const MAX: u64 = 64 * 1024;
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(MAX)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_returns_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&path, 2).unwrap(), "c\nd");
        assert_eq!(tail(&path, 10).unwrap(), "a\nb\nc\nd");
    }
}
