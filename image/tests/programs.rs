//! The programs an image carries must run on its board and base: built
//! for the board's machine, static or with their interpreter and
//! libraries in the base; they go in stripped, their debug information
//! beside the image. This test program itself stands for a dynamically
//! linked `deploy` built for this machine.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use rootfs::{build, elf, Base, Format};

/// This test program: a real, dynamically linked ELF with debug
/// information, and its machine.
fn this_program() -> (Vec<u8>, elf::Elf) {
    let b = fs::read(std::env::current_exe().unwrap()).unwrap();
    let e = elf::inspect(&b).unwrap();
    assert!(e.interp.is_some(), "test programs are linked dynamically");
    (b, e)
}

/// The board architecture of `machine`, and another one.
fn arches(machine: u16) -> (&'static str, &'static str) {
    match machine {
        62 => ("x86_64", "aarch64"),
        183 => ("aarch64", "x86_64"),
        m => panic!("no board runs machine {m}"),
    }
}

/// Inputs whose deploy binary is this test program and whose release
/// programs are static headers of its machine.
fn dynamic_inputs(dir: &Path) -> (Inputs, elf::Elf) {
    let inputs = Inputs::new(dir);
    let (bytes, e) = this_program();
    fs::write(dir.join("deploy"), &bytes).unwrap();
    for p in ["imu_reader", "controller"] {
        fs::write(dir.join("release/bin").join(p), elf(e.machine, p)).unwrap();
    }
    (inputs, e)
}

#[test]
fn a_deploy_binary_for_another_machine_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (inputs, e) = dynamic_inputs(t.path());
    let (_, other) = arches(e.machine);
    let mut spec = inputs.spec();
    spec.board = format!("a {other} board");
    spec.arch = Some(other.into());
    let out = t.path().join("x.tar");
    let err = build(&spec, &out, Format::Tar, &mut no_progress())
        .unwrap_err()
        .to_string();
    let built = elf::machine_name(e.machine);
    assert!(
        err.starts_with(&format!(
            "/usr/bin/deploy (from {}) is built for {built}, but board a {other} board runs {other}: build it for {other}",
            t.path().join("deploy").display()
        )),
        "{err}"
    );
    assert!(!out.exists());
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}

#[test]
fn a_release_program_for_another_machine_is_refused_by_its_path() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    // The fixture is an aarch64 board; one controller is built for x86_64.
    fs::write(
        t.path().join("release/bin/controller"),
        elf(62, "controller"),
    )
    .unwrap();
    let err = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/bin/controller (from "), "{err}");
    assert!(
        err.contains("is built for x86_64, but board jetson-orin-nano runs aarch64"),
        "{err}"
    );
}

#[test]
fn a_dynamic_program_whose_interpreter_and_libraries_the_base_lacks_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (inputs, e) = dynamic_inputs(t.path());
    let (arch, _) = arches(e.machine);
    let mut spec = inputs.spec();
    spec.arch = Some(arch.into());
    let err = build(
        &spec,
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    let interp = e.interp.as_deref().unwrap();
    assert!(
        err.contains(&format!("/usr/bin/deploy (from {}) cannot run on this base: its interpreter {interp} is not in the base", t.path().join("deploy").display())),
        "{err}"
    );
    assert!(
        err.contains("the base lacks libraries it links against: "),
        "{err}"
    );
    assert!(err.contains("libc.so.6"), "{err}");
    assert!(
        err.ends_with("link it statically, or use a base that has them"),
        "{err}"
    );
}

#[test]
fn a_dynamic_program_runs_where_the_base_has_what_it_needs_and_goes_in_stripped() {
    let t = tempfile::tempdir().unwrap();
    let (inputs, e) = dynamic_inputs(t.path());
    let (arch, _) = arches(e.machine);
    // The base gets the interpreter and every library, where glibc puts
    // them (the libraries under the multiarch directory, found through
    // the /lib -> usr/lib link the fixture has).
    let base = t.path().join("base");
    let interp = e.interp.clone().unwrap();
    let triplet = format!("{arch}-linux-gnu");
    let at = base.join(interp.trim_start_matches('/'));
    fs::create_dir_all(at.parent().unwrap()).unwrap();
    fs::write(&at, b"loader").unwrap();
    for lib in &e.needed {
        let p = base.join("usr/lib").join(&triplet).join(lib);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"library").unwrap();
    }
    let mut spec = inputs.spec();
    spec.arch = Some(arch.into());
    let out = t.path().join("ok.tar");
    let s = build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    let (_, m) = read_tar(&out);
    let original = fs::read(t.path().join("deploy")).unwrap();
    let installed = &m["usr/bin/deploy"].data;
    assert!(
        installed.len() < original.len() / 2,
        "{} of {} bytes",
        installed.len(),
        original.len()
    );
    let sections = elf::section_names(installed).unwrap();
    assert!(!sections.iter().any(|n| n == ".debug_info"), "{sections:?}");
    assert_eq!(
        elf::debuglink(installed).unwrap(),
        Some(("deploy.debug".to_string(), elf::crc32(&original)))
    );
    // The debug information beside the image, by the program's path.
    let debug = s.debug.clone().expect("a debug directory");
    assert_eq!(debug, t.path().join("ok.tar.debug"));
    assert!(fs::read(debug.join("usr/bin/deploy.debug")).unwrap() == original);
    assert_eq!(s.stripped_bytes, (original.len() - installed.len()) as u64);
    // Built again with --force: the same bytes, the debug directory
    // replaced.
    spec.force = true;
    build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert!(fs::read(debug.join("usr/bin/deploy.debug")).unwrap() == original);
    assert_eq!(
        read_tar(&out).1["usr/bin/deploy"].data.len(),
        installed.len()
    );
    // A deploy binary named through a symbolic link (as a build
    // directory or a package may give it) is followed and stripped the
    // same way.
    let link = t.path().join("deploy-link");
    std::os::unix::fs::symlink(t.path().join("deploy"), &link).unwrap();
    let direct = spec.deploy_binary.clone();
    spec.deploy_binary = link;
    build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert!(read_tar(&out).1["usr/bin/deploy"].data == *installed);
    spec.deploy_binary = direct;
    // Without stripping, the program goes in as given and there is no
    // debug directory.
    spec.strip = false;
    let s = build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    assert!(s.debug.is_none());
    assert!(!debug.exists());
    assert!(read_tar(&out).1["usr/bin/deploy"].data == original);
}

#[test]
fn without_a_base_a_dynamic_program_is_a_warning() {
    let t = tempfile::tempdir().unwrap();
    let (inputs, e) = dynamic_inputs(t.path());
    let (arch, _) = arches(e.machine);
    let mut spec = inputs.spec();
    spec.arch = Some(arch.into());
    spec.base = Base::None;
    let s = build(
        &spec,
        &t.path().join("o.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap();
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("is linked dynamically")
                && w.contains("with no base its interpreter and libraries cannot be checked")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn a_file_that_is_no_program_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    fs::write(t.path().join("release/bin/controller"), b"just some text\n").unwrap();
    let err = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("is not a program: it is neither an ELF program nor a #! script"),
        "{err}"
    );
    // A script whose interpreter the base lacks.
    fs::write(
        t.path().join("release/bin/controller"),
        b"#!/usr/bin/python3\n",
    )
    .unwrap();
    let err = build(
        &inputs.spec(),
        &t.path().join("x.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("its interpreter `/usr/bin/python3` (from its #! line) is not in the base"),
        "{err}"
    );
}

/// rtdeploy's other programs (the bridge) go in as `deploy` does: at
/// their path, executable, named in the SBOM and the manifest, and
/// refused when built for another board or given twice.
#[test]
fn the_bridge_goes_in_beside_deploy_checked_like_it() {
    let t = tempfile::tempdir().unwrap();
    let inputs = Inputs::new(t.path());
    let bridge = t.path().join("rtdeploy-bridge");
    fs::write(&bridge, elf(183, "bridge")).unwrap();
    let mut spec = inputs.spec();
    spec.tools = vec![("usr/bin/rtdeploy-bridge".into(), bridge.clone())];
    let out = t.path().join("x.tar");
    let summary = build(&spec, &out, Format::Tar, &mut no_progress()).unwrap();
    let (_, m) = read_tar(&out);
    let b = &m["usr/bin/rtdeploy-bridge"];
    assert_eq!(b.data, elf(183, "bridge"));
    assert_eq!(b.mode, 0o755);
    let sbom: serde_json::Value =
        serde_json::from_slice(&fs::read(&summary.sbom).unwrap()).unwrap();
    let c = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "rtdeploy-bridge")
        .unwrap_or_else(|| panic!("no bridge in {sbom}"));
    assert_eq!(c["version"], "0.1.0");
    assert_eq!(c["properties"][0]["value"], "/usr/bin/rtdeploy-bridge");
    assert_eq!(
        c["hashes"][0]["content"].as_str().unwrap(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(elf(183, "bridge")))
    );
    let manifest = fs::read_to_string(&summary.manifest).unwrap();
    assert!(manifest.contains("/usr/bin/rtdeploy-bridge"), "{manifest}");

    // Built for x86_64, for an aarch64 board: refused by its path.
    fs::write(&bridge, elf(62, "bridge")).unwrap();
    let err = build(
        &spec,
        &t.path().join("y.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!(
            "/usr/bin/rtdeploy-bridge (from {}) is built for x86_64, but board jetson-orin-nano runs aarch64",
            bridge.display()
        )),
        "{err}"
    );
    // Missing, or at deploy's own path: refused before anything is written.
    spec.tools = vec![("usr/bin/rtdeploy-bridge".into(), t.path().join("absent"))];
    let err = build(
        &spec,
        &t.path().join("z.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("absent"), "{err}");
    spec.tools = vec![("usr/bin/deploy".into(), bridge.clone())];
    let err = build(
        &spec,
        &t.path().join("z.tar"),
        Format::Tar,
        &mut no_progress(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("distinct relative paths"), "{err}");
    assert!(!t.path().join("y.tar").exists() && !t.path().join("z.tar").exists());
}
