//! The error collector: every mistake of a definition is gathered, so one build shows
//! them all. It must be drained; dropping it unread is a bug in this crate.

use std::cell::RefCell;
use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

pub struct Errors {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Errors {
    pub fn new() -> Self {
        Errors {
            errors: RefCell::new(Some(Vec::new())),
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
