//! Running commands: argument lists, echoed before they run, skipped in a dry run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where the workspace is and which cargo runs it.
#[derive(Debug)]
pub struct Workspace {
    /// The workspace root (the folder holding the top `Cargo.toml`).
    pub root: PathBuf,
    /// The cargo that runs this xtask (`$CARGO`), so nested builds use the same toolchain.
    pub cargo: OsString,
}

impl Workspace {
    /// The workspace at `root`, built by `$CARGO` (the cargo that runs this program, so
    /// nested builds use the same toolchain), else `cargo`.
    pub fn new(root: PathBuf) -> Workspace {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        Workspace { root, cargo }
    }

    /// The workspace around the current folder, as `cargo locate-project --workspace`
    /// finds it.
    pub fn find() -> Result<Workspace> {
        let mut ws = Workspace::new(PathBuf::new());
        let mut locate = Command::new(&ws.cargo);
        locate.args(["locate-project", "--workspace", "--message-format", "plain"]);
        let out = locate
            .output()
            .with_context(|| format!("could not start `{}`", display(&locate)))?;
        if !out.status.success() {
            bail!(
                "expected to run inside a cargo workspace, found `{}` saying: {}",
                display(&locate),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let manifest = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        ws.root = manifest
            .parent()
            .with_context(|| format!("`{}` named no folder", display(&locate)))?
            .to_path_buf();
        Ok(ws)
    }

    /// A `cargo` command run in the workspace root.
    pub fn cargo(&self) -> Command {
        let mut cmd = Command::new(&self.cargo);
        cmd.current_dir(&self.root);
        cmd
    }
}

/// The command as a reader would type it (environment first), for echoing.
pub fn display(cmd: &Command) -> String {
    let mut words = Vec::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            words.push(format!(
                "{}={}",
                key.to_string_lossy(),
                quote(&value.to_string_lossy())
            ));
        }
    }
    words.push(quote(&cmd.get_program().to_string_lossy()));
    words.extend(cmd.get_args().map(|a| quote(&a.to_string_lossy())));
    words.join(" ")
}

/// Words joined into one shell line, each quoted when it needs it.
pub fn quote_words<S: AsRef<str>>(words: &[S]) -> String {
    words
        .iter()
        .map(|w| quote(w.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes a word for display (and for the generated shell script) when it needs it.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` with inherited output, failing on a non-zero exit; in a dry run only
/// prints it.
pub fn run(cmd: &mut Command, dry_run: bool) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    if dry_run {
        return Ok(());
    }
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// Runs `cmd` (even in a dry run: callers use it only for queries), returning its
/// stdout; stderr goes to the terminal.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", display(cmd), out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{}` wrote non-UTF-8", display(cmd)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_shows_environment_and_quotes_odd_words() {
        let mut cmd = Command::new("cargo");
        cmd.args(["test", "--", "name with space"])
            .env("NVCC", "/x/nvcc");
        assert_eq!(
            display(&cmd),
            "NVCC=/x/nvcc cargo test -- 'name with space'"
        );
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }
}
