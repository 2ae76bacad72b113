//! Validation: names resolved against the declarations, schedule rules checked, and the
//! step lowered to the planner's [`Problem`]. Every rule reports to the collector and
//! checking goes on, so one build lists every mistake.
//!
//! One function per rule, named for it, called in turn from [`validate`]; the rules sit
//! with what they judge: `streams`, `buffers`, `items` (signatures and names), `bind`
//! (what parameters bind), `params` (parameter markers), `conditions`, `joins`, `scan`
//! (op bodies) and `scratch`. `lower` builds the planner's input and checks nothing.

use std::collections::HashMap;

use proc_macro2::Span;
use syn::Ident;

use crate::errors::Errors;
use crate::model::{Buffer, Op, Priority, Step};
use crate::schedule::{self, Problem};

pub mod automatic;
mod bind;
mod buffers;
mod conditions;
pub(crate) mod costs;
mod items;
mod joins;
mod lower;
mod params;
mod scan;
mod scratch;
mod streams;

pub use items::item_ident;

/// The most buffers and events a step may have, and the highest copy number: the plan
/// stores their indices as `u16`.
const MAX_INDEXED: usize = u16::MAX as usize;

/// The most streams a step may declare, groups' members included. Each is a CUDA stream
/// with its own cuBLASLt workspace, and the planner keeps a clock per pair of streams, so
/// a step of tens of thousands of streams would exhaust the compiler's memory before it
/// reached the GPU. (A stream group alone is capped at 1024 in parse.)
const MAX_STREAMS: usize = 1024;

/// A concrete stream: a declared single stream, one member of a group, or one the
/// planner added.
#[derive(Clone)]
pub struct PhysStream {
    /// `main`, `branch[2]`, `auto[0]`.
    pub name: String,
    /// The declaration it belongs to; the planner's streams belong to the origin's.
    pub decl: usize,
    pub priority: Priority,
    /// The planner added it.
    pub automatic: bool,
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

#[derive(Clone)]
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
#[derive(Clone)]
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
    /// What the planner placed, where it placed any op.
    pub automatic: Option<automatic::Report>,
    /// `compare(auto)`: the planner's placement of every op, a second plan of the same
    /// instances over the same copies.
    pub whole: Option<Box<Resolved>>,
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

#[derive(Clone)]
struct OpInfo {
    /// Physical streams, one per instance, with the instance's index.
    instances: Vec<(usize, Option<u32>)>,
    group_width: Option<u32>,
    /// (stream, which `#[join]` entry, its span)
    joins: Vec<(usize, usize, Span)>,
    after: Vec<usize>,
}

/// The names the rules resolve against: the step's streams, buffers and config.
struct Scope<'a> {
    step: &'a Step,
    streams: streams::Streams,
    buffers: Vec<&'a Buffer>,
    buf_ix: HashMap<String, usize>,
    config: Vec<String>,
    /// The parent of each `#[view]` buffer that resolved, by buffer index.
    view_parent: Vec<Option<usize>>,
}

/// The ops, each name once, in program order.
struct Ops<'a> {
    list: Vec<&'a Op>,
    by_name: HashMap<String, usize>,
    names: Vec<String>,
}

/// What the rules on each op resolved.
struct PerOp {
    infos: Vec<OpInfo>,
    /// Per op: the buffer index of its `#[when]` flag, where it resolved.
    flags: Vec<Option<usize>>,
    /// Group width a per-branch array must have, per buffer index.
    branch_widths: Vec<Option<u32>>,
    /// Declarations an op meant but did not reach, whose unused error would repeat the
    /// op's.
    excused: Vec<usize>,
}

/// What each rule protects against is said where it is checked. The rules run in a fixed
/// order, and each op's in turn, so the errors come in the order of the definition.
pub fn validate(step: &Step, errors: &Errors) -> Option<Resolved> {
    if step.streams.is_empty() {
        // Parsing said so already (no `streams(..)`, or arguments it could not read);
        // every rule below starts from the origin stream.
        return None;
    }
    let streams = streams::declare_streams(step, errors)?;
    let buffers: Vec<&Buffer> = step.buffer_fields().collect();
    let buf_ix: HashMap<String, usize> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| (b.name.to_string(), i))
        .collect();
    buffers::check_buffer_count(&buffers, errors);
    buffers::check_per_branch_arrays(&buffers, errors);
    buffers::check_shared(&buffers, errors);
    let view_parent = buffers::check_views(&buffers, &buf_ix, errors);
    let scope = Scope {
        step,
        streams,
        buffers,
        buf_ix,
        config: step.config_names(),
        view_parent,
    };
    items::check_reserved_names(step, errors);
    for op in &step.ops {
        items::check_op_signature(op, errors);
    }
    let host_scan = scan::HostScan::of(step);
    if step.ops.is_empty() {
        // A graph with no nodes captures nothing and cannot be instantiated usefully.
        items::report_no_ops(step, errors);
        return None;
    }
    let ops = items::check_duplicate_ops(step, errors);
    let mut per_op = check_each_op(&scope, &ops, &host_scan, errors);
    buffers::default_branch_widths(step, &scope.buffers, &mut per_op.branch_widths);
    let resolution = lower::Resolution {
        infos: &per_op.infos,
        flags: &per_op.flags,
        branch_widths: &per_op.branch_widths,
        n_streams: scope.streams.all.len(),
        after_instances: &[],
    };
    let lowered = lower::lower(&scope, &ops.list, resolution);
    check_program(&scope, &ops.list, &per_op, &lowered, errors);
    if !errors.is_empty() {
        // Placement builds on a step without mistakes.
        return None;
    }
    let costs = costs::read(&scope, &lowered.instances, errors);
    let whole = step.compare_auto.map(|_| {
        automatic::place(
            &scope,
            &ops,
            &per_op,
            &lowered,
            automatic::Mode::Whole,
            &costs,
            errors,
        )
    });
    let resolved = match &step.auto {
        Some(auto) => automatic::place(
            &scope,
            &ops,
            &per_op,
            &lowered,
            automatic::Mode::Unplaced(auto.most),
            &costs,
            errors,
        )?,
        None => Resolved {
            streams: scope.streams.all,
            instances: lowered.instances,
            problem: lowered.problem,
            extra_copies: lowered.extra_copies,
            branch_widths: per_op.branch_widths,
            automatic: None,
            whole: None,
        },
    };
    Some(Resolved {
        whole: whole.flatten().map(Box::new),
        ..resolved
    })
}

/// The rules on each op in turn, in program order: where it runs, what it binds, its
/// conditions, and what it waits for.
fn check_each_op(scope: &Scope, ops: &Ops, host_scan: &scan::HostScan, errors: &Errors) -> PerOp {
    let mut per_op = PerOp {
        infos: Vec::new(),
        flags: Vec::new(),
        branch_widths: vec![None; scope.buffers.len()],
        excused: Vec::new(),
    };
    let (buffers, buf_ix) = (&scope.buffers, &scope.buf_ix);
    for (i, op) in ops.list.iter().enumerate() {
        let mut info = streams::place_op(scope, op, &mut per_op.excused, errors);
        let own_decl = info
            .instances
            .first()
            .map(|&(s, _)| scope.streams.all[s].decl);
        bind::check_params(scope, op, &info, &mut per_op.branch_widths, errors);
        buffers::check_view_borrows(op, buffers, buf_ix, &scope.view_parent, errors);
        params::check_out_markers(op, buffers, buf_ix, errors);
        params::check_conditional_collectives(op, buffers, buf_ix, errors);
        host_scan.check(op, errors);
        conditions::check_every(op, &scope.config, errors);
        conditions::check_one_condition(op, errors);
        per_op.flags.push(conditions::check_when(
            op,
            buffers,
            buf_ix,
            &scope.config,
            errors,
        ));
        joins::resolve_joins(scope, op, own_decl, &mut info, errors);
        joins::resolve_after(ops, i, op, &mut info, errors);
        per_op.infos.push(info);
    }
    per_op
}

/// The rules on the whole program, once every op is lowered to the planner's nodes.
fn check_program(
    scope: &Scope,
    ops: &[&Op],
    per_op: &PerOp,
    lowered: &lower::Lowered,
    errors: &Errors,
) {
    let problem = &lowered.problem;
    buffers::check_copy_numbers(&scope.buffers, problem, errors);
    joins::check_pending_joins(
        ops,
        &per_op.infos,
        &lowered.instances,
        scope.streams.all.len(),
        errors,
    );
    let program = Program {
        ops,
        instances: &lowered.instances,
        buffers: &scope.buffers,
        streams: &scope.streams.all,
        problem,
        flags: &per_op.flags,
    };
    scratch::check_first_writes(&program, &lowered.uses, errors);
    streams::check_unused_streams(scope, &lowered.used, &per_op.excused, ops, errors);
    if errors.is_empty() {
        buffers::check_unordered_writes(scope.step, &program, errors);
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
    use crate::schedule::{Access, Event, Resource};

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
