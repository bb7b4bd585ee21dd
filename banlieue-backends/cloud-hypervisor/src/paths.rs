//! Which host files a machine may boot from: the image's `disk`, `kernel` and
//! `firmware` are host paths anyone allowed to create a `CloudHypervisorMachine` (or a
//! VMImage) writes, and the VMMs run on the operator's own host. Each must resolve
//! (symlinks and `..` followed, [`std::fs::canonicalize`]) to a **regular file** inside
//! one of the directories of the Provider setting `imageDirectories` (comma list of
//! absolute directories; default `<state dir>/images`), or the machine is refused with
//! the terminal `PathNotAllowed` before anything is made. A device node (`/dev/sda`),
//! a FIFO, a socket or a directory is refused wherever it is. The resolved path is the
//! one used from then on, so a symlink changed after the check does not move the disk.

use std::path::{Path, PathBuf};

use banlieue_sdk::api::vm_image::CloudHypervisorImageSource;
use banlieue_sdk::backend::BackendError;

/// The setting naming the directories images may come from.
pub const IMAGE_DIRECTORIES_SETTING: &str = "imageDirectories";

/// Reason of the terminal error of a path outside them (or not a regular file).
pub const PATH_NOT_ALLOWED: &str = "PathNotAllowed";

/// The directories of `imageDirectories` (`value`), else `<state dir>/images`: every
/// entry an absolute path without `..`.
pub fn parse_dirs(value: Option<&str>, state_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(vec![state_dir.join("images")]);
    };
    value
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let dir = PathBuf::from(d);
            if dir.is_absolute()
                && !dir
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                Ok(dir)
            } else {
                Err(format!(
                    "{IMAGE_DIRECTORIES_SETTING}: {d:?} is not an absolute directory without `..`"
                ))
            }
        })
        .collect()
}

/// Why a path is refused (a missing file is not refused here: the callers say
/// `ImageNotFound` as before).
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not there (or a dangling symlink).
    Missing,
    /// Resolves outside every allowed directory.
    Outside {
        /// Where it resolves to.
        resolved: PathBuf,
    },
    /// Inside, but not a regular file.
    NotAFile {
        /// Where it resolves to.
        resolved: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// The host could not tell (permissions, I/O).
    Unreadable(String),
}

fn file_type(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The path `path` resolves to, if it is a regular file inside one of `allowed`
/// (themselves resolved; one that does not exist holds nothing).
pub fn resolve(path: &Path, allowed: &[PathBuf]) -> Result<PathBuf, Refusal> {
    let resolved = match std::fs::canonicalize(path) {
        Ok(resolved) => resolved,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Refusal::Missing),
        Err(e) => return Err(Refusal::Unreadable(format!("{}: {e}", path.display()))),
    };
    let inside = allowed
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir).ok())
        .any(|dir| resolved.starts_with(&dir));
    if !inside {
        return Err(Refusal::Outside { resolved });
    }
    let meta = std::fs::metadata(&resolved)
        .map_err(|e| Refusal::Unreadable(format!("{}: {e}", resolved.display())))?;
    if meta.is_file() {
        Ok(resolved)
    } else {
        Err(Refusal::NotAFile {
            what: file_type(&meta),
            resolved,
        })
    }
}

fn list(allowed: &[PathBuf]) -> String {
    allowed
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error for `field`'s `path` refused as `refusal`; `None` when it is only missing.
pub fn refused(
    field: &str,
    path: &str,
    refusal: &Refusal,
    allowed: &[PathBuf],
) -> Option<BackendError> {
    let dirs = list(allowed);
    Some(match refusal {
        Refusal::Missing => return None,
        Refusal::Outside { resolved } => BackendError::terminal(
            PATH_NOT_ALLOWED,
            format!(
                "the image's {field} {path} (resolving to {}) is outside the directories images may come from on this host ({dirs}): move the file into one of them, or have the Provider's administrator add its directory to spec.settings.{IMAGE_DIRECTORIES_SETTING}",
                resolved.display()
            ),
        ),
        Refusal::NotAFile { resolved, what } => BackendError::terminal(
            PATH_NOT_ALLOWED,
            format!(
                "the image's {field} {path} (resolving to {}) is {what}, not a regular file: an image must be a file in {dirs}",
                resolved.display()
            ),
        ),
        Refusal::Unreadable(why) => BackendError::transient(
            "HostIOError",
            format!("checking the image's {field}: {why}"),
        ),
    })
}

/// The image's host paths (`disk`, `kernel`, `firmware`) checked and replaced by
/// what they resolve to; the first refusal as an error. A missing file is left as it
/// is (the caller reports `ImageNotFound`).
pub fn confine(
    image: &mut CloudHypervisorImageSource,
    allowed: &[PathBuf],
) -> Result<(), BackendError> {
    let mut fields: Vec<(&str, &mut String)> = vec![("disk", &mut image.disk)];
    if let Some(kernel) = image.kernel.as_mut() {
        fields.push(("kernel", kernel));
    }
    if let Some(firmware) = image.firmware.as_mut() {
        fields.push(("firmware", firmware));
    }
    for (field, path) in fields {
        match resolve(Path::new(path.as_str()), allowed) {
            Ok(resolved) => *path = resolved.to_string_lossy().into_owned(),
            Err(refusal) => {
                if let Some(error) = refused(field, path, &refusal, allowed) {
                    return Err(error);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Host {
        _root: tempfile::TempDir,
        images: PathBuf,
        outside: PathBuf,
    }

    fn host() -> Host {
        let root = tempfile::tempdir().unwrap();
        let images = root.path().join("images");
        let outside = root.path().join("secret");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(images.join("debian.raw"), b"disk").unwrap();
        std::fs::write(&outside, b"shadow").unwrap();
        Host {
            _root: root,
            images,
            outside,
        }
    }

    #[test]
    fn a_file_inside_is_allowed_and_resolved() {
        let h = host();
        let allowed = [h.images.clone()];
        let got = resolve(&h.images.join("debian.raw"), &allowed).unwrap();
        assert_eq!(
            got,
            std::fs::canonicalize(h.images.join("debian.raw")).unwrap()
        );
        // `..` that stays inside is fine; a symlink to a file inside is resolved.
        std::fs::create_dir(h.images.join("sub")).unwrap();
        assert!(resolve(&h.images.join("sub/../debian.raw"), &allowed).is_ok());
        std::os::unix::fs::symlink(h.images.join("debian.raw"), h.images.join("current")).unwrap();
        assert_eq!(resolve(&h.images.join("current"), &allowed).unwrap(), got);
    }

    #[test]
    fn dot_dot_and_symlinks_out_are_refused() {
        let h = host();
        let allowed = [h.images.clone()];
        let escaped = h.images.join("../secret");
        assert!(matches!(
            resolve(&escaped, &allowed),
            Err(Refusal::Outside { .. })
        ));
        std::os::unix::fs::symlink(&h.outside, h.images.join("link")).unwrap();
        let refusal = resolve(&h.images.join("link"), &allowed).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::Outside {
                resolved: std::fs::canonicalize(&h.outside).unwrap()
            }
        );
        let error = refused("disk", "/x/link", &refusal, &allowed).unwrap();
        assert_eq!(error.reason, PATH_NOT_ALLOWED);
        assert!(!error.is_transient());
        assert!(error.message.contains("/x/link"), "{}", error.message);
        assert!(
            error.message.contains(&h.images.display().to_string()),
            "{}",
            error.message
        );
        assert!(
            error.message.contains("imageDirectories"),
            "{}",
            error.message
        );
        // A directory that merely shares the prefix is not inside.
        let sibling = h.images.with_file_name("images-other");
        std::fs::create_dir(&sibling).unwrap();
        std::fs::write(sibling.join("x.raw"), b"x").unwrap();
        assert!(matches!(
            resolve(&sibling.join("x.raw"), &allowed),
            Err(Refusal::Outside { .. })
        ));
        assert!(matches!(
            resolve(Path::new("/etc/passwd"), &allowed),
            Err(Refusal::Outside { .. })
        ));
    }

    #[test]
    fn device_nodes_fifos_and_directories_are_refused_even_inside() {
        let h = host();
        // A device node outside (as in /dev/sda), and one linked from inside.
        let dev = Path::new("/dev/null");
        assert!(matches!(
            resolve(dev, &[PathBuf::from("/dev")]),
            Err(Refusal::NotAFile {
                what: "a character device",
                ..
            })
        ));
        std::os::unix::fs::symlink(dev, h.images.join("sda")).unwrap();
        assert!(matches!(
            resolve(&h.images.join("sda"), std::slice::from_ref(&h.images)),
            Err(Refusal::Outside { .. })
        ));
        let fifo = h.images.join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let refusal = resolve(&fifo, std::slice::from_ref(&h.images)).unwrap_err();
        assert!(
            matches!(refusal, Refusal::NotAFile { what: "a FIFO", .. }),
            "{refusal:?}"
        );
        let error = refused("disk", "/p", &refusal, std::slice::from_ref(&h.images)).unwrap();
        assert!(
            error.message.contains("is a FIFO, not a regular file"),
            "{}",
            error.message
        );
        assert!(matches!(
            resolve(&h.images, std::slice::from_ref(&h.images)),
            Err(Refusal::NotAFile {
                what: "a directory",
                ..
            })
        ));
    }

    #[test]
    fn missing_files_are_left_to_the_caller() {
        let h = host();
        assert_eq!(
            resolve(&h.images.join("nope.raw"), std::slice::from_ref(&h.images)),
            Err(Refusal::Missing)
        );
        let mut image = CloudHypervisorImageSource {
            disk: h.images.join("nope.raw").to_string_lossy().into_owned(),
            kernel: Some(h.images.join("debian.raw").to_string_lossy().into_owned()),
            ..Default::default()
        };
        confine(&mut image, std::slice::from_ref(&h.images)).unwrap();
        image.firmware = Some(h.outside.to_string_lossy().into_owned());
        let error = confine(&mut image, std::slice::from_ref(&h.images)).unwrap_err();
        assert!(error.message.contains("firmware"), "{}", error.message);
    }

    #[test]
    fn the_setting_defaults_to_the_state_dirs_images_and_takes_absolute_dirs() {
        let state = Path::new("/var/lib/banlieue/ch");
        assert_eq!(parse_dirs(None, state).unwrap(), vec![state.join("images")]);
        assert_eq!(
            parse_dirs(Some(" "), state).unwrap(),
            vec![state.join("images")]
        );
        assert_eq!(
            parse_dirs(Some("/srv/images, /usr/share/cloud-hypervisor"), state).unwrap(),
            vec![
                PathBuf::from("/srv/images"),
                PathBuf::from("/usr/share/cloud-hypervisor")
            ]
        );
        assert!(
            parse_dirs(Some("images"), state)
                .unwrap_err()
                .contains("\"images\"")
        );
        assert!(parse_dirs(Some("/srv/../etc"), state).is_err());
    }
}
