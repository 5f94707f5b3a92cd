// Flags and stream compaction. A flag is one byte per position. Compaction
// keeps the order of the input: per-block counts are scanned on the device,
// and each block ranks its kept rows with warp ballots.

#define COMPACT_ITEMS 8
#define COMPACT_TILE (BLOCK * COMPACT_ITEMS)

__device__ __forceinline__ bool kept(const u8* flags, u64 i, u8 want) { return (flags[i] != 0) == (want != 0); }

extern "C" __global__ void compact_count(const u8* flags, u64 n, u8 want, u32* block_counts) {
    __shared__ u32 scratch[WARPS];
    const u64 base = (u64)blockIdx.x * COMPACT_TILE;
    u32 count = 0;
    for (u32 r = 0; r < COMPACT_ITEMS; r++) {
        const u64 i = base + (u64)r * BLOCK + threadIdx.x;
        count += i < n && kept(flags, i, want);
    }
    u32 total;
    block_exclusive_scan<u32>(count, &total, scratch);
    if (threadIdx.x == 0) block_counts[blockIdx.x] = total;
}

// Writes values[i] (or i itself when `values` is null) for every kept i.
extern "C" __global__ void compact_write(const u8* flags, u64 n, u8 want, const u32* values,
                                         const u32* block_offsets, u32* out) {
    __shared__ u32 scratch[WARPS];
    const u64 base = (u64)blockIdx.x * COMPACT_TILE;
    u32 running = block_offsets[blockIdx.x];
    for (u32 r = 0; r < COMPACT_ITEMS; r++) {
        const u64 i = base + (u64)r * BLOCK + threadIdx.x;
        const bool keep = i < n && kept(flags, i, want);
        u32 total;
        const u32 prefix = block_exclusive_scan<u32>(keep ? 1u : 0u, &total, scratch);
        if (keep) out[running + prefix] = values ? values[i] : (u32)i;
        running += total;
    }
}

extern "C" __global__ void set_flags(u8* flags, const u32* positions, u64 n) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u32 p = positions[i];
    if (p != NULL_POSITION) flags[p] = 1;
}

extern "C" __global__ void sequence(u32* out, u64 n) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) out[i] = (u32)i;
}

// Raw 4-byte key values as key codes, in place: a value's distance from lo
// (wrapping) plus shift where that distance is at most span, the
// unmatchable key where it is not (a value outside the build side's span).
extern "C" __global__ void raw_codes_u32(u32* values, u64 n, u32 lo, u32 span, u32 shift) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u32 offset = values[i] - lo;
    values[i] = offset <= span ? offset + shift : 0xFFFFFFFFu;
}

// out[positions[i]] = values[i]. `seen`, unless null (positions known to be
// a permutation), holds one bit per position and, in word (n + 31) / 32, a
// flag set when a position is out of range (null) or met twice: n
// positions without either fill all n slots once.
extern "C" __global__ void scatter_permutation(const u32* positions, const u32* values, u64 n, u32* seen, u32* out) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const u32 p = positions[i];
    if (!seen) {
        out[p] = values[i];
        return;
    }
    u32* clash = seen + (n + 31) / 32;
    if (p == NULL_POSITION || (u64)p >= n) {
        *clash = 1;
        return;
    }
    const u32 bit = 1u << (p & 31);
    if (atomicOr(&seen[p >> 5], bit) & bit) {
        *clash = 1;
        return;
    }
    out[p] = values[i];
}
