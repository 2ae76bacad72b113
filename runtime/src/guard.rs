//! The rule no type can carry: no host-side call from inside an op. An op's capture stream
//! has no way to synchronise, allocate or copy to the host, and its buffers and config
//! cannot hold a host handle; but a handle can still reach an op another way (a kernels
//! type that holds a `Device`, a global). So every host-side entry point of this crate
//! asks [`check`] first, and fails, naming the op, while one is being issued.

use std::cell::{Cell, RefCell};

use cudarc::driver::CudaSlice;

use crate::error::{Error, Result};

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
}
