//! The build script's side of Cargo: the environment it reads, and the `cargo::`
//! directives it prints. Every variable read through [`Cargo::var`] gets its
//! `rerun-if-env-changed`; tests pass the variables in rather than setting them
//! process-wide.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::Path;

#[derive(Debug)]
pub(crate) struct Cargo<'a> {
    /// `None`: the process environment.
    vars: Option<&'a BTreeMap<String, OsString>>,
    directives: RefCell<Vec<String>>,
    seen: RefCell<BTreeSet<String>>,
}

impl<'a> Cargo<'a> {
    pub fn from_process() -> Cargo<'static> {
        Cargo {
            vars: None,
            directives: RefCell::default(),
            seen: RefCell::default(),
        }
    }

    #[cfg(test)]
    pub fn with_vars(vars: &'a BTreeMap<String, OsString>) -> Cargo<'a> {
        Cargo {
            vars: Some(vars),
            directives: RefCell::default(),
            seen: RefCell::default(),
        }
    }

    /// A variable the user sets: reading it makes a change to it rerun the build script.
    pub fn var(&self, key: &str) -> Option<OsString> {
        self.once(format!("cargo::rerun-if-env-changed={key}"));
        self.cargo_var(key)
    }

    /// A variable Cargo sets for build scripts (`OUT_DIR`, `NUM_JOBS`, `CARGO_CFG_*`).
    pub fn cargo_var(&self, key: &str) -> Option<OsString> {
        match self.vars {
            Some(vars) => vars.get(key).cloned(),
            None => std::env::var_os(key),
        }
    }

    /// Every variable whose name starts with `prefix` and ends with `suffix`, sorted by
    /// name (they are set by Cargo: no rerun directive needed).
    pub fn vars_matching(&self, prefix: &str, suffix: &str) -> Vec<(String, OsString)> {
        let all: Vec<(String, OsString)> = match self.vars {
            Some(vars) => vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
                .collect(),
        };
        let mut out: Vec<(String, OsString)> = all
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix) && k.ends_with(suffix))
            .collect();
        out.sort();
        out
    }

    pub fn rerun_if_changed(&self, path: &Path) {
        self.once(format!("cargo::rerun-if-changed={}", path.display()));
    }

    pub fn warning(&self, message: &str) {
        for line in message.lines() {
            self.directives
                .borrow_mut()
                .push(format!("cargo::warning={line}"));
        }
    }

    pub fn metadata(&self, key: &str, value: &str) {
        self.once(format!("cargo::metadata={key}={value}"));
    }

    fn once(&self, directive: String) {
        if self.seen.borrow_mut().insert(directive.clone()) {
            self.directives.borrow_mut().push(directive);
        }
    }

    /// What to print, in order.
    pub fn directives(&self) -> Vec<String> {
        self.directives.borrow().clone()
    }
}
