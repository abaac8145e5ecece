//! Text from robot.yaml shown back in messages: escaped and cut short.
//!
//! A message that quotes the file must stay one readable line whatever the
//! file holds: a control character would rewrite the terminal (an escape
//! sequence) or fake a second diagnostic (a line break), and a long value
//! would bury the message under it. Values are escaped like Rust's `{:?}`
//! escapes control characters and cut to a few dozen characters; whole
//! messages, which may quote values through other crates' validators and
//! serde, are escaped and cut in the middle so that what is wrong (the
//! start) and what is accepted (the end) both stay.

use std::fmt::Write;

/// The most characters of one value quoted in a message.
pub const MAX_VALUE_CHARS: usize = 48;

/// The most characters of one message; beyond it the middle is cut.
pub const MAX_MESSAGE_CHARS: usize = 400;

/// `text` escaped and cut to [`MAX_VALUE_CHARS`] characters, for quoting
/// inside a message (the caller adds the backticks).
pub fn value(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    for c in chars.by_ref().take(MAX_VALUE_CHARS) {
        push_escaped(&mut out, c);
    }
    let rest = chars.count();
    if rest > 0 {
        let _ = write!(out, "... ({rest} more characters)");
    }
    out
}

/// A whole message or field path escaped, and cut in the middle when it
/// is longer than [`MAX_MESSAGE_CHARS`].
pub fn message(text: &str) -> String {
    let total = text.chars().count();
    if total <= MAX_MESSAGE_CHARS && !text.chars().any(needs_escape) {
        return text.to_string();
    }
    let mut out = String::new();
    if total <= MAX_MESSAGE_CHARS {
        text.chars().for_each(|c| push_escaped(&mut out, c));
        return out;
    }
    let head = MAX_MESSAGE_CHARS / 2;
    let tail = MAX_MESSAGE_CHARS / 4;
    text.chars()
        .take(head)
        .for_each(|c| push_escaped(&mut out, c));
    let _ = write!(out, " ... ({} characters cut) ... ", total - head - tail);
    text.chars()
        .skip(total - tail)
        .for_each(|c| push_escaped(&mut out, c));
    out
}

/// Control characters, and the Unicode line separators and direction
/// overrides that would make the printed line read differently from what
/// it holds.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_cut_and_escaped() {
        assert_eq!(value("eth0"), "eth0");
        assert_eq!(value("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
        let long = "x".repeat(1000);
        let v = value(&long);
        assert!(v.starts_with(&"x".repeat(MAX_VALUE_CHARS)));
        assert!(v.ends_with("... (952 more characters)"), "{v}");
        // Characters, not bytes: no cut inside a character.
        assert_eq!(
            value(&"µ".repeat(60)).chars().filter(|&c| c == 'µ').count(),
            48
        );
    }

    #[test]
    fn messages_keep_both_ends() {
        assert_eq!(message("plain message"), "plain message");
        assert_eq!(message("two\nlines"), "two\\nlines");
        assert_eq!(message("bidi \u{202e}txt"), "bidi \\u{202e}txt");
        let long = format!("`{}` is not valid (expected a-z)", "y".repeat(100_000));
        let m = message(&long);
        assert!(m.chars().count() < MAX_MESSAGE_CHARS + 40, "{}", m.len());
        assert!(m.starts_with("`yyy"));
        assert!(m.ends_with("is not valid (expected a-z)"));
        assert!(m.contains("characters cut"));
    }
}
