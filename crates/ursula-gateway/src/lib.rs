//! `ursulagw`: a stateless HTTP/SSE reverse proxy in front of an Ursula cluster (cluster.md
//! §12). Clients talk to it as to one node: it sends each request to the leader of the
//! stream's group (learned from the nodes' `307`s and cached), so node addresses never reach
//! clients, and it owns CORS. With `--auth-issuer` it admits requests by access token and
//! bucket policy; without, it is a trusted pass-through.
//!
//! - `config`: flags.
//! - `serve`: the listener and graceful shutdown.
//! - `proxy`: one request: buffer the body, pick the upstream, follow leader redirects,
//!   rewrite the answer.
//! - `leaders`: the leader cache.
//! - `cors`: the gateway's CORS policy.
//! - `auth`, `policy`, `classify`: access tokens, the bucket policy, and what a request does.
//! - `expiry`: an SSE answer that ends when its credential expires.
//! - `quota`: per-tenant request rate, concurrent live reads and body size.
//! - `usage`: usage metering into a JSON-lines file.
//! - `answer`: the JSON error answers the gateway makes itself.
//! - `metrics`: `GET /__ursula/gateway/metrics` (on `--metrics-listen` too; with access control
//!   only there).

mod answer;
mod auth;
mod classify;
pub mod config;
mod cors;
mod expiry;
mod headers;
mod leaders;
mod metrics;
mod policy;
mod proxy;
mod quota;
mod serve;
mod usage;

pub use config::GatewayArgs;
pub use serve::{Gateway, run, run_with_metrics};

/// Logs to standard error, filtered by `URSULA_LOG`, else `RUST_LOG`, else `info`.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("URSULA_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Binds `args.listen`, logs the address, and serves until SIGTERM or Ctrl-C.
pub async fn main(args: GatewayArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    ursula_http::congestion::set(&listener, &args.tcp_congestion);
    let addr = listener.local_addr()?;
    tracing::info!(%addr, upstreams = ?args.upstreams, "ursulagw listening");
    let metrics = match args.metrics_listen {
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {at}: {e}"))?;
            tracing::info!(addr = %l.local_addr()?, "ursulagw metrics listening");
            Some(l)
        }
        None => None,
    };
    let gw = Gateway::new(args).map_err(|e| anyhow::anyhow!(e))?;
    run_with_metrics(gw, listener, metrics, stop_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
