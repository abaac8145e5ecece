//! The control socket protocol: `<prefix>/run/rtdeploy/control.sock`, a
//! Unix stream socket, one JSON object per line each way.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"start","name":"imu"}`, `stop`,
//! `restart`, `{"cmd":"stop-all"}`, `{"cmd":"logs","name":"imu","lines":50,
//! "follow":true}`, `{"cmd":"release-changed"}` (sent by `deploy install`
//! after it switched `current`: the supervisor reads `state.json` now
//! instead of at its next once-a-second look). Every request gets one reply line
//! `{"ok":true,...}` or `{"ok":false,"error":"..."}`; a `logs` request with
//! `follow` then gets one `{"ok":true,"data":"..."}` line per chunk of
//! output until the client hangs up.
//!
//! Who may connect: root, the supervisor's own user, or a member of
//! `robot.group` (checked with `SO_PEERCRED` and the peer's groups); the
//! socket file is mode 0660 and owned by that group as well.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::status::SupervisorStatus;

/// The socket path under a prefix.
pub fn socket_path(prefix: &Path) -> PathBuf {
    prefix.join("run/rtdeploy/control.sock")
}

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Status,
    Start {
        name: String,
    },
    Stop {
        name: String,
    },
    Restart {
        name: String,
    },
    StopAll,
    Logs {
        name: String,
        #[serde(default = "default_lines")]
        lines: usize,
        #[serde(default)]
        follow: bool,
    },
    /// `opt/rtdeploy/current` or `state.json` changed: look now.
    ReleaseChanged,
}

fn default_lines() -> usize {
    50
}

/// A reply line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was done (`stopping imu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SupervisorStatus>,
    /// `logs`: the last lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<Vec<String>>,
    /// `logs` with `follow`: new output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

impl Reply {
    pub fn error(msg: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
    pub fn message(msg: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            message: Some(msg.into()),
            ..Default::default()
        }
    }
}

/// Why a control request failed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ControlRequestError {
    #[error("cannot connect to {}: {source} (is `deploy supervise` running?)", path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {}: bad reply `{line}`: {source}", path.display())]
    BadReply {
        path: PathBuf,
        line: String,
        source: serde_json::Error,
    },
    #[error("control socket {}: the supervisor hung up without a reply", path.display())]
    NoReply { path: PathBuf },
}

/// A connection to the supervisor.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, ControlRequestError> {
        let s = UnixStream::connect(path).map_err(|source| ControlRequestError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        let io = |source| ControlRequestError::Io {
            path: path.to_path_buf(),
            source,
        };
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(io)?;
        let writer = s.try_clone().map_err(io)?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(s),
            writer,
        })
    }

    /// Sends a raw line (for tests of malformed input) and reads one reply.
    pub fn raw(&mut self, line: &str) -> Result<Reply, ControlRequestError> {
        let path = self.path.clone();
        let io = move |source| ControlRequestError::Io { path, source };
        let written = self.writer.write_all(format!("{line}\n").as_bytes());
        if let Err(e) = written {
            // A refused connection gets its reply before the supervisor
            // stops reading: show that reply rather than the broken pipe.
            return match self.next_reply() {
                Ok(Some(r)) => Ok(r),
                _ => Err(io(e)),
            };
        }
        self.next_reply()?
            .ok_or_else(|| ControlRequestError::NoReply {
                path: self.path.clone(),
            })
    }

    pub fn request(&mut self, req: &Request) -> Result<Reply, ControlRequestError> {
        let line = serde_json::to_string(req).expect("requests serialize");
        self.raw(&line)
    }

    /// The next reply line; `None` when the supervisor hung up.
    pub fn next_reply(&mut self) -> Result<Option<Reply>, ControlRequestError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|source| ControlRequestError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        serde_json::from_str(line.trim_end())
            .map(Some)
            .map_err(|source| ControlRequestError::BadReply {
                path: self.path.clone(),
                line: line.trim_end().to_string(),
                source,
            })
    }

    /// Waits without a timeout (for `logs --follow`).
    pub fn no_timeout(&mut self) -> Result<(), ControlRequestError> {
        self.reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(|source| ControlRequestError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

/// One request, one reply.
pub fn request(path: &Path, req: &Request) -> Result<Reply, ControlRequestError> {
    Client::connect(path)?.request(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_form() {
        assert_eq!(
            serde_json::to_string(&Request::StopAll).unwrap(),
            r#"{"cmd":"stop-all"}"#
        );
        let r: Request = serde_json::from_str(r#"{"cmd":"logs","name":"imu"}"#).unwrap();
        assert_eq!(
            r,
            Request::Logs {
                name: "imu".into(),
                lines: 50,
                follow: false
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::ReleaseChanged).unwrap(),
            r#"{"cmd":"release-changed"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"start"}"#).is_err());
    }
}
