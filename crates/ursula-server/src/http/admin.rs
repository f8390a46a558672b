//! The admin plane (a separate listener, off by default): mutating operator endpoints.
//!
//! `DELETE /__ursula/purge/{bucket}` erases a tenant and fences its ID (cluster.md §9.5);
//! metrics and health are served here too.

use super::error::{self, ApiError};
use super::{ApiResult, Resp, common_headers, leadership, not_found, ops};
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Method, Request, Response};
use std::sync::Arc;
use ursula_core::ErrorCode;
use ursula_core::command::{Op, Reply};
use ursula_core::ids::{self, RESERVED_BUCKET};

pub async fn handle(app: Arc<App>, req: Request<Body>) -> Resp {
    let origin = req.headers().get(http::header::ORIGIN).cloned();
    let (parts, _body) = req.into_parts();
    let mut resp = match dispatch(&app, &parts.method, parts.uri.path()).await {
        Ok(r) => r,
        Err(e) => error::render(e),
    };
    common_headers(&app, &mut resp, origin.as_ref());
    resp
}

async fn dispatch(app: &Arc<App>, method: &Method, path: &str) -> ApiResult {
    let Some(rest) = path.strip_prefix("/__ursula/") else {
        return Err(not_found());
    };
    let segs: Vec<String> = rest.split('/').map(str::to_owned).collect();
    match (method, segs.as_slice()) {
        (&Method::DELETE, [purge, bucket]) if purge == "purge" => purge_bucket(app, bucket).await,
        (m, [shed, maint]) if shed == "leadership-shed" && maint == "maintenance" => match *m {
            Method::POST => leadership::maintenance(app, true),
            Method::DELETE => leadership::maintenance(app, false),
            _ => Err(not_found()),
        },
        (&Method::POST, [raft, group, leader, transfer, node])
            if raft == "raft" && leader == "leader" && transfer == "transfer" =>
        {
            leadership::transfer(app, group, node).await
        }
        (&Method::POST, s) if super::admin_raft::handles(s) => {
            super::admin_raft::handle(app, s).await
        }
        (m, _) if m == Method::GET || m == Method::HEAD => ops::handle(app, m, &segs).await,
        _ => Err(not_found()),
    }
}

async fn purge_bucket(app: &Arc<App>, raw: &str) -> ApiResult {
    let bucket = super::path::pct_decode(raw).ok_or_else(|| {
        ApiError::new(ErrorCode::INVALID_BUCKET_ID, "bucket id is not valid UTF-8")
    })?;
    if bucket == RESERVED_BUCKET {
        return Err(ApiError::new(
            ErrorCode::INVALID_BUCKET_ID,
            "__ursula is reserved",
        ));
    }
    ids::validate_bucket(&bucket)
        .map_err(|e| ApiError::new(ErrorCode::INVALID_BUCKET_ID, e.to_string()))?;
    let mut removed = 0u64;
    let mut groups_with_streams = Vec::new();
    for g in 0..app.node.group_count() {
        if let Reply::Purged { removed: n } = app
            .propose(
                g,
                Op::PurgeBucket {
                    bucket: bucket.clone(),
                },
            )
            .await?
        {
            removed += n;
            if n > 0 {
                groups_with_streams.push(g);
            }
        }
    }
    tracing::info!(%bucket, removed, "bucket purged");
    let body = serde_json::json!({
        "bucket": bucket,
        "removed_streams": removed,
        "groups_with_streams": groups_with_streams,
        "cold_gc_entries_reclaimed": 0,
    });
    let mut r = Response::new(Body::from(body.to_string()));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    Ok(r)
}
