//! ext4 through e2fsprogs: the tree is laid out in a staging directory next
//! to the output, `mke2fs -d` copies it into a new filesystem, and
//! `debugfs` then sets what `mke2fs` takes from the staging files rather
//! than from the entries (ctime and atime always; owners and device nodes
//! when not run as root).
//!
//! Reproducibility: the filesystem UUID and directory hash seed are fixed
//! by the caller, `E2FSPROGS_FAKE_TIME` pins every time e2fsprogs would
//! take from the clock, `MKE2FS_CONFIG` points at our own feature list (not
//! the build host's `/etc/mke2fs.conf`), and `mke2fs -d` reads directories
//! in sorted order (e2fsprogs 1.47), so inode numbers follow path order.

use std::fs::{self, File};
use std::io::{self, BufRead, BufWriter, Write};
use std::os::unix::fs::{symlink, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{FileType, Mode, Timespec, Timestamps};

use crate::entry::Kind;
use crate::error::ImageBuildError;
use crate::write::{copy_segments, exact_copy, Item, Sink};

/// The mke2fs configuration used instead of the host's: ext4 features a
/// Jetson Linux 5.15 kernel and newer mount, and nothing that depends on
/// the host (no `orphan_file` default that varies between distributions).
pub const MKE2FS_CONF: &str = "[defaults]
\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
\tdefault_mntopts = acl,user_xattr
\tenable_periodic_fsck = 0
\tblocksize = 4096
\tinode_size = 256
\tinode_ratio = 16384
\treserved_ratio = 5.0
\tlazy_itable_init = false
\tlazy_journal_init = false

[fs_types]
\text4 = {
\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
\t}
";

/// Lays the tree out under a staging directory.
pub struct StagingSink {
    root: PathBuf,
    as_root: bool,
    /// Directories, to get their mode and mtime once their content is in.
    dirs: Vec<(PathBuf, u32, u64, u32, u32)>,
    /// Device nodes `mknod` could not create (not root): made by debugfs.
    pub deferred_nodes: Vec<(String, char, u32, u32)>,
}

impl StagingSink {
    pub fn new(root: PathBuf) -> Self {
        StagingSink {
            root,
            as_root: rustix::process::geteuid().is_root(),
            dirs: Vec::new(),
            deferred_nodes: Vec::new(),
        }
    }

    fn at(&self, path: &str) -> PathBuf {
        if path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
    }

    /// Sets directory modes, owners and mtimes, deepest first.
    pub fn finish(&mut self) -> io::Result<()> {
        for (p, mode, mtime, uid, gid) in self.dirs.iter().rev() {
            if self.as_root {
                std::os::unix::fs::lchown(p, Some(*uid), Some(*gid))?;
            }
            fs::set_permissions(p, fs::Permissions::from_mode(*mode))?;
            set_mtime(p, *mtime)?;
        }
        Ok(())
    }
}

fn set_mtime(p: &Path, mtime: u64) -> io::Result<()> {
    let t = Timespec {
        tv_sec: mtime as i64,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &Timestamps {
            last_access: t,
            last_modification: t,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?;
    Ok(())
}

impl Sink for StagingSink {
    fn put(&mut self, item: &Item, data: Option<&mut dyn BufRead>) -> io::Result<()> {
        let e = item.entry;
        let p = self.at(item.path);
        match (&e.kind, item.link_to) {
            (Kind::Dir, _) => {
                if !item.path.is_empty() {
                    fs::create_dir(&p)?;
                }
                // Writable while filling; the real mode is set in finish().
                fs::set_permissions(&p, fs::Permissions::from_mode(0o700))?;
                self.dirs.push((p, e.mode, e.mtime, e.uid, e.gid));
                return Ok(());
            }
            (Kind::File { .. }, Some(first)) => {
                fs::hard_link(self.at(first), &p)?;
                return Ok(());
            }
            (
                Kind::File {
                    size, data: source, ..
                },
                None,
            ) => {
                let data = data.ok_or_else(|| io::Error::other("regular file without data"))?;
                if let Some(map) = source.sparse_map() {
                    // Staged with the same holes, which `mke2fs -d` keeps
                    // (it finds them with SEEK_DATA/SEEK_HOLE).
                    let f = File::create(&p)?;
                    copy_segments(data, *size, map, &mut |offset, bytes| {
                        f.write_all_at(bytes, offset)
                    })?;
                    f.set_len(*size)?;
                } else {
                    let mut f = BufWriter::with_capacity(1 << 20, File::create(&p)?);
                    exact_copy(data, *size, &mut f)?;
                    f.flush()?;
                }
            }
            (Kind::Symlink(target), _) => symlink(target, &p)?,
            (Kind::Char { major, minor }, _) | (Kind::Block { major, minor }, _) => {
                let (ft, c) = if matches!(e.kind, Kind::Char { .. }) {
                    (FileType::CharacterDevice, 'c')
                } else {
                    (FileType::BlockDevice, 'b')
                };
                if self.as_root {
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        &p,
                        ft,
                        Mode::from_raw_mode(0o600),
                        rustix::fs::makedev(*major, *minor),
                    )?;
                } else {
                    self.deferred_nodes
                        .push((item.path.to_string(), c, *major, *minor));
                    return Ok(());
                }
            }
            (Kind::Fifo, _) | (Kind::Socket, _) => {
                let ft = if matches!(e.kind, Kind::Fifo) {
                    FileType::Fifo
                } else {
                    FileType::Socket
                };
                rustix::fs::mknodat(rustix::fs::CWD, &p, ft, Mode::from_raw_mode(0o600), 0)?;
            }
        }
        if self.as_root {
            std::os::unix::fs::lchown(&p, Some(e.uid), Some(e.gid))?;
        }
        if !matches!(e.kind, Kind::Symlink(_)) {
            fs::set_permissions(&p, fs::Permissions::from_mode(e.mode))?;
        }
        set_mtime(&p, e.mtime)
    }
}

/// What `make_fs` needs besides the staging tree.
pub struct Ext4Params<'a> {
    pub staging: &'a Path,
    pub out: &'a Path,
    pub size: u64,
    pub uuid: String,
    pub hash_seed: String,
    pub epoch: u64,
    /// Every path of the image (relative, root as ""), with mode, uid and
    /// gid, for the debugfs pass.
    pub entries: Vec<(String, u32, u32, u32)>,
    /// The paths with extended attributes, each inode once.
    pub xattrs: Vec<(String, crate::entry::Xattrs)>,
    pub deferred_nodes: Vec<(String, char, u32, u32)>,
    pub work_dir: &'a Path,
}

fn find_tool(name: &'static str) -> Result<PathBuf, ImageBuildError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(ImageBuildError::ToolMissing {
            tool: name,
            package: "e2fsprogs",
        })
}

fn run(tool: &'static str, cmd: &mut Command) -> Result<(), ImageBuildError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(ImageBuildError::io("run", tool))?;
    // debugfs reports command errors on stderr but exits 0.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("debugfs ") && !l.starts_with("mke2fs ") && !l.trim().is_empty())
        .collect();
    if !out.status.success() || (tool == "debugfs" && !errors.is_empty()) {
        return Err(ImageBuildError::ToolFailed {
            tool,
            status: out.status,
            stderr: errors.join("; "),
        });
    }
    Ok(())
}

/// Quotes a path for a debugfs command line.
fn dq(path: &str) -> String {
    format!("\"/{path}\"")
}

/// Runs mke2fs and the debugfs fix-ups; `params.out` must exist with
/// `params.size` bytes.
pub fn make_fs(params: &Ext4Params) -> Result<(), ImageBuildError> {
    let mke2fs = find_tool("mke2fs")?;
    let debugfs = find_tool("debugfs")?;
    let conf = params.work_dir.join("mke2fs.conf");
    fs::write(&conf, MKE2FS_CONF).map_err(ImageBuildError::io("write", &conf))?;
    let epoch = params.epoch.to_string();
    let blocks = params.size / 4096;
    let mut inodes = params.size / 16384;
    let needed = params.entries.len() as u64 * 5 / 4 + 1024;
    let mut cmd = Command::new(&mke2fs);
    cmd.env_clear()
        .env("MKE2FS_CONFIG", &conf)
        .env("E2FSPROGS_FAKE_TIME", &epoch)
        .env("SOURCE_DATE_EPOCH", &epoch)
        .env("LC_ALL", "C")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-U", &params.uuid])
        .arg("-E")
        .arg(format!("hash_seed={},root_owner=0:0", params.hash_seed));
    if inodes < needed {
        inodes = needed;
        cmd.arg("-N").arg(inodes.to_string());
    }
    cmd.arg("-d")
        .arg(params.staging)
        .arg(params.out)
        .arg(blocks.to_string());
    run("mke2fs", &mut cmd)?;

    let as_root = rustix::process::geteuid().is_root();
    let mut script = String::new();
    for (path, c, major, minor) in &params.deferred_nodes {
        // debugfs makes nodes in its current directory only.
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        script.push_str(&format!(
            "cd {}\nmknod \"{name}\" {c} {major} {minor}\ncd /\n",
            dq(dir)
        ));
    }
    let deferred: std::collections::HashSet<&str> = params
        .deferred_nodes
        .iter()
        .map(|(p, ..)| p.as_str())
        .collect();
    for (path, mode, uid, gid) in &params.entries {
        let p = dq(path);
        if !as_root || deferred.contains(path.as_str()) {
            script.push_str(&format!("sif {p} uid {uid}\nsif {p} gid {gid}\n"));
        }
        if deferred.contains(path.as_str()) {
            let c = params
                .deferred_nodes
                .iter()
                .find(|d| d.0 == *path)
                .map_or('c', |d| d.1);
            let ty = if c == 'c' { 0o020000 } else { 0o060000 };
            script.push_str(&format!(
                "sif {p} mode 0{:o}\nsif {p} mtime @{epoch}\n",
                ty | mode
            ));
        }
        script.push_str(&format!("sif {p} ctime @{epoch}\nsif {p} atime @{epoch}\n"));
    }
    // Extended attributes through debugfs rather than the staging files:
    // no privilege needed (security.* and trusted.* would want
    // CAP_SYS_ADMIN/CAP_SETFCAP on the staging tree), the build host's
    // filesystem need not hold them, and e2fsprogs stores POSIX ACLs in
    // ext4's own format. Each value goes through a file: they are binary.
    let values_dir = params.work_dir.join("xattrs");
    if !params.xattrs.is_empty() {
        fs::create_dir_all(&values_dir).map_err(ImageBuildError::io("create", &values_dir))?;
    }
    let mut n = 0;
    for (path, xattrs) in &params.xattrs {
        for (name, value) in xattrs {
            let file = values_dir.join(n.to_string());
            n += 1;
            fs::write(&file, value).map_err(ImageBuildError::io("write", &file))?;
            script.push_str(&format!(
                "ea_set -f \"{}\" {} \"{name}\"\n",
                file.display(),
                dq(path)
            ));
        }
    }
    if !params.entries.iter().any(|(p, ..)| p == "lost+found") {
        script.push_str(&format!(
            "sif /lost+found ctime @{epoch}\nsif /lost+found atime @{epoch}\n"
        ));
    }
    let script_path = params.work_dir.join("fixup.debugfs");
    fs::write(&script_path, script).map_err(ImageBuildError::io("write", &script_path))?;
    let mut cmd = Command::new(&debugfs);
    cmd.env_clear()
        .env("E2FSPROGS_FAKE_TIME", &epoch)
        .env("LC_ALL", "C")
        .arg("-w")
        .arg("-f")
        .arg(&script_path)
        .arg(params.out)
        .stdout(Stdio::null());
    run("debugfs", &mut cmd)
}

/// Whether an extended attribute name can be given in a debugfs script.
pub fn xattr_name_safe(name: &str) -> bool {
    !name.is_empty() && !name.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\')
}

/// Whether a path can be named in a debugfs script.
pub fn debugfs_safe(path: &str) -> bool {
    !path.contains(['"', '\n', '\\'])
}
