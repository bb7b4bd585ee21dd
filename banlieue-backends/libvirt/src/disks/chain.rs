//! A volume's backing chain as libvirt describes it: the OS disk is a qcow2 overlay
//! whose backing file is the image volume, so exporting it means fetching both.

use banlieue_sdk::backend::{BackendError, DiskFormat};
use virt::connect::Connect;
use virt::storage_vol::StorageVol;

use crate::error::{classify, is_not_found};

/// Longer chains than this are not banlieue's making (its overlays have one base).
const MAX_DEPTH: usize = 16;

/// What a volume's XML says about its format and backing file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeXml {
    /// `<target><format type>`.
    pub format: Option<String>,
    /// `<backingStore>`: the backing file's path and format.
    pub backing: Option<(String, Option<String>)>,
}

/// Parses `virStorageVolGetXMLDesc`.
pub fn parse_volume(xml: &str) -> Result<VolumeXml, String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| format!("volume XML: {e}"))?;
    let root = doc.root_element();
    let format_of = |node: roxmltree::Node<'_, '_>| {
        node.children()
            .find(|n| n.has_tag_name("format"))
            .and_then(|n| n.attribute("type"))
            .map(str::to_string)
    };
    let child = |name: &str| root.children().find(|n| n.has_tag_name(name));
    let backing = child("backingStore").and_then(|b| {
        let path = b
            .children()
            .find(|n| n.has_tag_name("path"))?
            .text()?
            .trim();
        (!path.is_empty()).then(|| (path.to_string(), format_of(b)))
    });
    Ok(VolumeXml {
        format: child("target").and_then(format_of),
        backing,
    })
}

/// The format QEMU reads a layer as; libvirt omits it for plain files.
pub fn layer_format(name: Option<&str>, what: &str) -> Result<DiskFormat, BackendError> {
    match name.unwrap_or("raw") {
        "raw" => Ok(DiskFormat::Raw),
        "qcow2" => Ok(DiskFormat::Qcow2),
        other => Err(BackendError::terminal(
            "UnsupportedDiskFormat",
            format!("{what} is a {other} volume; only qcow2 and raw disks can be exported"),
        )),
    }
}

/// One layer of a chain: the volume and the format it is read as.
pub struct Layer {
    /// The volume.
    pub vol: StorageVol,
    /// Its format.
    pub format: DiskFormat,
}

fn describe(vol: &StorageVol, what: &str) -> Result<VolumeXml, BackendError> {
    let xml = vol
        .xml_desc(0)
        .map_err(|e| classify(&format!("reading {what}'s description"), &e))?;
    parse_volume(&xml).map_err(|e| BackendError::transient("LibvirtError", e))
}

fn backing_volume(conn: &Connect, path: &str, what: &str) -> Result<StorageVol, BackendError> {
    conn.lookup_storage_vol_by_path(path).map_err(|e| {
        if is_not_found(&e) {
            BackendError::terminal(
                "BackingVolumeNotFound",
                format!("{what}'s backing file {path} is not a volume of any pool"),
            )
        } else {
            classify(&format!("looking up {what}'s backing file {path}"), &e)
        }
    })
}

/// `top`, then its backing volume, then that one's, and so on. `what` names the disk.
pub fn chain(conn: &Connect, top: StorageVol, what: &str) -> Result<Vec<Layer>, BackendError> {
    let mut layers: Vec<Layer> = Vec::new();
    let mut vol = top;
    // The child states the format QEMU opens its backing file with; it wins.
    let mut stated: Option<String> = None;
    loop {
        let xml = describe(&vol, what)?;
        let format = layer_format(stated.as_deref().or(xml.format.as_deref()), what)?;
        layers.push(Layer { vol, format });
        let Some((path, format)) = xml.backing else {
            return Ok(layers);
        };
        if layers.len() >= MAX_DEPTH {
            return Err(BackendError::terminal(
                "BackingChainTooDeep",
                format!("{what} has more than {MAX_DEPTH} backing files"),
            ));
        }
        vol = backing_volume(conn, &path, what)?;
        stated = format;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_format_and_backing_file() {
        let overlay = "<volume type='file'><name>bnl-u-os.qcow2</name><capacity unit='bytes'>1073741824</capacity>\
            <target><path>/p/bnl-u-os.qcow2</path><format type='qcow2'/></target>\
            <backingStore><path>/p/guest.qcow2</path><format type='qcow2'/></backingStore></volume>";
        assert_eq!(
            parse_volume(overlay).unwrap(),
            VolumeXml {
                format: Some("qcow2".into()),
                backing: Some(("/p/guest.qcow2".into(), Some("qcow2".into()))),
            }
        );
        let flat = "<volume><target><format type='qcow2'/></target><backingStore/></volume>";
        assert_eq!(parse_volume(flat).unwrap().backing, None);
        assert!(parse_volume("<volume>").is_err());
    }

    #[test]
    fn only_qcow2_and_raw_layers() {
        assert_eq!(layer_format(None, "d").unwrap(), DiskFormat::Raw);
        assert_eq!(layer_format(Some("qcow2"), "d").unwrap(), DiskFormat::Qcow2);
        let err = layer_format(Some("vmdk"), "disk data").unwrap_err();
        assert_eq!(err.reason, "UnsupportedDiskFormat");
        assert!(!err.is_transient() && err.message.contains("disk data"));
    }
}
