//! Device flags: a condition that ops set on the GPU, on which a `#[when(flag)]` op runs.

use std::fmt;

use cudarc::driver::LaunchArgs;

use crate::driver::device::Device;
use crate::driver::memory::{DeviceBuffer, DeviceMem, DeviceMemMut, sealed};
use crate::error::Result;

/// One `u32` in device memory that says whether a `#[when(flag)]` op runs: set when it
/// is nonzero.
///
/// Ops write it like any buffer (`&mut DeviceFlag`): with
/// [`CaptureStream::set_flag`](crate::CaptureStream::set_flag) (a memset in the graph),
/// or from a kernel of their own, which gets it as a `unsigned int*` through a typed
/// launcher or [`Launch::buf_mut`](crate::kernel::Launch::buf_mut) (it is a
/// [`DeviceMemMut<u32>`] of one element), so that the GPU decides at each replay, from
/// the data, whether the op runs. The op that names it in `#[when(..)]` reads it: the plan
/// orders it after the op that set it. The host reads it after a wait with
/// [`Device::download`] (or a step's `download`), and sets it with [`Device::upload`].
///
/// ```no_run
/// use stepgraph::{Device, DeviceFlag};
///
/// let device = Device::new(0)?;
/// let mut diverged = DeviceFlag::new(&device, "diverged", false)?;
/// assert_eq!(device.download(&diverged)?, [0]);
/// device.upload(&mut diverged, &[1])?;
/// assert_eq!(device.download(&diverged)?, [1]);
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct DeviceFlag {
    value: DeviceBuffer<u32>,
}

impl fmt::Debug for DeviceFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceFlag")
            .field("address", &self.value.device_address())
            .finish()
    }
}

impl DeviceFlag {
    /// Allocates the flag, set or clear. `what` names it in an out-of-memory error.
    pub fn new(device: &Device, what: &str, initially_set: bool) -> Result<DeviceFlag> {
        Ok(DeviceFlag {
            value: device.upload_new(what, &[u32::from(initially_set)])?,
        })
    }

    /// The `u32` underneath, for existing code that takes a buffer.
    pub fn as_buffer(&self) -> &DeviceBuffer<u32> {
        &self.value
    }

    /// The `u32` underneath, to write it with existing code that takes a buffer.
    pub fn as_buffer_mut(&mut self) -> &mut DeviceBuffer<u32> {
        &mut self.value
    }

    /// The raw device address of the `u32`. Using it does not borrow the flag: the
    /// caller keeps it alive and ordered.
    pub fn device_address(&self) -> u64 {
        self.value.device_address()
    }
}

impl sealed::Sealed for DeviceFlag {}

impl DeviceMem<u32> for DeviceFlag {
    fn len(&self) -> usize {
        1
    }

    fn device_address(&self) -> u64 {
        self.value.device_address()
    }

    fn push_arg<'b>(&'b self, args: &mut LaunchArgs<'b>) {
        self.value.push_arg(args)
    }
}

impl DeviceMemMut<u32> for DeviceFlag {
    fn push_arg_mut<'b>(&'b mut self, args: &mut LaunchArgs<'b>) {
        self.value.push_arg_mut(args)
    }
}

/// What `#[when(flag)]` may name: a [`DeviceFlag`] field of the step's buffers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a DeviceFlag: `#[when(..)]` names a DeviceFlag field of the buffers",
    label = "not a stepgraph::DeviceFlag",
    note = "an op runs when a flag on the device is set: declare the field as `stepgraph::DeviceFlag` (a u32, nonzero when set) and set it from an earlier op"
)]
#[doc(hidden)]
pub trait WhenFlag {
    /// The flag.
    fn flag(&self) -> &DeviceFlag;
}

impl WhenFlag for DeviceFlag {
    fn flag(&self) -> &DeviceFlag {
        self
    }
}

/// The flag a `#[when(field)]` op is issued with: what `#[step]` emits, spanned on the
/// field named in the attribute, so that a field of another type is reported there.
#[doc(hidden)]
pub fn when_flag<F: WhenFlag>(field: &F) -> &DeviceFlag {
    field.flag()
}
