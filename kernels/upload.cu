// Uploads packed by frame of reference: each block of values came up as its
// frame (the least value) and each value's distance from it in `bits` bits,
// in lanes (see src/backend/cuda/packing.rs for the layout). These kernels
// write the values back to their place.

// Values packed side by side (LANES in packing.rs).
#define PACK_LANES 8
// A block that went to its place as it was (SENT_IN_PLACE in packing.rs).
#define SENT_IN_PLACE 0xFFFFFFFFu

// BlockFrame in packing.rs.
struct BlockFrame {
    u64 base;
    u32 bits;
    u32 offset;
};

// One thread block per packed block; `n` values in the slice, `block_values`
// in each of its blocks but the last.
template <typename W>
__device__ void unpack_upload(const BlockFrame* frames, const u8* packed, u64 block_values, u64 n, W* out) {
    const u32 word_bits = sizeof(W) * 8;
    const BlockFrame frame = frames[blockIdx.x];
    if (frame.bits == SENT_IN_PLACE) return;
    const u64 first = (u64)blockIdx.x * block_values;
    const u64 count = min(block_values, n - first);
    const W* words = (const W*)(packed + frame.offset);
    const W base = (W)frame.base;
    const u32 bits = frame.bits;
    const W mask = bits == word_bits ? ~(W)0 : (((W)1 << bits) - 1);
    for (u64 i = threadIdx.x; i < count; i += BLOCK) {
        W distance = 0;
        if (bits != 0) {
            const u64 bit = (i / PACK_LANES) * bits;
            const u64 lane = i % PACK_LANES;
            const u64 word = bit / word_bits;
            const u32 shift = bit % word_bits;
            distance = words[word * PACK_LANES + lane] >> shift;
            if (shift + bits > word_bits) distance |= words[(word + 1) * PACK_LANES + lane] << (word_bits - shift);
            distance &= mask;
        }
        out[first + i] = base + distance;
    }
}

extern "C" __global__ void unpack_upload_u32(
    const BlockFrame* frames, const u8* packed, u64 block_values, u64 n, u32* out) {
    unpack_upload<u32>(frames, packed, block_values, n, out);
}

extern "C" __global__ void unpack_upload_u64(
    const BlockFrame* frames, const u8* packed, u64 block_values, u64 n, u64* out) {
    unpack_upload<u64>(frames, packed, block_values, n, out);
}
