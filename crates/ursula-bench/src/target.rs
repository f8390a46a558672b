//! Where the load goes: base URL plus URL layout.
//!
//! native: `{base}/{bucket}/{stream}`; compat: `{base}/v1/stream/{stream}`.

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use http::{HeaderValue, Uri};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Layout {
    /// `{base}/{bucket}/{stream}`
    Native,
    /// `{base}/v1/stream/{stream}`
    Compat,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Native => "native",
            Layout::Compat => "compat",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Target {
    /// The base URL as given (for reports).
    pub base: String,
    /// `host:port` to connect to.
    pub host: String,
    pub port: u16,
    /// Value for the Host header.
    pub host_header: HeaderValue,
    /// Path prefix of the base URL, without trailing slash ("" for the root).
    pub prefix: String,
    pub layout: Layout,
    pub bucket: String,
}

/// Names must be usable in a URL path segment without escaping.
fn check_segment(what: &str, s: &str) -> Result<()> {
    if s.is_empty() {
        bail!("{what} must not be empty");
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~')))
    {
        bail!("{what} {s:?} contains {c:?}; use [A-Za-z0-9-_.~]");
    }
    Ok(())
}

impl Target {
    pub fn parse(base: &str, layout: Layout, bucket: &str) -> Result<Self> {
        let uri: Uri = base
            .parse()
            .with_context(|| format!("invalid base URL {base:?}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => bail!("only http:// base URLs are supported, got {other}://"),
            None => bail!("base URL {base:?} needs a scheme, e.g. http://127.0.0.1:4437"),
        }
        let authority = uri
            .authority()
            .with_context(|| format!("base URL {base:?} has no host"))?;
        if uri.query().is_some() {
            bail!("base URL {base:?} must not have a query string");
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(80);
        let prefix = uri.path().trim_end_matches('/').to_owned();
        if layout == Layout::Native {
            check_segment("bucket", bucket)?;
        }
        let host_header = HeaderValue::from_str(authority.as_str())
            .with_context(|| format!("bad host in {base:?}"))?;
        Ok(Self {
            base: base.to_owned(),
            host: host.to_owned(),
            port,
            host_header,
            prefix,
            layout,
            bucket: bucket.to_owned(),
        })
    }

    /// Path (no query) of a stream.
    pub fn stream_path(&self, stream: &str) -> String {
        match self.layout {
            Layout::Native => format!("{}/{}/{}", self.prefix, self.bucket, stream),
            Layout::Compat => format!("{}/v1/stream/{}", self.prefix, stream),
        }
    }

    pub fn stream_uri(&self, stream: &str) -> Result<Uri> {
        check_segment("stream name", stream)?;
        path_uri(&self.stream_path(stream))
    }

    /// URI for reading `stream` at `offset`, with extra query (`&live=...`).
    pub fn read_uri(&self, stream_path: &str, offset: &str, extra: &str) -> Result<Uri> {
        path_uri(&format!("{stream_path}?offset={offset}{extra}"))
    }

    pub fn describe(&self) -> String {
        match self.layout {
            Layout::Native => format!("{} (native, bucket {})", self.base, self.bucket),
            Layout::Compat => format!("{} (compat /v1/stream)", self.base),
        }
    }
}

pub fn path_uri(path_and_query: &str) -> Result<Uri> {
    path_and_query
        .parse()
        .with_context(|| format!("invalid request path {path_and_query:?}"))
}

/// Offsets come back in headers; only pass on ones safe to put in a query.
pub fn valid_offset(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(base: &str, layout: Layout) -> Target {
        match Target::parse(base, layout, "bench") {
            Ok(t) => t,
            Err(e) => panic!("{base}: {e:#}"),
        }
    }

    #[test]
    fn native_layout() {
        let x = t("http://127.0.0.1:4437", Layout::Native);
        assert_eq!(x.host, "127.0.0.1");
        assert_eq!(x.port, 4437);
        assert_eq!(x.host_header, "127.0.0.1:4437");
        assert_eq!(x.stream_path("s1"), "/bench/s1");
        assert_eq!(
            x.stream_uri("s1").map(|u| u.to_string()).ok().as_deref(),
            Some("/bench/s1")
        );
    }

    #[test]
    fn compat_layout_and_prefix() {
        let x = t("http://localhost:8080/api/", Layout::Compat);
        assert_eq!(x.host, "localhost");
        assert_eq!(x.prefix, "/api");
        assert_eq!(x.stream_path("s"), "/api/v1/stream/s");
        let x = t("http://127.0.0.1:9/", Layout::Compat);
        assert_eq!(x.stream_path("s"), "/v1/stream/s");
    }

    #[test]
    fn default_port_and_ipv6() {
        assert_eq!(t("http://example.test", Layout::Native).port, 80);
        let x = t("http://[::1]:5000", Layout::Native);
        assert_eq!(x.host, "::1");
        assert_eq!(x.host_header, "[::1]:5000");
    }

    #[test]
    fn rejects_bad_bases_and_names() {
        assert!(Target::parse("https://127.0.0.1:1", Layout::Native, "b").is_err());
        assert!(Target::parse("127.0.0.1:1", Layout::Native, "b").is_err());
        assert!(Target::parse("/just/a/path", Layout::Native, "b").is_err());
        assert!(Target::parse("http://127.0.0.1:1/?x=1", Layout::Native, "b").is_err());
        assert!(Target::parse("http://127.0.0.1:1", Layout::Native, "a/b").is_err());
        assert!(Target::parse("http://127.0.0.1:1", Layout::Native, "").is_err());
        // the bucket is irrelevant in compat layout
        assert!(Target::parse("http://127.0.0.1:1", Layout::Compat, "").is_ok());
        let x = t("http://127.0.0.1:1", Layout::Native);
        assert!(x.stream_uri("has space").is_err());
        assert!(x.stream_uri("ok-name_1.2").is_ok());
    }

    #[test]
    fn read_uri_and_offsets() {
        let x = t("http://127.0.0.1:1", Layout::Native);
        let p = x.stream_path("s");
        let u = x.read_uri(&p, "-1", "&live=long-poll&timeout_ms=100");
        assert_eq!(
            u.map(|u| u.to_string()).ok().as_deref(),
            Some("/bench/s?offset=-1&live=long-poll&timeout_ms=100")
        );
        assert!(valid_offset("00000000000000000042"));
        assert!(valid_offset("0000000000000000_0000000000000042"));
        assert!(valid_offset("-1"));
        assert!(!valid_offset(""));
        assert!(!valid_offset("1&x=2"));
        assert!(!valid_offset("a b"));
    }
}
