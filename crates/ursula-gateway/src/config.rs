//! The gateway's flags (cluster.md §12.1).

use std::net::SocketAddr;
use std::time::Duration;

/// `ursulagw` / `ursula gateway`.
#[derive(clap::Args, Debug, Clone)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, env = "URSULAGW_LISTEN", default_value = "0.0.0.0:4437")]
    pub listen: SocketAddr,
    /// A second address that serves only `GET /__ursula/gateway/metrics`, for the operators'
    /// network. With access control on, the public listener conceals `/__ursula/*` like any
    /// refused path (cluster.md §9), so this is where the metrics are read. Not in the spec's
    /// flag table.
    #[arg(long, env = "URSULAGW_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// The TCP congestion control of client connections, or "" for the system's. CUBIC by
    /// default: BBR paces each connection by a timer of its own where the device has no `fq`
    /// queueing discipline (see `ursula_http::congestion`). Not in the spec's flag table.
    #[arg(long, env = "URSULAGW_TCP_CONGESTION", default_value = ursula_http::congestion::DEFAULT, value_parser = parse_congestion)]
    pub tcp_congestion: String,
    /// A node's client-plane URL, `http://host:port`; repeat for every node (or give them
    /// comma-separated).
    #[arg(long = "upstream", env = "URSULAGW_UPSTREAMS", value_delimiter = ',', required = true, value_parser = parse_upstream)]
    pub upstreams: Vec<String>,
    /// Seconds to wait for an upstream's response headers (bodies such as SSE are not
    /// covered); a long-poll gets at least its `timeout_ms` plus 2 s.
    #[arg(long, default_value_t = 30)]
    pub response_header_timeout: u64,
    /// The cluster's group count: the leader cache then keeps one leader per Raft group (every
    /// stream of a group shares it) instead of one per stream.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub raft_group_count: Option<u32>,
    /// Seconds a client has to send a request's head, and then its body; slower: the
    /// connection is closed (head) or `408 REQUEST_TIMEOUT` (body). Not in the spec's flag
    /// table: a public front door must not let a slow client hold its connections.
    #[arg(long, default_value_t = 30)]
    pub client_timeout: u64,
    /// Seconds per TCP connect to an upstream.
    #[arg(long, default_value_t = 5)]
    pub connect_timeout: u64,
    /// Largest request body (bodies are buffered to replay them after a redirect); larger:
    /// 413. Every route but single-request snapshot publishes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_request_body_bytes: u64,
    /// Largest body of a single-request snapshot publish; larger: 413.
    #[arg(long, default_value_t = 128 << 20)]
    pub max_snapshot_request_body_bytes: u64,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, default_value_t = 3600)]
    pub graceful_shutdown_timeout: u64,
    /// An origin browsers may call from (repeatable), or `*`. Unset: no CORS headers at all.
    #[arg(long = "cors-allowed-origin")]
    pub cors_allowed_origins: Vec<String>,
    /// Turns access control on: the issuer of the access tokens accepted (`iss`, exact).
    /// Requires `--auth-audience` and `--auth-policy`.
    #[arg(long, env = "URSULAGW_AUTH_ISSUER", requires_all = ["auth_audience", "auth_policy"])]
    pub auth_issuer: Option<String>,
    /// The audience (`aud`) access tokens must name.
    #[arg(long, env = "URSULAGW_AUTH_AUDIENCE", requires = "auth_issuer")]
    pub auth_audience: Option<String>,
    /// The issuer's JWKS URL [default: RFC 8414 discovery from the issuer].
    #[arg(long, env = "URSULAGW_AUTH_JWKS_URL", requires = "auth_issuer")]
    pub auth_jwks_url: Option<String>,
    /// The bucket policy (TOML: `[[bucket]] id, public_read, owners = [{issuer, subject}]`).
    #[arg(long, env = "URSULAGW_AUTH_POLICY", requires = "auth_issuer")]
    pub auth_policy: Option<std::path::PathBuf>,
    /// Per-tenant admission limits (TOML: `[default]` and `[[bucket]] id`, each with
    /// `requests_per_sec`, `max_concurrent_live_reads`, `max_request_body_bytes`). Needs
    /// access control.
    #[arg(long, env = "URSULAGW_QUOTA_POLICY", requires = "auth_issuer")]
    pub quota_policy: Option<std::path::PathBuf>,
    /// Append usage batches (JSON lines) to this file. Needs access control.
    #[arg(long, env = "URSULAGW_USAGE_LOG", requires = "auth_issuer")]
    pub usage_log: Option<std::path::PathBuf>,
    /// Seconds between usage batches.
    #[arg(long, default_value_t = 30)]
    pub usage_flush_secs: u64,
    /// Write-unit size of the `chunks` counter of the append class [default: not counted].
    #[arg(long)]
    pub usage_chunk_bytes: Option<u64>,
}

fn parse_congestion(name: &str) -> Result<String, String> {
    ursula_http::congestion::check_name(name).map(|()| name.to_owned())
}

impl GatewayArgs {
    pub fn response_header_timeout(&self) -> Duration {
        Duration::from_secs(self.response_header_timeout.max(1))
    }
}

/// `http://host:port` (a trailing `/` is dropped); anything else is refused at start-up.
fn parse_upstream(s: &str) -> Result<String, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    let ok = uri.scheme_str() == Some("http")
        && uri.authority().is_some()
        && uri
            .path_and_query()
            .is_none_or(|p| p.as_str() == "/" || p.as_str().is_empty());
    if !ok {
        return Err(format!("{s:?}: an upstream is http://host:port"));
    }
    Ok(s.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_are_plain_http_origins() {
        assert_eq!(
            parse_upstream("http://127.0.0.1:4437/").as_deref(),
            Ok("http://127.0.0.1:4437")
        );
        for bad in ["127.0.0.1:4437", "https://a:1", "http://a:1/x", "ftp://a"] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_congestion_control_is_cubic_unless_told_and_checked() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            gw: GatewayArgs,
        }
        let up = ["gw", "--upstream", "http://127.0.0.1:1"];
        let parsed = Cli::try_parse_from(up).expect("parse");
        assert_eq!(parsed.gw.tcp_congestion, "cubic");
        let system = Cli::try_parse_from([&up[..], &["--tcp-congestion", ""]].concat());
        assert_eq!(system.expect("parse").gw.tcp_congestion, "");
        let bad = Cli::try_parse_from([&up[..], &["--tcp-congestion", "a b"]].concat());
        assert!(bad.is_err());
    }
}
