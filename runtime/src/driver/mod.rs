//! The driver layer: the only part of the crate that calls the CUDA driver's raw API
//! (`cudarc::driver::sys` and `result`). Every layer above goes through the functions
//! and RAII types here, each of which returns a [`Result`](crate::Result) and says what
//! it needs of its caller.
//!
//! - [`device`]: the device, its context and streams, allocation and host transfers.
//! - [`memory`]: device buffers and their views.
//! - [`module`]: loaded kernel modules and their parameters.
//! - [`graph`]: captures, graphs and their nodes.
//! - [`event`]: events for timing.
//! - [`transfer`]: copies and memsets on a stream, and pinned host memory.

pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod memory;
pub(crate) mod module;
pub(crate) mod transfer;
