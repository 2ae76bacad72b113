//! GPU tests of the launch checks: every kernel's parameter list comes from the driver
//! when the kernels load, and a launch assembled by hand whose arguments differ from it in
//! number or size is refused, naming the kernel and the argument, before anything runs.
//! They need a CUDA GPU of compute capability 9.0.

use super::{Rng, bits, device, kernels, run_one_op};
use stepgraph::kernel::{ArgMismatch, Param};
use stepgraph::{Error, LaunchConfig};
use stepgraph_kernels::KernelId;
use stepgraph_kernels::reference::axpby_reference;

const N: usize = 1000;
const A: f32 = 0.5;
const B: f32 = -2.0;

fn config() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (N.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The op's own error, out of the executor's `Error::Op`.
fn inner(e: Error) -> Error {
    match e {
        Error::Op { source, .. } => match source.downcast::<Error>() {
            Ok(inner) => *inner,
            Err(other) => Error::Invalid(other.to_string()),
        },
        other => other,
    }
}

#[test]
fn gpu_the_loaded_kernels_carry_the_drivers_parameter_list_with_declared_names() {
    let device = device();
    let k = kernels(&device);
    let params = k.kernel(KernelId::Axpby).params();
    let got: Vec<(usize, usize, Option<&str>, Option<&str>)> = params
        .iter()
        .map(|p| (p.offset, p.size, p.name, p.c_type))
        .collect();
    assert_eq!(
        got,
        [
            (0, 8, Some("x"), Some("const float*")),
            (8, 8, Some("y"), Some("float*")),
            (16, 4, Some("n"), Some("unsigned")),
            (20, 4, Some("a"), Some("float")),
            (24, 4, Some("b"), Some("float")),
        ]
    );
    // Looked up by name alone, a kernel still gets its sizes from the driver.
    let bare = k.module(KernelId::Axpby.module()).kernel("axpby").unwrap();
    let sizes: Vec<usize> = bare.params().iter().map(|p| p.size).collect();
    assert_eq!(sizes, [8, 8, 4, 4, 4]);
    assert!(bare.params().iter().all(|p| p.name.is_none()));
}

#[test]
fn gpu_a_launch_with_the_wrong_arguments_is_refused_and_a_right_one_runs() {
    let device = device();
    let k = kernels(&device);
    let axpby = k.kernel(KernelId::Axpby);
    let mut rng = Rng::new(14);
    let x = rng.vec(N, -1.0, 1.0);
    let y0 = rng.vec_nonzero(N, -1.0, 1.0);
    let xb = device.upload_new("x", &x).unwrap();
    let mut yb = device.upload_new("y", &y0).unwrap();
    let n = N as u32;

    // One argument too few: `b` is missing.
    let e = run_one_op(&device, |stream| {
        let mut launch = stream.launch(axpby);
        launch.buf(&xb).buf_mut(&mut yb).arg(&n).arg(&A);
        // SAFETY: refused before the driver sees it (one argument is missing).
        unsafe { launch.launch(config()) }
    })
    .unwrap_err();
    let e = inner(e);
    assert_eq!(
        e.to_string(),
        "kernel `axpby` was not launched: it takes 5 arguments, the launch passed 4 (the first \
         missing is argument 4 `b`, float)"
    );
    assert!(matches!(
        e,
        Error::LaunchArguments {
            kernel: "axpby",
            mismatch: ArgMismatch::Count {
                expected: 5,
                found: 4,
                missing: Some(Param {
                    name: Some("b"),
                    ..
                }),
            },
        }
    ));
    assert_eq!(
        bits(&[&device.download(&yb).unwrap()]),
        bits(&[&y0]),
        "a refused launch left y as it was"
    );

    // A u64 where the kernel takes `unsigned n`.
    let n64 = N as u64;
    let e = run_one_op(&device, |stream| {
        let mut launch = stream.launch(axpby);
        launch.buf(&xb).buf_mut(&mut yb).arg(&n64).arg(&A).arg(&B);
        // SAFETY: refused before the driver sees it (argument 2 has the wrong size).
        unsafe { launch.launch(config()) }
    })
    .unwrap_err();
    let e = inner(e);
    assert_eq!(
        e.to_string(),
        "kernel `axpby` was not launched: argument 2 `n` is unsigned (4 bytes), the launch \
         passed 8 bytes"
    );
    assert!(matches!(
        e,
        Error::LaunchArguments {
            kernel: "axpby",
            mismatch: ArgMismatch::Size {
                index: 2,
                found: 8,
                param: Param {
                    name: Some("n"),
                    size: 4,
                    ..
                },
            },
        }
    ));
    assert_eq!(
        bits(&[&device.download(&yb).unwrap()]),
        bits(&[&y0]),
        "a refused launch left y as it was"
    );

    // The right arguments: it runs, and computes what the CPU reference does.
    run_one_op(&device, |stream| {
        let mut launch = stream.launch(axpby);
        launch.buf(&xb).buf_mut(&mut yb).arg(&n).arg(&A).arg(&B);
        // SAFETY: `axpby(const float* x, float* y, unsigned n, float a, float b)`; x and y
        // hold n elements and threads with i >= n return.
        unsafe { launch.launch(config()) }
    })
    .unwrap();
    let mut want = y0.clone();
    axpby_reference(&x, &mut want, A, B);
    assert_eq!(bits(&[&device.download(&yb).unwrap()]), bits(&[&want]));
}
