//! Cluster-plane egress probes (cluster.md §5.4, §9.6): every `interval` a clustered node
//! POSTs `probe_size` bytes to `/__ursula/cluster-probe` on each peer. When the probes to a
//! majority of its peers fail for `unhealthy_ticks` ticks in a row, the node's egress is
//! unhealthy: it sets the `EGRESS` shed bit (it stops campaigning, refuses transfers and
//! hands its leaderships away) and reports not ready, until `heal_ticks` healthy ticks in a
//! row clear it.
//!
//! The probe's body is as large as a typical append batch on purpose: a path that passes
//! small heartbeats but stalls large frames is what hurts replication most.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use ursula_core::ErrorCode;
use ursula_raft::shed;

use crate::app::App;
use crate::http::error::{ApiError, render};

/// The probe route on the cluster plane.
pub const PATH: &str = "/__ursula/cluster-probe";
/// The largest probe body the route accepts.
const MAX_PROBE_BYTES: usize = 1 << 20;

/// `[governance.cluster_probe]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterProbeConfig {
    /// How often a node probes every peer. Default: 500 ms. `"0s"` turns probing off.
    #[serde(deserialize_with = "crate::governance::duration")]
    pub interval: Duration,
    /// Bytes per probe. Default: 64 KiB (at most 1 MiB).
    #[serde(deserialize_with = "size")]
    pub probe_size: u64,
    /// A probe not answered within this counts as failed. Default: 200 ms.
    #[serde(deserialize_with = "crate::governance::duration")]
    pub timeout: Duration,
    /// Consecutive bad ticks (a majority of peers failing) that make egress unhealthy.
    pub unhealthy_ticks: u32,
    /// Consecutive good ticks that make it healthy again.
    pub heal_ticks: u32,
}

impl Default for ClusterProbeConfig {
    fn default() -> Self {
        ClusterProbeConfig {
            interval: Duration::from_millis(500),
            probe_size: 64 << 10,
            timeout: Duration::from_millis(200),
            unhealthy_ticks: 2,
            heal_ticks: 6,
        }
    }
}

fn size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    let n = ursula_storage::cold::config::parse_size(&s).map_err(serde::de::Error::custom)?;
    if n == 0 || n > MAX_PROBE_BYTES as u64 {
        return Err(serde::de::Error::custom(format!(
            "probe_size must be between 1 B and 1 MiB, not {s}"
        )));
    }
    Ok(n)
}

/// One tick is bad when the probes to a majority of the peers failed (a node without peers
/// never has a bad tick).
pub fn tick_is_bad(failed: usize, peers: usize) -> bool {
    peers > 0 && failed * 2 > peers
}

/// Egress health with hysteresis: `unhealthy_ticks` bad ticks in a row trip it, `heal_ticks`
/// good ticks in a row clear it; a tick of the other kind restarts the count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hysteresis {
    pub unhealthy: bool,
    run: u32,
}

impl Hysteresis {
    /// Takes one tick; returns whether the health flipped.
    pub fn step(&mut self, bad: bool, unhealthy_ticks: u32, heal_ticks: u32) -> bool {
        if bad != self.unhealthy {
            self.run += 1;
            let need = if bad { unhealthy_ticks } else { heal_ticks };
            if self.run >= need.max(1) {
                self.unhealthy = bad;
                self.run = 0;
                return true;
            }
        } else {
            self.run = 0;
        }
        false
    }
}

/// What the probes to one peer measured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerProbe {
    pub probes_total: u64,
    pub failures_total: u64,
    pub consecutive_failures: u64,
    /// Round trip of the last successful probe.
    pub last_rtt_us: Option<u64>,
    pub last_error: Option<String>,
}

/// The prober's state, read by metrics and readiness.
#[derive(Debug, Default)]
pub struct ProbeState {
    peers: Mutex<BTreeMap<u64, PeerProbe>>,
    egress: Mutex<Hysteresis>,
}

impl ProbeState {
    fn lock_peers(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, PeerProbe>> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether egress is unhealthy now.
    pub fn unhealthy(&self) -> bool {
        self.egress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unhealthy
    }

    /// Peers whose last probe failed.
    pub fn failing_peers(&self) -> Vec<u64> {
        self.lock_peers()
            .iter()
            .filter(|(_, p)| p.consecutive_failures > 0)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The readiness reason, if egress is unhealthy.
    pub fn reason(&self) -> Option<String> {
        if !self.unhealthy() {
            return None;
        }
        let peers = self.lock_peers().len();
        Some(format!(
            "cluster-plane egress unhealthy: probes to {} of {peers} peers failing",
            self.failing_peers().len()
        ))
    }

    /// `cluster_probe` in the JSON metrics.
    pub fn json(&self) -> serde_json::Value {
        let peers: Vec<serde_json::Value> = self
            .lock_peers()
            .iter()
            .map(|(id, p)| {
                serde_json::json!({
                    "peer": id,
                    "probes_total": p.probes_total,
                    "failures_total": p.failures_total,
                    "consecutive_failures": p.consecutive_failures,
                    "last_rtt_us": p.last_rtt_us,
                    "last_error": p.last_error,
                })
            })
            .collect();
        serde_json::json!({ "egress_unhealthy": self.unhealthy(), "peers": peers })
    }

    /// Per-peer Prometheus lines.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let peers = self.lock_peers();
        let mut family = |name: &str, kind: &str, value: &dyn Fn(&PeerProbe) -> Option<u64>| {
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            for (id, p) in peers.iter() {
                if let Some(v) = value(p) {
                    out.push_str(&format!("{name}{{peer=\"{id}\"}} {v}\n"));
                }
            }
        };
        family("ursula_cluster_probes_total", "counter", &|p| {
            Some(p.probes_total)
        });
        family("ursula_cluster_probe_failures_total", "counter", &|p| {
            Some(p.failures_total)
        });
        family("ursula_cluster_probe_last_rtt_us", "gauge", &|p| {
            p.last_rtt_us
        });
        out
    }

    fn record(&self, peer: u64, outcome: Result<Duration, String>) {
        let mut peers = self.lock_peers();
        let p = peers.entry(peer).or_default();
        p.probes_total += 1;
        match outcome {
            Ok(rtt) => {
                p.consecutive_failures = 0;
                p.last_rtt_us = Some(rtt.as_micros() as u64);
                p.last_error = None;
            }
            Err(e) => {
                p.failures_total += 1;
                p.consecutive_failures += 1;
                p.last_error = Some(e);
            }
        }
    }
}

/// `POST /__ursula/cluster-probe`: drains the body and answers `200 {"received": N}`.
pub async fn serve(req: Request<Body>) -> Response<Body> {
    if req.method() != Method::POST {
        return render(crate::http::method_not_allowed("POST"));
    }
    let body = Limited::new(req.into_body(), MAX_PROBE_BYTES);
    let n = match body.collect().await {
        Ok(b) => b.to_bytes().len(),
        Err(e) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            let (code, msg) = if too_large {
                (
                    ErrorCode::PAYLOAD_TOO_LARGE,
                    format!("a probe carries at most {MAX_PROBE_BYTES} bytes"),
                )
            } else {
                (
                    ErrorCode::MALFORMED_REQUEST,
                    format!("reading the probe: {e}"),
                )
            };
            return render(ApiError::new(code, msg));
        }
    };
    let mut r = Response::new(Body::from(format!(r#"{{"received":{n}}}"#)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    *r.status_mut() = StatusCode::OK;
    r
}

type ProbeClient = Client<HttpConnector, Full<Bytes>>;

async fn probe_once(
    client: &ProbeClient,
    uri: &Uri,
    body: Bytes,
    timeout: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let req = Request::post(uri.clone())
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let call = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let _ = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("answered {status}"));
        }
        Ok(started.elapsed())
    };
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
}

/// Starts probing every peer (a node with peers and a non-zero interval only).
pub fn spawn(app: &Arc<App>, cfg: &ClusterProbeConfig) -> anyhow::Result<()> {
    let node = Arc::clone(&app.node);
    if !node.has_peers() || cfg.interval.is_zero() {
        return Ok(());
    }
    let mut targets = Vec::new();
    for (&id, url) in node.peers() {
        if id == node.node_id() {
            continue;
        }
        let uri: Uri = format!("{url}{PATH}")
            .parse()
            .map_err(|e| anyhow::anyhow!("raft.peers url of node {id} ({url}): {e}"))?;
        targets.push((id, uri));
    }
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(cfg.timeout));
    connector.set_nodelay(true);
    let client: ProbeClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector);
    let body = Bytes::from(vec![0x5a; cfg.probe_size as usize]);
    let cfg = cfg.clone();
    let targets = Arc::new(targets);
    app.spawn_every(cfg.interval, move |app| {
        let (client, body, targets, cfg) = (
            client.clone(),
            body.clone(),
            Arc::clone(&targets),
            cfg.clone(),
        );
        async move { tick(&app, &client, &targets, body, &cfg).await }
    });
    Ok(())
}

async fn tick(
    app: &Arc<App>,
    client: &ProbeClient,
    targets: &[(u64, Uri)],
    body: Bytes,
    cfg: &ClusterProbeConfig,
) {
    let probes = targets.iter().map(|(id, uri)| async {
        (
            *id,
            probe_once(client, uri, body.clone(), cfg.timeout).await,
        )
    });
    let results = futures::future::join_all(probes).await;
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    let state = &app.governance.probes;
    for (id, r) in results {
        state.record(id, r);
    }
    let bad = tick_is_bad(failed, targets.len());
    let (flipped, unhealthy) = {
        let mut h = state.egress.lock().unwrap_or_else(|e| e.into_inner());
        (
            h.step(bad, cfg.unhealthy_ticks, cfg.heal_ticks),
            h.unhealthy,
        )
    };
    if !flipped {
        return;
    }
    let st = app.node.set_shed(shed::EGRESS, unhealthy);
    if unhealthy {
        tracing::warn!(
            failing = ?state.failing_peers(),
            peers = targets.len(),
            state = st.state(),
            "cluster-plane egress unhealthy: shedding leaderships"
        );
        let node = Arc::clone(&app.node);
        tokio::spawn(async move {
            let left = node
                .shed_leaderships(crate::governance::SHUTDOWN_HANDOVER)
                .await;
            tracing::info!(still_led = left.len(), "egress shedding pass done");
        });
    } else {
        tracing::warn!(state = st.state(), "cluster-plane egress healthy again");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_of_peers() {
        assert!(!tick_is_bad(0, 0));
        assert!(!tick_is_bad(1, 2));
        assert!(tick_is_bad(2, 2));
        assert!(tick_is_bad(1, 1));
        assert!(!tick_is_bad(2, 4));
        assert!(tick_is_bad(3, 4));
    }

    #[test]
    fn trips_after_unhealthy_ticks_and_heals_after_heal_ticks() {
        let mut h = Hysteresis::default();
        assert!(!h.step(true, 2, 3));
        // A good tick restarts the count.
        assert!(!h.step(false, 2, 3));
        assert!(!h.step(true, 2, 3));
        assert!(h.step(true, 2, 3));
        assert!(h.unhealthy);
        assert!(!h.step(false, 2, 3));
        assert!(!h.step(false, 2, 3));
        assert!(!h.step(true, 2, 3));
        assert!(h.unhealthy);
        for _ in 0..2 {
            assert!(!h.step(false, 2, 3));
        }
        assert!(h.step(false, 2, 3));
        assert!(!h.unhealthy);
    }

    proptest::proptest! {
        /// The flag flips exactly when the last `unhealthy_ticks` (or `heal_ticks`) ticks since
        /// the previous flip all disagreed with it, and never otherwise.
        #[test]
        fn flips_only_after_a_full_run(
            ticks in proptest::collection::vec(proptest::bool::ANY, 0..200),
            up in 1u32..5,
            heal in 1u32..8,
        ) {
            let mut h = Hysteresis::default();
            let mut flag = false;
            let mut run = 0u32;
            for bad in ticks {
                let flipped = h.step(bad, up, heal);
                // A model: count ticks that disagree with the flag, reset on agreement.
                if bad != flag { run += 1 } else { run = 0 }
                let need = if flag { heal } else { up };
                let want_flip = run >= need;
                if want_flip { flag = !flag; run = 0; }
                proptest::prop_assert_eq!(flipped, want_flip);
                proptest::prop_assert_eq!(h.unhealthy, flag);
            }
        }
    }
}
