// Gathers: out[i] = values[positions[i]], a null position giving a zero
// value (and a null in the validity bytes). Validity and boolean values are
// one byte per row on the device; pack_bits and unpack_bits convert them
// from and to Arrow's bitmaps.

// Rows per thread of the value gathers: their loads are in flight together.
#define GATHER_ITEMS 4

template <typename T>
__device__ void gather(const T* values, const u32* positions, u64 n, T* out) {
    const u64 base = (u64)blockIdx.x * BLOCK * GATHER_ITEMS + threadIdx.x;
    u32 from[GATHER_ITEMS];
#pragma unroll
    for (u32 k = 0; k < GATHER_ITEMS; k++) {
        const u64 i = base + (u64)k * BLOCK;
        from[k] = i < n ? positions[i] : NULL_POSITION;
    }
    T gathered[GATHER_ITEMS];
#pragma unroll
    for (u32 k = 0; k < GATHER_ITEMS; k++) {
        memset(&gathered[k], 0, sizeof(T));
        if (from[k] != NULL_POSITION) gathered[k] = values[from[k]];
    }
#pragma unroll
    for (u32 k = 0; k < GATHER_ITEMS; k++) {
        const u64 i = base + (u64)k * BLOCK;
        if (i < n) out[i] = gathered[k];
    }
}

extern "C" __global__ void gather_1(const u8* v, const u32* p, u64 n, u8* out) { gather<u8>(v, p, n, out); }
extern "C" __global__ void gather_2(const u16* v, const u32* p, u64 n, u16* out) { gather<u16>(v, p, n, out); }
extern "C" __global__ void gather_4(const u32* v, const u32* p, u64 n, u32* out) { gather<u32>(v, p, n, out); }
extern "C" __global__ void gather_8(const u64* v, const u32* p, u64 n, u64* out) { gather<u64>(v, p, n, out); }
extern "C" __global__ void gather_16(const uint4* v, const u32* p, u64 n, uint4* out) { gather<uint4>(v, p, n, out); }

// Validity of gathered rows; `valid` is null for a column without nulls.
extern "C" __global__ void gather_validity(const u8* valid, const u32* positions, u64 n, u8* out) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u32 p = positions[i];
    out[i] = p != NULL_POSITION && (valid == 0 || valid[p] != 0);
}

// Like gather_4, but a null position stays a null position.
extern "C" __global__ void gather_positions(const u32* values, const u32* positions, u64 n, u32* out) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u32 p = positions[i];
    out[i] = p == NULL_POSITION ? NULL_POSITION : values[p];
}

// Bytes (0 or 1) to an LSB-first bitmap of ceil(n / 32) words.
extern "C" __global__ void pack_bits(const u8* bytes, u64 n, u32* words) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    const u32 bits = __ballot_sync(FULL_MASK, i < n && bytes[i] != 0);
    if (lane_id() == 0 && i < n) words[i / 32] = bits;
}

// Bits [offset, offset + n) of an LSB-first bitmap to bytes.
extern "C" __global__ void unpack_bits(const u8* bitmap, u64 offset, u64 n, u8* bytes) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u64 bit = offset + i;
    bytes[i] = (bitmap[bit / 8] >> (bit % 8)) & 1;
}
