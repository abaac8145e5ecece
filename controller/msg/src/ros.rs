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

use crate::{Description, DescriptionError, Elem, Prim, Set};

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
                Elem::Prim(_) if f.octet => "byte".to_string(),
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

// ---- Reading other tools' schemas ----------------------------------------

/// A primitive as another tool's schema may have it (`bool` included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForeignPrim {
    Bool,
    Int(Prim),
}

impl ForeignPrim {
    fn size(self) -> usize {
        match self {
            ForeignPrim::Bool => 1,
            ForeignPrim::Int(p) => p.size() as usize,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ForeignElem {
    Prim(ForeignPrim),
    /// Index into [`Foreign::types`].
    Msg(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ForeignField {
    name: String,
    elem: ForeignElem,
    array: Option<usize>,
}

/// A fixed-size message type of a `ros2msg` schema another tool wrote,
/// read leniently (a `bool`, padding C would insert: CDR places every
/// field itself), for decoding logs: [`Foreign::decode`] walks the CDR
/// body field by field. Strings and sequences are not read (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign {
    /// Each definition's fields; the root first.
    types: Vec<(String, Vec<ForeignField>)>,
}

/// The most fields, definitions and array elements a foreign schema may
/// have: a log's schema is input.
const FOREIGN_MAX_FIELDS: usize = 4096;
const FOREIGN_MAX_ARRAY: usize = 1 << 20;
const FOREIGN_MAX_DEPTH: usize = 16;

impl Foreign {
    /// Reads `text`, the schema named `package/msg/Name`; `None` when a
    /// field is not of a fixed size or a name is not a known definition.
    pub fn read(schema_name: &str, text: &str) -> Option<Foreign> {
        if text.len() > crate::MAX_TEXT {
            return None;
        }
        let (pkg, root) = split_ros_name(schema_name)?;
        // (package, name, its fields as (type, name)), the root first.
        type Section = (String, String, Vec<(String, String)>);
        let mut sections: Vec<Section> = vec![(pkg, root, Vec::new())];
        for line in text.lines() {
            if line.starts_with("===") {
                sections.push((String::new(), String::new(), Vec::new()));
                continue;
            }
            let last = sections.last_mut()?;
            if last.1.is_empty() {
                if let Some(t) = line.trim().strip_prefix("MSG:") {
                    let (p, n) = split_ros_name(t.trim())?;
                    last.0 = p;
                    last.1 = n;
                }
                continue;
            }
            let code = line.split('#').next().unwrap_or("").trim();
            if code.is_empty() || (code.contains('=') && !code.contains("<=")) {
                continue;
            }
            let mut w = code.split_whitespace();
            let (ty, name) = (w.next()?, w.next()?);
            if w.next().is_some() {
                return None; // a default value: not a field this reader knows
            }
            last.2.push((ty.to_string(), name.to_string()));
            if last.2.len() > FOREIGN_MAX_FIELDS {
                return None;
            }
        }
        let names: Vec<String> = sections.iter().map(|s| s.1.clone()).collect();
        let mut types = Vec::with_capacity(sections.len());
        for (_, name, fields) in &sections {
            let mut out = Vec::with_capacity(fields.len());
            for (ty, fname) in fields {
                let (base, array) = match ty.split_once('[') {
                    None => (ty.as_str(), None),
                    Some((b, rest)) => {
                        let n: usize = rest.strip_suffix(']')?.parse().ok()?;
                        if n == 0 || n > FOREIGN_MAX_ARRAY {
                            return None;
                        }
                        (b, Some(n))
                    }
                };
                let elem = match base {
                    "bool" => ForeignElem::Prim(ForeignPrim::Bool),
                    other => match Prim::parse(other) {
                        Some(p) => ForeignElem::Prim(ForeignPrim::Int(p)),
                        None => {
                            let short = other.rsplit('/').next().unwrap_or(other);
                            ForeignElem::Msg(names.iter().position(|n| n == short)?)
                        }
                    },
                };
                out.push(ForeignField {
                    name: fname.clone(),
                    elem,
                    array,
                });
            }
            if out.is_empty() {
                return None;
            }
            types.push((name.clone(), out));
        }
        let f = Foreign { types };
        // No definition uses itself, however deep.
        f.depth(0, 0)?;
        Some(f)
    }

    fn depth(&self, t: usize, d: usize) -> Option<()> {
        if d > FOREIGN_MAX_DEPTH {
            return None;
        }
        for fld in &self.types.get(t)?.1 {
            if let ForeignElem::Msg(m) = fld.elem {
                self.depth(m, d + 1)?;
            }
        }
        Some(())
    }

    /// A CDR body (little endian, without its 4-byte header) decoded to a
    /// JSON object, each primitive aligned to its size from the start of
    /// the body; `None` when the body is shorter than the fields.
    pub fn decode(&self, body: &[u8]) -> Option<serde_json::Value> {
        let mut pos = 0usize;
        self.decode_type(0, body, &mut pos, 0)
    }

    fn decode_type(
        &self,
        t: usize,
        body: &[u8],
        pos: &mut usize,
        d: usize,
    ) -> Option<serde_json::Value> {
        use serde_json::Value;
        if d > FOREIGN_MAX_DEPTH {
            return None;
        }
        let mut obj = serde_json::Map::new();
        for f in &self.types.get(t)?.1 {
            let one = |pos: &mut usize| -> Option<Value> {
                match f.elem {
                    ForeignElem::Prim(p) => {
                        let size = p.size();
                        *pos = pos.checked_add((size - *pos % size) % size)?;
                        let b = body.get(*pos..pos.checked_add(size)?)?;
                        *pos += size;
                        Some(match p {
                            ForeignPrim::Bool => Value::Bool(b[0] != 0),
                            ForeignPrim::Int(pr) => pr.decode(b),
                        })
                    }
                    ForeignElem::Msg(m) => self.decode_type(m, body, pos, d + 1),
                }
            };
            let v = match f.array {
                None => one(pos)?,
                Some(n) => {
                    // Cheap refusal of an array longer than the body.
                    if n > body.len().saturating_add(1) {
                        return None;
                    }
                    Value::Array((0..n).map(|_| one(pos)).collect::<Option<Vec<_>>>()?)
                }
            };
            obj.insert(f.name.clone(), v);
        }
        Some(Value::Object(obj))
    }
}

// ---- The type description and its hash (REP-2011, RIHS01) ----------------

/// The version prefix of a type hash.
pub const RIHS01_PREFIX: &str = "RIHS01_";

impl Prim {
    /// The `type_id` of `type_description_interfaces/msg/FieldType` (a
    /// fixed array adds 48).
    fn ros_type_id(self, octet: bool) -> u32 {
        if octet {
            return 16; // FIELD_TYPE_BYTE
        }
        match self {
            Prim::I8 => 2,
            Prim::U8 => 3,
            Prim::I16 => 4,
            Prim::U16 => 5,
            Prim::I32 => 6,
            Prim::U32 => 7,
            Prim::I64 => 8,
            Prim::U64 => 9,
            Prim::F32 => 10,
            Prim::F64 => 11,
        }
    }
}

/// `FIELD_TYPE_NESTED_TYPE`.
const NESTED_TYPE_ID: u32 = 1;
/// What a fixed array adds to its element's `type_id`.
const ARRAY_TYPE_ID: u32 = 48;

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl Set {
    /// The DDS name of `name`'s type, which rmw_zenoh's key expressions
    /// carry: `package::msg::dds_::Name_`.
    pub fn dds_type_name(&self, name: &str) -> String {
        format!("{}::msg::dds_::{name}_", self.package_of(name))
    }

    fn ros_individual(&self, name: &str, out: &mut String) {
        let Some(d) = self.get(name) else { return };
        out.push_str("{\"type_name\": ");
        json_string(out, &self.ros_name(name));
        out.push_str(", \"fields\": [");
        for (i, f) in d.fields.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let (id, nested) = match &f.elem {
                Elem::Prim(p) => (p.ros_type_id(f.octet), String::new()),
                Elem::Msg(m) => (NESTED_TYPE_ID, self.ros_name(m)),
            };
            let (id, capacity) = match f.array {
                Some(n) => (id + ARRAY_TYPE_ID, n),
                None => (id, 0),
            };
            out.push_str("{\"name\": ");
            json_string(out, &f.name);
            let _ = write!(
                out,
                ", \"type\": {{\"type_id\": {id}, \"capacity\": {capacity}, \"string_capacity\": 0, \"nested_type_name\": "
            );
            json_string(out, &nested);
            out.push_str("}}");
        }
        out.push_str("]}");
    }

    /// Whether ROS 2 can name `name` and what it uses: package and field
    /// names lower case letters, digits and single underscores, starting
    /// with a letter and not ending with `_` (so no `_reserved`), type
    /// names starting upper case with letters and digits only. The first
    /// name it cannot take, with where.
    pub fn ros_names(&self, name: &str) -> Result<(), DescriptionError> {
        fn lower(s: &str) -> bool {
            let b = s.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_lowercase()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
                && !s.ends_with('_')
                && !s.contains("__")
        }
        let mut used = Vec::new();
        self.in_order(name, &mut used);
        for n in &used {
            let file = format!("{n}.msg");
            let Some(d) = self.get(n) else { continue };
            if !(n.as_bytes()[0].is_ascii_uppercase()
                && n.bytes().all(|c| c.is_ascii_alphanumeric()))
            {
                return Err(DescriptionError::Whole {
                    file,
                    what: format!("ROS 2 cannot name the type `{n}`: a type name starts upper case and has letters and digits only"),
                });
            }
            let pkg = self.package_of(n);
            if !lower(pkg) {
                return Err(DescriptionError::Whole {
                    file,
                    what: format!("ROS 2 cannot name the package `{pkg}`: lower case letters, digits and single underscores, starting with a letter"),
                });
            }
            if let Some(f) = d.fields.iter().find(|f| !lower(&f.name)) {
                return Err(DescriptionError::At {
                    file,
                    line: f.line,
                    column: 1,
                    what: format!("ROS 2 cannot name the field `{}`: lower case letters, digits and single underscores, starting with a letter and not ending with one", f.name),
                });
            }
        }
        Ok(())
    }

    /// The type description of `name` in the form ROS 2 hashes it
    /// (REP-2011: `type_description_interfaces/msg/TypeDescription` as
    /// JSON, default values left out, the referenced types sorted by
    /// name, separators `, ` and `: `, ASCII only).
    pub fn ros_type_description(&self, name: &str) -> Result<String, DescriptionError> {
        self.layout(name)?;
        self.ros_names(name)?;
        let mut used = Vec::new();
        self.in_order(name, &mut used);
        let mut refs: Vec<(String, &str)> = used
            .iter()
            .filter(|n| *n != name)
            .map(|n| (self.ros_name(n), n.as_str()))
            .collect();
        refs.sort();
        let mut out = String::from("{\"type_description\": ");
        self.ros_individual(name, &mut out);
        out.push_str(", \"referenced_type_descriptions\": [");
        for (i, (_, n)) in refs.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            self.ros_individual(n, &mut out);
        }
        out.push_str("]}");
        Ok(out)
    }

    /// The ROS 2 type hash of `name`: `RIHS01_` and the SHA-256 of
    /// [`Set::ros_type_description`] in hex.
    pub fn ros_type_hash(&self, name: &str) -> Result<String, DescriptionError> {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(self.ros_type_description(name)?.as_bytes());
        let mut out = String::from(RIHS01_PREFIX);
        for b in d {
            let _ = write!(out, "{b:02x}");
        }
        Ok(out)
    }

    /// How `name` is written as CDR and read back ([`CdrPlan`]).
    pub fn cdr_plan(&self, name: &str) -> Result<CdrPlan, DescriptionError> {
        let l = self.layout(name)?;
        let mut runs: Vec<CdrRun> = Vec::new();
        self.leaves(name, 0, 0, &mut runs);
        Ok(CdrPlan {
            runs,
            size: l.size as usize,
        })
    }

    fn leaves(&self, name: &str, base: usize, depth: usize, runs: &mut Vec<CdrRun>) {
        let (Some(d), Ok(l)) = (self.get(name), self.layout_at(name, depth)) else {
            return;
        };
        for (f, p) in d.fields.iter().zip(&l.fields) {
            let n = f.array.unwrap_or(1) as usize;
            let at = base + p.offset as usize;
            match &f.elem {
                Elem::Prim(pr) => {
                    let size = pr.size() as usize;
                    // Elements of one size that follow one another are
                    // one run: each is at a multiple of its size, in the
                    // struct as in CDR.
                    match runs.last_mut() {
                        Some(r) if r.size == size && r.offset + r.size * r.count == at => {
                            r.count += n
                        }
                        _ => runs.push(CdrRun {
                            offset: at,
                            size,
                            count: n,
                        }),
                    }
                }
                Elem::Msg(m) => {
                    let esize = p.size as usize / n.max(1);
                    for k in 0..n {
                        self.leaves(m, at + k * esize, depth + 1, runs);
                    }
                }
            }
        }
    }
}

/// Primitives of one size, one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CdrRun {
    /// Where the first is in the struct.
    offset: usize,
    size: usize,
    count: usize,
}

/// A type's primitives in order with their places: what a message is
/// written as CDR and read back from it with, field by field, each
/// primitive aligned to its size from the start of the CDR body, in
/// either byte order on the way in. Made once per channel; encoding and
/// decoding allocate nothing beyond the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdrPlan {
    runs: Vec<CdrRun>,
    size: usize,
}

/// Why CDR bytes are not a message of the type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdrError {
    #[error("{have} bytes: a CDR message has a 4-byte encapsulation header")]
    NoHeader { have: usize },
    #[error("encapsulation {0:#04x} {1:#04x}: expected plain CDR (0x00 0x00 big endian, 0x00 0x01 little endian)")]
    Encapsulation(u8, u8),
    #[error("{have} bytes of CDR body, the type needs {need}")]
    Short { need: usize, have: usize },
    #[error("{extra} bytes beyond the type's {used} (more than CDR's end padding): another type?")]
    Trailing { extra: usize, used: usize },
    #[error("{have} bytes of message, the type has {need}")]
    Message { need: usize, have: usize },
}

impl CdrPlan {
    /// The message's size as published.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Writes `data` (a message as published: little endian, at least
    /// [`CdrPlan::size`] bytes) into `out` as a CDR message (`CDR_LE`).
    pub fn encode(&self, data: &[u8], out: &mut Vec<u8>) -> Result<(), CdrError> {
        if data.len() < self.size {
            return Err(CdrError::Message {
                need: self.size,
                have: data.len(),
            });
        }
        out.clear();
        out.extend_from_slice(&CDR_HEADER);
        for r in &self.runs {
            let pos = out.len() - CDR_HEADER.len();
            out.resize(out.len() + (r.size - pos % r.size) % r.size, 0);
            out.extend_from_slice(&data[r.offset..r.offset + r.size * r.count]);
        }
        Ok(())
    }

    /// Reads a CDR message (either byte order) into `out` (at least
    /// [`CdrPlan::size`] bytes) as the channel's little-endian bytes.
    /// Up to 7 bytes after the last field are CDR's end padding; more
    /// are refused, as a message of another type.
    pub fn decode(&self, cdr: &[u8], out: &mut [u8]) -> Result<(), CdrError> {
        if out.len() < self.size {
            return Err(CdrError::Message {
                need: self.size,
                have: out.len(),
            });
        }
        let Some((head, body)) = cdr.split_first_chunk::<4>() else {
            return Err(CdrError::NoHeader { have: cdr.len() });
        };
        let swap = match (head[0], head[1]) {
            (0, 1) => cfg!(target_endian = "big"),
            (0, 0) => cfg!(target_endian = "little"),
            (a, b) => return Err(CdrError::Encapsulation(a, b)),
        };
        let mut pos = 0usize;
        for r in &self.runs {
            pos += (r.size - pos % r.size) % r.size;
            let len = r.size * r.count;
            let src = body.get(pos..pos + len).ok_or(CdrError::Short {
                need: pos + len,
                have: body.len(),
            })?;
            let dst = &mut out[r.offset..r.offset + len];
            dst.copy_from_slice(src);
            if swap && r.size > 1 {
                for e in dst.chunks_exact_mut(r.size) {
                    e.reverse();
                }
            }
            pos += len;
        }
        if body.len() - pos > 7 {
            return Err(CdrError::Trailing {
                extra: body.len() - pos,
                used: pos,
            });
        }
        Ok(())
    }
}

impl Set {
    /// What ROS 2 knows `name` by, as one JSON object (`deploy gen --lang
    /// ros2`): its type name, its DDS name, its RIHS01 hash, its ros2msg
    /// schema and the type description the hash is over.
    pub fn ros2_json(&self, name: &str) -> Result<String, DescriptionError> {
        let mut out = String::from("{\"type_name\": ");
        json_string(&mut out, &self.ros_name(name));
        out.push_str(", \"dds_type_name\": ");
        json_string(&mut out, &self.dds_type_name(name));
        out.push_str(", \"type_hash\": ");
        json_string(&mut out, &self.ros_type_hash(name)?);
        out.push_str(", \"ros2msg\": ");
        json_string(&mut out, &self.ros2msg(name)?);
        out.push_str(", \"type_description\": ");
        out.push_str(&self.ros_type_description(name)?);
        out.push_str("}\n");
        Ok(out)
    }
}

// ---- rmw_zenoh's key expressions, liveliness tokens and attachment ---------
//
// As ros2/rmw_zenoh's docs/design.md describes them at commit
// 99a6a2bd10b949052f4f12c5854825dc005e95a5 (the design of the 0.x
// releases for Jazzy and newer; Humble's rmw_zenoh has no RIHS01 hash and
// writes `TypeHashNotSupported` in its place).

/// `@ros2_lv`: the hermetic prefix of rmw_zenoh's liveliness tokens.
pub const LIVELINESS_PREFIX: &str = "@ros2_lv";

/// A name in a liveliness token: each `/` replaced by `%` (an empty one
/// is `%`).
pub fn mangle(name: &str) -> String {
    if name.is_empty() {
        "%".into()
    } else {
        name.replace('/', "%")
    }
}

/// The key expression of a topic: `<domain_id>/<topic>/<type_name>/<type_hash>`,
/// the topic's fully qualified name without its leading (and trailing)
/// slash.
pub fn topic_key(domain_id: u32, topic: &str, dds_type: &str, type_hash: &str) -> String {
    let t = topic.strip_prefix('/').unwrap_or(topic);
    let t = t.strip_suffix('/').unwrap_or(t);
    format!("{domain_id}/{t}/{dds_type}/{type_hash}")
}

/// A node's liveliness token.
pub fn node_token(
    domain_id: u32,
    session: &str,
    node_id: u32,
    namespace: &str,
    node: &str,
) -> String {
    format!(
        "{LIVELINESS_PREFIX}/{domain_id}/{session}/{node_id}/{node_id}/NN/%/{}/{node}",
        mangle(namespace)
    )
}

/// What a topic's endpoint is: a publisher (`MP`) or a subscription
/// (`MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Publisher,
    Subscription,
}

/// The QoS of an endpoint, as far as the bridge sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Qos {
    /// Reliable (rmw_zenoh's default) or best effort.
    pub reliable: bool,
    /// KEEP_LAST's depth.
    pub depth: u32,
}

/// The depth rmw_zenoh's default QoS has (a depth that differs is
/// written in the token).
const DEFAULT_DEPTH: u32 = 42;

impl Qos {
    /// The compact form in a liveliness token (rmw_zenoh's
    /// `qos_to_keyexpr`): a field left empty when it is the default
    /// (reliable, volatile, keep last 42, no deadline, no lifespan,
    /// automatic liveliness).
    pub fn keyexpr(&self) -> String {
        let reliability = if self.reliable { "" } else { "2" };
        let depth = if self.depth == DEFAULT_DEPTH {
            String::new()
        } else {
            self.depth.to_string()
        };
        format!("{reliability}::,{depth}:,:,:,,")
    }
}

/// A publisher's or subscription's liveliness token.
#[allow(clippy::too_many_arguments)]
pub fn endpoint_token(
    domain_id: u32,
    session: &str,
    node_id: u32,
    entity_id: u32,
    kind: Endpoint,
    namespace: &str,
    node: &str,
    topic: &str,
    dds_type: &str,
    type_hash: &str,
    qos: Qos,
) -> String {
    let kind = match kind {
        Endpoint::Publisher => "MP",
        Endpoint::Subscription => "MS",
    };
    format!(
        "{LIVELINESS_PREFIX}/{domain_id}/{session}/{node_id}/{entity_id}/{kind}/%/{}/{node}/{}/{dds_type}/{type_hash}/{}",
        mangle(namespace),
        mangle(topic),
        qos.keyexpr()
    )
}

/// The attachment of every message rmw_zenoh publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment {
    pub sequence_number: i64,
    /// Nanoseconds since the UNIX epoch.
    pub source_timestamp: i64,
    /// The publisher's GID.
    pub gid: [u8; 16],
}

/// Why bytes are not an rmw_zenoh attachment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachmentError {
    #[error("{0} bytes: an attachment is {len}", len = Attachment::LEN)]
    Length(usize),
    #[error("a GID of {0} bytes: expected 16")]
    GidLength(u8),
}

impl Attachment {
    /// Its encoded size: 8 + 8 + 1 + 16.
    pub const LEN: usize = 33;

    /// Little-endian sequence number and timestamp, the GID's length
    /// (16) and the GID.
    pub fn encode(&self) -> [u8; Attachment::LEN] {
        let mut b = [0u8; Attachment::LEN];
        b[0..8].copy_from_slice(&self.sequence_number.to_le_bytes());
        b[8..16].copy_from_slice(&self.source_timestamp.to_le_bytes());
        b[16] = 16;
        b[17..].copy_from_slice(&self.gid);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Attachment, AttachmentError> {
        let b: &[u8; Attachment::LEN] =
            b.try_into().map_err(|_| AttachmentError::Length(b.len()))?;
        if b[16] != 16 {
            return Err(AttachmentError::GidLength(b[16]));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[17..]);
        Ok(Attachment {
            sequence_number: i64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            source_timestamp: i64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            gid,
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

    fn parse_set(files: &[(&str, &str)]) -> Set {
        set(files)
    }

    /// Hashes published for these types (the key expressions of ROS 2
    /// programs talking to rmw_zenoh quote them), computed here from the
    /// types' fields alone.
    #[test]
    fn type_hashes_are_the_published_ones() {
        let s = parse_set(&[
            (
                "std_msgs/msg/Int64.msg",
                "# a comment is not hashed\nint64 data\n",
            ),
            (
                "geometry_msgs/msg/Vector3.msg",
                "float64 x\nfloat64 y\nfloat64 z\n",
            ),
            (
                "geometry_msgs/msg/Twist.msg",
                "Vector3  linear\nVector3  angular\n",
            ),
        ]);
        assert_eq!(
            s.ros_type_hash("Int64").unwrap(),
            "RIHS01_8cd1048c2f186b6bd9a92472dc1ce51723c0833a221e2b7aecfff111774f4b49"
        );
        assert_eq!(
            s.ros_type_hash("Vector3").unwrap(),
            "RIHS01_cc12fe83e4c02719f1ce8070bfd14aecd40f75a96696a67a2a1f37f7dbb0765d"
        );
        assert_eq!(
            s.ros_type_hash("Twist").unwrap(),
            "RIHS01_9c45bf16fe0983d80e3cfe750d6835843d265a9a6c46bd2e609fcddde6fb8d2a"
        );
        assert_eq!(s.dds_type_name("Twist"), "geometry_msgs::msg::dds_::Twist_");
        assert_eq!(
            s.ros_type_description("Twist").unwrap(),
            "{\"type_description\": {\"type_name\": \"geometry_msgs/msg/Twist\", \"fields\": [{\"name\": \"linear\", \"type\": {\"type_id\": 1, \"capacity\": 0, \"string_capacity\": 0, \"nested_type_name\": \"geometry_msgs/msg/Vector3\"}}, {\"name\": \"angular\", \"type\": {\"type_id\": 1, \"capacity\": 0, \"string_capacity\": 0, \"nested_type_name\": \"geometry_msgs/msg/Vector3\"}}]}, \"referenced_type_descriptions\": [{\"type_name\": \"geometry_msgs/msg/Vector3\", \"fields\": [{\"name\": \"x\", \"type\": {\"type_id\": 11, \"capacity\": 0, \"string_capacity\": 0, \"nested_type_name\": \"\"}}, {\"name\": \"y\", \"type\": {\"type_id\": 11, \"capacity\": 0, \"string_capacity\": 0, \"nested_type_name\": \"\"}}, {\"name\": \"z\", \"type\": {\"type_id\": 11, \"capacity\": 0, \"string_capacity\": 0, \"nested_type_name\": \"\"}}]}]}"
        );
        // byte and uint8 have the same bytes but not the same hash; an
        // array adds 48 to the element's id and gives its length.
        let b = parse_set(&[
            ("p/msg/B.msg", "byte[4] b\n"),
            ("p/msg/U.msg", "uint8[4] b\n"),
        ]);
        assert!(b
            .ros_type_description("B")
            .unwrap()
            .contains("\"type_id\": 64, \"capacity\": 4"));
        assert!(b
            .ros_type_description("U")
            .unwrap()
            .contains("\"type_id\": 51, \"capacity\": 4"));
        assert_ne!(b.ros_type_hash("B").unwrap(), b.ros_type_hash("U").unwrap());
        assert!(b.ros2msg("B").unwrap().starts_with("byte[4] b"));
    }

    /// The fixtures of rmw_zenoh's docs/design.md (at the pinned commit),
    /// quoted verbatim, made from their parts.
    #[test]
    fn key_expressions_and_tokens_are_the_design_documents() {
        let string_hash = "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18";
        let string = "std_msgs::msg::dds_::String_";
        assert_eq!(
            topic_key(0, "/chatter", string, string_hash),
            "0/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
        );
        assert_eq!(
            topic_key(0, "/robot1/chatter", string, string_hash),
            "0/robot1/chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18"
        );
        assert_eq!(
            node_token(2, "aac3178e146ba6f1fc6e6a4085e77f21", 0, "", "listener"),
            "@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/0/NN/%/%/listener"
        );
        assert_eq!(
            endpoint_token(
                2,
                "aac3178e146ba6f1fc6e6a4085e77f21",
                0,
                10,
                Endpoint::Subscription,
                "",
                "listener",
                "/chatter",
                string,
                string_hash,
                Qos { reliable: true, depth: 10 }
            ),
            "@ros2_lv/2/aac3178e146ba6f1fc6e6a4085e77f21/0/10/MS/%/%/listener/%chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,10:,:,:,,"
        );
        assert_eq!(
            endpoint_token(
                2,
                "8b20917502ee955ac4476e0266340d5c",
                0,
                10,
                Endpoint::Publisher,
                "",
                "talker",
                "/chatter",
                string,
                string_hash,
                Qos { reliable: true, depth: 7 }
            ),
            "@ros2_lv/2/8b20917502ee955ac4476e0266340d5c/0/10/MP/%/%/talker/%chatter/std_msgs::msg::dds_::String_/RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18/::,7:,:,:,,"
        );
        assert_eq!(
            Qos {
                reliable: false,
                depth: 42
            }
            .keyexpr(),
            "2::,:,:,:,,"
        );
        assert_eq!(mangle("/a/b"), "%a%b");
    }

    #[test]
    fn the_attachment_is_the_design_documents_and_garbage_is_refused() {
        let a = Attachment {
            sequence_number: 7,
            source_timestamp: -2,
            gid: [0xab; 16],
        };
        let b = a.encode();
        assert_eq!(b[..8], 7i64.to_le_bytes());
        assert_eq!(b[8..16], (-2i64).to_le_bytes());
        assert_eq!(b[16], 16);
        assert_eq!(b[17..], [0xab; 16]);
        assert_eq!(Attachment::decode(&b), Ok(a));
        assert_eq!(
            Attachment::decode(&b[..32]),
            Err(AttachmentError::Length(32))
        );
        let mut bad = b;
        bad[16] = 15;
        assert_eq!(
            Attachment::decode(&bad),
            Err(AttachmentError::GidLength(15))
        );
    }

    #[test]
    fn cdr_field_by_field_is_the_published_bytes_and_reads_either_byte_order() {
        let s = parse_set(&[
            ("p/msg/Inner.msg", "int16 a\nuint8 b\nbyte c\n"),
            (
                "p/msg/Outer.msg",
                "float64 x\nInner[2] i\nint32 v\nfloat32 f\n",
            ),
        ]);
        let plan = s.cdr_plan("Outer").unwrap();
        assert_eq!(plan.size(), 24);
        let data: Vec<u8> = (0u8..24).collect();
        let mut cdr = Vec::new();
        plan.encode(&data, &mut cdr).unwrap();
        // No padding in the description: none in CDR either.
        assert_eq!(cdr[..4], CDR_HEADER);
        assert_eq!(cdr[4..], data[..]);
        let mut back = vec![0u8; 24];
        plan.decode(&cdr, &mut back).unwrap();
        assert_eq!(back, data);
        // The same message big endian: each primitive reversed.
        let mut be = vec![0u8, 0, 0, 0];
        for (at, size) in [
            (0, 8),
            (8, 2),
            (10, 1),
            (11, 1),
            (12, 2),
            (14, 1),
            (15, 1),
            (16, 4),
            (20, 4),
        ] {
            be.extend(data[at..at + size].iter().rev());
        }
        let mut from_be = vec![0u8; 24];
        plan.decode(&be, &mut from_be).unwrap();
        assert_eq!(from_be, data);
        // End padding is CDR's; more is another type.
        let mut padded = cdr.clone();
        padded.extend([0; 4]);
        assert!(plan.decode(&padded, &mut back).is_ok());
        padded.extend([0; 4]);
        assert!(matches!(
            plan.decode(&padded, &mut back),
            Err(CdrError::Trailing { extra: 8, used: 24 })
        ));
        assert!(matches!(
            plan.decode(&cdr[..27], &mut back),
            Err(CdrError::Short { .. })
        ));
        assert!(matches!(
            plan.decode(&cdr[..3], &mut back),
            Err(CdrError::NoHeader { have: 3 })
        ));
        let mut xcdr2 = cdr.clone();
        xcdr2[1] = 7;
        assert_eq!(
            plan.decode(&xcdr2, &mut back),
            Err(CdrError::Encapsulation(0, 7))
        );
        assert!(matches!(
            plan.encode(&data[..23], &mut cdr),
            Err(CdrError::Message { need: 24, have: 23 })
        ));
        // Any bytes: an answer, never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..64 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = plan.decode(&junk, &mut back);
        }
    }

    #[test]
    fn names_ros_2_cannot_take_are_refused_for_its_hash() {
        for (file, text, why) in [
            ("p/msg/A.msg", "uint32 _reserved\n", "field `_reserved`"),
            ("p/msg/A.msg", "uint32 Big\n", "field `Big`"),
            ("p/msg/A.msg", "uint32 a__b\n", "field `a__b`"),
            ("p/msg/lower.msg", "uint32 a\n", "type `lower`"),
            ("Pkg_/msg/A.msg", "uint32 a\n", "package `Pkg_`"),
        ] {
            let e = set(&[(file, text)]);
            let name = e.names().next().unwrap().to_string();
            let err = e.ros_type_hash(&name).unwrap_err().to_string();
            assert!(err.contains(why), "{file} {text:?}: {err}");
            // The channel's own rules are looser: the layout stands.
            assert!(e.layout(&name).is_ok());
        }
    }

    #[test]
    fn another_tools_schema_is_read_leniently_and_decoded_as_cdr() {
        // Trailing padding in C, a bool, a nested type after a gap.
        let f = Foreign::read(
            "demo/msg/Pose",
            "# a pose\nfloat64 x\nint32 id\nbool ok\nInner in\nuint8 K=3\n================\nMSG: demo/Inner\nuint8 a\nfloat64 b\n",
        )
        .unwrap();
        let mut body = Vec::new();
        body.extend(1.5f64.to_le_bytes()); // 0
        body.extend(7i32.to_le_bytes()); // 8
        body.push(1); // 12 ok
        body.push(9); // 13 a
        body.extend([0; 2]); // 14: pad to 16
        body.extend((-2.0f64).to_le_bytes()); // 16 b
        assert_eq!(
            f.decode(&body).unwrap(),
            serde_json::json!({"x": 1.5, "id": 7, "ok": true, "in": {"a": 9, "b": -2.0}})
        );
        assert!(f.decode(&body[..23]).is_none());
        for bad in [
            "string s\n",
            "int32[] v\n",
            "Missing m\n",
            "float64 x 1.0\n",
            "",
        ] {
            assert!(Foreign::read("demo/msg/X", bad).is_none(), "{bad:?}");
        }
        // A definition that uses itself is refused, not followed.
        assert!(Foreign::read("demo/msg/A", "A a\n").is_none());
        assert!(Foreign::read("demo/msg/A", "uint8[1048577] a\n").is_none());
    }
}
