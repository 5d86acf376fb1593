//! Typed views of the command dwords, one per command, with fields named as
//! in the specifications (NVMe base 2.0 for admin commands, NVM command set
//! 1.0 for I/O): `CreateIoSq::qsize`, `GetLogPage::numd`, `WriteZeroes::deac`.
//!
//! A command is parsed into its view once, at dispatch (its command table
//! row does it), and the handler reads only the view. Parsing reads fixed
//! bit positions, so any dword parses; whether a value is acceptable (a
//! queue too large, an unknown CNS) is the handler's call, made in the
//! order the specification and the tests expect. The one exception is a
//! field with reserved encodings the controller must refuse before looking
//! at anything else (Get Features SEL).

use crate::command::Command;
use crate::spec::Status;

/// Get Features SEL: which value of a feature to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Current,
    Default,
    Saved,
    Capabilities,
}

impl Select {
    /// The SEL field (Get Features CDW10 10:8); 100b to 111b are reserved.
    pub fn from_sel(sel: u32) -> Result<Self, Status> {
        match sel {
            0 => Ok(Select::Current),
            1 => Ok(Select::Default),
            2 => Ok(Select::Saved),
            3 => Ok(Select::Capabilities),
            _ => Err(Status::INVALID_FIELD),
        }
    }
}

/// A command's typed view.
pub trait CommandFields: Sized {
    /// Reads the view out of the submission queue entry.
    fn parse(cmd: &Command) -> Result<Self, Status>;
}

/// `width` bits of `dword` from bit `shift` on.
const fn bits(dword: u32, shift: u32, width: u32) -> u32 {
    (dword >> shift) & ((1 << width) - 1)
}

const fn bit(dword: u32, at: u32) -> bool {
    dword & (1 << at) != 0
}

/// Create I/O Completion Queue (05h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateIoCq {
    /// PRP Entry 1: the queue's base address (physically contiguous).
    pub prp1: u64,
    /// Queue Identifier (CDW10 15:0).
    pub qid: u16,
    /// Queue Size, 0's based (CDW10 31:16).
    pub qsize: u16,
    /// Physically Contiguous (CDW11 0).
    pub pc: bool,
    /// Interrupts Enabled (CDW11 1).
    pub ien: bool,
    /// Interrupt Vector (CDW11 31:16).
    pub iv: u16,
}

impl CreateIoCq {
    /// Entries in the queue (QSIZE + 1).
    pub fn entries(&self) -> u32 {
        u32::from(self.qsize) + 1
    }
}

impl CommandFields for CreateIoCq {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let (cdw10, cdw11) = (cmd.cdw10(), cmd.cdw11());
        Ok(Self {
            prp1: cmd.prp1(),
            qid: bits(cdw10, 0, 16) as u16,
            qsize: bits(cdw10, 16, 16) as u16,
            pc: bit(cdw11, 0),
            ien: bit(cdw11, 1),
            iv: bits(cdw11, 16, 16) as u16,
        })
    }
}

/// Create I/O Submission Queue (01h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateIoSq {
    /// PRP Entry 1: the queue's base address (physically contiguous).
    pub prp1: u64,
    /// Queue Identifier (CDW10 15:0).
    pub qid: u16,
    /// Queue Size, 0's based (CDW10 31:16).
    pub qsize: u16,
    /// Physically Contiguous (CDW11 0).
    pub pc: bool,
    /// Queue Priority (CDW11 2:1); round robin ignores it.
    pub qprio: u8,
    /// Completion Queue Identifier (CDW11 31:16).
    pub cqid: u16,
    /// NVM Set Identifier (CDW12 15:0); no NVM sets here.
    pub nvmsetid: u16,
}

impl CreateIoSq {
    /// Entries in the queue (QSIZE + 1).
    pub fn entries(&self) -> u32 {
        u32::from(self.qsize) + 1
    }
}

impl CommandFields for CreateIoSq {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let (cdw10, cdw11) = (cmd.cdw10(), cmd.cdw11());
        Ok(Self {
            prp1: cmd.prp1(),
            qid: bits(cdw10, 0, 16) as u16,
            qsize: bits(cdw10, 16, 16) as u16,
            pc: bit(cdw11, 0),
            qprio: bits(cdw11, 1, 2) as u8,
            cqid: bits(cdw11, 16, 16) as u16,
            nvmsetid: bits(cmd.cdw12(), 0, 16) as u16,
        })
    }
}

/// Delete I/O Submission Queue (00h) and Delete I/O Completion Queue (04h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteIoQueue {
    /// Queue Identifier (CDW10 15:0).
    pub qid: u16,
}

impl CommandFields for DeleteIoQueue {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        Ok(Self {
            qid: bits(cmd.cdw10(), 0, 16) as u16,
        })
    }
}

/// Identify (06h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identify {
    pub nsid: u32,
    /// Controller or Namespace Structure (CDW10 7:0), see [`spec::cns`](crate::spec::cns).
    pub cns: u8,
    /// Controller Identifier (CDW10 31:16).
    pub cntid: u16,
    /// CNS Specific Identifier (CDW11 15:0).
    pub cnssid: u16,
    /// Command Set Identifier (CDW11 31:24).
    pub csi: u8,
}

impl CommandFields for Identify {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let (cdw10, cdw11) = (cmd.cdw10(), cmd.cdw11());
        Ok(Self {
            nsid: cmd.nsid(),
            cns: bits(cdw10, 0, 8) as u8,
            cntid: bits(cdw10, 16, 16) as u16,
            cnssid: bits(cdw11, 0, 16) as u16,
            csi: bits(cdw11, 24, 8) as u8,
        })
    }
}

/// Get Log Page (02h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetLogPage {
    pub nsid: u32,
    /// Log Page Identifier (CDW10 7:0).
    pub lid: u8,
    /// Log Specific Parameter (CDW10 14:8).
    pub lsp: u8,
    /// Retain Asynchronous Event (CDW10 15).
    pub rae: bool,
    /// Number of Dwords, 0's based: NUMDU (CDW11 15:0) : NUMDL (CDW10 31:16).
    pub numd: u32,
    /// Log Specific Identifier (CDW11 31:16).
    pub lsi: u16,
    /// Log Page Offset in bytes: LPOU (CDW13) : LPOL (CDW12).
    pub lpo: u64,
    /// UUID Index (CDW14 6:0).
    pub uuid_index: u8,
    /// Offset Type (CDW14 23): LPO counts entries instead of bytes.
    pub ot: bool,
    /// Command Set Identifier (CDW14 31:24).
    pub csi: u8,
}

impl GetLogPage {
    /// Bytes asked for ((NUMD + 1) dwords).
    pub fn bytes(&self) -> u64 {
        (u64::from(self.numd) + 1) * 4
    }
}

impl CommandFields for GetLogPage {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let (cdw10, cdw11, cdw14) = (cmd.cdw10(), cmd.cdw11(), cmd.cdw14());
        Ok(Self {
            nsid: cmd.nsid(),
            lid: bits(cdw10, 0, 8) as u8,
            lsp: bits(cdw10, 8, 7) as u8,
            rae: bit(cdw10, 15),
            numd: (bits(cdw11, 0, 16) << 16) | bits(cdw10, 16, 16),
            lsi: bits(cdw11, 16, 16) as u16,
            lpo: cmd.cdw12_13(),
            uuid_index: bits(cdw14, 0, 7) as u8,
            ot: bit(cdw14, 23),
            csi: bits(cdw14, 24, 8) as u8,
        })
    }
}

/// Get Features (0Ah).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetFeatures {
    pub nsid: u32,
    /// Feature Identifier (CDW10 7:0), see [`spec::feature`](crate::spec::feature).
    pub fid: u8,
    /// Select (CDW10 10:8); reserved values fail the parse with Invalid
    /// Field in Command.
    pub sel: Select,
    /// The feature specific dword (CDW11), decoded by the feature.
    pub cdw11: u32,
}

impl CommandFields for GetFeatures {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw10 = cmd.cdw10();
        Ok(Self {
            nsid: cmd.nsid(),
            fid: bits(cdw10, 0, 8) as u8,
            sel: Select::from_sel(bits(cdw10, 8, 3))?,
            cdw11: cmd.cdw11(),
        })
    }
}

/// Set Features (09h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetFeatures {
    pub nsid: u32,
    /// Feature Identifier (CDW10 7:0).
    pub fid: u8,
    /// Save (CDW10 31): nothing here is saveable.
    pub sv: bool,
    /// The feature specific dword (CDW11), decoded by the feature.
    pub cdw11: u32,
}

impl CommandFields for SetFeatures {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw10 = cmd.cdw10();
        Ok(Self {
            nsid: cmd.nsid(),
            fid: bits(cdw10, 0, 8) as u8,
            sv: bit(cdw10, 31),
            cdw11: cmd.cdw11(),
        })
    }
}

/// Abort (08h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abort {
    /// Submission Queue Identifier (CDW10 15:0).
    pub sqid: u16,
    /// Command Identifier (CDW10 31:16) of the command to abort.
    pub cid: u16,
}

impl CommandFields for Abort {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw10 = cmd.cdw10();
        Ok(Self {
            sqid: bits(cdw10, 0, 16) as u16,
            cid: bits(cdw10, 16, 16) as u16,
        })
    }
}

/// Asynchronous Event Request (0Ch): no fields; its CID is what completes
/// later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEventRequest {
    pub cid: u16,
}

impl CommandFields for AsyncEventRequest {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        Ok(Self { cid: cmd.cid() })
    }
}

/// Doorbell Buffer Config (7Ch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorbellBufferConfig {
    /// PRP Entry 1: Shadow Doorbell Buffer Address (page aligned).
    pub shadow_doorbell_buffer: u64,
    /// PRP Entry 2: EventIdx Buffer Address (page aligned).
    pub eventidx_buffer: u64,
}

impl CommandFields for DoorbellBufferConfig {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        Ok(Self {
            shadow_doorbell_buffer: cmd.prp1(),
            eventidx_buffer: cmd.prp2(),
        })
    }
}

/// Format NVM (80h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatNvm {
    pub nsid: u32,
    /// LBA Format index: LBAFU (CDW10 13:12) : LBAFL (CDW10 3:0).
    pub lbaf: u8,
    /// Metadata Settings (CDW10 4).
    pub mset: bool,
    /// Protection Information (CDW10 7:5).
    pub pi: u8,
    /// Protection Information Location (CDW10 8).
    pub pil: bool,
    /// Secure Erase Settings (CDW10 11:9).
    pub ses: u8,
}

impl CommandFields for FormatNvm {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw10 = cmd.cdw10();
        Ok(Self {
            nsid: cmd.nsid(),
            lbaf: (bits(cdw10, 0, 4) | (bits(cdw10, 12, 2) << 4)) as u8,
            mset: bit(cdw10, 4),
            pi: bits(cdw10, 5, 3) as u8,
            pil: bit(cdw10, 8),
            ses: bits(cdw10, 9, 3) as u8,
        })
    }
}

/// Flush (00h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush {
    /// One namespace, or FFFFFFFFh for all of them.
    pub nsid: u32,
}

impl CommandFields for Flush {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        Ok(Self { nsid: cmd.nsid() })
    }
}

/// Read (02h), Write (01h), Compare (05h) and Verify (0Ch): the same
/// dwords 10 to 12.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWrite {
    pub nsid: u32,
    /// Starting LBA (CDW11:CDW10).
    pub slba: u64,
    /// Number of Logical Blocks, 0's based (CDW12 15:0).
    pub nlb: u16,
    /// Protection Information field (CDW12 29:26); no PI here.
    pub prinfo: u8,
    /// Force Unit Access (CDW12 30).
    pub fua: bool,
    /// Limited Retry (CDW12 31).
    pub lr: bool,
}

impl ReadWrite {
    /// Logical blocks the command covers (NLB + 1).
    pub fn blocks(&self) -> u64 {
        u64::from(self.nlb) + 1
    }
}

impl CommandFields for ReadWrite {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw12 = cmd.cdw12();
        Ok(Self {
            nsid: cmd.nsid(),
            slba: cmd.cdw10_11(),
            nlb: bits(cdw12, 0, 16) as u16,
            prinfo: bits(cdw12, 26, 4) as u8,
            fua: bit(cdw12, 30),
            lr: bit(cdw12, 31),
        })
    }
}

/// Write Zeroes (08h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteZeroes {
    pub nsid: u32,
    /// Starting LBA (CDW11:CDW10).
    pub slba: u64,
    /// Number of Logical Blocks, 0's based (CDW12 15:0).
    pub nlb: u16,
    /// Deallocate (CDW12 25): the blocks may be deallocated.
    pub deac: bool,
    /// Protection Information field (CDW12 29:26).
    pub prinfo: u8,
    /// Force Unit Access (CDW12 30).
    pub fua: bool,
    /// Limited Retry (CDW12 31).
    pub lr: bool,
}

impl WriteZeroes {
    /// Logical blocks the command covers (NLB + 1).
    pub fn blocks(&self) -> u64 {
        u64::from(self.nlb) + 1
    }
}

impl CommandFields for WriteZeroes {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw12 = cmd.cdw12();
        Ok(Self {
            nsid: cmd.nsid(),
            slba: cmd.cdw10_11(),
            nlb: bits(cdw12, 0, 16) as u16,
            deac: bit(cdw12, 25),
            prinfo: bits(cdw12, 26, 4) as u8,
            fua: bit(cdw12, 30),
            lr: bit(cdw12, 31),
        })
    }
}

/// Dataset Management (09h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetManagement {
    pub nsid: u32,
    /// Number of Ranges, 0's based (CDW10 7:0).
    pub nr: u8,
    /// Attribute – Integral Dataset for Read (CDW11 0).
    pub idr: bool,
    /// Attribute – Integral Dataset for Write (CDW11 1).
    pub idw: bool,
    /// Attribute – Deallocate (CDW11 2).
    pub ad: bool,
}

impl DatasetManagement {
    /// Ranges in the data buffer (NR + 1).
    pub fn ranges(&self) -> usize {
        usize::from(self.nr) + 1
    }
}

impl CommandFields for DatasetManagement {
    fn parse(cmd: &Command) -> Result<Self, Status> {
        let cdw11 = cmd.cdw11();
        Ok(Self {
            nsid: cmd.nsid(),
            nr: bits(cmd.cdw10(), 0, 8) as u8,
            idr: bit(cdw11, 0),
            idw: bit(cdw11, 1),
            ad: bit(cdw11, 2),
        })
    }
}

/// One Dataset Management range (16 bytes of the command's data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRange {
    /// Context Attributes (bytes 3:0).
    pub context_attributes: u32,
    /// Length in Logical Blocks (bytes 7:4); not 0's based, 0 is empty.
    pub nlb: u32,
    /// Starting LBA (bytes 15:8).
    pub slba: u64,
}

impl DsmRange {
    /// Bytes per range in the data buffer.
    pub const SIZE: usize = 16;

    pub fn parse(raw: &[u8; Self::SIZE]) -> Self {
        let [a0, a1, a2, a3, l0, l1, l2, l3, s0, s1, s2, s3, s4, s5, s6, s7] = *raw;
        Self {
            context_attributes: u32::from_le_bytes([a0, a1, a2, a3]),
            nlb: u32::from_le_bytes([l0, l1, l2, l3]),
            slba: u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CommandBuilder;

    /// Catches a field read from the wrong bits: the dwords are spelled out
    /// from the specification's figures, independently of the parsers.
    #[test]
    fn admin_views_read_their_fields_from_the_spec_positions() {
        let cmd = |cdw10: u32, cdw11: u32| {
            CommandBuilder::new(0, 9)
                .nsid(3)
                .prp1(0x1000)
                .prp2(0x2000)
                .cdw(10, cdw10)
                .cdw(11, cdw11)
                .cdw(12, 0x0005_0007)
                .cdw(13, 0x1)
                .cdw(14, (0x5a << 24) | (1 << 23) | 0x11)
                .build()
        };
        let sq = CreateIoSq::parse(&cmd(0x003f_0002, 0x0001_0005)).unwrap();
        assert_eq!(
            (sq.qid, sq.qsize, sq.pc, sq.qprio, sq.cqid, sq.nvmsetid),
            (2, 0x3f, true, 2, 1, 7)
        );
        assert_eq!((sq.entries(), sq.prp1), (64, 0x1000));
        let cq = CreateIoCq::parse(&cmd(0xffff_0004, 0x0003_0002)).unwrap();
        assert_eq!(
            (cq.qid, cq.entries(), cq.pc, cq.ien, cq.iv),
            (4, 0x1_0000, false, true, 3)
        );
        let id = Identify::parse(&cmd(0x0007_0001, 0x0200_0033)).unwrap();
        assert_eq!(
            (id.cns, id.cntid, id.cnssid, id.csi, id.nsid),
            (1, 7, 0x33, 2, 3)
        );
        let log = GetLogPage::parse(&cmd(0x0003_8502, 0x0009_0001)).unwrap();
        assert_eq!((log.lid, log.lsp, log.rae), (2, 5, true));
        assert_eq!((log.numd, log.bytes()), (0x1_0003, 0x1_0004 * 4));
        assert_eq!((log.lsi, log.lpo), (9, (1 << 32) | 0x0005_0007));
        assert_eq!((log.uuid_index, log.ot, log.csi), (0x11, true, 0x5a));
        let get = GetFeatures::parse(&cmd(0x0000_0307, 0x42)).unwrap();
        assert_eq!(
            (get.fid, get.sel, get.cdw11),
            (7, Select::Capabilities, 0x42)
        );
        assert_eq!(
            GetFeatures::parse(&cmd(0x0000_0407, 0)),
            Err(Status::INVALID_FIELD),
            "SEL 100b is reserved"
        );
        let set = SetFeatures::parse(&cmd(0x8000_000e, 1)).unwrap();
        assert_eq!((set.fid, set.sv, set.cdw11), (0x0e, true, 1));
        let abort = Abort::parse(&cmd(0x1234_0001, 0)).unwrap();
        assert_eq!((abort.sqid, abort.cid), (1, 0x1234));
        let dbbuf = DoorbellBufferConfig::parse(&cmd(0, 0)).unwrap();
        assert_eq!(
            (dbbuf.shadow_doorbell_buffer, dbbuf.eventidx_buffer),
            (0x1000, 0x2000)
        );
        let format = FormatNvm::parse(&cmd(
            (0x2 << 12) | (0x3 << 9) | (1 << 8) | (0x5 << 5) | (1 << 4) | 0x1,
            0,
        ))
        .unwrap();
        assert_eq!(
            (format.lbaf, format.mset, format.pi, format.pil, format.ses),
            (0x21, true, 5, true, 3)
        );
        assert_eq!(DeleteIoQueue::parse(&cmd(0xffff_0009, 0)).unwrap().qid, 9);
    }

    #[test]
    fn nvm_views_read_their_fields_from_the_spec_positions() {
        let rw = CommandBuilder::new(0x02, 1)
            .nsid(1)
            .slba(0x1_0000_0002)
            .cdw(12, (1 << 31) | (1 << 30) | (0x9 << 26) | (1 << 25) | 0x00ff)
            .build();
        let r = ReadWrite::parse(&rw).unwrap();
        assert_eq!((r.slba, r.nlb, r.blocks()), (0x1_0000_0002, 0xff, 0x100));
        assert_eq!((r.prinfo, r.fua, r.lr, r.nsid), (0x9, true, true, 1));
        let z = WriteZeroes::parse(&rw).unwrap();
        assert_eq!(
            (z.slba, z.blocks(), z.deac, z.fua),
            (0x1_0000_0002, 0x100, true, true)
        );
        let dsm = CommandBuilder::new(0x09, 1)
            .cdw(10, 0xffff_ff02)
            .cdw(11, 0b100)
            .build();
        let d = DatasetManagement::parse(&dsm).unwrap();
        assert_eq!(
            (d.nr, d.ranges(), d.idr, d.idw, d.ad),
            (2, 3, false, false, true)
        );
        let mut raw = [0u8; 16];
        raw[0..4].copy_from_slice(&7u32.to_le_bytes());
        raw[4..8].copy_from_slice(&8u32.to_le_bytes());
        raw[8..16].copy_from_slice(&0x1_0000_0009u64.to_le_bytes());
        let range = DsmRange::parse(&raw);
        assert_eq!(
            (range.context_attributes, range.nlb, range.slba),
            (7, 8, 0x1_0000_0009)
        );
    }
}
