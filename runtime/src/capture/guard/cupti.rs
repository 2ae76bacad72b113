//! The few CUPTI entry points the capture guard uses: a subscriber to the driver and
//! runtime API callbacks, enabled while a step is captured and dropped after.
//!
//! CUPTI ships with the CUDA toolkit (`libcupti.so`, on the loader's path in the
//! toolkit's `targets/<arch>/lib` or `extras/CUPTI/lib64`) and in the `nvidia-cuda-cupti`
//! wheels. It is loaded on the first guarded capture, by file name and then from the
//! toolkit's usual folders. One subscriber at a time per process is all CUPTI 12 and 13
//! allow: a profiler or compute-sanitizer that holds it makes the subscription fail, and
//! the guard says so.
//!
//! [CUPTI callback API](https://docs.nvidia.com/cupti/api/group__CUPTI__CALLBACK__API.html)

use std::ffi::{CStr, c_char, c_void};
use std::sync::{Mutex, OnceLock};

/// `CUptiResult`.
type CuptiResult = u32;
const CUPTI_SUCCESS: CuptiResult = 0;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`.
const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS: CuptiResult = 39;

/// `CUpti_CallbackDomain`.
pub(crate) const DOMAIN_DRIVER_API: u32 = 1;
pub(crate) const DOMAIN_RUNTIME_API: u32 = 2;

/// `CUpti_ApiCallbackSite::CUPTI_API_ENTER`.
pub(crate) const API_ENTER: u32 = 0;

/// `CUpti_SubscriberHandle`.
type Subscriber = *mut c_void;

/// `CUpti_CallbackFunc`.
pub(crate) type Callback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// `CUpti_CallbackData`: what a driver or runtime API callback receives.
#[repr(C)]
pub(crate) struct CallbackData {
    pub callback_site: u32,
    pub function_name: *const c_char,
    pub function_params: *const c_void,
    pub function_return_value: *mut c_void,
    pub symbol_name: *const c_char,
    pub context: *mut c_void,
    pub context_uid: u32,
    pub correlation_data: *mut u64,
    pub correlation_id: u32,
}

/// The library and the entry points the guard calls.
struct Cupti {
    subscribe: unsafe extern "C" fn(*mut Subscriber, Callback, *mut c_void) -> CuptiResult,
    unsubscribe: unsafe extern "C" fn(Subscriber) -> CuptiResult,
    enable_domain: unsafe extern "C" fn(u32, Subscriber, u32) -> CuptiResult,
    result_string: unsafe extern "C" fn(CuptiResult, *mut *const c_char) -> CuptiResult,
    finalize: unsafe extern "C" fn() -> CuptiResult,
    /// Where it was loaded from, for messages.
    path: String,
    /// Kept loaded for the life of the process: the entry points above point into it.
    _lib: libloading::Library,
}

/// The file names tried first (the loader's path and cache), newest CUDA first.
const NAMES: &[&str] = &["libcupti.so.13", "libcupti.so.12", "libcupti.so"];

/// Toolkit folders tried after the names, under `CUDA_HOME`, `CUDA_PATH` and
/// `/usr/local/cuda`.
const TOOLKIT_DIRS: &[&str] = &["extras/CUPTI/lib64", "targets/x86_64-linux/lib", "lib64"];

fn load() -> Result<Cupti, String> {
    let roots: Vec<String> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .chain(["/usr/local/cuda".to_string()])
        .collect();
    let candidates: Vec<String> = NAMES
        .iter()
        .map(|n| n.to_string())
        .chain(roots.iter().flat_map(|root| {
            TOOLKIT_DIRS
                .iter()
                .flat_map(move |dir| NAMES.iter().map(move |n| format!("{root}/{dir}/{n}")))
        }))
        .collect();
    for path in &candidates {
        // SAFETY: loading CUPTI runs its initialisers, which only register the library
        // with the driver's tools interface; nothing of it runs until subscribed.
        let Ok(lib) = (unsafe { libloading::Library::new(path) }) else {
            continue;
        };
        return bind(lib, path.clone());
    }
    Err(format!(
        "the CUPTI library (libcupti, part of the CUDA toolkit and of the nvidia-cuda-cupti \
         wheels) was not found: looked for {}; add its folder to LD_LIBRARY_PATH or set \
         CUDA_HOME",
        candidates.join(", ")
    ))
}

fn bind(lib: libloading::Library, path: String) -> Result<Cupti, String> {
    /// One entry point, copied out of the library, which the caller keeps loaded.
    fn entry<T: Copy>(lib: &libloading::Library, path: &str, name: &str) -> Result<T, String> {
        // SAFETY: `T` is the entry point's C signature, written from CUPTI's headers.
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|e| format!("{path} has no `{name}`: {e}"))
    }
    Ok(Cupti {
        subscribe: entry(&lib, &path, "cuptiSubscribe")?,
        unsubscribe: entry(&lib, &path, "cuptiUnsubscribe")?,
        enable_domain: entry(&lib, &path, "cuptiEnableDomain")?,
        result_string: entry(&lib, &path, "cuptiGetResultString")?,
        finalize: entry(&lib, &path, "cuptiFinalize")?,
        path,
        _lib: lib,
    })
}

fn cupti() -> Result<&'static Cupti, String> {
    static CUPTI: OnceLock<Result<Cupti, String>> = OnceLock::new();
    CUPTI.get_or_init(load).as_ref().map_err(Clone::clone)
}

impl Cupti {
    /// What a failed call returned, in CUPTI's words.
    fn describe(&self, call: &str, code: CuptiResult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; CUPTI returns a static string.
        let named = unsafe { (self.result_string)(code, &mut text) } == CUPTI_SUCCESS;
        let name = if named && !text.is_null() {
            // SAFETY: non-null, NUL-terminated, static (CUPTI's table of messages).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUPTI error {code}")
        };
        if code == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS {
            format!(
                "{call} failed ({name}): another tool holds CUPTI in this process (a profiler \
                 such as Nsight Systems or Nsight Compute, or compute-sanitizer), and CUPTI \
                 takes one subscriber"
            )
        } else {
            format!("{call} ({}) failed: {name}", self.path)
        }
    }
}

/// The process's one subscription, shared by every guarded capture in flight (the ranks
/// of a data-parallel step capture on threads of their own at once).
struct Subscription {
    handle: Subscriber,
    users: usize,
}

// SAFETY: the handle is an opaque token CUPTI hands out and accepts from any thread.
unsafe impl Send for Subscription {}

static SUBSCRIPTION: Mutex<Subscription> = Mutex::new(Subscription {
    handle: std::ptr::null_mut(),
    users: 0,
});

/// Holds the callbacks on while it lives: the first holder subscribes and enables the
/// driver and runtime API domains, the last one unsubscribes and detaches CUPTI, so that
/// between captures CUPTI is free for other tools and no call or replay pays for it.
pub(crate) struct Watching(());

impl Watching {
    pub(crate) fn start(callback: Callback) -> Result<Watching, String> {
        let cupti = cupti()?;
        let mut sub = SUBSCRIPTION.lock().unwrap_or_else(|e| e.into_inner());
        if sub.users == 0 {
            let mut handle: Subscriber = std::ptr::null_mut();
            // SAFETY: a valid out-pointer and a callback that stays valid for the life of
            // the process (a plain function); no user data.
            let code = unsafe { (cupti.subscribe)(&mut handle, callback, std::ptr::null_mut()) };
            if code != CUPTI_SUCCESS {
                return Err(cupti.describe("cuptiSubscribe", code));
            }
            for domain in [DOMAIN_DRIVER_API, DOMAIN_RUNTIME_API] {
                // SAFETY: `handle` is the subscription just made.
                let code = unsafe { (cupti.enable_domain)(1, handle, domain) };
                if code != CUPTI_SUCCESS {
                    // SAFETY: as above; the subscription is dropped again.
                    unsafe { (cupti.unsubscribe)(handle) };
                    return Err(cupti.describe("cuptiEnableDomain", code));
                }
            }
            sub.handle = handle;
        }
        sub.users += 1;
        Ok(Watching(()))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut sub = SUBSCRIPTION.lock().unwrap_or_else(|e| e.into_inner());
        sub.users = sub.users.saturating_sub(1);
        if sub.users > 0 || sub.handle.is_null() {
            return;
        }
        if let Ok(cupti) = cupti() {
            // SAFETY: the subscription made by the first holder; nobody holds it now.
            // Unsubscribing also disables its domains. A failure leaves a subscriber that
            // calls back into a function that ignores threads issuing no op: harmless.
            unsafe { (cupti.unsubscribe)(sub.handle) };
            // Unsubscribed but attached, CUPTI keeps the driver's tool hooks on: a
            // 500-node graph's replay then cost 113 us of host time against 5 us, and its
            // device time rose 6% (H200). Detaching costs the next capture CUPTI's start
            // again (about 9 ms) and makes replays what they are without the guard.
            // SAFETY: called outside any callback, with no subscriber left; the next
            // subscription attaches CUPTI again.
            unsafe { (cupti.finalize)() };
        }
        sub.handle = std::ptr::null_mut();
    }
}
