//! A YAML document as a tree whose every node knows where it was written.
//!
//! saphyr-parser gives events with spans; this module folds them into
//! nodes (resolving aliases) so that both serde deserialisation errors and
//! the semantic checks that run afterwards can name a line and a column.
//!
//! The text may be hostile, so the tree is bounded: its depth
//! ([`MAX_DEPTH`]), the aliases used ([`MAX_ALIASES`]) and what they expand
//! to ([`MAX_ALIAS_NODES`], [`MAX_ALIAS_BYTES`]). Anchored collections are
//! shared rather than copied, and the first problem stops the parser.

use std::collections::HashMap;
use std::rc::Rc;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, SpannedEventReceiver};

use super::echo;

/// A position in the source: line 1-based, column 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

#[derive(Debug, Clone)]
pub enum Kind {
    /// A scalar and whether it was plain (unquoted, so its type is resolved
    /// by the core schema) or quoted/block (always a string).
    Scalar {
        text: String,
        plain: bool,
    },
    /// Collections are shared, not copied, by the anchors and aliases that
    /// name them: the tree's memory stays in proportion to the text.
    Seq(Rc<[Node]>),
    Map(Rc<[(Node, Node)]>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    pub pos: Pos,
}

/// Why a text is not one YAML document, or one beyond the limits below.
#[derive(Debug, Clone)]
pub struct YamlError {
    pub pos: Pos,
    pub message: String,
}

/// Nesting limit: deeper documents are refused instead of overflowing the
/// stack in the recursive passes that follow (serde, drop). The deepest
/// field robot.yaml has is five levels down (`irqs.threads[0].feeds[0]`).
pub const MAX_DEPTH: usize = 64;

/// The most aliases (`*name`) a document may use. A robot.yaml shares a
/// few blocks of defaults; thousands of aliases only serve to multiply.
pub const MAX_ALIASES: usize = 1024;

/// The most nodes aliases may copy into the tree, all aliases together.
/// Each alias is expanded into a copy; without a budget ten lines of
/// aliases of aliases expand to a billion nodes ("billion laughs").
pub const MAX_ALIAS_NODES: usize = 100_000;

/// The most scalar text aliases may copy, all aliases together: an alias
/// of one long value, used many times, would otherwise copy it each time.
pub const MAX_ALIAS_BYTES: usize = 1 << 20;

impl Node {
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The value of `key` in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match &self.kind {
            Kind::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The node a field path (`processes[2].restart.policy`,
    /// `sysctl.kernel.timer_migration`) names, or the deepest node on the
    /// way to it when the rest was not written (a defaulted field).
    pub fn locate(&self, path: &str) -> &Node {
        let mut node = self;
        let mut rest = path;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[') {
                let Some((idx, tail)) = after.split_once(']') else {
                    return node;
                };
                let next = match (&node.kind, idx.parse::<usize>()) {
                    (Kind::Seq(items), Ok(i)) => items.get(i),
                    _ => None,
                };
                match next {
                    Some(n) => node = n,
                    None => return node,
                }
                rest = tail.strip_prefix('.').unwrap_or(tail);
                continue;
            }
            // The longest key that the path continues with; keys may hold
            // dots themselves (sysctl names).
            let Kind::Map(entries) = &node.kind else {
                return node;
            };
            let found =
                entries
                    .iter()
                    .filter_map(|(k, v)| {
                        let k = k.as_str()?;
                        let tail = rest.strip_prefix(k)?;
                        (tail.is_empty() || tail.starts_with('.') || tail.starts_with('['))
                            .then_some((k.len(), v, tail))
                    })
                    .max_by_key(|(len, _, _)| *len);
            match found {
                Some((_, v, tail)) => {
                    node = v;
                    rest = tail.strip_prefix('.').unwrap_or(tail);
                }
                None => return node,
            }
        }
        node
    }
}

/// The position of byte `offset` of `bytes`, counted as the YAML parser
/// counts: lines end at LF, CRLF or a lone CR; columns are characters.
pub fn pos_at(bytes: &[u8], offset: usize) -> Pos {
    let mut pos = Pos { line: 1, col: 1 };
    let before = &bytes[..offset.min(bytes.len())];
    for (i, &b) in before.iter().enumerate() {
        match b {
            b'\n' => {
                pos = Pos {
                    line: pos.line + 1,
                    col: 1,
                }
            }
            // A CR followed by LF ends the line at the LF.
            b'\r' if before.get(i + 1) != Some(&b'\n') => {
                pos = Pos {
                    line: pos.line + 1,
                    col: 1,
                }
            }
            b'\r' => {}
            // UTF-8 continuation bytes belong to the character before.
            b if b & 0xc0 == 0x80 => {}
            _ => pos.col += 1,
        }
    }
    pos
}

/// Parses exactly one YAML document.
///
/// The parser is driven event by event and stopped at the first problem,
/// so a refused document costs no more than the part read up to it.
pub fn parse(text: &str) -> Result<Node, YamlError> {
    let mut builder = Builder {
        end: pos_at(text.as_bytes(), text.len()),
        ..Builder::default()
    };
    let parser = Parser::new_from_str(text);
    for event in parser {
        match event {
            Ok((event, span)) => builder.on_event(event, span),
            Err(e) => {
                return Err(YamlError {
                    pos: builder.within(e.marker().line(), e.marker().col()),
                    message: format!("not valid YAML: {}", e.info()),
                });
            }
        }
        if let Some(err) = builder.error.take() {
            return Err(err);
        }
        if builder.docs.len() > 1 {
            return Err(YamlError {
                pos: builder.docs[1].pos,
                message: "more than one YAML document (expected exactly one robot description)"
                    .into(),
            });
        }
    }
    match builder.docs.pop() {
        None => Err(YamlError {
            pos: Pos { line: 1, col: 1 },
            message: "the file is empty (expected a robot description starting with `robot:`)"
                .into(),
        }),
        Some(doc) => Ok(doc),
    }
}

/// What a node costs when an alias copies it.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    /// The node and every node under it.
    nodes: usize,
    /// The scalar text under it, in bytes.
    bytes: usize,
    /// Collection levels: 0 for a scalar, 1 for a list of scalars.
    height: usize,
}

impl Cost {
    /// Adds a child's cost to its (open) parent's.
    fn add(&mut self, child: Cost) {
        self.nodes += child.nodes;
        self.bytes += child.bytes;
        self.height = self.height.max(child.height);
    }

    /// The cost of a closed collection whose children cost `self`.
    fn closed(self) -> Cost {
        Cost {
            nodes: self.nodes + 1,
            bytes: self.bytes,
            height: self.height + 1,
        }
    }
}

/// A collection being built.
struct Open {
    pos: Pos,
    anchor: usize,
    /// The children's cost so far.
    cost: Cost,
    body: Body,
}

enum Body {
    Seq(Vec<Node>),
    Map {
        entries: Vec<(Node, Node)>,
        /// A key waiting for its value.
        key: Option<Node>,
        /// Every key so far and the line it was written on: duplicates are
        /// found in constant time per key.
        seen: HashMap<String, usize>,
    },
}

#[derive(Default)]
struct Builder {
    /// Where the text ends.
    end: Pos,
    stack: Vec<Open>,
    docs: Vec<Node>,
    anchors: HashMap<usize, (Node, Cost)>,
    /// Aliases used, and what they copied.
    aliases: usize,
    alias_cost: Cost,
    error: Option<YamlError>,
}

impl Builder {
    /// The place of a parser marker (1-based line, 0-based column), within
    /// the text: at its end, when there is no final line break, the scanner
    /// puts errors and empty values on a line after the last.
    fn within(&self, line: usize, col: usize) -> Pos {
        let pos = Pos { line, col: col + 1 };
        if (pos.line, pos.col) > (self.end.line, self.end.col) {
            self.end
        } else {
            pos
        }
    }

    fn fail(&mut self, pos: Pos, message: String) {
        if self.error.is_none() {
            self.error = Some(YamlError { pos, message });
        }
    }

    fn push_node(&mut self, node: Node, cost: Cost, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), cost));
        }
        let Some(open) = self.stack.last_mut() else {
            self.docs.push(node);
            return;
        };
        open.cost.add(cost);
        match &mut open.body {
            Body::Seq(items) => items.push(node),
            Body::Map { entries, key, seen } => match key.take() {
                Some(key) => entries.push((key, node)),
                None => {
                    let Some(name) = node.as_str() else {
                        let pos = node.pos;
                        self.fail(
                            pos,
                            "a mapping key must be a plain value, not a list or mapping".into(),
                        );
                        return;
                    };
                    if let Some(first) = seen.get(name) {
                        let message = format!(
                            "duplicate key `{}` (first written on line {first})",
                            echo::value(name)
                        );
                        let pos = node.pos;
                        self.fail(pos, message);
                        return;
                    }
                    seen.insert(name.to_string(), node.pos.line);
                    *key = Some(node);
                }
            },
        }
    }

    /// Expands alias `id` at `pos`, within the alias limits.
    fn alias(&mut self, id: usize, pos: Pos) {
        let Some((node, cost)) = self.anchors.get(&id) else {
            self.fail(pos, "not valid YAML: alias to an unknown anchor".into());
            return;
        };
        let depth = self.stack.len() + cost.height;
        self.aliases += 1;
        self.alias_cost.add(*cost);
        let refused = if self.aliases > MAX_ALIASES {
            Some(format!(
                "more than {MAX_ALIASES} aliases (the limit for robot.yaml)"
            ))
        } else if self.alias_cost.nodes > MAX_ALIAS_NODES {
            Some(format!(
                "aliases expand to more than {MAX_ALIAS_NODES} values (the limit for robot.yaml)"
            ))
        } else if self.alias_cost.bytes > MAX_ALIAS_BYTES {
            Some(format!(
                "aliases copy more than {} KiB of text (the limit for robot.yaml)",
                MAX_ALIAS_BYTES >> 10
            ))
        } else if depth > MAX_DEPTH {
            Some(format!(
                "this alias nests the document {depth} levels deep (the limit is {MAX_DEPTH})"
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            self.fail(pos, message);
            return;
        }
        let (mut node, cost) = (node.clone(), *cost);
        node.pos = pos;
        self.push_node(node, cost, 0);
    }
}

impl<'input> SpannedEventReceiver<'input> for Builder {
    fn on_event(&mut self, ev: Event<'input>, span: Span) {
        if self.error.is_some() {
            return;
        }
        let pos = self.within(span.start.line(), span.start.col());
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let plain = matches!(style, ScalarStyle::Plain) && tag.is_none();
                let cost = Cost {
                    nodes: 1,
                    bytes: text.len(),
                    height: 0,
                };
                // The scanner's buffer has room to spare (about 128 bytes
                // for a one-character value): keep only the text.
                let mut text = text.into_owned();
                text.shrink_to_fit();
                self.push_node(
                    Node {
                        kind: Kind::Scalar { text, plain },
                        pos,
                    },
                    cost,
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(
                        pos,
                        format!("nested deeper than {MAX_DEPTH} levels (the limit for robot.yaml)"),
                    );
                    return;
                }
                let body = if matches!(ev, Event::SequenceStart(..)) {
                    Body::Seq(Vec::new())
                } else {
                    Body::Map {
                        entries: Vec::new(),
                        key: None,
                        seen: HashMap::new(),
                    }
                };
                self.stack.push(Open {
                    pos,
                    anchor,
                    cost: Cost::default(),
                    body,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(open) => {
                    let kind = match open.body {
                        Body::Seq(items) => Kind::Seq(items.into()),
                        Body::Map { entries, .. } => Kind::Map(entries.into()),
                    };
                    self.push_node(
                        Node {
                            kind,
                            pos: open.pos,
                        },
                        open.cost.closed(),
                        open.anchor,
                    );
                }
                None => self.fail(pos, "not valid YAML: unbalanced end of collection".into()),
            },
            Event::Alias(id) => self.alias(id, pos),
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart(_)
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_lookup() {
        let doc = parse(
            "a:\n  b: 1\n  list:\n    - x\n    - {k: v}\nsysctl:\n  kernel.timer_migration: 0\n",
        )
        .unwrap();
        assert_eq!(doc.locate("a.b").pos, Pos { line: 2, col: 6 });
        assert_eq!(doc.locate("a.list[1].k").pos, Pos { line: 5, col: 11 });
        assert_eq!(
            doc.locate("sysctl.kernel.timer_migration").pos,
            Pos { line: 7, col: 27 }
        );
        // A missing field resolves to its nearest written ancestor.
        assert_eq!(doc.locate("a.missing").pos, doc.get("a").unwrap().pos);
    }

    #[test]
    fn refuses_duplicates_and_many_documents() {
        let e = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.pos.line, 3);
        assert!(e.message.contains("duplicate key `a`"));
        assert!(parse("a: 1\n---\nb: 2\n")
            .unwrap_err()
            .message
            .contains("more than one"));
        assert!(parse("").unwrap_err().message.contains("empty"));
        let e = parse("a: [1, 2\n").unwrap_err();
        assert!(e.pos.line >= 1);
        // An error, or an empty value, at the end of the text is placed
        // within it.
        let e = parse("a:\n  b: x\n  c:d e").unwrap_err();
        assert_eq!(e.pos, Pos { line: 3, col: 8 }, "{}", e.message);
        let doc = parse("? ").unwrap();
        let Kind::Map(entries) = &doc.kind else {
            panic!("{doc:?}")
        };
        assert_eq!(entries[0].0.pos, Pos { line: 1, col: 3 });
    }

    #[test]
    fn aliases_resolve() {
        let doc = parse("x: &v 5\ny: *v\n").unwrap();
        assert_eq!(doc.get("y").unwrap().as_str(), Some("5"));
        // A copy is placed where the alias is written.
        let doc = parse("x: &v [1, 2]\ny: *v\n").unwrap();
        assert_eq!(doc.get("y").unwrap().pos, Pos { line: 2, col: 4 });
        assert_eq!(doc.locate("y[1]").as_str(), Some("2"));
    }

    #[test]
    fn positions_of_bytes_count_lines_as_yaml_does() {
        let text = "ab\r\ncd\ref\nµx";
        let at = |i| pos_at(text.as_bytes(), i);
        assert_eq!(at(0), Pos { line: 1, col: 1 });
        assert_eq!(at(2), Pos { line: 1, col: 3 });
        // CRLF is one break; a lone CR is one too.
        assert_eq!(at(4), Pos { line: 2, col: 1 });
        assert_eq!(at(7), Pos { line: 3, col: 1 });
        // `µ` is two bytes and one column.
        assert_eq!(at(10), Pos { line: 4, col: 1 });
        assert_eq!(at(12), Pos { line: 4, col: 2 });
        assert_eq!(at(100), Pos { line: 4, col: 3 });
    }

    #[test]
    fn limits_are_refused_at_their_place() {
        let e = parse(&format!(
            "a: &a x\nb: [{}]\n",
            vec!["*a"; MAX_ALIASES + 1].join(",")
        ))
        .unwrap_err();
        assert_eq!(
            e.pos,
            Pos {
                line: 2,
                col: 5 + 3 * MAX_ALIASES
            }
        );
        assert!(
            e.message.contains("more than 1024 aliases"),
            "{}",
            e.message
        );

        // 1001 nodes a copy: the 100th copy passes 100 000.
        let list = vec!["x"; 1000].join(",");
        let e = parse(&format!(
            "a: &a [{list}]\nb: [{}]\n",
            vec!["*a"; 200].join(",")
        ))
        .unwrap_err();
        assert_eq!(
            e.pos,
            Pos {
                line: 2,
                col: 5 + 3 * 99
            }
        );
        assert!(
            e.message.contains("more than 100000 values"),
            "{}",
            e.message
        );

        let deep = |n| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert!(parse(&deep(MAX_DEPTH)).is_ok());
        let e = parse(&deep(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(
            e.pos,
            Pos {
                line: 1,
                col: MAX_DEPTH + 1
            }
        );
        assert!(
            e.message.contains("nested deeper than 64 levels"),
            "{}",
            e.message
        );

        // An alias whose copy would go past the depth limit.
        let e = parse(&format!("a: &a {}\nb: [*a]\n", deep(63))).unwrap_err();
        assert_eq!(e.pos, Pos { line: 2, col: 5 });
        assert!(e.message.contains("65 levels deep"), "{}", e.message);
    }

    #[test]
    fn duplicate_keys_are_found_in_every_mapping() {
        let e = parse("a:\n  x: 1\n  y: 2\nb:\n  x: 1\n  y: 2\n  x: 3\n").unwrap_err();
        assert_eq!(e.pos, Pos { line: 7, col: 3 });
        assert_eq!(e.message, "duplicate key `x` (first written on line 5)");
        // A long key is quoted cut short.
        let key = "k".repeat(5000);
        let e = parse(&format!("? {key}\n: 1\n? {key}\n: 2\n")).unwrap_err();
        assert!(e.message.len() < 200, "{}", e.message);
    }
}
