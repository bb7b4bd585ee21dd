//! Which host files a machine's OS disk may be backed by. `sources.libvirt` names a
//! storage-pool volume or a host path, written by anyone allowed to create a
//! `LibvirtMachine` (or a VMImage); the file is on the libvirt host, so the check asks
//! the host, through libvirt:
//!
//! - the image must be a volume libvirt knows, of type `file` (a `block` volume, a
//!   host disk or LV, a directory or a network volume is refused);
//! - its path, as libvirt reports it (and a `path` source as written, `..` folded),
//!   must be inside one of the directories of the Provider setting `imageDirectories`
//!   (comma list of absolute directories on the host). Default: the target
//!   directories of the host's active `dir`, `fs` and `netfs` storage pools, where
//!   libvirt already keeps VM storage;
//! - it must not be a machine's own volume (`bnl-<uid>-…`: another machine's disk or
//!   its seed, which holds bootstrap secrets);
//! - when the daemon is local (`qemu:///…`) and the operator sees the path, symlinks
//!   are resolved too: it must resolve to a regular file inside the directories. A
//!   remote host's (or a daemon in another mount namespace's) symlinks cannot be read
//!   through libvirt; there the host's own administrator decides what a pool holds.
//!
//! A refusal is the terminal `PathNotAllowed`, before any volume is made.

use std::path::{Component, Path, PathBuf};

use banlieue_sdk::api::vm_image::LibvirtImageSource;
use banlieue_sdk::backend::BackendError;
use virt::connect::Connect;

use crate::error::{classify, is_not_found};

/// The setting naming the directories images may come from.
pub const IMAGE_DIRECTORIES_SETTING: &str = "imageDirectories";

/// Reason of the terminal error of an image outside them.
pub const PATH_NOT_ALLOWED: &str = "PathNotAllowed";

/// Prefix of the volumes banlieue makes for machines (see [`crate::domain`]).
const MACHINE_VOLUME_PREFIX: &str = "bnl-";

/// libvirt's `virStorageVolType`, as reported by `virStorageVolGetInfo`.
const VOL_FILE: u32 = 0;

fn vol_type(kind: u32) -> &'static str {
    match kind {
        0 => "file",
        1 => "block",
        2 => "dir",
        3 => "network",
        4 => "netdir",
        5 => "ploop",
        _ => "unknown",
    }
}

/// The directories of `imageDirectories`, `None` when unset (the pools' directories
/// apply). Every entry an absolute path without `..`.
pub fn parse_dirs(value: Option<&str>) -> Result<Option<Vec<PathBuf>>, String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let dir = PathBuf::from(d);
            if dir.is_absolute() && !dir.components().any(|c| c == Component::ParentDir) {
                Ok(dir)
            } else {
                Err(format!(
                    "{IMAGE_DIRECTORIES_SETTING}: {d:?} is not an absolute directory without `..`"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `path` with `.` and `..` folded, without asking the file system (`/a/b/../c` is
/// `/a/c`; `..` at the root stays at the root).
pub fn fold(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn inside(path: &Path, allowed: &[PathBuf]) -> bool {
    let path = fold(path);
    allowed.iter().any(|dir| path.starts_with(fold(dir)))
}

/// The image volume as libvirt reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    /// Its name in its pool.
    pub name: String,
    /// Its path on the host.
    pub path: String,
    /// Its `virStorageVolType`.
    pub kind: u32,
}

/// What the operator itself sees at the volume's path (a local daemon only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Local {
    /// Nothing: a remote host, or a daemon in another mount namespace.
    Unseen,
    /// It resolves (symlinks followed) to `resolved`, a regular file or not.
    Seen {
        /// Where it resolves to.
        resolved: PathBuf,
        /// Whether that is a regular file.
        regular: bool,
    },
}

/// Why an image is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Outside every allowed directory (`resolved`: where it leads).
    Outside {
        /// Where it leads.
        resolved: String,
    },
    /// Not a file volume, or not a regular file.
    NotAFile {
        /// What it is.
        what: String,
    },
    /// A machine's own volume.
    MachineVolume,
}

/// The decision on a `path` source as written, before libvirt is asked.
pub fn check_written(path: &str, allowed: &[PathBuf]) -> Result<(), Refusal> {
    if inside(Path::new(path), allowed) {
        Ok(())
    } else {
        Err(Refusal::Outside {
            resolved: fold(Path::new(path)).display().to_string(),
        })
    }
}

/// The decision on the volume libvirt found, and what the operator sees of it.
pub fn check_volume(volume: &Volume, local: &Local, allowed: &[PathBuf]) -> Result<(), Refusal> {
    if volume.kind != VOL_FILE {
        return Err(Refusal::NotAFile {
            what: format!("a {} volume", vol_type(volume.kind)),
        });
    }
    if volume.name.starts_with(MACHINE_VOLUME_PREFIX) {
        return Err(Refusal::MachineVolume);
    }
    if !inside(Path::new(&volume.path), allowed) {
        return Err(Refusal::Outside {
            resolved: volume.path.clone(),
        });
    }
    match local {
        Local::Unseen => Ok(()),
        Local::Seen { resolved, regular } => {
            if !inside(resolved, allowed) {
                Err(Refusal::Outside {
                    resolved: resolved.display().to_string(),
                })
            } else if !regular {
                Err(Refusal::NotAFile {
                    what: "not a regular file".into(),
                })
            } else {
                Ok(())
            }
        }
    }
}

/// What a local operator sees at `path` (symlinks resolved).
pub fn look(path: &Path) -> Local {
    match std::fs::canonicalize(path) {
        Ok(resolved) => {
            let regular = std::fs::metadata(&resolved).is_ok_and(|m| m.is_file());
            Local::Seen { resolved, regular }
        }
        Err(_) => Local::Unseen,
    }
}

fn describe(source: &LibvirtImageSource) -> String {
    match (&source.volume, &source.path) {
        (Some(v), _) => format!("volume {} in storage pool {}", v.name, v.pool),
        (None, Some(path)) => path.clone(),
        (None, None) => "(neither a volume nor a path)".into(),
    }
}

fn list(allowed: &[PathBuf]) -> String {
    allowed
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The terminal error for `refusal` of `source`.
pub fn refused(
    source: &LibvirtImageSource,
    refusal: &Refusal,
    allowed: &[PathBuf],
) -> BackendError {
    let what = describe(source);
    let dirs = list(allowed);
    let message = match refusal {
        Refusal::Outside { resolved } => format!(
            "the image {what} (at {resolved}) is outside the directories images may come from on this libvirt host ({dirs}): put it in one of them, or have the Provider's administrator add its directory to spec.settings.{IMAGE_DIRECTORIES_SETTING}"
        ),
        Refusal::NotAFile { what: kind } => {
            format!("the image {what} is {kind}: an image must be a regular file in {dirs}")
        }
        Refusal::MachineVolume => format!(
            "the image {what} is a volume banlieue made for a machine (its disk or bootstrap seed), never an image: name an image volume in {dirs}"
        ),
    };
    BackendError::terminal(PATH_NOT_ALLOWED, message)
}

/// The target directories of the host's active `dir`, `fs` and `netfs` pools.
pub fn pool_dirs(conn: &Connect) -> Result<Vec<PathBuf>, BackendError> {
    let pools = conn
        .list_all_storage_pools(virt::sys::VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE)
        .map_err(|e| classify("listing storage pools", &e))?;
    let mut dirs = Vec::new();
    for pool in pools {
        let xml = pool
            .xml_desc(0)
            .map_err(|e| classify("reading a storage pool", &e))?;
        if let Some(dir) = pool_dir(&xml) {
            dirs.push(dir);
        }
    }
    Ok(dirs)
}

/// A pool's target directory, from its XML, if it is a directory-backed pool.
pub fn pool_dir(xml: &str) -> Option<PathBuf> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let root = doc.root_element();
    if !matches!(root.attribute("type"), Some("dir" | "fs" | "netfs")) {
        return None;
    }
    root.children()
        .find(|n| n.has_tag_name("target"))?
        .children()
        .find(|n| n.has_tag_name("path"))?
        .text()
        .map(|t| PathBuf::from(t.trim()))
}

/// Checks the image of a machine about to be made (nothing is made yet): `explicit`
/// is the `imageDirectories` setting, `local` whether the daemon is on the
/// operator's host. `Ok` also when the image is not found: the caller says
/// `ImageNotFound`.
pub fn check_image(
    conn: &Connect,
    source: &LibvirtImageSource,
    explicit: Option<&[PathBuf]>,
    local: bool,
) -> Result<(), BackendError> {
    let allowed = match explicit {
        Some(dirs) => dirs.to_vec(),
        None => pool_dirs(conn)?,
    };
    if let Some(path) = &source.path {
        check_written(path, &allowed).map_err(|r| refused(source, &r, &allowed))?;
    }
    let vol = match (&source.volume, &source.path) {
        (Some(v), _) => conn
            .lookup_storage_pool_by_name(&v.pool)
            .and_then(|pool| pool.lookup_storage_vol_by_name(&v.name)),
        (None, Some(path)) => conn.lookup_storage_vol_by_path(path),
        (None, None) => return Ok(()),
    };
    let vol = match vol {
        Ok(vol) => vol,
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(e) => return Err(classify("looking up the image volume", &e)),
    };
    let volume = Volume {
        name: vol
            .name()
            .map_err(|e| classify("reading the image's name", &e))?,
        path: vol
            .path()
            .map_err(|e| classify("reading the image's path", &e))?,
        kind: vol
            .info()
            .map_err(|e| classify("reading the image's type", &e))?
            .kind,
    };
    let seen = if local {
        look(Path::new(&volume.path))
    } else {
        Local::Unseen
    };
    if seen == Local::Unseen && local {
        tracing::debug!(path = %volume.path, "image path not visible from the operator; checked through libvirt only");
    }
    check_volume(&volume, &seen, &allowed).map_err(|r| refused(source, &r, &allowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs() -> Vec<PathBuf> {
        vec![PathBuf::from("/var/lib/libvirt/images")]
    }

    fn vol(name: &str, path: &str, kind: u32) -> Volume {
        Volume {
            name: name.into(),
            path: path.into(),
            kind,
        }
    }

    #[test]
    fn written_paths_fold_dot_dot_before_the_check() {
        assert!(check_written("/var/lib/libvirt/images/debian.qcow2", &dirs()).is_ok());
        assert!(check_written("/var/lib/libvirt/images/a/../debian.qcow2", &dirs()).is_ok());
        assert_eq!(
            check_written("/var/lib/libvirt/images/../../../../etc/shadow", &dirs()),
            Err(Refusal::Outside {
                resolved: "/etc/shadow".into()
            })
        );
        assert!(check_written("/etc/shadow", &dirs()).is_err());
        assert!(
            check_written("/var/lib/libvirt/images-old/x.qcow2", &dirs()).is_err(),
            "a sibling sharing the prefix is not inside"
        );
        assert_eq!(fold(Path::new("/../..")), PathBuf::from("/"));
    }

    #[test]
    fn only_file_volumes_inside_that_are_not_machine_volumes_pass() {
        let local = Local::Unseen;
        let ok = vol(
            "debian.qcow2",
            "/var/lib/libvirt/images/debian.qcow2",
            VOL_FILE,
        );
        assert!(check_volume(&ok, &local, &dirs()).is_ok());
        let device = vol("sda", "/dev/sda", 1);
        assert_eq!(
            check_volume(&device, &local, &dirs()),
            Err(Refusal::NotAFile {
                what: "a block volume".into()
            })
        );
        let other_machines = vol(
            "bnl-0c0ffee0-0000-4000-8000-000000000001-seed.img",
            "/var/lib/libvirt/images/bnl-0c0ffee0-0000-4000-8000-000000000001-seed.img",
            VOL_FILE,
        );
        assert_eq!(
            check_volume(&other_machines, &local, &dirs()),
            Err(Refusal::MachineVolume)
        );
        let elsewhere = vol("passwd", "/etc/passwd", VOL_FILE);
        assert!(matches!(
            check_volume(&elsewhere, &local, &dirs()),
            Err(Refusal::Outside { .. })
        ));
    }

    #[test]
    fn a_local_symlink_out_or_a_fifo_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let images = root.path().join("images");
        std::fs::create_dir(&images).unwrap();
        let allowed = vec![std::fs::canonicalize(&images).unwrap()];
        std::fs::write(images.join("debian.qcow2"), b"qcow").unwrap();
        let secret = root.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::os::unix::fs::symlink(&secret, images.join("link.qcow2")).unwrap();
        let at = |name: &str| {
            let path = allowed[0].join(name);
            (vol(name, &path.to_string_lossy(), VOL_FILE), look(&path))
        };
        let (v, seen) = at("debian.qcow2");
        assert!(check_volume(&v, &seen, &allowed).is_ok(), "{seen:?}");
        let (v, seen) = at("link.qcow2");
        assert_eq!(
            check_volume(&v, &seen, &allowed),
            Err(Refusal::Outside {
                resolved: std::fs::canonicalize(&secret)
                    .unwrap()
                    .display()
                    .to_string()
            }),
            "libvirt's own path is inside; the link leads out"
        );
        let fifo = images.join("pipe");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let (v, seen) = at("pipe");
        assert!(matches!(
            check_volume(&v, &seen, &allowed),
            Err(Refusal::NotAFile { .. })
        ));
        assert_eq!(look(Path::new("/nonexistent/x")), Local::Unseen);
    }

    #[test]
    fn the_refusal_names_the_image_and_the_directories() {
        let source = LibvirtImageSource {
            path: Some("/etc/shadow".into()),
            ..Default::default()
        };
        let e = refused(
            &source,
            &Refusal::Outside {
                resolved: "/etc/shadow".into(),
            },
            &dirs(),
        );
        assert_eq!(e.reason, PATH_NOT_ALLOWED);
        assert!(!e.is_transient());
        assert!(e.message.contains("/etc/shadow"), "{}", e.message);
        assert!(
            e.message.contains("/var/lib/libvirt/images"),
            "{}",
            e.message
        );
        assert!(e.message.contains("imageDirectories"), "{}", e.message);
    }

    #[test]
    fn the_setting_and_the_pools_directories() {
        assert_eq!(parse_dirs(None), Ok(None));
        assert_eq!(
            parse_dirs(Some("/srv/a, /srv/b")),
            Ok(Some(vec![PathBuf::from("/srv/a"), PathBuf::from("/srv/b")]))
        );
        assert!(parse_dirs(Some("srv")).is_err());
        assert_eq!(
            pool_dir(
                "<pool type='dir'><name>default</name><target><path>/var/lib/libvirt/images</path></target></pool>"
            ),
            Some(PathBuf::from("/var/lib/libvirt/images"))
        );
        assert_eq!(
            pool_dir(
                "<pool type='logical'><name>vg</name><target><path>/dev/vg</path></target></pool>"
            ),
            None,
            "a pool of block devices offers no image directory"
        );
    }
}
