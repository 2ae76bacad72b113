//! Code generation: the module with its `PLAN` constant and its `Step` type. The only
//! module that quotes. Generated code reaches the runtime only through
//! `::stepgraph::__rt_v1`.

use proc_macro2::{Literal, TokenStream};
use quote::{ToTokens, format_ident, quote};
use syn::{Ident, Type};

use crate::model::{BufKind, Priority, Step};
use crate::schedule::{Access, DepKind, Plan};
use crate::validate::{Arg, Resolved, Slot};

fn rt() -> TokenStream {
    quote!(::stepgraph::__rt_v1)
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

/// The `PLAN` constant.
fn plan_const(step: &Step, resolved: &Resolved, plan: &Plan) -> TokenStream {
    let rt = rt();
    let step_name = step.name.to_string();
    let streams = resolved.streams.iter().map(|s| {
        let name = &s.name;
        let priority = match step.streams[s.decl].priority {
            Priority::Low => quote!(Low),
            Priority::Normal => quote!(Normal),
            Priority::High => quote!(High),
        };
        quote!(#rt::StreamDesc { name: #name, priority: #rt::StreamPriority::#priority })
    });
    let buffers = step.buffers.iter().flat_map(|b| &b.fields).map(|b| {
        let name = b.name.to_string();
        let kind = match b.kind {
            BufKind::Shared => quote!(Shared),
            BufKind::PerBranch => quote!(PerBranch),
            BufKind::ScratchPerStream => quote!(ScratchPerStream),
            BufKind::ScratchPerBranch => quote!(ScratchPerBranch),
        };
        quote!(#rt::BufferDesc { name: #name, kind: #rt::BufKind::#kind })
    });
    let ops = resolved.instances.iter().enumerate().map(|(k, inst)| {
        let name = &inst.name;
        let func = step.ops[inst.op].name.to_string();
        let stream = lit_u16(inst.stream);
        let accesses = resolved.problem.ops[k].accesses.iter().map(|(r, a)| {
            let buf = lit_u16(r.buf);
            let copy = lit_u16(r.copy);
            let access = match a {
                Access::Read => quote!(Read),
                Access::Write => quote!(Write),
            };
            quote!(#rt::AccessDesc { buf: #rt::BufId(#buf), copy: #copy, access: #rt::Access::#access })
        });
        let waits = plan.waits[k].iter().map(|&e| {
            let e = lit_u16(e);
            quote!(#rt::EventId(#e))
        });
        let record = match plan.records[k] {
            Some(e) => {
                let e = lit_u16(e);
                quote!(::core::option::Option::Some(#rt::EventId(#e)))
            }
            None => quote!(::core::option::Option::None),
        };
        let cost = Literal::f64_suffixed(resolved.problem.ops[k].cost);
        quote! {
            #rt::OpDesc {
                name: #name,
                func: #func,
                stream: #rt::StreamId(#stream),
                accesses: &[#(#accesses),*],
                waits: &[#(#waits),*],
                record: #record,
                cost: #cost,
            }
        }
    });
    let edges = plan.deps.iter().map(|d| {
        let from = lit_u32(d.from);
        let to = lit_u32(d.to);
        let kind = match d.kind {
            DepKind::ReadAfterWrite => quote!(ReadAfterWrite),
            DepKind::WriteAfterRead => quote!(WriteAfterRead),
            DepKind::WriteAfterWrite => quote!(WriteAfterWrite),
            DepKind::Join => quote!(Join),
            DepKind::After => quote!(After),
        };
        let buf = match d.resource {
            Some(r) => {
                let b = lit_u16(r.buf);
                quote!(::core::option::Option::Some(#rt::BufId(#b)))
            }
            None => quote!(::core::option::Option::None),
        };
        quote!(#rt::EdgeDesc { from: #rt::OpId(#from), to: #rt::OpId(#to), kind: #rt::EdgeKind::#kind, buf: #buf })
    });
    let events = plan.events.iter().map(|e| {
        let stream = lit_u16(e.stream);
        let after = match e.after {
            Some(a) => {
                let a = lit_u32(a);
                quote!(::core::option::Option::Some(#rt::OpId(#a)))
            }
            None => quote!(::core::option::Option::None),
        };
        quote!(#rt::EventDesc { stream: #rt::StreamId(#stream), after: #after })
    });
    let final_waits = plan.final_waits.iter().map(|&e| {
        let e = lit_u16(e);
        quote!(#rt::EventId(#e))
    });
    let path = |p: &[usize]| {
        let ids = p.iter().map(|&o| {
            let o = lit_u32(o);
            quote!(#rt::OpId(#o))
        });
        quote!(&[#(#ids),*])
    };
    let critical = path(&plan.critical_path);
    let critical_cost = path(&plan.critical_path_by_cost);
    quote! {
        /// The schedule of this step, planned at compile time: ops in program order with
        /// their streams, buffer accesses, waits and records, the dependency edges, the
        /// events, the final joins and the critical path. `println!("{}", PLAN)` prints it.
        pub const PLAN: #rt::PlanDesc = #rt::PlanDesc {
            step: #step_name,
            streams: &[#(#streams),*],
            buffers: &[#(#buffers),*],
            ops: &[#(#ops),*],
            edges: &[#(#edges),*],
            events: &[#(#events),*],
            final_waits: &[#(#final_waits),*],
            critical_path: #critical,
            critical_path_by_cost: #critical_cost,
        };
    }
}

/// `Buffers` and `Config`, or empty stand-ins when the step declares none.
fn structs(step: &Step) -> TokenStream {
    let buffers = match &step.buffers {
        Some(b) => {
            let item = &b.item;
            quote!(#item)
        }
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

/// The public surface of `Step`, shared by the real expansion and the stand-in.
struct Surface {
    kernels_param: TokenStream,
    kernels_arg: TokenStream,
}

fn surface(step: &Step) -> Surface {
    match &step.kernels {
        Some(k) => Surface {
            kernels_param: quote!(kernels: ::std::sync::Arc<#k>,),
            kernels_arg: quote!(kernels,),
        },
        None => Surface {
            kernels_param: quote!(),
            kernels_arg: quote!(),
        },
    }
}

/// The full expansion of a valid step.
pub fn expand(step: &Step, resolved: &Resolved, plan: &Plan) -> TokenStream {
    let rt = rt();
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
    let plan_const = plan_const(step, resolved, plan);
    let buffers_ty = buffers_ident(step);
    let config_ty = config_ident(step);
    let Surface {
        kernels_param,
        kernels_arg,
    } = surface(step);
    let step_name = name.to_string();

    let fields: Vec<&crate::model::Buffer> = step.buffers.iter().flat_map(|b| &b.fields).collect();

    // Per-branch arrays must have one element per member of their group.
    let width_checks = fields.iter().enumerate().filter_map(|(i, b)| {
        // Only per-branch arrays get a width.
        let w = resolved.branch_widths[i]?;
        let Type::Array(arr) = &b.ty else { return None };
        let len = &arr.len;
        let w = Literal::usize_unsuffixed(w as usize);
        let msg = format!(
            "#[per_branch] buffer `{}` must have one element per branch of its stream group ({w})",
            b.name
        );
        Some(quote!(
            const _: () = ::core::assert!((#len) == #w, #msg);
        ))
    });

    // Scratch copies beyond the one the user supplies in the buffers struct.
    let scratch: Vec<(&Ident, &Type, usize)> = fields
        .iter()
        .enumerate()
        .filter(|(i, _)| resolved.extra_copies[*i] > 0)
        .map(|(i, b)| (&b.name, &b.ty, resolved.extra_copies[i]))
        .collect();
    let scratch_fields = scratch
        .iter()
        .map(|(n, t, _)| quote!(#n: ::std::vec::Vec<#t>,));
    let scratch_init = scratch.iter().map(|(n, _, count)| {
        let s = n.to_string();
        quote!(#n: #rt::scratch_copies(&buffers.#n, device, #s, #count)?,)
    });

    let (kernels_field, kernels_field_init, kernels_bind, kernels_pass, kernels_issue_param) =
        match &step.kernels {
            Some(k) => (
                quote!(kernels: ::std::sync::Arc<#k>,),
                quote!(kernels,),
                quote!(kernels,),
                quote!(kernels,),
                quote!(__kernels: &#k,),
            ),
            None => (quote!(), quote!(), quote!(), quote!(), quote!()),
        };

    let issue_ops = resolved.instances.iter().enumerate().map(|(k, inst)| {
        let func = &step.ops[inst.op].name;
        let id = lit_u32(k);
        let needs_blas = inst.args.iter().any(|a| matches!(a, Arg::Blas));
        let args = inst.args.iter().map(|a| match a {
            Arg::Stream => quote!(__stream),
            Arg::Blas => quote!(&__blas),
            Arg::Kernels => quote!(__kernels),
            Arg::Index(i) => {
                let i = Literal::u32_unsuffixed(*i);
                quote!(#i)
            }
            Arg::Config(f) => quote!(::core::clone::Clone::clone(&__config.#f)),
            Arg::Buffer { field, write, slot } => {
                let place = match slot {
                    Slot::Field | Slot::Copy(0) => quote!(__buffers.#field),
                    Slot::Element(i) => {
                        let i = Literal::usize_unsuffixed(*i as usize);
                        quote!(__buffers.#field[#i])
                    }
                    Slot::Copy(c) => {
                        let c = Literal::usize_unsuffixed(c - 1);
                        quote!(__scratch.#field[#c])
                    }
                };
                if *write {
                    quote!(&mut #place)
                } else {
                    quote!(&#place)
                }
            }
        });
        let blas = needs_blas.then(|| quote!(let __blas = __stream.blas();));
        quote! {
            __issue.op(#rt::OpId(#id), |__stream| {
                #blas
                #func(#(#args),*)
            })?;
        }
    });

    quote! {
        #(#attrs)*
        #vis mod #name {
            #(#other)*
            #structs
            #(#op_fns)*
            #plan_const
            #(#width_checks)*

            /// Scratch copies beyond the one in the buffers struct, one per extra stream
            /// or branch that uses the buffer.
            #[doc(hidden)]
            pub struct __Scratch {
                #(#scratch_fields)*
            }

            /// The captured step: owns its buffers, its streams, events and cuBLASLt
            /// workspaces, and the graph. The executor is the first field, so it is dropped
            /// (waiting for a replay in flight, destroying the graph) before any buffer.
            pub struct Step {
                exec: #rt::Executor,
                buffers: #buffers_ty,
                scratch: __Scratch,
                config: #config_ty,
                #kernels_field
            }

            impl ::core::fmt::Debug for Step {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.debug_struct(#step_name).field("exec", &self.exec).finish_non_exhaustive()
                }
            }

            impl Step {
                /// Builds the step with the planned multi-stream schedule and captures it.
                pub fn new(device: &#rt::Device, #kernels_param buffers: #buffers_ty, config: #config_ty) -> #rt::Result<Self> {
                    Self::with_schedule(device, #kernels_arg buffers, config, #rt::Schedule::Planned)
                }

                /// Builds the step with the given schedule (`OneStream` is the one-stream
                /// baseline) and captures it. Every stream, event, workspace and scratch
                /// copy is created here, before capture.
                pub fn with_schedule(device: &#rt::Device, #kernels_param buffers: #buffers_ty, config: #config_ty, schedule: #rt::Schedule) -> #rt::Result<Self> {
                    let exec = #rt::Executor::new(device, &PLAN, schedule)?;
                    let scratch = __Scratch { #(#scratch_init)* };
                    let mut step = Step { exec, buffers, scratch, config, #kernels_field_init };
                    step.capture()?;
                    ::core::result::Result::Ok(step)
                }

                /// The compile-time plan.
                pub const fn plan() -> &'static #rt::PlanDesc {
                    &PLAN
                }

                /// Launches one replay of the graph (capturing again first if buffers
                /// were rebound).
                pub fn replay(&mut self) -> #rt::Result<()> {
                    if self.exec.is_stale() {
                        self.capture()?;
                    }
                    self.exec.replay()
                }

                /// Runs the ops once without a graph, issued as they come (the eager
                /// baseline), on the same streams and events.
                pub fn run_eager(&mut self) -> #rt::Result<()> {
                    let Step { exec, buffers, scratch, config, #kernels_bind } = self;
                    exec.run_eager(&mut |__issue| Self::issue(__issue, buffers, scratch, config, #kernels_pass))
                }

                /// Waits for the last replay or eager run.
                pub fn wait(&self) -> #rt::Result<()> {
                    self.exec.wait()
                }

                /// Waits for the last replay and returns the proof that host values the
                /// graph reads (device scalars) may be written.
                pub fn host_access(&self) -> #rt::Result<#rt::HostAccess<'_>> {
                    self.exec.host_access()
                }

                /// The buffers. Reading them on the host needs [`Step::wait`] first.
                pub fn buffers(&self) -> &#buffers_ty {
                    &self.buffers
                }

                /// The config values.
                pub fn config(&self) -> &#config_ty {
                    &self.config
                }

                /// Waits for the last replay and copies `data` into the buffer `select`
                /// picks, in place: its address does not change, so the graph stays valid.
                pub fn upload<T: #rt::DeviceRepr>(&mut self, select: impl ::core::ops::FnOnce(&#buffers_ty) -> &#rt::DeviceBuffer<T>, data: &[T]) -> #rt::Result<()> {
                    self.exec.upload(select(&self.buffers), data)
                }

                /// Waits for the last replay and copies the buffer `select` picks to the host.
                pub fn download<T: #rt::DeviceRepr + ::core::clone::Clone + ::core::default::Default>(&self, select: impl ::core::ops::FnOnce(&#buffers_ty) -> &#rt::DeviceBuffer<T>) -> #rt::Result<::std::vec::Vec<T>> {
                    self.exec.download(select(&self.buffers))
                }

                /// The executor: streams, events, the graph.
                pub fn executor(&self) -> &#rt::Executor {
                    &self.exec
                }

                /// Waits for the last replay, lets `f` change the buffers (swap one for
                /// another of the same shape, say), and captures again: the executable graph
                /// is updated in place when the driver accepts it, instantiated anew otherwise.
                pub fn rebind<R>(&mut self, f: impl ::core::ops::FnOnce(&mut #buffers_ty) -> R) -> #rt::Result<R> {
                    self.exec.wait()?;
                    let out = f(&mut self.buffers);
                    self.exec.mark_stale();
                    self.capture()?;
                    ::core::result::Result::Ok(out)
                }

                /// Waits for the last replay, drops the graph, and returns the buffers and
                /// config.
                pub fn into_parts(self) -> #rt::Result<(#buffers_ty, #config_ty)> {
                    self.exec.wait()?;
                    let Step { exec, buffers, config, .. } = self;
                    ::core::mem::drop(exec);
                    ::core::result::Result::Ok((buffers, config))
                }

                /// Captures a second graph of the step with timing events around every op,
                /// replays it `replays` times and returns the median timeline: per-op
                /// durations, per-stream busy time, the measured critical path, the overlap.
                /// The normal graph is untouched.
                pub fn profile(&mut self, replays: usize) -> #rt::Result<#rt::Profile> {
                    let Step { exec, buffers, scratch, config, #kernels_bind } = self;
                    exec.profile(&mut |__issue| Self::issue(__issue, buffers, scratch, config, #kernels_pass), replays)
                }

                /// Captures the step once more and measures its work bound: every kernel
                /// timed alone, weighted by the share of the GPU its grid occupies. The
                /// kernels run many times on this step's buffers (in-place updates
                /// included): measure when the values no longer matter.
                pub fn work_bound(&mut self) -> #rt::Result<#rt::WorkBound> {
                    let Step { exec, buffers, scratch, config, #kernels_bind } = self;
                    exec.work_bound(&mut |__issue| Self::issue(__issue, buffers, scratch, config, #kernels_pass))
                }

                /// Captures the step again, reads the graph back from the driver and checks
                /// it against the plan: every dependency ordered, nothing independent
                /// ordered, each op's nodes what it issued. Debug builds do this at every
                /// capture.
                pub fn verify(&mut self) -> #rt::Result<#rt::VerifyReport> {
                    let Step { exec, buffers, scratch, config, #kernels_bind } = self;
                    exec.verify(&mut |__issue| Self::issue(__issue, buffers, scratch, config, #kernels_pass))
                }

                fn capture(&mut self) -> #rt::Result<()> {
                    let Step { exec, buffers, scratch, config, #kernels_bind } = self;
                    exec.capture(&mut |__issue| Self::issue(__issue, buffers, scratch, config, #kernels_pass))
                }

                #[allow(unused_variables, clippy::needless_borrow)]
                fn issue(
                    __issue: &#rt::Issue<'_>,
                    __buffers: &mut #buffers_ty,
                    __scratch: &mut __Scratch,
                    __config: &#config_ty,
                    #kernels_issue_param
                ) -> #rt::Result<()> {
                    #(#issue_ops)*
                    ::core::result::Result::Ok(())
                }
            }
        }
    }
}

/// What a step with errors expands to besides the errors: its items, and a `Step` with
/// the same signatures, so that one mistake does not cascade into errors at every use
/// and the IDE keeps working.
pub fn stand_in(step: &Step) -> TokenStream {
    let rt = rt();
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
    let buffers_ty = buffers_ident(step);
    let config_ty = config_ident(step);
    let Surface { kernels_param, .. } = surface(step);
    let msg = format!("stepgraph: step `{name}` did not compile");
    let step_name = name.to_string();
    quote! {
        #(#attrs)*
        #[allow(dead_code, unused)]
        #vis mod #name {
            #(#other)*
            #structs
            #(#op_fns)*

            /// Stand-in: the step has errors.
            pub const PLAN: #rt::PlanDesc = #rt::PlanDesc {
                step: #step_name, streams: &[], buffers: &[], ops: &[], edges: &[],
                events: &[], final_waits: &[], critical_path: &[], critical_path_by_cost: &[],
            };

            /// Stand-in: the step has errors.
            #[derive(Debug)]
            pub struct Step { _private: () }

            impl Step {
                pub fn new(device: &#rt::Device, #kernels_param buffers: #buffers_ty, config: #config_ty) -> #rt::Result<Self> { ::core::panic!(#msg) }
                pub fn with_schedule(device: &#rt::Device, #kernels_param buffers: #buffers_ty, config: #config_ty, schedule: #rt::Schedule) -> #rt::Result<Self> { ::core::panic!(#msg) }
                pub const fn plan() -> &'static #rt::PlanDesc { &PLAN }
                pub fn replay(&mut self) -> #rt::Result<()> { ::core::panic!(#msg) }
                pub fn run_eager(&mut self) -> #rt::Result<()> { ::core::panic!(#msg) }
                pub fn wait(&self) -> #rt::Result<()> { ::core::panic!(#msg) }
                pub fn host_access(&self) -> #rt::Result<#rt::HostAccess<'_>> { ::core::panic!(#msg) }
                pub fn buffers(&self) -> &#buffers_ty { ::core::panic!(#msg) }
                pub fn config(&self) -> &#config_ty { ::core::panic!(#msg) }
                pub fn upload<T: #rt::DeviceRepr>(&mut self, select: impl ::core::ops::FnOnce(&#buffers_ty) -> &#rt::DeviceBuffer<T>, data: &[T]) -> #rt::Result<()> { ::core::panic!(#msg) }
                pub fn download<T: #rt::DeviceRepr + ::core::clone::Clone + ::core::default::Default>(&self, select: impl ::core::ops::FnOnce(&#buffers_ty) -> &#rt::DeviceBuffer<T>) -> #rt::Result<::std::vec::Vec<T>> { ::core::panic!(#msg) }
                pub fn executor(&self) -> &#rt::Executor { ::core::panic!(#msg) }
                pub fn rebind<R>(&mut self, f: impl ::core::ops::FnOnce(&mut #buffers_ty) -> R) -> #rt::Result<R> { ::core::panic!(#msg) }
                pub fn into_parts(self) -> #rt::Result<(#buffers_ty, #config_ty)> { ::core::panic!(#msg) }
                pub fn profile(&mut self, replays: usize) -> #rt::Result<#rt::Profile> { ::core::panic!(#msg) }
                pub fn work_bound(&mut self) -> #rt::Result<#rt::WorkBound> { ::core::panic!(#msg) }
                pub fn verify(&mut self) -> #rt::Result<#rt::VerifyReport> { ::core::panic!(#msg) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_too_wide_for_its_literal_is_a_compile_error_not_a_wrap() {
        assert_eq!(lit_u16(65535).to_string(), "65535");
        assert_eq!(lit_u32(70000).to_string(), "70000");
        let wide = lit_u16(65536).to_string();
        assert!(
            wide.starts_with(":: core :: compile_error !")
                && wide.contains("index 65536 does not fit the plan's 16-bit indices"),
            "{wide}"
        );
    }
}
