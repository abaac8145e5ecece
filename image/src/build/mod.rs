//! `build`: base + release + boot configuration -> one image file, written
//! under a temporary name and renamed into place only when complete.

mod checks;
mod feed;
mod output;
mod tree;

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use cpusets::board::BootLoader;
use cpusets::cmdline::{render, Token};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::base::{self, Base};
use crate::entry::{disk_data, Data, Entry, Kind};
use crate::error::ImageBuildError;
use crate::extlinux;
use crate::manifest::Manifest;
use crate::release;
use crate::sbom;
use crate::write::{cpio::CpioSink, ext4, tar::TarSink, zst::ZstdFile, CountingWriter, Format};

use checks::{check_output_outside_inputs, check_programs, cpio_holes_warning};
use feed::write_all;
pub use output::{debug_sidecar, sidecars, write_debug_dir};
use output::{persist, umask, write_temp};
use tree::{dir_base_digest, files_with_xattrs, place};

/// Where rtdeploy puts things in the image (DESIGN.md, "On the robot");
/// rtdeploy's own directories as the robot's release store lays them out
/// ([`releases::layout::rel`]), the system's here.
pub mod paths {
    use releases::layout::rel;

    pub const EXTLINUX: &str = "boot/extlinux/extlinux.conf";
    pub const CMDLINE: &str = rel::CMDLINE;
    pub const ROBOT_YAML: &str = rel::CONFIG;
    pub const RELEASES: &str = rel::RELEASES;
    pub const CURRENT: &str = rel::CURRENT;
    /// What the robot.yaml link points at: the current release's, from
    /// the image's root.
    pub const CURRENT_ROBOT_YAML: &str = rel::CURRENT_CONFIG;
    pub const DEPLOY: &str = "usr/bin/deploy";
    pub const UNIT_DIR: &str = "etc/systemd/system";
    pub const WANTS: &str = "etc/systemd/system/multi-user.target.wants";
    pub const SYSCTL: &str = "etc/sysctl.d/90-rtdeploy.conf";
    pub const LIMITS: &str = "etc/security/limits.d/90-rtdeploy.conf";
}

/// Everything an image is made from. Text inputs (unit, sysctl, limits)
/// are rendered by their owners; this crate only places them.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub base: Base,
    /// The release directory: the release's files (`bin/...`).
    pub release: PathBuf,
    /// The `deploy` binary built for the board.
    pub deploy_binary: PathBuf,
    /// rtdeploy's other programs the robot runs (the Zenoh bridge): each
    /// its path in the image (no leading `/`, e.g.
    /// `usr/bin/rtdeploy-bridge`) and the binary built for the board.
    /// They go in as `deploy` does: checked against the board, stripped,
    /// named in the SBOM.
    pub tools: Vec<(String, PathBuf)>,
    /// robot.yaml as the user wrote it.
    pub robot_yaml: String,
    pub robot_name: String,
    /// The release version (`<version>-<sha8>` names the release).
    pub version: String,
    /// rtdeploy's own version, for the SBOM.
    pub rtdeploy_version: String,
    /// Clamp for every mtime; `None`: the newest mtime in the release.
    pub source_date_epoch: Option<u64>,
    /// The planned kernel command line.
    pub cmdline: Vec<Token>,
    pub boot: BootLoader,
    /// The supervisor's systemd unit: file name (`rtdeploy.service`) and text.
    pub unit: Option<(String, String)>,
    /// `/etc/sysctl.d/90-rtdeploy.conf`.
    pub sysctl: String,
    /// `/etc/security/limits.d/90-rtdeploy.conf`.
    pub limits: String,
    /// Further files rendered by their owners: path in the image (no
    /// leading `/`), contents, mode (e.g. the Mender update module).
    pub extra_files: Vec<(String, Vec<u8>, u32)>,
    /// The programs robot.yaml names (`processes[].exec`); relative ones
    /// must be in the release.
    pub programs: Vec<String>,
    /// `board.model`, and the board's architecture (`aarch64`, `x86_64`;
    /// `None` for a generic board: the base's is taken): every program
    /// the image carries must be built for it.
    pub board: String,
    pub arch: Option<String>,
    /// Put the deploy binary and the release's ELF files in stripped of
    /// their debug information, which goes into `<out>.debug/` (the
    /// files as given, for symbolising a crash on the build host).
    pub strip: bool,
    /// ext4 size in bytes; `None`: content plus headroom.
    pub size: Option<u64>,
    /// Replace an existing output.
    pub force: bool,
    /// fsync the image and its sidecars before renaming them into place,
    /// so a power cut right after the build cannot leave a renamed but
    /// unwritten file. Off by default: a build host can rebuild, and the
    /// flush costs as much as the build itself on a slow disk.
    pub sync: bool,
}

/// What `build` is doing, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Reading (and decompressing) a tar base; `total` is its file size.
    ReadBase,
    /// Writing entries; `total` is the bytes of file data to write.
    Write,
    /// mke2fs / debugfs running (no byte count).
    MakeFs,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Progress {
    pub phase: Phase,
    pub done: u64,
    pub total: u64,
}

/// What was written.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub out: PathBuf,
    pub format: Format,
    pub bytes: u64,
    /// sha256 of the image manifest (the sidecar): every entry's path,
    /// metadata and content digest, so equal digests mean equal trees.
    /// (The image file itself is not hashed while written: that would
    /// cost a third of the build; `sha256sum` it when needed.)
    pub manifest_sha256: String,
    pub entries: usize,
    pub data_bytes: u64,
    pub source_date_epoch: u64,
    /// `/opt/rtdeploy/releases/<version>-<sha8>`.
    pub release_dir: String,
    pub release_manifest_sha256: String,
    /// The sha256 the SBOM names for the base (file digest of a tar base,
    /// digest of the base's manifest for a directory base).
    pub base_sha256: Option<String>,
    /// The APPEND line written (extlinux boards with an extlinux.conf).
    pub append: Option<String>,
    pub cmdline: String,
    pub manifest: PathBuf,
    pub sbom: PathBuf,
    /// `<out>.debug`, with the debug information of the stripped
    /// programs, by their path in the image plus `.debug`; `None` when
    /// nothing was stripped.
    pub debug: Option<PathBuf>,
    /// How many bytes stripping saved.
    pub stripped_bytes: u64,
    pub warnings: Vec<String>,
}

/// A 16-byte UUID-formatted value derived from `label` and the inputs.
fn derived_uuid(label: &str, seed: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(label.as_bytes());
    h.update(seed);
    sbom::uuid_from(&hex::encode(h.finalize()))
}

/// Builds the image described by `spec` at `out` in `format`.
pub fn build(
    spec: &ImageSpec,
    out: &Path,
    format: Format,
    progress: &mut dyn FnMut(Progress),
) -> Result<Summary, ImageBuildError> {
    let (manifest_path, sbom_path) = sidecars(out);
    let out_dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let out_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // First: --force cannot help with this one.
    check_output_outside_inputs(spec, out, &out_dir)?;
    let debug_dir = debug_sidecar(out);
    if !spec.force {
        for p in [out, &manifest_path, &sbom_path, &debug_dir] {
            if fs::symlink_metadata(p).is_ok() {
                return Err(ImageBuildError::OutputExists {
                    path: p.to_path_buf(),
                });
            }
        }
    }

    // The release: checked first, it is small and names the image.
    let rel = release::read(&spec.release, &spec.programs, spec.strip)?;
    for reserved in ["robot.yaml", "manifest.json"] {
        if rel.files.iter().any(|f| f.rel == reserved) {
            return Err(ImageBuildError::Conflict {
                path: spec.release.join(reserved).display().to_string(),
                reason: format!(
                    "the release directory must not hold {reserved} (rtdeploy writes it)"
                ),
            });
        }
    }
    let own: Vec<(&str, &Path)> = std::iter::once((paths::DEPLOY, spec.deploy_binary.as_path()))
        .chain(
            spec.tools
                .iter()
                .map(|(p, src)| (p.as_str(), src.as_path())),
        )
        .collect();
    for (i, (path, _)) in own.iter().enumerate() {
        if own[..i].iter().any(|(p, _)| p == path)
            || path.starts_with('/')
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(ImageBuildError::Conflict {
                path: (*path).into(),
                reason: "rtdeploy's programs go to distinct relative paths of the image".into(),
            });
        }
    }
    let mut own_md = Vec::with_capacity(own.len());
    for (path, src) in &own {
        let md = fs::metadata(src).map_err(ImageBuildError::io("read the program", *src))?;
        if !md.is_file() {
            return Err(ImageBuildError::Conflict {
                path: src.display().to_string(),
                reason: format!("the program for /{path} is not a regular file"),
            });
        }
        own_md.push(md);
    }
    let epoch = spec.source_date_epoch.unwrap_or(rel.newest_mtime);
    let rmanifest = rel.manifest(
        &spec.robot_name,
        &spec.version,
        epoch,
        spec.robot_yaml.as_bytes(),
    );
    let rmanifest_bytes = rmanifest.to_bytes();
    let rmanifest_sha = hex::encode(Sha256::digest(&rmanifest_bytes));
    let release_name = releases::release_name(&spec.version, &rmanifest_bytes);
    let release_dir = format!("{}/{release_name}", paths::RELEASES);

    // The base.
    let base_total = match &spec.base {
        Base::Tar(p) => fs::metadata(p).map(|m| m.len()).unwrap_or(0),
        _ => 0,
    };
    let loaded = base::load(&spec.base, &out_dir, &mut |done| {
        progress(Progress {
            phase: Phase::ReadBase,
            done,
            total: base_total,
        })
    })?;
    let mut tree = loaded.tree;
    let base_keys: Vec<String> = match spec.base {
        Base::Dir(_) => tree.entries.keys().cloned().collect(),
        _ => Vec::new(),
    };
    // Base entries rtdeploy replaces, as they were (for the base digest).
    let mut replaced: HashMap<String, Entry> = HashMap::new();
    match &spec.base {
        Base::Dir(p) | Base::Tar(p) => base::check_rootfs(p, &tree)?,
        Base::None => {}
    }
    let mut warnings = Vec::new();

    // Boot configuration.
    let cmdline = render(&spec.cmdline);
    let mut append = None;
    if spec.boot == BootLoader::Extlinux {
        match tree.entries.get(paths::EXTLINUX) {
            Some(Entry {
                kind: Kind::File { size, data, .. },
                ..
            }) => {
                // At most one byte past the limit: lint refuses a longer file.
                let limit = extlinux::MAX_FILE_BYTES as u64 + 1;
                let source = tree.source_of(paths::EXTLINUX, data);
                let text = tree
                    .open(paths::EXTLINUX, *size, data)
                    .and_then(|r| {
                        units::bounded::read_at_most(&mut r.take(limit), &source, limit)
                            .map_err(units::bounded::FileReadError::into_io)
                    })
                    .and_then(|b| {
                        String::from_utf8(b).map_err(|e| {
                            units::bounded::FileReadError::NotText {
                                path: source.clone(),
                                at: e.utf8_error().valid_up_to(),
                            }
                            .into_io()
                        })
                    })
                    .map_err(ImageBuildError::io("read", &source))?;
                let merged = extlinux::merge_conf(&text, &spec.cmdline).map_err(|problems| ImageBuildError::Extlinux {
                    path: format!("/{}", paths::EXTLINUX),
                    problems,
                })?;
                append = Some(merged.append.clone());
                let old = tree.entries.get(paths::EXTLINUX).cloned().expect("present");
                let mut new = Entry::bytes(merged.text.into_bytes(), old.mode, epoch);
                (new.uid, new.gid) = (old.uid, old.gid);
                tree.entries.insert(paths::EXTLINUX.to_string(), new);
                replaced.insert(paths::EXTLINUX.to_string(), old);
            }
            Some(e) => {
                return Err(ImageBuildError::Conflict {
                    path: format!("/{}", paths::EXTLINUX),
                    reason: format!("is a {} in the base, not a regular file", e.kind.name()),
                })
            }
            None => warnings.push(format!(
                "the board boots with extlinux but the base has no /{}; the command line is only in /{}",
                paths::EXTLINUX,
                paths::CMDLINE
            )),
        }
    }

    // What rtdeploy adds.
    let mut add: Vec<(String, Entry)> = Vec::new();
    add.push((
        paths::CMDLINE.into(),
        Entry::bytes(format!("{cmdline}\n").into_bytes(), 0o644, epoch),
    ));
    // The programs go in stripped; their debug information goes beside
    // the image, by their path in it.
    let mut debug: Vec<(String, PathBuf)> = rel
        .debug
        .iter()
        .map(|(r, src)| (format!("{release_dir}/{r}"), src.clone()))
        .collect();
    for ((path, src), md) in own.iter().zip(&own_md) {
        let stripped = if spec.strip {
            // The debug link names the file as installed (`deploy.debug`),
            // whatever the binary given was called.
            let name = path.rsplit('/').next().unwrap_or(path);
            release::stripped(src, true, &format!("{name}.debug"))?
        } else {
            None
        };
        let (size, data) = match stripped {
            Some(b) => {
                debug.push((path.to_string(), src.to_path_buf()));
                (b.len() as u64, Data::Bytes(std::sync::Arc::new(b)))
            }
            None => (
                md.len(),
                disk_data(src, md).map_err(ImageBuildError::io("find the holes of", *src))?,
            ),
        };
        add.push((
            path.to_string(),
            Entry {
                kind: Kind::File {
                    size,
                    data,
                    link_group: None,
                },
                mode: 0o755,
                uid: 0,
                gid: 0,
                mtime: epoch,
                xattrs: Vec::new(),
            },
        ));
    }
    if let Some((name, text)) = &spec.unit {
        let unit = format!("{}/{name}", paths::UNIT_DIR);
        add.push((
            unit.clone(),
            Entry::bytes(text.clone().into_bytes(), 0o644, epoch),
        ));
        add.push((
            format!("{}/{name}", paths::WANTS),
            Entry::symlink(&format!("/{unit}"), epoch),
        ));
    }
    add.push((
        paths::SYSCTL.into(),
        Entry::bytes(spec.sysctl.clone().into_bytes(), 0o644, epoch),
    ));
    add.push((
        paths::LIMITS.into(),
        Entry::bytes(spec.limits.clone().into_bytes(), 0o644, epoch),
    ));
    for (path, bytes, mode) in &spec.extra_files {
        add.push((path.clone(), Entry::bytes(bytes.clone(), *mode, epoch)));
    }
    add.push((release_dir.clone(), Entry::dir(0o755, epoch)));
    for f in &rel.files {
        let mut e = f.entry.clone();
        e.mtime = epoch;
        if let Kind::File { data, .. } = &mut e.kind {
            if let Data::Disk(p) = data {
                let md = fs::metadata(&*p).map_err(ImageBuildError::io("stat", &*p))?;
                *data = disk_data(p, &md).map_err(ImageBuildError::io("find the holes of", &*p))?;
            }
        }
        add.push((format!("{release_dir}/{}", f.rel), e));
    }
    add.push((
        format!("{release_dir}/robot.yaml"),
        Entry::bytes(spec.robot_yaml.clone().into_bytes(), 0o644, epoch),
    ));
    add.push((
        format!("{release_dir}/manifest.json"),
        Entry::bytes(rmanifest_bytes, 0o644, epoch),
    ));
    add.push((
        paths::CURRENT.into(),
        Entry::symlink(&releases::Layout::release_link(&release_name), epoch),
    ));
    add.push((
        paths::ROBOT_YAML.into(),
        Entry::symlink(&format!("/{}", paths::CURRENT_ROBOT_YAML), epoch),
    ));
    tree.entries
        .entry(String::new())
        .or_insert_with(|| Entry::dir(0o755, epoch));
    for (path, entry) in add {
        place(&mut tree, &mut replaced, &path, entry, epoch)?;
    }
    warnings.extend(check_programs(spec, &tree, &release_dir)?);
    let stripped_bytes: u64 = debug
        .iter()
        .filter_map(|(p, src)| {
            let before = fs::metadata(src).ok()?.len();
            match &tree.entries.get(p)?.kind {
                Kind::File { size, .. } => Some(before.saturating_sub(*size)),
                _ => None,
            }
        })
        .sum();

    // Reproducibility: no time after the epoch.
    for e in tree.entries.values_mut() {
        e.mtime = e.mtime.min(epoch);
    }
    let cannot: Vec<String> = tree
        .entries
        .iter()
        .filter(|(_, e)| !format.can_hold(&e.kind))
        .map(|(p, e)| format!("{} /{p}", e.kind.name()))
        .collect();
    if !cannot.is_empty() {
        return Err(ImageBuildError::Unrepresentable {
            format: format.name(),
            what: cannot,
        });
    }
    if format == Format::CpioGz {
        warnings.extend(cpio_holes_warning(&tree));
        // The initramfs format has no extended attributes.
        let dropped: Vec<String> = tree
            .entries
            .iter()
            .filter(|(_, e)| !e.xattrs.is_empty())
            .map(|(p, e)| {
                let names: Vec<&str> = e.xattrs.iter().map(|(n, _)| n.as_str()).collect();
                format!("/{p} ({})", names.join(", "))
            })
            .collect();
        if !dropped.is_empty() {
            let n = dropped.len();
            let shown: Vec<String> = dropped.into_iter().take(8).collect();
            warnings.push(format!(
                "cpio.gz cannot hold extended attributes: {n} entries lose theirs ({}{}); a file capability such as ping's is gone on the robot (use tar, tar.zst or ext4 to keep them)",
                shown.join("; "),
                if n > shown.len() { "; ..." } else { "" }
            ));
        }
    }
    if format == Format::Ext4 {
        let mut bad: Vec<String> = tree
            .entries
            .keys()
            .filter(|p| !ext4::debugfs_safe(p))
            .map(|p| format!("name /{p}"))
            .collect();
        bad.extend(tree.entries.iter().flat_map(|(p, e)| {
            e.xattrs
                .iter()
                .filter(|(n, _)| !ext4::xattr_name_safe(n))
                .map(move |(n, _)| format!("extended attribute `{}` of /{p}", n.escape_debug()))
        }));
        if !bad.is_empty() {
            return Err(ImageBuildError::Unrepresentable {
                format: "ext4",
                what: bad,
            });
        }
    }

    // Write.
    let total = tree.data_bytes();
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{out_name}."))
        .suffix(".tmp")
        .tempfile_in(&out_dir)
        .map_err(ImageBuildError::io("create a temporary file in", &out_dir))?;
    let mut files = Vec::with_capacity(tree.entries.len());
    let bytes = match format {
        Format::TarZst => {
            let file = tmp
                .as_file()
                .try_clone()
                .map_err(ImageBuildError::io("write", tmp.path()))?;
            // Multi-threaded zstd output does not depend on the worker
            // count (any count >= 1), so the bytes are the same on every
            // build host.
            let workers = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            let zst = ZstdFile::new(file, 3, workers)
                .map_err(ImageBuildError::io("start zstd for", tmp.path()))?;
            // Headers and small files reach zstd in 64 KiB pieces (each
            // call into it takes a lock); larger file data goes to it
            // straight from the read-ahead buffers.
            let mut sink = TarSink::new(BufWriter::with_capacity(64 << 10, zst));
            write_all(&tree, &mut sink, &mut files, total, progress)?;
            sink.finish()
                .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
                .and_then(ZstdFile::finish)
                .map_err(ImageBuildError::io("write", tmp.path()))?
        }
        Format::Tar | Format::CpioGz => {
            let file = tmp
                .as_file()
                .try_clone()
                .map_err(ImageBuildError::io("write", tmp.path()))?;
            let hw = CountingWriter::new(BufWriter::with_capacity(1 << 20, file));
            let hw = match format {
                Format::Tar => {
                    let mut sink = TarSink::new(hw);
                    write_all(&tree, &mut sink, &mut files, total, progress)?;
                    sink.finish()
                }
                _ => {
                    let gz = flate2::GzBuilder::new()
                        .mtime(0)
                        .write(hw, flate2::Compression::default());
                    let mut sink = CpioSink::new(gz);
                    write_all(&tree, &mut sink, &mut files, total, progress)?;
                    sink.finish().and_then(|g| g.finish())
                }
            }
            .map_err(ImageBuildError::io("write", tmp.path()))?;
            let mut hw = hw;
            hw.flush()
                .map_err(ImageBuildError::io("write", tmp.path()))?;
            hw.count
        }
        Format::Ext4 => {
            let work = tempfile::Builder::new()
                .prefix(&format!(".{out_name}.staging."))
                .tempdir_in(&out_dir)
                .map_err(ImageBuildError::io(
                    "create a staging directory in",
                    &out_dir,
                ))?;
            let staging = work.path().join("root");
            fs::create_dir(&staging).map_err(ImageBuildError::io("create", &staging))?;
            let mut sink = ext4::StagingSink::new(staging.clone());
            write_all(&tree, &mut sink, &mut files, total, progress)?;
            sink.finish()
                .map_err(ImageBuildError::io("set metadata in", &staging))?;
            // Holes take no blocks: mke2fs keeps those of the staged files.
            let needed = tree.stored_bytes() + tree.entries.len() as u64 * 4096;
            let size = match spec.size {
                Some(s) => {
                    if s < needed {
                        return Err(ImageBuildError::TooSmall { size: s, needed });
                    }
                    s
                }
                None => (needed + needed / 5 + (96 << 20)).div_ceil(1 << 20) << 20,
            };
            tmp.as_file()
                .set_len(size)
                .map_err(ImageBuildError::io("size", tmp.path()))?;
            progress(Progress {
                phase: Phase::MakeFs,
                done: 0,
                total: 0,
            });
            let mut seed = rmanifest_sha.clone().into_bytes();
            seed.extend_from_slice(spec.robot_name.as_bytes());
            ext4::make_fs(&ext4::Ext4Params {
                staging: &staging,
                out: tmp.path(),
                size,
                uuid: derived_uuid("rtdeploy ext4 uuid", &seed),
                hash_seed: derived_uuid("rtdeploy ext4 hash seed", &seed),
                epoch,
                entries: tree
                    .entries
                    .iter()
                    .map(|(p, e)| (p.clone(), e.mode, e.uid, e.gid))
                    .collect(),
                xattrs: files_with_xattrs(&tree),
                deferred_nodes: std::mem::take(&mut sink.deferred_nodes),
                work_dir: work.path(),
            })?;
            size
        }
    };
    if spec.sync {
        tmp.as_file()
            .sync_all()
            .map_err(ImageBuildError::io("sync", tmp.path()))?;
    }

    // Digest of a directory base: its manifest, as listed while written.
    let base_sha256 = match &spec.base {
        Base::Tar(_) => loaded.file_sha256.clone(),
        Base::None => None,
        Base::Dir(_) => Some(dir_base_digest(&tree, &base_keys, &replaced, &files)?),
    };

    let image_manifest = Manifest {
        schema_version: 1,
        kind: "image",
        robot: spec.robot_name.clone(),
        version: spec.version.clone(),
        source_date_epoch: epoch,
        files: files.iter().map(|(_, f)| f.clone()).collect(),
    };
    let manifest_bytes = image_manifest.to_bytes();
    let manifest_sha256 = hex::encode(Sha256::digest(&manifest_bytes));
    let deploy_sha = files
        .iter()
        .find(|(p, _)| p == paths::DEPLOY)
        .and_then(|(_, f)| f.sha256.clone())
        .unwrap_or_default();
    let controllers = spec
        .programs
        .iter()
        .filter_map(|p| releases::programs::in_release(p))
        .filter_map(|rel_path| {
            let rel_path = rel_path.as_str();
            let path = format!("{release_dir}/{rel_path}");
            files
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, f)| sbom::Component {
                    name: rel_path.rsplit('/').next().unwrap_or(rel_path).to_string(),
                    version: Some(spec.version.clone()),
                    path: format!("/{path}"),
                    sha256: f.sha256.clone().unwrap_or_default(),
                })
        })
        .collect::<Vec<_>>();
    let mut controllers = controllers;
    controllers.sort_by(|a, b| a.path.cmp(&b.path));
    controllers.dedup_by(|a, b| a.path == b.path);
    let sbom_doc = sbom::render(&sbom::SbomInput {
        robot: &spec.robot_name,
        version: &spec.version,
        rtdeploy_version: &spec.rtdeploy_version,
        source_date_epoch: epoch,
        base_kind: match spec.base {
            Base::Dir(_) => "directory",
            Base::Tar(_) => "tar",
            Base::None => "none",
        },
        base_sha256: base_sha256.as_deref(),
        image_manifest_sha256: &manifest_sha256,
        deploy: sbom::Component {
            name: "deploy".into(),
            version: Some(spec.rtdeploy_version.clone()),
            path: format!("/{}", paths::DEPLOY),
            sha256: deploy_sha,
        },
        tools: spec
            .tools
            .iter()
            .map(|(path, _)| sbom::Component {
                name: path.rsplit('/').next().unwrap_or(path).to_string(),
                version: Some(spec.rtdeploy_version.clone()),
                path: format!("/{path}"),
                sha256: files
                    .iter()
                    .find(|(p, _)| p == path)
                    .and_then(|(_, f)| f.sha256.clone())
                    .unwrap_or_default(),
            })
            .collect(),
        controllers,
    });
    let mut sbom_bytes = serde_json::to_vec_pretty(&sbom_doc).expect("sbom serializes");
    sbom_bytes.push(b'\n');

    // Sidecars first, the image last: an image in place means it is whole.
    let debug_written = write_debug_dir(&debug_dir, &debug)?;
    let manifest_tmp = write_temp(&out_dir, &out_name, &manifest_bytes, spec.sync)?;
    let sbom_tmp = write_temp(&out_dir, &out_name, &sbom_bytes, spec.sync)?;
    persist(manifest_tmp, &manifest_path)?;
    persist(sbom_tmp, &sbom_path)?;
    // Readable like any file the user makes (the temporary name was 0600).
    let mode = 0o666 & !umask();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(mode),
    )
    .map_err(ImageBuildError::io("set the mode of", tmp.path()))?;
    persist(tmp, out)?;

    Ok(Summary {
        out: out.to_path_buf(),
        format,
        bytes,
        manifest_sha256,
        entries: tree.entries.len(),
        data_bytes: total,
        source_date_epoch: epoch,
        release_dir: format!("/{release_dir}"),
        release_manifest_sha256: rmanifest_sha,
        base_sha256,
        append,
        cmdline,
        manifest: manifest_path,
        sbom: sbom_path,
        debug: debug_written,
        stripped_bytes,
        warnings,
    })
}
