//! Every on-robot path rtdeploy uses, in one place (DESIGN.md, "On the
//! robot"), under an install prefix (`/` on a robot, a temporary directory
//! in tests, `--prefix` for unprivileged runs).
//!
//! ```text
//! etc/rtdeploy/robot.yaml -> ../../opt/rtdeploy/current/robot.yaml
//! etc/rtdeploy/keys/*.pub                  trusted ed25519 public keys
//! etc/rtdeploy/cmdline                     the planned kernel command line
//! opt/rtdeploy/releases/<version>-<sha8>/  {bin/..., robot.yaml, manifest.json, manifest.sig}
//! opt/rtdeploy/current -> releases/<name>  switched by rename(2) of a new symlink
//! opt/rtdeploy/previous -> releases/<name>
//! opt/rtdeploy/store/<sha256>              content-addressed file contents
//! var/lib/rtdeploy/state.json              committed | trial (written via temp + rename, fsync'd)
//! var/lib/rtdeploy/boot-check.json         the boot timing check's report
//! var/lib/rtdeploy/boot-check-history.jsonl the last boot checks, one JSON line each
//! var/lib/rtdeploy/cpusets-apply.json      what `deploy apply` could not move
//! run/rtdeploy/update.lock                 flock(2); the holder writes `pid=<pid> name=<name>`
//! run/rtdeploy/control.sock                the supervisor's control socket
//! var/log/rtdeploy/<process>.log           process output, rotated
//! dev/shm/rtdeploy/                        channel files (the runtime's `SHM_DIR`)
//! ```
//!
//! The image builder writes the same tree into an image: it takes the
//! relative spellings from [`rel`], or a [`Layout`] rooted at `/` for
//! absolute link targets.

use std::path::{Path, PathBuf};

use crate::bundle::Store;

/// The paths of [`Layout`] relative to the prefix, for writers that place
/// entries in a tree of their own (an image). `/`-separated, no leading
/// `/`.
pub mod rel {
    /// rtdeploy's configuration directory.
    pub const ETC: &str = "etc/rtdeploy";
    /// The robot.yaml in force: a link to the current release's.
    pub const CONFIG: &str = "etc/rtdeploy/robot.yaml";
    /// Trusted public keys, `*.pub`.
    pub const KEYS: &str = "etc/rtdeploy/keys";
    /// The planned kernel command line, for boards whose boot loader does
    /// not read it from extlinux.conf.
    pub const CMDLINE: &str = "etc/rtdeploy/cmdline";
    /// Releases, the store and the links between them.
    pub const OPT: &str = "opt/rtdeploy";
    pub const RELEASES: &str = "opt/rtdeploy/releases";
    pub const STORE: &str = "opt/rtdeploy/store";
    pub const CURRENT: &str = "opt/rtdeploy/current";
    pub const PREVIOUS: &str = "opt/rtdeploy/previous";
    /// The current release's programs: where a relative `exec` is found.
    pub const CURRENT_BIN: &str = "opt/rtdeploy/current/bin";
    /// The robot.yaml of the current release ([`CONFIG`] links here).
    pub const CURRENT_CONFIG: &str = "opt/rtdeploy/current/robot.yaml";
    /// The release state.
    pub const STATE: &str = "var/lib/rtdeploy/state.json";
    /// The boot timing check's report.
    pub const BOOT_CHECK_REPORT: &str = "var/lib/rtdeploy/boot-check.json";
    /// The last boot checks' figures, one JSON object per line, oldest
    /// first (rewritten via temp + rename).
    pub const BOOT_CHECK_HISTORY: &str = "var/lib/rtdeploy/boot-check-history.jsonl";
    /// What `deploy apply` recorded (unmovable IRQs).
    pub const CPUSETS_APPLY_STATE: &str = "var/lib/rtdeploy/cpusets-apply.json";
    /// The update lock.
    pub const LOCK: &str = "run/rtdeploy/update.lock";
    /// The supervisor's control socket.
    pub const CONTROL_SOCKET: &str = "run/rtdeploy/control.sock";
    /// Process logs, `<process>.log` and their rotations.
    pub const LOG_DIR: &str = "var/log/rtdeploy";
}

/// Every on-robot path, under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub prefix: PathBuf,
}

impl Layout {
    pub fn new(prefix: &Path) -> Layout {
        Layout {
            prefix: prefix.to_path_buf(),
        }
    }

    fn under(&self, rel: &str) -> PathBuf {
        self.prefix.join(rel)
    }

    /// `etc/rtdeploy`.
    pub fn etc(&self) -> PathBuf {
        self.under(rel::ETC)
    }
    /// `etc/rtdeploy/robot.yaml`, the link to the current release's
    /// robot.yaml (the default `-c`).
    pub fn config_link(&self) -> PathBuf {
        self.under(rel::CONFIG)
    }
    /// What [`config_link`](Layout::config_link) points at, relative to
    /// its directory, so the link holds under any prefix.
    pub fn config_link_target() -> String {
        let up = "../".repeat(rel::ETC.split('/').count());
        format!("{up}{}", rel::CURRENT_CONFIG)
    }
    /// `etc/rtdeploy/keys`.
    pub fn keys(&self) -> PathBuf {
        self.under(rel::KEYS)
    }
    /// `etc/rtdeploy/cmdline`.
    pub fn cmdline(&self) -> PathBuf {
        self.under(rel::CMDLINE)
    }
    /// `opt/rtdeploy`.
    pub fn opt(&self) -> PathBuf {
        self.under(rel::OPT)
    }
    /// `opt/rtdeploy/releases`.
    pub fn releases(&self) -> PathBuf {
        self.under(rel::RELEASES)
    }
    /// `opt/rtdeploy/releases/<name>`.
    pub fn release(&self, name: &str) -> PathBuf {
        self.releases().join(name)
    }
    /// What the `current` and `previous` links hold to name `release`: a
    /// path relative to their directory (`releases/<name>`), so a link
    /// holds under any prefix.
    pub fn release_link(release: &str) -> String {
        let dir = rel::RELEASES
            .strip_prefix(rel::OPT)
            .and_then(|d| d.strip_prefix('/'))
            .expect("releases/ is in opt/rtdeploy, beside the links");
        format!("{dir}/{release}")
    }
    /// The content-addressed store, `opt/rtdeploy/store`.
    pub fn store(&self) -> Store {
        Store::new(self.under(rel::STORE))
    }
    /// `opt/rtdeploy/current`.
    pub fn current(&self) -> PathBuf {
        self.under(rel::CURRENT)
    }
    /// `opt/rtdeploy/previous`.
    pub fn previous(&self) -> PathBuf {
        self.under(rel::PREVIOUS)
    }
    /// `opt/rtdeploy/current/bin`: where a relative `exec` is found.
    pub fn current_bin(&self) -> PathBuf {
        self.under(rel::CURRENT_BIN)
    }
    /// `opt/rtdeploy/current/robot.yaml`.
    pub fn current_config(&self) -> PathBuf {
        self.under(rel::CURRENT_CONFIG)
    }
    /// `var/lib/rtdeploy/state.json`.
    pub fn state(&self) -> PathBuf {
        self.under(rel::STATE)
    }
    /// `var/lib/rtdeploy/boot-check.json`.
    pub fn boot_check_report(&self) -> PathBuf {
        self.under(rel::BOOT_CHECK_REPORT)
    }
    /// `var/lib/rtdeploy/boot-check-history.jsonl`.
    pub fn boot_check_history(&self) -> PathBuf {
        self.under(rel::BOOT_CHECK_HISTORY)
    }
    /// `var/lib/rtdeploy/cpusets-apply.json`.
    pub fn cpusets_apply_state(&self) -> PathBuf {
        self.under(rel::CPUSETS_APPLY_STATE)
    }
    /// `run/rtdeploy/update.lock`.
    pub fn lock(&self) -> PathBuf {
        self.under(rel::LOCK)
    }
    /// `run/rtdeploy/control.sock`.
    pub fn control_socket(&self) -> PathBuf {
        self.under(rel::CONTROL_SOCKET)
    }
    /// `var/log/rtdeploy`.
    pub fn log_dir(&self) -> PathBuf {
        self.under(rel::LOG_DIR)
    }
    /// `dev/shm/rtdeploy`: where channels live (the runtime's
    /// [`SHM_DIR`](units::path::SHM_DIR) under the prefix).
    pub fn shm_dir(&self) -> PathBuf {
        self.under(units::path::SHM_DIR.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_under_the_prefix() {
        let l = Layout::new(Path::new("/pfx"));
        assert_eq!(l.current(), Path::new("/pfx/opt/rtdeploy/current"));
        assert_eq!(
            l.release("1-abcd0123"),
            Path::new("/pfx/opt/rtdeploy/releases/1-abcd0123")
        );
        assert_eq!(l.state(), Path::new("/pfx/var/lib/rtdeploy/state.json"));
        assert_eq!(
            l.control_socket(),
            Path::new("/pfx/run/rtdeploy/control.sock")
        );
        assert_eq!(l.shm_dir(), Path::new("/pfx/dev/shm/rtdeploy"));
        assert_eq!(l.current_bin(), Path::new("/pfx/opt/rtdeploy/current/bin"));
        // the robot's own root
        let root = Layout::new(Path::new("/"));
        assert_eq!(root.config_link(), Path::new("/etc/rtdeploy/robot.yaml"));
        assert_eq!(root.shm_dir(), Path::new(units::path::SHM_DIR));
    }

    #[test]
    fn release_links_resolve_beside_current() {
        let l = Layout::new(Path::new("/pfx"));
        let link = Layout::release_link("1-abcd0123");
        assert_eq!(link, "releases/1-abcd0123");
        assert_eq!(
            l.current().parent().unwrap().join(&link),
            l.release("1-abcd0123")
        );
        assert_eq!(l.previous().parent(), l.current().parent());
    }

    #[test]
    fn the_config_link_resolves_to_the_current_release() {
        let target = Layout::config_link_target();
        assert_eq!(target, "../../opt/rtdeploy/current/robot.yaml");
        let l = Layout::new(Path::new("/pfx"));
        let resolved = l.config_link().parent().unwrap().join(&target);
        let mut normal = PathBuf::new();
        for c in resolved.components() {
            match c {
                std::path::Component::ParentDir => {
                    normal.pop();
                }
                c => normal.push(c),
            }
        }
        assert_eq!(normal, l.current_config());
    }
}
