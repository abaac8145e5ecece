//! `bridge:`: chosen channels carried to and from Zenoh by
//! `rtdeploy-bridge`, a process of its own (its crate, `services/bridge`,
//! is the only one that links Zenoh) that the supervisor runs on the
//! housekeeping CPUs, never real-time, when robot.yaml has this section.
//!
//! The section is checked here, at `config check`, and resolved into a
//! [`BridgePlan`]: every forwarded channel by name with its size and, for
//! ROS 2, its message description (from `log.types`) with the type's ROS 2
//! names and hash. The supervisor hands the plan to the bridge as JSON in
//! [`PLAN_ENV`], so the bridge never reads robot.yaml itself.
//!
//! Two key spaces:
//! - between rtdeploy boards, `rtdeploy/<robot>/<channel>`: each message
//!   with its remote sequence, send time and boot id (see the bridge's
//!   `wire` module), and the boards' clock offset estimated by the bridges;
//! - to and from ROS 2 nodes on rmw_zenoh (`ros2: true`), the key
//!   expressions, attachments and liveliness tokens of rmw_zenoh's design
//!   (`messages::ros`), the payload CDR.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use units::duration::Dur;
use units::size::ByteSize;

/// The bridge's process name in the supervisor's table (refused for a
/// process of robot.yaml's own).
pub const PROCESS: &str = "rtdeploy-bridge";
/// Where the bridge publishes its status (JSON, twice a second).
pub const STATUS_CHANNEL: &str = "/rtdeploy/bridge/status";
/// The largest status message.
pub const STATUS_MAX: u64 = 32 << 10;
/// The environment variable that carries the plan to the bridge.
pub const PLAN_ENV: &str = "RTDEPLOY_BRIDGE_PLAN";
/// The largest plan: it travels in one environment variable, which the
/// kernel takes up to 128 KiB.
pub const MAX_PLAN: usize = 96 << 10;
/// The default program: where images install it, beside `deploy`.
pub const DEFAULT_EXEC: &str = "/usr/bin/rtdeploy-bridge";
/// The most forwarding rules and forwarded channels.
pub const MAX_LINKS: usize = 256;

/// Zenoh's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Through a router (rmw_zenoh's `rmw_zenohd`, tcp 7447 by default).
    #[default]
    Client,
    /// Peer to peer: listens and connects itself.
    Peer,
}

/// Which way a rule forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// From this robot's channel to Zenoh.
    #[default]
    Out,
    /// From Zenoh into this robot's channel.
    In,
    /// Both.
    Both,
}

impl Direction {
    pub fn outbound(self) -> bool {
        matches!(self, Direction::Out | Direction::Both)
    }
    pub fn inbound(self) -> bool {
        matches!(self, Direction::In | Direction::Both)
    }
}

/// `bridge.forward[]`: a rule.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Forward {
    /// The channels, a glob over `channels[].name` (`*`, `?`).
    pub channels: String,
    #[serde(default)]
    pub direction: Direction,
    /// On rmw_zenoh's key expressions, for ROS 2 nodes (the channel's
    /// type from `log.types`); else between rtdeploy boards.
    #[serde(default)]
    pub ros2: bool,
    /// Inbound between rtdeploy boards: the robot whose channel of the
    /// same name comes in (any robot when absent).
    #[serde(default)]
    pub from: Option<String>,
    /// Zenoh's congestion control: a reliable channel blocks the bridge's
    /// sender when the network is congested (never a real-time task);
    /// best effort (the default) drops, counted.
    #[serde(default)]
    pub reliable: bool,
    /// Zenoh's priority, 1 (real time) to 7 (background); 5 (data) by
    /// default.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// A message older than this when the bridge would send or deliver it
    /// is dropped and counted (none by default).
    #[serde(default)]
    pub ttl: Option<Dur>,
    /// Inbound: the most messages a second taken from the network; more
    /// are dropped and counted (none by default: the channel's `rate`).
    #[serde(default)]
    pub rate: Option<u32>,
}

fn default_priority() -> u8 {
    5
}

fn default_memory() -> ByteSize {
    ByteSize(64 << 20)
}

fn default_exec() -> String {
    DEFAULT_EXEC.into()
}

/// `bridge:`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSection {
    /// The bridge program.
    #[serde(default = "default_exec")]
    pub exec: String,
    #[serde(default)]
    pub mode: Mode,
    /// Endpoints to connect to (`tcp/host:port`); a client with none
    /// connects to a router on this machine, `tcp/127.0.0.1:7447`.
    #[serde(default)]
    pub connect: Vec<String>,
    /// Endpoints to listen on (a peer's).
    #[serde(default)]
    pub listen: Vec<String>,
    /// Zenoh's UDP multicast scouting (off, as rmw_zenoh has it).
    #[serde(default)]
    pub multicast_scouting: bool,
    /// ROS 2's domain id (`ROS_DOMAIN_ID`).
    #[serde(default)]
    pub domain_id: u32,
    /// The ROS 2 node the bridge appears as (default: the robot's name,
    /// made a valid node name).
    #[serde(default)]
    pub node: Option<String>,
    /// The memory the bridge may take (its resident set): messages
    /// beyond it are dropped, counted.
    #[serde(default = "default_memory")]
    pub memory: ByteSize,
    #[serde(default)]
    pub forward: Vec<Forward>,
}

/// A forwarded channel's ROS 2 type.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct RosType {
    /// `log.types.<channel>`'s `package/Name` and fields.
    pub name: String,
    pub fields: Vec<String>,
    /// `package::msg::dds_::Name_`.
    pub dds_type: String,
    /// `RIHS01_...`.
    pub hash: String,
}

/// One forwarded channel.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Link {
    pub channel: String,
    pub max_size: u64,
    pub direction: Direction,
    pub ros2: Option<RosType>,
    pub from: Option<String>,
    pub reliable: bool,
    pub priority: u8,
    pub ttl_ns: Option<u64>,
    pub rate: Option<u32>,
}

impl Link {
    /// The key expression of the link's outbound side (`out`) or the one
    /// its inbound side subscribes to: rmw_zenoh's for ROS 2 (inbound: any
    /// type hash, so that another is counted rather than unheard), else
    /// `rtdeploy/<robot>/<channel>` (inbound: the `from` robot, or any).
    pub fn key(&self, robot: &str, domain_id: u32, out: bool) -> String {
        match &self.ros2 {
            Some(t) => messages::ros::topic_key(
                domain_id,
                &self.channel,
                &t.dds_type,
                if out { &t.hash } else { "*" },
            ),
            None => format!(
                "rtdeploy/{}/{}",
                if out {
                    robot
                } else {
                    self.from.as_deref().unwrap_or("*")
                },
                self.channel.trim_start_matches('/')
            ),
        }
    }
}

/// What the bridge is given.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct BridgePlan {
    pub robot: String,
    pub mode: Mode,
    pub connect: Vec<String>,
    pub listen: Vec<String>,
    pub multicast_scouting: bool,
    pub domain_id: u32,
    pub node: String,
    pub memory: u64,
    pub links: Vec<Link>,
}

/// The largest ROS 2 domain id (REP-2000's DDS port arithmetic leaves
/// 0..=232).
pub const MAX_DOMAIN_ID: u32 = 232;

fn endpoint_ok(e: &str) -> bool {
    let Some((proto, addr)) = e.split_once('/') else {
        return false;
    };
    matches!(proto, "tcp" | "udp")
        && addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
}

/// A ROS 2 node name made from `s`: lower case, other characters `_`.
pub fn node_name(s: &str) -> String {
    let mut n: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if !n.starts_with(|c: char| c.is_ascii_alphabetic()) {
        n.insert_str(0, "rtdeploy_");
    }
    n
}

impl BridgeSection {
    /// The section's rules against the robot's channels (name, max_size)
    /// and `log.types`: each as `(field, problem)`.
    pub fn validate(
        &self,
        channels: &[(&str, u64)],
        types: &BTreeMap<String, logbook::schema::TypeDecl>,
        out: &mut Vec<(String, String)>,
    ) {
        let mut bad = |f: String, m: String| out.push((f, m));
        if self.exec.is_empty() {
            bad(
                "bridge.exec".into(),
                "empty: give the bridge program's path".into(),
            );
        }
        for (list, which) in [(&self.connect, "connect"), (&self.listen, "listen")] {
            for (i, e) in list.iter().enumerate() {
                if !endpoint_ok(e) {
                    bad(
                        format!("bridge.{which}[{i}]"),
                        format!("`{e}`: expected `tcp/HOST:PORT` or `udp/HOST:PORT`"),
                    );
                }
            }
        }
        if self.mode == Mode::Peer && self.listen.is_empty() && self.connect.is_empty() {
            bad(
                "bridge.listen".into(),
                "a peer with nothing to listen on and nothing to connect to meets no one (give listen: or connect:)".into(),
            );
        }
        if self.domain_id > MAX_DOMAIN_ID {
            bad(
                "bridge.domain_id".into(),
                format!(
                    "{}: ROS 2 domain ids are 0 to {MAX_DOMAIN_ID}",
                    self.domain_id
                ),
            );
        }
        if let Some(n) = &self.node {
            if node_name(n) != *n || n.contains("__") {
                bad(
                    "bridge.node".into(),
                    format!("`{n}`: a ROS 2 node name is lower case letters, digits and single underscores, starting with a letter"),
                );
            }
        }
        if self.forward.is_empty() {
            bad(
                "bridge.forward".into(),
                "no rule: give at least one `{channels: GLOB, direction: out|in|both}`".into(),
            );
        }
        if self.forward.len() > MAX_LINKS {
            bad(
                "bridge.forward".into(),
                format!("{} rules, at most {MAX_LINKS}", self.forward.len()),
            );
        }
        let largest = channels.iter().map(|c| c.1).max().unwrap_or(0);
        for (i, f) in self.forward.iter().enumerate() {
            let at = |k: &str| format!("bridge.forward[{i}].{k}");
            let matched: Vec<&(&str, u64)> = channels
                .iter()
                .filter(|(n, _)| logbook::section::glob(&f.channels, n))
                .collect();
            if matched.is_empty() {
                bad(
                    at("channels"),
                    format!("`{}` matches no channel of `channels:`", f.channels),
                );
            }
            if !(1..=7).contains(&f.priority) {
                bad(
                    at("priority"),
                    format!(
                        "{}: Zenoh's priorities are 1 (real time) to 7 (background)",
                        f.priority
                    ),
                );
            }
            if f.rate == Some(0) {
                bad(
                    at("rate"),
                    "0 lets nothing in: leave it out for no limit".into(),
                );
            }
            if f.ros2 && f.from.is_some() {
                bad(
                    at("from"),
                    "a robot name is for links between rtdeploy boards; ROS 2 topics have no robot"
                        .into(),
                );
            }
            if f.ros2 {
                for (name, _) in &matched {
                    match types.get(*name) {
                        None => bad(
                            at("ros2"),
                            format!("`{name}` has no type in `log.types`: ROS 2 needs its fields (declare them there)"),
                        ),
                        Some(t) => {
                            if let Err(e) = ros_type(t) {
                                bad(at("ros2"), format!("`{name}`: {e}"));
                            }
                        }
                    }
                }
            }
        }
        if self.memory.0 < (1 << 20) || self.memory.0 < largest.saturating_mul(4) {
            bad(
                "bridge.memory".into(),
                format!(
                    "{} bytes: at least 1 MiB and four of the largest message ({largest} bytes)",
                    self.memory.0
                ),
            );
        }
    }

    /// The plan for the bridge (after [`BridgeSection::validate`]
    /// passed): each channel once per direction, the first rule that
    /// matches it deciding.
    pub fn plan(
        &self,
        robot: &str,
        channels: &[(&str, u64)],
        types: &BTreeMap<String, logbook::schema::TypeDecl>,
    ) -> BridgePlan {
        let mut links: Vec<Link> = Vec::new();
        for f in &self.forward {
            for (name, max) in channels {
                if !logbook::section::glob(&f.channels, name) {
                    continue;
                }
                let taken = |out: bool| {
                    links.iter().any(|l| {
                        l.channel == *name
                            && if out {
                                l.direction.outbound()
                            } else {
                                l.direction.inbound()
                            }
                    })
                };
                let direction = match (
                    f.direction.outbound() && !taken(true),
                    f.direction.inbound() && !taken(false),
                ) {
                    (true, true) => Direction::Both,
                    (true, false) => Direction::Out,
                    (false, true) => Direction::In,
                    (false, false) => continue,
                };
                links.push(Link {
                    channel: name.to_string(),
                    max_size: *max,
                    direction,
                    ros2: if f.ros2 {
                        types.get(*name).and_then(|t| ros_type(t).ok())
                    } else {
                        None
                    },
                    from: f.from.clone(),
                    reliable: f.reliable,
                    priority: f.priority,
                    ttl_ns: f.ttl.map(|d| d.0.as_nanos() as u64),
                    rate: f.rate,
                });
            }
        }
        links.truncate(MAX_LINKS);
        BridgePlan {
            robot: robot.into(),
            mode: self.mode,
            connect: if self.connect.is_empty() && self.mode == Mode::Client {
                vec!["tcp/127.0.0.1:7447".into()]
            } else {
                self.connect.clone()
            },
            listen: self.listen.clone(),
            multicast_scouting: self.multicast_scouting,
            domain_id: self.domain_id,
            node: self.node.clone().unwrap_or_else(|| node_name(robot)),
            memory: self.memory.0,
            links,
        }
    }

    /// The channels the bridge publishes on (the inbound ones), for the
    /// supervisor's process table.
    pub fn inbound(&self, channels: &[(&str, u64)]) -> Vec<String> {
        channels
            .iter()
            .filter(|(n, _)| {
                self.forward
                    .iter()
                    .any(|f| f.direction.inbound() && logbook::section::glob(&f.channels, n))
            })
            .map(|(n, _)| n.to_string())
            .collect()
    }
}

/// What the bridge publishes on [`STATUS_CHANNEL`] (and `deploy status`
/// shows).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct BridgeStatus {
    pub robot: String,
    /// Its Zenoh session id.
    pub session: String,
    pub mode: String,
    pub node: String,
    pub domain_id: u32,
    /// The Zenoh ids of the peers and routers it is connected to.
    pub peers: Vec<String>,
    pub routers: Vec<String>,
    pub uptime_s: u64,
    /// Seconds without any peer or router (from the start when none was
    /// ever reached); `None` while one is.
    pub alone_s: Option<u64>,
    /// Times the bridge lost its last peer or router (the network, or
    /// every other side, down); it reconnects by itself.
    pub disconnections: u64,
    pub rss_bytes: u64,
    pub memory_bound: u64,
    pub over_memory: bool,
    pub links: Vec<LinkStatus>,
    pub clocks: Vec<ClockStatus>,
}

/// One direction of one forwarded channel.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct LinkStatus {
    pub channel: String,
    /// `out` or `in`.
    pub direction: String,
    /// The key expression (inbound: the one subscribed to).
    pub key: String,
    pub ros2: bool,
    pub sent: u64,
    pub received: u64,
    /// Messages a second over the last status period.
    pub rate_hz: f64,
    /// Messages the other side published that never came (gaps in its
    /// sequence), or that the channel overwrote before the bridge read.
    pub lost: u64,
    pub dropped: Dropped,
}

/// Messages dropped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct Dropped {
    pub garbage: u64,
    pub wrong_type: u64,
    pub size: u64,
    pub rate: u64,
    pub ttl: u64,
    pub memory: u64,
    pub failed: u64,
    pub stale: u64,
}

impl Dropped {
    pub fn total(&self) -> u64 {
        [
            self.garbage,
            self.wrong_type,
            self.size,
            self.rate,
            self.ttl,
            self.memory,
            self.failed,
            self.stale,
        ]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// The reasons with a count, `name n`, comma separated.
    pub fn describe(&self) -> String {
        [
            ("garbage", self.garbage),
            ("wrong type", self.wrong_type),
            ("too large", self.size),
            ("over rate", self.rate),
            ("too old", self.ttl),
            ("memory", self.memory),
            ("failed", self.failed),
            ("stale", self.stale),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(w, n)| format!("{w} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// Another board's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default)]
pub struct ClockStatus {
    pub robot: String,
    /// Its CLOCK_MONOTONIC minus this board's, ns.
    pub offset_ns: i64,
    /// The round trip of the exchange the estimate comes from (the error
    /// is at most half of it).
    pub rtt_ns: u64,
    pub samples: usize,
    pub boot_id: String,
}

/// The bridge's last status, from its channel in `shm_dir` (none before
/// its first, or when what is there is not one).
pub fn read_status(shm_dir: &std::path::Path) -> Option<BridgeStatus> {
    let ch = controller::Channel::open(shm_dir, STATUS_CHANNEL).ok()?;
    let next = ch.next_index();
    if next == 0 {
        return None;
    }
    let mut r = ch.reader_at(next - 1);
    let m = r.next_message().ok()??;
    serde_json::from_slice(m.data).ok()
}

impl BridgeStatus {
    /// Lines for `deploy status`.
    pub fn render(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut out = format!(
            "bridge: session {} ({}), {} peer(s), {} router(s){}{}, memory {:.1} of {:.0} MiB{}\n",
            self.session,
            self.mode,
            self.peers.len(),
            self.routers.len(),
            match self.alone_s {
                Some(s) => format!(" (nobody reached for {s} s)"),
                None => String::new(),
            },
            match self.disconnections {
                0 => String::new(),
                n => format!(", network lost {n} time(s)"),
            },
            mib(self.rss_bytes),
            mib(self.memory_bound),
            if self.over_memory {
                " (over: dropping what comes in)"
            } else {
                ""
            }
        );
        for l in &self.links {
            let (arrow, n, what) = if l.direction == "out" {
                ("->", l.sent, "sent")
            } else {
                ("<-", l.received, "received")
            };
            let dropped = l.dropped.describe();
            out.push_str(&format!(
                "  {:<3} {} {arrow} {}: {n} {what}, {:.1}/s, lost {}, dropped {}{}\n",
                l.direction,
                l.channel,
                l.key,
                l.rate_hz,
                l.lost,
                l.dropped.total(),
                if dropped.is_empty() {
                    String::new()
                } else {
                    format!(" ({dropped})")
                }
            ));
        }
        for c in &self.clocks {
            out.push_str(&format!(
                "  clock of {}: {:+.6} s from ours (within {:.1} us, {} exchanges), boot {}\n",
                c.robot,
                c.offset_ns as f64 / 1e9,
                c.rtt_ns as f64 / 2000.0,
                c.samples,
                c.boot_id
            ));
        }
        out
    }
}

/// A `log.types` declaration as a ROS 2 type, or why it cannot be one.
pub fn ros_type(t: &logbook::schema::TypeDecl) -> Result<RosType, String> {
    let d = messages::Description::from_fields(&t.name, &t.fields).map_err(|e| e.to_string())?;
    let name = d.name.clone();
    let set = messages::Set::new(vec![d]).map_err(|e| e.to_string())?;
    let hash = set.ros_type_hash(&name).map_err(|e| e.to_string())?;
    Ok(RosType {
        name: t.name.clone(),
        fields: t.fields.clone(),
        dds_type: set.dds_type_name(&name),
        hash,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types() -> BTreeMap<String, logbook::schema::TypeDecl> {
        [(
            "/demo/chatter".to_string(),
            logbook::schema::TypeDecl {
                name: "demo/Chatter".into(),
                fields: vec!["uint64 seq".into(), "uint64 deadline_ns".into()],
            },
        )]
        .into()
    }

    const CHANNELS: &[(&str, u64)] = &[("/demo/chatter", 64), ("/demo/summary", 64), ("/imu", 128)];

    /// The tests' sections, as JSON (robot.yaml's reader is tested
    /// elsewhere).
    fn section(json: &str) -> BridgeSection {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_section_resolves_to_links_each_channel_once_per_direction() {
        let s = section(
            r#"{"forward": [
                {"channels": "/demo/*", "ros2": true, "direction": "out"},
                {"channels": "/demo/chatter", "direction": "both", "from": "robot-a", "ttl": "100ms", "rate": 500},
                {"channels": "/imu", "priority": 2, "reliable": true}
            ]}"#,
        );
        let mut p = Vec::new();
        // /demo/summary has no type: refused for ROS 2.
        s.validate(CHANNELS, &types(), &mut p);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].0, "bridge.forward[0].ros2");
        assert!(
            p[0].1
                .contains("`/demo/summary` has no type in `log.types`"),
            "{p:?}"
        );
        let plan = s.plan("Robot-B", CHANNELS, &types());
        assert_eq!(plan.node, "robot_b");
        assert_eq!(plan.connect, ["tcp/127.0.0.1:7447"]);
        let l: Vec<(&str, Direction, bool)> = plan
            .links
            .iter()
            .map(|l| (l.channel.as_str(), l.direction, l.ros2.is_some()))
            .collect();
        assert_eq!(
            l,
            [
                ("/demo/chatter", Direction::Out, true),
                ("/demo/summary", Direction::Out, false),
                ("/demo/chatter", Direction::In, false),
                ("/imu", Direction::Out, false),
            ]
        );
        let rt = plan.links[0].ros2.as_ref().unwrap();
        assert_eq!(rt.dds_type, "demo::msg::dds_::Chatter_");
        assert!(rt.hash.starts_with("RIHS01_"));
        assert_eq!(plan.links[2].ttl_ns, Some(100_000_000));
        assert_eq!(plan.links[2].from.as_deref(), Some("robot-a"));
        assert_eq!((plan.links[3].priority, plan.links[3].reliable), (2, true));
        assert_eq!(s.inbound(CHANNELS), ["/demo/chatter"]);
    }

    #[test]
    fn mistakes_are_named() {
        let s = section(
            r#"{"mode": "peer", "connect": ["tcp/nowhere"], "domain_id": 300, "node": "Bad-Node",
                "memory": 1000,
                "forward": [{"channels": "/nothing/*", "priority": 9, "rate": 0, "ros2": true, "from": "x"}]}"#,
        );
        let mut p = Vec::new();
        s.validate(CHANNELS, &types(), &mut p);
        let fields: Vec<&str> = p.iter().map(|x| x.0.as_str()).collect();
        for f in [
            "bridge.connect[0]",
            "bridge.domain_id",
            "bridge.node",
            "bridge.memory",
            "bridge.forward[0].channels",
            "bridge.forward[0].priority",
            "bridge.forward[0].rate",
            "bridge.forward[0].from",
        ] {
            assert!(fields.contains(&f), "{f} not in {p:?}");
        }
        let bad_type: BTreeMap<String, logbook::schema::TypeDecl> = [(
            "/demo/chatter".to_string(),
            logbook::schema::TypeDecl {
                name: "demo/Chatter".into(),
                fields: vec!["uint64 _seq".into()],
            },
        )]
        .into();
        let s = section(r#"{"forward": [{"channels": "/demo/chatter", "ros2": true}]}"#);
        let mut p = Vec::new();
        s.validate(CHANNELS, &bad_type, &mut p);
        assert!(
            p.iter()
                .any(|x| x.1.contains("ROS 2 cannot name the field `_seq`")),
            "{p:?}"
        );
    }

    #[test]
    fn status_says_how_long_nobody_was_reached_and_how_often_the_network_was_lost() {
        let mut b = BridgeStatus {
            session: "z1".into(),
            mode: "peer".into(),
            memory_bound: 64 << 20,
            alone_s: Some(12),
            disconnections: 1,
            ..Default::default()
        };
        let first = |b: &BridgeStatus| b.render().lines().next().unwrap().to_string();
        assert_eq!(
            first(&b),
            "bridge: session z1 (peer), 0 peer(s), 0 router(s) (nobody reached for 12 s), \
             network lost 1 time(s), memory 0.0 of 64 MiB"
        );
        b.alone_s = None;
        b.peers = vec!["z2".into()];
        assert!(first(&b).contains("1 peer(s), 0 router(s), network lost 1 time(s), memory"));
        // A status of an older bridge (no such fields): connected, never lost.
        let old: BridgeStatus =
            serde_json::from_str(r#"{"session": "z1", "peers": ["z2"]}"#).unwrap();
        assert_eq!((old.alone_s, old.disconnections), (None, 0));
    }
}
