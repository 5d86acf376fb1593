//! EFA fault specs as a user or a control-socket client types them: any
//! text, through p2plab-fault's shared grammar and the EFA vocabulary
//! (`opcode=` by the admin opcode table). Catches a panic in the parser, a
//! printed form that does not parse back to the same spec, and a panic in
//! the injector deciding on packets, admin commands, completions and
//! interrupts; fills the injector to its cap to check the refusal past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_efa::fault::{EfaAction, EfaFaults};
use p2plab_fault::DEFAULT_MAX_ARMED;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(spec) = p2plab_fault::round_trip::<EfaAction>(text) else {
        return;
    };
    let mut faults = EfaFaults::default();
    let mut armed = 0;
    // None has fired yet (a link-down counts as fired once but has no
    // count=), so none makes room: the cap refuses the next.
    while faults.arm(spec).is_ok() {
        armed += 1;
        assert!(armed <= DEFAULT_MAX_ARMED, "{text:?}: armed past the cap");
    }
    assert_eq!(armed, DEFAULT_MAX_ARMED, "{text:?}");
    for (i, &byte) in data.iter().take(64).enumerate() {
        let _ = faults.wire();
        let _ = faults.admin_error(byte);
        let _ = faults.cq_error();
        let _ = faults.drop_interrupt();
        if i == 32 {
            assert_eq!(faults.link_down(), spec.action == EfaAction::LinkDown);
        }
    }
    let _ = faults.report();
});
