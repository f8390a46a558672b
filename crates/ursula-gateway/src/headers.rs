//! Headers across the proxy (cluster.md §12.2): hop-by-hop ones stay, the forwarded origin is
//! the gateway's to state, and answers never name a node.

use http::HeaderMap;
use http::header::{self, HeaderValue};

use ursula_http::strip_hop_by_hop;

/// The request headers an upstream gets: the client's, without hop-by-hop ones and `Host`
/// (the client sets the upstream's), with `X-Forwarded-Host` (the client's `Host`) and
/// `X-Forwarded-Proto` in place of whatever the client sent. `proto` is `https` only when a
/// TLS ingress in front said so (`X-Forwarded-Proto: https`); the gateway itself terminates
/// no TLS.
pub fn upstream_request(client: &HeaderMap) -> HeaderMap {
    let mut hm = client.clone();
    strip_hop_by_hop(&mut hm);
    let host = hm.remove(header::HOST);
    let proto = match client.get("x-forwarded-proto").map(HeaderValue::as_bytes) {
        Some(b"https") => "https",
        _ => "http",
    };
    hm.remove("x-forwarded-host");
    hm.remove("x-forwarded-proto");
    hm.remove(header::FORWARDED);
    // The body is buffered already: nothing to wait for.
    hm.remove(header::EXPECT);
    if let Some(h) = host {
        hm.insert("x-forwarded-host", h);
    }
    hm.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    hm
}

/// The origin (`scheme://authority`) of an absolute URL.
pub fn origin_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some(&url[..url.len() - rest.len() + end])
}

/// The path and query of an absolute URL (`/` when it has none).
pub fn path_of(url: &str) -> &str {
    match origin_of(url) {
        Some(o) if url.len() > o.len() => &url[o.len()..],
        Some(_) => "/",
        None => url,
    }
}

/// Rewrites the limits an answer advertises (protocol.md §9) to the gateway's own when they
/// are smaller (cluster.md §12.2, OQ-105); a limit the node did not send is not added.
pub fn advertise_limits(hm: &mut HeaderMap, max_request: u64, max_snapshot_request: u64) {
    let get = |hm: &HeaderMap, n: &str| {
        hm.get(n)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let request = get(hm, "ursula-max-request-bytes").map(|n| n.min(max_request));
    if let Some(n) = request {
        hm.insert("ursula-max-request-bytes", HeaderValue::from(n));
    }
    if let Some(n) = get(hm, "ursula-max-snapshot-request-bytes") {
        let n = n.min(max_snapshot_request);
        hm.insert("ursula-max-snapshot-request-bytes", HeaderValue::from(n));
    }
    if let Some(n) = get(hm, "ursula-max-snapshot-bytes") {
        let parts = request.unwrap_or(max_request).saturating_mul(4096);
        hm.insert("ursula-max-snapshot-bytes", HeaderValue::from(n.min(parts)));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_stay_behind() {
        let mut hm = HeaderMap::new();
        hm.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        hm.insert("x-secret", HeaderValue::from_static("1"));
        hm.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        hm.insert(header::HOST, HeaderValue::from_static("gw.example"));
        hm.insert("x-forwarded-host", HeaderValue::from_static("evil"));
        hm.append("stream-seq", HeaderValue::from_static("a"));
        hm.append("x-many", HeaderValue::from_static("1"));
        hm.append("x-many", HeaderValue::from_static("2"));
        let up = upstream_request(&hm);
        assert!(up.get("x-secret").is_none() && up.get(header::CONNECTION).is_none());
        assert!(up.get(header::TRANSFER_ENCODING).is_none() && up.get(header::HOST).is_none());
        assert_eq!(up.get("x-forwarded-host").unwrap(), "gw.example");
        assert_eq!(up.get("x-forwarded-proto").unwrap(), "http");
        assert_eq!(
            up.get_all("x-many").iter().count(),
            2,
            "repeated headers kept"
        );
        assert_eq!(up.get("stream-seq").unwrap(), "a");
    }

    #[test]
    fn urls_split_into_origin_and_path() {
        assert_eq!(
            origin_of("http://10.0.0.1:4437/b/s?x=1"),
            Some("http://10.0.0.1:4437")
        );
        assert_eq!(origin_of("https://a.example"), Some("https://a.example"));
        assert_eq!(origin_of("/b/s"), None);
        assert_eq!(path_of("http://10.0.0.1:4437/b/s?x=1"), "/b/s?x=1");
        assert_eq!(path_of("http://a"), "/");
    }

    #[test]
    fn advertised_limits_never_exceed_the_gateways() {
        let mut hm = HeaderMap::new();
        hm.insert("ursula-max-request-bytes", HeaderValue::from(64u64 << 20));
        hm.insert(
            "ursula-max-snapshot-request-bytes",
            HeaderValue::from(10u64),
        );
        hm.insert("ursula-max-snapshot-bytes", HeaderValue::from(u64::MAX));
        advertise_limits(&mut hm, 32 << 20, 128 << 20);
        assert_eq!(hm["ursula-max-request-bytes"], (32u64 << 20).to_string());
        assert_eq!(hm["ursula-max-snapshot-request-bytes"], "10");
        assert_eq!(
            hm["ursula-max-snapshot-bytes"],
            ((32u64 << 20) * 4096).to_string()
        );
        let mut none = HeaderMap::new();
        advertise_limits(&mut none, 1, 1);
        assert!(none.is_empty(), "nothing added");
    }
}
