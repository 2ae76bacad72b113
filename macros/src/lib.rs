//! The `#[step]` attribute of stepgraph. Use it through the `stepgraph` crate, which
//! re-exports it and documents it; this crate's modules are the stages of the macro:
//! `parse` (syntax into typed settings), `model` (the definition, every node with its
//! span), `validate` (names and schedule rules, lowered to the planner's input),
//! `schedule` (the planner, plain Rust) and `codegen` (the only stage that quotes).

mod codegen;
mod derive;
mod errors;
mod model;
mod parse;
mod place;
#[cfg(test)]
mod place_props;
mod schedule;
#[cfg(test)]
mod schedule_props;
#[cfg(test)]
mod snapshots;
mod validate;

use proc_macro2::TokenStream;

/// Plans a step's multi-stream capture at compile time. See the `stepgraph` crate.
#[proc_macro_attribute]
pub fn step(
    attr: proc_macro::TokenStream,
    item: proc_macro::TokenStream,
) -> proc_macro::TokenStream {
    // The folder of the file that holds the step: its costs file is found from there,
    // as `include_str!` finds a file. Absolute, since the path rustc gives is relative to
    // its working folder and an `include_bytes!` path is relative to the file.
    let source_dir = proc_macro::Span::call_site()
        .local_file()
        .and_then(|f| std::path::absolute(f).ok())
        .and_then(|f| f.parent().map(std::path::Path::to_path_buf));
    expand_in(attr.into(), item.into(), source_dir).into()
}

/// Makes a struct of step buffers, and of the plain data that describes them, a step
/// buffer, with each field checked where it is written. See `stepgraph::StepBuffer`.
#[proc_macro_derive(StepBuffer, attributes(step_buffer))]
pub fn derive_step_buffer(item: proc_macro::TokenStream) -> proc_macro::TokenStream {
    match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => derive::step_buffer(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// Makes a struct or enum of config values a config value, with each field checked where
/// it is written. See `stepgraph::ConfigValue`.
#[proc_macro_derive(ConfigValue, attributes(config_value))]
pub fn derive_config_value(item: proc_macro::TokenStream) -> proc_macro::TokenStream {
    match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => derive::config_value(input).into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// [`expand_in`] with no source file: a costs file is found from the crate's root.
#[cfg(test)]
fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_in(attr, item, None)
}

/// The whole macro: every error of the definition as a `compile_error!`, next to a
/// stand-in with the same signatures; or the planned expansion. `source_dir` is the
/// folder of the step's source file, where the compiler says it.
fn expand_in(
    attr: TokenStream,
    item: TokenStream,
    source_dir: Option<std::path::PathBuf>,
) -> TokenStream {
    let errors = errors::Errors::new();
    let module = match syn::parse2::<syn::ItemMod>(item.clone()) {
        Ok(m) => m,
        Err(e) => {
            errors.push(syn::Error::new(
                e.span(),
                "#[step] goes on an inline module: `mod name { .. }` holding the buffers, config and ops",
            ));
            return errors.finish().into_iter().chain([item]).collect();
        }
    };
    let args = parse::parse_args(attr, &errors);
    let Some(mut step) = parse::parse(args, module, &errors) else {
        return errors.finish().into_iter().chain([item]).collect();
    };
    step.source_dir = source_dir;
    let resolved = validate::validate(&step, &errors);
    // The planner runs only on a step without mistakes, and its plan is checked too.
    let planned = match resolved {
        Some(resolved) if errors.is_empty() => {
            let plan = schedule::plan(&resolved.problem);
            validate::check_plan(&step, &plan, &errors);
            let whole = resolved.whole.as_deref().map(|w| {
                let plan = schedule::plan(&w.problem);
                validate::check_plan(&step, &plan, &errors);
                plan
            });
            Some((resolved, plan, whole))
        }
        _ => None,
    };
    let warnings = errors.warnings();
    let tracked = codegen::track_costs_file(&step);
    let out = match (errors.finish(), planned) {
        (None, Some((resolved, plan, whole))) => {
            let whole = resolved.whole.as_deref().zip(whole.as_ref());
            codegen::expand(&step, &resolved, &plan, whole)
        }
        (errs, _) => errs.into_iter().chain([codegen::stand_in(&step)]).collect(),
    };
    quote::quote!(#out #warnings #tracked)
}
