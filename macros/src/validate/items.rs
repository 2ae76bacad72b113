//! The module's items: the ops' signatures, the names the expansion defines, and the
//! ops' own names.

use std::collections::HashMap;

use syn::Ident;

use super::Ops;
use crate::errors::Errors;
use crate::model::{Op, Step};

/// Each op's name once: the expansion calls an op by its function's name, and the plan
/// names its nodes so. The ops that remain, in program order.
pub fn check_duplicate_ops<'a>(step: &'a Step, errors: &Errors) -> Ops<'a> {
    let mut ops = Ops {
        list: Vec::new(),
        by_name: HashMap::new(),
        names: Vec::new(),
    };
    for op in &step.ops {
        let name = op.name.to_string();
        if let Some(&first) = ops.by_name.get(&name) {
            errors.spanned(
                &op.name,
                format!(
                    "two ops are named `{name}`; ops are named by their function, rename one (the first is op #{first})"
                ),
            );
            continue;
        }
        ops.by_name.insert(name.clone(), ops.list.len());
        ops.list.push(op);
        ops.names.push(name);
    }
    ops
}

/// An op is called by the expansion as `op(args..)?` inside the capture, in program
/// order: what its signature must be for that call to mean what the plan says.
pub fn check_op_signature(op: &Op, errors: &Errors) {
    check_not_async(op, errors);
    check_not_unsafe(op, errors);
    check_generics_inferred(op, errors);
    check_returns_result(op, errors);
}

/// The capture issues work as the op runs; a future would run it later, outside it.
fn check_not_async(op: &Op, errors: &Errors) {
    let name = &op.name;
    if let Some(a) = &op.item.sig.asyncness {
        errors.spanned(
            a,
            format!("op `{name}` is `async`: ops issue their work on the capture stream as they run, so an op is a plain `fn`; remove `async`"),
        );
    }
}

/// The expansion calls the op from safe code; the unsafe part belongs inside it.
fn check_not_unsafe(op: &Op, errors: &Errors) {
    let name = &op.name;
    if let Some(u) = &op.item.sig.unsafety {
        errors.spanned(
            u,
            format!("op `{name}` is an `unsafe fn`: the step calls it from safe code; make it a safe `fn` with an `unsafe {{ .. }}` block inside, stating why it holds"),
        );
    }
}

/// The expansion calls the op without naming its type or const parameters: rustc infers
/// each from the buffers and config bound to the parameters whose types mention it, and
/// one that no parameter mentions cannot be inferred.
fn check_generics_inferred(op: &Op, errors: &Errors) {
    let sig = &op.item.sig;
    let name = &op.name;
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
}

/// A failed launch or matmul must stop the capture (which is then discarded): an op says
/// so by returning the error.
fn check_returns_result(op: &Op, errors: &Errors) {
    let name = &op.name;
    if let syn::ReturnType::Default = op.item.sig.output {
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
pub fn report_no_ops(step: &Step, errors: &Errors) {
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
    (
        "AUTO_PLAN",
        "the planner's placement of every op, with `compare(auto)`",
    ),
    ("__AUTO_OPS", "that plan's ops"),
    ("__AUTO_EDGES", "that plan's edges"),
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
pub fn check_reserved_names(step: &Step, errors: &Errors) {
    for ident in step.other.iter().filter_map(item_ident) {
        check_reserved_name(ident, errors);
        check_generated_struct_name(step, ident, errors);
    }
}

/// A name the expansion defines in every step's module.
fn check_reserved_name(ident: &Ident, errors: &Errors) {
    let name = ident.to_string();
    if let Some((_, what)) = RESERVED.iter().find(|(n, _)| *n == name) {
        errors.spanned(
            ident,
            format!("`{name}` is defined by #[step] in this module ({what}): rename this item"),
        );
    }
}

/// `Buffers` or `Config` beside a step that lacks that struct, which the expansion then
/// defines empty.
fn check_generated_struct_name(step: &Step, ident: &Ident, errors: &Errors) {
    let name = ident.to_string();
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
