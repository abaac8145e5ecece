//! Kernel events after which an interrupt may have appeared, so the
//! supervisor's IRQ scan runs at once instead of at its next period.
//!
//! Two netlink sockets, both read on the supervisor's (housekeeping) CPU:
//! - `NETLINK_KOBJECT_UEVENT`, group 1: the kernel's own device events
//!   (a USB or PCI device added, a driver bound to it, a device changed).
//!   A driver that requests its interrupt in `probe` has it by `bind`.
//! - `NETLINK_ROUTE`, `RTMGRP_LINK`: a network interface going up. A
//!   driver that requests its interrupt in `open` (Jetson's mttcan, under
//!   the interface name `can0`) does so before the kernel announces the
//!   link up, and no uevent is sent for that.
//!
//! Only messages whose sender is the kernel (netlink port 0) count: a
//! process cannot make the supervisor scan. A message is only a hint, so
//! its content is read just far enough to name it in the scan's status;
//! anything malformed is ignored. Each read is bounded ([`BUF`] bytes,
//! [`MAX_PER_DRAIN`] messages per turn of the supervisor's loop).

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The largest message read; the kernel's uevents are at most 2 KiB
/// (UEVENT_BUFFER_SIZE) and a link message with its attributes a few.
/// Larger ones are cut (MSG_TRUNC) and still count as an event.
const BUF: usize = 8192;

/// At most this many messages are read per drain; the rest stay queued
/// for the next turn of the loop, so a flood cannot hold the loop.
pub const MAX_PER_DRAIN: usize = 256;

/// Which kernel events a socket carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device events (NETLINK_KOBJECT_UEVENT, the kernel's group).
    Uevent,
    /// Network links (NETLINK_ROUTE, RTMGRP_LINK).
    Link,
}

/// A non-blocking netlink socket subscribed to one [`Kind`].
#[derive(Debug)]
pub struct EventSocket {
    fd: OwnedFd,
    kind: Kind,
}

/// What one drain read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drained {
    /// Messages read from the kernel.
    pub messages: usize,
    /// Messages ignored: not from the kernel.
    pub foreign: usize,
    /// The first event that can bring an interrupt, as said in status
    /// (`uevent bind /devices/...`, `link can0 up`).
    pub trigger: Option<String>,
}

impl EventSocket {
    /// Opens and subscribes a socket of `kind`.
    pub fn open(kind: Kind) -> io::Result<EventSocket> {
        let (protocol, groups) = match kind {
            Kind::Uevent => (libc::NETLINK_KOBJECT_UEVENT, 1u32),
            Kind::Link => (libc::NETLINK_ROUTE, libc::RTMGRP_LINK as u32),
        };
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socket(2) returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = groups;
        // SAFETY: `addr` is a valid sockaddr_nl of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(EventSocket { fd, kind })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads what is queued, at most [`MAX_PER_DRAIN`] messages.
    pub fn drain(&self) -> Drained {
        let mut out = Drained::default();
        let mut buf = vec![0u8; BUF];
        for _ in 0..MAX_PER_DRAIN {
            // SAFETY: sockaddr_nl is plain data.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: `buf` has room for BUF bytes and `from` for `len`.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    BUF,
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_nl).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                // EAGAIN: drained. ENOBUFS: the kernel dropped messages
                // because we were slow; more than enough reason to scan.
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOBUFS) {
                    out.messages += 1;
                    out.trigger
                        .get_or_insert_with(|| "kernel events lost (ENOBUFS)".into());
                    continue;
                }
                break;
            }
            if from.nl_pid != 0 {
                out.foreign += 1;
                continue;
            }
            out.messages += 1;
            let msg = &buf[..(n as usize).min(BUF)];
            if out.trigger.is_none() {
                out.trigger = match self.kind {
                    Kind::Uevent => uevent_trigger(msg),
                    Kind::Link => link_trigger(msg),
                };
            }
        }
        out
    }
}

/// Device events after which a new interrupt can exist.
const UEVENT_ACTIONS: &[&str] = &["add", "bind", "change", "online", "move"];

/// `uevent bind /devices/...` for a kernel uevent (`ACTION@DEVPATH\0`
/// then `KEY=VALUE\0` pairs) whose action can bring an interrupt.
pub fn uevent_trigger(msg: &[u8]) -> Option<String> {
    let head = msg.split(|&b| b == 0).next()?;
    let head = std::str::from_utf8(head).ok()?;
    let (action, devpath) = head.split_once('@')?;
    if !UEVENT_ACTIONS.contains(&action) || !devpath.starts_with('/') {
        return None;
    }
    Some(format!("uevent {action} {}", printable(devpath, 120)))
}

/// `link can0 up` for an RTM_NEWLINK of an interface that is up, from a
/// buffer of netlink messages.
pub fn link_trigger(buf: &[u8]) -> Option<String> {
    const NLMSG_HDR: usize = 16;
    const IFINFO: usize = 16;
    let mut at = 0;
    while at + NLMSG_HDR <= buf.len() {
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().ok()?);
        if len < NLMSG_HDR || at + len > buf.len() {
            return None;
        }
        let msg = &buf[at + NLMSG_HDR..at + len];
        if kind == libc::RTM_NEWLINK && msg.len() >= IFINFO {
            let flags = u32::from_ne_bytes(msg[8..12].try_into().ok()?);
            if flags & libc::IFF_UP as u32 != 0 {
                let name = link_name(&msg[IFINFO..]).unwrap_or_else(|| {
                    format!(
                        "index {}",
                        i32::from_ne_bytes(msg[4..8].try_into().unwrap_or([0; 4]))
                    )
                });
                return Some(format!("link {name} up"));
            }
        }
        // Messages are 4-byte aligned.
        at += (len + 3) & !3;
    }
    None
}

/// The IFLA_IFNAME attribute among a link message's attributes.
fn link_name(mut attrs: &[u8]) -> Option<String> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == libc::IFLA_IFNAME {
            let value = &attrs[4..len];
            let value = value.split(|&b| b == 0).next().unwrap_or(value);
            return std::str::from_utf8(value).ok().map(|s| printable(s, 16));
        }
        let step = (len + 3) & !3;
        attrs = attrs.get(step..)?;
    }
    None
}

/// `s` cut to `max` characters with control characters replaced: it goes
/// into status and the log.
fn printable(s: &str, max: usize) -> String {
    s.chars()
        .take(max)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uevents_that_can_bring_an_interrupt_are_named() {
        let msg = b"bind@/devices/pci0000:00/0000:00:05.0\0ACTION=bind\0SUBSYSTEM=pci\0";
        assert_eq!(
            uevent_trigger(msg).as_deref(),
            Some("uevent bind /devices/pci0000:00/0000:00:05.0")
        );
        assert_eq!(uevent_trigger(b"remove@/devices/x\0ACTION=remove\0"), None);
        // udev's rebroadcast format, garbage, and nothing at all.
        assert_eq!(uevent_trigger(b"libudev\0\xfe\xed\xca\xfe"), None);
        assert_eq!(uevent_trigger(b"\xff\xfe@/x\0"), None);
        assert_eq!(uevent_trigger(b""), None);
        assert_eq!(uevent_trigger(b"add@relative\0"), None);
        let long = format!("add@/{}\n\0", "d".repeat(500));
        let t = uevent_trigger(long.as_bytes()).unwrap();
        assert_eq!(t.chars().count(), "uevent add ".len() + 120);
    }

    fn newlink(flags: u32, name: Option<&[u8]>) -> Vec<u8> {
        let mut attrs = Vec::new();
        if let Some(n) = name {
            let len = 4 + n.len();
            attrs.extend_from_slice(&(len as u16).to_ne_bytes());
            attrs.extend_from_slice(&libc::IFLA_IFNAME.to_ne_bytes());
            attrs.extend_from_slice(n);
            while attrs.len() % 4 != 0 {
                attrs.push(0);
            }
        }
        let len = 16 + 16 + attrs.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
        m.extend_from_slice(&[0; 10]); // flags, seq, pid
        m.extend_from_slice(&[0, 0, 0, 0]); // family, pad, type
        m.extend_from_slice(&7i32.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&attrs);
        m
    }

    #[test]
    fn a_link_going_up_is_named_and_malformed_messages_are_ignored() {
        let up = libc::IFF_UP as u32;
        assert_eq!(
            link_trigger(&newlink(up, Some(b"can0\0"))).as_deref(),
            Some("link can0 up")
        );
        assert_eq!(
            link_trigger(&newlink(up, None)).as_deref(),
            Some("link index 7 up")
        );
        assert_eq!(link_trigger(&newlink(0, Some(b"can0\0"))), None, "down");
        // Two messages: a link down, then one up.
        let mut two = newlink(0, Some(b"eth0\0"));
        two.extend(newlink(up, Some(b"eth1\0")));
        assert_eq!(link_trigger(&two).as_deref(), Some("link eth1 up"));
        // Lengths that lie, and truncations at every byte.
        let mut lie = newlink(up, Some(b"can0\0"));
        lie[0..4].copy_from_slice(&4096u32.to_ne_bytes());
        assert_eq!(link_trigger(&lie), None);
        let good = newlink(up, Some(b"can0\0"));
        for cut in 0..good.len() {
            let _ = link_trigger(&good[..cut]);
        }
        let mut zero = newlink(up, Some(b"can0\0"));
        zero[32..34].copy_from_slice(&0u16.to_ne_bytes());
        assert_eq!(link_trigger(&zero).as_deref(), Some("link index 7 up"));
    }

    /// The kernel sends a uevent when root writes an action to a device's
    /// `uevent` file: the socket reads it as the kernel's.
    #[test]
    #[ignore = "needs root: writing /sys/class/net/lo/uevent makes the kernel send a uevent"]
    fn the_kernel_s_uevent_is_read_from_the_socket() {
        let s = EventSocket::open(Kind::Uevent).expect("a uevent netlink socket");
        let lo = "uevent change /devices/virtual/net/lo";
        // Another device may speak in the same drain and be named first:
        // ask the kernel again, a few times.
        for _ in 0..5 {
            std::fs::write("/sys/class/net/lo/uevent", "change")
                .expect("write /sys/class/net/lo/uevent (as root)");
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < until {
                let d = s.drain();
                if let Some(t) = d.trigger {
                    assert_eq!(d.foreign, 0);
                    if t == lo {
                        return;
                    }
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        panic!("no `{lo}` read from the socket");
    }
}
