//! Storage volumes: the OS disk as a qcow2 overlay on the image, data disks, and the
//! seed (created, then its bytes uploaded over a libvirt stream, so it works on
//! remote hosts too).

use banlieue_sdk::api::vm_image::{DiskFormat, LibvirtImageSource};
use banlieue_sdk::backend::BackendError;
use virt::connect::Connect;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use crate::error::{classify, is_not_found};
use crate::transfer;
use crate::xml::escape;

const GIB: u64 = 1024 * 1024 * 1024;

/// An active storage pool by name.
pub fn pool(conn: &Connect, name: &str) -> Result<StoragePool, BackendError> {
    let pool = conn
        .lookup_storage_pool_by_name(name)
        .map_err(|e| classify(&format!("looking up storage pool {name}"), &e))?;
    if !pool.is_active().unwrap_or(false) {
        return Err(BackendError::transient(
            "StoragePoolInactive",
            format!("storage pool {name} is not active"),
        ));
    }
    Ok(pool)
}

/// The image the OS disk is cloned from: its path, format and capacity.
pub struct Image {
    /// Path on the host.
    pub path: String,
    /// `qcow2` or `raw`.
    pub format: &'static str,
    /// Virtual size in bytes.
    pub capacity: u64,
}

/// Resolves an image source to a volume; `Ok(None)` when it does not exist.
pub fn image(conn: &Connect, source: &LibvirtImageSource) -> Result<Option<Image>, BackendError> {
    let vol = match (&source.volume, &source.path) {
        (Some(v), _) => {
            let pool = match conn.lookup_storage_pool_by_name(&v.pool) {
                Ok(p) => p,
                Err(e) if is_not_found(&e) => return Ok(None),
                Err(e) => return Err(classify("looking up the image's pool", &e)),
            };
            // A pool refreshed since the image was copied in knows about it.
            let _ = pool.refresh(0);
            pool.lookup_storage_vol_by_name(&v.name)
        }
        (None, Some(path)) => conn.lookup_storage_vol_by_path(path),
        (None, None) => {
            return Err(BackendError::terminal(
                "InvalidImage",
                "sources.libvirt names neither a volume nor a path",
            ));
        }
    };
    let vol = match vol {
        Ok(v) => v,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(classify("looking up the image volume", &e)),
    };
    let path = vol
        .path()
        .map_err(|e| classify("reading the image's path", &e))?;
    let capacity = vol
        .info()
        .map_err(|e| classify("reading the image's size", &e))?
        .capacity;
    let format = match source.format {
        DiskFormat::Raw => "raw",
        _ => "qcow2",
    };
    Ok(Some(Image {
        path,
        format,
        capacity,
    }))
}

/// A volume of `pool` by name; `Ok(None)` when there is none.
pub fn lookup(pool: &StoragePool, name: &str) -> Result<Option<StorageVol>, BackendError> {
    match pool.lookup_storage_vol_by_name(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(classify(&format!("looking up volume {name}"), &e)),
    }
}

fn create(pool: &StoragePool, name: &str, xml: &str) -> Result<StorageVol, BackendError> {
    if let Some(v) = lookup(pool, name)? {
        return Ok(v);
    }
    StorageVol::create_xml(pool, xml, 0)
        .map_err(|e| classify(&format!("creating volume {name}"), &e))
}

/// The volume XML of a qcow2 overlay on `image`, at least `gib` GiB.
pub fn overlay_xml(name: &str, image: &Image, gib: Option<u32>) -> String {
    let capacity = gib
        .map(|g| u64::from(g) * GIB)
        .unwrap_or(0)
        .max(image.capacity);
    format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <target>\n    <format type='qcow2'/>\n  </target>\n  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n</volume>\n",
        escape(name),
        escape(&image.path),
        image.format
    )
}

/// The OS disk: a qcow2 overlay whose backing file is the image (created once).
pub fn ensure_os_disk(
    pool: &StoragePool,
    name: &str,
    image: &Image,
    gib: Option<u32>,
) -> Result<StorageVol, BackendError> {
    create(pool, name, &overlay_xml(name, image, gib))
}

/// An empty qcow2 data disk (`thick`/`eagerZeroed` allocate it up front).
pub fn ensure_data_disk(
    pool: &StoragePool,
    name: &str,
    gib: u32,
    preallocate: bool,
) -> Result<StorageVol, BackendError> {
    let capacity = u64::from(gib) * GIB;
    let allocation = if preallocate { capacity } else { 0 };
    let xml = format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <allocation unit='bytes'>{allocation}</allocation>\n  <target>\n    <format type='qcow2'/>\n  </target>\n</volume>\n",
        escape(name)
    );
    create(pool, name, &xml)
}

/// An empty qcow2 volume of `capacity` bytes with no backing file and nothing
/// preallocated (an upload overwrites it from the start), in place of any volume of
/// that name (what an interrupted import left).
pub fn recreate_qcow2(
    pool: &StoragePool,
    name: &str,
    capacity: u64,
) -> Result<StorageVol, BackendError> {
    if let Some(old) = lookup(pool, name)? {
        match old.delete(0) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(classify(&format!("deleting volume {name}"), &e)),
        }
    }
    let xml = format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <allocation unit='bytes'>0</allocation>\n  <target>\n    <format type='qcow2'/>\n  </target>\n</volume>\n",
        escape(name)
    );
    StorageVol::create_xml(pool, &xml, 0)
        .map_err(|e| classify(&format!("creating volume {name}"), &e))
}

/// The seed volume, (re)written with `bytes`.
pub fn ensure_seed(
    conn: &Connect,
    pool: &StoragePool,
    name: &str,
    bytes: &[u8],
) -> Result<(), BackendError> {
    let xml = format!(
        "<volume>\n  <name>{}</name>\n  <capacity unit='bytes'>{}</capacity>\n  <target>\n    <format type='raw'/>\n  </target>\n</volume>\n",
        escape(name),
        bytes.len()
    );
    let vol = create(pool, name, &xml)?;
    transfer::upload(
        conn,
        &vol,
        &format!("the seed {name}"),
        bytes,
        bytes.len() as u64,
    )
}

/// Deletes a volume; a volume already gone is fine.
pub fn delete(conn: &Connect, pool: &str, name: &str) -> Result<(), BackendError> {
    let pool = match conn.lookup_storage_pool_by_name(pool) {
        Ok(p) => p,
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(e) => return Err(classify("looking up a pool", &e)),
    };
    match lookup(&pool, name)? {
        Some(v) => match v.delete(0) {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(classify(&format!("deleting volume {name}"), &e)),
        },
        None => Ok(()),
    }
}

/// Every volume whose name starts with `prefix`, in every active pool.
pub fn with_prefix(conn: &Connect, prefix: &str) -> Result<Vec<(String, String)>, BackendError> {
    let pools = conn
        .list_all_storage_pools(virt::sys::VIR_CONNECT_LIST_STORAGE_POOLS_ACTIVE)
        .map_err(|e| classify("listing storage pools", &e))?;
    let mut out = Vec::new();
    for pool in pools {
        let pool_name = pool
            .name()
            .map_err(|e| classify("reading a pool's name", &e))?;
        let _ = pool.refresh(0);
        let names = pool
            .list_volumes()
            .map_err(|e| classify(&format!("listing volumes of {pool_name}"), &e))?;
        out.extend(
            names
                .into_iter()
                .filter(|n| n.starts_with(prefix))
                .map(|n| (pool_name.clone(), n)),
        );
    }
    Ok(out)
}
