//! What a safe wrapper around a typed launcher checks before it launches, and the grids it
//! launches with: lengths that fit the kernels' 32-bit indices, buffers of the lengths
//! the sizes say, and one-thread-per-element or (32, 32)-tile grids. The wrappers of this
//! crate use them, and so can those of a kernel crate built on it.

use stepgraph::{Error, LaunchConfig, Result};

/// Threads per block of the elementwise kernels.
pub const BLOCK_THREADS: u32 = 256;

/// `factors` multiplied, or [`Error::Invalid`] naming `what` if that overflows.
pub fn product(what: &str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| Error::Invalid(format!("{what}: the size {factors:?} overflows")))
}

/// A size that the kernels divide by or loop over: at least 1, and a 32-bit unsigned.
pub fn positive(what: &str, value: usize) -> Result<u32> {
    if value == 0 {
        return Err(Error::Invalid(format!(
            "{what}: expected at least 1, found 0"
        )));
    }
    len_u32(what, value)
}

/// A buffer's length must be what the sizes say, and fit the kernels' 32-bit indices.
pub fn check_len(what: &str, found: usize, expected: usize) -> Result<()> {
    same_len(what, expected, found)?;
    len_u32(what, found).map(|_| ())
}

/// A scratch buffer must hold at least `needed` floats (more is fine: one buffer may serve
/// several sizes).
pub fn check_scratch(what: &str, found: usize, needed: usize) -> Result<()> {
    if found < needed {
        return Err(Error::LengthMismatch {
            what: what.to_string(),
            expected: needed,
            found,
        });
    }
    Ok(())
}

/// Blocks of (32, 32) threads, for the column reductions.
pub fn tile_config(grid_x: u32, grid_y: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_x.max(1), grid_y.max(1), 1),
        block_dim: (32, 32, 1),
        shared_mem_bytes: 0,
    }
}

/// The kernels index with 32-bit unsigned integers.
pub fn len_u32(what: &str, len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| {
        Error::Invalid(format!(
            "{what} has {len} elements; the kernels index with 32-bit unsigned integers, so at \
             most {} fit",
            u32::MAX
        ))
    })
}

pub fn same_len(what: &str, expected: usize, found: usize) -> Result<()> {
    if expected != found {
        return Err(Error::LengthMismatch {
            what: what.to_string(),
            expected,
            found,
        });
    }
    Ok(())
}

/// Whether rows of `row_len` floats in buffers at `addresses` can move as `float4`s: every
/// row then starts 16-byte aligned, which takes rows of a multiple of 4 floats and
/// 16-byte-aligned buffers (whole allocations are; views at an offset may not be).
pub fn float4_rows(row_len: usize, addresses: &[u64]) -> bool {
    row_len.is_multiple_of(4) && addresses.iter().all(|a| a.is_multiple_of(16))
}

/// One thread per element. An empty buffer still gets one (idle) block, so a step's
/// graph has the same nodes whatever the sizes.
pub fn elementwise_config(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK_THREADS).max(1), 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The split of a two-pass column reduction over `[rows, cols]`: blocks of 32 columns,
/// and chunks of at most `target_rows` rows, more where the grid would exceed 1024
/// blocks. Returns `(column blocks, row chunks, rows per chunk)`.
pub fn row_chunk_plan(rows: usize, cols: usize, target_rows: usize) -> (usize, usize, usize) {
    let col_blocks = cols.div_ceil(32).max(1);
    let max_chunks = (1024 / col_blocks).max(1);
    let chunks = rows.div_ceil(target_rows).clamp(1, max_chunks);
    let rows_per_chunk = rows.div_ceil(chunks).max(1);
    (
        col_blocks,
        rows.div_ceil(rows_per_chunk).max(1),
        rows_per_chunk,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_move_as_float4s_only_whole_and_aligned() {
        assert!(float4_rows(256, &[0x1000, 0x2010]));
        assert!(
            !float4_rows(201, &[0x1000, 0x2000]),
            "a row not of whole vectors"
        );
        assert!(
            !float4_rows(256, &[0x1000, 0x2004]),
            "a buffer at a 4-byte offset"
        );
        assert!(float4_rows(0, &[]));
    }
}
