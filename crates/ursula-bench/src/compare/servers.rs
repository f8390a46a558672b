//! Starting, readiness-polling and stopping the servers under comparison,
//! and running the load generator as a pinned child process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tempfile::TempDir;

use super::peers;
use crate::cli::{ServerKind, ServerPaths};
use crate::target::Layout;

/// Everything needed to launch servers and generators.
#[derive(Debug, Clone)]
pub struct Env {
    pub self_exe: PathBuf,
    pub ursula_bin: PathBuf,
    pub bench_dir: PathBuf,
    pub peers_dir: PathBuf,
    pub ursula_old_bin: Option<PathBuf>,
    pub node: String,
    pub ready_timeout: Duration,
    /// (server cpus, generator cpus) for `taskset -c`, when pinning.
    pub pin: Option<(String, String)>,
}

impl Env {
    pub fn new(paths: &ServerPaths, pin: Option<(String, String)>) -> Result<Self> {
        let bench_dir = resolve_path(paths.bench_dir.as_deref().unwrap_or(Path::new("bench")));
        Ok(Self {
            self_exe: std::env::current_exe().context("locating ursula-bench")?,
            ursula_bin: resolve_path(&paths.ursula_bin),
            peers_dir: paths
                .peers_dir
                .as_deref()
                .map_or_else(|| bench_dir.join("peers"), resolve_path),
            ursula_old_bin: paths.ursula_old_bin.as_deref().map(resolve_path),
            bench_dir,
            node: paths.node.clone(),
            ready_timeout: paths.ready_timeout,
            pin,
        })
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Relative paths are tried from the current directory, then from the
/// workspace root, so `cargo run` works from anywhere in the checkout.
fn resolve_path(p: &Path) -> PathBuf {
    for c in [p.to_path_buf(), workspace_root().join(p)] {
        if c.exists() {
            return c.canonicalize().unwrap_or(c);
        }
    }
    p.to_path_buf()
}

/// CPU lists for server and generator, if `taskset` exists and there are
/// at least two CPUs to split.
pub fn pin_plan() -> Option<(String, String)> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 || !command_works("taskset", &["--version"]) {
        return None;
    }
    let half = cpus / 2;
    let range = |a: usize, b: usize| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        }
    };
    Some((range(0, half - 1), range(half, cpus - 1)))
}

fn command_works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run a short command with a deadline; returns stdout+stderr.
fn capture(program: &Path, args: &[&str], limit: Duration) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path)?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("running {}", program.display()))?;
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} {:?} did not finish in {limit:?}",
                program.display(),
                args
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(std::fs::read_to_string(out_path).unwrap_or_default())
}

/// Why a server cannot take part, or Ok if it can.
pub fn availability(kind: ServerKind, env: &Env) -> std::result::Result<(), String> {
    match kind {
        ServerKind::Floor => Ok(()),
        ServerKind::DsRust => peers::check_installed(
            &peers::ds_rust_bin(&env.peers_dir),
            peers::DS_RUST_VERSION,
            "ds-rust",
        ),
        ServerKind::UrsulaTonbo => peers::check_installed(
            &peers::ursula_tonbo_bin(&env.peers_dir),
            peers::URSULA_TONBO_VERSION,
            "ursula-tonbo",
        ),
        ServerKind::UrsulaOld => match &env.ursula_old_bin {
            None => Err("no --ursula-old-bin given".to_owned()),
            Some(b) if !b.is_file() => Err(format!("{} not found", b.display())),
            Some(_) => Ok(()),
        },
        ServerKind::Ursula | ServerKind::UrsulaMemory => {
            if !env.ursula_bin.is_file() {
                return Err(format!(
                    "{} not found (cargo build --release -p ursula-server)",
                    env.ursula_bin.display()
                ));
            }
            if kind == ServerKind::UrsulaMemory {
                let help = capture(
                    &env.ursula_bin,
                    &["server", "--help"],
                    Duration::from_secs(10),
                )
                .map_err(|e| format!("{e:#}"))?;
                if !help.contains("--memory") {
                    return Err("`ursula server --help` lists no --memory flag".to_owned());
                }
            }
            Ok(())
        }
        ServerKind::RefFile | ServerKind::RefMemory => {
            let pkg = env.bench_dir.join("node_modules/@durable-streams/server");
            if !pkg.is_dir() {
                return Err(format!(
                    "{} missing (run `npm ci` in {})",
                    pkg.display(),
                    env.bench_dir.display()
                ));
            }
            if !env.bench_dir.join("reference-server.mjs").is_file() {
                return Err("bench/reference-server.mjs missing".to_owned());
            }
            if !command_works(&env.node, &["--version"]) {
                return Err(format!("{} not runnable", env.node));
            }
            Ok(())
        }
    }
}

/// A free loopback port (the listener is dropped right away).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub struct Running {
    pub port: u16,
    pub pid: u32,
    /// The URL layout this server needs, when it differs from the default.
    pub layout: Option<Layout>,
    child: Child,
    dir: TempDir,
}

impl Running {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGTERM, then SIGKILL if it has not exited within 5 s.
    pub fn stop(mut self) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.pid.to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.child.try_wait()?.is_none() {
                if Instant::now() >= deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }
}

/// Start a server with a fresh temporary directory and wait until it
/// answers HTTP (polling; never a fixed sleep). `ursula_config` is TOML that
/// `ursula` (not `ursula-old`, which may not know the keys) is started with.
pub fn start(kind: ServerKind, env: &Env, ursula_config: Option<&str>) -> Result<Running> {
    let dir = tempfile::Builder::new().prefix("ursula-bench-").tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir(&data)?;
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let (program, args): (PathBuf, Vec<String>) = match kind {
        ServerKind::Floor => (
            env.self_exe.clone(),
            vec!["floor".into(), "--listen".into(), listen],
        ),
        ServerKind::Ursula | ServerKind::UrsulaOld => {
            let bin = match (kind, &env.ursula_old_bin) {
                (ServerKind::UrsulaOld, Some(b)) => b.clone(),
                _ => env.ursula_bin.clone(),
            };
            let mut a = vec![
                "server".into(),
                "--listen".into(),
                listen,
                "--data-dir".into(),
                data.display().to_string(),
            ];
            if kind == ServerKind::Ursula
                && let Some(toml) = ursula_config
            {
                let path = dir.path().join("ursula.toml");
                std::fs::write(&path, toml)?;
                a.extend(["--config".into(), path.display().to_string()]);
            }
            (bin, a)
        }
        ServerKind::DsRust => (
            peers::ds_rust_bin(&env.peers_dir),
            peers::ds_rust_args(port, &data),
        ),
        ServerKind::UrsulaTonbo => {
            let path = dir.path().join("ursula.toml");
            std::fs::write(&path, peers::ursula_tonbo_config(port, free_port()?, &data))?;
            (
                peers::ursula_tonbo_bin(&env.peers_dir),
                vec![
                    "server".into(),
                    "--config".into(),
                    path.display().to_string(),
                ],
            )
        }
        ServerKind::UrsulaMemory => (
            env.ursula_bin.clone(),
            vec![
                "server".into(),
                "--listen".into(),
                listen,
                "--memory".into(),
            ],
        ),
        ServerKind::RefFile | ServerKind::RefMemory => {
            let mut a = vec![
                env.bench_dir
                    .join("reference-server.mjs")
                    .display()
                    .to_string(),
                "--port".into(),
                port.to_string(),
            ];
            if kind == ServerKind::RefFile {
                a.extend(["--data-dir".into(), data.display().to_string()]);
            } else {
                a.push("--memory".into());
            }
            (PathBuf::from(&env.node), a)
        }
    };
    let log = std::fs::File::create(dir.path().join("server.log"))?;
    let mut cmd = match &env.pin {
        Some((server_cpus, _)) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(server_cpus).arg(&program);
            c
        }
        None => Command::new(&program),
    };
    cmd.args(&args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    // taskset execs the program, so the pid is the server's own.
    let pid = child.id();
    let mut running = Running {
        port,
        pid,
        layout: (kind == ServerKind::UrsulaTonbo).then_some(peers::URSULA_TONBO_LAYOUT),
        child,
        dir,
    };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + env.ready_timeout;
    loop {
        if let Some(status) = running.child.try_wait()? {
            bail!(
                "{} exited during start-up ({status}); log:\n{}",
                kind.name(),
                running.log_tail()
            );
        }
        if answers_http(addr) {
            if kind == ServerKind::UrsulaTonbo {
                let left = deadline.saturating_duration_since(Instant::now());
                if let Err(e) = peers::create_bucket(port, "bench", left) {
                    let tail = running.log_tail();
                    let _ = running.stop();
                    bail!("{}: {e:#}; log:\n{tail}", kind.name());
                }
            }
            return Ok(running);
        }
        if Instant::now() >= deadline {
            let tail = running.log_tail();
            let _ = running.stop();
            bail!(
                "{} not answering HTTP on {addr} after {:?}; log:\n{tail}",
                kind.name(),
                env.ready_timeout
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The status of one bodiless request to 127.0.0.1:`port`, or None.
pub fn http_status(port: u16, method: &str, path: &str) -> Option<u16> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut buf = [0u8; 12];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    let line = std::str::from_utf8(&buf[..got]).ok()?;
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}

/// True if something on `addr` answers an HTTP request with a status line.
fn answers_http(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    buf[..got].starts_with(b"HTTP/1.")
}

/// Run the load generator (this binary) pinned to the generator CPUs, with
/// a hard deadline; returns its stdout.
pub fn run_generator(env: &Env, args: &[String], limit: Duration) -> Result<String> {
    let dir = tempfile::tempdir()?;
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut cmd = match &env.pin {
        Some((_, gen_cpus)) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(gen_cpus).arg(&env.self_exe);
            c
        }
        None => Command::new(&env.self_exe),
    };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .context("starting the load generator")?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("load generator did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        bail!("load generator failed ({status}):\n{stderr}");
    }
    Ok(stdout)
}
