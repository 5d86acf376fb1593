//! Controller-level tests: a small host driver ([`harness`]) drives the
//! controller through its registers and queues in fake guest memory.

mod admin_cmds;
mod caller_queues;
mod command_tables;
mod doorbells;
mod faults;
mod harness;
mod io_cmds;
mod pmr;
mod registers;
mod robustness;
mod trace;
