//! What a step may hold and hand to its ops: device memory in its buffers ([`StepBuffer`])
//! and plain data in its config ([`ConfigValue`]). Both are checked, field by field, where
//! `#[step]` reads the structs, so that nothing an op receives can escape the capture: a
//! host handle through which an op could synchronise, allocate, download or replay another
//! step, or interior mutability through which it could write what its signature says it
//! only reads.

use crate::comm::Communicator;
use crate::flag::DeviceFlag;
use crate::memory::{DeviceBuffer, Span};
use crate::scalars::DeviceScalars;

/// Device memory that a step's ops are handed: the type of every field of a step's
/// `#[buffers]` struct.
///
/// Implemented for [`DeviceBuffer`], [`DeviceScalars`], [`DeviceFlag`], [`Communicator`],
/// cudarc's [`CudaSlice`](cudarc::driver::CudaSlice) (a trainer's existing buffers, and
/// its structs of them, enter a step unchanged) and arrays of step buffers, and derived
/// for a struct whose fields are all step buffers with `#[derive(StepBuffer)]`:
///
/// ```
/// use stepgraph::{DeviceBuffer, StepBuffer};
///
/// /// A linear layer's parameters, passed to ops as one buffer.
/// #[derive(StepBuffer)]
/// pub struct Linear {
///     pub w: DeviceBuffer<f32>,
///     pub b: DeviceBuffer<f32>,
/// }
///
/// #[derive(StepBuffer)]
/// pub struct Heads {
///     pub heads: [Linear; 4],
/// }
/// ```
///
/// A host handle, or a buffer behind interior mutability, is refused where it is named:
///
/// ```compile_fail
/// use std::cell::RefCell;
/// use stepgraph::{DeviceBuffer, StepBuffer};
///
/// #[derive(StepBuffer)]
/// pub struct Sneaky {
///     pub x: RefCell<DeviceBuffer<f32>>, // error: `RefCell<..>` cannot be a buffer of a step
/// }
/// ```
///
/// # Safety
///
/// An implementing type holds only device memory (with the sizes and addresses that
/// describe it) that an op reaches through the `&` or `&mut` its signature states: no host
/// handle (a [`Device`](crate::Device), a stream, a step), nothing through which an op can
/// synchronise, allocate or copy to the host, and no interior mutability. The plan orders
/// the ops by those signatures; a type that breaks this lets work or writes escape it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a buffer of a step",
    label = "not device memory the plan can order",
    note = "a step's buffers are DeviceBuffer<T>, DeviceScalars<T>, DeviceFlag, HostInput<T>, HostOutput<T>, a Communicator, cudarc's CudaSlice<T>, arrays of them, and structs of them that `#[derive(stepgraph::StepBuffer)]`",
    note = "host handles (Device, streams, steps) would let an op synchronise, allocate, download or replay inside the capture, and interior mutability (RefCell, Mutex, Arc) write through `&`; keep them outside the step"
)]
pub unsafe trait StepBuffer {}

// SAFETY: device memory, reached only through the borrow an op is given.
unsafe impl<T> StepBuffer for DeviceBuffer<T> {}

// SAFETY: one u32 of device memory, reached only through the borrow an op is given (and
// by the conditional node of the `#[when]` op that names it, which the plan orders as a
// read).
unsafe impl StepBuffer for DeviceFlag {}

// SAFETY: a device copy and pinned host values that only `set` (with the proof that no
// replay is in flight) writes; an op reaches them through `refresh`, a copy in the graph.
unsafe impl<T> StepBuffer for DeviceScalars<T> {}

// SAFETY: pinned staging slots that an op reaches only through `CaptureStream::stage`,
// a copy in the graph; the host writes a slot only through `Step::fill`, once the replay
// that read it has finished.
unsafe impl<T> StepBuffer for crate::host_io::HostInput<T> {}

// SAFETY: pinned slots that an op reaches only through `CaptureStream::read_back`, a copy
// in the graph; the host reads a slot only through `Step::read_back`, once the replay that
// wrote it has finished.
unsafe impl<T> StepBuffer for crate::host_io::HostOutput<T> {}

// SAFETY: an NCCL communicator, used by an op only to enqueue collectives on its capture
// stream; the plan orders every op that takes it by `&mut`.
unsafe impl StepBuffer for Communicator {}

// SAFETY: device memory, reached only through the borrow an op is given. It also holds
// cudarc's handle to the stream it was made on, the layer below that a migrating trainer's
// existing functions use: work issued on that stream inside an op is not in the graph, and
// the verifier names the op that put nothing into it; a synchronisation invalidates the
// capture, which the op is named for as well. The context's event tracking must be off
// (`Device::from_context` says why), or the slice's events break the capture.
unsafe impl<T> StepBuffer for cudarc::driver::CudaSlice<T> {}

// SAFETY: each element is a step buffer.
unsafe impl<T: StepBuffer, const N: usize> StepBuffer for [T; N] {}

/// Plain data a step's ops take by value: the type of every field of a step's `#[config]`
/// struct. Any `Copy + Send + Sync + 'static` type is one (sizes, coefficients, matmul
/// shapes); a host handle or a cell is not, so an op cannot reach the host through its
/// config either.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a config value of a step",
    label = "not plain data",
    note = "a step's config holds plain data the ops take by value: `Copy + Send + Sync + 'static` types such as sizes, coefficients and matmul shapes",
    note = "host handles (Device, streams, steps, Arc) and cells would let an op reach the host inside the capture; keep them outside the step"
)]
pub trait ConfigValue: Copy + Send + Sync + 'static {}

impl<T: Copy + Send + Sync + 'static> ConfigValue for T {}

/// Compiles only for a [`StepBuffer`]: what `#[step]` and `#[derive(StepBuffer)]` emit for
/// each field, spanned on its type, so that a refused type is reported there.
#[doc(hidden)]
pub const fn assert_buffer<T: StepBuffer + ?Sized>() {}

/// Compiles only for a [`ConfigValue`]; see [`assert_buffer`].
#[doc(hidden)]
pub const fn assert_config<T: ConfigValue>() {}

/// Where a `#[view(of = parent)]` field's views lie: a [`Span`], or with `#[per_branch]`
/// an array of them, one per branch.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a #[view] field",
    label = "not a Span",
    note = "a #[view(of = parent)] field holds where the view lies in `parent`: a stepgraph::Span (Span::new(offset, len), Span::rows, Span::columns), or an array of them with #[per_branch]"
)]
pub trait ViewSpans {
    /// The spans, one per copy (branch).
    fn spans(&self) -> &[Span];
}

impl ViewSpans for Span {
    fn spans(&self) -> &[Span] {
        std::slice::from_ref(self)
    }
}

impl<const N: usize> ViewSpans for [Span; N] {
    fn spans(&self) -> &[Span] {
        self
    }
}

/// Compiles only for [`ViewSpans`]; see [`assert_buffer`].
#[doc(hidden)]
pub const fn assert_view<T: ViewSpans>() {}
