//! Bucket routes (extensions.md §2): buckets are replicated to every group.

use super::error::ApiError;
use super::{ApiResult, render};
use crate::app::App;
use axum::body::Body;
use http::{HeaderValue, Response, StatusCode};
use std::sync::Arc;
use ursula_core::command::{Op, Reply};
use ursula_core::ids::{self, COMPAT_BUCKET};
use ursula_core::{ErrorCode, offset};

fn bucket_not_found() -> ApiError {
    ApiError::new(ErrorCode::BUCKET_NOT_FOUND, "bucket not found")
}

fn json_response(v: serde_json::Value) -> super::Resp {
    let mut r = Response::new(Body::from(v.to_string()));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

/// A bucket exists when it was acknowledged or holds a stream, and is not fenced.
fn exists(app: &App, bucket: &str) -> bool {
    let mut found = bucket == COMPAT_BUCKET;
    let mut fenced = false;
    for g in 0..app.node.group_count() {
        let (known, fence) = app.with_group(g, |gs| gs.bucket_facts(bucket));
        found |= known;
        fenced |= fence;
    }
    found && !fenced
}

pub async fn create(app: &Arc<App>, bucket: &str) -> ApiResult {
    for g in 0..app.node.group_count() {
        let r = app
            .propose(
                g,
                Op::CreateBucket {
                    bucket: bucket.to_owned(),
                },
            )
            .await;
        if let Err(e) = r {
            if e.code() == ErrorCode::BUCKET_NOT_FOUND {
                return Err(bucket_not_found());
            }
            return Err(e);
        }
    }
    Ok(render::empty(StatusCode::CREATED))
}

pub fn info(app: &Arc<App>, bucket: &str) -> ApiResult {
    if !exists(app, bucket) {
        return Err(bucket_not_found());
    }
    let now = app.now_ms();
    let count: usize = (0..app.node.group_count())
        .map(|g| app.with_group(g, |gs| gs.bucket_stream_count(bucket, now)))
        .sum();
    Ok(json_response(
        serde_json::json!({ "bucket_id": bucket, "streams": count }),
    ))
}

pub async fn delete(app: &Arc<App>, bucket: &str) -> ApiResult {
    if !exists(app, bucket) {
        return Err(bucket_not_found());
    }
    let has_streams = (0..app.node.group_count())
        .any(|g| app.with_group(g, |gs| gs.streams.keys().any(|k| k.bucket() == bucket)));
    if has_streams {
        return Err(ApiError::new(
            ErrorCode::BUCKET_NOT_EMPTY,
            "bucket still has streams",
        ));
    }
    for g in 0..app.node.group_count() {
        match app
            .propose(
                g,
                Op::DeleteBucket {
                    bucket: bucket.to_owned(),
                },
            )
            .await?
        {
            Reply::Done => {}
            _ => return Err(ApiError::new(ErrorCode::INTERNAL_ERROR, "unexpected reply")),
        }
    }
    Ok(render::empty(StatusCode::NO_CONTENT))
}

pub fn list(app: &Arc<App>, bucket: &str, query: Option<&str>) -> ApiResult {
    let bad = |m: &str| ApiError::new(ErrorCode::INVALID_QUERY, m.to_owned());
    let (mut prefix, mut after, mut limit) = (None::<String>, None::<String>, 1000u64);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = super::path::pct_decode(v).ok_or_else(|| bad("query is not valid UTF-8"))?;
        match k {
            "prefix" => prefix = Some(v),
            "after" => after = Some(v),
            "limit" => {
                limit = offset::parse_digits(&v)
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| bad("limit must be 1..1000"))?
            }
            _ => {}
        }
    }
    if !exists(app, bucket) {
        return Err(bucket_not_found());
    }
    let now = app.now_ms();
    let mut rows: Vec<(String, serde_json::Value)> = Vec::new();
    for g in 0..app.node.group_count() {
        app.with_group(g, |gs| {
            for (k, s) in &gs.streams {
                let id = k.stream();
                if k.bucket() != bucket || !s.visible(now) {
                    continue;
                }
                if prefix.as_deref().is_some_and(|p| !id.starts_with(p))
                    || after
                        .as_deref()
                        .is_some_and(|a| id.as_bytes() <= a.as_bytes())
                {
                    continue;
                }
                let mut row = serde_json::json!({
                    "stream_id": id,
                    "status": if s.closed { "Closed" } else { "Open" },
                    "content_type": s.content_type,
                    "tail_offset": s.tail,
                    "created_at_ms": s.created_at_ms,
                    "last_write_at_ms": s.last_write_ms,
                });
                if bucket == COMPAT_BUCKET {
                    row["compat_path"] = ids::unescape_compat_id(id).into();
                }
                rows.push((id.to_owned(), row));
            }
        });
    }
    rows.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let has_more = rows.len() as u64 > limit;
    rows.truncate(limit as usize);
    let next = if has_more {
        rows.last().map(|r| r.0.clone())
    } else {
        None
    };
    Ok(json_response(serde_json::json!({
        "bucket_id": bucket,
        "prefix": prefix,
        "stream_count": rows.len(),
        "streams": rows.into_iter().map(|r| r.1).collect::<Vec<_>>(),
        "next_cursor": next,
        "has_more": has_more,
    })))
}
