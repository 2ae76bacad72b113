//! The capture guard: no work outside the capture.
//!
//! Code an op calls may reach CUDA without this crate: cudarc through a buffer's slice,
//! raw driver calls, cuBLASLt, a library of the program's own. While a step is captured
//! ([`watch_capture`]), CUPTI calls back on every driver and runtime API call; a call
//! made while an op is issued ([`WatchingOp`]) that enqueues work on any stream but the
//! op's own, waits for the GPU, allocates, or steers a capture is recorded and fails the
//! op ([`WatchingOp::leave`]), naming the call. The cost is the capture's: the callbacks
//! are off between captures and during replays.
//!
//! It sees the thread that issues the op, which is where an op's code and every library
//! it calls run; work an op hands to a thread of its own is beyond it.

mod calls;
mod cupti;

use std::cell::RefCell;

use crate::error::{Error, Result};

thread_local! {
    /// What the capture guard saw of the op being issued, when it watches.
    static WATCH: RefCell<Option<OpWatch>> = const { RefCell::new(None) };
}

/// Watches the calls of the op being issued on this thread until it is left or dropped
/// (also when the op panics), restoring whatever was watched before.
pub(crate) struct WatchingOp {
    before: Option<OpWatch>,
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

impl WatchingOp {
    /// Watches the op's calls against `watch`; with `None`, watches nothing (an eager
    /// run, or the guard turned off).
    pub(crate) fn enter(watch: Option<Watch>) -> WatchingOp {
        let before = WATCH.with(|w| {
            w.replace(watch.map(|watch| OpWatch {
                watch,
                first: None,
                count: 0,
            }))
        });
        WatchingOp { before }
    }

    /// Ends the watch and returns the first call that escaped the op's capture, with
    /// how many more did.
    pub(crate) fn leave(self) -> Option<(Escaped, usize)> {
        let watched = WATCH.with(|w| w.borrow_mut().take());
        // `self` drops here, restoring what was watched before.
        let watched = watched?;
        let more = watched.count.saturating_sub(1);
        watched.first.map(|e| (e, more))
    }
}

impl Drop for WatchingOp {
    fn drop(&mut self) {
        let before = self.before.take();
        WATCH.with(|w| *w.borrow_mut() = before);
    }
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
    if crate::scope::exempted() {
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
