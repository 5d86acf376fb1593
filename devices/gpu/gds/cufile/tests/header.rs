//! `include/cufile.h` and the library agree, checked by a C compiler:
//! every CUfileOpError value is the number the library returns, the
//! structs have the sizes and field offsets the library reads and writes,
//! the constants match, and every function the headers declare is
//! exported (and the reverse).
//!
//! Catches: a renumbered or missing cuFile error, a `CUfileDescr_t` whose
//! fd or `CUfileDrvProps_t` whose fields sit elsewhere than where the
//! library looks, a handle-type or flag value that differs, a function on
//! one side only, a header that does not compile as C or C++.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use cufile::api::*;
use cufile::OpError;

fn crate_file(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn which_cc() -> Option<String> {
    ["cc", "gcc", "clang"]
        .into_iter()
        .find(|cc| {
            std::process::Command::new(cc)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(str::to_owned)
}

/// The C checks: `_Static_assert`s of every value and layout.
fn checks() -> String {
    let mut c = String::new();
    for (e, name, _) in OpError::ALL {
        writeln!(
            c,
            "_Static_assert(CU_FILE_{name} == {}, \"{name}\");",
            e as i32
        )
        .unwrap();
    }
    let size = std::mem::size_of::<CUfileDrvProps>();
    let offsets = [
        ("CUfileError_t", "err", 0, 8),
        ("CUfileError_t", "cu_err", 4, 8),
        ("CUfileDescr_t", "type", 0, 24),
        ("CUfileDescr_t", "handle.fd", 8, 24),
        ("CUfileDescr_t", "handle.handle", 8, 24),
        ("CUfileDescr_t", "fs_ops", 16, 24),
        ("CUfileDrvProps_t", "nvfs.major_version", 0, size),
        ("CUfileDrvProps_t", "nvfs.minor_version", 4, size),
        ("CUfileDrvProps_t", "nvfs.poll_thresh_size", 8, size),
        ("CUfileDrvProps_t", "nvfs.max_direct_io_size", 16, size),
        ("CUfileDrvProps_t", "nvfs.dstatusflags", 24, size),
        ("CUfileDrvProps_t", "nvfs.dcontrolflags", 28, size),
        ("CUfileDrvProps_t", "fflags", 32, size),
        ("CUfileDrvProps_t", "max_device_cache_size", 36, size),
        ("CUfileDrvProps_t", "per_buffer_cache_size", 40, size),
        ("CUfileDrvProps_t", "max_device_pinned_mem_size", 44, size),
        ("CUfileDrvProps_t", "max_batch_io_size", 48, size),
        ("CUfileDrvProps_t", "max_batch_io_timeout_msecs", 52, size),
    ];
    for (ty, field, off, size) in offsets {
        writeln!(
            c,
            "_Static_assert(offsetof({ty}, {field}) == {off}, \"{ty}.{field}\");\n\
             _Static_assert(sizeof({ty}) == {size}, \"{ty}\");"
        )
        .unwrap();
    }
    // The Rust side's own offsets, so a reordered Rust struct fails too.
    assert_eq!(std::mem::offset_of!(CUfileDescr, handle), 8);
    assert_eq!(std::mem::offset_of!(CUfileDescr, fs_ops), 16);
    assert_eq!(std::mem::offset_of!(CUfileDrvProps, fflags), 32);
    assert_eq!(
        std::mem::offset_of!(CUfileDrvProps, max_batch_io_timeout_msecs),
        52
    );
    for (name, value) in [
        ("CU_FILE_HANDLE_TYPE_OPAQUE_FD", HANDLE_TYPE_OPAQUE_FD),
        ("CU_FILE_HANDLE_TYPE_OPAQUE_WIN32", HANDLE_TYPE_OPAQUE_WIN32),
        ("CU_FILE_HANDLE_TYPE_USERSPACE_FS", HANDLE_TYPE_USERSPACE_FS),
        (
            "(CU_FILE_RDMA_REGISTER | CU_FILE_RDMA_RELAXED_ORDERING)",
            BUF_REGISTER_FLAGS,
        ),
        ("CU_FILE_NVME_SUPPORTED", NVME_SUPPORTED as i32),
        ("CU_FILE_USE_POLL_MODE", USE_POLL_MODE as i32),
        ("CU_FILE_ALLOW_COMPAT_MODE", ALLOW_COMPAT_MODE as i32),
        ("CUFILEOP_BASE_ERR", 5000),
        ("CUDA_SUCCESS", 0),
        ("CUDA_ERROR_UNKNOWN", cufile::error::CUDA_ERROR_UNKNOWN),
    ] {
        writeln!(c, "_Static_assert({name} == {value}, \"{name}\");").unwrap();
    }
    c
}

#[test]
fn header_compiles_with_cufiles_values_and_layout() {
    let Some(cc) = which_cc() else {
        eprintln!("no C compiler: the header is checked by the guest build only");
        return;
    };
    let dir = std::env::temp_dir().join(format!("p2plab-cufile-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let gds_include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include");
    let body = format!(
        "#include <stddef.h>\n#include \"cufile_p2plab.h\"\n{}\n\
         /* The macros as programs use them. */\n\
         static int use_macros(CUfileError_t st, ssize_t ret) {{\n\
           return IS_CUDA_ERR(st) + IS_CUFILE_ERR(ret) + CU_FILE_CUDA_ERR(st) +\n\
                  (CUFILE_ERRSTR(ret) != NULL) + cuFileDriverClose().err;\n\
         }}\n\
         int main(void) {{ CUfileError_t st = {{CU_FILE_SUCCESS, CUDA_SUCCESS}};\n\
           return use_macros(st, -CU_FILE_INVALID_VALUE); }}\n",
        checks()
    );
    let compile = |lang: &str, file: &std::path::Path| {
        let std = if lang == "c" {
            "-std=c11"
        } else {
            "-std=c++17"
        };
        let out = std::process::Command::new(&cc)
            .args([
                "-x",
                lang,
                std,
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
            ])
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(&gds_include)
            .arg(file)
            .output()
            .expect("running the C compiler");
        assert!(
            out.status.success(),
            "{lang}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let src = dir.join("abi.c");
    std::fs::write(&src, &body).unwrap();
    compile("c", &src);
    // C++ too, when the compiler has a C++ front end (static_assert is a
    // keyword there; _Static_assert is not).
    let probe = dir.join("probe.cc");
    std::fs::write(&probe, "int main() { return 0; }\n").unwrap();
    let has_cxx = std::process::Command::new(&cc)
        .args(["-x", "c++", "-fsyntax-only"])
        .arg(&probe)
        .status()
        .is_ok_and(|s| s.success());
    if has_cxx {
        let cxx = dir.join("abi.cc");
        std::fs::write(&cxx, body.replace("_Static_assert", "static_assert")).unwrap();
        compile("c++", &cxx);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Function names declared by the headers, or exported by the library.
fn names(text: &str, rust: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim();
        if rust && !(line.starts_with("pub ") && line.contains("extern \"C\" fn ")) {
            continue;
        }
        if line.starts_with("#define") || line.starts_with("*") || line.starts_with("/*") {
            continue;
        }
        for prefix in ["cuFile", "cufileop_", "p2plab_cufile_"] {
            for (at, _) in line.match_indices(prefix) {
                let name: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if line[at + name.len()..].starts_with('(') {
                    out.insert(name);
                }
            }
        }
    }
    out
}

#[test]
fn every_declared_function_is_exported_and_back() {
    let headers = crate_file("include/cufile.h") + &crate_file("include/cufile_p2plab.h");
    let mut declared = names(&headers, false);
    // `#define cuFileDriverClose cuFileDriverClose_v2`: programs built
    // before the macro call the plain name, which is exported as well.
    assert!(headers.contains("#define cuFileDriverClose cuFileDriverClose_v2"));
    declared.insert("cuFileDriverClose".into());
    let exported = names(&crate_file("src/api.rs"), true);
    assert!(declared.len() >= 18, "{declared:?}");
    assert_eq!(declared, exported);
}
