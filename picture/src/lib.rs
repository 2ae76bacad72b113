//! Pictures and records of stepgraph steps, with no CUDA: a step's compile-time plan
//! ([`PlanDesc`]) as Graphviz DOT and as SVG; a measured [`Profile`] as an SVG timeline
//! and as a Chrome/Perfetto trace; and the profile [`record`], a JSON document in which a
//! profile measured on a GPU host is saved and drawn again anywhere.
//!
//! - [`plan_dot`], [`plan_svg`], [`render_plan`] and [`print_plan_if_asked`], which
//!   handles an example's `--print-plan dot|svg` ([`PlanFormat`]);
//! - [`timeline_svg`] and [`trace_json`] for a profile;
//! - [`record::to_string`] and [`record::from_str`];
//! - [`curves_svg`] and [`curves_csv`]: learning curves ([`Curves`]), the mean return of
//!   several seeds ([`Series::over_runs`]) against environment steps or wall-clock time;
//! - [`program_dot`] and [`program_svg`]: a training loop ([`Program`]), the steps the
//!   host launches in turn, the device loops among them ([`Repeat::Loop`]) and the
//!   `#[shared]` buffers that link them.
//!
//! Both SVGs come from one renderer: a profile and a plan are each laid out as lanes,
//! bars on an axis and arrows, and only that is drawn. Every output depends only on its
//! input, byte for byte, which the committed documentation images and their up-to-date
//! check rely on. The SVG and DOT are written here (a handful of element kinds with fixed
//! attributes); the trace and the record through serde_json.
//!
//! ```
//! use stepgraph_picture::{record, timeline_svg, trace_json};
//!
//! let text = r#"{"format": "stepgraph-profile", "version": 2, "step": "one",
//!     "device": "test", "streams": ["main"],
//!     "ops": [{"name": "a", "func": "a", "stream": 0, "start_ms": 0, "end_ms": 0.25}],
//!     "waits": [], "critical_path": [0], "total_ms": 0.25}"#;
//! let profile = record::from_str(text)?;
//! assert!(timeline_svg(&profile).contains(">main</text>"));
//! assert!(trace_json(&profile)?.contains(r#""name": "a""#));
//! # Ok::<(), stepgraph_picture::Error>(())
//! ```

mod curve;
mod error;
mod json;
mod plan;
mod program;
pub mod record;
mod timeline;
mod trace;

#[cfg(test)]
mod testing;

pub use curve::{Curves, Point, Series, curves_csv, curves_svg};
pub use error::Error;
pub use plan::{PlanFormat, plan_dot, plan_svg, print_plan_if_asked, render_plan};
pub use program::{Launch, Program, Repeat, program_dot, program_svg};
#[doc(no_inline)]
pub use stepgraph_plan::{OpTiming, PlanDesc, Profile, WaitEdge};
pub use timeline::timeline_svg;
pub use trace::trace_json;
