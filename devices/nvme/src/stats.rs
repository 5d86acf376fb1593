//! Counters a tester reads from the host side to see what the controller
//! really did: which commands ran, where submission queue entries and data
//! came from (the CMB or guest memory), interrupts, doorbells.
//!
//! [`Stats`] holds live atomics updated on the hot paths; [`StatsSnapshot`]
//! is a consistent-enough copy with the controller's state, serialised as
//! JSON by the server binary (`--stats-file`).

use serde::Serialize;

p2plab_kit::counters! {
    /// Live counters.
    pub struct Stats => Counters {
        /// Register reads and writes on BAR0 (doorbells included).
        register_reads,
        register_writes,
        /// Doorbell writes, and those refused (bad queue or value).
        doorbell_writes,
        invalid_doorbell_writes,
        /// Controller enables (CC.EN 0->1), resets (1->0 or function reset),
        /// normal shutdowns (CC.SHN), and resets without a shutdown first.
        enables,
        resets,
        shutdowns,
        unsafe_shutdowns,
        /// Commands completed, per queue type, and those with an error status.
        admin_commands,
        io_commands,
        failed_commands,
        /// I/O commands by kind.
        read_commands,
        write_commands,
        flush_commands,
        compare_commands,
        verify_commands,
        write_zeroes_commands,
        dsm_commands,
        /// Logical block data moved for Read (to the host) and Write (from it).
        bytes_read,
        bytes_written,
        /// Data-pointer bytes that landed in the CMB / in guest memory.
        data_to_cmb_bytes,
        data_from_cmb_bytes,
        data_to_host_bytes,
        data_from_host_bytes,
        /// Submission queue entries fetched from the CMB / from guest memory.
        sq_entries_from_cmb,
        sq_entries_from_host,
        /// Completion queue entries posted into the CMB / into guest memory.
        cq_entries_to_cmb,
        cq_entries_to_host,
        /// I/O submission / completion queues created in the CMB or host memory.
        io_sqs_created_in_cmb,
        io_sqs_created_in_host,
        io_cqs_created_in_cmb,
        io_cqs_created_in_host,
        /// All DMA bytes, by target.
        cmb_read_bytes,
        cmb_write_bytes,
        pmr_read_bytes,
        pmr_write_bytes,
        host_read_bytes,
        host_write_bytes,
        /// Guest-memory accesses that failed.
        dma_faults,
        /// MSI-X vectors signalled.
        interrupts,
        /// Asynchronous events completed to the host.
        async_events,
        /// Backing store operations that failed (EIO, ENOSPC...).
        backend_errors,
        /// Injected faults that fired (one per spec per command), completions
        /// whose interrupt was dropped on purpose, commands held without a
        /// completion (`timeout`), and held commands that an Abort aborted.
        injected_faults,
        interrupts_dropped,
        /// Completions whose interrupt was sent late on purpose (`delay-irq`).
        interrupts_delayed,
        commands_held,
        commands_aborted,
        /// Reads failed by an injected media error.
        injected_media_errors,
        /// Internal errors (a panic at the queue-worker boundary) that set
        /// CSTS.CFS.
        internal_errors,
        /// Flushes refused because an earlier flush of the namespace failed
        /// (sticky until a controller reset).
        sticky_flush_failures,
    }
}

/// The CMB as the tester wants to see it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CmbSnapshot {
    /// Configured size in bytes (0 = no CMB).
    pub size: u64,
    /// Where the guest placed the CMB BAR, from config space.
    pub bar_address: Option<u64>,
    /// CMBMSC.CMSE: controller accesses to CBA are decoded as the CMB.
    pub cmse: bool,
    /// CMBMSC.CBA as latched.
    pub cba: Option<u64>,
    pub sq_entries_fetched: u64,
    pub cq_entries_posted: u64,
    pub io_sqs_created: u64,
    pub io_cqs_created: u64,
    /// Data bytes written into / read out of the CMB by commands.
    pub data_bytes_to: u64,
    pub data_bytes_from: u64,
    pub dma_read_bytes: u64,
    pub dma_write_bytes: u64,
}

/// The Persistent Memory Region.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PmrSnapshot {
    /// Size in bytes (0 = no PMR).
    pub size: u64,
    /// PMRCTL.EN.
    pub enabled: bool,
    /// PMRMSC.CBA as latched with CMSE.
    pub cba: Option<u64>,
    pub dma_read_bytes: u64,
    pub dma_write_bytes: u64,
}

/// Guest (host) memory traffic, the counterpart of [`CmbSnapshot`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostMemorySnapshot {
    pub sq_entries_fetched: u64,
    pub cq_entries_posted: u64,
    pub io_sqs_created: u64,
    pub io_cqs_created: u64,
    pub data_bytes_to: u64,
    pub data_bytes_from: u64,
    pub dma_read_bytes: u64,
    pub dma_write_bytes: u64,
    pub dma_faults: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ControllerSnapshot {
    /// Identify SN: matches /sys/class/nvme/nvmeN/serial in the guest, to
    /// tell which guest controller this server is.
    pub serial: String,
    pub enabled: bool,
    pub ready: bool,
    pub cc: u32,
    pub csts: u32,
    /// Shadow doorbells configured (Doorbell Buffer Config).
    pub shadow_doorbells: bool,
}

/// One live submission queue.
#[derive(Debug, Clone, Serialize)]
pub struct QueueSnapshot {
    pub sqid: u16,
    pub cqid: u16,
    pub entries: u32,
    pub base: u64,
    pub in_cmb: bool,
    pub cq_in_cmb: bool,
    pub fetched: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamespaceSnapshot {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
    pub backing: String,
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// Everything, ready for JSON.
#[derive(Debug, Clone, Serialize)]
pub struct StatsSnapshot {
    pub uptime_ms: u64,
    pub controller: ControllerSnapshot,
    pub cmb: CmbSnapshot,
    pub pmr: PmrSnapshot,
    pub host: HostMemorySnapshot,
    pub queues: Vec<QueueSnapshot>,
    pub namespaces: Vec<NamespaceSnapshot>,
    pub counters: Counters,
}

impl StatsSnapshot {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
