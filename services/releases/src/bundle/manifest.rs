//! `manifest.json`: what a release holds and which robot it is for.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::hash::Sha256Hex;
use super::quote::{peer_message, quoted};

/// The manifest format this code writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;
/// The first entry of a bundle.
pub const MANIFEST_NAME: &str = "manifest.json";
/// The second entry of a bundle: ed25519 over the exact manifest bytes.
pub const SIGNATURE_NAME: &str = "manifest.sig";
/// Names at the top of a release directory that the installer writes itself.
const RESERVED: [&str; 3] = ["robot.yaml", MANIFEST_NAME, SIGNATURE_NAME];

/// The robot a bundle is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compat {
    /// `robot.name` in robot.yaml.
    pub robot: String,
    /// `board.model` in robot.yaml.
    pub board: String,
}

/// One file of the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the release directory, `/`-separated.
    pub path: String,
    /// Permission bits (no setuid, setgid or sticky bit).
    pub mode: u32,
    pub size: u64,
    pub sha256: String,
}

/// The signed description of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// The robot and board the release is for.
    pub robot: String,
    pub board: String,
    /// The release version, part of the release directory's name.
    pub version: String,
    /// The release's robot.yaml, verbatim.
    pub robot_yaml: String,
    /// Sorted by path.
    pub files: Vec<FileEntry>,
}

/// Why a manifest was refused. Values from the manifest are shown cut and
/// escaped ([`quoted`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("manifest is not valid JSON for format {MANIFEST_FORMAT}: {0}")]
    Parse(String),
    #[error("manifest format {0} is not supported (expected {MANIFEST_FORMAT})")]
    Format(u32),
    #[error("version {} is not usable in a directory name (expected 1-64 characters of A-Z a-z 0-9 . _ + -, not starting with `.`)", quoted(.0))]
    Version(String),
    #[error("{field} {} is empty or holds control characters", quoted(value))]
    Name { field: &'static str, value: String },
    #[error("file path {} {why}", quoted(path))]
    Path { path: String, why: &'static str },
    #[error(
        "file {} has mode {mode:o} (expected permission bits only, at most 0777)",
        quoted(path)
    )]
    Mode { path: String, mode: u32 },
    #[error(
        "file {} has sha256 {} (expected 64 lower-case hex digits)",
        quoted(path),
        quoted(sha256)
    )]
    Sha { path: String, sha256: String },
    #[error(
        "bundle is for robot {} on board {}, but this robot is {} on board {}",
        quoted(bundle_robot),
        quoted(bundle_board),
        quoted(robot),
        quoted(board)
    )]
    Incompatible {
        bundle_robot: String,
        bundle_board: String,
        robot: String,
        board: String,
    },
}

/// The most characters of a JSON parser's message kept (it may quote a
/// value from the manifest whole).
const PARSE_SHOWN: usize = 300;

impl Manifest {
    /// Checks that every program of `programs` is an executable file of
    /// this release ([`crate::programs::check_programs`]).
    pub fn check_programs<'a>(
        &self,
        release: &str,
        programs: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), crate::programs::ReleaseProgramsError> {
        let files: Vec<_> = self
            .files
            .iter()
            .map(|f| crate::programs::ReleaseFile {
                path: &f.path,
                mode: f.mode,
                regular: true,
            })
            .collect();
        crate::programs::check_programs(release, programs, &files)
    }

    /// The canonical bytes that get signed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        v.push(b'\n');
        v
    }

    /// Parses and validates manifest bytes.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| {
            ManifestError::Parse(peer_message(e.to_string().as_bytes(), PARSE_SHOWN))
        })?;
        m.validate()?;
        Ok(m)
    }

    /// Checks everything the installer relies on: a usable version, safe
    /// relative paths (no `..`, no absolute path, no empty component, no
    /// clash with the installer's own files or with each other), plain
    /// permission bits and well-formed hashes.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.format != MANIFEST_FORMAT {
            return Err(ManifestError::Format(self.format));
        }
        let v = &self.version;
        let ok = !v.is_empty()
            && v.len() <= 64
            && !v.starts_with('.')
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
        if !ok {
            return Err(ManifestError::Version(v.clone()));
        }
        for (field, value) in [("robot", &self.robot), ("board", &self.board)] {
            if value.is_empty() || value.chars().any(|c| c.is_control()) {
                return Err(ManifestError::Name {
                    field,
                    value: value.clone(),
                });
            }
        }
        let mut paths = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        for f in &self.files {
            check_path(&f.path)?;
            if !paths.insert(f.path.as_str()) {
                return Err(ManifestError::Path {
                    path: f.path.clone(),
                    why: "is listed twice",
                });
            }
            let mut at = 0;
            while let Some(i) = f.path[at..].find('/') {
                dirs.insert(&f.path[..at + i]);
                at += i + 1;
            }
            if f.mode & !0o777 != 0 {
                return Err(ManifestError::Mode {
                    path: f.path.clone(),
                    mode: f.mode,
                });
            }
            if Sha256Hex::parse(&f.sha256).is_none() {
                return Err(ManifestError::Sha {
                    path: f.path.clone(),
                    sha256: f.sha256.clone(),
                });
            }
        }
        if let Some(p) = paths.intersection(&dirs).next() {
            return Err(ManifestError::Path {
                path: p.to_string(),
                why: "is both a file and a directory",
            });
        }
        Ok(())
    }

    /// Refuses a bundle made for another robot or board.
    pub fn check_compat(&self, robot: &Compat) -> Result<(), ManifestError> {
        if self.robot != robot.robot || self.board != robot.board {
            return Err(ManifestError::Incompatible {
                bundle_robot: self.robot.clone(),
                bundle_board: self.board.clone(),
                robot: robot.robot.clone(),
                board: robot.board.clone(),
            });
        }
        Ok(())
    }

    /// Each distinct blob with its size, in hash order.
    pub fn blobs(&self) -> Vec<(Sha256Hex, u64)> {
        let mut v: Vec<(Sha256Hex, u64)> = self
            .files
            .iter()
            .map(|f| (Sha256Hex::parse(&f.sha256).expect("validated"), f.size))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The sum of the file sizes.
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

fn check_path(p: &str) -> Result<(), ManifestError> {
    let bad = |why| {
        Err(ManifestError::Path {
            path: p.to_string(),
            why,
        })
    };
    if p.is_empty() || p.len() > 1024 {
        return bad("is empty or longer than 1024 bytes");
    }
    if p.starts_with('/') {
        return bad("is absolute (expected a path inside the release)");
    }
    if p.chars().any(|c| c.is_control()) {
        return bad("holds control characters");
    }
    for c in p.split('/') {
        match c {
            "" => return bad("has an empty component"),
            "." | ".." => {
                return bad("has a `.` or `..` component (expected a path inside the release)")
            }
            _ => {}
        }
    }
    if RESERVED.contains(&p) {
        return bad("is written by the installer itself (robot.yaml, manifest.json, manifest.sig)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(files: Vec<FileEntry>) -> Manifest {
        Manifest {
            format: 1,
            robot: "arm".into(),
            board: "generic".into(),
            version: "1.0".into(),
            robot_yaml: "robot: {name: arm}\n".into(),
            files,
        }
    }

    fn f(path: &str, mode: u32) -> FileEntry {
        FileEntry {
            path: path.into(),
            mode,
            size: 1,
            sha256: "a".repeat(64),
        }
    }

    #[test]
    fn round_trips_byte_for_byte() {
        let a = m(vec![f("bin/x", 0o755)]);
        let b = Manifest::parse(&a.to_bytes()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_bytes(), b.to_bytes());
    }

    #[test]
    fn refuses_unsafe_paths_and_modes() {
        for p in [
            "../x",
            "bin/../../x",
            "/etc/passwd",
            "bin//x",
            "./x",
            "",
            "robot.yaml",
            "bin/\nx",
        ] {
            let e = m(vec![f(p, 0o644)]).validate().unwrap_err();
            assert!(matches!(e, ManifestError::Path { .. }), "{p}: {e}");
        }
        let e = m(vec![f("bin/x", 0o4755)]).validate().unwrap_err();
        assert!(e.to_string().contains("4755"), "{e}");
        let e = m(vec![f("bin", 0o644), f("bin/x", 0o644)])
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("both a file and a directory"), "{e}");
        let e = m(vec![f("a", 0o644), f("a", 0o644)])
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }

    #[test]
    fn refuses_bad_versions() {
        for v in ["", ".hidden", "1/2", "a b", &"9".repeat(65)] {
            let mut x = m(vec![]);
            x.version = v.into();
            assert!(
                matches!(x.validate(), Err(ManifestError::Version(_))),
                "{v}"
            );
        }
    }

    #[test]
    fn values_in_errors_are_cut_and_escaped() {
        let long = format!("bin/\x1b[2J{}", "x".repeat(5000));
        let e = m(vec![f(&long, 0o644)]).validate().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "file path `bin/\\u{{1b}}[2J{}`... (5008 bytes) is empty or longer than 1024 bytes",
                "x".repeat(92)
            )
        );
        let mut x = m(vec![]);
        x.robot = format!("\n{}", "r".repeat(300));
        let e = x.validate().unwrap_err().to_string();
        assert!(e.starts_with("robot `\\nrrr"), "{e}");
        assert!(e.len() < 200, "{e}");
        // a JSON parser's message that quotes a long value is cut too
        let bad = format!("{{\"format\": \"{}\"}}", "9".repeat(100_000));
        let e = Manifest::parse(bad.as_bytes()).unwrap_err().to_string();
        assert!(e.len() < 400, "{} bytes: {e}", e.len());
    }

    #[test]
    fn compat_names_both_sides() {
        let e = m(vec![])
            .check_compat(&Compat {
                robot: "arm".into(),
                board: "orin-nano".into(),
            })
            .unwrap_err();
        let s = e.to_string();
        assert!(s.contains("generic") && s.contains("orin-nano"), "{s}");
    }
}
