//! The fake Cloud Hypervisor VMM (tests/fake-cloud-hypervisor) as a bin of this
//! package, so integration tests find it through `CARGO_BIN_EXE_fake-cloud-hypervisor`
//! and `cargo test` always builds it first.

fn main() {
    std::process::exit(fake_cloud_hypervisor::main_with_args(
        std::env::args().skip(1),
    ));
}
