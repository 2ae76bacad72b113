//! What an op receives by its type rather than by its name: the capture stream, its
//! cuBLASLt handle and the kernels, under a name `#[step]` cannot see (an alias declared
//! outside the step module). The macro passes all three to [`OpContext::pick`] and rustc
//! picks the one the parameter's type asks for.

use crate::blas::Blas;
use crate::op::stream::CaptureStream;

/// One of the three things an op may receive by type, picked out of them.
///
/// `M` is a marker that keeps the three impls apart (were the kernels a `CaptureStream`,
/// two impls would otherwise cover one type); rustc infers it from the parameter's type.
#[diagnostic::on_unimplemented(
    message = "an op cannot receive `{Self}`: it is none of what an op receives",
    label = "not a buffer, a config value, the capture stream, its cuBLASLt handle or the kernels",
    note = "an op receives a buffer named by the parameter or by `#[buf(field)]` (`&T` reads it, `&mut T` writes it), a config value by value, the capture stream (`&CaptureStream<'_>`), its cuBLASLt handle (`&Blas<'_>`), or the declared kernels (`&{K}`)"
)]
pub trait OpContext<'x, K: ?Sized, M>: Sized {
    /// The one of `stream`, `blas` and `kernels` that `Self` is.
    fn pick(stream: &'x CaptureStream<'x>, blas: &'x Blas<'x>, kernels: &'x K) -> Self;
}

/// Picks the capture stream.
#[derive(Debug)]
pub struct ByStream;

/// Picks the stream's cuBLASLt handle.
#[derive(Debug)]
pub struct ByBlas;

/// Picks the kernels.
#[derive(Debug)]
pub struct ByKernels;

impl<'x, K: ?Sized> OpContext<'x, K, ByStream> for &'x CaptureStream<'x> {
    fn pick(stream: &'x CaptureStream<'x>, _: &'x Blas<'x>, _: &'x K) -> Self {
        stream
    }
}

impl<'x, K: ?Sized> OpContext<'x, K, ByBlas> for &'x Blas<'x> {
    fn pick(_: &'x CaptureStream<'x>, blas: &'x Blas<'x>, _: &'x K) -> Self {
        blas
    }
}

impl<'x, K: ?Sized> OpContext<'x, K, ByKernels> for &'x K {
    fn pick(_: &'x CaptureStream<'x>, _: &'x Blas<'x>, kernels: &'x K) -> Self {
        kernels
    }
}
