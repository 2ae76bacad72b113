//! The profile record: a measured [`Profile`] as a small JSON document, so that a profile
//! taken on a GPU host can be saved, committed, and drawn again on a machine without a
//! GPU (`cargo xtask render-profile`).
//!
//! A record is a JSON object with the format's name and version, then the profile's
//! fields as [`Profile`] names them, one op, wait or stream per line:
//!
//! ```text
//! {
//!   "format": "stepgraph-profile",
//!   "version": 2,
//!   "step": "fork_join",
//!   "device": "NVIDIA H100 80GB HBM3",
//!   "streams": [
//!     "main",
//!     "chain[0]"
//!   ],
//!   "ops": [
//!     {"name": "seed", "func": "seed", "stream": 0, "start_ms": 0.0, "end_ms": 0.005},
//!     {"name": "chain[0]", "func": "chain", "stream": 1, "start_ms": 0.0071, "end_ms": 0.3612}
//!   ],
//!   "waits": [
//!     {"from": 0, "to": 1}
//!   ],
//!   "critical_path": [
//!     0,
//!     1
//!   ],
//!   "total_ms": 0.3725
//! }
//! ```
//!
//! `stream` is an index into `streams` (the origin first); `from`, `to` and the
//! `critical_path` entries are indices into `ops` (program order); times are in
//! milliseconds after the replay began, written so that they read back to the same bits.
//! Every field is required; other fields are ignored. [`from_str`] refuses a record that
//! breaks a rule (an index out of range, a time that is not finite, an op ending before it
//! starts, a negative total), and [`to_string`] refuses to write one.
//!
//! Version 1 was a line-based text format; it is recognised and refused by version.

use serde::{Deserialize, Serialize};
use stepgraph_plan::Profile;

use crate::{Error, json};

/// The record's `format` field.
pub const FORMAT: &str = "stepgraph-profile";
/// The record's `version` field: the version this crate writes and the only one it
/// reads.
pub const VERSION: u32 = 2;

/// The first line of a version 1 record, the line-based text format.
const TEXT_HEADER: &str = "# stepgraph profile v";

/// The profile as a record, which [`from_str`] reads back to an equal profile; the same
/// profile gives the same bytes. Refuses, with the error [`from_str`] would give, a
/// profile that breaks a rule of the record (see the [module](self) documentation).
///
/// ```
/// use stepgraph_picture::{OpTiming, Profile, record};
///
/// let profile = Profile {
///     step: "one".into(),
///     device: "test".into(),
///     streams: vec!["main".into()],
///     ops: vec![OpTiming {
///         name: "f[0]".into(), func: "f".into(), stream: 0, start_ms: 0.0, end_ms: 1.0,
///     }],
///     waits: vec![],
///     critical_path: vec![0],
///     total_ms: 1.0,
/// };
/// let text = record::to_string(&profile)?;
/// assert!(text.starts_with("{\n  \"format\": \"stepgraph-profile\",\n  \"version\": 2,\n"));
/// assert_eq!(record::from_str(&text)?, profile);
/// # Ok::<(), stepgraph_picture::Error>(())
/// ```
pub fn to_string(profile: &Profile) -> Result<String, Error> {
    check(profile)?;
    let record = Record {
        format: FORMAT,
        version: VERSION,
        profile,
    };
    json::to_string(&record).map_err(Error::Write)
}

/// Reads a record written by [`to_string`] (see the [module](self) documentation for the
/// format). Errors say what was expected and what was found, and where: the line and
/// column of a syntax error, the field (`ops[3].stream`) of a value that breaks a rule.
///
/// ```
/// use stepgraph_picture::{Error, record};
///
/// let text = r#"{"format": "stepgraph-profile", "version": 2, "step": "s",
///     "device": "test", "streams": ["main"],
///     "ops": [{"name": "a", "func": "a", "stream": 1, "start_ms": 0, "end_ms": 1}],
///     "waits": [], "critical_path": [0], "total_ms": 1}"#;
/// let e = record::from_str(text).unwrap_err();
/// assert!(matches!(e, Error::RecordValue { .. }));
/// assert_eq!(
///     e.to_string(),
///     "profile record: ops[0].stream (op `a`): expected a stream index below 1, found `1`"
/// );
/// ```
pub fn from_str(text: &str) -> Result<Profile, Error> {
    if let Some(version) = text_record_version(text) {
        return Err(Error::RecordVersion {
            expected: VERSION,
            found: format!("the line-based text record of version {version}"),
        });
    }
    // The header first, so that a record of another version is refused by its version
    // rather than by whatever field that version changed.
    let header: Header = serde_json::from_str(text).map_err(Error::RecordSyntax)?;
    check_header(&header)?;
    let profile: Profile = serde_json::from_str(text).map_err(Error::RecordSyntax)?;
    check(&profile)?;
    Ok(profile)
}

/// What [`to_string`] writes: the format's name and version, then the profile's fields.
#[derive(Serialize)]
struct Record<'a> {
    format: &'static str,
    version: u32,
    #[serde(flatten)]
    profile: &'a Profile,
}

/// What [`from_str`] reads before the profile; as JSON values, so that a wrong type is
/// reported as what was found.
#[derive(Deserialize)]
#[serde(expecting = "a profile record (a JSON object)")]
struct Header {
    format: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
}

/// The version of a line-based text record (`# stepgraph profile v1`), if `text` is one.
fn text_record_version(text: &str) -> Option<&str> {
    let first = text.trim_start().lines().next()?;
    Some(first.strip_prefix(TEXT_HEADER)?.trim_end())
}

fn check_header(header: &Header) -> Result<(), Error> {
    let found = |value: &Option<serde_json::Value>, field: &str| match value {
        Some(v) => format!("`{v}`"),
        None => format!("no `{field}` field"),
    };
    if header.format.as_ref().and_then(|v| v.as_str()) != Some(FORMAT) {
        return Err(Error::RecordFormat {
            expected: FORMAT,
            found: found(&header.format, "format"),
        });
    }
    if header.version.as_ref().and_then(|v| v.as_u64()) != Some(VERSION.into()) {
        return Err(Error::RecordVersion {
            expected: VERSION,
            found: found(&header.version, "version"),
        });
    }
    Ok(())
}

/// The rules of a record, checked in turn; the first broken one is the error.
fn check(p: &Profile) -> Result<(), Error> {
    total_is_a_duration(p)?;
    ops_run_on_known_streams(p)?;
    ops_have_finite_ordered_times(p)?;
    waits_join_known_ops(p)?;
    critical_path_names_known_ops(p)
}

fn value_error(at: String, expected: impl Into<String>, found: impl ToString) -> Error {
    Error::RecordValue {
        at,
        expected: expected.into(),
        found: found.to_string(),
    }
}

/// `ops[3].stream (op `chain[2]`)`: a field of an op, with the op's name.
fn op_field(p: &Profile, i: usize, field: &str) -> String {
    format!("ops[{i}].{field} (op `{}`)", p.ops[i].name)
}

/// What an index into `len` items (`stream`s, `op`s) must be.
fn index_below(what: &str, len: usize) -> String {
    let a = if what.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    if len == 0 {
        format!("{a} {what} index, but the record has no {what}s")
    } else {
        format!("{a} {what} index below {len}")
    }
}

/// The total scales the timeline's axis and divides the overlap: a negative or
/// non-finite one draws nothing sensible.
fn total_is_a_duration(p: &Profile) -> Result<(), Error> {
    if p.total_ms.is_finite() && p.total_ms >= 0.0 {
        return Ok(());
    }
    let expected = "a finite time of at least 0 milliseconds";
    Err(value_error("total_ms".into(), expected, p.total_ms))
}

/// An op on a stream past the streams has no lane to be drawn on and no track in a
/// trace.
fn ops_run_on_known_streams(p: &Profile) -> Result<(), Error> {
    let n = p.streams.len();
    match p.ops.iter().position(|op| op.stream >= n) {
        None => Ok(()),
        Some(i) => Err(value_error(
            op_field(p, i, "stream"),
            index_below("stream", n),
            p.ops[i].stream,
        )),
    }
}

/// A bar needs two finite ends, the end no earlier than the start: otherwise busy time,
/// overlap and the critical path's length are nonsense.
fn ops_have_finite_ordered_times(p: &Profile) -> Result<(), Error> {
    for (i, op) in p.ops.iter().enumerate() {
        for (field, t) in [("start_ms", op.start_ms), ("end_ms", op.end_ms)] {
            if !t.is_finite() {
                let expected = "a finite time in milliseconds";
                return Err(value_error(op_field(p, i, field), expected, t));
            }
        }
        if op.end_ms < op.start_ms {
            let expected = format!("an end time of at least the start, {}", op.start_ms);
            return Err(value_error(op_field(p, i, "end_ms"), expected, op.end_ms));
        }
    }
    Ok(())
}

/// A wait names the two ops its arrow joins; one past the ops has nothing to join.
fn waits_join_known_ops(p: &Profile) -> Result<(), Error> {
    let n = p.ops.len();
    for (k, w) in p.waits.iter().enumerate() {
        for (field, i) in [("from", w.from), ("to", w.to)] {
            if i >= n {
                return Err(value_error(
                    format!("waits[{k}].{field}"),
                    index_below("op", n),
                    i,
                ));
            }
        }
    }
    Ok(())
}

/// The critical path's length is summed over the ops it names; one past the ops would be
/// silently dropped from it.
fn critical_path_names_known_ops(p: &Profile) -> Result<(), Error> {
    let n = p.ops.len();
    match p.critical_path.iter().position(|&i| i >= n) {
        None => Ok(()),
        Some(k) => Err(value_error(
            format!("critical_path[{k}]"),
            index_below("op", n),
            p.critical_path[k],
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use serde_json::{Value, json};
    use stepgraph_plan::WaitEdge;

    use super::*;
    use crate::testing::{fork_join, op};

    fn record_of(p: &Profile) -> Value {
        serde_json::from_str(&to_string(p).unwrap()).unwrap()
    }

    /// The error and its chain of sources, as a chain printer shows them.
    fn chain(e: &Error) -> String {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    }

    fn err(record: &Value) -> String {
        chain(&from_str(&record.to_string()).unwrap_err())
    }

    #[test]
    fn record_round_trips_byte_for_byte_and_reads_crlf() {
        let p = fork_join();
        let text = to_string(&p).unwrap();
        assert_eq!(from_str(&text).unwrap(), p);
        assert_eq!(to_string(&from_str(&text).unwrap()).unwrap(), text);
        assert!(
            text.starts_with(
                "{\n  \"format\": \"stepgraph-profile\",\n  \"version\": 2,\n  \"step\": \"fork_join\",\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "\n    {\"name\": \"chain[1]\", \"func\": \"chain\", \"stream\": 2, \
                 \"start_ms\": 0.009, \"end_ms\": 0.362},\n"
            ),
            "one op per line:\n{text}"
        );
        assert_eq!(from_str(&text.replace('\n', "\r\n")).unwrap(), p);
        // Written compactly by another tool, it reads the same.
        assert_eq!(from_str(&record_of(&p).to_string()).unwrap(), p);
    }

    #[test]
    fn values_that_break_a_rule_are_errors_naming_the_field() {
        let good = record_of(&fork_join());
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut r = good.clone();
            edit(&mut r);
            r
        };
        let cases = [
            (
                with(&|r| r["ops"][1]["stream"] = json!(7)),
                "profile record: ops[1].stream (op `chain[0]`): expected a stream index below 3, \
                 found `7`",
            ),
            (
                with(&|r| r["ops"][1]["end_ms"] = json!(0.001)),
                "profile record: ops[1].end_ms (op `chain[0]`): expected an end time of at least \
                 the start, 0.008, found `0.001`",
            ),
            (
                with(&|r| r["waits"][2]["to"] = json!(9)),
                "profile record: waits[2].to: expected an op index below 4, found `9`",
            ),
            (
                with(&|r| r["critical_path"][1] = json!(4)),
                "profile record: critical_path[1]: expected an op index below 4, found `4`",
            ),
            (
                with(&|r| r["total_ms"] = json!(-1.5)),
                "profile record: total_ms: expected a finite time of at least 0 milliseconds, \
                 found `-1.5`",
            ),
            (
                with(&|r| r["streams"] = json!([])),
                "profile record: ops[0].stream (op `seed`): expected a stream index, but the \
                 record has no streams",
            ),
        ];
        for (record, message) in cases {
            let e = err(&record);
            assert!(e.starts_with(message), "{e}\nexpected: {message}");
        }
    }

    #[test]
    fn a_record_of_another_format_version_or_shape_says_what_it_found() {
        let good = record_of(&fork_join());
        let with = |edit: &dyn Fn(&mut Value)| {
            let mut r = good.clone();
            edit(&mut r);
            r
        };
        let cases = [
            (
                with(&|r| r["format"] = json!("chrome-trace")),
                "profile record: expected format `stepgraph-profile`, found `\"chrome-trace\"`",
            ),
            (
                with(&|r| {
                    r.as_object_mut().unwrap().remove("format");
                }),
                "profile record: expected format `stepgraph-profile`, found no `format` field",
            ),
            (
                with(&|r| r["version"] = json!(3)),
                "profile record: expected version 2, found `3`",
            ),
            (
                with(&|r| r["version"] = json!("2")),
                "profile record: expected version 2, found `\"2\"`",
            ),
            (
                with(&|r| {
                    r.as_object_mut().unwrap().remove("ops");
                }),
                "profile record: not JSON in the record's shape: missing field `ops`",
            ),
            (
                with(&|r| r["ops"][0]["start_ms"] = json!("0")),
                "profile record: not JSON in the record's shape: invalid type: string \"0\", \
                 expected f64",
            ),
            (
                with(&|r| r["ops"][0]["stream"] = json!(-1)),
                "profile record: not JSON in the record's shape: invalid value: integer `-1`",
            ),
            (
                json!("a string"),
                "profile record: not JSON in the record's shape: invalid type: string \
                 \"a string\", expected a profile record (a JSON object)",
            ),
        ];
        for (record, message) in cases {
            let e = err(&record);
            assert!(e.starts_with(message), "{e}\nexpected: {message}");
        }
        let text = to_string(&fork_join()).unwrap();
        let cut = &text[..text.len() / 2];
        let e = chain(&from_str(cut).unwrap_err());
        assert!(
            e.starts_with("profile record: not JSON in the record's shape: EOF while parsing")
                && e.contains(&format!("line {}", cut.lines().count())),
            "{e}"
        );
        let e = chain(&from_str("").unwrap_err());
        assert!(e.contains("line 1 column 0"), "{e}");
        let e = chain(&from_str("# stepgraph profile v1\nstep s\n").unwrap_err());
        assert_eq!(
            e,
            "profile record: expected version 2, found the line-based text record of version 1"
        );
    }

    #[test]
    fn a_profile_that_breaks_a_rule_is_not_written() {
        let mut p = fork_join();
        p.ops[2].start_ms = f64::NAN;
        let e = to_string(&p).unwrap_err().to_string();
        assert_eq!(
            e,
            "profile record: ops[2].start_ms (op `chain[1]`): expected a finite time in \
             milliseconds, found `NaN`"
        );
        let mut p = fork_join();
        p.waits.push(WaitEdge { from: 4, to: 0 });
        let e = to_string(&p).unwrap_err().to_string();
        assert!(
            e.contains("waits[4].from: expected an op index below 4"),
            "{e}"
        );
    }

    #[test]
    fn odd_names_are_kept_intact() {
        for name in [
            "",
            " ",
            "a b",
            "tab\there",
            "new\nline",
            "cr\r\n",
            r"back\slash",
            r"\e",
            "\"quoted\"",
            "nb\u{a0}sp",
            "nul\u{0}",
            "}], {\"format\": 1",
            "# stepgraph profile v1",
            "ünïcødé ✓",
        ] {
            let mut p = fork_join();
            p.step = name.into();
            p.device = name.into();
            p.streams[2] = name.into();
            p.ops[2] = op(name, name, 2, 0.009, 0.362);
            let text = to_string(&p).unwrap();
            assert_eq!(from_str(&text).unwrap(), p, "{name:?}:\n{text}");
            // The JSON's layout is its own: no name adds a line.
            assert_eq!(
                text.lines().count(),
                to_string(&fork_join()).unwrap().lines().count()
            );
        }
    }

    #[test]
    fn times_read_back_to_the_same_bits() {
        let mut p = fork_join();
        // 499925.88609869644 reads back an ulp off without serde_json's float_roundtrip.
        let starts = [0.1 + 0.2, 499925.88609869644, 5e-324, -0.0];
        let ends = [1e300, 499926.0, 1.0, 0.0];
        for (op, (start, end)) in p.ops.iter_mut().zip(starts.into_iter().zip(ends)) {
            (op.start_ms, op.end_ms) = (start, end);
        }
        let back = from_str(&to_string(&p).unwrap()).unwrap();
        for (a, b) in back.ops.iter().zip(&p.ops) {
            assert_eq!(a.start_ms.to_bits(), b.start_ms.to_bits());
            assert_eq!(a.end_ms.to_bits(), b.end_ms.to_bits());
        }
    }

    proptest::proptest! {
        #[test]
        fn any_profile_round_trips_through_a_record(
            step in ".*", device in ".*", name in ".*", func in ".*",
            streams in proptest::collection::vec(".*", 1..4),
            start in -1e3f64..1e3, len in 0f64..1e3, total in 0f64..1e6,
        ) {
            let p = Profile {
                step, device,
                ops: vec![op(&name, &func, streams.len() - 1, start, start + len)],
                streams,
                waits: vec![WaitEdge { from: 0, to: 0 }],
                critical_path: vec![0],
                total_ms: total,
            };
            proptest::prop_assert_eq!(from_str(&to_string(&p).unwrap()).unwrap(), p);
        }
    }
}
