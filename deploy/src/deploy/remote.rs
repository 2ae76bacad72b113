//! The layout of a deploy folder on the host and the fixed scripts that change it.
//!
//! ```text
//! <dir>/releases/<release>/                one folder per release, as the bundle was built;
//!                                          never written again once it has its name
//! <dir>/releases/.incoming-<release>/     an upload being checked; one that fails is
//!                                          resumed by the next upload of the same
//!                                          release, and removed by `clean` or by the
//!                                          next deploy of another
//! <dir>/releases/.damaged-<release>-<run>/ a release that failed its checksums, replaced
//!                                          by a fresh upload (until `clean`)
//! <dir>/current -> releases/<release>      switched only after the checks pass
//! <dir>/runs/<release>/<run>/              each run's results folder (what is fetched back)
//! <dir>/runs/<release>/<run>.json          the run's record: what started it, how, when
//! <dir>/runs/<release>/<run>.exit          `<status> <end> <start>` (unix times), written
//!                                          when it ends
//! <dir>/runs/.<run>.pid                    while a job or preflight runs: its process group
//! <dir>/history                            one line per change of `current` and per stage:
//!                                          `<unix time> <event> <release> <from> <by>`,
//!                                          tab-separated
//! <dir>/.lock                              the deploy folder's lock (see `lock.rs`)
//! ```
//!
//! A release's name says what it holds (the program, the revision, the hash of its
//! content: see [`crate::bundle::build_info::Identity::release`]), so an upload never
//! goes into a release folder: it goes to a folder of its own, and is renamed to its
//! release's name once its checksums and the preflight have passed. Files that the
//! release `current` points at already has are copied there on the host (rsync's
//! `--copy-dest`: copies, not hard links, so nothing done to the upload reaches a live
//! file), and only the others travel. The upload folder is named by the release alone,
//! so an interrupted upload is resumed by the next deploy of the same bundle: what is
//! there whole is not sent again, and a file cut off midway (kept in rsync's
//! [`PARTIAL_DIR`]) continues where it stopped. It is still checked as a whole before it
//! gets its release's name.

/// rsync's `--partial-dir`, inside each folder of an upload: where a file cut off
/// midway is kept for the next upload to continue.
pub const PARTIAL_DIR: &str = ".rsync-partial";

/// A script run on the host by `bash`, its values passed as arguments.
#[derive(Debug)]
pub struct Script {
    /// What the echo calls it.
    pub name: &'static str,
    pub text: &'static str,
}

/// `PREPARE DIR RELEASE`: the folders; the upload folders failed uploads of other
/// releases left are removed (the deploy holds the folder's lock, so none is in use);
/// then what is there, one fact a line: `stale <bytes> <name>` for each folder removed
/// (`unremovable <name>` for one that could not be), `incoming <bytes> <files>` when an
/// upload of RELEASE was left to resume, `releases <the releases folder's absolute path>`, `current <target of current, or
/// nothing>` and, if the release is there, `present`.
pub const PREPARE: Script = Script {
    name: "prepare",
    text: r#"set -eu
dir=$1 release=$2
mkdir -p -- "$dir/releases" "$dir/runs"
cd -- "$dir"
for d in releases/.incoming-*; do
    [ -d "$d" ] || continue
    name="${d#releases/}"
    bytes="$(du -sb -- "$d" 2>/dev/null | cut -f1)"
    if [ "$name" = ".incoming-$release" ]; then
        printf 'incoming %s %s\n' "${bytes:-0}" "$(find "$d" -type f | wc -l)"
    elif rm -rf -- "$d"; then
        printf 'stale %s %s\n' "${bytes:-0}" "$name"
    else
        printf 'unremovable %s\n' "$name"
    fi
done
printf 'releases %s\n' "$(cd releases && pwd -P)"
printf 'current %s\n' "$(readlink current 2>/dev/null || true)"
if [ -d "releases/$release" ]; then
    echo present
fi
"#,
};

/// `HASHES FOLDER`: `sha256sum` of every file under FOLDER, paths relative to it; then a
/// line `@@ SHA256SUMS` and the folder's own `SHA256SUMS`, if it has one.
pub const HASHES: Script = Script {
    name: "hashes",
    text: r#"set -eu -o pipefail
cd -- "$1"
find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum --
echo "@@ SHA256SUMS"
cat SHA256SUMS 2>/dev/null || true
"#,
};

/// The line [`HASHES`] puts between the hashes and the manifest.
pub const HASHES_SEPARATOR: &str = "@@ SHA256SUMS\n";

/// `PLACE DIR RELEASE UPLOAD ASIDE EVENT BY`: the checked upload UPLOAD (a folder name
/// in `releases/`, or empty when the release is there already) becomes the release; a
/// folder of that name already there (one that failed its checksums) is first moved to
/// ASIDE. Unless EVENT is `staged`, `current` then points at the release: the link is
/// made under a temporary name and renamed over `current`, which rename(2) does
/// atomically. EVENT (`switched`, `rolled-back`, `staged`) goes into `history`, with
/// where `current` pointed before and BY.
pub const PLACE: Script = Script {
    name: "place",
    text: r#"set -eu
dir=$1 release=$2 upload=$3 aside=$4 event=$5 by=$6
cd -- "$dir"
if [ -n "$upload" ]; then
    if [ -e "releases/$release" ]; then
        mv -T -- "releases/$release" "releases/$aside"
    fi
    mv -T -- "releases/$upload" "releases/$release"
fi
from="$(readlink current 2>/dev/null || true)"
from="${from#releases/}"
if [ "$event" != staged ]; then
    ln -sfn -- "releases/$release" current.new
    mv -T -- current.new current
    echo "current -> $(readlink current)"
fi
printf '%s\t%s\t%s\t%s\t%s\n' "$(date +%s)" "$event" "$release" "${from:--}" "$by" >>history
"#,
};

/// `WRITE FILE TEXT`: TEXT and a newline into FILE (its folder made), through a
/// temporary file renamed over it, so a reader never sees half of it.
pub const WRITE: Script = Script {
    name: "write",
    text: r#"set -eu
mkdir -p -- "$(dirname -- "$1")"
printf '%s\n' "$2" >"$1.tmp"
mv -f -- "$1.tmp" "$1"
"#,
};

/// `INSPECT DIR`: what the deploy folder holds, as sections each opened by a line
/// `@@ <kind> <names...>`: `current <target>`, `lock free` or `lock held` (its holder on
/// the next line), `release <name>` (its build-info.json follows), `leftover <name>` (an
/// upload or damaged folder), `run <release> <run>` (its record follows), `exit
/// <release> <run>` (its exit file follows), `running <release> <run>`, `history` (the
/// history file follows).
pub const INSPECT: Script = Script {
    name: "inspect",
    text: r#"set -u
cd -- "$1" 2>/dev/null || { echo "@@ missing"; exit 0; }
printf '@@ current %s\n' "$(readlink current 2>/dev/null || true)"
if [ ! -e .lock ] || flock -n .lock true 2>/dev/null; then
    echo "@@ lock free"
else
    echo "@@ lock held"
    head -c 600 .lock | tr '\n' ' '
    echo
fi
for d in releases/* releases/.[!.]*; do
    [ -d "$d" ] || continue
    name="${d#releases/}"
    case "$name" in
        .*) printf '@@ leftover %s\n' "$name" ;;
        *)
            printf '@@ release %s\n' "$name"
            cat -- "$d/build-info.json" 2>/dev/null
            echo
            ;;
    esac
done
for record in runs/*/*.json; do
    [ -f "$record" ] || continue
    rel="${record#runs/}" && rel="${rel%%/*}"
    run="${record##*/}" && run="${run%.json}"
    printf '@@ run %s %s\n' "$rel" "$run"
    cat -- "$record"
    echo
    if [ -f "runs/$rel/$run.exit" ]; then
        printf '@@ exit %s %s\n' "$rel" "$run"
        cat -- "runs/$rel/$run.exit"
    elif pid="$(cat -- "runs/.$run.pid" 2>/dev/null)" && kill -0 -- "$pid" 2>/dev/null; then
        printf '@@ running %s %s\n' "$rel" "$run"
    fi
done
echo "@@ history"
cat history 2>/dev/null || true
"#,
};

/// `REMOVE DIR NAME...`: removes the folders `releases/NAME` (names checked here
/// first), printing `removed <bytes> <name>` for each.
pub const REMOVE: Script = Script {
    name: "remove",
    text: r#"set -eu
cd -- "$1/releases"
shift
for name in "$@"; do
    case "$name" in
        '' | . | .. | */*) echo "refusing to remove '$name'" >&2; exit 2 ;;
    esac
    bytes="$(du -sb -- "$name" 2>/dev/null | cut -f1)"
    rm -rf -- "$name"
    printf 'removed %s %s\n' "${bytes:-0}" "$name"
done
"#,
};

/// `GUARD PIDFILE LIMIT_S PATH_PREFIX EXITFILE COMMAND...`: runs COMMAND with a time
/// limit in a process group of its own, whose id it writes to PIDFILE while it runs, so
/// that [`STOP`] can end it and everything it started. `timeout` leads that group, and
/// the limit holds even when the connection to the host is lost. PATH_PREFIX (when not
/// empty) goes first on PATH (the tests' stand-in nvidia-smi); EXITFILE (when not empty)
/// gets `<status> <unix time of the end> <unix time of the start>` when COMMAND ends
/// (both times the host's, so that a skewed clock here does not skew the duration).
pub const GUARD: Script = Script {
    name: "guard",
    text: r#"set -u
pidfile=$1 limit=$2 prefix=$3 exitfile=$4
shift 4
if [ -n "$prefix" ]; then
    export PATH="$prefix:$PATH"
fi
mkdir -p -- "$(dirname -- "$pidfile")"
start="$(date +%s)"
timeout --kill-after=5 "$limit" "$@" </dev/null &
pid=$!
printf '%s\n' "$pid" >"$pidfile"
wait "$pid"
rc=$?
if [ -n "$exitfile" ]; then
    printf '%s %s %s\n' "$rc" "$(date +%s)" "$start" >"$exitfile"
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

/// Paths in the deploy folder `dir` on the host.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The deploy folder as given: relative paths are taken from the remote home.
    pub dir: String,
}

impl Layout {
    pub fn new(dir: &str) -> Layout {
        let trimmed = dir.trim_end_matches('/');
        Layout {
            dir: if trimmed.is_empty() { "/" } else { trimmed }.to_string(),
        }
    }

    fn join(&self, rest: &str) -> String {
        if self.dir == "/" {
            format!("/{rest}")
        } else {
            format!("{}/{rest}", self.dir)
        }
    }

    pub fn release_dir(&self, release: &str) -> String {
        self.join(&format!("releases/{release}"))
    }

    /// The upload folder's name (in `releases/`) of `release`: the same for every
    /// deploy of it, so that one resumes what an interrupted one sent.
    pub fn upload(release: &str) -> String {
        format!(".incoming-{release}")
    }

    /// Where a damaged release goes when a fresh upload replaces it (in `releases/`).
    pub fn aside(release: &str, run: &str) -> String {
        format!(".damaged-{release}-{run}")
    }

    pub fn current(&self) -> String {
        self.join("current")
    }

    /// Where a [`GUARD`] writes the process group of what it runs (`name`: the run, or
    /// `preflight-<run>`).
    pub fn pidfile(&self, name: &str) -> String {
        self.join(&format!("runs/.{name}.pid"))
    }

    pub fn run_dir(&self, release: &str, run: &str) -> String {
        self.join(&format!("runs/{release}/{run}"))
    }

    /// The run's record (`.json`) or exit file (`.exit`), beside its results folder.
    pub fn run_file(&self, release: &str, run: &str, ext: &str) -> String {
        self.join(&format!("runs/{release}/{run}.{ext}"))
    }
}

/// The release `current` points at, from the link's target (`releases/<name>`), if it
/// is one a deploy made.
pub fn current_release(target: &str) -> Option<&str> {
    let name = target.strip_prefix("releases/")?;
    is_release_name(name).then_some(name)
}

/// Whether `name` can be a release folder's name: letters, digits, `-`, `_`, `.`, not
/// starting with a `.` (the upload and damaged folders do).
pub fn is_release_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sit_under_the_deploy_folder() {
        let l = Layout::new("stepgraph/");
        let r = "dqn-abc1234-dirty-0123";
        assert_eq!(
            l.release_dir(r),
            "stepgraph/releases/dqn-abc1234-dirty-0123"
        );
        assert_eq!(Layout::upload(r), ".incoming-dqn-abc1234-dirty-0123");
        assert_eq!(Layout::aside(r, "r1"), ".damaged-dqn-abc1234-dirty-0123-r1");
        assert_eq!(l.current(), "stepgraph/current");
        assert_eq!(
            l.run_dir(r, "r1"),
            "stepgraph/runs/dqn-abc1234-dirty-0123/r1"
        );
        assert_eq!(
            l.run_file(r, "r1", "json"),
            "stepgraph/runs/dqn-abc1234-dirty-0123/r1.json"
        );
        assert_eq!(l.pidfile("r1"), "stepgraph/runs/.r1.pid");
        assert_eq!(Layout::new("/").current(), "/current");
        assert_eq!(current_release("releases/dqn-a-b"), Some("dqn-a-b"));
        assert_eq!(current_release("releases/.incoming-x"), None);
        assert_eq!(current_release("/elsewhere"), None);
    }

    #[test]
    fn scripts_take_their_values_as_arguments() {
        for script in [
            &PREPARE, &HASHES, &PLACE, &WRITE, &INSPECT, &REMOVE, &GUARD, &STOP,
        ] {
            assert!(script.text.starts_with("set -"), "{}", script.name);
            assert!(script.text.contains("$1"), "{}", script.name);
        }
        assert!(PLACE.text.contains("mv -T -- current.new current"));
        assert!(HASHES.text.ends_with(&format!(
            "echo \"{}\"\ncat SHA256SUMS 2>/dev/null || true\n",
            HASHES_SEPARATOR.trim_end()
        )));
    }
}
