//! Start-up of the cold store (`[storage.cold]`): built before the node opens, so a bad
//! combination fails start-up with a clear error, then probed in the background.

use crate::config::Config;
use std::sync::Arc;
use std::time::Duration;
use ursula_storage::cold::{ColdConfig, ColdStore};

/// Probe interval of a running node.
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Builds the configured store; `None` for `none`. A failed first probe is logged, not fatal:
/// a store that is down at boot must not keep the node (and its hot tier) down.
pub async fn open(cfg: &Config) -> anyhow::Result<Option<Arc<dyn ColdStore>>> {
    let cold = &cfg.storage.cold;
    let backend = cold.backend(cfg.has_peers())?;
    let store = cold
        .open(&cfg.data_dir, false)
        .map_err(|e| anyhow::anyhow!("cannot set up the cold store: {e}"))?;
    let Some(store) = store else {
        tracing::info!(backend = backend.name(), "no cold store");
        return Ok(None);
    };
    let location = match backend {
        ursula_storage::cold::Backend::Local => {
            cold.local_path(&cfg.data_dir).display().to_string()
        }
        ursula_storage::cold::Backend::S3 => format!(
            "{}/{}",
            cold.s3.endpoint.as_deref().unwrap_or("aws"),
            cold.s3.bucket.as_deref().unwrap_or_default()
        ),
        _ => "process memory".to_owned(),
    };
    match probe(store.as_ref(), cold).await {
        Ok(()) => tracing::info!(backend = backend.name(), %location, "cold store ready"),
        Err(e) => tracing::warn!(
            backend = backend.name(),
            %location,
            error = %e,
            "cold store unreachable at start-up; serving from the hot tier"
        ),
    }
    Ok(Some(store))
}

/// The `cold_store` object of `/__ursula/metrics` (cluster.md §9.1): the backend and where it
/// keeps its objects; `null` for what the backend does not have.
pub fn describe(cfg: &Config) -> serde_json::Value {
    let cold = &cfg.storage.cold;
    let backend = cold
        .backend(cfg.has_peers())
        .unwrap_or(ursula_storage::cold::Backend::None);
    let s3 = (backend == ursula_storage::cold::Backend::S3).then_some(&cold.s3);
    let path = (backend == ursula_storage::cold::Backend::Local)
        .then(|| cold.local_path(&cfg.data_dir).display().to_string());
    serde_json::json!({
        "backend": backend.name(),
        "root": cold.root,
        "path": path,
        "bucket": s3.and_then(|s| s.bucket.clone()),
        "region": s3.map(|s| s.effective_region()),
        "endpoint": s3.and_then(|s| s.endpoint.clone()),
        "encryption": s3.map(|s| s.server_side_encryption.name()),
    })
}

async fn probe(store: &dyn ColdStore, cfg: &ColdConfig) -> Result<(), String> {
    match tokio::time::timeout(cfg.s3.probe_timeout, store.probe()).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {:?}", cfg.s3.probe_timeout)),
    }
}

/// Probes the store every [`PROBE_INTERVAL`], logs when its health changes and reports every
/// outcome to `report` (`Some(reason)` while it fails). The task ends when the returned guard
/// is dropped.
pub fn spawn_probe(
    store: Arc<dyn ColdStore>,
    cfg: &ColdConfig,
    report: impl Fn(Option<String>) + Send + 'static,
) -> ProbeGuard {
    let cfg = cfg.clone();
    let task = tokio::spawn(async move {
        let mut healthy = true;
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            let outcome = probe(store.as_ref(), &cfg).await;
            report(outcome.as_ref().err().cloned());
            match (outcome, healthy) {
                (Err(e), true) => {
                    healthy = false;
                    tracing::warn!(error = %e, "cold store became unreachable");
                }
                (Ok(()), false) => {
                    healthy = true;
                    tracing::info!("cold store reachable again");
                }
                _ => {}
            }
        }
    });
    ProbeGuard(task)
}

/// Stops the probe task when dropped.
pub struct ProbeGuard(tokio::task::JoinHandle<()>);

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
