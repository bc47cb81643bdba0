//! `retryctl`: the operator CLI (a thin binary over the `retryctl` library).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = retryctl::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("retryctl: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout().lock();
    match runtime.block_on(retryctl::run(cli, &mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("retryctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
