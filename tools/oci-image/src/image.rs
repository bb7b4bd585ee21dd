//! The image: one layer from a directory, its config, manifest and index, written as an
//! OCI layout inside a tar archive.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};
use flate2::{Compression, GzBuilder};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// What goes into the image config besides the filesystem.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    /// Full reference (`registry/repository:tag`), recorded in the index.
    pub reference: String,
    /// Every timestamp, in seconds since the epoch.
    pub epoch: u64,
    /// `User`.
    pub user: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Option<Vec<String>>,
    /// `Cmd`.
    pub cmd: Option<Vec<String>>,
    /// `Env`, `NAME=value`.
    pub env: Vec<String>,
    /// `Labels`, in the order given (written sorted).
    pub labels: Vec<(String, String)>,
}

/// What [`write_archive`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// `sha256:<hex>` of the manifest: the image's digest.
    pub manifest_digest: String,
    /// Files, directories and links in the layer.
    pub files: usize,
    /// The compressed layer's size.
    pub layer_bytes: usize,
}

fn sha256(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// The directory as an uncompressed tar: entries sorted by path, owners' numbers and
/// modes as on disk, owners' names empty, every time `epoch`.
fn layer_tar(rootfs: &Path, epoch: u64) -> Result<(Vec<u8>, usize)> {
    if !rootfs.is_dir() {
        bail!("{} is not a directory", rootfs.display());
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut count = 0;
    let walk = walkdir::WalkDir::new(rootfs)
        .min_depth(1)
        .sort_by_file_name()
        .follow_links(false);
    for entry in walk {
        let entry = entry.with_context(|| format!("walking {}", rootfs.display()))?;
        let relative = entry.path().strip_prefix(rootfs).expect("under the root");
        let meta = entry
            .path()
            .symlink_metadata()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        let mut header = tar::Header::new_ustar();
        header.set_mtime(epoch);
        header.set_uid(u64::from(meta.uid()));
        header.set_gid(u64::from(meta.gid()));
        header.set_mode(meta.permissions().mode() & 0o7777);
        header.set_username("")?;
        header.set_groupname("")?;
        let kind = meta.file_type();
        if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            builder.append_data(&mut header, relative, std::io::empty())?;
        } else if kind.is_symlink() {
            let target = fs::read_link(entry.path())?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, relative, target)?;
        } else if kind.is_file() {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            let file = fs::File::open(entry.path())?;
            builder.append_data(&mut header, relative, file)?;
        } else {
            bail!(
                "{}: only files, directories and symlinks go into an image",
                entry.path().display()
            );
        }
        count += 1;
    }
    Ok((builder.into_inner()?, count))
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    // No file name, time 0: the bytes depend on the input only.
    let mut encoder = GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

fn rfc3339(epoch: u64) -> String {
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm): no date crate
    // for one timestamp.
    let days = i64::try_from(epoch / 86_400).unwrap_or(i64::MAX);
    let secs = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn config(spec: &Spec, diff_id: &str) -> Value {
    let mut inner = serde_json::Map::new();
    if let Some(user) = &spec.user {
        inner.insert("User".into(), json!(user));
    }
    if !spec.env.is_empty() {
        inner.insert("Env".into(), json!(spec.env));
    }
    if let Some(entrypoint) = &spec.entrypoint {
        inner.insert("Entrypoint".into(), json!(entrypoint));
    }
    if let Some(cmd) = &spec.cmd {
        inner.insert("Cmd".into(), json!(cmd));
    }
    let mut labels: Vec<_> = spec.labels.clone();
    labels.sort();
    if !labels.is_empty() {
        let map: serde_json::Map<String, Value> = labels
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        inner.insert("Labels".into(), Value::Object(map));
    }
    let created = rfc3339(spec.epoch);
    json!({
        "created": created,
        "architecture": architecture(),
        "os": "linux",
        "config": inner,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created": created, "created_by": "oci-image (banlieue make image)"}],
    })
}

struct Blob {
    hex: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        Self {
            hex: sha256(&bytes),
            bytes,
        }
    }
    fn descriptor(&self, media_type: &str) -> Value {
        json!({"mediaType": media_type, "digest": format!("sha256:{}", self.hex), "size": self.bytes.len()})
    }
}

/// Builds the image of `rootfs` and writes it to `out` as an OCI layout archive.
pub fn write_archive(rootfs: &Path, spec: &Spec, out: &Path) -> Result<Written> {
    let (tar, files) = layer_tar(rootfs, spec.epoch)?;
    let diff_id = sha256(&tar);
    let layer = Blob::new(gzip(&tar)?);
    drop(tar);
    let config = Blob::new(serde_json::to_vec(&config(spec, &diff_id))?);
    let manifest = Blob::new(serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config.descriptor(CONFIG),
        "layers": [layer.descriptor(LAYER)],
    }))?);
    let mut entry = manifest.descriptor(MANIFEST);
    entry["annotations"] = json!({
        // containerd (`ctr images import`) names the image from the first, the OCI
        // spec's tools from the second.
        "io.containerd.image.name": spec.reference,
        "org.opencontainers.image.ref.name": spec.reference,
    });
    let index =
        serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": [entry]}))?;
    let docker = serde_json::to_vec(&json!([{
        "Config": format!("blobs/sha256/{}", config.hex),
        "RepoTags": [spec.reference],
        "Layers": [format!("blobs/sha256/{}", layer.hex)],
    }]))?;

    let mut archive = tar::Builder::new(Vec::new());
    let mut put = |path: &str, bytes: &[u8], dir: bool| -> Result<()> {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(spec.epoch);
        header.set_uid(0);
        header.set_gid(0);
        header.set_username("")?;
        header.set_groupname("")?;
        header.set_mode(if dir { 0o755 } else { 0o644 });
        header.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        header.set_size(bytes.len() as u64);
        archive.append_data(&mut header, path, bytes)?;
        Ok(())
    };
    put("blobs/", &[], true)?;
    put("blobs/sha256/", &[], true)?;
    let mut blobs = [&layer, &config, &manifest];
    blobs.sort_by(|a, b| a.hex.cmp(&b.hex));
    for blob in blobs {
        put(&format!("blobs/sha256/{}", blob.hex), &blob.bytes, false)?;
    }
    put("index.json", &index, false)?;
    put("manifest.json", &docker, false)?;
    put("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#, false)?;
    let bytes = archive.into_inner()?;
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent)?;
    }
    let partial = out.with_extension("partial");
    fs::write(&partial, &bytes).with_context(|| format!("writing {}", partial.display()))?;
    fs::rename(&partial, out)?;
    Ok(Written {
        manifest_digest: format!("sha256:{}", manifest.hex),
        files,
        layer_bytes: layer.bytes.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("usr/local/bin")).unwrap();
        fs::create_dir_all(dir.path().join("tmp")).unwrap();
        fs::set_permissions(dir.path().join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::write(dir.path().join("usr/local/bin/tool"), b"#!/bin/true\n").unwrap();
        fs::set_permissions(
            dir.path().join("usr/local/bin/tool"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        fs::write(
            dir.path().join("etc-passwd"),
            b"nonroot:x:65532:65532::/:/sbin/nologin\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("usr/local/bin/tool", dir.path().join("link")).unwrap();
        dir
    }

    fn spec() -> Spec {
        Spec {
            reference: "example.test/tool:1".into(),
            epoch: 1_700_000_000,
            user: Some("65532:65532".into()),
            entrypoint: Some(vec!["/usr/local/bin/tool".into()]),
            cmd: Some(vec!["run".into()]),
            env: vec!["PATH=/usr/local/bin".into()],
            labels: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
        }
    }

    fn entries(archive: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut tar = tar::Archive::new(fs::File::open(archive).unwrap());
        for e in tar.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            out.insert(path, bytes);
        }
        out
    }

    #[test]
    fn the_same_tree_gives_the_same_digest_whatever_its_files_times() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let a = write_archive(root.path(), &spec(), &out.path().join("a.tar")).unwrap();
        // Touch a file: its time on disk changes, the image does not.
        let file = fs::File::options()
            .write(true)
            .open(root.path().join("usr/local/bin/tool"))
            .unwrap();
        file.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5))
            .unwrap();
        let b = write_archive(root.path(), &spec(), &out.path().join("b.tar")).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            fs::read(out.path().join("a.tar")).unwrap(),
            fs::read(out.path().join("b.tar")).unwrap()
        );
        // A changed byte is a different image.
        fs::write(root.path().join("usr/local/bin/tool"), b"#!/bin/false\n").unwrap();
        let c = write_archive(root.path(), &spec(), &out.path().join("c.tar")).unwrap();
        assert_ne!(a.manifest_digest, c.manifest_digest);
    }

    #[test]
    fn the_archive_is_an_oci_layout_whose_digests_match_their_blobs() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let written = write_archive(root.path(), &spec(), &out.path().join("i.tar")).unwrap();
        let files = entries(&out.path().join("i.tar"));
        for (path, bytes) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/").filter(|h| !h.is_empty()) {
                assert_eq!(sha256(bytes), hex, "{path}");
            }
        }
        let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
        assert_eq!(
            index["manifests"][0]["digest"],
            json!(written.manifest_digest)
        );
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            json!("example.test/tool:1")
        );
        let manifest: Value = serde_json::from_slice(
            &files[&format!("blobs/sha256/{}", &written.manifest_digest[7..])],
        )
        .unwrap();
        let config_hex = manifest["config"]["digest"].as_str().unwrap()[7..].to_owned();
        let config: Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{config_hex}")]).unwrap();
        assert_eq!(config["config"]["User"], json!("65532:65532"));
        assert_eq!(config["config"]["Labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(config["created"], json!("2023-11-14T22:13:20Z"));
        // The layer holds the tree with its modes, and its diff_id is the uncompressed tar's.
        let layer_hex = manifest["layers"][0]["digest"].as_str().unwrap()[7..].to_owned();
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(&files[&format!("blobs/sha256/{layer_hex}")][..])
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            json!(format!("sha256:{}", sha256(&tar)))
        );
        let mut modes = BTreeMap::new();
        for e in tar::Archive::new(&tar[..]).entries().unwrap() {
            let e = e.unwrap();
            modes.insert(
                e.path().unwrap().to_string_lossy().into_owned(),
                e.header().mode().unwrap(),
            );
        }
        assert_eq!(modes["tmp"], 0o1777);
        assert_eq!(modes["usr/local/bin/tool"], 0o755);
        assert!(modes.contains_key("link"));
        assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
    }

    #[test]
    fn dates_are_utc_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_199), "2026-11-30T23:59:59Z");
    }
}
