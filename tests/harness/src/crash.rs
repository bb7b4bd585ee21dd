//! Crashing a control-plane process on purpose ([`ControlPlane::crash`]), to test how
//! clients live through an apiserver or etcd outage.
//!
//! [`ControlPlane::crash`]: crate::ControlPlane::crash

use std::time::Duration;

use kube::Client;

use crate::Error;
use crate::control_plane::{ETCD, KUBE_APISERVER, apiserver_ready, etcd_healthy, wait_ready};
use crate::teardown::{self, Slot};

/// A control-plane process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// etcd: the apiserver loses its storage; requests fail until it returns.
    Etcd,
    /// kube-apiserver: connections are refused and every watch breaks.
    KubeApiServer,
}

impl Component {
    pub(crate) fn process_name(self) -> &'static str {
        match self {
            Self::Etcd => ETCD,
            Self::KubeApiServer => KUBE_APISERVER,
        }
    }
}

/// A crash asked for by a test, answered once the process is back.
pub(crate) struct Request {
    pub(crate) component: Component,
    pub(crate) down_for: Duration,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<(), Error>>,
}

/// Carries out crash requests on the control-plane thread: the processes must be
/// started again from the thread that owns them (`PR_SET_PDEATHSIG`).
pub(crate) struct Crasher {
    pub(crate) running: Slot,
    pub(crate) client: Client,
    pub(crate) etcd_port: u16,
    pub(crate) start_timeout: Duration,
}

impl Crasher {
    pub(crate) async fn handle(&self, request: Request) {
        let result = self.crash(request.component, request.down_for).await;
        let _ = request.reply.send(result);
    }

    async fn crash(&self, component: Component, down_for: Duration) -> Result<(), Error> {
        let name = component.process_name();
        {
            let mut running = teardown::lock(&self.running);
            let process = running
                .as_mut()
                .and_then(|r| r.process_mut(name))
                .ok_or_else(|| Error::Io {
                    context: format!("crashing {name}"),
                    source: std::io::Error::other("the control plane was already stopped"),
                })?;
            process.crash_and_restart(down_for)?;
        }
        match component {
            Component::Etcd => {
                wait_ready(&self.running, name, self.start_timeout, || {
                    etcd_healthy(self.etcd_port)
                })
                .await?;
                // The apiserver reconnects on its own; wait until it serves again.
                wait_ready(&self.running, KUBE_APISERVER, self.start_timeout, || {
                    apiserver_ready(&self.client)
                })
                .await
            }
            Component::KubeApiServer => {
                wait_ready(&self.running, name, self.start_timeout, || {
                    apiserver_ready(&self.client)
                })
                .await
            }
        }
    }
}
