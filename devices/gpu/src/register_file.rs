//! BAR0's register state and what a register write does to it.
//!
//! A plain state machine: the caller holds the device lock, turns a BAR0
//! access into dwords of named registers ([`Reg::at`]), and carries out
//! the [`AfterWrite`] it gets back.

use crate::command::COMMAND_SIZE;
use crate::regs::*;
use crate::stats::Stats;
use crate::status::StatusCode;

/// Register file and engine bookkeeping, guarded by the device's lock.
#[derive(Debug)]
pub(crate) struct RegisterFile {
    pub scratch: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub ring_ctrl: RingCtrl,
    pub head: u32,
    pub tail: u32,
    pub fence: u64,
    pub checksum: u32,
    pub int_status: IntCauses,
    pub int_mask: IntCauses,
    pub engine_error: StatusCode,
    pub halted: bool,
    pub jobs_completed: u32,
    pub jobs_failed: u32,
    pub vram_err_count: u32,
    pub vram_err_addr: u64,
    /// Bus Master Enable in the PCI command register.
    pub bus_master_enabled: bool,
    /// The engine holds a fetched command it has not retired yet.
    pub engine_holds_job: bool,
    /// An unmasked cause was raised; the engine thread sends the MSI-X.
    pub interrupt_pending: bool,
    /// The device is being dropped; the engine thread exits.
    pub shutdown: bool,
}

/// What the caller must do after a register write.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    /// Nothing more.
    Nothing,
    /// The ring was disabled: the command in flight must never retire.
    AbandonJobInFlight,
}

impl RegisterFile {
    /// Power-on values.
    pub fn new() -> Self {
        Self {
            scratch: 0,
            ring_base: 0,
            ring_size: 0,
            ring_ctrl: RingCtrl::empty(),
            head: 0,
            tail: 0,
            fence: 0,
            checksum: 0,
            int_status: IntCauses::empty(),
            int_mask: IntCauses::ALL,
            engine_error: StatusCode::Ok,
            halted: false,
            jobs_completed: 0,
            jobs_failed: 0,
            vram_err_count: 0,
            vram_err_addr: 0,
            bus_master_enabled: false,
            engine_holds_job: false,
            interrupt_pending: false,
            shutdown: false,
        }
    }

    /// Whether the engine has an entry to fetch.
    pub fn runnable(&self) -> bool {
        self.ring_ctrl.enabled() && !self.halted && self.head != self.tail
    }

    fn status(&self) -> Status {
        let mut status = Status::READY;
        if self.ring_ctrl.enabled() {
            status |= Status::RING_ENABLED;
        }
        if self.engine_holds_job || self.runnable() {
            status |= Status::BUSY;
        }
        if self.halted {
            status |= Status::HALTED;
        }
        if self.bus_master_enabled {
            status |= Status::BUS_MASTER;
        }
        status
    }

    /// Latches `causes` in INT_STATUS; an unmasked one makes an interrupt
    /// pending.
    pub fn raise_interrupt(&mut self, causes: IntCauses) {
        self.int_status |= causes;
        if causes.without(self.int_mask) != IntCauses::empty() {
            self.interrupt_pending = true;
        }
    }

    /// Latches `causes` in INT_STATUS without sending an interrupt (an
    /// injected lost MSI-X): the driver only learns of them by polling, or
    /// with the next interrupt.
    pub fn latch_without_interrupt(&mut self, causes: IntCauses) {
        self.int_status |= causes;
    }

    /// Stops the engine on a ring-level error.
    pub fn halt(&mut self, error: StatusCode, stats: &Stats) {
        p2plab_ratelimit::log_limited!(
            warn,
            code = error.code(),
            reason = error.meaning(),
            "engine halted"
        );
        self.halted = true;
        self.engine_error = error;
        Stats::add(&stats.ring_errors, 1);
        self.raise_interrupt(IntCauses::ERROR);
    }

    /// Checks RING_BASE, RING_SIZE and RING_CTRL when the driver enables
    /// the ring.
    fn validate_ring(&self, vram_size: u64) -> Result<(), StatusCode> {
        if !self.ring_base.is_multiple_of(COMMAND_SIZE) {
            return Err(StatusCode::RingMisaligned);
        }
        let size = self.ring_size;
        if !size.is_power_of_two() || !(MIN_RING_ENTRIES..=MAX_RING_ENTRIES).contains(&size) {
            return Err(StatusCode::RingBadSize);
        }
        let end = self
            .ring_base
            .checked_add(u64::from(size) * COMMAND_SIZE)
            .ok_or(StatusCode::RingRange)?;
        if self.ring_ctrl.in_vram() && end > vram_size {
            return Err(StatusCode::RingRange);
        }
        Ok(())
    }

    /// The whole value of `reg` as the guest reads it.
    pub fn read(&self, reg: Reg, vram_size: u64) -> u64 {
        match reg {
            Reg::Id => ID_MAGIC.into(),
            Reg::Version => VERSION.into(),
            Reg::VramSize => vram_size,
            Reg::Status => self.status().raw().into(),
            Reg::EngineError => self.engine_error.code().into(),
            Reg::Scratch => self.scratch.into(),
            Reg::RingBase => self.ring_base,
            Reg::RingSize => self.ring_size.into(),
            Reg::RingCtrl => self.ring_ctrl.raw().into(),
            Reg::RingHead => self.head.into(),
            Reg::RingTail => self.tail.into(),
            Reg::Doorbell => 0,
            Reg::Fence => self.fence,
            Reg::Checksum => self.checksum.into(),
            Reg::IntStatus => self.int_status.raw().into(),
            Reg::IntMask => self.int_mask.raw().into(),
            Reg::JobsCompleted => self.jobs_completed.into(),
            Reg::JobsFailed => self.jobs_failed.into(),
            Reg::VramErrCount => self.vram_err_count.into(),
            Reg::VramErrAddr => self.vram_err_addr,
        }
    }

    /// A dword write to `half` of `reg`.
    pub fn write(
        &mut self,
        reg: Reg,
        half: Half,
        value: u32,
        vram_size: u64,
        stats: &Stats,
    ) -> AfterWrite {
        tracing::debug!(reg = reg.name(), ?half, value, "register write");
        match reg {
            Reg::Scratch => self.scratch = value,
            Reg::RingBase | Reg::RingSize if self.ring_ctrl.enabled() => {
                tracing::debug!(
                    reg = reg.name(),
                    "ring geometry write ignored while enabled"
                );
            }
            Reg::RingBase => self.ring_base = half.replace(self.ring_base, value),
            Reg::RingSize => self.ring_size = value,
            Reg::RingCtrl => {
                return self.write_ring_ctrl(RingCtrl::from_raw(value).known(), vram_size, stats)
            }
            Reg::RingTail => self.write_tail(value, stats),
            Reg::Doorbell => {
                Stats::add(&stats.doorbells, 1);
                self.write_tail(value, stats);
            }
            Reg::IntStatus => self.int_status = self.int_status.without(IntCauses::from_raw(value)),
            Reg::IntMask => {
                let newly_unmasked = self.int_mask.without(IntCauses::from_raw(value));
                self.int_mask = IntCauses::from_raw(value).known();
                if self.int_status.intersects(newly_unmasked) {
                    self.interrupt_pending = true;
                }
            }
            Reg::Id
            | Reg::Version
            | Reg::VramSize
            | Reg::Status
            | Reg::EngineError
            | Reg::RingHead
            | Reg::Fence
            | Reg::Checksum
            | Reg::JobsCompleted
            | Reg::JobsFailed
            | Reg::VramErrCount
            | Reg::VramErrAddr => {
                tracing::debug!(
                    reg = reg.name(),
                    value,
                    "write to read-only register ignored"
                )
            }
        }
        AfterWrite::Nothing
    }

    fn write_ring_ctrl(&mut self, value: RingCtrl, vram_size: u64, stats: &Stats) -> AfterWrite {
        match (self.ring_ctrl.enabled(), value.enabled()) {
            (false, true) => {
                self.ring_ctrl = value;
                self.head = 0;
                self.tail = 0;
                self.halted = false;
                self.engine_error = StatusCode::Ok;
                if let Err(error) = self.validate_ring(vram_size) {
                    self.halt(error, stats);
                } else {
                    tracing::info!(
                        base = self.ring_base,
                        entries = self.ring_size,
                        in_vram = value.in_vram(),
                        "ring enabled"
                    );
                }
            }
            (true, false) => {
                self.ring_ctrl = value;
                self.halted = false;
                tracing::info!("ring disabled");
                return AfterWrite::AbandonJobInFlight;
            }
            // The location cannot change under a live ring.
            (true, true) => {}
            (false, false) => self.ring_ctrl = value,
        }
        AfterWrite::Nothing
    }

    fn write_tail(&mut self, value: u32, stats: &Stats) {
        if !self.ring_ctrl.enabled() || self.halted {
            tracing::debug!(value, "tail write ignored: ring disabled or halted");
            return;
        }
        if value >= self.ring_size {
            self.halt(StatusCode::BadTail, stats);
            return;
        }
        self.tail = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Would catch a register whose declared access disagrees with what a
    /// write does: a read-only register that changes, or a write-only one
    /// that reads back.
    #[test]
    fn declared_access_matches_behaviour() {
        let stats = Stats::default();
        for reg in Reg::ALL.iter().copied() {
            let mut regs = RegisterFile::new();
            let before = regs.read(reg, 1 << 30);
            let _ = regs.write(reg, Half::Low, 0x5a5a_5a5a, 1 << 30, &stats);
            let after = regs.read(reg, 1 << 30);
            match reg.access() {
                Access::ReadOnly => assert_eq!(after, before, "{}", reg.name()),
                Access::WriteOnly => assert_eq!(after, 0, "{}", reg.name()),
                Access::ReadWrite | Access::ReadWrite1Clear => {}
            }
        }
    }

    #[test]
    fn int_status_is_write_one_to_clear() {
        let stats = Stats::default();
        let mut regs = RegisterFile::new();
        regs.raise_interrupt(IntCauses::ALL);
        let _ = regs.write(Reg::IntStatus, Half::Low, IntCauses::FENCE.raw(), 0, &stats);
        assert_eq!(regs.int_status, IntCauses::ERROR);
    }
}
