//! The declared streams, the stream each op is placed on, and whether every stream runs
//! an op.

use std::collections::HashMap;

use syn::Ident;

use super::{MAX_STREAMS, OpInfo, PhysStream, Scope};
use crate::errors::{Errors, did_you_mean, suggestion};
use crate::model::{IndexSpec, Op, Placement, Step, StreamDecl};

/// The declared streams, each group's members numbered in turn.
pub struct Streams {
    /// Each declaration's index, by name.
    pub by_name: HashMap<String, usize>,
    /// Every stream: a single stream, or one member of a group.
    pub all: Vec<PhysStream>,
    /// Each declaration's streams.
    pub members: Vec<Vec<usize>>,
    /// The declarations' names, for messages.
    pub names: Vec<String>,
}

/// The declared streams; `None` past the stream limit.
pub fn declare_streams(step: &Step, errors: &Errors) -> Option<Streams> {
    check_stream_count(step, errors)?;
    let mut streams = Streams {
        by_name: HashMap::new(),
        all: Vec::new(),
        members: Vec::new(),
        names: step.streams.iter().map(|s| s.name.to_string()).collect(),
    };
    for (d, decl) in step.streams.iter().enumerate() {
        let name = decl.name.to_string();
        check_duplicate_stream(&mut streams.by_name, d, decl, errors);
        check_origin_is_single(d, decl, errors);
        let mut ids = Vec::new();
        match decl.width {
            None => {
                ids.push(streams.all.len());
                streams.all.push(PhysStream {
                    name,
                    decl: d,
                    priority: decl.priority,
                    automatic: false,
                });
            }
            Some(w) => {
                for i in 0..w {
                    ids.push(streams.all.len());
                    streams.all.push(PhysStream {
                        name: format!("{name}[{i}]"),
                        decl: d,
                        priority: decl.priority,
                        automatic: false,
                    });
                }
            }
        }
        streams.members.push(ids);
    }
    Some(streams)
}

/// Each stream is a CUDA stream with its own cuBLASLt workspace, and the planner keeps a
/// clock per pair of streams: tens of thousands of them would exhaust the compiler's
/// memory before the step reached the GPU. `None` past the limit.
fn check_stream_count(step: &Step, errors: &Errors) -> Option<()> {
    // Streams are numbered in 16 bits too, well above this limit.
    let mut total = 0usize;
    for decl in &step.streams {
        total += decl.width.map_or(1, |w| w as usize);
        if total > MAX_STREAMS {
            let all: usize = step
                .streams
                .iter()
                .map(|d| d.width.map_or(1, |w| w as usize))
                .sum();
            errors.spanned(
                &decl.name,
                format!(
                    "this step declares {all} streams: expected at most {MAX_STREAMS} (each is a CUDA stream with its own workspace); `{}` goes past the limit",
                    decl.name
                ),
            );
            // Every later rule would list or plan each of these streams: only noise.
            return None;
        }
    }
    Some(())
}

/// Two declarations of one name would be one stream to every op that names it, and a
/// second CUDA stream that nothing runs on.
fn check_duplicate_stream(
    by_name: &mut HashMap<String, usize>,
    d: usize,
    decl: &StreamDecl,
    errors: &Errors,
) {
    let name = decl.name.to_string();
    if by_name.insert(name.clone(), d).is_some() {
        errors.spanned(&decl.name, format!("stream `{name}` is declared twice"));
    }
}

/// Capture begins and ends on one stream; a group has no single one.
fn check_origin_is_single(d: usize, decl: &StreamDecl, errors: &Errors) {
    if d == 0 && decl.width.is_some() {
        errors.spanned(
            &decl.name,
            "the first stream is the origin, where capture begins and ends: make it a single stream, not a group",
        );
    }
}

impl Scope<'_> {
    /// A stream name that is no declared stream: the op would have no stream to issue
    /// its work on, or to wait for.
    pub fn unknown_stream(&self, name: &Ident, what: &str, errors: &Errors) {
        let n = name.to_string();
        let names = &self.streams.names;
        errors.spanned(
            name,
            format!(
                "{what} `{n}` is not a stream of this step (declared: {}){}",
                names.join(", "),
                suggestion(&n, names.iter().map(String::as_str))
            ),
        );
    }
}

/// Where `op` runs: its streams, one per instance, with the instance's index. Without a
/// (readable) placement the op runs on the origin, and the rules after judge it there.
pub fn place_op(scope: &Scope, op: &Op, excused: &mut Vec<usize>, errors: &Errors) -> OpInfo {
    let mut info = OpInfo {
        instances: vec![(0, None)],
        group_width: None,
        joins: Vec::new(),
        after: Vec::new(),
    };
    let Some(pl) = &op.placement else {
        return info;
    };
    excuse_meant_stream(scope, pl, excused);
    let Some(&d) = scope.streams.by_name.get(&pl.stream.to_string()) else {
        scope.unknown_stream(&pl.stream, "op placed on", errors);
        return info;
    };
    let decl = &scope.step.streams[d];
    let members = &scope.streams.members[d];
    match (decl.width, &pl.index) {
        (None, None) => info.instances = vec![(members[0], None)],
        // An index picks a member of a group; a single stream has none to pick.
        (None, Some(_)) => errors.spanned(
            &pl.stream,
            format!(
                "stream `{}` is a single stream, not a group: write #[stream({})]",
                decl.name, decl.name
            ),
        ),
        // A group is many streams: the op must say whether it runs on each or on one.
        (Some(w), None) => errors.spanned(
            &pl.stream,
            format!(
                "`{n}` is a group of {w} streams: write #[stream({n}[d])] to replicate the op over d in 0..{w}, or #[stream({n}[0])] for one member",
                n = decl.name
            ),
        ),
        (Some(w), Some(IndexSpec::Each(_))) => {
            info.group_width = Some(w);
            info.instances = (0..w).map(|k| (members[k as usize], Some(k))).collect();
        }
        // A member past the group's width is no stream at all.
        (Some(w), Some(IndexSpec::Fixed(k, sp))) => {
            if *k >= w {
                errors.at(
                    *sp,
                    format!(
                        "`{}` has {w} streams: index {k} is out of range 0..{w}",
                        decl.name
                    ),
                );
            } else {
                info.group_width = Some(w);
                info.instances = vec![(members[*k as usize], Some(*k))];
            }
        }
    }
    info
}

/// The declaration a placement means, misspelt or not: an op whose stream did not
/// resolve would also make the stream it meant look unused, and that second error would
/// only repeat the first.
fn excuse_meant_stream(scope: &Scope, pl: &Placement, excused: &mut Vec<usize>) {
    let by_name = &scope.streams.by_name;
    let meant = did_you_mean(
        &pl.stream.to_string(),
        scope.streams.names.iter().map(String::as_str),
    )
    .and_then(|n| by_name.get(n).copied());
    excused.extend(meant.or_else(|| by_name.get(&pl.stream.to_string()).copied()));
}

/// Every declared stream runs an op: an unused stream is created, joined and paid for
/// at every capture. `excused` holds the declarations an op meant but did not reach (a
/// misspelt placement), whose error would only repeat that one's; after a placement that
/// did not parse, every declaration is.
pub fn check_unused_streams(
    scope: &Scope,
    used: &[bool],
    excused: &[usize],
    ops: &[&Op],
    errors: &Errors,
) {
    let (streams, members) = (&scope.streams.all, &scope.streams.members);
    let unreadable = ops.iter().any(|op| op.placement_unreadable);
    for (d, decl) in scope.step.streams.iter().enumerate().skip(1) {
        if (unreadable || excused.contains(&d)) && !members[d].iter().any(|&m| used[m]) {
            continue;
        }
        let unused: Vec<&str> = members[d]
            .iter()
            .filter(|&&s| !used[s])
            .map(|&s| streams[s].name.as_str())
            .collect();
        if unused.is_empty() {
            continue;
        }
        errors.spanned(
            &decl.name,
            if unused.len() == 1 {
                format!(
                    "stream `{}` is declared but no op runs on it: remove it from streams(..) or place an op with #[stream({})]",
                    unused[0], unused[0]
                )
            } else {
                format!(
                    "streams {} are declared but no op runs on them: shrink the group or place ops on them",
                    unused.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
                )
            },
        );
    }
}
