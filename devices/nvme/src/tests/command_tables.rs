//! The command tables: unique opcodes, the effects log they produce, data
//! directions, and Invalid Command Opcode for anything without a row.

use std::collections::BTreeSet;

use super::harness::*;
use crate::admin::ADMIN_COMMANDS;
use crate::command::CommandBuilder;
use crate::datapointer::DataTransfer;
use crate::io::IO_COMMANDS;
use crate::spec::effects::{CSUPP, LBCC, NCC, NIC};
use crate::spec::{admin, io, log, Status};
use crate::table::CommandTable;

/// Catches a pasted row: two rows for one opcode would make one of them
/// unreachable (the tables also refuse this at compile time), two rows
/// with one name would make the logs ambiguous.
#[test]
fn every_row_has_its_own_opcode_and_name() {
    for table in [&ADMIN_COMMANDS, &IO_COMMANDS] {
        let opcodes: BTreeSet<u8> = table.rows().iter().map(|r| r.opcode).collect();
        assert_eq!(opcodes.len(), table.rows().len(), "duplicate opcode");
        let names: BTreeSet<&str> = table.rows().iter().map(|r| r.name).collect();
        assert_eq!(names.len(), table.rows().len(), "duplicate name");
        for row in table.rows() {
            assert_eq!(table.find(row.opcode).map(|r| r.name), Ok(row.name));
            assert_eq!(table.name(row.opcode), row.name);
        }
    }
}

/// Catches a row whose data direction contradicts its opcode: the
/// specification encodes the direction in opcode bits 1:0, and handlers
/// map their data pointer the way the row says.
#[test]
fn every_rows_data_direction_is_its_opcodes_bits_1_0() {
    for table in [&ADMIN_COMMANDS, &IO_COMMANDS] {
        for row in table.rows() {
            assert_eq!(
                row.data as u8,
                row.opcode & 0x3,
                "{} ({:#04x}) says {:?}",
                row.name,
                row.opcode,
                row.data
            );
        }
    }
    assert_eq!(
        ADMIN_COMMANDS.find(admin::IDENTIFY).map(|r| r.data),
        Ok(DataTransfer::ControllerToHost)
    );
}

fn effects_of(table: &CommandTable) -> Vec<(u8, u32)> {
    let dwords = table.effects();
    (0..=255u8)
        .filter(|&op| dwords[usize::from(op)] != 0)
        .map(|op| (op, dwords[usize::from(op)]))
        .collect()
}

/// Catches a change in what the Commands Supported and Effects log
/// reports: these are the dwords the hand-written log page held before the
/// tables existed, opcode by opcode.
#[test]
fn effects_log_matches_what_the_controller_always_reported() {
    assert_eq!(
        effects_of(&ADMIN_COMMANDS),
        vec![
            (admin::DELETE_SQ, CSUPP),
            (admin::CREATE_SQ, CSUPP),
            (admin::GET_LOG_PAGE, CSUPP),
            (admin::DELETE_CQ, CSUPP),
            (admin::CREATE_CQ, CSUPP),
            (admin::IDENTIFY, CSUPP),
            (admin::ABORT, CSUPP),
            (admin::SET_FEATURES, CSUPP),
            (admin::GET_FEATURES, CSUPP),
            (admin::ASYNC_EVENT_REQUEST, CSUPP),
            (admin::DOORBELL_BUFFER_CONFIG, CSUPP),
            (admin::FORMAT_NVM, CSUPP | LBCC | NCC | NIC),
        ]
    );
    assert_eq!(
        effects_of(&IO_COMMANDS),
        vec![
            (io::FLUSH, CSUPP | LBCC),
            (io::WRITE, CSUPP | LBCC),
            (io::READ, CSUPP),
            (io::COMPARE, CSUPP),
            (io::WRITE_ZEROES, CSUPP | LBCC),
            (io::DATASET_MANAGEMENT, CSUPP | LBCC),
            (io::VERIFY, CSUPP),
        ]
    );
}

/// Catches a log page built from anything but the tables: the page the
/// guest reads holds exactly the tables' dwords at the spec's offsets
/// (ACS at 0, IOCS at 1024).
#[test]
fn the_effects_log_page_the_host_reads_is_the_tables() {
    let mut h = Host::new();
    h.enable();
    let cmd = CommandBuilder::new(admin::GET_LOG_PAGE, 0)
        .prp1(DATA)
        .cdw(
            10,
            ((4096 / 4 - 1) << 16) | u32::from(log::COMMANDS_EFFECTS),
        )
        .build();
    assert_eq!(h.admin_status(cmd), Status::SUCCESS);
    let page = h.peek(DATA, 4096);
    let dword = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().unwrap());
    let (acs, iocs) = (ADMIN_COMMANDS.effects(), IO_COMMANDS.effects());
    for op in 0..256 {
        assert_eq!(dword(op * 4), acs[op], "ACS of {op:#04x}");
        assert_eq!(dword(1024 + op * 4), iocs[op], "IOCS of {op:#04x}");
    }
    assert!(page[2048..].iter().all(|&b| b == 0));
}

/// Catches dispatch that does not go through the tables: every opcode
/// without a row, on either queue, completes with Invalid Command Opcode
/// (and no other status), and the controller keeps serving.
#[test]
fn every_opcode_without_a_row_is_an_invalid_command_opcode() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1);
    for opcode in 0..=255u8 {
        let cmd = CommandBuilder::new(opcode, 0).nsid(1).prp1(DATA).build();
        if ADMIN_COMMANDS.find(opcode).is_err() {
            assert_eq!(
                h.admin_status(cmd),
                Status::INVALID_OPCODE,
                "admin opcode {opcode:#04x}"
            );
        }
        if IO_COMMANDS.find(opcode).is_err() {
            assert_eq!(
                h.io(1, cmd).status,
                Status::INVALID_OPCODE,
                "I/O opcode {opcode:#04x}"
            );
        }
    }
    assert_eq!(
        ADMIN_COMMANDS.find(0x10).map(|r| r.name),
        Err(Status::INVALID_OPCODE)
    );
    assert_eq!(ADMIN_COMMANDS.name(0x10), "unsupported admin opcode");
    assert_eq!(IO_COMMANDS.name(0x04), "unsupported I/O opcode");
    // Still serving.
    let identify = CommandBuilder::new(admin::IDENTIFY, 0)
        .prp1(DATA)
        .cdw(10, 1)
        .build();
    assert_eq!(h.admin_status(identify), Status::SUCCESS);
}
