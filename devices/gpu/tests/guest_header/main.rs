//! The guest driver's C view of the hardware against the device's own
//! definitions, so the two cannot drift apart.
//!
//! `guest-driver/p2plab_gpu_hw.h` is parsed (its `#define`s evaluated,
//! its two structs laid out as C lays them out) and compared both ways
//! with the register map, bit fields, opcode table, status codes and ring
//! entry layout in `src/`; `P2PLAB_GPU_OP_*` in `p2plab_gpu_uapi.h` is
//! compared with the opcode table.
//!
//! Catches: a register, bit, opcode or status code added, removed,
//! renamed, moved or renumbered on one side only; a 64-bit register the
//! header does not mark as 64-bit (or the reverse); a ring entry or record
//! field that moved, changed size or name. The last test shows that each
//! of those mistakes is caught.

use std::collections::BTreeMap;

use p2plab_gpu::command::{Command, Completion, FieldSpan, COMPLETION_SIZE};
use p2plab_gpu::engine::opcodes::OPCODES;
use p2plab_gpu::regs::*;
use p2plab_gpu::status::StatusCode;

mod c_header;

const HW_H: &str = include_str!("../../guest-driver/p2plab_gpu_hw.h");
const UAPI_H: &str = include_str!("../../guest-driver/p2plab_gpu_uapi.h");

/// Every define the hardware header must have, with its value, built from
/// the device's own definitions: adding a register, bit, opcode or status
/// code in Rust makes it expected in C.
fn rust_defines() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let mut add = |name: String, value: u64| {
        assert!(out.insert(name.clone(), value).is_none(), "{name} twice");
    };
    for (name, value) in [
        ("P2PLAB_GPU_VENDOR_ID", DEFAULT_IDS.vendor_id.into()),
        ("P2PLAB_GPU_DEVICE_ID", DEFAULT_IDS.device_id.into()),
        ("P2PLAB_GPU_REGS_BAR", REGS_BAR.into()),
        ("P2PLAB_GPU_REGS_BAR_SIZE", REGS_BAR_SIZE),
        ("P2PLAB_GPU_VRAM_BAR", VRAM_BAR.into()),
        ("P2PLAB_GPU_ID_MAGIC", ID_MAGIC.into()),
        ("P2PLAB_GPU_VERSION_MAJOR", VERSION_MAJOR.into()),
        ("MIN_RING_ENTRIES", MIN_RING_ENTRIES.into()),
        ("MAX_RING_ENTRIES", MAX_RING_ENTRIES.into()),
        ("INT_ALL", IntCauses::ALL.raw().into()),
    ] {
        add(name.to_string(), value);
    }
    for reg in Reg::ALL {
        add(format!("REG_{}", reg.name()), reg.offset());
    }
    for (name, bit) in Status::NAMED {
        add(format!("{}{name}", Status::PREFIX), bit.raw().into());
    }
    for (name, bit) in RingCtrl::NAMED {
        add(format!("{}{name}", RingCtrl::PREFIX), bit.raw().into());
    }
    for (name, bit) in IntCauses::NAMED {
        add(format!("{}{name}", IntCauses::PREFIX), bit.raw().into());
    }
    use p2plab_gpu::command::CommandFlags;
    for (name, bit) in CommandFlags::NAMED {
        add(format!("{}{name}", CommandFlags::PREFIX), bit.raw().into());
    }
    for spec in OPCODES {
        add(format!("OP_{}", spec.name), spec.opcode.into());
    }
    for status in StatusCode::ALL {
        add(format!("HW_{}", status.name()), status.code().into());
    }
    out
}

/// Names and values that differ between a header's defines and what the
/// Rust side expects, both ways.
fn compare(header: &str, c: &BTreeMap<String, u64>, rust: &BTreeMap<String, u64>) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, value) in rust {
        match c.get(name) {
            None => problems.push(format!("{name} = {value:#x} is missing in {header}")),
            Some(c_value) if c_value != value => problems.push(format!(
                "{name} is {c_value:#x} in {header} but {value:#x} in the device"
            )),
            Some(_) => {}
        }
    }
    for (name, value) in c {
        if !rust.contains_key(name) {
            problems.push(format!(
                "{name} = {value:#x} in {header} is not defined by the device"
            ));
        }
    }
    problems
}

fn compare_struct(header: &str, name: &str, rust: &[FieldSpan], size: usize) -> Vec<String> {
    let (fields, c_size) = match c_header::struct_layout(header, name) {
        Ok(layout) => layout,
        Err(e) => return vec![e],
    };
    let rust: Vec<(String, usize, usize)> = rust
        .iter()
        .map(|f| (f.name.to_string(), f.offset, f.size))
        .collect();
    let mut problems = Vec::new();
    if fields != rust {
        problems.push(format!(
            "struct {name} is {fields:?} in C but {rust:?} in the device (name, offset, size)"
        ));
    }
    if c_size != size {
        problems.push(format!(
            "struct {name} is {c_size} bytes in C, {size} in the device"
        ));
    }
    problems
}

/// Everything that differs between `p2plab_gpu_hw.h` (as `hw_h`) and the
/// device.
fn hw_header_problems(hw_h: &str) -> Vec<String> {
    let header = "p2plab_gpu_hw.h";
    let defines = c_header::defines(hw_h);
    let mut problems: Vec<String> = defines
        .iter()
        .filter(|(_, d)| d.value.is_none())
        .map(|(name, _)| format!("{name} in {header} is not an integer expression"))
        .collect();
    let values: BTreeMap<String, u64> = defines
        .iter()
        .filter_map(|(name, d)| Some((name.clone(), d.value?)))
        .collect();
    problems.extend(compare(header, &values, &rust_defines()));
    for reg in Reg::ALL {
        let name = format!("REG_{}", reg.name());
        let marked_64 = defines
            .get(&name)
            .is_some_and(|d| d.comment.contains("64-bit"));
        if marked_64 != (reg.width() == Width::Bits64) {
            problems.push(format!(
                "{name}: the device says {:?}, the header's comment {} \"64-bit\"",
                reg.width(),
                if marked_64 { "says" } else { "does not say" }
            ));
        }
    }
    problems.extend(compare_struct(
        hw_h,
        "p2plab_gpu_hw_cmd",
        &Command::FIELDS,
        Command::SIZE,
    ));
    problems.extend(compare_struct(
        hw_h,
        "p2plab_gpu_hw_completion",
        &Completion::FIELDS,
        COMPLETION_SIZE,
    ));
    problems
}

/// Everything that differs between the UAPI header's opcode numbers (as
/// `uapi_h`) and the opcode table.
fn uapi_opcode_problems(uapi_h: &str) -> Vec<String> {
    let prefix = "P2PLAB_GPU_OP_";
    let c: BTreeMap<String, u64> = c_header::defines(uapi_h)
        .into_iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .filter_map(|(name, d)| Some((name, d.value?)))
        .collect();
    let rust: BTreeMap<String, u64> = OPCODES
        .iter()
        .map(|spec| (format!("{prefix}{}", spec.name), spec.opcode.into()))
        .collect();
    compare("p2plab_gpu_uapi.h", &c, &rust)
}

#[test]
fn hardware_header_matches_the_device() {
    let problems = hw_header_problems(HW_H);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    // The comparison saw the whole header, not an empty parse.
    let defines = c_header::defines(HW_H);
    assert_eq!(defines.len(), rust_defines().len());
    assert!(defines.len() > 50, "{} defines", defines.len());
}

#[test]
fn uapi_opcodes_match_the_opcode_table() {
    let problems = uapi_opcode_problems(UAPI_H);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
    assert_eq!(
        c_header::defines(UAPI_H)
            .keys()
            .filter(|name| name.starts_with("P2PLAB_GPU_OP_"))
            .count(),
        OPCODES.len()
    );
}

#[test]
fn the_c_reader_evaluates_what_the_header_uses() {
    let known: BTreeMap<&str, u64> = [("A", 1), ("B", 4)].into_iter().collect();
    assert_eq!(c_header::evaluate("0x1f", &known), Some(0x1f));
    assert_eq!(c_header::evaluate("65536", &known), Some(65536));
    assert_eq!(c_header::evaluate("(1u << 4)", &known), Some(16));
    assert_eq!(c_header::evaluate("(A | B)", &known), Some(5));
    assert_eq!(c_header::evaluate("(A | (1u << 3))", &known), Some(9));
    assert_eq!(c_header::evaluate("_IOR(0xb7, 0, struct x)", &known), None);
    assert_eq!(c_header::evaluate("(A + B)", &known), None);
    assert_eq!(c_header::evaluate("UNKNOWN", &known), None);
    let (fields, size) = c_header::struct_layout(
        "struct s {\n\t__u8 a;\t/* x */\n\t__le32 b;\n\t__le16 c[3];\n};",
        "s",
    )
    .unwrap();
    let expected = [("a", 0, 1), ("b", 4, 4), ("c", 8, 6)];
    assert_eq!(fields.len(), expected.len());
    for ((name, offset, len), (want_name, want_offset, want_len)) in fields.iter().zip(expected) {
        assert_eq!(
            (name.as_str(), *offset, *len),
            (want_name, want_offset, want_len)
        );
    }
    assert_eq!(size, 16);
}

/// Each kind of drift, made on purpose, is reported.
#[test]
fn the_check_catches_drift_on_either_side() {
    let edits: [(&str, &str, &str); 8] = [
        (
            "a register moved",
            "REG_FENCE\t\t0x040",
            "REG_FENCE\t\t0x044",
        ),
        ("a register removed", "#define REG_SCRATCH\t\t0x01c\n", ""),
        (
            "a register added in C only",
            "#define REG_SCRATCH",
            "#define REG_SCRATCH2\t0x018\n#define REG_SCRATCH",
        ),
        (
            "a bit moved",
            "RING_CTRL_IN_VRAM\t(1u << 1)",
            "RING_CTRL_IN_VRAM\t(1u << 2)",
        ),
        (
            "an opcode renumbered",
            "OP_FILL\t\t\t0x04",
            "OP_FILL\t\t\t0x06",
        ),
        ("a status code renamed", "HW_ERR_BAD_TAIL", "HW_ERR_TAIL"),
        ("a 64-bit mark lost", "0x008\t/* 64-bit */", "0x008"),
        ("a field resized", "__le32 pattern;", "__le16 pattern;"),
    ];
    for (what, from, to) in edits {
        assert!(HW_H.contains(from), "{what}: `{from:?}` not in the header");
        let edited = HW_H.replacen(from, to, 1);
        assert!(
            !hw_header_problems(&edited).is_empty(),
            "{what} went unnoticed"
        );
    }
    let edited = UAPI_H.replacen(
        "P2PLAB_GPU_OP_CHECKSUM\t\t5",
        "P2PLAB_GPU_OP_CHECKSUM\t\t6",
        1,
    );
    assert_ne!(edited, UAPI_H);
    assert!(
        !uapi_opcode_problems(&edited).is_empty(),
        "UAPI opcode drift"
    );

    // The device side: a definition the header lacks, or one it no longer has.
    let c: BTreeMap<String, u64> = c_header::defines(HW_H)
        .into_iter()
        .filter_map(|(name, d)| Some((name, d.value?)))
        .collect();
    let mut rust = rust_defines();
    rust.insert("REG_NEW".into(), 0x70);
    let problems = compare("h", &c, &rust);
    assert!(
        problems.contains(&"REG_NEW = 0x70 is missing in h".to_string()),
        "{problems:?}"
    );
    let mut rust = rust_defines();
    rust.remove("OP_NOP");
    let problems = compare("h", &c, &rust);
    assert!(
        problems.contains(&"OP_NOP = 0x0 in h is not defined by the device".to_string()),
        "{problems:?}"
    );
}
