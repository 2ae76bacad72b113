//! Scratch holds nothing between steps: each copy of a scratch buffer is written whole
//! (`#[out]`) before any op reads it, by an op that runs whenever its readers do.
//! Otherwise a reader sees what the last replay left there, or what the allocator did:
//! results that change from replay to replay with nothing reported.

use std::collections::HashMap;

use crate::errors::Errors;
use crate::model::{BufKind, Buffer, Condition, Param, ParamKind};
use crate::schedule::{Access, Resource};

use super::{Instance, PhysStream, Program, param_span};

/// How an op instance uses one scratch copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// `&`: reads it.
    Read,
    /// `&mut` without `#[out]`: may read what is there before writing (to accumulate).
    Update,
    /// `#[out] &mut`: writes every element before reading any.
    Out,
}

/// One use of a scratch copy by an op instance.
pub struct Use {
    res: Resource,
    how: How,
}

impl Use {
    pub fn new(res: Resource, param: &Param) -> Use {
        let how = match (param.kind, &param.out) {
            (ParamKind::Write, Some(_)) => How::Out,
            (ParamKind::Write, None) => How::Update,
            _ => How::Read,
        };
        Use { res, how }
    }

    /// The buffer, where this use writes it whole before reading it (`#[out]`).
    pub fn written_whole(&self) -> Option<usize> {
        (self.how == How::Out).then_some(self.res.buf)
    }
}

/// What is known of one scratch copy at a point of program order.
#[derive(Default)]
struct Copy {
    /// An op that runs at every replay wrote it whole (or a use of it was reported
    /// already, which later uses need not repeat).
    always: bool,
    /// Conditional ops that wrote it whole: their conditions and instances.
    under: Vec<(Condition, usize)>,
    /// `#[when]` writers whose flag a later op wrote: the condition, the writer and the
    /// instance that wrote the flag.
    stale: Vec<(Condition, usize, usize)>,
    /// The first instance that wrote it at all.
    writer: Option<usize>,
}

impl Copy {
    fn defined_for(&self, condition: &Condition) -> bool {
        self.always || self.under.iter().any(|(c, _)| c == condition)
    }
}

/// The first use of each scratch copy writes it whole, and a copy written only under a
/// condition is read only under the same condition. One error per op and buffer.
pub fn check_first_writes(program: &Program, uses: &[Vec<Use>], errors: &Errors) {
    let mut copies: HashMap<Resource, Copy> = HashMap::new();
    let mut reported: Vec<(usize, usize)> = Vec::new();
    for (k, inst) in program.instances.iter().enumerate() {
        let op = program.ops[inst.op];
        let condition = op.condition();
        for u in uses[k]
            .iter()
            .filter(|u| is_scratch_proper(program, u.res.buf))
        {
            let copy = copies.entry(u.res).or_default();
            if u.how != How::Out && !copy.defined_for(&condition) {
                if !reported.contains(&(inst.op, u.res.buf)) {
                    let message = undefined_use(program, &copies, k, u, &condition);
                    let buf = program.buffers[u.res.buf];
                    errors.at(param_span(op, &buf.name), message);
                    reported.push((inst.op, u.res.buf));
                }
                // Reported once: later uses of the copy build on this one.
                copies.entry(u.res).or_default().always = true;
            }
            let copy = copies.entry(u.res).or_default();
            if u.how != How::Read {
                copy.writer.get_or_insert(k);
            }
            if u.how == How::Out {
                match &condition {
                    Condition::Always => copy.always = true,
                    c => copy.under.push((c.clone(), k)),
                }
            }
        }
        forget_rewritten_flags(program, k, &mut copies);
    }
}

/// Whether the rules here apply to buffer `b`: scratch that is not also a view or a
/// `#[when]` flag, both refused already (a view holds no memory, a flag is shared), so
/// that their error is not followed by one that goes away with it.
fn is_scratch_proper(program: &Program, b: usize) -> bool {
    let buf = program.buffers[b];
    buf.is_scratch()
        && buf.view_of.is_none()
        && !program
            .ops
            .iter()
            .any(|op| op.when.as_ref() == Some(&buf.name))
}

/// A `#[when(flag)]` write covers a later `#[when(flag)]` reader only while the flag
/// stays as it was: after an op writes the flag, the reader may run where the writer did
/// not.
fn forget_rewritten_flags(program: &Program, k: usize, copies: &mut HashMap<Resource, Copy>) {
    for &(res, access) in &program.problem.ops[k].accesses {
        if access != Access::Write || !program.flags.contains(&Some(res.buf)) {
            continue;
        }
        let flag = Condition::When(program.buffers[res.buf].name.to_string());
        for copy in copies.values_mut() {
            let (stale, kept) = copy.under.drain(..).partition(|(c, _)| *c == flag);
            copy.under = kept;
            let stale: Vec<(Condition, usize)> = stale;
            copy.stale
                .extend(stale.into_iter().map(|(c, writer)| (c, writer, k)));
        }
    }
}

/// Why instance `k`'s use `u` of a copy that is not defined for its condition is wrong.
fn undefined_use(
    program: &Program,
    copies: &HashMap<Resource, Copy>,
    k: usize,
    u: &Use,
    condition: &Condition,
) -> String {
    let copy = &copies[&u.res];
    let reader = &program.instances[k];
    let buf = program.buffers[u.res.buf];
    if let Some(&(_, writer, flag_writer)) = copy.stale.iter().rev().find(|(c, ..)| c == condition)
    {
        return stale_flag_message(program, reader, buf, u.how, writer, flag_writer, condition);
    }
    let written = match copy.under.last() {
        Some((c, w)) => Some((c, *w)),
        None => copy.stale.last().map(|(c, w, _)| (c, *w)),
    };
    if let Some((c, writer)) = written {
        return conditional_message(program, reader, buf, u.how, writer, c, condition);
    }
    // Nothing wrote this copy; an op may have written another copy of the buffer.
    let other = copies
        .iter()
        .filter(|(r, _)| r.buf == u.res.buf && **r != u.res)
        .filter_map(|(_, c)| c.writer)
        .min()
        .map(|w| &program.instances[w]);
    match u.how {
        How::Update => {
            let op = &program.ops[reader.op].name;
            update_message(buf, reader, op, other, program.streams)
        }
        _ => read_message(buf, reader, other, program.streams),
    }
}

/// `#[scratch(per_stream)]` or `#[scratch(per_branch)]`: how many copies it gives.
fn copies_kind(buf: &Buffer) -> &'static str {
    match buf.kind {
        BufKind::ScratchPerBranch => "#[scratch(per_branch)] gives each branch",
        _ => "#[scratch(per_stream)] gives each stream that uses it",
    }
}

/// A read of a copy that nothing wrote: `other` wrote another copy of the same buffer,
/// if an op did.
fn read_message(
    buf: &Buffer,
    reader: &Instance,
    other: Option<&Instance>,
    streams: &[PhysStream],
) -> String {
    let name = &buf.name;
    let stream = &streams[reader.stream].name;
    let Some(other) = other else {
        return format!(
            "scratch buffer `{name}` is read by op `{}` before any op of the step wrote it: scratch holds nothing between steps; write it first, in an op that takes it by `#[out] &mut`, or drop #[scratch]",
            reader.name
        );
    };
    format!(
        "op `{}` reads `{stream}`'s copy of scratch buffer `{name}`, which no op wrote earlier in this step; op `{}` wrote the copy of `{}`, but {} a copy of its own and scratch holds nothing between steps: write `{name}` on `{stream}` first, or make it a shared buffer ordered by a join",
        reader.name,
        other.name,
        streams[other.stream].name,
        copies_kind(buf)
    )
}

/// A plain `&mut` of a copy that nothing wrote: the op may read it first.
fn update_message(
    buf: &Buffer,
    op: &Instance,
    func: &syn::Ident,
    other: Option<&Instance>,
    streams: &[PhysStream],
) -> String {
    let name = &buf.name;
    let stream = &streams[op.stream].name;
    let which = match other {
        None => format!("scratch buffer `{name}` by `&mut` before any op of the step wrote it"),
        Some(other) => format!(
            "`{stream}`'s copy of scratch buffer `{name}` by `&mut` before any op wrote it (op `{}` wrote the copy of `{}`, but {} a copy of its own)",
            other.name,
            streams[other.stream].name,
            copies_kind(buf)
        ),
    };
    format!(
        "op `{}` takes {which}: `&mut` may read what is there (to accumulate, say), and scratch holds nothing between steps; if `{func}` writes every element of `{name}` before reading any, mark the parameter #[out]; otherwise write it first in an op that does",
        op.name
    )
}

/// What the use does, for messages.
fn verb(how: How) -> &'static str {
    match how {
        How::Update => "takes by `&mut` (which may read it)",
        _ => "reads",
    }
}

/// A use of a copy that only ops with another condition wrote.
fn conditional_message(
    program: &Program,
    reader: &Instance,
    buf: &Buffer,
    how: How,
    writer: usize,
    written: &Condition,
    condition: &Condition,
) -> String {
    let writer = &program.instances[writer].name;
    let (name, reader) = (&buf.name, &reader.name);
    let when = match condition {
        Condition::Always => format!("at the replays where it does not, `{reader}`"),
        c => {
            format!("`{reader}` runs {c}, so at a replay where it runs and `{writer}` does not, it")
        }
    };
    format!(
        "op `{reader}` {} scratch buffer `{name}`, which only op `{writer}` wrote before it, and `{writer}` runs {written}: {when} sees what an earlier replay left, and scratch holds nothing between steps; write `{name}` first in an op that runs whenever `{reader}` does (#[out] if it writes it whole), or give `{reader}` the condition {written}",
        verb(how)
    )
}

/// A `#[when(flag)]` use of a copy that a `#[when(flag)]` op wrote before an op wrote the
/// flag again.
fn stale_flag_message(
    program: &Program,
    reader: &Instance,
    buf: &Buffer,
    how: How,
    writer: usize,
    flag_writer: usize,
    condition: &Condition,
) -> String {
    let writer = &program.instances[writer].name;
    let setter = &program.instances[flag_writer].name;
    let (name, reader) = (&buf.name, &reader.name);
    format!(
        "op `{reader}` {} scratch buffer `{name}`, which op `{writer}` wrote under the same {condition}, but op `{setter}` writes the flag between them: `{reader}` may run at a replay where `{writer}` did not, and see what an earlier replay left (scratch holds nothing between steps); write `{name}` after `{setter}`, or in an op that runs at every replay",
        verb(how)
    )
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use crate::validate::tests::errors_of;

    /// The errors of a one-stream step with a scratch buffer `tmp`, a flag `go`, a shared
    /// `out` and a config count `k`, and the given ops.
    fn errors(ops: TokenStream) -> Vec<String> {
        errors_of(
            quote!(streams(main)),
            quote!(mod conditions {
                #[buffers]
                pub struct Buffers {
                    #[scratch(per_stream)]
                    pub tmp: DeviceBuffer<f32>,
                    pub go: DeviceFlag,
                    pub out: DeviceBuffer<f32>,
                }
                #[config]
                pub struct Config { pub k: u32 }
                fn set(s: &CaptureStream<'_>, go: &mut DeviceFlag) -> Result<()> { Ok(()) }
                #ops
            }),
        )
    }

    #[test]
    fn an_unconditional_first_write_covers_every_later_reader() {
        let found = errors(quote! {
            fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            #[every(k)]
            fn a(s: &CaptureStream<'_>, tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            #[when(go)]
            fn b(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            fn c(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn a_conditional_first_write_covers_readers_of_the_same_condition_only() {
        let found = errors(quote! {
            #[every(k)]
            fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            #[every(k)]
            fn same(s: &CaptureStream<'_>, tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            #[every(4)]
            fn count(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with("op `count` reads scratch buffer `tmp`, which only op `fill` wrote before it, and `fill` runs #[every(k)]: `count` runs #[every(4)]"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn a_when_write_covers_a_when_reader_until_the_flag_is_written() {
        let covered = errors(quote! {
            #[when(go)]
            fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            #[when(go)]
            fn read(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert!(covered.is_empty(), "{covered:#?}");
        let rewritten = errors(quote! {
            #[when(go)]
            fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            fn reset(s: &CaptureStream<'_>, #[buf(go)] flag: &mut DeviceFlag) -> Result<()> { Ok(()) }
            #[when(go)]
            fn read(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert_eq!(rewritten.len(), 1, "{rewritten:#?}");
        assert!(
            rewritten[0].contains("but op `reset` writes the flag between them"),
            "{}",
            rewritten[0]
        );
        // An unconditional reader after the flag is written: the writer's condition, named.
        let unconditional = errors(quote! {
            #[when(go)]
            fn fill(s: &CaptureStream<'_>, #[out] tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            fn reset(s: &CaptureStream<'_>, #[buf(go)] flag: &mut DeviceFlag) -> Result<()> { Ok(()) }
            fn always(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert_eq!(unconditional.len(), 1, "{unconditional:#?}");
        assert!(unconditional[0].starts_with("op `always` reads scratch buffer `tmp`, which only op `fill` wrote before it, and `fill` runs #[when(go)]"), "{}", unconditional[0]);
    }

    #[test]
    fn a_first_use_by_plain_mut_is_an_error_once_per_op_and_later_uses_build_on_it() {
        let found = errors(quote! {
            fn acc(s: &CaptureStream<'_>, tmp: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
            fn read(s: &CaptureStream<'_>, tmp: &DeviceBuffer<f32>, out: &mut DeviceBuffer<f32>) -> Result<()> { Ok(()) }
        });
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(
            found[0].starts_with(
                "op `acc` takes scratch buffer `tmp` by `&mut` before any op of the step wrote it"
            ),
            "{}",
            found[0]
        );
    }
}
