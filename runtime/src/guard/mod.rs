//! What no type can carry: the rules an op keeps while it is issued.
//!
//! - No host-side call from inside an op. An op's capture stream has no way to
//!   synchronise, allocate or copy to the host, and its buffers and config cannot hold a
//!   host handle; but a handle can still reach an op another way (a kernels type that
//!   holds a `Device`, a global). So every host-side entry point of this crate asks
//!   [`check`] first, and fails, naming the op, while one is being issued.
//! - No work outside the capture ([`watch_capture`], the capture guard). Code an op calls may
//!   reach CUDA without this crate: cudarc through a buffer's slice, raw driver calls,
//!   cuBLASLt, a library of the program's own. While a step is captured, CUPTI calls back
//!   on every driver and runtime API call; a call made while an op is issued that enqueues
//!   work on any stream but the op's own, waits for the GPU, allocates, or steers a
//!   capture is recorded and fails the op ([`IssuingOp::leave`]), naming the call. The
//!   cost is the capture's: the callbacks are off between captures and during replays.
//!
//! Both see the thread that issues the op, which is where an op's code and every library
//! it calls run; work an op hands to a thread of its own is beyond them.

mod calls;
mod cupti;
mod grant;

pub(crate) use grant::check_write_mem;
pub use grant::{Grant, Granted, granted, granted_view};

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
    /// What the capture guard saw of the op being issued, when it watches.
    static WATCH: RefCell<Option<OpWatch>> = const { RefCell::new(None) };
    /// Depth of the runtime's own sections that may issue beside the op's stream (a
    /// matmul's warm-up in the dry pass, a collective's NCCL bookkeeping).
    static EXEMPT: Cell<u32> = const { Cell::new(0) };
}

/// Marks an op as being issued on this thread until it is dropped (also when the op
/// panics), restoring whatever was marked before; with a [`Watch`], the capture guard
/// records what the op's code calls meanwhile.
pub(crate) struct IssuingOp {
    before: Option<Issuing>,
    watch_before: Option<OpWatch>,
}

/// What the capture guard checks an op's calls against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Watch {
    /// The stream the op's work goes to (`CUstream` as an address): its capture stream,
    /// or the body stream of its conditional node.
    pub own: usize,
    /// The dry pass, which enqueues nothing: every call that enqueues work escapes it.
    pub dry: bool,
}

/// The calls of the op being issued that escaped its capture: the first in full (it says
/// what went wrong), and how many there were.
struct OpWatch {
    watch: Watch,
    first: Option<Escaped>,
    count: usize,
}

/// A call that escaped an op's capture.
#[derive(Clone, Debug)]
pub(crate) struct Escaped {
    /// The API entry point, as CUPTI names it (`cuMemsetD8Async`).
    pub call: String,
    kind: calls::Kind,
    /// The stream it named, for work on a stream.
    pub stream: Option<usize>,
    dry: bool,
}

impl IssuingOp {
    pub(crate) fn enter(step: &'static str, op: &'static str, watch: Option<Watch>) -> IssuingOp {
        let before = ISSUING.with(|c| c.replace(Some(Issuing { step, op })));
        let watch_before = WATCH.with(|w| {
            w.replace(watch.map(|watch| OpWatch {
                watch,
                first: None,
                count: 0,
            }))
        });
        IssuingOp {
            before,
            watch_before,
        }
    }

    /// Ends the op's issue and returns the first call that escaped its capture, with
    /// how many more did.
    pub(crate) fn leave(self) -> Option<(Escaped, usize)> {
        let watched = WATCH.with(|w| w.borrow_mut().take());
        // `self` drops here, restoring what was marked before.
        let watched = watched?;
        let more = watched.count.saturating_sub(1);
        watched.first.map(|e| (e, more))
    }
}

impl Drop for IssuingOp {
    fn drop(&mut self) {
        ISSUING.with(|c| c.set(self.before));
        let before = self.watch_before.take();
        WATCH.with(|w| *w.borrow_mut() = before);
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

/// Turns CUPTI's callbacks on until the value returned is dropped: hold it for a whole
/// capture (the dry pass and the capture itself). Fails when CUPTI cannot be loaded or
/// subscribed, saying why.
pub(crate) fn watch_capture() -> Result<cupti::Watching> {
    cupti::Watching::start(on_call).map_err(|why| Error::CaptureGuard { why })
}

/// CUPTI's callback, on every driver and runtime API call while a capture is watched, on
/// the calling thread. It returns at once on a thread that issues no op, and otherwise
/// records the call if it escapes the op's capture. It must not unwind and must not call
/// CUDA (that would call back into it).
unsafe extern "C" fn on_call(
    _: *mut std::ffi::c_void,
    domain: u32,
    cbid: u32,
    data: *const std::ffi::c_void,
) {
    if (domain != cupti::DOMAIN_DRIVER_API && domain != cupti::DOMAIN_RUNTIME_API) || data.is_null()
    {
        return;
    }
    // SAFETY: for these two domains CUPTI passes a `CUpti_CallbackData`, valid during
    // the callback.
    let data = unsafe { &*data.cast::<cupti::CallbackData>() };
    if data.callback_site != cupti::API_ENTER {
        return;
    }
    if EXEMPT.try_with(Cell::get).unwrap_or(0) > 0 {
        return;
    }
    let _ = WATCH.try_with(|w| {
        let Ok(mut w) = w.try_borrow_mut() else {
            return;
        };
        let Some(w) = w.as_mut() else {
            return;
        };
        let name = if data.function_name.is_null() {
            &[][..]
        } else {
            // SAFETY: CUPTI's function names are NUL-terminated global constants.
            unsafe { std::ffi::CStr::from_ptr(data.function_name) }.to_bytes()
        };
        let runtime = domain == cupti::DOMAIN_RUNTIME_API;
        let Some(call) = calls::classify(runtime, cbid, name) else {
            return;
        };
        // SAFETY: the parameter struct is the call's, laid out as `calls` records, and
        // valid during the callback.
        let stream = unsafe { read_stream(call.stream, data.function_params) };
        let escapes = w.watch.dry || call.kind != calls::Kind::Work || stream != Some(w.watch.own);
        if !escapes {
            return;
        }
        w.count += 1;
        if w.first.is_none() {
            w.first = Some(Escaped {
                call: String::from_utf8_lossy(name).into_owned(),
                kind: call.kind,
                stream,
                dry: w.watch.dry,
            });
        }
    });
}

/// The stream a call's parameters name, where `at` says it is.
///
/// # Safety
/// `params` is the call's CUPTI parameter struct, live, and `at` its stream's place in it.
unsafe fn read_stream(at: calls::StreamAt, params: *const std::ffi::c_void) -> Option<usize> {
    if params.is_null() {
        return None;
    }
    let base = params.cast::<u8>();
    match at {
        calls::StreamAt::Unknown => None,
        calls::StreamAt::Param(offset) => {
            // SAFETY: the offset lies inside the struct (the caller's promise); the field
            // is a pointer-sized handle, read unaligned to assume nothing of the struct.
            Some(unsafe { base.add(offset).cast::<usize>().read_unaligned() })
        }
        calls::StreamAt::Config(at, offset) => {
            // SAFETY: as above; the configuration the pointer names is live for the call.
            let config = unsafe { base.add(at).cast::<*const u8>().read_unaligned() };
            if config.is_null() {
                return None;
            }
            // SAFETY: the stream's offset lies inside the configuration struct.
            Some(unsafe { config.add(offset).cast::<usize>().read_unaligned() })
        }
    }
}

impl Escaped {
    /// Why the call escapes the capture and what to do instead; `stream` names the
    /// stream it was given (the caller knows the step's streams' names).
    pub(crate) fn explain(&self, stream: impl FnOnce(usize) -> String) -> String {
        let why = self.kind_text(stream);
        if self.dry {
            // The dry pass enqueues nothing: what the op's code issued there ran for real.
            return format!(
                "{why} (in the dry pass before the capture, where it ran for real, once: \
                 issue work only through the op's `CaptureStream`, whose `cuda_stream()` is \
                 `None` in the dry pass)"
            );
        }
        why
    }

    fn kind_text(&self, stream: impl FnOnce(usize) -> String) -> String {
        use calls::Kind;
        match self.kind {
            Kind::Work => format!(
                "{}: work issued off the op's capture stream runs once, while the step is \
                 captured, and never in a replay; issue it on the op's own stream \
                 (`CaptureStream`'s methods, or `CaptureStream::cuda_stream` for existing \
                 cudarc code)",
                match self.stream {
                    Some(s) => format!("on {} instead of its capture stream", stream(s)),
                    None => "on a stream stepgraph cannot tell (an entry point whose stream \
                             it does not read)"
                        .to_string(),
                }
            ),
            Kind::Blocking => "(a copy, memset or launch on the legacy default stream that the \
                               host waits for): it runs once, while the step is captured, and \
                               never in a replay; issue it on the op's own stream"
                .to_string(),
            Kind::Sync => "(a wait for, or a query of, the GPU's progress): inside an op it \
                           waits at capture time only, or breaks the capture; make it before \
                           or after the step's replay"
                .to_string(),
            Kind::Alloc => "(an allocation or a free): a graph keeps the addresses of capture \
                            time, so memory allocated or freed inside an op is new or gone at \
                            every replay; use the step's buffers and scratch"
                .to_string(),
            Kind::Capture => "(it begins or ends a capture, or changes one's dependencies): \
                              the step's capture is the runtime's to steer, and the plan's \
                              order would not hold"
                .to_string(),
            Kind::Context => "(an event over a whole context): a capture cannot hold it, and \
                              the plan orders ops by their streams"
                .to_string(),
        }
    }
}

/// How a stream handle an escaped call named reads in a message, when it is none of the
/// step's: the default streams by name, any other by address.
pub(crate) fn stream_text(stream: usize) -> String {
    match stream {
        0 | 1 => "the legacy default stream".to_string(),
        2 => "the per-thread default stream".to_string(),
        s => format!("stream {s:#x} (none of the step's)"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_call_fails_only_while_an_op_is_issued_and_names_it() {
        assert!(check("Device::download").is_ok());
        {
            let _op = IssuingOp::enter("dqn", "trunk_forward", None);
            let e = check("Device::download").unwrap_err();
            assert_eq!(
                e.to_string(),
                "op `trunk_forward` of step `dqn` called `Device::download` while it was \
                 being issued: a host-side call inside an op breaks or escapes the capture; \
                 make it before or after the step's replay"
            );
            {
                let _inner = IssuingOp::enter("other", "inner", None);
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
