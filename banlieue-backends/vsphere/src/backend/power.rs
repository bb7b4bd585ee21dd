//! Powering off: a guest shutdown when VMware Tools runs, else (or after
//! `shutdownTimeout`) a hard power-off.

use std::time::Instant;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::backend::{BackendError, Pending};

use super::vm::Vm;
use super::{OpKind, VSphereBackend, lock, vim};
use crate::client::{VimError, methods};

impl VSphereBackend {
    /// Powers a VM off: a guest shutdown first when VMware Tools runs, a hard power-off
    /// when there are no Tools or the shutdown took longer than `shutdownTimeout`.
    pub(super) async fn power_off(&self, uid: &str, vm: &Vm) -> Result<Pending, BackendError> {
        let asked = lock(&self.shutdowns).get(uid).copied();
        let hard = !vm.tools_running
            || vm.power == PowerState::Suspended
            || asked.is_some_and(|at| at.elapsed() >= self.settings.pacing.shutdown_timeout);
        if !hard {
            if asked.is_none() {
                match self
                    .client
                    .call(&methods::vm_call("ShutdownGuest", &vm.moref))
                    .await
                {
                    Ok(_) => {
                        lock(&self.shutdowns).insert(uid.to_string(), Instant::now());
                    }
                    // No Tools after all: power off.
                    Err(VimError::Fault(f)) if f.kind.starts_with("Tools") => {
                        return self.hard_power_off(uid, vm).await;
                    }
                    Err(e) => return Err(vim(e)),
                }
            }
            return Ok(Pending {
                operation: "ShuttingDown".into(),
                task: None,
                retry_after: self.settings.pacing.task_poll_interval,
            });
        }
        self.hard_power_off(uid, vm).await
    }

    pub(super) async fn hard_power_off(&self, uid: &str, vm: &Vm) -> Result<Pending, BackendError> {
        lock(&self.shutdowns).remove(uid);
        let task = self
            .start(
                uid,
                OpKind::PowerOff,
                &methods::vm_call("PowerOffVM_Task", &vm.moref),
            )
            .await?;
        Ok(self.pending(uid, OpKind::PowerOff, Some(&task)))
    }
}
