//! The bytes of Server-Sent Events (protocol.md §10.4): data, control and error events.
//!
//! Every frame is written into one `Vec<u8>` that becomes the `Bytes` handed to hyper, so a
//! delivery to a live subscriber allocates once for its frame. Valid UTF-8 (every JSON
//! stream and nearly every text stream) is written straight through; only text with invalid
//! sequences takes the lossy path.

use base64::Engine as _;
use ursula_core::offset::Off;

/// How the payload of a data event is written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Encoding {
    Text,
    Json,
    Base64,
}

/// Appends `event: data` with `payload` as its `data:` lines: one line per `\n`-separated
/// line of text (without `\r` and NUL, which SSE cannot carry), or one base64 line.
pub fn data_event(out: &mut Vec<u8>, enc: Encoding, payload: &[u8]) {
    out.extend_from_slice(b"event: data\n");
    match enc {
        Encoding::Base64 => {
            out.extend_from_slice(b"data:");
            let at = out.len();
            let len = base64::encoded_len(payload.len(), true).unwrap_or(0);
            out.resize(at + len, 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(payload, &mut out[at..])
                .unwrap_or(0);
            out.truncate(at + written);
            out.push(b'\n');
        }
        Encoding::Text | Encoding::Json => match std::str::from_utf8(payload) {
            Ok(_) => text_lines(out, payload),
            Err(_) => text_lines(out, String::from_utf8_lossy(payload).as_bytes()),
        },
    }
    out.push(b'\n');
}

/// The `data:` lines of valid UTF-8 `text`. In UTF-8 the bytes `\r` and NUL only ever stand
/// for those characters, so they are dropped byte by byte.
fn text_lines(out: &mut Vec<u8>, text: &[u8]) {
    for line in text.split(|b| *b == b'\n') {
        let dirty = memchr::memchr2(b'\r', 0, line).is_some();
        let first = if dirty {
            line.iter().copied().find(|b| *b != b'\r' && *b != 0)
        } else {
            line.first().copied()
        };
        // A leading space would be eaten by the SSE parser: `data: ` keeps it.
        out.extend_from_slice(if first == Some(b' ') {
            b"data: "
        } else {
            b"data:"
        });
        if dirty {
            out.extend(line.iter().copied().filter(|b| *b != b'\r' && *b != 0));
        } else {
            out.extend_from_slice(line);
        }
        out.push(b'\n');
    }
}

/// What a control event says.
pub struct Control<'a> {
    pub next: u64,
    /// `(first, next)` record ordinals, for a record read.
    pub records: Option<(u64, u64)>,
    pub cursor: Option<&'a str>,
    pub up_to_date: bool,
    pub closed: bool,
}

/// Appends `event: control` with its JSON object, keys in sorted order (as the earlier
/// `serde_json::Map` rendering wrote them). The cursor is one this server minted (decimal
/// digits), but it is escaped anyway.
pub fn control_event(out: &mut Vec<u8>, c: &Control<'_>) {
    out.extend_from_slice(b"event: control\ndata:{");
    let mut sep = "";
    if c.closed {
        out.extend_from_slice(b"\"streamClosed\":true");
        sep = ",";
    }
    if let Some(cursor) = c.cursor {
        out.extend_from_slice(sep.as_bytes());
        out.extend_from_slice(b"\"streamCursor\":");
        json_string(out, cursor);
        sep = ",";
    }
    if let Some((first, _)) = c.records {
        out.extend_from_slice(sep.as_bytes());
        out.extend_from_slice(b"\"streamFirstRecord\":");
        out.extend_from_slice(itoa::Buffer::new().format(first).as_bytes());
        sep = ",";
    }
    out.extend_from_slice(sep.as_bytes());
    out.extend_from_slice(b"\"streamNextOffset\":\"");
    out.extend_from_slice(&Off(c.next).digits());
    out.push(b'"');
    if let Some((_, next)) = c.records {
        out.extend_from_slice(b",\"streamNextRecord\":");
        out.extend_from_slice(itoa::Buffer::new().format(next).as_bytes());
    }
    if c.up_to_date {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    out.extend_from_slice(b"}\n\n");
}

fn json_string(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b.is_ascii_alphanumeric()) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Infallible for a `&str`.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// `event: error` with `msg` on one line.
pub fn error_event(msg: &str) -> Vec<u8> {
    format!("event: error\ndata:{}\n\n", msg.replace(['\n', '\r'], " ")).into_bytes()
}

/// Length of the UTF-8 sequence a lead byte starts (1 for anything else).
pub fn utf8_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// Shortens a text batch so it never ends inside a UTF-8 sequence.
pub fn utf8_end(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(enc: Encoding, payload: &[u8]) -> String {
        let mut out = Vec::new();
        data_event(&mut out, enc, payload);
        String::from_utf8(out).unwrap()
    }

    /// The rendering this module replaced, kept as the reference for the fast path.
    fn reference(payload: &[u8]) -> String {
        let mut ev = String::from("event: data\n");
        for line in String::from_utf8_lossy(payload).split('\n') {
            let clean: String = line.chars().filter(|c| *c != '\r' && *c != '\0').collect();
            ev.push_str(if clean.starts_with(' ') {
                "data: "
            } else {
                "data:"
            });
            ev.push_str(&clean);
            ev.push('\n');
        }
        ev.push('\n');
        ev
    }

    #[test]
    fn text_lines_and_leading_spaces() {
        assert_eq!(
            data(Encoding::Text, b"a\n b\r\n\0 c"),
            "event: data\ndata:a\ndata:  b\ndata:  c\n\n"
        );
        assert_eq!(data(Encoding::Json, b"[1]"), "event: data\ndata:[1]\n\n");
        assert_eq!(data(Encoding::Text, b""), "event: data\ndata:\n\n");
        assert_eq!(
            data(Encoding::Text, b"\xff!"),
            "event: data\ndata:\u{fffd}!\n\n"
        );
    }

    #[test]
    fn base64_is_one_line() {
        assert_eq!(
            data(Encoding::Base64, &[0, 1, 2, 255]),
            "event: data\ndata:AAEC/w==\n\n"
        );
        assert_eq!(data(Encoding::Base64, b""), "event: data\ndata:\n\n");
    }

    #[test]
    fn control_matches_sorted_json() {
        let mut out = Vec::new();
        control_event(
            &mut out,
            &Control {
                next: 5,
                records: Some((1, 3)),
                cursor: Some("00000000000000000006"),
                up_to_date: true,
                closed: false,
            },
        );
        let text = String::from_utf8(out).unwrap();
        let json = text
            .strip_prefix("event: control\ndata:")
            .and_then(|t| t.strip_suffix("\n\n"))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(json, v.to_string(), "keys in serde_json's sorted order");
        assert_eq!(v["streamNextOffset"], "00000000000000000005");
        assert_eq!(v["streamNextRecord"], 3);
        assert_eq!(v["streamFirstRecord"], 1);
        assert_eq!(v["upToDate"], true);
        assert!(v.get("streamClosed").is_none());
        let mut out = Vec::new();
        control_event(
            &mut out,
            &Control {
                next: 0,
                records: None,
                cursor: Some("a\"b"),
                up_to_date: true,
                closed: true,
            },
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "event: control\ndata:{\"streamClosed\":true,\"streamCursor\":\"a\\\"b\",\
             \"streamNextOffset\":\"00000000000000000000\",\"upToDate\":true}\n\n"
        );
    }

    proptest! {
        #[test]
        fn fast_path_matches_reference(payload in proptest::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), Just(0u8), Just(b' '), Just(0xC3), Just(0xA9), any::<u8>()],
            0..64,
        )) {
            prop_assert_eq!(data(Encoding::Text, &payload), reference(&payload));
        }
    }
}
