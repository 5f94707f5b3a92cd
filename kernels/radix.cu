// One pass of a stable least-significant-digit radix partition: a histogram
// of digits per tile, a scan of the histograms (digit-major, so each
// (digit, tile) pair gets its output offset), then a scatter that ranks the
// tile's items by digit in input order and writes them through shared
// memory, so that consecutive threads write consecutive positions.
//
// Radix partitioning by partition id (two 8-bit passes for up to 15
// partition bits plus the unmatchable partition) and radix sorting by key
// (one pass per 8 key bits) are both sequences of these passes.

#define TILE_ITEMS 16
#define TILE (BLOCK * TILE_ITEMS)
#define MAX_DIGITS 256

// A column moved along with the keys: `width` bytes per row.
struct ColumnMove {
    const u8* source;
    u8* destination;
    u64 width;
};

template <typename K>
__device__ void radix_histogram(const K* keys, u64 n, u32 partition_bits, u32 shift, u32 digit_mask,
                                u32 tiles, u32* tile_counts) {
    __shared__ u32 counts[MAX_DIGITS];
    for (u32 d = threadIdx.x; d < MAX_DIGITS; d += BLOCK) counts[d] = 0;
    __syncthreads();
    const u64 base = (u64)blockIdx.x * TILE;
    // All loads first, so that they are in flight together.
    u32 digits[TILE_ITEMS];
#pragma unroll
    for (u32 i = 0; i < TILE_ITEMS; i++) {
        const u64 index = base + (u64)i * BLOCK + threadIdx.x;
        digits[i] = index < n ? digit_of<K>(keys[index], partition_bits, shift, digit_mask) : MAX_DIGITS;
    }
#pragma unroll
    for (u32 i = 0; i < TILE_ITEMS; i++) {
        // Lanes with equal digits add once, so skewed data costs no more.
        const u32 peers = __match_any_sync(FULL_MASK, digits[i]);
        if (digits[i] != MAX_DIGITS && (peers & lanes_below()) == 0) atomicAdd(&counts[digits[i]], __popc(peers));
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d <= digit_mask; d += BLOCK) tile_counts[(u64)d * tiles + blockIdx.x] = counts[d];
}

#define MOVE_BATCH 4

// Copies MOVE_BATCH values: every load, then every store.
template <typename T>
__device__ __forceinline__ void move_batch(const T* __restrict__ from, T* __restrict__ to, const u32* source,
                                           const u32* destination, const bool* valid) {
    T values[MOVE_BATCH];
#pragma unroll
    for (u32 b = 0; b < MOVE_BATCH; b++)
        if (valid[b]) values[b] = from[source[b]];
#pragma unroll
    for (u32 b = 0; b < MOVE_BATCH; b++)
        if (valid[b]) to[destination[b]] = values[b];
}

template <typename K>
__device__ void radix_scatter(const K* keys_in, K* keys_out, u64 n, u32 partition_bits, u32 shift,
                              u32 digit_mask, u32 tiles, const u32* tile_offsets,
                              const ColumnMove* columns, u32 column_count, u32* generated_row_ids) {
    __shared__ u32 warp_counts[WARPS][MAX_DIGITS];
    __shared__ u32 digit_start[MAX_DIGITS];
    __shared__ u32 digit_offset[MAX_DIGITS];
    __shared__ u16 source_of_slot[TILE];
    __shared__ u8 digit_of_slot[TILE];
    __shared__ u32 scratch[WARPS];

    const u32 tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
    const u64 base = (u64)blockIdx.x * TILE;
    const u32 tile_rows = (u32)min((u64)TILE, n - base);

    for (u32 x = tid; x < WARPS * MAX_DIGITS; x += BLOCK) (&warp_counts[0][0])[x] = 0;
    __syncthreads();

    // Each warp ranks its own run of WARP_ITEMS consecutive items, 32 at a
    // time, against warp-private digit counters: items are ordered by
    // (warp, round, lane), which is input order, so the ranking is stable.
    const u32 WARP_ITEMS = TILE / WARPS;
    // Digit in the high half, rank in the low half (ranks stay below TILE).
    u32 item_digit_rank[TILE_ITEMS];
#pragma unroll
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        item_digit_rank[round] =
            item < tile_rows ? digit_of<K>(keys_in[base + item], partition_bits, shift, digit_mask) : MAX_DIGITS;
    }
#pragma unroll
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        const bool valid = item < tile_rows;
        const u32 digit = item_digit_rank[round];
        const u32 peers = __match_any_sync(FULL_MASK, digit);
        const u32 below = __popc(peers & lanes_below());
        u32 before = 0;
        if (valid) before = warp_counts[warp][digit];
        __syncwarp();
        if (valid && below == 0) warp_counts[warp][digit] = before + __popc(peers);
        __syncwarp();
        item_digit_rank[round] = (digit << 16) | (before + below);
    }
    __syncthreads();

    // Per digit: where each warp's items start among the tile's items of
    // that digit, and how many there are in all.
    for (u32 d = tid; d < MAX_DIGITS; d += BLOCK) {
        u32 running = 0;
        for (u32 w = 0; w < WARPS; w++) {
            const u32 count = warp_counts[w][d];
            warp_counts[w][d] = running;
            running += count;
        }
        digit_start[d] = running;
    }
    __syncthreads();
    // Where each digit's run starts in the tile and in the output.
    {
        const u32 d = tid;
        u32 total;
        const u32 count = d < MAX_DIGITS ? digit_start[d] : 0u;
        __syncthreads();
        const u32 start = block_exclusive_scan<u32>(count, &total, scratch);
        if (d < MAX_DIGITS) {
            digit_start[d] = start;
            digit_offset[d] = d <= digit_mask ? tile_offsets[(u64)d * tiles + blockIdx.x] : 0u;
        }
    }
    __syncthreads();
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        if (item < tile_rows) {
            const u32 digit = item_digit_rank[round] >> 16;
            const u32 slot = digit_start[digit] + warp_counts[warp][digit] + (item_digit_rank[round] & 0xFFFFu);
            source_of_slot[slot] = (u16)item;
            digit_of_slot[slot] = (u8)digit;
        }
    }
    __syncthreads();

    // Write slot by slot: a run of one digit goes to consecutive positions.
    // Each thread handles MOVE_BATCH slots at a time, all loads before all
    // stores, so that the loads of a batch are in flight together.
    for (u32 first = 0; first < TILE; first += BLOCK * MOVE_BATCH) {
        u32 source[MOVE_BATCH];
        u32 destination[MOVE_BATCH];
        bool valid[MOVE_BATCH];
#pragma unroll
        for (u32 b = 0; b < MOVE_BATCH; b++) {
            const u32 slot = first + b * BLOCK + tid;
            valid[b] = slot < tile_rows;
            const u32 digit = valid[b] ? digit_of_slot[slot] : 0;
            destination[b] = valid[b] ? digit_offset[digit] + (slot - digit_start[digit]) : 0;
            source[b] = valid[b] ? (u32)(base + source_of_slot[slot]) : 0;
        }
        move_batch<K>(keys_in, keys_out, source, destination, valid);
        if (generated_row_ids) {
#pragma unroll
            for (u32 b = 0; b < MOVE_BATCH; b++)
                if (valid[b]) generated_row_ids[destination[b]] = source[b];
        }
        for (u32 c = 0; c < column_count; c++) {
            const ColumnMove column = columns[c];
            switch (column.width) {
                case 1: move_batch<u8>(column.source, column.destination, source, destination, valid); break;
                case 2: move_batch<u16>((const u16*)column.source, (u16*)column.destination, source, destination, valid); break;
                case 4: move_batch<u32>((const u32*)column.source, (u32*)column.destination, source, destination, valid); break;
                case 8: move_batch<u64>((const u64*)column.source, (u64*)column.destination, source, destination, valid); break;
                case 16: move_batch<uint4>((const uint4*)column.source, (uint4*)column.destination, source, destination, valid); break;
            }
        }
    }
}

// Start of every partition of a partitioned relation: offsets[p] is the
// first position whose partition id is at least p (p = 0 ..= partitions + 1).
template <typename K>
__device__ void partition_offsets(const K* keys, u64 n, u32 partition_bits, u32* offsets) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    const u32 count = (1u << partition_bits) + 2;
    if (p >= count) return;
    u64 low = 0, high = n;
    while (low < high) {
        u64 middle = (low + high) / 2;
        if (partition_of(keys[middle], partition_bits) < p) low = middle + 1; else high = middle;
    }
    offsets[p] = (u32)low;
}

// [0, first unmatchable position, n] of a sorted relation.
template <typename K>
__device__ void sorted_offsets(const K* keys, u64 n, u32* offsets) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64 low = 0, high = n;
    while (low < high) {
        u64 middle = (low + high) / 2;
        if (keys[middle] != Key<K>::unmatchable()) low = middle + 1; else high = middle;
    }
    offsets[0] = 0;
    offsets[1] = (u32)low;
    offsets[2] = (u32)n;
}

#define RADIX_KERNELS(K)                                                                                     \
    extern "C" __global__ void __launch_bounds__(BLOCK) radix_histogram_##K(                                 \
        const K* keys, u64 n, u32 partition_bits, u32 shift, u32 digit_mask, u32 tiles, u32* tile_counts) {  \
        radix_histogram<K>(keys, n, partition_bits, shift, digit_mask, tiles, tile_counts);                  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK, 4) radix_scatter_##K(                                   \
        const K* keys_in, K* keys_out, u64 n, u32 partition_bits, u32 shift, u32 digit_mask, u32 tiles,      \
        const u32* tile_offsets, const ColumnMove* columns, u32 column_count, u32* generated_row_ids) {      \
        radix_scatter<K>(keys_in, keys_out, n, partition_bits, shift, digit_mask, tiles, tile_offsets,       \
                         columns, column_count, generated_row_ids);                                          \
    }                                                                                                        \
    extern "C" __global__ void partition_offsets_##K(const K* keys, u64 n, u32 partition_bits, u32* offsets) { \
        partition_offsets<K>(keys, n, partition_bits, offsets);                                              \
    }                                                                                                        \
    extern "C" __global__ void sorted_offsets_##K(const K* keys, u64 n, u32* offsets) {                      \
        sorted_offsets<K>(keys, n, offsets);                                                                 \
    }

RADIX_KERNELS(u32)
RADIX_KERNELS(u64)
