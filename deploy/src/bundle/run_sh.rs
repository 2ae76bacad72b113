//! The bundle's `run.sh`, which runs it on the GPU host.

use crate::cmd::{quote, quote_words};

/// Folders that hold the CUDA libraries on the usual layouts of a toolkit install.
pub const CUDA_LIB_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/extras/CUPTI/lib64",
];

/// Folders under a Python environment's `nvidia` package (the NVIDIA wheels).
pub const PYTHON_NVIDIA_LIB_DIRS: &[&str] = &["cu13/lib", "cublas/lib", "cuda_cupti/lib"];

/// The compute-sanitizer tools `run.sh sanitize` runs, one after the other.
pub const SANITIZER_TOOLS: &[&str] = &["memcheck", "racecheck", "synccheck"];

/// What `run.sh` runs.
#[derive(Debug)]
pub struct RunScript<'a> {
    /// Test binaries in `bin/`, run one test at a time with ignored tests included.
    pub tests: &'a [String],
    /// Examples in `bin/`, run without arguments.
    pub examples: &'a [String],
    /// The example `run.sh sanitize` runs under compute-sanitizer, and its arguments.
    pub sanitize: Option<(&'a str, &'a [String])>,
}

impl RunScript<'_> {
    pub fn render(&self) -> String {
        let words = quote_words::<String>;
        let (sanitize_example, sanitize_args) = match self.sanitize {
            Some((example, args)) => (quote(example), words(args)),
            None => (String::new(), String::new()),
        };
        TEMPLATE
            .replace("@TESTS@", &words(self.tests))
            .replace("@EXAMPLES@", &words(self.examples))
            .replace("@SANITIZE_EXAMPLE@", &sanitize_example)
            .replace("@SANITIZE_ARGS@", &sanitize_args)
            .replace("@SANITIZER_TOOLS@", &SANITIZER_TOOLS.join(" "))
            .replace("@LIB_PATH@", &lib_path_block())
    }
}

/// The shell code that puts the CUDA library folders found on this host on
/// `LD_LIBRARY_PATH` (and exports it): shared by `run.sh` and `preflight.sh`, so the
/// preflight finds the libraries exactly where the job will.
pub fn lib_path_block() -> String {
    LIB_PATH_BLOCK
        .replace("@CUDA_LIB_DIRS@", &CUDA_LIB_DIRS.join(" "))
        .replace(
            "@PYTHON_NVIDIA_LIB_DIRS@",
            &PYTHON_NVIDIA_LIB_DIRS
                .iter()
                .map(|d| format!("{d:?}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
}

const LIB_PATH_BLOCK: &str = r#"# libcuda is on the loader cache; cuBLASLt and NVRTC may be only in a toolkit folder or
# in a Python environment's NVIDIA wheels. Folders that do not exist are skipped.
add_lib_dir() {
    [ -d "$1" ] || return 0
    case ":${LD_LIBRARY_PATH:-}:" in
        *":$1:"*) ;;
        *) LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$1" ;;
    esac
}
for dir in @CUDA_LIB_DIRS@; do
    add_lib_dir "$dir"
done
if command -v python3 >/dev/null 2>&1; then
    while IFS= read -r dir; do
        add_lib_dir "$dir"
    done < <(python3 -c '
import os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
for base in list(getattr(nvidia, "__path__", None) or []):
    for sub in (@PYTHON_NVIDIA_LIB_DIRS@,):
        path = os.path.join(base, sub)
        if os.path.isdir(path):
            print(path)
' 2>/dev/null || true)
fi
# NCCL (data-parallel steps): cudarc loads `libnccl.so`, but PyTorch's wheel ships only
# `libnccl.so.2`. Without a system libnccl.so, link the wheel's under that name.
if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libnccl\.so '; then
    nccl2="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
    if [ -n "$nccl2" ] && [ -f "$nccl2" ]; then
        nccl_links="${TMPDIR:-/tmp}/stepgraph-nccl-links"
        mkdir -p "$nccl_links" && ln -sf "$nccl2" "$nccl_links/libnccl.so"
        add_lib_dir "$nccl_links"
    fi
fi
export LD_LIBRARY_PATH"#;

const TEMPLATE: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask bundle`: rebuild the bundle rather than edit this file.
#
#   ./run.sh            every test binary in bin/ (ignored GPU tests included, one test
#                       at a time: GPU tests must not run concurrently), then every example
#   ./run.sh sanitize   compute-sanitizer (@SANITIZER_TOOLS@) on the sanitize example
#   ./run.sh portable   as ./run.sh, in the portable mode (STEPGRAPH_PORTABLE=1): every
#                       module loaded from its compute_80 PTX, no arch-specific kernel,
#                       as on an Ampere GPU; logs named portable-<name>.log
#
# Each binary's output goes to the terminal and to ${OUT:-./out}/<name>.log. A summary
# line per binary ends the run; the exit status is 1 if any failed.
set -u -o pipefail

case "${1:-all}" in
    all | sanitize | portable) mode="${1:-all}" ;;
    *)
        echo "usage: $0 [sanitize | portable]" >&2
        exit 2
        ;;
esac

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${OUT:-./out}"
mkdir -p "$out"

tests=(@TESTS@)
examples=(@EXAMPLES@)
sanitize_example=@SANITIZE_EXAMPLE@
sanitize_args=(@SANITIZE_ARGS@)

@LIB_PATH@
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
if [ -f "$here/build-info.json" ]; then
    cat "$here/build-info.json"
    echo
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader || true
fi

summary=()
failed=0

# run_logged NAME COMMAND...: runs COMMAND, showing and logging its output.
run_logged() {
    local name="$1"
    shift
    local log="$out/$name.log"
    echo "=== $name: $*"
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        summary+=("passed  $name")
    else
        summary+=("FAILED  $name (exit $rc, log $log)")
        failed=1
    fi
}

# run_all [PREFIX]: every test binary, then every example; logs named PREFIX<name>.
run_all() {
    local prefix="${1:-}" name
    for name in "${tests[@]}"; do
        run_logged "$prefix$name" "$here/bin/$name" --include-ignored --test-threads=1
    done
    for name in "${examples[@]}"; do
        run_logged "$prefix$name" "$here/bin/$name"
    done
}

run_sanitize() {
    if [ -z "$sanitize_example" ] || [ ! -x "$here/bin/$sanitize_example" ]; then
        echo "run.sh: this bundle has no sanitize example (wanted '${sanitize_example}')" >&2
        exit 1
    fi
    local sanitizer
    sanitizer="$(command -v compute-sanitizer || true)"
    if [ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
        sanitizer=/usr/local/cuda/bin/compute-sanitizer
    fi
    if [ -z "$sanitizer" ]; then
        echo "run.sh: compute-sanitizer is neither on PATH nor in /usr/local/cuda/bin" >&2
        exit 1
    fi
    # compute-sanitizer holds CUPTI, which takes one subscriber: the capture guard, which
    # needs it, is off for these runs (the plain runs keep it).
    local tool
    for tool in @SANITIZER_TOOLS@; do
        run_logged "sanitize-$tool" env STEPGRAPH_CAPTURE_GUARD=0 \
            "$sanitizer" --tool "$tool" --error-exitcode 1 \
            "$here/bin/$sanitize_example" "${sanitize_args[@]}"
    done
}

case "$mode" in
    all) run_all ;;
    sanitize) run_sanitize ;;
    portable)
        export STEPGRAPH_PORTABLE=1
        run_all portable-
        ;;
esac

echo
echo "summary:"
if [ "${#summary[@]}" -eq 0 ]; then
    echo "  nothing ran"
    failed=1
fi
for line in "${summary[@]}"; do
    echo "  $line"
done
exit "$failed"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn render() -> String {
        let tests = ["gpu".to_string(), "stepgraph_suite".to_string()];
        let examples = ["fork_join".to_string()];
        let args = ["--quick".to_string()];
        RunScript {
            tests: &tests,
            examples: &examples,
            sanitize: Some(("fork_join", &args)),
        }
        .render()
    }

    #[test]
    fn every_placeholder_is_filled() {
        let script = render();
        let left = script
            .split('@')
            .skip(1)
            .find(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()));
        assert!(
            left.is_none(),
            "unfilled placeholder @{}",
            left.unwrap_or_default()
        );
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
    }

    #[test]
    fn library_folders_are_searched() {
        let script = render();
        for dir in CUDA_LIB_DIRS {
            assert!(script.contains(dir), "{dir} missing");
        }
        assert!(
            script.contains(r#"for sub in ("cu13/lib", "cublas/lib", "cuda_cupti/lib",):"#),
            "{script}"
        );
        assert!(script.contains("export LD_LIBRARY_PATH"));
    }

    #[test]
    fn binaries_tests_and_sanitizer_are_listed() {
        let script = render();
        assert!(script.contains("tests=(gpu stepgraph_suite)\n"));
        assert!(script.contains("examples=(fork_join)\n"));
        assert!(script.contains("sanitize_example=fork_join\n"));
        assert!(script.contains("sanitize_args=(--quick)\n"));
        assert!(script.contains("--include-ignored --test-threads=1"));
        assert!(script.contains("for tool in memcheck racecheck synccheck; do"));
        assert!(script.contains("--error-exitcode 1"));
        // The portable mode runs the same binaries with the runtime's switch set.
        assert!(script.contains("export STEPGRAPH_PORTABLE=1\n        run_all portable-\n"));
    }

    #[test]
    fn a_bundle_without_sanitize_target_says_so() {
        let script = RunScript {
            tests: &[],
            examples: &[],
            sanitize: None,
        }
        .render();
        assert!(script.contains("sanitize_example=\n"));
        assert!(script.contains("tests=()\n"));
    }
}
