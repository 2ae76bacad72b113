//! The `cargo xtask` binary: parses the command line and runs the command (the commands
//! live in the library, one module each).

use clap::{Parser, Subcommand};

use xtask::cmd::Workspace;
use xtask::{bundle, demo, deploy, install_nvcc, plan, test};

/// Chores of the stepgraph workspace.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    InstallNvcc(install_nvcc::InstallNvcc),
    Test(test::Test),
    Demo(demo::Demo),
    Bundle(bundle::Bundle),
    // Boxed: its many options would make every variant as large. With no subcommand it
    // deploys, so its own options are required only then.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Deploy(Box<deploy::Deploy>),
    Plan(plan::Plan),
    RenderProfile(plan::RenderProfile),
}

/// Runs the command; on failure prints its error, each cause once (`{:#}`: never a
/// backtrace, which `RUST_BACKTRACE=1`, set on many machines, would add to every
/// message), and exits 1, or with the shells' status for a signal it handled (130 for
/// Ctrl-C, 143 for SIGTERM).
fn main() {
    let cli = Cli::parse();
    let ws = Workspace::locate();
    if let Err(e) = run(cli, &ws) {
        eprintln!("error: {e:#}");
        let status = xtask::interrupt::requested().map_or(1, xtask::interrupt::exit_status);
        std::process::exit(status);
    }
}

fn run(cli: Cli, ws: &Workspace) -> anyhow::Result<()> {
    match cli.command {
        Command::InstallNvcc(c) => c.run(ws),
        Command::Test(c) => c.run(ws),
        Command::Demo(c) => c.run(ws),
        Command::Bundle(c) => c.run(ws),
        Command::Deploy(c) => (*c).run(ws),
        Command::Plan(c) => c.run(ws),
        Command::RenderProfile(c) => c.run(ws),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn args_after_double_dash_reach_the_command() {
        let cli = Cli::try_parse_from(["xtask", "test", "--", "-p", "xtask", "--", "--nocapture"])
            .unwrap();
        let Command::Test(t) = cli.command else {
            panic!("parsed {cli:?}")
        };
        assert_eq!(t.args, ["-p", "xtask", "--", "--nocapture"]);
    }
}
