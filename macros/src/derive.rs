//! `#[derive(StepBuffer)]`: a struct of step buffers is a step buffer. Each field's type
//! is checked where it is written, so that a host handle or a cell in a component is
//! reported at the field, not where the component is used.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Path};

/// The expansion of `#[derive(StepBuffer)]` on `input`, or the errors that stop it.
pub fn step_buffer(input: DeriveInput) -> TokenStream {
    let krate = match runtime_path(&input) {
        Ok(p) => p,
        Err(e) => return e.to_compile_error(),
    };
    let fields = match &input.data {
        Data::Struct(s) => &s.fields,
        _ => {
            return syn::Error::new(
                input.ident.span(),
                "#[derive(StepBuffer)] goes on a struct whose fields are step buffers (DeviceBuffer<T>, DeviceScalars<T>, a Communicator, arrays of them, or structs that derive StepBuffer)",
            )
            .to_compile_error();
        }
    };
    let rt = quote!(#krate::__rt_v1);
    let name = &input.ident;
    let generic = !input.generics.params.is_empty();
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // A generic struct's fields may name its parameters, which a `const` cannot: they
    // become bounds of the impl instead, and are checked where the struct is used.
    let mut bounds: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(|p| quote!(#p)).collect())
        .unwrap_or_default();
    let mut checks = Vec::new();
    for field in fields {
        let ty = &field.ty;
        if generic {
            bounds.push(quote!(#ty: #rt::StepBuffer));
        } else {
            checks.push(quote_spanned!(ty.span()=> #rt::assert_buffer::<#ty>();));
        }
    }
    let checks = (!checks.is_empty()).then(|| quote!(const _: () = { #(#checks)* };));
    quote! {
        #checks
        // SAFETY: every field is a step buffer (checked above, or bounded below), and the
        // struct adds nothing an op could reach besides them.
        unsafe impl #impl_generics #rt::StepBuffer for #name #ty_generics where #(#bounds),* {}
    }
}

/// `#[step_buffer(crate = path)]`, for a crate that re-exports stepgraph; `::stepgraph`
/// otherwise.
fn runtime_path(input: &DeriveInput) -> syn::Result<Path> {
    let mut path: Option<Path> = None;
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("step_buffer"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                if path.is_some() {
                    return Err(meta.error("`crate = ..` is given twice"));
                }
                path = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error("expected `crate = path` (the runtime's path)"))
            }
        })?;
    }
    Ok(path.unwrap_or_else(|| syn::parse_quote!(::stepgraph)))
}
