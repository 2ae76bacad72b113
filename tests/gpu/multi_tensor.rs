//! GPU tests of the multi-tensor axpby (`PairTable`, `Kernels::axpby_table`): one launch
//! over every pair gives the bits of one `Kernels::axpby` per pair and of the CPU
//! reference, over pairs whose lengths put chunk boundaries inside tensors, at them, and
//! between tensors of one element; and the table refuses pairs that do not match. They
//! need a CUDA GPU of compute capability 9.0.

use super::{Rng, bits, run_one_op};
use stepgraph::{DeviceBuffer, Error, Result};
use stepgraph_kernels::reference::axpby_reference;
use stepgraph_kernels::{PAIR_CHUNK, PairTable};

/// Chunk boundaries inside a tensor and at its end, one-element tensors on either side of
/// one, and a long tensor of many chunks.
const LENGTHS: [usize; 8] = [
    1,
    PAIR_CHUNK - 1,
    1,
    PAIR_CHUNK,
    3 * PAIR_CHUNK + 7,
    1,
    65_541,
    3,
];

#[test]
fn gpu_axpby_table_equals_axpby_per_tensor_bit_for_bit() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let mut rng = Rng::new(81);
    let xs_host: Vec<Vec<f32>> = LENGTHS
        .iter()
        .map(|&n| rng.vec_nonzero(n, -2.0, 2.0))
        .collect();
    let ys_host: Vec<Vec<f32>> = LENGTHS
        .iter()
        .map(|&n| rng.vec_nonzero(n, -2.0, 2.0))
        .collect();
    let up = |what: &str, v: &[Vec<f32>]| -> Result<Vec<DeviceBuffer<f32>>> {
        v.iter().map(|t| device.upload_new(what, t)).collect()
    };
    let xs = up("x", &xs_host)?;
    let mut ys_table = up("y (table)", &ys_host)?;
    let mut ys_each = up("y (each)", &ys_host)?;
    let pairs: Vec<_> = xs.iter().zip(&ys_table).collect();
    let table = PairTable::new(&device, &pairs)?;
    assert_eq!(
        (table.len(), table.total()),
        (LENGTHS.len(), LENGTHS.iter().sum())
    );
    // A Polyak update, then coefficients of either sign, applied twice: the second
    // launch reads what the first wrote.
    for (a, b) in [(0.005f32, 0.995f32), (-1.5, 0.25)] {
        let x_refs: Vec<&DeviceBuffer<f32>> = xs.iter().collect();
        run_one_op(&device, |s| {
            let mut y_refs: Vec<&mut DeviceBuffer<f32>> = ys_table.iter_mut().collect();
            k.axpby_table(s, &table, &x_refs, &mut y_refs, a, b)?;
            for (x, y) in xs.iter().zip(ys_each.iter_mut()) {
                k.axpby(s, x, y, a, b)?;
            }
            Ok(())
        })?;
    }
    let mut want = ys_host.clone();
    for (a, b) in [(0.005f32, 0.995f32), (-1.5, 0.25)] {
        for (x, y) in xs_host.iter().zip(want.iter_mut()) {
            axpby_reference(x, y, a, b);
        }
    }
    for i in 0..LENGTHS.len() {
        let table_y = device.download(&ys_table[i])?;
        let each_y = device.download(&ys_each[i])?;
        assert_eq!(
            bits(&[&table_y]),
            bits(&[&each_y]),
            "pair {i}: table against axpby"
        );
        assert_eq!(
            bits(&[&table_y]),
            bits(&[&want[i]]),
            "pair {i}: table against the CPU"
        );
    }
    Ok(())
}

#[test]
fn gpu_pair_table_refuses_mismatched_pairs_and_foreign_buffers() -> Result<()> {
    let device = super::device();
    let k = super::kernels(&device);
    let up = |n: usize| device.upload_new("t", &vec![0.5f32; n]);
    let (x0, y0, x1, y1_short) = (up(4)?, up(4)?, up(6)?, up(5)?);
    let err = PairTable::new(&device, &[(&x0, &y0), (&x1, &y1_short)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LengthMismatch {
                expected: 6,
                found: 5,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("pair 1"), "{err}");
    let (empty_x, empty_y) = (up(0)?, up(0)?);
    let err = PairTable::new(&device, &[(&empty_x, &empty_y)]).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected at least one element, found none"),
        "{err}"
    );

    let table = PairTable::new(&device, &[(&x0, &y0)])?;
    let mut other = up(4)?;
    let err = run_one_op(&device, |s| {
        k.axpby_table(s, &table, &[&x0], &mut [&mut other], 1.0, 1.0)
    })
    .unwrap_err();
    assert!(
        err.chain()
            .contains("expected pair 0's y to be the table's buffer"),
        "{}",
        err.chain()
    );
    let mut y0 = y0;
    let err = run_one_op(&device, |s| {
        k.axpby_table(s, &table, &[], &mut [&mut y0], 1.0, 1.0)
    })
    .unwrap_err();
    assert!(
        err.chain()
            .contains("xs (one per table pair): expected 1 elements, found 0"),
        "{}",
        err.chain()
    );
    Ok(())
}
