//! VMM processes: start one per machine, tell whether it still runs, stop it.
//!
//! A VMM is started in its own process group (so signals aimed at the operator do not
//! reach it) with its output in the machine's `vmm.log`, and a thread reaps it when
//! it exits. It outlives the operator: a restarted operator finds it again through
//! the pid in `state.json`, and checks `/proc/<pid>` — not a zombie, and its command
//! line names this machine's API socket — so a recycled pid is never mistaken for it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use banlieue_sdk::backend::BackendError;

/// True when `pid` is a live process whose command line contains `socket`.
pub fn alive(pid: u32, socket: &Path) -> bool {
    let proc = Path::new("/proc").join(pid.to_string());
    let Ok(stat) = std::fs::read_to_string(proc.join("stat")) else {
        return false;
    };
    // `pid (comm) S ...`: the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z" | "X" | "x")) || state.is_none() {
        return false;
    }
    let Ok(cmdline) = std::fs::read(proc.join("cmdline")) else {
        return false;
    };
    let socket = socket.to_string_lossy();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| String::from_utf8_lossy(arg).contains(socket.as_ref()))
}

/// A VMM just started.
#[derive(Clone, Debug)]
pub struct Spawned {
    /// Its pid.
    pub pid: u32,
    exited: Arc<AtomicBool>,
}

impl Spawned {
    /// True once the process has exited (known from its reaper, so there is no window
    /// where a process in the middle of `exec` looks like a stranger).
    pub fn exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }
}

/// Starts `binary --api-socket path=<socket>` with output appended to `log`.
/// A missing or unusable binary is terminal.
pub fn spawn(binary: &Path, socket: &Path, log: &Path) -> Result<Spawned, BackendError> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| {
                BackendError::transient("HostIOError", format!("opening {}: {e}", log.display()))
            })
    };
    let mut command = Command::new(binary);
    command
        .arg("--api-socket")
        .arg(format!("path={}", socket.display()))
        .stdin(Stdio::null())
        .stdout(open()?)
        .stderr(open()?);
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    let mut child = command.spawn().map_err(|e| {
        let reason = if e.kind() == std::io::ErrorKind::NotFound {
            "BinaryNotFound"
        } else {
            "VMMStartFailed"
        };
        BackendError::terminal(
            reason,
            format!(
                "starting {}: {e} (Provider setting `binary`)",
                binary.display()
            ),
        )
    })?;
    let pid = child.id();
    let exited = Arc::new(AtomicBool::new(false));
    let flag = exited.clone();
    // Reap it whenever it exits, so a dead VMM never lingers as a zombie that looks alive.
    std::thread::Builder::new()
        .name(format!("vmm-{pid}"))
        .spawn(move || {
            let _ = child.wait();
            flag.store(true, Ordering::SeqCst);
        })
        .map_err(|e| BackendError::transient("HostIOError", format!("reaper thread: {e}")))?;
    Ok(Spawned { pid, exited })
}

/// Sends SIGTERM (or SIGKILL when `kill`) to `pid`. Errors (already gone) are ignored.
pub fn signal(pid: u32, kill: bool) {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let signal = if kill {
        rustix::process::Signal::KILL
    } else {
        rustix::process::Signal::TERM
    };
    let _ = rustix::process::kill_process(pid, signal);
}

/// The last lines of a VMM's log, for error messages.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_live_vmm_from_a_dead_or_foreign_one() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        // A shell script stands in for a VMM: its command line keeps the arguments.
        let sh = dir.path().join("vmm.sh");
        std::fs::write(&sh, "#!/bin/sh\nsleep 30\n").unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&sh)
            .status()
            .unwrap();
        let spawned = spawn(&sh, &socket, &dir.path().join("log")).unwrap();
        let pid = spawned.pid;
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(alive(pid, &socket));
        assert!(!spawned.exited());
        assert!(
            !alive(pid, &dir.path().join("other.sock")),
            "another machine's socket"
        );
        assert!(!alive(std::process::id(), &socket));
        signal(pid, true);
        let gone = (0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            !alive(pid, &socket)
        });
        assert!(gone, "a killed VMM is reaped and reported dead");
        assert!(spawned.exited());
        let e = spawn(
            Path::new("/nonexistent/ch"),
            &socket,
            &dir.path().join("log"),
        )
        .unwrap_err();
        assert_eq!(e.reason, "BinaryNotFound");
    }
}
