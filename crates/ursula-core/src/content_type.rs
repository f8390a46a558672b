//! Content types: normalization, media-type matching and JSON mode.

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

/// The media type (essence) of a content type: the part before the first `;`, trimmed.
pub fn media_type(ct: &str) -> &str {
    ct.split(';').next().unwrap_or("").trim()
}

/// Two content types match when their media types are equal case-insensitively.
pub fn matches(a: &str, b: &str) -> bool {
    media_type(a).eq_ignore_ascii_case(media_type(b))
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
