//! Events for timing, shared by profiles, replay timings and the work bound.

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaEvent, CudaStream};

use crate::driver::device::Device;
use crate::error::{Error, Result};

/// An event on `device`: with `timing`, one whose elapsed time can be read; without, one
/// that only orders streams (cheaper to record and wait on).
pub(crate) fn event(device: &Device, timing: bool) -> Result<CudaEvent> {
    let flags = if timing {
        CUevent_flags::CU_EVENT_DEFAULT
    } else {
        CUevent_flags::CU_EVENT_DISABLE_TIMING
    };
    device
        .context()
        .new_event(Some(flags))
        .map_err(Error::driver("cuEventCreate"))
}

/// An event of `ctx` that only orders streams (no timing).
pub(crate) fn ordering_event(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
) -> Result<CudaEvent> {
    ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(Error::driver("cuEventCreate"))
}

/// Milliseconds from `from` to `to`, both recorded and complete.
pub(crate) fn elapsed_ms(from: &CudaEvent, to: &CudaEvent) -> Result<f64> {
    from.elapsed_ms(to)
        .map(f64::from)
        .map_err(Error::driver("cuEventElapsedTime"))
}

/// Records a timing event as an event-record node of the graph being captured (an
/// "external" record), so that its time can be read after each replay. A plain record
/// during capture only orders streams and leaves no node.
pub(crate) fn record_external(event: &CudaEvent, stream: &CudaStream) -> Result<()> {
    // SAFETY: both handles are valid and of one context; the event outlives the graph's
    // replays (the profile keeps it until it has read the times).
    unsafe {
        sys::cuEventRecordWithFlags(
            event.cu_event(),
            stream.cu_stream(),
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
        )
    }
    .result()
    .map_err(Error::driver("cuEventRecordWithFlags"))
}
