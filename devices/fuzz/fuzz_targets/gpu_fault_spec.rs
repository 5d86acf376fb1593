//! GPU fault injection specs as a user or a control-socket client types
//! them: any text. Catches a panic in the parser, a printed form that does
//! not parse back to the same spec, and a panic in the injector deciding
//! on jobs and VRAM reads with any fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_fault::{GpuFaultSpec, GpuInjector};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = text.parse::<GpuFaultSpec>() else {
        return;
    };
    let printed = spec.to_string();
    let again: GpuFaultSpec = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, spec, "{text:?} -> {printed:?}");
    let mut injector = GpuInjector::default();
    injector.arm(spec);
    for chunk in data.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let _ = injector.decide(v as u8);
        let _ = injector.vram_error(v >> 8, v.rotate_left(17));
    }
    let _ = injector.report();
});
