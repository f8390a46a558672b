//! ursula-bench: the load generator behind every Ursula performance claim.
//! See docs/benchmarks.md for the method and the exact commands.

mod cli;
mod client;
mod compare;
mod floor;
mod payload;
mod procfs;
mod report;
mod scenarios;
mod smoke;
mod sse;
mod stalls;
mod stats;
mod target;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use cli::{Cli, Command};
use client::Endpoint;
use report::{json_line, note};
use scenarios::{append, cold_soak, create, fanout, idle, longpoll, mixed, read};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => code,
        Err(e) => {
            note(&format!("ursula-bench: error: {e:#}"));
            ExitCode::from(2)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode> {
    if let Command::Compare(args) = &cli.command {
        // Compare only orchestrates processes; the load runs in children.
        return compare::run(&cli.target, args, cli.quiet);
    }
    let threads = cli
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
    .context("building the tokio runtime")?;
    if let Command::Smoke(args) = &cli.command
        && let Some(kind) = args.spawn
    {
        return smoke_spawned(&rt, &cli, args, kind);
    }
    rt.block_on(async_main(cli))
}

/// `smoke --spawn KIND`: start the server, smoke it, stop it.
fn smoke_spawned(
    rt: &tokio::runtime::Runtime,
    cli: &Cli,
    args: &cli::SmokeArgs,
    kind: cli::ServerKind,
) -> Result<ExitCode> {
    let env = compare::servers::Env::new(&args.paths, None)?;
    if let Err(why) = compare::servers::availability(kind, &env) {
        anyhow::bail!("cannot spawn {}: {why}", kind.name());
    }
    let server = compare::servers::start(kind, &env, None)?;
    note(&format!(
        "spawned {} at {} (pid {})",
        kind.name(),
        server.url(),
        server.pid
    ));
    let mut target = cli.target.clone();
    target.url = server.url();
    if let Some(layout) = server.layout {
        target.layout = layout;
    }
    let mut smoke_args = args.clone();
    smoke_args.server_pid = Some(server.pid);
    let result = rt.block_on(async {
        let ep = Endpoint::resolve(target.target()?).await?;
        Box::pin(smoke::run(ep, &smoke_args, cli.quiet)).await
    });
    let log = server.log_tail();
    server.stop()?;
    match result {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => {
            note(&format!("server log tail:\n{log}"));
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.context(format!("server log tail:\n{log}"))),
    }
}

async fn async_main(cli: Cli) -> Result<ExitCode> {
    let quiet = cli.quiet;
    if let Command::Floor(args) = &cli.command {
        floor::serve(args.listen).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let ep = Endpoint::resolve(cli.target.target()?).await?;
    macro_rules! emit {
        ($rep:expr) => {{
            let rep = $rep;
            json_line(&rep)?;
            if !quiet {
                note(&rep.table());
            }
        }};
    }
    match &cli.command {
        Command::Append(a) => emit!(append::run(ep, a).await?),
        Command::Read(a) => emit!(read::run(ep, a).await?),
        Command::Fanout(a) => emit!(fanout::run(ep, a).await?),
        Command::Longpoll(a) => emit!(longpoll::run(ep, a).await?),
        Command::Idle(a) => emit!(idle::run(ep, a).await?),
        Command::Create(a) => emit!(create::run(ep, a).await?),
        Command::Mixed(a) => emit!(Box::pin(mixed::run(ep, a)).await?),
        Command::ColdSoak(a) => {
            let rep = cold_soak::run(ep, a, quiet).await?;
            let ok = rep.problems().is_empty();
            emit!(rep);
            if !ok {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Smoke(a) => {
            if !Box::pin(smoke::run(ep, a, quiet)).await? {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Floor(_) | Command::Compare(_) => {}
    }
    Ok(ExitCode::SUCCESS)
}
