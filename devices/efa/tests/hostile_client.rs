//! The `p2plab-efa` binary under a hostile vfio-user client, as
//! `devices/nic/tests/hostile_client.rs` attacks the NIC's: malformed
//! region accesses (each must get an error reply and leave the stream in
//! sync), register writes of sizes and alignments the device does not
//! take (dropped and counted), writes to read-only registers (ignored),
//! and an admin queue, AENQ and readless-read address pointing at guest
//! memory that was never mapped, with doorbells of any value, reset
//! storms and Bus Master Enable toggled in between. The server must never
//! crash or hang; it must exit cleanly on SIGTERM with no panic in its log.
//!
//! The raw client (`p2plab_server::testing::RawClient`) is used because
//! rust-vmm's client cannot parse error replies; the server runs as a
//! child process (`p2plab_server::testing::SpawnedServer`).

use p2plab_efa::regs::{
    reg, ADMIN_API_VERSION, CONTROLLER_VERSION, DB_BAR, LLQ_BAR, REGS_BAR, REGS_BAR_SIZE,
};
use p2plab_server::testing::{RawClient, SpawnedServer};

const BAR0: u32 = REGS_BAR as u32;
const CONFIG: u32 = 7;
const COMMAND: u64 = 4;
const UNMAPPED: u64 = 0x7000_0000;

fn efa(name: &str) -> SpawnedServer {
    SpawnedServer::start(env!("CARGO_BIN_EXE_p2plab-efa"), name, |_| {
        Vec::<String>::new()
    })
}

fn read32(raw: &mut RawClient, offset: u64) -> u32 {
    let (reply, payload) = raw.region_read(BAR0, offset, 4);
    assert!(!reply.is_error(), "read of {offset:#x} refused");
    // The reply repeats the access header (offset, region, count): 16 bytes.
    let data = payload.get(16..20).expect("four bytes of data");
    u32::from_le_bytes([data[0], data[1], data[2], data[3]])
}

fn write32(raw: &mut RawClient, offset: u64, value: u32) {
    let reply = raw.region_write(BAR0, offset, &value.to_le_bytes());
    assert!(!reply.is_error(), "write of {offset:#x} refused");
}

/// Catches: a server that crashes, hangs or loses the stream on accesses
/// outside its BARs, of absurd sizes or with lying payloads (each must
/// get an error reply); an EFA that acts on register writes of a size or
/// alignment it does not take, or on writes to read-only registers, or
/// does not count the refused ones.
#[test]
fn malformed_region_accesses_get_errors_and_bad_writes_are_counted() {
    let server = efa("efa-hostile-regs");
    let mut raw = RawClient::connect(server.socket());
    let mut refused = raw.malformed_accesses(BAR0, REGS_BAR_SIZE, 3);
    refused.push((
        "an LLQ read at a wrapping offset",
        raw.region_read(u32::from(LLQ_BAR), u64::MAX - 3, 4).0,
    ));
    for (what, reply) in &refused {
        assert!(reply.is_error(), "{what}: answered without an error");
        assert_ne!(reply.error, 0, "{what}: error reply without an errno");
    }
    // The stream is still in sync: good reads after them work.
    assert_eq!(read32(&mut raw, reg::VERSION), ADMIN_API_VERSION);

    let before = server.status()["bad_register_accesses"]
        .as_u64()
        .expect("bad_register_accesses in status");
    // Sizes and alignments the device does not take: dropped, counted.
    let aq_caps = reg::AQ_CAPS;
    write32(&mut raw, aq_caps, 0x0040_0020);
    assert!(!raw.region_write(BAR0, aq_caps + 1, &[0xff; 4]).is_error());
    assert!(!raw.region_write(BAR0, aq_caps, &[0xff; 2]).is_error());
    assert!(!raw.region_write(BAR0, aq_caps, &[0xff; 1]).is_error());
    assert_eq!(
        read32(&mut raw, aq_caps),
        0x0040_0020,
        "a refused write changed AQ_CAPS"
    );
    let after = server.status()["bad_register_accesses"]
        .as_u64()
        .expect("bad_register_accesses in status");
    assert_eq!(after - before, 3, "refused writes not counted");
    // Read-only registers ignore writes.
    write32(&mut raw, reg::VERSION, 0xdead_beef);
    write32(&mut raw, reg::CONTROLLER_VERSION, 0xdead_beef);
    assert_eq!(read32(&mut raw, reg::VERSION), ADMIN_API_VERSION);
    assert_eq!(
        read32(&mut raw, reg::CONTROLLER_VERSION),
        CONTROLLER_VERSION
    );
    drop(raw);

    let log = server.log();
    let status = server.stop();
    assert!(status.success(), "the server exited with {status}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
}

/// Catches: an EFA that crashes, hangs or stops answering when the
/// driver side points its admin queue, admin completion queue, AENQ and
/// readless-read answer at memory that was never mapped (or at wrapping
/// addresses), rings the admin and EQ doorbells and the doorbell BAR with
/// any value, and resets it over and over with Bus Master Enable toggled
/// in between.
#[test]
fn an_admin_queue_in_unmapped_memory_and_doorbell_storms_leave_it_serving() {
    let server = efa("efa-hostile-admin");
    let mut raw = RawClient::connect(server.socket());
    for round in 0..4u32 {
        let command: u16 = if round % 2 == 0 { 0x6 } else { 0x2 };
        assert!(!raw
            .region_write(CONFIG, COMMAND, &command.to_le_bytes())
            .is_error());
        // A reset, then queues anywhere but in guest RAM.
        write32(&mut raw, reg::DEV_CTL, 1);
        write32(&mut raw, reg::DEV_CTL, 0);
        let base = if round < 2 { UNMAPPED } else { u64::MAX - 0x40 };
        for (lo, hi) in [
            (reg::AQ_BASE_LO, reg::AQ_BASE_HI),
            (reg::ACQ_BASE_LO, reg::ACQ_BASE_HI),
            (reg::AENQ_BASE_LO, reg::AENQ_BASE_HI),
            (reg::MMIO_RESP_LO, reg::MMIO_RESP_HI),
        ] {
            write32(&mut raw, lo, base as u32);
            write32(&mut raw, hi, (base >> 32) as u32);
        }
        write32(&mut raw, reg::AQ_CAPS, 0x0040_0020 ^ round);
        write32(&mut raw, reg::ACQ_CAPS, 0x0010_0020 | round << 24);
        write32(&mut raw, reg::AENQ_CAPS, 0x0008_0020);
        // Readless reads whose answer cannot land, of any register.
        for offset in [0u32, 0x58, 0xffff, u32::MAX] {
            write32(&mut raw, reg::MMIO_REG_READ, offset << 16 | round);
        }
        for value in [1, 0x40, 0xffff, u32::MAX] {
            write32(&mut raw, reg::AQ_PROD_DB, value);
            write32(&mut raw, reg::AENQ_CONS_DB, value);
            write32(&mut raw, reg::EQ_DB, value);
            // Doorbells of queues that do not exist: answered (a posted
            // write on real hardware), never a crash.
            assert!(!raw
                .region_write(u32::from(DB_BAR), 0, &value.to_le_bytes())
                .is_error());
        }
        // Still answering, and still in sync.
        assert_eq!(read32(&mut raw, reg::VERSION), ADMIN_API_VERSION);
    }
    let status = server.status();
    assert!(status.is_object(), "status: {status}");
    drop(raw);
    let log = server.log();
    let exit = server.stop();
    assert!(exit.success(), "the server exited with {exit}:\n{log}");
    assert!(!log.contains("panicked"), "a thread panicked:\n{log}");
}
