//! Message types of logged channels, as robot.yaml declares them
//! (`log.types`), written into the log as `ros2msg` schemas with `cdr`
//! messages, which Foxglove and the ROS 2 tools decode without a plugin.
//!
//! A declaration is a message description given inline (a `package/Name`
//! and its fields), read, laid out and hashed by the `messages` crate, the
//! one module that `deploy gen` makes every language's type from. So the
//! rules are a channel type's (no `bool`, no padding: see `messages`), the
//! logged bytes are the CDR body as published (`messages::ros`), and the
//! declaration carries the layout hash that a channel of that type
//! records: the logger checks one against the other before it trusts the
//! field names (see `recorder::topic_spec`).

use messages::{Description, DescriptionError, Set};
use serde::{Deserialize, Serialize};

pub use messages::ros::CDR_HEADER;

/// `log.types.<channel>`: what a channel's messages hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TypeDecl {
    /// The type's name, `package/Name` (written as the ros2msg schema
    /// name `package/msg/Name`); `Name` is the struct's name, the one the
    /// channel records.
    pub name: String,
    /// The struct's fields in declaration order, each `TYPE NAME` or
    /// `TYPE[N] NAME` with a primitive TYPE: `byte`, `char`, `int8` ..
    /// `int64`, `uint8` .. `uint64`, `float32`, `float64`.
    pub fields: Vec<String>,
}

/// A declared (or logged) type, laid out.
#[derive(Debug, Clone)]
pub struct Layout {
    kind: Kind,
    /// The message's size in bytes (0 for another tool's type).
    pub size: u64,
    /// The layout hash a channel of this type records (0 for another
    /// tool's type).
    pub hash: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    /// A channel's type (a declaration, or a log of ours).
    Own { set: Set, root: String },
    /// A type of another tool's log, read leniently (see
    /// `messages::ros::Foreign`).
    Foreign {
        schema_name: String,
        text: String,
        foreign: messages::ros::Foreign,
    },
}

impl PartialEq for Layout {
    fn eq(&self, other: &Layout) -> bool {
        self.hash == other.hash && self.schema_name() == other.schema_name()
    }
}

impl TypeDecl {
    /// Reads and lays out the declaration; the error says which field
    /// and why.
    pub fn layout(&self) -> Result<Layout, DescriptionError> {
        let d = Description::from_fields(&self.name, &self.fields)?;
        let root = d.name.clone();
        Layout::of(Set::new(vec![d])?, root)
    }
}

impl Layout {
    fn of(set: Set, root: String) -> Result<Layout, DescriptionError> {
        let l = set.layout(&root)?;
        Ok(Layout {
            kind: Kind::Own { set, root },
            size: l.size,
            hash: l.hash,
        })
    }

    /// The struct's name, as a channel of the type records it.
    pub fn type_name(&self) -> &str {
        match &self.kind {
            Kind::Own { root, .. } => root,
            Kind::Foreign { schema_name, .. } => {
                schema_name.rsplit('/').next().unwrap_or(schema_name)
            }
        }
    }

    /// The ros2msg schema name: `package/msg/Name`.
    pub fn schema_name(&self) -> String {
        match &self.kind {
            Kind::Own { set, root } => set.ros_name(root),
            Kind::Foreign { schema_name, .. } => schema_name.clone(),
        }
    }

    /// The ros2msg schema text.
    pub fn ros2msg(&self) -> String {
        match &self.kind {
            Kind::Own { set, root } => set.ros2msg(root).unwrap_or_default(),
            Kind::Foreign { text, .. } => text.clone(),
        }
    }

    /// Decodes a message's payload (as published, or another tool's CDR
    /// body, without the CDR header) into a JSON object; `None` when it is
    /// shorter than the type.
    pub fn decode(&self, data: &[u8]) -> Option<serde_json::Value> {
        match &self.kind {
            Kind::Own { set, root } => set.decode(root, data),
            Kind::Foreign { foreign, .. } => foreign.decode(data),
        }
    }
}

/// Reads a ros2msg schema (for logs written by this logger or by other
/// tools): a channel's type when it is one (see
/// `messages::Set::from_ros2msg`), else another tool's fixed-size type
/// read leniently (a `bool`, padding); `None` for a type with strings or
/// sequences.
pub fn parse_ros2msg(schema_name: &str, text: &str) -> Option<Layout> {
    if let Ok((set, root)) = Set::from_ros2msg(schema_name, text) {
        if let Ok(l) = Layout::of(set, root) {
            return Some(l);
        }
    }
    let foreign = messages::ros::Foreign::read(schema_name, text)?;
    Some(Layout {
        kind: Kind::Foreign {
            schema_name: schema_name.to_string(),
            text: text.to_string(),
            foreign,
        },
        size: 0,
        hash: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(fields: &[&str]) -> TypeDecl {
        TypeDecl {
            name: "demo/Chatter".into(),
            fields: fields.iter().map(|s| s.to_string()).collect(),
        }
    }

    controller::shm_struct! {
        struct Chatter {
            seq: u64,
            deadline_ns: u64,
        }
    }

    #[test]
    fn a_declaration_carries_the_hash_of_the_channel_type_it_describes() {
        let l = decl(&["uint64 seq", "uint64 deadline_ns"])
            .layout()
            .unwrap();
        assert_eq!(l.hash, <Chatter as controller::ShmSafe>::LAYOUT_HASH);
        assert_eq!(l.size, 16);
        assert_eq!(l.type_name(), "Chatter");
        assert_eq!(l.schema_name(), "demo/msg/Chatter");
        assert_eq!(l.ros2msg(), "uint64 seq\nuint64 deadline_ns\n");
        assert_eq!(
            parse_ros2msg("demo/msg/Chatter", &l.ros2msg()),
            Some(l.clone())
        );
        // Another field name is another type.
        let other = decl(&["uint64 seq", "uint64 deadline"]).layout().unwrap();
        assert_ne!(other.hash, l.hash);
    }

    #[test]
    fn decodes_every_primitive() {
        let l = decl(&[
            "int16 s",
            "uint8 ok",
            "int8 t",
            "int32[2] v",
            "uint32 r",
            "float64 x",
        ])
        .layout()
        .unwrap();
        let mut b = vec![0u8; l.size as usize];
        b[0..2].copy_from_slice(&(-2i16).to_le_bytes());
        b[2] = 1;
        b[3] = 0xff;
        b[4..8].copy_from_slice(&7i32.to_le_bytes());
        b[8..12].copy_from_slice(&(-7i32).to_le_bytes());
        b[16..24].copy_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(
            l.decode(&b).unwrap(),
            serde_json::json!({"s": -2, "ok": 1, "t": -1, "v": [7, -7], "r": 0, "x": 1.5})
        );
        assert!(l.decode(&b[..10]).is_none());
    }

    #[test]
    fn refuses_what_a_channel_cannot_carry_or_cannot_name() {
        for (fields, why) in [
            (vec!["string x"], "no fixed size"),
            (vec!["bool ok"], "`bool`"),
            (vec!["uint8 a", "uint64 b"], "pads"),
            (vec!["float64"], "expected `TYPE NAME`"),
            (vec!["float64 x y"], "default value"),
            (vec!["uint8[0] x"], "length"),
            (vec!["uint8[] x"], "sequence"),
            (vec!["float64 x", "uint8 x"], "a second field"),
            (vec!["demo/Inner x"], "no description"),
            (vec![], "no field"),
        ] {
            let e = decl(&fields).layout().unwrap_err().to_string();
            assert!(e.contains(why), "{fields:?}: {e}");
        }
        let mut d = decl(&["float64 x"]);
        d.name = "Chatter".into();
        assert!(d.layout().unwrap_err().to_string().contains("package/Name"));
    }

    #[test]
    fn another_tools_schema_decodes_though_no_channel_could_carry_it() {
        // Trailing padding (20 bytes of fields) and a bool: read, decoded
        // as CDR.
        let l = parse_ros2msg(
            "demo/msg/Pose",
            "# a pose\nfloat64 x\nfloat64 y\nint32 id\nbool ok\n",
        )
        .unwrap();
        let mut b = Vec::new();
        b.extend(1.5f64.to_le_bytes());
        b.extend((-3.0f64).to_le_bytes());
        b.extend(3i32.to_le_bytes());
        b.push(1);
        assert_eq!(
            l.decode(&b).unwrap(),
            serde_json::json!({"x": 1.5, "y": -3.0, "id": 3, "ok": true})
        );
        assert_eq!(
            (l.schema_name().as_str(), l.type_name(), l.hash),
            ("demo/msg/Pose", "Pose", 0)
        );
        assert!(parse_ros2msg("demo/msg/S", "string s\n").is_none());
    }
}
