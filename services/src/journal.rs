//! Supervisor events to the systemd journal, with structured fields,
//! through the journal's native protocol (a datagram of `FIELD=value`
//! lines on `/run/systemd/journal/socket`, systemd's "Native Journal
//! Protocol" document), without libsystemd.
//!
//! Used when systemd runs the supervisor (`$JOURNAL_STREAM` set: its
//! stderr already goes to the journal, so lines are not printed twice) or
//! when the journal's socket exists (then stderr keeps its lines too).
//! A value with a newline is sent in the protocol's binary form (name,
//! newline, 64-bit little-endian length, bytes, newline). A message is cut
//! at [`MAX_MESSAGE`] bytes: larger datagrams would need the protocol's
//! memfd form, which this does not implement. A failed send is not
//! retried; the caller then prints the line on stderr.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The journal's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// The longest MESSAGE sent.
pub const MAX_MESSAGE: usize = 16 << 10;

/// syslog(3) priorities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Err = 3,
    Warning = 4,
    Info = 6,
}

/// A connection to the journal.
#[derive(Debug)]
pub struct Journal {
    sock: UnixDatagram,
    path: PathBuf,
    /// systemd set `$JOURNAL_STREAM`: stderr is the journal already.
    pub stderr_is_journal: bool,
    /// Fields sent with every entry (`SYSLOG_IDENTIFIER`, the robot).
    common: Vec<(String, String)>,
}

/// Whether a field name is one the journal accepts from a client:
/// uppercase ASCII letters, digits and underscores, not starting with an
/// underscore or a digit, at most 64 bytes.
pub fn valid_field(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Encodes one entry in the native protocol. Fields with invalid names
/// are dropped.
pub fn encode(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in fields {
        if !valid_field(k) {
            continue;
        }
        if v.contains('\n') {
            out.extend_from_slice(k.as_bytes());
            out.push(b'\n');
            out.extend_from_slice(&(v.len() as u64).to_le_bytes());
            out.extend_from_slice(v.as_bytes());
            out.push(b'\n');
        } else {
            out.extend_from_slice(format!("{k}={v}\n").as_bytes());
        }
    }
    out
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Journal {
    /// Connects to the journal at `path`.
    pub fn connect(path: &Path, stderr_is_journal: bool, robot: &str) -> std::io::Result<Journal> {
        let sock = UnixDatagram::unbound()?;
        sock.connect(path)?;
        Ok(Journal {
            sock,
            path: path.to_path_buf(),
            stderr_is_journal,
            common: vec![
                ("SYSLOG_IDENTIFIER".into(), "rtdeploy-supervise".into()),
                (units::env::ROBOT.into(), robot.into()),
            ],
        })
    }

    /// The journal when systemd runs this process or its socket exists,
    /// from the environment.
    pub fn from_env(robot: &str) -> Option<Journal> {
        let stream = std::env::var_os("JOURNAL_STREAM").is_some();
        let path = Path::new(SOCKET);
        if !stream && !path.exists() {
            return None;
        }
        Journal::connect(path, stream, robot).ok()
    }

    /// Sends one event: MESSAGE, PRIORITY, the common fields, and
    /// `RTDEPLOY_PROCESS` when it is about one process.
    pub fn send(&self, pri: Priority, process: Option<&str>, msg: &str) -> std::io::Result<()> {
        let pri_s = (pri as u8).to_string();
        let mut fields: Vec<(&str, &str)> =
            vec![("MESSAGE", cut(msg, MAX_MESSAGE)), ("PRIORITY", &pri_s)];
        fields.extend(self.common.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(p) = process {
            fields.push((units::env::PROCESS, p));
        }
        self.sock.send(&encode(&fields)).map(|_| ())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

static JOURNAL: OnceLock<Option<Journal>> = OnceLock::new();

/// Sets up the process's journal connection once (later calls keep the
/// first).
pub fn init(j: Option<Journal>) {
    let _ = JOURNAL.set(j);
}

/// Says an event: to the journal when connected, and on stderr (when
/// `verbose`) unless stderr is the journal or the journal took it.
pub fn event(verbose: bool, pri: Priority, process: Option<&str>, msg: &str) {
    let j = JOURNAL.get().and_then(Option::as_ref);
    let sent = j.is_some_and(|j| j.send(pri, process, msg).is_ok());
    let stderr_is_journal = j.is_some_and(|j| j.stderr_is_journal);
    if verbose && !(sent && stderr_is_journal) {
        // The events' messages name their process already
        // (`talker: started, pid 7`): said once.
        match process {
            Some(p) if !msg.starts_with(&format!("{p}: ")) => {
                eprintln!("rtdeploy supervise: {p}: {msg}")
            }
            _ => eprintln!("rtdeploy supervise: {msg}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a datagram back into fields, as journald reads it.
    fn decode(mut d: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while !d.is_empty() {
            let nl = d.iter().position(|&b| b == b'\n').expect("a newline");
            let line = &d[..nl];
            if let Some(eq) = line.iter().position(|&b| b == b'=') {
                out.push((
                    String::from_utf8(line[..eq].to_vec()).unwrap(),
                    String::from_utf8(line[eq + 1..].to_vec()).unwrap(),
                ));
                d = &d[nl + 1..];
            } else {
                let name = String::from_utf8(line.to_vec()).unwrap();
                let len = u64::from_le_bytes(d[nl + 1..nl + 9].try_into().unwrap()) as usize;
                let v = &d[nl + 9..nl + 9 + len];
                assert_eq!(d[nl + 9 + len], b'\n');
                out.push((name, String::from_utf8(v.to_vec()).unwrap()));
                d = &d[nl + 10 + len..];
            }
        }
        out
    }

    #[test]
    fn entries_reach_a_bound_socket_in_the_native_protocol() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket");
        let server = UnixDatagram::bind(&path).unwrap();
        let j = Journal::connect(&path, false, "arm-1").unwrap();
        j.send(
            Priority::Warning,
            Some("imu"),
            "timing report over budget\nsecond line",
        )
        .unwrap();
        j.send(Priority::Info, None, "start-up done").unwrap();
        let mut buf = vec![0u8; 65536];
        let n = server.recv(&mut buf).unwrap();
        let f = decode(&buf[..n]);
        let get = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("MESSAGE"),
            Some("timing report over budget\nsecond line")
        );
        assert_eq!(get("PRIORITY"), Some("4"));
        assert_eq!(get("SYSLOG_IDENTIFIER"), Some("rtdeploy-supervise"));
        assert_eq!(get(units::env::ROBOT), Some("arm-1"));
        assert_eq!(get(units::env::PROCESS), Some("imu"));
        // The binary form: name, newline, little-endian length.
        assert!(buf[..n].starts_with(b"MESSAGE\n"));
        assert_eq!(&buf[8..16], &(37u64).to_le_bytes());
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"MESSAGE=start-up done\nPRIORITY=6\nSYSLOG_IDENTIFIER=rtdeploy-supervise\nRTDEPLOY_ROBOT=arm-1\n"
        );
    }

    #[test]
    fn bad_field_names_are_dropped_and_messages_cut() {
        assert!(valid_field(units::env::PROCESS));
        for bad in ["", "_PID", "lower", "1X", "A-B", &"A".repeat(65)] {
            assert!(!valid_field(bad), "{bad}");
        }
        assert_eq!(encode(&[("_PID", "1"), ("OK", "v")]), b"OK=v\n");
        let long = "é".repeat(MAX_MESSAGE);
        assert!(cut(&long, MAX_MESSAGE).len() <= MAX_MESSAGE);
    }

    #[test]
    fn no_journal_means_no_connection() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Journal::connect(&dir.path().join("none"), false, "r").is_err());
    }
}
