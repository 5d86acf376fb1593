//! Scripts the host runs in the guest, kept in `.sh` files that shellcheck
//! lints (`scripts/test`) and built into the one `/run/p2plab/script.sh`
//! an exec run gets. A script is the text of a bash file
//! (`include_str!`), plus what it takes from the host:
//!
//! - **parameters**: environment variables, each declared near the top of
//!   the file as `: "${NAME:?what it is}"`. [`GuestScript::render`]
//!   refuses a declared parameter the host does not give, and one the
//!   host gives that no file declares, so a renamed placeholder fails
//!   before a boot, not halfway through one.
//! - **libraries**: files the script sources from `/run/p2plab/lib/`
//!   (`. /run/p2plab/lib/NAME`, with a `# shellcheck source=` directive
//!   beside it). The launcher writes them into the run folder's `guest/`,
//!   which the guest sees at `/run/p2plab`, before QEMU starts. A library
//!   given but never sourced, or sourced but not given, is refused.
//! - **calls**: lines appended after the file, each one of its functions
//!   with shell-quoted arguments: the plan the host computed (the kill
//!   campaign's rounds, the bench's jobs), while what each step does stays
//!   in the file. A call of a function no file defines is refused.

use std::collections::BTreeSet;

use anyhow::{bail, ensure, Result};

/// Where a script's libraries are, in the guest: `lib/` of the run
/// folder's `guest/`, which the guest mounts at `/run/p2plab`.
pub const LIB_DIR: &str = "/run/p2plab/lib";

/// Runs the parts of a shared boot ([`GuestScript::in_parts`]).
const PARTS_RUNNER: &str = include_str!("../guest/parts.sh");

/// A guest script: a `.sh` file's text and what the host gives it.
#[derive(Debug, Clone)]
pub struct GuestScript {
    /// The file's name, for error messages.
    name: String,
    text: String,
    /// Parameters, exported before the file's text runs.
    vars: Vec<(String, String)>,
    /// Library name (under [`LIB_DIR`]) and text.
    libs: Vec<(String, String)>,
    /// Rendered call lines, appended after the text.
    calls: Vec<String>,
    /// Other files for the run folder's `guest/` (the parts of a shared
    /// boot and their libraries), already checked.
    files: Vec<(String, String)>,
}

impl GuestScript {
    /// The script in `text`, the content of the file `name`.
    pub fn new(name: &str, text: &str) -> Self {
        Self {
            name: name.to_owned(),
            text: text.to_owned(),
            vars: Vec::new(),
            libs: Vec::new(),
            calls: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Gives the parameter `name` (declared in the file as
    /// `: "${NAME:?...}"`) the value `value`.
    pub fn var(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.vars.push((name.to_owned(), value.to_string()));
        self
    }

    /// Gives the library `name`, which the script sources from
    /// `/run/p2plab/lib/NAME`.
    pub fn lib(mut self, name: &str, text: &str) -> Self {
        self.libs.push((name.to_owned(), text.to_owned()));
        self
    }

    /// Appends a call of the script's function `words[0]` with the other
    /// words as its arguments, each quoted for the shell.
    pub fn call<S: AsRef<str>>(mut self, words: impl IntoIterator<Item = S>) -> Self {
        let words: Vec<String> = words.into_iter().map(|w| quote(w.as_ref())).collect();
        self.calls.push(words.join(" "));
        self
    }

    /// One script that runs `parts` in turn in one boot, each in its own
    /// bash (its `exit`, `set -u` and functions stay its own), with its
    /// output lines prefixed by its prefix (capital letters, digits and
    /// `_`), so two parts that report the same key never mask each other.
    /// It stops with the failing part's status when one fails.
    pub fn in_parts(parts: &[(&str, &GuestScript)]) -> Result<GuestScript> {
        let mut shared = GuestScript::new("parts.sh", PARTS_RUNNER);
        let mut libs: Vec<(String, String)> = Vec::new();
        for (n, (prefix, part)) in parts.iter().enumerate() {
            ensure!(
                prefix
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'),
                "part {n} ({}): prefix {prefix:?} is not capital letters, digits and _",
                part.name
            );
            shared.files.push((format!("parts/{n}.sh"), part.render()?));
            for (name, text) in &part.libs {
                match libs.iter().find(|(have, _)| have == name) {
                    Some((_, same)) if same == text => {}
                    Some(_) => bail!("two parts give different libraries named {name}"),
                    None => libs.push((name.clone(), text.clone())),
                }
            }
            shared = shared.call(["run_part", &n.to_string(), prefix]);
        }
        shared.files.extend(
            libs.into_iter()
                .map(|(name, text)| (format!("lib/{name}"), text)),
        );
        Ok(shared)
    }

    /// The script as the guest runs it: the file's shebang line, the
    /// parameters, the rest of the file, then the calls. Fails when the
    /// parameters, libraries or calls do not match what the files
    /// declare, source and define.
    pub fn render(&self) -> Result<String> {
        self.check()?;
        let (shebang, body) = match self.text.strip_prefix("#!") {
            Some(_) => self.text.split_once('\n').unwrap_or((&self.text, "")),
            None => ("", self.text.as_str()),
        };
        let mut out = String::new();
        if !shebang.is_empty() {
            out.push_str(shebang);
            out.push('\n');
        }
        if !self.vars.is_empty() {
            out.push_str("# Parameters from the host.\n");
            for (name, value) in &self.vars {
                out.push_str(&format!("export {name}={}\n", quote(value)));
            }
        }
        out.push_str(body);
        if !out.ends_with('\n') {
            out.push('\n');
        }
        for call in &self.calls {
            out.push_str(call);
            out.push('\n');
        }
        Ok(out)
    }

    /// The files the script needs beside it, as (path under the run
    /// folder's `guest/`, text): its libraries under `lib/`, and the parts
    /// of a shared boot.
    pub fn files(&self) -> Vec<(String, String)> {
        self.libs
            .iter()
            .map(|(name, text)| (format!("lib/{name}"), text.clone()))
            .chain(self.files.iter().cloned())
            .collect()
    }

    fn check(&self) -> Result<()> {
        let name = &self.name;
        let texts: Vec<&str> = std::iter::once(self.text.as_str())
            .chain(self.libs.iter().map(|(_, text)| text.as_str()))
            .collect();

        let mut given = BTreeSet::new();
        for (var, _) in &self.vars {
            ensure!(
                is_parameter_name(var),
                "{name}: parameter {var:?} is not a capitalised shell name"
            );
            ensure!(given.insert(var.as_str()), "{name}: {var} given twice");
        }
        let declared: BTreeSet<&str> = texts.iter().flat_map(|t| declared_parameters(t)).collect();
        if let Some(missing) = declared.difference(&given).next() {
            bail!("{name} needs the parameter {missing} (it declares ${{{missing}:?}})");
        }
        if let Some(extra) = given.difference(&declared).next() {
            bail!("{name} does not declare the parameter {extra} (`: \"${{{extra}:?...}}\"`)");
        }

        let mut libs = BTreeSet::new();
        for (lib, _) in &self.libs {
            ensure!(
                is_file_name(lib),
                "{name}: library name {lib:?} is not a plain .sh file name"
            );
            ensure!(
                libs.insert(lib.as_str()),
                "{name}: library {lib} given twice"
            );
        }
        let sourced: BTreeSet<&str> = texts.iter().flat_map(|t| sourced_libraries(t)).collect();
        if let Some(missing) = sourced.difference(&libs).next() {
            bail!("{name} sources {LIB_DIR}/{missing}, which it was not given");
        }
        if let Some(extra) = libs.difference(&sourced).next() {
            bail!("{name} was given the library {extra} but never sources {LIB_DIR}/{extra}");
        }

        for call in &self.calls {
            let function = call.split(' ').next().unwrap_or_default();
            ensure!(
                texts.iter().any(|t| defines_function(t, function)),
                "{name} defines no function {function:?} to call"
            );
        }
        Ok(())
    }
}

/// A word quoted for a POSIX shell: as it is when that is safe, else in
/// single quotes.
pub fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@+".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn is_parameter_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn is_file_name(name: &str) -> bool {
    name.strip_suffix(".sh").is_some_and(|stem| {
        !stem.is_empty()
            && stem
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    })
}

/// The parameters a script declares: every `${NAME:?` with a capitalised
/// NAME.
fn declared_parameters(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices("${").filter_map(|(at, _)| {
        let rest = &text[at + 2..];
        let end = rest.find(":?")?;
        let name = &rest[..end];
        is_parameter_name(name).then_some(name)
    })
}

/// The libraries a script sources: every `/run/p2plab/lib/NAME`, NAME up
/// to the first character that cannot be in a file name.
fn sourced_libraries(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices(LIB_DIR).filter_map(|(at, _)| {
        let rest = text[at + LIB_DIR.len()..].strip_prefix('/')?;
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
            .unwrap_or(rest.len());
        Some(&rest[..end])
    })
}

/// Whether `text` defines the shell function `name` (`name() {` at the
/// start of a line, indentation allowed).
fn defines_function(text: &str, name: &str) -> bool {
    !name.is_empty()
        && text.lines().any(|line| {
            line.trim_start()
                .strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with("()"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "#!/bin/bash\n# a test\n: \"${SIZE:?bytes}\" \"${SEED:?}\"\n\
        # shellcheck source=SCRIPTDIR/lib/common.sh\n. /run/p2plab/lib/common.sh\n\
        step() { echo \"$1\"; }\n";
    const LIB: &str = "#!/bin/bash\nsay() { echo \"$1=$2\"; }\n";

    fn script() -> GuestScript {
        GuestScript::new("test.sh", SCRIPT)
            .var("SIZE", 4096)
            .var("SEED", "it's 7")
            .lib("common.sh", LIB)
    }

    /// Catches: parameters spliced anywhere but right after the shebang
    /// (bash would not take the file as its dialect, or `set -u` lines
    /// would run before them), values not quoted for the shell, calls
    /// lost or unquoted, libraries not handed to the launcher.
    #[test]
    fn parameters_follow_the_shebang_and_calls_the_text() {
        let text = script()
            .call(["step", "a b", "c"])
            .call(["step", ""])
            .render()
            .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "#!/bin/bash");
        assert_eq!(lines[2], "export SIZE=4096");
        assert_eq!(lines[3], "export SEED='it'\\''s 7'");
        assert_eq!(lines[4], "# a test");
        assert_eq!(lines[lines.len() - 2], "step 'a b' c");
        assert_eq!(lines[lines.len() - 1], "step ''");
        assert_eq!(
            script().files(),
            vec![("lib/common.sh".to_owned(), LIB.to_owned())]
        );
    }

    /// Catches: a parameter the file declares but the host forgot (the
    /// guest would stop at `${NAME:?}` minutes into a boot), one the host
    /// gives under a name no file declares (a renamed placeholder), bad
    /// names and duplicates.
    #[test]
    fn parameters_must_match_the_declarations() {
        let missing = GuestScript::new("test.sh", SCRIPT)
            .var("SIZE", 1)
            .lib("common.sh", LIB);
        let err = missing.render().unwrap_err().to_string();
        assert!(err.contains("needs the parameter SEED"), "{err}");
        let extra = script().var("COUNT", 3);
        let err = extra.render().unwrap_err().to_string();
        assert!(
            err.contains("does not declare the parameter COUNT"),
            "{err}"
        );
        let twice = script().var("SIZE", 2);
        assert!(twice.render().unwrap_err().to_string().contains("twice"));
        let lower = GuestScript::new("x.sh", ": \"${size:?}\"\n").var("size", 1);
        assert!(lower.render().is_err());
        // A library's declarations count too.
        let in_lib = GuestScript::new("x.sh", ". /run/p2plab/lib/p.sh\n")
            .lib("p.sh", ": \"${PEER:?nvme or nic0}\"\n");
        assert!(in_lib.render().is_err());
        assert!(in_lib.var("PEER", "nvme").render().is_ok());
    }

    /// Catches: a library the script sources but the host does not write
    /// (the guest would fail on a missing file), one written but never
    /// sourced, and names that would leave `lib/`.
    #[test]
    fn libraries_must_be_sourced_and_given() {
        let without = GuestScript::new("test.sh", SCRIPT)
            .var("SIZE", 1)
            .var("SEED", 2);
        let err = without.render().unwrap_err().to_string();
        assert!(err.contains("sources /run/p2plab/lib/common.sh"), "{err}");
        let unused = script().lib("other.sh", LIB);
        let err = unused.render().unwrap_err().to_string();
        assert!(err.contains("never sources"), "{err}");
        let escape = GuestScript::new("x.sh", ". /run/p2plab/lib/../x.sh\n").lib("../x.sh", "");
        assert!(escape.render().is_err());
    }

    /// Catches: a call of a function that no file defines (a renamed
    /// step), which bash would report only in the guest.
    #[test]
    fn calls_must_name_a_defined_function() {
        assert!(script().call(["step", "1"]).render().is_ok());
        assert!(script().call(["say", "A", "1"]).render().is_ok());
        let err = script().call(["stpe", "1"]).render().unwrap_err();
        assert!(err.to_string().contains("no function \"stpe\""), "{err}");
    }

    /// Catches: a shared boot whose parts are not written, not run in
    /// order with their prefixes, or whose libraries are dropped or
    /// silently replaced by another part's library of the same name.
    #[test]
    fn parts_run_in_order_with_their_prefixes_and_libraries() {
        let first = script();
        let second = GuestScript::new("second.sh", "#!/bin/bash\necho DONE=1\nexit 0\n");
        let shared = GuestScript::in_parts(&[("", &first), ("PM_", &second)]).unwrap();
        let text = shared.render().unwrap();
        assert!(text.ends_with("run_part 0 ''\nrun_part 1 PM_\n"), "{text}");
        let files = shared.files();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["parts/0.sh", "parts/1.sh", "lib/common.sh"]);
        assert_eq!(files[0].1, first.render().unwrap());
        assert!(GuestScript::in_parts(&[("pm", &second)]).is_err());
        let clash = GuestScript::new("other.sh", ". /run/p2plab/lib/common.sh\n")
            .lib("common.sh", "#!/bin/bash\n");
        assert!(GuestScript::in_parts(&[("", &first), ("B_", &clash)]).is_err());
    }
}
