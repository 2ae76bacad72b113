//! The programs xtask builds, runs, bundles and draws, wherever they live in the
//! workspace: the small examples of the root package and the trainers' binaries in their
//! own crates. Commands name a program; this table says how cargo builds it.

use anyhow::{Result, bail};

/// The root package: the small examples and the runtime's GPU tests.
pub const SUITE: &str = "stepgraph-suite";

/// The DQN trainer's crate.
pub const DQN: &str = "stepgraph-dqn";

/// The migration example's crate: a plain-cudarc trainer and its stepgraph step.
pub const MIGRATE: &str = "stepgraph-migrate";

/// The environments' library crate (CartPole, Pendulum on the GPU).
pub const ENVS: &str = "stepgraph-envs";

/// The soft actor-critic example's crate: a second trainer on the public API alone.
pub const SAC: &str = "stepgraph-sac";

/// The agents' crate: whole training loops on the device (DQN on CartPole-v1, SAC on
/// Pendulum-v1).
pub const AGENTS: &str = "stepgraph-agents";

/// How cargo names a program's target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `--example NAME`: a file of a package's `examples/`.
    Example,
    /// `--bin NAME`: a package's binary.
    Bin,
}

/// A program of the workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    /// The name commands take (`cargo xtask plan dqn`), also its target's name.
    pub name: &'static str,
    /// Its package.
    pub package: &'static str,
    /// Its kind of target.
    pub target: Target,
}

/// Every program, the main job first.
pub const PROGRAMS: &[Program] = &[
    Program {
        name: "cartpole",
        package: AGENTS,
        target: Target::Bin,
    },
    Program {
        name: "pendulum",
        package: AGENTS,
        target: Target::Bin,
    },
    Program {
        name: "dqn",
        package: DQN,
        target: Target::Bin,
    },
    Program {
        name: "fork_join",
        package: SUITE,
        target: Target::Example,
    },
    Program {
        name: "capture_cost",
        package: SUITE,
        target: Target::Example,
    },
    Program {
        name: "migrate",
        package: MIGRATE,
        target: Target::Bin,
    },
    Program {
        name: "sac",
        package: SAC,
        target: Target::Bin,
    },
];

/// The main job: what `cargo xtask demo` runs and `cargo xtask deploy` ships by default.
pub const DEMO: &str = "cartpole";

/// The packages whose integration tests named `gpu*` need a GPU: built with their
/// `gpu-tests` feature into the GPU-test bundle, compiled (not run) by `cargo xtask test`.
pub const GPU_TEST_PACKAGES: &[&str] = &[SUITE, DQN, MIGRATE, SAC, ENVS, AGENTS];

/// The integration tests that need a GPU, by name (a cargo target pattern, passed as is:
/// no shell expands it). The other test binaries stay home: the suite's `ui` runs
/// trybuild, which needs the Rust toolchain the GPU host lacks.
pub const GPU_TESTS: &str = "gpu*";

impl Program {
    /// The program called `name`, or an error listing the programs there are.
    pub fn find(name: &str) -> Result<&'static Program> {
        if let Some(p) = PROGRAMS.iter().find(|p| p.name == name) {
            return Ok(p);
        }
        let names: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        bail!(
            "no program `{name}` in this workspace: expected one of {}",
            names.join(", ")
        )
    }

    /// The cargo arguments that select it: `-p PACKAGE --example NAME` or
    /// `-p PACKAGE --bin NAME`.
    pub fn cargo_args(&self) -> Vec<String> {
        let kind = match self.target {
            Target::Example => "--example",
            Target::Bin => "--bin",
        };
        ["-p", self.package, kind, self.name]
            .map(String::from)
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_by_name_and_selected_by_package_and_target() {
        assert_eq!(
            Program::find("dqn").unwrap().cargo_args().join(" "),
            "-p stepgraph-dqn --bin dqn"
        );
        assert_eq!(
            Program::find("fork_join").unwrap().cargo_args().join(" "),
            "-p stepgraph-suite --example fork_join"
        );
        let e = Program::find("dqnn").unwrap_err().to_string();
        assert_eq!(
            e,
            "no program `dqnn` in this workspace: expected one of cartpole, pendulum, dqn, fork_join, capture_cost, migrate, sac"
        );
        assert!(Program::find(DEMO).is_ok());
    }

    #[test]
    fn every_program_exists_where_the_table_says() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for p in PROGRAMS {
            let path = match (p.package, p.target) {
                (SUITE, Target::Example) => root.join(format!("examples/{}.rs", p.name)),
                (DQN, Target::Bin) => root.join(format!("examples/dqn/src/bin/{}/main.rs", p.name)),
                (MIGRATE, Target::Bin) => {
                    root.join(format!("examples/migrate/src/bin/{}.rs", p.name))
                }
                (SAC, Target::Bin) => root.join(format!("examples/sac/src/bin/{}/main.rs", p.name)),
                (AGENTS, Target::Bin) => {
                    root.join(format!("examples/agents/src/bin/{}.rs", p.name))
                }
                other => panic!("no layout known for {other:?}"),
            };
            assert!(path.is_file(), "{} is missing", path.display());
        }
    }
}
