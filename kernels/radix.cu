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
    for (u32 i = 0; i < TILE_ITEMS; i++) {
        u64 index = base + (u64)i * BLOCK + threadIdx.x;
        bool valid = index < n;
        u32 digit = valid ? digit_of<K>(keys[index], partition_bits, shift, digit_mask) : MAX_DIGITS;
        // Lanes with equal digits add once, so skewed data costs no more.
        u32 peers = __match_any_sync(FULL_MASK, digit);
        if (valid && (peers & lanes_below()) == 0) atomicAdd(&counts[digit], __popc(peers));
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d <= digit_mask; d += BLOCK) tile_counts[(u64)d * tiles + blockIdx.x] = counts[d];
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
    u32 item_digit[TILE_ITEMS];
    u32 item_rank[TILE_ITEMS];
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        const bool valid = item < tile_rows;
        const u32 digit = valid ? digit_of<K>(keys_in[base + item], partition_bits, shift, digit_mask) : MAX_DIGITS;
        const u32 peers = __match_any_sync(FULL_MASK, digit);
        const u32 below = __popc(peers & lanes_below());
        u32 before = 0;
        if (valid) before = warp_counts[warp][digit];
        __syncwarp();
        if (valid && below == 0) warp_counts[warp][digit] = before + __popc(peers);
        __syncwarp();
        item_digit[round] = digit;
        item_rank[round] = before + below;
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
            const u32 digit = item_digit[round];
            const u32 slot = digit_start[digit] + warp_counts[warp][digit] + item_rank[round];
            source_of_slot[slot] = (u16)item;
            digit_of_slot[slot] = (u8)digit;
        }
    }
    __syncthreads();

    // Write slot by slot: a run of one digit goes to consecutive positions.
    for (u32 slot = tid; slot < tile_rows; slot += BLOCK) {
        const u32 digit = digit_of_slot[slot];
        const u64 destination = (u64)digit_offset[digit] + (slot - digit_start[digit]);
        const u64 source = base + source_of_slot[slot];
        keys_out[destination] = keys_in[source];
        if (generated_row_ids) generated_row_ids[destination] = (u32)source;
        for (u32 c = 0; c < column_count; c++) {
            const ColumnMove column = columns[c];
            switch (column.width) {
                case 1: column.destination[destination] = column.source[source]; break;
                case 2: ((u16*)column.destination)[destination] = ((const u16*)column.source)[source]; break;
                case 4: ((u32*)column.destination)[destination] = ((const u32*)column.source)[source]; break;
                case 8: ((u64*)column.destination)[destination] = ((const u64*)column.source)[source]; break;
                case 16: ((uint4*)column.destination)[destination] = ((const uint4*)column.source)[source]; break;
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
    extern "C" __global__ void __launch_bounds__(BLOCK) radix_scatter_##K(                                   \
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
