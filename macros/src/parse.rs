//! Syntax to model: the `#[step(..)]` arguments and the attributes inside the module,
//! parsed into typed settings. Problems are reported to the collector and parsing goes
//! on, so that one build shows every mistake.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, FnArg, Ident, Item, ItemFn, ItemMod, ItemStruct, LitFloat, LitInt, LitStr, Pat,
    Path, Token, Type, bracketed, parenthesized,
};

use crate::errors::Errors;
use crate::model::{
    AutoStreams, BufKind, Buffer, ConfigField, Every, IndexSpec, Op, Param, ParamKind, Placement,
    Priority, Step, StreamDecl, StreamRef, Struct,
};

/// The widest stream group `streams(.., name[N])` may declare.
const MAX_GROUP_WIDTH: u32 = 1024;

/// The most streams `auto(N)` may give the planner.
const MAX_AUTO_STREAMS: usize = 64;

/// `#[step(streams(main, aux, branch[4]), kernels = path::Kernels, crate = path)]`
pub struct StepArgs {
    pub streams: Vec<StreamDecl>,
    pub streams_span: Option<Span>,
    pub kernels: Option<Path>,
    /// `crate = path`: where the runtime is, for crates that re-export stepgraph.
    pub krate: Option<Path>,
    /// `auto` or `auto(N)` in `streams(..)`: the planner places the ops without a
    /// `#[stream]`, on streams of its own.
    pub auto: Option<AutoStreams>,
    /// `compare(auto)`: the module also holds the step placed wholly by the planner.
    pub compare_auto: Option<Span>,
    /// `costs = "file"`: the measured op costs the planner places by.
    pub costs: Option<LitStr>,
    /// The arguments did not parse (and that error is reported): missing streams are a
    /// consequence, not a second mistake.
    pub unreadable: bool,
}

impl Parse for StepArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = StepArgs {
            streams: Vec::new(),
            streams_span: None,
            kernels: None,
            krate: None,
            auto: None,
            compare_auto: None,
            costs: None,
            unreadable: false,
        };
        while !input.is_empty() {
            if input.peek(Token![crate]) {
                args.parse_crate(input)?;
            } else {
                let key: Ident = input.parse()?;
                match key.to_string().as_str() {
                    "streams" => args.parse_streams(&key, input)?,
                    "kernels" => args.parse_kernels(&key, input)?,
                    "compare" => args.parse_compare(&key, input)?,
                    "costs" => args.parse_costs(&key, input)?,
                    other => {
                        return Err(syn::Error::new(
                            key.span(),
                            format!(
                                "unknown step argument `{other}`: expected `streams(..)`, `kernels = Type`, `compare(auto)`, `costs = \"file\"` or `crate = path`"
                            ),
                        ));
                    }
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

impl StepArgs {
    /// `crate = path`.
    fn parse_crate(&mut self, input: ParseStream) -> syn::Result<()> {
        let key: Token![crate] = input.parse()?;
        input.parse::<Token![=]>()?;
        if self.krate.is_some() {
            return Err(syn::Error::new(
                key.span,
                "`crate = ..` is given twice: give the runtime's path once",
            ));
        }
        self.krate = Some(input.parse()?);
        Ok(())
    }

    /// `streams(main, aux(low), branch[4])`, after the key.
    fn parse_streams(&mut self, key: &Ident, input: ParseStream) -> syn::Result<()> {
        let content;
        parenthesized!(content in input);
        // A second list would silently add streams to the first.
        if self.streams_span.is_some() {
            return Err(syn::Error::new(
                key.span(),
                "`streams(..)` is given twice: list every stream, origin first, in one `streams(..)`",
            ));
        }
        self.streams_span = Some(key.span());
        while !content.is_empty() {
            if content.peek(Ident) && content.fork().parse::<Ident>()? == "auto" {
                self.parse_auto(&content)?;
            } else {
                self.streams.push(parse_stream_decl(&content)?);
            }
            if content.is_empty() {
                break;
            }
            content.parse::<Token![,]>()?;
        }
        Ok(())
    }

    /// `auto` or `auto(N)` in `streams(..)`: after the origin, once, with N from 1 to
    /// [`MAX_AUTO_STREAMS`].
    fn parse_auto(&mut self, content: ParseStream) -> syn::Result<()> {
        let word: Ident = content.parse()?;
        if self.streams.is_empty() {
            return Err(syn::Error::new(
                word.span(),
                "the first stream is the origin, where capture begins and ends: name it first, then `auto` (`streams(main, auto)`)",
            ));
        }
        if self.auto.is_some() {
            return Err(syn::Error::new(
                word.span(),
                "`auto` is given twice: give the planner's streams once, as `auto` or `auto(N)`",
            ));
        }
        let mut most = AutoStreams::DEFAULT;
        if content.peek(syn::token::Bracket) {
            return Err(syn::Error::new(
                word.span(),
                "`auto` is the planner's streams, not a group: write `auto(N)` for at most N of them",
            ));
        }
        if content.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in content);
            if inner.peek(Ident) {
                let word: Ident = inner.parse()?;
                return Err(syn::Error::new(
                    word.span(),
                    format!(
                        "`auto({word})`: the planner chooses its streams' priorities; `auto(N)` takes the most streams it may add, a count from 1"
                    ),
                ));
            }
            let lit: LitInt = inner.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    "`auto(N)` takes the most streams the planner may add, a count from 1",
                )
            })?;
            let n: u64 = lit.base10_parse()?;
            if n == 0 || n > MAX_AUTO_STREAMS as u64 {
                return Err(syn::Error::new(
                    lit.span(),
                    format!(
                        "`auto({n})`: expected from 1 to {MAX_AUTO_STREAMS} streams for the planner"
                    ),
                ));
            }
            most = n as usize;
        }
        self.auto = Some(AutoStreams {
            most,
            span: word.span(),
        });
        Ok(())
    }

    /// `compare(auto)`, after the key.
    fn parse_compare(&mut self, key: &Ident, input: ParseStream) -> syn::Result<()> {
        let content;
        parenthesized!(content in input);
        let what: Ident = content.parse()?;
        if what != "auto" || !content.is_empty() {
            return Err(syn::Error::new(
                what.span(),
                "expected `compare(auto)`: the step placed wholly by the planner, beside this one",
            ));
        }
        if self.compare_auto.is_some() {
            return Err(syn::Error::new(
                key.span(),
                "`compare(auto)` is given twice",
            ));
        }
        self.compare_auto = Some(key.span());
        Ok(())
    }

    /// `costs = "file"`, after the key.
    fn parse_costs(&mut self, key: &Ident, input: ParseStream) -> syn::Result<()> {
        input.parse::<Token![=]>()?;
        if self.costs.is_some() {
            return Err(syn::Error::new(
                key.span(),
                "`costs = ..` is given twice: a step has one costs file",
            ));
        }
        let path: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "expected `costs = \"file\"`, the path of the step's costs file from the folder of this source file",
            )
        })?;
        self.costs = Some(path);
        Ok(())
    }

    /// `kernels = path::Kernels`, after the key.
    fn parse_kernels(&mut self, key: &Ident, input: ParseStream) -> syn::Result<()> {
        input.parse::<Token![=]>()?;
        if self.kernels.is_some() {
            return Err(syn::Error::new(
                key.span(),
                "`kernels = ..` is given twice: a step has one kernels type (a struct of several registries if it needs more)",
            ));
        }
        self.kernels = Some(input.parse()?);
        Ok(())
    }
}

/// `main`, `branch[4]` or `aux(low)`: one entry of `streams(..)`.
fn parse_stream_decl(content: ParseStream) -> syn::Result<StreamDecl> {
    let name: Ident = content.parse()?;
    let width = if content.peek(syn::token::Bracket) {
        Some(parse_group_width(content)?)
    } else {
        None
    };
    let priority = if content.peek(syn::token::Paren) {
        parse_priority(content)?
    } else {
        Priority::Normal
    };
    Ok(StreamDecl {
        name,
        width,
        priority,
    })
}

/// The `[N]` of a stream group: at least one stream, at most `MAX_GROUP_WIDTH`.
fn parse_group_width(content: ParseStream) -> syn::Result<u32> {
    let inner;
    bracketed!(inner in content);
    let lit: LitInt = inner.parse()?;
    // Read wide, so that any width too large gets the message below.
    let n: u64 = lit.base10_parse()?;
    if n == 0 {
        return Err(syn::Error::new(
            lit.span(),
            "a stream group needs at least one stream: write `name[N]` with N >= 1",
        ));
    }
    // Each stream is created, joined and given a cuBLASLt workspace; the macro also lays
    // out one entry per stream, so a typo such as `b[4000000000]` would exhaust the
    // compiler's memory.
    if n > MAX_GROUP_WIDTH as u64 {
        return Err(syn::Error::new(
            lit.span(),
            format!("a stream group of {n} streams: expected at most {MAX_GROUP_WIDTH}"),
        ));
    }
    Ok(n as u32)
}

/// The `(low)`, `(normal)` or `(high)` after a stream's name.
fn parse_priority(content: ParseStream) -> syn::Result<Priority> {
    let inner;
    parenthesized!(inner in content);
    let word: Ident = inner.parse()?;
    match word.to_string().as_str() {
        "low" => Ok(Priority::Low),
        "normal" => Ok(Priority::Normal),
        "high" => Ok(Priority::High),
        other => Err(syn::Error::new(
            word.span(),
            format!("unknown stream priority `{other}`: expected `low`, `normal` or `high`"),
        )),
    }
}

/// `name`, `name[d]` or `name[2]` inside `#[stream(..)]` / `#[join(..)]`.
struct StreamSyntax {
    name: Ident,
    index: Option<IndexSyntax>,
}

enum IndexSyntax {
    Var(Ident),
    Lit(u32, Span),
}

impl Parse for StreamSyntax {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        let index = if input.peek(syn::token::Bracket) {
            let inner;
            bracketed!(inner in input);
            if inner.peek(LitInt) {
                let lit: LitInt = inner.parse()?;
                Some(IndexSyntax::Lit(lit.base10_parse()?, lit.span()))
            } else {
                Some(IndexSyntax::Var(inner.parse()?))
            }
        } else {
            None
        };
        Ok(StreamSyntax { name, index })
    }
}

fn is(attr: &Attribute, name: &str) -> bool {
    attr.path().is_ident(name)
}

/// The first `#[name]` of `attrs`, a marker that takes no arguments (`#[op]`, `#[out]`,
/// `#[per_branch]`, `#[buffers]`, ..). Arguments and repeats are reported: the macro
/// would ignore them, and an ignored argument reads like a setting the step obeys.
fn marker<'a>(attrs: &'a [Attribute], name: &str, errors: &Errors) -> Option<&'a Attribute> {
    let mut found = attrs.iter().filter(|a| is(a, name));
    let first = found.next()?;
    for attr in std::iter::once(first).chain(found.clone()) {
        match &attr.meta {
            syn::Meta::Path(_) => {}
            syn::Meta::List(l) => errors.at(
                l.delimiter.span().join(),
                format!("#[{name}] takes no arguments: write #[{name}]"),
            ),
            syn::Meta::NameValue(nv) => errors.spanned(
                &nv.value,
                format!("#[{name}] takes no value: write #[{name}]"),
            ),
        }
    }
    for again in found {
        errors.spanned(
            again,
            format!("#[{name}] is given twice: remove the second"),
        );
    }
    Some(first)
}

/// Parses the module into the model. `None` only when the item is not an inline module.
pub fn parse(args: StepArgs, module: ItemMod, errors: &Errors) -> Option<Step> {
    let Some((_, items)) = module.content else {
        errors.spanned(
            &module.ident,
            "#[step] needs the step written inline: `mod name { .. }`",
        );
        return None;
    };
    if args.streams.is_empty() && !args.unreadable {
        errors.at(
            args.streams_span.unwrap_or_else(|| module.ident.span()),
            "declare the step's streams, origin first: #[step(streams(main, ..))]",
        );
    }
    let mut step = Step {
        vis: module.vis,
        name: module.ident,
        attrs: module.attrs,
        streams: args.streams,
        kernels: args.kernels,
        krate: args.krate,
        auto: args.auto,
        compare_auto: args.compare_auto,
        costs: args.costs,
        source_dir: None,
        buffers: None,
        config: None,
        ops: Vec::new(),
        other: Vec::new(),
    };
    let names = SpecialNames::of(&items);
    for item in items {
        match item {
            Item::Struct(s) if marker(&s.attrs, "buffers", errors).is_some() => {
                if step.buffers.is_some() {
                    errors.spanned(
                        &s.ident,
                        "a step has one #[buffers] struct; this is a second",
                    );
                    continue;
                }
                step.buffers = Some(parse_buffers(s, errors));
            }
            Item::Struct(s) if marker(&s.attrs, "config", errors).is_some() => {
                if step.config.is_some() {
                    errors.spanned(
                        &s.ident,
                        "a step has one #[config] struct; this is a second",
                    );
                    continue;
                }
                step.config = Some(parse_config(s, errors));
            }
            Item::Fn(f) if is_op(&f, &names) => {
                if let Some(op) = parse_op(f, &step, &names, errors) {
                    step.ops.push(op);
                }
            }
            other => step.other.push(other),
        }
    }
    bind_by_type(&mut step);
    Some(step)
}

fn named_fields<'a>(s: &'a ItemStruct, what: &str, errors: &Errors) -> Vec<&'a syn::Field> {
    match &s.fields {
        syn::Fields::Named(f) => f.named.iter().collect(),
        _ => {
            errors.spanned(&s.ident, format!("the {what} struct needs named fields"));
            Vec::new()
        }
    }
}

fn parse_buffers(mut s: ItemStruct, errors: &Errors) -> Struct<Buffer> {
    s.attrs.retain(|a| !is(a, "buffers"));
    let mut fields = Vec::new();
    for field in named_fields(&s, "#[buffers]", errors) {
        let Some(name) = field.ident.clone() else {
            continue;
        };
        let mut kind = BufKind::Shared;
        let mut kind_span = name.span();
        let mut view_of: Option<Ident> = None;
        let across_steps = marker(&field.attrs, "shared", errors).map(|a| a.span());
        for attr in &field.attrs {
            if is(attr, "shared") {
                continue;
            }
            if is(attr, "view") {
                match parse_view(attr) {
                    Ok(parent) if view_of.is_some() => errors.spanned(
                        &parent,
                        format!("buffer `{name}` already has a #[view(of = ..)]"),
                    ),
                    Ok(parent) => view_of = Some(parent),
                    Err(e) => errors.push(e),
                }
                continue;
            }
            let new_kind = sharing_kind(attr, errors);
            if let Some(k) = new_kind {
                if kind != BufKind::Shared {
                    errors.spanned(
                        attr,
                        format!("buffer `{name}` already has a sharing attribute"),
                    );
                }
                kind = k;
                kind_span = attr.span();
            }
        }
        fields.push(Buffer {
            name,
            ty: field.ty.clone(),
            kind,
            kind_span,
            view_of,
            across_steps,
        });
    }
    if let syn::Fields::Named(f) = &mut s.fields {
        for field in f.named.iter_mut() {
            field.attrs.retain(|a| {
                !is(a, "per_branch") && !is(a, "scratch") && !is(a, "view") && !is(a, "shared")
            });
        }
    }
    Struct { item: s, fields }
}

/// The sharing a buffer attribute sets: `#[per_branch]`, `#[scratch(..)]`, or none for
/// another attribute.
fn sharing_kind(attr: &Attribute, errors: &Errors) -> Option<BufKind> {
    if is(attr, "per_branch") {
        marker(std::slice::from_ref(attr), "per_branch", errors);
        Some(BufKind::PerBranch)
    } else if is(attr, "scratch") {
        match attr.parse_args::<Ident>() {
            Ok(k) if k == "per_stream" => Some(BufKind::ScratchPerStream),
            Ok(k) if k == "per_branch" => Some(BufKind::ScratchPerBranch),
            // Scratch all the same, of either kind: the rules for scratch then
            // apply, not those for a shared buffer, whose errors would only
            // follow from this one.
            Ok(k) => {
                errors.spanned(
                    &k,
                    format!("unknown scratch kind `{k}`: expected `per_stream` or `per_branch`"),
                );
                Some(BufKind::ScratchPerStream)
            }
            Err(_) => {
                errors.spanned(
                    attr,
                    "write #[scratch(per_stream)] or #[scratch(per_branch)]",
                );
                Some(BufKind::ScratchPerStream)
            }
        }
    } else {
        None
    }
}

/// `#[view(of = parent)]`: the parent buffer's name.
fn parse_view(attr: &syn::Attribute) -> syn::Result<Ident> {
    let wrong = || {
        syn::Error::new_spanned(
            attr,
            "write #[view(of = buffer)], naming the buffer the view lies in",
        )
    };
    let syn::Meta::List(list) = &attr.meta else {
        return Err(wrong());
    };
    let nv: syn::MetaNameValue = syn::parse2(list.tokens.clone()).map_err(|_| wrong())?;
    if !nv.path.is_ident("of") {
        return Err(syn::Error::new_spanned(
            &nv.path,
            "unknown #[view] argument: expected `of = buffer`",
        ));
    }
    match nv.value {
        syn::Expr::Path(p) if p.qself.is_none() => p.path.get_ident().cloned().ok_or_else(|| {
            syn::Error::new_spanned(&p, "expected the name of a buffer of this step")
        }),
        other => Err(syn::Error::new_spanned(
            other,
            "expected the name of a buffer of this step",
        )),
    }
}

fn parse_config(mut s: ItemStruct, errors: &Errors) -> Struct<ConfigField> {
    s.attrs.retain(|a| !is(a, "config"));
    let fields = named_fields(&s, "#[config]", errors)
        .into_iter()
        .filter_map(|f| {
            Some(ConfigField {
                name: f.ident.clone()?,
                ty: f.ty.clone(),
            })
        })
        .collect();
    Struct { item: s, fields }
}

/// The last path segment of `T` in `&T`, `&T<'_>` and `&path::T`.
fn last_segment(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| &s.ident),
        Type::Group(g) => last_segment(&g.elem),
        Type::Paren(p) => last_segment(&p.elem),
        _ => None,
    }
}

/// The names under which the module's items refer to the capture stream and the cuBLASLt
/// handle: `CaptureStream` and `Blas`, and the names a `use .. as ..` of the module gives
/// them. (Aliases made outside the module cannot be seen by the macro.)
pub struct SpecialNames {
    stream: Vec<String>,
    blas: Vec<String>,
}

impl SpecialNames {
    fn of(items: &[Item]) -> SpecialNames {
        let mut names = SpecialNames {
            stream: vec!["CaptureStream".into()],
            blas: vec!["Blas".into()],
        };
        for item in items {
            if let Item::Use(u) = item {
                names.collect(&u.tree);
            }
        }
        names
    }

    fn collect(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => self.collect(&p.tree),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.collect(t)),
            syn::UseTree::Rename(r) if r.ident == "CaptureStream" => {
                self.stream.push(r.rename.to_string())
            }
            syn::UseTree::Rename(r) if r.ident == "Blas" => self.blas.push(r.rename.to_string()),
            _ => {}
        }
    }

    fn kind(&self, name: &str) -> Option<ParamKind> {
        if self.stream.iter().any(|n| n == name) {
            Some(ParamKind::Stream)
        } else if self.blas.iter().any(|n| n == name) {
            Some(ParamKind::Blas)
        } else {
            None
        }
    }
}

/// The attributes that make a `fn` an op and that parsing removes from it.
const OP_ATTRS: [&str; 7] = ["op", "stream", "join", "after", "cost", "every", "when"];

/// The attributes of an op's parameters, which parsing removes from them.
const PARAM_ATTRS: [&str; 3] = ["buf", "all_branches", "out"];

/// The types an op's buffer parameters have, by their last path segment: device memory,
/// which a `&T` parameter binds by name. (Arrays and slices are device memory too.)
const DEVICE_MEMORY: [&str; 9] = [
    "DeviceBuffer",
    "View",
    "ViewMut",
    "DeviceScalars",
    "DeviceFlag",
    "Communicator",
    "CudaSlice",
    "HostInput",
    "HostOutput",
];

/// Whether `ty` (the `T` of a `&T` parameter) is recognisably device memory.
pub fn is_device_memory(ty: &Type) -> bool {
    match ty {
        Type::Array(_) | Type::Slice(_) => true,
        Type::Group(g) => is_device_memory(&g.elem),
        Type::Paren(p) => is_device_memory(&p.elem),
        _ => last_segment(ty).is_some_and(|s| DEVICE_MEMORY.iter().any(|d| s == d)),
    }
}

/// Which `fn`s of the module are ops: those that take the capture stream or its cuBLASLt
/// handle (there is no other way to put work into the step), and those that carry an op
/// attribute (`#[op]` alone marks one whose stream type is an alias the macro cannot
/// see). Every other `fn` is a helper the ops may call, kept as it is.
fn is_op(f: &ItemFn, names: &SpecialNames) -> bool {
    let attributed = f.attrs.iter().any(|a| OP_ATTRS.iter().any(|n| is(a, n)));
    attributed
        || f.sig.inputs.iter().any(|input| match input {
            FnArg::Typed(pt) => match &*pt.ty {
                Type::Reference(r) => {
                    last_segment(&r.elem).is_some_and(|s| names.kind(&s.to_string()).is_some())
                }
                _ => false,
            },
            FnArg::Receiver(_) => false,
        })
}

fn parse_op(mut f: ItemFn, step: &Step, names: &SpecialNames, errors: &Errors) -> Option<Op> {
    // `#[op]` only marks the op (`is_op`); its arguments are mistakes.
    marker(&f.attrs, "op", errors);
    let attrs = OpAttrs::parse(&f.attrs, errors);
    f.attrs.retain(|a| !OP_ATTRS.iter().any(|n| is(a, n)));
    let index_var = match &attrs.placement {
        Some(Placement {
            index: Some(IndexSpec::Each(v)),
            ..
        }) => Some(v.clone()),
        _ => None,
    };
    let kernels_name = step
        .kernels
        .as_ref()
        .and_then(|p| p.segments.last())
        .map(|s| s.ident.to_string());
    let context = ParamContext {
        names,
        kernels_name: kernels_name.as_deref(),
        index_var: index_var.as_ref(),
    };
    let mut params = Vec::new();
    for input in f.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = input else {
            errors.spanned(&*input, "an op is a free function: it takes no `self`");
            continue;
        };
        params.extend(parse_param(pt, &context, errors));
    }
    Some(Op {
        name: f.sig.ident.clone(),
        placement: attrs.placement,
        placement_unreadable: attrs.placement_unreadable,
        joins: attrs.joins,
        after: attrs.after,
        cost: attrs.cost,
        every: attrs.every,
        when: attrs.when,
        params,
        item: f,
    })
}

/// An op's attributes (`OP_ATTRS`), each read into its setting; a repeat is reported,
/// never silently kept or replaced.
#[derive(Default)]
struct OpAttrs {
    placement: Option<Placement>,
    placement_unreadable: bool,
    joins: Vec<StreamRef>,
    after: Vec<Ident>,
    cost: Option<f64>,
    every: Option<Every>,
    when: Option<Ident>,
}

impl OpAttrs {
    fn parse(attrs: &[Attribute], errors: &Errors) -> OpAttrs {
        let mut op = OpAttrs::default();
        for attr in attrs {
            if is(attr, "stream") {
                op.stream(attr, errors);
            } else if is(attr, "join") {
                op.join(attr, errors);
            } else if is(attr, "after") {
                op.after(attr, errors);
            } else if is(attr, "every") {
                op.every(attr, errors);
            } else if is(attr, "when") {
                op.when(attr, errors);
            } else if is(attr, "cost") {
                op.cost(attr, errors);
            }
        }
        op
    }

    /// `#[stream(name)]`, `#[stream(group[d])]` or `#[stream(group[2])]`.
    fn stream(&mut self, attr: &Attribute, errors: &Errors) {
        match attr.parse_args::<StreamSyntax>() {
            Ok(s) => {
                if self.placement.is_some() {
                    errors.spanned(
                        attr,
                        "an op runs on one stream: remove the second #[stream]",
                    );
                }
                self.placement = Some(Placement {
                    stream: s.name,
                    index: s.index.map(|i| match i {
                        IndexSyntax::Var(v) => IndexSpec::Each(v),
                        IndexSyntax::Lit(n, sp) => IndexSpec::Fixed(n, sp),
                    }),
                });
            }
            Err(e) => {
                errors.push(syn::Error::new(
                    e.span(),
                    "expected #[stream(name)], #[stream(group[d])] or #[stream(group[2])]",
                ));
                self.placement_unreadable = true;
            }
        }
    }

    /// `#[join(a, group, group[2])]`.
    fn join(&mut self, attr: &Attribute, errors: &Errors) {
        match attr.parse_args_with(Punctuated::<StreamSyntax, Token![,]>::parse_terminated) {
            Ok(list) if list.is_empty() => {
                errors.spanned(attr, "name the streams to join: #[join(a, b)]")
            }
            Ok(list) => {
                for s in list {
                    let index = match s.index {
                        None => None,
                        Some(IndexSyntax::Lit(n, sp)) => Some((n, sp)),
                        Some(IndexSyntax::Var(v)) => {
                            errors.spanned(
                                &v,
                                "a join names a whole group (`branch`) or one member (`branch[2]`)",
                            );
                            continue;
                        }
                    };
                    self.joins.push(StreamRef {
                        name: s.name,
                        index,
                    });
                }
            }
            Err(e) => errors.push(syn::Error::new(e.span(), "expected #[join(stream, ..)]")),
        }
    }

    /// `#[after(op, ..)]`.
    fn after(&mut self, attr: &Attribute, errors: &Errors) {
        match attr.parse_args_with(Punctuated::<Ident, Token![,]>::parse_terminated) {
            // An empty list orders nothing: a leftover, or an op that was meant.
            Ok(list) if list.is_empty() => errors.spanned(
                attr,
                "name the earlier ops this op runs after: #[after(op)]",
            ),
            Ok(list) => self.after.extend(list),
            Err(e) => errors.push(syn::Error::new(e.span(), "expected #[after(op, ..)]")),
        }
    }

    /// `#[every(k)]`, `k` a config field or a count.
    fn every(&mut self, attr: &Attribute, errors: &Errors) {
        match parse_every(attr, errors) {
            Ok(e) if self.every.is_some() => {
                errors.at(e.span(), "an op has one #[every]: remove the second")
            }
            Ok(e) => self.every = Some(e),
            Err(Reported(true)) => {}
            Err(Reported(false)) => errors.spanned(
                attr,
                "expected #[every(k)], with k a config field (u32) or a count: the op runs at every k-th replay",
            ),
        }
    }

    /// `#[when(flag)]`.
    fn when(&mut self, attr: &Attribute, errors: &Errors) {
        match attr.parse_args::<Ident>() {
            Ok(flag) if self.when.is_some() => {
                errors.spanned(&flag, "an op has one #[when]: remove the second")
            }
            Ok(flag) => self.when = Some(flag),
            Err(_) => errors.spanned(
                attr,
                "expected #[when(flag)], with flag a DeviceFlag field of the buffers: the op runs when the flag is set",
            ),
        }
    }

    /// `#[cost(N)]`, a non-negative number.
    fn cost(&mut self, attr: &Attribute, errors: &Errors) {
        let parsed = attr
            .parse_args::<LitFloat>()
            .and_then(|l| l.base10_parse::<f64>())
            .or_else(|_| {
                attr.parse_args::<LitInt>()
                    .and_then(|l| l.base10_parse::<f64>())
            });
        match parsed {
            // A second cost would silently replace the first.
            Ok(_) if self.cost.is_some() => {
                errors.spanned(attr, "an op has one #[cost]: remove the second")
            }
            Ok(c) if c.is_finite() && c >= 0.0 => self.cost = Some(c),
            _ => errors.spanned(attr, "expected #[cost(N)] with N a non-negative number"),
        }
    }
}

/// Whether the error of an attribute that did not parse is reported already.
struct Reported(bool);

/// The argument of `#[every(..)]`: a config field or a count of at least 1 that fits a
/// `u32`. A count out of range is reported here.
fn parse_every(attr: &Attribute, errors: &Errors) -> Result<Every, Reported> {
    let l = match attr.parse_args::<syn::Expr>() {
        Ok(syn::Expr::Path(p)) if p.qself.is_none() => {
            return p
                .path
                .get_ident()
                .cloned()
                .map(Every::Field)
                .ok_or(Reported(false));
        }
        Ok(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(l),
            ..
        })) => l,
        _ => return Err(Reported(false)),
    };
    if !matches!(l.suffix(), "" | "u32") {
        // The count is a `u32`: another suffix says a type it does not have.
        errors.spanned(
            &l,
            format!(
                "#[every({l})]: the count is a `u32`; expected a plain number or a `u32` one, found a `{}` suffix",
                l.suffix()
            ),
        );
        return Err(Reported(true));
    }
    match l.base10_parse::<u32>() {
        Ok(0) => {
            errors.spanned(&l, "#[every(0)] never runs: expected a count of at least 1");
            Err(Reported(true))
        }
        Ok(n) => Ok(Every::Count(n, l.span())),
        Err(_) => {
            errors.spanned(&l, "expected a count that fits in 32 bits");
            Err(Reported(true))
        }
    }
}

/// What an op's parameters are read against.
struct ParamContext<'a> {
    names: &'a SpecialNames,
    /// The last segment of the step's kernels type, when it declares one.
    kernels_name: Option<&'a str>,
    /// The replication index of an op on `group[d]`: `d`.
    index_var: Option<&'a Ident>,
}

/// One parameter of an op, its stepgraph attributes removed; `None` where what it binds
/// cannot be read.
fn parse_param(pt: &mut syn::PatType, context: &ParamContext, errors: &Errors) -> Option<Param> {
    let binding = param_binding(pt, errors);
    let all_branches = marker(&pt.attrs, "all_branches", errors).cloned();
    let out = marker(&pt.attrs, "out", errors).cloned();
    pt.attrs.retain(|a| !PARAM_ATTRS.iter().any(|n| is(a, n)));
    // What an unreadable `#[buf]` binds is unknown: any rule about it would guess.
    let binding = binding.ok()?;
    let Pat::Ident(pat) = &*pt.pat else {
        errors.spanned(
            &pt.pat,
            "an op parameter is a plain name that binds a buffer or a config field",
        );
        return None;
    };
    let name = pat.ident.clone();
    let kind = param_kind(&pt.ty, context, errors);
    let is_index = kind == ParamKind::Value && context.index_var == Some(&name);
    // The replication index: bound by the expansion, not by a field.
    let kind = if is_index { ParamKind::Index } else { kind };
    let named_by_buf = binding.is_some();
    let binding = binding.unwrap_or_else(|| name.clone());
    Some(Param {
        name,
        binding,
        named_by_buf,
        kind,
        ty: (*pt.ty).clone(),
        span: pt.span(),
        all_branches,
        out,
    })
}

/// The buffer `#[buf(name)]` binds, if the parameter has one; `Err` where one did not
/// parse (reported).
fn param_binding(pt: &syn::PatType, errors: &Errors) -> Result<Option<Ident>, ()> {
    let mut binding: Option<Ident> = None;
    let mut unreadable = false;
    for attr in pt.attrs.iter().filter(|a| is(a, "buf")) {
        match attr.parse_args::<Ident>() {
            // A second name would silently replace the first.
            Ok(b) if binding.is_some() => errors.spanned(
                &b,
                "a parameter binds one buffer: remove the second #[buf(..)]",
            ),
            Ok(b) => binding = Some(b),
            Err(_) => {
                errors.spanned(attr, "expected #[buf(buffer_name)]");
                unreadable = true;
            }
        }
    }
    if unreadable { Err(()) } else { Ok(binding) }
}

/// What a parameter of type `ty` is by its type: the stream, the handle or the kernels
/// by reference, a buffer read by `&` or written by `&mut`, or a value.
fn param_kind(ty: &Type, context: &ParamContext, errors: &Errors) -> ParamKind {
    let Type::Reference(r) = ty else {
        return ParamKind::Value;
    };
    let seg = last_segment(&r.elem).map(Ident::to_string);
    let special = match seg.as_deref() {
        Some(s) if context.names.kind(s).is_some() => context.names.kind(s),
        Some(s) if context.kernels_name == Some(s) => Some(ParamKind::Kernels),
        _ => None,
    };
    match special {
        Some(k) if r.mutability.is_some() => {
            errors.spanned(
                ty,
                "the stream, cuBLASLt handle and kernels are shared: take them by `&`, not `&mut`",
            );
            k
        }
        Some(k) => k,
        None if r.mutability.is_some() => ParamKind::Write,
        None => ParamKind::Read,
    }
}

/// Turns each `&T` parameter that names no buffer or config field, and whose `T` is no
/// device memory, into a context parameter, bound by type: the capture stream, its
/// cuBLASLt handle or the kernels under an alias declared outside the module, which the
/// macro cannot see but rustc can. A parameter that looks meant as a buffer (named by
/// `#[buf]`, marked `#[all_branches]` or `#[out]`, or a near miss of a buffer's name) or
/// as the undeclared kernels stays a buffer parameter, for validation's better error.
fn bind_by_type(step: &mut Step) {
    let buffers: Vec<String> = step.buffer_fields().map(|b| b.name.to_string()).collect();
    let config: Vec<String> = step.config_names();
    let kernels_declared = step.kernels.is_some();
    for param in step.ops.iter_mut().flat_map(|op| &mut op.params) {
        let Type::Reference(r) = &param.ty else {
            continue;
        };
        let b = param.binding.to_string();
        let meant_as_buffer = param.named_by_buf
            || param.all_branches.is_some()
            || param.out.is_some()
            || buffers.contains(&b)
            || config.contains(&b)
            || is_device_memory(&r.elem)
            || (!kernels_declared && b.contains("kernel"))
            || crate::errors::did_you_mean(&b, buffers.iter().map(String::as_str)).is_some();
        if param.kind == ParamKind::Read && !meant_as_buffer {
            param.kind = ParamKind::Context;
        }
    }
}

/// Parses the attribute arguments, reporting a syntax error to the collector.
pub fn parse_args(tokens: TokenStream, errors: &Errors) -> StepArgs {
    match syn::parse2::<StepArgs>(tokens) {
        Ok(a) => a,
        Err(e) => {
            errors.push(e);
            StepArgs {
                streams: Vec::new(),
                streams_span: None,
                kernels: None,
                krate: None,
                auto: None,
                compare_auto: None,
                costs: None,
                unreadable: true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    /// The kinds of op `f`'s parameters in a step with buffers `x` and `q_values` and a
    /// config field `scale`.
    fn kinds(args: TokenStream, op: TokenStream) -> Vec<(String, ParamKind)> {
        let errors = Errors::new();
        let module: ItemMod = syn::parse2(quote!(mod s {
            #[buffers]
            pub struct Buffers { pub x: DeviceBuffer<f32>, pub q_values: DeviceBuffer<f32> }
            #[config]
            pub struct Config { pub scale: f32 }
            #op
        }))
        .unwrap();
        let step = parse(parse_args(args, &errors), module, &errors).unwrap();
        let _ = errors.finish();
        let op = step.ops.iter().find(|o| o.name == "f").unwrap();
        op.params
            .iter()
            .map(|p| (p.name.to_string(), p.kind))
            .collect()
    }

    #[test]
    fn a_reference_that_binds_nothing_and_is_no_device_memory_is_bound_by_type() {
        let found = kinds(
            quote!(streams(main), kernels = Kernels),
            quote!(
                #[op]
                fn f(
                    s: &Stream<'_>,
                    lt: &path::Lt<'_>,
                    ks: &Ks,
                    x: &DeviceBuffer<f32>,
                ) -> Result<()> {
                    Ok(())
                }
            ),
        );
        use ParamKind::*;
        assert_eq!(
            found,
            [
                ("s".into(), Context),
                ("lt".into(), Context),
                ("ks".into(), Context),
                ("x".into(), Read)
            ]
        );
    }

    #[test]
    fn a_reference_meant_as_a_buffer_or_config_stays_one_for_its_better_error() {
        let found = kinds(
            quote!(streams(main)),
            quote!(
                #[op]
                fn f(
                    s: &Stream<'_>,
                    // Device memory, a near miss of a buffer, a config field by reference,
                    // the kernels undeclared, a buffer named by `#[buf]`, `#[out]`.
                    lanes: &[DeviceBuffer<f32>; 2],
                    q_value: &Head,
                    scale: &f32,
                    kernels: &Kernels,
                    #[buf(x)] a: &Head,
                    #[out] b: &Head,
                ) -> Result<()> {
                    Ok(())
                }
            ),
        );
        let meant: Vec<&str> = found
            .iter()
            .filter(|(_, k)| *k == ParamKind::Read)
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(meant, ["lanes", "q_value", "scale", "kernels", "a", "b"]);
    }

    #[test]
    fn device_memory_is_recognised_by_its_last_segment_or_as_an_array() {
        for ty in [
            quote!(DeviceBuffer<f32>),
            quote!(stepgraph::View<'_, f32>),
            quote!(ViewMut<'_, f32>),
            quote!(DeviceScalars<f32>),
            quote!(DeviceFlag),
            quote!(Communicator),
            quote!(cudarc::driver::CudaSlice<f32>),
            quote!(HostInput<f32>),
            quote!(HostOutput<f32>),
            quote!([Head; 2]),
            quote!((DeviceBuffer<f32>)),
        ] {
            assert!(is_device_memory(&syn::parse2(ty.clone()).unwrap()), "{ty}");
        }
        for ty in [quote!(CaptureStream<'_>), quote!(Head), quote!(str)] {
            assert!(!is_device_memory(&syn::parse2(ty.clone()).unwrap()), "{ty}");
        }
    }
}
