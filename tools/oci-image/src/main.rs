//! `oci-image`: packs a root filesystem directory into an OCI image archive (an OCI
//! image layout in a tar file, with Docker's `manifest.json` beside it so `docker load`
//! takes it too), one layer, without a container engine or a registry.
//!
//! The same directory and flags give the same bytes, so the same digest: entries are
//! sorted by path, every time is `--epoch` (the commit time), owner names are empty,
//! and gzip records no file name or time. See ADR 0017 for why this tool exists.

mod image;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Parser;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "oci-image",
    about = "Pack a root filesystem into a reproducible OCI image archive"
)]
struct Args {
    /// The root filesystem to pack (owners and modes are taken from it).
    #[arg(long)]
    rootfs: PathBuf,
    /// The archive to write.
    #[arg(long)]
    out: PathBuf,
    /// The image's full reference, e.g. `ghcr.io/banlieue-io/banlieue:0.1.0`.
    #[arg(long = "ref")]
    reference: String,
    /// Seconds since the epoch for every timestamp (the image's `created`, file times).
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// The image config's `User`.
    #[arg(long)]
    user: Option<String>,
    /// `Entrypoint`, as a JSON array.
    #[arg(long)]
    entrypoint: Option<String>,
    /// `Cmd`, as a JSON array.
    #[arg(long)]
    cmd: Option<String>,
    /// `Env` entries, `NAME=value`.
    #[arg(long = "env")]
    env: Vec<String>,
    /// `Labels`, `key=value`.
    #[arg(long = "label")]
    labels: Vec<String>,
}

fn json_array(flag: &str, value: &Option<String>) -> Result<Option<Vec<String>>> {
    value
        .as_deref()
        .map(|v| {
            serde_json::from_str(v)
                .with_context(|| format!("--{flag} is not a JSON array of strings: {v}"))
        })
        .transpose()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut labels = Vec::new();
    for label in &args.labels {
        let Some((k, v)) = label.split_once('=') else {
            bail!("--label {label}: want key=value");
        };
        labels.push((k.to_owned(), v.to_owned()));
    }
    for env in &args.env {
        if !env.contains('=') {
            bail!("--env {env}: want NAME=value");
        }
    }
    let spec = image::Spec {
        reference: args.reference.clone(),
        epoch: args.epoch,
        user: args.user.clone(),
        entrypoint: json_array("entrypoint", &args.entrypoint)?,
        cmd: json_array("cmd", &args.cmd)?,
        env: args.env.clone(),
        labels,
    };
    let written = image::write_archive(&args.rootfs, &spec, &args.out)?;
    println!("{} {}", written.manifest_digest, args.out.display());
    eprintln!(
        "oci-image: {} -> {} ({} files, layer {} bytes compressed)",
        args.reference,
        args.out.display(),
        written.files,
        written.layer_bytes
    );
    Ok(())
}
