//! Which CUDA calls put work on a stream, wait for the GPU, allocate or steer a capture,
//! and where each keeps its stream: the capture guard's view of the driver and runtime
//! APIs, by CUPTI callback id.
//!
//! A CUPTI callback hands over the call's arguments as a struct laid out like its
//! parameter list (CUPTI's `generated_cuda_meta.h` and `generated_cuda_runtime_api_meta.h`),
//! so the stream is read at a fixed byte offset. The ids are stable across CUDA releases
//! (CUPTI appends, it never renumbers), so one table serves CUDA 12 and 13. A call that is
//! not in the table and looks like it enqueues work (an `Async` name, a launch) is
//! refused as unknown rather than let through: the guard's promise is that nothing
//! escapes unnoticed.

/// What a call does, as far as a capture is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Enqueues work on a stream (a launch, a copy, a memset, an event record or wait, a
    /// stream memory operation, a graph launch): captured only on a capturing stream.
    Work,
    /// A copy, memset or launch on the legacy default stream that the host waits for.
    Blocking,
    /// Waits for, or asks about, the GPU's progress.
    Sync,
    /// Allocates or frees memory (device, pinned, managed, stream-ordered).
    Alloc,
    /// Begins or ends a capture, or changes a capture's mode or dependencies.
    Capture,
    /// Records or waits on an event for a whole context.
    Context,
}

/// Where a [`Kind::Work`] call keeps its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamAt {
    /// At this byte offset of the parameter struct.
    Param(usize),
    /// In a launch configuration the parameter struct points to: the pointer's offset,
    /// then the stream's offset in the configuration.
    Config(usize, usize),
    /// Nowhere the guard can read (an API whose stream it cannot locate).
    Unknown,
}

/// One known call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub kind: Kind,
    pub stream: StreamAt,
}

/// `k` pointer-sized parameters before the stream: every parameter of these APIs that
/// precedes the stream is 8 bytes wide, or padded to 8 by the next one.
const fn after(k: usize) -> StreamAt {
    StreamAt::Param(8 * k)
}

const fn work(stream: StreamAt) -> Call {
    Call {
        kind: Kind::Work,
        stream,
    }
}

const fn plain(kind: Kind) -> Call {
    Call {
        kind,
        stream: StreamAt::Unknown,
    }
}

const BLOCKING: Call = plain(Kind::Blocking);
const SYNC: Call = plain(Kind::Sync);
const ALLOC: Call = plain(Kind::Alloc);
const CAPTURE: Call = plain(Kind::Capture);
const CONTEXT: Call = plain(Kind::Context);
const UNKNOWN_STREAM: Call = work(StreamAt::Unknown);

/// `cuLaunchKernel(f, gridDimX..blockDimZ, sharedMemBytes, hStream, ..)`: a pointer and
/// seven `unsigned int`s, then the stream at 40.
const LAUNCH_KERNEL: StreamAt = StreamAt::Param(40);
/// `cuLaunchKernelEx(const CUlaunchConfig *config, ..)`: `CUlaunchConfig` holds seven
/// `unsigned int`s (grid, block, shared bytes), then `hStream` at 32.
const LAUNCH_EX: StreamAt = StreamAt::Config(0, 32);
/// `cudaLaunchKernel(func, dim3 gridDim, dim3 blockDim, args, sharedMem, stream)`: two
/// 12-byte `dim3`s after the function, so the stream is at 48.
const CUDA_LAUNCH_KERNEL: StreamAt = StreamAt::Param(48);
/// `cudaLaunchKernelExC(const cudaLaunchConfig_t *config, ..)`: two `dim3`s and a
/// `size_t`, then `stream` at 32.
const CUDA_LAUNCH_EX: StreamAt = StreamAt::Config(0, 32);

/// The driver API (CUPTI's `CUpti_driver_api_trace_cbid`), sorted by id.
#[rustfmt::skip]
const DRIVER: &[(u32, Call)] = &[
    (17, SYNC),                 // cuCtxSynchronize
    (29, ALLOC), (30, ALLOC), (31, ALLOC), (32, ALLOC), (33, ALLOC), (34, ALLOC), // cuMemAlloc, cuMemAllocPitch, cuMemFree (32- and 64-bit)
    (37, ALLOC), (38, ALLOC), (39, ALLOC), // cuMemAllocHost, cuMemFreeHost, cuMemHostAlloc
    (43, BLOCKING), (44, BLOCKING), (45, BLOCKING), (46, BLOCKING), (47, BLOCKING), (48, BLOCKING), // cuMemcpyHtoD, DtoH, DtoD
    (49, BLOCKING), (50, BLOCKING), (51, BLOCKING), (52, BLOCKING), (53, BLOCKING), (54, BLOCKING), (55, BLOCKING), // cuMemcpy with arrays
    (56, BLOCKING), (57, BLOCKING), (58, BLOCKING), (59, BLOCKING), // cuMemcpy2D, 2DUnaligned, 3D
    (60, UNKNOWN_STREAM), (61, UNKNOWN_STREAM), (62, UNKNOWN_STREAM), (63, UNKNOWN_STREAM), // 32-bit cuMemcpy*Async
    (64, UNKNOWN_STREAM), (65, UNKNOWN_STREAM), (66, UNKNOWN_STREAM), (67, UNKNOWN_STREAM),
    (68, UNKNOWN_STREAM), (69, UNKNOWN_STREAM), (70, UNKNOWN_STREAM),
    (71, BLOCKING), (72, BLOCKING), (73, BLOCKING), (74, BLOCKING), (75, BLOCKING), (76, BLOCKING), // cuMemsetD8/16/32
    (77, BLOCKING), (78, BLOCKING), (79, BLOCKING), (80, BLOCKING), (81, BLOCKING), (82, BLOCKING), // cuMemsetD2D8/16/32
    (115, BLOCKING), (116, BLOCKING), // cuLaunch, cuLaunchGrid
    (117, work(after(2))),      // cuLaunchGridAsync(f, width, height, hStream)
    (119, work(after(1))),      // cuEventRecord(hEvent, hStream)
    (120, SYNC), (121, SYNC),   // cuEventQuery, cuEventSynchronize
    (123, SYNC),                // cuEventElapsedTime
    (125, SYNC), (126, SYNC),   // cuStreamQuery, cuStreamSynchronize
    (133, work(after(2))), (134, work(after(2))), // cuGraphicsMapResources, cuGraphicsUnmapResources
    (215, ALLOC),               // cu64MemHostAlloc
    (216, work(after(3))),      // cuMemsetD8Async(dstDevice, uc, N, hStream)
    (217, UNKNOWN_STREAM),
    (218, work(after(3))),      // cuMemsetD16Async
    (219, UNKNOWN_STREAM),
    (220, work(after(3))),      // cuMemsetD32Async
    (221, UNKNOWN_STREAM),
    (222, work(after(5))),      // cuMemsetD2D8Async(dstDevice, dstPitch, uc, Width, Height, hStream)
    (223, UNKNOWN_STREAM),
    (224, work(after(5))),      // cuMemsetD2D16Async
    (225, UNKNOWN_STREAM),
    (226, work(after(5))),      // cuMemsetD2D32Async
    (227, UNKNOWN_STREAM),
    (232, BLOCKING), (233, BLOCKING), // cu64Memcpy2D, cu64Memcpy2DUnaligned
    (234, UNKNOWN_STREAM),      // cu64Memcpy2DAsync
    (243, ALLOC), (244, ALLOC), (245, ALLOC), // cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemFree_v2
    (248, BLOCKING),            // cuMemcpy_v2
    (249, BLOCKING), (250, BLOCKING), (251, BLOCKING), (252, BLOCKING), (253, BLOCKING), (254, BLOCKING), // cuMemsetD*_v2
    (271, ALLOC),               // cuMemHostAlloc_v2
    (276, BLOCKING),            // cuMemcpyHtoD_v2
    (277, work(after(3))),      // cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream)
    (278, BLOCKING),            // cuMemcpyDtoH_v2
    (279, work(after(3))),      // cuMemcpyDtoHAsync_v2
    (280, BLOCKING),            // cuMemcpyDtoD_v2
    (281, work(after(3))),      // cuMemcpyDtoDAsync_v2
    (282, BLOCKING),            // cuMemcpyAtoH_v2
    (283, work(after(4))),      // cuMemcpyAtoHAsync_v2(dstHost, srcArray, srcOffset, ByteCount, hStream)
    (284, BLOCKING), (285, BLOCKING), (286, BLOCKING), (287, BLOCKING), (288, BLOCKING), // AtoD, DtoA, AtoA, 2D, 2DUnaligned
    (289, work(after(1))),      // cuMemcpy2DAsync_v2(pCopy, hStream)
    (290, BLOCKING),            // cuMemcpy3D_v2
    (291, work(after(1))),      // cuMemcpy3DAsync_v2
    (292, BLOCKING),            // cuMemcpyHtoA_v2
    (293, work(after(4))),      // cuMemcpyHtoAAsync_v2(dstArray, dstOffset, srcHost, ByteCount, hStream)
    (294, ALLOC),               // cuMemAllocHost_v2
    (295, work(after(0))),      // cuStreamWaitEvent(hStream, hEvent, Flags)
    (301, ALLOC), (302, ALLOC), // cuMemHostRegister, cuMemHostUnregister
    (305, BLOCKING),            // cuMemcpy
    (306, work(after(3))),      // cuMemcpyAsync(dst, src, ByteCount, hStream)
    (307, work(LAUNCH_KERNEL)), // cuLaunchKernel
    (318, BLOCKING),            // cuMemcpyPeer
    (319, work(after(5))),      // cuMemcpyPeerAsync(dst, dstCtx, src, srcCtx, ByteCount, hStream)
    (320, BLOCKING),            // cuMemcpy3DPeer
    (321, work(after(1))),      // cuMemcpy3DPeerAsync
    (346, work(after(0))),      // cuStreamAddCallback(hStream, ..)
    (371, ALLOC),               // cuMemAllocManaged
    (377, work(after(0))),      // cuStreamAttachMemAsync(hStream, ..)
    (379, ALLOC),               // cuMemHostRegister_v2
    (397, BLOCKING), (398, BLOCKING), (399, BLOCKING), (400, BLOCKING), (401, BLOCKING), (402, BLOCKING), // *_ptds blocking copies
    (403, BLOCKING), (404, BLOCKING), (405, BLOCKING), (406, BLOCKING), (407, BLOCKING), (408, BLOCKING),
    (409, BLOCKING), (410, BLOCKING), (411, BLOCKING), (412, BLOCKING), (413, BLOCKING), (414, BLOCKING),
    (415, BLOCKING), (416, BLOCKING),
    (418, work(after(3))),      // cuMemcpyAsync_ptsz
    (419, work(after(4))),      // cuMemcpyHtoAAsync_v2_ptsz
    (420, work(after(4))),      // cuMemcpyAtoHAsync_v2_ptsz
    (421, work(after(3))), (422, work(after(3))), (423, work(after(3))), // cuMemcpy{HtoD,DtoH,DtoD}Async_v2_ptsz
    (424, work(after(1))), (425, work(after(1))), // cuMemcpy2DAsync_v2_ptsz, cuMemcpy3DAsync_v2_ptsz
    (426, work(after(5))),      // cuMemcpyPeerAsync_ptsz
    (427, work(after(1))),      // cuMemcpy3DPeerAsync_ptsz
    (428, work(after(3))), (429, work(after(3))), (430, work(after(3))), // cuMemsetD{8,16,32}Async_ptsz
    (431, work(after(5))), (432, work(after(5))), (433, work(after(5))), // cuMemsetD2D{8,16,32}Async_ptsz
    (436, work(after(0))),      // cuStreamWaitEvent_ptsz
    (437, work(after(0))),      // cuStreamAddCallback_ptsz
    (438, work(after(0))),      // cuStreamAttachMemAsync_ptsz
    (439, SYNC), (440, SYNC),   // cuStreamQuery_ptsz, cuStreamSynchronize_ptsz
    (441, work(after(1))),      // cuEventRecord_ptsz
    (442, work(LAUNCH_KERNEL)), // cuLaunchKernel_ptsz
    (443, work(after(2))), (444, work(after(2))), // cuGraphics{Map,Unmap}Resources_ptsz
    (458, work(after(0))), (459, work(after(0))), (460, work(after(0))), (461, work(after(0))), // cuStream{Wait,Write}Value32
    (462, work(after(0))), (463, work(after(0))), // cuStreamBatchMemOp
    (467, work(after(3))), (468, work(after(3))), // cuMemPrefetchAsync(devPtr, count, dstDevice, hStream)
    (473, work(after(0))), (474, work(after(0))), (475, work(after(0))), (476, work(after(0))), // cuStream{Wait,Write}Value64
    (477, work(LAUNCH_KERNEL)), (478, work(LAUNCH_KERNEL)), // cuLaunchCooperativeKernel
    (480, UNKNOWN_STREAM),      // cuLaunchCooperativeKernelMultiDevice
    (490, work(after(3))), (491, work(after(3))), // cuSignalExternalSemaphoresAsync
    (492, work(after(3))), (493, work(after(3))), // cuWaitExternalSemaphoresAsync
    (495, CAPTURE), (496, CAPTURE), (497, CAPTURE), (498, CAPTURE), // cuStreamBeginCapture, cuStreamEndCapture
    (514, work(after(1))), (515, work(after(1))), // cuGraphLaunch(hGraphExec, hStream)
    (527, work(after(0))), (528, work(after(0))), // cuLaunchHostFunc(hStream, ..)
    (539, CAPTURE), (540, CAPTURE), (541, CAPTURE), // cuStreamBeginCapture_v2, cuThreadExchangeStreamCaptureMode
    (547, ALLOC), (548, ALLOC), (549, ALLOC), (550, ALLOC), (551, ALLOC), (552, ALLOC), // cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap/Unmap
    (580, work(after(1))), (581, work(after(1))), // cuGraphUpload(hGraphExec, hStream)
    (584, UNKNOWN_STREAM), (585, UNKNOWN_STREAM), // cuMemMapArrayAsync
    (587, work(after(1))), (588, work(after(1))), // cuEventRecordWithFlags(hEvent, hStream, flags)
    (598, ALLOC), (599, ALLOC), (600, ALLOC), (601, ALLOC), // cuMemAllocAsync, cuMemFreeAsync
    (602, ALLOC),               // cuMemPoolTrimTo
    (611, ALLOC), (612, ALLOC), // cuMemAllocFromPoolAsync
    (631, CAPTURE), (632, CAPTURE), // cuStreamUpdateCaptureDependencies
    (652, work(LAUNCH_EX)), (653, work(LAUNCH_EX)), // cuLaunchKernelEx
    (659, work(after(0))), (660, work(after(0))), (661, work(after(0))), (662, work(after(0))), // cuStreamWaitValue{32,64}_v2
    (663, work(after(0))), (664, work(after(0))), (665, work(after(0))), (666, work(after(0))), // cuStreamWriteValue{32,64}_v2
    (667, work(after(0))), (668, work(after(0))), // cuStreamBatchMemOp_v2
    (716, work(after(4))), (717, work(after(4))), // cuMemPrefetchAsync_v2(devPtr, count, location, flags, hStream)
    (720, CAPTURE), (721, CAPTURE), // cuStreamBeginCaptureToGraph
    (731, CAPTURE), (732, CAPTURE), // cuStreamUpdateCaptureDependencies_v2
    (749, CONTEXT), (750, CONTEXT), // cuGreenCtxRecordEvent, cuGreenCtxWaitEvent
    (755, CONTEXT), (756, CONTEXT), // cuCtxRecordEvent, cuCtxWaitEvent
    (761, work(after(4))), (762, work(after(4))), // cuMemBatchDecompressAsync
    (776, work(after(8))), (777, work(after(8))), // cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream)
    (778, work(after(4))), (779, work(after(4))), // cuMemcpy3DBatchAsync(numOps, opList, failIdx, flags, hStream)
    (780, SYNC),                // cuEventElapsedTime_v2
    (783, CAPTURE),             // cuStreamBeginCaptureToCig
    (784, work(after(7))), (785, work(after(7))), // cuMemPrefetchBatchAsync
    (789, work(after(4))), (790, work(after(4))), // cuMemDiscardBatchAsync
    (791, work(after(7))), (792, work(after(7))), // cuMemDiscardAndPrefetchBatchAsync
    (796, work(after(7))), (797, work(after(7))), // cuMemcpyBatchAsync_v2
    (798, work(after(3))), (799, work(after(3))), // cuMemcpy3DBatchAsync_v2
    (800, SYNC),                // cuCtxSynchronize_v2
    (814, CAPTURE), (815, CAPTURE), (816, CAPTURE), // cuStreamBeginCaptureToCig_ptsz, cuStreamEndCaptureToCig
    (831, work(after(0))), (832, work(after(0))), // cuLaunchHostFunc_v2(hStream, ..)
    (837, work(after(4))), (838, work(after(4))), // cuMemcpyWithAttributesAsync(dst, src, size, attr, hStream)
    (839, work(after(2))), (840, work(after(2))), // cuMemcpy3DWithAttributesAsync(op, flags, hStream)
];

/// The runtime API (CUPTI's `CUpti_runtime_api_trace_cbid`), sorted by id. Libraries
/// built on a static CUDA runtime (cuBLASLt's memsets, for one) reach the driver by paths
/// the driver's callbacks do not see, so the runtime's callbacks are read too.
#[rustfmt::skip]
const RUNTIME: &[(u32, Call)] = &[
    (13, UNKNOWN_STREAM),       // cudaLaunch (configured by cudaConfigureCall)
    (20, ALLOC), (21, ALLOC), (22, ALLOC), (23, ALLOC), (24, ALLOC), (25, ALLOC), (26, ALLOC), (27, ALLOC), // cudaMalloc .. cudaHostAlloc
    (31, BLOCKING), (32, BLOCKING), (33, BLOCKING), (34, BLOCKING), (35, BLOCKING), // cudaMemcpy, 2D, ToArray, 2DToArray, FromArray
    (36, BLOCKING), (37, BLOCKING), (38, BLOCKING), (39, BLOCKING), (40, BLOCKING), // 2DFromArray, ArrayToArray, 2DArrayToArray, ToSymbol, FromSymbol
    (41, work(after(4))),       // cudaMemcpyAsync(dst, src, count, kind, stream)
    (42, work(after(6))),       // cudaMemcpyToArrayAsync(dst, wOffset, hOffset, src, count, kind, stream)
    (43, work(after(6))),       // cudaMemcpyFromArrayAsync(dst, src, wOffset, hOffset, count, kind, stream)
    (44, work(after(7))),       // cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream)
    (45, work(after(8))),       // cudaMemcpy2DToArrayAsync
    (46, work(after(8))),       // cudaMemcpy2DFromArrayAsync
    (47, work(after(5))),       // cudaMemcpyToSymbolAsync(symbol, src, count, offset, kind, stream)
    (48, work(after(5))),       // cudaMemcpyFromSymbolAsync
    (49, BLOCKING), (50, BLOCKING), // cudaMemset, cudaMemset2D
    (51, work(after(3))),       // cudaMemsetAsync(devPtr, value, count, stream)
    (52, work(after(5))),       // cudaMemset2DAsync(devPtr, pitch, value, width, height, stream)
    (76, work(after(2))), (77, work(after(2))), // cudaGraphics{Map,Unmap}Resources(count, resources, stream)
    (126, SYNC),                // cudaThreadSynchronize
    (131, SYNC), (132, SYNC),   // cudaStreamSynchronize, cudaStreamQuery
    (135, work(after(1))),      // cudaEventRecord(event, stream)
    (137, SYNC), (138, SYNC), (139, SYNC), // cudaEventSynchronize, cudaEventQuery, cudaEventElapsedTime
    (140, ALLOC), (141, ALLOC), // cudaMalloc3D, cudaMalloc3DArray
    (142, BLOCKING),            // cudaMemset3D
    (143, work(after(8))),      // cudaMemset3DAsync(cudaPitchedPtr (32 bytes), value, cudaExtent (24 bytes), stream)
    (144, BLOCKING),            // cudaMemcpy3D
    (145, work(after(1))),      // cudaMemcpy3DAsync(p, stream)
    (147, work(after(0))),      // cudaStreamWaitEvent(stream, event, flags)
    (152, ALLOC), (153, ALLOC), // cudaHostRegister, cudaHostUnregister
    (160, BLOCKING),            // cudaMemcpyPeer
    (161, work(after(5))),      // cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream)
    (162, BLOCKING),            // cudaMemcpy3DPeer
    (163, work(after(1))),      // cudaMemcpy3DPeerAsync
    (165, SYNC),                // cudaDeviceSynchronize
    (192, ALLOC), (194, ALLOC), // cudaMallocMipmappedArray, cudaFreeMipmappedArray
    (197, work(after(0))),      // cudaStreamAddCallback(stream, ..)
    (206, ALLOC),               // cudaMallocManaged
    (208, work(after(0))),      // cudaStreamAttachMemAsync(stream, ..)
    (211, work(CUDA_LAUNCH_KERNEL)), // cudaLaunchKernel
    (213, UNKNOWN_STREAM),      // cudaLaunch_ptsz
    (214, work(CUDA_LAUNCH_KERNEL)), // cudaLaunchKernel_ptsz
    (215, BLOCKING), (216, BLOCKING), (217, BLOCKING), (218, BLOCKING), (219, BLOCKING), // *_ptds blocking copies
    (220, BLOCKING), (221, BLOCKING), (222, BLOCKING), (223, BLOCKING), (224, BLOCKING),
    (225, work(after(4))),      // cudaMemcpyAsync_ptsz
    (226, work(after(6))), (227, work(after(6))), // cudaMemcpy{To,From}ArrayAsync_ptsz
    (228, work(after(7))),      // cudaMemcpy2DAsync_ptsz
    (229, work(after(8))), (230, work(after(8))), // cudaMemcpy2D{To,From}ArrayAsync_ptsz
    (231, work(after(5))), (232, work(after(5))), // cudaMemcpy{To,From}SymbolAsync_ptsz
    (233, BLOCKING), (234, BLOCKING), // cudaMemset_ptds, cudaMemset2D_ptds
    (235, work(after(3))),      // cudaMemsetAsync_ptsz
    (236, work(after(5))),      // cudaMemset2DAsync_ptsz
    (239, SYNC), (240, SYNC),   // cudaStreamSynchronize_ptsz, cudaStreamQuery_ptsz
    (241, work(after(0))),      // cudaStreamAttachMemAsync_ptsz
    (242, work(after(1))),      // cudaEventRecord_ptsz
    (243, BLOCKING),            // cudaMemset3D_ptds
    (244, work(after(8))),      // cudaMemset3DAsync_ptsz
    (245, BLOCKING),            // cudaMemcpy3D_ptds
    (246, work(after(1))),      // cudaMemcpy3DAsync_ptsz
    (247, work(after(0))),      // cudaStreamWaitEvent_ptsz
    (248, work(after(0))),      // cudaStreamAddCallback_ptsz
    (249, BLOCKING),            // cudaMemcpy3DPeer_ptds
    (250, work(after(1))),      // cudaMemcpy3DPeerAsync_ptsz
    (252, work(after(3))), (253, work(after(3))), // cudaMemPrefetchAsync(devPtr, count, dstDevice, stream)
    (269, work(CUDA_LAUNCH_KERNEL)), (270, work(CUDA_LAUNCH_KERNEL)), // cudaLaunchCooperativeKernel
    (272, UNKNOWN_STREAM),      // cudaLaunchCooperativeKernelMultiDevice
    (279, work(after(3))), (280, work(after(3))), // cudaSignalExternalSemaphoresAsync
    (281, work(after(3))), (282, work(after(3))), // cudaWaitExternalSemaphoresAsync
    (284, work(after(0))), (285, work(after(0))), // cudaLaunchHostFunc(stream, ..)
    (311, work(after(1))), (312, work(after(1))), // cudaGraphLaunch(graphExec, stream)
    (315, CAPTURE), (316, CAPTURE), // cudaStreamBeginCapture
    (319, CAPTURE), (320, CAPTURE), // cudaStreamEndCapture
    (327, CAPTURE),             // cudaThreadExchangeStreamCaptureMode
    (348, work(after(1))), (349, work(after(1))), // cudaGraphUpload(graphExec, stream)
    (370, work(after(1))), (371, work(after(1))), // cudaEventRecordWithFlags(event, stream, flags)
    (373, ALLOC), (374, ALLOC), (375, ALLOC), (376, ALLOC), (377, ALLOC), // cudaMallocAsync, cudaFreeAsync, cudaMemPoolTrimTo
    (391, ALLOC), (392, ALLOC), // cudaMallocFromPoolAsync
    (393, work(after(3))), (394, work(after(3))), (395, work(after(3))), (396, work(after(3))), // external semaphores, v2
    (411, CAPTURE), (412, CAPTURE), // cudaStreamUpdateCaptureDependencies
    (430, work(CUDA_LAUNCH_EX)), (431, work(CUDA_LAUNCH_EX)), // cudaLaunchKernelExC
    (449, work(after(4))), (450, work(after(4))), // cudaMemPrefetchAsync_v2(devPtr, count, location, flags, stream)
    (452, CAPTURE), (453, CAPTURE), // cudaStreamBeginCaptureToGraph
    (463, CAPTURE), (464, CAPTURE), // cudaStreamUpdateCaptureDependencies_v2
    (482, work(after(8))), (483, work(after(8))), // cudaMemcpyBatchAsync (12.8: with failIdx)
    (484, work(after(4))), (485, work(after(4))), // cudaMemcpy3DBatchAsync (12.8)
    (486, SYNC),                // cudaEventElapsedTime_v2
    (487, work(after(7))), (488, work(after(7))), // cudaMemPrefetchBatchAsync
    (489, work(after(4))), (490, work(after(4))), // cudaMemDiscardBatchAsync
    (491, work(after(7))), (492, work(after(7))), // cudaMemDiscardAndPrefetchBatchAsync
    (505, work(CUDA_LAUNCH_KERNEL)), (506, work(CUDA_LAUNCH_KERNEL)), // __cudaLaunchKernel (CUDA 13's <<<>>>)
    (509, work(after(7))), (510, work(after(7))), // cudaMemcpyBatchAsync (13.0)
    (511, work(after(3))), (512, work(after(3))), // cudaMemcpy3DBatchAsync (13.0)
    (534, SYNC),                // cudaExecutionCtxSynchronize
    (543, CONTEXT), (544, CONTEXT), // cudaExecutionCtxRecordEvent, cudaExecutionCtxWaitEvent
    (550, work(after(0))), (551, work(after(0))), // cudaLaunchHostFunc_v2(stream, ..)
    (554, work(after(4))), (555, work(after(4))), // cudaMemcpyWithAttributesAsync(dst, src, size, attr, stream)
    (556, work(after(2))), (557, work(after(2))), // cudaMemcpy3DWithAttributesAsync(op, flags, stream)
];

/// The call with CUPTI id `cbid` of the driver API (`runtime` false) or the runtime API,
/// if it is one the guard knows; else, if `name` looks like a call that enqueues work or
/// waits for the GPU, one whose stream is unknown; else `None` (a query, an attribute, a
/// module load: nothing a capture can lose).
pub(crate) fn classify(runtime: bool, cbid: u32, name: &[u8]) -> Option<Call> {
    let table = if runtime { RUNTIME } else { DRIVER };
    match table.binary_search_by_key(&cbid, |&(id, _)| id) {
        Ok(i) => Some(table[i].1),
        Err(_) if looks_like_work(name) => Some(UNKNOWN_STREAM),
        Err(_) => None,
    }
}

/// Whether an API the tables do not know enqueues work or waits for the GPU, by its name
/// (`cuFooAsync`, `cuFooAsync_ptsz`, `cudaFooAsync_v13020`, `cuLaunchFoo`,
/// `cudaFooSynchronize`): CUDA's own naming, kept since CUDA 2.
fn looks_like_work(name: &[u8]) -> bool {
    let name = std::str::from_utf8(name).unwrap_or("");
    let base = name
        .split("_ptsz")
        .next()
        .unwrap_or(name)
        .split("_ptds")
        .next()
        .unwrap_or(name);
    let base = match base.rsplit_once("_v") {
        Some((head, tail)) if tail.chars().all(|c| c.is_ascii_digit()) => head,
        _ => base,
    };
    let launch = [
        "cuLaunch",
        "cudaLaunch",
        "__cudaLaunch",
        "cuGraphLaunch",
        "cudaGraphLaunch",
    ]
    .iter()
    .any(|p| base.starts_with(p));
    launch || base.ends_with("Async") || base.contains("Synchronize")
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_uint, c_void};
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn the_tables_are_sorted_with_each_id_once() {
        for table in [DRIVER, RUNTIME] {
            assert!(table.windows(2).all(|w| w[0].0 < w[1].0), "{table:?}");
        }
    }

    /// The offsets above, against the C layout of the parameter lists they stand for.
    #[test]
    fn stream_offsets_follow_the_c_layout_of_the_parameters() {
        type Ptr = *mut c_void;
        #[repr(C)]
        struct LaunchKernel(Ptr, [c_uint; 6], c_uint, Ptr);
        assert_eq!(LAUNCH_KERNEL, StreamAt::Param(offset_of!(LaunchKernel, 3)));
        #[repr(C)]
        struct LaunchConfig([c_uint; 6], c_uint, Ptr);
        assert_eq!(LAUNCH_EX, StreamAt::Config(0, offset_of!(LaunchConfig, 2)));
        #[repr(C)]
        struct Dim3(c_uint, c_uint, c_uint);
        #[repr(C)]
        struct CudaLaunchKernel(Ptr, Dim3, Dim3, Ptr, usize, Ptr);
        assert_eq!(
            CUDA_LAUNCH_KERNEL,
            StreamAt::Param(offset_of!(CudaLaunchKernel, 5))
        );
        #[repr(C)]
        struct CudaLaunchConfig(Dim3, Dim3, usize, Ptr);
        assert_eq!(
            CUDA_LAUNCH_EX,
            StreamAt::Config(0, offset_of!(CudaLaunchConfig, 3))
        );
        // A byte, an int or a location padded to 8 by what follows.
        #[repr(C)]
        struct MemsetD8(u64, u8, usize, Ptr);
        assert_eq!(after(3), StreamAt::Param(offset_of!(MemsetD8, 3)));
        #[repr(C)]
        struct MemsetD2D32(u64, usize, c_uint, usize, usize, Ptr);
        assert_eq!(after(5), StreamAt::Param(offset_of!(MemsetD2D32, 5)));
        #[repr(C)]
        struct LaunchGridAsync(Ptr, i32, i32, Ptr);
        assert_eq!(after(2), StreamAt::Param(offset_of!(LaunchGridAsync, 3)));
        #[repr(C)]
        struct PrefetchV2(u64, usize, [i32; 2], c_uint, Ptr);
        assert_eq!(after(4), StreamAt::Param(offset_of!(PrefetchV2, 4)));
        #[repr(C)]
        struct CudaMemcpyAsync(Ptr, Ptr, usize, i32, Ptr);
        assert_eq!(after(4), StreamAt::Param(offset_of!(CudaMemcpyAsync, 4)));
        #[repr(C)]
        struct PitchedPtr(Ptr, usize, usize, usize);
        #[repr(C)]
        struct Extent(usize, usize, usize);
        #[repr(C)]
        struct CudaMemset3DAsync(PitchedPtr, i32, Extent, Ptr);
        assert_eq!(after(8), StreamAt::Param(offset_of!(CudaMemset3DAsync, 3)));
    }

    #[test]
    fn unknown_calls_that_enqueue_or_wait_are_told_by_their_names() {
        for name in [
            "cuMemcpyFooAsync",
            "cuMemcpyFooAsync_ptsz",
            "cudaFooAsync_v13020",
            "cuLaunchSomething",
            "__cudaLaunchKernel_ptsz_v13000",
            "cuGraphLaunchWithArguments",
            "cudaFooSynchronize",
        ] {
            assert!(looks_like_work(name.as_bytes()), "{name}");
        }
        for name in [
            "cuCtxGetCurrent",
            "cuFuncGetAttribute",
            "cuStreamGetCaptureInfo_v3",
            "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
            "cudaGetDevice",
            "cuGraphAddKernelNode_v2",
        ] {
            assert!(!looks_like_work(name.as_bytes()), "{name}");
        }
        // Known ids take the table's word, whatever the name.
        assert_eq!(classify(false, 307, b"x").map(|c| c.kind), Some(Kind::Work));
        assert_eq!(classify(true, 51, b"x").map(|c| c.stream), Some(after(3)));
        assert_eq!(classify(false, 304, b"cuCtxGetCurrent"), None);
        assert_eq!(classify(false, 9999, b"cuNewAsync"), Some(UNKNOWN_STREAM));
    }
}
