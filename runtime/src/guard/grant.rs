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
//! a collective) must lie inside one of them ([`check_write`]); and after the op, each
//! parameter must lie where it lay before ([`Grant::leave`]).
//!
//! Reads are not held to the grant: a table the kernels type uploaded once and every op
//! reads is no race.

use std::cell::RefCell;

use crate::buffer::StepBuffer;
use crate::error::{Error, Result};
use crate::memory::{DeviceMem, ViewMut};
use crate::stream::{CaptureStream, Mode};

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

thread_local! {
    /// The spans the op being issued may write; `None` when no grant is held (an eager
    /// run, code outside a step, a parameter whose memory cannot be told).
    static GRANTED: RefCell<Option<Vec<(u64, usize)>>> = const { RefCell::new(None) };
}

/// An op's grant, held while it is issued.
#[derive(Debug)]
pub struct Grant {
    before: Vec<Granted>,
    /// What was granted before (an op issued inside another is refused elsewhere, but
    /// the grant is restored all the same).
    outer: Option<Vec<(u64, usize)>>,
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
        let outer = GRANTED.with(|g| g.replace(spans));
        Grant {
            before: params,
            outer,
        }
    }

    /// Ends the op's grant: fails, naming the parameter, if one of them no longer lies
    /// where it lay when the op began (swapped with another, or assigned).
    pub fn leave(self, params: Vec<Granted>) -> Result<()> {
        match self.before.iter().zip(&params).find(|(was, is)| was != is) {
            Some((was, _)) => {
                let (step, op) = crate::guard::issuing().unwrap_or(("?", "?"));
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

impl Drop for Grant {
    fn drop(&mut self) {
        let outer = self.outer.take();
        GRANTED.with(|g| *g.borrow_mut() = outer);
    }
}

/// Fails unless the `bytes` at `address` lie inside memory the op being issued takes
/// `&mut`, when a grant is held; `what` names the write (`copy destination`, `argument 3
/// of kernel scale`).
pub(crate) fn check_write(address: u64, bytes: usize, what: impl FnOnce() -> String) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let end = address.saturating_add(bytes as u64);
    let granted = GRANTED.with(|g| {
        g.borrow().as_ref().is_none_or(|spans| {
            spans
                .iter()
                .any(|&(a, n)| a <= address && end <= a.saturating_add(n as u64))
        })
    });
    if granted {
        return Ok(());
    }
    let (step, op) = crate::guard::issuing().unwrap_or(("?", "?"));
    Err(Error::UngrantedWrite {
        step,
        op,
        what: what(),
        address,
        bytes,
    })
}

/// [`check_write`] for device memory an operation writes.
pub(crate) fn check_write_mem<T>(
    mem: &(impl DeviceMem<T> + ?Sized),
    what: impl FnOnce() -> String,
) -> Result<()> {
    check_write(mem.device_address(), mem.len() * size_of::<T>(), what)
}
