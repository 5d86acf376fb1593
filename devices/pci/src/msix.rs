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

use crate::regs::msix::{ENTRY_SIZE, ENTRY_VECTOR_CONTROL, MAX_VECTORS, VECTOR_CONTROL_MASK_BIT};

/// A table or PBA access the device cannot serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsixAccessError {
    #[error(
        "MSI-X access of {len} bytes at {offset:#x}: only 4- or 8-byte naturally aligned accesses"
    )]
    BadSize { offset: u64, len: usize },
    #[error("MSI-X access of {len} bytes at {offset:#x} is beyond the structure")]
    OutOfRange { offset: u64, len: usize },
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
    pub address: u64,
    pub data: u32,
    pub masked: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct VectorRouting {
    /// The client bound an eventfd to this vector.
    bound: bool,
    /// The client masked it with SET_IRQS ACTION_MASK.
    client_masked: bool,
}

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
    allow_small: bool,
) -> Result<usize, MsixAccessError> {
    let aligned = match len {
        4 | 8 => offset.is_multiple_of(len as u64),
        1 | 2 if allow_small => offset.is_multiple_of(len as u64),
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

    pub fn vectors(&self) -> u16 {
        self.vectors
    }

    pub fn table_len(&self) -> u64 {
        self.table.len() as u64
    }

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

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn function_masked(&self) -> bool {
        self.function_masked
    }

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
            self.set_pending(vector, true);
            FireOutcome::Pending
        } else {
            FireOutcome::Deliver
        }
    }

    fn set_pending(&mut self, vector: u16, on: bool) {
        if let Some(bits) = self.pending.get_mut(usize::from(vector) / 64) {
            let bit = 1u64 << (vector % 64);
            if on {
                *bits |= bit;
            } else {
                *bits &= !bit;
            }
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
                self.set_pending(vector, false);
                ready.push(vector);
            }
        }
        ready
    }

    /// Message Control changed. Returns vectors to deliver now. Turning
    /// MSI-X off drops whatever was pending.
    pub fn set_control(&mut self, enabled: bool, function_masked: bool) -> Vec<u16> {
        self.enabled = enabled;
        self.function_masked = function_masked;
        if !enabled {
            self.pending.fill(0);
        }
        self.take_deliverable()
    }

    /// The client bound (`true`) or unbound an eventfd. Returns vectors to
    /// deliver now.
    pub fn set_bound(&mut self, vector: u16, bound: bool) -> Vec<u16> {
        if let Some(routing) = self.routing.get_mut(usize::from(vector)) {
            routing.bound = bound;
            if !bound {
                routing.client_masked = false;
            }
        }
        self.take_deliverable()
    }

    /// The client masked or unmasked a vector with SET_IRQS. Returns vectors
    /// to deliver now.
    pub fn set_client_masked(&mut self, vector: u16, masked: bool) -> Vec<u16> {
        if let Some(routing) = self.routing.get_mut(usize::from(vector)) {
            routing.client_masked = masked;
        }
        self.take_deliverable()
    }

    /// Reads the table: 4- or 8-byte aligned accesses within it.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) -> Result<(), MsixAccessError> {
        let at = check_access(offset, data.len(), self.table_len(), false)?;
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
        let at = check_access(offset, data.len(), self.table_len(), false)?;
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
        let at = check_access(offset, data.len(), self.pba_len(), true)?;
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
        check_access(offset, data.len(), self.pba_len(), true)?;
        Ok(())
    }
}
