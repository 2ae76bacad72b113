//! Collectives across the ranks of a data-parallel step, through NCCL, issued from ops
//! like any other work.
//!
//! A [`Communicator`] is a field of the step's buffers and ops take it as
//! `&mut Communicator`: NCCL requires every rank to issue the collectives of one
//! communicator in the same order, and a write access makes the planner order all of
//! them in program order (each one "writes" the communicator's state). The buckets an
//! all-reduce reduces are `&mut` too, so it waits for the ops that write them and the ops
//! that read the reduced values wait for it. Put the collective ops on a stream of their
//! own (`#[stream(comm)]`) and each bucket's all-reduce overlaps whatever backward work
//! is still running on the other streams.
//!
//! Capturing a step with collectives is itself collective: NCCL may register the buckets
//! with the peer ranks while it captures an all-reduce, and waits for them to do the same.
//! Every capture (building the step, [`crate::Executor::verify`], profiling, the work
//! bound) must run on every rank at once, in the same order; a rank that captures alone
//! waits forever. The work bound does not time the collectives' kernels: alone, without
//! their peers, they would not finish.
//!
//! [`Communicator::single`] is the world of one process without NCCL: its collectives
//! issue nothing (reducing over one rank is the identity), so a step written for data
//! parallelism runs unchanged where NCCL is not installed.

use std::ffi::CStr;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

use crate::driver::device::{Device, require_library};
use crate::driver::memory::DeviceBuffer;
use crate::error::{Error, Result};
use crate::op::stream::CaptureStream;

/// The error of a failed NCCL call, with NCCL's description of the code.
fn nccl_error(call: &'static str) -> impl Fn(nccl::NcclError) -> Error {
    move |e| {
        // SAFETY: the library is loaded (a call just returned this code); the string is
        // static inside NCCL.
        let message = unsafe {
            let p = sys::ncclGetErrorString(e.0);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error::Nccl {
            call,
            code: format!("{:?}", e.0),
            message,
        }
    }
}

/// Fails with a clear error unless NCCL can be loaded. PyTorch's wheels ship the library
/// only as `libnccl.so.2`, a name cudarc's loader does not try: say so.
fn require_nccl() -> Result<()> {
    require_library("nccl").map_err(|e| match e {
        Error::LibraryMissing {
            library,
            candidates,
            ..
        } => Error::LibraryMissing {
            library,
            candidates,
            hint: "install NCCL, or link an existing libnccl.so.2 (PyTorch's nvidia/nccl/lib \
                   has one) as libnccl.so in a folder on LD_LIBRARY_PATH",
        },
        other => other,
    })
}

/// The id every rank of one communicator joins with: made once (by one rank, or by the
/// process that starts the others) and handed to each rank.
#[derive(Clone, Copy)]
pub struct CommId(sys::ncclUniqueId);

impl fmt::Debug for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CommId(..)")
    }
}

impl CommId {
    /// A fresh id (`ncclGetUniqueId`).
    pub fn new() -> Result<CommId> {
        crate::scope::check("CommId::new")?;
        require_nccl()?;
        nccl::get_uniqueid()
            .map(CommId)
            .map_err(nccl_error("ncclGetUniqueId"))
    }
}

/// How an all-reduce combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The mean: for gradients of a loss that is a mean over each rank's slice of the
    /// batch, the gradient of the mean over the whole batch.
    Avg,
    /// The product.
    Prod,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
}

impl ReduceOp {
    fn nccl(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
            ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types NCCL reduces.
pub trait CollectiveElem: cudarc::driver::DeviceRepr + sealed::Sealed {
    /// NCCL's name for the type.
    const NCCL: sys::ncclDataType_t;
}

macro_rules! collective_elem {
    ($($t:ty => $n:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl CollectiveElem for $t {
            const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::$n;
        }
    )*};
}

collective_elem!(
    f32 => ncclFloat32, f64 => ncclFloat64, i8 => ncclInt8, u8 => ncclUint8,
    i32 => ncclInt32, u32 => ncclUint32, i64 => ncclInt64, u64 => ncclUint64,
);

fn check_rank(rank: usize, world: usize) -> Result<()> {
    if world == 0 || rank >= world {
        return Err(Error::Argument {
            what: "a communicator's rank and world".into(),
            expected: "world >= 1 and rank < world".into(),
            found: format!("rank {rank} of world {world}"),
        });
    }
    Ok(())
}

/// An NCCL communicator, destroyed with its owner.
struct Nccl {
    raw: sys::ncclComm_t,
    /// Keeps the context the communicator was made in alive as long as it.
    _ctx: Arc<CudaContext>,
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful ncclCommInitRank and is destroyed once.
        // A failure here leaves nothing to recover: the communicator is gone either way.
        let _ = unsafe { nccl::comm_destroy(self.raw) };
    }
}

/// This rank's place in a data-parallel world, and the means of its collectives.
pub struct Communicator {
    nccl: Option<Nccl>,
    rank: usize,
    world: usize,
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("nccl", &self.nccl.is_some())
            .finish()
    }
}

impl Communicator {
    /// A world of one process without NCCL: collectives issue nothing.
    pub fn single() -> Communicator {
        Communicator {
            nccl: None,
            rank: 0,
            world: 1,
        }
    }

    /// Joins rank `rank` of a `world`-rank communicator on `device` (`ncclCommInitRank`),
    /// then runs one small all-reduce eagerly: NCCL may set up its connections lazily, at
    /// the first collective, and that must not happen inside a capture. Blocks until every
    /// rank has joined, so the ranks must join at the same time (one thread or process
    /// each). A world of one is a real NCCL communicator too.
    pub fn join(device: &Device, id: CommId, rank: usize, world: usize) -> Result<Communicator> {
        crate::scope::check("Communicator::join")?;
        check_rank(rank, world)?;
        let ranks = |n: usize| {
            i32::try_from(n).map_err(|_| Error::TooLarge {
                what: "ranks of an NCCL communicator".into(),
                found: n as u64,
                max: i32::MAX as u64,
                why: "NCCL takes an int",
            })
        };
        require_nccl()?;
        let ctx = device.context().clone();
        ctx.bind_to_thread()
            .map_err(Error::driver("cuCtxSetCurrent"))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context of `device` is current on this thread, so
        // the communicator is made on that GPU.
        unsafe { nccl::comm_init_rank(&mut raw, ranks(world)?, id.0, ranks(rank)?) }
            .map_err(nccl_error("ncclCommInitRank"))?;
        let comm = Communicator {
            nccl: Some(Nccl {
                raw,
                _ctx: ctx.clone(),
            }),
            rank,
            world,
        };
        let stream = ctx.new_stream().map_err(Error::driver("cuStreamCreate"))?;
        let mut probe = DeviceBuffer::wrap(
            stream
                .alloc_zeros::<f32>(1)
                .map_err(Error::driver("cuMemAllocAsync"))?,
        );
        comm.all_reduce_on(&stream, &mut [&mut probe], ReduceOp::Sum)?;
        stream
            .synchronize()
            .map_err(Error::driver("cuStreamSynchronize"))?;
        Ok(comm)
    }

    /// This rank, `0..world`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the world.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Whether collectives go through NCCL (false for [`Communicator::single`]).
    pub fn uses_nccl(&self) -> bool {
        self.nccl.is_some()
    }

    /// The loaded NCCL's version code (`ncclGetVersion`: 22809 for 2.28.9).
    pub fn nccl_version() -> Result<i32> {
        require_nccl()?;
        nccl::get_nccl_version().map_err(nccl_error("ncclGetVersion"))
    }

    /// All-reduces each buffer in place on `stream`, as one NCCL group (one launch for
    /// the lot). Nothing is issued without NCCL or for no buffers.
    fn all_reduce_on<T: CollectiveElem>(
        &self,
        stream: &cudarc::driver::CudaStream,
        bufs: &mut [&mut DeviceBuffer<T>],
        op: ReduceOp,
    ) -> Result<()> {
        let Some(comm) = &self.nccl else {
            return Ok(());
        };
        if bufs.is_empty() {
            return Ok(());
        }
        nccl::group_start().map_err(nccl_error("ncclGroupStart"))?;
        let mut first_err = None;
        for buf in bufs.iter_mut() {
            let len = buf.len();
            let ptr = buf.device_address();
            // SAFETY: `ptr` is `len` elements of T on this communicator's GPU, in place;
            // the stream belongs to the same context; the buffer outlives the collective
            // (it is a buffer of the step, which outlives its graph).
            let r = unsafe {
                nccl::all_reduce(
                    ptr as *const std::ffi::c_void,
                    ptr as *mut std::ffi::c_void,
                    len,
                    T::NCCL,
                    op.nccl(),
                    comm.raw,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            };
            if let Err(e) = r {
                first_err.get_or_insert(nccl_error("ncclAllReduce")(e));
                break;
            }
        }
        // A group that was started must be ended, also after a failed call in it.
        let ended = nccl::group_end().map_err(nccl_error("ncclGroupEnd"));
        match first_err {
            Some(e) => Err(e),
            None => ended.map(|_| ()),
        }
    }
}

impl CaptureStream<'_> {
    /// All-reduces each of `bufs` in place across the ranks of `comm`, as one NCCL group
    /// on this op's stream. With [`Communicator::single`] nothing is issued.
    ///
    /// Take `comm` as `&mut Communicator` in the op's signature, like the buckets: the
    /// planner then keeps every collective of the communicator in program order, as NCCL
    /// requires of all ranks.
    pub fn all_reduce<T: CollectiveElem>(
        &self,
        comm: &mut Communicator,
        bufs: &mut [&mut DeviceBuffer<T>],
        op: ReduceOp,
    ) -> Result<()> {
        if self.conditional {
            // A conditional node's body may hold kernels, copies and memsets only: NCCL's
            // captured collective is more (and every rank must run it at every replay).
            return Err(Error::InConditional {
                what: format!("an all-reduce on `{}`", self.name),
                why: "a conditional node's body cannot hold a collective, and every rank must \
                      run each one; issue it from an op without a condition",
            });
        }
        for buf in bufs.iter() {
            crate::driver::memory::check_write_mem(&**buf, || "all-reduce bucket".into())?;
        }
        self.count(|c| c.collectives += 1);
        if self.mode.enqueues() {
            // NCCL may order its own bookkeeping streams against this one; what it issues
            // is NCCL's to order, so the capture guard does not judge it.
            crate::scope::exempt(|| comm.all_reduce_on(self.stream, bufs, op))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_world_is_rank_zero_of_one_without_nccl() {
        let c = Communicator::single();
        assert_eq!((c.rank(), c.world(), c.uses_nccl()), (0, 1, false));
    }

    #[test]
    fn a_rank_outside_the_world_is_refused_before_nccl_is_touched() {
        assert!(check_rank(0, 1).is_ok() && check_rank(3, 4).is_ok());
        let e = check_rank(2, 2).unwrap_err();
        assert!(
            matches!(&e, Error::Argument { found, .. } if found == "rank 2 of world 2"),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains("found rank 2 of world 2"), "{e}");
        assert!(check_rank(0, 0).is_err());
    }

    #[test]
    fn reduce_ops_map_to_their_nccl_names() {
        assert_eq!(ReduceOp::Avg.nccl(), sys::ncclRedOp_t::ncclAvg);
        assert_eq!(ReduceOp::Sum.nccl(), sys::ncclRedOp_t::ncclSum);
        assert_eq!(
            <f32 as CollectiveElem>::NCCL,
            sys::ncclDataType_t::ncclFloat32
        );
        assert_eq!(
            <i64 as CollectiveElem>::NCCL,
            sys::ncclDataType_t::ncclInt64
        );
    }
}
