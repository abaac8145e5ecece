//! Whether the bridge reaches anyone: the Zenoh peers and routers it is
//! connected to, looked at once a status period. Losing the last one (a
//! cable pulled, a switch down, the other boards off) is said on stderr,
//! counted and shown in the status as the seconds without anyone; Zenoh
//! reconnects by itself (its connect endpoints are retried, peers found
//! again through the router or scouting) and the bridge says so when it
//! does. Nothing restarts.

use std::collections::BTreeSet;

/// The most ids named in one look's lines; the rest are counted.
const MAX_NAMED: usize = 8;

#[derive(Debug, Default)]
pub struct Reach {
    known: BTreeSet<String>,
    /// The uptime (s) since which nobody is reached; `None` while someone
    /// is.
    alone_since: Option<u64>,
    ever: bool,
    /// Times the bridge went from someone to nobody.
    pub disconnections: u64,
}

impl Reach {
    pub fn new() -> Reach {
        Reach {
            alone_since: Some(0),
            ..Reach::default()
        }
    }

    /// One look at the ids of the peers and routers connected now, at
    /// `uptime_s`; returns what to say (bounded: a few lines).
    pub fn look(&mut self, uptime_s: u64, ids: impl IntoIterator<Item = String>) -> Vec<String> {
        let now: BTreeSet<String> = ids.into_iter().collect();
        let mut said = Vec::new();
        let mut name = |what: &str, set: Vec<&String>| {
            if set.is_empty() {
                return;
            }
            let shown: Vec<&str> = set.iter().take(MAX_NAMED).map(|s| s.as_str()).collect();
            let more = set.len().saturating_sub(MAX_NAMED);
            said.push(format!(
                "{what} {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        };
        name("connected to", now.difference(&self.known).collect());
        name("lost", self.known.difference(&now).collect());
        match (now.is_empty(), self.alone_since) {
            (true, None) => {
                self.disconnections += 1;
                self.alone_since = Some(uptime_s);
                said.push(
                    "no peer or router is reached any more (the network, or the other side, \
                     is down); Zenoh reconnects by itself"
                        .into(),
                );
            }
            (false, Some(since)) => {
                if self.ever {
                    said.push(format!(
                        "reached again after {} s without anyone",
                        uptime_s.saturating_sub(since)
                    ));
                }
                self.alone_since = None;
                self.ever = true;
            }
            _ => {}
        }
        self.known = now;
        said
    }

    /// Seconds without a peer or router (from the start when none was
    /// ever reached); `None` while one is.
    pub fn alone_s(&self, uptime_s: u64) -> Option<u64> {
        self.alone_since.map(|s| uptime_s.saturating_sub(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_lost_network_is_said_counted_and_timed_and_its_return_too() {
        let mut r = Reach::new();
        // Not yet connected: alone from the start, nothing lost.
        assert!(r.look(0, ids(&[])).is_empty());
        assert_eq!((r.alone_s(3), r.disconnections), (Some(3), 0));
        assert_eq!(r.look(4, ids(&["a"])), ["connected to a"]);
        assert_eq!(r.alone_s(5), None);
        assert!(r.look(5, ids(&["a"])).is_empty());
        let said = r.look(10, ids(&[]));
        assert_eq!(said[0], "lost a");
        assert!(
            said[1].starts_with("no peer or router is reached"),
            "{said:?}"
        );
        assert_eq!((r.alone_s(25), r.disconnections), (Some(15), 1));
        // Still alone: said once.
        assert!(r.look(11, ids(&[])).is_empty());
        assert_eq!(
            r.look(30, ids(&["a", "b"])),
            [
                "connected to a, b",
                "reached again after 20 s without anyone"
            ]
        );
        // One of two lost: the network is still there.
        assert_eq!(r.look(31, ids(&["b"])), ["lost a"]);
        assert_eq!((r.alone_s(31), r.disconnections), (None, 1));
    }

    #[test]
    fn many_ids_are_named_up_to_a_bound() {
        let mut r = Reach::new();
        let many: Vec<String> = (0..100).map(|i| format!("p{i:03}")).collect();
        let said = r.look(1, many);
        assert_eq!(said.len(), 1);
        assert!(said[0].ends_with("p007 and 92 more"), "{}", said[0]);
    }
}
