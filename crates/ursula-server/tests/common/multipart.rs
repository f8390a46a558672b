//! Strict parsing of `multipart/mixed` bootstrap answers (extensions.md §8).

use super::Response;

/// One part of a `multipart/mixed` body.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    pub content_type: String,
    pub body: Vec<u8>,
}

/// Parses a bootstrap answer strictly (extensions.md §8 wire format) and returns its parts.
pub fn parse_multipart(r: &Response) -> Vec<Part> {
    let ct = r.header("content-type").expect("content-type");
    let boundary = ct
        .strip_prefix("multipart/mixed; boundary=")
        .unwrap_or_else(|| panic!("not multipart/mixed: {ct}"));
    let hex = boundary
        .strip_prefix("bootstrap-")
        .expect("bootstrap- prefix");
    assert!(
        hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{boundary}"
    );
    let dash = format!("--{boundary}");
    let body = &r.body;
    let close = format!("\r\n{dash}--\r\n");
    assert!(
        body.starts_with(dash.as_bytes()),
        "body starts with the boundary"
    );
    assert!(
        body.ends_with(close.as_bytes()),
        "body ends with the close delimiter"
    );
    let inner = &body[dash.len()..body.len() - close.len()];
    let delim = format!("\r\n{dash}");
    let mut parts = Vec::new();
    for chunk in split_on(inner, delim.as_bytes()) {
        let chunk = chunk
            .strip_prefix(b"\r\n")
            .expect("CRLF after the boundary");
        let end = find(chunk, b"\r\n\r\n").expect("part headers end");
        let head = std::str::from_utf8(&chunk[..end]).expect("ASCII part headers");
        let content_type = head
            .strip_prefix("Content-Type: ")
            .unwrap_or_else(|| panic!("part header {head:?}"))
            .to_owned();
        parts.push(Part {
            content_type,
            body: chunk[end + 4..].to_vec(),
        });
    }
    parts
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn split_on<'a>(mut hay: &'a [u8], delim: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    while let Some(p) = find(hay, delim) {
        out.push(&hay[..p]);
        hay = &hay[p + delim.len()..];
    }
    out.push(hay);
    out
}
