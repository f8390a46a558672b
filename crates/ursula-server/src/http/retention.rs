//! Retention routes (extensions.md §7): `PUT .../retention/{offset}` and
//! `PUT .../retention?record=n`. Every rule runs in the state machine; this layer checks
//! syntax and renders the answer.

use super::error::ApiError;
use super::snapshot::{path_offset, put_records, record_query};
use super::{ApiResult, headers as h, method_not_allowed, not_found, render};
use crate::app::App;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use std::sync::Arc;
use ursula_core::ErrorCode;
use ursula_core::command::{At, Op, Reply};
use ursula_core::offset::Off;

pub async fn handle(
    app: &Arc<App>,
    target: &super::path::Target,
    rest: &[String],
    req: Request<Body>,
) -> ApiResult {
    if rest.len() > 1 {
        return Err(not_found());
    }
    if req.method() != Method::PUT {
        return Err(method_not_allowed("PUT, OPTIONS"));
    }
    let at = match rest.first() {
        Some(o) => At::Offset(path_offset(o)?),
        None => At::Record(record_query(req.uri().query())?),
    };
    let incarnation = h::incarnation(req.headers())?;
    let op = Op::Retain {
        key: target.key.clone(),
        at,
        incarnation,
    };
    let Reply::Retained(r) = app.propose(app.group_of(&target.key), op).await? else {
        return Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "unexpected reply to a retention request",
        ));
    };
    let mut resp = render::empty(StatusCode::NO_CONTENT);
    let hm = resp.headers_mut();
    h::put(hm, h::STREAM_RETAINED_OFFSET, &Off(r.retained).to_string());
    h::put(hm, h::STREAM_INCARNATION, &r.incarnation.to_string());
    put_records(hm, r.json, r.record_first, r.record_next);
    Ok(resp)
}
