//! JSON mode: validation, one-level array flattening and canonical NDJSON.
//!
//! Canonical form keeps the client's member order and number spelling and only
//! removes insignificant whitespace, so normalization never changes a value.

use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// A JSON body normalized into canonical NDJSON (one compact value per line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    pub bytes: Vec<u8>,
    pub messages: usize,
}

/// Why a JSON body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidJson(pub String);

/// Validates `body` and flattens a top-level array by one level.
pub fn normalize(body: &[u8]) -> Result<Normalized, InvalidJson> {
    // `IgnoredAny` skips string contents without checking them, so check UTF-8 first.
    std::str::from_utf8(body).map_err(|e| InvalidJson(format!("JSON body is not UTF-8: {e}")))?;
    serde_json::from_slice::<IgnoredAny>(body)
        .map_err(|e| InvalidJson(format!("invalid JSON: {e}")))?;
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    let mut out = Vec::with_capacity(body.len() + 1);
    let mut messages = 0;
    if first == Some(&b'[') {
        let items: Vec<&RawValue> = serde_json::from_slice(body)
            .map_err(|e| InvalidJson(format!("invalid JSON array: {e}")))?;
        for item in items {
            minify_into(item.get().as_bytes(), &mut out);
            out.push(b'\n');
            messages += 1;
        }
    } else {
        minify_into(body, &mut out);
        out.push(b'\n');
        messages = 1;
    }
    Ok(Normalized {
        bytes: out,
        messages,
    })
}

/// Copies valid JSON text, dropping whitespace outside strings.
fn minify_into(src: &[u8], out: &mut Vec<u8>) {
    let mut in_string = false;
    let mut escaped = false;
    for &b in src {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
            out.push(b);
        } else if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            out.push(b);
        }
    }
}

/// Renders canonical NDJSON lines as one JSON array: `[` + lines joined by `,` + `]`.
pub fn ndjson_to_array(ndjson: &[u8], out: &mut Vec<u8>) {
    out.reserve(ndjson.len() + 2);
    out.push(b'[');
    let mut first = true;
    for line in ndjson.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(line);
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(s: &str) -> (String, usize) {
        let n = normalize(s.as_bytes()).expect("valid");
        (String::from_utf8(n.bytes).expect("utf8"), n.messages)
    }

    #[test]
    fn flattens_one_level() {
        assert_eq!(norm(r#"{"a": 1}"#), ("{\"a\":1}\n".into(), 1));
        assert_eq!(
            norm(r#"[{"a":1}, {"b":2}]"#),
            ("{\"a\":1}\n{\"b\":2}\n".into(), 2)
        );
        assert_eq!(norm("[[1,2],[3,4]]"), ("[1,2]\n[3,4]\n".into(), 2));
        assert_eq!(norm("[[[1,2,3]]]"), ("[[1,2,3]]\n".into(), 1));
        assert_eq!(norm(" [ ] "), (String::new(), 0));
        assert_eq!(norm(r#""a b\" c""#), ("\"a b\\\" c\"\n".into(), 1));
    }

    #[test]
    fn rejects_invalid() {
        for bad in ["", "{", "[1,]", "{} {}", "nope"] {
            assert!(normalize(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(
            normalize(b"\"\xff\xfe\"").is_err(),
            "invalid UTF-8 inside a string"
        );
        assert!(normalize(b"{\"\xff\":1}").is_err());
    }

    #[test]
    fn array_rendering() {
        let mut out = Vec::new();
        ndjson_to_array(b"{\"a\":1}\n[2]\n", &mut out);
        assert_eq!(out, b"[{\"a\":1},[2]]");
        out.clear();
        ndjson_to_array(b"", &mut out);
        assert_eq!(out, b"[]");
    }

    fn arb_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            "[ a-z\\\\\"\n]{0,8}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Flattening keeps every value and puts each on exactly one line.
        #[test]
        fn normalization_preserves_values(v in arb_json()) {
            let pretty = serde_json::to_string_pretty(&v).expect("serialize");
            let n = normalize(pretty.as_bytes()).expect("valid");
            let expected: Vec<serde_json::Value> = match &v {
                serde_json::Value::Array(items) => items.clone(),
                other => vec![other.clone()],
            };
            prop_assert_eq!(n.messages, expected.len());
            let lines: Vec<&[u8]> = n.bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
            prop_assert_eq!(lines.len(), expected.len());
            for (line, want) in lines.iter().zip(expected.iter()) {
                let got: serde_json::Value = serde_json::from_slice(line).expect("line parses");
                prop_assert_eq!(&got, want);
            }
        }
    }
}
