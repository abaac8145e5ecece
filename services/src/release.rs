//! Releases on the robot: install a signed bundle, switch to it in trial,
//! commit it when healthy or roll back, and the update lock.
//!
//! Layout under the install prefix:
//!
//! ```text
//! opt/rtdeploy/store/<sha256>              content-addressed file contents
//! opt/rtdeploy/releases/<version>-<sha8>/  {bin/..., robot.yaml, manifest.json, manifest.sig}
//! opt/rtdeploy/current -> releases/<name>  switched by rename(2) of a new symlink
//! opt/rtdeploy/previous -> releases/<name>
//! var/lib/rtdeploy/state.json              committed | trial (written via temp + rename, fsync'd)
//! run/rtdeploy/update.lock                 flock(2); the holder writes `pid=<pid> name=<name>`
//! etc/rtdeploy/keys/*.pub                  trusted ed25519 public keys
//! etc/rtdeploy/robot.yaml -> ../../opt/rtdeploy/current/robot.yaml
//! ```
//!
//! Crash safety: a release directory is complete (every file linked or
//! copied, fsync'd) before it is renamed into `releases/`; `state.json` says
//! `trial` before `current` moves; `current` is only ever replaced by
//! rename(2). So at any instant `current` names either the old or the new
//! release, whole, and [`recover_at_start`] turns an interrupted trial back
//! into the old release.
//!
//! How the supervisor uses this module:
//!
//! 1. at start, before starting any process: [`recover_at_start`]`(prefix)`;
//! 2. start processes from `opt/rtdeploy/current`;
//! 3. when [`read_state`] says [`ReleaseState::Trial`] (an install just
//!    switched `current`; poll `state.json` or get told over the control
//!    socket): restart every process from `current`, make a
//!    [`TrialHealth`] with `update.health_window`, and once a second feed
//!    it each process's [`ProcessHealth`] (`running`: the child is alive;
//!    `ready`: `health::Health::ready() && !unhealthy(now)`; `over_budget`:
//!    `Health::over_budget`; `restarts`: its restart count); on
//!    [`HealthVerdict::Commit`] call
//!    [`commit`], on [`HealthVerdict::Rollback`] call [`rollback`] and
//!    restart the processes again (from the old release). [`watch_trial`]
//!    is that loop, for callers that can block a thread on it.
//!
//! The update lock's file protocol, for holders in other crates (a
//! controller holding it while the robot moves): open (create, mode 0644)
//! `<prefix>/run/rtdeploy/update.lock`, take `flock(LOCK_EX)` on it, then
//! truncate it and write `pid=<pid> name=<process name>\n`; to release,
//! truncate it to 0 bytes, then close (or just exit: the kernel drops the
//! lock). An installer that cannot take the lock within
//! `update.lock_timeout` refuses and quotes the file's contents.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use image::bundle::wire::{self, kind, BlobStart, Need, Needed};
use image::bundle::{
    load_trusted_keys, quoted, quoted_bytes, sync_dir, BundleReadError, BundleReader, Compat,
    KeyError, Manifest, Sha256Hex, Store, StoreError, VerifiedManifest, MANIFEST_NAME,
    SIGNATURE_NAME,
};
use serde::{Deserialize, Serialize};

/// The install steps a fault can be injected after (see [`fault_point`]).
pub const FAULT_STEPS: &[&str] = &[
    "locked",
    "blob-staged",
    "verified",
    "stored",
    "release-file",
    "release-built",
    "release-renamed",
    "state-trial",
    "previous-switched",
    "current-switched",
    "config-linked",
    "pruned",
];

/// Test hook: when the environment variable `RTDEPLOY_FAULT` names `step`,
/// the process aborts right there, as a power cut or a SIGKILL would stop
/// it (no destructors, no cleanup).
pub fn fault_point(step: &str) {
    if std::env::var_os("RTDEPLOY_FAULT").is_some_and(|v| v == step) {
        eprintln!("rtdeploy: RTDEPLOY_FAULT={step}: aborting");
        std::process::abort();
    }
}

/// Every on-robot path this module uses, under one prefix.
#[derive(Debug, Clone)]
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
    pub fn opt(&self) -> PathBuf {
        self.under("opt/rtdeploy")
    }
    pub fn releases(&self) -> PathBuf {
        self.under("opt/rtdeploy/releases")
    }
    pub fn release(&self, name: &str) -> PathBuf {
        self.releases().join(name)
    }
    pub fn store(&self) -> Store {
        Store::new(self.under("opt/rtdeploy/store"))
    }
    pub fn current(&self) -> PathBuf {
        self.under("opt/rtdeploy/current")
    }
    pub fn previous(&self) -> PathBuf {
        self.under("opt/rtdeploy/previous")
    }
    pub fn state(&self) -> PathBuf {
        self.under("var/lib/rtdeploy/state.json")
    }
    pub fn lock(&self) -> PathBuf {
        self.under("run/rtdeploy/update.lock")
    }
    pub fn keys(&self) -> PathBuf {
        self.under("etc/rtdeploy/keys")
    }
    pub fn config_link(&self) -> PathBuf {
        self.under("etc/rtdeploy/robot.yaml")
    }
}

// ---------------------------------------------------------------- lock

/// Why the update lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum UpdateLockError {
    #[error("update lock {}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("update lock {} is held by {holder}; waited {waited:?}", path.display())]
    Busy {
        path: PathBuf,
        holder: String,
        waited: Duration,
    },
}

/// The update lock, held until dropped.
#[derive(Debug)]
pub struct UpdateLock {
    file: File,
    path: PathBuf,
}

impl UpdateLock {
    /// Takes `<prefix>/run/rtdeploy/update.lock`, waiting up to `timeout`,
    /// and records `holder` (a process name) and our pid in it.
    pub fn acquire(
        prefix: &Path,
        holder: &str,
        timeout: Duration,
    ) -> Result<UpdateLock, UpdateLockError> {
        let start = Instant::now();
        loop {
            if let Some(l) = Self::try_acquire(prefix, holder)? {
                return Ok(l);
            }
            if start.elapsed() >= timeout {
                let path = Layout::new(prefix).lock();
                let text = fs::read_to_string(&path).unwrap_or_default();
                return Err(UpdateLockError::Busy {
                    path,
                    holder: describe_holder(&text),
                    waited: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50).min(timeout));
        }
    }

    /// Takes the lock if nobody holds it.
    pub fn try_acquire(prefix: &Path, holder: &str) -> Result<Option<UpdateLock>, UpdateLockError> {
        let path = Layout::new(prefix).lock();
        let err = |err| UpdateLockError::Io {
            path: path.clone(),
            err,
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(err)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(err)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
            Err(e) => return Err(err(e.into())),
        }
        let name: String = holder
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        file.set_len(0).map_err(err)?;
        file.rewind().map_err(err)?;
        file.write_all(format!("pid={} name={name}\n", std::process::id()).as_bytes())
            .map_err(err)?;
        Ok(Some(UpdateLock { file, path }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for UpdateLock {
    fn drop(&mut self) {
        // Clear the holder before the lock goes (on close).
        let _ = self.file.set_len(0);
    }
}

fn describe_holder(text: &str) -> String {
    let mut pid = None;
    let mut name = None;
    for w in text.split_whitespace() {
        if let Some(p) = w.strip_prefix("pid=") {
            pid = Some(p);
        } else if let Some(n) = w.strip_prefix("name=") {
            name = Some(n);
        }
    }
    match (pid, name) {
        (Some(p), Some(n)) => format!("pid {p} ({n})"),
        (Some(p), None) => format!("pid {p}"),
        _ => "a process that did not say who it is".into(),
    }
}

// ---------------------------------------------------------------- state

/// `state.json`: whether `current` is committed or on trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum ReleaseState {
    Committed {
        release: String,
    },
    Trial {
        release: String,
        /// Unix seconds when the trial began.
        since: u64,
        /// The release to go back to.
        previous: String,
        /// Where `previous` pointed before the install (restored on
        /// rollback).
        #[serde(default)]
        previous_link: Option<String>,
    },
}

impl ReleaseState {
    pub fn release(&self) -> &str {
        match self {
            ReleaseState::Committed { release } | ReleaseState::Trial { release, .. } => release,
        }
    }
}

/// Why a release operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: io::Error },
    #[error("state file {} is not valid: {why}", path.display())]
    State { path: PathBuf, why: String },
    #[error("release `{release}` is in trial; it must be committed or rolled back before another install")]
    TrialInProgress { release: String },
    #[error("no release is in trial (state: {state})")]
    NotInTrial { state: String },
    #[error("nothing to roll back to: {why}")]
    NoPrevious { why: String },
    #[error("release {} is missing or incomplete: {why}", path.display())]
    Incomplete { path: PathBuf, why: String },
    #[error(transparent)]
    Lock(#[from] UpdateLockError),
    #[error(transparent)]
    Keys(#[from] KeyError),
    #[error(transparent)]
    Bundle(#[from] BundleReadError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("update connection: {0}")]
    Connection(io::Error),
    #[error("update protocol: {0}")]
    Protocol(String),
    #[error("release {release}: its robot.yaml is not valid: {why}")]
    RobotYaml { release: String, why: String },
    #[error("release {release} needs blob {sha} (for `{path}`), which the store does not hold")]
    MissingBlob {
        release: String,
        sha: String,
        path: String,
    },
}

fn ioe(path: &Path) -> impl FnOnce(io::Error) -> ReleaseError + '_ {
    move |err| ReleaseError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Reads `state.json` (`None` if there is none yet).
pub fn read_state(prefix: &Path) -> Result<Option<ReleaseState>, ReleaseError> {
    let path = Layout::new(prefix).state();
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| ReleaseError::State {
                path,
                why: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ioe(&path)(e)),
    }
}

fn write_state(prefix: &Path, s: &ReleaseState) -> Result<(), ReleaseError> {
    let path = Layout::new(prefix).state();
    let dir = path.parent().expect("state has a parent");
    fs::create_dir_all(dir).map_err(ioe(dir))?;
    let tmp = dir.join(format!(".state.json.tmp-{}", std::process::id()));
    let mut bytes = serde_json::to_vec_pretty(s).expect("state serializes");
    bytes.push(b'\n');
    write_synced(&tmp, &bytes, 0o644)?;
    fs::rename(&tmp, &path).map_err(ioe(&path))?;
    sync_dir(dir).map_err(ioe(dir))
}

fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ReleaseError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(ioe(path))?;
    f.write_all(bytes).map_err(ioe(path))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(ioe(path))?;
    f.sync_all().map_err(ioe(path))
}

/// The release a link (`current`, `previous`) names, if any.
pub fn link_target(link: &Path) -> Option<String> {
    let t = fs::read_link(link).ok()?;
    t.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Points `link` at `releases/<release>` by renaming a fresh symlink over
/// it, then fsyncs the directory.
fn switch_link(link: &Path, release: &str) -> Result<(), ReleaseError> {
    let dir = link.parent().expect("links live in opt/rtdeploy");
    let name = link.file_name().expect("link has a name").to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(Path::new("releases").join(release), &tmp).map_err(ioe(&tmp))?;
    fs::rename(&tmp, link).map_err(ioe(link))?;
    sync_dir(dir).map_err(ioe(dir))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

// ---------------------------------------------------------------- install

/// Checks a release's robot.yaml text; `Err` says why it is not valid.
pub type ValidateYaml = dyn Fn(&str) -> Result<(), String>;

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
    let file = File::open(bundle).map_err(|err| BundleReadError::Open {
        path: bundle.to_path_buf(),
        err,
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
    let new_blobs = staging
        .borrow()
        .as_ref()
        .map_or(0, |s: &image::bundle::Staging| s.len());
    if let Some(s) = staging.into_inner() {
        s.commit()?;
    }
    fault_point("stored");
    let mut report = install_from_store(&layout, &verified, opts, &lock)?;
    report.new_blobs = new_blobs;
    Ok(report)
}

fn check_robot_yaml(v: &VerifiedManifest, opts: &InstallOptions) -> Result<(), BundleReadError> {
    if let Some(check) = opts.validate_robot_yaml {
        if let Err(why) = check(&v.manifest.robot_yaml) {
            return Err(BundleReadError::BadEntry {
                name: format!("{MANIFEST_NAME} (robot.yaml of {})", v.release),
                why: format!("holds a robot.yaml that is not valid: {why}"),
            });
        }
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
    build_release(layout, verified)?;
    fault_point("release-renamed");
    let before = link_target(&layout.current());
    let state = begin_trial(prefix, name)?;
    let mut warnings = Vec::new();
    ensure_config_link(layout, &mut warnings)?;
    fault_point("config-linked");
    let (pruned_releases, pruned_blobs) = prune(prefix, opts.keep)?;
    fault_point("pruned");
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
    let mut src = File::open(from).map_err(ioe(from))?;
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
    let bytes =
        fs::read(dir.join(MANIFEST_NAME)).map_err(|e| inc(format!("{MANIFEST_NAME}: {e}")))?;
    let m = Manifest::parse(&bytes).map_err(|e| inc(e.to_string()))?;
    let yaml =
        fs::read_to_string(dir.join("robot.yaml")).map_err(|e| inc(format!("robot.yaml: {e}")))?;
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
        let (sha, _) =
            image::bundle::sha256_file(&p).map_err(|e| inc(format!("{}: {e}", f.path)))?;
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
            std::os::unix::fs::symlink("../../opt/rtdeploy/current/robot.yaml", &link)
                .map_err(ioe(&link))?;
            sync_dir(dir).map_err(ioe(dir))
        }
    }
}

// ---------------------------------------------------------------- trial

/// Switches `current` to `release` (which must be complete in
/// `releases/`) in trial: `state.json` says trial first, then `previous`
/// and `current` move by rename. Returns the new state, or `None` when
/// `release` already is current. The first release on a robot (nothing to
/// go back to) is committed at once.
pub fn begin_trial(prefix: &Path, release: &str) -> Result<Option<ReleaseState>, ReleaseError> {
    let layout = Layout::new(prefix);
    let dir = layout.release(release);
    if !dir.join(MANIFEST_NAME).is_file() {
        return Err(ReleaseError::Incomplete {
            path: dir,
            why: "no manifest.json".into(),
        });
    }
    if let Some(ReleaseState::Trial { release: r, .. }) = read_state(prefix)? {
        return Err(ReleaseError::TrialInProgress { release: r });
    }
    let cur = link_target(&layout.current());
    if cur.as_deref() == Some(release) {
        return Ok(None);
    }
    let state = match &cur {
        Some(c) if layout.release(c).is_dir() => ReleaseState::Trial {
            release: release.to_string(),
            since: unix_now(),
            previous: c.clone(),
            previous_link: link_target(&layout.previous()),
        },
        _ => ReleaseState::Committed {
            release: release.to_string(),
        },
    };
    write_state(prefix, &state)?;
    fault_point("state-trial");
    if let Some(c) = &cur {
        switch_link(&layout.previous(), c)?;
    }
    fault_point("previous-switched");
    switch_link(&layout.current(), release)?;
    fault_point("current-switched");
    Ok(Some(state))
}

/// Marks the release in trial as good, then prunes to `keep` releases
/// (unless the update lock is held: then the next install prunes).
pub fn commit(prefix: &Path, keep: u32) -> Result<String, ReleaseError> {
    match read_state(prefix)? {
        Some(ReleaseState::Trial { release, .. }) => {
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: release.clone(),
                },
            )?;
            // Pruning waits for a moment without an install (or a holder)
            // working on the store; a caller holding the lock prunes itself.
            if let Ok(Some(_lock)) = UpdateLock::try_acquire(prefix, "commit") {
                prune(prefix, keep)?;
            }
            Ok(release)
        }
        other => Err(ReleaseError::NotInTrial {
            state: describe_state(&other),
        }),
    }
}

fn describe_state(s: &Option<ReleaseState>) -> String {
    match s {
        None => "no state.json".into(),
        Some(ReleaseState::Committed { release }) => format!("committed {release}"),
        Some(ReleaseState::Trial { release, .. }) => format!("trial {release}"),
    }
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rollback {
    /// The release that was current.
    pub from: String,
    /// The release that is current now (committed).
    pub to: String,
    /// Whether it ended a trial (else it was a manual rollback of a
    /// committed release).
    pub trial: bool,
}

/// Goes back: from a trial, to the release before it (and `previous` as it
/// was before the install); from a committed release, to `previous` (the
/// two swap). The result is committed.
pub fn rollback(prefix: &Path) -> Result<Rollback, ReleaseError> {
    let layout = Layout::new(prefix);
    match read_state(prefix)? {
        Some(ReleaseState::Trial {
            release,
            previous,
            previous_link,
            ..
        }) => {
            if !layout.release(&previous).join(MANIFEST_NAME).is_file() {
                return Err(ReleaseError::NoPrevious {
                    why: format!("release {previous} is gone"),
                });
            }
            // current first: a crash here leaves state `trial`, and the next
            // recovery runs this again.
            switch_link(&layout.current(), &previous)?;
            match previous_link.filter(|p| layout.release(p).is_dir()) {
                Some(p) => switch_link(&layout.previous(), &p)?,
                None => {
                    let _ = fs::remove_file(layout.previous());
                }
            }
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: previous.clone(),
                },
            )?;
            Ok(Rollback {
                from: release,
                to: previous,
                trial: true,
            })
        }
        _ => {
            let cur = link_target(&layout.current()).ok_or_else(|| ReleaseError::NoPrevious {
                why: "no current release".into(),
            })?;
            let prev = link_target(&layout.previous())
                .filter(|p| p != &cur && layout.release(p).join(MANIFEST_NAME).is_file())
                .ok_or_else(|| ReleaseError::NoPrevious {
                    why: format!("{} names no other release", layout.previous().display()),
                })?;
            write_state(
                prefix,
                &ReleaseState::Committed {
                    release: prev.clone(),
                },
            )?;
            switch_link(&layout.current(), &prev)?;
            switch_link(&layout.previous(), &cur)?;
            Ok(Rollback {
                from: cur,
                to: prev,
                trial: false,
            })
        }
    }
}

/// What [`recover_at_start`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// The release `current` names now.
    pub current: Option<String>,
    /// A trial was interrupted (crash, power cut) and rolled back.
    pub rolled_back: Option<Rollback>,
    /// `current` did not match the committed release and was put back.
    pub repaired: bool,
    /// Leftover temporary directories removed.
    pub cleaned: Vec<String>,
}

/// Run once at supervisor start, before any process starts: a trial found
/// here was interrupted, so it is rolled back; `current` is put back to the
/// committed release if they disagree; leftovers of killed installs go.
/// Waits up to 5 s for the update lock (an install still running).
pub fn recover_at_start(prefix: &Path) -> Result<Recovery, ReleaseError> {
    let layout = Layout::new(prefix);
    let _lock = UpdateLock::acquire(prefix, "recover", Duration::from_secs(5))?;
    let mut out = Recovery {
        current: None,
        rolled_back: None,
        repaired: false,
        cleaned: Vec::new(),
    };
    for e in fs::read_dir(layout.releases())
        .into_iter()
        .flatten()
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(".tmp-") && fs::remove_dir_all(e.path()).is_ok() {
            out.cleaned.push(n);
        }
    }
    layout.store().remove_stale_staging();
    match read_state(prefix)? {
        Some(ReleaseState::Trial { .. }) => out.rolled_back = Some(rollback(prefix)?),
        Some(ReleaseState::Committed { release }) => {
            if link_target(&layout.current()).as_deref() != Some(release.as_str())
                && layout.release(&release).join(MANIFEST_NAME).is_file()
            {
                switch_link(&layout.current(), &release)?;
                out.repaired = true;
            }
        }
        None => {
            if let Some(c) = link_target(&layout.current()) {
                write_state(prefix, &ReleaseState::Committed { release: c })?;
            }
        }
    }
    out.current = link_target(&layout.current());
    Ok(out)
}

// ---------------------------------------------------------------- health

/// One process as the supervisor sees it, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessHealth {
    pub name: String,
    /// Alive now.
    pub running: bool,
    /// Reported ready (its first timing report, or the readiness signal).
    pub ready: bool,
    /// Timing reports over budget so far (a running count, as
    /// `health::Health::over_budget` keeps it); any increase during the
    /// trial fails it.
    pub over_budget: u64,
    /// Restarts since the supervisor started it (a crash shows up here even
    /// if the process is running again by the time we look).
    pub restarts: u32,
}

/// What to do with a trial now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthVerdict {
    /// Keep watching.
    Wait,
    /// Healthy for the whole window: [`commit`].
    Commit,
    /// [`rollback`], for this reason.
    Rollback(String),
}

/// The health decision for one trial. Healthy means every process running,
/// ready and within budget; a crash, a restart or a budget overrun rolls
/// back at once; the processes must all be ready within one window of the
/// trial's start, and then stay healthy for a whole window.
#[derive(Debug, Clone)]
pub struct TrialHealth {
    window: Duration,
    healthy_since: Option<Duration>,
    /// Restarts and over-budget counts at the first observation.
    baseline: Option<BTreeMap<String, (u32, u64)>>,
}

impl TrialHealth {
    pub fn new(window: Duration) -> TrialHealth {
        TrialHealth {
            window,
            healthy_since: None,
            baseline: None,
        }
    }

    /// How much of the window is still to go, `elapsed` after the trial
    /// began; `None` until every process was seen healthy.
    pub fn window_left(&self, elapsed: Duration) -> Option<Duration> {
        self.healthy_since
            .map(|since| self.window.saturating_sub(elapsed.saturating_sub(since)))
    }

    /// Takes one observation, `elapsed` after the trial began.
    pub fn observe(&mut self, elapsed: Duration, procs: &[ProcessHealth]) -> HealthVerdict {
        let baseline = self.baseline.get_or_insert_with(|| {
            procs
                .iter()
                .map(|p| (p.name.clone(), (p.restarts, p.over_budget)))
                .collect()
        });
        for p in procs {
            if !p.running {
                return HealthVerdict::Rollback(format!("process {} is not running", p.name));
            }
            let (restarts, over) = baseline.get(&p.name).copied().unwrap_or((0, 0));
            if p.restarts > restarts {
                return HealthVerdict::Rollback(format!(
                    "process {} restarted {} time(s) during the trial",
                    p.name, p.restarts
                ));
            }
            if p.over_budget > over {
                return HealthVerdict::Rollback(format!(
                    "process {} went over its timing budget ({} report(s) during the trial)",
                    p.name,
                    p.over_budget - over
                ));
            }
        }
        if let Some(p) = procs.iter().find(|p| !p.ready) {
            self.healthy_since = None;
            if elapsed >= self.window {
                return HealthVerdict::Rollback(format!(
                    "process {} not ready {:?} into the trial",
                    p.name, self.window
                ));
            }
            return HealthVerdict::Wait;
        }
        let since = *self.healthy_since.get_or_insert(elapsed);
        if elapsed.saturating_sub(since) >= self.window {
            HealthVerdict::Commit
        } else {
            HealthVerdict::Wait
        }
    }
}

/// How a watched trial ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrialOutcome {
    Committed(String),
    RolledBack { rollback: Rollback, reason: String },
}

/// Watches the trial in `state.json` until it commits or rolls back:
/// every `interval` it asks `probe` for the processes' health and applies
/// [`TrialHealth`]'s verdict with [`commit`] or [`rollback`].
pub fn watch_trial(
    prefix: &Path,
    window: Duration,
    keep: u32,
    interval: Duration,
    mut probe: impl FnMut() -> Vec<ProcessHealth>,
) -> Result<TrialOutcome, ReleaseError> {
    let mut health = TrialHealth::new(window);
    let start = Instant::now();
    loop {
        match health.observe(start.elapsed(), &probe()) {
            HealthVerdict::Wait => std::thread::sleep(interval),
            HealthVerdict::Commit => return commit(prefix, keep).map(TrialOutcome::Committed),
            HealthVerdict::Rollback(reason) => {
                return rollback(prefix)
                    .map(|rollback| TrialOutcome::RolledBack { rollback, reason })
            }
        }
    }
}

// ---------------------------------------------------------------- listing, pruning

/// One release on the robot.
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseInfo {
    pub name: String,
    pub version: Option<String>,
    pub files: usize,
    pub bytes: u64,
    pub current: bool,
    pub previous: bool,
    pub trial: bool,
    pub committed: bool,
}

/// Every release, newest first, with the state.
#[derive(Debug, Clone, Serialize)]
pub struct ReleasesInfo {
    pub current: Option<String>,
    pub previous: Option<String>,
    pub state: Option<ReleaseState>,
    pub releases: Vec<ReleaseInfo>,
}

fn release_dirs(layout: &Layout) -> Vec<(String, SystemTime)> {
    let mut v: Vec<(String, SystemTime)> = fs::read_dir(layout.releases())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let t = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(UNIX_EPOCH);
            (e.file_name().to_string_lossy().into_owned(), t)
        })
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    v
}

/// Lists the releases: which is current, previous, on trial, committed.
pub fn list(prefix: &Path) -> Result<ReleasesInfo, ReleaseError> {
    let layout = Layout::new(prefix);
    let state = read_state(prefix)?;
    let current = link_target(&layout.current());
    let previous = link_target(&layout.previous());
    let releases = release_dirs(&layout)
        .into_iter()
        .map(|(name, _)| {
            let m = fs::read(layout.release(&name).join(MANIFEST_NAME))
                .ok()
                .and_then(|b| Manifest::parse(&b).ok());
            ReleaseInfo {
                version: m.as_ref().map(|m| m.version.clone()),
                files: m.as_ref().map_or(0, |m| m.files.len()),
                bytes: m.as_ref().map_or(0, |m| m.total_size()),
                current: current.as_deref() == Some(&name),
                previous: previous.as_deref() == Some(&name),
                trial: matches!(&state, Some(ReleaseState::Trial { release, .. }) if *release == name),
                committed: matches!(&state, Some(ReleaseState::Committed { release }) if *release == name),
                name,
            }
        })
        .collect();
    Ok(ReleasesInfo {
        current,
        previous,
        state,
        releases,
    })
}

/// Keeps the newest `keep` releases (never removing current, previous, or
/// the release a trial would go back to), then removes store blobs no kept
/// release uses. Returns (releases removed, blobs removed).
pub fn prune(prefix: &Path, keep: u32) -> Result<(Vec<String>, usize), ReleaseError> {
    let layout = Layout::new(prefix);
    let mut pinned: BTreeSet<String> = [
        link_target(&layout.current()),
        link_target(&layout.previous()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(ReleaseState::Trial {
        release,
        previous,
        previous_link,
        ..
    }) = read_state(prefix)?
    {
        pinned.extend(
            [Some(release), Some(previous), previous_link]
                .into_iter()
                .flatten(),
        );
    }
    let all = release_dirs(&layout);
    let mut kept: Vec<String> = all
        .iter()
        .filter(|(n, _)| pinned.contains(n))
        .map(|(n, _)| n.clone())
        .collect();
    let mut removed = Vec::new();
    for (n, _) in &all {
        if pinned.contains(n) {
            continue;
        }
        if (kept.len() as u32) < keep.max(1) {
            kept.push(n.clone());
        } else {
            let p = layout.release(n);
            // Renamed away first so a half-removed release never looks whole.
            let doomed = layout.releases().join(format!(".tmp-rm-{n}"));
            fs::rename(&p, &doomed).map_err(ioe(&p))?;
            fs::remove_dir_all(&doomed).map_err(ioe(&doomed))?;
            removed.push(n.clone());
        }
    }
    if !removed.is_empty() {
        sync_dir(&layout.releases()).map_err(ioe(&layout.releases()))?;
    }
    let mut used = BTreeSet::new();
    for n in &kept {
        let Ok(b) = fs::read(layout.release(n).join(MANIFEST_NAME)) else {
            continue;
        };
        let Ok(m) = Manifest::parse(&b) else { continue };
        used.extend(m.blobs().into_iter().map(|(s, _)| s));
    }
    let (blobs, _) = layout.store().gc(&used)?;
    Ok((removed, blobs))
}

// ---------------------------------------------------------------- serve-update

/// The robot's side of `deploy update` (see [`image::bundle::wire`]):
/// verifies the manifest, asks only for the blobs (and blob tails) it
/// lacks, receives them into the store, then installs. An error is also
/// sent to the peer as an ERROR frame.
pub fn serve_update(
    prefix: &Path,
    opts: &InstallOptions,
    r: impl Read,
    w: impl Write,
) -> Result<Option<InstallReport>, ReleaseError> {
    let mut r = io::BufReader::new(r);
    let mut w = io::BufWriter::new(w);
    let result = serve_inner(prefix, opts, &mut r, &mut w);
    if let Err(e) = &result {
        let _ = wire::write_frame(&mut w, kind::ERROR, e.to_string().as_bytes());
        let _ = w.flush();
    }
    result
}

fn proto(why: impl Into<String>) -> ReleaseError {
    ReleaseError::Protocol(why.into())
}

/// A frame over its kind's limit, or of no known kind, is the sender
/// breaking the protocol; any other read or write error is the connection.
fn net(e: io::Error) -> ReleaseError {
    if e.kind() == io::ErrorKind::InvalidData {
        ReleaseError::Protocol(e.to_string())
    } else {
        ReleaseError::Connection(e)
    }
}

fn serve_inner(
    prefix: &Path,
    opts: &InstallOptions,
    r: &mut impl Read,
    w: &mut impl Write,
) -> Result<Option<InstallReport>, ReleaseError> {
    let layout = Layout::new(prefix);
    let store = layout.store();
    let frame = |r: &mut dyn Read| -> Result<Option<(u8, Vec<u8>)>, ReleaseError> {
        let mut r = r;
        wire::read_frame(&mut r).map_err(net)
    };
    match frame(r)? {
        Some((kind::HELLO, p)) if p == wire::PROTOCOL.as_bytes() => {}
        Some((kind::HELLO, p)) => {
            return Err(proto(format!(
                "the sender speaks {} (expected `{}`)",
                quoted_bytes(&p),
                wire::PROTOCOL
            )))
        }
        None => return Ok(None),
        Some((k, _)) => return Err(proto(format!("expected HELLO, got frame kind {k}"))),
    }
    wire::write_frame(w, kind::HELLO, wire::PROTOCOL.as_bytes()).map_err(net)?;
    w.flush().map_err(net)?;
    let p = match frame(r)? {
        Some((kind::MANIFEST, p)) => p,
        Some((k, _)) => return Err(proto(format!("expected MANIFEST, got frame kind {k}"))),
        None => return Err(proto("the sender closed the connection before MANIFEST")),
    };
    let (bytes, sig) =
        wire::decode_manifest(&p).ok_or_else(|| proto("malformed MANIFEST frame"))?;
    let trusted = load_trusted_keys(&layout.keys(), &opts.public_keys)?;
    let verified = VerifiedManifest::verify(bytes, &sig, &trusted, &opts.compat)?;
    check_robot_yaml(&verified, opts)?;
    let sizes: BTreeMap<Sha256Hex, u64> = verified.manifest.blobs().into_iter().collect();
    let modes: BTreeMap<String, u32> = verified
        .manifest
        .files
        .iter()
        .rev()
        .map(|f| (f.sha256.clone(), f.mode))
        .collect();
    // Partials of other releases, or longer than their blob, go before
    // anything is asked for.
    store.trim_partials(&sizes)?;
    let mut need = Vec::new();
    for (s, &size) in &sizes {
        if store.has(s) {
            continue;
        }
        let prefix = store.partial_prefix(s, size)?;
        need.push(Needed {
            sha256: s.to_string(),
            offset: prefix.as_ref().map_or(0, |(len, _)| *len),
            size,
            prefix_sha256: prefix.map(|(_, h)| h.to_string()),
        });
    }
    let need = Need {
        release: verified.release.clone(),
        need,
    };
    wire::write_frame(
        w,
        kind::NEED,
        &serde_json::to_vec(&need).expect("serializes"),
    )
    .map_err(net)?;
    w.flush().map_err(net)?;
    let mut receiving: Option<image::bundle::Receiver> = None;
    let received = receive_blobs(r, &store, &sizes, &modes, &mut receiving);
    if let Some(rx) = receiving.take() {
        // Cut or refused in the middle of a blob: what arrived is kept
        // for a resume (never more than the blob's size).
        let _ = rx.suspend();
    }
    let new_blobs = received?;
    let lock = UpdateLock::acquire(prefix, &opts.holder, opts.lock_timeout)?;
    fault_point("locked");
    let mut report = install_from_store(&layout, &verified, opts, &lock)?;
    report.new_blobs = new_blobs;
    wire::write_frame(
        w,
        kind::DONE,
        &serde_json::to_vec(&report).expect("serializes"),
    )
    .map_err(net)?;
    w.flush().map_err(net)?;
    Ok(Some(report))
}

/// Receives blobs until INSTALL; returns how many arrived whole. The blob
/// being received when it returns is left in `receiving`.
fn receive_blobs(
    r: &mut impl Read,
    store: &Store,
    sizes: &BTreeMap<Sha256Hex, u64>,
    modes: &BTreeMap<String, u32>,
    receiving: &mut Option<image::bundle::Receiver>,
) -> Result<usize, ReleaseError> {
    let mut new_blobs = 0;
    let mut current: Option<Sha256Hex> = None;
    loop {
        match wire::read_frame(r).map_err(net)? {
            Some((kind::BLOB_START, p)) => {
                let s: BlobStart = serde_json::from_slice(&p)
                    .map_err(|e| proto(format!("bad BLOB_START: {}", quoted(&e.to_string()))))?;
                let sha = Sha256Hex::parse(&s.sha256)
                    .filter(|sha| sizes.contains_key(sha))
                    .ok_or_else(|| {
                        proto(format!("blob {} is not in the manifest", quoted(&s.sha256)))
                    })?;
                if let Some(rx) = receiving.take() {
                    let _ = rx.suspend();
                }
                *receiving = Some(store.receive(&sha, s.offset, sizes[&sha])?);
                current = Some(sha);
            }
            Some((kind::BLOB_DATA, p)) => {
                let rx = receiving
                    .as_mut()
                    .ok_or_else(|| proto("BLOB_DATA outside a blob"))?;
                rx.write_compressed(&p)?;
            }
            Some((kind::BLOB_END, _)) => {
                let rx = receiving
                    .take()
                    .ok_or_else(|| proto("BLOB_END outside a blob"))?;
                let sha = current.take().expect("set with the receiver");
                rx.finish(modes[sha.as_str()])?;
                new_blobs += 1;
            }
            Some((kind::INSTALL, _)) => return Ok(new_blobs),
            Some((k, _)) => return Err(proto(format!("unexpected frame kind {k}"))),
            None => {
                return Err(ReleaseError::Connection(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the sender closed the connection before INSTALL",
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, running: bool, ready: bool, over_budget: u64, restarts: u32) -> ProcessHealth {
        ProcessHealth {
            name: name.into(),
            running,
            ready,
            over_budget,
            restarts,
        }
    }
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn health_commits_after_a_full_healthy_window() {
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(3), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(12), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(13), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Commit
        );
    }

    #[test]
    fn health_rolls_back_on_crash_restart_budget_or_never_ready() {
        let mut h = TrialHealth::new(S(10));
        assert!(
            matches!(h.observe(S(1), &[p("a", false, false, 0, 0)]), HealthVerdict::Rollback(r) if r.contains("a is not running"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 0, 2)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(1), &[p("a", true, true, 0, 3)]), HealthVerdict::Rollback(r) if r.contains("restarted"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 4, 0)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(1), &[p("a", true, true, 5, 0)]), HealthVerdict::Rollback(r) if r.contains("budget"))
        );
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(9), &[p("a", true, true, 0, 0), p("b", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert!(
            matches!(h.observe(S(10), &[p("a", true, true, 0, 0), p("b", true, false, 0, 0)]), HealthVerdict::Rollback(r) if r.contains("b not ready"))
        );
    }

    #[test]
    fn health_streak_restarts_when_a_process_stops_being_ready() {
        let mut h = TrialHealth::new(S(10));
        assert_eq!(
            h.observe(S(0), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(5), &[p("a", true, false, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(6), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(15), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Wait
        );
        assert_eq!(
            h.observe(S(16), &[p("a", true, true, 0, 0)]),
            HealthVerdict::Commit
        );
    }

    #[test]
    fn lock_holder_is_named() {
        assert_eq!(describe_holder("pid=12 name=imu_ctl\n"), "pid 12 (imu_ctl)");
        assert_eq!(describe_holder(""), "a process that did not say who it is");
    }
}
