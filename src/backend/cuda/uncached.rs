//! Filling host memory bound for the device without passing it through the
//! CPU's caches.
//!
//! An upload's bytes are written once by the host and then read once by the
//! copy engine. Ordinary stores first read every cache line they write
//! (and keep it cached for nothing), so a copy moves three bytes through
//! the host's memory for each byte it writes; the host's memory bandwidth,
//! which the transfers share, is what the join is bound by. So the
//! producer (a column copy, the key encoder) writes into a small buffer
//! that stays in the first-level cache, and that buffer is written out with
//! non-temporal stores, which neither read nor cache the target.

use datafusion::error::Result;

/// Bytes the producer writes at a time: small enough to stay in the
/// first-level cache, a multiple of every element size.
const SCRATCH_BYTES: usize = 16 << 10;

/// The producer's buffer, aligned for any element it writes.
#[repr(C, align(64))]
struct Scratch([u8; SCRATCH_BYTES]);

/// Fills `bytes` with what `fill` writes for offsets `first..` (relative
/// to the whole transfer), through a cached scratch buffer and non-temporal
/// stores. `fill` is called with offsets `first + k * SCRATCH_BYTES` and
/// buffers aligned to 64 bytes, so it sees whole elements where `first` is
/// a multiple of their size.
pub(super) fn fill_uncached(
    first: usize,
    bytes: &mut [u8],
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
) -> Result<()> {
    let mut scratch = Scratch([0; SCRATCH_BYTES]);
    let filled = bytes.chunks_mut(SCRATCH_BYTES).enumerate().try_for_each(|(i, target)| {
        let written = &mut scratch.0[..target.len()];
        fill(first + i * SCRATCH_BYTES, written)?;
        copy_uncached(target, written);
        Ok(())
    });
    // Non-temporal stores are weakly ordered: they must be fenced by the
    // thread that made them before another thread, or the copy engine, reads
    // the memory. Fenced on failure too, as the memory is freed or reused.
    store_fence();
    filled
}

/// `target.copy_from_slice(source)`, with non-temporal stores where the
/// target is 16-byte aligned. [`store_fence`] must follow before the target
/// is read by anyone else.
#[cfg(target_arch = "x86_64")]
fn copy_uncached(target: &mut [u8], source: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    const LANE: usize = size_of::<__m128i>();
    let len = target.len().min(source.len());
    let head = target.as_ptr().align_offset(LANE).min(len);
    let body = (len - head) / LANE * LANE;
    target[..head].copy_from_slice(&source[..head]);
    let (to, from) = (target[head..head + body].chunks_exact_mut(LANE), source[head..head + body].chunks_exact(LANE));
    for (to, from) in to.zip(from) {
        // SAFETY: SSE2 is part of x86-64; `from` holds 16 readable bytes
        // (an unaligned load), `to` 16 writable ones on a 16-byte boundary
        // (the alignment `_mm_stream_si128` needs).
        unsafe { _mm_stream_si128(to.as_mut_ptr().cast::<__m128i>(), _mm_loadu_si128(from.as_ptr().cast())) }
    }
    target[head + body..len].copy_from_slice(&source[head + body..len]);
}

#[cfg(not(target_arch = "x86_64"))]
fn copy_uncached(target: &mut [u8], source: &[u8]) {
    let len = target.len().min(source.len());
    target[..len].copy_from_slice(&source[..len]);
}

fn store_fence() {
    // SAFETY: SSE is part of x86-64; a fence has no other effect.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::exec_datafusion_err;

    /// Byte `offset` of a transfer whose every byte differs from its
    /// neighbours'.
    fn byte(offset: usize) -> u8 {
        (offset.wrapping_mul(31) ^ (offset >> 8)) as u8
    }

    fn fill(first: usize, out: &mut [u8]) -> Result<()> {
        out.iter_mut().enumerate().for_each(|(i, b)| *b = byte(first + i));
        Ok(())
    }

    #[test]
    fn fills_every_byte_whatever_the_length_and_alignment() {
        let mut memory = vec![0u8; 3 * SCRATCH_BYTES + 200];
        for start in [0, 1, 7, 16, 33] {
            for len in [0, 1, 15, 16, 17, 100, SCRATCH_BYTES - 1, SCRATCH_BYTES, 2 * SCRATCH_BYTES + 77] {
                memory.fill(0xAA);
                let first = 1000 + start;
                fill_uncached(first, &mut memory[start..start + len], &fill).expect("the fill succeeds");
                let expected: Vec<u8> = (0..len).map(|i| byte(first + i)).collect();
                assert_eq!(&memory[start..start + len], &expected[..], "start {start}, {len} bytes");
                assert!(memory[..start].iter().chain(&memory[start + len..]).all(|&b| b == 0xAA), "bytes outside");
            }
        }
    }

    #[test]
    fn a_failing_fill_stops_at_its_piece() {
        let mut memory = vec![0u8; 3 * SCRATCH_BYTES];
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let failing = |first: usize, out: &mut [u8]| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if first >= SCRATCH_BYTES { Err(exec_datafusion_err!("no rows at {first}")) } else { fill(first, out) }
        };
        let error = fill_uncached(0, &mut memory, &failing).expect_err("the second piece fails");
        assert!(error.to_string().contains(&format!("no rows at {SCRATCH_BYTES}")), "{error}");
        assert_eq!(calls.into_inner(), 2);
        assert!(memory[..SCRATCH_BYTES].iter().enumerate().all(|(i, &b)| b == byte(i)));
    }
}
