//! What a step may hold and hand to its ops: device memory in its buffers ([`StepBuffer`])
//! and plain data in its config ([`ConfigValue`]). Both are checked, field by field, where
//! `#[step]` and the two derives read the structs, so that nothing an op receives can
//! escape the capture: a host handle through which an op could synchronise, allocate,
//! download or replay another step, a reference through which it could read or change
//! host state that the graph's replays never see, or interior mutability through which it
//! could write what its signature says it only reads.

use core::marker::PhantomData;
use core::num::{
    NonZeroI8, NonZeroI16, NonZeroI32, NonZeroI64, NonZeroI128, NonZeroIsize, NonZeroU8,
    NonZeroU16, NonZeroU32, NonZeroU64, NonZeroU128, NonZeroUsize,
};
use core::time::Duration;

use cudarc::driver::LaunchConfig;

use crate::blas::{Epilogue, Matmul, Precision, SmTarget};
use crate::driver::memory::{DeviceBuffer, Span};
use crate::op::comm::{Communicator, ReduceOp};
use crate::op::flag::DeviceFlag;
use crate::op::scalars::DeviceScalars;

/// Device memory that a step's ops are handed: the type of every field of a step's
/// `#[buffers]` struct.
///
/// Implemented for [`DeviceBuffer`], [`DeviceScalars`], [`DeviceFlag`],
/// [`HostInput`](crate::HostInput), [`HostOutput`](crate::HostOutput), [`Communicator`],
/// cudarc's [`CudaSlice`](cudarc::driver::CudaSlice) (a trainer's existing buffers, and
/// its structs of them, enter a step unchanged) and arrays of step buffers. A struct of
/// them derives it with `#[derive(StepBuffer)]`; its other fields may be plain data that
/// describes the buffers (sizes and shapes: any [`ConfigValue`]). Each field is checked
/// where it is written:
///
/// ```
/// use stepgraph::{DeviceBuffer, StepBuffer};
///
/// /// A linear layer's parameters, passed to ops as one buffer.
/// #[derive(StepBuffer)]
/// pub struct Linear {
///     pub w: DeviceBuffer<f32>,
///     pub b: DeviceBuffer<f32>,
///     /// `[out, in]`: the shape of `w`.
///     pub shape: [usize; 2],
/// }
///
/// #[derive(StepBuffer)]
/// pub struct Heads {
///     pub heads: [Linear; 4],
///     /// Samples per head.
///     pub batch: usize,
/// }
/// ```
///
/// The derive takes one attribute, `#[step_buffer(crate = path)]` on the struct, for a
/// crate that re-exports stepgraph: the impl then names the runtime through `path`. Its
/// fields take none. In a generic struct, a field whose type names a parameter is bounded
/// as a step buffer where the struct is used; the others are checked where they are
/// written.
///
/// A host handle, or a buffer behind interior mutability, is refused where it is named:
///
/// ```compile_fail,E0277
/// use std::cell::RefCell;
/// use stepgraph::{DeviceBuffer, StepBuffer};
///
/// #[derive(StepBuffer)]
/// pub struct Sneaky {
///     pub x: RefCell<DeviceBuffer<f32>>, // error: `RefCell<..>` cannot be a field of a struct of step buffers
/// }
/// ```
///
/// # Safety
///
/// An implementing type holds only device memory, and plain data that describes it (sizes,
/// shapes, addresses), that an op reaches through the `&` or `&mut` its signature states:
/// no host handle (a [`Device`](crate::Device), a stream, a step), nothing through which an
/// op can synchronise, allocate or copy to the host, and no interior mutability. The plan
/// orders the ops by those signatures; a type that breaks this lets work or writes escape
/// it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a buffer of a step",
    label = "not device memory the plan can order",
    note = "a step's buffers are DeviceBuffer<T>, DeviceScalars<T>, DeviceFlag, HostInput<T>, HostOutput<T>, a Communicator, cudarc's CudaSlice<T>, arrays of them, and structs of them that `#[derive(stepgraph::StepBuffer)]`",
    note = "if `{Self}` is a struct of buffers, add `#[derive(stepgraph::StepBuffer)]` to it",
    note = "host handles (Device, streams, steps) would let an op synchronise, allocate, download or replay inside the capture, and interior mutability (RefCell, Mutex, Arc) write through `&`; keep them outside the step",
    note = "a buffer that other steps use too is a `stepgraph::Shared<T>` field marked `#[shared]`"
)]
pub unsafe trait StepBuffer {
    /// Pushes where the device memory an op reaches through this value lies, as
    /// `(address, bytes)` spans, and says whether it could tell (a hand-written impl that
    /// does not is taken as unknown): what holds an op to the buffers its `&mut`
    /// parameters grant, and finds a buffer swapped inside an op.
    #[doc(hidden)]
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        let _ = spans;
        false
    }
}

/// The span of device memory `mem` covers.
fn span_of<T>(mem: &impl crate::DeviceMem<T>) -> (u64, usize) {
    (mem.device_address(), mem.len() * size_of::<T>())
}

// SAFETY: device memory, reached only through the borrow an op is given.
unsafe impl<T> StepBuffer for DeviceBuffer<T> {
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        spans.push(span_of(self));
        true
    }
}

// SAFETY: one u32 of device memory, reached only through the borrow an op is given (and
// by the conditional node of the `#[when]` op that names it, which the plan orders as a
// read).
unsafe impl StepBuffer for DeviceFlag {
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        spans.push(span_of(self));
        true
    }
}

// SAFETY: a device copy and pinned host values that only `set` (with the proof that no
// replay is in flight) writes; an op reaches them through `refresh`, a copy in the graph.
unsafe impl<T> StepBuffer for DeviceScalars<T> {
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        spans.push(span_of(self.device_copy()));
        true
    }
}

// SAFETY: pinned staging slots that an op reaches only through `CaptureStream::stage`,
// a copy in the graph; the host writes a slot only through `Step::fill`, once the replay
// that read it has finished.
unsafe impl<T> StepBuffer for crate::op::host_io::HostInput<T> {
    fn __regions(&self, _: &mut Vec<(u64, usize)>) -> bool {
        true
    }
}

// SAFETY: pinned slots that an op reaches only through `CaptureStream::read_back`, a copy
// in the graph; the host reads a slot only through `Step::read_back`, once the replay that
// wrote it has finished.
unsafe impl<T> StepBuffer for crate::op::host_io::HostOutput<T> {
    fn __regions(&self, _: &mut Vec<(u64, usize)>) -> bool {
        true
    }
}

// SAFETY: an NCCL communicator, used by an op only to enqueue collectives on its capture
// stream; the plan orders every op that takes it by `&mut`.
unsafe impl StepBuffer for Communicator {
    fn __regions(&self, _: &mut Vec<(u64, usize)>) -> bool {
        true
    }
}

// SAFETY: device memory, reached only through the borrow an op is given. It also holds
// cudarc's handle to the stream it was made on, the layer below that a migrating trainer's
// existing functions use: work issued on that stream inside an op is not in the graph, and
// the verifier names the op that put nothing into it; a synchronisation invalidates the
// capture, which the op is named for as well. The context's event tracking must be off
// (`Device::from_context` says why), or the slice's events break the capture.
unsafe impl<T> StepBuffer for cudarc::driver::CudaSlice<T> {
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        spans.push(span_of(self));
        true
    }
}

// SAFETY: each element is a step buffer.
unsafe impl<T: StepBuffer, const N: usize> StepBuffer for [T; N] {
    fn __regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        // Every element's spans, also after one that could not tell.
        let mut known = true;
        for e in self {
            known &= e.__regions(spans);
        }
        known
    }
}

/// Plain data a step's ops take by value: the type of every field of a step's `#[config]`
/// struct, and of the sizes and shapes in a `#[derive(StepBuffer)]` struct.
///
/// Implemented for the primitive numbers, `bool`, `char`, `()`, `&'static str` (text that
/// nothing can change), the [`NonZero`](core::num::NonZero) integers,
/// [`Duration`](core::time::Duration), [`f16`](half::f16) and [`bf16`](half::bf16); for
/// [`Option`]s, arrays, tuples (up to 12 elements) and
/// [`PhantomData`](core::marker::PhantomData) of config values; and for the runtime's
/// descriptions of work: [`Matmul`], [`Precision`], [`Epilogue`], [`SmTarget`], [`Span`],
/// [`ReduceOp`] and [`LaunchConfig`]. A struct or enum of config values derives it with
/// `#[derive(ConfigValue)]` (beside `Clone` and `Copy`, which it requires), each field
/// checked where it is written:
///
/// ```
/// use stepgraph::{CaptureStream, ConfigValue, DeviceBuffer, Matmul, Result};
///
/// /// The model's sizes.
/// #[derive(Clone, Copy, ConfigValue)]
/// pub struct Sizes {
///     pub batch: usize,
///     pub hidden: usize,
/// }
///
/// /// The head's activation.
/// #[derive(Clone, Copy, ConfigValue)]
/// pub enum Activation {
///     Relu,
///     LeakyRelu { slope: f32 },
/// }
///
/// #[stepgraph::step(streams(main))]
/// mod net {
///     use super::*;
///
///     #[buffers]
///     pub struct Buffers {
///         pub x: DeviceBuffer<f32>,
///     }
///
///     #[config]
///     pub struct Config {
///         pub sizes: Sizes,
///         pub activation: Activation,
///         pub fc: Matmul,
///         pub label: &'static str,
///     }
///
///     fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>, sizes: Sizes) -> Result<()> {
///         assert_eq!(x.len(), sizes.batch * sizes.hidden);
///         s.memset_zeros(x)
///     }
/// }
/// # fn main() {}
/// ```
///
/// The derive takes one attribute, `#[config_value(crate = path)]` on the struct or enum,
/// for a crate that re-exports stepgraph; its fields and variants take none. In a generic
/// type, a field whose type names a parameter is bounded as a config value where the type
/// is used; the others are checked where they are written.
///
/// A reference to anything that can change is refused where it is named: an op that
/// counted its calls through a `&'static AtomicU32` would count once, when the step is
/// captured, and never while the graph replays.
///
/// ```compile_fail,E0277
/// use std::sync::atomic::AtomicU32;
/// use stepgraph::{CaptureStream, DeviceBuffer, Result};
///
/// #[stepgraph::step(streams(main))]
/// mod counted {
///     use super::*;
///
///     #[buffers]
///     pub struct Buffers {
///         pub x: DeviceBuffer<f32>,
///     }
///
///     #[config]
///     pub struct Config {
///         pub calls: &'static AtomicU32, // error: `&'static AtomicU32` cannot be a config value of a step
///     }
///
///     fn clear(s: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(x)
///     }
/// }
/// # fn main() {}
/// ```
///
/// # Safety
///
/// An implementing type is plain data: no reference to, pointer to or handle of anything
/// that can change or that lives on the host (a [`Device`](crate::Device), a stream, a
/// step, an `Arc`, a file), no interior mutability (cells, atomics, locks), and nothing else
/// through which an op could reach the host. Ops read their config while the step is
/// captured, and the graph replays what they issued then: state an op could read or change
/// through a config value would be read or changed at capture time only.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a config value of a step",
    label = "not plain data",
    note = "a step's config holds plain data the ops take by value: numbers, bool, char, &'static str, Duration, f16, bf16, Option, arrays and tuples of them, and stepgraph's Matmul, Precision, Epilogue, SmTarget, Span, ReduceOp and LaunchConfig",
    note = "if `{Self}` is a struct or enum of config values, add `#[derive(stepgraph::ConfigValue)]` to it",
    note = "references, raw pointers, atomics, cells, locks and host handles (Device, streams, steps, Arc) are refused: through them an op would read or change host state at capture time only, and the graph would replay without it"
)]
pub unsafe trait ConfigValue: Copy + 'static {}

/// Implements [`ConfigValue`] for types without parameters; each invocation says why it
/// holds for its types.
macro_rules! config_values {
    ($($t:ty),+ $(,)?) => {$(
        // SAFETY: see the invocation.
        unsafe impl ConfigValue for $t {}
    )+};
}

// SAFETY: numbers, a truth value, a character, nothing at all.
config_values!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize
);
config_values!(f32, f64, bool, char, ());
// SAFETY: numbers.
config_values!(
    NonZeroU8,
    NonZeroU16,
    NonZeroU32,
    NonZeroU64,
    NonZeroU128,
    NonZeroUsize
);
config_values!(
    NonZeroI8,
    NonZeroI16,
    NonZeroI32,
    NonZeroI64,
    NonZeroI128,
    NonZeroIsize
);
config_values!(Duration, half::f16, half::bf16);
// SAFETY: text that nothing can change, for as long as the program runs.
config_values!(&'static str);
// SAFETY: a matmul's shape, layouts and options (sizes, flags, enums of numbers); where a
// view lies (two offsets); which reduction a collective applies; a launch's grid, block
// and shared memory sizes.
config_values!(
    Matmul,
    Precision,
    Epilogue,
    SmTarget,
    Span,
    ReduceOp,
    LaunchConfig
);

// SAFETY: a config value, or none.
unsafe impl<T: ConfigValue> ConfigValue for Option<T> {}

// SAFETY: each element is a config value.
unsafe impl<T: ConfigValue, const N: usize> ConfigValue for [T; N] {}

// SAFETY: holds no value at all, whatever it names.
unsafe impl<T: ?Sized + 'static> ConfigValue for PhantomData<T> {}

/// Implements [`ConfigValue`] for tuples of config values, one impl per length. Kept out
/// of the types an error suggests, which they would fill with `(A, B)`, `(A, B, C)` and so
/// on; a tuple with an element that is no config value is reported as a whole.
macro_rules! config_value_tuples {
    ($(($($t:ident),+))+) => {$(
        // SAFETY: each element is a config value.
        #[diagnostic::do_not_recommend]
        unsafe impl<$($t: ConfigValue),+> ConfigValue for ($($t,)+) {}
    )+};
}

config_value_tuples! {
    (A)
    (A, B)
    (A, B, C)
    (A, B, C, D)
    (A, B, C, D, E)
    (A, B, C, D, E, F)
    (A, B, C, D, E, F, G)
    (A, B, C, D, E, F, G, H)
    (A, B, C, D, E, F, G, H, I)
    (A, B, C, D, E, F, G, H, I, J)
    (A, B, C, D, E, F, G, H, I, J, K)
    (A, B, C, D, E, F, G, H, I, J, K, L)
}

/// What a field of a `#[derive(StepBuffer)]` struct may be: a step buffer (its role
/// [`AsBuffer`]) or plain data that describes the buffers (its role [`AsPlainData`]). One
/// impl per role, so that rustc infers a field's role from its type, and refuses a type of
/// neither with one message.
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a field of a struct of step buffers",
    label = "neither a step buffer nor plain data",
    note = "a field of a `#[derive(StepBuffer)]` struct is a step buffer (DeviceBuffer<T>, DeviceScalars<T>, DeviceFlag, HostInput<T>, HostOutput<T>, a Communicator, cudarc's CudaSlice<T>, an array of them, a struct that derives StepBuffer) or plain data that describes them (a size or a shape: any ConfigValue)",
    note = "if `{Self}` is a struct of buffers, add `#[derive(stepgraph::StepBuffer)]` to it; if it is a struct of sizes, `#[derive(stepgraph::ConfigValue)]`",
    note = "host handles (Device, streams, steps) would let an op synchronise, allocate, download or replay inside the capture, and interior mutability (RefCell, Mutex, Arc) write through `&`; keep them outside the step"
)]
pub trait BufferField<Role> {
    /// [`StepBuffer::__regions`] of a step buffer; nothing for plain data.
    fn __field_regions(&self, spans: &mut Vec<(u64, usize)>) -> bool;
}

/// The role of a [`BufferField`] that is a step buffer.
#[doc(hidden)]
#[derive(Debug)]
pub enum AsBuffer {}

/// The role of a [`BufferField`] that is plain data.
#[doc(hidden)]
#[derive(Debug)]
pub enum AsPlainData {}

impl<T: StepBuffer + ?Sized> BufferField<AsBuffer> for T {
    fn __field_regions(&self, spans: &mut Vec<(u64, usize)>) -> bool {
        self.__regions(spans)
    }
}

impl<T: ConfigValue> BufferField<AsPlainData> for T {
    fn __field_regions(&self, _: &mut Vec<(u64, usize)>) -> bool {
        true
    }
}

/// Compiles only for a [`StepBuffer`]: what `#[step]` emits for each field of the step's
/// buffers, spanned on its type, so that a refused type is reported there.
#[doc(hidden)]
pub const fn assert_buffer<T: StepBuffer + ?Sized>() {}

/// [`BufferField::__field_regions`] of a field, which compiles only for a [`BufferField`]
/// of either role, which rustc infers: what `#[derive(StepBuffer)]` emits for each field,
/// spanned on its type, so that a refused type is reported there.
#[doc(hidden)]
pub fn field_regions<T: BufferField<Role> + ?Sized, Role>(
    field: &T,
    spans: &mut Vec<(u64, usize)>,
) -> bool {
    field.__field_regions(spans)
}

/// Compiles only for a [`ConfigValue`]: what `#[step]` and `#[derive(ConfigValue)]` emit
/// for each field; see [`assert_buffer`].
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
