//! The end-to-end suites of p2plab: each file in `tests/` boots the real
//! guest under QEMU (KVM when usable, else TCG; `P2PLAB_ACCEL` forces one)
//! against the device servers and asserts on what the guest and the
//! servers report. The scripts they run in the guest are
//! the `.sh` files in `guest/` (libraries they source in `guest/lib/`),
//! which `scripts/test` lints with shellcheck.
//!
//! Nothing lives in this library: Cargo needs a target besides the tests.
//! Run the suites with `scripts/test --e2e-only` (one VM at a time).
