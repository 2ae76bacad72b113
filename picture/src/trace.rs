//! A profile in the Chrome trace event format, which Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open. The events are typed here and written by serde_json.

use std::borrow::Cow;

use serde::Serialize;
use stepgraph_plan::{OpTiming, Profile};

use crate::timeline::stream_name;
use crate::{Error, json};

/// The profile in the Chrome trace event format (the JSON object form): one track per
/// stream (process 1, thread id = stream index, named by `thread_name` metadata and kept
/// in stream order by `thread_sort_index`), a complete event (`"ph": "X"`, `ts` and
/// `dur` in microseconds, to the nanosecond) per op with its function, stream and
/// whether it is on the critical path in `args`, a flow arrow (`"ph": "s"` / `"f"`) per
/// wait, and the step, device and figures in `otherData`. One event per line; the output
/// depends only on the profile, byte for byte. Times JSON cannot hold (NaN, infinities)
/// are written as `null`.
///
/// ```
/// use stepgraph_picture::{OpTiming, Profile, trace_json};
///
/// let profile = Profile {
///     step: "one".into(),
///     device: "test".into(),
///     streams: vec!["main".into()],
///     ops: vec![OpTiming {
///         name: "a".into(), func: "a".into(), stream: 0, start_ms: 0.5, end_ms: 0.75,
///     }],
///     waits: vec![],
///     critical_path: vec![0],
///     total_ms: 0.75,
/// };
/// let trace: serde_json::Value = serde_json::from_str(&trace_json(&profile)?).unwrap();
/// let op = &trace["traceEvents"][3];
/// assert_eq!((op["ph"].as_str(), op["ts"].as_f64(), op["dur"].as_f64()),
///            (Some("X"), Some(500.0), Some(250.0)));
/// # Ok::<(), stepgraph_picture::Error>(())
/// ```
pub fn trace_json(profile: &Profile) -> Result<String, Error> {
    json::to_string(&Trace::of(profile)).map_err(Error::Write)
}

/// The JSON object form of a trace.
#[derive(Serialize)]
struct Trace<'a> {
    #[serde(rename = "traceEvents")]
    events: Vec<Event<'a>>,
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other: OtherData<'a>,
}

/// One trace event. The kinds used here share these fields, each kind setting some.
#[derive(Serialize)]
struct Event<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'a str>,
    ph: Phase,
    /// Binds a flow's end to the slice that encloses it.
    #[serde(skip_serializing_if = "Option::is_none")]
    bp: Option<&'static str>,
    /// Pairs a flow's start and end.
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<usize>,
    pid: u32,
    tid: usize,
    /// Microseconds after the replay began.
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    /// Microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args<'a>>,
}

#[derive(Clone, Copy, Serialize)]
enum Phase {
    /// Metadata: names and order of the process and its threads.
    #[serde(rename = "M")]
    Metadata,
    /// A complete event: a slice with a start and a duration.
    #[serde(rename = "X")]
    Complete,
    /// A flow's start.
    #[serde(rename = "s")]
    FlowStart,
    /// A flow's end.
    #[serde(rename = "f")]
    FlowEnd,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Name {
        name: Cow<'a, str>,
    },
    SortIndex {
        sort_index: usize,
    },
    Op {
        func: &'a str,
        stream: &'a str,
        critical: bool,
    },
}

#[derive(Serialize)]
struct OtherData<'a> {
    step: &'a str,
    device: &'a str,
    total_ms: f64,
    overlap: f64,
    critical_path_ms: f64,
}

/// The one process all tracks belong to.
const PID: u32 = 1;

impl<'a> Event<'a> {
    /// A metadata event with no time.
    fn metadata(name: &'a str, tid: usize, args: Args<'a>) -> Event<'a> {
        Event {
            name,
            cat: None,
            ph: Phase::Metadata,
            bp: None,
            id: None,
            pid: PID,
            tid,
            ts: None,
            dur: None,
            args: Some(args),
        }
    }
}

impl<'a> Trace<'a> {
    fn of(p: &'a Profile) -> Trace<'a> {
        let mut events = vec![Event::metadata(
            "process_name",
            0,
            Args::Name {
                name: Cow::Owned(format!("{} on {}", p.step, p.device)),
            },
        )];
        for (i, s) in p.streams.iter().enumerate() {
            events.push(Event::metadata(
                "thread_name",
                i,
                Args::Name {
                    name: Cow::Borrowed(s),
                },
            ));
            events.push(Event::metadata(
                "thread_sort_index",
                i,
                Args::SortIndex { sort_index: i },
            ));
        }
        for (i, op) in p.ops.iter().enumerate() {
            events.push(Event {
                name: &op.name,
                cat: Some(&op.func),
                ph: Phase::Complete,
                bp: None,
                id: None,
                pid: PID,
                tid: op.stream,
                ts: Some(us(op.start_ms)),
                dur: Some(us(op.duration_ms())),
                args: Some(Args::Op {
                    func: &op.func,
                    stream: stream_name(p, op.stream),
                    critical: p.critical_path.contains(&i),
                }),
            });
        }
        // Flow ends sit inside their ops (at the middle) so that a viewer binds each to
        // the right slice; it draws the arrow from the first slice's end regardless.
        let inside = |op: &OpTiming| Some(us(op.start_ms + op.duration_ms() / 2.0));
        for (k, w) in p.waits.iter().enumerate() {
            let (Some(from), Some(to)) = (p.ops.get(w.from), p.ops.get(w.to)) else {
                continue;
            };
            let flow = |ph, bp, op: &OpTiming| Event {
                name: "wait",
                cat: Some("wait"),
                ph,
                bp,
                id: Some(k),
                pid: PID,
                tid: op.stream,
                ts: inside(op),
                dur: None,
                args: None,
            };
            events.push(flow(Phase::FlowStart, None, from));
            events.push(flow(Phase::FlowEnd, Some("e"), to));
        }
        Trace {
            events,
            display_time_unit: "ms",
            other: OtherData {
                step: &p.step,
                device: &p.device,
                total_ms: p.total_ms,
                overlap: p.overlap(),
                critical_path_ms: p.critical_path_ms(),
            },
        }
    }
}

/// Milliseconds as microseconds rounded to the nanosecond: the events' precision,
/// without the float noise of a product in every number.
fn us(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fork_join, op};

    #[test]
    fn trace_json_has_a_track_per_stream_an_event_per_op_and_a_flow_per_wait() {
        let p = fork_join();
        let text = trace_json(&p).unwrap();
        assert_eq!(text, trace_json(&p).unwrap(), "same profile, same bytes");
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["displayTimeUnit"], "ms");
        let events = json["traceEvents"].as_array().unwrap();
        let of = |ph: &str, name: Option<&str>| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["ph"] == ph && name.is_none_or(|n| e["name"] == n))
                .collect()
        };
        let threads: Vec<(u64, &str)> = of("M", Some("thread_name"))
            .iter()
            .map(|e| {
                (
                    e["tid"].as_u64().unwrap(),
                    e["args"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(threads, [(0, "main"), (1, "chain[0]"), (2, "chain[1]")]);
        let sort: Vec<u64> = of("M", Some("thread_sort_index"))
            .iter()
            .map(|e| e["args"]["sort_index"].as_u64().unwrap())
            .collect();
        assert_eq!(sort, [0, 1, 2]);
        let complete = of("X", None);
        assert_eq!(complete.len(), p.ops.len());
        for (i, (e, op)) in complete.iter().zip(&p.ops).enumerate() {
            assert_eq!(e["name"], op.name.as_str());
            assert_eq!(e["tid"].as_u64().unwrap() as usize, op.stream);
            assert!(
                (e["ts"].as_f64().unwrap() - op.start_ms * 1e3).abs() < 1e-3,
                "{e}"
            );
            assert!(
                (e["dur"].as_f64().unwrap() - op.duration_ms() * 1e3).abs() < 1e-3,
                "{e}"
            );
            assert_eq!(e["args"]["func"], op.func.as_str());
            assert_eq!(e["args"]["stream"], p.streams[op.stream].as_str());
            assert_eq!(e["args"]["critical"], p.critical_path.contains(&i));
        }
        let (starts, finishes) = (of("s", None), of("f", None));
        assert_eq!((starts.len(), finishes.len()), (4, 4));
        for (k, (s, f)) in starts.iter().zip(&finishes).enumerate() {
            let w = p.waits[k];
            assert_eq!(
                (s["id"].as_u64(), f["id"].as_u64()),
                (Some(k as u64), Some(k as u64))
            );
            assert_eq!(s["tid"].as_u64().unwrap() as usize, p.ops[w.from].stream);
            assert_eq!(f["tid"].as_u64().unwrap() as usize, p.ops[w.to].stream);
            assert_eq!(f["bp"], "e");
        }
        assert_eq!(json["otherData"]["device"], p.device.as_str());
        assert_eq!(json["otherData"]["total_ms"], p.total_ms);
    }

    #[test]
    fn odd_names_come_back_from_the_json_as_they_were() {
        let odd = "a\"b\\c\nl2\t\r\u{1}é <&>";
        let mut p = fork_join();
        p.step = odd.into();
        p.streams[1] = odd.into();
        p.ops[1] = op(odd, odd, 1, 0.008, 0.35);
        let json: serde_json::Value = serde_json::from_str(&trace_json(&p).unwrap()).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        assert_eq!(events[0]["args"]["name"], format!("{odd} on {}", p.device));
        assert_eq!(events[3]["args"]["name"], odd);
        let chain = events.iter().find(|e| e["ph"] == "X" && e["tid"] == 1);
        let chain = chain.unwrap();
        assert_eq!((&chain["name"], &chain["cat"]), (&odd.into(), &odd.into()));
        assert_eq!(json["otherData"]["step"], odd);
    }

    #[test]
    fn times_json_cannot_hold_are_null_and_stale_waits_are_left_out() {
        let mut p = fork_join();
        p.ops[0].end_ms = f64::NAN;
        p.total_ms = f64::INFINITY;
        p.waits.push(stepgraph_plan::WaitEdge { from: 9, to: 0 });
        let json: serde_json::Value = serde_json::from_str(&trace_json(&p).unwrap()).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let seed = events.iter().find(|e| e["name"] == "seed").unwrap();
        assert!(seed["dur"].is_null(), "{seed}");
        assert!(json["otherData"]["total_ms"].is_null());
        assert_eq!(events.iter().filter(|e| e["ph"] == "s").count(), 4);
    }

    #[test]
    fn microseconds_are_rounded_to_the_nanosecond() {
        assert_eq!(us(0.005856000003404915), 5.856);
        assert_eq!(us(0.3721919945674017), 372.192);
        assert_eq!(us(1.0), 1000.0);
        assert!(us(f64::NAN).is_nan());
    }
}
