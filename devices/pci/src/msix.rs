//! MSI-X state: the vector table and Pending Bit Array that live in a BAR,
//! the enable/function-mask bits of Message Control, and the per-vector
//! routing a vfio-user client sets up with SET_IRQS.
//!
//! Who decides whether a vector is delivered: QEMU's vfio-pci client
//! emulates the MSI-X table itself (it reads the table location from our
//! capability and overlays the table in the BAR with its own MMIO), so the
//! guest's table writes never reach us. Instead the client binds one eventfd
//! per live vector (SET_IRQS MSIX, ACTION_TRIGGER + DATA_EVENTFD) and may
//! mask/unmask vectors (ACTION_MASK/UNMASK). Message Control writes do reach
//! us through config space. So by default a vector is delivered when MSI-X
//! is enabled, the function is not masked, an eventfd is bound, and the
//! client has not masked it. The mask bit of our own table copy only counts
//! when [`MsixState::set_table_masks_delivery`] is on, for a client that
//! does forward table accesses. QEMU's vfio-user client forwards PBA reads
//! to the server, so our PBA is what the guest sees.

use crate::regs::msix::{
    CONTROL_ENABLE, CONTROL_FUNCTION_MASK, ENTRY_SIZE, ENTRY_VECTOR_CONTROL, MAX_VECTORS,
    VECTOR_CONTROL_MASK_BIT,
};

/// The two bits of MSI-X Message Control that decide delivery, as the
/// guest last wrote them to config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsixControl {
    /// MSI-X Enable: the function signals with MSI-X messages, not INTx.
    pub enabled: bool,
    /// Function Mask: every vector is masked; a vector that fires stays
    /// pending until the mask is lifted.
    pub function_masked: bool,
}

impl MsixControl {
    /// MSI-X off, the power-on state.
    pub const DISABLED: Self = Self {
        enabled: false,
        function_masked: false,
    };
    /// MSI-X on and no function mask: vectors are delivered.
    pub const ENABLED: Self = Self {
        enabled: true,
        function_masked: false,
    };
    /// MSI-X on with every vector held back (Linux sets this while it
    /// programs the table).
    pub const ENABLED_MASKED: Self = Self {
        enabled: true,
        function_masked: true,
    };

    /// Decodes the Message Control register.
    pub fn from_register(control: u16) -> Self {
        Self {
            enabled: control & CONTROL_ENABLE != 0,
            function_masked: control & CONTROL_FUNCTION_MASK != 0,
        }
    }
}

/// Whether the client has an eventfd bound to a vector (SET_IRQS
/// ACTION_TRIGGER with DATA_EVENTFD; fd -1 unbinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorBinding {
    /// An eventfd is bound: the vector can be delivered.
    Bound,
    /// No eventfd: the vector waits as pending.
    Unbound,
}

/// The client's own mask of a vector (SET_IRQS ACTION_MASK/UNMASK), on
/// top of the guest's masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMask {
    /// Held back: the vector waits as pending.
    Masked,
    /// Not held back by the client.
    Unmasked,
}

/// Which access sizes a structure accepts (both need natural alignment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessSizes {
    /// 4 or 8 bytes, as the spec allows for the table.
    DwordOrQword,
    /// 1, 2, 4 or 8 bytes: the PBA, read with whatever size the guest used.
    Any,
}

/// A table or PBA access the device cannot serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsixAccessError {
    /// The spec allows only naturally aligned dword or qword accesses to
    /// the table (any naturally aligned size to the PBA).
    #[error(
        "MSI-X access of {len} bytes at {offset:#x}: only 4- or 8-byte naturally aligned accesses"
    )]
    BadSize {
        /// Offset of the access inside the table or PBA.
        offset: u64,
        /// Its size in bytes.
        len: usize,
    },
    /// The access leaves the table or PBA (or the function has no MSI-X).
    #[error("MSI-X access of {len} bytes at {offset:#x} is beyond the structure")]
    OutOfRange {
        /// Offset of the access inside the table or PBA.
        offset: u64,
        /// Its size in bytes.
        len: usize,
    },
}

/// What happened to a vector that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireOutcome {
    /// Deliver it now (signal its eventfd).
    Deliver,
    /// Masked: its pending bit is set; it is delivered once unmasked.
    Pending,
    /// MSI-X is off (or the vector does not exist): nothing happens.
    NotEnabled,
}

/// One table entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixEntry {
    /// Message Address (bits 1:0 always 0).
    pub address: u64,
    /// Message Data.
    pub data: u32,
    /// Vector Control Mask Bit.
    pub masked: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct VectorRouting {
    /// The client bound an eventfd to this vector.
    bound: bool,
    /// The client masked it with SET_IRQS ACTION_MASK.
    client_masked: bool,
}

/// The MSI-X state of one function: table, PBA, Message Control bits and
/// the client's per-vector routing. Every method that can unmask a vector
/// returns the pending vectors to deliver now; the caller signals them.
#[derive(Debug, Clone)]
pub struct MsixState {
    vectors: u16,
    table: Vec<u8>,
    pending: Vec<u64>,
    routing: Vec<VectorRouting>,
    enabled: bool,
    function_masked: bool,
    table_masks_delivery: bool,
}

fn check_access(
    offset: u64,
    len: usize,
    size: u64,
    sizes: AccessSizes,
) -> Result<usize, MsixAccessError> {
    let aligned = match len {
        4 | 8 => offset.is_multiple_of(len as u64),
        1 | 2 if sizes == AccessSizes::Any => offset.is_multiple_of(len as u64),
        _ => false,
    };
    if !aligned {
        return Err(MsixAccessError::BadSize { offset, len });
    }
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= size => {
            usize::try_from(offset).map_err(|_| MsixAccessError::OutOfRange { offset, len })
        }
        _ => Err(MsixAccessError::OutOfRange { offset, len }),
    }
}

impl MsixState {
    /// `vectors` is clamped to 1..=2048.
    pub fn new(vectors: u16) -> Self {
        let vectors = vectors.clamp(1, MAX_VECTORS);
        let mut state = Self {
            vectors,
            table: vec![0; usize::from(vectors) * ENTRY_SIZE as usize],
            pending: vec![0; usize::from(vectors).div_ceil(64)],
            routing: vec![VectorRouting::default(); usize::from(vectors)],
            enabled: false,
            function_masked: false,
            table_masks_delivery: false,
        };
        state.reset();
        state
    }

    /// Number of vectors (table entries).
    pub fn vectors(&self) -> u16 {
        self.vectors
    }

    /// Bytes the table takes in its BAR.
    pub fn table_len(&self) -> u64 {
        self.table.len() as u64
    }

    /// Bytes the PBA takes in its BAR (whole qwords).
    pub fn pba_len(&self) -> u64 {
        self.pending.len() as u64 * 8
    }

    /// Makes the table's per-vector mask bit gate delivery, for a client
    /// that forwards table accesses instead of emulating the table.
    pub fn set_table_masks_delivery(&mut self, on: bool) -> Vec<u16> {
        self.table_masks_delivery = on;
        self.take_deliverable()
    }

    /// Power-on state: disabled, every table entry masked, nothing pending,
    /// nothing routed.
    pub fn reset(&mut self) {
        self.table.fill(0);
        for entry in self.table.chunks_exact_mut(ENTRY_SIZE as usize) {
            entry[ENTRY_VECTOR_CONTROL as usize..]
                .copy_from_slice(&VECTOR_CONTROL_MASK_BIT.to_le_bytes());
        }
        self.pending.fill(0);
        self.routing.fill(VectorRouting::default());
        self.enabled = false;
        self.function_masked = false;
    }

    /// MSI-X Enable, as last written to Message Control.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Function Mask, as last written to Message Control.
    pub fn function_masked(&self) -> bool {
        self.function_masked
    }

    /// Table entry `vector`, or `None` beyond the table.
    pub fn entry(&self, vector: u16) -> Option<MsixEntry> {
        let start = usize::from(vector) * ENTRY_SIZE as usize;
        let entry = self.table.get(start..start + ENTRY_SIZE as usize)?;
        let dword = |at: usize| {
            u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
        };
        Some(MsixEntry {
            address: u64::from(dword(0)) | (u64::from(dword(4)) << 32),
            data: dword(8),
            masked: dword(12) & VECTOR_CONTROL_MASK_BIT != 0,
        })
    }

    /// Whether `vector`'s bit is set in the PBA.
    pub fn is_pending(&self, vector: u16) -> bool {
        let word = usize::from(vector) / 64;
        self.pending
            .get(word)
            .is_some_and(|bits| bits & (1 << (vector % 64)) != 0)
    }

    /// Whether a vector that fires now would wait (and be marked pending).
    pub fn is_masked(&self, vector: u16) -> bool {
        let Some(routing) = self.routing.get(usize::from(vector)) else {
            return true;
        };
        let table_mask = self.table_masks_delivery && self.entry(vector).is_some_and(|e| e.masked);
        self.function_masked || !routing.bound || routing.client_masked || table_mask
    }

    /// The device signals `vector`.
    pub fn fire(&mut self, vector: u16) -> FireOutcome {
        if !self.enabled || vector >= self.vectors {
            return FireOutcome::NotEnabled;
        }
        if self.is_masked(vector) {
            self.mark_pending(vector);
            FireOutcome::Pending
        } else {
            FireOutcome::Deliver
        }
    }

    fn mark_pending(&mut self, vector: u16) {
        if let Some(bits) = self.pending.get_mut(usize::from(vector) / 64) {
            *bits |= 1u64 << (vector % 64);
        }
    }

    fn clear_pending(&mut self, vector: u16) {
        if let Some(bits) = self.pending.get_mut(usize::from(vector) / 64) {
            *bits &= !(1u64 << (vector % 64));
        }
    }

    /// Clears and returns the pending vectors that are no longer masked:
    /// the caller delivers them.
    fn take_deliverable(&mut self) -> Vec<u16> {
        if !self.enabled {
            return Vec::new();
        }
        let mut ready = Vec::new();
        for vector in 0..self.vectors {
            if self.is_pending(vector) && !self.is_masked(vector) {
                self.clear_pending(vector);
                ready.push(vector);
            }
        }
        ready
    }

    /// Message Control changed. Returns vectors to deliver now. Turning
    /// MSI-X off drops whatever was pending.
    pub fn set_control(&mut self, control: MsixControl) -> Vec<u16> {
        self.enabled = control.enabled;
        self.function_masked = control.function_masked;
        if !control.enabled {
            self.pending.fill(0);
        }
        self.take_deliverable()
    }

    /// The client bound or unbound an eventfd. Unbinding also drops the
    /// client's mask. Returns vectors to deliver now.
    pub fn set_binding(&mut self, vector: u16, binding: VectorBinding) -> Vec<u16> {
        if let Some(routing) = self.routing.get_mut(usize::from(vector)) {
            routing.bound = binding == VectorBinding::Bound;
            if binding == VectorBinding::Unbound {
                routing.client_masked = false;
            }
        }
        self.take_deliverable()
    }

    /// The client masked or unmasked a vector with SET_IRQS. Returns vectors
    /// to deliver now.
    pub fn set_client_mask(&mut self, vector: u16, mask: ClientMask) -> Vec<u16> {
        if let Some(routing) = self.routing.get_mut(usize::from(vector)) {
            routing.client_masked = mask == ClientMask::Masked;
        }
        self.take_deliverable()
    }

    /// Reads the table: 4- or 8-byte aligned accesses within it.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) -> Result<(), MsixAccessError> {
        let at = check_access(
            offset,
            data.len(),
            self.table_len(),
            AccessSizes::DwordOrQword,
        )?;
        let src = self
            .table
            .get(at..at + data.len())
            .ok_or(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            })?;
        data.copy_from_slice(src);
        Ok(())
    }

    /// Writes the table. Address bits 1:0 and the reserved vector-control
    /// bits are read-only zero. Returns vectors to deliver now (a vector
    /// unmasked in the table while table masks count).
    pub fn table_write(&mut self, offset: u64, data: &[u8]) -> Result<Vec<u16>, MsixAccessError> {
        let at = check_access(
            offset,
            data.len(),
            self.table_len(),
            AccessSizes::DwordOrQword,
        )?;
        let dst = self
            .table
            .get_mut(at..at + data.len())
            .ok_or(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            })?;
        dst.copy_from_slice(data);
        // Re-apply the read-only bits of every dword the write touched.
        let first_dword = at / 4;
        let dwords = data.len() / 4;
        for dword in first_dword..first_dword + dwords {
            let field = (dword * 4) as u64 % ENTRY_SIZE;
            let keep: u32 = match field {
                0 => !0b11,
                ENTRY_VECTOR_CONTROL => VECTOR_CONTROL_MASK_BIT,
                _ => !0,
            };
            if let Some(bytes) = self.table.get_mut(dword * 4..dword * 4 + 4) {
                let value = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) & keep;
                bytes.copy_from_slice(&value.to_le_bytes());
            }
        }
        Ok(self.take_deliverable())
    }

    /// Reads the PBA. Any naturally aligned 1/2/4/8-byte access works, since
    /// the client forwards whatever size the guest used.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) -> Result<(), MsixAccessError> {
        let at = check_access(offset, data.len(), self.pba_len(), AccessSizes::Any)?;
        let mut image = Vec::with_capacity(self.pending.len() * 8);
        for word in &self.pending {
            image.extend_from_slice(&word.to_le_bytes());
        }
        let src = image
            .get(at..at + data.len())
            .ok_or(MsixAccessError::OutOfRange {
                offset,
                len: data.len(),
            })?;
        data.copy_from_slice(src);
        Ok(())
    }

    /// The PBA is read-only; a well-formed write is ignored.
    pub fn pba_write(&mut self, offset: u64, data: &[u8]) -> Result<(), MsixAccessError> {
        check_access(offset, data.len(), self.pba_len(), AccessSizes::Any)?;
        Ok(())
    }
}
