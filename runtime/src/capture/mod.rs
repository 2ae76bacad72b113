//! Capture and replay: the executor that issues a plan's ops in dry, capture and eager
//! passes and replays the graph ([`executor`]), the `Step` users hold ([`step`]), its
//! options ([`options`]), the check of a captured graph against its plan ([`verify`]),
//! and the capture guard ([`guard`]). The top layer: it uses every other.

pub(crate) mod executor;
pub(crate) mod guard;
pub(crate) mod options;
pub(crate) mod step;
pub(crate) mod verify;
