//! The vim25 methods banlieue calls, as typed request encoders (method element only;
//! [`super::soap::envelope`] wraps it) and response decoders. Field order follows the
//! vim25 WSDL's `xsd:sequence`s: real vCenters reject out-of-order elements.

use super::soap::method;
use super::xml::{Element, MoRef, Xml};

/// The `ServiceInstance` every session starts from.
pub fn service_instance() -> MoRef {
    MoRef::new("ServiceInstance", "ServiceInstance")
}

/// `RetrieveServiceContent` on the service instance.
pub fn retrieve_service_content() -> String {
    let mut x = method("RetrieveServiceContent", &service_instance());
    x.close("RetrieveServiceContent");
    x.finish()
}

/// What `RetrieveServiceContent` returns that banlieue uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceContent {
    /// The inventory's root folder.
    pub root_folder: MoRef,
    /// The property collector.
    pub property_collector: MoRef,
    /// The view manager (container views).
    pub view_manager: MoRef,
    /// The search index (find by path or UUID).
    pub search_index: MoRef,
    /// The session manager (login, logout).
    pub session_manager: MoRef,
    /// The file manager (datastore directories), when the service has one.
    pub file_manager: Option<MoRef>,
    /// `about.fullName`, e.g. `VMware vCenter Server 8.0.3 build-24022515`.
    pub full_name: String,
    /// `about.apiVersion`, e.g. `8.0.3.0`.
    pub api_version: String,
    /// `about.apiType`: `VirtualCenter` or `HostAgent`.
    pub api_type: String,
}

/// Decodes a `RetrieveServiceContentResponse`.
pub fn decode_service_content(response: &Element) -> Result<ServiceContent, String> {
    let rv = response
        .child("returnval")
        .ok_or("RetrieveServiceContent answered without returnval")?;
    let moref = |name: &str| {
        rv.child(name)
            .and_then(Element::as_moref)
            .ok_or_else(|| format!("the service content has no {name}"))
    };
    let about = |name: &str| rv.text_at(&["about", name]).unwrap_or_default().to_string();
    Ok(ServiceContent {
        root_folder: moref("rootFolder")?,
        property_collector: moref("propertyCollector")?,
        view_manager: moref("viewManager")?,
        search_index: moref("searchIndex")?,
        session_manager: moref("sessionManager")?,
        file_manager: rv.child("fileManager").and_then(Element::as_moref),
        full_name: about("fullName"),
        api_version: about("apiVersion"),
        api_type: about("apiType"),
    })
}

/// `Login`.
pub fn login(session_manager: &MoRef, user: &str, password: &str) -> String {
    let mut x = method("Login", session_manager);
    x.text("userName", user)
        .text("password", password)
        .close("Login");
    x.finish()
}

/// `Logout`.
pub fn logout(session_manager: &MoRef) -> String {
    let mut x = method("Logout", session_manager);
    x.close("Logout");
    x.finish()
}

/// `CreateContainerView`: every object of `types` below `container`.
pub fn create_container_view(
    view_manager: &MoRef,
    container: &MoRef,
    types: &[&str],
    recursive: bool,
) -> String {
    let mut x = method("CreateContainerView", view_manager);
    x.moref("container", container);
    for t in types {
        x.text("type", t);
    }
    x.text("recursive", recursive).close("CreateContainerView");
    x.finish()
}

/// `DestroyView`.
pub fn destroy_view(view: &MoRef) -> String {
    let mut x = method("DestroyView", view);
    x.close("DestroyView");
    x.finish()
}

/// Decodes a response whose `returnval` is one managed object reference (or none).
pub fn decode_moref(response: &Element) -> Option<MoRef> {
    response.child("returnval").and_then(Element::as_moref)
}

/// Which properties to read of which type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PropertySpec<'a> {
    /// Managed object type, e.g. `VirtualMachine`.
    pub kind: &'a str,
    /// Property paths, e.g. `runtime.powerState`.
    pub paths: &'a [&'a str],
}

/// Where to read from: one object, or everything in a container view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Objects<'a> {
    /// One object.
    One(&'a MoRef),
    /// The objects of a `ContainerView` (the view itself skipped).
    View(&'a MoRef),
    /// Several objects in one call (each kind's paths from its [`PropertySpec`]).
    Many(&'a [MoRef]),
}

/// `RetrievePropertiesEx`.
pub fn retrieve_properties_ex(
    collector: &MoRef,
    props: &[PropertySpec<'_>],
    objects: Objects<'_>,
) -> String {
    let mut x = method("RetrievePropertiesEx", collector);
    x.open("specSet");
    for p in props {
        x.open("propSet").text("type", p.kind);
        for path in p.paths {
            x.text("pathSet", path);
        }
        x.close("propSet");
    }
    x.open("objectSet");
    match objects {
        Objects::One(obj) => {
            x.moref("obj", obj).text("skip", false);
        }
        Objects::Many(objs) => {
            for (i, obj) in objs.iter().enumerate() {
                if i > 0 {
                    x.close("objectSet").open("objectSet");
                }
                x.moref("obj", obj).text("skip", false);
            }
        }
        Objects::View(view) => {
            x.moref("obj", view)
                .text("skip", true)
                .open_typed("selectSet", "TraversalSpec")
                .text("name", "traverseView")
                .text("type", "ContainerView")
                .text("path", "view")
                .text("skip", false)
                .close("selectSet");
        }
    }
    x.close("objectSet")
        .close("specSet")
        .open("options")
        .close("options")
        .close("RetrievePropertiesEx");
    x.finish()
}

/// `ContinueRetrievePropertiesEx` with the token of a truncated result.
pub fn continue_retrieve_properties_ex(collector: &MoRef, token: &str) -> String {
    let mut x = method("ContinueRetrievePropertiesEx", collector);
    x.text("token", token).close("ContinueRetrievePropertiesEx");
    x.finish()
}

/// One object and the properties read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectContent {
    /// The object.
    pub obj: MoRef,
    /// `(path, value element)` pairs; a value's shape depends on its type.
    pub props: Vec<(String, Element)>,
}

impl ObjectContent {
    /// A property's value element.
    pub fn prop(&self, path: &str) -> Option<&Element> {
        self.props.iter().find(|(p, _)| p == path).map(|(_, v)| v)
    }

    /// A property's text (strings, numbers, booleans, enums).
    pub fn text(&self, path: &str) -> Option<&str> {
        self.prop(path).map(|v| v.text.as_str())
    }

    /// A property holding one reference.
    pub fn moref(&self, path: &str) -> Option<MoRef> {
        self.prop(path).and_then(Element::as_moref)
    }

    /// A property holding an `ArrayOfManagedObjectReference`.
    pub fn morefs(&self, path: &str) -> Vec<MoRef> {
        self.prop(path)
            .map(|v| v.children.iter().filter_map(Element::as_moref).collect())
            .unwrap_or_default()
    }
}

/// Decodes a `RetrievePropertiesEx`/`ContinueRetrievePropertiesEx` response: objects
/// and the continuation token, if the result was truncated.
pub fn decode_retrieve_result(response: &Element) -> (Vec<ObjectContent>, Option<String>) {
    let Some(rv) = response.child("returnval") else {
        return (Vec::new(), None);
    };
    let objects = rv
        .children_named("objects")
        .filter_map(|o| {
            let obj = o.child("obj")?.as_moref()?;
            let props = o
                .children_named("propSet")
                .filter_map(|p| Some((p.text_at(&["name"])?.to_string(), p.child("val")?.clone())))
                .collect();
            Some(ObjectContent { obj, props })
        })
        .collect();
    let token = rv.text_at(&["token"]).map(str::to_string);
    (objects, token)
}

/// `FindByInventoryPath`, e.g. `/DC0/vm/templates/ubuntu`.
pub fn find_by_inventory_path(search_index: &MoRef, path: &str) -> String {
    let mut x = method("FindByInventoryPath", search_index);
    x.text("inventoryPath", path).close("FindByInventoryPath");
    x.finish()
}

/// `FindByUuid` for a VM, by its instance UUID (`instance = true`) or BIOS UUID.
pub fn find_vm_by_uuid(search_index: &MoRef, uuid: &str, instance: bool) -> String {
    let mut x = method("FindByUuid", search_index);
    x.text("uuid", uuid)
        .text("vmSearch", true)
        .text("instanceUuid", instance)
        .close("FindByUuid");
    x.finish()
}

/// The parts of a `VirtualMachineConfigSpec` banlieue sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigSpec {
    /// `name` (creating a VM).
    pub name: Option<String>,
    /// `version`, the hardware version, e.g. `vmx-19` (creating a VM).
    pub version: Option<String>,
    /// `instanceUuid`: banlieue sets it to the infra object's UID, as CAPV does.
    pub instance_uuid: Option<String>,
    /// `guestId`, e.g. `otherLinux64Guest` (creating a VM).
    pub guest_id: Option<String>,
    /// `annotation` (the VM's notes).
    pub annotation: Option<String>,
    /// `files.vmPathName`: where the `.vmx` goes (creating a VM).
    pub vm_path_name: Option<String>,
    /// `numCPUs`.
    pub num_cpus: Option<u32>,
    /// `numCoresPerSocket`.
    pub num_cores_per_socket: Option<u32>,
    /// `memoryMB`.
    pub memory_mib: Option<u64>,
    /// `memoryHotAddEnabled` (vSphere changes it only while the VM is off).
    pub memory_hot_add: Option<bool>,
    /// `cpuHotAddEnabled` (vSphere changes it only while the VM is off).
    pub cpu_hot_add: Option<bool>,
    /// `deviceChange`: device edits (network backings, disk capacity).
    pub device_change: Vec<DeviceChange>,
    /// `extraConfig` (`guestinfo.*` and banlieue's own keys); an empty value removes a key.
    pub extra_config: Vec<(String, String)>,
    /// `firmware`: `bios` or `efi`.
    pub firmware: Option<String>,
    /// `bootOptions.efiSecureBootEnabled` (Secure Boot; needs firmware `efi`).
    pub efi_secure_boot: Option<bool>,
}

impl ConfigSpec {
    fn write(&self, x: &mut Xml, name: &str) {
        x.open(name);
        if let Some(v) = &self.name {
            x.text("name", v);
        }
        if let Some(v) = &self.version {
            x.text("version", v);
        }
        if let Some(v) = &self.instance_uuid {
            x.text("instanceUuid", v);
        }
        if let Some(v) = &self.guest_id {
            x.text("guestId", v);
        }
        if let Some(v) = &self.annotation {
            x.text("annotation", v);
        }
        if let Some(v) = &self.vm_path_name {
            x.open("files").text("vmPathName", v).close("files");
        }
        if let Some(v) = self.num_cpus {
            x.text("numCPUs", v);
        }
        if let Some(v) = self.num_cores_per_socket {
            x.text("numCoresPerSocket", v);
        }
        if let Some(v) = self.memory_mib {
            x.text("memoryMB", v);
        }
        // The WSDL's order: memoryMB, memoryHotAddEnabled, cpuHotAddEnabled, ...,
        // deviceChange.
        if let Some(v) = self.memory_hot_add {
            x.text("memoryHotAddEnabled", v);
        }
        if let Some(v) = self.cpu_hot_add {
            x.text("cpuHotAddEnabled", v);
        }
        for change in &self.device_change {
            x.open("deviceChange").text("operation", &change.operation);
            if let Some(op) = &change.file_operation {
                x.text("fileOperation", op);
            }
            x.element("device", &change.device).close("deviceChange");
        }
        for (k, v) in &self.extra_config {
            x.open_typed("extraConfig", "OptionValue")
                .text("key", k)
                .typed_text("value", "xsd:string", v)
                .close("extraConfig");
        }
        // The WSDL's order: extraConfig, ..., bootOptions, ..., firmware.
        if let Some(v) = self.efi_secure_boot {
            x.open("bootOptions")
                .text("efiSecureBootEnabled", v)
                .close("bootOptions");
        }
        if let Some(v) = &self.firmware {
            x.text("firmware", v);
        }
        x.close(name);
    }
}

/// One `VirtualDeviceConfigSpec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceChange {
    /// `add`, `edit` or `remove`.
    pub operation: String,
    /// `create` for a new disk's file.
    pub file_operation: Option<String>,
    /// The whole device (vSphere replaces the device on `edit`).
    pub device: Element,
}

/// Where a clone goes (`VirtualMachineRelocateSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelocateSpec {
    /// VM folder.
    pub folder: Option<MoRef>,
    /// Datastore for the disks.
    pub datastore: Option<MoRef>,
    /// `diskMoveType`, e.g. `createNewChildDiskBacking` for linked clones.
    pub disk_move_type: Option<String>,
    /// Resource pool.
    pub pool: Option<MoRef>,
    /// Host (usually left to DRS).
    pub host: Option<MoRef>,
    /// Per-disk placement and backing (`disk[]`): how the clone's copy of a disk is
    /// provisioned.
    pub disks: Vec<DiskLocator>,
}

/// A `VirtualMachineRelocateSpecDiskLocator` whose backing sets the copy's
/// provisioning (a `VirtualDiskFlatVer2BackingInfo` with only the fields that do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskLocator {
    /// The template's disk device key.
    pub disk_id: String,
    /// Where the copy goes (required by the API).
    pub datastore: MoRef,
    /// `thinProvisioned`.
    pub thin_provisioned: bool,
    /// `eagerlyScrub`: zeroed up front (eager-zeroed thick).
    pub eagerly_scrub: bool,
}

/// A `VirtualMachineCloneSpec`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloneSpec {
    /// Placement.
    pub location: RelocateSpec,
    /// Make the clone a template.
    pub template: bool,
    /// Configuration applied to the clone.
    pub config: Option<ConfigSpec>,
    /// Power the clone on when done.
    pub power_on: bool,
    /// The source snapshot (linked clones).
    pub snapshot: Option<MoRef>,
}

/// `CloneVM_Task`.
pub fn clone_vm_task(vm: &MoRef, folder: &MoRef, name: &str, spec: &CloneSpec) -> String {
    let mut x = method("CloneVM_Task", vm);
    x.moref("folder", folder).text("name", name).open("spec");
    let l = &spec.location;
    x.open("location");
    if let Some(v) = &l.folder {
        x.moref("folder", v);
    }
    if let Some(v) = &l.datastore {
        x.moref("datastore", v);
    }
    if let Some(v) = &l.disk_move_type {
        x.text("diskMoveType", v);
    }
    if let Some(v) = &l.pool {
        x.moref("pool", v);
    }
    if let Some(v) = &l.host {
        x.moref("host", v);
    }
    for d in &l.disks {
        // WSDL order: diskId, datastore, diskMoveType, diskBackingInfo; a file
        // backing's fileName is required, empty lets vSphere name the copy.
        x.open("disk")
            .text("diskId", &d.disk_id)
            .moref("datastore", &d.datastore)
            .open_typed("diskBackingInfo", "VirtualDiskFlatVer2BackingInfo")
            .text("fileName", "")
            .text("diskMode", "persistent")
            .text("thinProvisioned", d.thin_provisioned)
            .text("eagerlyScrub", d.eagerly_scrub)
            .close("diskBackingInfo")
            .close("disk");
    }
    x.close("location").text("template", spec.template);
    if let Some(config) = &spec.config {
        config.write(&mut x, "config");
    }
    x.text("powerOn", spec.power_on);
    if let Some(v) = &spec.snapshot {
        x.moref("snapshot", v);
    }
    x.close("spec").close("CloneVM_Task");
    x.finish()
}

/// `CreateVM_Task` on a VM folder: a new VM from `config` alone (no template), in
/// resource pool `pool`.
pub fn create_vm_task(folder: &MoRef, config: &ConfigSpec, pool: &MoRef) -> String {
    let mut x = method("CreateVM_Task", folder);
    config.write(&mut x, "config");
    x.moref("pool", pool).close("CreateVM_Task");
    x.finish()
}

/// `MakeDirectory` on the file manager: `name` is a datastore path (`[ds] dir`).
pub fn make_directory(
    file_manager: &MoRef,
    name: &str,
    datacenter: &MoRef,
    create_parents: bool,
) -> String {
    let mut x = method("MakeDirectory", file_manager);
    x.text("name", name)
        .moref("datacenter", datacenter)
        .text("createParentDirectories", create_parents)
        .close("MakeDirectory");
    x.finish()
}

/// `ReconfigVM_Task`.
pub fn reconfig_vm_task(vm: &MoRef, spec: &ConfigSpec) -> String {
    let mut x = method("ReconfigVM_Task", vm);
    spec.write(&mut x, "spec");
    x.close("ReconfigVM_Task");
    x.finish()
}

/// A method on a VM that takes no arguments: `PowerOnVM_Task`, `PowerOffVM_Task`,
/// `SuspendVM_Task`, `ShutdownGuest`, `Destroy_Task`.
pub fn vm_call(name: &str, vm: &MoRef) -> String {
    let mut x = method(name, vm);
    x.close(name);
    x.finish()
}

/// A task's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Queued or running.
    Running,
    /// Done; the result, when it is a reference (a clone's new VM).
    Succeeded(Option<MoRef>),
    /// Failed with vSphere's fault.
    Failed(super::soap::VimFault),
}

/// The properties of a `Task` [`decode_task`] reads.
pub const TASK_PATHS: &[&str] = &["info.state", "info.error", "info.result"];

/// Decodes a task's `info.*` properties.
pub fn decode_task(task: &ObjectContent) -> TaskState {
    match task.text("info.state").unwrap_or("running") {
        "success" => TaskState::Succeeded(task.moref("info.result")),
        "error" => {
            let error = task.prop("info.error");
            let message = error
                .and_then(|e| e.text_at(&["localizedMessage"]))
                .unwrap_or_default();
            TaskState::Failed(super::soap::VimFault::from_detail(
                error.and_then(|e| e.child("fault")),
                message,
            ))
        }
        _ => TaskState::Running,
    }
}

/// `(key, value)` pairs of an `ArrayOfOptionValue` (e.g. `config.extraConfig`).
pub fn option_values(value: &Element) -> Vec<(String, String)> {
    value
        .children
        .iter()
        .filter_map(|o| {
            Some((
                o.text_at(&["key"])?.to_string(),
                o.text_at(&["value"]).unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// IP addresses of an `ArrayOfGuestNicInfo` (`guest.net`), in order.
pub fn guest_ips(value: &Element) -> Vec<String> {
    value
        .children
        .iter()
        .flat_map(|nic| nic.children_named("ipAddress").map(|ip| ip.text.clone()))
        .collect()
}
