//! The `run.sh` of a job bundle (`cargo xtask bundle <example>`): runs the one job in a
//! fresh results folder, which is what `cargo xtask deploy` fetches back.

use super::run_sh::lib_path_block;
use crate::cmd::{quote, quote_words};

/// The log of the job's output (stdout and stderr together) in its results folder.
pub const OUTPUT_LOG: &str = "output.log";

/// The folder of a job bundle's data files; `run.sh` exports its path as [`DATA_VAR`].
pub const DATA_DIR: &str = "data";

/// The variable that holds the path of the bundle's `data/` folder for the job.
pub const DATA_VAR: &str = "DEPLOY_DATA";

/// What the job `run.sh` runs.
#[derive(Debug)]
pub struct JobScript<'a> {
    /// The executable in `bin/`.
    pub job: &'a str,
    /// Its arguments when `run.sh` is given none.
    pub args: &'a [String],
}

impl JobScript<'_> {
    /// The script.
    pub fn render(&self) -> String {
        TEMPLATE
            .replace("@JOB@", &quote(self.job))
            .replace("@DEFAULT_ARGS@", &quote_words(self.args))
            .replace("@DATA_VAR@", DATA_VAR)
            .replace("@DATA_DIR@", DATA_DIR)
            .replace("@OUTPUT_LOG@", OUTPUT_LOG)
            .replace("@LIB_PATH@", &lib_path_block())
    }
}

const TEMPLATE: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask bundle`: rebuild the bundle rather than edit this file.
#
#   ./run.sh [ARGS...]   runs bin/@JOB@ ARGS in a fresh results folder (with no ARGS,
#                        the bundle's default arguments, set below)
#   ./preflight.sh       checks first that this host can run it
#
# The results folder is $OUT, or <this folder>-results/<UTC time> beside the bundle (never
# inside it: its checksums cover every file in it); it must be new or empty. The job runs
# there, so what it writes lands there, next to a copy of build-info.json and
# @OUTPUT_LOG@ (its stdout and stderr, also shown here). The exit status is the job's.
# The job finds the bundle's data files in $@DATA_VAR@ (this folder's @DATA_DIR@/).
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
job=@JOB@
if [ "$#" -eq 0 ]; then
    set -- @DEFAULT_ARGS@
fi
out="${OUT:-$here-results/$(date -u +%Y%m%dT%H%M%SZ)}"

if [ -d "$out" ] && [ -n "$(ls -A -- "$out")" ]; then
    echo "run.sh: expected a new or empty results folder, found $out holding files" >&2
    exit 2
fi
mkdir -p -- "$out"
out="$(cd -- "$out" && pwd)"

@LIB_PATH@

cp -- "$here/build-info.json" "$out/"
export @DATA_VAR@="$here/@DATA_DIR@"
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
        let args = ["--steps".to_string(), "a b".to_string()];
        let script = JobScript {
            job: "fork_join",
            args: &args,
        }
        .render();
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        for placeholder in [
            "@JOB@",
            "@OUTPUT_LOG@",
            "@LIB_PATH@",
            "@DEFAULT_ARGS@",
            "@DATA_VAR@",
            "@DATA_DIR@",
        ] {
            assert!(!script.contains(placeholder), "{placeholder} left");
        }
        assert!(script.contains("job=fork_join\n"));
        assert!(script.contains("    set -- --steps 'a b'\n"));
        assert!(script.contains("export DEPLOY_DATA=\"$here/data\"\n"));
        assert!(script.contains(&lib_path_block()));
        assert!(script.contains(r#""$here/bin/$job" "$@" 2>&1 | tee output.log"#));
        assert!(script.contains(r#"exit "${PIPESTATUS[0]}""#));
    }
}
