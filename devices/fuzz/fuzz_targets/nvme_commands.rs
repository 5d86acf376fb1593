//! The NVMe controller as a hostile guest drives it, with no socket and
//! no thread per input: BAR0 register and doorbell writes, guest memory
//! scribbled anywhere, admin and I/O commands with any dwords (data
//! pointers optionally steered into guest RAM or the CMB so they reach
//! the handlers' data paths), in any order. The queues run on the
//! target's thread (`NvmeController::with_queues_on_caller`) through the
//! same fetch, command tables, handlers, PRP/SGL walking, queue
//! bookkeeping and completion posting as the worker threads;
//! `nvme_workers` feeds the same inputs to the threads themselves.
//!
//! Catches a panic anywhere in the model, an internal error counted at
//! the worker boundary, a hang (libFuzzer's -timeout: a queue that never
//! drains, a wait for a completion slot), and a reset that leaves the
//! controller ready.
#![no_main]

#[path = "common/nvme_guest.rs"]
mod nvme_guest;

use libfuzzer_sys::fuzz_target;
use nvme_guest::{drive, Guest, Runner};

fuzz_target!(|data: &[u8]| {
    let Some(mut guest) = Guest::new(Runner::Caller) else {
        return;
    };
    drive(&mut guest, data);
});
