//! Rendering successful write answers.

use super::Resp;
use super::headers as h;
use axum::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use ursula_core::command::{AppendReply, CreateReply};
use ursula_core::offset::Off;

pub fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    r
}

fn records(hm: &mut HeaderMap, json: bool, start: u64, next: u64) {
    if json {
        h::put(hm, h::STREAM_EXTENSIONS, h::JSON_RECORDS_EXT);
        h::put(hm, h::STREAM_RECORD_START, &start.to_string());
        h::put(hm, h::STREAM_RECORD_NEXT, &next.to_string());
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
    h::put(hm, "location", location);
    h::put(hm, "content-type", &c.content_type);
    h::put(hm, h::STREAM_NEXT_OFFSET, &Off(c.tail).to_string());
    h::put(hm, h::STREAM_INCARNATION, &c.incarnation.to_string());
    h::put_lifetime(hm, &c.lifetime);
    if c.closed {
        hm.insert(h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some((e, s)) = c.producer {
        h::put(hm, h::PRODUCER_EPOCH, &e.to_string());
        h::put(hm, h::PRODUCER_SEQ, &s.to_string());
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
    h::put(hm, h::STREAM_NEXT_OFFSET, &Off(a.next_offset).to_string());
    h::put(hm, h::STREAM_INCARNATION, &a.incarnation.to_string());
    if a.closed {
        hm.insert(h::STREAM_CLOSED, HeaderValue::from_static("true"));
    }
    if let Some((e, s)) = a.producer {
        h::put(hm, h::PRODUCER_EPOCH, &e.to_string());
        h::put(hm, h::PRODUCER_SEQ, &s.to_string());
    }
    records(hm, a.json, a.record_start, a.record_next);
    r
}
