//! The bundle's `preflight.sh`: whether a host can run the bundle, checked on the host
//! before anything depends on it (`cargo xtask deploy` switches `current` only when it
//! passes).

use super::run_sh::lib_path_block;
use crate::cmd::{quote, quote_words};
use crate::project::Needs;

/// The one nvidia-smi query the preflight makes (a stand-in must answer it).
pub const GPU_QUERY: &[&str] = &[
    "--query-gpu=index,name,compute_cap,driver_version",
    "--format=csv,noheader",
];

/// Free space the job's results need by default, in MiB.
pub const DEFAULT_MIN_FREE_MIB: u64 = 512;

/// What `preflight.sh` checks for.
#[derive(Debug)]
pub struct Preflight<'a> {
    /// The GPU, driver and libraries the host must have.
    pub needs: &'a Needs,
}

impl Preflight<'_> {
    /// The script.
    pub fn render(&self) -> String {
        let needs = self.needs;
        let (min_driver, cuda) = needs
            .driver
            .as_ref()
            .map_or(("", ""), |(v, what)| (v.as_str(), what.as_str()));
        TEMPLATE
            .replace("@LIB_PATH@", &lib_path_block())
            .replace("@LIBRARIES@", &quote_words(&needs.libraries))
            .replace(
                "@MIN_CC@",
                &quote(needs.compute_capability.as_deref().unwrap_or_default()),
            )
            .replace("@MIN_DRIVER@", &quote(min_driver))
            .replace("@CUDA@", &quote(cuda))
            .replace("@MIN_FREE_MIB@", &DEFAULT_MIN_FREE_MIB.to_string())
            .replace("@GPU_QUERY@", &GPU_QUERY.join(" "))
    }
}

/// The flag that skips the GPU, driver and library checks (testing without a GPU).
pub const NO_GPU_CHECKS: &str = "--no-gpu-checks";

/// The prefix of a failed check's line; `cargo xtask deploy` collects these lines into
/// its error.
pub const FAIL_PREFIX: &str = "FAIL  ";

const TEMPLATE: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask bundle`: rebuild the bundle rather than edit this file.
#
#   ./preflight.sh [--no-gpu-checks] [DIR [MIN_FREE_MIB]]
#
# Whether this host can run the bundle: a GPU that nvidia-smi lists; the compute
# capability and the driver version below, when the bundle sets one; every library the
# job loads, found where run.sh looks and on the loader cache; MIN_FREE_MIB MiB free in
# DIR (default @MIN_FREE_MIB@ MiB in this bundle's folder). One line per check, `ok` or `FAIL` with what was expected
# and what was found; the exit status is 1 if any check failed. --no-gpu-checks skips the
# GPU, driver and library checks, for testing on a machine without a GPU.
set -u -o pipefail

gpu_checks=1
if [ "${1:-}" = --no-gpu-checks ]; then
    gpu_checks=0
    shift
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
disk_dir="${1:-$here}"
min_free_mib="${2:-@MIN_FREE_MIB@}"
min_cc=@MIN_CC@
min_driver=@MIN_DRIVER@
driver_for=@CUDA@
libraries=(@LIBRARIES@)
failed=0

ok() { printf 'ok    %s: %s\n' "$1" "$2"; }
skip() { printf 'skip  %s: %s\n' "$1" "$2"; }
fail() {
    printf 'FAIL  %s: expected %s, found %s\n' "$1" "$2" "$3"
    failed=1
}
# When the preflight is stopped (its time limit ran out, or the deploy was interrupted),
# the check that was running says so, rather than the preflight ending without a word.
running="" running_expected=""
checking() { running="$1" running_expected="$2"; }
trap 'fail "$running" "$running_expected" "no answer when the preflight was stopped"; exit 124' TERM
is_version() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)*$ ]]; }
# version_ge A B: whether the dotted number A is at least B (580.159.04 >= 580.65.06).
version_ge() {
    local IFS=.
    local -a a=($1) b=($2)
    local i x y
    for ((i = 0; i < ${#a[@]} || i < ${#b[@]}; i++)); do
        x=$((10#${a[i]:-0}))
        y=$((10#${b[i]:-0}))
        ((x > y)) && return 0
        ((x < y)) && return 1
    done
    return 0
}

checking "library search" "python3 and ldconfig to answer"
@LIB_PATH@

# The GPUs, their compute capability and the driver, from one query; and the libraries.
if [ "$gpu_checks" = 0 ]; then
    skip gpu "--no-gpu-checks (no GPU, compute capability, driver or library checks)"
else
checking gpu "nvidia-smi to list the GPUs"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    fail gpu "nvidia-smi on PATH (it comes with the NVIDIA driver)" "none (PATH=$PATH)"
elif ! gpus="$(nvidia-smi @GPU_QUERY@ 2>&1)"; then
    fail gpu "nvidia-smi to list the GPUs" "it failed: ${gpus//$'\n'/ }"
elif [ -z "$gpus" ]; then
    fail gpu "at least one GPU" "none listed by nvidia-smi"
else
    capable="" seen="" driver=""
    while IFS=, read -r index name cc drv; do
        name="${name# }" cc="${cc// /}" driver="${drv// /}"
        ok gpu "$index: $name (compute capability $cc)"
        seen="${seen:+$seen; }$cc on GPU $index ($name)"
        if [ -z "$capable" ] && is_version "$cc" && version_ge "$cc" "$min_cc"; then
            capable="GPU $index"
        fi
    done <<<"$gpus"
    if [ -z "$min_cc" ]; then
        ok "compute capability" "$seen (the bundle sets no minimum)"
    elif [ -n "$capable" ]; then
        ok "compute capability" "$capable has at least $min_cc"
    else
        fail "compute capability" "at least $min_cc on one GPU" "$seen"
    fi
    if [ -z "$min_driver" ]; then
        ok driver "$driver (the bundle sets no minimum)"
    elif ! is_version "$driver"; then
        fail driver "a version number at least $min_driver" "'$driver'"
    elif version_ge "$driver" "$min_driver"; then
        ok driver "$driver (at least $min_driver)"
    else
        fail driver "at least $min_driver${driver_for:+ ($driver_for)}" "$driver"
    fi
fi

# The libraries: where run.sh puts them on LD_LIBRARY_PATH, else the loader cache.
checking libraries "ldconfig to list the loader cache"
ldconfig="$(command -v ldconfig || echo /sbin/ldconfig)"
cache="$("$ldconfig" -p 2>/dev/null || true)"
IFS=: read -r -a lib_dirs <<<"${LD_LIBRARY_PATH:-}"
for lib in "${libraries[@]}"; do
    where=""
    for d in "${lib_dirs[@]}"; do
        if [ -n "$d" ] && [ -e "$d/$lib" ]; then
            where="$d/$lib"
            break
        fi
    done
    if [ -z "$where" ]; then
        where="$(awk -v lib="$lib" '$1 == lib { print $NF; exit }' <<<"$cache")"
    fi
    if [ -n "$where" ]; then
        ok "library $lib" "$where"
    else
        fail "library $lib" "it in LD_LIBRARY_PATH (${LD_LIBRARY_PATH:-empty}) or on the loader cache (ldconfig -p)" "it in neither"
    fi
done
fi # gpu_checks

# Free disk where the results go. (Not `$dir`: the library search above uses that name.)
checking "free disk" "df to report the free space in $disk_dir"
avail_kib="$(df -Pk -- "$disk_dir" 2>/dev/null | awk 'NR == 2 { print $4 }')"
if ! [[ "$min_free_mib" =~ ^[0-9]+$ ]]; then
    fail "free disk" "a number of MiB as the second argument" "'$min_free_mib'"
elif ! [[ "$avail_kib" =~ ^[0-9]+$ ]]; then
    fail "free disk" "df to report the free space in $disk_dir" "no figure"
elif ((avail_kib / 1024 >= min_free_mib)); then
    ok "free disk" "$((avail_kib / 1024)) MiB in $disk_dir (at least $min_free_mib)"
else
    fail "free disk" "at least $min_free_mib MiB free in $disk_dir" "$((avail_kib / 1024)) MiB"
fi

if [ "$failed" -ne 0 ]; then
    echo "preflight: this host cannot run the bundle"
    exit 1
fi
echo "preflight: ok"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> Needs {
        Needs::new()
            .library("libcublasLt.so.13")
            .compute_capability("8.0")
            .driver("580.65.06", "CUDA 13.0")
    }

    #[test]
    fn every_placeholder_is_filled() {
        for needs in [needs(), Needs::new()] {
            let script = Preflight { needs: &needs }.render();
            assert!(!script.contains("@LIB"), "{script}");
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
    }

    #[test]
    fn the_checks_use_the_pinned_figures() {
        let script = Preflight { needs: &needs() }.render();
        assert!(script.contains("min_cc=8.0\n"));
        assert!(script.contains("min_driver=580.65.06\n"));
        assert!(script.contains("driver_for='CUDA 13.0'\n"));
        assert!(script.contains("libraries=(libcuda.so.1 libcublasLt.so.13)\n"));
        assert!(script.contains("--query-gpu=index,name,compute_cap,driver_version"));
        assert!(script.contains(r#"if [ "${1:-}" = --no-gpu-checks ]; then"#));
        assert!(script.contains("fi # gpu_checks\n"));
        // The same library search as run.sh.
        assert!(script.contains(&lib_path_block()));
    }

    #[test]
    fn without_minimums_the_checks_say_so() {
        let script = Preflight {
            needs: &Needs::new(),
        }
        .render();
        assert!(script.contains("min_cc=''\n"));
        assert!(script.contains("min_driver=''\n"));
        assert!(script.contains("driver_for=''\n"));
        assert!(script.contains("(the bundle sets no minimum)"));
    }
}
