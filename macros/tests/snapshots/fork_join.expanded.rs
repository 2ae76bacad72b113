///
/** The schedule, planned at compile time (`PLAN` has it in full):

 ```text
 main      seed, sum
 chain[0]  start[0], work[0]
 chain[1]  start[1], work[1]
 chain[2]  start[2], work[2]
 chain[3]  start[3], work[3]
 ```
 5 streams, 10 ops, 5 events. Critical path (ops): seed → start[0] → work[0] → sum.*/
mod fork_join {
    use super::*;
    ///The width of the stream group `chain`: its branches, one stream each.
    pub const CHAIN_WIDTH: usize = 4;
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
    use ::stepgraph::__rt_v1 as __sg;
    /// The schedule of this step, planned at compile time. `println!("{}", PLAN)` prints it in full.
    ///
    /** ```text
 main      seed, sum
 chain[0]  start[0], work[0]
 chain[1]  start[1], work[1]
 chain[2]  start[2], work[2]
 chain[3]  start[3], work[3]
 ```
 5 streams, 10 ops, 5 events. Critical path (ops): seed → start[0] → work[0] → sum.*/
    pub const PLAN: __sg::PlanDesc = __sg::PlanDesc::new("fork_join")
        .with_streams(
            &[
                __sg::StreamDesc::named("main"),
                __sg::StreamDesc::named("chain[0]"),
                __sg::StreamDesc::named("chain[1]"),
                __sg::StreamDesc::named("chain[2]"),
                __sg::StreamDesc::named("chain[3]"),
            ],
        )
        .with_buffers(
            &[
                __sg::BufferDesc::new("seed", __sg::BufKind::Shared),
                __sg::BufferDesc::new("lanes", __sg::BufKind::PerBranch),
                __sg::BufferDesc::new("total", __sg::BufKind::Shared),
            ],
        )
        .with_ops(__OPS)
        .with_edges(__EDGES)
        .with_events(
            &[
                __sg::event(0, 0),
                __sg::event(1, 5),
                __sg::event(2, 6),
                __sg::event(3, 7),
                __sg::event(4, 8),
            ],
        )
        .with_final_waits(&__sg::events([]))
        .with_critical_paths(&__sg::ops([0, 1, 5, 9]), &__sg::ops([0, 1, 5, 9]));
    const __OPS: &[__sg::OpDesc] = &[
        __sg::op("seed", "seed", 0, &[__sg::write(0, 0)]).with_record(__sg::EventId(0)),
        __sg::op("start[0]", "start", 1, &[__sg::read(0, 0), __sg::write(1, 0)])
            .with_waits(&__sg::events([0])),
        __sg::op("start[1]", "start", 2, &[__sg::read(0, 0), __sg::write(1, 1)])
            .with_waits(&__sg::events([0])),
        __sg::op("start[2]", "start", 3, &[__sg::read(0, 0), __sg::write(1, 2)])
            .with_waits(&__sg::events([0])),
        __sg::op("start[3]", "start", 4, &[__sg::read(0, 0), __sg::write(1, 3)])
            .with_waits(&__sg::events([0])),
        __sg::op("work[0]", "work", 1, &[__sg::write(1, 0)])
            .with_record(__sg::EventId(1)),
        __sg::op("work[1]", "work", 2, &[__sg::write(1, 1)])
            .with_record(__sg::EventId(2)),
        __sg::op("work[2]", "work", 3, &[__sg::write(1, 2)])
            .with_record(__sg::EventId(3)),
        __sg::op("work[3]", "work", 4, &[__sg::write(1, 3)])
            .with_record(__sg::EventId(4)),
        __sg::op(
                "sum",
                "sum",
                0,
                &[
                    __sg::read(1, 0),
                    __sg::read(1, 1),
                    __sg::read(1, 2),
                    __sg::read(1, 3),
                    __sg::write(2, 0),
                ],
            )
            .with_waits(&__sg::events([1, 2, 3, 4])),
    ];
    const __EDGES: &[__sg::EdgeDesc] = &[
        __sg::raw(0, 1, 0),
        __sg::raw(0, 2, 0),
        __sg::raw(0, 3, 0),
        __sg::raw(0, 4, 0),
        __sg::waw(1, 5, 1),
        __sg::waw(2, 6, 1),
        __sg::waw(3, 7, 1),
        __sg::waw(4, 8, 1),
        __sg::raw(5, 9, 1),
        __sg::raw(6, 9, 1),
        __sg::raw(7, 9, 1),
        __sg::raw(8, 9, 1),
        __sg::join(5, 9),
        __sg::join(6, 9),
        __sg::join(7, 9),
        __sg::join(8, 9),
    ];
    const _: () = ::core::assert!(
        (4) == 4,
        "#[per_branch] buffer `lanes` must have one element per branch of its stream group (4)"
    );
    const _: () = {
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_buffer::<[DeviceBuffer<f32>; 4]>();
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_config::<u32>();
    };
    /// Scratch copies beyond the one in the buffers struct.
    #[doc(hidden)]
    pub struct __Scratch {}
    /// This step, captured and replayed: see [`Step`](__sg::Step) for its methods.
    pub type Step = __sg::Step<Spec>;
    /// What [`Step`] runs: this module's plan, buffers, config, kernels and ops.
    #[derive(Debug)]
    pub struct Spec;
    impl __sg::StepSpec for Spec {
        type Buffers = Buffers;
        type Config = Config;
        type Kernels = Kernels;
        type Scratch = __Scratch;
        const PLAN: &'static __sg::PlanDesc = &PLAN;
        fn scratch(buffers: &Buffers, device: &__sg::Device) -> __sg::Result<__Scratch> {
            ::core::result::Result::Ok(__Scratch {})
        }
        #[allow(unused_variables, clippy::needless_borrow)]
        fn issue(
            __i: &__sg::Issue<'_>,
            __b: &mut Buffers,
            __s: &mut __Scratch,
            __c: &Config,
            __k: &Kernels,
        ) -> __sg::Result<()> {
            __i.op(
                __sg::OpId(0),
                |__st| {
                    let __a2 = &mut __b.seed;
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("seed", & * __a2)],
                    );
                    let __done = seed(__st, __k, &mut *__a2);
                    __grant.leave(::std::vec![__sg::granted("seed", & * __a2)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(1),
                |__st| {
                    let __a2 = &__b.seed;
                    let __a3 = &mut __b.lanes[0];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[0]", & * __a3)],
                    );
                    let __done = start(__st, 0, __a2, &mut *__a3);
                    __grant.leave(::std::vec![__sg::granted("lanes[0]", & * __a3)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(2),
                |__st| {
                    let __a2 = &__b.seed;
                    let __a3 = &mut __b.lanes[1];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[1]", & * __a3)],
                    );
                    let __done = start(__st, 1, __a2, &mut *__a3);
                    __grant.leave(::std::vec![__sg::granted("lanes[1]", & * __a3)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(3),
                |__st| {
                    let __a2 = &__b.seed;
                    let __a3 = &mut __b.lanes[2];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[2]", & * __a3)],
                    );
                    let __done = start(__st, 2, __a2, &mut *__a3);
                    __grant.leave(::std::vec![__sg::granted("lanes[2]", & * __a3)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(4),
                |__st| {
                    let __a2 = &__b.seed;
                    let __a3 = &mut __b.lanes[3];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[3]", & * __a3)],
                    );
                    let __done = start(__st, 3, __a2, &mut *__a3);
                    __grant.leave(::std::vec![__sg::granted("lanes[3]", & * __a3)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(5),
                |__st| {
                    let __a2 = &mut __b.lanes[0];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[0]", & * __a2)],
                    );
                    let __done = work(__st, __k, &mut *__a2, __sg::cfg(&__c.iters));
                    __grant.leave(::std::vec![__sg::granted("lanes[0]", & * __a2)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(6),
                |__st| {
                    let __a2 = &mut __b.lanes[1];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[1]", & * __a2)],
                    );
                    let __done = work(__st, __k, &mut *__a2, __sg::cfg(&__c.iters));
                    __grant.leave(::std::vec![__sg::granted("lanes[1]", & * __a2)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(7),
                |__st| {
                    let __a2 = &mut __b.lanes[2];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[2]", & * __a2)],
                    );
                    let __done = work(__st, __k, &mut *__a2, __sg::cfg(&__c.iters));
                    __grant.leave(::std::vec![__sg::granted("lanes[2]", & * __a2)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(8),
                |__st| {
                    let __a2 = &mut __b.lanes[3];
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("lanes[3]", & * __a2)],
                    );
                    let __done = work(__st, __k, &mut *__a2, __sg::cfg(&__c.iters));
                    __grant.leave(::std::vec![__sg::granted("lanes[3]", & * __a2)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(9),
                |__st| {
                    let __a2 = &__b.lanes;
                    let __a3 = &mut __b.total;
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("total", & * __a3)],
                    );
                    let __done = sum(__st, __k, __a2, &mut *__a3);
                    __grant.leave(::std::vec![__sg::granted("total", & * __a3)])?;
                    __done
                },
            )?;
            ::core::result::Result::Ok(())
        }
    }
}
