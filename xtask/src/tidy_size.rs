//! Checks that keep code and documents at a size a reader can hold, run as ordinary
//! tests by `cargo xtask test`:
//!
//! - no function of a library crate's code is over [`FUNCTION_LINES`] lines (tests are
//!   exempt: a test that reads as one scenario may be long);
//! - the benchmark document and each PERF note stay documents, not notebooks: current
//!   figures only, history lives in git.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::tidy::{LIBRARY_CRATES, rust_files, workspace};

/// The longest a library function may be.
const FUNCTION_LINES: usize = 150;

/// Documents and the most lines each may have, by path from the workspace root; a path
/// ending in `/` is every file of that name below the folder (`PERF.md` anywhere).
const DOCUMENTS: &[(&str, usize)] = &[
    ("bench/BENCHMARKS.md", 250),
    ("examples/dqn/src/kernels.rs", 2000),
];

/// Every PERF note of the examples may have this many lines.
const PERF_NOTE_LINES: usize = 200;

/// Finds the functions of one file that are too long, skipping tests.
struct Lengths<'a> {
    file: &'a Path,
    long: Vec<String>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("test") || path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        // `#[cfg(test)]`: a module or function that only tests build.
        path.is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl Lengths<'_> {
    fn check(&mut self, name: &syn::Ident, attrs: &[syn::Attribute], block: &syn::Block) {
        if is_test(attrs) {
            return;
        }
        let span = block.span();
        let lines = span.end().line.saturating_sub(span.start().line) + 1;
        if lines > FUNCTION_LINES {
            self.long.push(format!(
                "{}:{}: `{name}` is {lines} lines",
                self.file.display(),
                name.span().start().line
            ));
        }
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.check(&f.sig.ident, &f.attrs, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.check(&f.sig.ident, &f.attrs, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.check(&f.sig.ident, &f.attrs, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// The too-long functions of the Rust files given, named by file, line and length.
fn long_functions(files: &[PathBuf]) -> Vec<String> {
    let mut long = Vec::new();
    for path in files {
        // A crate's test files (`tests.rs`, `tests/…`) are tests, whatever their attributes.
        if path.iter().any(|p| p == "tests" || p == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let file =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
        let mut walk = Lengths {
            file: path,
            long: Vec::new(),
        };
        walk.visit_file(&file);
        long.append(&mut walk.long);
    }
    long
}

fn lines_of(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .count()
}

/// Every `PERF.md` below `dir`, skipping build output.
fn perf_notes(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let skip = path
            .file_name()
            .is_some_and(|n| n == "target" || n.to_string_lossy().starts_with('.'));
        if path.is_dir() && !skip {
            perf_notes(&path, out);
        } else if path.file_name().is_some_and(|n| n == "PERF.md") {
            out.push(path);
        }
    }
}

#[test]
fn no_library_function_is_over_the_limit() {
    let mut long = Vec::new();
    for folder in LIBRARY_CRATES {
        let mut files = Vec::new();
        rust_files(&workspace().join(folder).join("src"), &mut files);
        long.append(&mut long_functions(&files));
    }
    assert!(
        long.is_empty(),
        "expected every library function to be at most {FUNCTION_LINES} lines (split it by \
         what each part does), found:\n{}",
        long.join("\n")
    );
}

#[test]
fn documents_stay_documents() {
    let root = workspace();
    let mut limits: Vec<(PathBuf, usize)> = DOCUMENTS
        .iter()
        .map(|&(rel, most)| (root.join(rel), most))
        .collect();
    let mut notes = Vec::new();
    perf_notes(&root.join("examples"), &mut notes);
    assert!(!notes.is_empty(), "expected the examples' PERF.md notes");
    limits.extend(notes.into_iter().map(|p| (p, PERF_NOTE_LINES)));
    let over: Vec<String> = limits
        .iter()
        .filter_map(|(path, most)| {
            let lines = lines_of(path);
            (lines > *most).then(|| format!("{}: {lines} lines", path.display()))
        })
        .collect();
    assert!(
        over.is_empty(),
        "expected each document within its limit (BENCHMARKS.md 250 lines, each PERF.md \
         {PERF_NOTE_LINES}, the DQN kernels.rs 2000), found:\n{}",
        over.join("\n")
    );
}

#[cfg(test)]
mod checks {
    use super::*;

    #[test]
    fn a_long_function_is_found_and_a_long_test_is_not() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let body = "    let x = 1;\n".repeat(FUNCTION_LINES);
        let text = format!(
            "fn long() {{\n{body}}}\nfn short() {{}}\n#[test]\nfn long_test() {{\n{body}}}\n\
             #[cfg(test)]\nmod t {{ fn helper() {{\n{body}}} }}\n\
             impl S {{ fn method(&self) {{\n{body}}} }}\n"
        );
        let path = dir.path().join("lib.rs");
        std::fs::write(&path, text).expect("a file");
        let long = long_functions(&[path]);
        assert_eq!(long.len(), 2, "{long:?}");
        assert!(long[0].contains("`long` is 152 lines"), "{long:?}");
        assert!(long[1].contains("`method`"), "{long:?}");
    }
}
