//! When an op runs: `#[every(k)]` and `#[when(flag)]`, each a conditional node.

use std::collections::HashMap;

use syn::Ident;

use crate::errors::{Errors, suggestion};
use crate::model::{BufKind, Buffer, Op, ParamKind};

/// `#[every(k)]` names a config field: the count is read from the config when the step is
/// captured.
pub fn check_every(op: &Op, config: &[String], errors: &Errors) {
    let Some(crate::model::Every::Field(f)) = &op.every else {
        return;
    };
    let name = f.to_string();
    if !config.contains(&name) {
        errors.spanned(
            f,
            format!(
                "#[every({name})] names no config field of this step{} (the count is a `u32` field of the #[config] struct, or a number)",
                suggestion(&name, config.iter().map(String::as_str))
            ),
        );
    }
}

/// One conditional node per op: `#[every]` and `#[when]` together would need two, and
/// which of them the work follows would be a guess.
pub fn check_one_condition(op: &Op, errors: &Errors) {
    if let (Some(_), Some(flag)) = (&op.every, &op.when) {
        errors.spanned(
            flag,
            format!(
                "op `{}` has both #[every] and #[when]: an op has one condition; split it into two ops, or set the flag every k-th step",
                op.name
            ),
        );
    }
}

/// `#[when(flag)]` names one shared `DeviceFlag` of the buffers, which the op reads and
/// does not write: the node reads the flag's one address at every replay. Returns the
/// flag's buffer index when it is one. (That the field is a `DeviceFlag` is the
/// compiler's to check, at the attribute, in the expansion.)
pub fn check_when(
    op: &Op,
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    config: &[String],
    errors: &Errors,
) -> Option<usize> {
    let flag = op.when.as_ref()?;
    let bi = flag_buffer(flag, buffers, buf_ix, config, errors)?;
    check_flag_is_shared(flag, buffers[bi], errors)?;
    check_flag_not_written(op, flag, errors)?;
    Some(bi)
}

/// The buffer `#[when(flag)]` names: the node reads the flag from device memory, so a
/// config field or a name that is none gives it nothing to read.
fn flag_buffer(
    flag: &Ident,
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    config: &[String],
    errors: &Errors,
) -> Option<usize> {
    let name = flag.to_string();
    if let Some(&bi) = buf_ix.get(&name) {
        return Some(bi);
    }
    let why = if config.contains(&name) {
        format!(
            " (`{name}` is a config field; the flag is on the device, a DeviceFlag field of the #[buffers] struct)"
        )
    } else {
        let names: Vec<String> = buffers.iter().map(|b| b.name.to_string()).collect();
        format!(
            "{} (the flag is a DeviceFlag field of the #[buffers] struct)",
            suggestion(&name, names.iter().map(String::as_str))
        )
    };
    errors.spanned(
        flag,
        format!("#[when({name})] names no buffer of this step{why}"),
    );
    None
}

/// Each stream or branch would have its own copy of the flag, and the op would read one
/// of them while another op set another; a view is a place in another buffer, not a
/// flag. `None` when reported.
fn check_flag_is_shared(flag: &Ident, buf: &Buffer, errors: &Errors) -> Option<()> {
    let name = flag.to_string();
    let refused = if buf.view_of.is_some() {
        Some("is a #[view] of another buffer")
    } else {
        match buf.kind {
            BufKind::Shared => None,
            BufKind::PerBranch => Some("is #[per_branch], one copy per branch"),
            BufKind::ScratchPerStream | BufKind::ScratchPerBranch => {
                Some("is #[scratch], one copy per stream or branch that holds nothing between ops")
            }
        }
    };
    if let Some(what) = refused {
        errors.spanned(
            flag,
            format!("#[when({name})]: `{name}` {what}; the flag is one shared DeviceFlag field, which every op that sets or reads it sees"),
        );
        return None;
    }
    Some(())
}

/// The generated issue call lends the flag to the node while the op's work borrows its
/// buffers; the node reads the flag before the work, so a write there is for the next
/// replay and belongs in a later op. `None` when reported.
fn check_flag_not_written(op: &Op, flag: &Ident, errors: &Errors) -> Option<()> {
    let name = flag.to_string();
    if let Some(p) = op
        .params
        .iter()
        .find(|p| p.kind == ParamKind::Write && p.binding == *flag)
    {
        errors.at(
            p.span,
            format!(
                "op `{}` runs #[when({name})] and writes `{name}`: the flag decides whether the op runs; clear or set it in another op (it may read it with `&`)",
                op.name
            ),
        );
        return None;
    }
    Some(())
}
