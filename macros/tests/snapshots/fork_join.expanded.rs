mod fork_join {
    use super::*;
    pub struct Buffers {
        pub seed: DeviceBuffer<f32>,
        pub lanes: [DeviceBuffer<f32>; 4],
        pub total: DeviceBuffer<f32>,
    }
    pub struct Config {
        pub iters: u32,
    }
    #[allow(clippy::too_many_arguments)]
    fn seed(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        seed: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.fill(stream, seed)
    }
    #[allow(clippy::too_many_arguments)]
    fn start(
        stream: &CaptureStream<'_>,
        d: usize,
        seed: &DeviceBuffer<f32>,
        lanes: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(seed, lanes)
    }
    #[allow(clippy::too_many_arguments)]
    fn work(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        lanes: &mut DeviceBuffer<f32>,
        iters: u32,
    ) -> Result<()> {
        k.chain_step(stream, lanes, iters)
    }
    #[allow(clippy::too_many_arguments)]
    fn sum(
        stream: &CaptureStream<'_>,
        k: &Kernels,
        lanes: &[DeviceBuffer<f32>; 4],
        total: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        k.sum(stream, lanes, total)
    }
    /// The schedule of this step, planned at compile time: ops in program order with
    /// their streams, buffer accesses, waits and records, the dependency edges, the
    /// events, the final joins and the critical path. `println!("{}", PLAN)` prints it.
    pub const PLAN: ::stepgraph::__rt_v1::PlanDesc = ::stepgraph::__rt_v1::PlanDesc {
        step: "fork_join",
        streams: &[
            ::stepgraph::__rt_v1::StreamDesc {
                name: "main",
                priority: ::stepgraph::__rt_v1::StreamPriority::Normal,
            },
            ::stepgraph::__rt_v1::StreamDesc {
                name: "chain[0]",
                priority: ::stepgraph::__rt_v1::StreamPriority::Normal,
            },
            ::stepgraph::__rt_v1::StreamDesc {
                name: "chain[1]",
                priority: ::stepgraph::__rt_v1::StreamPriority::Normal,
            },
            ::stepgraph::__rt_v1::StreamDesc {
                name: "chain[2]",
                priority: ::stepgraph::__rt_v1::StreamPriority::Normal,
            },
            ::stepgraph::__rt_v1::StreamDesc {
                name: "chain[3]",
                priority: ::stepgraph::__rt_v1::StreamPriority::Normal,
            },
        ],
        buffers: &[
            ::stepgraph::__rt_v1::BufferDesc {
                name: "seed",
                kind: ::stepgraph::__rt_v1::BufKind::Shared,
            },
            ::stepgraph::__rt_v1::BufferDesc {
                name: "lanes",
                kind: ::stepgraph::__rt_v1::BufKind::PerBranch,
            },
            ::stepgraph::__rt_v1::BufferDesc {
                name: "total",
                kind: ::stepgraph::__rt_v1::BufKind::Shared,
            },
        ],
        ops: &[
            ::stepgraph::__rt_v1::OpDesc {
                name: "seed",
                func: "seed",
                stream: ::stepgraph::__rt_v1::StreamId(0),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(0),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[],
                record: ::core::option::Option::Some(::stepgraph::__rt_v1::EventId(0)),
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "start[0]",
                func: "start",
                stream: ::stepgraph::__rt_v1::StreamId(1),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(0),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[::stepgraph::__rt_v1::EventId(0)],
                record: ::core::option::Option::None,
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "start[1]",
                func: "start",
                stream: ::stepgraph::__rt_v1::StreamId(2),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(0),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 1,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[::stepgraph::__rt_v1::EventId(0)],
                record: ::core::option::Option::None,
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "start[2]",
                func: "start",
                stream: ::stepgraph::__rt_v1::StreamId(3),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(0),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 2,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[::stepgraph::__rt_v1::EventId(0)],
                record: ::core::option::Option::None,
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "start[3]",
                func: "start",
                stream: ::stepgraph::__rt_v1::StreamId(4),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(0),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 3,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[::stepgraph::__rt_v1::EventId(0)],
                record: ::core::option::Option::None,
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "work[0]",
                func: "work",
                stream: ::stepgraph::__rt_v1::StreamId(1),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[],
                record: ::core::option::Option::Some(::stepgraph::__rt_v1::EventId(1)),
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "work[1]",
                func: "work",
                stream: ::stepgraph::__rt_v1::StreamId(2),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 1,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[],
                record: ::core::option::Option::Some(::stepgraph::__rt_v1::EventId(2)),
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "work[2]",
                func: "work",
                stream: ::stepgraph::__rt_v1::StreamId(3),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 2,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[],
                record: ::core::option::Option::Some(::stepgraph::__rt_v1::EventId(3)),
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "work[3]",
                func: "work",
                stream: ::stepgraph::__rt_v1::StreamId(4),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 3,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[],
                record: ::core::option::Option::Some(::stepgraph::__rt_v1::EventId(4)),
                cost: 1f64,
            },
            ::stepgraph::__rt_v1::OpDesc {
                name: "sum",
                func: "sum",
                stream: ::stepgraph::__rt_v1::StreamId(0),
                accesses: &[
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 1,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 2,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(1),
                        copy: 3,
                        access: ::stepgraph::__rt_v1::Access::Read,
                    },
                    ::stepgraph::__rt_v1::AccessDesc {
                        buf: ::stepgraph::__rt_v1::BufId(2),
                        copy: 0,
                        access: ::stepgraph::__rt_v1::Access::Write,
                    },
                ],
                waits: &[
                    ::stepgraph::__rt_v1::EventId(1),
                    ::stepgraph::__rt_v1::EventId(2),
                    ::stepgraph::__rt_v1::EventId(3),
                    ::stepgraph::__rt_v1::EventId(4),
                ],
                record: ::core::option::Option::None,
                cost: 1f64,
            },
        ],
        edges: &[
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(0),
                to: ::stepgraph::__rt_v1::OpId(1),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(0)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(0),
                to: ::stepgraph::__rt_v1::OpId(2),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(0)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(0),
                to: ::stepgraph::__rt_v1::OpId(3),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(0)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(0),
                to: ::stepgraph::__rt_v1::OpId(4),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(0)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(1),
                to: ::stepgraph::__rt_v1::OpId(5),
                kind: ::stepgraph::__rt_v1::EdgeKind::WriteAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(2),
                to: ::stepgraph::__rt_v1::OpId(6),
                kind: ::stepgraph::__rt_v1::EdgeKind::WriteAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(3),
                to: ::stepgraph::__rt_v1::OpId(7),
                kind: ::stepgraph::__rt_v1::EdgeKind::WriteAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(4),
                to: ::stepgraph::__rt_v1::OpId(8),
                kind: ::stepgraph::__rt_v1::EdgeKind::WriteAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(5),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(6),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(7),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(8),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::ReadAfterWrite,
                buf: ::core::option::Option::Some(::stepgraph::__rt_v1::BufId(1)),
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(5),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::Join,
                buf: ::core::option::Option::None,
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(6),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::Join,
                buf: ::core::option::Option::None,
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(7),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::Join,
                buf: ::core::option::Option::None,
            },
            ::stepgraph::__rt_v1::EdgeDesc {
                from: ::stepgraph::__rt_v1::OpId(8),
                to: ::stepgraph::__rt_v1::OpId(9),
                kind: ::stepgraph::__rt_v1::EdgeKind::Join,
                buf: ::core::option::Option::None,
            },
        ],
        events: &[
            ::stepgraph::__rt_v1::EventDesc {
                stream: ::stepgraph::__rt_v1::StreamId(0),
                after: ::core::option::Option::Some(::stepgraph::__rt_v1::OpId(0)),
            },
            ::stepgraph::__rt_v1::EventDesc {
                stream: ::stepgraph::__rt_v1::StreamId(1),
                after: ::core::option::Option::Some(::stepgraph::__rt_v1::OpId(5)),
            },
            ::stepgraph::__rt_v1::EventDesc {
                stream: ::stepgraph::__rt_v1::StreamId(2),
                after: ::core::option::Option::Some(::stepgraph::__rt_v1::OpId(6)),
            },
            ::stepgraph::__rt_v1::EventDesc {
                stream: ::stepgraph::__rt_v1::StreamId(3),
                after: ::core::option::Option::Some(::stepgraph::__rt_v1::OpId(7)),
            },
            ::stepgraph::__rt_v1::EventDesc {
                stream: ::stepgraph::__rt_v1::StreamId(4),
                after: ::core::option::Option::Some(::stepgraph::__rt_v1::OpId(8)),
            },
        ],
        final_waits: &[],
        critical_path: &[
            ::stepgraph::__rt_v1::OpId(0),
            ::stepgraph::__rt_v1::OpId(1),
            ::stepgraph::__rt_v1::OpId(5),
            ::stepgraph::__rt_v1::OpId(9),
        ],
        critical_path_by_cost: &[
            ::stepgraph::__rt_v1::OpId(0),
            ::stepgraph::__rt_v1::OpId(1),
            ::stepgraph::__rt_v1::OpId(5),
            ::stepgraph::__rt_v1::OpId(9),
        ],
    };
    const _: () = ::core::assert!(
        (4) == 4,
        "#[per_branch] buffer `lanes` must have one element per branch of its stream group (4)"
    );
    /// Scratch copies beyond the one in the buffers struct, one per extra stream
    /// or branch that uses the buffer.
    #[doc(hidden)]
    pub struct __Scratch {}
    /// The captured step: owns its buffers, its streams, events and cuBLASLt
    /// workspaces, and the graph. The executor is the first field, so it is dropped
    /// (waiting for a replay in flight, destroying the graph) before any buffer.
    pub struct Step {
        exec: ::stepgraph::__rt_v1::Executor,
        buffers: Buffers,
        scratch: __Scratch,
        config: Config,
        kernels: ::std::sync::Arc<Kernels>,
    }
    impl ::core::fmt::Debug for Step {
        fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
            f.debug_struct("fork_join").field("exec", &self.exec).finish_non_exhaustive()
        }
    }
    impl Step {
        /// Builds the step with the planned multi-stream schedule and captures it.
        pub fn new(
            device: &::stepgraph::__rt_v1::Device,
            kernels: ::std::sync::Arc<Kernels>,
            buffers: Buffers,
            config: Config,
        ) -> ::stepgraph::__rt_v1::Result<Self> {
            Self::with_schedule(
                device,
                kernels,
                buffers,
                config,
                ::stepgraph::__rt_v1::Schedule::Planned,
            )
        }
        /// Builds the step with the given schedule (`OneStream` is the one-stream
        /// baseline) and captures it. Every stream, event, workspace and scratch
        /// copy is created here, before capture.
        pub fn with_schedule(
            device: &::stepgraph::__rt_v1::Device,
            kernels: ::std::sync::Arc<Kernels>,
            buffers: Buffers,
            config: Config,
            schedule: ::stepgraph::__rt_v1::Schedule,
        ) -> ::stepgraph::__rt_v1::Result<Self> {
            let exec = ::stepgraph::__rt_v1::Executor::new(device, &PLAN, schedule)?;
            let scratch = __Scratch {};
            let mut step = Step {
                exec,
                buffers,
                scratch,
                config,
                kernels,
            };
            step.capture()?;
            ::core::result::Result::Ok(step)
        }
        /// The compile-time plan.
        pub const fn plan() -> &'static ::stepgraph::__rt_v1::PlanDesc {
            &PLAN
        }
        /// Launches one replay of the graph (capturing again first if buffers
        /// were rebound).
        pub fn replay(&mut self) -> ::stepgraph::__rt_v1::Result<()> {
            if self.exec.is_stale() {
                self.capture()?;
            }
            self.exec.replay()
        }
        /// Runs the ops once without a graph, issued as they come (the eager
        /// baseline), on the same streams and events.
        pub fn run_eager(&mut self) -> ::stepgraph::__rt_v1::Result<()> {
            let Step { exec, buffers, scratch, config, kernels } = self;
            exec.run_eager(
                &mut |__issue| Self::issue(__issue, buffers, scratch, config, kernels),
            )
        }
        /// Waits for the last replay or eager run.
        pub fn wait(&self) -> ::stepgraph::__rt_v1::Result<()> {
            self.exec.wait()
        }
        /// Waits for the last replay and returns the proof that host values the
        /// graph reads (device scalars) may be written.
        pub fn host_access(
            &self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::HostAccess<'_>> {
            self.exec.host_access()
        }
        /// The buffers. Reading them on the host needs [`Step::wait`] first.
        pub fn buffers(&self) -> &Buffers {
            &self.buffers
        }
        /// The config values.
        pub fn config(&self) -> &Config {
            &self.config
        }
        /// Waits for the last replay and copies `data` into the buffer `select`
        /// picks, in place: its address does not change, so the graph stays valid.
        pub fn upload<T: ::stepgraph::__rt_v1::DeviceRepr>(
            &mut self,
            select: impl ::core::ops::FnOnce(
                &Buffers,
            ) -> &::stepgraph::__rt_v1::DeviceBuffer<T>,
            data: &[T],
        ) -> ::stepgraph::__rt_v1::Result<()> {
            self.exec.upload(select(&self.buffers), data)
        }
        /// Waits for the last replay and copies the buffer `select` picks to the host.
        pub fn download<
            T: ::stepgraph::__rt_v1::DeviceRepr + ::core::clone::Clone
                + ::core::default::Default,
        >(
            &self,
            select: impl ::core::ops::FnOnce(
                &Buffers,
            ) -> &::stepgraph::__rt_v1::DeviceBuffer<T>,
        ) -> ::stepgraph::__rt_v1::Result<::std::vec::Vec<T>> {
            self.exec.download(select(&self.buffers))
        }
        /// The executor: streams, events, the graph.
        pub fn executor(&self) -> &::stepgraph::__rt_v1::Executor {
            &self.exec
        }
        /// Waits for the last replay, lets `f` change the buffers (swap one for
        /// another of the same shape, say), and captures again: the executable graph
        /// is updated in place when the driver accepts it, instantiated anew otherwise.
        pub fn rebind<R>(
            &mut self,
            f: impl ::core::ops::FnOnce(&mut Buffers) -> R,
        ) -> ::stepgraph::__rt_v1::Result<R> {
            self.exec.wait()?;
            let out = f(&mut self.buffers);
            self.exec.mark_stale();
            self.capture()?;
            ::core::result::Result::Ok(out)
        }
        /// Waits for the last replay, drops the graph, and returns the buffers and
        /// config.
        pub fn into_parts(self) -> ::stepgraph::__rt_v1::Result<(Buffers, Config)> {
            self.exec.wait()?;
            let Step { exec, buffers, config, .. } = self;
            ::core::mem::drop(exec);
            ::core::result::Result::Ok((buffers, config))
        }
        /// Captures a second graph of the step with timing events around every op,
        /// replays it `replays` times and returns the median timeline: per-op
        /// durations, per-stream busy time, the measured critical path, the overlap.
        /// The normal graph is untouched.
        pub fn profile(
            &mut self,
            replays: usize,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::Profile> {
            let Step { exec, buffers, scratch, config, kernels } = self;
            exec.profile(
                &mut |__issue| Self::issue(__issue, buffers, scratch, config, kernels),
                replays,
            )
        }
        /// Captures the step once more and measures its work bound: every kernel
        /// timed alone, weighted by the share of the GPU its grid occupies. The
        /// kernels run many times on this step's buffers (in-place updates
        /// included): measure when the values no longer matter.
        pub fn work_bound(
            &mut self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::WorkBound> {
            let Step { exec, buffers, scratch, config, kernels } = self;
            exec.work_bound(
                &mut |__issue| Self::issue(__issue, buffers, scratch, config, kernels),
            )
        }
        /// Captures the step again, reads the graph back from the driver and checks
        /// it against the plan: every dependency ordered, nothing independent
        /// ordered, each op's nodes what it issued. Debug builds do this at every
        /// capture.
        pub fn verify(
            &mut self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::VerifyReport> {
            let Step { exec, buffers, scratch, config, kernels } = self;
            exec.verify(
                &mut |__issue| Self::issue(__issue, buffers, scratch, config, kernels),
            )
        }
        fn capture(&mut self) -> ::stepgraph::__rt_v1::Result<()> {
            let Step { exec, buffers, scratch, config, kernels } = self;
            exec.capture(
                &mut |__issue| Self::issue(__issue, buffers, scratch, config, kernels),
            )
        }
        #[allow(unused_variables, clippy::needless_borrow)]
        fn issue(
            __issue: &::stepgraph::__rt_v1::Issue<'_>,
            __buffers: &mut Buffers,
            __scratch: &mut __Scratch,
            __config: &Config,
            __kernels: &Kernels,
        ) -> ::stepgraph::__rt_v1::Result<()> {
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(0),
                    |__stream| { seed(__stream, __kernels, &mut __buffers.seed) },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(1),
                    |__stream| {
                        start(__stream, 0, &__buffers.seed, &mut __buffers.lanes[0])
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(2),
                    |__stream| {
                        start(__stream, 1, &__buffers.seed, &mut __buffers.lanes[1])
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(3),
                    |__stream| {
                        start(__stream, 2, &__buffers.seed, &mut __buffers.lanes[2])
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(4),
                    |__stream| {
                        start(__stream, 3, &__buffers.seed, &mut __buffers.lanes[3])
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(5),
                    |__stream| {
                        work(
                            __stream,
                            __kernels,
                            &mut __buffers.lanes[0],
                            ::core::clone::Clone::clone(&__config.iters),
                        )
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(6),
                    |__stream| {
                        work(
                            __stream,
                            __kernels,
                            &mut __buffers.lanes[1],
                            ::core::clone::Clone::clone(&__config.iters),
                        )
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(7),
                    |__stream| {
                        work(
                            __stream,
                            __kernels,
                            &mut __buffers.lanes[2],
                            ::core::clone::Clone::clone(&__config.iters),
                        )
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(8),
                    |__stream| {
                        work(
                            __stream,
                            __kernels,
                            &mut __buffers.lanes[3],
                            ::core::clone::Clone::clone(&__config.iters),
                        )
                    },
                )?;
            __issue
                .op(
                    ::stepgraph::__rt_v1::OpId(9),
                    |__stream| {
                        sum(__stream, __kernels, &__buffers.lanes, &mut __buffers.total)
                    },
                )?;
            ::core::result::Result::Ok(())
        }
    }
}
