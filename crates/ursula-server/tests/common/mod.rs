//! Black-box test harness: runs the `ursula` binary on a temporary data directory and talks
//! to it with a tiny HTTP/1.1 client over `std::net::TcpStream`.
//!
//! The client is deliberately raw: some tests must send bytes no real HTTP client would.

#![allow(
    dead_code,
    reason = "every test crate uses a different subset of the harness"
)]

pub mod cluster;
pub mod gateway;
pub mod multipart;

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a server may take to print its listen line.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long a graceful shutdown may take (the server itself allows 10 s for draining).
const TERM_DEADLINE: Duration = Duration::from_secs(25);
/// Default per-request socket timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Stderr lines kept for diagnostics.
const LOG_LINES: usize = 400;

// ---------------------------------------------------------------------------------------------
// Server process
// ---------------------------------------------------------------------------------------------

/// A running (or stopped) `ursula server` process on one data directory.
pub struct Server {
    child: Option<Child>,
    addr: SocketAddr,
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    log: Arc<Mutex<VecDeque<String>>>,
    extra_args: Vec<String>,
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) from a log line.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, up to and including the final byte.
                for c2 in chars.by_ref() {
                    if ('@'..='~').contains(&c2) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// Extracts the socket address after `addr=` from a listen line.
pub fn parse_listen_line(line: &str) -> Option<SocketAddr> {
    let clean = strip_ansi(line);
    if !clean.contains("ursula listening") {
        return None;
    }
    let rest = &clean[clean.find("addr=")? + "addr=".len()..];
    let rest = rest.trim_start_matches('"');
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

impl Server {
    /// Starts a server on a fresh temporary data directory (removed on drop).
    pub fn start() -> Server {
        Self::start_with_args(&[])
    }

    /// Like [`Server::start`], with extra command-line flags (e.g. `--group-count 4`).
    pub fn start_with_args(args: &[&str]) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("ursula-test-")
            .tempdir()
            .expect("create temp dir");
        let dir = tmp.path().join("data");
        let mut s = Self::spawn(&dir, args);
        s._tmp = Some(tmp);
        s
    }

    /// Like [`Server::start_with_args`], with `toml` as its config file (`--config`).
    pub fn start_with_config(toml: &str, args: &[&str]) -> Server {
        let tmp = tempfile::Builder::new()
            .prefix("ursula-test-")
            .tempdir()
            .expect("create temp dir");
        let cfg = tmp.path().join("ursula.toml");
        std::fs::write(&cfg, toml).expect("write the config file");
        let mut all = vec!["--config", cfg.to_str().expect("a UTF-8 temp path")];
        all.extend_from_slice(args);
        let mut s = Self::spawn(&tmp.path().join("data"), &all);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a server on an existing (or to be created) data directory, which it does
    /// not remove.
    pub fn start_in(dir: &Path) -> Server {
        Self::spawn(dir, &[])
    }

    /// [`Server::start_in`] with extra command-line flags.
    pub fn start_in_with_args(dir: &Path, args: &[&str]) -> Server {
        Self::spawn(dir, args)
    }

    fn spawn(dir: &Path, args: &[&str]) -> Server {
        let mut s = Server {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            dir: dir.to_path_buf(),
            _tmp: None,
            log: Arc::new(Mutex::new(VecDeque::new())),
            extra_args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        s.launch();
        s
    }

    fn launch(&mut self) {
        assert!(self.child.is_none(), "server is already running");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ursula"));
        cmd.arg("server")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(&self.extra_args)
            .env("NO_COLOR", "1")
            .env_remove("URSULA_CONFIG")
            .env_remove("URSULA_LISTEN")
            .env_remove("URSULA_DATA_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ursula binary");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel::<SocketAddr>();
        let log = self.log.clone();
        if let Ok(mut l) = log.lock() {
            l.push_back(format!("---- launch pid {} ----", child.id()));
        }
        // Drains stderr for the whole life of the process (a full pipe would block the
        // server), reports the listen address once and keeps the last lines.
        std::thread::spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut line = Vec::new();
            let mut sent = false;
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = strip_ansi(String::from_utf8_lossy(&line).trim_end());
                if !sent && let Some(a) = parse_listen_line(&text) {
                    let _ = tx.send(a);
                    sent = true;
                }
                if let Ok(mut l) = log.lock() {
                    if l.len() >= LOG_LINES {
                        l.pop_front();
                    }
                    l.push_back(text);
                }
            }
        });
        let deadline = Instant::now() + START_DEADLINE;
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(a) => break a,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let st = child.wait().ok();
                    panic!(
                        "server exited before listening ({st:?}); log:\n{}",
                        self.log_tail(80)
                    );
                }
            }
            if let Ok(Some(st)) = child.try_wait() {
                // Give the reader thread a moment to collect the last lines.
                let _ = rx.recv_timeout(Duration::from_millis(300));
                panic!(
                    "server exited before listening ({st}); log:\n{}",
                    self.log_tail(80)
                );
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "server did not print its listen line within {START_DEADLINE:?}; log:\n{}",
                    self.log_tail(80)
                );
            }
        };
        assert!(addr.ip().is_loopback(), "server listens on {addr}");
        self.addr = addr;
        self.child = Some(child);
    }

    /// The address of the running server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id of the running server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(c) => matches!(c.try_wait(), Ok(None)),
        }
    }

    /// The last `n` lines the server wrote to stderr.
    pub fn log_tail(&self, n: usize) -> String {
        let l = match self.log.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let skip = l.len().saturating_sub(n);
        l.iter().skip(skip).cloned().collect::<Vec<_>>().join("\n")
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let Some(mut c) = self.child.take() else {
            panic!("terminate: server is not running");
        };
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM failed: {status}");
        let deadline = Instant::now() + TERM_DEADLINE;
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st;
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "server did not exit within {TERM_DEADLINE:?} after SIGTERM; log:\n{}",
                    self.log_tail(60)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) for the process to exit by itself and returns its status; `None` if it
    /// is still running after `timeout` (it is left running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again on the same data directory (SIGKILLs it first if it is
    /// still running). The address changes.
    pub fn restart(&mut self) {
        self.kill9();
        self.launch();
    }

    // ---- request helpers ---------------------------------------------------------------

    /// One request on a fresh connection; panics on I/O errors.
    pub fn req(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        request(self.addr, method, path, headers, body)
    }

    pub fn get(&self, path: &str) -> Response {
        self.req("GET", path, &[], b"")
    }

    pub fn head(&self, path: &str) -> Response {
        self.req("HEAD", path, &[], b"")
    }

    pub fn delete(&self, path: &str) -> Response {
        self.req("DELETE", path, &[], b"")
    }

    pub fn put(&self, path: &str, content_type: &str, body: &[u8]) -> Response {
        self.req("PUT", path, &[("Content-Type", content_type)], body)
    }

    pub fn post(&self, path: &str, content_type: &str, body: &[u8]) -> Response {
        self.req("POST", path, &[("Content-Type", content_type)], body)
    }

    /// Reads a stream completely from offset 0 (following `Stream-Next-Offset` until
    /// `Stream-Up-To-Date`), returning the bytes and the final next offset.
    pub fn read_all(&self, path: &str) -> (Vec<u8>, u64) {
        read_all(self.addr, path)
    }

    /// The JSON metrics of `/__ursula/metrics`.
    pub fn metrics(&self) -> serde_json::Value {
        let r = self.get("/__ursula/metrics");
        assert_eq!(r.status, 200, "metrics: {}", r.text());
        r.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() && self.child.is_some() {
            eprintln!(
                "---- server log (last lines) ----\n{}\n---- end of server log ----",
                self.log_tail(60)
            );
        }
        self.kill9();
    }
}

/// Reads a stream from offset 0 to its tail with catch-up reads.
pub fn read_all(addr: SocketAddr, path: &str) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut off = 0u64;
    for _ in 0..100_000 {
        let sep = if path.contains('?') { '&' } else { '?' };
        let r = request(
            addr,
            "GET",
            &format!("{path}{sep}offset={}", off20(off)),
            &[],
            b"",
        );
        assert_eq!(
            r.status,
            200,
            "read {path} at {off}: {} {}",
            r.status,
            r.text()
        );
        let next = r.next_offset();
        assert!(next >= off, "next offset went backwards: {off} -> {next}");
        out.extend_from_slice(&r.body);
        let done = r.header("stream-up-to-date") == Some("true");
        if done {
            return (out, next);
        }
        assert!(
            next > off,
            "read at {off} made no progress without being up to date"
        );
        off = next;
    }
    panic!("read_all {path}: too many rounds");
}

/// An offset in its canonical 20-digit form.
pub fn off20(o: u64) -> String {
    format!("{o:020}")
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP client
// ---------------------------------------------------------------------------------------------

/// A parsed HTTP response. Header names are lowercase.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header.
    pub fn headers_all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response ({}) is not JSON: {e}; body {:?}",
                self.status,
                self.text()
            )
        })
    }

    /// `Stream-Next-Offset`, checked to be exactly 20 digits.
    pub fn next_offset(&self) -> u64 {
        let v = self.header("stream-next-offset").unwrap_or_else(|| {
            panic!(
                "no Stream-Next-Offset on {} {:?}",
                self.status, self.headers
            )
        });
        parse_off20(v)
    }

    /// `Stream-Incarnation`, checked to be 32 lowercase hex digits.
    pub fn incarnation(&self) -> String {
        let v = self.header("stream-incarnation").unwrap_or_else(|| {
            panic!(
                "no Stream-Incarnation on {} {:?}",
                self.status, self.headers
            )
        });
        assert!(
            v.len() == 32
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "Stream-Incarnation {v:?} is not 32 lowercase hex digits"
        );
        v.to_owned()
    }

    /// Checks the JSON error body shape and returns the code.
    pub fn error_code(&self) -> String {
        match check_error_body(self) {
            Ok(code) => code,
            Err(e) => panic!("{e}"),
        }
    }

    /// A one-line description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {} headers={:?} body={:?}",
            self.status,
            self.reason,
            self.headers,
            truncate(&self.text(), 300)
        )
    }
}

/// Shortens a string for messages.
pub fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes)", &s[..end], s.len())
}

/// Parses a 20-digit offset, panicking on any other form.
pub fn parse_off20(v: &str) -> u64 {
    assert!(
        v.len() == 20 && v.bytes().all(|b| b.is_ascii_digit()),
        "offset {v:?} is not 20 digits"
    );
    v.parse().expect("20 digits fit u64")
}

/// Validates `{"error":{"code":"...","message":"..."}}`, `Content-Type: application/json`
/// and `X-Content-Type-Options: nosniff`; returns the code.
pub fn check_error_body(r: &Response) -> Result<String, String> {
    let ctx = || r.describe();
    if !(400..=599).contains(&r.status) {
        return Err(format!("not an error status: {}", ctx()));
    }
    let ct = r.header("content-type").unwrap_or("");
    if !ct.to_ascii_lowercase().starts_with("application/json") {
        return Err(format!(
            "error without Content-Type application/json: {}",
            ctx()
        ));
    }
    if r.header("x-content-type-options") != Some("nosniff") {
        return Err(format!(
            "error without X-Content-Type-Options: nosniff: {}",
            ctx()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&r.body)
        .map_err(|e| format!("error body is not JSON ({e}): {}", ctx()))?;
    let err = v
        .get("error")
        .and_then(|e| e.as_object())
        .ok_or_else(|| format!("error body has no \"error\" object: {}", ctx()))?;
    let code = err
        .get("code")
        .and_then(|c| c.as_str())
        .ok_or_else(|| format!("error.code is not a string: {}", ctx()))?;
    let msg = err.get("message").and_then(|c| c.as_str());
    if msg.is_none() {
        return Err(format!("error.message is not a string: {}", ctx()));
    }
    let valid = code.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !valid {
        return Err(format!(
            "error.code {code:?} is not [A-Z][A-Z0-9_]*: {}",
            ctx()
        ));
    }
    Ok(code.to_owned())
}

/// Asserts an error answer with the given status and code.
#[track_caller]
pub fn assert_error(r: &Response, status: u16, code: &str) {
    assert_eq!(
        r.status,
        status,
        "expected {status} {code}, got {}",
        r.describe()
    );
    assert_eq!(r.error_code(), code, "wrong code: {}", r.describe());
}

/// Builds the bytes of a request. `Host` is added unless given; `Content-Length` is added
/// unless a `Content-Length` or `Transfer-Encoding` header is given.
pub fn build_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    let has = |n: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if !has("host") {
        out.extend_from_slice(format!("Host: {addr}\r\n").as_bytes());
    }
    for (k, v) in headers {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if !has("content-length")
        && !has("transfer-encoding")
        && (!body.is_empty() || method != "GET" && method != "HEAD")
    {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// One request on a fresh connection; panics with context on I/O errors.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    try_request(addr, method, path, headers, body, REQUEST_TIMEOUT)
        .unwrap_or_else(|e| panic!("{method} {path} to {addr}: {e}"))
}

/// One request on a fresh connection with a socket timeout.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<Response> {
    let mut c = Conn::open(addr, timeout)?;
    c.send(method, path, headers, body)
}

/// Status, reason phrase and headers (lowercase names) of a response.
pub type Head = (u16, String, Vec<(String, String)>);

/// What [`Conn::wait_closed`] observed.
#[derive(Debug)]
pub enum PeerState {
    /// EOF or reset.
    Closed,
    /// Nothing arrived within the timeout.
    Open,
    /// Bytes arrived.
    Data(Vec<u8>),
}

/// A persistent (keep-alive) HTTP/1.1 connection.
pub struct Conn {
    addr: SocketAddr,
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects with `timeout` as connect, read and write timeout.
    pub fn open(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Conn {
            addr,
            stream,
            reader,
        })
    }

    /// Wraps an already connected stream.
    pub fn from_stream(stream: TcpStream) -> io::Result<Conn> {
        let addr = stream.peer_addr()?;
        let reader = BufReader::new(stream.try_clone()?);
        Ok(Conn {
            addr,
            stream,
            reader,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.stream.set_read_timeout(Some(t))
    }

    /// Sends a request and reads its response.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        let bytes = build_request(self.addr, method, path, headers, body);
        self.write_raw(&bytes)?;
        self.read_response(method == "HEAD")
    }

    /// Writes bytes as they are.
    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Half-closes the sending side.
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.stream.shutdown(Shutdown::Write)
    }

    /// Reads the status line and headers.
    pub fn read_head(&mut self) -> io::Result<Head> {
        let mut total = 0usize;
        let mut line = Vec::new();
        // Skip interim 1xx responses.
        loop {
            line.clear();
            let n = self.reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before a response",
                ));
            }
            let status_line = String::from_utf8_lossy(&line).trim_end().to_owned();
            let mut parts = status_line.splitn(3, ' ');
            let version = parts.next().unwrap_or("");
            if !version.starts_with("HTTP/1.") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {status_line:?}"),
                ));
            }
            let status: u16 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {status_line:?}"),
                )
            })?;
            let reason = parts.next().unwrap_or("").to_owned();
            let mut headers = Vec::new();
            loop {
                line.clear();
                let n = self.reader.read_until(b'\n', &mut line)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside headers",
                    ));
                }
                total += n;
                if total > 1 << 20 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "response header section too large",
                    ));
                }
                let h = String::from_utf8_lossy(&line).trim_end().to_owned();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("bad header line {h:?}"))
                })?;
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            return Ok((status, reason, headers));
        }
    }

    /// Reads a whole response (`head_only` for answers to `HEAD`).
    pub fn read_response(&mut self, head_only: bool) -> io::Result<Response> {
        let (status, reason, headers) = self.read_head()?;
        let mut r = Response {
            status,
            reason,
            headers,
            body: Vec::new(),
        };
        if head_only || status == 204 || status == 304 {
            return Ok(r);
        }
        let chunked = r
            .header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            while let Some(c) = self.read_chunk()? {
                r.body.extend_from_slice(&c);
            }
        } else if let Some(len) = r.header("content-length") {
            let len: usize = len.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad Content-Length {len:?}"),
                )
            })?;
            r.body.resize(len, 0);
            self.reader.read_exact(&mut r.body)?;
        } else {
            self.reader.read_to_end(&mut r.body)?;
        }
        Ok(r)
    }

    /// Reads one chunk of a chunked body; `None` after the last chunk (and trailers).
    pub fn read_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        let n = self.reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a chunked body",
            ));
        }
        let text = String::from_utf8_lossy(&line);
        let size_text = text
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let size = usize::from_str_radix(&size_text, 16).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad chunk size line {text:?}"),
            )
        })?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                line.clear();
                let n = self.reader.read_until(b'\n', &mut line)?;
                if n == 0 || line == b"\r\n" || line == b"\n" {
                    return Ok(None);
                }
            }
        }
        let mut data = vec![0u8; size];
        self.reader.read_exact(&mut data)?;
        let mut crlf = [0u8; 2];
        self.reader.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "chunk not followed by CRLF",
            ));
        }
        Ok(Some(data))
    }

    /// Reads with the given timeout to learn whether the peer closed the connection.
    pub fn wait_closed(&mut self, timeout: Duration) -> io::Result<PeerState> {
        self.stream.set_read_timeout(Some(timeout))?;
        let mut buf = [0u8; 4096];
        match self.reader.read(&mut buf) {
            Ok(0) => Ok(PeerState::Closed),
            Ok(n) => Ok(PeerState::Data(buf[..n].to_vec())),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(PeerState::Open)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                ) =>
            {
                Ok(PeerState::Closed)
            }
            Err(e) => Err(e),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Server-Sent Events
// ---------------------------------------------------------------------------------------------

/// One SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

impl SseEvent {
    pub fn control(&self) -> serde_json::Value {
        assert_eq!(self.event, "control", "not a control event: {self:?}");
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("control data is not JSON ({e}): {self:?}"))
    }
}

/// An open SSE response, read event by event.
pub struct SseStream {
    conn: Conn,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    chunked: bool,
    buf: Vec<u8>,
    ended: bool,
    pub raw: Vec<u8>,
}

impl SseStream {
    /// Opens `GET path` and reads the response head.
    pub fn open(addr: SocketAddr, path: &str) -> io::Result<SseStream> {
        Self::open_with(addr, path, &[])
    }

    /// [`SseStream::open`] with extra request headers.
    pub fn open_with(
        addr: SocketAddr,
        path: &str,
        extra: &[(&str, &str)],
    ) -> io::Result<SseStream> {
        let mut conn = Conn::open(addr, REQUEST_TIMEOUT)?;
        let mut headers = vec![("Accept", "text/event-stream")];
        headers.extend_from_slice(extra);
        let req = build_request(addr, "GET", path, &headers, b"");
        conn.write_raw(&req)?;
        let (status, _reason, headers) = conn.read_head()?;
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        Ok(SseStream {
            conn,
            status,
            headers,
            chunked,
            buf: Vec::new(),
            ended: false,
            raw: Vec::new(),
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn fill(&mut self, deadline: Instant) -> io::Result<bool> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "SSE deadline passed",
            ));
        }
        self.conn.set_read_timeout(left)?;
        if self.chunked {
            match self.conn.read_chunk()? {
                Some(c) => {
                    self.raw.extend_from_slice(&c);
                    self.buf.extend_from_slice(&c);
                    Ok(true)
                }
                None => Ok(false),
            }
        } else {
            let mut b = [0u8; 8192];
            let n = self.conn.reader.read(&mut b)?;
            self.raw.extend_from_slice(&b[..n]);
            self.buf.extend_from_slice(&b[..n]);
            Ok(n > 0)
        }
    }

    /// Reads until the unread body holds `needle` (`Ok(true)`), or the response ends
    /// (`Ok(false)`); an error on timeout. Comments (`:` lines) are kept in the unread body
    /// until [`Self::next_event`] passes them.
    pub fn wait_for(&mut self, needle: &[u8], deadline: Instant) -> io::Result<bool> {
        loop {
            if self.buf.windows(needle.len()).any(|w| w == needle) {
                return Ok(true);
            }
            if self.ended || !self.fill(deadline)? {
                self.ended = true;
                return Ok(false);
            }
        }
    }

    /// The next event, `Ok(None)` when the response has ended; an error on timeout.
    pub fn next_event(&mut self, deadline: Instant) -> io::Result<Option<SseEvent>> {
        loop {
            // Normalize CRLF line ends that a server may use.
            if let Some(pos) = find_event_end(&self.buf) {
                let (block, sep) = pos;
                let raw: Vec<u8> = self.buf.drain(..block + sep).collect();
                let text = String::from_utf8_lossy(&raw[..block]).replace("\r\n", "\n");
                let mut event = String::from("message");
                let mut data: Vec<String> = Vec::new();
                let mut any = false;
                for line in text.split('\n') {
                    if line.is_empty() || line.starts_with(':') {
                        continue;
                    }
                    any = true;
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "event" => event = value.to_owned(),
                        "data" => data.push(value.to_owned()),
                        _ => {}
                    }
                }
                if !any {
                    continue; // a comment-only block (keep-alive)
                }
                return Ok(Some(SseEvent {
                    event,
                    data: data.join("\n"),
                }));
            }
            if self.ended {
                return Ok(None);
            }
            if !self.fill(deadline)? {
                self.ended = true;
            }
        }
    }
}

/// Position and separator length of the first blank line in an SSE buffer.
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    for i in 0..b.len() {
        if b[i..].starts_with(b"\n\n") {
            return Some((i, 2));
        }
        if b[i..].starts_with(b"\r\n\r\n") {
            return Some((i, 4));
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Deterministic PRNG (no dependency)
// ---------------------------------------------------------------------------------------------

/// The seed of a randomized crash test: `URSULA_CRASH_SEED` when set, else the clock. It is
/// printed, so a failure can be repeated.
pub fn crash_seed(test: &str) -> u64 {
    let seed = std::env::var("URSULA_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("{test} seed: {seed} (repeat with URSULA_CRASH_SEED={seed})");
    seed
}

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Regular files below `dir`, at any depth (0 if it does not exist).
pub fn files_below(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.path().is_dir() {
                files_below(&e.path())
            } else {
                1
            }
        })
        .sum()
}
