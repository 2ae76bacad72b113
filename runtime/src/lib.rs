//! stepgraph: a training step written as annotated ops, captured as one multi-stream
//! CUDA graph.
//!
//! The [`step`] attribute reads a module that declares a step's buffers, its streams and
//! its ops in program order. Each op's signature says what it reads (`&T`) and writes
//! (`&mut T`); attributes say where it runs (`#[stream(aux_iqn)]`) and where it joins other
//! streams (`#[join(main)]`). At compile time the macro plans the schedule, rejects
//! schedule mistakes with errors at the offending token, and emits a `Step` type that
//! creates its streams, events, per-stream cuBLASLt workspaces and scratch copies once,
//! captures the ops in RELAXED mode, and replays the graph.
//!
//! This crate is the runtime those steps call, over cudarc: [`Device`], [`DeviceBuffer`],
//! [`CaptureStream`] (which has no way to synchronise, allocate or copy to the host),
//! [`Blas`] for cuBLASLt, [`DeviceScalars`], and the graph machinery.
#![doc = include_str!("../../README.md")]

mod blas;
mod comm;
mod device;
mod error;
mod exec;
mod graph;
mod picture;
pub mod plan;
mod profile;
mod scalars;
mod stream;
mod timing;
mod verify;
mod work;

pub use blas::{
    BlasElem, BlasHandle, BlasSession, Epilogue, Matmul, MatmulArgs, Precision, WORKSPACE_BYTES,
};
pub use comm::{CollectiveElem, CommId, Communicator, ReduceOp};
pub use cudarc::driver::{DeviceRepr, LaunchConfig};
pub use device::{
    AllocLike, Device, DeviceBuffer, REQUIRED_COMPUTE_CAPABILITY, check_compute_capability,
    check_libraries, require_library,
};
pub use error::{Error, Result};
pub use exec::{Executor, GRAPH_DOT, Issue, MAX_PROFILE_REPLAYS, PRIORITY_OVERRIDE, Schedule};
pub use graph::{Graph, NodeCounts, Refresh};
pub use picture::PlanFormat;
pub use plan::PlanDesc;
pub use profile::{OpTiming, Profile, WaitEdge};
pub use scalars::{DeviceScalars, HostAccess};
pub use stepgraph_macros::step;
pub use stream::{Blas, CaptureStream, Kernel, Launch, Mode, Module};
pub use timing::median;
pub use verify::{OpCounts, VerifyReport};
pub use work::{KernelWork, OpWork, WorkBound, grid_share, wave_share};

/// What generated code calls. Hidden and versioned: a macro expansion from another
/// version of stepgraph fails to resolve it instead of calling the wrong shapes.
#[doc(hidden)]
pub mod __rt_v1 {
    pub use crate::device::{AllocLike, Device, DeviceBuffer};
    pub use crate::error::{Error, Result};
    pub use crate::exec::{Executor, Issue, Schedule};
    pub use crate::plan::*;
    pub use crate::profile::Profile;
    pub use crate::scalars::HostAccess;
    pub use crate::stream::{Blas, CaptureStream};
    pub use crate::verify::VerifyReport;
    pub use crate::work::WorkBound;
    pub use cudarc::driver::DeviceRepr;

    /// Allocates `count` more copies shaped like `first` (per-stream or per-branch
    /// scratch), naming each in an out-of-memory error.
    pub fn scratch_copies<T: AllocLike>(
        first: &T,
        device: &Device,
        buffer: &'static str,
        count: usize,
    ) -> Result<Vec<T>> {
        (1..=count)
            .map(|i| first.alloc_like(device, &format!("scratch copy {i} of `{buffer}`")))
            .collect()
    }
}
