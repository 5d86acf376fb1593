//! Controller registers (NVMe base 2.0, 3.1.4): where each sits in BAR0
//! ([`Reg`], declared with p2plab-kit's `registers!`, offsets in [`reg`])
//! and typed views of their fields, named as in the specification
//! (`Cc::iosqes`, `Csts::CFS`, `CmbSz::szu`...). Status bits are
//! p2plab-kit `bit_flags!`; a 64-bit register's dwords are the kit's
//! [`Half`].
//!
//! Values the host writes are kept raw and read through accessors
//! ([`Cc`], [`Aqa`], [`CmbMsc`], [`PmrCtl`], [`PmrMsc`]); values the
//! controller reports are built from named fields ([`Cap`], [`CmbLoc`],
//! [`CmbSz`], [`PmrCap`]) or flags ([`Csts`], [`CmbSts`], [`PmrSts`]).

use std::borrow::Cow;

pub use p2plab_kit::regs::Half;

p2plab_kit::registers! {
    /// A controller register in BAR0, named as in the specification.
    /// A 64-bit register is two dwords, low at its offset.
    pub enum Reg, offsets in reg {
        /// Controller Capabilities.
        Cap(CAP) = 0x00, Bits64, ReadOnly;
        /// Version.
        Vs(VS) = 0x08, Bits32, ReadOnly;
        /// Interrupt Mask Set.
        Intms(INTMS) = 0x0c, Bits32, ReadWrite;
        /// Interrupt Mask Clear.
        Intmc(INTMC) = 0x10, Bits32, ReadWrite;
        /// Controller Configuration.
        Cc(CC) = 0x14, Bits32, ReadWrite;
        /// Controller Status.
        Csts(CSTS) = 0x1c, Bits32, ReadOnly;
        /// NVM Subsystem Reset.
        Nssr(NSSR) = 0x20, Bits32, ReadWrite;
        /// Admin Queue Attributes.
        Aqa(AQA) = 0x24, Bits32, ReadWrite;
        /// Admin Submission Queue Base Address.
        Asq(ASQ) = 0x28, Bits64, ReadWrite;
        /// Admin Completion Queue Base Address.
        Acq(ACQ) = 0x30, Bits64, ReadWrite;
        /// Controller Memory Buffer Location.
        Cmbloc(CMBLOC) = 0x38, Bits32, ReadOnly;
        /// Controller Memory Buffer Size.
        Cmbsz(CMBSZ) = 0x3c, Bits32, ReadOnly;
        /// Boot Partition Information.
        Bpinfo(BPINFO) = 0x40, Bits32, ReadOnly;
        /// Boot Partition Read Select.
        Bprsel(BPRSEL) = 0x44, Bits32, ReadWrite;
        /// Boot Partition Memory Buffer Location.
        Bpmbl(BPMBL) = 0x48, Bits64, ReadWrite;
        /// Controller Memory Buffer Memory Space Control.
        Cmbmsc(CMBMSC) = 0x50, Bits64, ReadWrite;
        /// Controller Memory Buffer Status.
        Cmbsts(CMBSTS) = 0x58, Bits32, ReadOnly;
        /// Persistent Memory Region Capabilities.
        Pmrcap(PMRCAP) = 0xe00, Bits32, ReadOnly;
        /// Persistent Memory Region Control.
        Pmrctl(PMRCTL) = 0xe04, Bits32, ReadWrite;
        /// Persistent Memory Region Status.
        Pmrsts(PMRSTS) = 0xe08, Bits32, ReadOnly;
        /// Persistent Memory Region Elasticity Buffer Size.
        Pmrebs(PMREBS) = 0xe0c, Bits32, ReadOnly;
        /// Persistent Memory Region Sustained Write Throughput.
        Pmrswtp(PMRSWTP) = 0xe10, Bits32, ReadOnly;
        /// Persistent Memory Region Memory Space Control, lower dword.
        Pmrmscl(PMRMSCL) = 0xe14, Bits32, ReadWrite;
        /// Persistent Memory Region Memory Space Control, upper dword.
        Pmrmscu(PMRMSCU) = 0xe18, Bits32, ReadWrite;
    }
}

/// First doorbell; doorbells are `4 << CAP.DSTRD` bytes apart.
pub const DOORBELLS: u64 = 0x1000;

/// A register's name for traces and logs: its name, `NAME.hi` for the
/// upper dword of a 64-bit one, `doorbell` or `reserved`.
pub fn register_name(offset: u64) -> Cow<'static, str> {
    if offset >= DOORBELLS {
        return Cow::Borrowed("doorbell");
    }
    match Reg::at(offset & !3) {
        Some((reg, Half::Low)) => Cow::Borrowed(reg.name()),
        Some((reg, Half::High)) => Cow::Owned(format!("{}.hi", reg.name())),
        None => Cow::Borrowed("reserved"),
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

p2plab_kit::bit_flags! {
    /// CSTS: Controller Status, as the controller reports it (its flags;
    /// SHST is a field, see [`Csts::with_shst`]).
    pub struct Csts(u32), prefix "CSTS_" {
        /// Ready.
        RDY = 1 << 0;
        /// Controller Fatal Status.
        CFS = 1 << 1;
    }
}

impl Csts {
    const SHST_SHIFT: u32 = 2;

    /// Status with Shutdown Status `shst` and no flag set.
    pub fn with_shst(shst: Shst) -> Self {
        Csts::from_raw((shst as u32) << Self::SHST_SHIFT)
    }

    /// Sets a flag ([`RDY`](Self::RDY), [`CFS`](Self::CFS)).
    pub fn set(&mut self, flag: Csts) {
        *self |= flag;
    }

    pub const fn rdy(self) -> bool {
        self.contains(Self::RDY)
    }

    pub const fn cfs(self) -> bool {
        self.contains(Self::CFS)
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

p2plab_kit::bit_flags! {
    /// CMBSTS: Controller Memory Buffer Status.
    pub struct CmbSts(u32), prefix "CMBSTS_" {
        /// Controller Base Address Invalid.
        CBAI = 1 << 0;
    }
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

p2plab_kit::bit_flags! {
    /// PMRCTL: Persistent Memory Region Control, as the host wrote it.
    pub struct PmrCtl(u32), prefix "PMRCTL_" {
        /// Enable.
        EN = 1 << 0;
    }
}

impl PmrCtl {
    pub const fn en(self) -> bool {
        self.contains(Self::EN)
    }
}

p2plab_kit::bit_flags! {
    /// PMRSTS: Persistent Memory Region Status.
    pub struct PmrSts(u32), prefix "PMRSTS_" {
        /// Not Ready.
        NRDY = 1 << 8;
        /// Controller Base Address Invalid.
        CBAI = 1 << 12;
    }
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
        assert_eq!(csts.raw(), (2 << 2) | 2);
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
        assert_eq!(register_name(reg::ASQ + 4), "ASQ.hi");
        assert_eq!(register_name(reg::CMBMSC + 6), "CMBMSC.hi");
        assert_eq!(register_name(reg::CC + 1), "CC");
        assert_eq!(register_name(0x18), "reserved");
        assert_eq!(register_name(DOORBELLS + 8), "doorbell");
        assert_eq!(Reg::at(reg::PMRMSCU), Some((Reg::Pmrmscu, Half::Low)));
    }
}
