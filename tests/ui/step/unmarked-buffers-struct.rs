use stepgraph::{CaptureStream, Result};

#[stepgraph::step(streams(main))]
mod s {
    use super::*;

    // Without #[buffers] this is not the step's buffers, and the expansion adds its own.
    pub struct Buffers {}

    fn nothing(stream: &CaptureStream<'_>) -> Result<()> {
        let _ = stream;
        Ok(())
    }
}

fn main() {}
