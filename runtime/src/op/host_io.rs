//! Host-fed inputs and read-backs that do not stall the training loop.
//!
//! A [`HostInput`] is two pinned staging slots that an op copies into device memory with
//! [`CaptureStream::stage`](crate::CaptureStream::stage); a [`HostOutput`] is four pinned
//! slots that an op copies device memory into with
//! [`CaptureStream::read_back`](crate::CaptureStream::read_back). Both copies are memcpy
//! nodes of the one graph, so they run on the copy engines in stream order with the
//! step's kernels. Before each replay the executor points each node at the slot that
//! replay owns (`cuGraphExecMemcpyNodeSetParams`, a microsecond of host time and no
//! re-capture), and after it records one event, so the host knows when each slot is free:
//!
//! - an input's next slot is handed to the host ([`Step::fill`](crate::Step::fill)) only
//!   once the replay that last read it has finished, while the replay that reads the other
//!   slot may still run: the host fills batch n+1 while replay n runs;
//! - an output's slots are written by replays in turn, and the host reads the newest one
//!   whose replay has finished ([`Step::read_back`](crate::Step::read_back)), one or more
//!   steps late, without waiting.
//!
//! The borrows make the rest impossible to write: a slot is written through a closure
//! while the step is borrowed mutably, and a read-back borrows the step, so no replay can
//! be launched while the host holds either; and at most [`MAX_IN_FLIGHT`] replays are in
//! flight, so a queued replay never writes the slot the host reads.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DeviceRepr, ValidAsZeroBits};

use crate::driver::device::Device;
use crate::driver::graph::{CUDA_MEMCPY3D, CUgraphExec, CUgraphNode};
use crate::error::{Error, Result};

/// Staging slots of a [`HostInput`]: the host fills one while a replay reads the other.
pub const INPUT_SLOTS: usize = 2;

/// Slots of a [`HostOutput`]: one per replay in flight, and the one the host reads.
pub const OUTPUT_SLOTS: usize = 4;

/// The most replays of a step with host inputs or outputs that are in flight at once:
/// launching one more first waits for the oldest. Fewer than [`OUTPUT_SLOTS`], so the
/// replays in flight never write the slot of the newest finished one.
pub const MAX_IN_FLIGHT: u64 = OUTPUT_SLOTS as u64 - 1;

/// Which way a ring's copies go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Host slots to device memory ([`HostInput`]).
    ToDevice,
    /// Device memory to host slots ([`HostOutput`]).
    ToHost,
}

/// One page-locked allocation, freed on drop.
struct Pinned {
    ptr: *mut u8,
    ctx: Arc<CudaContext>,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` in `Ring::new` and is freed once, after
        // every graph that copies from or to it (each holds the ring's Arc).
        self.ctx
            .record_err(unsafe { crate::driver::transfer::free_host(self.ptr) });
    }
}

/// The pinned slots of one input or output and which replay used each last: shared by
/// the [`HostInput`]/[`HostOutput`] and the graph whose nodes copy from or to them, so
/// the memory outlives both.
pub(crate) struct Ring {
    pub(crate) what: String,
    pub(crate) direction: Direction,
    slots: Vec<Pinned>,
    /// Bytes per slot.
    pub(crate) bytes: usize,
    state: Mutex<RingState>,
}

// SAFETY: the slots are plain page-locked memory owned by the ring; the host touches them
// only through `Step::fill` (a slot no replay uses, the step borrowed mutably) and
// `Step::read_back` (a slot whose replay has finished), and the state is behind a mutex.
unsafe impl Send for Ring {}
// SAFETY: as above; shared access reads the pointers and locks the state.
unsafe impl Sync for Ring {}

/// Which slot each replay used, in terms of one executor's replay numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RingState {
    /// Per slot, the replay (1, 2, ..) that last read or wrote it; 0 for none.
    pub(crate) used_by: Vec<u64>,
    /// An input's slot that the next replay reads: the one the host filled last.
    pub(crate) current: usize,
    /// The slot the latest replay used.
    pub(crate) last: Option<usize>,
    /// The executor whose graph copies from or to the ring, once one has captured it.
    pub(crate) owner: Option<u64>,
}

impl RingState {
    fn new(slots: usize) -> RingState {
        RingState {
            used_by: vec![0; slots],
            ..RingState::default()
        }
    }

    /// The slot an input's next fill writes: not the one the latest replay read (which
    /// may still be running), so the other one. Before any replay, the current one.
    pub(crate) fn next_fill(&self) -> usize {
        match self.last {
            Some(last) => (last + 1) % self.used_by.len(),
            None => self.current,
        }
    }

    /// The slot replay `seq` uses: an input's current one, an output's turn.
    pub(crate) fn slot_for(&self, direction: Direction, seq: u64) -> usize {
        match direction {
            Direction::ToDevice => self.current,
            Direction::ToHost => (seq % self.used_by.len() as u64) as usize,
        }
    }

    /// Marks `slot` used by replay `seq`.
    pub(crate) fn mark(&mut self, slot: usize, seq: u64) {
        self.used_by[slot] = seq;
        self.last = Some(slot);
    }

    /// An output's slots, newest replay first (slots never written left out).
    pub(crate) fn newest_first(&self) -> Vec<(u64, usize)> {
        let mut used: Vec<(u64, usize)> = self
            .used_by
            .iter()
            .enumerate()
            .filter(|(_, seq)| **seq > 0)
            .map(|(slot, &seq)| (seq, slot))
            .collect();
        used.sort_by(|a, b| b.cmp(a));
        used
    }
}

impl Ring {
    fn new(
        device: &Device,
        what: &str,
        direction: Direction,
        slots: usize,
        bytes: usize,
    ) -> Result<Ring> {
        crate::scope::check(match direction {
            Direction::ToDevice => "HostInput::new",
            Direction::ToHost => "HostOutput::new",
        })?;
        if bytes == 0 {
            return Err(Error::HostIo {
                buffer: what.to_string(),
                problem: "has no elements: expected at least one; the driver copies no \
                          empty range"
                    .into(),
            });
        }
        let ctx = device.context().clone();
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let slots = (0..slots)
            .map(|i| {
                // SAFETY: a plain page-locked allocation of `bytes` bytes, zeroed below
                // before anything reads it.
                let ptr = crate::driver::transfer::malloc_host(bytes).map_err(
                    device.alloc_error(&format!("slot {i} of `{what}` (pinned)"), bytes),
                )?;
                // SAFETY: `ptr` holds `bytes` writable bytes.
                unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
                Ok(Pinned {
                    ptr,
                    ctx: ctx.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Ring {
            what: what.to_string(),
            direction,
            state: Mutex::new(RingState::new(slots.len())),
            slots,
            bytes,
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, RingState> {
        // A panic while the lock was held cannot leave the plain-data state torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn slot_ptr(&self, slot: usize) -> *mut u8 {
        self.slots[slot].ptr
    }

    /// Binds the ring to executor `owner`, refusing a second one: the slots' bookkeeping
    /// is in one executor's replay numbers.
    pub(crate) fn bind(&self, owner: u64) -> Result<()> {
        let mut st = self.state();
        match st.owner {
            Some(o) if o != owner => Err(Error::HostIo {
                buffer: self.what.clone(),
                problem: "is copied by the graph of another step: a host input or output belongs \
                          to one step"
                    .into(),
            }),
            _ => {
                st.owner = Some(owner);
                Ok(())
            }
        }
    }

    /// Fails unless executor `owner` captured a copy from or to the ring.
    pub(crate) fn check_owner(&self, owner: u64, step: &str) -> Result<()> {
        match self.state().owner {
            Some(o) if o == owner => Ok(()),
            _ => Err(Error::HostIo {
                buffer: self.what.clone(),
                problem: format!(
                    "is not copied by any op of step `{step}`: expected an op that calls \
                     CaptureStream::{} with it",
                    match self.direction {
                        Direction::ToDevice => "stage",
                        Direction::ToHost => "read_back",
                    }
                ),
            }),
        }
    }
}

/// An input the host feeds every step: two pinned staging slots that an op copies into
/// device memory inside the graph ([`CaptureStream::stage`](crate::CaptureStream::stage)),
/// the slot the host filled last at each replay. The host fills the next slot with
/// [`Step::fill`](crate::Step::fill) (or [`Step::stage`](crate::Step::stage)) while the
/// replay that reads the other one runs; a slot still being read is never handed out.
///
/// ```no_run
/// #[stepgraph::step(streams(main))]
/// mod feed {
///     use stepgraph::{CaptureStream, DeviceBuffer, HostInput, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub batch_in: HostInput<f32>,
///         pub batch: DeviceBuffer<f32>,
///     }
///
///     fn load(s: &CaptureStream<'_>, batch_in: &HostInput<f32>, batch: &mut DeviceBuffer<f32>) -> Result<()> {
///         s.stage(batch_in, batch)
///     }
/// }
///
/// let device = stepgraph::Device::new(0)?;
/// let buffers = feed::Buffers {
///     batch_in: stepgraph::HostInput::new(&device, "batch_in", 1024)?,
///     batch: device.alloc_zeros("batch", 1024)?,
/// };
/// let mut step = feed::Step::new(&device, (), buffers, feed::Config {})?;
/// for t in 0..10 {
///     // Waits only for the replay two steps back, which read this slot.
///     step.fill(|b| &b.batch_in, |slot| slot.fill(t as f32))?;
///     step.replay()?; // returns at once: the next fill overlaps this replay
/// }
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct HostInput<T> {
    pub(crate) ring: Arc<Ring>,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

/// Values the graph copies back to the host every replay, into the next of four pinned
/// slots ([`CaptureStream::read_back`](crate::CaptureStream::read_back)): the host reads
/// the newest finished one with [`Step::read_back`](crate::Step::read_back), a step or
/// more late, without waiting for the GPU.
///
/// ```no_run
/// #[stepgraph::step(streams(main))]
/// mod watch {
///     use stepgraph::{CaptureStream, DeviceBuffer, HostOutput, Result};
///
///     #[buffers]
///     pub struct Buffers {
///         pub loss: DeviceBuffer<f32>,
///         pub loss_out: HostOutput<f32>,
///     }
///
///     fn report(s: &CaptureStream<'_>, loss: &DeviceBuffer<f32>, loss_out: &mut HostOutput<f32>) -> Result<()> {
///         s.read_back(loss, loss_out)
///     }
/// }
///
/// let device = stepgraph::Device::new(0)?;
/// let buffers = watch::Buffers {
///     loss: device.alloc_zeros("loss", 1)?,
///     loss_out: stepgraph::HostOutput::new(&device, "loss_out", 1)?,
/// };
/// let mut step = watch::Step::new(&device, (), buffers, watch::Config {})?;
/// for t in 1..=100 {
///     step.replay()?;
///     if t % 10 == 0 {
///         if let Some(loss) = step.read_back(|b| &b.loss_out)? {
///             println!("replay {}: loss {}", loss.replay(), loss[0]);
///         }
///     }
/// }
/// # Ok::<(), stepgraph::Error>(())
/// ```
pub struct HostOutput<T> {
    pub(crate) ring: Arc<Ring>,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

macro_rules! ring_common {
    ($ty:ident, $dir:expr, $slots:expr) => {
        impl<T> fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("what", &self.ring.what)
                    .field("len", &self.len)
                    .finish()
            }
        }

        impl<T: DeviceRepr + ValidAsZeroBits + Copy> $ty<T> {
            /// Allocates the pinned slots, `len` elements each, zeroed. `what` names it
            /// in errors.
            pub fn new(device: &Device, what: &str, len: usize) -> Result<Self> {
                let bytes = len
                    .checked_mul(size_of::<T>())
                    .ok_or_else(|| Error::TooLarge {
                        what: format!("`{what}`: elements of {} bytes", size_of::<T>()),
                        found: len as u64,
                        max: (usize::MAX / size_of::<T>().max(1)) as u64,
                        why: "beyond it the size in bytes overflows",
                    })?;
                Ok($ty {
                    ring: Arc::new(Ring::new(device, what, $dir, $slots, bytes)?),
                    len,
                    _elem: std::marker::PhantomData,
                })
            }
        }

        impl<T> $ty<T> {
            /// Elements per slot.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether a slot holds no element (never: [`new`](Self::new) refuses it).
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The name it was created with.
            pub fn name(&self) -> &str {
                &self.ring.what
            }
        }
    };
}

ring_common!(HostInput, Direction::ToDevice, INPUT_SLOTS);
ring_common!(HostOutput, Direction::ToHost, OUTPUT_SLOTS);

impl<T> HostInput<T> {
    /// Slot `slot` as a mutable slice.
    ///
    /// # Safety
    /// No replay may read the slot while the slice lives, and no other slice of it may
    /// exist.
    // The exclusivity a `&mut` needs is the caller's to uphold (the safety contract):
    // the slots are shared with the graph, not owned by this borrow.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot_mut(&self, slot: usize) -> &mut [T] {
        // SAFETY: the slot holds `len` initialised (zeroed, then written) elements of T,
        // page aligned; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ring.slot_ptr(slot).cast(), self.len) }
    }
}

impl<T> HostOutput<T> {
    /// Slot `slot` as a slice.
    ///
    /// # Safety
    /// No replay may write the slot while the slice lives.
    pub(crate) unsafe fn slot(&self, slot: usize) -> &[T] {
        // SAFETY: as for `slot_mut`; the caller rules out a concurrent write.
        unsafe { std::slice::from_raw_parts(self.ring.slot_ptr(slot).cast(), self.len) }
    }
}

/// The values one finished replay read back, borrowed from the step's [`HostOutput`]:
/// while it lives the step cannot be replayed, so the slot is not overwritten.
pub struct ReadBack<'s, T> {
    pub(crate) values: &'s [T],
    pub(crate) replay: u64,
}

impl<T> ReadBack<'_, T> {
    /// Which replay of the step wrote the values: 1 for the first (eager runs count too).
    pub fn replay(&self) -> u64 {
        self.replay
    }
}

impl<T> std::ops::Deref for ReadBack<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.values
    }
}

impl<T: fmt::Debug> fmt::Debug for ReadBack<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadBack")
            .field("replay", &self.replay)
            .field("values", &self.values)
            .finish()
    }
}

/// A memcpy node of the graph that copies from or to a ring: re-pointed before each
/// replay at the slot that replay uses.
pub(crate) struct Patch {
    ring: Arc<Ring>,
    node: CUgraphNode,
    /// The node's parameters as captured; the host pointer is changed per slot.
    params: CUDA_MEMCPY3D,
    /// Where the node's host pointer is: the driver may record it as host or unified.
    host_field: HostField,
    /// The slot the executable node points at now.
    slot: usize,
}

#[derive(Clone, Copy, Debug)]
enum HostField {
    SrcHost,
    SrcDevice,
    DstHost,
    DstDevice,
}

/// A copy an op captured: the ring, the slot it points at, and its node.
pub(crate) struct Captured {
    pub(crate) ring: Arc<Ring>,
    pub(crate) slot: usize,
    pub(crate) node: CUgraphNode,
}

impl Patch {
    /// Reads the captured node's parameters and finds its host pointer.
    pub(crate) fn new(c: Captured) -> Result<Patch> {
        let params = crate::driver::graph::memcpy_node_params(c.node)?;
        let ptr = c.ring.slot_ptr(c.slot);
        let host_field = match c.ring.direction {
            Direction::ToDevice if params.srcHost == ptr.cast_const().cast() => HostField::SrcHost,
            Direction::ToDevice if params.srcDevice == ptr as u64 => HostField::SrcDevice,
            Direction::ToHost if params.dstHost == ptr.cast() => HostField::DstHost,
            Direction::ToHost if params.dstDevice == ptr as u64 => HostField::DstDevice,
            _ => {
                return Err(Error::Internal {
                    what: format!(
                        "the captured copy of `{}` does not refer to its staging slot: the \
                         driver recorded another host address",
                        c.ring.what
                    ),
                });
            }
        };
        Ok(Patch {
            ring: c.ring,
            node: c.node,
            params,
            host_field,
            slot: c.slot,
        })
    }

    /// Points the executable node at the slot replay `seq` uses, and marks the slot.
    pub(crate) fn prepare(&mut self, exec: CUgraphExec, ctx: &CudaContext, seq: u64) -> Result<()> {
        let mut st = self.ring.state();
        let slot = st.slot_for(self.ring.direction, seq);
        if slot != self.slot {
            let mut params = self.params;
            let ptr = self.ring.slot_ptr(slot);
            match self.host_field {
                HostField::SrcHost => params.srcHost = ptr.cast_const().cast(),
                HostField::SrcDevice => params.srcDevice = ptr as u64,
                HostField::DstHost => params.dstHost = ptr.cast(),
                HostField::DstDevice => params.dstDevice = ptr as u64,
            }
            // SAFETY: `node` is a memcpy node of the graph `exec` was instantiated from;
            // the new slot is pinned memory of the same context and size as the old.
            unsafe { crate::driver::graph::set_memcpy_node_params(exec, self.node, &params, ctx) }?;
            self.slot = slot;
        }
        st.mark(slot, seq);
        Ok(())
    }
}

/// The identity of an executor, for binding rings to one.
pub(crate) fn next_executor_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Replay numbers and one completion event per replay in flight: how the host knows a
/// slot's replay has finished without waiting for the newest.
pub(crate) struct Clock {
    events: Vec<CudaEvent>,
    /// Replays (and eager runs) launched so far: the number of the latest.
    launched: std::cell::Cell<u64>,
    /// Every replay up to this one has finished.
    finished: std::cell::Cell<u64>,
}

impl Clock {
    pub(crate) fn new(device: &Device) -> Result<Clock> {
        Ok(Clock {
            events: (0..=MAX_IN_FLIGHT)
                .map(|_| crate::driver::event::event(device, false))
                .collect::<Result<_>>()?,
            launched: Default::default(),
            finished: Default::default(),
        })
    }

    pub(crate) fn launched(&self) -> u64 {
        self.launched.get()
    }

    fn event(&self, seq: u64) -> &CudaEvent {
        &self.events[(seq % self.events.len() as u64) as usize]
    }

    /// The number of the next replay, after waiting until launching it leaves at most
    /// [`MAX_IN_FLIGHT`] in flight.
    pub(crate) fn next(&self) -> Result<u64> {
        let seq = self.launched.get() + 1;
        self.wait(seq.saturating_sub(MAX_IN_FLIGHT))?;
        Ok(seq)
    }

    /// Counts a replay that copies nothing to or from the host, without recording its
    /// completion: no slot waits for it by number, so the one driver call of its launch
    /// stays the whole of its host work.
    pub(crate) fn count_unrecorded(&self) {
        self.launched.set(self.launched.get() + 1);
    }

    /// Records replay `seq`'s completion on `stream`, after its launch.
    pub(crate) fn launched_on(&self, seq: u64, stream: &CudaStream) -> Result<()> {
        self.event(seq)
            .record(stream)
            .map_err(Error::driver("cuEventRecord"))?;
        self.launched.set(seq);
        Ok(())
    }

    /// Waits until replay `seq` has finished (at once for 0, none).
    pub(crate) fn wait(&self, seq: u64) -> Result<()> {
        if seq <= self.finished.get() {
            return Ok(());
        }
        // Replays more than MAX_IN_FLIGHT back are finished: `next` waited for them, so
        // an event that was recorded again for a later replay is never waited on.
        if seq + MAX_IN_FLIGHT > self.launched.get() {
            self.event(seq)
                .synchronize()
                .map_err(Error::driver("cuEventSynchronize"))?;
        }
        self.finished.set(seq);
        Ok(())
    }

    /// Whether replay `seq` has finished, without waiting.
    pub(crate) fn is_finished(&self, seq: u64) -> Result<bool> {
        if seq <= self.finished.get() || seq + MAX_IN_FLIGHT <= self.launched.get() {
            return Ok(true);
        }
        let done = self
            .event(seq)
            .try_is_complete()
            .map_err(Error::driver("cuEventQuery"))?;
        if done {
            self.finished.set(seq);
        }
        Ok(done)
    }

    /// Notes that everything launched so far has finished (after a full wait).
    pub(crate) fn all_finished(&self) {
        self.finished.set(self.launched.get());
    }
}

/// What one pass tells the copies to and from host rings.
pub(crate) struct IoPass {
    /// The executor's identity, which the rings are bound to.
    pub(crate) owner: u64,
    /// The number of the replay or eager run this pass is (eager runs) or prepares
    /// (captures: the slot the nodes point at until patched).
    pub(crate) seq: u64,
    /// Whether this pass's copies are the executor's graph (registered for patching) or
    /// an eager run (slots marked now); `None`: a graph of its own (profile, work bound)
    /// whose copies use the slots no valid read-back refers to.
    pub(crate) kind: Option<IoKind>,
    pub(crate) captured: std::cell::RefCell<Vec<Captured>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoKind {
    /// The step's graph: nodes are found and patched at each replay.
    Graph,
    /// An eager run, number `seq`.
    Eager,
}

/// Enqueues `src` → `dst` of `bytes` (host pinned to device or device to host).
pub(crate) fn enqueue(
    direction: Direction,
    host: *mut u8,
    device: u64,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    match direction {
        Direction::ToDevice => {
            // SAFETY: `host` is a pinned slot of `bytes` initialised bytes that outlives
            // the graph (the executor's patch or the ring's Arc holds it).
            let src = unsafe { std::slice::from_raw_parts(host.cast_const(), bytes) };
            // SAFETY: `device` has room for `bytes` (checked by the caller); the source is
            // pinned, so a captured node reads it at replay time.
            unsafe { crate::driver::transfer::copy_htod(stream, device, src) }
                .map_err(Error::driver("cuMemcpyHtoDAsync"))
        }
        Direction::ToHost => {
            // SAFETY: as above; the host reads the slot only once the replay that writes
            // it has finished, and holds no slice of it now (it cannot, while an op runs).
            let dst = unsafe { std::slice::from_raw_parts_mut(host, bytes) };
            // SAFETY: `device` holds `bytes` (checked by the caller); the slot is written
            // at replay time.
            unsafe { crate::driver::transfer::copy_dtoh(stream, dst, device) }
                .map_err(Error::driver("cuMemcpyDtoHAsync"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_fill_never_gets_the_slot_the_latest_replay_reads() {
        let mut st = RingState::new(INPUT_SLOTS);
        // Before any replay the host fills the current slot, as often as it likes.
        assert_eq!(st.next_fill(), 0);
        st.current = st.next_fill();
        // Replay 1 reads slot 0; the next fill is slot 1, which no replay has read.
        let s1 = st.slot_for(Direction::ToDevice, 1);
        st.mark(s1, 1);
        assert_eq!((s1, st.next_fill()), (0, 1));
        assert_eq!(st.used_by[1], 0);
        st.current = 1;
        // Replay 2 reads slot 1; the fill after it is slot 0, last read by replay 1,
        // which the host must wait for.
        let s2 = st.slot_for(Direction::ToDevice, 2);
        st.mark(s2, 2);
        assert_eq!((s2, st.next_fill(), st.used_by[0]), (1, 0, 1));
        // Without a fill, replay 3 reads slot 1 again.
        let s3 = st.slot_for(Direction::ToDevice, 3);
        st.mark(s3, 3);
        assert_eq!((s3, st.next_fill()), (1, 0));
    }

    #[test]
    fn outputs_take_turns_and_read_newest_first() {
        let mut st = RingState::new(OUTPUT_SLOTS);
        assert!(st.newest_first().is_empty());
        for seq in 1..=6 {
            let slot = st.slot_for(Direction::ToHost, seq);
            assert_eq!(slot, (seq % OUTPUT_SLOTS as u64) as usize);
            st.mark(slot, seq);
        }
        let order: Vec<u64> = st.newest_first().iter().map(|&(seq, _)| seq).collect();
        assert_eq!(order, vec![6, 5, 4, 3]);
        // The replays in flight after the newest finished one never share its slot.
        for newest_finished in 3..=6u64 {
            for in_flight in newest_finished + 1..=newest_finished + MAX_IN_FLIGHT {
                assert_ne!(
                    st.slot_for(Direction::ToHost, in_flight),
                    st.slot_for(Direction::ToHost, newest_finished)
                );
            }
        }
    }
}
