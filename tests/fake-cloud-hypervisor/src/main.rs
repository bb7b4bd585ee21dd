//! `fake-cloud-hypervisor --api-socket path=<socket>`: see the crate README.

fn main() {
    std::process::exit(fake_cloud_hypervisor::main_with_args(
        std::env::args().skip(1),
    ));
}
