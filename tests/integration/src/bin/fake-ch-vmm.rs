//! The fake Cloud Hypervisor VMM (tests/fake-cloud-hypervisor) as a bin of this
//! package, so integration tests find it through `CARGO_BIN_EXE_fake-ch-vmm` and
//! `cargo test` always builds it first. (Named apart from the fake crate's own
//! `fake-cloud-hypervisor` bin: two bins with one name collide in `target/`.)

fn main() {
    std::process::exit(fake_cloud_hypervisor::main_with_args(
        std::env::args().skip(1),
    ));
}
