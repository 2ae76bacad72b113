//! Checks that keep the library crates' shape, run as ordinary tests by `cargo xtask test`:
//!
//! - no import cycle between the modules of a library crate;
//! - the runtime's layers: each module uses only its own layer and those below it;
//! - raw FFI only in its layer: `cudarc::driver::{sys, result}` only in the runtime's
//!   driver layer, cuBLASLt's only in its cuBLASLt layer, NCCL's only in its collectives.
//!
//! Modules are files (`lib.rs`, `a/mod.rs`, `a/b.rs`). A use of `crate::a::b::Item`,
//! `super::Item` or `self::Item`, in a `use` or in any path the code names, is an edge
//! from the file to the deepest file module on that path; a name the path reaches
//! through a re-export (`pub use`) is followed to where it is defined. A module's
//! re-exports of its own children are its face, not a use: a folder's `mod.rs` and the
//! crate root may name their children freely. Paths inside macro invocations and doc
//! links are not code, and not read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from the crate root (`["driver", "graph"]`); the root is empty.
type ModPath = Vec<String>;

/// A path a module names, made absolute. A path that begins with a name of its own
/// (`use op::stream::X` in the crate root) is relative to the module it is written in,
/// when that module has a child module of that name; `child` is that child's path, to be
/// checked once every file is read.
#[derive(Clone, Debug)]
struct Named {
    path: ModPath,
    child: Option<ModPath>,
}

/// One library crate's modules and what each uses.
#[derive(Debug, Default)]
struct Crate {
    /// Every file module, with its file.
    files: BTreeMap<ModPath, PathBuf>,
    /// Re-exports: (module, name) to the path it names.
    reexports: BTreeMap<(ModPath, String), Named>,
    /// Paths each file module names (absolute, `crate::` stripped), with how it wrote them.
    uses: BTreeMap<ModPath, Vec<(Named, String)>>,
    /// The `cudarc::...` paths each file module names.
    ffi: BTreeMap<ModPath, BTreeSet<String>>,
}

/// The module a source file is, from its path under `src/`.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "lib.rs" | "main.rs" | "mod.rs" => {}
        file => parts.push(file.trim_end_matches(".rs").to_string()),
    }
    parts
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Walks one file, knowing which (possibly inline) module each item sits in.
struct Walker<'a> {
    /// The module the code being walked is in: the file's, then inline `mod`s.
    here: ModPath,
    /// The file's own module, to which every edge is charged.
    file: ModPath,
    krate: &'a mut Crate,
}

impl Walker<'_> {
    /// `segments` made absolute from the module being walked, if it may name this crate.
    fn absolute(&self, segments: &[String]) -> Option<Named> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.clone(),
            "super" => {
                let mut b = self.here.clone();
                b.pop();
                b
            }
            _ => {
                let mut path = self.here.clone();
                path.extend(segments.iter().cloned());
                let child = path[..=self.here.len()].to_vec();
                return Some(Named {
                    path,
                    child: Some(child),
                });
            }
        };
        let mut rest = rest;
        while let Some((s, tail)) = rest.split_first() {
            if s != "super" {
                break;
            }
            base.pop();
            rest = tail;
        }
        base.extend(rest.iter().cloned());
        Some(Named {
            path: base,
            child: None,
        })
    }

    fn record(&mut self, segments: Vec<String>, pub_use: bool) {
        if segments.first().is_some_and(|s| s == "cudarc") {
            self.krate
                .ffi
                .entry(self.file.clone())
                .or_default()
                .insert(segments.join("::"));
        }
        let text = segments.join("::");
        let Some(abs) = self.absolute(&segments) else {
            return;
        };
        if pub_use && let Some(name) = abs.path.last() {
            self.krate
                .reexports
                .insert((self.here.clone(), name.clone()), abs.clone());
        }
        self.krate
            .uses
            .entry(self.file.clone())
            .or_default()
            .push((abs, text));
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, pub_use: bool) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, pub_use);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.record(full, pub_use);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                full.push(r.ident.to_string());
                self.record(full.clone(), false);
                if pub_use && let Some(abs) = self.absolute(&full) {
                    self.krate
                        .reexports
                        .insert((self.here.clone(), r.rename.to_string()), abs);
                }
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone(), false),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, pub_use);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.here.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let pub_use = !matches!(u.vis, syn::Visibility::Inherited);
        self.use_tree(&mut Vec::new(), &u.tree, pub_use);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(segments, false);
        syn::visit::visit_path(self, p);
    }
}

impl Crate {
    fn read(src: &Path) -> Result<Crate, String> {
        let mut krate = Crate::default();
        let mut files = Vec::new();
        rust_files(src, &mut files);
        if files.is_empty() {
            return Err(format!("no Rust files under {}", src.display()));
        }
        for path in files {
            let rel = path.strip_prefix(src).unwrap_or(&path);
            // Binaries and build scripts are crates of their own.
            if rel.starts_with("bin") {
                continue;
            }
            let module = module_of(rel);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let file = syn::parse_file(&text).map_err(|e| {
                format!(
                    "parsing {}: {e} (expected a Rust file syn can read)",
                    path.display()
                )
            })?;
            krate.files.insert(module.clone(), path.clone());
            let mut walker = Walker {
                here: module.clone(),
                file: module,
                krate: &mut krate,
            };
            walker.visit_file(&file);
        }
        Ok(krate)
    }

    /// The file module a path lands in, following re-exports (a few hops at most).
    fn resolve(&self, named: &Named) -> Option<ModPath> {
        if let Some(child) = &named.child
            && !self.files.contains_key(child)
        {
            return None;
        }
        let mut path = named.path.clone();
        for _ in 0..8 {
            let module = (0..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|m| self.files.contains_key(m))?;
            if module.len() == path.len() {
                return Some(module);
            }
            let name = &path[module.len()];
            let target = self
                .reexports
                .get(&(module.clone(), name.clone()))
                .filter(|t| t.child.as_ref().is_none_or(|c| self.files.contains_key(c)));
            match target {
                Some(target) if target.path != path[..=module.len()] => {
                    let mut next = target.path.clone();
                    next.extend(path[module.len() + 1..].iter().cloned());
                    path = next;
                }
                _ => return Some(module),
            }
        }
        None
    }

    /// Edges between file modules: (from, to) with one way each was written.
    fn edges(&self) -> BTreeMap<(ModPath, ModPath), String> {
        let mut edges = BTreeMap::new();
        for (from, uses) in &self.uses {
            for (path, text) in uses {
                let Some(to) = self.resolve(path) else {
                    continue;
                };
                // A module naming itself or its own children is its face, not a use.
                if to.starts_with(from) {
                    continue;
                }
                edges
                    .entry((from.clone(), to))
                    .or_insert_with(|| text.clone());
            }
        }
        edges
    }
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".to_string()
    } else {
        m.join("::")
    }
}

/// The import cycles among a crate's modules, each as a readable chain.
fn cycles(edges: &BTreeMap<(ModPath, ModPath), String>) -> Vec<String> {
    let mut next: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    // A module is on a cycle when it reaches itself; report each cycle once, from its
    // smallest module, along a shortest way back.
    let mut found = BTreeSet::new();
    for start in next.keys() {
        let mut back: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*start]);
        let mut closed = None;
        while let Some(m) = queue.pop_front() {
            for &n in next.get(m).into_iter().flatten() {
                if n == *start {
                    closed = Some(m);
                    break;
                }
                if !back.contains_key(n) {
                    back.insert(n, m);
                    queue.push_back(n);
                }
            }
            if closed.is_some() {
                break;
            }
        }
        let Some(mut m) = closed else {
            continue;
        };
        let mut chain = vec![*start];
        let mut rev = vec![m];
        while m != *start {
            m = back[m];
            if m != *start {
                rev.push(m);
            }
        }
        chain.extend(rev.into_iter().rev());
        let smallest = chain.iter().min().copied().unwrap_or(*start);
        if smallest != *start {
            continue;
        }
        let mut text = String::new();
        for (i, m) in chain.iter().enumerate() {
            let to = chain.get(i + 1).copied().unwrap_or(*start);
            let how = &edges[&((*m).clone(), to.clone())];
            let _ = write!(text, "{} -> {} (`{how}`); ", name(m), name(to));
        }
        found.insert(text.trim_end_matches("; ").to_string());
    }
    found.into_iter().collect()
}

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The library crates, by folder.
pub(crate) const LIBRARY_CRATES: &[&str] = &[
    "runtime", "macros", "plan", "picture", "build", "kernels", "testkit", "envs", "deploy",
];

/// The runtime's layers, bottom up: a module's layer is its first segment's.
const RUNTIME_LAYERS: &[&[&str]] = &[
    &["error", "scope"],
    &["driver"],
    &["blas"],
    &["op"],
    &["measure"],
    &["capture"],
];

/// The FFI crates' error types, which the error enum wraps: names, not calls.
const FFI_ERRORS: &[&str] = &["DriverError", "CublasError", "NcclError"];

/// Raw FFI paths and the runtime modules allowed to name them.
const RUNTIME_FFI: &[(&str, &str)] = &[
    ("cudarc::driver::sys", "driver"),
    ("cudarc::driver::result", "driver"),
    ("cudarc::cublaslt::sys", "blas"),
    ("cudarc::cublaslt::result", "blas"),
    ("cudarc::nccl", "op::comm"),
];

fn layer(m: &ModPath) -> Option<usize> {
    let first = m.first()?;
    RUNTIME_LAYERS
        .iter()
        .position(|l| l.contains(&first.as_str()))
}

fn read(folder: &str) -> Crate {
    let src = workspace().join(folder).join("src");
    Crate::read(&src).unwrap_or_else(|e| panic!("{folder}: {e}"))
}

#[test]
fn no_library_crate_has_an_import_cycle() {
    let mut all = Vec::new();
    for folder in LIBRARY_CRATES {
        for cycle in cycles(&read(folder).edges()) {
            all.push(format!("{folder}: {cycle}"));
        }
    }
    assert!(
        all.is_empty(),
        "expected no import cycle between a library crate's modules, found:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_runtime_uses_its_layers_bottom_up() {
    let krate = read("runtime");
    let mut wrong = Vec::new();
    let mut unplaced = BTreeSet::new();
    for m in krate.files.keys().filter(|m| !m.is_empty()) {
        if layer(m).is_none() {
            unplaced.insert(name(m));
        }
    }
    for ((from, to), how) in krate.edges() {
        let (Some(a), Some(b)) = (layer(&from), layer(&to)) else {
            continue;
        };
        if b > a {
            wrong.push(format!(
                "{} (layer {a}) uses {} (layer {b}) through `{how}`",
                name(&from),
                name(&to)
            ));
        }
    }
    assert!(
        unplaced.is_empty(),
        "every runtime module belongs to a layer of RUNTIME_LAYERS; these do not: {unplaced:?}"
    );
    assert!(
        wrong.is_empty(),
        "expected each runtime module to use only its own layer and those below, found:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn raw_ffi_stays_in_its_layer() {
    let mut wrong = Vec::new();
    for folder in LIBRARY_CRATES {
        let krate = read(folder);
        for (module, paths) in &krate.ffi {
            for path in paths {
                let allowed = RUNTIME_FFI
                    .iter()
                    .filter(|(ffi, _)| path.starts_with(ffi))
                    .map(|&(_, home)| home)
                    .collect::<Vec<_>>();
                let error_type = path
                    .rsplit("::")
                    .next()
                    .is_some_and(|last| FFI_ERRORS.contains(&last));
                if allowed.is_empty() || error_type {
                    continue;
                }
                let inside = *folder == "runtime"
                    && allowed.iter().any(|home| name(module).starts_with(home));
                if !inside {
                    wrong.push(format!(
                        "{folder}: `{path}` in {} (allowed only in {})",
                        name(module),
                        allowed.join(", ")
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "expected raw CUDA FFI only in its layer, found:\n{}",
        wrong.join("\n")
    );
}

#[cfg(test)]
mod checks {
    use super::*;

    fn parse(files: &[(&str, &str)]) -> Crate {
        let dir = tempfile::tempdir().expect("a temporary folder");
        for (rel, text) in files {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
            std::fs::write(&path, text).expect("a file");
        }
        Crate::read(dir.path()).expect("a crate")
    }

    #[test]
    fn a_cycle_through_a_reexport_is_found_and_a_face_is_not_a_use() {
        let krate = parse(&[
            ("lib.rs", "mod a; mod b; pub use a::A; pub use b::B;"),
            ("a.rs", "pub struct A; fn f(_: crate::B) {}"),
            (
                "b/mod.rs",
                "mod c; pub use c::C; pub struct B(crate::a::A);",
            ),
            ("b/c.rs", "pub struct C(super::B);"),
        ]);
        let found = cycles(&krate.edges());
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("a -> b (`crate::B`)"), "{found:?}");
        assert!(found[0].contains("b -> a (`crate::a::A`)"), "{found:?}");
    }

    #[test]
    fn a_tree_without_cycles_has_none() {
        let krate = parse(&[
            ("lib.rs", "mod a; mod b; pub use b::B;"),
            (
                "a.rs",
                "pub struct A; #[cfg(test)] mod tests { use super::A; }",
            ),
            ("b.rs", "use crate::a::A; pub struct B(A);"),
        ]);
        assert!(cycles(&krate.edges()).is_empty());
    }

    #[test]
    fn ffi_paths_are_recorded_from_uses_and_expressions() {
        let krate = parse(&[(
            "lib.rs",
            "use cudarc::driver::{sys, result as r}; fn f() { cudarc::nccl::sys::x(); }",
        )]);
        let paths = &krate.ffi[&Vec::new()];
        assert!(paths.contains("cudarc::driver::sys"), "{paths:?}");
        assert!(paths.contains("cudarc::driver::result"), "{paths:?}");
        assert!(paths.contains("cudarc::nccl::sys::x"), "{paths:?}");
    }
}
