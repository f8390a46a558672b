//! The gateway's routing against scripted upstreams: answers a real node gives only in rare
//! moments (a leader stepping down with `503` and `Retry-After`, a `307` that is not to a
//! leader) are played on cue, and the gateway process is the real one. Also its drain on
//! SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod common;

use common::gateway::Gateway;
use common::{try_request, wait_until};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// What a scripted upstream answers to `(path, host)`: the status line's code, extra
/// headers, the body, and how long to wait first.
type Script = dyn Fn(&str, &str) -> (u16, Vec<(String, String)>, String, Duration) + Send + Sync;

/// A scripted upstream on a loopback port: one answer per connection (`Connection: close`),
/// each request's method and path recorded.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    fn start(
        script: impl Fn(&str, &str) -> (u16, Vec<(String, String)>, String, Duration)
        + Send
        + Sync
        + 'static,
    ) -> Upstream {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for c in l.incoming().map_while(Result::ok) {
                let (script, log) = (Arc::clone(&script), Arc::clone(&log));
                std::thread::spawn(move || serve_one(c, &*script, &log));
            }
        });
        Upstream { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_one(c: TcpStream, script: &Script, log: &Mutex<Vec<String>>) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let mut it = line.split_whitespace();
    let (method, path) = (
        it.next().unwrap_or("").to_owned(),
        it.next().unwrap_or("").to_owned(),
    );
    let (mut len, mut host) = (0usize, String::new());
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            } else if k.eq_ignore_ascii_case("host") {
                v.trim().clone_into(&mut host);
            }
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    log.lock().unwrap().push(format!("{method} {path}"));
    let (status, headers, text, delay) = script(&path, &host);
    std::thread::sleep(delay);
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nconnection: close\r\ncontent-length: {}\r\n",
        text.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&text);
    let mut c = c;
    let _ = c.write_all(out.as_bytes());
}

fn h(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

const NOW: Duration = Duration::ZERO;

#[test]
fn a_leader_that_steps_down_is_forgotten_and_a_plain_redirect_reaches_the_client_as_a_path() {
    // `b` leads; `a` redirects to it, except for one path it redirects elsewhere without
    // naming a leader. `b` steps down once (503 with Retry-After) on cue.
    let b = Upstream::start(|path, _| match path {
        "/tenant/s?step=down" => (503, vec![h("retry-after", "1")], "{}".into(), NOW),
        _ => (200, vec![], "from b".into(), NOW),
    });
    let leader = b.url();
    let a = Upstream::start(move |path, _| match path {
        "/tenant/moved" => (
            307,
            vec![h("location", "http://127.0.0.1:9/elsewhere/x?y=1")],
            String::new(),
            NOW,
        ),
        _ => (
            307,
            vec![
                h("location", &format!("{leader}{path}")),
                h("x-ursula-raft-leader-id", "2"),
            ],
            String::new(),
            NOW,
        ),
    });
    let gw = Gateway::start(&[a.url()], &[]);

    // Learned through a's redirect, then asked directly.
    assert_eq!(gw.req("GET", "/tenant/s", &[], b"").text(), "from b");
    assert_eq!(gw.req("GET", "/tenant/s?again", &[], b"").text(), "from b");
    assert_eq!(a.seen(), ["GET /tenant/s"]);
    let m = gw.metrics();
    assert_eq!(m["leader_cache_hits"], 1, "{m}");
    assert_eq!(m["leader_redirects"], 1, "{m}");

    // The leader steps down: the client gets its 503, and the gateway forgets it, so the next
    // request goes through a again.
    let r = gw.req("GET", "/tenant/s?step=down", &[], b"");
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(gw.metrics()["leader_cache_evictions"], 1);
    assert_eq!(gw.req("GET", "/tenant/s", &[], b"").text(), "from b");
    assert_eq!(a.seen().len(), 2, "{:?}", a.seen());

    // A redirect that does not name a leader is the client's, without any node's origin.
    let r = gw.req("GET", "/tenant/moved", &[], b"");
    assert_eq!(r.status, 307);
    assert_eq!(r.header("location"), Some("/elsewhere/x?y=1"));
}

#[test]
fn sigterm_lets_the_requests_in_flight_finish_and_takes_no_new_ones() {
    let slow = Upstream::start(|_, _| (200, vec![], "late".into(), Duration::from_millis(1500)));
    let mut gw = Gateway::start(&[slow.url()], &["--graceful-shutdown-timeout", "30"]);
    let addr = gw.addr;
    let in_flight = std::thread::spawn(move || try_request(addr, "GET", "/tenant/s", &[], b"", T));
    assert!(wait_until(T, || !slow.seen().is_empty()));
    let st = std::process::Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    // New connections are refused once the listener is closed, while the request finishes.
    assert!(wait_until(T, || TcpStream::connect(addr).is_err()));
    assert!(
        !in_flight.is_finished(),
        "refused while the request was still in flight"
    );
    let r = in_flight
        .join()
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!((r.status, r.text().as_str()), (200, "late"));
    let exited = wait_until(T, || gw.child.try_wait().unwrap().is_some());
    assert!(exited, "the gateway exits once drained");
    assert!(gw.child.wait().unwrap().success());
}

#[test]
fn a_create_location_names_the_gateway_even_for_a_client_without_host() {
    // Like a node, the upstream names itself in `Location` by the `Host` it was sent.
    let node = Upstream::start(|path, host| {
        let location = format!("http://{host}{path}");
        (201, vec![h("location", &location)], String::new(), NOW)
    });
    let gw = Gateway::start(&[node.url()], &[]);
    let r = gw.req("PUT", "/tenant/s", &[("Content-Type", "text/plain")], b"");
    assert_eq!(r.status, 201);
    let with_host = r.header("location").unwrap().to_owned();
    assert!(with_host.ends_with("/tenant/s"), "{with_host}");
    assert!(!with_host.contains(&node.addr.to_string()), "{with_host}");
    // HTTP/1.0 allows a request without Host: the gateway's own address stands in.
    let mut c = TcpStream::connect(gw.addr).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    c.write_all(b"PUT /tenant/t HTTP/1.0\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.0 201"), "{answer}");
    let want = format!("location: http://{}/tenant/t\r\n", gw.addr);
    assert!(answer.to_ascii_lowercase().contains(&want), "{answer}");
}
