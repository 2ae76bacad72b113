//! Measurement: timing statistics ([`timing`]), the work bound of a captured step, each
//! op's kernels replayed alone ([`work`]), and the device's ceilings and a step's floor
//! ([`floor`]). It reads captured graphs through the driver layer and runs matmuls
//! through cuBLASLt; the capture layer's `Step` offers it.

pub(crate) mod floor;
pub(crate) mod timing;
pub(crate) mod work;
