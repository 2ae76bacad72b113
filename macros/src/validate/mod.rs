//! Validation: names resolved against the declarations, schedule rules checked, and the
//! step lowered to the planner's [`Problem`]. Every rule reports to the collector and
//! checking goes on, so one build lists every mistake.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::Ident;

use crate::errors::{Errors, suggestion};
use crate::model::{BufKind, Buffer, IndexSpec, Op, ParamKind, Step};
use crate::schedule::{self, Access, OpNode, Problem, Resource};

mod params;
mod scan;
mod scratch;

/// The most buffers and events a step may have, and the highest copy number: the plan
/// stores their indices as `u16`.
const MAX_INDEXED: usize = u16::MAX as usize;

/// The most streams a step may declare, groups' members included. Each is a CUDA stream
/// with its own cuBLASLt workspace, and the planner keeps a clock per pair of streams, so
/// a step of tens of thousands of streams would exhaust the compiler's memory before it
/// reached the GPU. (A stream group alone is capped at 1024 in parse.)
const MAX_STREAMS: usize = 1024;

/// A concrete stream: a declared single stream or one member of a group.
pub struct PhysStream {
    /// `main`, `branch[2]`.
    pub name: String,
    pub decl: usize,
}

/// Which copy of a buffer an argument passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The field itself (a shared buffer, or a whole per-branch array).
    Field,
    /// Element `i` of a per-branch array.
    Element(u32),
    /// Scratch copy `k`: 0 is the field itself, `k > 0` the (k-1)th extra copy.
    Copy(usize),
}

pub enum Arg {
    Stream,
    Blas,
    Kernels,
    /// A parameter bound by its type (the stream, the handle or the kernels under an
    /// alias the macro cannot see); the span of the type, for rustc's error if it is none.
    Context(Span),
    Index(u32),
    Config(Ident),
    Buffer {
        field: Ident,
        write: bool,
        slot: Slot,
    },
}

/// One op instance: a replicated op yields one per index.
pub struct Instance {
    pub op: usize,
    pub name: String,
    pub stream: usize,
    pub args: Vec<Arg>,
}

pub struct Resolved {
    pub streams: Vec<PhysStream>,
    pub instances: Vec<Instance>,
    pub problem: Problem,
    /// Extra scratch copies to allocate, per buffer index.
    pub extra_copies: Vec<usize>,
    /// Group width a per-branch array must have, per buffer index.
    pub branch_widths: Vec<Option<u32>>,
}

/// The resolved step in program order, as the rules read it.
pub struct Program<'a> {
    pub ops: &'a [&'a Op],
    pub instances: &'a [Instance],
    pub buffers: &'a [&'a Buffer],
    pub streams: &'a [PhysStream],
    pub problem: &'a Problem,
    /// Per op: the buffer index of its `#[when]` flag.
    pub flags: &'a [Option<usize>],
}

struct OpInfo {
    /// Physical streams, one per instance, with the instance's index.
    instances: Vec<(usize, Option<u32>)>,
    group_width: Option<u32>,
    /// (stream, which `#[join]` entry, its span)
    joins: Vec<(usize, usize, Span)>,
    after: Vec<usize>,
}

/// What each rule protects against is said where it is checked.
pub fn validate(step: &Step, errors: &Errors) -> Option<Resolved> {
    if step.streams.is_empty() {
        // Parsing said so already (no `streams(..)`, or arguments it could not read);
        // every rule below starts from the origin stream.
        return None;
    }
    // --- streams -------------------------------------------------------------------
    let (decl_of, streams, members) = declare_streams(step, errors)?;
    let stream_names: Vec<String> = step.streams.iter().map(|s| s.name.to_string()).collect();
    let unknown_stream = |name: &Ident, what: &str| {
        let n = name.to_string();
        errors.spanned(
            name,
            format!(
                "{what} `{n}` is not a stream of this step (declared: {}){}",
                stream_names.join(", "),
                suggestion(&n, stream_names.iter().map(String::as_str))
            ),
        );
    };

    // --- buffers and config --------------------------------------------------------
    let buffers: Vec<&crate::model::Buffer> = step.buffer_fields().collect();
    let buf_ix: HashMap<String, usize> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.to_string(), i))
        .collect();
    // The plan numbers buffers in 16 bits; a wider index would name another buffer.
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
    for b in &buffers {
        if b.kind == BufKind::PerBranch && !matches!(b.ty, syn::Type::Array(_)) {
            // The expansion indexes it by branch.
            errors.at(
                b.kind_span,
                format!("#[per_branch] buffer `{}` holds one element per branch: give it an array type `[T; N]`", b.name),
            );
        }
    }
    let view_parent = check_views(&buffers, &buf_ix, errors);
    let config: Vec<String> = step.config_names();

    check_reserved_names(step, errors);
    for op in &step.ops {
        check_op_signature(op, errors);
    }
    let host_scan = scan::HostScan::of(step);

    // --- op names ------------------------------------------------------------------
    if step.ops.is_empty() {
        // A graph with no nodes captures nothing and cannot be instantiated usefully.
        report_no_ops(step, errors);
        return None;
    }
    let mut op_ix: HashMap<String, usize> = HashMap::new();
    let mut ops: Vec<&Op> = Vec::new();
    for op in &step.ops {
        let name = op.name.to_string();
        if let Some(&first) = op_ix.get(&name) {
            errors.spanned(
                &op.name,
                format!(
                    "two ops are named `{name}`; ops are named by their function, rename one (the first is op #{first})"
                ),
            );
            continue;
        }
        op_ix.insert(name, ops.len());
        ops.push(op);
    }
    let op_names: Vec<String> = ops.iter().map(|o| o.name.to_string()).collect();

    // --- per op: placement, parameters, joins, orderings ---------------------------
    let mut infos: Vec<OpInfo> = Vec::new();
    // Per op: the buffer index of its `#[when]` flag, where it resolved.
    let mut flags: Vec<Option<usize>> = Vec::new();
    let mut branch_widths: Vec<Option<u32>> = vec![None; buffers.len()];
    // An op whose stream did not resolve would also make the stream it meant look
    // unused; that second error would only repeat the first.
    let mut excused: Vec<usize> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let mut info = OpInfo {
            instances: vec![(0, None)],
            group_width: None,
            joins: Vec::new(),
            after: Vec::new(),
        };
        if let Some(pl) = &op.placement {
            let meant = crate::errors::did_you_mean(
                &pl.stream.to_string(),
                stream_names.iter().map(String::as_str),
            )
            .and_then(|n| decl_of.get(n).copied());
            excused.extend(meant.or_else(|| decl_of.get(&pl.stream.to_string()).copied()));
            match decl_of.get(&pl.stream.to_string()) {
                None => unknown_stream(&pl.stream, "op placed on"),
                Some(&d) => {
                    let decl = &step.streams[d];
                    match (decl.width, &pl.index) {
                        (None, None) => info.instances = vec![(members[d][0], None)],
                        (None, Some(_)) => errors.spanned(
                            &pl.stream,
                            format!("stream `{}` is a single stream, not a group: write #[stream({})]", decl.name, decl.name),
                        ),
                        (Some(w), None) => errors.spanned(
                            &pl.stream,
                            format!(
                                "`{n}` is a group of {w} streams: write #[stream({n}[d])] to replicate the op over d in 0..{w}, or #[stream({n}[0])] for one member",
                                n = decl.name
                            ),
                        ),
                        (Some(w), Some(IndexSpec::Each(_))) => {
                            info.group_width = Some(w);
                            info.instances = (0..w).map(|k| (members[d][k as usize], Some(k))).collect();
                        }
                        (Some(w), Some(IndexSpec::Fixed(k, sp))) => {
                            if *k >= w {
                                errors.at(*sp, format!("`{}` has {w} streams: index {k} is out of range 0..{w}", decl.name));
                            } else {
                                info.group_width = Some(w);
                                info.instances = vec![(members[d][*k as usize], Some(*k))];
                            }
                        }
                    }
                }
            }
        }
        let own_decl = info.instances.first().map(|&(s, _)| streams[s].decl);

        // Parameters.
        let mut bound: HashMap<String, (&Ident, ParamKind)> = HashMap::new();
        for p in &op.params {
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
            match p.kind {
                ParamKind::Read | ParamKind::Write => {
                    let b = p.binding.to_string();
                    let Some(&bi) = buf_ix.get(&b) else {
                        if config.contains(&b) {
                            errors.at(p.span, format!("`{b}` is a config value: take it by value (`{b}: T`), not by reference"));
                        } else if step.kernels.is_none() && b.contains("kernel") {
                            errors.at(p.span, format!("parameter `{b}` names no buffer; to pass the loaded kernels, declare their type: #[step(streams(..), kernels = path::Kernels)]"));
                        } else {
                            let names: Vec<String> =
                                buffers.iter().map(|x| x.name.to_string()).collect();
                            let sugg = suggestion(&b, names.iter().map(String::as_str));
                            errors.spanned(
                                &p.binding,
                                format!("parameter `{b}` names no buffer of this step{sugg}"),
                            );
                        }
                        continue;
                    };
                    if let Some((first, first_kind)) = bound.insert(b.clone(), (&p.name, p.kind)) {
                        // `&` and `&mut` to one buffer in one call alias, which the op's
                        // kernels would see as two buffers; two `&` are one read.
                        if first_kind == ParamKind::Write || p.kind == ParamKind::Write {
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
                                    op.name, by(first_kind), p.name, by(p.kind)
                                ),
                            );
                            continue;
                        }
                    }
                    let buf = buffers[bi];
                    let write = p.kind == ParamKind::Write;
                    // Reading the array whole from a group still ties its width to the
                    // group's (the width check below).
                    if let Some(attr) = &p.all_branches {
                        if let Some(message) =
                            all_branches_misuse(op, &b, buf, write, info.group_width)
                        {
                            errors.spanned(attr, message);
                            continue;
                        }
                    }
                    match (buf.kind, info.group_width) {
                        (BufKind::Shared, Some(_)) if write && matches!(op.placement.as_ref().and_then(|p| p.index.as_ref()), Some(IndexSpec::Each(_))) => {
                            // Every replica would write the one copy at the same time.
                            errors.at(
                                p.span,
                                format!(
                                    "op `{}` is replicated over a stream group but writes `{b}`, which has one copy: mark it #[per_branch] (an array, one element per branch) or #[scratch(per_branch)], or read it with `&`",
                                    op.name
                                ),
                            );
                        }
                        (BufKind::ScratchPerBranch, None) => errors.at(
                            p.span,
                            format!("`{b}` is #[scratch(per_branch)]: only an op on a stream group (#[stream(group[d])]) has a branch index to pick its copy"),
                        ),
                        (BufKind::PerBranch, None) if buf.view_of.is_some() => errors.at(
                            p.span,
                            format!(
                                "`{b}` holds one view per branch: only an op on a stream group (#[stream(group[d])]) picks one; an op off the group takes the parent `{}` whole",
                                buf.view_of.as_ref().map(Ident::to_string).unwrap_or_default()
                            ),
                        ),
                        (BufKind::PerBranch, Some(w)) => match branch_widths[bi] {
                            Some(prev) if prev != w => errors.at(
                                p.span,
                                format!("`{b}` is used by groups of {prev} and {w} streams: a #[per_branch] array has one width"),
                            ),
                            _ => branch_widths[bi] = Some(w),
                        },
                        _ => {}
                    }
                }
                ParamKind::Value => {
                    let b = p.binding.to_string();
                    if !config.contains(&b) {
                        if buf_ix.contains_key(&b) {
                            errors.at(
                                p.span,
                                format!(
                                    "`{b}` is a buffer: take it as `&T` (read) or `&mut T` (write)"
                                ),
                            );
                        } else {
                            let sugg = suggestion(&b, config.iter().map(String::as_str));
                            errors.spanned(
                                &p.binding,
                                format!("parameter `{b}` names no config field of this step{sugg}"),
                            );
                        }
                    }
                }
                _ => {}
            }
        }

        check_view_borrows(op, &buffers, &buf_ix, &view_parent, errors);
        params::check_out_markers(op, &buffers, &buf_ix, errors);
        params::check_conditional_collectives(op, &buffers, &buf_ix, errors);
        host_scan.check(op, errors);
        check_every(op, &config, errors);
        check_one_condition(op, errors);
        flags.push(check_when(op, &buffers, &buf_ix, &config, errors));

        // Joins.
        for (ji, j) in op.joins.iter().enumerate() {
            let Some(&d) = decl_of.get(&j.name.to_string()) else {
                unknown_stream(&j.name, "#[join] of");
                continue;
            };
            let targets: Vec<usize> = match (step.streams[d].width, j.index) {
                (_, None) => members[d].clone(),
                (Some(w), Some((k, sp))) => {
                    if k >= w {
                        errors.at(
                            sp,
                            format!(
                                "`{}` has {w} streams: index {k} is out of range 0..{w}",
                                j.name
                            ),
                        );
                        continue;
                    }
                    vec![members[d][k as usize]]
                }
                (None, Some((_, sp))) => {
                    errors.at(
                        sp,
                        format!("stream `{}` is a single stream, not a group", j.name),
                    );
                    continue;
                }
            };
            if Some(d) == own_decl && step.streams[d].width.is_none() {
                errors.spanned(
                    &j.name,
                    format!(
                        "op `{}` runs on `{}` already: a stream cannot join itself",
                        op.name, j.name
                    ),
                );
                continue;
            }
            if let Some(message) = own_group_join(op, j, &info, &streams, &targets) {
                errors.spanned(&j.name, message);
                continue;
            }
            // Each stream once: a second mention waits for nothing more, and usually
            // stands for a stream that was meant instead.
            let named = |t: usize| streams[t].name.clone();
            if let Some(&(t, first, _)) = info.joins.iter().find(|(t, _, _)| targets.contains(t)) {
                let is_group = |r: &crate::model::StreamRef| {
                    r.index.is_none()
                        && decl_of
                            .get(&r.name.to_string())
                            .is_some_and(|&g| step.streams[g].width.is_some())
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
                continue;
            }
            for t in targets {
                info.joins.push((t, ji, j.name.span()));
            }
        }

        // Explicit orderings: program order is the only order, so `after` looks back.
        for a in &op.after {
            let n = a.to_string();
            match op_ix.get(&n) {
                None => errors.spanned(a, format!("#[after] names no op of this step: `{n}`{}", suggestion(&n, op_names.iter().map(String::as_str)))),
                Some(&j) if j == i => errors.spanned(a, format!("op `{n}` cannot run after itself")),
                Some(&j) if j > i => errors.spanned(
                    a,
                    format!("#[after({n})] refers to a later op: ops run in program order, so move `{}` below `{n}` or drop the ordering", op.name),
                ),
                Some(&j) => info.after.push(j),
            }
        }
        infos.push(info);
    }

    // A per-branch array bound whole by ops off any group takes the width of the one
    // group, when there is one.
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

    // --- instances in program order -------------------------------------------------
    let mut first_instance = vec![0usize; ops.len()];
    let mut instances: Vec<Instance> = Vec::new();
    let mut nodes: Vec<OpNode> = Vec::new();
    // Per-stream scratch: copy slot of each (buffer, stream), in order of first use.
    let mut stream_slots: HashMap<(usize, usize), usize> = HashMap::new();
    let mut extra_copies = vec![0usize; buffers.len()];
    // Per instance: its uses of scratch copies, for the first-write rules.
    let mut uses: Vec<Vec<scratch::Use>> = Vec::new();
    let mut used = vec![false; streams.len()];
    used[0] = true;
    for (i, op) in ops.iter().enumerate() {
        first_instance[i] = instances.len();
        let info = &infos[i];
        for &(stream, index) in &info.instances {
            used[stream] = true;
            let mut args = Vec::new();
            let mut accesses = Vec::new();
            let mut scratch_uses = Vec::new();
            for p in &op.params {
                let arg = match p.kind {
                    ParamKind::Stream => Arg::Stream,
                    ParamKind::Blas => Arg::Blas,
                    ParamKind::Kernels => Arg::Kernels,
                    // The referenced type's name, where rustc says it is none of the three.
                    ParamKind::Context => Arg::Context(match &p.ty {
                        syn::Type::Reference(r) => syn::spanned::Spanned::span(&r.elem),
                        ty => syn::spanned::Spanned::span(ty),
                    }),
                    ParamKind::Index => Arg::Index(index.unwrap_or(0)),
                    ParamKind::Value => Arg::Config(p.binding.clone()),
                    ParamKind::Read | ParamKind::Write => {
                        let Some(&bi) = buf_ix.get(&p.binding.to_string()) else {
                            continue;
                        };
                        let write = p.kind == ParamKind::Write;
                        let access = if write { Access::Write } else { Access::Read };
                        let slot = match buffers[bi].kind {
                            BufKind::Shared => Slot::Field,
                            BufKind::PerBranch => match index {
                                Some(k) if p.all_branches.is_none() => Slot::Element(k),
                                _ => Slot::Field,
                            },
                            BufKind::ScratchPerBranch => Slot::Copy(index.unwrap_or(0) as usize),
                            BufKind::ScratchPerStream => {
                                let next =
                                    stream_slots.iter().filter(|((b, _), _)| *b == bi).count();
                                Slot::Copy(*stream_slots.entry((bi, stream)).or_insert(next))
                            }
                        };
                        let copies = match slot {
                            // The whole array: every element.
                            Slot::Field if buffers[bi].kind == BufKind::PerBranch => {
                                0..branch_widths[bi].unwrap_or(1) as usize
                            }
                            Slot::Field => 0..1,
                            Slot::Element(k) => k as usize..k as usize + 1,
                            Slot::Copy(k) => {
                                extra_copies[bi] = extra_copies[bi].max(k);
                                k..k + 1
                            }
                        };
                        for copy in copies {
                            let res = Resource { buf: bi, copy };
                            // One buffer read through two `&` parameters is one read.
                            if !accesses.contains(&(res, access)) {
                                accesses.push((res, access));
                            }
                            if buffers[bi].is_scratch() {
                                scratch_uses.push(scratch::Use::new(res, p));
                            }
                        }
                        Arg::Buffer {
                            field: p.binding.clone(),
                            write,
                            slot,
                        }
                    }
                };
                args.push(arg);
            }
            // A `#[when]` op reads its flag (its conditional node does, before the work):
            // ordered after the op that set it, and before an op that writes it next.
            if let Some(bi) = flags[i] {
                let res = Resource { buf: bi, copy: 0 };
                if !accesses.contains(&(res, Access::Read)) {
                    accesses.push((res, Access::Read));
                }
            }
            let name = match index {
                // An index comes only with a group placement.
                Some(k) => format!("{}[{k}]", op.name),
                _ => op.name.to_string(),
            };
            let after = info
                .after
                .iter()
                .flat_map(|&j| first_instance[j]..first_instance[j] + infos[j].instances.len())
                .collect();
            nodes.push(OpNode {
                stream,
                accesses,
                joins: info
                    .joins
                    .iter()
                    .map(|&(s, _, _)| s)
                    .filter(|&s| s != stream)
                    .collect(),
                after,
                cost: op.cost.unwrap_or(1.0),
            });
            instances.push(Instance {
                op: i,
                name,
                stream,
                args,
            });
            uses.push(scratch_uses);
        }
    }
    let problem = Problem {
        n_streams: streams.len(),
        ops: nodes,
        parents: view_parent,
    };

    // --- copies the plan numbers in 16 bits ----------------------------------------------
    check_copy_numbers(&buffers, &problem, errors);

    // --- joins with nothing pending ------------------------------------------------
    check_pending_joins(&ops, &infos, &instances, streams.len(), errors);

    // --- scratch written whole, and by an op that runs whenever its readers do ------
    let program = Program {
        ops: &ops,
        instances: &instances,
        buffers: &buffers,
        streams: &streams,
        problem: &problem,
        flags: &flags,
    };
    scratch::check_first_writes(&program, &uses, errors);

    // --- streams never used --------------------------------------------------------
    check_unused_streams(step, &streams, &members, &used, &excused, &ops, errors);

    // --- one buffer written by two streams with nothing else ordering them -----------
    if errors.is_empty() {
        check_unordered_writes(step, &program, errors);
    }

    Some(Resolved {
        streams,
        instances,
        problem,
        extra_copies,
        branch_widths,
    })
}

/// The declared streams, each group's members numbered in turn: per declaration its
/// index by name and its members, and every member. `None` past the stream limit.
fn declare_streams(step: &Step, errors: &Errors) -> Option<DeclaredStreams> {
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
    let mut decl_of: HashMap<String, usize> = HashMap::new();
    let mut streams: Vec<PhysStream> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (d, decl) in step.streams.iter().enumerate() {
        let name = decl.name.to_string();
        if decl_of.insert(name.clone(), d).is_some() {
            errors.spanned(&decl.name, format!("stream `{name}` is declared twice"));
        }
        if d == 0 && decl.width.is_some() {
            // Capture begins and ends on one stream; a group has no single one.
            errors.spanned(
                &decl.name,
                "the first stream is the origin, where capture begins and ends: make it a single stream, not a group",
            );
        }
        let mut ids = Vec::new();
        match decl.width {
            None => {
                ids.push(streams.len());
                streams.push(PhysStream { name, decl: d });
            }
            Some(w) => {
                for i in 0..w {
                    ids.push(streams.len());
                    streams.push(PhysStream {
                        name: format!("{name}[{i}]"),
                        decl: d,
                    });
                }
            }
        }
        members.push(ids);
    }
    Some((decl_of, streams, members))
}

/// What [`declare_streams`] returns: the declarations by name, the streams, and each
/// declaration's streams.
type DeclaredStreams = (HashMap<String, usize>, Vec<PhysStream>, Vec<Vec<usize>>);

/// A join of a stream that has done nothing since the joining stream last joined it
/// waits for nothing: dead code at best, a misplaced join at worst. Joins are kept per
/// pair of streams: another stream joining the same op still waits for it.
fn check_pending_joins(
    ops: &[&Op],
    infos: &[OpInfo],
    instances: &[Instance],
    n_streams: usize,
    errors: &Errors,
) {
    let mut last_op: Vec<Option<usize>> = vec![None; n_streams];
    // (joining stream, joined stream) -> the joined stream's last op then.
    let mut joined_upto: HashMap<(usize, usize), usize> = HashMap::new();
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

/// Every declared stream runs an op: an unused stream is created, joined and paid for
/// at every capture. `excused` holds the declarations an op meant but did not reach (a
/// misspelt placement), whose error would only repeat that one's; after a placement that
/// did not parse, every declaration is.
fn check_unused_streams(
    step: &Step,
    streams: &[PhysStream],
    members: &[Vec<usize>],
    used: &[bool],
    excused: &[usize],
    ops: &[&Op],
    errors: &Errors,
) {
    let unreadable = ops.iter().any(|op| op.placement_unreadable);
    for (d, decl) in step.streams.iter().enumerate().skip(1) {
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

/// A copy is a branch index (groups are at most 1024 wide) or a stream's slot (at most one
/// per stream): within bounds once the streams are, checked so that it stays so, for the
/// plan numbers copies in 16 bits and a wider one would name another copy.
fn check_copy_numbers(buffers: &[&Buffer], problem: &Problem, errors: &Errors) {
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
fn check_unordered_writes(step: &Step, program: &Program, errors: &Errors) {
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

/// The parent of each `#[view(of = ..)]` field, by buffer index. A view lies inside a
/// whole buffer that every op reaches the same way: not inside another view (whose own
/// place is known only at run time), not inside scratch or per-branch copies (each
/// stream or branch would need its own view of its own copy), and not inside itself.
fn check_views(
    buffers: &[&crate::model::Buffer],
    buf_ix: &HashMap<String, usize>,
    errors: &Errors,
) -> Vec<Option<usize>> {
    let names: Vec<String> = buffers.iter().map(|b| b.name.to_string()).collect();
    buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let parent = b.view_of.as_ref()?;
            let pn = parent.to_string();
            // The expansion indexes the spans and hands them to the runtime: a field of
            // another type would fail there too, at every op that names it.
            let spans = match (&b.ty, b.kind) {
                (syn::Type::Array(a), BufKind::PerBranch) => last_segment_is(&a.elem, "Span"),
                (ty, BufKind::Shared) => last_segment_is(ty, "Span"),
                _ => true,
            };
            if !spans {
                let want = if b.kind == BufKind::PerBranch {
                    "an array of `stepgraph::Span`, one per branch (`[Span; N]`)"
                } else {
                    "a `stepgraph::Span` (`Span::new(offset, len)`, `Span::rows`, `Span::columns`)"
                };
                errors.spanned(
                    &b.ty,
                    format!("view `{}` holds where it lies in `{pn}`: expected {want}", b.name),
                );
                return None;
            }
            if b.is_scratch() {
                errors.at(
                    b.kind_span,
                    format!("view `{}` cannot be scratch: a view holds no memory of its own, only where it lies in `{pn}`", b.name),
                );
                return None;
            }
            let Some(&pi) = buf_ix.get(&pn) else {
                errors.spanned(
                    parent,
                    format!(
                        "#[view(of = {pn})] names no buffer of this step{}",
                        suggestion(&pn, names.iter().map(String::as_str))
                    ),
                );
                return None;
            };
            let p = buffers[pi];
            let why = if pi == i {
                Some("a view cannot lie in itself".to_string())
            } else if p.view_of.is_some() {
                Some(format!("`{pn}` is itself a view: make `{}` a view of `{pn}`'s parent", b.name))
            } else if p.kind != BufKind::Shared {
                Some(format!("`{pn}` has a copy per stream or per branch, and a view lies in one buffer: view a shared buffer"))
            } else {
                None
            };
            if let Some(why) = why {
                errors.spanned(parent, format!("view `{}` of `{pn}`: {why}", b.name));
                return None;
            }
            Some(pi)
        })
        .collect()
}

/// An op receives a view of a buffer by borrowing the buffer, so it cannot take the
/// buffer and a view of it, or two views of one buffer, when it writes any of them: that
/// would be a mutable borrow beside another of the same memory. Reading them all is fine.
fn check_view_borrows(
    op: &Op,
    buffers: &[&crate::model::Buffer],
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
        {
            if write || first_write {
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
        }
        seen.push((root, p, write));
    }
}

/// `#[every(k)]` names a config field: the count is read from the config when the step is
/// captured.
fn check_every(op: &Op, config: &[String], errors: &Errors) {
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
fn check_one_condition(op: &Op, errors: &Errors) {
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
fn check_when(
    op: &Op,
    buffers: &[&crate::model::Buffer],
    buf_ix: &HashMap<String, usize>,
    config: &[String],
    errors: &Errors,
) -> Option<usize> {
    let flag = op.when.as_ref()?;
    let name = flag.to_string();
    let Some(&bi) = buf_ix.get(&name) else {
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
        return None;
    };
    let buf = buffers[bi];
    // Each stream or branch would have its own copy, and the op would read one of them
    // while another op set another; a view is a place in another buffer, not a flag.
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
    // The generated issue call lends the flag to the node while the op's work borrows
    // its buffers; the node reads the flag before the work, so a write there is for the
    // next replay and belongs in a later op.
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
    Some(bi)
}

/// What is wrong with `#[all_branches]` on a parameter binding `buf` (named `b`), if
/// anything: it asks an op on a stream group for a `#[per_branch]` array whole, to read.
fn all_branches_misuse(
    op: &Op,
    b: &str,
    buf: &crate::model::Buffer,
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
    let replicated = matches!(
        op.placement.as_ref().and_then(|p| p.index.as_ref()),
        Some(IndexSpec::Each(_))
    );
    if write && replicated {
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

/// A join that names the op's own stream through a group (the group, or its own member
/// of it): what is wrong with it, if anything. `info` holds the op's placement, `group`
/// the streams the join names.
fn own_group_join(
    op: &Op,
    join: &crate::model::StreamRef,
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

/// An op is called by the expansion as `op(args..)?` inside the capture, in program
/// order: what its signature must be for that call to mean what the plan says.
fn check_op_signature(op: &Op, errors: &Errors) {
    let sig = &op.item.sig;
    let name = &op.name;
    // The capture issues work as the op runs; a future would run it later, outside it.
    if let Some(a) = &sig.asyncness {
        errors.spanned(
            a,
            format!("op `{name}` is `async`: ops issue their work on the capture stream as they run, so an op is a plain `fn`; remove `async`"),
        );
    }
    // The expansion calls the op from safe code; the unsafe part belongs inside it.
    if let Some(u) = &sig.unsafety {
        errors.spanned(
            u,
            format!("op `{name}` is an `unsafe fn`: the step calls it from safe code; make it a safe `fn` with an `unsafe {{ .. }}` block inside, stating why it holds"),
        );
    }
    // The expansion calls the op without naming its type or const parameters: rustc
    // infers each from the buffers and config bound to the parameters whose types
    // mention it, and one that no parameter mentions cannot be inferred.
    for param in &sig.generics.params {
        let (ident, what) = match param {
            syn::GenericParam::Type(t) => (&t.ident, "type"),
            syn::GenericParam::Const(c) => (&c.ident, "const"),
            syn::GenericParam::Lifetime(_) => continue,
        };
        let used = sig.inputs.iter().any(|input| match input {
            syn::FnArg::Typed(pt) => mentions(&pt.ty, ident),
            syn::FnArg::Receiver(_) => false,
        });
        if !used {
            errors.spanned(
                ident,
                format!("op `{name}`'s {what} parameter `{ident}` appears in no parameter's type: the step calls `{name}` with its buffers and config, and rustc infers `{ident}` from their types; use `{ident}` in a parameter's type, or write the concrete type"),
            );
        }
    }
    // A failed launch or matmul must stop the capture (which is then discarded): an op
    // says so by returning the error.
    if let syn::ReturnType::Default = sig.output {
        errors.spanned(
            name,
            format!("op `{name}` returns nothing: an op returns `stepgraph::Result<()>`, so that a failed launch stops the capture; add `-> Result<()>` and end with `Ok(())`"),
        );
    }
}

/// Whether `ident` occurs in `ty` (as a type, or as a const in an array length).
fn mentions(ty: &syn::Type, ident: &Ident) -> bool {
    struct Finder<'a> {
        ident: &'a Ident,
        found: bool,
    }
    impl<'ast> syn::visit::Visit<'ast> for Finder<'_> {
        fn visit_ident(&mut self, i: &'ast Ident) {
            self.found |= i == self.ident;
        }
    }
    let mut finder = Finder {
        ident,
        found: false,
    };
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.found
}

/// A step without ops. Where a `fn` of the module takes a reference to a type the macro
/// cannot resolve, that is likely the op, its stream type an alias declared outside the
/// module: the error names it and the remedy.
fn report_no_ops(step: &Step, errors: &Errors) {
    let unresolved = step.other.iter().find_map(|item| {
        let syn::Item::Fn(f) = item else { return None };
        f.sig.inputs.iter().find_map(|input| match input {
            syn::FnArg::Typed(pt) => match &*pt.ty {
                syn::Type::Reference(r) => unresolved_type(&r.elem).map(|t| (&f.sig.ident, t)),
                _ => None,
            },
            syn::FnArg::Receiver(_) => None,
        })
    });
    match unresolved {
        Some((f, (ty, name))) => errors.spanned(
            ty,
            format!(
                "this step has no ops, and `fn {f}` takes `&{name}`, a type the macro cannot resolve: if `{name}` is an alias of CaptureStream (or Blas) declared outside the module, mark the op #[op]; an op is a `fn` of the module that takes the capture stream (`&CaptureStream<'_>`) or its cuBLASLt handle (`&Blas<'_>`), or carries an op attribute"
            ),
        ),
        None => errors.spanned(
            &step.name,
            "this step has no ops: an op is a `fn` of the module that takes the capture stream (`&CaptureStream<'_>`) or its cuBLASLt handle (`&Blas<'_>`); other `fn`s are helpers",
        ),
    }
}

/// A path type that is no device memory and no primitive (a capitalised name that is not
/// `Self`): one the macro cannot tell the stream from. With its name.
fn unresolved_type(ty: &syn::Type) -> Option<(&syn::Type, String)> {
    let syn::Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?.ident.to_string();
    let capitalised = last.starts_with(|c: char| c.is_ascii_uppercase()) && last != "Self";
    (capitalised && !crate::parse::is_device_memory(ty)).then_some((ty, last))
}

/// The names the expansion defines in the step's module, with what each is.
const RESERVED: &[(&str, &str)] = &[
    ("Step", "the step's type"),
    ("Spec", "the spec `Step` runs"),
    ("PLAN", "the compile-time plan"),
    ("__Scratch", "the scratch copies"),
    ("__OPS", "the plan's ops"),
    ("__EDGES", "the plan's edges"),
    ("__sg", "the path to the runtime"),
];

/// The identifier an item of the module defines, if it defines one.
pub fn item_ident(item: &syn::Item) -> Option<&Ident> {
    use syn::Item::*;
    match item {
        Const(i) => Some(&i.ident),
        Enum(i) => Some(&i.ident),
        Fn(i) => Some(&i.sig.ident),
        Mod(i) => Some(&i.ident),
        Static(i) => Some(&i.ident),
        Struct(i) => Some(&i.ident),
        Trait(i) => Some(&i.ident),
        Type(i) => Some(&i.ident),
        Union(i) => Some(&i.ident),
        _ => None,
    }
}

/// An item of the module named like one the expansion defines would clash with it, and
/// rustc would report the clash at the attribute, not at the item.
fn check_reserved_names(step: &Step, errors: &Errors) {
    for ident in step.other.iter().filter_map(item_ident) {
        let name = ident.to_string();
        if let Some((_, what)) = RESERVED.iter().find(|(n, _)| *n == name) {
            errors.spanned(
                ident,
                format!("`{name}` is defined by #[step] in this module ({what}): rename this item"),
            );
        }
        let generated = match name.as_str() {
            "Buffers" if step.buffers.is_none() => Some(("buffers", "#[buffers]")),
            "Config" if step.config.is_none() => Some(("config", "#[config]")),
            _ => None,
        };
        if let Some((what, attr)) = generated {
            errors.spanned(
                ident,
                format!(
                    "a step without a {attr} struct gets an empty `{name}`, which this item would clash with: mark this struct {attr} if it holds the step's {what}, or rename it"
                ),
            );
        }
    }
}

/// The rule only the plan can check: its events, numbered in 16 bits like the streams.
/// A wider event index would make a stream wait on the wrong event. The planner records
/// at most one event per op instance, so only a step of tens of thousands of ops gets here.
pub fn check_plan(step: &Step, plan: &schedule::Plan, errors: &Errors) {
    if plan.events.len() > MAX_INDEXED {
        errors.spanned(
            &step.name,
            format!(
                "the plan of this step has {} events: expected at most {MAX_INDEXED} (the plan numbers them in 16 bits): split the step in two",
                plan.events.len()
            ),
        );
    }
}

/// Whether `ty` names a type whose last path segment is `name` (`Communicator`,
/// `stepgraph::Communicator`), behind references and parentheses.
fn last_segment_is(ty: &syn::Type, name: &str) -> bool {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == name),
        syn::Type::Reference(r) => last_segment_is(&r.elem, name),
        syn::Type::Paren(p) => last_segment_is(&p.elem, name),
        syn::Type::Group(g) => last_segment_is(&g.elem, name),
        _ => false,
    }
}

/// Where an error about an op's use of `buffer` points: the parameter that binds it.
fn param_span(op: &Op, buffer: &Ident) -> Span {
    op.params
        .iter()
        .find(|p| p.binding == *buffer)
        .map_or(op.name.span(), |p| p.span)
}

#[cfg(test)]
pub(crate) mod tests {
    use proc_macro2::TokenStream;
    use quote::{format_ident, quote};
    use syn::Item;

    use super::*;
    use crate::schedule::Event;

    /// The messages of the `compile_error!`s an expansion starts with.
    pub(crate) fn errors_of(attr: TokenStream, item: TokenStream) -> Vec<String> {
        let out = crate::expand(attr, item);
        let file: syn::File = syn::parse2(out).expect("the expansion parses as a file");
        file.items
            .iter()
            .filter_map(|item| match item {
                Item::Macro(m)
                    if m.mac.path.segments.last().map(|s| s.ident.to_string())
                        == Some("compile_error".into()) =>
                {
                    Some(m.mac.parse_body::<syn::LitStr>().unwrap().value())
                }
                _ => None,
            })
            .collect()
    }

    const ONE_OP: &str = "fn a(s: &CaptureStream<'_>) -> Result<()> { Ok(()) }";

    #[test]
    fn more_than_1024_streams_is_one_error_at_the_group_past_the_limit() {
        // The origin and 2 groups of 1024: 2049 streams.
        let groups = (0..2).map(|g| {
            let g = format_ident!("g{g}");
            quote!(#g[1024])
        });
        let op: syn::ItemFn = syn::parse_str(ONE_OP).unwrap();
        let errors = errors_of(
            quote!(streams(main, #(#groups),*)),
            quote!(mod wide { #op }),
        );
        assert_eq!(
            errors,
            [
                "this step declares 2049 streams: expected at most 1024 (each is a CUDA stream with its own workspace); `g0` goes past the limit"
            ]
        );
    }

    #[test]
    fn more_buffers_than_16_bits_number_is_an_error_at_the_first_past_the_limit() {
        let fields = (0..=MAX_INDEXED).map(|b| {
            let b = format_ident!("b{b}");
            quote!(pub #b: DeviceBuffer<f32>)
        });
        let op: syn::ItemFn = syn::parse_str(ONE_OP).unwrap();
        let errors = errors_of(
            quote!(streams(main)),
            quote!(mod many {
                #[buffers]
                pub struct Buffers { #(#fields),* }
                #op
            }),
        );
        assert_eq!(
            errors,
            [
                "this step declares 65536 buffers: expected at most 65535 (the plan numbers them in 16 bits); `b65535` goes past the limit"
            ]
        );
    }

    /// A one-stream step validated without a mistake.
    fn resolved(module: syn::ItemMod) -> Resolved {
        let errors = Errors::new();
        let args = crate::parse::parse_args(quote!(streams(main)), &errors);
        let step = crate::parse::parse(args, module, &errors).unwrap();
        let resolved = validate(&step, &errors).unwrap();
        assert!(errors.finish().is_none());
        resolved
    }

    #[test]
    fn a_when_op_reads_its_flag_once_whether_or_not_it_names_it() {
        let module: syn::ItemMod = syn::parse_quote!(
            mod guarded {
                #[buffers]
                pub struct Buffers {
                    pub x: DeviceBuffer<f32>,
                    pub go: DeviceFlag,
                }
                fn set(s: &CaptureStream<'_>, go: &mut DeviceFlag) -> Result<()> {
                    Ok(())
                }
                #[when(go)]
                fn a(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
                    Ok(())
                }
                #[when(go)]
                fn b(
                    s: &CaptureStream<'_>,
                    go: &DeviceFlag,
                    x: &mut DeviceBuffer<f32>,
                ) -> Result<()> {
                    Ok(())
                }
            }
        );
        let resolved = resolved(module);
        let go = Resource { buf: 1, copy: 0 };
        for op in &resolved.problem.ops[1..] {
            let reads = op
                .accesses
                .iter()
                .filter(|&&a| a == (go, Access::Read))
                .count();
            assert_eq!(reads, 1, "{:?}", op.accesses);
        }
    }

    #[test]
    fn one_buffer_bound_to_two_shared_parameters_is_one_read() {
        let module: syn::ItemMod = syn::parse_quote!(
            mod twice {
                #[buffers]
                pub struct Buffers {
                    pub x: DeviceBuffer<f32>,
                    pub y: DeviceBuffer<f32>,
                }
                fn f(
                    s: &CaptureStream<'_>,
                    x: &DeviceBuffer<f32>,
                    #[buf(x)] again: &DeviceBuffer<f32>,
                    y: &mut DeviceBuffer<f32>,
                ) -> Result<()> {
                    Ok(())
                }
            }
        );
        let resolved = resolved(module);
        let x = Resource { buf: 0, copy: 0 };
        let y = Resource { buf: 1, copy: 0 };
        assert_eq!(
            resolved.problem.ops[0].accesses,
            [(x, Access::Read), (y, Access::Write)]
        );
        // Both parameters are passed.
        assert_eq!(resolved.instances[0].args.len(), 4);
    }

    #[test]
    fn a_plan_with_more_events_than_16_bits_number_is_an_error_at_the_step() {
        let errors = Errors::new();
        let module: syn::ItemMod = syn::parse_str(&format!("mod busy {{ {ONE_OP} }}")).unwrap();
        let args = crate::parse::parse_args(quote!(streams(main)), &errors);
        let step = crate::parse::parse(args, module, &errors).unwrap();
        let resolved = validate(&step, &errors).unwrap();
        let mut plan = schedule::plan(&resolved.problem);
        check_plan(&step, &plan, &errors);
        assert!(errors.is_empty());
        plan.events = vec![
            Event {
                stream: 0,
                after: None,
            };
            MAX_INDEXED + 1
        ];
        check_plan(&step, &plan, &errors);
        let out = errors.finish().unwrap().to_string();
        assert!(
            out.contains("the plan of this step has 65536 events: expected at most 65535"),
            "{out}"
        );
    }
}
