//! The host talking to a guest as it would to a robot: ssh as root to the
//! forwarded port, every command within a time limit.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// What a remote command gave.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Its exit status; 255 when ssh itself failed, 124 at the time limit.
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Reply {
    pub fn ok(&self) -> bool {
        self.status == 0
    }

    /// Standard output, trimmed.
    pub fn text(&self) -> &str {
        self.stdout.trim()
    }
}

/// What feeds a remote command's standard input.
pub type Input = Box<dyn FnOnce(&mut dyn std::io::Write) + Send>;

/// ssh to root@127.0.0.1 on the forwarded port.
#[derive(Debug, Clone)]
pub struct Ssh {
    pub port: u16,
    pub key: PathBuf,
}

/// The most of a remote command's output kept (per stream).
const MAX_OUTPUT: u64 = 32 << 20;

impl Ssh {
    /// The options `ssh` and `deploy update --ssh-option` both take.
    pub fn options(&self) -> Vec<String> {
        vec![
            "BatchMode=yes".into(),
            "StrictHostKeyChecking=no".into(),
            "UserKnownHostsFile=/dev/null".into(),
            "LogLevel=ERROR".into(),
            "ConnectTimeout=10".into(),
            format!("IdentityFile={}", self.key.display()),
            format!("Port={}", self.port),
        ]
    }

    fn command(&self) -> Command {
        let mut c = Command::new("ssh");
        for o in self.options() {
            c.arg("-o").arg(o);
        }
        c.args([
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=6",
            "root@127.0.0.1",
        ]);
        c
    }

    /// Runs `cmd` in the guest (a shell command line), feeding it `input`,
    /// within `limit`.
    pub fn run_with(&self, limit: Duration, cmd: &str, input: Option<Input>) -> Reply {
        let mut c = self.command();
        c.arg(cmd)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match c.spawn() {
            Ok(c) => c,
            Err(e) => {
                return Reply {
                    status: 255,
                    stdout: String::new(),
                    stderr: format!("ssh: {e}"),
                }
            }
        };
        let feeder = input.map(|f| {
            let mut stdin = child.stdin.take().expect("piped");
            thread::spawn(move || {
                f(&mut stdin);
                let _ = stdin.flush();
            })
        });
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let o = thread::spawn(move || {
            let mut b = Vec::new();
            let _ = (&mut out).take(MAX_OUTPUT).read_to_end(&mut b);
            // Drain the rest so the remote end never blocks on a full pipe.
            let _ = std::io::copy(&mut out, &mut std::io::sink());
            b
        });
        let e = thread::spawn(move || {
            let mut b = Vec::new();
            let _ = (&mut err).take(MAX_OUTPUT).read_to_end(&mut b);
            let _ = std::io::copy(&mut err, &mut std::io::sink());
            b
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s.code().unwrap_or(255),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break 124;
                }
                Ok(None) => thread::sleep(Duration::from_millis(50)),
                Err(_) => break 255,
            }
        };
        if let Some(f) = feeder {
            let _ = f.join();
        }
        Reply {
            status,
            stdout: String::from_utf8_lossy(&o.join().unwrap_or_default()).into_owned(),
            stderr: String::from_utf8_lossy(&e.join().unwrap_or_default()).into_owned(),
        }
    }

    /// Runs `cmd` in the guest within `limit`.
    pub fn run(&self, limit: u64, cmd: &str) -> Reply {
        self.run_with(Duration::from_secs(limit), cmd, None)
    }

    /// A query: `run`, tried up to three times when ssh itself failed
    /// (255) or the limit hit (124): under emulation a busy guest can be
    /// slow to take a connection.
    pub fn query(&self, limit: u64, cmd: &str) -> Reply {
        let mut r = self.run(limit, cmd);
        for _ in 1..3 {
            if r.status != 124 && r.status != 255 {
                break;
            }
            thread::sleep(Duration::from_secs(5));
            r = self.run(limit, cmd);
        }
        r
    }

    /// Sends the files `names` of `dir` into the guest's `to` (a tar
    /// through ssh).
    pub fn send_files(&self, dir: &Path, names: &[String], to: &str) -> Reply {
        let mut tar = Command::new("tar");
        tar.arg("-C").arg(dir).arg("-cf").arg("-").args(names);
        let input: Input = Box::new(move |w| {
            if let Ok(mut child) = tar.stdout(Stdio::piped()).stdin(Stdio::null()).spawn() {
                if let Some(mut out) = child.stdout.take() {
                    let _ = std::io::copy(&mut out, w);
                }
                let _ = child.wait();
            }
        });
        self.run_with(
            Duration::from_secs(300),
            &format!("mkdir -p {to} && tar -C {to} -xf -"),
            Some(input),
        )
    }
}

/// A free TCP port on 127.0.0.1 (for QEMU's forward of the guest's ssh).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
