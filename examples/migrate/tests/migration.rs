//! The migration diff (`MIGRATION.diff`, the change from the before's trainer to the
//! after's step) is current, and it changes no function of the trainer: the existing
//! files it touches gain attributes only, and the kernels, the cuBLASLt wrapper and the
//! before's driver are not in it at all.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One file of the diff.
struct FileDiff {
    /// Its path inside the crate.
    path: String,
    /// Whether the diff creates it.
    new: bool,
    /// Its changed lines, `(sign, text)`.
    lines: Vec<(char, String)>,
}

/// The diff, file by file.
fn files() -> Vec<FileDiff> {
    let text = std::fs::read_to_string(root().join("MIGRATION.diff")).expect("MIGRATION.diff");
    let mut out: Vec<FileDiff> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("diff --git a/examples/migrate/") {
            let path = rest.split(' ').next().unwrap_or_default().to_string();
            out.push(FileDiff {
                path,
                new: false,
                lines: Vec::new(),
            });
            continue;
        }
        let Some(file) = out.last_mut() else { continue };
        if line.starts_with("new file mode") {
            file.new = true;
        } else if line.starts_with("+++") || line.starts_with("---") {
            // File headers, not lines.
        } else if let Some(added) = line.strip_prefix('+') {
            file.lines.push(('+', added.to_string()));
        } else if let Some(removed) = line.strip_prefix('-') {
            file.lines.push(('-', removed.to_string()));
        }
    }
    out
}

#[test]
fn the_migration_changes_no_function_of_the_trainer() {
    let files = files();
    let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert!(
        names.contains(&"src/model.rs") && names.contains(&"src/after.rs"),
        "{names:?}"
    );
    for untouched in ["src/lt.rs", "src/kernels.rs", "src/before.rs", "cuda/"] {
        assert!(
            !names.iter().any(|n| n.starts_with(untouched)),
            "{untouched} is in the migration diff"
        );
    }
    // In the model, the existing functions' file: attributes changed, nothing else.
    let model = &files
        .iter()
        .find(|f| f.path == "src/model.rs")
        .unwrap()
        .lines;
    assert!(!model.is_empty());
    for (sign, line) in model {
        assert!(
            line.trim_start().starts_with("#[derive("),
            "model.rs: a changed line that is not a derive: {sign}{line}"
        );
    }
}

#[test]
fn the_migration_diff_is_current() {
    for FileDiff { path, new, lines } in files() {
        let current = std::fs::read_to_string(Path::new(&root()).join(&path))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        if new {
            // A new file is its added lines, exactly.
            let added: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
            assert_eq!(
                added,
                current.lines().collect::<Vec<_>>(),
                "{path} differs from MIGRATION.diff: regenerate it (see the crate's README)"
            );
        } else {
            for (sign, line) in &lines {
                if *sign == '+' {
                    assert!(
                        current.lines().any(|l| l == line),
                        "{path} lacks `{line}` of MIGRATION.diff: regenerate it (see the crate's README)"
                    );
                }
            }
        }
    }
}
