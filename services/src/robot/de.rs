//! serde deserialisation from a [`Node`] tree, with every error carrying
//! the field path and the position of the node it is about.
//!
//! Plain scalars are typed by YAML 1.2's core schema (`true`, `12`, `0x1f`,
//! `1.5`, `null`, `~`); quoted scalars are always strings. A field that
//! wants a string takes the scalar's text as written, so `version: 1.10`
//! stays `1.10`.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};

use super::echo;
use super::yaml::{Kind, Node, Pos};

/// A deserialisation error: what, where in the file, and at which field.
#[derive(Debug, Clone)]
pub struct DeError {
    pub message: String,
    pub pos: Option<Pos>,
    pub path: String,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: msg.to_string(),
            pos: None,
            path: String::new(),
        }
    }
}

/// Deserialises `T` from `node`, naming fields from `path`.
pub fn from_node<'de, T: serde::Deserialize<'de>>(
    node: &'de Node,
    path: &str,
) -> Result<T, DeError> {
    T::deserialize(NodeDe {
        node,
        path: path.to_string(),
    })
}

struct NodeDe<'a> {
    node: &'a Node,
    path: String,
}

/// A plain scalar's type under the core schema.
enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i128),
    /// An integer written with more digits than any field takes.
    TooLong,
    Float(f64),
    Str(&'a str),
}

fn resolve(text: &str, plain: bool) -> Resolved<'_> {
    if !plain {
        return Resolved::Str(text);
    }
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    let digits = |s: &str, radix: u32| !s.is_empty() && s.chars().all(|c| c.is_digit(radix));
    // An integer that does not fit in i128 is no less an integer: it is
    // refused as out of range, not taken for a string.
    if let Some(hex) = text.strip_prefix("0x") {
        if digits(hex, 16) {
            return i128::from_str_radix(hex, 16).map_or(Resolved::TooLong, Resolved::Int);
        }
    }
    if let Some(oct) = text.strip_prefix("0o") {
        if digits(oct, 8) {
            return i128::from_str_radix(oct, 8).map_or(Resolved::TooLong, Resolved::Int);
        }
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits(unsigned, 10) {
        return text
            .parse::<i128>()
            .map_or(Resolved::TooLong, Resolved::Int);
    }
    let is_float = {
        let (mantissa, exp) = match unsigned.find(['e', 'E']) {
            Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
            None => (unsigned, None),
        };
        let mantissa_ok = match mantissa.split_once('.') {
            Some((a, b)) => {
                (digits(a, 10) || a.is_empty())
                    && (digits(b, 10) || b.is_empty())
                    && !(a.is_empty() && b.is_empty())
            }
            None => digits(mantissa, 10),
        };
        let exp_ok = exp.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e), 10));
        mantissa_ok && exp_ok && (mantissa.contains('.') || exp.is_some())
    };
    if is_float {
        if let Ok(v) = text.parse::<f64>() {
            return Resolved::Float(v);
        }
    }
    Resolved::Str(text)
}

/// `e`, placed at `pos` and `path` unless it has a place already (an
/// error from deeper in the tree knows better).
fn placed(mut e: DeError, pos: Pos, path: &str) -> DeError {
    if e.pos.is_none() {
        e.pos = Some(pos);
        e.path = path.to_string();
    }
    e
}

impl<'a> NodeDe<'a> {
    fn child(&self, node: &'a Node, segment: &str) -> NodeDe<'a> {
        let path = if self.path.is_empty() {
            segment.to_string()
        } else if segment.starts_with('[') {
            format!("{}{segment}", self.path)
        } else {
            format!("{}.{segment}", self.path)
        };
        NodeDe { node, path }
    }

    /// Gives an error without a place this node's place.
    fn at<T>(&self, r: Result<T, DeError>) -> Result<T, DeError> {
        r.map_err(|e| placed(e, self.node.pos, &self.path))
    }

    /// Deserialises `seed` from this node; an error without a place gets
    /// this node's.
    fn deserialize_placed<T: DeserializeSeed<'a>>(self, seed: T) -> Result<T::Value, DeError> {
        let (pos, path) = (self.node.pos, self.path.clone());
        seed.deserialize(self).map_err(|e| placed(e, pos, &path))
    }

    fn what(&self) -> &'static str {
        match &self.node.kind {
            Kind::Scalar { .. } => "a single value",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    fn scalar(&self) -> Option<(&'a str, bool)> {
        match &self.node.kind {
            Kind::Scalar { text, plain } => Some((text.as_str(), *plain)),
            _ => None,
        }
    }

    fn int<V: Visitor<'a>>(&self, visitor: V) -> Result<V::Value, DeError> {
        match self.scalar().map(|(t, p)| resolve(t, p)) {
            Some(Resolved::Int(v)) if v >= 0 && v <= u64::MAX as i128 => {
                visitor.visit_u64(v as u64)
            }
            Some(Resolved::Int(v)) if v < 0 && v >= i64::MIN as i128 => visitor.visit_i64(v as i64),
            Some(Resolved::Int(v)) => Err(de::Error::custom(format!("{v} is out of range"))),
            _ => self.any(visitor),
        }
    }

    fn any<V: Visitor<'a>>(&self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            Kind::Scalar { text, plain } => match resolve(text, *plain) {
                Resolved::Null => visitor.visit_unit(),
                Resolved::Bool(b) => visitor.visit_bool(b),
                Resolved::Int(v) if v >= 0 && v <= u64::MAX as i128 => visitor.visit_u64(v as u64),
                Resolved::Int(v) if v < 0 && v >= i64::MIN as i128 => visitor.visit_i64(v as i64),
                Resolved::Int(v) => Err(de::Error::custom(format!("{v} is out of range"))),
                Resolved::TooLong => Err(de::Error::custom(format!(
                    "`{}` is out of range (a {}-digit number; no field takes more than 64 bits)",
                    echo::value(text),
                    text.trim_start_matches(['-', '+']).len()
                ))),
                Resolved::Float(f) => visitor.visit_f64(f),
                Resolved::Str(s) => visitor.visit_str(s),
            },
            Kind::Seq(items) => visitor.visit_seq(Seq {
                parent: self,
                items,
                next: 0,
            }),
            Kind::Map(entries) => visitor.visit_map(Map {
                parent: self,
                entries,
                next: 0,
                value: None,
            }),
        }
    }
}

macro_rules! forward_int {
    ($($name:ident)*) => {$(
        fn $name<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let r = self.int(visitor);
            self.at(r)
        }
    )*};
}

impl<'de> Deserializer<'de> for NodeDe<'de> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = self.any(visitor);
        self.at(r)
    }

    forward_int! {
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.scalar() {
            Some((text, _)) => visitor.visit_str(text),
            None => Err(de::Error::custom(format!(
                "expected a string here, found {}",
                self.what()
            ))),
        };
        self.at(r)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match self.scalar().map(|(t, p)| resolve(t, p)) {
            Some(Resolved::Null) => visitor.visit_none(),
            _ => visitor.visit_some(NodeDe {
                node: self.node,
                path: self.path.clone(),
            }),
        };
        self.at(r)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            Kind::Scalar { text, .. } => visitor.visit_enum(text.as_str().into_deserializer()),
            _ => Err(de::Error::custom(format!(
                "expected one of the listed names here, found {}",
                self.what()
            ))),
        };
        self.at(r)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let r = visitor.visit_newtype_struct(NodeDe {
            node: self.node,
            path: self.path.clone(),
        });
        self.at(r)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool f32 f64 bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
    }
}

struct Seq<'p, 'a> {
    parent: &'p NodeDe<'a>,
    items: &'a [Node],
    next: usize,
}

impl<'de> de::SeqAccess<'de> for Seq<'_, 'de> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        let Some(item) = self.items.get(self.next) else {
            return Ok(None);
        };
        let child = self.parent.child(item, &format!("[{}]", self.next));
        self.next += 1;
        child.deserialize_placed(seed).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len() - self.next)
    }
}

struct Map<'p, 'a> {
    parent: &'p NodeDe<'a>,
    entries: &'a [(Node, Node)],
    next: usize,
    value: Option<NodeDe<'a>>,
}

impl<'de> de::MapAccess<'de> for Map<'_, 'de> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((key, value)) = self.entries.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        let name = key.as_str().unwrap_or("?");
        let key_de = self.parent.child(key, name);
        self.value = Some(self.parent.child(value, name));
        key_de.deserialize_placed(seed).map(Some)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, DeError> {
        let value = self
            .value
            .take()
            .ok_or_else(|| <DeError as de::Error>::custom("value without a key"))?;
        value.deserialize_placed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len() - self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::super::yaml::parse;
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        n: u32,
        #[serde(default)]
        f: Option<f64>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        name: String,
        items: Vec<Inner>,
        #[serde(default)]
        flag: bool,
    }

    #[test]
    fn typed_values() {
        let doc =
            parse("name: 1.10\nitems:\n  - n: 3\n    f: 2\n  - {n: 0x10}\nflag: true\n").unwrap();
        let o: Outer = from_node(&doc, "").unwrap();
        assert_eq!(o.name, "1.10");
        assert_eq!(o.items[0].f, Some(2.0));
        assert_eq!(o.items[1].n, 16);
        assert!(o.flag);
    }

    #[test]
    fn errors_name_field_and_place() {
        let doc = parse("name: x\nitems:\n  - n: 3\n  - n: -1\n").unwrap();
        let e = from_node::<Outer>(&doc, "").unwrap_err();
        assert_eq!(e.path, "items[1].n");
        assert_eq!(e.pos, Some(Pos { line: 4, col: 8 }));

        let doc = parse("name: x\nitems: []\nflg: true\n").unwrap();
        let e = from_node::<Outer>(&doc, "").unwrap_err();
        assert_eq!(e.path, "flg");
        assert_eq!(e.pos.unwrap().line, 3);
        assert!(e.message.contains("unknown field `flg`"), "{}", e.message);

        let doc = parse("name: x\n").unwrap();
        let e = from_node::<Outer>(&doc, "").unwrap_err();
        assert!(e.message.contains("missing field `items`"));
        assert_eq!(e.pos.unwrap().line, 1);

        let doc = parse("name: [a]\nitems: []\n").unwrap();
        let e = from_node::<Outer>(&doc, "").unwrap_err();
        assert!(e.message.contains("found a list"), "{}", e.message);
    }

    #[test]
    fn core_schema() {
        assert!(matches!(resolve("12", true), Resolved::Int(12)));
        assert!(matches!(resolve("-3", true), Resolved::Int(-3)));
        assert!(matches!(resolve("0o17", true), Resolved::Int(15)));
        assert!(matches!(resolve("1e3", true), Resolved::Float(_)));
        assert!(matches!(resolve(".5", true), Resolved::Float(_)));
        assert!(matches!(resolve("12", false), Resolved::Str("12")));
        assert!(matches!(resolve("500us", true), Resolved::Str(_)));
        assert!(matches!(resolve("4-5", true), Resolved::Str(_)));
        assert!(matches!(resolve("~", true), Resolved::Null));
        assert!(matches!(resolve(".", true), Resolved::Str(_)));
        let huge = "9".repeat(100);
        assert!(matches!(resolve(&huge, true), Resolved::TooLong));
        assert!(matches!(
            resolve(&format!("0x{huge}"), true),
            Resolved::TooLong
        ));
        assert!(matches!(resolve(&huge, false), Resolved::Str(_)));
    }
}
