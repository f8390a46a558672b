//! The gateway's CORS (cluster.md §12.6): the nodes' CORS headers never pass through it; it
//! answers preflights itself, the same for every path, and adds its own headers to answers for
//! an allowed `Origin`. `Access-Control-Allow-Credentials` is never sent (tokens travel in
//! `Authorization`, not cookies).

use crate::answer::{Body, full};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};

const METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";

pub struct Cors {
    /// Exact origins, or `*`; empty: CORS is off.
    allowed: Vec<String>,
}

impl Cors {
    pub fn new(allowed: &[String]) -> Cors {
        Cors {
            allowed: allowed.iter().map(|o| o.trim().to_owned()).collect(),
        }
    }

    /// `Access-Control-Allow-Origin` for a request from `origin`, if it is allowed.
    fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let origin = origin?;
        if self.allowed.iter().any(|a| a == "*") {
            return Some(HeaderValue::from_static("*"));
        }
        let o = origin.to_str().ok()?;
        self.allowed.iter().any(|a| a == o).then(|| origin.clone())
    }

    /// The answer to any `OPTIONS`: `204` with `Allow`, and for an allowed preflight the
    /// CORS headers, allowing the headers it asked for.
    pub fn options(&self, req: &HeaderMap) -> Response<Body> {
        let mut r = Response::new(full(""));
        *r.status_mut() = StatusCode::NO_CONTENT;
        let hm = r.headers_mut();
        hm.insert(header::ALLOW, HeaderValue::from_static(METHODS));
        let preflight = req.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if let (true, Some(allow)) = (preflight, self.allow(req.get(header::ORIGIN))) {
            if allow != "*" {
                hm.append(header::VARY, HeaderValue::from_static("origin"));
            }
            hm.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            hm.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(METHODS),
            );
            hm.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            if let Some(h) = req.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
                hm.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, h.clone());
            }
        }
        r
    }

    /// Replaces an answer's CORS headers with the gateway's for a request from `origin`.
    pub fn apply(&self, origin: Option<&HeaderValue>, hm: &mut HeaderMap) {
        let upstream: Vec<_> = hm
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-"))
            .cloned()
            .collect();
        for k in upstream {
            hm.remove(k);
        }
        let vary: Vec<HeaderValue> = hm
            .get_all(header::VARY)
            .iter()
            .filter(|v| !v.as_bytes().eq_ignore_ascii_case(b"origin"))
            .cloned()
            .collect();
        hm.remove(header::VARY);
        for v in vary {
            hm.append(header::VARY, v);
        }
        let Some(allow) = self.allow(origin) else {
            return;
        };
        if allow != "*" {
            hm.append(header::VARY, HeaderValue::from_static("origin"));
        }
        hm.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        hm.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("*"),
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut hm = HeaderMap::new();
        for (k, v) in pairs {
            hm.append(*k, HeaderValue::from_static(v));
        }
        hm
    }

    #[test]
    fn preflights_are_answered_for_allowed_origins_only() {
        let cors = Cors::new(&["https://app.example".to_owned()]);
        let pre = headers(&[
            ("origin", "https://app.example"),
            ("access-control-request-method", "PUT"),
            (
                "access-control-request-headers",
                "if-none-match, content-type",
            ),
        ]);
        let r = cors.options(&pre);
        assert_eq!(r.status(), 204);
        let hm = r.headers();
        assert_eq!(hm["access-control-allow-origin"], "https://app.example");
        assert_eq!(
            hm["access-control-allow-headers"],
            "if-none-match, content-type"
        );
        assert_eq!(hm["access-control-max-age"], "600");
        assert_eq!(hm["vary"], "origin");
        let stranger = headers(&[
            ("origin", "https://evil.example"),
            ("access-control-request-method", "PUT"),
        ]);
        let r = cors.options(&stranger);
        assert_eq!(r.status(), 204);
        assert!(r.headers().get("access-control-allow-origin").is_none());
        assert_eq!(r.headers()["allow"], METHODS);
    }

    #[test]
    fn upstream_cors_is_replaced_by_the_gateways() {
        let mut hm = headers(&[
            ("access-control-allow-origin", "*"),
            ("access-control-expose-headers", "*"),
            ("vary", "Origin"),
            ("vary", "accept-encoding"),
        ]);
        let off = Cors::new(&[]);
        off.apply(Some(&HeaderValue::from_static("https://a")), &mut hm);
        assert!(
            hm.get("access-control-allow-origin").is_none(),
            "off: none at all"
        );
        assert_eq!(hm.get_all("vary").iter().count(), 1);
        let any = Cors::new(&["*".to_owned()]);
        any.apply(Some(&HeaderValue::from_static("https://a")), &mut hm);
        assert_eq!(hm["access-control-allow-origin"], "*");
        assert_eq!(hm["access-control-expose-headers"], "*");
        assert!(hm.get("access-control-allow-credentials").is_none());
        let mut none = HeaderMap::new();
        any.apply(None, &mut none);
        assert!(none.is_empty(), "no Origin, no CORS");
    }
}
