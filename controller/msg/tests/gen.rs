//! Descriptions in `tests/msg/demo/msg/`: their layout hash is the one the
//! runtime's `shm_struct!` computes for the same struct, and the Rust, C
//! (and C++) and Python types written from them compile or load with
//! their sizes, offsets and hashes checked by each language itself.

use std::path::{Path, PathBuf};
use std::process::Command as Run;

use controller::ShmSafe;
use messages::{c, python, rust, rust_set, Description, DescriptionError, Set};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/msg/demo/msg")
}

fn set() -> Set {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir()).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        v.push(Description::parse(p.to_str().unwrap(), &text).unwrap());
    }
    Set::new(v).unwrap()
}

// The same types written by hand with the runtime's macro.
mod by_hand {
    controller::shm_struct! {
        pub struct Vector3 { pub x: f64, pub y: f64, pub z: f64 }
    }
    controller::shm_struct! {
        pub struct Chatter { pub seq: u64, pub deadline_ns: u64 }
    }
    controller::shm_struct! {
        pub struct Command {
            pub seq: u64,
            pub torque: [f32; 6],
            pub offset: Vector3,
            pub points: [Vector3; 2],
            pub mode: u32,
            pub _reserved: u32,
            pub gains: [i16; 4],
            pub tag: [u8; 8],
        }
    }
}

// What `deploy gen --lang rust` wrote, compiled here: its own
// compile-time assertion holds its hash to the description's.
mod generated {
    include!("generated/demo.rs");
}

#[test]
fn a_description_hashes_as_the_runtime_hashes_the_same_struct() {
    let s = set();
    assert_eq!(
        s.layout_hash("Chatter").unwrap(),
        by_hand::Chatter::LAYOUT_HASH
    );
    assert_eq!(
        s.layout_hash("Vector3").unwrap(),
        by_hand::Vector3::LAYOUT_HASH
    );
    assert_eq!(
        s.layout_hash("Command").unwrap(),
        by_hand::Command::LAYOUT_HASH
    );
    assert_eq!(
        generated::Command::LAYOUT_HASH,
        by_hand::Command::LAYOUT_HASH
    );
    let l = s.layout("Command").unwrap();
    assert_eq!((l.size, l.align), (128, 8));
    assert_eq!(
        std::mem::size_of::<generated::Command>(),
        std::mem::size_of::<by_hand::Command>()
    );
    let d = s.get("Command").unwrap();
    assert_eq!(d.package.as_deref(), Some("demo"));
    assert_eq!(d.doc, ["A joint command."]);
}

#[test]
fn the_generated_rust_is_what_the_generator_writes() {
    let want = rust_set(&set()).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/generated/demo.rs");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not what the generator writes now: write it again (deploy gen --lang rust tests/msg/demo/msg/*.msg)\n{want}",
        path.display()
    );
    // One description alone: its own struct, naming the one it uses.
    let one = rust(&set(), "Command").unwrap();
    assert!(
        one.contains("pub offset: Vector3,") && !one.contains("pub struct Vector3"),
        "{one}"
    );
}

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.into())
}

fn compile(compiler: &str, args: &[&str], file: &Path) {
    let include = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ffi/include");
    let out = Run::new(compiler)
        .args(args)
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(file.parent().unwrap())
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_c_type_compiles_as_c_and_cpp_with_its_layout_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set();
    for name in ["Command", "Chatter"] {
        std::fs::write(tmp.path().join(format!("{name}.h")), c(&s, name).unwrap()).unwrap();
    }
    let hash = s.layout_hash("Command").unwrap();
    // Both headers (Vector3 defined once), the record used as the C
    // interface takes it.
    let src = format!(
        "#include \"Command.h\"\n#include \"Chatter.h\"\n#include \"Command.h\"\n\
         int main(void) {{ Command c = {{0}}; c.offset.x = 1.0; c.points[1].z = 2.0;\n\
         return (Command_type.layout_hash == UINT64_C({hash:#x}) && Command_type.size == 128\n\
         && Chatter_type.size == 16 && c.points[1].z == 2.0) ? 0 : 1; }}\n"
    );
    let cfile = tmp.path().join("use.c");
    std::fs::write(&cfile, &src).unwrap();
    compile(
        &compiler("CC", "cc"),
        &[
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
        ],
        &cfile,
    );
    let cpp = tmp.path().join("use.cpp");
    std::fs::write(
        &cpp,
        src.replace("(void)", "()")
            .replace("Command c = {0};", "Command c{};"),
    )
    .unwrap();
    compile(
        &compiler("CXX", "c++"),
        &[
            "-std=c++17",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fno-exceptions",
            "-fsyntax-only",
        ],
        &cpp,
    );
    // A layout that differs from the description fails the build.
    let bad = c(&s, "Chatter")
        .unwrap()
        .replace("uint64_t deadline_ns;", "uint32_t deadline_ns;");
    std::fs::write(tmp.path().join("Chatter.h"), bad).unwrap();
    let f = tmp.path().join("bad.c");
    std::fs::write(&f, "#include \"Chatter.h\"\n").unwrap();
    let out = Run::new(compiler("CC", "cc"))
        .args(["-std=c11", "-fsyntax-only", "-I"])
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ffi/include"))
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Chatter.deadline_ns: 8 bytes at 8"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_python_type_loads_with_its_layout_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let s = set();
    std::fs::write(
        tmp.path().join("command.py"),
        python(&s, "Command").unwrap(),
    )
    .unwrap();
    let hash = s.layout_hash("Command").unwrap();
    let script = format!(
        "import ctypes, command\n\
         c = command.Command()\n\
         c.points[1].z = 2.0\n\
         b = bytes(c)\n\
         assert len(b) == 128, len(b)\n\
         assert command.Command.LAYOUT_HASH == {hash:#x}\n\
         assert command.Command.TYPE_NAME == 'Command'\n\
         assert command.Command.points.offset == 56\n\
         print('ok')\n"
    );
    let out = Run::new("python3")
        .arg("-c")
        .arg(script)
        .current_dir(tmp.path())
        .output()
        .expect("python3");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn parse_err(text: &str) -> String {
    match Description::parse("pkg/msg/Bad.msg", text) {
        Ok(d) => match Set::new(vec![d]).unwrap().layout("Bad") {
            Ok(l) => panic!("accepted: {l:?}"),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    }
}

#[test]
fn what_a_channel_cannot_carry_is_refused_with_its_place() {
    for (text, want) in [
        (
            "uint64 a\nbool b\n",
            "pkg/msg/Bad.msg:2:1: `bool`: not valid for every bit pattern",
        ),
        (
            "string name\n",
            "pkg/msg/Bad.msg:1:1: `string`: of no fixed size",
        ),
        ("uint8[] data\n", "1:1: `uint8[]`: a sequence"),
        ("uint8[<=4] data\n", "1:1: `uint8[<=4]`: a sequence"),
        ("int32 X=3\n", "1:8: a constant"),
        ("int32 x 3\n", "1:9: a default value"),
        (
            "uint8 a\nuint64 b\n",
            "2:1: field `b` would start at byte 1, which C pads by 7 to 8",
        ),
        (
            "uint64 a\nuint8 b\n",
            "9 bytes of fields, which C pads by 7",
        ),
        ("Missing m\n", "1:1: `Missing`: no description of that name"),
        ("uint64 type\n", "1:8: `type` is a keyword"),
        ("uint64 a\nuint64 a\n", "2:8: a second field named `a`"),
        ("uint8[0] a\n", "the length must be 1 to"),
        ("# only a comment\n", "no field"),
        ("time t\n", "give the nanoseconds"),
    ] {
        let e = parse_err(text);
        assert!(e.contains(want), "{text:?}: {e}");
    }
    // A cycle is refused, not followed for ever.
    let a = Description::parse("A.msg", "B b\n").unwrap();
    let b = Description::parse("B.msg", "A a\n").unwrap();
    let e = Set::new(vec![a, b]).unwrap().layout("A").unwrap_err();
    assert!(matches!(e, DescriptionError::Whole { .. }), "{e}");
    assert!(e.to_string().contains("nested more than"), "{e}");
    // A name that is not an identifier.
    let e = Description::parse("my-type.msg", "uint8 a\n").unwrap_err();
    assert!(e.to_string().contains("must be an identifier"), "{e}");
}
