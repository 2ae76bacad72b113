//! Device memory an op hands to the GPU: whole buffers and views into them, and the two
//! traits that every kernel argument, copy, memset and matmul takes, so that a view goes
//! wherever a buffer does.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ops::{Bound, RangeBounds};

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, LaunchArgs};
use cudarc::driver::{DeviceRepr, DeviceSlice, PushKernelArg};

use crate::error::{Error, Result};

pub(crate) mod sealed {
    /// Only this crate's memory types: the plan's orderings and the length checks of
    /// every call rely on the address and length they report.
    pub trait Sealed {}
}

/// Device memory a kernel, copy or matmul reads: a [`DeviceBuffer`], a [`View`] or a
/// [`ViewMut`] of one, or cudarc's own `CudaSlice` or `CudaView`. Sealed: the address and
/// length are the memory's own.
///
/// ```no_run
/// use stepgraph::{CaptureStream, DeviceMem, DeviceMemMut, Result};
///
/// /// A helper over any memory: whole buffers, views, a trainer's `CudaSlice`s.
/// fn zero_tail<T: stepgraph::DeviceRepr + stepgraph::cudarc::driver::ValidAsZeroBits>(
///     s: &CaptureStream<'_>,
///     src: &impl DeviceMem<T>,
///     dst: &mut impl DeviceMemMut<T>,
/// ) -> Result<()> {
///     assert!(src.len() <= dst.len());
///     s.memset_zeros(dst)
/// }
/// ```
pub trait DeviceMem<T>: sealed::Sealed {
    /// Number of elements.
    fn len(&self) -> usize;

    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address of the first element. Using it does not borrow the memory:
    /// whoever passes it on keeps the memory alive and ordered.
    fn device_address(&self) -> u64;

    /// Pushes the address as a kernel argument that lives as long as the borrow.
    #[doc(hidden)]
    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>);
}

/// Device memory a kernel, copy or matmul writes: a [`DeviceBuffer`] or a [`ViewMut`],
/// taken `&mut`.
pub trait DeviceMemMut<T>: DeviceMem<T> {
    /// Pushes the address as a kernel argument the kernel writes through.
    #[doc(hidden)]
    fn push_arg_mut<'b>(&'b mut self, args: &mut LaunchArgs<'b>);
}

/// Elements `start..end` of a buffer: where a view lies in it.
///
/// A field of a step's buffers marked `#[view(of = parent)]` holds one (or an array of
/// them, one per branch): the op that names the field receives a [`View`] or a
/// [`ViewMut`] of `parent` over these elements, and the planner orders it against the
/// ops that use `parent` or an overlapping view of it, and not against the others.
///
/// ```
/// use stepgraph::Span;
///
/// // Branch 2's rows of a [4 × 256, 64] allocation.
/// let rows = Span::rows(2 * 256, 256, 64);
/// assert_eq!((rows.start(), rows.end(), rows.len()), (32768, 49152, 16384));
/// // Columns 18..530 of a [64, 530] matrix: every element from the block's first to its
/// // last (a matmul reads it with leading dimension 530).
/// let cols = Span::columns(64, 530, 18, 512);
/// assert_eq!((cols.start(), cols.len()), (18, 63 * 530 + 512));
/// assert!(rows.overlaps(&Span::new(40000, 1)));
/// assert!(!rows.overlaps(&Span::new(0, 32768)));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    start: usize,
    end: usize,
}

impl Span {
    /// `len` elements from `offset` (saturating: a span past `usize::MAX` fits no buffer,
    /// so the bounds check refuses it instead of the sum wrapping).
    pub const fn new(offset: usize, len: usize) -> Span {
        Span {
            start: offset,
            end: offset.saturating_add(len),
        }
    }

    /// `rows` rows of `row_len` elements from row `first` of a row-major matrix.
    pub const fn rows(first: usize, rows: usize, row_len: usize) -> Span {
        Span::new(first.saturating_mul(row_len), rows.saturating_mul(row_len))
    }

    /// Columns `first..first + cols` of `rows` rows of a row-major matrix whose rows are
    /// `ld` elements apart: every element from the block's first to its last, the columns
    /// outside the block in between included (a strided read covers them).
    pub const fn columns(rows: usize, ld: usize, first: usize, cols: usize) -> Span {
        if rows == 0 || cols == 0 {
            return Span::new(first, 0);
        }
        Span::new(first, (rows - 1).saturating_mul(ld).saturating_add(cols))
    }

    /// The first element.
    pub const fn start(&self) -> usize {
        self.start
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.end
    }

    /// Number of elements.
    pub const fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether it covers no element.
    pub const fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Whether the two share an element (empty spans share none).
    pub const fn overlaps(&self, other: &Span) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }

    /// The span `range` denotes in a buffer of `len` elements, or an error naming `what`.
    pub(crate) fn of(range: impl RangeBounds<usize>, len: usize, what: &str) -> Result<Span> {
        let start = match range.start_bound() {
            Bound::Included(&s) => Some(s),
            Bound::Excluded(&s) => s.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1),
            Bound::Excluded(&e) => Some(e),
            Bound::Unbounded => Some(len),
        };
        match (start, end) {
            (Some(start), Some(end)) if start <= end && end <= len => Ok(Span { start, end }),
            (start, end) => Err(Error::OutOfBounds {
                what: what.to_string(),
                start: start.unwrap_or(usize::MAX),
                end: end.unwrap_or(usize::MAX),
                len,
            }),
        }
    }
}

impl RangeBounds<usize> for Span {
    fn start_bound(&self) -> Bound<&usize> {
        Bound::Included(&self.start)
    }

    fn end_bound(&self) -> Bound<&usize> {
        Bound::Excluded(&self.end)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// A typed allocation in device memory.
///
/// It has no method that touches the host: copies to and from the host go through
/// [`Device::upload`](crate::Device::upload) and [`Device::download`](crate::Device::download), which an op never receives. An op gets
/// `&DeviceBuffer` (read) or `&mut DeviceBuffer` (write) and hands it, or a [`View`] of
/// it, to a kernel launch, a matmul, a copy or a memset on its
/// [`CaptureStream`](crate::CaptureStream).
///
/// It is a cudarc [`CudaSlice`] underneath, and converts both ways
/// ([`from_cuda_slice`](DeviceBuffer::from_cuda_slice),
/// [`into_cuda_slice`](DeviceBuffer::into_cuda_slice),
/// [`as_cuda_slice`](DeviceBuffer::as_cuda_slice)), so that existing cudarc code takes it
/// unchanged. Inside an op the slice is reached only through `unsafe`
/// ([`cuda_slice`](DeviceBuffer::cuda_slice)): it carries cudarc's stream and context, a
/// route out of the capture.
///
/// Dropped while an op is being issued (a buffer an op's kernels type held), it is not
/// freed until the capture has ended, and the op fails with
/// [`Error::HostCallInOp`]: a free inside a capture leaves the graph an address that is
/// gone at the next replay.
pub struct DeviceBuffer<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.slice.len())
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: `slice` is not used again: this is the value's last use.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        crate::scope::free(slice);
    }
}

impl<T> DeviceBuffer<T> {
    pub(crate) fn wrap(slice: CudaSlice<T>) -> DeviceBuffer<T> {
        DeviceBuffer {
            slice: ManuallyDrop::new(slice),
        }
    }

    /// The cudarc allocation, for existing code that takes `&CudaSlice<T>`: outside an
    /// op (building buffers, host code between replays).
    ///
    /// Fails with [`Error::HostCallInOp`] while an op is being issued: a `CudaSlice` hands
    /// out cudarc's stream and context, through which code could synchronise, copy to the
    /// host, clone the allocation or issue work off the capture stream, all of which
    /// escape the capture. Inside an op, [`cuda_slice`](Self::cuda_slice) gives it under
    /// a written contract.
    pub fn as_cuda_slice(&self) -> Result<&CudaSlice<T>> {
        crate::scope::check("DeviceBuffer::as_cuda_slice")?;
        Ok(&self.slice)
    }

    /// The cudarc allocation, for existing code that takes `&mut CudaSlice<T>`: outside
    /// an op. Fails while an op is being issued, as
    /// [`as_cuda_slice`](Self::as_cuda_slice) does; inside an op,
    /// [`cuda_slice_mut`](Self::cuda_slice_mut).
    ///
    /// Replacing the slice (`*buf.as_cuda_slice_mut()? = other`) rebinds the buffer: a
    /// step's buffers are rebound only through [`Step::rebind`](crate::Step::rebind),
    /// which captures again.
    pub fn as_cuda_slice_mut(&mut self) -> Result<&mut CudaSlice<T>> {
        crate::scope::check("DeviceBuffer::as_cuda_slice_mut")?;
        Ok(&mut self.slice)
    }

    /// The cudarc allocation inside an op, for an existing function that takes
    /// `&CudaSlice<T>` and issues its work on the stream of
    /// [`CaptureStream::cuda_stream`](crate::CaptureStream::cuda_stream).
    ///
    /// # Safety
    ///
    /// The slice carries cudarc's stream and context, which are not the capture's. The
    /// caller, and the code it hands the slice to:
    /// - issues work on the slice only on the op's capture stream (`cuda_stream()`'s
    ///   contract applies), never on the slice's own stream or the context's default
    ///   stream: such work runs once, while the step is captured, and never in a replay;
    /// - does not synchronise the slice's stream or context, copy the slice to or from the
    ///   host, clone it, or free it (each escapes the capture or leaves the graph an
    ///   address that is gone at the next replay);
    /// - only reads the memory (this is a shared borrow of the op's parameter).
    ///
    /// The capture guard ([`Options::capture_guard`](crate::Options::capture_guard))
    /// refuses, naming the op, the CUDA calls that break the first two points.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use stepgraph::cudarc::driver::{CudaSlice, CudaStream, DriverError};
    /// use stepgraph::{CaptureStream, DeviceBuffer, Error, Result};
    ///
    /// // An existing function of a cudarc trainer, unchanged.
    /// fn copy(s: &Arc<CudaStream>, a: &CudaSlice<f32>, b: &mut CudaSlice<f32>) -> Result<(), DriverError> {
    ///     s.memcpy_dtod(a, b)
    /// }
    ///
    /// fn op(s: &CaptureStream<'_>, a: &DeviceBuffer<f32>, b: &mut DeviceBuffer<f32>) -> Result<()> {
    ///     // SAFETY: `copy` issues one copy on the stream it is given, the capture stream,
    ///     // from `a` (read) into `b` (written), and nothing else.
    ///     unsafe {
    ///         if let Some(stream) = s.cuda_stream() {
    ///             copy(stream, a.cuda_slice(), b.cuda_slice_mut()).map_err(Error::driver("copy"))?;
    ///         }
    ///     }
    ///     Ok(())
    /// }
    /// ```
    pub unsafe fn cuda_slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The cudarc allocation inside an op, for an existing function that takes
    /// `&mut CudaSlice<T>`.
    ///
    /// # Safety
    ///
    /// As for [`cuda_slice`](Self::cuda_slice), and the slice is written in place, never
    /// replaced: the graph keeps the address it was captured with.
    pub unsafe fn cuda_slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// The allocation, for the runtime's own use.
    pub(crate) fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The allocation, for the runtime's own use.
    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// Gives the cudarc allocation back.
    pub fn into_cuda_slice(self) -> CudaSlice<T> {
        let mut me = ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the slice is taken out exactly once.
        unsafe { ManuallyDrop::take(&mut me.slice) }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The raw device address, for kernels that take pointers packed in structs and for
    /// identity checks in tests. Using it does not borrow the buffer: the caller keeps the
    /// buffer alive and ordered.
    pub fn device_address(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(self.slice.stream());
        ptr
    }

    /// A view of elements `range` (`a..b`, `a..`, `..`, a [`Span`]), read-only.
    ///
    /// ```no_run
    /// # let device = stepgraph::Device::new(0)?;
    /// let x = device.upload_new("x", &[1.0f32, 2.0, 3.0, 4.0, 5.0])?;
    /// let tail = x.view(1..)?;
    /// assert_eq!(tail.len(), 4);
    /// assert_eq!(tail.offset(), 1);
    /// assert!(x.view(2..9).is_err()); // past the end: an error, not a panic
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn view(&self, range: impl RangeBounds<usize>) -> Result<View<'_, T>> {
        self.view_named(range, "view")
    }

    /// [`view`](Self::view), an out-of-range `range` reported as `what`'s.
    fn view_named(&self, range: impl RangeBounds<usize>, what: &str) -> Result<View<'_, T>> {
        let span = Span::of(range, self.len(), what)?;
        let inner = self.slice.slice(span);
        Ok(View { inner, span })
    }

    /// A view of elements `range` that kernels, copies and matmuls may write.
    ///
    /// ```no_run
    /// # let device = stepgraph::Device::new(0)?;
    /// let mut x = device.upload_new("x", &[1.0f32; 10])?;
    /// stepgraph::exec::run_once(&device, |s| s.memset_zeros(&mut x.view_mut(3..7)?))?;
    /// assert_eq!(device.download(&x)?, [1., 1., 1., 0., 0., 0., 0., 1., 1., 1.]);
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn view_mut(&mut self, range: impl RangeBounds<usize>) -> Result<ViewMut<'_, T>> {
        self.view_mut_named(range, "view_mut")
    }

    /// [`view_mut`](Self::view_mut), an out-of-range `range` reported as `what`'s.
    fn view_mut_named(
        &mut self,
        range: impl RangeBounds<usize>,
        what: &str,
    ) -> Result<ViewMut<'_, T>> {
        let span = Span::of(range, self.len(), what)?;
        let inner = self.slice.slice_mut(span);
        let addr = {
            let (ptr, _sync) = inner.device_ptr(inner.stream());
            ptr
        };
        Ok(ViewMut { inner, span, addr })
    }
}

/// What both kinds of view say of themselves: their length and where they lie.
macro_rules! view_accessors {
    ($view:ident) => {
        impl<T> $view<'_, T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.span.len()
            }

            /// Whether it holds no elements.
            pub fn is_empty(&self) -> bool {
                self.span.is_empty()
            }

            /// Where it starts in its buffer, in elements.
            pub fn offset(&self) -> usize {
                self.span.start()
            }

            /// The elements of its buffer it covers.
            pub fn span(&self) -> Span {
                self.span
            }
        }
    };
}

/// Elements of a [`DeviceBuffer`], read-only: what `buf.view(a..b)` gives and what an op
/// that reads a `#[view]` field receives. It goes wherever a buffer is read.
///
/// Its address is the buffer's plus `offset` elements: a view at an odd offset is not
/// aligned beyond its element type, which kernels with vector loads must not assume.
pub struct View<'a, T> {
    inner: CudaView<'a, T>,
    span: Span,
}

impl<T> fmt::Debug for View<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("span", &self.span)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

view_accessors!(View);

impl<'a, T> View<'a, T> {
    /// The cudarc view, for existing code that takes `&CudaView<T>`: outside an op. Fails
    /// while an op is being issued, as [`DeviceBuffer::as_cuda_slice`] does; inside an
    /// op, [`cuda_view`](Self::cuda_view).
    pub fn as_cuda_view(&self) -> Result<&CudaView<'a, T>> {
        crate::scope::check("View::as_cuda_view")?;
        Ok(&self.inner)
    }

    /// The cudarc view inside an op.
    ///
    /// # Safety
    ///
    /// As for [`DeviceBuffer::cuda_slice`].
    pub unsafe fn cuda_view(&self) -> &CudaView<'a, T> {
        &self.inner
    }
}

/// Elements of a [`DeviceBuffer`] that may be written: what `buf.view_mut(a..b)` gives and
/// what an op that writes a `#[view]` field receives. It goes wherever a buffer is read or
/// written. Alignment as for [`View`].
pub struct ViewMut<'a, T> {
    inner: CudaViewMut<'a, T>,
    span: Span,
    /// The address, kept for kernels that read through the view: cudarc pushes a
    /// `CudaViewMut` only as a pointer to write through.
    addr: u64,
}

impl<T> fmt::Debug for ViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewMut")
            .field("span", &self.span)
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

view_accessors!(ViewMut);

impl<'a, T> ViewMut<'a, T> {
    /// The cudarc view, for existing code that takes `&CudaView<T>`: outside an op. Fails
    /// while an op is being issued, as [`DeviceBuffer::as_cuda_slice`] does; inside an
    /// op, [`cuda_view`](Self::cuda_view).
    pub fn as_cuda_view(&self) -> Result<CudaView<'_, T>> {
        crate::scope::check("ViewMut::as_cuda_view")?;
        Ok(self.inner.as_view())
    }

    /// The cudarc view, for existing code that takes `&mut CudaViewMut<T>`: outside an
    /// op. A reborrow, not the view itself, so that this one keeps its address. Fails
    /// while an op is being issued; inside an op,
    /// [`cuda_view_mut`](Self::cuda_view_mut).
    ///
    /// ```no_run
    /// use stepgraph::cudarc::driver::{CudaView, CudaViewMut};
    ///
    /// // Existing code, on cudarc's views.
    /// fn fill(src: &CudaView<'_, f32>, dst: &mut CudaViewMut<'_, f32>) {
    ///     assert_eq!(src.len(), dst.len());
    /// }
    ///
    /// # let device = stepgraph::Device::new(0)?;
    /// let x = device.upload_new("x", &[1.0f32; 8])?;
    /// let mut y = device.alloc_zeros::<f32>("y", 8)?;
    /// let src = x.view(2..6)?;
    /// let mut dst = y.view_mut(4..)?;
    /// fill(src.as_cuda_view()?, &mut dst.as_cuda_view_mut()?);
    /// assert_eq!((src.offset(), dst.span()), (2, stepgraph::Span::new(4, 4)));
    /// # Ok::<(), stepgraph::Error>(())
    /// ```
    pub fn as_cuda_view_mut(&mut self) -> Result<CudaViewMut<'_, T>> {
        crate::scope::check("ViewMut::as_cuda_view_mut")?;
        Ok(self.inner.slice_mut(..))
    }

    /// The cudarc view inside an op.
    ///
    /// # Safety
    ///
    /// As for [`DeviceBuffer::cuda_slice`].
    pub unsafe fn cuda_view(&self) -> CudaView<'_, T> {
        self.inner.as_view()
    }

    /// The cudarc view inside an op, to write.
    ///
    /// # Safety
    ///
    /// As for [`DeviceBuffer::cuda_slice_mut`].
    pub unsafe fn cuda_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.inner.slice_mut(..)
    }
}

impl<T> sealed::Sealed for CudaSlice<T> {}
impl<T> sealed::Sealed for CudaView<'_, T> {}

// A trainer's own cudarc memory goes wherever a buffer does, too: a copy into a
// `CudaSlice` of its own, a matmul on one. The address and length are cudarc's.
impl<T> DeviceMem<T> for CudaSlice<T> {
    fn len(&self) -> usize {
        DeviceSlice::len(self)
    }

    fn device_address(&self) -> u64 {
        let (ptr, _sync) = self.device_ptr(DeviceSlice::stream(self));
        ptr
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        args.arg(self);
    }
}

impl<T> DeviceMemMut<T> for CudaSlice<T> {
    fn push_arg_mut<'b>(&'b mut self, args: &mut LaunchArgs<'b>) {
        args.arg(self);
    }
}

impl<T> DeviceMem<T> for CudaView<'_, T> {
    fn len(&self) -> usize {
        DeviceSlice::len(self)
    }

    fn device_address(&self) -> u64 {
        let (ptr, _sync) = self.device_ptr(DeviceSlice::stream(self));
        ptr
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        args.arg(self);
    }
}

impl<T> sealed::Sealed for DeviceBuffer<T> {}
impl<T> sealed::Sealed for View<'_, T> {}
impl<T> sealed::Sealed for ViewMut<'_, T> {}

impl<T> DeviceMem<T> for DeviceBuffer<T> {
    fn len(&self) -> usize {
        self.slice.len()
    }

    fn device_address(&self) -> u64 {
        DeviceBuffer::device_address(self)
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        args.arg(&*self.slice);
    }
}

impl<T> DeviceMemMut<T> for DeviceBuffer<T> {
    fn push_arg_mut<'b>(&'b mut self, args: &mut LaunchArgs<'b>) {
        args.arg(&mut *self.slice);
    }
}

impl<T> DeviceMem<T> for View<'_, T> {
    fn len(&self) -> usize {
        self.span.len()
    }

    fn device_address(&self) -> u64 {
        let (ptr, _sync) = self.inner.device_ptr(self.inner.stream());
        ptr
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        args.arg(&self.inner);
    }
}

impl<T> DeviceMem<T> for ViewMut<'_, T> {
    fn len(&self) -> usize {
        self.span.len()
    }

    fn device_address(&self) -> u64 {
        self.addr
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        args.arg(&self.addr);
    }
}

impl<T> DeviceMemMut<T> for ViewMut<'_, T> {
    fn push_arg_mut<'b>(&'b mut self, args: &mut LaunchArgs<'b>) {
        args.arg(&mut self.inner);
    }
}

/// A step's declared view, resolved against its parent at issue time: generated code
/// calls these with the view's field name, so an out-of-range span names the field.
#[doc(hidden)]
pub fn declared_view<'a, T>(
    parent: &'a DeviceBuffer<T>,
    span: Span,
    what: &str,
) -> Result<View<'a, T>> {
    parent.view_named(span, what)
}

/// [`declared_view`] for an op that writes the view.
#[doc(hidden)]
pub fn declared_view_mut<'a, T>(
    parent: &'a mut DeviceBuffer<T>,
    span: Span,
    what: &str,
) -> Result<ViewMut<'a, T>> {
    parent.view_mut_named(span, what)
}

/// Up to `N` device addresses passed to a kernel by value: the CUDA side is a struct that
/// holds one array of `N` pointers, such as `struct BranchIn { const float* p[8]; }`.
/// A kernel that serves several branches takes one, so that each branch's tensor stays a
/// buffer of its own, written on its branch's stream, and the schedule can tell the
/// branches apart. Entries past the buffers given are null.
///
/// stepgraph-build passes such a parameter as a slice of buffers and builds the table
/// itself; build one by hand for a launch assembled with [`CaptureStream::launch`]
/// (`.arg(&table)`).
///
/// ```no_run
/// # fn demo(a: &stepgraph::DeviceBuffer<f32>, b: &stepgraph::DeviceBuffer<f32>) -> stepgraph::Result<()> {
/// use stepgraph::PtrTable;
///
/// let adv = PtrTable::<8>::reads("my_kernel: adv", &[a, b])?;
/// assert_eq!(adv.addresses()[2], 0);
/// # Ok(()) }
/// ```
///
/// [`CaptureStream::launch`]: crate::CaptureStream::launch
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrTable<const N: usize> {
    addresses: [u64; N],
}

// SAFETY: a plain array of device addresses, laid out as the CUDA struct of `N` pointers
// (8-byte pointers on the 64-bit hosts CUDA supports and on the device).
unsafe impl<const N: usize> DeviceRepr for PtrTable<N> {}

impl<const N: usize> PtrTable<N> {
    /// The addresses of buffers a kernel reads. More than `N` is [`Error::Argument`].
    pub fn reads<T>(what: &str, bufs: &[&impl DeviceMem<T>]) -> Result<Self> {
        Self::of(what, bufs.iter().map(|b| b.device_address()), bufs.len())
    }

    /// The addresses of buffers a kernel writes. Inside an op, each must lie within what
    /// the op may write ([`Error::UngrantedWrite`] otherwise), as a written kernel
    /// argument must; more than `N` is [`Error::Argument`].
    pub fn writes<T>(what: &str, bufs: &mut [&mut impl DeviceMemMut<T>]) -> Result<Self> {
        for (i, b) in bufs.iter().enumerate() {
            check_write_mem(&**b, || format!("{what}[{i}]"))?;
        }
        Self::of(what, bufs.iter().map(|b| b.device_address()), bufs.len())
    }

    fn of(what: &str, addresses: impl Iterator<Item = u64>, count: usize) -> Result<Self> {
        if count > N {
            return Err(Error::Argument {
                what: what.to_string(),
                expected: format!("at most {N} buffers (the CUDA struct's array)"),
                found: format!("{count}"),
            });
        }
        let mut table = [0u64; N];
        for (slot, address) in table.iter_mut().zip(addresses) {
            *slot = address;
        }
        Ok(PtrTable { addresses: table })
    }

    /// The addresses, null past the buffers given.
    pub fn addresses(&self) -> &[u64; N] {
        &self.addresses
    }
}

/// [`check_write`](crate::scope::check_write) for device memory an operation writes: fails
/// unless it lies inside the grant of the op being issued, when one is held.
pub(crate) fn check_write_mem<T>(
    mem: &(impl DeviceMem<T> + ?Sized),
    what: impl FnOnce() -> String,
) -> Result<()> {
    crate::scope::check_write(mem.device_address(), mem.len() * size_of::<T>(), what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_table_fills_its_slots_in_order_and_refuses_more_than_its_array() {
        let table = PtrTable::<4>::of("k: adv", [16u64, 32].into_iter(), 2).unwrap();
        assert_eq!(table.addresses(), &[16, 32, 0, 0]);
        let e = PtrTable::<2>::of("k: adv", [1u64, 2, 3].into_iter(), 3).unwrap_err();
        assert!(
            matches!(&e, Error::Argument { what, found, .. } if what == "k: adv" && found == "3"),
            "{e}"
        );
        assert_eq!(std::mem::size_of::<PtrTable<8>>(), 64);
    }

    #[test]
    fn a_range_becomes_a_span_inside_the_buffer_or_an_error_with_both_sizes() {
        assert_eq!(Span::of(.., 10, "v").unwrap(), Span::new(0, 10));
        assert_eq!(Span::of(3..7, 10, "v").unwrap(), Span::new(3, 4));
        assert_eq!(Span::of(3..=7, 10, "v").unwrap(), Span::new(3, 5));
        assert_eq!(Span::of(10.., 10, "v").unwrap(), Span::new(10, 0));
        assert_eq!(Span::of(Span::new(2, 3), 10, "v").unwrap(), Span::new(2, 3));
        let e = Span::of(8..12, 10, "view of `x`").unwrap_err().to_string();
        assert_eq!(
            e,
            "view of `x`: expected elements within 0..10, found 8..12"
        );
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = Span::of(5..2, 10, "v").unwrap_err().to_string();
        assert!(backwards.contains("found 5..2"), "{backwards}");
        let wrap = Span::of(..=usize::MAX, 10, "v").unwrap_err().to_string();
        assert!(wrap.contains("within 0..10"), "{wrap}");
    }

    #[test]
    fn spans_overlap_when_they_share_an_element() {
        let a = Span::new(0, 4);
        assert!(a.overlaps(&Span::new(3, 1)));
        assert!(!a.overlaps(&Span::new(4, 4)));
        assert!(!a.overlaps(&Span::new(2, 0)));
        assert!(!Span::new(2, 0).overlaps(&a));
        assert_eq!(Span::new(usize::MAX, 5).end(), usize::MAX);
        assert_eq!(Span::columns(0, 10, 3, 4), Span::new(3, 0));
        assert_eq!(Span::columns(3, 10, 3, 4), Span::new(3, 24));
        assert_eq!(Span::rows(1, 2, 8), Span::new(8, 16));
        assert_eq!(Span::new(3, 4).to_string(), "3..7");
    }
}
