//! sd_notify(3) without libsystemd: one datagram to `$NOTIFY_SOCKET`
//! (a path, or `@name` for the abstract namespace).

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The systemd notification socket, when the supervisor runs under systemd.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
    /// Send `WATCHDOG=1` this often (half of `$WATCHDOG_USEC`).
    pub watchdog: Option<Duration>,
}

/// Why the notification socket could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NotifySendError {
    #[error("NOTIFY_SOCKET `{addr}`: {err}")]
    Socket { addr: String, err: std::io::Error },
}

impl Notifier {
    /// From `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` as given
    /// (the caller reads the environment). `None` without a socket.
    pub fn new(
        notify_socket: Option<&str>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        own_pid: u32,
    ) -> Result<Option<Notifier>, NotifySendError> {
        let Some(path) = notify_socket.filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let err = |e| NotifySendError::Socket {
            addr: path.to_string(),
            err: e,
        };
        let addr = if let Some(name) = path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(err)?
        } else {
            SocketAddr::from_pathname(path).map_err(err)?
        };
        let sock = UnixDatagram::unbound().map_err(err)?;
        let for_us = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(own_pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && for_us)
            .map(|u| Duration::from_micros(u / 2));
        Ok(Some(Notifier {
            sock,
            addr,
            watchdog,
        }))
    }

    /// Sends `state` (`READY=1`, `WATCHDOG=1`, `STOPPING=1`, `STATUS=...`).
    pub fn send(&self, state: &str) -> Result<(), NotifySendError> {
        self.sock
            .send_to_addr(state.as_bytes(), &self.addr)
            .map(|_| ())
            .map_err(|err| NotifySendError::Socket {
                addr: format!("{:?}", self.addr),
                err,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(Some(path.to_str().unwrap()), Some("2000000"), None, 1)
            .unwrap()
            .unwrap();
        assert_eq!(n.watchdog, Some(Duration::from_secs(1)));
        n.send("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        let other = Notifier::new(Some(path.to_str().unwrap()), Some("2000000"), Some("77"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(other.watchdog, None, "WATCHDOG_PID names another process");
        assert!(Notifier::new(None, None, None, 1).unwrap().is_none());
    }

    #[test]
    fn a_send_error_says_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("none");
        let n = Notifier::new(Some(path.to_str().unwrap()), None, None, 1)
            .unwrap()
            .unwrap();
        let e = n.send("READY=1").unwrap_err();
        assert!(e.to_string().ends_with("(os error 2)"), "{e}");
        assert!(std::error::Error::source(&e).is_none(), "{e}");
    }
}
