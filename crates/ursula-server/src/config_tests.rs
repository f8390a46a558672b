//! Tests of `Config`: parsing, defaults, validation.

use super::*;

#[test]
fn commit_linger_is_read_from_the_file_and_bounded() {
    let parse = |t: &str| toml::from_str::<Config>(t).expect("parse");
    assert_eq!(parse("").commit_linger_us, 250);
    let off = parse("commit_linger_us = 0\n");
    off.validate().expect("0 turns the linger off");
    assert_eq!(off.commit_linger_us, 0);
    parse("commit_linger_us = 10000\n")
        .validate()
        .expect("10 ms is allowed");
    let err = parse("commit_linger_us = 10001\n").validate().unwrap_err();
    assert!(err.to_string().contains("commit_linger_us"), "{err}");
}

#[test]
fn the_wal_segment_size_is_read_as_a_size_and_bounded() {
    let parse = |t: &str| toml::from_str::<Config>(t).expect("parse");
    assert_eq!(parse("").raft.wal.segment_size(), 64 << 20);
    let small = parse("[raft.wal]\nsegment_size = \"1MiB\"\n");
    small.validate().expect("1 MiB is allowed");
    assert_eq!(small.raft.wal.segment_size(), 1 << 20);
    assert_eq!(
        parse("[raft.wal]\nsegment_size = 2097152\n")
            .raft
            .wal
            .segment_size(),
        2 << 20
    );
    for bad in ["\"512KiB\"", "\"2GiB\""] {
        let err = parse(&format!("[raft.wal]\nsegment_size = {bad}\n"))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("segment_size"), "{err}");
    }
}

#[test]
fn cold_health_marks_are_checked_against_the_flush_settings() {
    let peers = "[[raft.peers]]\nnode_id = 1\nurl = \"http://127.0.0.1:1\"\n\
                 [[raft.peers]]\nnode_id = 2\nurl = \"http://127.0.0.1:2\"\n\
                 [[raft.peers]]\nnode_id = 3\nurl = \"http://127.0.0.1:3\"\n";
    let with = |cold: &str, extra: &str| {
        let t = format!(
            "[raft]\nnode_id = 1\n{peers}[storage.cold]\nbackend = \"s3\"\n{cold}\
             [storage.cold.s3]\nbucket = \"b\"\n{extra}"
        );
        toml::from_str::<Config>(&t).expect("parse")
    };
    let cluster = |extra: &str| with("", extra);
    cluster("").validate().expect("the defaults hold");
    // Derived marks follow a lowered cap.
    with(
        "flush_size = \"64KiB\"\nmax_hot_size_per_group = \"512KiB\"\n",
        "",
    )
    .validate()
    .expect("derived marks");
    let cases = [
        (
            "[governance.cold_health]\nhot_size_low = \"48MiB\"\nhot_size_high = \"40MiB\"\n",
            "hot_size_low",
        ),
        (
            "[governance.cold_health]\nhot_size_high = \"8MiB\"\n",
            "flush_min_hot_size",
        ),
        (
            "[governance.cold_health]\nhot_size_high = \"64MiB\"\n",
            "max_hot_size_per_group",
        ),
    ];
    for (extra, names) in cases {
        let err = cluster(extra).validate().unwrap_err().to_string();
        assert!(err.contains(names), "{extra}: {err}");
    }
    // A set `flush_any_hot_size` must stay below the high mark (48 MiB by default)...
    let err = with("flush_any_hot_size = \"48MiB\"\n", "")
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("flush_any_hot_size"), "{err}");
    // ...and an unset one follows lowered marks down to the low mark.
    let low =
        cluster("[governance.cold_health]\nhot_size_high = \"12MiB\"\nhot_size_low = \"10MiB\"\n");
    low.validate().expect("lowered marks");
    assert_eq!(low.tiering().flush_any_hot_size, 10 << 20);
    assert_eq!(cluster("").tiering().flush_any_hot_size, 16 << 20);
    // A single node runs no gate: its marks are not checked.
    let single: Config =
        toml::from_str("[governance.cold_health]\nhot_size_high = \"1MiB\"\n").expect("parse");
    single.validate().expect("no gate without peers");
}

#[test]
fn toml_overrides_defaults() {
    let c: Config = toml::from_str("group_count = 8\nlisten = \"127.0.0.1:9000\"").expect("parse");
    assert_eq!(c.group_count, Some(8));
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.long_poll_timeout_ms, 1000);
    assert!(toml::from_str::<Config>("bogus = 1").is_err());
    let cold: Config = toml::from_str("[storage.cold]\nbackend = \"mem\"\n").expect("parse cold");
    assert_eq!(
        cold.storage.cold.backend,
        Some(ursula_storage::cold::Backend::Memory)
    );
    let rt: Config =
        toml::from_str("[runtime]\nexternal_payload_min_size = \"2MiB\"\n").expect("parse runtime");
    assert_eq!(rt.runtime.external_payload_min_size, 2 << 20);
    assert_eq!(Config::default().runtime.external_payload_min_size, 1 << 20);
    assert!(toml::from_str::<Config>("[runtime]\nbogus = 1\n").is_err());
    let rt: Config = toml::from_str("[runtime]\nnode_memory_abort_cap_size = \"2GiB\"\n")
        .expect("parse the memory cap");
    assert_eq!(rt.runtime.node_memory_abort_cap_size, Some(2 << 30));
    assert_eq!(Config::default().runtime.node_memory_abort_cap_size, None);
    let raft: Config = toml::from_str("[raft]\nmax_uncommitted_size_per_group = \"8MiB\"\n")
        .expect("parse the uncommitted bound");
    assert_eq!(raft.raft.max_uncommitted_size_per_group, Some(8 << 20));
    assert_eq!(Config::default().raft.max_uncommitted_size_per_group, None);
    let s3: Config = toml::from_str("[storage.cold]\nbackend = \"s3\"\n").expect("parse s3");
    assert!(toml::from_str::<Config>("[raft]\nbogus = 1").is_err());
    assert!(s3.validate().is_err(), "s3 without a bucket");
    assert!(
        Config {
            group_count: Some(0),
            ..Config::default()
        }
        .validate()
        .is_err()
    );
}

#[test]
fn the_send_buffer_is_autotuned_or_at_least_two_loopback_segments() {
    let ok = |toml: &str| toml::from_str::<Config>(toml).expect("parse").validate();
    assert_eq!(Config::default().send_buffer_bytes, 256 * 1024);
    assert!(
        ok("send_buffer_bytes = 0\n").is_ok(),
        "0 is the kernel's autotuning"
    );
    assert!(ok("send_buffer_bytes = 131072\n").is_ok());
    let e = ok("send_buffer_bytes = 65536\n").unwrap_err();
    assert!(e.to_string().contains("131072"), "{e}");
    assert!(ok("send_buffer_bytes = 2147483648\n").is_err());
}

#[test]
fn the_congestion_control_defaults_to_cubic_and_a_bad_name_is_refused_by_key() {
    // The name rules themselves are `ursula_http::congestion`'s, tested there.
    assert_eq!(Config::default().tcp_congestion, "cubic");
    let bad = toml::from_str::<Config>("tcp_congestion = \"cubic; rm\"\n").expect("parse");
    let e = bad.validate().unwrap_err();
    assert!(e.to_string().contains("tcp_congestion"), "{e}");
}

#[test]
fn the_body_budget_must_admit_what_the_limits_allow() {
    let ok = |toml: &str| toml::from_str::<Config>(toml).expect("parse").validate();
    assert!(
        ok("http_inflight_body_size = 0\n").is_ok(),
        "0 is unlimited"
    );
    let e = ok("http_inflight_body_size = 1048576\n").unwrap_err();
    assert!(e.to_string().contains("max_request_bytes"), "{e}");
    let e = ok("http_inflight_body_size = 33554432\n").unwrap_err();
    assert!(e.to_string().contains("64 MiB"), "{e}");
    assert!(ok("http_inflight_body_size = 33554432\n[storage.cold]\nbackend = \"none\"\n").is_ok());
}
