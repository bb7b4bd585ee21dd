//! Locating the `etcd` and `kube-apiserver` binaries the way controller-runtime's envtest does.

use std::env;
use std::path::{Path, PathBuf};

use crate::Error;

/// Where the Makefile-independent fallback looks, as in envtest.
const DEFAULT_ASSETS_DIR: &str = "/usr/local/kubebuilder/bin";

/// Paths of the control-plane binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// The `etcd` binary.
    pub etcd: PathBuf,
    /// The `kube-apiserver` binary.
    pub kube_apiserver: PathBuf,
}

impl Binaries {
    /// Finds both binaries, looking (for each, in order) at `TEST_ASSET_<NAME>`,
    /// `$KUBEBUILDER_ASSETS/<name>` and `/usr/local/kubebuilder/bin/<name>`.
    ///
    /// # Errors
    /// [`Error::MissingBinary`] naming every place that was searched.
    pub fn locate() -> Result<Self, Error> {
        Ok(Self {
            etcd: locate("etcd")?,
            kube_apiserver: locate("kube-apiserver")?,
        })
    }
}

/// `kube-apiserver` → `TEST_ASSET_KUBE_APISERVER`.
fn asset_env_var(name: &str) -> String {
    format!("TEST_ASSET_{}", name.to_uppercase().replace('-', "_"))
}

fn locate(name: &str) -> Result<PathBuf, Error> {
    let var = asset_env_var(name);
    let from_env = |key: &str| {
        env::var_os(key)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let candidates = [
        (format!("${var}"), from_env(&var)),
        (
            format!("$KUBEBUILDER_ASSETS/{name}"),
            from_env("KUBEBUILDER_ASSETS").map(|dir| dir.join(name)),
        ),
        (
            String::new(),
            Some(Path::new(DEFAULT_ASSETS_DIR).join(name)),
        ),
    ];
    if let Some(path) = candidates
        .iter()
        .filter_map(|(_, path)| path.as_ref())
        .find(|path| is_executable(path))
    {
        return Ok(path.clone());
    }
    let searched = candidates
        .iter()
        .map(|(origin, path)| match path {
            None => format!("{origin} (unset)"),
            Some(path) if origin.is_empty() => format!("{} (not found)", path.display()),
            Some(path) => format!("{origin} = {} (not an executable file)", path.display()),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::MissingBinary {
        name: name.to_owned(),
        searched,
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::asset_env_var;

    #[test]
    fn env_var_names_match_envtest() {
        assert_eq!(asset_env_var("kube-apiserver"), "TEST_ASSET_KUBE_APISERVER");
        assert_eq!(asset_env_var("etcd"), "TEST_ASSET_ETCD");
    }
}
