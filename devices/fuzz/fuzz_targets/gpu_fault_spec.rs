//! GPU fault injection specs as a user or a control-socket client types
//! them: any text, through p2plab-fault's shared grammar and the GPU
//! vocabulary. Catches a panic in the parser, a printed form that does not
//! parse back to the same spec, and a panic in the injector deciding on
//! jobs and VRAM reads with any fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_gpu::fault::{GpuAction, GpuFaults};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(spec) = p2plab_fault::round_trip::<GpuAction>(text) else {
        return;
    };
    let mut faults = GpuFaults::default();
    faults
        .arm(spec)
        .unwrap_or_else(|e| panic!("an empty injector refused {text:?}: {e}"));
    for chunk in data.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let _ = faults.decide(v as u8);
        let _ = faults.vram_error(v >> 8, v.rotate_left(17));
    }
    let _ = faults.report();
});
