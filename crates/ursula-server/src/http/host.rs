//! The `Host` of a request (RFC 9112 §3.2) and the public base URL built from it
//! (protocol.md §2.7).
//!
//! Without `server.public_url`, the authority of a create's absolute `Location` comes from
//! the request, so it must be checked before anything echoes it: an HTTP/1.1 request needs
//! exactly one `Host` holding a URI authority (`host[:port]`), else `400 MALFORMED_REQUEST`.
//! `server.allowed_hosts`, when set, also limits which host names are served (a node
//! reachable from a browser is then safe from DNS rebinding).

use super::error::ApiError;
use crate::app::App;
use http::{HeaderMap, Request, Version, header};
use ursula_core::ErrorCode;

/// Longest `Host` accepted: a 253-byte DNS name, brackets or a port beside it.
const MAX_HOST_BYTES: usize = 262;

fn malformed(m: &str) -> ApiError {
    ApiError::new(ErrorCode::MALFORMED_REQUEST, m.to_owned())
}

/// Whether `s` is `host [ ":" port ]` with a non-empty host: a registered name (letters,
/// digits, `-`, `.`, `_`, `~`), an IPv4 address (a name by that grammar) or a bracketed IPv6
/// literal, and a port of 1 to 5 digits up to 65535. Sub-delimiters and percent-encoding,
/// which RFC 3986 allows in a name but no DNS name holds, are refused so that nothing a
/// browser or proxy could read as markup or as a second authority gets through.
pub fn is_valid_authority(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_HOST_BYTES {
        return false;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return false;
        };
        if ip.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            _ => match after.strip_prefix(':') {
                Some(p) => ("v6", Some(p)),
                None => return false,
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    let port_ok = port.is_none_or(|p| {
        (1..=5).contains(&p.len())
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| n <= 65_535)
    });
    host_ok && port_ok
}

/// The host name of a valid authority (without port or IPv6 brackets), for the allow-list.
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .trim_end_matches('.')
}

/// Checks a request's `Host` (and the authority of an absolute-form target). `Ok` carries
/// nothing: the checked value is read again where it is needed ([`base_url`]).
pub fn check<B>(app: &App, req: &Request<B>) -> Result<(), ApiError> {
    let hm = req.headers();
    let mut hosts = hm.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(malformed("the request has more than one Host header")),
        (None, _) if req.version() == Version::HTTP_11 => {
            return Err(malformed("an HTTP/1.1 request needs a Host header"));
        }
        (None, _) => None,
        (Some(v), None) => Some(
            v.to_str()
                .ok()
                .filter(|v| is_valid_authority(v))
                .ok_or_else(|| malformed("the Host header is not a host with an optional port"))?,
        ),
    };
    // An absolute-form target names the authority itself; RFC 9112 §3.2.2 has it win.
    let authority = match req.uri().authority() {
        Some(a) if !is_valid_authority(a.as_str()) => {
            return Err(malformed(
                "the request target's authority is not a host with an optional port",
            ));
        }
        Some(a) => Some(a.as_str()),
        None => host,
    };
    let allowed = &app.cfg.allowed_hosts;
    if !allowed.is_empty() {
        let name = authority.map(host_name);
        if !name.is_some_and(|n| allowed.iter().any(|a| a.eq_ignore_ascii_case(n))) {
            return Err(malformed(
                "this node does not serve the host the request names",
            ));
        }
    }
    Ok(())
}

/// The public base URL of a request (protocol.md §2.7): `server.public_url`; else, when
/// `trust_forwarded_headers` is on, what a proxy forwarded ([`forwarded_base`]); else `http://`
/// and the authority [`check`] accepted, else the listener's address.
pub fn base_url(app: &App, uri: &http::Uri, hm: &HeaderMap) -> String {
    if let Some(u) = &app.cfg.public_url {
        return u.trim_end_matches('/').to_owned();
    }
    if app.cfg.trust_forwarded_headers
        && let Some(base) = forwarded_base(hm)
    {
        return base;
    }
    let authority = uri.authority().map(|a| a.as_str()).or_else(|| {
        hm.get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .filter(|v| is_valid_authority(v))
    });
    match authority {
        Some(a) => format!("http://{a}"),
        None => format!("http://{}", app.cfg.listen),
    }
}

/// The base URL a trusted proxy forwarded: the first element of `Forwarded` (RFC 7239) when
/// it names a `host`, else the first values of `X-Forwarded-Host` and `X-Forwarded-Proto`.
/// The scheme is `http` or `https` (`http` when not forwarded) and the host must be a valid
/// authority; a header that is malformed is ignored, never echoed.
fn forwarded_base(hm: &HeaderMap) -> Option<String> {
    let first = |name: &str| {
        hm.get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let (proto, host) = match first("forwarded").and_then(parse_forwarded) {
        Some((proto, host)) => (proto, host),
        None => (first("x-forwarded-proto"), first("x-forwarded-host")?),
    };
    let scheme = match proto {
        None => "http",
        Some(p) if p.eq_ignore_ascii_case("http") => "http",
        Some(p) if p.eq_ignore_ascii_case("https") => "https",
        Some(_) => return None,
    };
    is_valid_authority(host).then(|| format!("{scheme}://{host}"))
}

/// `proto` and `host` of one `Forwarded` element (`for=…;proto=https;host=example.com`,
/// values optionally quoted); `None` without a `host`.
fn parse_forwarded(element: &str) -> Option<(Option<&str>, &str)> {
    let mut proto = None;
    let mut host = None;
    for pair in element.split(';') {
        let (k, v) = pair.split_once('=')?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        match k.trim().to_ascii_lowercase().as_str() {
            "proto" => proto = Some(v),
            "host" => host = Some(v),
            _ => {}
        }
    }
    Some((proto, host?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(headers: &[(&'static str, &'static str)]) -> Option<String> {
        let mut hm = HeaderMap::new();
        for (k, v) in headers {
            hm.append(*k, http::HeaderValue::from_static(v));
        }
        forwarded_base(&hm)
    }

    #[test]
    fn forwarded_headers_name_the_public_base() {
        let f = "for=192.0.2.60;proto=https;host=streams.example.com, for=10.0.0.1;host=inner";
        assert_eq!(
            forwarded(&[("forwarded", f)]).as_deref(),
            Some("https://streams.example.com")
        );
        assert_eq!(
            forwarded(&[("forwarded", "host=\"[::1]:8443\";proto=\"HTTPS\"")]).as_deref(),
            Some("https://[::1]:8443")
        );
        // Forwarded wins; without a host in it, the X-Forwarded pair is used.
        let both = [
            ("forwarded", "proto=https;host=a.example"),
            ("x-forwarded-host", "b.example"),
        ];
        assert_eq!(forwarded(&both).as_deref(), Some("https://a.example"));
        let xf = [
            ("forwarded", "for=1.2.3.4"),
            ("x-forwarded-proto", "https, http"),
            ("x-forwarded-host", "b.example:8443, c"),
        ];
        assert_eq!(forwarded(&xf).as_deref(), Some("https://b.example:8443"));
        assert_eq!(
            forwarded(&[("x-forwarded-host", "b.example")]).as_deref(),
            Some("http://b.example")
        );
        // Malformed values are ignored, never echoed.
        for bad in [
            &[("x-forwarded-host", "x\"><script>")][..],
            &[
                ("x-forwarded-host", "b.example"),
                ("x-forwarded-proto", "ftp"),
            ],
            &[("forwarded", "host")],
            &[("x-forwarded-proto", "https")],
        ] {
            assert_eq!(forwarded(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn authorities() {
        for ok in [
            "127.0.0.1:4437",
            "localhost",
            "streams.example.com",
            "a-b_c~d.e:1",
            "x:65535",
            "[::1]",
            "[::1]:8080",
            "[2001:db8::7]:443",
            "LOCALHOST.",
        ] {
            assert!(is_valid_authority(ok), "{ok:?}");
        }
        for bad in [
            "",
            "x\"><script>",
            "a b",
            "a,b",
            "a/b",
            "a@b",
            "a:b",
            "a:",
            ":80",
            "a:65536",
            "a:123456",
            "a:-1",
            "a:1:2",
            "[::1",
            "[::1]x",
            "[::1]:",
            "[nope]",
            "a%20b",
            "a'b",
            "a;b",
            "a\tb",
        ] {
            assert!(!is_valid_authority(bad), "{bad:?}");
        }
        assert!(!is_valid_authority(&"a".repeat(MAX_HOST_BYTES + 1)));
    }

    proptest::proptest! {
        /// A name of the allowed characters with or without a port is an authority; one
        /// character that could end the URL, start markup or a second authority is not.
        #[test]
        fn names_with_one_bad_character_are_refused(
            name in "[a-zA-Z0-9._~-]{1,40}",
            port in proptest::option::of(0u32..=65_535),
            bad in "[ \"<>'/\\\\@?#%,;(){}|^\t]",
            at in 0usize..41,
        ) {
            let authority = match port {
                Some(p) => format!("{name}:{p}"),
                None => name.clone(),
            };
            proptest::prop_assert!(is_valid_authority(&authority), "{}", authority);
            let mut broken = name.clone();
            broken.insert_str(at % (name.len() + 1), &bad);
            proptest::prop_assert!(!is_valid_authority(&broken), "{:?}", broken);
        }
    }

    #[test]
    fn host_names_for_the_allow_list() {
        assert_eq!(host_name("Example.com:80"), "Example.com");
        assert_eq!(host_name("example.com."), "example.com");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
    }
}
