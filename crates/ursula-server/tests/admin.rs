//! The admin plane: `DELETE /__ursula/purge/{bucket}` erases a tenant and fences its ID, so
//! creating a stream in it answers `404` afterwards (seed 003); the client plane has no
//! mutating operator routes.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use common::{Server, assert_error, request};
use std::net::SocketAddr;
use std::time::Duration;

fn admin_addr(s: &Server) -> SocketAddr {
    // The log reader thread may still be storing the listen line: wait for it.
    let logged = common::wait_until(Duration::from_secs(10), || {
        s.log_tail(200).contains("admin_addr=")
    });
    assert!(logged, "admin address logged");
    let log = common::strip_ansi(&s.log_tail(200));
    let at = log.find("admin_addr=").expect("admin address logged") + "admin_addr=".len();
    let rest = &log[at..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    rest[..end].parse().expect("admin address parses")
}

#[test]
fn purge_erases_and_fences_a_bucket() {
    let s = Server::start_with_args(&["--admin-listen", "127.0.0.1:0"]);
    let admin = admin_addr(&s);
    for name in ["a", "b", "c"] {
        assert_eq!(
            s.put(&format!("/tenant-a/{name}"), "text/plain", b"hello")
                .status,
            201
        );
    }
    assert_eq!(s.put("/tenant-b/keep", "text/plain", b"kept").status, 201);
    assert_eq!(
        s.put("/v1/stream/compat-one", "text/plain", b"x").status,
        201
    );

    // Not on the client plane.
    assert_error(&s.delete("/__ursula/purge/tenant-a"), 404, "NOT_FOUND");
    assert_error(
        &request(admin, "DELETE", "/__ursula/purge/AB", &[], b""),
        400,
        "INVALID_BUCKET_ID",
    );
    assert_error(
        &request(admin, "DELETE", "/__ursula/purge/__ursula", &[], b""),
        400,
        "INVALID_BUCKET_ID",
    );

    let r = request(admin, "DELETE", "/__ursula/purge/tenant-a", &[], b"");
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(r.json()["removed_streams"], 3);
    assert_eq!(r.json()["bucket"], "tenant-a");

    // Gone and fenced: reads 404, re-creating the bucket or a stream in it 404.
    assert_error(&s.get("/tenant-a/a"), 404, "BUCKET_NOT_FOUND");
    assert_error(
        &s.post("/tenant-a/a", "text/plain", b"x"),
        404,
        "BUCKET_NOT_FOUND",
    );
    assert_error(
        &s.put("/tenant-a/a", "text/plain", b""),
        404,
        "BUCKET_NOT_FOUND",
    );
    assert_error(
        &s.req("PUT", "/tenant-a", &[], b""),
        404,
        "BUCKET_NOT_FOUND",
    );
    assert_error(&s.get("/tenant-a"), 404, "BUCKET_NOT_FOUND");
    // Idempotent.
    let again = request(admin, "DELETE", "/__ursula/purge/tenant-a", &[], b"");
    assert_eq!(
        (again.status, again.json()["removed_streams"].clone()),
        (200, 0.into())
    );
    // Other buckets untouched.
    assert_eq!(s.get("/tenant-b/keep?offset=-1").body, b"kept");

    // The compatibility bucket is emptied but never fenced.
    let r = request(admin, "DELETE", "/__ursula/purge/__compat_v1", &[], b"");
    assert_eq!(r.json()["removed_streams"], 1);
    assert_eq!(s.get("/v1/stream/compat-one").status, 404);
    assert_eq!(
        s.put("/v1/stream/compat-one", "text/plain", b"again")
            .status,
        201
    );
}

#[test]
fn the_fence_survives_a_restart() {
    let mut s = Server::start_with_args(&["--admin-listen", "127.0.0.1:0"]);
    let admin = admin_addr(&s);
    assert_eq!(s.put("/gone-tenant/x", "text/plain", b"x").status, 201);
    assert_eq!(
        request(admin, "DELETE", "/__ursula/purge/gone-tenant", &[], b"").status,
        200
    );
    s.kill9();
    s.restart();
    assert_error(
        &s.put("/gone-tenant/x", "text/plain", b""),
        404,
        "BUCKET_NOT_FOUND",
    );
}
