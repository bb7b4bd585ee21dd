//! `banlieue crds`: print the CRDs as one YAML stream, or write `<group>_<plural>.yaml`
//! files into a directory (what `make crds` commits under `deploy/crds/`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Options of `banlieue crds`.
#[derive(Args, Debug)]
pub struct CrdsCommand {
    /// Write one file per CRD into this directory instead of printing them. Files of
    /// CRDs that no longer exist are removed.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

impl CrdsCommand {
    pub fn run(self) -> anyhow::Result<()> {
        let crds = banlieue_sdk::crds::all();
        match self.out_dir {
            None => {
                for crd in &crds {
                    print!("---\n{}", banlieue_sdk::crds::to_yaml(crd)?);
                }
            }
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                remove_stale_yaml(&dir)?;
                for crd in &crds {
                    let path = dir.join(banlieue_sdk::crds::file_name(crd));
                    std::fs::write(&path, banlieue_sdk::crds::to_yaml(crd)?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
                eprintln!("wrote {} CRDs to {}", crds.len(), dir.display());
            }
        }
        Ok(())
    }
}

fn remove_stale_yaml(dir: &std::path::Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}
