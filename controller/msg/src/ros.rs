//! The ROS 2 side of a description: its `ros2msg` schema text (what MCAP
//! logs carry and Foxglove and the ROS 2 tools read), that text read
//! back, and a message's bytes decoded to JSON.
//!
//! Why a channel message is already its CDR body: plain CDR (XCDR1,
//! little endian) aligns each primitive to its own size, counted from the
//! end of the 4-byte encapsulation header, and writes fixed arrays without
//! a length and nested structs as their fields. A description puts each
//! field at a multiple of its alignment with no padding anywhere (nested
//! structs included, see [`Set::layout`]), so CDR inserts no padding
//! either and every field lands at the same offset: the CDR message is
//! the 4-byte header followed by the published bytes, unchanged.

use std::fmt::Write as _;

use crate::{Description, DescriptionError, Elem, Set};

/// The CDR encapsulation header in front of a message: representation
/// `CDR_LE`, no options.
pub const CDR_HEADER: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// The package a description without one is given in ROS 2 names.
pub const DEFAULT_PACKAGE: &str = "rtdeploy";

/// The separator between a `ros2msg` schema's definitions.
const SEPARATOR: &str =
    "================================================================================";

impl Set {
    fn package_of(&self, name: &str) -> &str {
        self.get(name)
            .and_then(|d| d.package.as_deref())
            .unwrap_or(DEFAULT_PACKAGE)
    }

    /// The ROS 2 type name of `name`: `package/msg/Name`.
    pub fn ros_name(&self, name: &str) -> String {
        format!("{}/msg/{name}", self.package_of(name))
    }

    /// The `ros2msg` schema of `name`: its fields, then each description
    /// it uses after a separator line and `MSG: package/Name`, as the ROS 2
    /// tools concatenate them.
    pub fn ros2msg(&self, name: &str) -> Result<String, DescriptionError> {
        self.layout(name)?;
        let mut order = Vec::new();
        self.in_order(name, &mut order);
        let mut out = String::new();
        self.ros2msg_fields(name, &mut out);
        for dep in order.iter().rev().filter(|n| *n != name) {
            let _ = writeln!(out, "{SEPARATOR}\nMSG: {}/{dep}", self.package_of(dep));
            self.ros2msg_fields(dep, &mut out);
        }
        Ok(out)
    }

    fn ros2msg_fields(&self, name: &str, out: &mut String) {
        let Some(d) = self.get(name) else { return };
        for f in &d.fields {
            let elem = match &f.elem {
                Elem::Prim(p) => p.name().to_string(),
                Elem::Msg(m) => format!("{}/{m}", self.package_of(m)),
            };
            match f.array {
                Some(n) => {
                    let _ = writeln!(out, "{elem}[{n}] {}", f.name);
                }
                None => {
                    let _ = writeln!(out, "{elem} {}", f.name);
                }
            }
        }
    }

    /// A message of `name` decoded to a JSON object, nested descriptions
    /// as objects and arrays as arrays; `None` when `data` is shorter
    /// than the type (a longer one is read up to the type's size).
    pub fn decode(&self, name: &str, data: &[u8]) -> Option<serde_json::Value> {
        let size = self.layout(name).ok()?.size;
        if (data.len() as u64) < size {
            return None;
        }
        self.decode_at(name, data, 0)
    }

    fn decode_at(&self, name: &str, data: &[u8], depth: usize) -> Option<serde_json::Value> {
        use serde_json::Value;
        let d = self.get(name)?;
        let l = self.layout_at(name, depth).ok()?;
        let mut obj = serde_json::Map::new();
        for (f, p) in d.fields.iter().zip(&l.fields) {
            let n = f.array.unwrap_or(1) as usize;
            let esize = (p.size as usize) / n.max(1);
            let one = |k: usize| -> Option<Value> {
                let at = p.offset as usize + k * esize;
                let b = data.get(at..at + esize)?;
                match &f.elem {
                    Elem::Prim(pr) => Some(pr.decode(b)),
                    Elem::Msg(m) => self.decode_at(m, b, depth + 1),
                }
            };
            let v = match f.array {
                None => one(0)?,
                Some(_) => Value::Array((0..n).map(one).collect::<Option<Vec<_>>>()?),
            };
            obj.insert(f.name.clone(), v);
        }
        Some(Value::Object(obj))
    }

    /// Reads a `ros2msg` schema (as [`Set::ros2msg`] writes it, or as the
    /// ROS 2 tools do) named `package/msg/Name`: comments, blank lines
    /// and constants skipped, each `MSG:` section a description. The set
    /// and the root's name, or why the schema is not a channel's type
    /// (a bool, a string, a sequence, padding, a missing definition).
    pub fn from_ros2msg(schema_name: &str, text: &str) -> Result<(Set, String), DescriptionError> {
        let whole = |what: String| DescriptionError::Whole {
            file: schema_name.to_string(),
            what,
        };
        let (pkg, root) = split_ros_name(schema_name)
            .ok_or_else(|| whole("expected a schema name `package/msg/Name`".into()))?;
        let mut sections: Vec<(String, String, String)> = vec![(pkg, root.clone(), String::new())];
        for line in text.lines() {
            if line.starts_with("===") {
                sections.push((String::new(), String::new(), String::new()));
                continue;
            }
            let last = sections.last_mut().expect("one section at least");
            if last.1.is_empty() {
                if let Some(t) = line.trim().strip_prefix("MSG:") {
                    let (p, n) = split_ros_name(t.trim())
                        .ok_or_else(|| whole(format!("`{line}`: expected `MSG: package/Name`")))?;
                    last.0 = p;
                    last.1 = n;
                }
                continue;
            }
            let code = line.split('#').next().unwrap_or("");
            // A constant (`TYPE NAME=VALUE`): the schema's, not a field.
            if code.contains('=') && !code.contains("<=") {
                continue;
            }
            last.2.push_str(code.trim());
            last.2.push('\n');
        }
        let mut ds = Vec::new();
        for (p, n, fields) in sections {
            if n.is_empty() {
                return Err(whole("a definition without its `MSG:` line".into()));
            }
            ds.push(Description::parse(&format!("{p}/msg/{n}.msg"), &fields)?);
        }
        let set = Set::new(ds)?;
        set.layout(&root)?;
        Ok((set, root))
    }
}

/// `package/msg/Name` or `package/Name`: the package and the name.
fn split_ros_name(s: &str) -> Option<(String, String)> {
    let mut parts = s.split('/');
    let (p, a, b) = (parts.next()?, parts.next()?, parts.next());
    if parts.next().is_some() {
        return None;
    }
    let name = match b {
        Some(n) if a == "msg" => n,
        Some(_) => return None,
        None => a,
    };
    (!p.is_empty() && !name.is_empty()).then(|| (p.to_string(), name.to_string()))
}

impl Description {
    /// A description given as a list of fields (robot.yaml's
    /// `log.types`), named `package/Name` or `package/msg/Name`. An error
    /// names the field by its index.
    pub fn from_fields(name: &str, fields: &[String]) -> Result<Description, DescriptionError> {
        let (pkg, short) = split_ros_name(name).ok_or_else(|| DescriptionError::Whole {
            file: name.to_string(),
            what: "expected `package/Name`".into(),
        })?;
        if let Some(i) = fields.iter().position(|f| f.contains(['\n', '\r', '#'])) {
            return Err(DescriptionError::Whole {
                file: format!("fields[{i}] {:?}", fields[i]),
                what: "one field each, without a line break or comment".into(),
            });
        }
        Description::parse(&format!("{pkg}/msg/{short}.msg"), &fields.join("\n")).map_err(|e| {
            match e {
                DescriptionError::At { line, what, .. } if line >= 1 && line <= fields.len() => {
                    DescriptionError::Whole {
                        file: format!("fields[{}] {:?}", line - 1, fields[line - 1]),
                        what,
                    }
                }
                other => other,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(files: &[(&str, &str)]) -> Set {
        Set::new(
            files
                .iter()
                .map(|(f, t)| Description::parse(f, t).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn ros2msg_round_trips_with_nested_definitions() {
        let s = set(&[
            ("geo/msg/Vector3.msg", "float64 x\nfloat64 y\nfloat64 z\n"),
            (
                "demo/msg/Pose.msg",
                "# a pose\nuint64 stamp\ngeo/Vector3 position\nVector3[2] corners\n",
            ),
        ]);
        let text = s.ros2msg("Pose").unwrap();
        assert_eq!(
            text,
            format!(
                "uint64 stamp\ngeo/Vector3 position\ngeo/Vector3[2] corners\n{SEPARATOR}\nMSG: geo/Vector3\nfloat64 x\nfloat64 y\nfloat64 z\n"
            )
        );
        assert_eq!(s.ros_name("Pose"), "demo/msg/Pose");
        let (back, root) = Set::from_ros2msg("demo/msg/Pose", &text).unwrap();
        assert_eq!(root, "Pose");
        assert_eq!(back.layout("Pose").unwrap(), s.layout("Pose").unwrap());
        assert_eq!(back.ros2msg("Pose").unwrap(), text);
    }

    #[test]
    fn reading_skips_comments_and_constants_and_refuses_what_a_channel_cannot_carry() {
        let (s, root) = Set::from_ros2msg(
            "demo/msg/Chatter",
            "# seq first\nuint8 MODE_IDLE=0\nuint64 seq  # counts\n\nuint64 deadline_ns\n",
        )
        .unwrap();
        assert_eq!(s.layout(&root).unwrap().size, 16);
        for (text, why) in [
            ("string name\n", "string"),
            ("bool ok\n", "bool"),
            ("uint8 a\nuint64 b\n", "pads"),
            ("int32[] v\n", "sequence"),
            ("int32[<=4] v\n", "sequence"),
            ("demo/Missing m\n", "no description"),
        ] {
            let e = Set::from_ros2msg("demo/msg/X", text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        assert!(Set::from_ros2msg("X", "uint8 a\n").is_err());
    }

    #[test]
    fn decodes_nested_and_arrays_and_refuses_short_messages() {
        let s = set(&[
            ("Inner.msg", "int16 a\nuint8 b\nuint8 c\n"),
            ("Outer.msg", "float64 x\nInner[2] i\nint32 v\nfloat32 f\n"),
        ]);
        let mut b = vec![0u8; 24];
        b[0..8].copy_from_slice(&1.5f64.to_le_bytes());
        b[8..10].copy_from_slice(&(-2i16).to_le_bytes());
        b[10] = 3;
        b[11] = 4;
        b[12..14].copy_from_slice(&7i16.to_le_bytes());
        b[16..20].copy_from_slice(&(-9i32).to_le_bytes());
        b[20..24].copy_from_slice(&0.25f32.to_le_bytes());
        assert_eq!(
            s.decode("Outer", &b).unwrap(),
            serde_json::json!({"x": 1.5, "i": [{"a": -2, "b": 3, "c": 4}, {"a": 7, "b": 0, "c": 0}], "v": -9, "f": 0.25})
        );
        assert!(s.decode("Outer", &b[..23]).is_none());
        let mut longer = b.clone();
        longer.push(0xff);
        assert_eq!(s.decode("Outer", &longer), s.decode("Outer", &b));
    }

    #[test]
    fn inline_fields_name_the_bad_one() {
        let d = Description::from_fields(
            "demo/Chatter",
            &["uint64 seq".into(), "uint64 deadline_ns".into()],
        )
        .unwrap();
        assert_eq!(
            (d.name.as_str(), d.package.as_deref()),
            ("Chatter", Some("demo"))
        );
        let e = Description::from_fields("demo/Chatter", &["uint64 seq".into(), "bool ok".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("fields[1] \"bool ok\": `bool`"), "{e}");
        let e = Description::from_fields("Chatter", &["uint64 seq".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("package/Name"), "{e}");
        let e = Description::from_fields("demo/Chatter", &["uint64 a\nuint64 b".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("fields[0]"), "{e}");
        assert!(Description::from_fields("demo/Chatter", &[]).is_err());
    }
}
