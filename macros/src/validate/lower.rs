//! The resolved ops lowered to the planner's input: one node per op instance, in program
//! order, with the copies of buffers it reads and writes. No rule is checked here.

use std::collections::HashMap;
use std::ops::Range;

use super::{Arg, Instance, OpInfo, Scope, Slot, scratch};
use crate::model::{BufKind, Op, Param, ParamKind};
use crate::schedule::{Access, OpNode, Problem, Resource};

/// The op instances and the planner's nodes, one per instance.
pub struct Lowered {
    pub instances: Vec<Instance>,
    /// The planner's input: a node per instance.
    pub problem: Problem,
    /// Extra scratch copies to allocate, per buffer index.
    pub extra_copies: Vec<usize>,
    /// Per instance: its uses of scratch copies, for the first-write rules.
    pub uses: Vec<Vec<scratch::Use>>,
    /// Per stream: whether an instance runs on it (the origin always does).
    pub used: Vec<bool>,
}

/// What the ops resolved to, per op.
#[derive(Clone, Copy)]
pub struct Resolution<'r> {
    pub infos: &'r [OpInfo],
    /// The buffer index of each op's `#[when]` flag.
    pub flags: &'r [Option<usize>],
    /// The group width each `#[per_branch]` array has, per buffer index.
    pub branch_widths: &'r [Option<u32>],
    /// How many streams the ops run on.
    pub n_streams: usize,
    /// Per instance: orderings besides the op's own `#[after]`s (those its `#[join]`s
    /// meant, once the planner has placed the ops).
    pub after_instances: &'r [Vec<usize>],
}

/// The instances of `ops` in program order, each a node of the planner's problem.
pub fn lower(scope: &Scope, ops: &[&Op], resolution: Resolution) -> Lowered {
    let mut lowering = Lowering {
        scope,
        resolution,
        first_instance: vec![0; ops.len()],
        stream_slots: HashMap::new(),
        out: Lowered {
            instances: Vec::new(),
            problem: Problem {
                n_streams: resolution.n_streams,
                ops: Vec::new(),
                parents: scope.view_parent.clone(),
            },
            extra_copies: vec![0; scope.buffers.len()],
            uses: Vec::new(),
            used: vec![false; resolution.n_streams],
        },
    };
    lowering.out.used[0] = true;
    for (i, op) in ops.iter().enumerate() {
        lowering.first_instance[i] = lowering.out.instances.len();
        for &(stream, index) in &resolution.infos[i].instances {
            lowering.instance(i, op, stream, index);
        }
    }
    lowering.out
}

struct Lowering<'s, 'a, 'r> {
    scope: &'s Scope<'a>,
    resolution: Resolution<'r>,
    /// Per op: the index of its first instance.
    first_instance: Vec<usize>,
    /// Per-stream scratch: copy slot of each (buffer, stream), in order of first use.
    stream_slots: HashMap<(usize, usize), usize>,
    out: Lowered,
}

/// What one instance does to buffers.
#[derive(Default)]
struct Uses {
    accesses: Vec<(Resource, Access)>,
    scratch: Vec<scratch::Use>,
}

impl Lowering<'_, '_, '_> {
    /// Op `i`'s instance on `stream`, with its group index.
    fn instance(&mut self, i: usize, op: &Op, stream: usize, index: Option<u32>) {
        self.out.used[stream] = true;
        let mut args = Vec::new();
        let mut uses = Uses::default();
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
                    let Some(arg) = self.buffer_arg(p, stream, index, &mut uses) else {
                        continue;
                    };
                    arg
                }
            };
            args.push(arg);
        }
        // A `#[when]` op reads its flag (its conditional node does, before the work):
        // ordered after the op that set it, and before an op that writes it next.
        if let Some(bi) = self.resolution.flags[i] {
            let res = Resource { buf: bi, copy: 0 };
            if !uses.accesses.contains(&(res, Access::Read)) {
                uses.accesses.push((res, Access::Read));
            }
        }
        let name = match index {
            // An index comes only with a group placement.
            Some(k) => format!("{}[{k}]", op.name),
            _ => op.name.to_string(),
        };
        let info = &self.resolution.infos[i];
        let infos = self.resolution.infos;
        let k = self.out.instances.len();
        let after = info
            .after
            .iter()
            .flat_map(|&j| {
                self.first_instance[j]..self.first_instance[j] + infos[j].instances.len()
            })
            .chain(
                self.resolution
                    .after_instances
                    .get(k)
                    .into_iter()
                    .flatten()
                    .copied(),
            )
            .collect();
        self.out.problem.ops.push(OpNode {
            stream,
            accesses: uses.accesses,
            joins: info
                .joins
                .iter()
                .map(|&(s, _, _)| s)
                .filter(|&s| s != stream)
                .collect(),
            after,
            cost: op.cost.unwrap_or(1.0),
        });
        self.out.instances.push(Instance {
            op: i,
            name,
            stream,
            args,
        });
        self.out.uses.push(uses.scratch);
    }

    /// The argument a `&` or `&mut` parameter passes, with the copies it reads or writes
    /// added to `uses`; `None` where the parameter names no buffer.
    fn buffer_arg(
        &mut self,
        p: &Param,
        stream: usize,
        index: Option<u32>,
        uses: &mut Uses,
    ) -> Option<Arg> {
        let bi = *self.scope.buf_ix.get(&p.binding.to_string())?;
        let write = p.kind == ParamKind::Write;
        let access = if write { Access::Write } else { Access::Read };
        let slot = self.slot(bi, p, stream, index);
        for copy in self.copies(bi, slot) {
            let res = Resource { buf: bi, copy };
            // One buffer read through two `&` parameters is one read.
            if !uses.accesses.contains(&(res, access)) {
                uses.accesses.push((res, access));
            }
            if self.scope.buffers[bi].is_scratch() {
                uses.scratch.push(scratch::Use::new(res, p));
            }
        }
        Some(Arg::Buffer {
            field: p.binding.clone(),
            write,
            slot,
        })
    }

    /// Which copy of buffer `bi` parameter `p` passes on `stream`.
    fn slot(&mut self, bi: usize, p: &Param, stream: usize, index: Option<u32>) -> Slot {
        match self.scope.buffers[bi].kind {
            BufKind::Shared => Slot::Field,
            BufKind::PerBranch => match index {
                Some(k) if p.all_branches.is_none() => Slot::Element(k),
                _ => Slot::Field,
            },
            BufKind::ScratchPerBranch => Slot::Copy(index.unwrap_or(0) as usize),
            BufKind::ScratchPerStream => {
                let next = self
                    .stream_slots
                    .iter()
                    .filter(|((b, _), _)| *b == bi)
                    .count();
                Slot::Copy(*self.stream_slots.entry((bi, stream)).or_insert(next))
            }
        }
    }

    /// The copies of buffer `bi` a slot reaches; a scratch copy past the field is
    /// counted for allocation.
    fn copies(&mut self, bi: usize, slot: Slot) -> Range<usize> {
        match slot {
            // The whole array: every element.
            Slot::Field if self.scope.buffers[bi].kind == BufKind::PerBranch => {
                0..self.resolution.branch_widths[bi].unwrap_or(1) as usize
            }
            Slot::Field => 0..1,
            Slot::Element(k) => k as usize..k as usize + 1,
            Slot::Copy(k) => {
                self.out.extra_copies[bi] = self.out.extra_copies[bi].max(k);
                k..k + 1
            }
        }
    }
}
