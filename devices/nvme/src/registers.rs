//! Controller registers (NVMe base 2.0, 3.1.4): where each sits in BAR0
//! ([`reg`]) and typed views of their fields, named as in the
//! specification (`Cc::iosqes`, `Csts::CFS`, `CmbSz::szu`...).
//!
//! Values the host writes are kept raw and read through accessors
//! ([`Cc`], [`Aqa`], [`CmbMsc`], [`PmrCtl`], [`PmrMsc`]); values the
//! controller reports are built from named fields ([`Cap`], [`CmbLoc`],
//! [`CmbSz`], [`PmrCap`]) or flags ([`Csts`], [`CmbSts`], [`PmrSts`]).

/// Register byte offsets in BAR0. 64-bit registers are accessed as two
/// dwords; the upper one has its own name (`ASQ_HI`...).
pub mod reg {
    /// Controller Capabilities, low and high dwords.
    pub const CAP: u64 = 0x00;
    pub const CAP_HI: u64 = 0x04;
    /// Version.
    pub const VS: u64 = 0x08;
    /// Interrupt Mask Set / Clear.
    pub const INTMS: u64 = 0x0c;
    pub const INTMC: u64 = 0x10;
    /// Controller Configuration.
    pub const CC: u64 = 0x14;
    /// Controller Status.
    pub const CSTS: u64 = 0x1c;
    /// NVM Subsystem Reset.
    pub const NSSR: u64 = 0x20;
    /// Admin Queue Attributes.
    pub const AQA: u64 = 0x24;
    /// Admin Submission Queue Base Address, low and high dwords.
    pub const ASQ: u64 = 0x28;
    pub const ASQ_HI: u64 = 0x2c;
    /// Admin Completion Queue Base Address, low and high dwords.
    pub const ACQ: u64 = 0x30;
    pub const ACQ_HI: u64 = 0x34;
    /// Controller Memory Buffer Location and Size.
    pub const CMBLOC: u64 = 0x38;
    pub const CMBSZ: u64 = 0x3c;
    /// Boot Partition Information, Read Select, Memory Buffer Location.
    pub const BPINFO: u64 = 0x40;
    pub const BPRSEL: u64 = 0x44;
    pub const BPMBL: u64 = 0x48;
    pub const BPMBL_HI: u64 = 0x4c;
    /// Controller Memory Buffer Memory Space Control, low and high dwords.
    pub const CMBMSC: u64 = 0x50;
    pub const CMBMSC_HI: u64 = 0x54;
    /// Controller Memory Buffer Status.
    pub const CMBSTS: u64 = 0x58;
    /// Persistent Memory Region Capabilities, Control, Status, Elasticity
    /// Buffer Size, Sustained Write Throughput, Memory Space Control
    /// (lower and upper dwords).
    pub const PMRCAP: u64 = 0xe00;
    pub const PMRCTL: u64 = 0xe04;
    pub const PMRSTS: u64 = 0xe08;
    pub const PMREBS: u64 = 0xe0c;
    pub const PMRSWTP: u64 = 0xe10;
    pub const PMRMSCL: u64 = 0xe14;
    pub const PMRMSCU: u64 = 0xe18;
    /// First doorbell; doorbells are `4 << CAP.DSTRD` bytes apart.
    pub const DOORBELLS: u64 = 0x1000;

    /// A name for tracing.
    pub fn name(offset: u64) -> &'static str {
        match offset & !3 {
            CAP => "CAP",
            CAP_HI => "CAP.hi",
            VS => "VS",
            INTMS => "INTMS",
            INTMC => "INTMC",
            CC => "CC",
            CSTS => "CSTS",
            NSSR => "NSSR",
            AQA => "AQA",
            ASQ => "ASQ",
            ASQ_HI => "ASQ.hi",
            ACQ => "ACQ",
            ACQ_HI => "ACQ.hi",
            CMBLOC => "CMBLOC",
            CMBSZ => "CMBSZ",
            BPINFO => "BPINFO",
            BPRSEL => "BPRSEL",
            BPMBL | BPMBL_HI => "BPMBL",
            CMBMSC => "CMBMSC",
            CMBMSC_HI => "CMBMSC.hi",
            CMBSTS => "CMBSTS",
            PMRCAP => "PMRCAP",
            PMRCTL => "PMRCTL",
            PMRSTS => "PMRSTS",
            PMREBS => "PMREBS",
            PMRSWTP => "PMRSWTP",
            PMRMSCL => "PMRMSCL",
            PMRMSCU => "PMRMSCU",
            o if o >= DOORBELLS => "doorbell",
            _ => "reserved",
        }
    }
}

/// `bits` of `value` starting at bit `shift`.
const fn field(value: u64, shift: u32, bits: u32) -> u64 {
    (value >> shift) & ((1 << bits) - 1)
}

/// CAP: what the controller can do, fixed for its lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0's based.
    pub mqes: u16,
    /// Contiguous Queues Required.
    pub cqr: bool,
    /// Timeout: how long the host waits for CSTS.RDY, in 500 ms units.
    pub to: u8,
    /// Command Sets Supported (bit 0: the NVM command set).
    pub css: u8,
    /// Memory Page Size Minimum and Maximum: 2 ^ (12 + value) bytes.
    pub mpsmin: u8,
    pub mpsmax: u8,
    /// Persistent Memory Region Supported.
    pub pmrs: bool,
    /// Controller Memory Buffer Supported.
    pub cmbs: bool,
}

impl Cap {
    /// CSS bit: the NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;

    pub fn value(&self) -> u64 {
        u64::from(self.mqes)
            | (u64::from(self.cqr) << 16)
            | (u64::from(self.to) << 24)
            | (u64::from(self.css) << 37)
            | (u64::from(self.mpsmin & 0xf) << 48)
            | (u64::from(self.mpsmax & 0xf) << 52)
            | (u64::from(self.pmrs) << 56)
            | (u64::from(self.cmbs) << 57)
    }
}

/// CC: Controller Configuration, as the host wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable.
    pub const fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O Command Set Selected.
    pub const fn css(self) -> u32 {
        field(self.0 as u64, 4, 3) as u32
    }
    /// Memory Page Size: 2 ^ (12 + MPS) bytes.
    pub const fn mps(self) -> u32 {
        field(self.0 as u64, 7, 4) as u32
    }
    /// Arbitration Mechanism Selected.
    pub const fn ams(self) -> u32 {
        field(self.0 as u64, 11, 3) as u32
    }
    /// Shutdown Notification (0: none).
    pub const fn shn(self) -> u32 {
        field(self.0 as u64, 14, 2) as u32
    }
    /// I/O Submission Queue Entry Size, log2 bytes.
    pub const fn iosqes(self) -> u32 {
        field(self.0 as u64, 16, 4) as u32
    }
    /// I/O Completion Queue Entry Size, log2 bytes.
    pub const fn iocqes(self) -> u32 {
        field(self.0 as u64, 20, 4) as u32
    }
}

/// CSTS.SHST: Shutdown Status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shst {
    /// Normal operation (no shutdown requested).
    #[default]
    Normal = 0,
    /// Shutdown processing occurring.
    Occurring = 1,
    /// Shutdown processing complete.
    Complete = 2,
}

/// CSTS: Controller Status, as the controller reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready.
    pub const RDY: u32 = 1 << 0;
    /// Controller Fatal Status.
    pub const CFS: u32 = 1 << 1;
    const SHST_SHIFT: u32 = 2;

    /// Status with Shutdown Status `shst` and no flag set.
    pub fn with_shst(shst: Shst) -> Self {
        Csts((shst as u32) << Self::SHST_SHIFT)
    }

    /// Sets a flag ([`RDY`](Self::RDY), [`CFS`](Self::CFS)).
    pub fn set(&mut self, flag: u32) {
        self.0 |= flag;
    }

    pub const fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }

    pub const fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
}

/// AQA: Admin Queue Attributes, as the host wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// ASQS and ACQS; everything else is reserved and reads 0.
    pub const WRITABLE: u32 = 0x0fff_0fff;

    /// Admin Submission Queue Size, 0's based.
    pub const fn asqs(self) -> u32 {
        field(self.0 as u64, 0, 12) as u32
    }
    /// Admin Completion Queue Size, 0's based.
    pub const fn acqs(self) -> u32 {
        field(self.0 as u64, 16, 12) as u32
    }
}

/// CMBLOC: where the CMB is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmbLoc {
    /// Base Indicator Register: the BAR holding the CMB.
    pub bir: u8,
    /// CMB Data Pointer Mixed Locations Support.
    pub cdpmls: bool,
    /// CMB Data Pointer and Command Independent Locations Support.
    pub cdpcils: bool,
    /// Offset into the BAR, in CMBSZ.SZU units.
    pub ofst: u32,
}

impl CmbLoc {
    pub fn value(&self) -> u32 {
        u32::from(self.bir & 0x7)
            | (u32::from(self.cdpmls) << 5)
            | (u32::from(self.cdpcils) << 6)
            | (self.ofst << 12)
    }
}

/// CMBSZ: what the CMB can hold and how big it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmbSz {
    /// Submission Queue Support.
    pub sqs: bool,
    /// Completion Queue Support.
    pub cqs: bool,
    /// PRP SGL List Support.
    pub lists: bool,
    /// Read Data Support.
    pub rds: bool,
    /// Write Data Support.
    pub wds: bool,
    /// Size Units: 4 KiB << (4 * SZU).
    pub szu: u8,
    /// Size, in SZU units.
    pub sz: u32,
}

impl CmbSz {
    /// SZU for 1 MiB units.
    pub const SZU_1MIB: u8 = 2;
    /// The bytes one SZU_1MIB unit holds.
    pub const UNIT_1MIB: u64 = 1 << 20;

    pub fn value(&self) -> u32 {
        u32::from(self.sqs)
            | (u32::from(self.cqs) << 1)
            | (u32::from(self.lists) << 2)
            | (u32::from(self.rds) << 3)
            | (u32::from(self.wds) << 4)
            | (u32::from(self.szu & 0xf) << 8)
            | (self.sz << 12)
    }
}

/// CMBMSC: Controller Memory Buffer Memory Space Control, as the host
/// wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmbMsc(pub u64);

impl CmbMsc {
    /// Capabilities Registers Enabled: CMBLOC and CMBSZ read non-zero.
    pub const fn cre(self) -> bool {
        self.0 & 1 != 0
    }
    /// Controller Memory Space Enable: the controller decodes CBA.
    pub const fn cmse(self) -> bool {
        self.0 & 2 != 0
    }
    /// Controller Base Address (4 KiB aligned).
    pub const fn cba(self) -> u64 {
        self.0 & !0xfff
    }
}

/// CMBSTS: Controller Memory Buffer Status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmbSts(pub u32);

impl CmbSts {
    /// Controller Base Address Invalid.
    pub const CBAI: u32 = 1 << 0;
}

/// PMRCAP: what the Persistent Memory Region can do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmrCap {
    /// Read Data Support.
    pub rds: bool,
    /// Write Data Support.
    pub wds: bool,
    /// Base Indicator Register: the BAR holding the PMR.
    pub bir: u8,
    /// Persistent Memory Region Write Barrier Mechanisms.
    pub pmrwbm: u8,
    /// Persistent Memory Region Timeout (in PMRTU units; PMRTU 0 is 500 ms).
    pub pmrto: u8,
    /// Controller Memory Space Supported.
    pub cmss: bool,
}

impl PmrCap {
    /// PMRWBM bit 1: a read of PMRSTS completes only once earlier writes
    /// to the PMR are persistent.
    pub const PMRWBM_PMRSTS_READ: u8 = 0x2;

    pub fn value(&self) -> u32 {
        (u32::from(self.rds) << 3)
            | (u32::from(self.wds) << 4)
            | (u32::from(self.bir & 0x7) << 5)
            | (u32::from(self.pmrwbm & 0xf) << 10)
            | (u32::from(self.pmrto) << 16)
            | (u32::from(self.cmss) << 24)
    }
}

/// PMRCTL: Persistent Memory Region Control, as the host wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmrCtl(pub u32);

impl PmrCtl {
    /// Enable.
    pub const EN: u32 = 1 << 0;

    pub const fn en(self) -> bool {
        self.0 & Self::EN != 0
    }
}

/// PMRSTS: Persistent Memory Region Status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmrSts(pub u32);

impl PmrSts {
    /// Not Ready.
    pub const NRDY: u32 = 1 << 8;
    /// Controller Base Address Invalid.
    pub const CBAI: u32 = 1 << 12;
}

/// PMRMSC (PMRMSCL and PMRMSCU): Persistent Memory Region Memory Space
/// Control, as the host wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PmrMsc(pub u64);

impl PmrMsc {
    /// Controller Memory Space Enable.
    pub const CMSE: u64 = 1 << 1;

    pub const fn cmse(self) -> bool {
        self.0 & Self::CMSE != 0
    }
    /// Controller Base Address (4 KiB aligned).
    pub const fn cba(self) -> u64 {
        self.0 & !0xfff
    }
}

/// `value` (a 64-bit register) with its `half` dword replaced by `dword`.
pub fn with_dword(value: u64, half: Dword, dword: u32) -> u64 {
    match half {
        Dword::Low => (value & !0xffff_ffff) | u64::from(dword),
        Dword::High => (value & 0xffff_ffff) | (u64::from(dword) << 32),
    }
}

/// The low or high dword of a 64-bit register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dword {
    Low,
    High,
}

impl Dword {
    /// This half of `value`.
    pub fn of(self, value: u64) -> u32 {
        match self {
            Dword::Low => value as u32,
            Dword::High => (value >> 32) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a field placed at the wrong bit: every value below is
    /// spelled out from the specification's figures, independently of the
    /// encoders.
    #[test]
    fn reported_registers_put_each_field_where_the_spec_says() {
        let cap = Cap {
            mqes: 1023,
            cqr: true,
            to: 0x0f,
            css: Cap::CSS_NVM,
            mpsmin: 0,
            mpsmax: 4,
            pmrs: true,
            cmbs: true,
        };
        assert_eq!(
            cap.value(),
            1023 | (1 << 16) | (0x0f << 24) | (1 << 37) | (4 << 52) | (1 << 56) | (1 << 57)
        );
        let loc = CmbLoc {
            bir: 2,
            cdpmls: true,
            cdpcils: true,
            ofst: 0,
        };
        assert_eq!(loc.value(), 2 | (1 << 5) | (1 << 6));
        let sz = CmbSz {
            sqs: true,
            cqs: true,
            lists: true,
            rds: true,
            wds: true,
            szu: CmbSz::SZU_1MIB,
            sz: 64,
        };
        assert_eq!(sz.value(), 0x1f | (2 << 8) | (64 << 12));
        let pmrcap = PmrCap {
            rds: true,
            wds: true,
            bir: 4,
            pmrwbm: PmrCap::PMRWBM_PMRSTS_READ,
            pmrto: 4,
            cmss: true,
        };
        assert_eq!(
            pmrcap.value(),
            (1 << 3) | (1 << 4) | (4 << 5) | (0x2 << 10) | (4 << 16) | (1 << 24)
        );
        let mut csts = Csts::with_shst(Shst::Complete);
        csts.set(Csts::CFS);
        assert_eq!(csts.0, (2 << 2) | 2);
        assert!(csts.cfs() && !csts.rdy());
    }

    #[test]
    fn written_registers_read_back_by_field() {
        let cc =
            Cc(1 | (0x7 << 4) | (0x3 << 7) | (0x1 << 11) | (0x2 << 14) | (6 << 16) | (4 << 20));
        assert!(cc.en());
        assert_eq!(
            (
                cc.css(),
                cc.mps(),
                cc.ams(),
                cc.shn(),
                cc.iosqes(),
                cc.iocqes()
            ),
            (7, 3, 1, 2, 6, 4)
        );
        let aqa = Aqa(Aqa::WRITABLE);
        assert_eq!((aqa.asqs(), aqa.acqs()), (0xfff, 0xfff));
        let msc = CmbMsc(0x1_2345_6789 | 3);
        assert!(msc.cre() && msc.cmse());
        assert_eq!(msc.cba(), 0x1_2345_6000);
        assert!(PmrMsc(2).cmse() && !PmrMsc(1).cmse());
        assert_eq!(
            with_dword(0x1111_2222_3333_4444, Dword::High, 5),
            0x5_3333_4444
        );
        assert_eq!(
            with_dword(0x1111_2222_3333_4444, Dword::Low, 5),
            0x1111_2222_0000_0005
        );
        assert_eq!(Dword::High.of(0x1111_2222_3333_4444), 0x1111_2222);
        assert_eq!(reg::name(reg::ASQ_HI), "ASQ.hi");
        assert_eq!(reg::name(reg::CMBMSC_HI + 2), "CMBMSC.hi");
    }
}
