//! The gateway (`ursula gateway`, cluster.md §12) as a client meets it: one address for a
//! cluster, answers from each stream's leader, no node address in any answer, its own CORS
//! and its own JSON errors. The real binaries, real processes, loopback ports.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::cluster::{Cluster, ClusterSpec};
use common::{Server, strip_ansi, try_request, wait_until};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// A gateway process, killed on drop.
struct Gateway {
    child: Child,
    addr: SocketAddr,
}

impl Gateway {
    fn start(upstreams: &[String], extra: &[&str]) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ursula"));
        cmd.args(["gateway", "--listen", "127.0.0.1:0"]);
        for u in upstreams {
            cmd.args(["--upstream", u]);
        }
        let mut child = cmd
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let line = strip_ansi(&line);
                if let Some(a) = line.split("addr=").nth(1) {
                    let a = a.split_whitespace().next().unwrap_or("");
                    if let Ok(addr) = a.parse::<SocketAddr>() {
                        let _ = tx.send(addr);
                    }
                }
            }
        });
        let addr = rx.recv_timeout(T).expect("the gateway reports its address");
        Gateway { child, addr }
    }

    fn req(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> common::Response {
        try_request(self.addr, method, path, headers, body, T).unwrap()
    }

    fn metrics(&self) -> Value {
        self.req("GET", "/__ursula/gateway/metrics", &[], b"")
            .json()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn one_address_for_a_cluster_answers_from_each_leader_and_names_no_node() {
    let mut c = Cluster::start(ClusterSpec::new(3));
    c.wait_ready();
    let upstreams: Vec<String> = c
        .ports()
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    let gw = Gateway::start(&upstreams, &[]);
    let text = [("Content-Type", "text/plain")];
    // Streams spread over the 4 groups, so most are led by a node the gateway does not try
    // first: it follows the 307s itself.
    for i in 0..12 {
        let p = format!("/gwbk/s{i}");
        let r = gw.req("PUT", &p, &text, b"first;");
        assert_eq!(r.status, 201, "create {p}: {}", r.text());
        let loc = r.header("location").expect("Location");
        assert_eq!(loc, format!("http://{}{p}", gw.addr), "no node address");
        let r = gw.req("POST", &p, &text, b"second;");
        assert_eq!(r.status, 204, "append {p}: {}", r.text());
        let r = gw.req("GET", &format!("{p}?offset=-1"), &[], b"");
        assert_eq!(r.status, 200, "read {p}");
        assert_eq!(r.text(), "first;second;");
    }
    let m = gw.metrics();
    assert!(m["leader_redirects"].as_u64().unwrap() > 0, "{m}");
    assert!(m["leader_cache_hits"].as_u64().unwrap() > 0, "{m}");
    assert!(m["leader_cache_entries"].as_u64().unwrap() >= 1, "{m}");
    let every_node = upstreams.iter().map(|u| u.trim_start_matches("http://"));
    for n in every_node {
        let r = gw.req("PUT", "/gwbk/again", &text, b"");
        assert!(!r.text().contains(n), "{}", r.text());
    }
}

#[test]
fn the_gateway_owns_cors_limits_and_its_errors() {
    let s = Server::start();
    let node = format!("http://{}", s.addr());
    let gw = Gateway::start(
        &[node],
        &[
            "--cors-allowed-origin",
            "https://app.example",
            "--max-request-body-bytes",
            "1000",
        ],
    );
    let text = [("Content-Type", "text/plain")];
    assert_eq!(gw.req("PUT", "/gwck/s", &text, b"x").status, 201);

    // Preflight: answered by the gateway, for an allowed origin only.
    let pre = gw.req(
        "OPTIONS",
        "/gwck/s",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "content-type, if-none-match",
            ),
        ],
        b"",
    );
    assert_eq!(pre.status, 204);
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(
        pre.header("access-control-allow-headers"),
        Some("content-type, if-none-match")
    );
    // The node answers `*` for any origin; through the gateway only its policy shows.
    let r = gw.req(
        "GET",
        "/gwck/s?offset=-1",
        &[("Origin", "https://app.example")],
        b"",
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert_eq!(r.header("access-control-expose-headers"), Some("*"));
    let r = gw.req(
        "GET",
        "/gwck/s?offset=-1",
        &[("Origin", "https://evil.example")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);

    // The limit it enforces is the one it advertises, and a larger body is refused in JSON.
    let head = gw.req("HEAD", "/gwck/s", &[], b"");
    assert_eq!(head.header("ursula-max-request-bytes"), Some("1000"));
    let r = gw.req("POST", "/gwck/s", &text, &[b'a'; 1001]);
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(gw.req("POST", "/gwck/s", &text, &[b'a'; 1000]).status, 204);

    // A node that does not answer: 502 UPSTREAM_FAILED, and the gateway keeps serving.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dead = Gateway::start(&[format!("http://127.0.0.1:{port}")], &[]);
    let r = dead.req("GET", "/gwck/s", &[], b"");
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["code"], "UPSTREAM_FAILED");
    assert!(wait_until(T, || dead.req("GET", "/gwck/s", &[], b"").status == 502));
}
