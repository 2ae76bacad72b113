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
    /// Stand-in: the step has errors.
    pub const PLAN: ::stepgraph::__rt_v1::PlanDesc = ::stepgraph::__rt_v1::PlanDesc {
        step: "broken",
        streams: &[],
        buffers: &[],
        ops: &[],
        edges: &[],
        events: &[],
        final_waits: &[],
        critical_path: &[],
        critical_path_by_cost: &[],
    };
    /// Stand-in: the step has errors.
    #[derive(Debug)]
    pub struct Step {
        _private: (),
    }
    impl Step {
        pub fn new(
            device: &::stepgraph::__rt_v1::Device,
            buffers: Buffers,
            config: Config,
        ) -> ::stepgraph::__rt_v1::Result<Self> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn with_schedule(
            device: &::stepgraph::__rt_v1::Device,
            buffers: Buffers,
            config: Config,
            schedule: ::stepgraph::__rt_v1::Schedule,
        ) -> ::stepgraph::__rt_v1::Result<Self> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub const fn plan() -> &'static ::stepgraph::__rt_v1::PlanDesc {
            &PLAN
        }
        pub fn replay(&mut self) -> ::stepgraph::__rt_v1::Result<()> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn run_eager(&mut self) -> ::stepgraph::__rt_v1::Result<()> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn wait(&self) -> ::stepgraph::__rt_v1::Result<()> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn host_access(
            &self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::HostAccess<'_>> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn buffers(&self) -> &Buffers {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn config(&self) -> &Config {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn upload<T: ::stepgraph::__rt_v1::DeviceRepr>(
            &mut self,
            select: impl ::core::ops::FnOnce(
                &Buffers,
            ) -> &::stepgraph::__rt_v1::DeviceBuffer<T>,
            data: &[T],
        ) -> ::stepgraph::__rt_v1::Result<()> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn download<
            T: ::stepgraph::__rt_v1::DeviceRepr + ::core::clone::Clone
                + ::core::default::Default,
        >(
            &self,
            select: impl ::core::ops::FnOnce(
                &Buffers,
            ) -> &::stepgraph::__rt_v1::DeviceBuffer<T>,
        ) -> ::stepgraph::__rt_v1::Result<::std::vec::Vec<T>> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn executor(&self) -> &::stepgraph::__rt_v1::Executor {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn rebind<R>(
            &mut self,
            f: impl ::core::ops::FnOnce(&mut Buffers) -> R,
        ) -> ::stepgraph::__rt_v1::Result<R> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn into_parts(self) -> ::stepgraph::__rt_v1::Result<(Buffers, Config)> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn profile(
            &mut self,
            replays: usize,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::Profile> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn work_bound(
            &mut self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::WorkBound> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
        pub fn verify(
            &mut self,
        ) -> ::stepgraph::__rt_v1::Result<::stepgraph::__rt_v1::VerifyReport> {
            ::core::panic!("stepgraph: step `broken` did not compile")
        }
    }
}
