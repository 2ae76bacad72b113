//! What an op's signature grants it, held to while the op is captured.
//!
//! The plan orders ops by their parameters: an op writes what it takes `&mut`, and
//! nothing else. Device memory can still reach an op another way (a buffer in a `static`,
//! one held by the kernels type, a global), and a `&mut` parameter can still be swapped
//! with another or assigned (`std::mem::swap(a, b)`): the first races, unseen by the
//! plan, with every other op that touches that memory; the second swaps the allocations
//! once, at capture, after which the graph and the host disagree about which buffer is
//! which. Generated code records where each `&mut` parameter's memory lies before the op
//! runs ([`Grant::enter`], with [`granted`]); every write the runtime issues for the op (a kernel's
//! `buf_mut` argument, a copy's destination, a memset, a matmul's outputs, a staged copy,
//! a collective) must lie inside one of them ([`check_write`](crate::scope::check_write)); and after the op, each
//! parameter must lie where it lay before ([`Grant::leave`]).
//!
//! Reads are not held to the grant: a table the kernels type uploaded once and every op
//! reads is no race.

use crate::driver::memory::{DeviceMem, ViewMut};
use crate::error::{Error, Result};
use crate::op::buffer::StepBuffer;
use crate::op::stream::CaptureStream;
use crate::scope::{Granting, Mode};

/// Where one of an op's `&mut` parameters lies: its name and `(address, bytes)` spans.
#[derive(Debug, PartialEq, Eq)]
pub struct Granted {
    name: &'static str,
    spans: Vec<(u64, usize)>,
    /// Whether the spans are all of it: a `StepBuffer` implemented by hand may not say,
    /// and writes are not held to the grant then.
    known: bool,
}

/// Parameter `name`, a step buffer the op takes `&mut`.
pub fn granted<B: StepBuffer + ?Sized>(name: &'static str, buffer: &B) -> Granted {
    let mut spans = Vec::new();
    let known = buffer.__regions(&mut spans);
    Granted { name, spans, known }
}

/// Parameter `name`, a view the op writes.
pub fn granted_view<T>(name: &'static str, view: &ViewMut<'_, T>) -> Granted {
    let bytes = DeviceMem::len(view) * size_of::<T>();
    Granted {
        name,
        spans: vec![(DeviceMem::device_address(view), bytes)],
        known: true,
    }
}

/// An op's grant, held while it is issued.
#[derive(Debug)]
pub struct Grant {
    before: Vec<Granted>,
    /// Holds the writes while the op is issued, and restores what was held before (an
    /// op issued inside another is refused elsewhere, but the grant is restored all the
    /// same).
    _held: Granting,
}

impl Grant {
    /// Records where the op's `&mut` parameters lie and, in the dry pass and the
    /// capture, holds the runtime's writes for the op to them.
    pub fn enter(stream: &CaptureStream<'_>, params: Vec<Granted>) -> Grant {
        let checked = stream.mode() != Mode::Eager && params.iter().all(|p| p.known);
        let spans = checked.then(|| {
            params
                .iter()
                .flat_map(|p| p.spans.iter().copied())
                .collect()
        });
        Grant {
            before: params,
            _held: Granting::hold(spans),
        }
    }

    /// Ends the op's grant: fails, naming the parameter, if one of them no longer lies
    /// where it lay when the op began (swapped with another, or assigned).
    pub fn leave(self, params: Vec<Granted>) -> Result<()> {
        match self.before.iter().zip(&params).find(|(was, is)| was != is) {
            Some((was, _)) => {
                let (step, op) = crate::scope::issuing().unwrap_or(("?", "?"));
                Err(Error::BufferReplaced {
                    step,
                    op,
                    buffer: was.name,
                })
            }
            None => Ok(()),
        }
    }
}
