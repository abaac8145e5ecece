//! Installing a release: a bundle file verified and staged into the
//! store ([`install_bundle`]), or a manifest whose blobs already arrived
//! over the wire ([`install_from_store`]); either way the release
//! directory is built from the store, checked, renamed into place and
//! switched to in trial ([`begin_trial`](crate::switch::begin_trial)).
//!
//! Crash safety: a release directory is complete (every file linked or
//! copied, fsync'd) before it is renamed into `releases/`; `state.json` says
//! `trial` before `current` moves; `current` is only ever replaced by
//! rename(2). So at any instant `current` names either the old or the new
//! release, whole, and [`recover_at_start`](crate::switch::recover_at_start)
//! turns an interrupted trial back into the old release.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::{self, BufReader};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::bundle::{
    load_trusted_keys, sha256_file, sync_dir, BundleReadError, BundleReader, Compat, Manifest,
    Sha256Hex, Staging, VerifiedManifest, MANIFEST_NAME, MAX_MANIFEST, SIGNATURE_NAME,
};
use crate::error::{ioe, ReleaseError};
use crate::fault::fault_point;
use crate::layout::Layout;
use crate::lock::UpdateLock;
use crate::prune::prune;
use crate::state::{link_target, read_state, write_synced, ReleaseState};
use crate::switch::begin_system_trial;
use crate::system::{PlanSystem, SystemUpdate};

/// Checks a release's robot.yaml text and returns the programs it runs
/// (`processes[].exec`, which the release must hold); `Err` says why it
/// is not valid.
pub type ValidateYaml = dyn Fn(&str) -> Result<Vec<String>, RobotYamlError>;

/// Why a [`ValidateYaml`] refused a release's robot.yaml.
#[derive(Debug, thiserror::Error)]
pub enum RobotYamlError {
    /// It does not load or does not validate; the validator's own error
    /// (every problem, with line and column) says why.
    #[error(transparent)]
    Invalid(Box<dyn std::error::Error + Send + Sync>),
}

/// What an install checks against and how it behaves.
pub struct InstallOptions<'a> {
    /// The robot and board this robot is (from its robot.yaml).
    pub compat: Compat,
    /// `update.public_keys`, in addition to `etc/rtdeploy/keys/*.pub`.
    pub public_keys: Vec<String>,
    /// `update.keep`.
    pub keep: u32,
    /// `update.lock_timeout`.
    pub lock_timeout: Duration,
    /// The name written into the update lock.
    pub holder: String,
    /// Validates the new release's robot.yaml before anything switches.
    pub validate_robot_yaml: Option<&'a ValidateYaml>,
    /// Plans the system part of the new release from its robot.yaml
    /// (kernel command line, CPU plan: [`crate::system`]); `None` installs
    /// every release as controller-only.
    pub plan_system: Option<Box<PlanSystem>>,
}

/// What an install did.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    /// `<version>-<sha8>`.
    pub release: String,
    pub version: String,
    /// The release `current` pointed at before.
    pub previous: Option<String>,
    /// `trial`, `committed` (the first release: nothing to go back to) or
    /// `already-current`.
    pub state: String,
    /// Which trusted key verified the bundle.
    pub signer: String,
    pub files: usize,
    pub bytes: u64,
    /// Blobs that were new to the store.
    pub new_blobs: usize,
    /// Releases and blobs removed to keep `update.keep` releases.
    pub pruned_releases: Vec<String>,
    pub pruned_blobs: usize,
    pub warnings: Vec<String>,
    /// The release changes the kernel command line or the CPU plan: what
    /// changed and the boot entry written ([`crate::system`]).
    pub system: Option<SystemUpdate>,
    /// A reboot is needed to run the release (a system update in trial);
    /// `run/rtdeploy/reboot-required` says so too.
    pub reboot: bool,
}

/// Installs a bundle file: takes the update lock, verifies the signature
/// (before extracting anything else), checks robot and board, stages and
/// checks every blob, builds and renames the release directory, then
/// [`begin_trial`].
pub fn install_bundle(
    prefix: &Path,
    bundle: &Path,
    opts: &InstallOptions,
) -> Result<InstallReport, ReleaseError> {
    let layout = Layout::new(prefix);
    // Named on the command line: through a link, but a regular file.
    let file = units::bounded::Bound::regular(u64::MAX)
        .following_links()
        .open(bundle)
        .map_err(|e| BundleReadError::Open {
            path: bundle.to_path_buf(),
            err: e.into_io(),
        })?;
    let lock = UpdateLock::acquire(prefix, &opts.holder, opts.lock_timeout)?;
    fault_point("locked");
    let trusted = load_trusted_keys(&layout.keys(), &opts.public_keys)?;
    let store = layout.store();
    let staging = RefCell::new(None);
    let modes = RefCell::new(BTreeMap::<Sha256Hex, u32>::new());
    let first = std::cell::Cell::new(true);
    let verified = BundleReader::read(
        BufReader::with_capacity(1 << 20, file),
        &trusted,
        &opts.compat,
        |v| {
            check_robot_yaml(v, opts)?;
            let mut m = modes.borrow_mut();
            for f in &v.manifest.files {
                m.entry(Sha256Hex::parse(&f.sha256).expect("validated"))
                    .or_insert(f.mode);
            }
            Ok(())
        },
        |sha, data| {
            let mut st = staging.borrow_mut();
            if st.is_none() {
                // Only now, with the signature verified, does anything get
                // written; leftovers of killed installs go first.
                store.remove_stale_staging();
                *st = Some(store.staging().map_err(io::Error::other)?);
            }
            let mode = modes.borrow().get(sha).copied().unwrap_or(0o644);
            st.as_mut().expect("just made").write(sha, mode, data)?;
            if first.replace(false) {
                fault_point("blob-staged");
            }
            Ok(())
        },
    )?;
    fault_point("verified");
    let new_blobs = staging.borrow().as_ref().map_or(0, |s: &Staging| s.len());
    if let Some(s) = staging.into_inner() {
        s.commit()?;
    }
    fault_point("stored");
    let mut report = install_from_store(&layout, &verified, opts, &lock)?;
    report.new_blobs = new_blobs;
    Ok(report)
}

pub(crate) fn check_robot_yaml(
    v: &VerifiedManifest,
    opts: &InstallOptions,
) -> Result<(), BundleReadError> {
    if let Some(check) = opts.validate_robot_yaml {
        let programs = check(&v.manifest.robot_yaml).map_err(|why| BundleReadError::BadEntry {
            name: format!("{MANIFEST_NAME} (robot.yaml of {})", v.release),
            why: format!("holds a robot.yaml that is not valid: {why}"),
        })?;
        // The same check `deploy image` and `deploy bundle` make: a
        // release that cannot run its own robot.yaml is not installed.
        v.manifest
            .check_programs(&v.release, programs.iter().map(String::as_str))
            .map_err(|e| BundleReadError::BadEntry {
                name: format!("{MANIFEST_NAME} (release {})", v.release),
                why: format!("is refused: {e}"),
            })?;
    }
    Ok(())
}

/// Builds the release from blobs already in the store, switches to it in
/// trial, and prunes. The caller holds the update lock.
pub fn install_from_store(
    layout: &Layout,
    verified: &VerifiedManifest,
    opts: &InstallOptions,
    _lock: &UpdateLock,
) -> Result<InstallReport, ReleaseError> {
    let prefix = &layout.prefix;
    if let Some(ReleaseState::Trial { release, .. }) = read_state(prefix)? {
        return Err(ReleaseError::TrialInProgress { release });
    }
    let name = &verified.release;
    let store = layout.store();
    for f in &verified.manifest.files {
        if !store.has(&Sha256Hex::parse(&f.sha256).expect("validated")) {
            return Err(ReleaseError::MissingBlob {
                release: name.clone(),
                sha: f.sha256.clone(),
                path: f.path.clone(),
            });
        }
    }
    let before = link_target(&layout.current());
    let system = match &opts.plan_system {
        Some(plan) if before.as_deref() != Some(name.as_str()) => {
            plan(name, &verified.manifest.robot_yaml).map_err(|why| ReleaseError::System {
                release: name.clone(),
                why,
            })?
        }
        _ => None,
    };
    build_release(layout, verified)?;
    fault_point("release-renamed");
    let state = begin_system_trial(prefix, name, system)?;
    let mut warnings = Vec::new();
    ensure_config_link(layout, &mut warnings)?;
    fault_point("config-linked");
    let (pruned_releases, pruned_blobs) = prune(prefix, opts.keep)?;
    fault_point("pruned");
    let (system, reboot) = match &state {
        Some(ReleaseState::Trial { system, .. }) => (system.as_deref().cloned(), system.is_some()),
        _ => (None, false),
    };
    let state = match state {
        None => "already-current",
        Some(ReleaseState::Trial { .. }) => "trial",
        Some(ReleaseState::Committed { .. }) => "committed",
    };
    Ok(InstallReport {
        release: name.clone(),
        version: verified.manifest.version.clone(),
        previous: before,
        state: state.into(),
        signer: verified.signer.clone(),
        files: verified.manifest.files.len(),
        bytes: verified.manifest.total_size(),
        new_blobs: 0,
        pruned_releases,
        pruned_blobs,
        warnings,
        system,
        reboot,
    })
}

/// Makes `releases/<name>` from the store: built in `releases/.tmp-<name>`,
/// every file linked (or copied when its mode differs from the stored
/// blob's), every directory fsync'd, then renamed into place. A complete
/// release of that name already there is kept.
fn build_release(layout: &Layout, v: &VerifiedManifest) -> Result<(), ReleaseError> {
    let releases = layout.releases();
    fs::create_dir_all(&releases).map_err(ioe(&releases))?;
    let dest = layout.release(&v.release);
    if dest.exists() {
        if verify_release(&dest).is_ok() {
            return Ok(());
        }
        // A damaged release that is not in use is rebuilt.
        if link_target(&layout.current()).as_deref() == Some(v.release.as_str()) {
            return Err(ReleaseError::Incomplete {
                path: dest,
                why: "it is current and damaged; roll back first".into(),
            });
        }
        fs::remove_dir_all(&dest).map_err(ioe(&dest))?;
    }
    let tmp = releases.join(format!(".tmp-{}", v.release));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(ioe(&tmp))?;
    }
    fs::create_dir(&tmp).map_err(ioe(&tmp))?;
    let store = layout.store();
    let mut dirs = BTreeSet::new();
    dirs.insert(tmp.clone());
    let mut first = true;
    for f in &v.manifest.files {
        let to = tmp.join(&f.path);
        let parent = to.parent().expect("inside tmp").to_path_buf();
        if !dirs.contains(&parent) {
            fs::create_dir_all(&parent).map_err(ioe(&parent))?;
            let mut p = parent.as_path();
            while p != tmp {
                dirs.insert(p.to_path_buf());
                p = p.parent().expect("inside tmp");
            }
        }
        let blob = store.blob_path(&Sha256Hex::parse(&f.sha256).expect("validated"));
        let md = fs::metadata(&blob).map_err(ioe(&blob))?;
        if md.permissions().mode() & 0o7777 == f.mode && fs::hard_link(&blob, &to).is_ok() {
            // Shares the verified, fsync'd inode.
        } else {
            copy_synced(&blob, &to, f.mode)?;
        }
        if first {
            first = false;
            fault_point("release-file");
        }
    }
    write_synced(
        &tmp.join("robot.yaml"),
        v.manifest.robot_yaml.as_bytes(),
        0o644,
    )?;
    write_synced(&tmp.join(MANIFEST_NAME), &v.bytes, 0o644)?;
    write_synced(&tmp.join(SIGNATURE_NAME), &v.signature, 0o644)?;
    for d in dirs.iter().rev() {
        sync_dir(d).map_err(ioe(d))?;
    }
    fault_point("release-built");
    fs::rename(&tmp, &dest).map_err(ioe(&dest))?;
    sync_dir(&releases).map_err(ioe(&releases))
}

fn copy_synced(from: &Path, to: &Path, mode: u32) -> Result<(), ReleaseError> {
    let mut src = crate::error::open_regular(from).map_err(ioe(from))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(to)
        .map_err(ioe(to))?;
    io::copy(&mut src, &mut dst).map_err(ioe(to))?;
    dst.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(ioe(to))?;
    dst.sync_all().map_err(ioe(to))
}

/// Checks a release directory against its own manifest: every listed file
/// present with its mode, size and sha256, nothing else but robot.yaml,
/// manifest.json and manifest.sig. Returns the manifest.
pub fn verify_release(dir: &Path) -> Result<Manifest, ReleaseError> {
    let inc = |why: String| ReleaseError::Incomplete {
        path: dir.to_path_buf(),
        why,
    };
    let bytes = crate::error::read_regular(&dir.join(MANIFEST_NAME), MAX_MANIFEST)
        .map_err(|e| inc(format!("{MANIFEST_NAME}: {e}")))?;
    let m = Manifest::parse(&bytes).map_err(|e| inc(e.to_string()))?;
    // The manifest carries robot.yaml: it is no longer than the manifest.
    let yaml = crate::error::read_regular(&dir.join("robot.yaml"), MAX_MANIFEST)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .map_err(|e| inc(format!("robot.yaml: {e}")))?;
    if yaml != m.robot_yaml {
        return Err(inc("robot.yaml differs from the manifest".into()));
    }
    let mut listed: BTreeSet<PathBuf> = m.files.iter().map(|f| PathBuf::from(&f.path)).collect();
    for n in ["robot.yaml", MANIFEST_NAME, SIGNATURE_NAME] {
        listed.insert(PathBuf::from(n));
    }
    for f in &m.files {
        let p = dir.join(&f.path);
        let md = fs::symlink_metadata(&p).map_err(|e| inc(format!("{}: {e}", f.path)))?;
        if !md.file_type().is_file()
            || md.permissions().mode() & 0o7777 != f.mode
            || md.len() != f.size
        {
            return Err(inc(format!(
                "{} is not the regular file of mode {:o} and {} bytes the manifest lists",
                f.path, f.mode, f.size
            )));
        }
        let (sha, _) = sha256_file(&p).map_err(|e| inc(format!("{}: {e}", f.path)))?;
        if sha.as_str() != f.sha256 {
            return Err(inc(format!(
                "{} hashes to {sha}, the manifest says {}",
                f.path, f.sha256
            )));
        }
    }
    let mut extra = Vec::new();
    walk_files(dir, dir, &mut extra);
    if let Some(x) = extra.into_iter().find(|p| !listed.contains(p)) {
        return Err(inc(format!("{} is not in the manifest", x.display())));
    }
    Ok(m)
}

fn walk_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk_files(root, &p, out);
        } else {
            out.push(p.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
}

fn ensure_config_link(layout: &Layout, warnings: &mut Vec<String>) -> Result<(), ReleaseError> {
    let link = layout.config_link();
    match fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => Ok(()),
        Ok(_) => {
            warnings.push(format!(
                "{} is a regular file, not a link to {}/robot.yaml: the new release's robot.yaml is not in effect until it is replaced by that link",
                link.display(),
                layout.current().display()
            ));
            Ok(())
        }
        Err(_) => {
            let dir = link.parent().expect("etc/rtdeploy");
            fs::create_dir_all(dir).map_err(ioe(dir))?;
            std::os::unix::fs::symlink(Layout::config_link_target(), &link).map_err(ioe(&link))?;
            sync_dir(dir).map_err(ioe(dir))
        }
    }
}
