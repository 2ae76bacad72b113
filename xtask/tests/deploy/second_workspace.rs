//! A workspace of a user's own, written here into a temporary folder: its program
//! (`trainer`, which reads a data file of the bundle and writes a result), and its
//! xtask, a few lines on `stepgraph-deploy` by a path dependency. Built offline into a
//! target folder under this workspace's `target/`, so a second run reuses the build,
//! then deployed to the test's host, run, and its results fetched.

use super::*;

/// The user's program: prints its arguments, reads its config from the bundle's data
/// and writes a result into its working folder (the run's results folder).
const TRAINER: &str = r#"fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("trainer: args {}", args.join(" "));
    let data = std::env::var("DEPLOY_DATA").expect("run.sh sets DEPLOY_DATA");
    let config = std::fs::read_to_string(format!("{data}/configs/run.toml"))
        .expect("the config travels with the bundle");
    let result = format!("args: {}\nconfig: {}\n", args.join(" "), config.trim());
    std::fs::write("result.txt", result).expect("the results folder is writable");
    println!("trainer: done");
}
"#;

/// The user's xtask: the whole of it.
const XTASK: &str = r#"use stepgraph_deploy::{Cli, Needs, Project};

fn main() -> std::process::ExitCode {
    Cli::new(
        Project::new("trainer")
            .bin("trainer")
            .bin("eval")
            .data("configs/")
            .args(["--steps", "1000"])
            .needs(Needs::new().libraries(["libc.so.6"]).compute_capability("8.0")),
    )
    .run()
}
"#;

/// Writes the workspace under `dir` and returns its root.
fn write_workspace(dir: &Path) -> PathBuf {
    let root = dir.join("user-ws");
    let files = [
        (
            "Cargo.toml",
            "[workspace]\nmembers = [\"app\", \"xtask\"]\nresolver = \"3\"\n".to_string(),
        ),
        (
            "app/Cargo.toml",
            "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [[bin]]\nname = \"trainer\"\npath = \"src/main.rs\"\n"
                .to_string(),
        ),
        ("app/src/main.rs", TRAINER.to_string()),
        (
            "xtask/Cargo.toml",
            format!(
                "[package]\nname = \"xtask\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [dependencies]\nstepgraph-deploy = {{ path = {:?} }}\n",
                workspace_root().join("deploy").display().to_string()
            ),
        ),
        ("xtask/src/main.rs", XTASK.to_string()),
        ("configs/run.toml", "lr = 0.001\n".to_string()),
    ];
    for (path, text) in files {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    // This workspace's lock file: the same versions, all of them in the registry cache,
    // so the build needs no network.
    fs::copy(workspace_root().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    root
}

/// The user's xtask command in `root`, with cargo offline and the shared target folder.
fn user_xtask(root: &Path, target: &Path) -> Command {
    let mut cmd = Command::new(target.join("debug/xtask"));
    cmd.current_dir(root)
        .env("CARGO_TARGET_DIR", target)
        .env("CARGO_NET_OFFLINE", "true")
        .stdin(Stdio::null());
    cmd
}

#[test]
fn a_second_workspace_deploys_its_own_program_with_its_data_and_arguments() {
    let host = Host::start();
    let root = write_workspace(host.tmp.path());
    let target = workspace_root().join("target/second-workspace");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let build = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--offline", "--quiet", "-p", "xtask"])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("cargo runs");
    assert!(
        build.success(),
        "the second workspace's xtask did not build"
    );

    // A program the project names but the workspace lacks is named as such.
    let out = host.output(user_xtask(&root, &target).args(["bundle", "eval"]));
    assert!(
        !out.ok,
        "bundling a missing target succeeded:\n{}",
        out.text
    );
    out.expect_output(&[
        "no bin target `eval` in the workspace at",
        "found only trainer",
    ]);

    let mut deploy = user_xtask(&root, &target);
    deploy
        .args(["deploy", "--host", &host.target()])
        .arg("--key")
        .arg(&host.sshd.key)
        .arg("--known-hosts")
        .arg(host.tmp.path().join("known_hosts"))
        .arg("--dir")
        .arg(host.remote())
        .arg("--fetch-to")
        .arg(host.fetched())
        .arg("--remote-path-prefix")
        .arg(host.stand_in())
        .env(TEST_MARK, host.tmp.path());
    host.output(&mut deploy).expect_ok().expect_output(&[
        "ok    compute capability: GPU 0 has at least 8.0",
        "ok    library libc.so.6: /",
        "trainer: args --steps 1000",
        "trainer: done",
        "deployed trainer-nogit-",
    ]);
    let live = host.remote().join("current");
    assert!(live.join("bin/trainer").is_file());
    assert_eq!(
        fs::read_to_string(live.join("data/configs/run.toml")).unwrap(),
        "lr = 0.001\n"
    );

    // Arguments after `--` replace the defaults.
    let mut again = user_xtask(&root, &target);
    again
        .args(["deploy", "run", "--host", &host.target()])
        .arg("--key")
        .arg(&host.sshd.key)
        .arg("--known-hosts")
        .arg(host.tmp.path().join("known_hosts"))
        .arg("--dir")
        .arg(host.remote())
        .arg("--fetch-to")
        .arg(host.fetched())
        .arg("--remote-path-prefix")
        .arg(host.stand_in())
        .args(["--", "--steps", "7"])
        .env(TEST_MARK, host.tmp.path());
    host.output(&mut again)
        .expect_ok()
        .expect_output(&["trainer: args --steps 7"]);

    let release = fs::read_link(&live).unwrap();
    let release = release.file_name().unwrap().to_string_lossy().into_owned();
    let results: Vec<String> = host
        .runs(&release)
        .iter()
        .map(|run| fs::read_to_string(run.join("result.txt")).unwrap())
        .collect();
    assert_eq!(
        results,
        [
            "args: --steps 1000\nconfig: lr = 0.001\n",
            "args: --steps 7\nconfig: lr = 0.001\n"
        ]
    );
}
