//! The host's part of preparing a boot: static builds, a busybox root
//! filesystem, an initramfs, stripped copies, and commands run with their
//! output kept in a file.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `cmd` with its output (both streams) in `log`; the error is what
/// went wrong with the last 40 lines of that output.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<(), String> {
    let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{status}:\n{}", tail(log, 40)))
    }
}

/// Runs `cmd` and returns its standard output; the error carries its
/// standard error.
pub fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The last `n` lines of a file (bounded to its last MiB).
pub fn tail(path: &Path, n: usize) -> String {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
    let mut bytes = Vec::new();
    let _ = f.take(1 << 20).read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).replace('\r', "");
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `cargo build --release --target x86_64-unknown-linux-gnu` of `src` into
/// `target_dir`, statically linked (the guest has no C library).
pub fn cargo_static(
    src: &Path,
    target_dir: &Path,
    args: &[&str],
    log: &Path,
) -> Result<(), String> {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(src)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_TARGET_DIR", target_dir)
        .args(["build", "--release", "--locked", "--target", X86_TRIPLE])
        .args(args);
    run_logged(&mut c, log)
}

pub const X86_TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Whether `path` is a statically linked ELF program (no PT_INTERP).
pub fn is_static(path: &Path) -> Result<bool, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let elf = rootfs::elf::inspect(&bytes).map_err(|e| format!("{}: {}", path.display(), e.0))?;
    Ok(elf.interp.is_none())
}

/// `strip -o dst src`, or a plain copy where there is no `strip`.
pub fn strip_copy(src: &Path, dst: &Path) -> Result<(), String> {
    match Command::new("strip").arg("-o").arg(dst).arg(src).status() {
        Ok(s) if s.success() => Ok(()),
        _ => std::fs::copy(src, dst)
            .map(|_| ())
            .map_err(|e| format!("{} -> {}: {e}", src.display(), dst.display())),
    }
}

/// Writes a minimal root filesystem into `dir`: busybox-static with its
/// applet links, `examples/qemu-base` of the repository, the few files an
/// init needs, the usual empty mount points, and (as root) /dev/console
/// and /dev/null, which a cpio.gz needs before devtmpfs is mounted.
pub fn busybox_base(dir: &Path, repo: &Path) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    for d in [
        "usr/bin", "usr/lib", "etc", "dev", "proc", "sys", "tmp", "run", "root", "var/log",
        "var/lib", "mnt", "opt",
    ] {
        std::fs::create_dir_all(dir.join(d)).map_err(io)?;
    }
    use std::os::unix::fs::{symlink, PermissionsExt as _};
    for (link, to) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/bin"),
        ("usr/sbin", "bin"),
        ("lib", "usr/lib"),
    ] {
        symlink(to, dir.join(link)).map_err(io)?;
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(io)?;
    std::fs::set_permissions(dir.join("root"), std::fs::Permissions::from_mode(0o700))
        .map_err(io)?;
    let bb = dir.join("usr/bin/busybox");
    std::fs::copy("/bin/busybox", &bb)
        .map_err(|e| format!("/bin/busybox (busybox-static): {e}"))?;
    if !is_static(&bb)? {
        return Err("/bin/busybox is not static (install busybox-static)".into());
    }
    let list = output(Command::new(&bb).arg("--list"))?;
    for applet in list.split_whitespace().filter(|a| *a != "busybox") {
        let l = dir.join("usr/bin").join(applet);
        if !l.exists() {
            symlink("busybox", l).map_err(io)?;
        }
    }
    let extra = repo.join("examples/qemu-base");
    if extra.is_dir() {
        let mut c = Command::new("cp");
        c.arg("-a").arg(extra.join(".")).arg(dir);
        output(&mut c)?;
    }
    let defaults = [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        ),
        (
            "etc/group",
            "root:x:0:\nrtdeploy:x:900:\nnogroup:x:65534:\n",
        ),
        ("etc/hostname", "rtdeploy-qemu\n"),
    ];
    for (f, text) in defaults {
        if !dir.join(f).exists() {
            std::fs::write(dir.join(f), text).map_err(io)?;
        }
    }
    if rustix::process::geteuid().is_root() {
        for (name, mode, major, minor) in [("console", 0o600, 5, 1), ("null", 0o666, 1, 3)] {
            let p = dir.join("dev").join(name);
            if !p.exists() {
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &p,
                    rustix::fs::FileType::CharacterDevice,
                    rustix::fs::Mode::from_raw_mode(mode),
                    rustix::fs::makedev(major, minor),
                )
                .map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
    }
    Ok(())
}

/// Copies a directory tree (`cp -a`).
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    output(Command::new("cp").arg("-a").arg(from).arg(to)).map(|_| ())
}

/// Packs `dir` as a newc cpio.gz initramfs: entries sorted by name, owned
/// by root, mtimes as they are.
pub fn cpio_gz(dir: &Path, out: &Path) -> Result<(), String> {
    let mut names = Vec::new();
    walk(dir, Path::new("."), &mut names).map_err(|e| format!("{}: {e}", dir.display()))?;
    names.sort();
    let gz = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "-R", "0:0", "--quiet"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cpio: {e}"))?;
    let cpio_out = cpio.stdout.take().expect("piped");
    let mut gzip = Command::new("gzip")
        .args(["-n", "-6"])
        .stdin(cpio_out)
        .stdout(gz)
        .spawn()
        .map_err(|e| format!("gzip: {e}"))?;
    {
        let mut stdin = cpio.stdin.take().expect("piped");
        let mut list = Vec::new();
        for n in &names {
            list.extend_from_slice(n.as_encoded_bytes());
            list.push(b'\n');
        }
        stdin.write_all(&list).map_err(|e| format!("cpio: {e}"))?;
    }
    let a = cpio.wait().map_err(|e| e.to_string())?;
    let b = gzip.wait().map_err(|e| e.to_string())?;
    if a.success() && b.success() {
        Ok(())
    } else {
        Err(format!("cpio {a}, gzip {b}"))
    }
}

fn walk(root: &Path, rel: &Path, names: &mut Vec<std::ffi::OsString>) -> std::io::Result<()> {
    for e in std::fs::read_dir(root.join(rel))? {
        let e = e?;
        let r: PathBuf = rel.join(e.file_name());
        names.push(r.as_os_str().to_owned());
        if e.file_type()?.is_dir() {
            walk(root, &r, names)?;
        }
    }
    Ok(())
}

/// The size of a file, for a message (`7.5 MiB`; a sparse one says how
/// much of it is written).
pub fn size(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let (len, blocks) = std::fs::metadata(path)
        .map(|m| (m.len(), m.blocks() * 512))
        .unwrap_or((0, 0));
    let mib = |n: u64| format!("{:.1} MiB", n as f64 / 1048576.0);
    if blocks < len {
        // Sparse: its size and what is written.
        format!("{}, {} written", mib(len), mib(blocks))
    } else {
        mib(len)
    }
}
