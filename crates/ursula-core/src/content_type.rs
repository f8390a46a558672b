//! Content types: normalization, media-type matching and JSON mode.

/// Normalizes a content type: split on `;`, trim, drop empties, lowercase, join with `"; "`.
/// An empty value yields `application/octet-stream`.
pub fn normalize(ct: &str) -> String {
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
