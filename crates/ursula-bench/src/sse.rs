//! Incremental Server-Sent Events parser (enough of the WHATWG rules for
//! Durable Streams: `event:` and `data:` fields, comments, CRLF or LF).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Event type; "message" when no `event:` field was sent.
    pub kind: String,
    /// Data lines joined with '\n'.
    pub data: String,
}

#[derive(Default, Debug)]
pub struct Parser {
    buf: Vec<u8>,
    kind: String,
    data: String,
    has_data: bool,
}

impl Parser {
    /// Feed bytes; calls `on_event` for each completed event.
    pub fn feed(&mut self, chunk: &[u8], mut on_event: impl FnMut(Event)) {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let end = start + pos;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if let Some(ev) = self.line(&line) {
                on_event(ev);
            }
        }
        self.buf.drain(..start);
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let kind = std::mem::take(&mut self.kind);
            let data = std::mem::take(&mut self.data);
            let had = std::mem::replace(&mut self.has_data, false);
            if !had {
                return None;
            }
            let kind = if kind.is_empty() {
                "message".to_owned()
            } else {
                kind
            };
            return Some(Event { kind, data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.kind = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

/// `streamNextOffset` from a control event's JSON, if present.
pub fn control_next_offset(data: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    v.get("streamNextOffset")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<Event> {
        let mut p = Parser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, |e| out.push(e));
        }
        out
    }

    #[test]
    fn events_split_across_chunks() {
        let evs = parse_all(&[
            b"event: data\nda",
            b"ta:hello\n\nevent: control\r\ndata: {\"streamNextOffset\":\"5\"}\r\n",
            b"\r\n: comment\n\n",
        ]);
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0].kind, "data");
        assert_eq!(evs[0].data, "hello");
        assert_eq!(evs[1].kind, "control");
        assert_eq!(control_next_offset(&evs[1].data).as_deref(), Some("5"));
    }

    #[test]
    fn multiline_data_and_default_kind() {
        let evs = parse_all(&[b"data:a\ndata: b\n\ndata\n\n"]);
        assert_eq!(
            evs[0],
            Event {
                kind: "message".into(),
                data: "a\nb".into()
            }
        );
        assert_eq!(evs[1].data, "");
    }

    #[test]
    fn control_without_offset() {
        assert_eq!(control_next_offset("{\"upToDate\":true}"), None);
        assert_eq!(control_next_offset("not json"), None);
    }
}
