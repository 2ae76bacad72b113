//! How an op waits for other streams and earlier ops: `#[join(..)]` and `#[after(..)]`.

use proc_macro2::Span;

use super::{Instance, OpInfo, Ops, PhysStream, Scope};
use crate::errors::{Errors, suggestion};
use crate::model::{IndexSpec, Op, StreamRef};

/// The streams each `#[join]` of `op` names, into `info.joins`. `own_decl` is the
/// declaration the op runs on.
pub fn resolve_joins(
    scope: &Scope,
    op: &Op,
    own_decl: Option<usize>,
    info: &mut OpInfo,
    errors: &Errors,
) {
    for (ji, j) in op.joins.iter().enumerate() {
        resolve_join(scope, op, (ji, j), own_decl, info, errors);
    }
}

/// One `#[join]` entry, the `ji`th: its streams, once every rule holds. `None` when a
/// rule reported.
fn resolve_join(
    scope: &Scope,
    op: &Op,
    (ji, j): (usize, &StreamRef),
    own_decl: Option<usize>,
    info: &mut OpInfo,
    errors: &Errors,
) -> Option<()> {
    let (d, targets) = join_targets(scope, j, errors)?;
    check_join_of_itself(scope, op, j, d, own_decl, errors)?;
    check_own_group_join(scope, op, j, info, &targets, errors)?;
    check_duplicate_join(scope, op, j, info, &targets, errors)?;
    for t in targets {
        info.joins.push((t, ji, j.name.span()));
    }
    Some(())
}

/// The declaration a join names and its streams: a stream, every member of a group, or
/// one member. A name that is no stream, or a member that is none, leaves the op nothing
/// to wait for.
fn join_targets(scope: &Scope, j: &StreamRef, errors: &Errors) -> Option<(usize, Vec<usize>)> {
    let Some(&d) = scope.streams.by_name.get(&j.name.to_string()) else {
        scope.unknown_stream(&j.name, "#[join] of", errors);
        return None;
    };
    let members = &scope.streams.members[d];
    let targets = match (scope.step.streams[d].width, j.index) {
        (_, None) => members.clone(),
        (Some(w), Some((k, sp))) => {
            if k >= w {
                errors.at(
                    sp,
                    format!(
                        "`{}` has {w} streams: index {k} is out of range 0..{w}",
                        j.name
                    ),
                );
                return None;
            }
            vec![members[k as usize]]
        }
        (None, Some((_, sp))) => {
            errors.at(
                sp,
                format!("stream `{}` is a single stream, not a group", j.name),
            );
            return None;
        }
    };
    Some((d, targets))
}

/// A stream that waits for itself: the event it would wait on is recorded after the
/// wait, so the join orders nothing. `None` when reported.
fn check_join_of_itself(
    scope: &Scope,
    op: &Op,
    j: &StreamRef,
    d: usize,
    own_decl: Option<usize>,
    errors: &Errors,
) -> Option<()> {
    if Some(d) == own_decl && scope.step.streams[d].width.is_none() {
        errors.spanned(
            &j.name,
            format!(
                "op `{}` runs on `{}` already: a stream cannot join itself",
                op.name, j.name
            ),
        );
        return None;
    }
    Some(())
}

/// A join that names the op's own stream through a group (the group, or its own member
/// of it): a replica would wait for the replicas issued before it, and a stream for
/// itself. `None` when reported.
fn check_own_group_join(
    scope: &Scope,
    op: &Op,
    j: &StreamRef,
    info: &OpInfo,
    targets: &[usize],
    errors: &Errors,
) -> Option<()> {
    match own_group_join(op, j, info, &scope.streams.all, targets) {
        Some(message) => {
            errors.spanned(&j.name, message);
            None
        }
        None => Some(()),
    }
}

/// A join that names the op's own stream through a group (the group, or its own member
/// of it): what is wrong with it, if anything. `info` holds the op's placement, `group`
/// the streams the join names.
fn own_group_join(
    op: &Op,
    join: &StreamRef,
    info: &OpInfo,
    streams: &[PhysStream],
    group: &[usize],
) -> Option<String> {
    let own: Vec<usize> = info.instances.iter().map(|&(s, _)| s).collect();
    if !own.iter().any(|s| group.contains(s)) {
        return None;
    }
    let name = &op.name;
    let replicated = matches!(
        op.placement.as_ref().and_then(|p| p.index.as_ref()),
        Some(IndexSpec::Each(_))
    );
    Some(match (replicated, join.index) {
        // Each replica would wait for the replicas issued before it: the group would run
        // one stream after another, which is what a group is there to avoid.
        (true, None) => format!(
            "op `{name}` runs on every stream of `{g}`, and joining `{g}` would make each replica wait for the ones before it, serialising the group; join `{g}` from an op after it (on another stream), or name other streams",
            g = join.name
        ),
        (true, Some((k, _))) => format!(
            "op `{name}` runs on every stream of `{g}`, `{g}[{k}]` included: joining `{g}[{k}]` would make the other replicas wait for that one; join it from an op after the group, or name another stream",
            g = join.name
        ),
        (false, Some(_)) => format!(
            "op `{name}` runs on `{}` already: a stream cannot join itself",
            streams[own[0]].name
        ),
        (false, None) => {
            let others: Vec<String> = group
                .iter()
                .filter(|s| !own.contains(s))
                .map(|&s| streams[s].name.clone())
                .collect();
            format!(
                "op `{name}` runs on `{}`, a member of `{}`: a stream cannot join itself; to wait for the other members, name them: #[join({})]",
                streams[own[0]].name,
                join.name,
                others.join(", ")
            )
        }
    })
}

/// Each stream once: a second mention waits for nothing more, and usually stands for a
/// stream that was meant instead, which the op then does not wait for. `None` when
/// reported.
fn check_duplicate_join(
    scope: &Scope,
    op: &Op,
    j: &StreamRef,
    info: &OpInfo,
    targets: &[usize],
    errors: &Errors,
) -> Option<()> {
    let Some(&(t, first, _)) = info.joins.iter().find(|(t, _, _)| targets.contains(t)) else {
        return Some(());
    };
    let named = |t: usize| scope.streams.all[t].name.clone();
    let is_group = |r: &StreamRef| {
        r.index.is_none()
            && scope
                .streams
                .by_name
                .get(&r.name.to_string())
                .is_some_and(|&g| scope.step.streams[g].width.is_some())
    };
    let earlier = &op.joins[first];
    let already = if is_group(earlier) {
        format!("the group `{}` joined before holds it", earlier.name)
    } else {
        format!("`{}` is joined before", earlier.name)
    };
    let what = if is_group(j) {
        format!("the group `{}`, which holds `{}`,", j.name, named(t))
    } else {
        format!("`{}`", named(t))
    };
    errors.spanned(
        &j.name,
        format!(
            "op `{}` joins {what} twice ({already}): name each stream once; was another stream meant?",
            op.name
        ),
    );
    None
}

/// The ops `#[after(..)]` names, into `info.after`. Program order is the only order, so
/// `after` looks back: a later op, or the op itself, would be an ordering the plan
/// cannot keep.
pub fn resolve_after(ops: &Ops, i: usize, op: &Op, info: &mut OpInfo, errors: &Errors) {
    for a in &op.after {
        let n = a.to_string();
        match ops.by_name.get(&n) {
            None => errors.spanned(
                a,
                format!(
                    "#[after] names no op of this step: `{n}`{}",
                    suggestion(&n, ops.names.iter().map(String::as_str))
                ),
            ),
            Some(&j) if j == i => {
                errors.spanned(a, format!("op `{n}` cannot run after itself"))
            }
            Some(&j) if j > i => errors.spanned(
                a,
                format!(
                    "#[after({n})] refers to a later op: ops run in program order, so move `{}` below `{n}` or drop the ordering",
                    op.name
                ),
            ),
            Some(&j) => info.after.push(j),
        }
    }
}

/// A join of a stream that has done nothing since the joining stream last joined it
/// waits for nothing: dead code at best, a misplaced join at worst. Joins are kept per
/// pair of streams: another stream joining the same op still waits for it.
pub fn check_pending_joins(
    ops: &[&Op],
    infos: &[OpInfo],
    instances: &[Instance],
    n_streams: usize,
    errors: &Errors,
) {
    let mut last_op: Vec<Option<usize>> = vec![None; n_streams];
    // (joining stream, joined stream) -> the joined stream's last op then.
    let mut joined_upto: std::collections::HashMap<(usize, usize), usize> =
        std::collections::HashMap::new();
    // Per op: for each #[join] entry, its span and whether any instance waited for
    // something through it (a replicated op's instances are judged together).
    let mut entries: Vec<Vec<(usize, Span, bool)>> = vec![Vec::new(); ops.len()];
    for (k, inst) in instances.iter().enumerate() {
        let t = inst.stream;
        for &(s, entry, span) in &infos[inst.op].joins {
            if s == t {
                continue;
            }
            let pending = match (last_op[s], joined_upto.get(&(t, s))) {
                (None, _) => false,
                (Some(l), Some(&j)) => l > j,
                (Some(_), None) => true,
            };
            let op_entries = &mut entries[inst.op];
            match op_entries.iter_mut().find(|(e, _, _)| *e == entry) {
                Some(e) => e.2 |= pending,
                None => op_entries.push((entry, span, pending)),
            }
        }
        for &(s, _, _) in &infos[inst.op].joins {
            if let Some(l) = last_op[s] {
                joined_upto.insert((t, s), l);
            }
        }
        last_op[t] = Some(k);
    }
    for (i, op_entries) in entries.iter().enumerate() {
        for (_, span, pending) in op_entries {
            if !pending {
                errors.at(
                    *span,
                    format!(
                        "#[join] on op `{}`: this stream has no op pending since this op's stream last joined it, so the join waits for nothing; remove it or move it below the op it should wait for",
                        ops[i].name
                    ),
                );
            }
        }
    }
}
