//! Issue 2's proof of the path, in one boot of the default lab: the NVMe
//! device served over vfio-user enumerates behind the PCIe switch with its
//! IDs and BAR sizes, a register round-trips through a trapped BAR and data
//! through an mmapped BAR, and MSI-X interrupts reach the guest.
//!
//! What it catches (a deliberately broken device it fails on): wrong class
//! or IDs in config space; a device not behind the switch; a BAR of the
//! wrong size, or a CMB BAR that is not 64-bit prefetchable; a trapped
//! register that does not round-trip, or a read-only one that takes
//! writes; an mmapped BAR that loses data (the wrong-seed check proves the
//! comparison can fail); MSI-X that is not enabled or whose admin or I/O
//! vectors never fire.

mod common;

use common::{run_guest, Boot};
use p2plab_lab::GuestScript;

#[test]
fn nvme_enumerates_behind_the_switch_and_its_bars_and_msix_work() {
    let run = run_guest(
        "lab",
        &GuestScript::new("foundation.sh", include_str!("../guest/foundation.sh")),
        Boot {
            append: vec!["p2plab.nonvme".into()],
            ..Boot::default()
        },
    );

    // Identity: an NVMe function (class 01:08:02).
    run.expect("NVME_CLASS", "0x010802");
    assert!(run.fact("NVME_VENDOR").starts_with("0x"), "vendor id");

    // Behind the switch: xio3130 downstream (104c:8233), x3130 upstream
    // (104c:8232), QEMU's pcie-root-port (1b36:000c).
    run.expect("PARENT", "0x104c:0x8233");
    run.expect("GRANDPARENT", "0x104c:0x8232");
    run.expect("ROOT_PORT", "0x1b36:0x000c");

    // BARs: registers (at least 16 KiB) and a 64 MiB 64-bit prefetchable CMB.
    assert!(run.fact_u64("BAR0_SIZE") >= 16 * 1024);
    assert_eq!(run.fact_u64("BAR2_SIZE"), 64 << 20);
    let cmb_flags = run.fact_u64("BAR2_FLAGS");
    assert_ne!(
        cmb_flags & 0x2000,
        0,
        "BAR2 must be prefetchable (flags {cmb_flags:#x})"
    );
    assert_ne!(
        cmb_flags & 0x0010_0000,
        0,
        "BAR2 must be 64-bit (flags {cmb_flags:#x})"
    );

    // Trapped BAR0 round trip.
    let vs = run.fact_u64("REG_VS");
    assert!(vs >= 0x0001_0400, "NVMe version {vs:#x} below 1.4");
    run.expect("REG_AQA", "0x1f003f");
    run.expect("REG_AQA_CLEARED", "0x0");

    // mmapped BAR2 round trip, and the check really compares.
    run.expect("CMB_ROUNDTRIP", "ok");
    run.expect("CMB_WRONG_SEED", "rejected");

    // MSI-X: the driver uses it and the vectors fire.
    run.expect("BLOCK_DEVICE", "present");
    run.expect("MSIX_CAP", "1");
    run.expect("ADMIN_IRQ_KIND", "msix");
    assert!(
        run.fact_u64("NVME_VECTORS") >= 2,
        "admin + at least one I/O queue vector"
    );
    assert!(
        run.fact_u64("NVME_VECTORS_FIRED") >= 2,
        "admin and I/O vectors both fired"
    );

    // The server's log decodes what happened.
    let log = run.file("nvme0.log");
    assert!(!log.is_empty(), "nvme0.log is empty");
}
