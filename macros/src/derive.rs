//! The derives of what a step may hold: `#[derive(StepBuffer)]` (a struct of step buffers,
//! and of the plain data that describes them, is a step buffer) and `#[derive(ConfigValue)]`
//! (a struct or enum of config values is one). Each field's type is checked where it is
//! written, so that a host handle or a cell in a component is reported at the field, not
//! where the component is used.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Attribute, Data, DeriveInput, Field, Generics, Ident, Lifetime, Path, Type};

use crate::errors::Errors;

/// The attribute of `#[derive(StepBuffer)]`.
const STEP_BUFFER: &str = "step_buffer";
/// The attribute of `#[derive(ConfigValue)]`.
const CONFIG_VALUE: &str = "config_value";

/// The expansion of `#[derive(StepBuffer)]` on `input`: its errors, and the impl with each
/// field checked.
pub fn step_buffer(input: DeriveInput) -> TokenStream {
    let errors = Errors::new();
    let krate = runtime_path(&input.attrs, STEP_BUFFER, &errors);
    let Data::Struct(data) = &input.data else {
        errors.at(
            input.ident.span(),
            "#[derive(StepBuffer)] goes on a struct whose fields are step buffers (DeviceBuffer<T>, DeviceScalars<T>, a Communicator, arrays of them, or structs that derive StepBuffer) or plain data that describes them",
        );
        return errors.finish().unwrap_or_default();
    };
    // An attribute on a field would read as an exception to the rule, like a host handle
    // marked to be skipped; an op would still be handed it, inside the capture.
    for field in &data.fields {
        refuse_attrs(
            &field.attrs,
            STEP_BUFFER,
            "#[derive(StepBuffer)] takes no field attributes: a size or shape field needs none (plain data is checked as such), and a host handle cannot be part of a step buffer; remove this attribute",
            &errors,
        );
    }
    let rt = quote!(#krate::__rt_v1);
    let params = Params::of(&input.generics);
    let mut bounds = own_bounds(&input.generics);
    // Where each field's memory lies: a step buffer's, nothing for plain data.
    let mut regions = Vec::new();
    for (i, field) in data.fields.iter().enumerate() {
        let ty = &field.ty;
        let member = match &field.ident {
            Some(ident) => quote!(#ident),
            None => syn::Index::from(i).into_token_stream(),
        };
        if params.named_in(ty) {
            bounds.push(quote_spanned!(ty.span()=> #ty: #rt::StepBuffer));
            regions.push(quote!(#rt::StepBuffer::__regions(&self.#member, spans)));
        } else {
            // The one check of the field's type: a type that is neither is reported once,
            // at the field.
            regions.push(
                quote_spanned!(ty.span()=> #rt::field_regions::<#ty, _>(&self.#member, spans)),
            );
        }
    }
    let name = &input.ident;
    let (impl_generics, ty_generics, _) = input.generics.split_for_impl();
    let errors = errors.finish();
    quote! {
        #errors
        // SAFETY: every field is a step buffer or plain data (checked where `__regions`
        // visits it, or bounded below), and the struct adds nothing an op could reach
        // besides them.
        #[automatically_derived]
        unsafe impl #impl_generics #rt::StepBuffer for #name #ty_generics where #(#bounds,)* {
            fn __regions(&self, spans: &mut ::std::vec::Vec<(u64, usize)>) -> bool {
                true #(& #regions)*
            }
        }
    }
}

/// The expansion of `#[derive(ConfigValue)]` on `input`: its errors, and the impl with each
/// field (of every variant) checked.
pub fn config_value(input: DeriveInput) -> TokenStream {
    let errors = Errors::new();
    let krate = runtime_path(&input.attrs, CONFIG_VALUE, &errors);
    let fields: Vec<&Field> = match &input.data {
        Data::Struct(data) => data.fields.iter().collect(),
        Data::Enum(data) => {
            for variant in &data.variants {
                refuse_attrs(&variant.attrs, CONFIG_VALUE, NO_CONFIG_ATTRS, &errors);
            }
            data.variants.iter().flat_map(|v| &v.fields).collect()
        }
        Data::Union(data) => {
            errors.at(
                data.union_token.span,
                "#[derive(ConfigValue)] goes on a struct or an enum whose fields are config values, not on a union: its fields share their bytes, so none of them says what an op reads; use an enum",
            );
            return errors.finish().unwrap_or_default();
        }
    };
    for field in &fields {
        refuse_attrs(&field.attrs, CONFIG_VALUE, NO_CONFIG_ATTRS, &errors);
    }
    let rt = quote!(#krate::__rt_v1);
    let params = Params::of(&input.generics);
    let mut bounds = own_bounds(&input.generics);
    let mut checks = Vec::new();
    for field in fields {
        let ty = &field.ty;
        if params.named_in(ty) {
            bounds.push(quote_spanned!(ty.span()=> #ty: #rt::ConfigValue));
        } else {
            checks.push(quote_spanned!(ty.span()=> #rt::assert_config::<#ty>();));
        }
    }
    let name = &input.ident;
    let (impl_generics, ty_generics, _) = input.generics.split_for_impl();
    let checks = (!checks.is_empty()).then(|| quote!(const _: () = { #(#checks)* };));
    let errors = errors.finish();
    quote! {
        #errors
        #checks
        // SAFETY: every field is a config value (checked above, or bounded below), and a
        // struct or enum adds nothing an op could reach besides them.
        #[automatically_derived]
        unsafe impl #impl_generics #rt::ConfigValue for #name #ty_generics where #(#bounds,)* {}
    }
}

/// Why `#[derive(ConfigValue)]` refuses `#[config_value(..)]` on a field or a variant.
const NO_CONFIG_ATTRS: &str = "#[derive(ConfigValue)] takes no field or variant attributes: every field is checked as a config value; remove this attribute";

/// `#[<name>(crate = path)]`, for a crate that re-exports stepgraph; `::stepgraph`
/// otherwise, and where the attribute is wrong (its error is reported, and the impl still
/// emitted, so that uses of the type do not fail too).
fn runtime_path(attrs: &[Attribute], name: &str, errors: &Errors) -> Path {
    let mut path: Option<Path> = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident(name)) {
        let parsed = attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("crate") {
                let found = meta.path.to_token_stream().to_string().replace(' ', "");
                return Err(meta.error(format!(
                    "unknown argument `{found}`: #[{name}(..)] takes only `crate = path`, the path of a crate that re-exports stepgraph"
                )));
            }
            if path.is_some() {
                return Err(meta.error("`crate = ..` is given twice; keep one"));
            }
            path = Some(meta.value()?.parse()?);
            Ok(())
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    path.unwrap_or_else(|| syn::parse_quote!(::stepgraph))
}

/// Reports each `#[<name>(..)]` in `attrs` (of a field or a variant) at the attribute.
fn refuse_attrs(attrs: &[Attribute], name: &str, why: &str, errors: &Errors) {
    for attr in attrs.iter().filter(|a| a.path().is_ident(name)) {
        errors.spanned(attr, why);
    }
}

/// The where-clause the type declares, kept on the impl.
fn own_bounds(generics: &Generics) -> Vec<TokenStream> {
    generics
        .where_clause
        .iter()
        .flat_map(|w| &w.predicates)
        .map(ToTokens::to_token_stream)
        .collect()
}

/// The type's own parameters. A field whose type names one cannot be checked in a `const`
/// (which cannot name them): it becomes a bound of the impl, checked where the type is
/// used. Every other field is checked where it is written, which a bound that names no
/// parameter could not be (rustc refuses a bound that is false for every use).
struct Params {
    names: Vec<Ident>,
    lifetimes: Vec<Lifetime>,
}

impl Params {
    fn of(generics: &Generics) -> Params {
        Params {
            names: generics
                .type_params()
                .map(|p| p.ident.clone())
                .chain(generics.const_params().map(|p| p.ident.clone()))
                .collect(),
            lifetimes: generics.lifetimes().map(|p| p.lifetime.clone()).collect(),
        }
    }

    /// Whether `ty` names a parameter (or `Self`, which a `const` cannot name either).
    fn named_in(&self, ty: &Type) -> bool {
        let mut finder = Finder {
            params: self,
            found: false,
        };
        finder.visit_type(ty);
        finder.found
    }
}

/// Looks through a type for one of `params`.
struct Finder<'a> {
    params: &'a Params,
    found: bool,
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_path(&mut self, path: &'ast Path) {
        let first = path.segments.first().map(|s| &s.ident);
        if path.leading_colon.is_none()
            && first.is_some_and(|i| i == "Self" || self.params.names.contains(i))
        {
            self.found = true;
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_lifetime(&mut self, lifetime: &'ast Lifetime) {
        self.found |= self.params.lifetimes.contains(lifetime);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step_buffer_of(input: DeriveInput) -> String {
        step_buffer(input).to_string()
    }

    fn config_value_of(input: DeriveInput) -> String {
        config_value(input).to_string()
    }

    #[test]
    fn a_size_field_is_checked_as_a_buffer_field() {
        let out = step_buffer_of(syn::parse_quote! {
            struct Linear { w: DeviceBuffer<f32>, len: usize }
        });
        assert!(
            out.contains("field_regions :: < DeviceBuffer < f32 > , _ >"),
            "{out}"
        );
        assert!(out.contains("field_regions :: < usize , _ >"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn a_field_naming_a_parameter_becomes_a_bound() {
        let out = step_buffer_of(syn::parse_quote! {
            struct Pair<T, const N: usize> { a: [T; 2], b: [DeviceBuffer<f32>; N], len: usize }
        });
        assert!(
            out.contains("[T ; 2] : :: stepgraph :: __rt_v1 :: StepBuffer"),
            "{out}"
        );
        assert!(
            out.contains("[DeviceBuffer < f32 > ; N] : :: stepgraph"),
            "{out}"
        );
        assert!(out.contains("field_regions :: < usize , _ >"), "{out}");
    }

    #[test]
    fn a_field_attribute_is_refused() {
        let out = step_buffer_of(syn::parse_quote! {
            struct Linear { w: DeviceBuffer<f32>, #[step_buffer(skip)] device: Device }
        });
        assert!(out.contains("takes no field attributes"), "{out}");
        // The impl is still emitted, so that uses of the struct do not fail too.
        assert!(out.contains("unsafe impl"), "{out}");
    }

    #[test]
    fn the_crate_path_is_used_and_other_arguments_refused() {
        let out = config_value_of(syn::parse_quote! {
            #[config_value(crate = facade)]
            struct Sizes { batch: usize }
        });
        assert!(
            out.contains("facade :: __rt_v1 :: ConfigValue for Sizes"),
            "{out}"
        );
        let out = config_value_of(syn::parse_quote! {
            #[config_value(skip)]
            struct Sizes { batch: usize }
        });
        assert!(out.contains("unknown argument `skip`"), "{out}");
        let out = step_buffer_of(syn::parse_quote! {
            #[step_buffer(crate = a, crate = b)]
            struct Linear { w: DeviceBuffer<f32> }
        });
        assert!(out.contains("given twice"), "{out}");
    }

    #[test]
    fn every_variant_field_of_an_enum_is_checked() {
        let out = config_value_of(syn::parse_quote! {
            enum Activation { Relu, Leaky { slope: f32 }, Clamp(f32, f64) }
        });
        for ty in ["f32", "f64"] {
            assert!(out.contains(&format!("assert_config :: < {ty} >")), "{out}");
        }
        let out = config_value_of(syn::parse_quote! {
            enum Activation { #[config_value(skip)] Relu }
        });
        assert!(out.contains("no field or variant attributes"), "{out}");
    }

    #[test]
    fn a_union_and_an_enum_of_buffers_are_refused() {
        let out = config_value_of(syn::parse_quote! { union Bits { a: u32, b: f32 } });
        assert!(out.contains("not on a union"), "{out}");
        let out = step_buffer_of(syn::parse_quote! { enum E { A(DeviceBuffer<f32>) } });
        assert!(out.contains("goes on a struct"), "{out}");
    }
}
