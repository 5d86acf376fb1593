//! The OCP Error Injection feature (Set and Get Features C0h,
//! `devices/nvme/src/admin/ocp.rs`) as a hostile guest uses it, through
//! the controller's admin queue (run on the target's thread): Set
//! Features C0h with any CDW10 (SV), CDW11 (NUM and the bits above it),
//! NSID and CDW14, and any entry data (types optionally folded into
//! 0..=11 so every arm is reached) at any dword offset in a page; Get
//! Features C0h with any select; reads and writes that the armed faults
//! hit (held, failed, corrupted, CFS); Aborts of held commands;
//! re-enables and function resets.
//!
//! Catches a panic, an internal error (a completion with Internal Error
//! status, or one counted at the worker boundary), a Set that succeeds
//! but arms another number of injections than its enabled entries, a
//! refused Set that changes anything, and a Get whose NUME or entries
//! differ from the last accepted Set (default select: none; capabilities:
//! changeable only).
#![no_main]

#[path = "common/nvme_guest.rs"]
mod nvme_guest;

use libfuzzer_sys::fuzz_target;
use nvme_guest::{Guest, Runner, RAM};
use p2plab_dma::GuestMemory;
use p2plab_nvme::{CommandBuilder, Status};

const SET_FEATURES: u8 = 0x09;
const GET_FEATURES: u8 = 0x0a;
const ABORT: u8 = 0x08;
const FID: u32 = 0xc0;
const ENTRY: usize = 32;
const MAX_ENTRIES: usize = 127;
/// The feature's data buffer (two pages) and the I/O buffer.
const DATA: u64 = RAM + 0x1_0000;
const IO_DATA: u64 = RAM + 0x2_0000;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// What the host last set (the entries of the last accepted Set).
struct Model {
    entries: Vec<[u8; ENTRY]>,
}

fn read_ram(guest: &Guest, at: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    guest.ram.read(at, &mut b).expect("the buffer is in RAM");
    b
}

fn no_internal_error(status: Status) {
    assert_ne!(
        status,
        Status::INTERNAL_ERROR,
        "a command failed with Internal Error"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some(mut guest) = Guest::new(Runner::Caller) else {
        return;
    };
    guest.enable();
    let mut model = Model {
        entries: Vec::new(),
    };
    let mut input = Bytes(data);
    let mut cid = 0u16;
    while let Some(op) = input.u8() {
        cid = cid.wrapping_add(1);
        match op & 0x7 {
            // Set Features C0h.
            0 | 1 => {
                let (Some(cdw10), Some(cdw11), Some(nsid), Some(cdw14), Some(offset)) = (
                    input.u32(),
                    input.u32(),
                    input.u32(),
                    input.u32(),
                    input.u8(),
                ) else {
                    break;
                };
                let offset = u64::from(offset) * 4 % 0x1000;
                let given = usize::from(input.u8().unwrap_or(0)) % (MAX_ENTRIES + 1);
                for i in 0..given {
                    let Some(bytes) = input.take(ENTRY) else {
                        break;
                    };
                    let mut entry = [0u8; ENTRY];
                    entry.copy_from_slice(bytes);
                    if op & 0x80 != 0 {
                        entry[2] %= 12;
                        entry[3] = 0;
                    }
                    let at = DATA + offset + (i * ENTRY) as u64;
                    guest.ram.write(at, &entry).expect("in RAM");
                }
                let num = (cdw11 & 0x7f) as usize;
                let before = guest.ctrl.fault_report().armed.len();
                let cmd = CommandBuilder::new(SET_FEATURES, cid)
                    .nsid(nsid)
                    .prp1(DATA + offset)
                    .prp2(DATA + 0x1000)
                    .cdw(10, (cdw10 & !0xff) | FID)
                    .cdw(11, cdw11)
                    .cdw(14, cdw14)
                    .build();
                let Some(c) = guest.run(0, cmd) else { continue };
                no_internal_error(c.status);
                let armed = guest.ctrl.fault_report().armed.len();
                if c.status == Status::SUCCESS {
                    let raw = read_ram(&guest, DATA + offset, num * ENTRY);
                    model.entries = raw
                        .chunks_exact(ENTRY)
                        .map(|e| {
                            let mut entry = [0u8; ENTRY];
                            entry.copy_from_slice(e);
                            entry
                        })
                        .collect();
                    let enabled = model.entries.iter().filter(|e| e[0] & 1 != 0).count();
                    assert_eq!(armed, enabled, "armed injections vs enabled entries");
                } else {
                    assert_eq!(armed, before, "a refused Set changed the injections");
                }
            }
            // Get Features C0h.
            2 => {
                let (Some(cdw10), Some(nsid), Some(cdw14), Some(offset)) =
                    (input.u32(), input.u32(), input.u32(), input.u8())
                else {
                    break;
                };
                let offset = u64::from(offset) * 4 % 0x1000;
                let len = MAX_ENTRIES * ENTRY;
                guest
                    .ram
                    .write(DATA + offset, &vec![0xa5; len])
                    .expect("in RAM");
                let cmd = CommandBuilder::new(GET_FEATURES, cid)
                    .nsid(nsid)
                    .prp1(DATA + offset)
                    .prp2(DATA + 0x1000)
                    .cdw(10, (cdw10 & !0xff) | FID)
                    .cdw(14, cdw14)
                    .build();
                let Some(c) = guest.run(0, cmd) else { continue };
                no_internal_error(c.status);
                if c.status != Status::SUCCESS {
                    continue;
                }
                let got = read_ram(&guest, DATA + offset, len);
                match (cdw10 >> 8) & 0x7 {
                    // Current, saved: what the host set.
                    0 | 2 => {
                        assert_eq!(c.dw0 as usize, model.entries.len(), "NUME");
                        let mut want = model.entries.concat();
                        want.resize(len, 0);
                        assert!(got == want, "Get returned other entries than were set");
                    }
                    1 => {
                        assert_eq!(c.dw0, 0, "default NUME");
                        assert!(got.iter().all(|&b| b == 0), "default entries");
                    }
                    3 => assert_eq!(c.dw0, 0b100, "capabilities"),
                    sel => panic!("select {sel} is reserved, yet Get succeeded"),
                }
            }
            // A read or a write the armed faults may hit.
            3 => {
                let (Some(kind), Some(lba)) = (input.u8(), input.u8()) else {
                    break;
                };
                let opcode = if kind & 1 == 0 { 0x02 } else { 0x01 };
                let cmd = CommandBuilder::new(opcode, cid)
                    .nsid(1)
                    .prp1(IO_DATA)
                    .cdw(10, u32::from(lba % 120))
                    .cdw(12, u32::from(kind >> 5))
                    .build();
                if let Some(c) = guest.run(1, cmd) {
                    no_internal_error(c.status);
                }
            }
            // Abort a command (a held one, with luck).
            4 => {
                let (Some(sqid), Some(target)) = (input.u8(), input.u8()) else {
                    break;
                };
                let cmd = CommandBuilder::new(ABORT, cid)
                    .cdw(10, u32::from(sqid & 1) | (u32::from(target) << 16))
                    .build();
                if let Some(c) = guest.run(0, cmd) {
                    no_internal_error(c.status);
                }
            }
            // Linux's recovery after CFS: the entries survive it.
            5 => guest.reenable(),
            6 => guest.function_reset(),
            // A Get Features C0h that must match the model, whatever the
            // fuzzer did meanwhile (only after an enable).
            _ => {
                if guest.csts() & 3 != 1 {
                    continue;
                }
                let cmd = CommandBuilder::new(GET_FEATURES, cid)
                    .prp1(DATA)
                    .prp2(DATA + 0x1000)
                    .cdw(10, FID)
                    .build();
                if let Some(c) = guest.run(0, cmd) {
                    if c.status == Status::SUCCESS {
                        assert_eq!(c.dw0 as usize, model.entries.len(), "NUME");
                    }
                }
            }
        }
    }
    guest.finish();
});
