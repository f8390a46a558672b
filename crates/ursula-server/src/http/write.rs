//! Create (`PUT`), append and close (`POST`), delete (`DELETE`) of a stream.

use super::error::ApiError;
use super::path::{self, Target};
use super::{ApiResult, body, headers as h, render};
use crate::app::App;
use crate::metrics::inc;
use crate::tiering::HotReservation;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use std::sync::Arc;
use ursula_core::command::{AppendReq, CreateReq, ForkCreate, Op, PinReq, Reply};
use ursula_core::{ErrorCode, content_type, json, offset};

/// How long a fork source keeps an unconfirmed pin (forks.md §10.1).
const PIN_CONFIRM_MS: u64 = 60_000;

/// Normalizes a JSON body into canonical NDJSON; other bodies pass through.
fn canonical(body: Bytes, is_json: bool) -> Result<(Bytes, u64), ApiError> {
    if !is_json || body.is_empty() {
        return Ok((body, 0));
    }
    let n = json::normalize(&body).map_err(|e| ApiError::new(ErrorCode::INVALID_JSON, e.0))?;
    Ok((Bytes::from(n.bytes), n.messages as u64))
}

/// The created stream's URL: the base URL and the path the client used.
fn location(app: &App, uri: &http::Uri, headers: &HeaderMap) -> String {
    format!("{}{}", super::host::base_url(app, uri, headers), uri.path())
}

struct ForkHeaders {
    source: ursula_core::StreamKey,
    anchor: Option<u64>,
    sub: u64,
}

fn fork_headers(hm: &HeaderMap, target: &Target) -> Result<Option<ForkHeaders>, ApiError> {
    let from = h::text(hm, &h::STREAM_FORKED_FROM, ErrorCode::INVALID_FORK_SOURCE)?;
    let off = h::text(hm, &h::STREAM_FORK_OFFSET, ErrorCode::INVALID_FORK_OFFSET)?;
    let sub = h::text(
        hm,
        &h::STREAM_FORK_SUB_OFFSET,
        ErrorCode::INVALID_FORK_SUB_OFFSET,
    )?;
    let Some(from) = from else {
        if off.is_some() || sub.is_some() {
            return Err(ApiError::new(
                ErrorCode::INVALID_HEADER,
                "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
            ));
        }
        return Ok(None);
    };
    let source = path::fork_source(from.trim())?;
    if source.bucket() != target.key.bucket() || source == target.key {
        return Err(ApiError::new(
            ErrorCode::INVALID_FORK_SOURCE,
            "a fork source must be another stream of the same bucket",
        ));
    }
    let anchor = match off {
        None => None,
        Some(v) => Some(offset::parse_fork_offset(v.trim()).ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_FORK_OFFSET,
                format!("invalid Stream-Fork-Offset {:?}", h::shorten(v, 64)),
            )
        })?),
    };
    let sub = match sub {
        None => 0,
        Some(v) => offset::parse_canonical_uint(v.trim()).ok_or_else(|| {
            ApiError::new(
                ErrorCode::INVALID_FORK_SUB_OFFSET,
                format!("invalid Stream-Fork-Sub-Offset {:?}", h::shorten(v, 64)),
            )
        })?,
    };
    Ok(Some(ForkHeaders {
        source,
        anchor,
        sub,
    }))
}

pub async fn create(app: &Arc<App>, target: &Target, req: Request<Body>) -> ApiResult {
    let (parts, body) = req.into_parts();
    let hm = &parts.headers;
    let now = app.now_ms();
    let lifetime = h::lifetime(hm, now)?;
    let producer = h::producer(hm)?;
    let incarnation = h::incarnation(hm)?;
    let fork = fork_headers(hm, target)?;
    let ct = h::content_type(hm)?;
    let (body, _charge) = body::read(app, hm, body, app.cfg.max_request_bytes).await?;
    // The stream's content type is known now unless a fork inherits it.
    let request_json = ct.as_deref().is_some_and(content_type::is_json);
    let (payload, messages) = if fork.is_none() || ct.is_some() {
        canonical(body.clone(), request_json)?
    } else {
        (body.clone(), 0)
    };
    let mut cr = CreateReq {
        key: target.key.clone(),
        content_type: ct.clone(),
        closed: h::closed(hm),
        lifetime,
        stream_seq: h::stream_seq(hm)?,
        producer,
        incarnation,
        payload,
        messages,
        fork: None,
    };
    let group = app.group_of(&target.key);
    let hot = if fork.is_some() || !crate::external::wanted(app, cr.payload.len()) {
        app.admit_hot(&target.key, cr.producer.as_ref(), cr.payload.len() as u64)?
    } else {
        HotReservation::none()
    };
    let loc = location(app, &parts.uri, hm);
    let Some(f) = fork else {
        let reply = if crate::external::wanted(app, cr.payload.len()) {
            let payload = std::mem::take(&mut cr.payload);
            Box::pin(crate::external::create(app, cr, payload, request_json)).await?
        } else {
            app.propose(group, Op::Create(Box::new(cr))).await?
        };
        return match reply {
            Reply::Created(c) => {
                if c.created {
                    hot.keep();
                }
                Ok(render::created(&c, &loc))
            }
            _ => Err(ApiError::new(
                ErrorCode::INTERNAL_ERROR,
                "unexpected reply to create",
            )),
        };
    };
    // Fork: an existing target is answered without contacting the source (forks.md §5.1).
    cr.fork = Some(ForkCreate {
        source: f.source.clone(),
        anchor: f.anchor,
        sub: f.sub,
        pinned: None,
    });
    if app.with_stream(&target.key, |_| ()).is_some() {
        match app.propose(group, Op::Create(Box::new(cr.clone()))).await? {
            Reply::Created(c) => return Ok(render::created(&c, &loc)),
            Reply::NeedsPin => {}
            _ => {
                return Err(ApiError::new(
                    ErrorCode::INTERNAL_ERROR,
                    "unexpected reply to fork",
                ));
            }
        }
    }
    let pin_id = app.next_pin_id();
    let src_group = app.group_of(&f.source);
    let pin = PinReq {
        source: f.source.clone(),
        fork_key: target.key.clone(),
        pin_id,
        deadline_ms: app.now_ms() + PIN_CONFIRM_MS,
        anchor: f.anchor,
        sub: f.sub,
        content_type: ct.clone(),
    };
    let pinned = match app.propose(src_group, Op::Pin(Box::new(pin))).await? {
        Reply::Pinned(p) => *p,
        _ => {
            return Err(ApiError::new(
                ErrorCode::INTERNAL_ERROR,
                "unexpected reply to pin",
            ));
        }
    };
    let release = |app: Arc<App>, source| async move {
        let _ = app
            .propose(
                src_group,
                Op::Unpin {
                    key: source,
                    pin_id,
                },
            )
            .await;
    };
    if ct.is_none() && content_type::is_json(&pinned.content_type) {
        match canonical(body, true) {
            Ok((p, m)) => {
                cr.payload = p;
                cr.messages = m;
            }
            Err(e) => {
                release(app.clone(), f.source.clone()).await;
                return Err(e);
            }
        }
    }
    if let Some(fc) = cr.fork.as_mut() {
        fc.pinned = Some(pinned);
    }
    let res = app.propose(group, Op::Create(Box::new(cr))).await;
    match res {
        Ok(Reply::Created(c)) if c.created => {
            hot.keep();
            Ok(render::created(&c, &loc))
        }
        Ok(Reply::Created(c)) => {
            release(app.clone(), f.source.clone()).await;
            Ok(render::created(&c, &loc))
        }
        Ok(_) => {
            release(app.clone(), f.source.clone()).await;
            Err(ApiError::new(
                ErrorCode::INTERNAL_ERROR,
                "unexpected reply to fork create",
            ))
        }
        // A definite rejection created nothing: release the pin before answering. After an
        // ambiguous failure the fork may exist; upkeep releases the pin only if it does not.
        Err(e)
            if matches!(
                e.code(),
                ErrorCode::INTERNAL_ERROR | ErrorCode::LEADER_UNAVAILABLE
            ) =>
        {
            Err(e)
        }
        Err(e) => {
            release(app.clone(), f.source.clone()).await;
            Err(e)
        }
    }
}

/// Takes the target by value: its key moves into the command.
pub async fn append(app: &Arc<App>, target: Target, req: Request<Body>) -> ApiResult {
    let (parts, body) = req.into_parts();
    let hm = &parts.headers;
    let carried = h::carried(hm);
    let producer = if carried.producer {
        h::producer(hm)?
    } else {
        None
    };
    let (record_match, incarnation, close, stream_seq) = if carried.stream {
        (
            h::record_match(hm)?,
            h::incarnation(hm)?,
            h::closed(hm),
            h::stream_seq(hm)?,
        )
    } else {
        (None, None, false, None)
    };
    let ct = h::content_type(hm)?;
    let (body, _charge) = body::read(app, hm, body, app.cfg.max_request_bytes).await?;
    if !body.is_empty() && ct.is_none() {
        return Err(ApiError::new(
            ErrorCode::MISSING_CONTENT_TYPE,
            "an append with a body needs Content-Type",
        ));
    }
    let is_json = ct.as_deref().is_some_and(content_type::is_json);
    let had_body = !body.is_empty();
    let (payload, messages) = canonical(body, is_json)?;
    if is_json && had_body && messages == 0 {
        return Err(ApiError::new(
            ErrorCode::INVALID_JSON,
            "an append must hold at least one JSON value",
        ));
    }
    let bytes = payload.len() as u64;
    // An external payload adds no hot bytes (cluster.md §6.4).
    let external = crate::external::wanted(app, payload.len());
    let hot = if external {
        HotReservation::none()
    } else {
        app.admit_hot(&target.key, producer.as_ref(), bytes)?
    };
    let group = app.group_of(&target.key);
    let mut req = AppendReq {
        key: target.key,
        content_type: ct,
        close,
        stream_seq,
        producer,
        incarnation,
        record_match,
        payload,
        messages,
    };
    let reply = if external {
        let payload = std::mem::take(&mut req.payload);
        Box::pin(crate::external::append(app, req, payload, is_json)).await?
    } else {
        app.propose(group, Op::Append(Box::new(req))).await?
    };
    match reply {
        Reply::Appended(a) => {
            if a.appended && !a.duplicate {
                inc(&app.metrics.appends, 1);
                inc(&app.metrics.appended_bytes, bytes);
                hot.keep();
            }
            Ok(render::appended(&a))
        }
        _ => Err(ApiError::new(
            ErrorCode::INTERNAL_ERROR,
            "unexpected reply to append",
        )),
    }
}

pub async fn delete(app: &Arc<App>, target: &Target, hm: &HeaderMap) -> ApiResult {
    let incarnation = h::incarnation(hm)?;
    let op = Op::Delete {
        key: target.key.clone(),
        incarnation,
    };
    let before = app.with_stream(&target.key, |s| {
        (
            s.incarnation,
            s.snapshot_object.as_ref().map(|r| r.key.clone()),
        )
    });
    app.propose(app.group_of(&target.key), op).await?;
    crate::parts::after_stream_delete(app, &target.key, before);
    Ok(render::empty(StatusCode::NO_CONTENT))
}
