//! Buffers that several steps use: [`Shared`], and the order it keeps between the steps'
//! launches.
//!
//! A step's graph refers to its buffers by address, and two steps' graphs run on their
//! own streams: an act step reading the parameters an update step writes would race with
//! it unless something orders them. A `Shared` buffer carries that order. Each launch of
//! a step that uses it (a replay, a loop, an eager run, a timing) first makes the step's
//! origin stream wait for the launches it depends on, and then records where it stands:
//!
//! - a step that writes the buffer waits for its last writer and for every reader since;
//! - a step that only reads it waits for its last writer.
//!
//! So the steps run in the order the host launches them, as if on one stream, while
//! steps that only read run side by side. Nothing is copied: each step's graph uses the
//! one allocation.

use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{Error, Result};
use crate::op::buffer::StepBuffer;

/// Device memory that several steps use: the parameters that an act step reads and an
/// update step writes, a replay buffer, environment state.
///
/// Each step names it in its `#[buffers]` struct as a field marked `#[shared]`, holding a
/// clone of one `Shared` (clones are handles to the same memory). Its ops take the inner
/// value as any buffer: `&T` to read it, `&mut T` to write it. Launches of the steps that
/// share it run in the order the host makes them (see the module's page), and a step
/// refuses to run on memory that another step's `rebind` has replaced since it was
/// captured, naming both ([`Error::SharedRebound`]).
///
/// ```no_run
/// use stepgraph::{Device, DeviceBuffer, Shared};
///
/// #[stepgraph::step(streams(main))]
/// mod act {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};
///
///     #[buffers]
///     pub struct Buffers {
///         #[shared]
///         pub params: Shared<DeviceBuffer<f32>>,
///         pub actions: DeviceBuffer<f32>,
///     }
///
///     fn act(s: &CaptureStream<'_>, params: &DeviceBuffer<f32>, actions: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.copy(params, actions) // stands for a policy's forward pass
///     }
/// }
///
/// #[stepgraph::step(streams(main))]
/// mod update {
///     use stepgraph::{CaptureStream, DeviceBuffer, Result, Shared};
///
///     #[buffers]
///     pub struct Buffers {
///         #[shared]
///         pub params: Shared<DeviceBuffer<f32>>,
///     }
///
///     fn sgd(s: &CaptureStream<'_>, params: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.memset_zeros(params) // stands for an optimiser step
///     }
/// }
///
/// let device = Device::new(0)?;
/// let params = Shared::new("params", device.upload_new("params", &[1.0f32; 64])?);
/// let mut act = act::Step::new(&device, (), act::Buffers {
///     params: params.clone(),
///     actions: device.alloc_zeros("actions", 64)?,
/// }, act::Config {})?;
/// let mut update = update::Step::new(&device, (), update::Buffers { params: params.clone() }, update::Config {})?;
/// act.replay()?;    // reads the parameters
/// update.replay()?; // waits for `act`, then writes them
/// act.replay()?;    // waits for `update`: sees the new values
/// let actions = act.download(|b| &b.actions)?;
/// assert!(actions.iter().all(|&a| a == 0.0));
/// let host: Vec<f32> = device.download(&*params.host()?)?; // waits for every step
/// # Ok::<(), stepgraph::Error>(())
/// ```
///
/// The host reaches the memory through [`Shared::host`], which first waits for every
/// launch of every step that uses it.
pub struct Shared<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

struct Inner<T> {
    name: String,
    value: RwLock<T>,
    state: Mutex<State>,
    /// Held across a step's launch, from its waits to its record, and while the host
    /// takes the buffer: what one launch reads of the others' is never half-written.
    order: Mutex<()>,
}

/// How the host is named among a buffer's holders.
const HOST: &str = "the host";

/// Where the steps that use a shared buffer stand with it.
#[derive(Default)]
pub(crate) struct State {
    /// Counts the times its memory was replaced (a rebind that moved it).
    generation: u64,
    /// The step whose rebind replaced it last (`None`: the host, outside any rebind).
    rebound_by: Option<&'static str>,
    /// The last launch that writes it.
    last_write: Option<Fence>,
    /// The launches since that only read it, one per step.
    reads: Vec<Fence>,
    /// The steps whose ops hold it now (a capture or an eager run under way).
    holders: Vec<&'static str>,
}

/// A step's launch, as the steps after it wait for it: the event its origin stream
/// records after each launch (a later record of the same step only orders more).
#[derive(Clone)]
pub(crate) struct Fence {
    /// Tells two steps of one name apart.
    pub(crate) owner: u64,
    pub(crate) event: Arc<CudaEvent>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state is plain data, consistent after every statement: a panic elsewhere while
    // it was held leaves nothing half-written.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<T> Shared<T> {
    /// Shares `value` between steps; `name` names it in errors.
    pub fn new(name: impl Into<String>, value: T) -> Shared<T> {
        Shared {
            inner: Arc::new(Inner {
                name: name.into(),
                value: RwLock::new(value),
                state: Mutex::new(State::default()),
                order: Mutex::new(()),
            }),
        }
    }

    /// The name given at [`Shared::new`].
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether `other` is a handle to the same memory.
    pub fn same(&self, other: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl<T: StepBuffer> Shared<T> {
    /// Waits for every launch of every step that uses the buffer, then gives the host
    /// the value: to copy it to or from the host (in place, which keeps every step's
    /// graph valid), or to replace it. A value replaced by other memory (found when the
    /// guard is dropped) makes each step that captured the old memory refuse to run
    /// until it is captured again ([`Step::recapture`](crate::Step::recapture)); within a
    /// step's [`rebind`](crate::Step::rebind), that step is captured again at once and
    /// named in the others' errors.
    ///
    /// Fails if a step's ops hold the value now (a capture on another thread).
    pub fn host(&self) -> Result<SharedHost<'_, T>> {
        // Named among the holders first, under the launch order: a launch after this
        // refuses to start, and one before it is among the fences waited for.
        let held = {
            let _order = lock(&self.inner.order);
            Held::new(&self.inner.state, HOST)
        };
        let fences: Vec<Fence> = {
            let state = lock(&self.inner.state);
            state
                .last_write
                .iter()
                .chain(&state.reads)
                .cloned()
                .collect()
        };
        for f in &fences {
            f.event
                .synchronize()
                .map_err(Error::driver("cuEventSynchronize"))?;
        }
        let value = self.write_for(HOST)?;
        let mut before = Vec::new();
        let known = value.__regions(&mut before);
        Ok(SharedHost {
            shared: self,
            value,
            before: known.then_some(before),
            _held: held,
        })
    }

    fn write_for(&self, who: &'static str) -> Result<RwLockWriteGuard<'_, T>> {
        match self.inner.value.try_write() {
            Ok(g) => Ok(g),
            Err(TryLockError::Poisoned(e)) => Ok(e.into_inner()),
            Err(TryLockError::WouldBlock) => Err(self.busy(who)),
        }
    }

    fn busy(&self, who: &'static str) -> Error {
        let state = lock(&self.inner.state);
        Error::SharedBusy {
            buffer: self.inner.name.clone(),
            step: who,
            holder: state
                .holders
                .iter()
                .copied()
                .find(|&h| h != who)
                .unwrap_or("another thread"),
        }
    }
}

/// The host's hold on a [`Shared`] buffer, from [`Shared::host`]: no step launch uses the
/// memory, and none can capture it, while it lives.
pub struct SharedHost<'a, T: StepBuffer> {
    shared: &'a Shared<T>,
    value: RwLockWriteGuard<'a, T>,
    /// Where the memory lay when the host took it (`None`: the value cannot tell).
    before: Option<Vec<(u64, usize)>>,
    _held: Held<'a>,
}

impl<T: StepBuffer> std::fmt::Debug for SharedHost<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedHost")
            .field("name", &self.shared.inner.name)
            .finish_non_exhaustive()
    }
}

impl<T: StepBuffer> std::ops::Deref for SharedHost<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: StepBuffer> std::ops::DerefMut for SharedHost<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: StepBuffer> Drop for SharedHost<'_, T> {
    fn drop(&mut self) {
        let mut after = Vec::new();
        let known = self.value.__regions(&mut after);
        // A value that cannot tell where it lies counts as moved: a graph of the old
        // memory must not run on the new.
        let moved = match (&self.before, known) {
            (Some(before), true) => *before != after,
            _ => true,
        };
        if moved {
            let mut state = lock(&self.shared.inner.state);
            state.generation += 1;
            state.rebound_by = rebinding::current();
        }
    }
}

/// The step whose `rebind` runs on this thread, if any: it is named as the one that
/// replaced a shared buffer's memory.
pub(crate) mod rebinding {
    use std::cell::Cell;

    thread_local! {
        static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
    }

    pub(crate) fn current() -> Option<&'static str> {
        CURRENT.with(Cell::get)
    }

    /// Runs `f` as step `step`'s rebind.
    pub(crate) fn within<R>(step: &'static str, f: impl FnOnce() -> R) -> R {
        let outer = CURRENT.with(|c| c.replace(Some(step)));
        let out = f();
        CURRENT.with(|c| c.set(outer));
        out
    }
}

/// An op's hold on a shared buffer while it is issued: `&T` through a read hold, `&mut T`
/// through a write hold.
#[doc(hidden)]
pub struct SharedRead<'a, T> {
    value: RwLockReadGuard<'a, T>,
    _held: Held<'a>,
}

#[doc(hidden)]
pub struct SharedWrite<'a, T> {
    value: RwLockWriteGuard<'a, T>,
    _held: Held<'a>,
}

impl<T> std::fmt::Debug for SharedRead<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRead").finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for SharedWrite<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWrite").finish_non_exhaustive()
    }
}

impl<T> std::ops::Deref for SharedRead<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::Deref for SharedWrite<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for SharedWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

/// Names a step among a buffer's holders while it holds it.
struct Held<'a> {
    state: &'a Mutex<State>,
    step: &'static str,
}

impl<'a> Held<'a> {
    fn new(state: &'a Mutex<State>, step: &'static str) -> Held<'a> {
        lock(state).holders.push(step);
        Held { state, step }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut state = lock(self.state);
        if let Some(i) = state.holders.iter().position(|&s| s == self.step) {
            state.holders.remove(i);
        }
    }
}

/// The shared buffer `shared`, read by an op of step `step` (generated code).
#[doc(hidden)]
pub fn shared_read<'a, T: StepBuffer>(
    shared: &'a Shared<T>,
    step: &'static str,
) -> Result<SharedRead<'a, T>> {
    let value = match shared.inner.value.try_read() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return Err(shared.busy(step)),
    };
    Ok(SharedRead {
        value,
        _held: Held::new(&shared.inner.state, step),
    })
}

/// The shared buffer `shared`, written by an op of step `step` (generated code).
#[doc(hidden)]
pub fn shared_write<'a, T: StepBuffer>(
    shared: &'a Shared<T>,
    step: &'static str,
) -> Result<SharedWrite<'a, T>> {
    let value = shared.write_for(step)?;
    Ok(SharedWrite {
        value,
        _held: Held::new(&shared.inner.state, step),
    })
}

/// What a `#[shared]` field holds: a [`Shared`] of step buffers.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a #[shared] buffer of a step",
    label = "not a `stepgraph::Shared<T>`",
    note = "a #[shared] field holds a `stepgraph::Shared<T>`, whose `T` is a step buffer (a DeviceBuffer, a struct of them with #[derive(StepBuffer)], ..); every step that uses it holds a clone"
)]
#[doc(hidden)]
pub trait SharedBuffer {}

impl<T: StepBuffer + Send + Sync + 'static> SharedBuffer for Shared<T> {}

/// Checks, where the field is written, that a `#[shared]` field holds a [`Shared`]
/// (generated code).
#[doc(hidden)]
pub const fn assert_shared<T: SharedBuffer>() {}

/// A step's use of one shared buffer, as its spec lists them (generated code).
#[doc(hidden)]
pub struct SharedUse {
    pub(crate) cell: Arc<dyn SharedCell + Send + Sync>,
    /// The field of the step's buffers.
    pub(crate) field: &'static str,
    /// Whether an op of the step writes it.
    pub(crate) writes: bool,
}

/// The use of `shared` by a step's ops: written by one of them, or only read (generated
/// code).
#[doc(hidden)]
pub fn shared_use<T: StepBuffer + Send + Sync + 'static>(
    shared: &Shared<T>,
    field: &'static str,
    writes: bool,
) -> SharedUse {
    SharedUse {
        cell: Arc::clone(&shared.inner) as Arc<dyn SharedCell + Send + Sync>,
        field,
        writes,
    }
}

impl std::fmt::Debug for SharedUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedUse")
            .field("buffer", &self.cell.name())
            .field("field", &self.field)
            .field("writes", &self.writes)
            .finish()
    }
}

/// What a step needs of a shared buffer, whatever it holds.
pub(crate) trait SharedCell {
    fn name(&self) -> &str;
    fn state(&self) -> &Mutex<State>;
    fn order(&self) -> &Mutex<()>;
    /// Identifies the memory's handle: equal for clones.
    fn key(&self) -> usize;
}

impl<T> SharedCell for Inner<T> {
    fn name(&self) -> &str {
        &self.name
    }
    fn state(&self) -> &Mutex<State> {
        &self.state
    }
    fn order(&self) -> &Mutex<()> {
        &self.order
    }
    fn key(&self) -> usize {
        self as *const Inner<T> as *const () as usize
    }
}

/// A step's side of its shared buffers: who it is, the event its launches record, and
/// the memory it captured.
pub(crate) struct Sharing {
    step: &'static str,
    owner: u64,
    event: Option<Arc<CudaEvent>>,
    /// The generation of each use (in the spec's order) at the last capture.
    captured: Vec<u64>,
}

impl Sharing {
    pub(crate) fn new(step: &'static str) -> Sharing {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Sharing {
            step,
            owner: NEXT.fetch_add(1, Ordering::Relaxed),
            event: None,
            captured: Vec::new(),
        }
    }

    /// Notes the memory a capture used.
    pub(crate) fn captured(&mut self, uses: &[SharedUse]) {
        self.captured = uses
            .iter()
            .map(|u| lock(u.cell.state()).generation)
            .collect();
    }

    /// Runs `launch` (which puts work on `origin`) in order with the other steps that use
    /// these buffers: `origin` first waits for the launches this one depends on, then
    /// records this launch for the launches after it. Refuses memory replaced since the
    /// capture, naming the step that replaced it.
    pub(crate) fn launch<R>(
        &mut self,
        uses: &[SharedUse],
        origin: &CudaStream,
        launch: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        if uses.is_empty() {
            return launch();
        }
        // Each buffer's launch order, taken in address order, so that two threads
        // launching steps that share buffers cannot each hold one the other needs. The
        // states are locked only briefly: the ops issued by `launch` (an eager run) take
        // them too.
        let mut order: Vec<usize> = (0..uses.len()).collect();
        order.sort_by_key(|&i| uses[i].cell.key());
        order.dedup_by_key(|i| uses[*i].cell.key());
        let _ordered: Vec<MutexGuard<'_, ()>> =
            order.iter().map(|&i| lock(uses[i].cell.order())).collect();
        let writes = |key: usize| uses.iter().any(|u| u.writes && u.cell.key() == key);
        let mut waits: Vec<Fence> = Vec::new();
        for &i in &order {
            let (cell, state) = (&uses[i].cell, lock(uses[i].cell.state()));
            if self.captured.get(i).copied() != Some(state.generation) {
                return Err(Error::SharedRebound {
                    step: self.step,
                    buffer: cell.name().to_string(),
                    field: uses[i].field,
                    by: state.rebound_by,
                });
            }
            if state.holders.contains(&HOST) {
                return Err(Error::SharedBusy {
                    buffer: cell.name().to_string(),
                    step: self.step,
                    holder: HOST,
                });
            }
            let after_reads = if writes(cell.key()) {
                &state.reads[..]
            } else {
                &[]
            };
            for f in state.last_write.iter().chain(after_reads) {
                if f.owner != self.owner && !waits.iter().any(|w| w.owner == f.owner) {
                    waits.push(f.clone());
                }
            }
        }
        // Made before the launch: once work is queued, this launch must be recorded.
        let event = match &self.event {
            Some(e) => Arc::clone(e),
            None => {
                let e = Arc::new(crate::driver::event::ordering_event(origin.context())?);
                self.event = Some(Arc::clone(&e));
                e
            }
        };
        for f in &waits {
            origin
                .wait(&f.event)
                .map_err(Error::driver("cuStreamWaitEvent"))?;
        }
        let out = launch()?;
        event
            .record(origin)
            .map_err(Error::driver("cuEventRecord"))?;
        let me = Fence {
            owner: self.owner,
            event,
        };
        for &i in &order {
            let mut state = lock(uses[i].cell.state());
            if writes(uses[i].cell.key()) {
                state.last_write = Some(me.clone());
                state.reads.clear();
            } else {
                state.reads.retain(|f| f.owner != me.owner);
                state.reads.push(me.clone());
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceBuffer;

    #[test]
    fn clones_are_the_same_memory_and_new_values_are_not() {
        let a: Shared<Vec<DeviceBuffer<f32>>> = Shared::new("a", Vec::new());
        let b = a.clone();
        let c: Shared<Vec<DeviceBuffer<f32>>> = Shared::new("a", Vec::new());
        assert!(a.same(&b));
        assert!(!a.same(&c));
        assert_eq!(b.name(), "a");
    }

    #[test]
    fn a_held_buffer_names_its_holder_to_another_step() {
        let s: Shared<[DeviceBuffer<f32>; 0]> = Shared::new("params", []);
        let held = shared_write(&s, "update").expect("free");
        let Err(e) = shared_read(&s, "act") else {
            panic!("a buffer held for writing was read");
        };
        let text = e.to_string();
        assert!(
            text.contains("`act`") && text.contains("`update`") && text.contains("`params`"),
            "{text}"
        );
        drop(held);
        let r1 = shared_read(&s, "act").expect("free again");
        let r2 = shared_read(&s, "evaluate").expect("two readers");
        assert!(shared_write(&s, "update").is_err());
        drop((r1, r2));
        assert!(shared_write(&s, "update").is_ok());
    }

    #[test]
    fn a_rebind_is_named_by_the_step_that_ran_it() {
        assert_eq!(rebinding::current(), None);
        let inner = rebinding::within("update", rebinding::current);
        assert_eq!(inner, Some("update"));
        assert_eq!(rebinding::current(), None);
    }
}
