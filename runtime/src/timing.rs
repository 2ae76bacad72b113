//! Timing with CUDA events, shared by profiles, replay timings and the work bound.

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use crate::device::Device;
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

/// Milliseconds from `from` to `to`, both recorded and complete.
pub(crate) fn elapsed_ms(from: &CudaEvent, to: &CudaEvent) -> Result<f64> {
    from.elapsed_ms(to)
        .map(f64::from)
        .map_err(Error::driver("cuEventElapsedTime"))
}

/// The median of `values` (the upper one of the middle two for an even count), sorting
/// them in place; NaN for none.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_middle_value_after_sorting() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&mut []).is_nan());
    }
}
