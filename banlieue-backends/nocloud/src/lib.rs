//! cloud-init NoCloud seeds for banlieue's backends: the three files
//! (`meta-data`, `user-data`, `network-config`) and the small images that carry
//! them to a guest, written in memory (no shell-out, no temporary files).
//!
//! cloud-init's NoCloud datasource looks for a file system labelled `cidata`
//! (either case) of type vfat or iso9660 and reads the three files from its root:
//!
//! - [`iso::image`] writes an ISO 9660 image with a Joliet tree (so the names keep
//!   their lower case and dashes), for a CD-ROM drive (Proxmox VE attaches it as
//!   `ide2: <storage>:iso/<name>.iso,media=cdrom`);
//! - [`fat::image`] writes a FAT12 image, for a read-only disk (libvirt, Cloud
//!   Hypervisor).
//!
//! [`files`] builds `meta-data` and a version 2 `network-config` from plain
//! inputs ([`Interface`]); `user-data` is the bootstrap data verbatim. The files
//! hold secrets (join tokens, keys): nothing here logs them or puts them in an
//! error message.
#![warn(missing_docs)]

pub mod fat;
pub mod files;
pub mod iso;

pub use files::{AddressMode, Interface, SeedFiles, meta_data, network_config, yaml_quote};

/// The file-system label NoCloud looks for.
pub const LABEL: &str = "cidata";

/// `user-data` when there is no bootstrap data: an empty cloud-config.
pub const EMPTY_USER_DATA: &str = "#cloud-config\n{}\n";

/// Files read back from an image: `(name, contents)`.
pub type FileList = Vec<(String, Vec<u8>)>;

/// Why a seed image could not be written or read. Messages name files and sizes,
/// never their contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeedError {
    /// The files do not fit the image format (size, count or name length).
    TooLarge(String),
    /// A file name the format cannot carry.
    InvalidName(String),
    /// An image that is not what the reader expects.
    Malformed(String),
    /// An I/O error of the in-memory writer.
    Io(String),
}

impl std::fmt::Display for SeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooLarge(m) => write!(f, "NoCloud seed too large: {m}"),
            Self::InvalidName(m) => write!(f, "NoCloud seed file name: {m}"),
            Self::Malformed(m) => write!(f, "not a NoCloud seed image: {m}"),
            Self::Io(m) => write!(f, "writing the NoCloud seed: {m}"),
        }
    }
}

impl std::error::Error for SeedError {}
