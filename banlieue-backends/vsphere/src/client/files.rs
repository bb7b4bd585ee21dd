//! Datastore files over HTTPS: vCenter's
//! `/folder/<path>?dcPath=<datacenter>&dsName=<datastore>` interface (ESXi and vcsim
//! serve it too), in the client's one SOAP session: the `vmware_soap_session` cookie
//! authenticates it, and a 401 logs in once more, as a `NotAuthenticated` fault does
//! for SOAP calls. TLS is the SOAP calls' (the Provider's CA bundle, or none when it
//! says `insecureSkipTLSVerify`).
//!
//! Bodies are streamed both ways and never held in memory (a disk is as big as it
//! is). Downloads leave all-zero chunks as holes in the local file, so a thin disk
//! does not come back as gigabytes of written zeros.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};

use banlieue_sdk::backend::BackendError;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, COOKIE, RANGE};
use reqwest::{Response, StatusCode};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::{VimClient, VimError, transport};

/// A file on a datastore, as vSphere writes it: `[datastore] dir/name.vmdk`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DatastorePath {
    /// The datastore's name.
    pub datastore: String,
    /// The path inside it, `/`-separated, without a leading `/`.
    pub path: String,
}

impl DatastorePath {
    /// `[datastore] path`.
    pub fn new(datastore: impl Into<String>, path: impl Into<String>) -> Self {
        Self {
            datastore: datastore.into(),
            path: path.into(),
        }
    }

    /// Reads vSphere's `[datastore] dir/file` notation.
    pub fn parse(text: &str) -> Option<Self> {
        let (datastore, path) = text.trim().strip_prefix('[')?.split_once(']')?;
        (!datastore.is_empty()).then(|| Self::new(datastore, path.trim_start()))
    }

    /// The file `name` in the same directory.
    pub fn sibling(&self, name: &str) -> Self {
        match self.path.rsplit_once('/') {
            Some((dir, _)) => Self::new(&self.datastore, format!("{dir}/{name}")),
            None => Self::new(&self.datastore, name),
        }
    }

    /// The file's name, without its directory.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

impl fmt::Display for DatastorePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "[{}]", self.datastore)
        } else {
            write!(f, "[{}] {}", self.datastore, self.path)
        }
    }
}

/// Why a file transfer failed: on vCenter's side, or with the local file.
#[derive(Debug)]
pub enum TransferError {
    /// vCenter: no answer, a fault, an HTTP error status.
    Remote(VimError),
    /// Reading or writing the local file.
    Local {
        /// The local file.
        path: PathBuf,
        /// What went wrong.
        error: std::io::Error,
    },
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Remote(e) => write!(f, "{e}"),
            Self::Local { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl From<VimError> for TransferError {
    fn from(error: VimError) -> Self {
        Self::Remote(error)
    }
}

impl TransferError {
    /// Classifies the error for controllers: vCenter's side as [`VimError`]s are, the
    /// local file as a terminal `StagingUnusable` (the controller owns that directory).
    pub fn into_backend(self) -> BackendError {
        match self {
            Self::Remote(e) => e.into_backend(),
            Self::Local { path, error } => BackendError::terminal(
                "StagingUnusable",
                format!("staging file {}: {error}", path.display()),
            ),
        }
    }
}

fn local(path: &Path, error: std::io::Error) -> TransferError {
    TransferError::Local {
        path: path.to_path_buf(),
        error,
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters, so datastore and
/// file names with spaces, brackets or non-ASCII letters survive (`%20`, never `+`).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Sends a request built in the session.
async fn send(request: reqwest::RequestBuilder) -> Result<Response, TransferError> {
    Ok(request.send().await.map_err(transport)?)
}

/// An error status as a [`VimError::Http`], with the start of vCenter's answer.
async fn status_error(method: &str, file: &DatastorePath, response: Response) -> TransferError {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let body: String = body.trim().chars().take(200).collect();
    let detail = if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    };
    TransferError::Remote(VimError::Http {
        status: status.as_u16(),
        message: format!("{method} {file} on the datastore: HTTP {status}{detail}"),
    })
}

impl VimClient {
    /// The URL of `file` in the datacenter at inventory path `datacenter` (`DC0`, or
    /// `folder/DC0` for one in a folder).
    pub fn datastore_file_url(&self, datacenter: &str, file: &DatastorePath) -> String {
        let path: Vec<String> = file.path.split('/').map(encode).collect();
        format!(
            "{}/folder/{}?dcPath={}&dsName={}",
            self.endpoint,
            path.join("/"),
            encode(datacenter),
            encode(&file.datastore)
        )
    }

    /// Sends a request in the session (`send` gets the cookie), logging in once more
    /// when the answer is 401 (the session expired or was ended).
    async fn in_session<F, Fut>(&self, mut send: F) -> Result<Response, TransferError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<Response, TransferError>>,
    {
        let mut renewed = false;
        loop {
            let session = self.session().await?;
            let response = send(session.cookie.expose().to_string()).await?;
            if response.status() == StatusCode::UNAUTHORIZED && !renewed {
                self.forget_session(&session).await;
                renewed = true;
                continue;
            }
            return Ok(response);
        }
    }

    /// The size of `file`, `None` when there is no such file.
    pub async fn datastore_file_size(
        &self,
        datacenter: &str,
        file: &DatastorePath,
    ) -> Result<Option<u64>, TransferError> {
        let url = self.datastore_file_url(datacenter, file);
        let response = self
            .in_session(|cookie| send(self.transfer.head(&url).header(COOKIE, cookie)))
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => Ok(Some(
                // A HEAD answer has no body: its length is only in the header.
                response
                    .headers()
                    .get(CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_default(),
            )),
            _ => Err(status_error("HEAD", file, response).await),
        }
    }

    /// The first `max` bytes of `file` (all of it when it is smaller), `None` when
    /// there is no such file. Asks for that range only; a server that sends more is
    /// cut off after `max` bytes.
    pub async fn read_datastore_file_start(
        &self,
        datacenter: &str,
        file: &DatastorePath,
        max: usize,
    ) -> Result<Option<Vec<u8>>, TransferError> {
        let url = self.datastore_file_url(datacenter, file);
        let range = format!("bytes=0-{}", max.saturating_sub(1));
        let mut response = self
            .in_session(|cookie| {
                send(
                    self.transfer
                        .get(&url)
                        .header(COOKIE, cookie)
                        .header(RANGE, &range),
                )
            })
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            // An empty file has no byte 0.
            StatusCode::RANGE_NOT_SATISFIABLE => return Ok(Some(Vec::new())),
            s if s.is_success() => {}
            _ => return Err(status_error("GET", file, response).await),
        }
        let mut out = Vec::new();
        while out.len() < max {
            match response.chunk().await.map_err(transport)? {
                Some(chunk) => out.extend_from_slice(&chunk),
                None => break,
            }
        }
        out.truncate(max);
        Ok(Some(out))
    }

    /// Streams up to `limit` bytes of `file` into `to` (the local file at `path`),
    /// from `to`'s current position. All-zero chunks are skipped with a seek, leaving
    /// holes: the caller sets the file's final length. Returns how many bytes the
    /// remote file gave (less than `limit` when it is shorter), `None` when there is
    /// no such file.
    pub async fn download_datastore_file(
        &self,
        datacenter: &str,
        file: &DatastorePath,
        to: &mut tokio::fs::File,
        path: &Path,
        limit: u64,
    ) -> Result<Option<u64>, TransferError> {
        let url = self.datastore_file_url(datacenter, file);
        let mut response = self
            .in_session(|cookie| send(self.transfer.get(&url).header(COOKIE, cookie)))
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            s if s.is_success() => {}
            _ => return Err(status_error("GET", file, response).await),
        }
        let mut done: u64 = 0;
        while done < limit {
            let Some(chunk) = response.chunk().await.map_err(transport)? else {
                break;
            };
            let room = usize::try_from(limit - done).unwrap_or(usize::MAX);
            let chunk = &chunk[..chunk.len().min(room)];
            if chunk.iter().all(|b| *b == 0) {
                let skip = i64::try_from(chunk.len()).unwrap_or(i64::MAX);
                to.seek(std::io::SeekFrom::Current(skip))
                    .await
                    .map_err(|e| local(path, e))?;
            } else {
                to.write_all(chunk).await.map_err(|e| local(path, e))?;
            }
            done += chunk.len() as u64;
        }
        to.flush().await.map_err(|e| local(path, e))?;
        Ok(Some(done))
    }

    /// Streams the local file at `from` to `file`, replacing what is there. Returns
    /// the bytes sent.
    pub async fn upload_datastore_file(
        &self,
        datacenter: &str,
        file: &DatastorePath,
        from: &Path,
    ) -> Result<u64, TransferError> {
        let url = self.datastore_file_url(datacenter, file);
        let len = tokio::fs::metadata(from)
            .await
            .map_err(|e| local(from, e))?
            .len();
        let url = &url;
        let response = self
            .in_session(|cookie| async move {
                // Opened per attempt: a retried request needs the body from the start.
                let body = tokio::fs::File::open(from)
                    .await
                    .map_err(|e| local(from, e))?;
                send(
                    self.transfer
                        .put(url)
                        .header(COOKIE, cookie)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        // vCenter wants the length up front; the body is still streamed.
                        .header(CONTENT_LENGTH, len)
                        .body(reqwest::Body::from(body)),
                )
                .await
            })
            .await?;
        if !response.status().is_success() {
            return Err(status_error("PUT", file, response).await);
        }
        Ok(len)
    }

    /// Writes `bytes` (a small file, e.g. a disk descriptor) to `file`, replacing what
    /// is there.
    pub async fn upload_datastore_bytes(
        &self,
        datacenter: &str,
        file: &DatastorePath,
        bytes: &[u8],
    ) -> Result<(), TransferError> {
        let url = self.datastore_file_url(datacenter, file);
        let response = self
            .in_session(|cookie| {
                send(
                    self.transfer
                        .put(&url)
                        .header(COOKIE, cookie)
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .body(bytes.to_vec()),
                )
            })
            .await?;
        if !response.status().is_success() {
            return Err(status_error("PUT", file, response).await);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datastore_paths_read_and_print_as_vsphere_writes_them() {
        let p = DatastorePath::parse("[LocalDS_0] banlieue/u/os.vmdk").unwrap();
        assert_eq!(p, DatastorePath::new("LocalDS_0", "banlieue/u/os.vmdk"));
        assert_eq!(p.to_string(), "[LocalDS_0] banlieue/u/os.vmdk");
        assert_eq!(p.file_name(), "os.vmdk");
        assert_eq!(p.sibling("os-flat.vmdk").path, "banlieue/u/os-flat.vmdk");
        assert_eq!(
            DatastorePath::parse("[my ds]top.vmdk")
                .unwrap()
                .sibling("x")
                .path,
            "x"
        );
        assert_eq!(DatastorePath::parse("[]x"), None);
        assert_eq!(DatastorePath::parse("no brackets"), None);
        assert_eq!(DatastorePath::new("ds", "").to_string(), "[ds]");
    }

    #[test]
    fn names_are_percent_encoded_never_plus() {
        assert_eq!(encode("my ds+[1]/é"), "my%20ds%2B%5B1%5D%2F%C3%A9");
        assert_eq!(encode("DC0_C1-a.b~"), "DC0_C1-a.b~");
    }
}
