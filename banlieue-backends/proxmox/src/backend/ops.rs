//! The PVE tasks in flight per machine: remembering and polling them.

use super::*;

/// What polling a machine's task found.
#[derive(Debug)]
pub(super) enum Outcome {
    /// No task in flight.
    Idle,
    /// Still running.
    Running(OpKind, Upid),
    /// Finished well just now.
    Succeeded(OpKind),
    /// PVE no longer knows the task (pvedaemon restarted): it may have done anything.
    Lost,
}

impl ProxmoxBackend {
    /// Polls the task in flight for `uid`, if any: `Some(kind)` while it runs; a
    /// failed task is forgotten and returned as an error.
    pub(super) async fn poll(&self, uid: &str) -> Result<Option<(OpKind, Upid)>, BackendError> {
        Ok(match self.poll_outcome(uid).await? {
            Outcome::Running(kind, upid) => Some((kind, upid)),
            Outcome::Idle | Outcome::Succeeded(_) | Outcome::Lost => None,
        })
    }

    /// [`Self::poll`], telling apart a task that succeeded (and what it was) from one
    /// PVE no longer knows.
    pub(super) async fn poll_outcome(&self, uid: &str) -> Result<Outcome, BackendError> {
        let Some((kind, upid)) = self.tasks.get(uid) else {
            return Ok(Outcome::Idle);
        };
        match task_state(&self.client, &upid).await {
            Ok(TaskState::Running) => Ok(Outcome::Running(kind, upid)),
            Ok(TaskState::Succeeded) => {
                self.tasks.forget(uid);
                Ok(Outcome::Succeeded(kind))
            }
            Ok(TaskState::Failed(exit)) => {
                self.tasks.forget(uid);
                info!(uid, task = %upid.raw, exit, "proxmox: task failed");
                let message = format!("task {} failed: {exit}", upid.raw);
                Err(if is_lock_message(&exit) {
                    BackendError::transient("VMLocked", message)
                } else if matches!(kind, OpKind::Clone | OpKind::Resize | OpKind::Start) {
                    BackendError::terminal(kind.failure_reason(), message)
                } else {
                    BackendError::transient(kind.failure_reason(), message)
                })
            }
            // PVE forgets tasks after a restart of pvedaemon: nothing left to wait for.
            Err(e)
                if e.status() == Some(500)
                    && e.message().contains("unable to parse worker upid") =>
            {
                self.tasks.forget(uid);
                Ok(Outcome::Lost)
            }
            Err(e) => Err(pve(e)),
        }
    }

    pub(super) fn remember(
        &self,
        uid: &str,
        kind: OpKind,
        data: &Value,
    ) -> Result<Upid, BackendError> {
        let upid = upid_of(data).map_err(pve)?;
        debug!(uid, task = %upid.raw, operation = kind.operation(), "proxmox: task started");
        self.tasks.remember(uid, kind, upid.clone());
        Ok(upid)
    }
}
