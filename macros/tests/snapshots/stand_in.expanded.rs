::core::compile_error! {
    "two ops are named `a`; ops are named by their function, rename one (the first is op #0)"
}
::core::compile_error! {
    "op placed on `auxx` is not a stream of this step (declared: main, aux); did you mean `aux`?"
}
#[allow(dead_code, unused)]
mod broken {
    use super::*;
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }
    /// This step declares no config values.
    #[derive(Debug, Default, Clone, Copy)]
    pub struct Config {}
    fn a(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) -> Result<()> {
        stream.memset_zeros(x)
    }
    use ::stepgraph::__rt_v1 as __sg;
    /// Stand-in: the step has errors.
    pub const PLAN: __sg::PlanDesc = __sg::PlanDesc::new("broken");
    /// This step, captured and replayed: see [`Step`](__sg::Step) for its methods.
    pub type Step = __sg::Step<Spec>;
    /// What [`Step`] runs: this module's plan, buffers, config, kernels and ops.
    #[derive(Debug)]
    pub struct Spec;
    impl __sg::StepSpec for Spec {
        type Buffers = Buffers;
        type Config = Config;
        type Kernels = ();
        type Scratch = ();
        const PLAN: &'static __sg::PlanDesc = &PLAN;
        fn scratch(_: &Buffers, _: &__sg::Device) -> __sg::Result<()> {
            ::core::result::Result::Ok(())
        }
        fn issue(
            _: &__sg::Issue<'_>,
            _: &mut Buffers,
            _: &mut (),
            _: &Config,
            _: &(),
        ) -> __sg::Result<()> {
            ::core::result::Result::Ok(())
        }
    }
}
