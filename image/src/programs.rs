//! Whether the programs an image carries (the `deploy` binary and the
//! release's programs) can run on the board and the base they go into:
//! built for the board's machine, and either static or with their
//! interpreter and libraries in the base. A program that cannot run is
//! refused before anything is written; what cannot be known (no base) is a
//! warning.

use std::io::Read;

use crate::elf::{self, Elf};
use crate::entry::{Kind, Tree};
use crate::error::ImageBuildError;

/// One program the image carries.
pub struct Program<'a> {
    /// Its path in the image (`usr/bin/deploy`).
    pub path: String,
    /// Where it comes from, for messages.
    pub source: String,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// The board the image is for: its model and, when the model has one
/// (not `generic`), its architecture (`aarch64`, `x86_64`).
pub struct Target<'a> {
    pub board: &'a str,
    pub arch: Option<&'a str>,
}

/// The most symlinks followed while resolving one path in the tree.
const MAX_LINKS: usize = 40;
/// The most bytes of an `ld.so.conf` file read.
const MAX_CONF: u64 = 64 << 10;

/// `path` (relative to the image root) with every symlink on the way
/// followed inside the tree; the entry it ends at, if there is one.
pub fn resolve(tree: &Tree, path: &str) -> Option<String> {
    let mut todo: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .rev()
        .map(String::from)
        .collect();
    let mut at: Vec<String> = Vec::new();
    let mut links = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            at.pop();
            continue;
        }
        at.push(c);
        let here = at.join("/");
        if let Kind::Symlink(target) = &tree.entries.get(&here)?.kind {
            links += 1;
            if links > MAX_LINKS {
                return None;
            }
            at.pop();
            if target.starts_with('/') {
                at.clear();
            }
            todo.extend(
                target
                    .split('/')
                    .filter(|c| !c.is_empty() && *c != ".")
                    .rev()
                    .map(String::from),
            );
        }
    }
    let p = at.join("/");
    tree.entries.contains_key(&p).then_some(p)
}

/// Whether `path` is (or leads to) a regular file of the tree.
fn is_file(tree: &Tree, path: &str) -> bool {
    resolve(tree, path)
        .and_then(|p| tree.entries.get(&p))
        .is_some_and(|e| matches!(e.kind, Kind::File { .. }))
}

/// The first bytes of a regular file of the tree.
fn head(tree: &Tree, path: &str, n: u64) -> Option<Vec<u8>> {
    let p = resolve(tree, path)?;
    let Kind::File { size, data, .. } = &tree.entries.get(&p)?.kind else {
        return None;
    };
    let r = tree.open(&p, *size, data).ok()?;
    units::bounded::read_at_most(&mut r.take(n), &tree.source_of(&p, data), n).ok()
}

/// The machine of the base's programs (its `/bin/sh`), for a board that
/// does not name one.
fn base_machine(tree: &Tree) -> Option<u16> {
    ["bin/sh", "usr/bin/sh", "bin/busybox", "usr/bin/env"]
        .iter()
        .find_map(|p| head(tree, p, 64).and_then(|h| elf::inspect(&h).ok()))
        .map(|e| e.machine)
}

/// The library directories of the base: its `ld.so.conf` (and the
/// `ld.so.conf.d/*.conf` it includes), then the standard ones for the
/// machine's multiarch triplet.
fn library_dirs(tree: &Tree, machine: u16) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut confs = vec!["etc/ld.so.conf".to_string()];
    confs.extend(
        tree.entries
            .keys()
            .filter(|k| k.starts_with("etc/ld.so.conf.d/") && k.ends_with(".conf"))
            .cloned(),
    );
    for c in confs {
        if let Some(text) = head(tree, &c, MAX_CONF) {
            for line in String::from_utf8_lossy(&text).lines() {
                let line = line.trim();
                if line.starts_with('/') {
                    dirs.push(
                        line.trim_start_matches('/')
                            .trim_end_matches('/')
                            .to_string(),
                    );
                }
            }
        }
    }
    let triplet = match machine {
        183 => Some("aarch64-linux-gnu"),
        62 => Some("x86_64-linux-gnu"),
        _ => None,
    };
    for d in ["lib", "usr/lib"] {
        if let Some(t) = triplet {
            dirs.push(format!("{d}/{t}"));
        }
    }
    for d in ["lib", "usr/lib", "lib64", "usr/lib64", "usr/local/lib"] {
        dirs.push(d.to_string());
    }
    dirs
}

/// Checks every program against the board and the tree (`has_base`:
/// whether the tree holds a base root filesystem, rather than rtdeploy's
/// files only). Returns the warnings of what could not be checked.
pub fn check(
    target: &Target,
    tree: &Tree,
    has_base: bool,
    programs: &[Program],
) -> Result<Vec<String>, ImageBuildError> {
    let mut warnings = Vec::new();
    let mut elves: Vec<(&Program, Elf)> = Vec::new();
    for p in programs {
        if elf::is_elf(p.bytes) {
            let e = elf::inspect(p.bytes).map_err(|e| ImageBuildError::NotAProgram {
                path: format!("/{}", p.path),
                source_path: p.source.clone(),
                why: format!("its ELF headers cannot be read: {e}"),
            })?;
            elves.push((p, e));
        } else if let Some(line) = p.bytes.strip_prefix(b"#!") {
            let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let interp = line.split_whitespace().next().unwrap_or("");
            if has_base && !is_file(tree, interp) {
                return Err(ImageBuildError::ProgramNeeds {
                    path: format!("/{}", p.path),
                    source_path: p.source.clone(),
                    problems: vec![format!(
                        "its interpreter `{interp}` (from its #! line) is not in the base"
                    )],
                });
            }
        } else {
            return Err(ImageBuildError::NotAProgram {
                path: format!("/{}", p.path),
                source_path: p.source.clone(),
                why: "it is neither an ELF program nor a #! script".into(),
            });
        }
    }
    // The machine they must be built for: the board's, else the base's,
    // else the first program's (they must at least agree).
    let want = match target.arch.and_then(elf::machine_of) {
        Some(m) => Some((m, format!("board {} runs", target.board))),
        None => base_machine(tree)
            .map(|m| (m, format!("the base of board {} runs", target.board)))
            .or_else(|| {
                elves
                    .first()
                    .map(|(p, e)| (e.machine, format!("/{} is built for", p.path)))
            }),
    };
    for (p, e) in &elves {
        if let Some((m, who)) = &want {
            if e.machine != *m || !e.class64_le {
                let found = if e.class64_le {
                    elf::machine_name(e.machine)
                } else {
                    format!("{} (32-bit or big-endian)", elf::machine_name(e.machine))
                };
                return Err(ImageBuildError::ProgramMachine {
                    path: format!("/{}", p.path),
                    source_path: p.source.clone(),
                    found,
                    want: format!("{who} {}", elf::machine_name(*m)),
                    target: elf::machine_name(*m),
                });
            }
        }
        let Some(interp) = &e.interp else {
            continue;
        };
        if !has_base {
            warnings.push(format!(
                "/{} (from {}) is linked dynamically (interpreter {interp}, libraries {}): with no base its interpreter and libraries cannot be checked; the root filesystem the image is laid over must have them (or link it statically)",
                p.path,
                p.source,
                e.needed.join(", ")
            ));
            continue;
        }
        let mut problems = Vec::new();
        if !is_file(tree, interp) {
            problems.push(format!("its interpreter {interp} is not in the base"));
        }
        let origin = p.path.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        let mut dirs: Vec<String> = e
            .runpath
            .iter()
            .map(|r| {
                r.replace("$ORIGIN", &format!("/{origin}"))
                    .replace("${ORIGIN}", &format!("/{origin}"))
                    .trim_start_matches('/')
                    .to_string()
            })
            .collect();
        dirs.extend(library_dirs(tree, e.machine));
        let missing: Vec<&str> = e
            .needed
            .iter()
            .filter(|lib| {
                if lib.contains('/') {
                    !is_file(tree, lib.trim_start_matches('/'))
                } else {
                    !dirs.iter().any(|d| is_file(tree, &format!("{d}/{lib}")))
                }
            })
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            problems.push(format!(
                "the base lacks {} it links against: {} (looked in /{})",
                if missing.len() == 1 {
                    "a library"
                } else {
                    "libraries"
                },
                missing.join(", "),
                dirs.iter().take(6).cloned().collect::<Vec<_>>().join(", /")
            ));
        }
        if !problems.is_empty() {
            return Err(ImageBuildError::ProgramNeeds {
                path: format!("/{}", p.path),
                source_path: p.source.clone(),
                problems,
            });
        }
    }
    Ok(warnings)
}
