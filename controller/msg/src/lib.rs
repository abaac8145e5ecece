//! Message descriptions: the one definition of a channel's message type
//! that every language's code is made from.
//!
//! A description is a ROS 2 style `.msg` field list, one field a line:
//!
//! ```text
//! # A joint command.
//! uint64 seq
//! float32[6] torque
//! Vector3 offset      # another description of the same set
//! uint32 mode
//! uint32 _reserved
//! ```
//!
//! Types are the fixed-size primitives `int8` .. `int64`, `uint8` ..
//! `uint64`, `float32`, `float64` (`byte` and `char` are `uint8`), fixed
//! arrays `T[N]`, and other descriptions of the set, by name. What a
//! channel cannot carry as plain bytes is refused with its line and
//! column: `bool` (not valid for every bit pattern), strings, unbounded
//! and bounded sequences, constants and default values. A description is
//! laid out as C lays out the struct (each field at a multiple of its
//! alignment) and must have no padding, so that Rust's `repr(C)`, C, C++,
//! numpy and ctypes agree byte for byte; reorder the fields or add
//! reserved ones where it would.
//!
//! [`Set::layout_hash`] is the hash a channel records for the type
//! (defined in `controller::shm`, where `shm_struct!` computes the same
//! at compile time): a Rust, C, C++ or Python process made from the same
//! description carries the same record, and a channel bound to another
//! refuses it, naming both. [`rust`], [`c`] and [`python`] write each
//! language's type (`deploy gen`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use controller::shm::{layout_hash_bytes, layout_hash_mix, TypeName, LAYOUT_HASH_START};

pub mod ros;

/// The most fields a description may have.
pub const MAX_FIELDS: usize = 1024;
/// The longest array a field may declare.
pub const MAX_ARRAY: u64 = 1 << 24;
/// The most descriptions nested inside one another.
pub const MAX_DEPTH: usize = 16;
/// The largest message a description may describe (a channel's limit).
pub const MAX_SIZE: u64 = controller::config::MAX_MESSAGE_SIZE;
/// The longest description file read.
pub const MAX_TEXT: usize = 256 << 10;

/// A fixed-size primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
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
    const ALL: [Prim; 10] = [
        Prim::I8,
        Prim::U8,
        Prim::I16,
        Prim::U16,
        Prim::I32,
        Prim::U32,
        Prim::I64,
        Prim::U64,
        Prim::F32,
        Prim::F64,
    ];

    /// The description's name, the one the layout hash covers.
    pub fn name(self) -> &'static str {
        match self {
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

    fn parse(s: &str) -> Option<Prim> {
        match s {
            "byte" | "char" => Some(Prim::U8),
            _ => Prim::ALL.into_iter().find(|p| p.name() == s),
        }
    }

    pub fn size(self) -> u64 {
        match self {
            Prim::I8 | Prim::U8 => 1,
            Prim::I16 | Prim::U16 => 2,
            Prim::I32 | Prim::U32 | Prim::F32 => 4,
            Prim::I64 | Prim::U64 | Prim::F64 => 8,
        }
    }

    /// A little-endian value of this primitive (`b` its size) as JSON;
    /// a float that JSON cannot hold (NaN, infinity) is null.
    fn decode(self, b: &[u8]) -> serde_json::Value {
        use serde_json::Value;
        let mut a = [0u8; 8];
        a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
        let u = u64::from_le_bytes(a);
        match self {
            Prim::U8 | Prim::U16 | Prim::U32 | Prim::U64 => u.into(),
            Prim::I8 => (u as u8 as i8).into(),
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

    fn rust(self) -> &'static str {
        match self {
            Prim::I8 => "i8",
            Prim::U8 => "u8",
            Prim::I16 => "i16",
            Prim::U16 => "u16",
            Prim::I32 => "i32",
            Prim::U32 => "u32",
            Prim::I64 => "i64",
            Prim::U64 => "u64",
            Prim::F32 => "f32",
            Prim::F64 => "f64",
        }
    }

    fn c(self) -> &'static str {
        match self {
            Prim::I8 => "int8_t",
            Prim::U8 => "uint8_t",
            Prim::I16 => "int16_t",
            Prim::U16 => "uint16_t",
            Prim::I32 => "int32_t",
            Prim::U32 => "uint32_t",
            Prim::I64 => "int64_t",
            Prim::U64 => "uint64_t",
            Prim::F32 => "float",
            Prim::F64 => "double",
        }
    }

    fn ctypes(self) -> &'static str {
        match self {
            Prim::I8 => "ctypes.c_int8",
            Prim::U8 => "ctypes.c_uint8",
            Prim::I16 => "ctypes.c_int16",
            Prim::U16 => "ctypes.c_uint16",
            Prim::I32 => "ctypes.c_int32",
            Prim::U32 => "ctypes.c_uint32",
            Prim::I64 => "ctypes.c_int64",
            Prim::U64 => "ctypes.c_uint64",
            Prim::F32 => "ctypes.c_float",
            Prim::F64 => "ctypes.c_double",
        }
    }

    fn numpy(self) -> &'static str {
        match self {
            Prim::I8 => "<i1",
            Prim::U8 => "<u1",
            Prim::I16 => "<i2",
            Prim::U16 => "<u2",
            Prim::I32 => "<i4",
            Prim::U32 => "<u4",
            Prim::I64 => "<i8",
            Prim::U64 => "<u8",
            Prim::F32 => "<f4",
            Prim::F64 => "<f8",
        }
    }
}

/// A field's element type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elem {
    Prim(Prim),
    /// Another description of the set, by its name.
    Msg(String),
}

/// One field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub elem: Elem,
    /// `T[N]`: N.
    pub array: Option<u64>,
    /// Declared `byte`: the bytes of a `uint8`, but an octet
    /// (`FIELD_TYPE_BYTE`) in ROS 2's type description and its hash.
    pub octet: bool,
    /// Its line in the file.
    pub line: usize,
}

/// One description: a `.msg` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The type's name (the file's stem): the struct's name in every
    /// language and the name a channel records.
    pub name: String,
    /// The package it belongs to, when known (`pkg/msg/Name.msg`): the
    /// ROS 2 name `pkg/msg/Name` in logs and the bridge.
    pub package: Option<String>,
    /// The comment lines before the first field.
    pub doc: Vec<String>,
    pub fields: Vec<Field>,
}

/// A description that cannot be a channel's type, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescriptionError {
    #[error("{file}:{line}:{column}: {what}")]
    At {
        file: String,
        line: usize,
        column: usize,
        what: String,
    },
    #[error("{file}: {what}")]
    Whole { file: String, what: String },
}

const KEYWORDS: &[&str] = &[
    // Rust, C and C++, and Python: a field named so would not compile.
    "as",
    "break",
    "const",
    "continue",
    "crate",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "Self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "async",
    "await",
    "dyn",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "macro",
    "override",
    "priv",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "try",
    "auto",
    "case",
    "char",
    "default",
    "double",
    "float",
    "goto",
    "int",
    "long",
    "register",
    "short",
    "signed",
    "sizeof",
    "switch",
    "typedef",
    "union",
    "unsigned",
    "void",
    "volatile",
    "class",
    "delete",
    "friend",
    "namespace",
    "new",
    "operator",
    "private",
    "protected",
    "public",
    "template",
    "this",
    "throw",
    "typename",
    "using",
    "and",
    "def",
    "del",
    "elif",
    "except",
    "from",
    "global",
    "import",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "with",
    "None",
    "True",
    "False",
];

fn identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

impl Description {
    /// Parses the text of `file` (its stem the type's name, its parent
    /// `msg` folder's parent the package when the path has one).
    pub fn parse(file: &str, text: &str) -> Result<Description, DescriptionError> {
        let whole = |what: String| DescriptionError::Whole {
            file: file.to_string(),
            what,
        };
        if text.len() > MAX_TEXT {
            return Err(whole(format!(
                "{} bytes: a description is at most {MAX_TEXT}",
                text.len()
            )));
        }
        let path = std::path::Path::new(file);
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if !identifier(&name) || name.len() > TypeName::MAX {
            return Err(whole(format!(
                "the type's name `{name}` (the file's stem) must be an identifier of at most {} bytes",
                TypeName::MAX
            )));
        }
        let package = path
            .parent()
            .filter(|p| p.file_name().is_some_and(|n| n == "msg"))
            .and_then(|p| p.parent())
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .filter(|n| identifier(n))
            .map(str::to_string);
        let mut d = Description {
            name,
            package,
            doc: Vec::new(),
            fields: Vec::new(),
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let at = |column: usize, what: String| DescriptionError::At {
                file: file.to_string(),
                line,
                column,
                what,
            };
            let (code, comment) = match raw.find('#') {
                Some(k) => (&raw[..k], Some(raw[k + 1..].trim())),
                None => (raw, None),
            };
            if code.trim().is_empty() {
                if let (Some(c), true) = (comment, d.fields.is_empty()) {
                    // Printable text only: it goes into three languages'
                    // comments and a Python string.
                    d.doc.push(
                        c.chars()
                            .map(|ch| if ch.is_control() { '?' } else { ch })
                            .collect(),
                    );
                }
                continue;
            }
            // `NAME=VALUE`: an `=` outside a `[...]` (`T[<=N]` is a
            // bounded sequence, refused below).
            let mut depth = 0i32;
            let eq = code.char_indices().find(|&(_, ch)| {
                match ch {
                    '[' => depth += 1,
                    ']' => depth -= 1,
                    _ => {}
                }
                ch == '=' && depth == 0
            });
            if let Some((k, _)) = eq {
                return Err(at(
                    k + 1,
                    "a constant: a channel's type has fields only".into(),
                ));
            }
            let words: Vec<(usize, &str)> = code
                .split_whitespace()
                .map(|w| (w.as_ptr() as usize - code.as_ptr() as usize + 1, w))
                .collect();
            match words.len() {
                2 => {}
                n if n > 2 => {
                    return Err(at(
                        words[2].0,
                        "a default value: a channel's type has none".into(),
                    ))
                }
                _ => {
                    return Err(at(
                        words[0].0,
                        "expected `TYPE NAME` or `TYPE[N] NAME`".into(),
                    ))
                }
            }
            let ((tcol, ty), (ncol, fname)) = (words[0], words[1]);
            if !identifier(fname) {
                return Err(at(ncol, format!("`{fname}` is not a field name")));
            }
            if KEYWORDS.contains(&fname) {
                return Err(at(
                    ncol,
                    format!("`{fname}` is a keyword of Rust, C, C++ or Python"),
                ));
            }
            if d.fields.iter().any(|f| f.name == fname) {
                return Err(at(ncol, format!("a second field named `{fname}`")));
            }
            let (base, array) = match ty.split_once('[') {
                None => (ty, None),
                Some((b, rest)) => {
                    let Some(n) = rest.strip_suffix(']') else {
                        return Err(at(tcol, format!("`{ty}`: expected `T[N]`")));
                    };
                    if n.is_empty() || n.starts_with("<=") {
                        return Err(at(
                            tcol,
                            format!(
                                "`{ty}`: a sequence; a channel's message has a fixed size: give `T[N]`"
                            ),
                        ));
                    }
                    match n.parse::<u64>() {
                        Ok(n) if (1..=MAX_ARRAY).contains(&n) => (b, Some(n)),
                        _ => {
                            return Err(at(
                                tcol,
                                format!("`{ty}`: the length must be 1 to {MAX_ARRAY}"),
                            ))
                        }
                    }
                }
            };
            let elem = match Prim::parse(base) {
                Some(p) => Elem::Prim(p),
                None => match base {
                    "bool" => {
                        return Err(at(
                            tcol,
                            "`bool`: not valid for every bit pattern another process may write: use uint8".into(),
                        ))
                    }
                    "string" | "wstring" => {
                        return Err(at(
                            tcol,
                            format!("`{base}`: of no fixed size: use uint8[N]"),
                        ))
                    }
                    "time" | "duration" => {
                        return Err(at(
                            tcol,
                            format!("`{base}`: give the nanoseconds as int64 or uint64"),
                        ))
                    }
                    other => {
                        // `pkg/Name` or `Name`: another description.
                        let short = other.rsplit('/').next().unwrap_or(other);
                        if !identifier(short) {
                            return Err(at(tcol, format!("`{other}` is not a type")));
                        }
                        Elem::Msg(short.to_string())
                    }
                },
            };
            if d.fields.len() == MAX_FIELDS {
                return Err(at(tcol, format!("more than {MAX_FIELDS} fields")));
            }
            d.fields.push(Field {
                name: fname.to_string(),
                elem,
                array,
                octet: base == "byte",
                line,
            });
        }
        if d.fields.is_empty() {
            return Err(whole("no field".into()));
        }
        Ok(d)
    }
}

/// A field's place in its struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub offset: u64,
    pub size: u64,
    pub align: u64,
}

/// A struct's size, alignment and fields' places.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub size: u64,
    pub align: u64,
    pub fields: Vec<Placed>,
    pub hash: u64,
}

/// Descriptions that may refer to one another, by name.
#[derive(Debug, Clone, Default)]
pub struct Set {
    by_name: BTreeMap<String, Description>,
}

impl Set {
    /// The set of `descriptions` (names must differ).
    pub fn new(descriptions: Vec<Description>) -> Result<Set, DescriptionError> {
        let mut by_name = BTreeMap::new();
        for d in descriptions {
            if by_name.contains_key(&d.name) {
                return Err(DescriptionError::Whole {
                    file: d.name.clone(),
                    what: "two descriptions of this name".into(),
                });
            }
            by_name.insert(d.name.clone(), d);
        }
        Ok(Set { by_name })
    }

    pub fn get(&self, name: &str) -> Option<&Description> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The layout of `name` and its layout hash: fields in order at
    /// multiples of their alignment with no padding between them or at
    /// the end, every nested description known, no cycle.
    pub fn layout(&self, name: &str) -> Result<Layout, DescriptionError> {
        self.layout_at(name, 0)
    }

    /// The hash a channel records for `name` (see the crate's docs).
    pub fn layout_hash(&self, name: &str) -> Result<u64, DescriptionError> {
        Ok(self.layout(name)?.hash)
    }

    fn layout_at(&self, name: &str, depth: usize) -> Result<Layout, DescriptionError> {
        let d = self
            .by_name
            .get(name)
            .ok_or_else(|| DescriptionError::Whole {
                file: name.to_string(),
                what: "no such description in the set".into(),
            })?;
        let file = format!("{}.msg", d.name);
        if depth > MAX_DEPTH {
            return Err(DescriptionError::Whole {
                file,
                what: format!("descriptions nested more than {MAX_DEPTH} deep (a cycle?)"),
            });
        }
        let mut h = layout_hash_bytes(LAYOUT_HASH_START, d.name.as_bytes());
        let (mut offset, mut align) = (0u64, 1u64);
        let mut fields = Vec::new();
        for f in &d.fields {
            let at = |what: String| DescriptionError::At {
                file: file.clone(),
                line: f.line,
                column: 1,
                what,
            };
            let (esize, ealign, ehash) = match &f.elem {
                Elem::Prim(p) => (
                    p.size(),
                    p.size(),
                    layout_hash_bytes(LAYOUT_HASH_START, p.name().as_bytes()),
                ),
                Elem::Msg(m) => {
                    if !self.by_name.contains_key(m) {
                        return Err(at(format!("`{m}`: no description of that name in the set")));
                    }
                    let l = self.layout_at(m, depth + 1)?;
                    (l.size, l.align, l.hash)
                }
            };
            let (size, fhash) = match f.array {
                None => (esize, ehash),
                Some(n) => (
                    esize.saturating_mul(n),
                    layout_hash_mix(
                        layout_hash_mix(layout_hash_bytes(LAYOUT_HASH_START, b"[]"), ehash),
                        n,
                    ),
                ),
            };
            if offset % ealign != 0 {
                let pad = ealign - offset % ealign;
                return Err(at(format!(
                    "field `{}` would start at byte {offset}, which C pads by {pad} to {}: reorder the fields by alignment or add a reserved field of {pad} bytes before it",
                    f.name,
                    offset + pad
                )));
            }
            fields.push(Placed {
                offset,
                size,
                align: ealign,
            });
            offset = offset.saturating_add(size);
            align = align.max(ealign);
            h = layout_hash_bytes(h, f.name.as_bytes());
            h = layout_hash_mix(h, fhash);
        }
        if offset % align != 0 {
            let pad = align - offset % align;
            return Err(DescriptionError::Whole {
                file,
                what: format!(
                    "{offset} bytes of fields, which C pads by {pad} to a multiple of the alignment {align}: add a reserved field of {pad} bytes at the end"
                ),
            });
        }
        if offset > MAX_SIZE {
            return Err(DescriptionError::Whole {
                file,
                what: format!("{offset} bytes; a channel carries at most {MAX_SIZE}"),
            });
        }
        Ok(Layout {
            size: offset,
            align,
            fields,
            hash: h,
        })
    }

    /// `name` and the descriptions it uses, each once, the used first.
    fn in_order(&self, name: &str, out: &mut Vec<String>) {
        if out.iter().any(|n| n == name) {
            return;
        }
        if let Some(d) = self.by_name.get(name) {
            for f in &d.fields {
                if let Elem::Msg(m) = &f.elem {
                    self.in_order(m, out);
                }
            }
        }
        out.push(name.to_string());
    }
}

fn header_line(d: &Description, l: &Layout, comment: &str) -> String {
    format!(
        "{comment} Generated by `deploy gen` from {}.msg: do not edit. {} bytes, layout hash {:#018x}.\n",
        d.name, l.size, l.hash
    )
}

/// The Rust type of `name` alone: a `controller::shm_struct!` and a
/// compile-time check that its hash is the description's. The
/// descriptions it uses are named, expected in the same module (write
/// them too, or [`rust_set`]).
pub fn rust(set: &Set, name: &str) -> Result<String, DescriptionError> {
    rust_of(set, &[name.to_string()])
}

/// The Rust types of the whole set, each once, a used one before its
/// user: one module's worth.
pub fn rust_set(set: &Set) -> Result<String, DescriptionError> {
    let mut order = Vec::new();
    for n in set.names() {
        set.in_order(n, &mut order);
    }
    rust_of(set, &order)
}

fn rust_of(set: &Set, order: &[String]) -> Result<String, DescriptionError> {
    let mut out = String::new();
    for n in order {
        let d = set.get(n).ok_or_else(|| DescriptionError::Whole {
            file: n.clone(),
            what: "no such description in the set".into(),
        })?;
        let l = set.layout(n)?;
        out.push_str(&header_line(d, &l, "//"));
        out.push_str("controller::shm_struct! {\n");
        for c in &d.doc {
            let _ = writeln!(out, "    /// {c}");
        }
        out.push_str("    #[derive(Debug, PartialEq)]\n");
        let _ = writeln!(out, "    pub struct {} {{", d.name);
        for f in &d.fields {
            let elem = match &f.elem {
                Elem::Prim(p) => p.rust().to_string(),
                Elem::Msg(m) => m.clone(),
            };
            let ty = match f.array {
                Some(n) => format!("[{elem}; {n}]"),
                None => elem,
            };
            let _ = writeln!(out, "        pub {}: {ty},", f.name);
        }
        out.push_str("    }\n}\n");
        let _ = writeln!(
            out,
            "const _: () = assert!(<{} as controller::ShmSafe>::LAYOUT_HASH == {:#018x});\n",
            d.name, l.hash
        );
    }
    Ok(out)
}

/// The C type (C11, and C++ through the same header): the struct, its
/// size and every offset checked by the compiler, and its `rtd_type`
/// (`<Name>_type`) for `rtd_sender_new`, `rtd_watch` and `rtd_fetcher_new`.
pub fn c(set: &Set, name: &str) -> Result<String, DescriptionError> {
    let d = set.get(name).ok_or_else(|| DescriptionError::Whole {
        file: name.to_string(),
        what: "no such description in the set".into(),
    })?;
    let l0 = set.layout(name)?;
    let guard = format!("RTDEPLOY_MSG_{}_H", d.name.to_ascii_uppercase());
    let mut out = header_line(d, &l0, "/*").trim_end().to_string() + " */\n";
    let _ = write!(
        out,
        "#ifndef {guard}\n#define {guard}\n\n#include <stddef.h>\n#include <stdint.h>\n\n#include \"rtdeploy.h\"\n\n"
    );
    out.push_str(
        "#ifdef __cplusplus\n#define RTD_MSG_ASSERT(c, m) static_assert(c, m)\n#define RTD_MSG_ALIGNOF(t) alignof(t)\n#else\n#define RTD_MSG_ASSERT(c, m) _Static_assert(c, m)\n#define RTD_MSG_ALIGNOF(t) _Alignof(t)\n#endif\n\n",
    );
    out.push_str("RTD_MSG_ASSERT(sizeof(float) == 4 && sizeof(double) == 8, \"IEEE float32 and float64\");\n\n");
    let mut order = Vec::new();
    set.in_order(name, &mut order);
    for n in &order {
        let d = set.get(n).expect("in the set");
        let l = set.layout(n)?;
        let upper = d.name.to_ascii_uppercase();
        let _ = writeln!(
            out,
            "#ifndef RTDEPLOY_MSG_{upper}_DEFINED\n#define RTDEPLOY_MSG_{upper}_DEFINED"
        );
        for c in &d.doc {
            let _ = writeln!(out, "/* {} */", c.replace("*/", "* /"));
        }
        let _ = writeln!(out, "typedef struct {} {{", d.name);
        for f in &d.fields {
            let elem = match &f.elem {
                Elem::Prim(p) => p.c().to_string(),
                Elem::Msg(m) => m.clone(),
            };
            match f.array {
                Some(k) => {
                    let _ = writeln!(out, "    {elem} {}[{k}];", f.name);
                }
                None => {
                    let _ = writeln!(out, "    {elem} {};", f.name);
                }
            }
        }
        let _ = writeln!(out, "}} {};\n", d.name);
        let _ = writeln!(
            out,
            "#define {upper}_LAYOUT_HASH UINT64_C({:#018x})",
            l.hash
        );
        let _ = writeln!(
            out,
            "RTD_MSG_ASSERT(sizeof({0}) == {1}, \"{0}: {1} bytes\");",
            d.name, l.size
        );
        let _ = writeln!(
            out,
            "RTD_MSG_ASSERT(RTD_MSG_ALIGNOF({0}) == {1}, \"{0}: aligned to {1}\");",
            d.name, l.align
        );
        for (f, p) in d.fields.iter().zip(&l.fields) {
            let _ = writeln!(
                out,
                "RTD_MSG_ASSERT(offsetof({0}, {1}) == {2} && sizeof(((const {0} *)0)->{1}) == {3}, \"{0}.{1}: {3} bytes at {2}\");",
                d.name, f.name, p.offset, p.size
            );
        }
        let _ = writeln!(
            out,
            "static const rtd_type {0}_type = {{\"{0}\", sizeof({0}), RTD_MSG_ALIGNOF({0}), {upper}_LAYOUT_HASH}};",
            d.name
        );
        // The C++ layer (rtdeploy.hpp) finds a type's record through
        // this overload.
        let _ = writeln!(
            out,
            "#ifdef __cplusplus\ninline const rtd_type &rtd_type_of(const {0} *) {{ return {0}_type; }}\n#endif",
            d.name
        );
        out.push_str("#endif\n\n");
    }
    let _ = writeln!(out, "#endif /* {guard} */");
    Ok(out)
}

/// The Python type: a `ctypes.Structure` with `TYPE_NAME` and
/// `LAYOUT_HASH`, its size and offsets checked when the module loads, and
/// `<Name>.dtype()`, the numpy structured dtype of the same bytes (numpy
/// imported only when asked).
pub fn python(set: &Set, name: &str) -> Result<String, DescriptionError> {
    let l0 = set.layout(name)?;
    let d0 = set.get(name).expect("laid out");
    let mut out = header_line(d0, &l0, "#");
    out.push_str("import ctypes\n\n");
    let mut order = Vec::new();
    set.in_order(name, &mut order);
    for n in &order {
        let d = set.get(n).expect("in the set");
        let l = set.layout(n)?;
        let _ = writeln!(out, "\nclass {}(ctypes.Structure):", d.name);
        let doc = if d.doc.is_empty() {
            format!("The message {} (from {}.msg).", d.name, d.name)
        } else {
            d.doc.join(" ")
        };
        let _ = writeln!(out, "    {:?}", doc);
        let _ = writeln!(out, "    TYPE_NAME = {:?}", d.name);
        let _ = writeln!(out, "    LAYOUT_HASH = {:#018x}", l.hash);
        out.push_str("    _fields_ = [\n");
        for f in &d.fields {
            let elem = match &f.elem {
                Elem::Prim(p) => p.ctypes().to_string(),
                Elem::Msg(m) => m.clone(),
            };
            let ty = match f.array {
                Some(k) => format!("{elem} * {k}"),
                None => elem,
            };
            let _ = writeln!(out, "        ({:?}, {ty}),", f.name);
        }
        out.push_str("    ]\n\n    @staticmethod\n    def dtype():\n        import numpy\n        return numpy.dtype({\n");
        let names: Vec<String> = d.fields.iter().map(|f| format!("{:?}", f.name)).collect();
        let formats: Vec<String> = d
            .fields
            .iter()
            .map(|f| {
                let e = match &f.elem {
                    Elem::Prim(p) => format!("{:?}", p.numpy()),
                    Elem::Msg(m) => format!("{m}.dtype()"),
                };
                match f.array {
                    Some(k) => format!("({e}, ({k},))"),
                    None => e,
                }
            })
            .collect();
        let offsets: Vec<String> = l.fields.iter().map(|p| p.offset.to_string()).collect();
        let _ = writeln!(out, "            \"names\": [{}],", names.join(", "));
        let _ = writeln!(out, "            \"formats\": [{}],", formats.join(", "));
        let _ = writeln!(out, "            \"offsets\": [{}],", offsets.join(", "));
        let _ = writeln!(out, "            \"itemsize\": {},", l.size);
        out.push_str("        })\n\n");
        let _ = writeln!(
            out,
            "assert ctypes.sizeof({0}) == {1}, \"{0}: {1} bytes\"",
            d.name, l.size
        );
        for f in &d.fields {
            let p = l.fields[d.fields.iter().position(|g| g.name == f.name).unwrap_or(0)];
            let _ = writeln!(
                out,
                "assert {0}.{1}.offset == {2}, \"{0}.{1} at {2}\"",
                d.name, f.name, p.offset
            );
        }
    }
    Ok(out)
}
