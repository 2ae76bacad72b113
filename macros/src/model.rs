//! The internal model of a step definition. Every node keeps the syntax it came from, so
//! any error can point at the exact token.

use proc_macro2::Span;
use syn::{Ident, Item, ItemFn, ItemStruct, Path, Type, Visibility};

pub struct Step {
    pub vis: Visibility,
    pub name: Ident,
    pub attrs: Vec<syn::Attribute>,
    /// Declared streams, origin first.
    pub streams: Vec<StreamDecl>,
    pub kernels: Option<Path>,
    /// `crate = path`: the runtime crate's path, `::stepgraph` by default.
    pub krate: Option<Path>,
    /// `auto` in `streams(..)`: the planner places the ops without a `#[stream]`.
    pub auto: Option<AutoStreams>,
    /// `compare(auto)`: the module also holds the step placed wholly by the planner.
    pub compare_auto: Option<Span>,
    /// `costs = "file"`: the measured op costs the planner places by, from the folder of
    /// the step's source file.
    pub costs: Option<syn::LitStr>,
    /// That folder, where the compiler says it (not in this crate's unit tests).
    pub source_dir: Option<std::path::PathBuf>,
    pub buffers: Option<Struct<Buffer>>,
    pub config: Option<Struct<ConfigField>>,
    pub ops: Vec<Op>,
    /// Items of the module that are none of the above (uses, helper types, consts).
    pub other: Vec<Item>,
}

impl Step {
    /// The buffers' fields, in declaration order.
    pub fn buffer_fields(&self) -> impl Iterator<Item = &Buffer> {
        self.buffers.iter().flat_map(|b| &b.fields)
    }

    /// The config fields' names, in declaration order.
    pub fn config_names(&self) -> Vec<String> {
        self.config
            .iter()
            .flat_map(|c| &c.fields)
            .map(|f| f.name.to_string())
            .collect()
    }
}

/// `auto(N)` in `streams(..)`: the planner may add up to `most` streams of its own.
pub struct AutoStreams {
    pub most: usize,
    pub span: Span,
}

impl AutoStreams {
    /// The most streams plain `auto` lets the planner add: past a few streams, ops side
    /// by side only share the GPU's SMs.
    pub const DEFAULT: usize = 8;
}

/// `main`, `branch[4]` or `aux_attn(low)` in `streams(..)`.
pub struct StreamDecl {
    pub name: Ident,
    /// The group width for `name[N]`: one stream per index.
    pub width: Option<u32>,
    /// `(low)` or `(high)` after the name; normal when absent.
    pub priority: Priority,
}

/// A stream's scheduling priority: where streams compete for the GPU, the blocks of
/// higher-priority kernels are dispatched first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    Low,
    Normal,
    High,
}

pub struct Struct<F> {
    /// The struct with stepgraph's attributes removed.
    pub item: ItemStruct,
    pub fields: Vec<F>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufKind {
    Shared,
    PerBranch,
    ScratchPerStream,
    ScratchPerBranch,
}

pub struct Buffer {
    pub name: Ident,
    pub ty: Type,
    pub kind: BufKind,
    /// The attribute that set the kind, or the field name for shared buffers.
    pub kind_span: Span,
    /// `#[view(of = parent)]`: the field holds where a view lies in `parent` (a `Span`, or
    /// an array of them with `#[per_branch]`), and ops that name it get a view of `parent`.
    pub view_of: Option<Ident>,
    /// `#[shared]`: the field holds a `Shared<T>` that other steps use too, and ops get
    /// the `T` inside.
    pub across_steps: Option<Span>,
}

impl Buffer {
    pub fn is_scratch(&self) -> bool {
        matches!(
            self.kind,
            BufKind::ScratchPerStream | BufKind::ScratchPerBranch
        )
    }
}

pub struct ConfigField {
    pub name: Ident,
    pub ty: Type,
}

/// Where an op runs: `#[stream(name)]`, `#[stream(group[d])]` or `#[stream(group[2])]`.
pub struct Placement {
    pub stream: Ident,
    pub index: Option<IndexSpec>,
}

pub enum IndexSpec {
    /// Replicated over every index of the group; the ident names the index parameter.
    Each(Ident),
    /// One fixed member of the group.
    Fixed(u32, Span),
}

/// A stream named in `#[join(..)]`: a stream, a whole group, or one member.
pub struct StreamRef {
    pub name: Ident,
    pub index: Option<(u32, Span)>,
}

pub struct Op {
    pub name: Ident,
    /// `None`: the origin stream.
    pub placement: Option<Placement>,
    /// A `#[stream(..)]` that did not parse (and was reported): the op's stream is
    /// unknown, so no stream is reported unused for want of it.
    pub placement_unreadable: bool,
    pub joins: Vec<StreamRef>,
    pub after: Vec<Ident>,
    pub cost: Option<f64>,
    /// `#[every(k)]`: the op runs at every k-th replay only, as a conditional node.
    pub every: Option<Every>,
    /// `#[when(flag)]`: the op runs only when the device flag `flag` (a buffer) is set,
    /// as a conditional node; the op reads the flag.
    pub when: Option<Ident>,
    pub params: Vec<Param>,
    /// The function with stepgraph's attributes removed.
    pub item: ItemFn,
}

/// How often an `#[every(..)]` op runs: every `k`-th replay, `k` a config field or a count.
pub enum Every {
    /// A `u32` field of the config.
    Field(Ident),
    /// A literal count, at least 1.
    Count(u32, Span),
}

impl Every {
    pub fn span(&self) -> Span {
        match self {
            Every::Field(i) => i.span(),
            Every::Count(_, s) => *s,
        }
    }

    /// How the plan prints it: the field's name or the count.
    pub fn text(&self) -> String {
        match self {
            Every::Field(i) => i.to_string(),
            Every::Count(n, _) => n.to_string(),
        }
    }
}

impl Op {
    /// When the op runs: always, or under its `#[every]` or `#[when]`.
    pub fn condition(&self) -> Condition {
        match (&self.every, &self.when) {
            (_, Some(flag)) => Condition::When(flag.to_string()),
            (Some(every), None) => Condition::Every(every.text()),
            (None, None) => Condition::Always,
        }
    }
}

/// When an op runs. Two ops with equal conditions run at the same replays (an
/// `#[every(k)]` op counts the replays from the first; a `#[when]` op reads the flag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    Always,
    /// `#[every(k)]`: the field's name or the count.
    Every(String),
    /// `#[when(flag)]`: the flag's name.
    When(String),
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Condition::Always => write!(f, "at every replay"),
            Condition::Every(k) => write!(f, "#[every({k})]"),
            Condition::When(flag) => write!(f, "#[when({flag})]"),
        }
    }
}

pub struct Param {
    /// The parameter's name.
    pub name: Ident,
    /// What it binds: a buffer or config field name (the parameter's name, or the one
    /// given by `#[buf(..)]`).
    pub binding: Ident,
    /// Whether `#[buf(..)]` named the binding: the parameter is meant to be a buffer.
    pub named_by_buf: bool,
    pub kind: ParamKind,
    /// The parameter's type, as written.
    pub ty: Type,
    pub span: Span,
    /// `#[all_branches]`: an op on a stream group takes a `#[per_branch]` array whole,
    /// every branch's element, rather than its own branch's; the attribute, for errors.
    pub all_branches: Option<syn::Attribute>,
    /// `#[out]`: the op writes every element of this scratch buffer before it reads any,
    /// so it needs nothing from an earlier op; the attribute, for errors.
    pub out: Option<syn::Attribute>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// `&T`: reads the buffer.
    Read,
    /// `&mut T`: writes the buffer.
    Write,
    /// A plain value: a config field.
    Value,
    /// The replication index of an op on `group[d]` (the parameter named `d`).
    Index,
    /// `&CaptureStream`: the op's capture stream.
    Stream,
    /// `&Blas`: the stream's cuBLASLt handle and workspace.
    Blas,
    /// `&Kernels` (the type named by `kernels = ..`): the loaded kernels.
    Kernels,
    /// A `&T` that binds no buffer or config field and whose type is no device memory:
    /// the stream, its cuBLASLt handle or the kernels under a name the macro cannot see
    /// (an alias declared outside the module), which rustc picks by type.
    Context,
}
