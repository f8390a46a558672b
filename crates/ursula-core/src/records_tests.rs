use super::*;

fn params<'a>(pairs: &[(&str, &'a str)]) -> RecordParams<'a> {
    let mut p = RecordParams::default();
    for (k, v) in pairs {
        match *k {
            "record" => p.record = Some(v),
            "tail_records" => p.tail_records = Some(v),
            "max_records" => p.max_records = Some(v),
            "record_view" => p.record_view = Some(v),
            "offset" => p.offset = true,
            "max_bytes" => p.max_bytes = true,
            _ => unreachable!("{k}"),
        }
    }
    p
}

fn code(pairs: &[(&str, &str)]) -> Option<ErrorCode> {
    params(pairs).check().err().map(|r| r.code)
}

#[test]
fn parameters_follow_the_validation_table() {
    let q = |pairs: &[(&str, &str)]| params(pairs).check().expect("valid");
    assert_eq!(q(&[]), None);
    assert_eq!(
        q(&[("record", "now")]),
        Some(RecordQuery {
            start: RecordStart::Now,
            max_records: None,
            envelope: false
        })
    );
    assert_eq!(
        q(&[
            ("tail_records", "0"),
            ("max_records", "5"),
            ("record_view", "envelope")
        ]),
        Some(RecordQuery {
            start: RecordStart::Tail(0),
            max_records: Some(5),
            envelope: true
        })
    );
    assert_eq!(
        q(&[("record", "42")]).map(|r| r.start),
        Some(RecordStart::At(42))
    );
    let bad = Some(ErrorCode::INVALID_QUERY);
    for pairs in [
        &[("record", "1"), ("tail_records", "1")][..],
        &[("record", "1"), ("offset", "")],
        &[("tail_records", "1"), ("offset", "")],
        &[("max_records", "1")],
        &[("max_records", "1"), ("offset", "")],
        &[("record", "1"), ("max_bytes", "")],
        &[("record_view", "envelope")],
        &[("record", "1"), ("record_view", "lines")],
        &[("record", "1"), ("record_view", "")],
        &[("record", "-1")],
        &[("record", "")],
        &[("record", "NOW")],
        &[("record", "1.5")],
        &[("record", "18446744073709551616")],
        &[("tail_records", "-1")],
        &[("tail_records", "now")],
        &[("record", "1"), ("max_records", "0")],
        &[("record", "1"), ("max_records", "x")],
    ] {
        assert_eq!(code(pairs), bad, "{pairs:?}");
    }
    // The first broken rule answers: the combination before the value.
    let msg = params(&[("record", "x"), ("tail_records", "y")])
        .check()
        .unwrap_err()
        .message;
    assert!(msg.contains("exclude"), "{msg}");
}

#[test]
fn envelope_lines_carry_their_ordinals() {
    let mut out = Vec::new();
    envelope_into(b"{\"a\":1}\n[2]\n\"s\"\n", 41, &mut out);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "{\"record\":41,\"value\":{\"a\":1}}\n{\"record\":42,\"value\":[2]}\n{\"record\":43,\"value\":\"s\"}\n"
    );
    let mut out = Vec::new();
    envelope_into(b"", 7, &mut out);
    assert!(out.is_empty());
}
