//! The trainer's one error type.

use cudarc::cublaslt::result::CublasError;
use cudarc::driver::DriverError;

/// What can go wrong in the trainer: a CUDA driver call, a cuBLASLt call, or arguments
/// that do not fit (lengths, shapes, a workspace), found before anything is issued.
///
/// A message names the call or the operand; the driver's or cuBLASLt's own error is its
/// [`source`](std::error::Error::source), not repeated in the message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CUDA driver call failed.
    #[error("{call} failed")]
    Driver {
        /// The driver call (`cuLaunchKernel`, `cuStreamBeginCapture`).
        call: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A cuBLASLt call failed.
    #[error("{call} failed")]
    Blas {
        /// The cuBLASLt call (`cublasLtMatmul`).
        call: &'static str,
        /// cuBLASLt's status.
        #[source]
        source: CublasError,
    },
    /// Arguments that would make a kernel or a matmul go out of bounds, or that cannot be
    /// used as given; nothing was issued.
    #[error("{0}")]
    Invalid(String),
}

/// The trainer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a driver error of `call`, for `map_err`.
    pub(crate) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
        move |source| Error::Driver { call, source }
    }

    /// Wraps a cuBLASLt error of `call`, for `map_err`.
    pub(crate) fn blas(call: &'static str) -> impl FnOnce(CublasError) -> Error {
        move |source| Error::Blas { call, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::cublaslt::sys::cublasStatus_t;
    use std::error::Error as _;

    #[test]
    fn a_message_names_the_call_and_leaves_the_cause_to_the_source() {
        let e =
            Error::blas("cublasLtMatmul")(CublasError(cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
        assert_eq!(e.to_string(), "cublasLtMatmul failed");
        let source = e.source().map(|s| s.to_string()).unwrap_or_default();
        assert!(source.contains("NOT_SUPPORTED"), "{source}");
    }
}
