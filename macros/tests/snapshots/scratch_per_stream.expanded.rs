///
/** The schedule, planned at compile time (`PLAN` has it in full):

 ```text
 main  trunk
 iqn   iqn
 attn  attn
 ```
 3 streams, 3 ops, 3 events. Critical path (ops): trunk → iqn.*/
pub mod heads {
    use super::*;
    pub struct Buffers {
        pub features: DeviceBuffer<f32>,
        pub tmp: DeviceBuffer<f32>,
        pub iqn_out: DeviceBuffer<f32>,
        pub attn_out: DeviceBuffer<f32>,
    }
    pub struct Config {
        pub spec: Matmul,
    }
    #[allow(clippy::too_many_arguments)]
    fn trunk(
        stream: &CaptureStream<'_>,
        features: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.memset_zeros(features)
    }
    #[allow(clippy::too_many_arguments)]
    fn iqn(
        blas: &Blas<'_>,
        features: &DeviceBuffer<f32>,
        tmp: &mut DeviceBuffer<f32>,
        iqn_out: &mut DeviceBuffer<f32>,
        spec: Matmul,
    ) -> Result<()> {
        blas.run(&spec, features, tmp, iqn_out)
    }
    #[allow(clippy::too_many_arguments)]
    fn attn(
        stream: &CaptureStream<'_>,
        features: &DeviceBuffer<f32>,
        tmp: &mut DeviceBuffer<f32>,
        attn_out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        stream.copy(features, tmp)?;
        stream.copy(tmp, attn_out)
    }
    use ::stepgraph::__rt_v1 as __sg;
    /// The schedule of this step, planned at compile time. `println!("{}", PLAN)` prints it in full.
    ///
    /** ```text
 main  trunk
 iqn   iqn
 attn  attn
 ```
 3 streams, 3 ops, 3 events. Critical path (ops): trunk → iqn.*/
    pub const PLAN: __sg::PlanDesc = __sg::PlanDesc::new("heads")
        .with_streams(
            &[
                __sg::StreamDesc::named("main"),
                __sg::StreamDesc::named("iqn"),
                __sg::StreamDesc::named("attn"),
            ],
        )
        .with_buffers(
            &[
                __sg::BufferDesc::new("features", __sg::BufKind::Shared),
                __sg::BufferDesc::new("tmp", __sg::BufKind::ScratchPerStream),
                __sg::BufferDesc::new("iqn_out", __sg::BufKind::Shared),
                __sg::BufferDesc::new("attn_out", __sg::BufKind::Shared),
            ],
        )
        .with_ops(__OPS)
        .with_edges(__EDGES)
        .with_events(&[__sg::event(0, 0), __sg::event(1, 1), __sg::event(2, 2)])
        .with_final_waits(&__sg::events([1, 2]))
        .with_critical_paths(&__sg::ops([0, 1]), &__sg::ops([0, 1]));
    const __OPS: &[__sg::OpDesc] = &[
        __sg::op("trunk", "trunk", 0, &[__sg::write(0, 0)])
            .with_record(__sg::EventId(0))
            .with_cost(2f64),
        __sg::op(
                "iqn",
                "iqn",
                1,
                &[__sg::read(0, 0), __sg::write(1, 0), __sg::write(2, 0)],
            )
            .with_waits(&__sg::events([0]))
            .with_record(__sg::EventId(1)),
        __sg::op(
                "attn",
                "attn",
                2,
                &[__sg::read(0, 0), __sg::write(1, 1), __sg::write(3, 0)],
            )
            .with_waits(&__sg::events([0]))
            .with_record(__sg::EventId(2)),
    ];
    const __EDGES: &[__sg::EdgeDesc] = &[__sg::raw(0, 1, 0), __sg::raw(0, 2, 0)];
    const _: () = {
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_buffer::<DeviceBuffer<f32>>();
        __sg::assert_config::<Matmul>();
    };
    /// Scratch copies beyond the one in the buffers struct.
    #[doc(hidden)]
    pub struct __Scratch {
        tmp: ::std::vec::Vec<DeviceBuffer<f32>>,
    }
    /// This step, captured and replayed: see [`Step`](__sg::Step) for its methods.
    pub type Step = __sg::Step<Spec>;
    /// What [`Step`] runs: this module's plan, buffers, config, kernels and ops.
    #[derive(Debug)]
    pub struct Spec;
    impl __sg::StepSpec for Spec {
        type Buffers = Buffers;
        type Config = Config;
        type Kernels = ();
        type Scratch = __Scratch;
        const PLAN: &'static __sg::PlanDesc = &PLAN;
        fn scratch(buffers: &Buffers, device: &__sg::Device) -> __sg::Result<__Scratch> {
            ::core::result::Result::Ok(__Scratch {
                tmp: __sg::scratch_copies(&buffers.tmp, device, "tmp", 1usize)?,
            })
        }
        #[allow(unused_variables, clippy::needless_borrow)]
        fn issue(
            __i: &__sg::Issue<'_>,
            __b: &mut Buffers,
            __s: &mut __Scratch,
            __c: &Config,
            __k: &(),
        ) -> __sg::Result<()> {
            __i.op(
                __sg::OpId(0),
                |__st| {
                    let __a1 = &mut __b.features;
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![__sg::granted("features", & * __a1)],
                    );
                    let __done = trunk(__st, &mut *__a1);
                    __grant.leave(::std::vec![__sg::granted("features", & * __a1)])?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(1),
                |__st| {
                    let __a1 = &__b.features;
                    let __a2 = &mut __b.tmp;
                    let __a3 = &mut __b.iqn_out;
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![
                            __sg::granted("tmp", & * __a2), __sg::granted("iqn_out", & *
                            __a3)
                        ],
                    );
                    let __done = iqn(
                        &__st.blas(),
                        __a1,
                        &mut *__a2,
                        &mut *__a3,
                        __sg::cfg(&__c.spec),
                    );
                    __grant
                        .leave(
                            ::std::vec![
                                __sg::granted("tmp", & * __a2), __sg::granted("iqn_out", & *
                                __a3)
                            ],
                        )?;
                    __done
                },
            )?;
            __i.op(
                __sg::OpId(2),
                |__st| {
                    let __a1 = &__b.features;
                    let __a2 = &mut __s.tmp[0];
                    let __a3 = &mut __b.attn_out;
                    let __grant = __sg::Grant::enter(
                        __st,
                        ::std::vec![
                            __sg::granted("tmp", & * __a2), __sg::granted("attn_out", & *
                            __a3)
                        ],
                    );
                    let __done = attn(__st, __a1, &mut *__a2, &mut *__a3);
                    __grant
                        .leave(
                            ::std::vec![
                                __sg::granted("tmp", & * __a2), __sg::granted("attn_out", &
                                * __a3)
                            ],
                        )?;
                    __done
                },
            )?;
            ::core::result::Result::Ok(())
        }
    }
}
