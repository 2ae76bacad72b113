//! The command line: `bundle` and `deploy` for one [`Project`], as a program of its own
//! ([`Cli`]) or inside another `clap` parser ([`Command`], [`Project::set_defaults`]).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::bundle::Bundle;
use crate::cmd::Workspace;
use crate::deploy::Deploy;
use crate::interrupt;
use crate::project::Project;

/// A workspace's `cargo xtask` with the commands `bundle` and `deploy` for `project`.
///
/// ```no_run
/// use stepgraph_deploy::{Cli, Project};
///
/// fn main() -> std::process::ExitCode {
///     Cli::new(Project::new("trainer").data("configs/")).run()
/// }
/// ```
#[derive(Debug)]
pub struct Cli {
    project: Project,
}

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

/// The commands, for a `clap` parser of one's own: a variant of its subcommand enum
/// holding a `Command` (with `#[command(flatten)]`), or the two commands' own variants.
/// Call [`Project::set_defaults`] on the parser's `clap::Command` before parsing.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Builds a program of the workspace (or its GPU tests) in release mode into a
    /// bundle folder for the GPU host.
    Bundle(Bundle),
    /// Ships a bundle to a GPU host over ssh, checks it there, runs it and fetches its
    /// results; its subcommands look after the releases the host holds.
    // Boxed: its many options would make every variant as large. With no subcommand it
    // deploys, so its own options are required only then.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Deploy(Box<Deploy>),
}

impl Command {
    /// Runs the command for `project`, whose workspace is `ws`.
    pub fn run(self, project: &Project, ws: &Workspace) -> anyhow::Result<()> {
        match self {
            Command::Bundle(c) => c.run(project, ws),
            Command::Deploy(c) => (*c).run(project, ws),
        }
    }
}

impl Cli {
    /// The command line for `project`.
    pub fn new(project: Project) -> Cli {
        Cli { project }
    }

    /// Parses this process's arguments and runs the command; see [`Cli::run_from`].
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// Parses `args` (the program's name first) and runs the command. A bad command line
    /// exits as clap does (status 2, after its usage message); a failure prints its
    /// error and gives the status [`exit_code`] gives.
    pub fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let matches = self
            .project
            .set_defaults(Args::command())
            .get_matches_from(args);
        let parsed = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let result = self
            .project
            .workspace()
            .and_then(|ws| parsed.command.run(&self.project, &ws));
        exit_code(result)
    }
}

/// The end of a command: on failure prints its error, each cause once (`{:#}`: never a
/// backtrace, which `RUST_BACKTRACE=1`, set on many machines, would add to every
/// message), and gives 1, or the shells' status for a signal the command stopped on (130
/// for Ctrl-C, 143 for SIGTERM).
pub fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            let status = interrupt::requested().map_or(1, interrupt::exit_status);
            ExitCode::from(u8::try_from(status).unwrap_or(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn the_project_gives_the_defaults_and_args_reach_the_job() {
        let project = Project::new("trainer").remote_dir("runs");
        let parse = |args: &[&str]| {
            let m = project
                .set_defaults(Args::command())
                .try_get_matches_from(args)
                .unwrap();
            Args::from_arg_matches(&m).unwrap().command
        };
        let Command::Bundle(b) = parse(&["x", "bundle"]) else {
            panic!("not a bundle")
        };
        assert_eq!(b.example.as_deref(), Some("trainer"));
        let Command::Deploy(d) = parse(&["x", "deploy", "--host", "h", "--", "--steps", "3"])
        else {
            panic!("not a deploy")
        };
        assert_eq!(d.ship.host.dir, "runs");
        assert_eq!(d.ship.bundle.example.as_deref(), Some("trainer"));
        assert_eq!(d.ship.job.args, ["--steps", "3"]);
        let Command::Deploy(d) = parse(&["x", "deploy", "--host", "h", "--example", "eval"]) else {
            panic!("not a deploy")
        };
        assert_eq!(d.ship.bundle.example.as_deref(), Some("eval"));
        // The defaults reach the subcommands too.
        let m = project
            .set_defaults(Args::command())
            .try_get_matches_from(["x", "deploy", "status", "--host", "h"])
            .unwrap();
        let (_, deploy) = m.subcommand().unwrap();
        let (_, status) = deploy.subcommand().unwrap();
        assert_eq!(status.get_one::<String>("dir").unwrap(), "runs");
    }
}
