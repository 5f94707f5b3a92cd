//! Uploads packed by frame of reference on their way up.
//!
//! Each byte copied from DataFusion's batches to the device crosses the
//! host's memory three times (read from the batch, written to pinned memory,
//! read by the copy engine), and the host's memory is what a join over
//! pageable batches is bound by (docs/benchmarks.md). Many columns hold
//! values of a narrow range: keys counted from some base, quantities, dates,
//! codes. So each block of values that an upload's producer writes into its
//! cached scratch buffer goes out as its frame (the block's least value)
//! and each value's distance from it, in as few bits as the block's range
//! needs, and a kernel (`kernels/upload.cu`) writes the values back on the
//! device. A block whose range needs every bit, or that would not shrink,
//! goes as it is.
//!
//! The least value is taken in unsigned order or with the sign bit flipped
//! (signed order), whichever gives the narrower range: small values of
//! either sign pack, and the device adds the distance to the frame in
//! wrapping arithmetic either way.
//!
//! A packed block of `n` values: value `i` is row `i / LANES` of lane
//! `i % LANES`; each lane's rows are a stream of `bits`-bit fields, lowest
//! first, in words of the values' width, and word `w` of lane `l` lies at
//! word `w * LANES + l`. The host packs a row of every lane at once with
//! vector instructions, and adjacent device threads read adjacent words.
//! With `bits` the full width this is the values as they are, which is how
//! a block that does not shrink goes.

use std::sync::atomic::{AtomicU64, Ordering};

use arrow::buffer::Buffer;
use cudarc::driver::result;
use cudarc::driver::sys::CUdeviceptr;
use datafusion::error::Result;
use rayon::prelude::*;

use super::device::cuda_error;
use super::memory::{DeviceBuffer, Instance, bind};
use super::pinned::PinnedLoan;
use super::uncached::{SCRATCH_BYTES, Scratch, copy_uncached, store_fence};
use crate::backend::TransferMemory;

/// Values packed side by side (`PACK_LANES` in `kernels/upload.cu`).
const LANES: usize = 8;

/// A block's frame on the device (`BlockFrame` in `kernels/upload.cu`):
/// the least value, the bits of each distance from it, and where in the
/// slice's packed bytes the block starts.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BlockFrame {
    pub base: u64,
    pub bits: u32,
    pub offset: u32,
}

/// The `bits` of a block that went to its place on the device as it is,
/// with the rest of its piece, and that the kernel leaves alone.
pub(super) const SENT_IN_PLACE: u32 = u32::MAX;

/// Values of a packed block: the scratch buffer's.
pub(super) const fn block_values(width: usize) -> usize {
    SCRATCH_BYTES / width
}

/// Whether uploads of elements `width` bytes wide are packed.
pub(super) fn packs(width: usize) -> bool {
    matches!(width, 4 | 8)
}

/// The unsigned integers values are packed as.
trait Word: Copy + Default + Ord + Send + Sync {
    const BITS: u32;
    const SIGN: Self;
    const ZERO: Self;
    const MAX: Self;
    fn sub(self, other: Self) -> Self;
    fn shl(self, n: u32) -> Self;
    fn shr(self, n: u32) -> Self;
    fn or(self, other: Self) -> Self;
    fn flip(self) -> Self;
    fn significant_bits(self) -> u32;
    fn widen(self) -> u64;
}

macro_rules! word {
    ($t:ty) => {
        impl Word for $t {
            const BITS: u32 = <$t>::BITS;
            const SIGN: Self = 1 << (<$t>::BITS - 1);
            const ZERO: Self = 0;
            const MAX: Self = <$t>::MAX;
            #[inline(always)]
            fn sub(self, other: Self) -> Self {
                self.wrapping_sub(other)
            }
            #[inline(always)]
            fn shl(self, n: u32) -> Self {
                self << n
            }
            #[inline(always)]
            fn shr(self, n: u32) -> Self {
                self >> n
            }
            #[inline(always)]
            fn or(self, other: Self) -> Self {
                self | other
            }
            #[inline(always)]
            fn flip(self) -> Self {
                self ^ Self::SIGN
            }
            #[inline(always)]
            fn significant_bits(self) -> u32 {
                <$t>::BITS - self.leading_zeros()
            }
            #[inline(always)]
            fn widen(self) -> u64 {
                self as u64
            }
        }
    };
}
word!(u32);
word!(u64);

/// The frame of `values`: the least value and the bits of the widest
/// distance from it, in unsigned order or in signed order (the sign bit
/// flipped), whichever needs fewer bits.
#[inline(always)]
fn frame<W: Word>(values: &[W]) -> (W, u32) {
    if values.is_empty() {
        return (W::ZERO, 0);
    }
    // Lane-wise extremes in both orders at once, written out plainly so
    // that one pass of a few vector instructions a row finds them.
    let (mut low, mut high) = ([W::MAX; LANES], [W::ZERO; LANES]);
    let (mut low_signed, mut high_signed) = ([W::MAX; LANES], [W::ZERO; LANES]);
    let mut rows = values.chunks_exact(LANES);
    for row in &mut rows {
        for l in 0..LANES {
            low[l] = low[l].min(row[l]);
            high[l] = high[l].max(row[l]);
            low_signed[l] = low_signed[l].min(row[l].flip());
            high_signed[l] = high_signed[l].max(row[l].flip());
        }
    }
    for &v in rows.remainder() {
        low[0] = low[0].min(v);
        high[0] = high[0].max(v);
        low_signed[0] = low_signed[0].min(v.flip());
        high_signed[0] = high_signed[0].max(v.flip());
    }
    let range = |low: [W; LANES], high: [W; LANES]| {
        let least = low.into_iter().fold(W::MAX, W::min);
        (least, high.into_iter().fold(W::ZERO, W::max).sub(least).significant_bits())
    };
    let (unsigned, signed) = (range(low, high), range(low_signed, high_signed));
    if signed.1 < unsigned.1 { (signed.0.flip(), signed.1) } else { unsigned }
}

/// Words a block of `values` values packed in `bits` bits takes.
fn packed_words(values: usize, bits: u32, word_bits: u32) -> usize {
    (values.div_ceil(LANES) * bits as usize).div_ceil(word_bits as usize) * LANES
}

/// Packs `values` in place as their distances from `base` in `bits` bits
/// (fewer than the words'), in the layout of the module's description;
/// returns the words written. In place is safe: word `w` of every lane is
/// written once rows `0..=w` have been read, as no field is wider than a
/// word. Rows are arrays of the lanes, so that each step is one vector
/// instruction.
#[inline(always)]
fn pack_in_place<W: Word>(values: &mut [W], base: W, bits: u32) -> usize {
    let n = values.len();
    let mut acc = [W::ZERO; LANES];
    let (mut filled, mut words) = (0, 0);
    for r in 0..n.div_ceil(LANES) {
        // A partial last row's missing fields are zero distances.
        let mut row = [W::ZERO; LANES];
        let at = r * LANES;
        match <&[W; LANES]>::try_from(values.get(at..at + LANES).unwrap_or(&[])) {
            Ok(full) => (0..LANES).for_each(|l| row[l] = full[l].sub(base)),
            Err(_) => values[at..].iter().enumerate().for_each(|(l, v)| row[l] = v.sub(base)),
        }
        for l in 0..LANES {
            acc[l] = acc[l].or(row[l].shl(filled));
        }
        filled += bits;
        if filled >= W::BITS {
            values[words * LANES..(words + 1) * LANES].copy_from_slice(&acc);
            words += 1;
            filled -= W::BITS;
            // The top `filled` bits of each field, which did not fit; none
            // where all fit, as no distance reaches bit `bits`.
            for l in 0..LANES {
                acc[l] = row[l].shr(bits - filled);
            }
        }
    }
    if filled > 0 {
        // Within the block: `pack` packs only where the words are fewer.
        values[words * LANES..(words + 1) * LANES].copy_from_slice(&acc);
        words += 1;
    }
    words * LANES
}

/// Packs the block `values` in place where that shrinks it; returns its
/// frame (offset left at 0) and the words it now takes.
#[inline(always)]
fn pack<W: Word>(values: &mut [W]) -> (BlockFrame, usize) {
    let as_it_is = (BlockFrame { base: 0, bits: W::BITS, offset: 0 }, values.len());
    let (base, bits) = frame(values);
    let words = packed_words(values.len(), bits, W::BITS);
    // A partial last row may need words past the block's values.
    if bits >= W::BITS || words >= values.len() {
        return as_it_is;
    }
    let words = pack_in_place(values, base, bits);
    (BlockFrame { base: base.widen(), bits, offset: 0 }, words)
}

/// `bytes` as words; the scratch buffer is aligned for any word.
#[inline(always)]
fn words_of<W: Word>(bytes: &mut [u8]) -> &mut [W] {
    debug_assert!(bytes.as_ptr().align_offset(align_of::<W>()) == 0 && bytes.len().is_multiple_of(size_of::<W>()));
    // SAFETY: the bytes are aligned for W and hold whole words (checked
    // above in tests; the scratch is aligned to 64 bytes and blocks hold
    // whole elements), and every bit pattern is a valid unsigned integer.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<W>(), bytes.len() / size_of::<W>()) }
}

#[inline(always)]
fn pack_bytes<W: Word>(bytes: &mut [u8]) -> (BlockFrame, usize) {
    let (frame, words) = pack(words_of::<W>(bytes));
    (frame, words * size_of::<W>())
}

/// Vector instructions wider than the baseline's, where the host has them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pack_bytes_avx2<W: Word>(bytes: &mut [u8]) -> (BlockFrame, usize) {
    pack_bytes::<W>(bytes)
}

fn pack_block(bytes: &mut [u8], width: usize) -> (BlockFrame, usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the host has AVX2 (checked just above).
        return unsafe { if width == 4 { pack_bytes_avx2::<u32>(bytes) } else { pack_bytes_avx2::<u64>(bytes) } };
    }
    if width == 4 { pack_bytes::<u32>(bytes) } else { pack_bytes::<u64>(bytes) }
}

/// Fills the piece `bytes` (offsets `first..` of the whole upload, in
/// elements `width` bytes wide, 4 or 8) with what `fill` writes, each
/// block of the scratch buffer's size packed where that shrinks it and
/// written out past the caches from the piece's start, one after another.
/// `frames[j]` gets block `j`'s frame, its offset counted from `offset`,
/// the piece's in its slice. Returns the bytes written.
pub(super) fn fill_packed(
    first: usize,
    bytes: &mut [u8],
    width: usize,
    fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    frames: &mut [BlockFrame],
    offset: usize,
) -> Result<usize> {
    let mut scratch = Scratch([0; SCRATCH_BYTES]);
    let mut used = 0;
    let mut blocks = (0..bytes.len()).step_by(SCRATCH_BYTES).zip(frames.iter_mut());
    let filled = blocks.try_for_each(|(start, frame)| {
        let raw = &mut scratch.0[..(bytes.len() - start).min(SCRATCH_BYTES)];
        fill(first + start, raw)?;
        let (packed, len) = pack_block(raw, width);
        *frame = BlockFrame { offset: (offset + used) as u32, ..packed };
        // A block shrinks or stays as it is, so it ends at or before its
        // own place in the piece: `used + len <= start + raw.len()`.
        copy_uncached(&mut bytes[used..used + len], &raw[..len]);
        used += len;
        Ok(())
    });
    // Non-temporal stores are fenced by the thread that made them before
    // anyone reads the memory; on failure too, as it is freed or reused.
    store_fence();
    filled.map(|()| used)
}

/// An upload through a pinned block, packed a slice at a time. Each
/// piece's packed bytes go to device memory of their own, at the piece's
/// place in the slice, then the slice's frames, then the kernel writes the
/// slice's values to their place. A piece that did not shrink at all goes
/// straight to its place, as an upload that is not packed does.
pub(super) struct PackedUpload {
    width: usize,
    /// A slice's packed bytes, then its frames; reused slice after slice,
    /// as the stream orders each slice's transfers after the kernel of the
    /// one before.
    packed: DeviceBuffer<u8>,
    frames_at: usize,
    /// Every block's frame, read by the transfers until the stream is
    /// waited for.
    frames: PinnedLoan,
    frame_count: usize,
}

impl PackedUpload {
    /// For an upload of `len` bytes of elements `width` bytes wide, sent
    /// `slice` bytes at a time; `None` where such elements are not packed
    /// or no pinned memory is to spare for the frames.
    pub(super) fn new(instance: &Instance, len: usize, width: usize, slice: usize, what: &str) -> Result<Option<Self>> {
        if !packs(width) {
            return Ok(None);
        }
        let frame_count = len.div_ceil(SCRATCH_BYTES);
        let Some(frames) = instance.device.pinned.lend(frame_count * size_of::<BlockFrame>()) else {
            return Ok(None);
        };
        // The frames after the packed bytes, aligned for their words.
        let frames_at = len.min(slice).next_multiple_of(size_of::<BlockFrame>());
        let slice_frames = len.min(slice).div_ceil(SCRATCH_BYTES);
        let packed = DeviceBuffer::alloc(instance, frames_at + slice_frames * size_of::<BlockFrame>(), what)?;
        Ok(Some(Self { width, packed, frames_at, frames, frame_count }))
    }

    /// Fills the slice `bytes`, at `first` in the upload, with what `fill`
    /// writes, and sends it to `destination`, on every core: pieces of
    /// `piece` bytes are filled and sent side by side.
    pub(super) fn send(
        &mut self,
        instance: &Instance,
        (first, bytes, piece): (usize, &mut [u8], usize),
        destination: CUdeviceptr,
        fill: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
        what: &str,
    ) -> Result<()> {
        let all_frames = self.frames.bytes_mut(self.frame_count * size_of::<BlockFrame>())?;
        // SAFETY: the loan is page aligned and holds `frame_count` frames,
        // whose fields take any bit pattern.
        let all_frames =
            unsafe { std::slice::from_raw_parts_mut(all_frames.as_mut_ptr().cast::<BlockFrame>(), self.frame_count) };
        let frames = &mut all_frames[first / SCRATCH_BYTES..][..bytes.len().div_ceil(SCRATCH_BYTES)];
        let (width, packed) = (self.width, self.packed.pointer());
        let sent = AtomicU64::new(0);
        bytes.par_chunks_mut(piece).zip(frames.par_chunks_mut(piece / SCRATCH_BYTES)).enumerate().try_for_each(
            |(p, (bytes, frames))| {
                let at = p * piece;
                let used = fill_packed(first + at, bytes, width, fill, frames, at)?;
                let (to, bytes) = if used == bytes.len() {
                    frames.iter_mut().for_each(|frame| frame.bits = SENT_IN_PLACE);
                    (destination + at as u64, &bytes[..])
                } else {
                    (packed + at as u64, &bytes[..used])
                };
                sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                bind(instance, what)?;
                // SAFETY: both device ranges hold the piece's bytes; the
                // pinned bytes stay alive and unwritten (the loan is held by
                // the caller) until the stream is waited for.
                unsafe { result::memcpy_htod_async(to, bytes, instance.stream.cu_stream()) }
                    .map_err(|e| cuda_error(what, e))
            },
        )?;
        let frame_bytes = size_of_val(frames);
        instance.counters.record_upload(sent.into_inner() + frame_bytes as u64);
        // SAFETY: the device buffer holds a slice's frames past `frames_at`;
        // the frames stay alive and unwritten until the stream is waited for.
        unsafe {
            let frames = std::slice::from_raw_parts(frames.as_ptr().cast::<u8>(), frame_bytes);
            result::memcpy_htod_async(packed + self.frames_at as u64, frames, instance.stream.cu_stream())
        }
        .map_err(|e| cuda_error(what, e))?;
        let kernel = if width == 4 { "unpack_upload_u32" } else { "unpack_upload_u64" };
        let values = (bytes.len() / width) as u64;
        instance.launch_blocks(
            kernel,
            frames.len() as u64,
            0,
            values,
            &[
                (packed + self.frames_at as u64).into(),
                packed.into(),
                (block_values(width) as u64).into(),
                values.into(),
                destination.into(),
            ],
        )
    }

    /// The frames, to be held until the stream is waited for, as the
    /// upload's pinned block is.
    pub(super) fn into_frames(self) -> Result<Buffer> {
        Box::new(self.frames).into_buffer(self.frame_count * size_of::<BlockFrame>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of a block as `kernels/upload.cu` writes them back.
    fn unpack<W: Word>(words: &[W], frame: BlockFrame, count: usize) -> Vec<u64> {
        (0..count)
            .map(|i| {
                let bits = frame.bits;
                let distance = if bits == 0 {
                    0
                } else {
                    let (bit, lane) = ((i / LANES) as u64 * u64::from(bits), i % LANES);
                    let (word, shift) = ((bit / u64::from(W::BITS)) as usize, (bit % u64::from(W::BITS)) as u32);
                    let mut d = words[word * LANES + lane].widen() >> shift;
                    if shift + bits > W::BITS {
                        d |= words[(word + 1) * LANES + lane].widen() << (W::BITS - shift);
                    }
                    if bits == 64 { d } else { d & ((1u64 << bits) - 1) }
                };
                let value = frame.base.wrapping_add(distance);
                if W::BITS == 32 { value & 0xFFFF_FFFF } else { value }
            })
            .collect()
    }

    /// A generator of the values of blocks: constant, counted up, small of
    /// either sign, narrow around a large base, and spread over every bit.
    fn values(kind: usize, n: usize, width: usize, seed: u64) -> Vec<u64> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mask = if width == 4 { 0xFFFF_FFFF } else { u64::MAX };
        (0..n)
            .map(|i| {
                let v = match kind {
                    0 => 0xDEAD_BEEF,
                    1 => 1000 + i as u64,
                    2 => (next() % 1999).wrapping_sub(999),
                    3 => (1 << (width * 8 - 2)) + next() % (1 << 27),
                    4 => next() % 3,
                    _ => next(),
                };
                let v = v & mask;
                // Small values of either sign, as a signed column holds them.
                if kind == 2 && width == 4 { v & 0xFFFF_FFFF } else { v }
            })
            .collect()
    }

    fn round_trip<W: Word>(values: &[u64], from: fn(u64) -> W) -> (BlockFrame, usize) {
        let mut block: Vec<W> = values.iter().map(|&v| from(v)).collect();
        let (frame, words) = pack(&mut block);
        assert!(words <= values.len(), "{words} words for {} values", values.len());
        if frame.bits < W::BITS {
            assert!(words < values.len(), "a packed block shrinks");
        }
        assert_eq!(unpack(&block[..words], frame, values.len()), values, "bits {}", frame.bits);
        (frame, words)
    }

    #[test]
    fn blocks_come_back_as_they_were() {
        for width in [4, 8] {
            for kind in 0..6 {
                for n in [0, 1, 7, 8, 9, 100, 4095, block_values(width)] {
                    let values = values(kind, n, width, (kind * 31 + n) as u64);
                    let (frame, _) = if width == 4 {
                        round_trip::<u32>(&values, |v| v as u32)
                    } else {
                        round_trip::<u64>(&values, |v| v)
                    };
                    if n == block_values(width) {
                        let expected_bits = match kind {
                            0 => 0,
                            1 => usize::BITS - (n - 1).leading_zeros(),
                            2 => 11,
                            3 => 27,
                            4 => 2,
                            _ => width as u32 * 8,
                        };
                        assert_eq!(frame.bits, expected_bits, "kind {kind}, width {width}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_field_width_packs() {
        for bits in 1..=64u32 {
            let n = block_values(8) - 3;
            let top = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let values: Vec<u64> =
                (0..n as u64).map(|i| 5u64.wrapping_add(i.wrapping_mul(0x9E37_79B9) & top)).collect();
            let (frame, _) = round_trip::<u64>(&[values.clone(), vec![5, 5u64.wrapping_add(top)]].concat(), |v| v);
            assert!(frame.bits <= bits.max(1) || bits == 64, "{bits} bits packed in {}", frame.bits);
            if bits <= 32 {
                let values: Vec<u64> = values.iter().map(|v| v & 0xFFFF_FFFF).collect();
                round_trip::<u32>(&values, |v| v as u32);
            }
        }
    }

    #[test]
    fn a_piece_fills_frames_and_keeps_its_blocks_in_order() {
        for width in [4, 8] {
            for kind in [1, 2, 5] {
                let n = 3 * block_values(width) + 5;
                let values = values(kind, n, width, 7);
                let fill = |first: usize, out: &mut [u8]| {
                    for (k, chunk) in out.chunks_exact_mut(width).enumerate() {
                        let v = values[first / width + k];
                        chunk.copy_from_slice(&v.to_le_bytes()[..width]);
                    }
                    Ok(())
                };
                let mut piece = vec![0u8; n * width];
                let mut frames = vec![BlockFrame::default(); n.div_ceil(block_values(width))];
                let used = fill_packed(0, &mut piece, width, &fill, &mut frames, 4096).expect("filled");
                assert_eq!(used == piece.len(), kind == 5, "only spread values go as they are");
                let mut back = vec![];
                for (j, frame) in frames.iter().enumerate() {
                    let count = (n - j * block_values(width)).min(block_values(width));
                    let at = frame.offset as usize - 4096;
                    back.extend(if width == 4 {
                        let words: Vec<u32> =
                            piece[at..].chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
                        unpack(&words, *frame, count)
                    } else {
                        let words: Vec<u64> =
                            piece[at..].chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
                        unpack(&words, *frame, count)
                    });
                }
                assert_eq!(back, values, "width {width}, kind {kind}");
            }
        }
    }
}
