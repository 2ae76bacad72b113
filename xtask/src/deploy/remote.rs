//! The layout of a deploy folder on the host and the fixed scripts that change it.
//!
//! ```text
//! <dir>/releases/<release>/            one folder per release, as the bundle was built
//! <dir>/releases/<release>.incoming/   an upload being checked (left there if it fails)
//! <dir>/current -> releases/<release>  switched only after the checks pass
//! <dir>/runs/<release>/<run>/          each run's results folder (what is fetched back)
//! ```
//!
//! An upload never writes into a release folder: it goes to `.incoming`, seeded with hard
//! links to the release of the same name if there is one (a redeploy: rsync then sends
//! only what changed, usually nothing), and replaces the release only once its checksums
//! and the preflight have passed.

/// A script run on the host by `bash -s`, its values passed as arguments.
#[derive(Debug)]
pub struct Script {
    /// What the echo calls it.
    pub name: &'static str,
    pub text: &'static str,
}

/// `PREPARE DIR RELEASE`: the folders, and the upload folder seeded from the release of
/// the same name.
pub const PREPARE: Script = Script {
    name: "prepare",
    text: r#"set -eu
dir=$1 release=$2
mkdir -p -- "$dir/releases" "$dir/runs"
incoming="$dir/releases/$release.incoming"
rm -rf -- "$incoming"
if [ -d "$dir/releases/$release" ]; then
    cp -al -- "$dir/releases/$release" "$incoming"
fi
"#,
};

/// `HASHES FOLDER`: `sha256sum` of every file under FOLDER, paths relative to it.
pub const HASHES: Script = Script {
    name: "hashes",
    text: r#"set -eu -o pipefail
cd -- "$1"
find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum --
"#,
};

/// `ACTIVATE DIR RELEASE`: the checked upload becomes the release and `current` points
/// at it. The link is made under a temporary name and renamed over `current`, which
/// rename(2) does atomically. A redeploy first moves the old folder of the same name
/// aside, so for that instant a `current` already pointing at it dangles; a job that is
/// running keeps its open files.
pub const ACTIVATE: Script = Script {
    name: "activate",
    text: r#"set -eu
dir=$1 release=$2
cd -- "$dir"
rm -rf -- "releases/$release.old"
if [ -e "releases/$release" ]; then
    mv -T -- "releases/$release" "releases/$release.old"
fi
mv -T -- "releases/$release.incoming" "releases/$release"
ln -sfn -- "releases/$release" current.new
mv -T -- current.new current
rm -rf -- "releases/$release.old"
echo "current -> $(readlink current)"
"#,
};

/// `GUARD PIDFILE LIMIT_S PATH_PREFIX EXITFILE COMMAND...`: runs COMMAND with a time
/// limit in a process group of its own, whose id it writes to PIDFILE while it runs, so
/// that [`STOP`] can end it and everything it started. `timeout` leads that group, and
/// the limit holds even when the connection to the host is lost. PATH_PREFIX (when not
/// empty) goes first on PATH (the tests' stand-in nvidia-smi); EXITFILE (when not empty)
/// gets `<status> <unix time>` when COMMAND ends.
pub const GUARD: Script = Script {
    name: "guard",
    text: r#"set -u
pidfile=$1 limit=$2 prefix=$3 exitfile=$4
shift 4
if [ -n "$prefix" ]; then
    export PATH="$prefix:$PATH"
fi
mkdir -p -- "$(dirname -- "$pidfile")"
timeout --kill-after=5 "$limit" "$@" </dev/null &
pid=$!
printf '%s\n' "$pid" >"$pidfile"
wait "$pid"
rc=$?
if [ -n "$exitfile" ]; then
    printf '%s %s\n' "$rc" "$(date +%s)" >"$exitfile"
fi
rm -f -- "$pidfile"
exit "$rc"
"#,
};

/// `STOP PIDFILE`: ends the process group a [`GUARD`] runs, TERM first and KILL two
/// seconds later; nothing to do when it already ended.
pub const STOP: Script = Script {
    name: "stop",
    text: r#"set -u
pid="$(cat -- "$1" 2>/dev/null)" || exit 0
case "$pid" in
    '' | *[!0-9]*) exit 0 ;;
esac
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM -- "$pid" 2>/dev/null || exit 0
for _ in $(seq 40); do
    kill -0 -- "-$pid" 2>/dev/null || exit 0
    sleep 0.05
done
kill -KILL -- "-$pid" 2>/dev/null
exit 0
"#,
};

/// Paths of one release in the deploy folder `dir` on the host.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The deploy folder as given: relative paths are taken from the remote home.
    pub dir: String,
    pub release: String,
}

impl Layout {
    pub fn new(dir: &str, release: &str) -> Layout {
        let trimmed = dir.trim_end_matches('/');
        Layout {
            dir: if trimmed.is_empty() { "/" } else { trimmed }.to_string(),
            release: release.to_string(),
        }
    }

    fn join(&self, rest: &str) -> String {
        if self.dir == "/" {
            format!("/{rest}")
        } else {
            format!("{}/{rest}", self.dir)
        }
    }

    pub fn release_dir(&self) -> String {
        self.join(&format!("releases/{}", self.release))
    }

    pub fn incoming(&self) -> String {
        self.join(&format!("releases/{}.incoming", self.release))
    }

    pub fn current(&self) -> String {
        self.join("current")
    }

    /// Where a [`GUARD`] writes the process group of what it runs (`name`: the run, or
    /// `preflight-<run>`).
    pub fn pidfile(&self, name: &str) -> String {
        self.join(&format!("runs/.{name}.pid"))
    }

    pub fn run_dir(&self, run: &str) -> String {
        self.join(&format!("runs/{}/{run}", self.release))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sit_under_the_deploy_folder() {
        let l = Layout::new("stepgraph/", "abc1234-dirty");
        assert_eq!(l.release_dir(), "stepgraph/releases/abc1234-dirty");
        assert_eq!(l.incoming(), "stepgraph/releases/abc1234-dirty.incoming");
        assert_eq!(l.current(), "stepgraph/current");
        assert_eq!(l.run_dir("r1"), "stepgraph/runs/abc1234-dirty/r1");
        assert_eq!(Layout::new("/", "r").current(), "/current");
    }

    #[test]
    fn scripts_take_their_values_as_arguments() {
        for script in [&PREPARE, &HASHES, &ACTIVATE, &GUARD, &STOP] {
            assert!(script.text.starts_with("set -"), "{}", script.name);
            assert!(script.text.contains("$1"), "{}", script.name);
        }
        assert!(ACTIVATE.text.contains("mv -T -- current.new current"));
    }
}
