//! `cargo xtask`: the project's chores, written in Rust so that they run wherever cargo
//! does (the alias lives in `.cargo/config.toml`).
//!
//! One module per command, a struct per command with `fn run(self, ws)`. Commands are
//! built as argument lists with [`std::process::Command`], never through a shell string,
//! and every command that writes outside cargo's own folders takes `--dry-run`.

mod bundle;
mod cmd;
mod demo;
mod install_nvcc;
mod test;

use clap::{Parser, Subcommand};

use crate::cmd::Workspace;

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let ws = Workspace::locate();
    match cli.command {
        Command::InstallNvcc(c) => c.run(&ws),
        Command::Test(c) => c.run(&ws),
        Command::Demo(c) => c.run(&ws),
        Command::Bundle(c) => c.run(&ws),
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
