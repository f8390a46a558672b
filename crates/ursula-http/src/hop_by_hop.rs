//! Hop-by-hop headers (RFC 9110 §7.6.1): a proxy never forwards them.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// Headers of one connection, never forwarded (RFC 9110 §7.6.1), besides those `Connection`
/// names.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers and those `Connection` lists.
pub fn strip_hop_by_hop(hm: &mut HeaderMap) {
    let named: Vec<HeaderName> = hm
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        hm.remove(n);
    }
    for n in HOP_BY_HOP {
        hm.remove(n);
    }
    hm.remove("trailers");
}
