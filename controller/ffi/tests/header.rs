//! `include/rtdeploy.h` is written by hand; this test holds it to the
//! library's source (`src/lib.rs`):
//! - every `extern "C"` function is declared, with the C types of its
//!   Rust parameters and result, and the header declares no other;
//! - every `pub const RTD_*` and every `rtd_status` value is the header's;
//! - every `#[repr(C)]` struct has the header's size and field offsets
//!   (checked by the C compiler, from the offsets Rust computes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rtdeploy::{RtdReportEntry, RtdType};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap()
}

/// `RtdReportEntry` -> `rtd_report_entry`.
fn c_name(rust: &str) -> String {
    let mut out = String::new();
    for (i, ch) in rust.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    out
}

/// The C type of a Rust parameter or result type of the interface.
fn c_type(rust: &str) -> String {
    let t = rust.trim();
    if let Some(inner) = t.strip_prefix("*mut ") {
        return pointer(c_type(inner));
    }
    if let Some(inner) = t.strip_prefix("*const ") {
        let inner = c_type(inner);
        return pointer(if inner.ends_with('*') {
            inner
        } else {
            format!("const {inner}")
        });
    }
    if let Some(f) = t.strip_prefix("Option<").and_then(|r| r.strip_suffix('>')) {
        return c_type(f);
    }
    match t {
        "u64" => "uint64_t".into(),
        "u32" => "uint32_t".into(),
        "usize" => "size_t".into(),
        "c_int" => "int".into(),
        "c_char" => "char".into(),
        "c_void" => "void".into(),
        "" => "void".into(),
        other => {
            assert!(
                other.starts_with("Rtd"),
                "no C type known for `{other}`: extend the test's mapping"
            );
            c_name(other)
        }
    }
}

fn pointer(inner: String) -> String {
    if inner.ends_with('*') {
        format!("{inner}*")
    } else {
        format!("{inner} *")
    }
}

/// Collapses runs of spaces, and the space between two `*`.
fn norm(s: &str) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    s.replace("* *", "**")
}

/// The functions of the Rust source: name -> (result, parameter types).
fn rust_functions(src: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(i) = rest.find("extern \"C\" fn rtd_") {
        let after = &rest[i + "extern \"C\" fn ".len()..];
        let open = after.find('(').unwrap();
        let name = after[..open].to_string();
        // Parameters up to the matching ')'.
        let mut depth = 0;
        let mut close = 0;
        for (j, ch) in after[open..].char_indices() {
            match ch {
                '(' | '<' => depth += 1,
                ')' | '>' if !(ch == '>' && after[open..][..j].ends_with('-')) => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        let params: Vec<String> = after[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| norm(&c_type(p.split_once(':').unwrap().1)))
            .collect();
        let tail = &after[close + 1..];
        let brace = tail.find('{').unwrap();
        let ret = tail[..brace].trim().strip_prefix("->").unwrap_or("").trim();
        out.insert(name, (norm(&c_type(ret)), params));
        rest = &after[close..];
    }
    out
}

/// The header's prototypes: name -> (result, parameter types).
fn header_functions(h: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for line in h.lines() {
        let line = line.trim();
        if line.starts_with("typedef") || line.starts_with('#') || !line.ends_with(");") {
            continue;
        }
        let Some(open) = line.find("(") else { continue };
        let head = &line[..open];
        let Some(at) = head.rfind("rtd_") else {
            continue;
        };
        let name = head[at..].trim().to_string();
        let ret = norm(&head[..at]);
        let inner = &line[open + 1..line.len() - 2];
        let params: Vec<String> = if inner.trim() == "void" {
            vec![]
        } else {
            inner
                .split(',')
                .map(|p| {
                    // Drop the parameter's name: the last identifier.
                    let p = p.trim();
                    let cut = p
                        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .map_or(0, |k| k + 1);
                    norm(&p[..cut])
                })
                .collect()
        };
        out.insert(name, (ret, params));
    }
    out
}

#[test]
fn every_function_is_declared_with_its_c_types() {
    let rust = rust_functions(&read("src/lib.rs"));
    let header = header_functions(&read("include/rtdeploy.h"));
    assert!(
        rust.len() >= 30,
        "{} functions found in src/lib.rs",
        rust.len()
    );
    let only_rust: Vec<_> = rust.keys().filter(|k| !header.contains_key(*k)).collect();
    let only_header: Vec<_> = header.keys().filter(|k| !rust.contains_key(*k)).collect();
    assert!(
        only_rust.is_empty() && only_header.is_empty(),
        "not declared in the header: {only_rust:?}; declared but not in the library: {only_header:?}"
    );
    let mut wrong = Vec::new();
    for (name, r) in &rust {
        let h = &header[name];
        if r != h {
            wrong.push(format!("{name}: library {r:?}, header {h:?}"));
        }
    }
    assert!(wrong.is_empty(), "prototypes differ:\n{}", wrong.join("\n"));
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Compiles `source` against the header (syntax and static assertions only).
fn compile_c(source: &str, dir: &Path) {
    let file = dir.join("check.c");
    std::fs::write(&file, source).unwrap();
    let out = Command::new(cc())
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root().join("include"))
        .arg(&file)
        .output()
        .expect("a C compiler (cc, or $CC)");
    assert!(
        out.status.success(),
        "{}\n{source}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn constants_statuses_and_structs_are_the_librarys() {
    let src = read("src/lib.rs");
    let mut asserts = String::new();
    // pub const RTD_*: u32 = N;
    for line in src.lines() {
        if let Some(rest) = line.trim().strip_prefix("pub const RTD_") {
            let (name, value) = rest.split_once(": u32 = ").unwrap();
            let value = value.trim_end_matches(';');
            asserts.push_str(&format!(
                "_Static_assert(RTD_{name} == {value}, \"RTD_{name}\");\n"
            ));
        }
    }
    // enum RtdStatus { Ok = 0, Argument = 1, ... }
    let body = src.split("pub enum RtdStatus {").nth(1).unwrap();
    let body = &body[..body.find('}').unwrap()];
    let mut statuses = 0;
    for line in body.lines() {
        let line = line.trim();
        if line.starts_with("///") || line.is_empty() {
            continue;
        }
        let (variant, value) = line.trim_end_matches(',').split_once(" = ").unwrap();
        let c = if variant == "Ok" {
            "RTD_OK".to_string()
        } else {
            format!("RTD_ERR_{}", variant.to_ascii_uppercase())
        };
        asserts.push_str(&format!("_Static_assert({c} == {value}, \"{c}\");\n"));
        statuses += 1;
    }
    assert_eq!(statuses, 10);
    // The structs, field by field, from the offsets Rust computes; a
    // field added on one side only fails the count.
    macro_rules! layout {
        ($rust:ty, $c:literal, [$($f:ident),*]) => {{
            let fields = [$(stringify!($f)),*];
            let decl = src
                .split(&format!("pub struct {} {{", stringify!($rust)))
                .nth(1)
                .unwrap();
            let decl = &decl[..decl.find('}').unwrap()];
            let declared = decl.lines().filter(|l| l.trim().starts_with("pub ")).count();
            assert_eq!(declared, fields.len(), "fields of {}", stringify!($rust));
            asserts.push_str(&format!(
                "_Static_assert(sizeof({}) == {}, \"sizeof {}\");\n",
                $c,
                std::mem::size_of::<$rust>(),
                $c
            ));
            $(
                asserts.push_str(&format!(
                    "_Static_assert(offsetof({}, {}) == {}, \"{}.{}\");\n",
                    $c,
                    stringify!($f),
                    std::mem::offset_of!($rust, $f),
                    $c,
                    stringify!($f)
                ));
            )*
        }};
    }
    layout!(RtdType, "rtd_type", [name, size, align, layout_hash]);
    layout!(
        RtdReportEntry,
        "rtd_report_entry",
        [
            name,
            kind,
            reserved,
            count,
            total,
            latency_p50_ns,
            latency_p99_ns,
            latency_max_ns,
            handler_p99_ns,
            handler_max_ns,
            lost,
            missed,
            errors
        ]
    );
    assert_eq!(
        std::mem::size_of::<rtdeploy::RtdStatus>(),
        std::mem::size_of::<std::ffi::c_int>()
    );
    let dir = tempfile::tempdir().unwrap();
    compile_c(
        &format!("#include <stddef.h>\n#include \"rtdeploy.h\"\n{asserts}"),
        dir.path(),
    );
}

#[test]
fn the_header_compiles_as_cpp_too() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("check.cpp");
    std::fs::write(
        &file,
        "#include \"rtdeploy.h\"\nstatic_assert(RTD_ABI_VERSION >= 1, \"\");\nint main() { return static_cast<int>(rtd_abi_version() != RTD_ABI_VERSION); }\n",
    )
    .unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(root().join("include"))
        .arg(&file)
        .output();
    match out {
        Ok(o) => assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("a C++ compiler ({cxx}): {e}"),
    }
}
