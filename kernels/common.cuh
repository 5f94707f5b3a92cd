// Shared definitions of the join kernels.
//
// The kernel sources are concatenated into one translation unit (this file
// first) and compiled at run time by NVRTC. They use no headers, so the
// driver and the NVRTC library are all a machine needs.
//
// Every definition that the host code also makes (the partition function,
// the reserved key and position values) must stay identical to its Rust
// counterpart in src/backend/mod.rs and src/keys/mod.rs.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define BLOCK 256
#define WARPS (BLOCK / 32)
#define FULL_MASK 0xFFFFFFFFu

// A position denoting "no row" (the padding side of an outer join row).
#define NULL_POSITION 0xFFFFFFFFu
// Radix passes over key bits rather than over partition ids.
#define SORT_BY_KEY 0xFFFFFFFFu

template <typename K> struct Key;
template <> struct Key<u32> { static __device__ __forceinline__ u32 unmatchable() { return 0xFFFFFFFFu; } };
template <> struct Key<u64> { static __device__ __forceinline__ u64 unmatchable() { return 0xFFFFFFFFFFFFFFFFull; } };

// Partition of a key: the top `bits` bits of the key times an odd constant
// (Fibonacci hashing); the unmatchable key goes to the extra partition
// `1 << bits`. Mirrors PartitionSpec::partition_of.
__device__ __forceinline__ u32 partition_of(u32 key, u32 bits) {
    if (key == 0xFFFFFFFFu) return 1u << bits;
    if (bits == 0) return 0;
    return (key * 0x9E3779B1u) >> (32 - bits);
}

__device__ __forceinline__ u32 partition_of(u64 key, u32 bits) {
    if (key == 0xFFFFFFFFFFFFFFFFull) return 1u << bits;
    if (bits == 0) return 0;
    return (u32)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

// Hash table slot of a key, independent of the bits that chose its
// partition. A multiplier other than the partition function's keeps the two
// uncorrelated; for 4-byte keys the 64-bit golden-ratio multiplier also
// spreads dense keys (surrogate keys) evenly, which halves the walks.
__device__ __forceinline__ u32 slot_hash(u64 key) {
    return (u32)((key * 0xD6E8FEB86659FD93ull) >> 32);
}

__device__ __forceinline__ u32 slot_hash(u32 key) {
    return (u32)(((u64)key * 0x9E3779B97F4A7C15ull) >> 32);
}

// The digit of one radix pass: bits [shift, shift + digit bits) of the key
// (sorting) or of its partition id (partitioning).
template <typename K>
__device__ __forceinline__ u32 digit_of(K key, u32 partition_bits, u32 shift, u32 digit_mask) {
    u64 source = partition_bits == SORT_BY_KEY ? (u64)key : (u64)partition_of(key, partition_bits);
    return (u32)(source >> shift) & digit_mask;
}

// A row's position in its relation as given: through `row_ids` where the
// relation was reordered, else its own.
__device__ __forceinline__ u32 output_position(u32 position, const u32* row_ids) {
    return row_ids ? row_ids[position] : position;
}

__device__ __forceinline__ u32 lane_id() { return threadIdx.x & 31; }

__device__ __forceinline__ u32 lanes_below() { return (1u << lane_id()) - 1u; }

// The lanes of the warp whose value has the same low `bits` bits as this
// lane's: one ballot per bit, cheaper than __match_any_sync.
template <u32 BITS>
__device__ __forceinline__ u32 lanes_with_equal_bits(u32 value) {
    u32 peers = FULL_MASK;
#pragma unroll
    for (u32 bit = 0; bit < BITS; bit++) {
        const bool set = (value >> bit) & 1;
        const u32 ones = __ballot_sync(FULL_MASK, set);
        peers &= set ? ones : ~ones;
    }
    return peers;
}

// Exclusive prefix sum over the block (BLOCK threads, all must call it);
// `scratch` holds WARPS values. Returns the thread's prefix and the total.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T value, T* total, T* scratch) {
    const u32 lane = lane_id(), warp = threadIdx.x >> 5;
    T inclusive = value;
    for (u32 offset = 1; offset < 32; offset <<= 1) {
        T other = __shfl_up_sync(FULL_MASK, inclusive, offset);
        if (lane >= offset) inclusive += other;
    }
    if (lane == 31) scratch[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        T warp_total = lane < WARPS ? scratch[lane] : (T)0;
        for (u32 offset = 1; offset < WARPS; offset <<= 1) {
            T other = __shfl_up_sync(FULL_MASK, warp_total, offset);
            if (lane >= offset) warp_total += other;
        }
        if (lane < WARPS) scratch[lane] = warp_total;
    }
    __syncthreads();
    T result = (warp > 0 ? scratch[warp - 1] : (T)0) + inclusive - value;
    *total = scratch[WARPS - 1];
    __syncthreads();
    return result;
}
