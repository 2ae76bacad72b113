//! The `cargo xtask` binary: parses the command line and runs the command (the commands
//! live in the library, one module each).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use stepgraph_deploy::{Bundle, Deploy, Project, Workspace};

use xtask::{demo, install_nvcc, plan, test};

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
    Bundle(Bundle),
    // Boxed: its many options would make every variant as large. With no subcommand it
    // deploys, so its own options are required only then.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Deploy(Box<Deploy>),
    Plan(plan::Plan),
    RenderProfile(plan::RenderProfile),
}

/// Runs the command; on failure prints its error, each cause once, and exits 1, or with
/// the shells' status for a signal it handled (130 for Ctrl-C, 143 for SIGTERM): see
/// [`stepgraph_deploy::exit_code`].
fn main() -> ExitCode {
    let ws = xtask::workspace();
    let project = xtask::project::project(&ws);
    let cli = parse(&project, std::env::args_os());
    stepgraph_deploy::exit_code(run(cli, &project, &ws))
}

/// The command line, with the project's defaults (the program, the deploy folder).
fn parse(project: &Project, args: impl IntoIterator<Item = std::ffi::OsString>) -> Cli {
    let matches = project.set_defaults(Cli::command()).get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn run(cli: Cli, project: &Project, ws: &Workspace) -> anyhow::Result<()> {
    match cli.command {
        Command::InstallNvcc(c) => c.run(ws),
        Command::Test(c) => c.run(ws),
        Command::Demo(c) => c.run(ws),
        Command::Bundle(c) => c.run(project, ws),
        Command::Deploy(c) => (*c).run(project, ws),
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

    #[test]
    fn bundle_and_deploy_take_this_workspace_s_defaults() {
        let project = xtask::project::project(&xtask::workspace());
        let cli = parse(&project, ["xtask", "deploy", "--host", "h"].map(Into::into));
        let Command::Deploy(d) = cli.command else {
            panic!("parsed {cli:?}")
        };
        assert_eq!(d.ship.host.dir, "stepgraph");
        assert_eq!(d.ship.bundle.example.as_deref(), Some("cartpole"));
        let cli = parse(&project, ["xtask", "bundle", "--gpu-tests"].map(Into::into));
        let Command::Bundle(b) = cli.command else {
            panic!("parsed {cli:?}")
        };
        assert!(b.gpu_tests);
    }
}
