//! Message types of logged channels, as robot.yaml declares them
//! (`log.types`), written into the log as `ros2msg` schemas with `cdr`
//! messages, which Foxglove and the ROS 2 tools decode without a plugin.
//!
//! Why this works with the bytes exactly as published: a channel message
//! is a `repr(C)` struct. Plain CDR (XCDR1, little endian) aligns each
//! primitive to its own size, counted from the end of its 4-byte
//! encapsulation header, and writes fixed-size arrays without a length;
//! C aligns each field to its own alignment, which for these primitives
//! is their size, counted from the start of the struct. For a flat
//! struct of primitives and fixed arrays (the only kind declared here)
//! both put every field at the same offset, so a logged message is the
//! 4-byte CDR header followed by the published bytes, unchanged. Only C's
//! trailing padding differs, and CDR readers ignore trailing bytes.
//! Nested structs are not accepted: C pads a nested struct to its
//! alignment and CDR does not, so the offsets after one would differ.

use serde::{Deserialize, Serialize};

/// The CDR encapsulation header in front of each logged message of a
/// typed channel: representation `CDR_LE`, no options.
pub const CDR_HEADER: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// The most fields a declared type may have.
pub const MAX_FIELDS: usize = 256;
/// The longest array a field may declare.
pub const MAX_ARRAY: u64 = 1 << 20;

/// `log.types.<channel>`: what a channel's messages hold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TypeDecl {
    /// The type's name, `package/Name` (written as the ros2msg schema
    /// name `package/msg/Name`).
    pub name: String,
    /// The struct's fields in declaration order, each `TYPE NAME` or
    /// `TYPE[N] NAME` with a ros2msg primitive TYPE: `bool`, `byte`,
    /// `char`, `int8` .. `int64`, `uint8` .. `uint64`, `float32`,
    /// `float64`.
    pub fields: Vec<String>,
}

/// A primitive of a declared field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    Bool,
    Byte,
    Char,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl Prim {
    fn parse(s: &str) -> Option<Prim> {
        Some(match s {
            "bool" => Prim::Bool,
            "byte" => Prim::Byte,
            "char" => Prim::Char,
            "int8" => Prim::I8,
            "uint8" => Prim::U8,
            "int16" => Prim::I16,
            "uint16" => Prim::U16,
            "int32" => Prim::I32,
            "uint32" => Prim::U32,
            "int64" => Prim::I64,
            "uint64" => Prim::U64,
            "float32" => Prim::F32,
            "float64" => Prim::F64,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Prim::Bool => "bool",
            Prim::Byte => "byte",
            Prim::Char => "char",
            Prim::I8 => "int8",
            Prim::U8 => "uint8",
            Prim::I16 => "int16",
            Prim::U16 => "uint16",
            Prim::I32 => "int32",
            Prim::U32 => "uint32",
            Prim::I64 => "int64",
            Prim::U64 => "uint64",
            Prim::F32 => "float32",
            Prim::F64 => "float64",
        }
    }

    /// Size, and alignment, in bytes.
    pub fn size(self) -> u64 {
        match self {
            Prim::Bool | Prim::Byte | Prim::Char | Prim::I8 | Prim::U8 => 1,
            Prim::I16 | Prim::U16 => 2,
            Prim::I32 | Prim::U32 | Prim::F32 => 4,
            Prim::I64 | Prim::U64 | Prim::F64 => 8,
        }
    }

    fn decode(self, b: &[u8]) -> serde_json::Value {
        use serde_json::Value;
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        let u = u64::from_le_bytes(a);
        match self {
            Prim::Bool => Value::Bool(b[0] != 0),
            Prim::Byte | Prim::Char | Prim::U8 | Prim::U16 | Prim::U32 | Prim::U64 => u.into(),
            Prim::I8 => (b[0] as i8).into(),
            Prim::I16 => (u as u16 as i16).into(),
            Prim::I32 => (u as u32 as i32).into(),
            Prim::I64 => (u as i64).into(),
            Prim::F32 => serde_json::Number::from_f64(f32::from_bits(u as u32) as f64)
                .map_or(Value::Null, Value::Number),
            Prim::F64 => {
                serde_json::Number::from_f64(f64::from_bits(u)).map_or(Value::Null, Value::Number)
            }
        }
    }
}

/// One field, placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub prim: Prim,
    /// `Some(n)` for `TYPE[n]`.
    pub array: Option<u64>,
    pub offset: u64,
}

/// A declared type with its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub name: String,
    pub fields: Vec<Field>,
    /// `size_of` of the matching `repr(C)` struct (trailing padding
    /// included).
    pub size: u64,
}

fn valid_ident(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
        && !s.ends_with('_')
        && !s.contains("__")
}

fn valid_type_name(s: &str) -> bool {
    let Some((pkg, name)) = s.split_once('/') else {
        return false;
    };
    valid_ident(pkg)
        && !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_uppercase()
        && name.bytes().all(|c| c.is_ascii_alphanumeric())
}

/// Why a declared type cannot be laid out ([`TypeDecl::layout`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TypeLayoutError {
    #[error("name {name:?}: expected `package/Name` (lower-case package, a Name of letters and digits starting upper case)")]
    TypeName { name: String },
    #[error("no fields")]
    NoFields,
    #[error("{count} fields (at most {max})", max = MAX_FIELDS)]
    TooManyFields { count: usize },
    /// `fields[i]`, as declared, and what is wrong with it.
    #[error("fields[{index}] {field:?}: {problem}")]
    Field {
        index: usize,
        field: String,
        problem: FieldProblem,
    },
}

/// What is wrong with one declared field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("expected `TYPE NAME` or `TYPE[N] NAME`, e.g. `float64 x`")]
    Shape,
    #[error("array length: expected `TYPE[N]` with N from 1 to {max}", max = MAX_ARRAY)]
    ArrayLength,
    #[error("type {prim:?}: not a primitive (bool, byte, char, int8..int64, uint8..uint64, float32, float64; nested types are not supported)")]
    NotPrimitive { prim: String },
    #[error("name {name:?}: expected lower case letters, digits and single underscores, starting with a letter")]
    Name { name: String },
    #[error("name {name:?} declared twice")]
    Twice { name: String },
}

impl TypeDecl {
    /// Parses and places the fields; the error says which field and why.
    pub fn layout(&self) -> Result<Layout, TypeLayoutError> {
        if !valid_type_name(&self.name) {
            return Err(TypeLayoutError::TypeName {
                name: self.name.clone(),
            });
        }
        if self.fields.is_empty() {
            return Err(TypeLayoutError::NoFields);
        }
        if self.fields.len() > MAX_FIELDS {
            return Err(TypeLayoutError::TooManyFields {
                count: self.fields.len(),
            });
        }
        let mut fields: Vec<Field> = Vec::with_capacity(self.fields.len());
        let (mut offset, mut align) = (0u64, 1u64);
        for (i, f) in self.fields.iter().enumerate() {
            let bad = |problem: FieldProblem| TypeLayoutError::Field {
                index: i,
                field: f.clone(),
                problem,
            };
            let mut parts = f.split_whitespace();
            let (Some(ty), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(FieldProblem::Shape));
            };
            let (prim, array) = match ty.split_once('[') {
                None => (ty, None),
                Some((p, rest)) => {
                    let n = rest
                        .strip_suffix(']')
                        .and_then(|n| n.parse::<u64>().ok())
                        .filter(|n| (1..=MAX_ARRAY).contains(n))
                        .ok_or_else(|| bad(FieldProblem::ArrayLength))?;
                    (p, Some(n))
                }
            };
            let prim = Prim::parse(prim).ok_or_else(|| {
                bad(FieldProblem::NotPrimitive {
                    prim: prim.to_string(),
                })
            })?;
            if !valid_ident(name) {
                return Err(bad(FieldProblem::Name {
                    name: name.to_string(),
                }));
            }
            if fields.iter().any(|g| g.name == name) {
                return Err(bad(FieldProblem::Twice {
                    name: name.to_string(),
                }));
            }
            let a = prim.size();
            offset = offset.div_ceil(a) * a;
            fields.push(Field {
                name: name.to_string(),
                prim,
                array,
                offset,
            });
            offset += a * array.unwrap_or(1);
            align = align.max(a);
        }
        Ok(Layout {
            name: self.name.clone(),
            fields,
            size: offset.div_ceil(align) * align,
        })
    }
}

impl Layout {
    /// The ros2msg schema name: `package/msg/Name`.
    pub fn schema_name(&self) -> String {
        let (pkg, name) = self
            .name
            .split_once('/')
            .unwrap_or(("rtdeploy", &self.name));
        format!("{pkg}/msg/{name}")
    }

    /// The ros2msg schema text, a field per line.
    pub fn ros2msg(&self) -> String {
        let mut s = String::new();
        for f in &self.fields {
            match f.array {
                Some(n) => s.push_str(&format!("{}[{n}] {}\n", f.prim.name(), f.name)),
                None => s.push_str(&format!("{} {}\n", f.prim.name(), f.name)),
            }
        }
        s
    }

    /// The bytes fields end at (without trailing padding): the least a
    /// message must hold to decode.
    pub fn end(&self) -> u64 {
        self.fields
            .last()
            .map_or(0, |f| f.offset + f.prim.size() * f.array.unwrap_or(1))
    }

    /// Decodes a message's payload (as published, without the CDR
    /// header) into a JSON object; `None` when it is shorter than the
    /// fields.
    pub fn decode(&self, data: &[u8]) -> Option<serde_json::Value> {
        if (data.len() as u64) < self.end() {
            return None;
        }
        let mut obj = serde_json::Map::new();
        for f in &self.fields {
            let sz = f.prim.size() as usize;
            let at = f.offset as usize;
            let v = match f.array {
                None => f.prim.decode(&data[at..at + sz]),
                Some(n) => serde_json::Value::Array(
                    (0..n as usize)
                        .map(|k| f.prim.decode(&data[at + k * sz..at + (k + 1) * sz]))
                        .collect(),
                ),
            };
            obj.insert(f.name.clone(), v);
        }
        Some(serde_json::Value::Object(obj))
    }
}

/// Parses a ros2msg schema of the flat kind [`Layout::ros2msg`] writes
/// (comments, blank lines and constants skipped), for reading logs
/// written by other tools; `None` for anything else.
pub fn parse_ros2msg(schema_name: &str, text: &str) -> Option<Layout> {
    let mut fields = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with("===") {
            break; // dependent definitions: this reader has no nested types
        }
        if line.contains('=') {
            continue; // a constant
        }
        fields.push(line.to_string());
    }
    let name = schema_name.replacen("/msg/", "/", 1);
    TypeDecl { name, fields }.layout().ok()
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

    #[repr(C)]
    struct Mixed {
        a: u8,
        b: u64,
        c: [u16; 3],
        d: f32,
        e: i8,
    }

    #[test]
    fn layout_is_the_c_layout() {
        let l = decl(&["uint8 a", "uint64 b", "uint16[3] c", "float32 d", "int8 e"])
            .layout()
            .unwrap();
        let offs: Vec<u64> = l.fields.iter().map(|f| f.offset).collect();
        assert_eq!(
            offs,
            vec![
                std::mem::offset_of!(Mixed, a) as u64,
                std::mem::offset_of!(Mixed, b) as u64,
                std::mem::offset_of!(Mixed, c) as u64,
                std::mem::offset_of!(Mixed, d) as u64,
                std::mem::offset_of!(Mixed, e) as u64,
            ]
        );
        assert_eq!(l.size, std::mem::size_of::<Mixed>() as u64);
        assert_eq!(l.schema_name(), "demo/msg/Chatter");
        assert_eq!(
            l.ros2msg(),
            "uint8 a\nuint64 b\nuint16[3] c\nfloat32 d\nint8 e\n"
        );
        assert_eq!(parse_ros2msg("demo/msg/Chatter", &l.ros2msg()), Some(l));
    }

    #[test]
    fn decodes_every_primitive() {
        let l = decl(&["bool ok", "int16 s", "float64 x", "int32[2] v"])
            .layout()
            .unwrap();
        let mut b = vec![0u8; l.size as usize];
        b[0] = 1;
        b[2..4].copy_from_slice(&(-2i16).to_le_bytes());
        b[8..16].copy_from_slice(&1.5f64.to_le_bytes());
        b[16..20].copy_from_slice(&7i32.to_le_bytes());
        b[20..24].copy_from_slice(&(-7i32).to_le_bytes());
        assert_eq!(
            l.decode(&b).unwrap(),
            serde_json::json!({"ok": true, "s": -2, "x": 1.5, "v": [7, -7]})
        );
        assert!(l.decode(&b[..10]).is_none());
    }

    #[test]
    fn refuses_what_cdr_would_lay_out_otherwise_or_cannot_name() {
        for (fields, why) in [
            (vec!["demo/Inner x"], "not a primitive"),
            (vec!["float64"], "expected `TYPE NAME`"),
            (vec!["float64 x y"], "expected `TYPE NAME`"),
            (vec!["uint8[0] x"], "array length"),
            (vec!["uint8[] x"], "array length"),
            (vec!["uint8[2000000] x"], "array length"),
            (vec!["float64 X"], "name \"X\""),
            (vec!["float64 a__b"], "name"),
            (vec!["float64 x", "uint8 x"], "declared twice"),
            (vec![], "no fields"),
        ] {
            let e = decl(&fields).layout().unwrap_err().to_string();
            assert!(e.contains(why), "{fields:?}: {e}");
        }
        let mut d = decl(&["float64 x"]);
        d.name = "Chatter".into();
        assert!(d.layout().unwrap_err().to_string().contains("package/Name"));
    }
}
