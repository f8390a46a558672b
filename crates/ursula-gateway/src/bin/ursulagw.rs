//! `ursulagw`: the gateway on its own (the same as `ursula gateway`).

use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "Ursula's gateway: one front door for a cluster (cluster.md §12)"
)]
struct Cli {
    #[command(flatten)]
    args: ursula_gateway::GatewayArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    ursula_gateway::init_tracing();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(ursula_gateway::main(cli.args))
}
