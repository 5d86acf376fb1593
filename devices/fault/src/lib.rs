//! Fault injection for p2plab devices, device-agnostic where it can be:
//!
//! - [`FaultSpec`]: one injection as text (`status=0x281,dnr,count=3,opcode=read,lba=0-1023`),
//!   parsed with errors that name the bad item and printed back in a
//!   canonical form that parses to the same spec.
//! - [`Injector`]: the armed specs of one device; [`Injector::decide`] says
//!   what to do to a command, [`BadBlocks`] keeps media-error ranges until
//!   they are rewritten.
//!
//! - [`GpuFaultSpec`] and [`GpuInjector`]: the same for the GPU's engine
//!   jobs (`job-error=0x06,count=1`, `hang`, `drop-irq`, `vram-error=A-B`).
//!
//! - [`NicFaultSpec`] and [`NicInjector`]: the NIC's wire, which drops,
//!   delays or corrupts frames on demand (`drop,count=1`, `delay=5ms`,
//!   `corrupt,prob=0.1`).
//!
//! - [`EfaFaultSpec`] and [`EfaInjector`]: the EFA's fabric packets
//!   (`drop`, `delay=`, `corrupt`, `reorder`), admin command and completion
//!   errors (`admin-error=5,opcode=9`, `cq-error=12`), `link-down` and
//!   `drop-irq`.
//!
//! The device model applies the [`Decision`]; this crate knows command
//! fields (queue, opcode, namespace, LBAs), not any device's registers.

mod efa;
mod gpu;
mod injector;
mod nic;
mod spec;

pub use efa::{EfaAction, EfaFaultSpec, EfaInjector, WireDecision};
pub use gpu::{GpuAction, GpuDecision, GpuFaultSpec, GpuInjector};
pub use injector::{Armed, ArmedReport, BadBlocks, BadRangeReport, Decision, Injector, PeerEffect};
pub use nic::{NicAction, NicDecision, NicFaultSpec, NicInjector};
pub use spec::{
    Action, CommandInfo, CommandSet, FaultSpec, Filter, LbaRange, Opcode, SpecError, MAX_LATENCY,
};
