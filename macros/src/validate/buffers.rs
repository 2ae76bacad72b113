//! The buffers: how many, their kinds and views, and how ops share their copies.

use std::collections::HashMap;

use syn::Ident;

use super::{MAX_INDEXED, Program, last_segment_is, param_span};
use crate::errors::{Errors, suggestion};
use crate::model::{BufKind, Buffer, Op, ParamKind, Step};
use crate::schedule::{self, Problem};

/// The plan numbers buffers in 16 bits; a wider index would name another buffer.
pub fn check_buffer_count(buffers: &[&Buffer], errors: &Errors) {
    if let Some(b) = buffers.get(MAX_INDEXED) {
        errors.spanned(
            &b.name,
            format!(
                "this step declares {} buffers: expected at most {MAX_INDEXED} (the plan numbers them in 16 bits); `{}` goes past the limit",
                buffers.len(),
                b.name
            ),
        );
    }
}

/// The expansion indexes a `#[per_branch]` buffer by branch, so it must be an array.
pub fn check_per_branch_arrays(buffers: &[&Buffer], errors: &Errors) {
    for b in buffers {
        if b.kind == BufKind::PerBranch && !matches!(b.ty, syn::Type::Array(_)) {
            errors.at(
                b.kind_span,
                format!("#[per_branch] buffer `{}` holds one element per branch: give it an array type `[T; N]`", b.name),
            );
        }
    }
}

/// A `#[shared]` buffer is one allocation that several steps use, handed to each op
/// whole: per-branch arrays and scratch copies are a step's own (the step allocates the
/// copies, and each branch indexes its element), and a view holds no memory to share.
pub fn check_shared(buffers: &[&Buffer], errors: &Errors) {
    for b in buffers {
        let Some(span) = b.across_steps else {
            continue;
        };
        let why = if b.view_of.is_some() {
            Some(
                "a view holds no memory of its own, only where it lies: share its parent"
                    .to_string(),
            )
        } else if b.kind == BufKind::PerBranch {
            Some("a #[per_branch] array is indexed by this step's branches: share a struct or array of the buffers as one (`Shared<[T; N]>`), or share each buffer".to_string())
        } else if b.is_scratch() {
            Some("scratch holds nothing between launches, and this step allocates its copies: a buffer other steps read must hold its values".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            errors.at(
                span,
                format!("buffer `{}` cannot be #[shared]: {why}", b.name),
            );
        }
    }
}

/// The parent of each `#[view(of = ..)]` field, by buffer index. A view lies inside a
/// whole buffer that every op reaches the same way: not inside another view (whose own
/// place is known only at run time), not inside scratch or per-branch copies (each
/// stream or branch would need its own view of its own copy), and not inside itself.
pub fn check_views(
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    errors: &Errors,
) -> Vec<Option<usize>> {
    (0..buffers.len())
        .map(|i| view_parent(buffers, i, buf_ix, errors))
        .collect()
}

/// The parent of buffer `i`, when it is a view whose every rule holds.
fn view_parent(
    buffers: &[&Buffer],
    i: usize,
    buf_ix: &HashMap<String, usize>,
    errors: &Errors,
) -> Option<usize> {
    let b = buffers[i];
    let parent = b.view_of.as_ref()?;
    check_view_holds_spans(b, parent, errors)?;
    check_view_not_scratch(b, parent, errors)?;
    let pn = parent.to_string();
    let Some(&pi) = buf_ix.get(&pn) else {
        let names: Vec<String> = buffers.iter().map(|b| b.name.to_string()).collect();
        errors.spanned(
            parent,
            format!(
                "#[view(of = {pn})] names no buffer of this step{}",
                suggestion(&pn, names.iter().map(String::as_str))
            ),
        );
        return None;
    };
    check_view_parent_is_whole(buffers, i, pi, parent, errors)?;
    Some(pi)
}

/// The expansion indexes the spans and hands them to the runtime: a field of another
/// type would fail there too, at every op that names it. `None` when reported.
fn check_view_holds_spans(b: &Buffer, parent: &Ident, errors: &Errors) -> Option<()> {
    let spans = match (&b.ty, b.kind) {
        (syn::Type::Array(a), BufKind::PerBranch) => last_segment_is(&a.elem, "Span"),
        (ty, BufKind::Shared) => last_segment_is(ty, "Span"),
        _ => true,
    };
    if spans {
        return Some(());
    }
    let want = if b.kind == BufKind::PerBranch {
        "an array of `stepgraph::Span`, one per branch (`[Span; N]`)"
    } else {
        "a `stepgraph::Span` (`Span::new(offset, len)`, `Span::rows`, `Span::columns`)"
    };
    errors.spanned(
        &b.ty,
        format!(
            "view `{}` holds where it lies in `{parent}`: expected {want}",
            b.name
        ),
    );
    None
}

/// A view holds no memory of its own to give a copy per stream or branch. `None` when
/// reported.
fn check_view_not_scratch(b: &Buffer, parent: &Ident, errors: &Errors) -> Option<()> {
    if !b.is_scratch() {
        return Some(());
    }
    errors.at(
        b.kind_span,
        format!("view `{}` cannot be scratch: a view holds no memory of its own, only where it lies in `{parent}`", b.name),
    );
    None
}

/// The parent is a whole buffer of one copy, other than the view: a view of a view, or
/// of one of many copies, would lie somewhere the plan cannot say. `None` when reported.
fn check_view_parent_is_whole(
    buffers: &[&Buffer],
    i: usize,
    pi: usize,
    parent: &Ident,
    errors: &Errors,
) -> Option<()> {
    let (b, p) = (buffers[i], buffers[pi]);
    let pn = parent.to_string();
    let why = if pi == i {
        Some("a view cannot lie in itself".to_string())
    } else if p.view_of.is_some() {
        Some(format!(
            "`{pn}` is itself a view: make `{}` a view of `{pn}`'s parent",
            b.name
        ))
    } else if p.kind != BufKind::Shared {
        Some(format!(
            "`{pn}` has a copy per stream or per branch, and a view lies in one buffer: view a shared buffer"
        ))
    } else {
        None
    };
    if let Some(why) = why {
        errors.spanned(parent, format!("view `{}` of `{pn}`: {why}", b.name));
        return None;
    }
    Some(())
}

/// An op receives a view of a buffer by borrowing the buffer, so it cannot take the
/// buffer and a view of it, or two views of one buffer, when it writes any of them: that
/// would be a mutable borrow beside another of the same memory. Reading them all is fine.
pub fn check_view_borrows(
    op: &Op,
    buffers: &[&Buffer],
    buf_ix: &HashMap<String, usize>,
    view_parent: &[Option<usize>],
    errors: &Errors,
) {
    // (the buffer the memory belongs to, the parameter, writes)
    let mut seen: Vec<(usize, &crate::model::Param, bool)> = Vec::new();
    for p in &op.params {
        if !matches!(p.kind, ParamKind::Read | ParamKind::Write) {
            continue;
        }
        let Some(&bi) = buf_ix.get(&p.binding.to_string()) else {
            continue;
        };
        let root = view_parent[bi].unwrap_or(bi);
        let write = p.kind == ParamKind::Write;
        if let Some(&(_, first, first_write)) = seen
            .iter()
            .find(|(r, q, _)| *r == root && q.binding != p.binding)
            && (write || first_write)
        {
            let name = |q: &crate::model::Param| q.binding.to_string();
            errors.at(
                p.span,
                format!(
                    "op `{}` takes `{}` and `{}`, which lie in one buffer (`{}`), and writes one of them: an op borrows a buffer once to write it; take `{}` whole",
                    op.name,
                    name(first),
                    name(p),
                    buffers[root].name,
                    buffers[root].name
                ),
            );
            continue;
        }
        seen.push((root, p, write));
    }
}

/// A per-branch array bound whole by ops off any group takes the width of the one
/// group, when there is one.
pub fn default_branch_widths(step: &Step, buffers: &[&Buffer], branch_widths: &mut [Option<u32>]) {
    let groups: Vec<u32> = step.streams.iter().filter_map(|s| s.width).collect();
    let single_group_width = if groups.len() == 1 {
        Some(groups[0])
    } else {
        None
    };
    for (bi, buf) in buffers.iter().enumerate() {
        if buf.kind == BufKind::PerBranch && branch_widths[bi].is_none() {
            branch_widths[bi] = single_group_width;
        }
    }
}

/// A copy is a branch index (groups are at most 1024 wide) or a stream's slot (at most one
/// per stream): within bounds once the streams are, checked so that it stays so, for the
/// plan numbers copies in 16 bits and a wider one would name another copy.
pub fn check_copy_numbers(buffers: &[&Buffer], problem: &Problem, errors: &Errors) {
    for (bi, buf) in buffers.iter().enumerate() {
        let most = problem
            .ops
            .iter()
            .flat_map(|n| &n.accesses)
            .filter(|(r, _)| r.buf == bi)
            .map(|(r, _)| r.copy)
            .max();
        if let Some(copy) = most.filter(|&c| c > MAX_INDEXED) {
            errors.spanned(
                &buf.name,
                format!(
                    "buffer `{}` would need copy number {copy}: expected copy numbers up to {MAX_INDEXED} (the plan numbers them in 16 bits)",
                    buf.name
                ),
            );
        }
    }
}

/// Two streams writing one shared buffer with nothing else ordering them: the plan would
/// serialise the streams through the buffer, which is rarely what was meant (scratch
/// wants a copy per stream, state wants one writer). Checked on a step without other
/// errors, whose accesses are all resolved.
pub fn check_unordered_writes(step: &Step, program: &Program, errors: &Errors) {
    let mut reported: Vec<(usize, usize)> = Vec::new();
    for d in schedule::unordered_cross_stream_writes(program.problem) {
        let (a, b) = (&program.instances[d.from], &program.instances[d.to]);
        let Some(res) = d.resource else { continue };
        if reported.contains(&(b.op, res.buf)) {
            continue;
        }
        reported.push((b.op, res.buf));
        let buf = program.buffers[res.buf];
        let op = program.ops[b.op];
        let span = param_span(op, &buf.name);
        let joined = &step.streams[program.streams[a.stream].decl].name;
        let advice = if last_segment_is(&buf.ty, "Communicator") {
            // Every rank must issue a communicator's collectives in one order.
            format!(
                "Collectives on one communicator must run in one order on every rank: issue both on one stream (a `comm` stream, say), or order them with #[join({joined})] on `{}`",
                b.name
            )
        } else {
            format!(
                "If `{name}` holds nothing between steps (scratch), give each stream its own copy with #[scratch(per_stream)]; if it holds state (parameters, optimizer moments), copies would diverge: run both ops on one stream, or order them with #[join({joined})] on `{}`",
                b.name,
                name = buf.name
            )
        };
        errors.at(
            span,
            format!(
                "ops `{}` (stream `{}`) and `{}` (stream `{}`) both write the shared buffer `{}` and nothing else orders them; the plan would serialise the two streams through it. {advice}",
                a.name,
                program.streams[a.stream].name,
                b.name,
                program.streams[b.stream].name,
                buf.name,
            ),
        );
    }
}
