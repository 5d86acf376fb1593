//! Decoding what the controller does into trace events (see the
//! p2plab-trace crate for the recorder and the line format). Every
//! function here runs only while tracing is on: callers pass them as the
//! closure of [`Tracer::record`](p2plab_trace::Tracer::record).

use p2plab_trace::hex;
use serde_json::{json, Map, Value};

use crate::admin::ADMIN_COMMANDS;
use crate::command::{Command, Completion};
use crate::datapointer::DataTransfer;
use crate::fault::Decision;
use crate::fields::{CommandFields, ReadWrite};
use crate::io::IO_COMMANDS;
use crate::spec::io as io_op;
use crate::state::ControllerState;
use crate::table::CommandTable;

/// The command set table of queue `sqid`.
fn table(sqid: u16) -> &'static CommandTable {
    if sqid == 0 {
        &ADMIN_COMMANDS
    } else {
        &IO_COMMANDS
    }
}

/// A `cmd` event: the command by spec name with its fields, data pointer
/// and status.
pub(crate) fn command(
    state: &ControllerState,
    sqid: u16,
    cmd: &Command,
    c: &Completion,
    injected: bool,
) -> Value {
    let table = table(sqid);
    let mut event = Map::new();
    event.insert("name".into(), table.name(cmd.opcode()).into());
    event.insert("opcode".into(), hex(u64::from(cmd.opcode())).into());
    event.insert("sqid".into(), sqid.into());
    event.insert("cid".into(), cmd.cid().into());
    event.insert("nsid".into(), cmd.nsid().into());
    insert_blocks(&mut event, sqid, cmd);
    let moves_data = table
        .find(cmd.opcode())
        .is_ok_and(|row| !matches!(row.data, DataTransfer::None));
    if moves_data {
        event.insert("data".into(), data_pointer(state, cmd));
    }
    event.insert("status".into(), c.status.name().into());
    event.insert("status_raw".into(), hex(u64::from(c.status.raw())).into());
    if injected {
        event.insert("injected".into(), true.into());
    }
    Value::Object(event)
}

/// SLBA and NLB (as a count of blocks) of the NVM commands that address
/// blocks.
fn insert_blocks(event: &mut Map<String, Value>, sqid: u16, cmd: &Command) {
    if sqid != 0
        && matches!(
            cmd.opcode(),
            io_op::READ | io_op::WRITE | io_op::COMPARE | io_op::WRITE_ZEROES | io_op::VERIFY
        )
    {
        if let Ok(rw) = ReadWrite::parse(cmd) {
            event.insert("slba".into(), rw.slba.into());
            event.insert("nlb".into(), rw.blocks().into());
        }
    }
}

/// Where an address lives, for the data pointer summary.
fn pointer(state: &ControllerState, addr: u64, len: u64) -> Value {
    json!({"addr": hex(addr), "at": state.mem.locate(addr, len)})
}

/// The data pointer as the command carries it (PRP1/PRP2 or SGL1), each
/// address with where it lives. PRP and SGL lists are not walked: the
/// summary reads nothing the command did not already read.
fn data_pointer(state: &ControllerState, cmd: &Command) -> Value {
    match cmd.psdt() {
        0 => {
            let mut prp = json!({"form": "prp", "prp1": pointer(state, cmd.prp1(), 1)});
            if cmd.prp2() != 0 {
                prp["prp2"] = pointer(state, cmd.prp2(), 1);
            }
            prp
        }
        psdt => {
            let d = cmd.sgl1();
            let addr = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
            let len = u32::from_le_bytes([d[8], d[9], d[10], d[11]]);
            let kind = match d[15] >> 4 {
                0 => "data block",
                1 => "bit bucket",
                2 => "segment",
                3 => "last segment",
                4 => "keyed data block",
                5 => "transport data block",
                _ => "reserved",
            };
            json!({
                "form": if psdt == 1 { "sgl" } else { "sgl-mptr-sgl" },
                "sgl1": {"type": kind, "addr": hex(addr), "len": len,
                         "at": state.mem.locate(addr, u64::from(len))},
            })
        }
    }
}

/// A `fault` event: what an injection does to a command.
pub(crate) fn fault(sqid: u16, cmd: &Command, d: &Decision) -> Value {
    let mut effects = Vec::new();
    if let Some((sct_sc, dnr, more)) = d.status {
        effects.push(format!(
            "status {sct_sc:#x}{}{}",
            if dnr { " dnr" } else { "" },
            if more { " more" } else { "" }
        ));
    }
    if let Some(abortable) = d.hang {
        effects.push(
            if abortable {
                "hang"
            } else {
                "hang (not abortable)"
            }
            .into(),
        );
    }
    if !d.latency.is_zero() {
        effects.push(format!("latency {:?}", d.latency));
    }
    if d.fatal {
        effects.push("cfs".into());
    }
    if d.internal_error {
        effects.push("internal error".into());
    }
    if d.drop_interrupt {
        effects.push("drop interrupt".into());
    }
    if !d.interrupt_delay.is_zero() {
        effects.push(format!("delay interrupt {:?}", d.interrupt_delay));
    }
    if let Some(range) = d.corrupt {
        effects.push(format!("corrupt {range:?}"));
    }
    let mut event = Map::new();
    event.insert("name".into(), table(sqid).name(cmd.opcode()).into());
    event.insert("opcode".into(), hex(u64::from(cmd.opcode())).into());
    event.insert("sqid".into(), sqid.into());
    event.insert("cid".into(), cmd.cid().into());
    event.insert("nsid".into(), cmd.nsid().into());
    insert_blocks(&mut event, sqid, cmd);
    event.insert("effects".into(), effects.into());
    event.insert("fired".into(), d.fired.into());
    event.insert("injected".into(), true.into());
    Value::Object(event)
}
