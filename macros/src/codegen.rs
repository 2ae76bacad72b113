//! Code generation: the module with its `PLAN` constant and its `Step` type. The only
//! module that quotes. Generated code reaches the runtime only through
//! `::stepgraph::__rt_v1`.

use proc_macro2::{Literal, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, Type};

use crate::model::{BufKind, Buffer, Priority, Step};
use crate::schedule::{Access, DepKind, Plan};
use crate::validate::{Arg, Resolved, Slot};

/// The hidden module of the runtime that generated code calls, as the module's local
/// alias `__sg` refers to it.
fn rt() -> TokenStream {
    quote!(__sg)
}

/// `use <runtime>::__rt_v1 as __sg;`: the one path into the runtime, `::stepgraph` unless
/// the step says `crate = path`.
fn rt_use(step: &Step) -> TokenStream {
    match &step.krate {
        Some(path) => quote!(use #path::__rt_v1 as __sg;),
        None => quote!(
            use ::stepgraph::__rt_v1 as __sg;
        ),
    }
}

/// An op index as a `u32` literal.
fn lit_u32(n: usize) -> TokenStream {
    match u32::try_from(n) {
        Ok(n) => Literal::u32_unsuffixed(n).into_token_stream(),
        Err(_) => index_too_wide(n, 32),
    }
}

/// A stream, buffer, event or copy index as a `u16` literal. Validation refuses a step
/// with more than `u16::MAX` of any of these, so the fallback is never emitted; were it
/// ever, the build would stop there instead of wrapping to another index.
fn lit_u16(n: usize) -> TokenStream {
    match u16::try_from(n) {
        Ok(n) => Literal::u16_unsuffixed(n).into_token_stream(),
        Err(_) => index_too_wide(n, 16),
    }
}

fn index_too_wide(n: usize, bits: u32) -> TokenStream {
    let msg = format!(
        "stepgraph: index {n} does not fit the plan's {bits}-bit indices; validation should have refused this step (a bug in stepgraph-macros)"
    );
    quote!(::core::compile_error!(#msg))
}

/// The `PLAN` constant, written with the runtime's compact `const fn` constructors, with
/// the schedule's `summary` in its docs.
fn plan_const(step: &Step, resolved: &Resolved, plan: &Plan, summary: &str) -> TokenStream {
    plan_const_named(step, resolved, plan, summary, PlanNames::STEP)
}

/// The names a plan's constants take in the module.
struct PlanNames {
    plan: &'static str,
    ops: &'static str,
    edges: &'static str,
    doc: &'static str,
}

impl PlanNames {
    const STEP: PlanNames = PlanNames {
        plan: "PLAN",
        ops: "__OPS",
        edges: "__EDGES",
        doc: " The schedule of this step, planned at compile time. `println!(\"{}\", PLAN)` prints it in full.",
    };
    const AUTO: PlanNames = PlanNames {
        plan: "AUTO_PLAN",
        ops: "__AUTO_OPS",
        edges: "__AUTO_EDGES",
        doc: " The planner's placement of every op of this step (`compare(auto)`): the same ops in the same order, over the same buffer copies, each `#[stream]` and the declared priorities ignored. `Schedule::Automatic` captures it, to compare it on the GPU with `PLAN`.",
    };
}

fn plan_const_named(
    step: &Step,
    resolved: &Resolved,
    plan: &Plan,
    summary: &str,
    names: PlanNames,
) -> TokenStream {
    let rt = rt();
    let step_name = step.name.to_string();
    let streams = resolved.streams.iter().map(|s| {
        let name = &s.name;
        let desc = match s.priority {
            Priority::Normal => quote!(#rt::StreamDesc::named(#name)),
            Priority::Low => quote!(#rt::stream(#name, #rt::StreamPriority::Low)),
            Priority::High => quote!(#rt::stream(#name, #rt::StreamPriority::High)),
        };
        if s.automatic {
            quote!(#desc.automatic())
        } else {
            desc
        }
    });
    let placement = resolved.automatic.as_ref().map(|report| {
        let text = placement_text(resolved, report);
        quote!(.with_placement(#text))
    });
    let buffers = step.buffer_fields().map(|b| {
        let name = b.name.to_string();
        let kind = match b.kind {
            BufKind::Shared => quote!(Shared),
            BufKind::PerBranch => quote!(PerBranch),
            BufKind::ScratchPerStream => quote!(ScratchPerStream),
            BufKind::ScratchPerBranch => quote!(ScratchPerBranch),
        };
        let mut desc = quote!(#rt::BufferDesc::new(#name, #rt::BufKind::#kind));
        if b.across_steps.is_some() {
            desc = quote!(#desc.with_across_steps());
        }
        match parent_index(step, b) {
            Some(p) => {
                let p = lit_u16(p);
                quote!(#desc.with_view_of(#rt::BufId(#p)))
            }
            None => desc,
        }
    });
    let ops = resolved
        .instances
        .iter()
        .enumerate()
        .map(|(k, inst)| op_desc(step, resolved, plan, k, inst));
    let edges = plan.deps.iter().map(|d| {
        let (from, to) = (lit_u32(d.from), lit_u32(d.to));
        let buf = d.resource.map(|r| lit_u16(r.buf));
        match (d.kind, buf) {
            (DepKind::ReadAfterWrite, Some(b)) => quote!(#rt::raw(#from, #to, #b)),
            (DepKind::WriteAfterRead, Some(b)) => quote!(#rt::war(#from, #to, #b)),
            (DepKind::WriteAfterWrite, Some(b)) => quote!(#rt::waw(#from, #to, #b)),
            (DepKind::Join, _) => quote!(#rt::join(#from, #to)),
            // Data edges always name their buffer; `After` is the only other kind.
            _ => quote!(#rt::after(#from, #to)),
        }
    });
    let events = plan.events.iter().map(|e| match e.after {
        Some(a) => {
            let (stream, a) = (lit_u16(e.stream), lit_u32(a));
            quote!(#rt::event(#stream, #a))
        }
        None => quote!(#rt::begin()),
    });
    let final_waits = plan.final_waits.iter().map(|&e| lit_u16(e));
    let path = |p: &[usize]| {
        let ids = p.iter().map(|&o| lit_u32(o));
        quote!(&#rt::ops([#(#ids),*]))
    };
    let critical = path(&plan.critical_path);
    let critical_cost = path(&plan.critical_path_by_cost);
    let (plan_name, ops_name, edges_name) = (
        format_ident!("{}", names.plan),
        format_ident!("{}", names.ops),
        format_ident!("{}", names.edges),
    );
    let doc = names.doc;
    quote! {
        #[doc = #doc]
        #[doc = ""]
        #[doc = #summary]
        pub const #plan_name: #rt::PlanDesc = #rt::PlanDesc::new(#step_name)
            .with_streams(&[#(#streams),*])
            .with_buffers(&[#(#buffers),*])
            .with_ops(#ops_name)
            .with_edges(#edges_name)
            .with_events(&[#(#events),*])
            .with_final_waits(&#rt::events([#(#final_waits),*]))
            .with_critical_paths(#critical, #critical_cost)
            #placement;
        const #ops_name: &[#rt::OpDesc] = &[#(#ops),*];
        const #edges_name: &[#rt::EdgeDesc] = &[#(#edges),*];
    }
}

/// `include_bytes!` of the step's costs file where it exists, so that a change to the
/// file builds the step again (a proc macro has no other way to track a file on stable).
pub fn track_costs_file(step: &Step) -> TokenStream {
    let Some(lit) = &step.costs else {
        return TokenStream::new();
    };
    let path = crate::validate::costs::path(step, lit);
    if !path.is_file() {
        return TokenStream::new();
    }
    let path = path.to_string_lossy().into_owned();
    quote::quote_spanned!(lit.span()=> const _: &[u8] = include_bytes!(#path);)
}

/// What the plan says of the ops the planner placed: how many, from which costs, and
/// what the simulated run gives against the critical path.
fn placement_text(resolved: &Resolved, report: &crate::validate::automatic::Report) -> String {
    let placed = report.placed.iter().filter(|&&p| p).count();
    let added = resolved.streams.iter().filter(|s| s.automatic).count();
    format!(
        "placed by the planner: {placed} of {} ops, on the origin and {added} streams of its own, from {}: a simulated run of {:.2} against a critical path of {:.2}",
        report.placed.len(),
        report.source,
        report.makespan,
        report.critical
    )
}

/// The schedule in a few lines for rustdoc: each stream's ops in issue order, the events
/// that order them and the critical path, so that a reader of the docs sees where each op
/// runs without printing the plan.
pub(crate) fn plan_summary(resolved: &Resolved, plan: &Plan) -> String {
    let width = resolved
        .streams
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    let mut lines = vec![" ```text".to_string()];
    for (k, s) in resolved.streams.iter().enumerate() {
        let ops: Vec<&str> = resolved
            .instances
            .iter()
            .filter(|i| i.stream == k)
            .map(|i| i.name.as_str())
            .collect();
        lines.push(format!(" {:width$}  {}", s.name, ops.join(", ")));
    }
    lines.push(" ```".into());
    let name = |&o: &usize| resolved.instances[o].name.as_str();
    let critical: Vec<&str> = plan.critical_path.iter().map(name).collect();
    lines.push(format!(
        " {} streams, {} ops, {} events. Critical path (ops): {}.",
        resolved.streams.len(),
        resolved.instances.len(),
        plan.events.iter().filter(|e| e.after.is_some()).count(),
        critical.join(" → ")
    ));
    lines.join("\n")
}

/// Op instance `k`'s entry of the plan: its stream, accesses, events, cost and
/// condition.
fn op_desc(
    step: &Step,
    resolved: &Resolved,
    plan: &Plan,
    k: usize,
    inst: &crate::validate::Instance,
) -> TokenStream {
    let rt = rt();
    let name = &inst.name;
    let func = step.ops[inst.op].name.to_string();
    let stream = lit_u16(inst.stream);
    let accesses = resolved.problem.ops[k].accesses.iter().map(|(r, a)| {
        let (buf, copy) = (lit_u16(r.buf), lit_u16(r.copy));
        match a {
            Access::Read => quote!(#rt::read(#buf, #copy)),
            Access::Write => quote!(#rt::write(#buf, #copy)),
        }
    });
    let waits = (!plan.waits[k].is_empty()).then(|| {
        let w = plan.waits[k].iter().map(|&e| lit_u16(e));
        quote!(.with_waits(&#rt::events([#(#w),*])))
    });
    let record = plan.records[k].map(|e| {
        let e = lit_u16(e);
        quote!(.with_record(#rt::EventId(#e)))
    });
    let cost = resolved.problem.ops[k].cost;
    let cost = (cost != 1.0).then(|| {
        let c = Literal::f64_suffixed(cost);
        quote!(.with_cost(#c))
    });
    let every = step.ops[inst.op].every.as_ref().map(|e| {
        let text = e.text();
        quote!(.with_every(#text))
    });
    let when = step.ops[inst.op].when.as_ref().and_then(|flag| {
        let b = step.buffer_fields().position(|b| b.name == *flag)?;
        let b = lit_u16(b);
        Some(quote!(.with_when(#rt::BufId(#b))))
    });
    let automatic = resolved
        .automatic
        .as_ref()
        .is_some_and(|r| r.placed[k])
        .then(|| quote!(.placed_automatically()));
    quote!(#rt::op(#name, #func, #stream, &[#(#accesses),*]) #waits #record #cost #every #when #automatic)
}

/// The index of a view's parent among the buffers (validation resolved it).
fn parent_index(step: &Step, b: &crate::model::Buffer) -> Option<usize> {
    let parent = b.view_of.as_ref()?;
    step.buffers
        .iter()
        .flat_map(|s| &s.fields)
        .position(|f| f.name == *parent)
}

/// Whether an item of the module is named `name` (which the expansion then must not
/// define again: validation has reported the clash).
fn defines(step: &Step, name: &str) -> bool {
    step.other
        .iter()
        .filter_map(crate::validate::item_ident)
        .any(|i| i == name)
}

/// `NAME_WIDTH`, one `usize` const per stream group `name[N]`: the number of branches, for
/// the `#[per_branch]` arrays' types (`[T; NAME_WIDTH]`) and any code outside the step
/// that loops over the branches, so that the width is written once, in `streams(..)`.
/// Left out where the module defines an item of that name.
fn group_widths(step: &Step) -> TokenStream {
    let consts = step.streams.iter().filter_map(|st| {
        let width = st.width?;
        let name = format!("{}_WIDTH", st.name.to_string().to_uppercase());
        if defines(step, &name) {
            return None;
        }
        let ident = Ident::new(&name, st.name.span());
        let width = Literal::usize_unsuffixed(width as usize);
        let doc = format!(
            "The width of the stream group `{}`: its branches, one stream each.",
            st.name
        );
        Some(quote!(#[doc = #doc] pub const #ident: usize = #width;))
    });
    quote!(#(#consts)*)
}

/// `Buffers` and `Config`, or empty stand-ins when the step declares none.
fn structs(step: &Step) -> TokenStream {
    let buffers = match &step.buffers {
        Some(b) => {
            let item = &b.item;
            quote!(#item)
        }
        None if defines(step, "Buffers") => quote!(),
        None => quote! {
            /// This step declares no buffers.
            #[derive(Debug, Default)]
            pub struct Buffers {}
        },
    };
    let config = match &step.config {
        Some(c) => {
            let item = &c.item;
            quote!(#item)
        }
        None if defines(step, "Config") => quote!(),
        None => quote! {
            /// This step declares no config values.
            #[derive(Debug, Default, Clone, Copy)]
            pub struct Config {}
        },
    };
    quote!(#buffers #config)
}

fn buffers_ident(step: &Step) -> Ident {
    step.buffers
        .as_ref()
        .map_or_else(|| format_ident!("Buffers"), |b| b.item.ident.clone())
}

fn config_ident(step: &Step) -> Ident {
    step.config
        .as_ref()
        .map_or_else(|| format_ident!("Config"), |c| c.item.ident.clone())
}

/// The kernels type the ops receive: the one `kernels = ..` names, or `()`.
fn kernels_ty(step: &Step) -> TokenStream {
    match &step.kernels {
        Some(k) => quote!(#k),
        None => quote!(()),
    }
}

/// The module's `Step` alias and its `Spec`, whose `StepSpec` impl holds `body` (the
/// associated items besides the types).
fn spec(step: &Step, scratch_ty: TokenStream, body: TokenStream) -> TokenStream {
    let rt = rt();
    let buffers_ty = buffers_ident(step);
    let config_ty = config_ident(step);
    let kernels_ty = kernels_ty(step);
    // A doc comment is a string, which `quote!` does not interpolate: the link is built
    // here, through the module's own path to the runtime, so that it resolves wherever
    // the runtime is re-exported from.
    let step_doc =
        format!(" This step, captured and replayed: see [`Step`]({rt}::Step) for its methods.");
    quote! {
        #[doc = #step_doc]
        pub type Step = #rt::Step<Spec>;

        /// What [`Step`] runs: this module's plan, buffers, config, kernels and ops.
        #[derive(Debug)]
        pub struct Spec;

        impl #rt::StepSpec for Spec {
            type Buffers = #buffers_ty;
            type Config = #config_ty;
            type Kernels = #kernels_ty;
            type Scratch = #scratch_ty;
            const PLAN: &'static #rt::PlanDesc = &PLAN;
            #body
        }
    }
}

/// One op instance's call: its buffers bound to locals, the op's grant entered (where its
/// `&mut` buffers lie, which the runtime holds its writes to), the function called with
/// each parameter bound, and the grant left (which fails if a buffer was swapped or
/// assigned). The call is spanned on the op, so that a type error in it (a wrong return
/// type, say) points at the op.
fn op_call(step: &Step, inst: &crate::validate::Instance) -> TokenStream {
    let rt = rt();
    let op = &step.ops[inst.op];
    let func = &op.name;
    let mut binds = Vec::new();
    let mut granted = Vec::new();
    let args: Vec<TokenStream> = inst
        .args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::Stream => quote!(__st),
            Arg::Blas => quote!(&__st.blas()),
            Arg::Kernels => quote!(__k),
            // Bound by its type, which rustc knows where the macro does not (an alias
            // declared outside the module). Spanned on the type, the path to the runtime
            // (`rt()`) included, so that a type that is none of the three is reported
            // there alone.
            Arg::Context(span) => {
                quote_spanned!(*span=> __sg::OpContext::pick(__st, &__st.blas(), __k))
            }
            Arg::Index(i) => Literal::u32_unsuffixed(*i).into_token_stream(),
            Arg::Config(f) => quote!(#rt::cfg(&__c.#f)),
            Arg::Buffer { field, write, slot } => {
                let local = format_ident!("__a{}", i);
                let bound = bind_buffer(step, field, *write, *slot, &local);
                binds.push(bound.bind);
                if *write {
                    let name = match slot {
                        Slot::Element(k) => format!("{field}[{k}]"),
                        _ => field.to_string(),
                    };
                    granted.push(if bound.view {
                        quote!(#rt::granted_view(#name, &#local))
                    } else {
                        quote!(#rt::granted(#name, &*#local))
                    });
                }
                bound.arg
            }
        })
        .collect();
    let span = op.item.sig.ident.span();
    let call = quote_spanned!(span=> #func(#(#args),*));
    // The block's value is the op's: a return type other than `Result<()>` is reported
    // at the op.
    let done = quote_spanned!(span=> __done);
    quote! {{
        #(#binds)*
        let __grant = #rt::Grant::enter(__st, ::std::vec![#(#granted),*]);
        let __done = #call;
        __grant.leave(::std::vec![#(#granted),*])?;
        #done
    }}
}

/// A buffer argument: the `let` that binds it to a local, and how the call passes it.
struct BoundBuffer {
    bind: TokenStream,
    arg: TokenStream,
    /// A declared view, made for the call (its parent is the buffer).
    view: bool,
}

/// Binds buffer `field` (copy `slot`) to `local`: the field itself, an element of a
/// per-branch array, a scratch copy, or a view of the parent of a `#[view]` field.
fn bind_buffer(step: &Step, field: &Ident, write: bool, slot: Slot, local: &Ident) -> BoundBuffer {
    let rt = rt();
    let buf = step.buffer_fields().find(|b| b.name == *field);
    let step_name = step.name.to_string();
    let is_shared = |name: &Ident| {
        step.buffer_fields()
            .any(|b| b.name == *name && b.across_steps.is_some())
    };
    if let Some(parent) = buf.and_then(|b| b.view_of.as_ref()) {
        // A declared view: the op gets a view of the parent over the field's span.
        let (span, what) = match slot {
            Slot::Element(i) => {
                let ix = Literal::usize_unsuffixed(i as usize);
                (
                    quote!(__b.#field[#ix]),
                    format!("view `{field}[{i}]` of `{parent}`"),
                )
            }
            _ => (quote!(__b.#field), format!("view `{field}` of `{parent}`")),
        };
        // A shared parent is held for the call, as a shared buffer is.
        let hold = format_ident!("{}_hold", local);
        let (held, parent_mut, parent_ref) = if is_shared(parent) {
            let held = if write {
                quote!(let mut #hold = #rt::shared_write(&__b.#parent, #step_name)?;)
            } else {
                quote!(let #hold = #rt::shared_read(&__b.#parent, #step_name)?;)
            };
            (held, quote!(&mut *#hold), quote!(&*#hold))
        } else {
            (quote!(), quote!(&mut __b.#parent), quote!(&__b.#parent))
        };
        return if write {
            BoundBuffer {
                bind: quote!(#held let mut #local = #rt::declared_view_mut(#parent_mut, #span, #what)?;),
                arg: quote!(&mut #local),
                view: true,
            }
        } else {
            BoundBuffer {
                bind: quote!(#held let #local = #rt::declared_view(#parent_ref, #span, #what)?;),
                arg: quote!(&#local),
                view: true,
            }
        };
    }
    let place = match slot {
        Slot::Field | Slot::Copy(0) => quote!(__b.#field),
        Slot::Element(i) => {
            let i = Literal::usize_unsuffixed(i as usize);
            quote!(__b.#field[#i])
        }
        Slot::Copy(c) => {
            let c = Literal::usize_unsuffixed(c - 1);
            quote!(__s.#field[#c])
        }
    };
    if is_shared(field) {
        // Held for the call: the op gets the value inside, and another step's capture on
        // another thread, or the host, cannot reach it meanwhile.
        let hold = format_ident!("{}_hold", local);
        return if write {
            BoundBuffer {
                bind: quote! {
                    let mut #hold = #rt::shared_write(&__b.#field, #step_name)?;
                    let #local = &mut *#hold;
                },
                arg: quote!(&mut *#local),
                view: false,
            }
        } else {
            BoundBuffer {
                bind: quote! {
                    let #hold = #rt::shared_read(&__b.#field, #step_name)?;
                    let #local = &*#hold;
                },
                arg: quote!(#local),
                view: false,
            }
        };
    }
    if write {
        BoundBuffer {
            bind: quote!(let #local = &mut #place;),
            arg: quote!(&mut *#local),
            view: false,
        }
    } else {
        BoundBuffer {
            bind: quote!(let #local = &#place;),
            arg: quote!(#local),
            view: false,
        }
    }
}

/// The full expansion of a valid step: the module's items, its `PLAN`, and the spec that
/// [`Step`](stepgraph::Step) runs. The step's methods live in the runtime, not here.
pub fn expand(
    step: &Step,
    resolved: &Resolved,
    plan: &Plan,
    whole: Option<(&Resolved, &Plan)>,
) -> TokenStream {
    let rt_use = rt_use(step);
    let vis = &step.vis;
    let name = &step.name;
    let attrs = &step.attrs;
    let other = &step.other;
    // An op's parameters are its access set: many of them is the design, not a smell.
    let op_fns = step
        .ops
        .iter()
        .map(|o| &o.item)
        .map(|f| quote!(#[allow(clippy::too_many_arguments)] #f));
    let structs = structs(step);
    let widths = group_widths(step);
    let summary = plan_summary(resolved, plan);
    let plan_const = plan_const(step, resolved, plan, &summary);
    let schedule_doc =
        format!(" The schedule, planned at compile time (`PLAN` has it in full):\n\n{summary}");
    let width_checks = width_checks(step, resolved);
    let type_checks = type_checks(step);
    let scratch = ScratchCopies::of(step, resolved);
    let scratch_fields = &scratch.fields;
    // Only the planned expansion names `AUTO_PLAN`: the stand-in of a step with mistakes
    // does not define it, and a user's item of that name is one of those mistakes.
    let rt = rt();
    let auto_plan = step.compare_auto.map(|_| {
        quote!(const AUTO_PLAN: ::core::option::Option<&'static #rt::PlanDesc> = ::core::option::Option::Some(&AUTO_PLAN);)
    });
    let body = spec_body(step, resolved, &scratch);
    let spec = spec(step, quote!(__Scratch), quote!(#auto_plan #body));
    let twin = whole.map(|(resolved, plan)| twin(step, resolved, plan));

    quote! {
        #(#attrs)*
        #[doc = ""]
        #[doc = #schedule_doc]
        #vis mod #name {
            #(#other)*
            #widths
            #structs
            #(#op_fns)*
            #rt_use
            #plan_const
            #(#width_checks)*
            #type_checks

            /// Scratch copies beyond the one in the buffers struct.
            #[doc(hidden)]
            pub struct __Scratch {
                #(#scratch_fields)*
            }

            #spec

            #twin
        }
    }
}

/// `compare(auto)`: `AUTO_PLAN`, the planner's placement of every op.
fn twin(step: &Step, resolved: &Resolved, plan: &Plan) -> TokenStream {
    let summary = plan_summary(resolved, plan);
    plan_const_named(step, resolved, plan, &summary, PlanNames::AUTO)
}

/// Per-branch arrays must have one element per member of their group.
fn width_checks(step: &Step, resolved: &Resolved) -> Vec<TokenStream> {
    step.buffer_fields()
        .enumerate()
        .filter_map(|(i, b)| {
            let w = resolved.branch_widths[i]?;
            let Type::Array(arr) = &b.ty else { return None };
            let len = &arr.len;
            let w = Literal::usize_unsuffixed(w as usize);
            let msg = format!(
                "#[per_branch] buffer `{}` must have one element per branch of its stream group ({w})",
                b.name
            );
            Some(quote_spanned!(b.name.span()=> const _: () = ::core::assert!((#len) == #w, #msg);))
        })
        .collect()
}

/// What the ops may receive: device memory the plan orders, and plain data. Each field's
/// type is checked where it is written, so that a host handle or a cell is reported at
/// the field.
fn type_checks(step: &Step) -> TokenStream {
    let rt = rt();
    let buffer_checks = step.buffer_fields().map(|b| {
        let ty = &b.ty;
        if b.view_of.is_some() {
            quote_spanned!(ty.span()=> #rt::assert_view::<#ty>();)
        } else if b.across_steps.is_some() {
            quote_spanned!(ty.span()=> #rt::assert_shared::<#ty>();)
        } else {
            quote_spanned!(ty.span()=> #rt::assert_buffer::<#ty>();)
        }
    });
    let config_checks = step.config.iter().flat_map(|c| &c.fields).map(|f| {
        let ty = &f.ty;
        quote_spanned!(ty.span()=> #rt::assert_config::<#ty>();)
    });
    quote!(const _: () = { #(#buffer_checks)* #(#config_checks)* };)
}

/// Where each declared view lies, for the step to order views that overlap. A step
/// without views keeps the trait's default (none).
fn views_fn(step: &Step) -> Option<TokenStream> {
    let rt = rt();
    let buffers_ty = buffers_ident(step);
    let views: Vec<TokenStream> = step
        .buffer_fields()
        .enumerate()
        .filter(|(_, b)| b.view_of.is_some())
        .map(|(i, b)| {
            let (i, name) = (lit_u16(i), &b.name);
            quote!((#rt::BufId(#i), #rt::ViewSpans::spans(&__b.#name)))
        })
        .collect();
    (!views.is_empty()).then(|| {
        quote! {
            fn views(__b: &#buffers_ty) -> ::std::vec::Vec<(#rt::BufId, &[#rt::Span])> {
                ::std::vec![#(#views),*]
            }
        }
    })
}

/// The `#[shared]` buffers, each with whether an op writes it (itself or a view of it),
/// for the step to order its launches with the other steps that use them. A step
/// without shared buffers keeps the trait's default (none).
fn shared_fn(step: &Step, resolved: &Resolved) -> Option<TokenStream> {
    let rt = rt();
    let buffers_ty = buffers_ident(step);
    let fields: Vec<&Buffer> = step.buffer_fields().collect();
    let written = |name: &Ident| {
        resolved
            .instances
            .iter()
            .flat_map(|i| &i.args)
            .any(|a| match a {
                Arg::Buffer {
                    field, write: true, ..
                } => {
                    field == name
                        || fields
                            .iter()
                            .any(|b| b.name == *field && b.view_of.as_ref() == Some(name))
                }
                _ => false,
            })
    };
    let uses: Vec<TokenStream> = fields
        .iter()
        .filter(|b| b.across_steps.is_some())
        .map(|b| {
            let name = &b.name;
            let text = name.to_string();
            let writes = written(name);
            quote!(#rt::shared_use(&__b.#name, #text, #writes))
        })
        .collect();
    (!uses.is_empty()).then(|| {
        quote! {
            fn shared(__b: &#buffers_ty) -> ::std::vec::Vec<#rt::SharedUse> {
                ::std::vec![#(#uses),*]
            }
        }
    })
}

/// Scratch copies beyond the one the user supplies in the buffers struct: the fields of
/// `__Scratch` and their initialisers.
struct ScratchCopies {
    fields: Vec<TokenStream>,
    init: Vec<TokenStream>,
}

impl ScratchCopies {
    fn of(step: &Step, resolved: &Resolved) -> ScratchCopies {
        let rt = rt();
        let scratch: Vec<(&Ident, &Type, usize)> = step
            .buffer_fields()
            .enumerate()
            .filter(|(i, _)| resolved.extra_copies[*i] > 0)
            .map(|(i, b)| (&b.name, &b.ty, resolved.extra_copies[i]))
            .collect();
        let fields = scratch
            .iter()
            .map(|(n, t, _)| quote!(#n: ::std::vec::Vec<#t>,))
            .collect();
        let init = scratch
            .iter()
            .map(|(n, _, count)| {
                let s = n.to_string();
                quote!(#n: #rt::scratch_copies(&buffers.#n, device, #s, #count)?,)
            })
            .collect();
        ScratchCopies { fields, init }
    }
}

/// The `StepSpec` items besides the types: the scratch copies, the views, and `issue`,
/// which issues every op instance in program order.
fn spec_body(step: &Step, resolved: &Resolved, scratch: &ScratchCopies) -> TokenStream {
    let rt = rt();
    let buffers_ty = buffers_ident(step);
    let config_ty = config_ident(step);
    let kernels_ty = kernels_ty(step);
    let scratch_init = &scratch.init;
    let views_fn = views_fn(step);
    let shared_fn = shared_fn(step, resolved);
    let issue_ops = resolved
        .instances
        .iter()
        .enumerate()
        .map(|(k, inst)| issue_op(step, k, inst));
    quote! {
        fn scratch(buffers: &#buffers_ty, device: &#rt::Device) -> #rt::Result<__Scratch> {
            ::core::result::Result::Ok(__Scratch { #(#scratch_init)* })
        }

        #views_fn

        #shared_fn

        #[allow(unused_variables, clippy::needless_borrow)]
        fn issue(
            __i: &#rt::Issue<'_>,
            __b: &mut #buffers_ty,
            __s: &mut __Scratch,
            __c: &#config_ty,
            __k: &#kernels_ty,
        ) -> #rt::Result<()> {
            #(#issue_ops)*
            ::core::result::Result::Ok(())
        }
    }
}

/// The issue of op instance `k`: always, under its `#[when]` flag, or every k-th replay.
fn issue_op(step: &Step, k: usize, inst: &crate::validate::Instance) -> TokenStream {
    let rt = rt();
    let id = lit_u32(k);
    let call = op_call(step, inst);
    let op = &step.ops[inst.op];
    match (&op.every, &op.when) {
        (None, None) => quote!(__i.op(#rt::OpId(#id), |__st| #call)?;),
        (_, Some(flag))
            if step
                .buffer_fields()
                .any(|b| b.name == *flag && b.across_steps.is_some()) =>
        {
            // A shared flag is held (read) while the node is added; the op's own reads of
            // it hold it again, which readers may.
            let step_name = step.name.to_string();
            let flag = quote_spanned!(flag.span()=> {
                let __flag = #rt::shared_read(&__b.#flag, #step_name)?;
                __i.op_when(#rt::OpId(#id), #rt::when_flag(&*__flag), |__st| #call)?;
            });
            quote!(#flag)
        }
        (_, Some(flag)) => {
            // Spanned on the flag, so that a field of another type is reported there.
            let flag = quote_spanned!(flag.span()=> #rt::when_flag(&__b.#flag));
            quote!(__i.op_when(#rt::OpId(#id), #flag, |__st| #call)?;)
        }
        (Some(every), None) => {
            // Spanned on the count, so that a field of another type is reported there.
            let count = match every {
                crate::model::Every::Field(f) => quote_spanned!(f.span()=> __c.#f),
                crate::model::Every::Count(n, _) => Literal::u32_unsuffixed(*n).into_token_stream(),
            };
            quote!(__i.op_every(#rt::OpId(#id), #count, |__st| #call)?;)
        }
    }
}

/// What a step with errors expands to besides the errors: its items, an empty plan, and
/// a spec with the same types, so that one mistake does not cascade into errors at every
/// use and the IDE keeps working. Building such a step fails on its empty plan.
pub fn stand_in(step: &Step) -> TokenStream {
    let rt = rt();
    let rt_use = rt_use(step);
    let vis = &step.vis;
    let name = &step.name;
    let attrs = &step.attrs;
    let other = &step.other;
    let mut seen = Vec::new();
    let op_fns = step
        .ops
        .iter()
        .filter(|o| {
            let n = o.name.to_string();
            let first = !seen.contains(&n);
            seen.push(n);
            first
        })
        .map(|o| &o.item);
    let structs = structs(step);
    let widths = group_widths(step);
    let buffers_ty = buffers_ident(step);
    let config_ty = config_ident(step);
    let kernels_ty = kernels_ty(step);
    let step_name = name.to_string();
    // An item named like the plan or the spec: leave both out, not to add a second error.
    let clash = ["Step", "Spec", "PLAN", "__sg"]
        .iter()
        .any(|n| defines(step, n));
    let rt_use = (!clash).then_some(rt_use);
    let spec = (!clash).then(|| {
        spec(
            step,
            quote!(()),
            quote! {
                fn scratch(_: &#buffers_ty, _: &#rt::Device) -> #rt::Result<()> {
                    ::core::result::Result::Ok(())
                }

                fn issue(
                    _: &#rt::Issue<'_>,
                    _: &mut #buffers_ty,
                    _: &mut (),
                    _: &#config_ty,
                    _: &#kernels_ty,
                ) -> #rt::Result<()> {
                    ::core::result::Result::Ok(())
                }
            },
        )
    });
    let plan = (!clash).then(|| {
        quote! {
            /// Stand-in: the step has errors.
            pub const PLAN: #rt::PlanDesc = #rt::PlanDesc::new(#step_name);
        }
    });
    quote! {
        #(#attrs)*
        #[allow(dead_code, unused)]
        #vis mod #name {
            #(#other)*
            #widths
            #structs
            #(#op_fns)*
            #rt_use
            #plan
            #spec
        }
    }
}
