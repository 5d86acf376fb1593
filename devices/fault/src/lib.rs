//! Fault injection for p2plab devices, knowing no device:
//!
//! - [`Spec`]: one injection as text (`ACTION,count=3,prob=0.1,after=2,FILTERS`),
//!   parsed with errors that name the bad item and printed back in a
//!   canonical form that parses to the same spec. The shared items
//!   (`count=`, `prob=`, `after=`) are read here; the action words, their
//!   flags and the filters are the device's, through [`Vocabulary`] and
//!   [`Filter`].
//! - [`Injector`]: the armed specs of one device, at most
//!   [`Vocabulary::MAX_ARMED`]: IDs, which fire on a command
//!   ([`Injector::fire`]), what each has fired, the `status` report;
//!   [`Shared`] adds the lock and the flag that makes an idle device's
//!   per-command check one atomic load.
//! - [`OpcodeNames`]: `opcode=` filters by the names in the device's own
//!   command table, so there is no second list of names.
//!
//! Each device crate owns its vocabulary and applies what fired:
//! `p2plab_nvme::fault`, `p2plab_gpu::fault`, `p2plab_nic::fault`.

mod grammar;
mod injector;
mod opcode;
mod spec;

pub use grammar::{
    format_duration, parse_duration, parse_number, parse_probability, parse_range, Item, SpecError,
    MAX_DURATION,
};
pub use injector::{ArmError, Armed, ArmedReport, Dice, Idle, Injector, Shared};
pub use opcode::{is_spec_name, opcode_text, parse_opcode, spec_name, OpcodeNames};
pub use spec::{round_trip, Filter, NoFilter, Spec, Vocabulary, DEFAULT_MAX_ARMED};

#[cfg(test)]
mod tests {
    /// Catches: a list of opcode names (or any name-to-number table)
    /// brought back into this crate, which knows no device: names come
    /// from each device's command table through [`crate::OpcodeNames`],
    /// and the device crates' own tests check that no row's name is
    /// spelled out here.
    #[test]
    fn this_crate_keeps_no_name_table() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            files += 1;
            // Spelled in pieces, so that this test does not find itself.
            let tables = [
                ["str, ", "u8)"],
                ["(u8, &'static ", "str)"],
                ["(u8, ", "&str)"],
            ];
            for table in tables.map(|pieces| pieces.concat()) {
                assert!(
                    !text.contains(&table),
                    "{} has a name table ({table}): take names from the device's command table",
                    path.display()
                );
            }
        }
        assert!(files >= 4, "read {files} files of {}", src.display());
    }
}
