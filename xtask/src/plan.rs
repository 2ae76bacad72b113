//! `cargo xtask plan <program>` and `cargo xtask render-profile <record>`: pictures of a
//! step, with no GPU needed.
//!
//! `plan` asks the program itself for its compile-time plan (`--print-plan dot|svg`,
//! which every program handles before it touches a GPU), so the picture is of the plan
//! the macro really emitted. `render-profile` draws a profile recorded on a GPU host
//! (a `.profile.json` record, as `stepgraph_picture::record::to_string` writes it) as an
//! SVG timeline and a Chrome/Perfetto trace; the documentation images in `docs/` are made
//! this way. Both draw with `stepgraph-picture`, which needs no CUDA.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;
use stepgraph_picture::{record, timeline_svg, trace_json};

use crate::cmd::{self, Workspace};
use crate::install_nvcc::InstallNvcc;
use crate::programs::Program;

/// Where `plan` writes without `--out`, relative to the workspace root.
pub const PLAN_OUT: &str = "target/plan";
/// Where `render-profile` writes without `--out`, relative to the workspace root.
pub const PROFILE_OUT: &str = "target/profile";

/// Writes an example's compile-time plan as `<out>/<example>.plan.dot` and
/// `<out>/<example>.plan.svg`, and `<example>.plan.graphviz.svg` (graphviz's drawing of
/// the DOT) when graphviz's `dot` is installed. Builds the example (so nvcc is installed
/// if needed) but runs it only with `--print-plan`: no GPU needed.
#[derive(Debug, Args)]
pub struct Plan {
    /// The program whose plan to draw (`fork_join`, `dqn`, `capture_cost`).
    pub example: String,
    /// The folder to write into [default: target/plan in the workspace].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the commands and the files it would write without doing either.
    #[arg(long)]
    pub dry_run: bool,
}

impl Plan {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let program = Program::find(&self.example)?;
        let out = self.out.unwrap_or_else(|| ws.root.join(PLAN_OUT));
        let nvcc = InstallNvcc::with_dry_run(self.dry_run).ensure(ws)?;
        let [dot_path, svg_path, graphviz_path] = plan_outputs(&out, &self.example);
        create_dir(&out, self.dry_run)?;
        for (format, path) in [("dot", &dot_path), ("svg", &svg_path)] {
            let mut print = ws.cargo();
            print
                .args(["run", "--release"])
                .args(program.cargo_args())
                .arg("--")
                .args(["--print-plan", format])
                .env("NVCC", &nvcc.path);
            if self.dry_run {
                eprintln!("$ {} > {}", cmd::display(&print), path.display());
                continue;
            }
            let text = cmd::stdout_of(&mut print)?;
            write(path, &text, false)?;
        }

        let mut graphviz = Command::new("dot");
        graphviz
            .arg("-Tsvg")
            .arg(&dot_path)
            .arg("-o")
            .arg(&graphviz_path);
        if self.dry_run {
            eprintln!("$ {} (if graphviz is installed)", cmd::display(&graphviz));
            return Ok(());
        }
        match graphviz.status() {
            Ok(status) if status.success() => {
                eprintln!("wrote {}", graphviz_path.display());
                Ok(())
            }
            Ok(status) => bail!("`{}` failed: {status}", cmd::display(&graphviz)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                eprintln!(
                    "skipped {}: graphviz's `dot` is not installed (apt-get install graphviz); \
                     the .plan.svg needs no graphviz",
                    graphviz_path.display()
                );
                Ok(())
            }
            Err(e) => {
                Err(e).with_context(|| format!("could not start `{}`", cmd::display(&graphviz)))
            }
        }
    }
}

/// Draws a recorded profile as `<out>/<name>.timeline.svg` and `<out>/<name>.trace.json`
/// (open the trace in ui.perfetto.dev or chrome://tracing), `<name>` being the record's
/// file name without `.profile.json` (or its extension). The documentation images are
/// made with `cargo xtask render-profile tests/fixtures/fork_join.profile.json --out docs`.
#[derive(Debug, Args)]
pub struct RenderProfile {
    /// A profile record, as `stepgraph_picture::record::to_string` writes it
    /// (`tests/fixtures/fork_join.profile.json`).
    pub record: PathBuf,
    /// The folder to write into [default: target/profile in the workspace].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the files it would write without writing them.
    #[arg(long)]
    pub dry_run: bool,
}

impl RenderProfile {
    pub fn run(self, ws: &Workspace) -> Result<()> {
        let text = fs::read_to_string(&self.record)
            .with_context(|| format!("could not read {}", self.record.display()))?;
        let profile = record::from_str(&text)
            .with_context(|| format!("could not read the profile {}", self.record.display()))?;
        let name = record_name(&self.record)
            .with_context(|| format!("{} has no usable file name", self.record.display()))?;
        let out = self.out.unwrap_or_else(|| ws.root.join(PROFILE_OUT));
        let [svg, trace] = profile_outputs(&out, name);
        create_dir(&out, self.dry_run)?;
        write(&svg, &timeline_svg(&profile), self.dry_run)?;
        let trace_text = trace_json(&profile)
            .with_context(|| format!("could not write the trace of {}", self.record.display()))?;
        write(&trace, &trace_text, self.dry_run)
    }
}

/// The `.plan.dot`, `.plan.svg` and `.plan.graphviz.svg` of an example.
pub fn plan_outputs(out: &Path, example: &str) -> [PathBuf; 3] {
    ["plan.dot", "plan.svg", "plan.graphviz.svg"].map(|ext| out.join(format!("{example}.{ext}")))
}

/// The name a record's pictures are called by: its file name without `.profile.json`
/// (`fork_join.profile.json` draws `fork_join.timeline.svg`), or without its extension.
pub fn record_name(record: &Path) -> Option<&str> {
    let file = record.file_name()?.to_str()?;
    let name = match file.strip_suffix(".profile.json") {
        Some(name) => name,
        None => record.file_stem()?.to_str()?,
    };
    (!name.is_empty()).then_some(name)
}

/// The `.timeline.svg` and `.trace.json` of a recorded profile.
pub fn profile_outputs(out: &Path, name: &str) -> [PathBuf; 2] {
    ["timeline.svg", "trace.json"].map(|ext| out.join(format!("{name}.{ext}")))
}

fn create_dir(dir: &Path, dry_run: bool) -> Result<()> {
    if dry_run {
        return Ok(());
    }
    fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))
}

fn write(path: &Path, text: &str, dry_run: bool) -> Result<()> {
    if dry_run {
        eprintln!("would write {} ({} bytes)", path.display(), text.len());
        return Ok(());
    }
    fs::write(path, text).with_context(|| format!("could not write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    use super::*;

    /// The two commands as the binary mounts them.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        Plan(Plan),
        RenderProfile(RenderProfile),
    }

    /// A fresh empty folder under the system's temp folder.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn plan_and_render_profile_parse_their_arguments() {
        let cli = Cli::try_parse_from(["xtask", "plan", "fork_join", "--out", "docs"]).unwrap();
        let Command::Plan(p) = cli.command else {
            panic!("parsed {cli:?}")
        };
        assert_eq!(
            (p.example.as_str(), p.out),
            ("fork_join", Some("docs".into()))
        );
        let cli = Cli::try_parse_from(["xtask", "render-profile", "a.profile.json", "--dry-run"])
            .unwrap();
        let Command::RenderProfile(r) = cli.command else {
            panic!("parsed {cli:?}")
        };
        assert_eq!(
            (r.record, r.out, r.dry_run),
            ("a.profile.json".into(), None, true)
        );
    }

    #[test]
    fn outputs_are_named_after_the_example_or_record() {
        let out = Path::new("docs");
        assert_eq!(
            plan_outputs(out, "fork_join"),
            [
                "docs/fork_join.plan.dot",
                "docs/fork_join.plan.svg",
                "docs/fork_join.plan.graphviz.svg"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            profile_outputs(out, "fork_join"),
            ["docs/fork_join.timeline.svg", "docs/fork_join.trace.json"].map(PathBuf::from)
        );
        fn name(path: &str) -> Option<&str> {
            record_name(Path::new(path))
        }
        assert_eq!(
            name("tests/fixtures/fork_join.profile.json"),
            Some("fork_join")
        );
        assert_eq!(name("elsewhere/run.json"), Some("run"));
        assert_eq!(name("no_extension"), Some("no_extension"));
        assert_eq!(name(".profile.json"), None);
    }

    #[test]
    fn render_profile_draws_the_committed_fixture() {
        let ws = crate::workspace();
        let out = scratch("render");
        let record = ws.root.join("tests/fixtures/fork_join.profile.json");
        RenderProfile {
            record: record.clone(),
            out: Some(out.clone()),
            dry_run: false,
        }
        .run(&ws)
        .unwrap();
        let [svg, trace] = profile_outputs(&out, "fork_join");
        let svg = fs::read_to_string(svg).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains(">chain[3]</text>"));
        let trace: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(trace).unwrap()).expect("the trace is JSON");
        assert_eq!(trace["displayTimeUnit"], "ms");

        let dry = scratch("render-dry");
        RenderProfile {
            record,
            out: Some(dry.join("never")),
            dry_run: true,
        }
        .run(&ws)
        .unwrap();
        assert!(!dry.join("never").exists(), "a dry run writes nothing");
        let _ = fs::remove_dir_all(out);
        let _ = fs::remove_dir_all(dry);
    }

    #[test]
    fn render_profile_reports_a_bad_record_with_its_path_and_where() {
        let ws = crate::workspace();
        let dir = scratch("bad-record");
        let good =
            fs::read_to_string(ws.root.join("tests/fixtures/fork_join.profile.json")).unwrap();
        let cases = [
            (
                good.replacen("\"stream\": 1,", "\"stream\": 9,", 1),
                "ops[1].stream (op `chain[0]`): expected a stream index below 5, found `9`",
            ),
            (
                good.replacen("\"waits\"", "\"wait\"", 1),
                "missing field `waits` at line 37",
            ),
            (
                "# stepgraph profile v1\nstep s\n".to_string(),
                "expected version 2, found the line-based text record of version 1",
            ),
        ];
        for (text, message) in cases {
            let record = dir.join("bad.profile.json");
            fs::write(&record, text).unwrap();
            let e = RenderProfile {
                record,
                out: Some(dir.clone()),
                dry_run: false,
            }
            .run(&ws)
            .unwrap_err();
            let text = format!("{e:#}");
            assert!(
                text.contains("bad.profile.json") && text.contains(message),
                "{text}\nexpected: {message}"
            );
        }
        assert!(!dir.join("bad.timeline.svg").exists(), "nothing drawn");
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn plan_of_an_unknown_example_lists_the_examples() {
        let ws = crate::workspace();
        let e = Plan {
            example: "no_such_example".into(),
            out: None,
            dry_run: true,
        }
        .run(&ws)
        .unwrap_err()
        .to_string();
        assert!(e.contains("no program `no_such_example`"), "{e}");
        assert!(e.contains("fork_join"), "{e}");
    }
}
