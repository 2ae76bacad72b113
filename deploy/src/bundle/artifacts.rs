//! Executables named in cargo's JSON messages, and their stable names.

use std::path::PathBuf;

/// What an executable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A test harness binary (`profile.test == true`): unit tests of a library or an
    /// integration test file.
    Test,
    /// A program run as it is: an example or a binary (`target.kind` holds `example` or
    /// `bin`, not built as a test).
    Program,
}

/// One executable cargo built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    /// What it is for.
    pub kind: Kind,
    /// The cargo target's name (`gpu`, `fork_join`, `stepgraph_suite`).
    pub target: String,
    /// Where cargo put it.
    pub path: PathBuf,
}

impl Artifact {
    /// The name it gets in the bundle: the file name without cargo's hash suffix.
    pub fn stable_name(&self) -> String {
        let file = self
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.target.clone());
        strip_hash_suffix(&file).to_string()
    }
}

/// `gpu-0123456789abcdef` → `gpu`: test binaries carry a 16-hex-digit metadata hash.
/// Names without one are returned as they are.
pub fn strip_hash_suffix(file_name: &str) -> &str {
    match file_name.rsplit_once('-') {
        Some((stem, hash))
            if !stem.is_empty()
                && hash.len() == 16
                && hash
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            stem
        }
        _ => file_name,
    }
}

/// The executable named by one line of `--message-format=json` output, if it names one
/// (`reason == "compiler-artifact"` with `executable` set).
pub fn parse_line(line: &str) -> Option<Artifact> {
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    if msg["reason"] != "compiler-artifact" {
        return None;
    }
    let path = PathBuf::from(msg["executable"].as_str()?);
    let target = msg["target"]["name"].as_str()?.to_string();
    let kind = if msg["profile"]["test"] == true {
        Kind::Test
    } else if msg["target"]["kind"]
        .as_array()
        .is_some_and(|kinds| kinds.iter().any(|k| k == "example" || k == "bin"))
    {
        Kind::Program
    } else {
        return None;
    };
    Some(Artifact { kind, target, path })
}

/// Every executable named in a build's JSON output, in order.
pub fn parse_stream(stdout: &str) -> Vec<Artifact> {
    stdout.lines().filter_map(parse_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of `cargo test -p stepgraph-kernels --no-run --message-format=json` as cargo
    /// writes it, from a checkout in /home/user/stepgraph.
    const TEST_LINE: &str = r#"{"reason":"compiler-artifact","package_id":"path+file:///home/user/stepgraph/kernels#stepgraph-kernels@0.1.0","manifest_path":"/home/user/stepgraph/kernels/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"stepgraph_kernels","src_path":"/home/user/stepgraph/kernels/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":true},"features":[],"filenames":["/tmp/target-kx/debug/deps/stepgraph_kernels-c8554a21b043ac5f"],"executable":"/tmp/target-kx/debug/deps/stepgraph_kernels-c8554a21b043ac5f","fresh":false}"#;

    const EXAMPLE_LINE: &str = r#"{"reason":"compiler-artifact","target":{"kind":["example"],"crate_types":["bin"],"name":"fork_join"},"profile":{"test":false},"executable":"/t/release/examples/fork_join"}"#;

    const LIB_LINE: &str = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"stepgraph"},"profile":{"test":false},"executable":null}"#;

    #[test]
    fn test_binary_is_found_and_named_without_its_hash() {
        let a = parse_line(TEST_LINE).expect("an artifact");
        assert_eq!(a.kind, Kind::Test);
        assert_eq!(a.target, "stepgraph_kernels");
        assert_eq!(
            a.path,
            PathBuf::from("/tmp/target-kx/debug/deps/stepgraph_kernels-c8554a21b043ac5f")
        );
        assert_eq!(a.stable_name(), "stepgraph_kernels");
    }

    #[test]
    fn examples_are_kept_and_libraries_and_other_messages_skipped() {
        let out = [
            LIB_LINE,
            EXAMPLE_LINE,
            r#"{"reason":"build-finished","success":true}"#,
            "not json",
        ]
        .join("\n");
        let found = parse_stream(&out);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, Kind::Program);
        assert_eq!(found[0].stable_name(), "fork_join");
    }

    #[test]
    fn hash_suffix_is_stripped_only_when_it_is_one() {
        assert_eq!(strip_hash_suffix("gpu-0123456789abcdef"), "gpu");
        assert_eq!(strip_hash_suffix("fork-join-0123456789abcdef"), "fork-join");
        assert_eq!(strip_hash_suffix("fork_join"), "fork_join");
        assert_eq!(strip_hash_suffix("fork-join"), "fork-join");
        // Not 16 digits, or not lowercase hex: not a hash.
        assert_eq!(
            strip_hash_suffix("gpu-0123456789abcde"),
            "gpu-0123456789abcde"
        );
        assert_eq!(
            strip_hash_suffix("gpu-0123456789ABCDEF"),
            "gpu-0123456789ABCDEF"
        );
        assert_eq!(strip_hash_suffix("-0123456789abcdef"), "-0123456789abcdef");
    }
}
