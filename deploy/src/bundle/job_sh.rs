//! The `run.sh` of a job bundle (`cargo xtask bundle <example>`): runs the one job in a
//! fresh results folder, which is what `cargo xtask deploy` fetches back.

use super::run_sh::lib_path_block;
use crate::cmd::quote;

/// The log of the job's output (stdout and stderr together) in its results folder.
pub const OUTPUT_LOG: &str = "output.log";

/// What the job `run.sh` runs.
#[derive(Debug)]
pub struct JobScript<'a> {
    /// The executable in `bin/`.
    pub job: &'a str,
}

impl JobScript<'_> {
    pub fn render(&self) -> String {
        TEMPLATE
            .replace("@JOB@", &quote(self.job))
            .replace("@OUTPUT_LOG@", OUTPUT_LOG)
            .replace("@LIB_PATH@", &lib_path_block())
    }
}

const TEMPLATE: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask bundle`: rebuild the bundle rather than edit this file.
#
#   ./run.sh [ARGS...]   runs bin/@JOB@ ARGS in a fresh results folder
#   ./preflight.sh       checks first that this host can run it
#
# The results folder is $OUT, or <this folder>-results/<UTC time> beside the bundle (never
# inside it: its checksums cover every file in it); it must be new or empty. The job runs
# there, so what it writes lands there, next to a copy of build-info.json and
# @OUTPUT_LOG@ (its stdout and stderr, also shown here). The exit status is the job's.
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
job=@JOB@
out="${OUT:-$here-results/$(date -u +%Y%m%dT%H%M%SZ)}"

if [ -d "$out" ] && [ -n "$(ls -A -- "$out")" ]; then
    echo "run.sh: expected a new or empty results folder, found $out holding files" >&2
    exit 2
fi
mkdir -p -- "$out"
out="$(cd -- "$out" && pwd)"

@LIB_PATH@

cp -- "$here/build-info.json" "$out/"
cd -- "$out"
echo "run.sh: bin/$job${*:+ $*} (results in $out)"
"$here/bin/$job" "$@" 2>&1 | tee @OUTPUT_LOG@
exit "${PIPESTATUS[0]}"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_runs_in_its_results_folder_with_the_library_path() {
        let script = JobScript { job: "fork_join" }.render();
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        for placeholder in ["@JOB@", "@OUTPUT_LOG@", "@LIB_PATH@"] {
            assert!(!script.contains(placeholder), "{placeholder} left");
        }
        assert!(script.contains("job=fork_join\n"));
        assert!(script.contains(&lib_path_block()));
        assert!(script.contains(r#""$here/bin/$job" "$@" 2>&1 | tee output.log"#));
        assert!(script.contains(r#"exit "${PIPESTATUS[0]}""#));
    }
}
