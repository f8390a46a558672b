//! `ursulactl`, the operator CLI of an Ursula cluster (cluster.md §10): it manages the
//! logical state of running nodes over their metrics and admin HTTP APIs and never runs
//! anything on a host.
//!
//! The binary is `src/main.rs`; [`run_blocking`] runs one command line in-process (what the
//! binary and the integration tests call). Exit codes: `0` success, `2` safety abort (a gate
//! that did not open in time, no safe target, nodes disagreeing), `1` anything else (bad
//! manifest or arguments, a node's refusal, transport errors) with a single greppable line
//! on stderr starting `ursulactl: error:`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub mod catchup;
pub mod client;
mod leadership;
pub mod manifest;
mod rejoin;
pub mod restart;
mod status;
pub mod view;

/// Exit code of a safety abort.
pub const EXIT_SAFETY: i32 = 2;
/// Exit code of every other failure.
pub const EXIT_ERROR: i32 = 1;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "ursulactl",
    version,
    about = "Operate an Ursula cluster over its admin and metrics APIs"
)]
pub struct Cli {
    /// Cluster manifest: `nodes[]` with `id`, `admin_url` or `host` (+ `admin_port`, default
    /// 4438), and optional `http_url` (client plane, for metrics). `.toml` or `.json`; `-` reads
    /// stdin.
    #[arg(long, global = true, env = "URSULACTL_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub verb: Verb,
}

/// The verbs (cluster.md §10).
#[derive(Debug, Subcommand)]
pub enum Verb {
    /// Per node: groups hosted, groups led, groups without a leader; unreachable nodes are
    /// reported, not fatal.
    Status {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Wait until every node reports the expected group count and every group has a leader.
    WaitReady {
        #[arg(long)]
        expected_groups: u64,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Move the leadership of one group to a voter.
    TransferLeader {
        #[arg(long)]
        group: u32,
        #[arg(long)]
        to: u64,
    },
    /// Mark a node for maintenance and move every leadership away from it (waits up to
    /// `--timeout-secs`; exit 2 if it still leads a group then).
    Drain {
        #[arg(long)]
        node: u64,
        #[arg(long, default_value_t = 60)]
        timeout_secs: u64,
        /// Print the transfers it would make, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Clear a node's maintenance mark.
    Undrain {
        #[arg(long)]
        node: u64,
    },
    /// Ask the group's leader to let a wiped node take part in the group again (one shot).
    AllowNextRevert {
        #[arg(long)]
        group: u32,
        #[arg(long)]
        node: u64,
    },
    /// `allow-next-revert` for every group the wiped node awaits permission in.
    AllowRejoin {
        #[arg(long)]
        node: u64,
    },
    /// Before the platform restarts a (drained) node: a disk WAL needs nothing, a memory WAL
    /// gets one empty-log rejoin armed per group. Exit 2 if the nodes do not all answer with
    /// the same `wal_backend`.
    PrepareRestart {
        #[arg(long)]
        node: u64,
    },
    /// Wait until a node is a voter of every group and within `--lag-tolerance` entries of
    /// each leader. Exit 2 if it makes no progress for `--stall-timeout-secs`, or after
    /// `--max-wait-secs` in any case.
    Wait {
        #[arg(long)]
        node: u64,
        #[arg(long, default_value_t = 16)]
        lag_tolerance: u64,
        #[arg(long, default_value_t = 90)]
        stall_timeout_secs: u64,
        #[arg(long, default_value_t = 1800)]
        max_wait_secs: u64,
    },
    /// Check that every node of the manifest is a voter of every group and caught up, in two
    /// consecutive samples (retried for up to `--timeout-secs`; exit 2 otherwise).
    VerifyCluster {
        #[arg(long, default_value_t = 16)]
        lag_tolerance: u64,
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
}

/// Why a command failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    pub safety: bool,
    pub message: String,
}

impl CtlError {
    /// A configuration, argument, refusal or transport error (exit 1).
    pub fn config(message: impl Into<String>) -> Self {
        CtlError {
            safety: false,
            message: one_line(message.into()),
        }
    }

    /// A safety abort (exit 2).
    pub fn safety(message: impl Into<String>) -> Self {
        CtlError {
            safety: true,
            message: one_line(message.into()),
        }
    }

    pub fn exit_code(&self) -> i32 {
        if self.safety { EXIT_SAFETY } else { EXIT_ERROR }
    }

    /// The single stderr line.
    pub fn line(&self) -> String {
        let kind = if self.safety { "safety abort" } else { "error" };
        format!("ursulactl: {kind}: {}", self.message)
    }
}

fn one_line(s: String) -> String {
    s.replace(['\n', '\r'], " ")
}

/// Where a command's report goes: stdout as it happens, or a buffer (tests).
pub struct Out {
    buf: Option<String>,
}

impl Out {
    pub fn stdout() -> Self {
        Out { buf: None }
    }

    pub fn buffer() -> Self {
        Out {
            buf: Some(String::new()),
        }
    }

    /// Writes one line.
    pub fn line(&mut self, s: impl AsRef<str>) {
        match &mut self.buf {
            Some(b) => {
                b.push_str(s.as_ref());
                b.push('\n');
            }
            None => {
                use std::io::Write;
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{}", s.as_ref());
                let _ = o.flush();
            }
        }
    }

    /// What was written to a buffer.
    pub fn into_text(self) -> String {
        self.buf.unwrap_or_default()
    }
}

/// Runs one parsed command.
pub async fn run(cli: Cli, out: &mut Out) -> Result<(), CtlError> {
    let path = cli
        .config
        .ok_or_else(|| CtlError::config("--config PATH (the cluster manifest) is required"))?;
    let manifest = manifest::Manifest::load(&path)?;
    let client = client::Client::default();
    let ctx = Ctx { manifest, client };
    match cli.verb {
        Verb::Status { json } => status::status(&ctx, json, out).await,
        Verb::WaitReady {
            expected_groups,
            timeout_secs,
        } => status::wait_ready(&ctx, expected_groups, timeout_secs, out).await,
        Verb::TransferLeader { group, to } => leadership::transfer(&ctx, group, to, out).await,
        Verb::Drain {
            node,
            timeout_secs,
            dry_run,
        } => leadership::drain(&ctx, node, timeout_secs, dry_run, out).await,
        Verb::Undrain { node } => leadership::undrain(&ctx, node, out).await,
        Verb::AllowNextRevert { group, node } => {
            rejoin::allow_next_revert(&ctx, group, node, out).await
        }
        Verb::AllowRejoin { node } => rejoin::allow_rejoin(&ctx, node, out).await,
        Verb::PrepareRestart { node } => restart::prepare_restart(&ctx, node, out).await,
        Verb::Wait {
            node,
            lag_tolerance,
            stall_timeout_secs,
            max_wait_secs,
        } => {
            catchup::wait(
                &ctx,
                node,
                lag_tolerance,
                stall_timeout_secs,
                max_wait_secs,
                out,
            )
            .await
        }
        Verb::VerifyCluster {
            lag_tolerance,
            timeout_secs,
        } => catchup::verify_cluster(&ctx, lag_tolerance, timeout_secs, out).await,
    }
}

/// What every verb works with.
pub(crate) struct Ctx {
    pub manifest: manifest::Manifest,
    pub client: client::Client,
}

/// The outcome of [`run_blocking`].
#[derive(Debug, Clone)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    /// The error line, if any.
    pub stderr: String,
}

/// Parses `args` (the first is the program name) and runs the command on a fresh runtime,
/// collecting its output. `--help` / `--version` print to `stdout` with code 0; an argument
/// error is code 1.
pub fn run_blocking<I, T>(args: I) -> Outcome
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => return usage_outcome(&e),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Outcome {
                code: EXIT_ERROR,
                stdout: String::new(),
                stderr: CtlError::config(format!("starting the runtime: {e}")).line(),
            };
        }
    };
    let mut out = Out::buffer();
    let res = rt.block_on(run(cli, &mut out));
    let stdout = out.into_text();
    match res {
        Ok(()) => Outcome {
            code: 0,
            stdout,
            stderr: String::new(),
        },
        Err(e) => Outcome {
            code: e.exit_code(),
            stdout,
            stderr: e.line(),
        },
    }
}

/// Help and version are successes; any other clap error is exit 1 with one line.
pub fn usage_outcome(e: &clap::Error) -> Outcome {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Outcome {
            code: 0,
            stdout: e.to_string(),
            stderr: String::new(),
        },
        _ => {
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            Outcome {
                code: EXIT_ERROR,
                stdout: String::new(),
                stderr: CtlError::config(format!("{first} (see ursulactl --help)")).line(),
            }
        }
    }
}
