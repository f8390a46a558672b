//! `ursulactl`: see the library docs (`ursula_ctl`) and docs/cluster.md.

use clap::Parser;
use ursula_ctl::{Cli, Out, usage_outcome};

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let o = usage_outcome(&e);
            let mut out = Out::stdout();
            if !o.stdout.is_empty() {
                out.line(o.stdout.trim_end());
            }
            if !o.stderr.is_empty() {
                eprintln!("{}", o.stderr);
            }
            std::process::exit(o.code);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ursulactl: error: starting the runtime: {e}");
            std::process::exit(ursula_ctl::EXIT_ERROR);
        }
    };
    let mut out = Out::stdout();
    if let Err(e) = rt.block_on(ursula_ctl::run(cli, &mut out)) {
        eprintln!("{}", e.line());
        std::process::exit(e.exit_code());
    }
}
