//! Content types: validation, normalization, media-type matching and JSON mode.

/// The `tchar`s of RFC 9110 §5.6.2 (the characters of a token), as a table: the validation
/// runs over every byte of every write's `Content-Type`, and a lookup is a load where the
/// spelled-out test was a search of the punctuation list per byte.
const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

/// Whether `b` is a `tchar` of RFC 9110 §5.6.2 (the characters of a token).
fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

/// Length of the token at the start of `s` (0 when there is none).
fn token_len(s: &[u8]) -> usize {
    s.iter().position(|b| !is_tchar(*b)).unwrap_or(s.len())
}

/// Length of the quoted-string at the start of `s` (RFC 9110 §5.6.4), if it is one.
fn quoted_len(s: &[u8]) -> Option<usize> {
    if s.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' => return Some(i + 1),
            b'\\' => {
                // quoted-pair: HTAB, SP, VCHAR or obs-text.
                let next = *s.get(i + 1)?;
                if !(next == b'\t' || next >= 0x20) || next == 0x7f {
                    return None;
                }
                i += 2;
            }
            b'\t' | b' ' | 0x21..=0x7e | 0x80..=0xff => i += 1,
            _ => return None,
        }
    }
    None
}

/// Whether `ct` is exactly one media type of RFC 9110 §8.3.1:
/// `type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] )`, with optional
/// whitespace around the whole value. A list (`a/b, c/d`), a stray quote or separator, or a
/// parameter without a value is not one. One pass, no allocation: it runs on every write.
pub fn is_valid(ct: &str) -> bool {
    let ows = |s: &[u8], mut i: usize| {
        while matches!(s.get(i), Some(b' ' | b'\t')) {
            i += 1;
        }
        i
    };
    let s = ct.as_bytes();
    let mut i = ows(s, 0);
    let ty = token_len(&s[i..]);
    if ty == 0 || s.get(i + ty) != Some(&b'/') {
        return false;
    }
    i += ty + 1;
    let sub = token_len(&s[i..]);
    if sub == 0 {
        return false;
    }
    i += sub;
    loop {
        i = ows(s, i);
        match s.get(i) {
            None => return true,
            Some(b';') => i = ows(s, i + 1),
            Some(_) => return false,
        }
        // An empty parameter (`a/b;` or `a/b;;c=d`) is allowed by the grammar.
        if matches!(s.get(i), None | Some(b';')) {
            continue;
        }
        let name = token_len(&s[i..]);
        if name == 0 || s.get(i + name) != Some(&b'=') {
            return false;
        }
        i += name + 1;
        let value = match token_len(&s[i..]) {
            0 => match quoted_len(&s[i..]) {
                Some(n) => n,
                None => return false,
            },
            n => n,
        };
        i += value;
    }
}

/// Normalizes a content type: split on `;`, trim, drop empties, lowercase, join with `"; "`.
/// An empty value yields `application/octet-stream`.
pub fn normalize(ct: &str) -> String {
    // One allocation: this runs for every append.
    let mut out = String::with_capacity(ct.len() + 2);
    for part in ct.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push_str("; ");
        }
        let start = out.len();
        out.push_str(part);
        if let Some(added) = out.get_mut(start..) {
            added.make_ascii_lowercase();
        }
    }
    if out.is_empty() {
        return "application/octet-stream".to_owned();
    }
    out
}

/// The normalized form of `ct` when `ct` is a valid media type, `None` when it is not (see
/// [`is_valid`] and [`normalize`]). The common value, a lowercase `type/subtype` without
/// parameters or spaces, is recognised in one pass and copied as it is.
pub fn validate_normalize(ct: &str) -> Option<String> {
    let s = ct.as_bytes();
    let mut slash = None;
    let mut plain = !s.is_empty();
    for (i, &b) in s.iter().enumerate() {
        if b == b'/' && slash.is_none() {
            slash = Some(i);
        } else if !is_tchar(b) || b.is_ascii_uppercase() {
            plain = false;
            break;
        }
    }
    match slash {
        Some(i) if plain && i > 0 && i + 1 < s.len() => Some(ct.to_owned()),
        _ => is_valid(ct).then(|| normalize(ct)),
    }
}

/// The media type (essence) of a content type: the part before the first `;`, trimmed.
pub fn media_type(ct: &str) -> &str {
    let end = ct.bytes().position(|b| b == b';').unwrap_or(ct.len());
    ct[..end].trim()
}

/// Two content types match when their media types are equal case-insensitively. Every
/// append checks its type against its stream's, and the two are usually the same text.
pub fn matches(a: &str, b: &str) -> bool {
    a == b || media_type(a).eq_ignore_ascii_case(media_type(b))
}

/// JSON mode applies when the media type is `application/json`.
pub fn is_json(ct: &str) -> bool {
    media_type(ct).eq_ignore_ascii_case("application/json")
}

/// Text streams (`text/*`) carry SSE data as UTF-8 text.
pub fn is_text(ct: &str) -> bool {
    media_type(ct).to_ascii_lowercase().starts_with("text/")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, spelled out: split, trim, lowercase, drop empties, join.
    fn normalize_reference(ct: &str) -> String {
        let parts: Vec<String> = ct
            .split(';')
            .map(|p| p.trim().to_ascii_lowercase())
            .filter(|p| !p.is_empty())
            .collect();
        if parts.is_empty() {
            return "application/octet-stream".to_owned();
        }
        parts.join("; ")
    }

    proptest::proptest! {
        // Biased towards separators, spaces, tabs and case so that splitting, trimming and
        // joining are exercised, with any other character mixed in.
        #[test]
        fn normalize_matches_its_definition(
            ct in "([ \t;;;aAzZ/=\\u{a0}]|[ -~\\u{80}-\\u{10ffff}]){0,40}"
        ) {
            proptest::prop_assert_eq!(normalize(&ct), normalize_reference(&ct));
        }
    }

    proptest::proptest! {
        /// The fast path changes nothing: a value is accepted exactly when it is valid, and
        /// accepted values come out as `normalize` spells them.
        #[test]
        fn validate_normalize_is_is_valid_then_normalize(
            ct in "([ \t;/=\"aAzZ]|[a-z]{1,6}|[ -~\u{80}-\u{10ffff}]){0,24}"
        ) {
            let want = is_valid(&ct).then(|| normalize(&ct));
            proptest::prop_assert_eq!(validate_normalize(&ct), want);
        }
    }

    #[test]
    fn validate_normalize_takes_plain_types_as_they_are() {
        for (ct, want) in [
            ("application/json", Some("application/json")),
            ("application/vnd.a+json", Some("application/vnd.a+json")),
            ("Application/JSON", Some("application/json")),
            (
                "text/plain;charset=UTF-8",
                Some("text/plain; charset=utf-8"),
            ),
            (" text/plain ", Some("text/plain")),
            ("application/", None),
            ("/json", None),
            ("a/b/c", None),
            ("application", None),
            ("", None),
        ] {
            assert_eq!(validate_normalize(ct).as_deref(), want, "{ct:?}");
        }
    }

    #[test]
    fn media_types_of_rfc_9110_are_valid_and_nothing_else() {
        for ok in [
            "application/json",
            " Application/JSON ",
            "text/plain; charset=utf-8",
            "text/plain;charset=UTF-8;format=flowed",
            "text/plain ;  charset=\"utf-8\"",
            "text/plain; a=\"x;y\\\"z\"",
            "application/json;",
            "application/json;;a=b",
            "application/vnd.a+json",
            "x-custom/x.y_z-1",
        ] {
            assert!(is_valid(ok), "{ok:?} is a media type");
        }
        for bad in [
            "",
            "application",
            "application/",
            "/json",
            "application/json, text/plain",
            "application/json\"",
            "application/json ,x",
            "application /json",
            "application/ json",
            "application/json x",
            "text/plain; charset",
            "text/plain; charset=",
            "text/plain; charset =utf-8",
            "text/plain; charset= utf-8",
            "text/plain; a=\"unterminated",
            "text/plain; a=\"x\"y",
            "a/b/c",
            "x\"><script>/y",
            "text/plain; a=\"x\u{7f}\"",
        ] {
            assert!(!is_valid(bad), "{bad:?} is not a media type");
        }
    }

    proptest::proptest! {
        /// A type, subtype and parameters built from the grammar are accepted; putting a
        /// character that no token holds in the type or subtype makes the value invalid.
        #[test]
        fn grammar_built_media_types_are_valid(
            ty in "[a-zA-Z0-9!#$%&'*+.^_`|~-]{1,12}",
            sub in "[a-zA-Z0-9!#$%&'*+.^_`|~-]{1,12}",
            params in proptest::collection::vec(
                ("[a-z0-9-]{1,8}", "[a-zA-Z0-9.-]{1,8}|\"[ -!#-\\[\\]-~]{0,8}\""),
                0..4,
            ),
            bad in "[ \"(),/:<=>?@\\[\\]{}]",
            at in 0usize..24,
        ) {
            let mut ct = format!("{ty}/{sub}");
            for (k, v) in &params {
                ct.push_str(&format!("; {k}={v}"));
            }
            proptest::prop_assert!(is_valid(&ct), "{}", ct);
            let essence = format!("{ty}/{sub}");
            let cut = at % (essence.len() + 1);
            let mut broken = essence.clone();
            broken.insert_str(cut, &bad);
            // A leading or trailing space is optional whitespace, not an error.
            if !(bad == " " && (cut == 0 || cut == essence.len())) {
                proptest::prop_assert!(!is_valid(&broken), "{}", broken);
            }
        }
    }

    #[test]
    fn normalizes() {
        assert_eq!(
            normalize("Application/JSON ;Charset=UTF-8"),
            "application/json; charset=utf-8"
        );
        assert_eq!(normalize(""), "application/octet-stream");
        assert_eq!(normalize(" ; "), "application/octet-stream");
    }

    #[test]
    fn matching_ignores_parameters() {
        assert!(matches(
            "application/json",
            "APPLICATION/JSON; charset=utf-8"
        ));
        assert!(!matches("application/json", "application/x-ndjson"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(!is_json("application/ld+json"));
        assert!(is_text("text/plain"));
    }
}
