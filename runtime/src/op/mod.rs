//! What an op receives, and the step features built on it: the capture stream and its
//! kernel launches ([`stream`]), the buffer and config traits ([`buffer`]), context
//! parameters ([`context`]), the op's grant ([`grant`]), device scalars ([`scalars`]),
//! host input and output ([`host_io`]), device flags and conditional ops ([`flag`],
//! [`every`]) and collectives ([`comm`]).
//!
//! This layer sits on the driver and cuBLASLt; capture and measurement sit on it.

pub(crate) mod buffer;
pub(crate) mod comm;
pub(crate) mod context;
pub(crate) mod every;
pub(crate) mod flag;
pub(crate) mod grant;
pub(crate) mod host_io;
pub(crate) mod scalars;
pub(crate) mod shared;
pub(crate) mod stream;
