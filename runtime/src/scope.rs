//! The op being issued on this thread, and what it may do meanwhile: the rules no type
//! can carry.
//!
//! - No host-side call from inside an op. An op's capture stream has no way to
//!   synchronise, allocate or copy to the host, and its buffers and config cannot hold a
//!   host handle; but a handle can still reach an op another way (a kernels type that
//!   holds a `Device`, a global). So every host-side entry point of this crate asks
//!   [`check`] first, and fails, naming the op, while one is being issued.
//! - No write outside the op's grant: while a grant is held ([`Granting`]), every write
//!   the runtime issues for the op must lie inside memory the op takes `&mut`
//!   ([`check_write`]).
//!
//! This is the bottom of the crate with the error enum: every layer asks it, and it asks
//! no layer. The capture guard, which watches what CUDA an op's code calls, sits with
//! the capture (`capture::guard`); the grant's public face with what ops receive
//! (`op::grant`).

use std::cell::{Cell, RefCell};

use cudarc::driver::CudaSlice;

use crate::error::{Error, Result};

/// How a pass over the step's ops treats the work they issue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Nothing is enqueued: arguments are checked and matmul plans are built and warmed.
    /// Runs once before every capture, so nothing is created inside a capture.
    Dry,
    /// Work is enqueued on a stream under stream capture.
    Capture,
    /// Work is enqueued and runs as it is issued (the eager baseline).
    Eager,
}

impl Mode {
    /// Whether work is put on the stream in this mode.
    pub fn enqueues(self) -> bool {
        !matches!(self, Mode::Dry)
    }
}

/// The op being issued on this thread: its step and name.
#[derive(Clone, Copy)]
struct Issuing {
    step: &'static str,
    op: &'static str,
}

thread_local! {
    static ISSUING: Cell<Option<Issuing>> = const { Cell::new(None) };
    /// A host-side call that could not return its error (a drop), to be reported as the
    /// op's when it returns.
    static PENDING: Cell<Option<(Issuing, &'static str)>> = const { Cell::new(None) };
    /// Allocations dropped inside an op, freed once no capture is in progress.
    static DEFERRED: RefCell<Vec<CudaSlice<u8>>> = const { RefCell::new(Vec::new()) };
    /// Depth of the runtime's own sections that may issue beside the op's stream (a
    /// matmul's warm-up in the dry pass, a collective's NCCL bookkeeping).
    static EXEMPT: Cell<u32> = const { Cell::new(0) };
    /// The spans the op being issued may write; `None` when no grant is held (an eager
    /// run, code outside a step, a parameter whose memory cannot be told).
    static GRANTED: RefCell<Option<Vec<(u64, usize)>>> = const { RefCell::new(None) };
}

/// Marks an op as being issued on this thread until it is dropped (also when the op
/// panics), restoring whatever was marked before.
pub(crate) struct IssuingOp {
    before: Option<Issuing>,
}

impl IssuingOp {
    pub(crate) fn enter(step: &'static str, op: &'static str) -> IssuingOp {
        let before = ISSUING.with(|c| c.replace(Some(Issuing { step, op })));
        IssuingOp { before }
    }
}

impl Drop for IssuingOp {
    fn drop(&mut self) {
        ISSUING.with(|c| c.set(self.before));
    }
}

/// Runs `f`, a section of the runtime's own that issues beside an op's stream on
/// purpose (a matmul warmed in the dry pass, NCCL's bookkeeping streams inside a
/// collective), without the capture guard recording its calls.
pub(crate) fn exempt<R>(f: impl FnOnce() -> R) -> R {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            EXEMPT.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    EXEMPT.with(|d| d.set(d.get() + 1));
    let _depth = Depth;
    f()
}

/// Whether this thread is inside an [`exempt`] section. Safe to call from a CUPTI
/// callback: it neither panics nor calls CUDA.
pub(crate) fn exempted() -> bool {
    EXEMPT.try_with(Cell::get).unwrap_or(0) > 0
}

/// The step and op being issued on this thread, if one is.
pub(crate) fn issuing() -> Option<(&'static str, &'static str)> {
    ISSUING
        .try_with(Cell::get)
        .ok()
        .flatten()
        .map(|Issuing { step, op }| (step, op))
}

/// Fails with [`Error::HostCallInOp`] when an op is being issued on this thread: `call`
/// (`Device::download`, `Step::replay`) would break or escape its capture. A synchronise
/// fails the capture; an allocation or a free leaves the graph an address that is freed
/// or new each replay; a copy to the host reads a value frozen at capture time; a replay
/// of another step, or a new stream or cuBLASLt session, is work that runs once, at
/// capture, and never in a replay.
pub(crate) fn check(call: &'static str) -> Result<()> {
    match ISSUING.with(Cell::get) {
        Some(Issuing { step, op }) => Err(Error::HostCallInOp { step, op, call }),
        None => Ok(()),
    }
}

/// Frees `slice`, or, while an op is being issued, keeps it until [`free_deferred`] and
/// marks the op failed: a free inside a capture would leave the graph an address that is
/// gone (or someone else's) at the next replay.
pub(crate) fn free<T>(slice: CudaSlice<T>) {
    // `try_with`: a buffer may be dropped by another thread-local's destructor, after
    // these are gone; no op is being issued then.
    let Some(issuing) = ISSUING.try_with(Cell::get).ok().flatten() else {
        drop(slice);
        return;
    };
    let bytes = slice.num_bytes();
    let stream = slice.stream().clone();
    let ptr = slice.leak();
    // SAFETY: `ptr` is the allocation just leaked, `bytes` bytes long, owned by nobody
    // else; the new slice frees it when dropped, as the old one would have.
    let erased = unsafe { stream.upgrade_device_ptr::<u8>(ptr, bytes) };
    DEFERRED.with(|d| d.borrow_mut().push(erased));
    PENDING.with(|p| {
        if p.get().is_none() {
            p.set(Some((issuing, "DeviceBuffer::drop")));
        }
    });
}

/// The error of a host-side call the op being left made without being able to return
/// it ([`free`]), if any.
pub(crate) fn take_pending() -> Option<Error> {
    PENDING
        .with(Cell::take)
        .map(|(Issuing { step, op }, call)| Error::HostCallInOp { step, op, call })
}

/// Frees what ops dropped; called once no capture is in progress. Work issued before the
/// drop may still use the memory, so the device is waited for first.
pub(crate) fn free_deferred() {
    let freed = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    if let Some(first) = freed.first() {
        let ctx = first.stream().context();
        ctx.record_err(ctx.synchronize());
    }
    drop(freed);
}

/// Holds the runtime's writes for the op being issued to `spans` (or to anything, with
/// `None`) until dropped, restoring what was held before.
pub(crate) struct Granting {
    outer: Option<Vec<(u64, usize)>>,
}

impl Granting {
    pub(crate) fn hold(spans: Option<Vec<(u64, usize)>>) -> Granting {
        let outer = GRANTED.with(|g| g.replace(spans));
        Granting { outer }
    }
}

impl Drop for Granting {
    fn drop(&mut self) {
        let outer = self.outer.take();
        GRANTED.with(|g| *g.borrow_mut() = outer);
    }
}

impl std::fmt::Debug for Granting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Granting").finish_non_exhaustive()
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
    let (step, op) = issuing().unwrap_or(("?", "?"));
    Err(Error::UngrantedWrite {
        step,
        op,
        what: what(),
        address,
        bytes,
    })
}

/// What one op issued during a pass, counted by its capture stream.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Kernel launches.
    pub launches: usize,
    /// cuBLASLt matmuls (one or more kernel nodes each).
    pub matmuls: usize,
    /// Device-to-device and host-to-device copies.
    pub copies: usize,
    /// Memsets.
    pub memsets: usize,
    /// Collectives (NCCL groups): any number of nodes each, of any kind.
    pub collectives: usize,
    /// Times the op took its stream as cudarc's
    /// ([`CaptureStream::cuda_stream`](crate::CaptureStream::cuda_stream)): work of any
    /// number and kind that nothing counts.
    pub raw: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_call_fails_only_while_an_op_is_issued_and_names_it() {
        assert!(check("Device::download").is_ok());
        {
            let _op = IssuingOp::enter("dqn", "trunk_forward");
            let e = check("Device::download").unwrap_err();
            assert_eq!(
                e.to_string(),
                "op `trunk_forward` of step `dqn` called `Device::download` while it was \
                 being issued: a host-side call inside an op breaks or escapes the capture; \
                 make it before or after the step's replay"
            );
            {
                let _inner = IssuingOp::enter("other", "inner");
                assert!(
                    check("Step::replay")
                        .unwrap_err()
                        .to_string()
                        .contains("`inner`")
                );
            }
            assert!(
                check("x")
                    .unwrap_err()
                    .to_string()
                    .contains("`trunk_forward`")
            );
        }
        assert!(check("Device::download").is_ok());
    }

    #[test]
    fn a_held_grant_refuses_writes_outside_its_spans_and_is_restored() {
        assert!(check_write(0x1000, 64, || "free".into()).is_ok());
        {
            let _op = IssuingOp::enter("s", "o");
            let _held = Granting::hold(Some(vec![(0x1000, 64)]));
            assert!(check_write(0x1000, 64, || "inside".into()).is_ok());
            assert!(check_write(0x1000, 0, || "empty".into()).is_ok());
            let e = check_write(0x1020, 64, || "copy destination".into()).unwrap_err();
            assert!(matches!(
                e,
                Error::UngrantedWrite {
                    op: "o",
                    address: 0x1020,
                    bytes: 64,
                    ..
                }
            ));
        }
        assert!(check_write(0x9000, 8, || "after".into()).is_ok());
    }
}
