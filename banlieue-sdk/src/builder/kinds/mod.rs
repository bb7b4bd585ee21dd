//! How each of banlieue's own machine kinds is built from a VirtualMachine: its
//! [`crate::contract::MachineKind`] implementation, one file per kind.

mod cloud_hypervisor;
mod libvirt;
mod proxmox;
mod vsphere;
