//! Rules on one op's parameters beyond what they bind: the `#[out]` marker and what a
//! conditional op may take.

use std::collections::HashMap;

use crate::errors::Errors;
use crate::model::{BufKind, Buffer, Op, ParamKind};

/// `#[out]` marks a `&mut` scratch parameter the op writes whole before reading: the step
/// relies on it for scratch only, so anywhere else the marker would be accepted and
/// ignored, and read as a promise the step keeps.
pub fn check_out_markers(
    op: &Op,
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    errors: &Errors,
) {
    for p in &op.params {
        let Some(attr) = &p.out else { continue };
        let name = &p.name;
        let what = match p.kind {
            ParamKind::Read => {
                errors.spanned(
                    attr,
                    format!(
                        "#[out] on `{name}`, which op `{}` takes by `&`: #[out] says the op writes a scratch buffer whole before reading it, and `&` only reads; remove #[out], or take `{name}` by `&mut` if the op writes it",
                        op.name
                    ),
                );
                continue;
            }
            ParamKind::Write => {
                let Some(&bi) = buf_ix.get(&p.binding.to_string()) else {
                    // Validation reports the unknown buffer.
                    continue;
                };
                let buf = buffers[bi];
                if buf.is_scratch() {
                    continue;
                }
                let kind = match buf.kind {
                    BufKind::PerBranch => "a #[per_branch] buffer",
                    _ if buf.view_of.is_some() => "a view of a shared buffer",
                    _ => "a shared buffer",
                };
                errors.spanned(
                    attr,
                    format!(
                        "#[out] on `{name}`: #[out] marks scratch an op writes whole before reading it, and `{}` is {kind}, which keeps its value between steps and needs no first write; remove #[out]",
                        p.binding
                    ),
                );
                continue;
            }
            ParamKind::Value => "a config value",
            ParamKind::Index => "the replication index",
            ParamKind::Stream => "the capture stream",
            ParamKind::Blas => "the stream's cuBLASLt handle",
            ParamKind::Kernels => "the kernels",
            ParamKind::Context => "no buffer",
        };
        errors.spanned(
            attr,
            format!(
                "#[out] on `{name}`, which is {what}: #[out] marks a `&mut` scratch buffer parameter the op writes whole before reading it; remove #[out]"
            ),
        );
    }
}

/// A conditional op's work is the body of a conditional graph node, which holds kernels,
/// matmuls, copies and memsets and no collective; and every rank must issue each
/// collective, so a rank that skipped one would leave the others waiting in it.
pub fn check_conditional_collectives(
    op: &Op,
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    errors: &Errors,
) {
    let condition = match (&op.every, &op.when) {
        (Some(every), _) => format!("#[every({})]", every.text()),
        (None, Some(flag)) => format!("#[when({flag})]"),
        (None, None) => return,
    };
    for p in &op.params {
        if !matches!(p.kind, ParamKind::Read | ParamKind::Write) {
            continue;
        }
        let declared = buf_ix
            .get(&p.binding.to_string())
            .is_some_and(|&bi| holds_communicator(&buffers[bi].ty));
        if declared || holds_communicator(&p.ty) {
            errors.at(
                p.span,
                format!(
                    "op `{}` runs {condition} and takes the communicator `{}`: its work is the body of a conditional graph node, and collectives cannot run there (and every rank must issue each one, or the others wait for it); run the collective in an op without a condition",
                    op.name, p.binding
                ),
            );
        }
    }
}

/// Whether `ty` is a `Communicator` (by its last path segment), or a reference to, an
/// array of or a slice of them.
fn holds_communicator(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Communicator"),
        syn::Type::Reference(r) => holds_communicator(&r.elem),
        syn::Type::Array(a) => holds_communicator(&a.elem),
        syn::Type::Slice(s) => holds_communicator(&s.elem),
        syn::Type::Paren(p) => holds_communicator(&p.elem),
        syn::Type::Group(g) => holds_communicator(&g.elem),
        _ => false,
    }
}
