//! Names taken from untrusted input, made safe to print in an error.

/// How many characters of an untrusted name an error message shows.
pub const SHOWN_CHARS: usize = 100;

/// `name` for an error message: its first [`SHOWN_CHARS`] characters,
/// escaped as Rust escapes a string (so control characters and terminal
/// escapes print as `\n`, `\u{1b}`), in backticks, followed by `...` and
/// the full length when it was cut. A name from a hostile bundle or peer
/// can be megabytes long; the error stays a line.
pub fn quoted(name: &str) -> String {
    shown(name, name.len())
}

/// [`quoted`] for bytes that may not be UTF-8 (invalid sequences print
/// as U+FFFD).
pub fn quoted_bytes(name: &[u8]) -> String {
    // A character is at most 4 bytes: this prefix holds the shown part.
    let head = &name[..name.len().min(SHOWN_CHARS * 4)];
    shown(&String::from_utf8_lossy(head), name.len())
}

/// A message from a peer (an ERROR frame's text) for an error: at most
/// `max` characters, control characters escaped, so it stays one line.
pub fn peer_message(bytes: &[u8], max: usize) -> String {
    let head = &bytes[..bytes.len().min(max.saturating_mul(4))];
    let text = String::from_utf8_lossy(head);
    let mut out = String::with_capacity(text.len().min(max) + 24);
    let mut chars = text.chars();
    for c in chars.by_ref().take(max) {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() || head.len() < bytes.len() {
        out.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    out
}

fn shown(text: &str, full_len: usize) -> String {
    let mut out = String::with_capacity(SHOWN_CHARS + 24);
    out.push('`');
    let mut chars = text.chars();
    for c in chars.by_ref().take(SHOWN_CHARS) {
        out.extend(c.escape_debug());
    }
    out.push('`');
    if chars.next().is_some() || text.len() < full_len {
        out.push_str(&format!("... ({full_len} bytes)"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_are_escaped_whole() {
        assert_eq!(quoted("bin/ctl"), "`bin/ctl`");
        assert_eq!(quoted("a\nb\u{1b}[2J"), "`a\\nb\\u{1b}[2J`");
    }

    #[test]
    fn long_names_are_cut_and_say_how_long() {
        let s = quoted(&"x".repeat(5000));
        assert_eq!(s, format!("`{}`... (5000 bytes)", "x".repeat(100)));
        let b = quoted_bytes(&[b'y'; 1 << 20]);
        assert_eq!(b, format!("`{}`... (1048576 bytes)", "y".repeat(100)));
        assert!(quoted_bytes(&[0xff, b'a']).contains('\u{fffd}'));
        // exactly at the limit: nothing cut
        assert_eq!(quoted(&"z".repeat(100)), format!("`{}`", "z".repeat(100)));
        assert_eq!(quoted_bytes(&[b'z'; 100]), format!("`{}`", "z".repeat(100)));
    }

    #[test]
    fn peer_messages_stay_one_line() {
        assert_eq!(peer_message(b"no space left", 50), "no space left");
        assert_eq!(peer_message(b"a\nb\x1b", 50), "a\\nb\\u{1b}");
        assert_eq!(
            peer_message(&[b'm'; 1000], 10),
            "mmmmmmmmmm... (1000 bytes)"
        );
    }
}
