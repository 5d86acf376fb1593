//! NIC wire fault specs as a user or a control-socket client types them:
//! any text, through p2plab-fault's shared grammar and the NIC
//! vocabulary. Catches a panic in the parser, a printed form that does not
//! parse back to the same spec, and a panic in the injector deciding on
//! frames; fills the injector to its cap to check the refusal past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_fault::DEFAULT_MAX_ARMED;
use p2plab_nic::fault::{NicAction, NicFaults};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(spec) = p2plab_fault::round_trip::<NicAction>(text) else {
        return;
    };
    let mut faults = NicFaults::default();
    let mut armed = 0;
    // None has fired yet, so none makes room: the cap refuses the next.
    while faults.arm(spec).is_ok() {
        armed += 1;
        assert!(armed <= DEFAULT_MAX_ARMED, "{text:?}: armed past the cap");
    }
    assert_eq!(armed, DEFAULT_MAX_ARMED, "{text:?}");
    for _ in 0..data.len().min(64) {
        let _ = faults.decide();
    }
    let _ = faults.report();
});
