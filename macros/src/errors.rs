//! The error collector: every mistake of a definition is gathered, so one build shows
//! them all. It must be drained; dropping it unread is a bug in this crate.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

pub struct Errors {
    errors: RefCell<Option<Vec<syn::Error>>>,
    /// Warnings: what the build goes on without, said at its token.
    warnings: RefCell<Vec<(Span, String)>>,
}

impl Errors {
    pub fn new() -> Self {
        Errors {
            errors: RefCell::new(Some(Vec::new())),
            warnings: RefCell::new(Vec::new()),
        }
    }

    pub fn at(&self, span: Span, msg: impl Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub fn spanned(&self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    pub fn push(&self, err: syn::Error) {
        if let Some(v) = self.errors.borrow_mut().as_mut() {
            v.push(err);
        }
    }

    /// A warning at `span`: the build goes on.
    pub fn warn(&self, span: Span, msg: impl Display) {
        self.warnings.borrow_mut().push((span, msg.to_string()));
    }

    /// The warnings so far, as items that make rustc warn at their spans. Stable Rust
    /// has no warning API for proc macros; the use of a deprecated constant whose note is
    /// the message is the one way to a warning at a chosen token (`#[allow(deprecated)]`
    /// on the module silences it).
    pub fn warnings(&self) -> TokenStream {
        self.warnings
            .borrow_mut()
            .drain(..)
            .map(|(span, msg)| {
                let note = format!("stepgraph: {msg}");
                let name = quote::format_ident!("step_warning", span = span);
                quote::quote_spanned! {span=>
                    const _: () = {
                        #[deprecated(note = #note)]
                        #[allow(non_upper_case_globals)]
                        const #name: () = ();
                        #name
                    };
                }
            })
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.errors.borrow().as_ref().is_none_or(Vec::is_empty)
    }

    /// Drains the collector into its errors.
    pub fn drain(self) -> Vec<syn::Error> {
        self.errors.borrow_mut().take().unwrap_or_default()
    }

    /// Drains the collector into `compile_error!`s (empty when there were none).
    pub fn finish(self) -> Option<TokenStream> {
        let errors = self.errors.borrow_mut().take().unwrap_or_default();
        if errors.is_empty() {
            return None;
        }
        Some(errors.iter().map(syn::Error::to_compile_error).collect())
    }
}

impl Drop for Errors {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("stepgraph-macros: error collector dropped without being drained");
        }
    }
}

/// The closest candidate within a small edit distance, for "did you mean".
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|&(d, c)| d <= 2.max(name.len() / 3) && d < c.len().max(name.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// ` (did you mean `x`?)` or nothing.
pub fn suggestion<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    match did_you_mean(name, candidates) {
        Some(c) => format!("; did you mean `{c}`?"),
        None => String::new(),
    }
}
