//! A volume's bytes over a libvirt stream (`virStorageVolUpload`/`Download`), in
//! 1 MiB chunks: it works against a remote libvirtd as well as a local one, and a
//! disk is never held in memory whole.

use std::io::{ErrorKind, Read, Write};

use banlieue_sdk::backend::BackendError;
use virt::connect::Connect;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::error::classify;

/// How much crosses the stream per call.
pub const CHUNK: usize = 1 << 20;

fn local_io(what: &str, e: &std::io::Error) -> BackendError {
    BackendError::transient("StagingIOError", format!("{what}: {e}"))
}

/// Writes `len` bytes read from `source` into `vol` from offset 0. `what` names the
/// volume in errors.
pub fn upload(
    conn: &Connect,
    vol: &StorageVol,
    what: &str,
    source: impl Read,
    len: u64,
) -> Result<(), BackendError> {
    let stream = Stream::new(conn, 0).map_err(|e| classify("opening an upload stream", &e))?;
    vol.upload(&stream, 0, len, 0)
        .map_err(|e| classify(&format!("uploading {what}"), &e))?;
    match pump(&stream, what, source, len) {
        Ok(()) => stream
            .finish()
            .map_err(|e| classify(&format!("finishing the upload of {what}"), &e)),
        Err(e) => {
            // Without an abort libvirt keeps the half-written volume's job open.
            let _ = stream.abort();
            Err(e)
        }
    }
}

fn pump(stream: &Stream, what: &str, mut source: impl Read, len: u64) -> Result<(), BackendError> {
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        let n = match source.read(&mut buf[..want]) {
            Ok(0) => {
                return Err(BackendError::transient(
                    "StagingIOError",
                    format!("uploading {what}: the file ended {left} bytes early"),
                ));
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(local_io(&format!("reading what goes to {what}"), &e)),
        };
        send_all(stream, what, &buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn send_all(stream: &Stream, what: &str, mut data: &[u8]) -> Result<(), BackendError> {
    while !data.is_empty() {
        match stream.send(data) {
            Ok(n) if n > 0 => data = &data[n as usize..],
            Ok(_) => {
                return Err(BackendError::transient(
                    "UploadFailed",
                    format!("uploading {what}: stream closed"),
                ));
            }
            Err(e) => return Err(classify(&format!("uploading {what}"), &e)),
        }
    }
    Ok(())
}

/// Copies the whole of `vol` into `sink`; returns how many bytes it wrote.
pub fn download(
    conn: &Connect,
    vol: &StorageVol,
    what: &str,
    sink: &mut impl Write,
) -> Result<u64, BackendError> {
    let stream = Stream::new(conn, 0).map_err(|e| classify("opening a download stream", &e))?;
    vol.download(&stream, 0, 0, 0)
        .map_err(|e| classify(&format!("downloading {what}"), &e))?;
    match drain(&stream, what, sink) {
        Ok(n) => {
            stream
                .finish()
                .map_err(|e| classify(&format!("finishing the download of {what}"), &e))?;
            Ok(n)
        }
        Err(e) => {
            let _ = stream.abort();
            Err(e)
        }
    }
}

fn drain(stream: &Stream, what: &str, sink: &mut impl Write) -> Result<u64, BackendError> {
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let n = stream
            .recv(&mut buf)
            .map_err(|e| classify(&format!("downloading {what}"), &e))?;
        if n <= 0 {
            return Ok(total);
        }
        let n = n as usize;
        sink.write_all(&buf[..n])
            .map_err(|e| local_io(&format!("writing {what}"), &e))?;
        total += n as u64;
    }
}
