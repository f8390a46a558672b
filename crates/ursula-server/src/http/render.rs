//! Rendering successful write answers.

use super::Resp;
use super::headers as h;
use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ursula_core::command::{AppendReply, CreateReply};

pub fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    // Room for the protocol headers and the common ones without growing the map.
    *r.headers_mut() = HeaderMap::with_capacity(16);
    r
}

fn records(hm: &mut HeaderMap, json: bool, start: u64, next: u64) {
    if json {
        h::put(hm, &h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
        h::put_u64(hm, &h::STREAM_RECORD_START, start);
        h::put_u64(hm, &h::STREAM_RECORD_NEXT, next);
    }
}

/// `201`/`200` of a create.
pub fn created(c: &CreateReply, location: &str) -> Resp {
    let mut r = empty(if c.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    });
    let hm = r.headers_mut();
    h::put(hm, &http::header::LOCATION, location);
    h::put(hm, &http::header::CONTENT_TYPE, &c.content_type);
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, c.tail);
    h::put_incarnation(hm, c.incarnation);
    h::put_lifetime(hm, &c.lifetime);
    if c.closed {
        hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some((e, s)) = c.producer {
        h::put_u64(hm, &h::PRODUCER_EPOCH, e);
        h::put_u64(hm, &h::PRODUCER_SEQ, s);
    }
    records(hm, c.json, c.record_start, c.record_next);
    r
}

/// `200`/`204` of an append or close.
pub fn appended(a: &AppendReply) -> Resp {
    let status = if a.producer.is_some() && a.appended && !a.duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut r = empty(status);
    let hm = r.headers_mut();
    h::put_off(hm, &h::STREAM_NEXT_OFFSET, a.next_offset);
    h::put_incarnation(hm, a.incarnation);
    if a.closed {
        hm.insert(&h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some((e, s)) = a.producer {
        h::put_u64(hm, &h::PRODUCER_EPOCH, e);
        h::put_u64(hm, &h::PRODUCER_SEQ, s);
    }
    records(hm, a.json, a.record_start, a.record_next);
    r
}
