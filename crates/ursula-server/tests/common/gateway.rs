//! A gateway process (`ursula gateway`) for the tests that drive one.

use super::{Response, strip_ansi, try_request};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// A gateway process, killed on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    /// The addresses it reports after its listener's (`--metrics-listen`).
    pub more: mpsc::Receiver<SocketAddr>,
}

impl Gateway {
    pub fn start(upstreams: &[String], extra: &[&str]) -> Gateway {
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
        Gateway {
            child,
            addr,
            more: rx,
        }
    }

    pub fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        try_request(self.addr, method, path, headers, body, T).unwrap()
    }

    pub fn metrics(&self) -> Value {
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
