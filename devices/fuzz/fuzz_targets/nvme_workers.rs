//! The `nvme_commands` inputs fed to the NVMe controller with its real
//! queue worker threads: what running the queues on the caller's thread
//! cannot show. Register writes, resets and doorbells race the workers;
//! a worker waits in a full completion queue for the host, holds its
//! interrupt, sleeps and wakes on doorbells; CC.EN 1->0 stops workers in
//! the middle of a command. Slow (a controller and its threads per input,
//! waits for completions), so its campaigns are short.
//!
//! Catches a panic in any thread (libFuzzer aborts on a panic in any
//! thread, workers included), an internal error counted at the worker
//! boundary, a hang (libFuzzer's -timeout), and a function reset that
//! leaves a worker running.
#![no_main]

#[path = "common/nvme_guest.rs"]
mod nvme_guest;

use libfuzzer_sys::fuzz_target;
use nvme_guest::{drive, Guest, Runner};

fuzz_target!(|data: &[u8]| {
    let Some(mut guest) = Guest::new(Runner::Threads) else {
        return;
    };
    drive(&mut guest, data);
});
