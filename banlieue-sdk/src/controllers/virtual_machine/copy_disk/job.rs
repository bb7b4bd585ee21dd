//! The background copy of one VM's disks ([`disk_copy::copy`]): export from the
//! source backend into the staging directory, convert, import.
//! It runs beside the reconciles (a copy takes minutes; a reconcile must not), which
//! poll it; a job lost with its process is started again from its first step (every
//! step overwrites what an interrupted one left).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::plan::Job;
use crate::backend::{BackendError, MachineIdentity, MachineRequest};
use crate::controllers::backends::Instrumented;
use crate::controllers::disk_copy::{self, Progress};

/// What a job needs: both backends, who to copy, what to create.
pub(crate) struct Input {
    pub source: Instrumented,
    pub target: Instrumented,
    pub source_identity: MachineIdentity,
    pub target_request: MachineRequest,
    /// This VM's directory under the staging root (removed when the job ends).
    pub dir: PathBuf,
}

/// The running and finished jobs, by VM UID.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: Mutex<HashMap<String, Running>>,
}

/// A started job: its state, its task (to abort) and its staging directory.
struct Running {
    state: Arc<State>,
    task: tokio::task::AbortHandle,
    dir: PathBuf,
}

/// One job's progress and, once it ended, its outcome.
#[derive(Default)]
struct State {
    progress: Progress,
    outcome: Mutex<Option<Result<(), BackendError>>>,
}

impl Jobs {
    /// Where the job of `vm` is.
    pub fn state(&self, vm: &str) -> Job {
        let jobs = self.jobs.lock().expect("copy jobs");
        let Some(Running { state, .. }) = jobs.get(vm) else {
            return Job::NotRunning;
        };
        match &*state.outcome.lock().expect("copy outcome") {
            None => Job::Running(state.progress.describe()),
            Some(Ok(())) => Job::Succeeded,
            Some(Err(e)) => Job::Failed(e.to_string()),
        }
    }

    /// Starts the job of `vm` unless one runs or has finished unread.
    pub fn start(&self, vm: &str, input: Input) {
        let mut jobs = self.jobs.lock().expect("copy jobs");
        if jobs.contains_key(vm) {
            return;
        }
        let state = Arc::new(State::default());
        let dir = input.dir.clone();
        let task_state = state.clone();
        let task = tokio::spawn(async move {
            let state = task_state;
            let outcome = run(&input, &state.progress).await;
            if let Err(e) = tokio::fs::remove_dir_all(&input.dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %input.dir.display(), error = %e, "staging not cleaned up");
            }
            *state.outcome.lock().expect("copy outcome") = Some(outcome);
        });
        jobs.insert(
            vm.to_owned(),
            Running {
                state,
                task: task.abort_handle(),
                dir,
            },
        );
    }

    /// Stops the job of `vm`, if any, and removes its staging directory: the VM is
    /// deleted, or its move was called off, while it copied (importing into a machine
    /// being deleted would leave disks behind).
    pub fn cancel(&self, vm: &str) {
        let Some(running) = self.jobs.lock().expect("copy jobs").remove(vm) else {
            return;
        };
        running.task.abort();
        tokio::spawn(async move {
            let _ = tokio::fs::remove_dir_all(&running.dir).await;
        });
    }

    /// Whether a job of `vm` is known (running, or finished and not yet acted on).
    pub fn has(&self, vm: &str) -> bool {
        self.jobs.lock().expect("copy jobs").contains_key(vm)
    }

    /// Forgets a finished job once its outcome is acted on.
    pub fn forget(&self, vm: &str) {
        self.jobs.lock().expect("copy jobs").remove(vm);
    }
}

async fn run(input: &Input, progress: &Progress) -> Result<(), BackendError> {
    let (Some(from), Some(to)) = (input.source.disk_transfer(), input.target.disk_transfer())
    else {
        return Err(BackendError::terminal(
            "CopyDiskUnsupported",
            "a backend of this move has no disk export or import",
        ));
    };
    let source = &input.source_identity;
    disk_copy::copy(
        from,
        to,
        source,
        &input.target_request,
        &input.dir,
        progress,
    )
    .await
    .map(drop)
}
