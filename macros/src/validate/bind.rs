//! What each parameter of an op binds: a buffer by `&` or `&mut`, a config field by
//! value, and which copy of the buffer the op's placement gives it.

use std::collections::HashMap;

use syn::Ident;

use super::{OpInfo, Scope};
use crate::errors::{Errors, suggestion};
use crate::model::{BufKind, Buffer, IndexSpec, Op, Param, ParamKind};

/// The buffer and config parameters of `op`, each in turn. Records the group width each
/// `#[per_branch]` array is used with in `branch_widths`.
pub fn check_params(
    scope: &Scope,
    op: &Op,
    info: &OpInfo,
    branch_widths: &mut [Option<u32>],
    errors: &Errors,
) {
    let mut bound: HashMap<String, (&Ident, ParamKind)> = HashMap::new();
    for p in &op.params {
        check_all_branches_target(p, errors);
        match p.kind {
            ParamKind::Read | ParamKind::Write => {
                check_buffer_param(scope, op, p, info, &mut bound, branch_widths, errors);
            }
            ParamKind::Value => check_config_param(scope, p, errors),
            _ => {}
        }
    }
}

/// `#[all_branches]` on a parameter that is no buffer would be accepted and ignored, and
/// read as a promise that the op sees every branch's element.
fn check_all_branches_target(p: &Param, errors: &Errors) {
    if let (Some(attr), false) = (
        &p.all_branches,
        matches!(p.kind, ParamKind::Read | ParamKind::Write),
    ) {
        errors.spanned(
            attr,
            format!(
                "#[all_branches] marks a parameter that reads a #[per_branch] buffer by `&`; `{}` is not a buffer parameter",
                p.name
            ),
        );
    }
}

/// A `&` or `&mut` parameter: the buffer it names, bound once, in a copy the op's
/// placement can pick. `None` when a rule reported, for the rules after it would only
/// repeat that error.
fn check_buffer_param<'a>(
    scope: &Scope,
    op: &Op,
    p: &'a Param,
    info: &OpInfo,
    bound: &mut HashMap<String, (&'a Ident, ParamKind)>,
    branch_widths: &mut [Option<u32>],
    errors: &Errors,
) -> Option<()> {
    let bi = buffer_of(scope, p, errors)?;
    check_double_binding(op, p, bound, errors)?;
    let buf = scope.buffers[bi];
    check_all_branches_use(op, p, buf, info.group_width, errors)?;
    let width = info.group_width;
    check_replicated_shared_write(op, p, buf, width, errors);
    check_scratch_per_branch_on_group(p, buf, width, errors);
    check_branch_view_on_group(p, buf, width, errors);
    check_one_branch_width(p, buf, width, &mut branch_widths[bi], errors);
    Some(())
}

/// The buffer a `&` or `&mut` parameter names: without one, the op would be handed
/// memory the plan does not order.
fn buffer_of(scope: &Scope, p: &Param, errors: &Errors) -> Option<usize> {
    let b = p.binding.to_string();
    if let Some(&bi) = scope.buf_ix.get(&b) {
        return Some(bi);
    }
    if scope.config.contains(&b) {
        errors.at(
            p.span,
            format!("`{b}` is a config value: take it by value (`{b}: T`), not by reference"),
        );
    } else if scope.step.kernels.is_none() && b.contains("kernel") {
        errors.at(
            p.span,
            format!(
                "parameter `{b}` names no buffer; to pass the loaded kernels, declare their type: #[step(streams(..), kernels = path::Kernels)]"
            ),
        );
    } else {
        let names: Vec<String> = scope.buffers.iter().map(|x| x.name.to_string()).collect();
        let sugg = suggestion(&b, names.iter().map(String::as_str));
        errors.spanned(
            &p.binding,
            format!("parameter `{b}` names no buffer of this step{sugg}"),
        );
    }
    None
}

/// `&` and `&mut` to one buffer in one call alias, which the op's kernels would see as
/// two buffers; two `&` are one read. `None` when reported.
fn check_double_binding<'a>(
    op: &Op,
    p: &'a Param,
    bound: &mut HashMap<String, (&'a Ident, ParamKind)>,
    errors: &Errors,
) -> Option<()> {
    let b = p.binding.to_string();
    let Some((first, first_kind)) = bound.insert(b.clone(), (&p.name, p.kind)) else {
        return Some(());
    };
    if first_kind != ParamKind::Write && p.kind != ParamKind::Write {
        return Some(());
    }
    let by = |k: ParamKind| {
        if k == ParamKind::Write {
            "`&mut`"
        } else {
            "`&`"
        }
    };
    errors.spanned(
        &p.binding,
        format!(
            "buffer `{b}` is bound twice in op `{}`, by parameters `{first}` ({}) and `{}` ({}): a `&mut` borrow excludes any other of the same buffer; bind it once by `&mut` to read and write it, or by `&` in both to read it",
            op.name,
            by(first_kind),
            p.name,
            by(p.kind)
        ),
    );
    None
}

/// `#[all_branches]` reads every branch's element of a `#[per_branch]` array: on any
/// other buffer, or written by every replica at once, the replicas would race on the
/// memory. Reading the array whole from a group still ties its width to the group's
/// ([`check_one_branch_width`]). `None` when reported.
fn check_all_branches_use(
    op: &Op,
    p: &Param,
    buf: &Buffer,
    group_width: Option<u32>,
    errors: &Errors,
) -> Option<()> {
    let Some(attr) = &p.all_branches else {
        return Some(());
    };
    let write = p.kind == ParamKind::Write;
    let b = p.binding.to_string();
    match all_branches_misuse(op, &b, buf, write, group_width) {
        Some(message) => {
            errors.spanned(attr, message);
            None
        }
        None => Some(()),
    }
}

/// What is wrong with `#[all_branches]` on a parameter binding `buf` (named `b`), if
/// anything: it asks an op on a stream group for a `#[per_branch]` array whole, to read.
fn all_branches_misuse(
    op: &Op,
    b: &str,
    buf: &Buffer,
    write: bool,
    group_width: Option<u32>,
) -> Option<String> {
    let name = &op.name;
    if buf.kind != BufKind::PerBranch {
        return Some(format!(
            "#[all_branches] takes a #[per_branch] array whole, but `{b}` {}: bind it without #[all_branches]",
            match buf.kind {
                BufKind::Shared => "has one copy",
                _ => "is scratch, a copy per stream or branch that no other branch's op may read",
            }
        ));
    }
    if let Some(parent) = &buf.view_of {
        return Some(format!(
            "`{b}` holds one view per branch: to read every branch's, take the parent `{parent}` whole"
        ));
    }
    if write && is_replicated(op) {
        return Some(format!(
            "op `{name}` runs on every stream of its group, so with #[all_branches] each replica would write every element of `{b}` at once: take it by `&`, or drop #[all_branches] to write the replica's own element"
        ));
    }
    if group_width.is_none() {
        return Some(format!(
            "op `{name}` is not on a stream group, so it takes `{b}` whole already: remove #[all_branches]"
        ));
    }
    None
}

/// Whether `op` runs on every stream of its group (`#[stream(group[d])]`).
fn is_replicated(op: &Op) -> bool {
    matches!(
        op.placement.as_ref().and_then(|p| p.index.as_ref()),
        Some(IndexSpec::Each(_))
    )
}

/// A replicated op writing a buffer of one copy: every replica would write the one copy
/// at the same time.
fn check_replicated_shared_write(
    op: &Op,
    p: &Param,
    buf: &Buffer,
    group_width: Option<u32>,
    errors: &Errors,
) {
    let write = p.kind == ParamKind::Write;
    if buf.kind == BufKind::Shared && group_width.is_some() && write && is_replicated(op) {
        errors.at(
            p.span,
            format!(
                "op `{}` is replicated over a stream group but writes `{}`, which has one copy: mark it #[per_branch] (an array, one element per branch) or #[scratch(per_branch)], or read it with `&`",
                op.name, p.binding
            ),
        );
    }
}

/// A `#[scratch(per_branch)]` copy is picked by the branch index: an op off a group has
/// none, and no copy to use.
fn check_scratch_per_branch_on_group(
    p: &Param,
    buf: &Buffer,
    group_width: Option<u32>,
    errors: &Errors,
) {
    if buf.kind == BufKind::ScratchPerBranch && group_width.is_none() {
        errors.at(
            p.span,
            format!(
                "`{}` is #[scratch(per_branch)]: only an op on a stream group (#[stream(group[d])]) has a branch index to pick its copy",
                p.binding
            ),
        );
    }
}

/// A `#[per_branch]` view is one place per branch: an op off a group has no branch to
/// pick one by, and would not know which part of the parent it reaches.
fn check_branch_view_on_group(p: &Param, buf: &Buffer, group_width: Option<u32>, errors: &Errors) {
    if buf.kind == BufKind::PerBranch && group_width.is_none() && buf.view_of.is_some() {
        errors.at(
            p.span,
            format!(
                "`{}` holds one view per branch: only an op on a stream group (#[stream(group[d])]) picks one; an op off the group takes the parent `{}` whole",
                p.binding,
                buf.view_of.as_ref().map(Ident::to_string).unwrap_or_default()
            ),
        );
    }
}

/// A `#[per_branch]` array has one element per branch of one width: used by groups of
/// two widths, the wider group's replicas would index past the array. Records the width
/// in `width_of_buf`.
fn check_one_branch_width(
    p: &Param,
    buf: &Buffer,
    group_width: Option<u32>,
    width_of_buf: &mut Option<u32>,
    errors: &Errors,
) {
    let (BufKind::PerBranch, Some(w)) = (buf.kind, group_width) else {
        return;
    };
    match *width_of_buf {
        Some(prev) if prev != w => errors.at(
            p.span,
            format!(
                "`{}` is used by groups of {prev} and {w} streams: a #[per_branch] array has one width",
                p.binding
            ),
        ),
        _ => *width_of_buf = Some(w),
    }
}

/// A parameter taken by value binds a config field, read when the step is captured: a
/// buffer by value would copy the device memory's handle out of the step.
fn check_config_param(scope: &Scope, p: &Param, errors: &Errors) {
    let b = p.binding.to_string();
    if scope.config.contains(&b) {
        return;
    }
    if scope.buf_ix.contains_key(&b) {
        errors.at(
            p.span,
            format!("`{b}` is a buffer: take it as `&T` (read) or `&mut T` (write)"),
        );
    } else {
        let sugg = suggestion(&b, scope.config.iter().map(String::as_str));
        errors.spanned(
            &p.binding,
            format!("parameter `{b}` names no config field of this step{sugg}"),
        );
    }
}
