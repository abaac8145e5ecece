//! A YAML document as a tree whose every node knows where it was written.
//!
//! saphyr-parser gives events with spans; this module folds them into
//! nodes (resolving aliases) so that both serde deserialisation errors and
//! the semantic checks that run afterwards can name a line and a column.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, SpannedEventReceiver};

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
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    pub pos: Pos,
}

/// Why a text is not one YAML document.
#[derive(Debug, Clone)]
pub struct YamlError {
    pub pos: Pos,
    pub message: String,
}

/// Nesting limit: deeper documents are refused instead of overflowing the
/// stack in the recursive passes that follow.
const MAX_DEPTH: usize = 64;

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

/// Parses exactly one YAML document.
pub fn parse(text: &str) -> Result<Node, YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, true) {
        return Err(YamlError {
            pos: Pos {
                line: e.marker().line(),
                col: e.marker().col() + 1,
            },
            message: e.info().to_string(),
        });
    }
    if let Some(err) = builder.error {
        return Err(err);
    }
    match builder.docs.len() {
        0 => Err(YamlError {
            pos: Pos { line: 1, col: 1 },
            message: "the file is empty (expected a robot description starting with `robot:`)"
                .into(),
        }),
        1 => Ok(builder.docs.pop().expect("one document")),
        _ => Err(YamlError {
            pos: builder.docs[1].pos,
            message: "more than one YAML document (expected exactly one robot description)".into(),
        }),
    }
}

enum Open {
    Seq(Vec<Node>, Pos, usize),
    Map(Vec<(Node, Node)>, Option<Node>, Pos, usize),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    docs: Vec<Node>,
    anchors: HashMap<usize, Node>,
    error: Option<YamlError>,
}

impl Builder {
    fn fail(&mut self, pos: Pos, message: String) {
        if self.error.is_none() {
            self.error = Some(YamlError { pos, message });
        }
    }

    fn push_node(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.docs.push(node),
            Some(Open::Seq(items, _, _)) => items.push(node),
            Some(Open::Map(entries, pending, _, _)) => match pending.take() {
                None => {
                    if !matches!(node.kind, Kind::Scalar { .. }) {
                        let pos = node.pos;
                        self.fail(
                            pos,
                            "a mapping key must be a plain value, not a list or mapping".into(),
                        );
                        return;
                    }
                    if let Some(dup) = entries.iter().find(|(k, _)| k.as_str() == node.as_str()) {
                        let (first, name) =
                            (dup.0.pos.line, node.as_str().unwrap_or("").to_string());
                        self.fail(
                            node.pos,
                            format!("duplicate key `{name}` (first written on line {first})"),
                        );
                        return;
                    }
                    *pending = Some(node);
                }
                Some(key) => entries.push((key, node)),
            },
        }
    }
}

impl<'input> SpannedEventReceiver<'input> for Builder {
    fn on_event(&mut self, ev: Event<'input>, span: Span) {
        if self.error.is_some() {
            return;
        }
        let pos = Pos {
            line: span.start.line(),
            col: span.start.col() + 1,
        };
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let plain = matches!(style, ScalarStyle::Plain) && tag.is_none();
                self.push_node(
                    Node {
                        kind: Kind::Scalar {
                            text: text.into_owned(),
                            plain,
                        },
                        pos,
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    self.fail(pos, format!("nested deeper than {MAX_DEPTH} levels"));
                    return;
                }
                if matches!(ev, Event::SequenceStart(..)) {
                    self.stack.push(Open::Seq(Vec::new(), pos, anchor));
                } else {
                    self.stack.push(Open::Map(Vec::new(), None, pos, anchor));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Open::Seq(items, pos, anchor)) => self.push_node(
                    Node {
                        kind: Kind::Seq(items),
                        pos,
                    },
                    anchor,
                ),
                Some(Open::Map(entries, _, pos, anchor)) => self.push_node(
                    Node {
                        kind: Kind::Map(entries),
                        pos,
                    },
                    anchor,
                ),
                None => self.fail(pos, "unbalanced end of collection".into()),
            },
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(mut node) => {
                    node.pos = pos;
                    self.push_node(node, 0);
                }
                None => self.fail(pos, "alias to an unknown anchor".into()),
            },
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
    }

    #[test]
    fn aliases_resolve() {
        let doc = parse("x: &v 5\ny: *v\n").unwrap();
        assert_eq!(doc.get("y").unwrap().as_str(), Some("5"));
    }
}
