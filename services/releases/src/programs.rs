//! The programs a release's robot.yaml runs (`processes[].exec`), and the
//! one check that the release holds each of them: made by `deploy image`
//! before it builds, `deploy bundle` before it signs, and `deploy install`
//! (and the update wire) before anything switches.
//!
//! A relative `exec` names a file under the release's `bin/`, as the
//! supervisor resolves it: `imu` and `bin/imu` are both `bin/imu`. An
//! absolute one is a program of the base system, not of the release.

/// Where the program `exec` lives inside a release directory, or `None`
/// for an absolute path (a program of the base system).
pub fn in_release(exec: &str) -> Option<String> {
    if exec.starts_with('/') {
        return None;
    }
    let mut rel = exec;
    while let Some(r) = rel.strip_prefix("./") {
        rel = r;
    }
    let rel = rel.strip_prefix("bin/").unwrap_or(rel);
    Some(format!("bin/{rel}"))
}

/// One file of a release as the check sees it.
#[derive(Debug, Clone, Copy)]
pub struct ReleaseFile<'a> {
    /// Relative to the release directory, `/`-separated.
    pub path: &'a str,
    /// Permission bits.
    pub mode: u32,
    /// A regular file (not a directory, not a symlink).
    pub regular: bool,
}

/// Why a release cannot run the robot.yaml it goes with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "release {release} lacks {} program(s) its robot.yaml runs: {} (a process's `exec` names bin/<name> in the release directory: build the programs and put them there, executable)",
    problems.len(),
    problems.join(", ")
)]
pub struct ReleaseProgramsError {
    /// The release directory or bundle, as the user named it.
    pub release: String,
    /// One per program: `bin/imu (not in the release)`, `bin/imu (not
    /// executable)`, `bin/imu (a directory, not a program)`.
    pub problems: Vec<String>,
}

/// Checks that every program of `programs` (robot.yaml's `exec`s) is a
/// regular, executable file among `files`; every one that is not is listed
/// at once. Absolute programs (of the base system) are not looked for.
pub fn check_programs<'a>(
    release: &str,
    programs: impl IntoIterator<Item = &'a str>,
    files: &[ReleaseFile<'_>],
) -> Result<(), ReleaseProgramsError> {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for exec in programs {
        let Some(rel) = in_release(exec) else {
            continue;
        };
        if seen.contains(&rel) {
            continue;
        }
        let problem = match files.iter().find(|f| f.path == rel) {
            None if files.iter().any(|f| f.path.starts_with(&format!("{rel}/"))) => {
                Some("a directory, not a program")
            }
            None => Some("not in the release"),
            Some(f) if !f.regular => Some("not a regular file"),
            Some(f) if f.mode & 0o111 == 0 => Some("not executable"),
            Some(_) => None,
        };
        if let Some(why) = problem {
            problems.push(format!("{rel} ({why})"));
        }
        seen.push(rel);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ReleaseProgramsError {
            release: release.to_string(),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, mode: u32) -> ReleaseFile<'_> {
        ReleaseFile {
            path,
            mode,
            regular: true,
        }
    }

    #[test]
    fn relative_programs_live_under_bin_as_the_supervisor_runs_them() {
        assert_eq!(in_release("imu").as_deref(), Some("bin/imu"));
        assert_eq!(in_release("bin/imu").as_deref(), Some("bin/imu"));
        assert_eq!(in_release("./bin/imu").as_deref(), Some("bin/imu"));
        assert_eq!(in_release("tools/imu").as_deref(), Some("bin/tools/imu"));
        assert_eq!(in_release("/usr/bin/python3"), None);
    }

    #[test]
    fn every_missing_or_unrunnable_program_is_named_at_once() {
        let files = [
            file("bin/talker", 0o755),
            file("bin/notes.txt", 0o644),
            file("bin/tools/x", 0o755),
            ReleaseFile {
                path: "bin/link",
                mode: 0o777,
                regular: false,
            },
        ];
        let err = check_programs(
            "build/release",
            [
                "talker",
                "bin/listener",
                "listener",
                "notes.txt",
                "tools",
                "link",
                "/bin/sh",
            ],
            &files,
        )
        .unwrap_err();
        assert_eq!(
            err.problems,
            [
                "bin/listener (not in the release)",
                "bin/notes.txt (not executable)",
                "bin/tools (a directory, not a program)",
                "bin/link (not a regular file)",
            ]
        );
        assert!(err
            .to_string()
            .starts_with("release build/release lacks 4 program(s) its robot.yaml runs: bin/listener (not in the release), "));
        assert!(check_programs("r", ["talker", "/bin/sh"], &files).is_ok());
        // A robot.yaml without processes needs nothing.
        assert!(check_programs("r", [], &[]).is_ok());
    }
}
