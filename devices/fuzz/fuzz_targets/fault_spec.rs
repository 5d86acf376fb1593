//! NVMe fault injection specs as a user or a control-socket client types
//! them: any text, through p2plab-fault's shared grammar and the NVMe
//! vocabulary. Catches a panic in the parser, a printed form that does not
//! parse back to the same spec (what `status` shows must be pasteable),
//! and a panic in the injector deciding on commands and peer transfers
//! with any fields, or in the bad blocks a media error leaves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use p2plab_nvme::fault::{Action, CommandInfo, NvmeFaults};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(spec) = p2plab_fault::round_trip::<Action>(text) else {
        return;
    };
    let mut faults = NvmeFaults::default();
    let id = faults
        .arm(spec)
        .unwrap_or_else(|e| panic!("an empty injector refused {text:?}: {e}"));
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
        let _ = faults.decide(&cmd);
        let _ = faults.peer_transfer();
        if let Some((slba, blocks)) = cmd.lba {
            if let Some(lba) = faults.bad_blocks().first_bad(1, slba, blocks) {
                faults.note_media_error(1, lba);
            }
            faults.bad_blocks_mut().repair(1, slba, blocks);
        }
    }
    let _ = faults.report();
    assert!(faults.disarm(id), "{text:?}: armed spec {id} not found");
});
