use stepgraph::{CaptureStream, DeviceBuffer};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    #[buffers]
    pub struct Buffers {
        pub x: DeviceBuffer<f32>,
    }

    // An op returns `stepgraph::Result<()>`: its errors are how a failed launch stops
    // the capture.
    fn clear(stream: &CaptureStream<'_>, x: &mut DeviceBuffer<f32>) {
        let _ = stream.memset_zeros(x);
    }
}

fn main() {}
