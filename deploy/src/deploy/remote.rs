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
//! <dir>/runs/<release>/<run>.log           the job's output (stdout and stderr), as it comes
//! <dir>/runs/<release>/<run>.exit          `<status> <end> <start> <how>` (unix times; how:
//!                                          `exited`, `timed-out`, `signal <NAME>`,
//!                                          `cancelled <NAME>`), written when it ends
//! <dir>/runs/.<run>.pid                    while a job runs: its process group and its
//!                                          supervisor's pid (a preflight's: its group)
//! <dir>/runs/.<run>.cancel                 while a cancel stops it: the signal sent
//! <dir>/history                            one line per change of `current` and per stage:
//!                                          `<unix time> <event> <release> <from> <by>`,
//!                                          tab-separated
//! <dir>/.lock                              the deploy folder's lock (see `lock.rs`): its
//!                                          holder, and `@ pid <pid on the host>`
//! ```
//!
//! A job runs detached from the connection that started it ([`START`], [`JOB`]): in a
//! session of its own, its output going to its log, its end recorded in its exit file
//! by a supervisor that outlives it. The lock covers the changes to the folder (an
//! upload, the switch of `current`, `clean`, `rollback`) and a job's start, not its run:
//! what a running job uses is known from its records (`clean` keeps its release).
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
    head -n 1 .lock | head -c 600
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
    elif [ -s "runs/.$run.pid" ] && read -r group super _ <"runs/.$run.pid" &&
        kill -0 -- "${super:-$group}" 2>/dev/null; then
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

/// `STOP PIDFILE GRACE_TENTHS MARKER`: ends the process group a [`GUARD`] or a [`JOB`]
/// runs (the first word of PIDFILE), TERM first and KILL when it has not ended
/// GRACE_TENTHS tenths of a second later. MARKER (when not empty) gets the signal's name
/// first, so that the job's exit file says it was cancelled. Says what it did, a line a
/// step: `none` (nothing ran), `term <group>`, `ended <tenths>`, `killed <group>`.
pub const STOP: Script = Script {
    name: "stop",
    text: r#"set -u
pidfile=$1 grace=$2 marker=$3
group=
if [ -s "$pidfile" ]; then
    read -r group _ <"$pidfile" || true
fi
case "$group" in
    '' | *[!0-9]*) echo none; exit 0 ;;
esac
if ! kill -0 -- "-$group" 2>/dev/null; then
    echo none
    exit 0
fi
if [ -n "$marker" ]; then
    echo TERM >"$marker"
fi
kill -TERM -- "-$group" 2>/dev/null || kill -TERM -- "$group" 2>/dev/null
echo "term $group"
for i in $(seq "$grace"); do
    if ! kill -0 -- "-$group" 2>/dev/null; then
        echo "ended $i"
        exit 0
    fi
    sleep 0.1
done
if [ -n "$marker" ]; then
    echo KILL >"$marker"
fi
kill -KILL -- "-$group" 2>/dev/null
echo "killed $group"
exit 0
"#,
};

/// `JOB PIDFILE LIMIT_S PATH_PREFIX EXITFILE MARKER COMMAND...`: the supervisor of a
/// detached job, which [`START`] runs in a session of its own with its output going to
/// the job's log. `timeout` leads the job's own process group (which [`STOP`] signals)
/// and holds its limit; this shell, outside that group, outlives the job to write
/// EXITFILE: `<status> <end> <start> <how>`, how being `exited`, `timed-out`, `signal
/// <NAME>` or, when MARKER names the signal a cancel sent, `cancelled <NAME>`. PIDFILE
/// holds `<group> <this shell's pid>` while it runs.
pub const JOB: Script = Script {
    name: "job",
    text: r#"set -u
pidfile=$1 limit=$2 prefix=$3 exitfile=$4 marker=$5
shift 5
if [ -n "$prefix" ]; then
    export PATH="$prefix:$PATH"
fi
start="$(date +%s)"
timeout --kill-after=5 "$limit" "$@" </dev/null &
job=$!
printf '%s %s\n' "$job" "$$" >"$pidfile.tmp"
mv -f -- "$pidfile.tmp" "$pidfile"
# A signal to this shell goes on to the job; the shell stays to record the end.
got=
trap 'got=1; kill -TERM -- "-$job" 2>/dev/null' TERM INT HUP
wait "$job"
rc=$?
while [ -n "$got" ] && [ "$rc" -gt 128 ]; do
    got=
    wait "$job"
    rc=$?
done
end="$(date +%s)"
how=exited
if [ -s "$marker" ]; then
    how="cancelled $(tail -n 1 -- "$marker")"
elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ $((end - start)) -ge "$limit" ]; then
    how=timed-out
elif [ "$rc" -gt 128 ] && [ "$rc" -lt 192 ]; then
    how="signal $(kill -l "$rc" 2>/dev/null || echo $((rc - 128)))"
fi
printf '%s %s %s %s\n' "$rc" "$end" "$start" "$how" >"$exitfile.tmp"
mv -f -- "$exitfile.tmp" "$exitfile"
rm -f -- "$pidfile" "$marker"
"#,
};

/// `START SUPERVISOR PIDFILE LOG RECORDFILE RECORD LIMIT_S PATH_PREFIX EXITFILE MARKER
/// COMMAND...`: writes the run's record, then starts SUPERVISOR (the text of [`JOB`])
/// with the rest in a session of its own (`setsid`), detached from this connection,
/// its output into LOG; prints `started <group> <supervisor pid>` once it runs (or
/// `started` when it has already ended).
pub const START: Script = Script {
    name: "start",
    text: r#"set -eu
supervisor=$1 pidfile=$2 log=$3 recordfile=$4 record=$5
shift 5
exitfile=$3
mkdir -p -- "$(dirname -- "$pidfile")" "$(dirname -- "$recordfile")"
printf '%s\n' "$record" >"$recordfile.tmp"
mv -f -- "$recordfile.tmp" "$recordfile"
: >"$log"
setsid bash -c "$supervisor" stepgraph-job "$pidfile" "$@" </dev/null >>"$log" 2>&1 &
for _ in $(seq 200); do
    if [ -s "$pidfile" ] || [ -e "$exitfile" ]; then
        break
    fi
    sleep 0.05
done
if [ -s "$pidfile" ]; then
    printf 'started %s\n' "$(cat -- "$pidfile")"
elif [ -e "$exitfile" ]; then
    echo started
else
    echo "its supervisor did not start within 10s; the log says:" >&2
    tail -n 20 -- "$log" >&2
    exit 1
fi
"#,
};

/// `STATE PIDFILE EXITFILE`: how a job stands: `exit <its exit file>`, `running`, or
/// `gone` (no exit recorded and no supervisor: the host went down, or it was killed).
pub const STATE: Script = Script {
    name: "state",
    text: r#"set -u
if [ -f "$2" ]; then
    printf 'exit %s\n' "$(cat -- "$2")"
    exit 0
fi
if [ -s "$1" ] && read -r group super _ <"$1" && kill -0 -- "${super:-$group}" 2>/dev/null; then
    echo running
    exit 0
fi
# It may have ended between the two looks.
if [ -f "$2" ]; then
    printf 'exit %s\n' "$(cat -- "$2")"
    exit 0
fi
echo gone
"#,
};

/// `FOLLOW LOG PIDFILE EXITFILE LINES FOLLOW`: the last LINES lines of a job's log
/// (`+1`: all of it) and, if FOLLOW is 1 and the job runs, what it writes next, until
/// its supervisor ends (after it recorded the exit). Exits 3 when there is no log.
pub const FOLLOW: Script = Script {
    name: "follow",
    text: r#"set -u
log=$1 pidfile=$2 exitfile=$3 lines=$4 follow=$5
if [ ! -f "$log" ]; then
    echo "no log at $log" >&2
    exit 3
fi
super=
if [ "$follow" = 1 ] && [ ! -e "$exitfile" ] && [ -s "$pidfile" ]; then
    read -r _ super _ <"$pidfile" || true
fi
if [ -n "$super" ] && kill -0 "$super" 2>/dev/null; then
    exec tail -n "$lines" -s 0.2 --pid="$super" -F -- "$log"
fi
exec tail -n "$lines" -- "$log"
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

    /// Where a [`GUARD`] or a [`JOB`] writes the process group of what it runs (`name`:
    /// the run, or `preflight-<run>`).
    pub fn pidfile(&self, name: &str) -> String {
        self.join(&format!("runs/.{name}.pid"))
    }

    /// Where a cancel writes the signal it sends to the job `run`.
    pub fn cancel_marker(&self, run: &str) -> String {
        self.join(&format!("runs/.{run}.cancel"))
    }

    pub fn run_dir(&self, release: &str, run: &str) -> String {
        self.join(&format!("runs/{release}/{run}"))
    }

    /// The run's record (`.json`), log (`.log`) or exit file (`.exit`), beside its
    /// results folder.
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
            &PREPARE, &HASHES, &PLACE, &INSPECT, &REMOVE, &GUARD, &STOP, &JOB, &START, &STATE,
            &FOLLOW,
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
