//! Stopping control planes when the test binary exits, and removing what crashed runs left.
//!
//! Test binaries end with `std::process::exit`, which runs C `atexit` handlers but no
//! destructors of statics, so the shared control plane is stopped from an `atexit` hook.

use std::env;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};
use std::time::Duration;

use tempfile::TempDir;

use crate::process::ManagedProcess;

/// Control-plane directories are named `<prefix><pid>-<random>` under the system temp dir.
pub(crate) const DIR_PREFIX: &str = "banlieue-testenv-";

/// A file marking a directory kept on purpose (`BANLIEUE_TESTENV_KEEP=1`), which later runs
/// must not remove.
const KEEP_MARKER: &str = ".banlieue-testenv-keep";

/// The processes and directory of one control plane. Dropping it stops the processes (last
/// started first: the apiserver before etcd) and removes the directory.
#[derive(Debug)]
pub(crate) struct Running {
    dir: Option<TempDir>,
    keep_dir: bool,
    stop_timeout: Duration,
    processes: Vec<ManagedProcess>,
}

impl Running {
    pub(crate) fn new(dir: TempDir, keep_dir: bool, stop_timeout: Duration) -> Self {
        Self {
            dir: Some(dir),
            keep_dir,
            stop_timeout,
            processes: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, process: ManagedProcess) {
        self.processes.push(process);
    }

    pub(crate) fn process_mut(&mut self, name: &str) -> Option<&mut ManagedProcess> {
        self.processes.iter_mut().find(|p| p.name() == name)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop(self.stop_timeout);
        }
        let Some(dir) = self.dir.take() else { return };
        if self.keep_dir {
            let path = dir.keep();
            let _ = fs::write(path.join(KEEP_MARKER), b"");
            crate::note(&format!("kept {} (BANLIEUE_TESTENV_KEEP)", path.display()));
        } else {
            let path = dir.path().to_owned();
            if let Err(e) = dir.close() {
                crate::note(&format!("could not remove {}: {e}", path.display()));
            }
        }
    }
}

/// A control plane's [`Running`] state, shared between its handle and the `atexit` hook.
/// `None` once it has been shut down.
pub(crate) type Slot = Arc<Mutex<Option<Running>>>;

static LIVE: Mutex<Vec<Slot>> = Mutex::new(Vec::new());
static AT_EXIT: Once = Once::new();

/// Tracks `running` so that it is shut down at process exit at the latest.
pub(crate) fn register(running: Running) -> Slot {
    AT_EXIT.call_once(|| {
        // SAFETY: `at_exit` is an `extern "C" fn()` that does not unwind (see below).
        if unsafe { libc::atexit(at_exit) } != 0 {
            crate::note("atexit registration failed; relying on PR_SET_PDEATHSIG");
        }
    });
    let slot = Arc::new(Mutex::new(Some(running)));
    lock(&LIVE).push(Arc::clone(&slot));
    slot
}

/// Stops the processes and removes the directory, if not done already.
pub(crate) fn shutdown(slot: &Slot) {
    let running = lock(slot).take();
    drop(running);
}

/// Locks `mutex`, ignoring poisoning: a test that panicked must not block teardown.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

extern "C" fn at_exit() {
    // Unwinding out of an `extern "C"` function aborts; teardown is best-effort, so swallow
    // any panic rather than turning a passing run into an abort.
    let _ = std::panic::catch_unwind(|| {
        let slots = std::mem::take(&mut *lock(&LIVE));
        for slot in &slots {
            shutdown(slot);
        }
    });
}

/// Removes control-plane directories whose owning process no longer exists (left behind by a
/// test binary that was killed), except ones kept on purpose.
pub(crate) fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(env::temp_dir()) else {
        return;
    };
    let own = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        if pid == own || is_alive(pid) || path.join(KEEP_MARKER).exists() || !is_dir(&path) {
            continue;
        }
        match fs::remove_dir_all(&path) {
            Ok(()) => crate::note(&format!("removed stale {}", path.display())),
            Err(e) => crate::note(&format!("could not remove stale {}: {e}", path.display())),
        }
    }
}

fn is_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

fn is_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 only checks for existence and permission.
    let ret = unsafe { libc::kill(pid, 0) };
    ret == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::is_alive;

    #[test]
    fn own_process_is_alive() {
        assert!(is_alive(std::process::id()));
    }
}
