//! The query parameters of a stream read (protocol.md §10.1, extensions.md §11.6) and the
//! `Accept` negotiation of JSON streams (protocol.md §11.3).

use super::error::ApiError;
use http::HeaderMap;
use ursula_core::ErrorCode;
use ursula_core::offset::{self, ReadStart};
use ursula_core::records::{RecordParams, RecordQuery};

/// Query parameters of a read.
#[derive(Debug, Default)]
pub struct ReadQuery {
    pub offset: Option<ReadStart>,
    pub live: Option<Live>,
    pub cursor: Option<String>,
    pub timeout_ms: Option<u64>,
    pub max_bytes: Option<u64>,
    /// `record`, `tail_records`, `max_records`, `record_view`: a record-aware read.
    pub records: Option<RecordQuery>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    LongPoll,
    Sse,
}

fn bad_query(m: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::INVALID_QUERY, m)
}

/// The raw values of the record parameters (a repeated one keeps its last value).
#[derive(Default)]
struct RawRecords {
    record: Option<String>,
    tail_records: Option<String>,
    max_records: Option<String>,
    record_view: Option<String>,
}

/// Whether the query asks for a live read (a `live` parameter, whatever its value): such a
/// read waits by design, so it is not timed (`crate::latency`).
pub fn is_live(q: Option<&str>) -> bool {
    q.unwrap_or("")
        .split('&')
        .any(|p| p.split_once('=').map_or(p, |(k, _)| k) == "live")
}

pub fn parse_query(q: Option<&str>) -> Result<ReadQuery, ApiError> {
    let mut rq = ReadQuery::default();
    let mut seen_offset = false;
    let mut raw = RawRecords::default();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !matches!(
            k,
            "offset"
                | "live"
                | "cursor"
                | "timeout_ms"
                | "max_bytes"
                | "record"
                | "tail_records"
                | "max_records"
                | "record_view"
        ) {
            continue;
        }
        let v = match (k, super::path::pct_decode(&value.replace('+', " "))) {
            (_, Some(v)) => v,
            ("offset", None) => {
                return Err(ApiError::new(
                    ErrorCode::INVALID_OFFSET,
                    "offset is not valid UTF-8",
                ));
            }
            ("cursor", None) => String::new(),
            (_, None) => return Err(bad_query(format!("{k} is not valid UTF-8"))),
        };
        match k {
            "offset" => {
                if seen_offset {
                    return Err(bad_query("offset given twice"));
                }
                seen_offset = true;
                rq.offset = Some(offset::parse_read_offset(&v).ok_or_else(|| {
                    let shown = super::headers::shorten(&v, 64);
                    ApiError::new(
                        ErrorCode::INVALID_OFFSET,
                        format!("invalid offset {shown:?}"),
                    )
                })?);
            }
            "live" => {
                rq.live = match v.as_str() {
                    "long-poll" => Some(Live::LongPoll),
                    "sse" => Some(Live::Sse),
                    _ => {
                        let shown = super::headers::shorten(&v, 64);
                        return Err(bad_query(format!("invalid live mode {shown:?}")));
                    }
                }
            }
            "cursor" => rq.cursor = Some(v),
            "timeout_ms" => {
                rq.timeout_ms = Some(
                    offset::parse_digits(&v)
                        .ok_or_else(|| bad_query("timeout_ms must be an integer"))?,
                )
            }
            "max_bytes" => {
                rq.max_bytes = Some(
                    offset::parse_digits(&v)
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| bad_query("max_bytes must be an integer >= 1"))?,
                )
            }
            "record" => raw.record = Some(v),
            "tail_records" => raw.tail_records = Some(v),
            "max_records" => raw.max_records = Some(v),
            _ => raw.record_view = Some(v),
        }
    }
    let params = RecordParams {
        record: raw.record.as_deref(),
        tail_records: raw.tail_records.as_deref(),
        max_records: raw.max_records.as_deref(),
        record_view: raw.record_view.as_deref(),
        offset: seen_offset,
        max_bytes: rq.max_bytes.is_some(),
    };
    rq.records = params.check()?;
    if rq.live.is_some() && rq.offset.is_none() && rq.records.is_none() {
        return Err(bad_query(
            "a live read needs an offset, record or tail_records",
        ));
    }
    Ok(rq)
}

/// Whether the client asked for NDJSON over the default JSON array.
pub fn wants_ndjson(hm: &HeaderMap) -> bool {
    let Some(accept) = hm.get(http::header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mut nd: Option<f32> = None;
    let mut js: f32 = 0.0;
    for item in accept.split(',') {
        let mut parts = item.split(';');
        let ty = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .find_map(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
            })
            .unwrap_or(1.0);
        if ty == "application/x-ndjson" {
            nd = Some(nd.map_or(q, |x| x.max(q)));
        } else if ty == "application/json" {
            js = js.max(q);
        }
    }
    nd.is_some_and(|q| q > 0.0 && q >= js)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ursula_core::records::RecordStart;

    fn code(q: &str) -> Option<ErrorCode> {
        parse_query(Some(q)).err().map(|e| e.code())
    }

    #[test]
    fn a_live_parameter_marks_a_live_read() {
        assert!(is_live(Some("offset=-1&live=sse")));
        assert!(is_live(Some("live=long-poll")));
        assert!(is_live(Some("live")));
        assert!(!is_live(Some("offset=-1&alive=1&x=live")));
        assert!(!is_live(None));
    }

    #[test]
    fn record_parameters() {
        let q = parse_query(Some("record=now&live=long-poll")).expect("valid");
        assert_eq!(q.records.map(|r| r.start), Some(RecordStart::Now));
        let q = parse_query(Some(
            "tail_records=2&max_records=1&record_view=envelope&live=sse",
        ))
        .expect("valid");
        let r = q.records.expect("a record read");
        assert_eq!(
            (r.start, r.max_records, r.envelope),
            (RecordStart::Tail(2), Some(1), true)
        );
        // The last value of a repeated record parameter counts.
        let q = parse_query(Some("record=1&record=7")).expect("valid");
        assert_eq!(q.records.map(|r| r.start), Some(RecordStart::At(7)));
        for bad in [
            "record=1&offset=0",
            "offset=0&tail_records=1",
            "max_records=2",
            "record=1&max_bytes=10",
            "record_view=envelope",
            "record=1&record_view=json",
            "record=x",
            "record=%FF",
            "tail_records=-1",
            "record=0&max_records=0",
            "live=sse",
        ] {
            assert_eq!(code(bad), Some(ErrorCode::INVALID_QUERY), "{bad}");
        }
        assert_eq!(parse_query(Some("offset=0")).expect("valid").records, None);
    }
}
