//! Fault injection specs as a user or a control-socket client types them:
//! any text. Catches a panic in the parser, a printed form that does not
//! parse back to the same spec (what `status` shows must be pasteable),
//! and a panic in the injector deciding on commands with any fields.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_fault::{CommandInfo, FaultSpec, Injector};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(spec) = text.parse::<FaultSpec>() else {
        return;
    };
    let printed = spec.to_string();
    let again: FaultSpec = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, spec, "{text:?} -> {printed:?}");
    let mut injector = Injector::default();
    injector.arm(spec);
    for (i, chunk) in data.chunks(8).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        let v = u64::from_le_bytes(word);
        let cmd = CommandInfo {
            queue: (i % 3) as u16,
            opcode: v as u8,
            nsid: (v >> 8) as u32 % 4,
            lba: (v & 1 == 1).then_some((v >> 16, (v >> 48) + 1)),
        };
        let _ = injector.decide(&cmd);
        if let Some((slba, blocks)) = cmd.lba {
            let _ = injector.bad_blocks().first_bad(1, slba, blocks);
            injector.bad_blocks_mut().repair(1, slba, blocks);
        }
    }
    let _ = injector.report();
});
