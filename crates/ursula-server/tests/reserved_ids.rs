//! Seed 003 on the real binary: `streams` and `__ds` are reserved stream IDs and an empty
//! stream ID is invalid; each answers `400 INVALID_STREAM_ID` with a JSON body and creates
//! nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, assert_error};

#[test]
fn reserved_and_empty_stream_ids_answer_400_and_create_nothing() {
    let s = Server::start();
    assert_eq!(s.put("/seedb", "", b"").status, 201);
    for path in ["/seedb/streams", "/seedb/", "/seedb/__ds"] {
        let r = s.put(path, "text/plain", b"");
        assert_error(&r, 400, "INVALID_STREAM_ID");
        let r = s.post(path, "text/plain", b"x");
        assert_error(&r, 400, "INVALID_STREAM_ID");
    }
    // `streams` stays the listing for GET, and nothing was created.
    let list = s.get("/seedb/streams");
    assert_eq!(list.status, 200, "{}", list.describe());
    assert!(!list.text().contains("__ds"), "{}", list.text());
    assert_eq!(
        list.json()["streams"].as_array().map(Vec::len),
        Some(0),
        "{}",
        list.text()
    );
    // A bucket whose ID is reserved-looking is still a bucket; `/{bucket}/__ds/...` is not a
    // stream either.
    assert_eq!(s.get("/seedb/__ds/subscriptions/x").status, 404);
}
