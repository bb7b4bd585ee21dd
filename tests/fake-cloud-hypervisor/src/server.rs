//! The HTTP/1.1 server on the API socket: validates, dispatches to the state machine,
//! validates the answer, records the exchange.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::openapi::{BASE, Spec};
use crate::vmm::{After, GuestPowerOff, Reply, VERSION, Vmm};

/// Command-line options.
#[derive(Clone, Debug)]
pub struct Options {
    /// The API socket (`--api-socket path=<p>` or `--api-socket <p>`).
    pub socket: PathBuf,
    /// Where to append one JSON line per exchange (`--record`).
    pub record: Option<PathBuf>,
    /// The guest's reaction to the power button (`--guest-poweroff`).
    pub guest: GuestPowerOff,
    /// How long the guest takes to react (`--guest-delay-ms`).
    pub guest_delay: Duration,
}

impl Options {
    /// Parses the arguments (without the program name). `Ok(None)` for `--version`.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Self>, String> {
        let mut args = args.into_iter();
        let mut socket = None;
        let mut record = None;
        let mut guest = GuestPowerOff::Exit;
        let mut guest_delay = Duration::from_millis(200);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--version" | "-V" => return Ok(None),
                "--api-socket" => {
                    let v = value("--api-socket")?;
                    // CH's form is `path=<p>` (or `fd=<n>`, which the fake does not take).
                    let path = v
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("path="))
                        .unwrap_or(&v);
                    socket = Some(PathBuf::from(path));
                }
                "--record" => record = Some(PathBuf::from(value("--record")?)),
                "--guest-poweroff" => {
                    guest = match value("--guest-poweroff")?.as_str() {
                        "exit" => GuestPowerOff::Exit,
                        "shutdown" => GuestPowerOff::Shutdown,
                        "ignore" => GuestPowerOff::Ignore,
                        other => {
                            return Err(format!(
                                "--guest-poweroff {other:?}: exit, shutdown or ignore"
                            ));
                        }
                    }
                }
                "--guest-delay-ms" => {
                    let v = value("--guest-delay-ms")?;
                    guest_delay = Duration::from_millis(
                        v.parse().map_err(|_| format!("--guest-delay-ms {v:?}"))?,
                    );
                }
                other => eprintln!("fake-cloud-hypervisor: ignoring argument {other:?}"),
            }
        }
        let socket = socket.ok_or("--api-socket path=<socket> is required")?;
        Ok(Some(Self {
            socket,
            record,
            guest,
            guest_delay,
        }))
    }
}

/// Runs the fake with these arguments; returns the exit code.
pub fn main_with_args(args: impl IntoIterator<Item = String>) -> i32 {
    let options = match Options::parse(args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("cloud-hypervisor {VERSION}");
            return 0;
        }
        Err(e) => {
            eprintln!("fake-cloud-hypervisor: {e}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fake-cloud-hypervisor: runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(serve(options)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fake-cloud-hypervisor: {e}");
            1
        }
    }
}

struct Shared {
    spec: Spec,
    vmm: Mutex<Vmm>,
    options: Options,
}

async fn serve(options: Options) -> Result<(), String> {
    let listener = tokio::net::UnixListener::bind(&options.socket)
        .map_err(|e| format!("binding {}: {e}", options.socket.display()))?;
    eprintln!(
        "fake-cloud-hypervisor {VERSION}: API on {}",
        options.socket.display()
    );
    let shared = Arc::new(Shared {
        spec: Spec::bundled(),
        vmm: Mutex::new(Vmm::new(std::process::id())),
        options,
    });
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("accept: {e}"))?;
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, hyper::Error>(exchange(&shared, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("fake-cloud-hypervisor: connection: {e}");
            }
        });
    }
}

fn exit(shared: &Shared) -> ! {
    let _ = std::fs::remove_file(&shared.options.socket);
    std::process::exit(0)
}

async fn exchange(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let content_type = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => Bytes::from(format!("reading the body: {e}")),
    };
    let mut violations = shared
        .spec
        .check_request(&method, &path, content_type.as_deref(), &body);
    let reply = if !violations.is_empty() {
        let chain: Vec<&str> = violations.iter().map(String::as_str).collect();
        // Unknown operations get CH's 404; malformed requests its 400.
        let status = if shared.spec.operation(&method, &path).is_none() {
            404
        } else {
            400
        };
        Reply {
            status,
            body: Some(json!(chain)),
            after: After::Nothing,
        }
    } else {
        let parsed: Option<Value> =
            (!body.is_empty()).then(|| serde_json::from_slice(&body).unwrap_or(Value::Null));
        let op = path
            .strip_prefix(BASE)
            .unwrap_or(&path)
            .trim_start_matches('/');
        shared
            .vmm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .handle(&method, op, parsed.as_ref())
    };
    let out = reply
        .body
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_default();
    let response_violations =
        shared
            .spec
            .check_response(&method, &path, reply.status, out.as_bytes());
    violations.extend(response_violations);
    for v in &violations {
        eprintln!("fake-cloud-hypervisor: OPENAPI VIOLATION: {v}");
    }
    record(shared, &method, &path, &body, &reply, &violations);
    match reply.after {
        After::Nothing => {}
        After::ExitVmm => {
            let shared = shared.clone();
            tokio::spawn(async move {
                // Let the 204 reach the client first.
                tokio::time::sleep(Duration::from_millis(20)).await;
                exit(&shared);
            });
        }
        After::PowerButton => {
            let shared = shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep(shared.options.guest_delay).await;
                match shared.options.guest {
                    GuestPowerOff::Exit => exit(&shared),
                    GuestPowerOff::Shutdown => shared
                        .vmm
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .guest_powered_off(),
                    GuestPowerOff::Ignore => {}
                }
            });
        }
    }
    let mut response = Response::builder().status(reply.status);
    if reply.body.is_some() {
        response = response.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    response
        .body(Full::new(Bytes::from(out)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn record(
    shared: &Shared,
    method: &str,
    path: &str,
    body: &[u8],
    reply: &Reply,
    violations: &[String],
) {
    let Some(file) = &shared.options.record else {
        return;
    };
    let request: Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()));
    let line = json!({
        "socket": shared.options.socket,
        "method": method,
        "path": path,
        "request": if body.is_empty() { Value::Null } else { request },
        "status": reply.status,
        "response": reply.body,
        "violations": violations,
    });
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        // One write per line: O_APPEND keeps lines from concurrent VMMs whole.
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!(
            "fake-cloud-hypervisor: OPENAPI VIOLATION LOG UNWRITABLE {}: {e}",
            file.display()
        );
    }
}
