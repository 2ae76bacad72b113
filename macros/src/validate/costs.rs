//! The costs the planner places by: the step's measured costs file (`costs = "file"`)
//! where it describes this step's ops, else the `#[cost]` hints.
//!
//! A file that cannot be read, does not parse, or was measured for other ops (an op
//! renamed, added or removed since) is never half-used: the planner falls back to the
//! hints and a warning at the file's name says why and how to measure it again.

use std::path::PathBuf;

use stepgraph_plan::OpCosts;
use syn::LitStr;

use super::{Instance, Scope};
use crate::errors::Errors;
use crate::model::Step;
use crate::schedule::Problem;

/// Per op instance, the cost the planner places by, and where it came from.
pub struct Costs {
    /// Measured, per instance in program order (microseconds); `None`: the hints.
    pub measured: Option<Vec<f64>>,
    /// Where the costs came from, for the printed plan.
    pub source: String,
}

impl Costs {
    /// The problem's op costs: the measured ones where there are.
    pub fn apply(&self, problem: &Problem) -> Problem {
        let mut p = problem.clone();
        if let Some(m) = &self.measured {
            for (op, &c) in p.ops.iter_mut().zip(m) {
                op.cost = c;
            }
        }
        p
    }
}

/// The file `costs = ".."` names: from the folder of the step's source file, as
/// `include_str!` reads, or from the crate's root where the compiler did not say.
pub fn path(step: &Step, lit: &LitStr) -> PathBuf {
    let dir = step
        .source_dir
        .clone()
        .or_else(|| std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from));
    dir.unwrap_or_default().join(lit.value())
}

const HINTS: &str = "the ops' #[cost] hints (1.0 where none)";

/// The costs of the step's instances: the file's where it describes them; else the
/// hints, with a warning at the file's name.
pub(super) fn read(scope: &Scope, instances: &[Instance], errors: &Errors) -> Costs {
    let hints = || Costs {
        measured: None,
        source: HINTS.to_string(),
    };
    let Some(lit) = &scope.step.costs else {
        return hints();
    };
    if scope.step.auto.is_none() && scope.step.compare_auto.is_none() {
        errors.at(
            lit.span(),
            "`costs` is what the planner places by, and it places no op of this step: add `auto` to `streams(..)`, or `compare(auto)`, or remove `costs`",
        );
        return hints();
    }
    let file = lit.value();
    let path = path(scope.step, lit);
    let remedy = "it falls back to the #[cost] hints; measure the costs again with `Step::op_costs` and write them to that file";
    let costs = match std::fs::read_to_string(&path) {
        Err(e) => {
            errors.warn(
                lit.span(),
                format!("the costs file `{file}` could not be read ({e}): {remedy}"),
            );
            return hints();
        }
        Ok(text) => match OpCosts::parse(&text) {
            Err(e) => {
                errors.warn(
                    lit.span(),
                    format!("the costs file `{file}` does not parse ({e}): {remedy}"),
                );
                return hints();
            }
            Ok(c) => c,
        },
    };
    let step = scope.step.name.to_string();
    if let Some(stale) = costs.stale(&step, instances.iter().map(|i| i.name.as_str())) {
        errors.warn(
            lit.span(),
            format!("the costs file `{file}` is stale for step `{step}`: {stale}; {remedy}"),
        );
        return hints();
    }
    let measured = instances
        .iter()
        .map(|i| costs.get(&i.name).map_or(0.0, |c| c.alone_us))
        .collect();
    let on = if costs.measured_on.is_empty() {
        String::new()
    } else {
        format!(" on {}", costs.measured_on)
    };
    Costs {
        measured: Some(measured),
        source: format!("the costs measured{on} in `{file}` (microseconds)"),
    }
}
