//! PVE tasks: UPIDs and task status.

use serde_json::Value;

use crate::client::{Form, PveClient, PveError, encode};

/// A parsed UPID: `UPID:{node}:{pid}:{pstart}:{starttime}:{type}:{id}:{user}:`
/// (pid, pstart and starttime in hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upid {
    /// The whole UPID, as PVE gave it.
    pub raw: String,
    /// The node the task runs on (status is asked there).
    pub node: String,
    /// Worker process ID.
    pub pid: u32,
    /// Task type, e.g. `qmclone`, `qmstart`.
    pub task_type: String,
    /// The task's object ID (a VMID for VM tasks; may be empty).
    pub id: String,
    /// Who started it (`user@realm` or `user@realm!token`).
    pub user: String,
    /// Start time, Unix seconds.
    pub start_time: u64,
}

impl Upid {
    /// Parses a UPID; `None` when it is not one.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.strip_prefix("UPID:")?;
        let parts: Vec<&str> = rest.splitn(8, ':').collect();
        if parts.len() < 7 || parts[0].is_empty() {
            return None;
        }
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        Some(Self {
            raw: text.to_string(),
            node: parts[0].to_string(),
            pid: u32::try_from(hex(parts[1])?).ok()?,
            start_time: hex(parts[3])?,
            task_type: parts[4].to_string(),
            id: parts[5].to_string(),
            user: parts[6].to_string(),
        })
    }

    /// `/nodes/{node}/tasks/{upid}/status` with the UPID URL-encoded.
    pub fn status_path(&self) -> String {
        format!(
            "/nodes/{}/tasks/{}/status",
            encode(&self.node),
            encode(&self.raw)
        )
    }
}

/// The state of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Still running.
    Running,
    /// Ended with exit status `OK` (or a warning: `WARNINGS: n`).
    Succeeded,
    /// Ended with another exit status: PVE's error text.
    Failed(String),
}

impl TaskState {
    /// Reads `GET …/tasks/{upid}/status`'s data.
    pub fn from_status(data: &Value) -> Self {
        match data.get("status").and_then(Value::as_str) {
            Some("running") => Self::Running,
            _ => {
                let exit = data
                    .get("exitstatus")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown exit status");
                if exit == "OK" || exit.starts_with("WARNINGS") {
                    Self::Succeeded
                } else {
                    Self::Failed(exit.trim_end().to_string())
                }
            }
        }
    }
}

/// Asks PVE for a task's state.
pub async fn task_state(client: &PveClient, upid: &Upid) -> Result<TaskState, PveError> {
    let data = client.get(&upid.status_path(), &Form::new()).await?;
    Ok(TaskState::from_status(&data))
}

/// The UPID a call answered with.
pub fn upid_of(data: &Value) -> Result<Upid, PveError> {
    data.as_str()
        .and_then(Upid::parse)
        .ok_or_else(|| PveError::Decode(format!("expected a task UPID, got {data}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(name: &str) -> Value {
        let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).unwrap();
        crate::client::parse(200, "OK", &bytes).unwrap()
    }

    #[test]
    fn parses_fakepves_upids() {
        let upid = upid_of(&golden("clone.json")).unwrap();
        assert_eq!(upid.node, "pve1");
        assert_eq!(upid.pid, 0x3E8);
        assert_eq!(upid.task_type, "qmclone");
        assert_eq!(upid.id, "9000");
        assert_eq!(upid.user, "root@pam!banlieue");
        assert_eq!(upid.start_time, 0x6B0C6C49);
        assert_eq!(
            upid.status_path(),
            "/nodes/pve1/tasks/UPID%3Apve1%3A000003E8%3A00001B58%3A6B0C6C49%3Aqmclone%3A9000%3Aroot%40pam%21banlieue%3A/status"
        );
    }

    #[test]
    fn parses_real_pve_upids() {
        let upid =
            Upid::parse("UPID:node-a:0030A5F4:0B2C1D3E:65F1A2B3:qmstart:101:root@pam:").unwrap();
        assert_eq!((upid.node.as_str(), upid.id.as_str()), ("node-a", "101"));
        assert!(Upid::parse("UPID:").is_none());
        assert!(Upid::parse("not a upid").is_none());
        assert!(Upid::parse("UPID:n:zz:0:0:qmstart:1:u:").is_none());
    }

    #[test]
    fn reads_task_states() {
        assert_eq!(
            TaskState::from_status(&golden("task_ok.json")),
            TaskState::Succeeded
        );
        assert_eq!(
            TaskState::from_status(&golden("task_failed.json")),
            TaskState::Failed("VM 100 already running".into())
        );
        assert_eq!(
            TaskState::from_status(&serde_json::json!({"status": "running"})),
            TaskState::Running
        );
        assert_eq!(
            TaskState::from_status(
                &serde_json::json!({"status": "stopped", "exitstatus": "WARNINGS: 2"})
            ),
            TaskState::Succeeded
        );
    }
}
