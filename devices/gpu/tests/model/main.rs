//! The device model driven the way a guest driver drives it: register
//! writes, ring entries in "guest memory", fences and interrupts. No socket,
//! no QEMU. `rig` is the fake guest; each other module is one area.

mod rig;

mod caller_engine;
mod command_errors;
mod commands;
mod faults;
mod fences;
mod registers;
mod reset;
mod ring_errors;
mod robustness;
mod trace;
