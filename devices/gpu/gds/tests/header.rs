//! The C header and the Rust ABI agree: every constant has the value the
//! library uses, every exported function is declared and every declared
//! function exported, and (when a C compiler is installed) the structs
//! have the sizes and layout the library writes.
//!
//! Would catch: a renumbered error code or reason bit, a function added on
//! one side only, a struct field reordered in the header.

use std::collections::BTreeSet;
use std::path::PathBuf;

use p2plab_gds::{ErrorCode, Path, Reason};

fn crate_file(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `#define P2PLAB_GDS_NAME value` with value a number or `(1u << n)`.
fn define(header: &str, name: &str) -> u64 {
    let full = format!("P2PLAB_GDS_{name}");
    let line = header
        .lines()
        .find(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("#define") && w.next() == Some(full.as_str())
        })
        .unwrap_or_else(|| panic!("{full} is not defined in the header"));
    let value: String = line
        .split_whitespace()
        .skip(2)
        .take_while(|w| !w.starts_with("/*"))
        .collect();
    if let Some(shift) = value
        .strip_prefix("(1u<<")
        .and_then(|v| v.strip_suffix(')'))
    {
        return 1 << shift.parse::<u32>().expect("shift");
    }
    value
        .parse()
        .unwrap_or_else(|_| panic!("{full} = {value:?}"))
}

#[test]
fn constants_match() {
    let header = crate_file("include/p2plab_gds.h");
    for code in ErrorCode::ALL {
        assert_eq!(define(&header, code.name()), code as u64, "{code:?}");
    }
    for reason in Reason::ALL {
        let name = format!("REASON_{}", reason.name().to_uppercase());
        assert_eq!(
            define(&header, &name),
            u64::from(reason.bit()),
            "{reason:?}"
        );
    }
    for path in [Path::None, Path::P2p, Path::Compat, Path::Mixed] {
        let name = format!("PATH_{}", path.name().to_uppercase());
        assert_eq!(define(&header, &name), path as u64, "{path:?}");
    }
    assert_eq!(
        define(&header, "BUF_P2PMEM"),
        u64::from(p2plab_gds::ffi::BUF_P2PMEM)
    );
    assert_eq!(
        define(&header, "BUF_DEVMAP"),
        u64::from(p2plab_gds::ffi::BUF_DEVMAP)
    );
}

/// Names followed by `(` that start with p2plab_gds_.
fn function_names(text: &str, rust: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if rust && !line.starts_with("pub ") {
            continue;
        }
        if rust && !line.contains("extern \"C\" fn ") {
            continue;
        }
        for (at, _) in line.match_indices("p2plab_gds_") {
            let name: String = line[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if line[at + name.len()..].starts_with('(') {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn every_exported_function_is_declared() {
    let header = crate_file("include/p2plab_gds.h");
    let ffi: String = ["mod", "io", "memory", "names"]
        .iter()
        .map(|m| crate_file(&format!("src/ffi/{m}.rs")))
        .collect();
    let declared = function_names(&header, false);
    let exported = function_names(&ffi, true);
    assert!(exported.len() >= 20, "{exported:?}");
    assert_eq!(declared, exported);
}

#[test]
fn struct_layout_in_c() {
    let Ok(cc) = which_cc() else {
        eprintln!("no C compiler: layout checked only by the guest build");
        return;
    };
    let dir = std::env::temp_dir().join(format!("p2plab-gds-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    std::fs::write(
        &src,
        "#include <stddef.h>\n#include \"p2plab_gds.h\"\n\
         _Static_assert(sizeof(struct p2plab_gds_io_report) == 304, \"report\");\n\
         _Static_assert(offsetof(struct p2plab_gds_io_report, p2p_errno) == 40, \"errno\");\n\
         _Static_assert(offsetof(struct p2plab_gds_io_report, detail) == 48, \"detail\");\n\
         _Static_assert(sizeof(struct p2plab_gds_buf_info) == 40, \"info\");\n\
         _Static_assert(offsetof(struct p2plab_gds_buf_info, vram_offset) == 24, \"voff\");\n\
         _Static_assert(sizeof(p2plab_gds_status_t) == 8, \"status\");\n",
    )
    .unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let compile = |lang: &str, file: &std::path::Path| {
        std::process::Command::new(&cc)
            .args(["-x", lang, "-fsyntax-only", "-Wall", "-Werror"])
            .arg("-I")
            .arg(&include)
            .arg(file)
            .status()
            .expect("running the C compiler")
            .success()
    };
    assert!(compile("c", &src), "the header does not compile as C");
    // C++ test code includes it too (extern "C"), when the compiler can.
    let empty = dir.join("empty.cc");
    std::fs::write(&empty, "int main() { return 0; }\n").unwrap();
    if compile("c++", &empty) {
        let cxx = dir.join("layout.cc");
        std::fs::write(
            &cxx,
            "#include \"p2plab_gds.h\"\n\
             static_assert(sizeof(struct p2plab_gds_io_report) == 304, \"report\");\n\
             static_assert(sizeof(p2plab_gds_status_t) == 8, \"status\");\n\
             int main() { return p2plab_gds_driver_open().err; }\n",
        )
        .unwrap();
        assert!(compile("c++", &cxx), "the header does not compile as C++");
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn which_cc() -> Result<String, ()> {
    for cc in ["cc", "gcc", "clang"] {
        if std::process::Command::new(cc)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(cc.to_owned());
        }
    }
    Err(())
}
