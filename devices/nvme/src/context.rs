//! What every command handler gets and returns: the same signature for
//! every command of every command set.

use std::sync::Arc;

use crate::command::{Command, Completion};
use crate::datapointer::{DataBuffer, DataPointers, DataTransfer};
use crate::fault::LbaRange;
use crate::memory::Placement;
use crate::namespace::DIRECT_ALIGN;
use crate::queues::CompletionQueue;
use crate::spec::Status;
use crate::state::ControllerState;

/// How a command ended, as its handler reports it. An error status is the
/// `Err` of [`CommandResult`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Post this completion now.
    Complete(Completion),
    /// The command stays outstanding and completes later (Asynchronous
    /// Event Request): post nothing now.
    Deferred,
}

impl Outcome {
    /// Successful completion, Dword 0 = 0.
    pub fn success() -> Self {
        Outcome::Complete(Completion::success())
    }

    /// Successful completion with a command-specific Dword 0.
    pub fn with_result(dw0: u32) -> Self {
        Outcome::Complete(Completion::with_result(dw0))
    }

    /// The outcome of a handler's result: an error status completes the
    /// command with that status.
    pub fn of(result: CommandResult) -> Self {
        result.unwrap_or_else(|status| Outcome::Complete(Completion::error(status)))
    }
}

/// What a command handler returns: an outcome, or the status the command
/// fails with.
pub(crate) type CommandResult = Result<Outcome, Status>;

/// Buffers a queue worker reuses from command to command, so that I/O
/// allocates nothing per command. Both start on a 4 KiB boundary, so that
/// an O_DIRECT namespace (`--caching direct`) can use them as they are.
#[derive(Default)]
pub(crate) struct BounceBuffers {
    /// One chunk of logical block data on its way between host memory and
    /// the namespace (Read, Write, Verify; the host's side of Compare).
    transfer: Vec<u8>,
    /// The namespace's side of Compare: what the media holds, to check the
    /// host's data against.
    media: Vec<u8>,
}

/// `len` bytes of `storage` starting at its first 4 KiB boundary, growing
/// it (with room for the alignment) when it is too short.
fn aligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    let need = len + DIRECT_ALIGN;
    if storage.len() < need {
        storage.resize(need, 0);
    }
    let start = storage
        .as_ptr()
        .align_offset(DIRECT_ALIGN)
        .min(DIRECT_ALIGN);
    &mut storage[start..start + len]
}

impl BounceBuffers {
    /// The `len`-byte transfer buffer; its contents are stale and must be
    /// overwritten.
    pub fn transfer(&mut self, len: usize) -> &mut [u8] {
        aligned(&mut self.transfer, len)
    }

    /// The transfer buffer for the host's data and the media buffer, both
    /// `len` bytes of stale contents (Compare).
    pub fn host_and_media(&mut self, len: usize) -> (&mut [u8], &mut [u8]) {
        (
            aligned(&mut self.transfer, len),
            aligned(&mut self.media, len),
        )
    }
}

/// The command being run and everything its handler may touch.
pub(crate) struct CommandContext<'a> {
    /// The controller.
    pub state: &'a Arc<ControllerState>,
    /// The submission queue entry.
    pub cmd: &'a Command,
    /// The completion queue of the command's submission queue (handlers
    /// that complete other commands post there: Abort).
    pub cq: &'a CompletionQueue,
    /// The SQ Head Pointer to report in completions.
    pub sq_head: u16,
    /// The worker's reusable buffers.
    pub buffers: &'a mut BounceBuffers,
    /// Set by the command table from the command's row and set.
    pub(crate) data: DataTransfer,
    pub(crate) pointers: DataPointers,
    /// An injected `corrupt`: Read flips a bit in each of these blocks.
    pub corrupt: Option<LbaRange>,
}

impl<'a> CommandContext<'a> {
    pub fn new(
        state: &'a Arc<ControllerState>,
        cmd: &'a Command,
        cq: &'a CompletionQueue,
        sq_head: u16,
        buffers: &'a mut BounceBuffers,
    ) -> Self {
        Self {
            state,
            cmd,
            cq,
            sq_head,
            buffers,
            data: DataTransfer::None,
            pointers: DataPointers::PrpOnly,
            corrupt: None,
        }
    }

    /// The command's data pointer walked for `len` bytes, in the direction
    /// its table row says.
    pub fn map_data(&self, len: u64) -> Result<DataBuffer, Status> {
        // A handler mapping data for a command whose row says it moves
        // none is a bug in this crate, not the guest's error.
        let direction = self.data.direction().ok_or(Status::INTERNAL_ERROR)?;
        let state = self.state;
        DataBuffer::map(
            &state.mem,
            self.cmd,
            len,
            direction,
            state.page_size(),
            self.pointers,
        )
    }

    /// Sends `data` to the host buffer of a controller-to-host command.
    pub fn send(&self, data: &[u8]) -> Result<Placement, Status> {
        self.map_data(data.len() as u64)?
            .write_to_host(&self.state.mem, data)
    }

    /// Receives `len` bytes from the host buffer of a host-to-controller
    /// command.
    pub fn receive(&self, len: usize) -> Result<Vec<u8>, Status> {
        let buf = self.map_data(len as u64)?;
        let mut data = vec![0u8; len];
        buf.read_from_host(&self.state.mem, &mut data)?;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounce_buffers_start_on_a_4k_boundary() {
        let mut b = BounceBuffers::default();
        for len in [512, 4096, 1 << 20, 12288, 1 << 20] {
            let t = b.transfer(len);
            assert_eq!((t.len(), t.as_ptr() as usize % DIRECT_ALIGN), (len, 0));
            let (h, m) = b.host_and_media(len);
            assert_eq!((h.len(), h.as_ptr() as usize % DIRECT_ALIGN), (len, 0));
            assert_eq!((m.len(), m.as_ptr() as usize % DIRECT_ALIGN), (len, 0));
        }
    }
}
