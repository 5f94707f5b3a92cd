// Stable least-significant-digit radix passes with decoupled look-back
// (Merrill and Garland's single-pass scan, as in "onesweep" radix sorting).
// One kernel counts the digits of up to four passes over the whole relation,
// so every pass knows where each digit starts in the output. Each scatter
// tile then ranks its items by digit in input order, publishes its per-digit
// counts, and learns how many items of each digit the earlier tiles hold by
// looking back over their published counts: no histogram and no scan of
// per-tile counts in any pass. Items are written through shared memory, so
// that consecutive threads write consecutive positions.
//
// Radix partitioning by partition id (two 8-bit passes for up to 15
// partition bits plus the unmatchable partition) and radix sorting by key
// (one pass per 8 key bits) are both sequences of these passes.

#define TILE_ITEMS 16
#define TILE (BLOCK * TILE_ITEMS)
#define MAX_DIGITS 256
// Passes whose digits one read of the keys counts: every pass of a sort of
// 4-byte keys.
#define COUNTED_PASSES 4

// A tile's published count of one digit: the flag in the high half, the
// count in the low half. AGGREGATE counts the tile's own items; PREFIX
// counts the items of this and every earlier tile. Zero: not published yet.
#define STATUS_AGGREGATE 1ull
#define STATUS_PREFIX 2ull

// A column moved along with the keys: `width` bytes per row.
struct ColumnMove {
    const u8* source;
    u8* destination;
    u64 width;
};

// Adds the digit counts of the first `passes` of up to COUNTED_PASSES
// passes over the tiles blockIdx.x, blockIdx.x + gridDim.x, ... to
// counts[pass * MAX_DIGITS + digit]. Pass p takes its digits at shift
// plans[p] >> 16 with mask plans[p] & 0xFFFF.
template <typename K>
__device__ void radix_digit_counts(const K* keys, u64 n, u32 partition_bits, u32 plan0, u32 plan1, u32 plan2,
                                   u32 plan3, u32 passes, u32* counts) {
    // Warp-private counters keep same-digit atomics of different warps apart.
    __shared__ u32 warp_counts[COUNTED_PASSES][WARPS][MAX_DIGITS];
    const u32 plans[COUNTED_PASSES] = {plan0, plan1, plan2, plan3};
    for (u32 x = threadIdx.x; x < COUNTED_PASSES * WARPS * MAX_DIGITS; x += BLOCK) (&warp_counts[0][0][0])[x] = 0;
    __syncthreads();
    const u32 warp = threadIdx.x >> 5;
    const u64 tiles = (n + TILE - 1) / TILE;
    for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const u64 base = tile * TILE;
        // All loads first, so that they are in flight together.
        K tile_keys[TILE_ITEMS];
#pragma unroll
        for (u32 i = 0; i < TILE_ITEMS; i++) {
            const u64 index = base + (u64)i * BLOCK + threadIdx.x;
            if (index < n) tile_keys[i] = keys[index];
        }
#pragma unroll
        for (u32 i = 0; i < TILE_ITEMS; i++) {
            const u64 index = base + (u64)i * BLOCK + threadIdx.x;
            if (index >= n) continue;
#pragma unroll
            for (u32 p = 0; p < COUNTED_PASSES; p++) {
                if (p < passes) {
                    const u32 digit = digit_of<K>(tile_keys[i], partition_bits, plans[p] >> 16, plans[p] & 0xFFFFu);
                    atomicAdd(&warp_counts[p][warp][digit], 1u);
                }
            }
        }
    }
    __syncthreads();
    for (u32 x = threadIdx.x; x < passes * MAX_DIGITS; x += BLOCK) {
        const u32 pass = x / MAX_DIGITS, digit = x % MAX_DIGITS;
        u32 total = 0;
#pragma unroll
        for (u32 w = 0; w < WARPS; w++) total += warp_counts[pass][w][digit];
        if (total > 0) atomicAdd(&counts[x], total);
    }
}

__device__ __forceinline__ void publish_status(u64* status, u64 flag, u32 count) {
    *(volatile u64*)status = (flag << 32) | count;
}

// Items of `digit` in the tiles before `tile`: walks back over the earlier
// tiles' published counts until one has published its inclusive prefix.
// Tiles are numbered in the order blocks start, so every earlier tile
// belongs to a block that is already running: the walk only ever waits on
// work in progress.
__device__ u32 look_back(const u64* statuses, u32 tile, u32 digit) {
    u32 before = 0;
    for (u32 earlier = tile - 1;; earlier--) {
        u64 status;
        do {
            status = *(volatile const u64*)(statuses + (u64)earlier * MAX_DIGITS + digit);
        } while ((status >> 32) == 0);
        before += (u32)status;
        if ((status >> 32) == STATUS_PREFIX) return before;
    }
}

// What the moves of one tile share, all in shared memory. Items are
// exchanged through `words` as values of up to 8 bytes: every thread loads
// TILE_ITEMS values (coalesced, in the warp-striped item order of the keys),
// stores each at its item's slot, and then writes the slots BLOCK apart, so
// consecutive threads write consecutive positions of each digit's run.
struct TileExchange {
    u64* words;               // TILE values
    const u16* slot_of_item;  // TILE slots
    const u8* digit_of_slot;  // TILE digits
    const u32* digit_base;    // output position of a digit's slot 0
};

__device__ __forceinline__ u32 tile_item(u32 round) { return (threadIdx.x >> 5) * (TILE / WARPS) + round * 32 + lane_id(); }

// Loads every item of the tile with `load(item)`, coalesced, BATCH rounds
// at a time (enough loads in flight to cover memory latency, few enough
// registers for four blocks per multiprocessor), and stores each value at
// its item's slot of the exchange.
template <typename T, u32 BATCH, typename Load>
__device__ __forceinline__ void stage_items(u32 tile_rows, const TileExchange& tile, Load load) {
    T* words = (T*)tile.words;
#pragma unroll
    for (u32 first = 0; first < TILE_ITEMS; first += BATCH) {
        T values[BATCH];
#pragma unroll
        for (u32 r = 0; r < BATCH; r++) {
            const u32 item = tile_item(first + r);
            if (item < tile_rows) values[r] = load(item);
        }
#pragma unroll
        for (u32 r = 0; r < BATCH; r++) {
            const u32 item = tile_item(first + r);
            if (item < tile_rows) words[tile.slot_of_item[item]] = values[r];
        }
    }
}

// After the staging, calls `write(slot, position)` for every slot of the
// tile, BLOCK apart, so consecutive threads write consecutive positions.
template <typename Write>
__device__ __forceinline__ void write_slots(u32 tile_rows, const TileExchange& tile, Write write) {
    __syncthreads();
#pragma unroll 4
    for (u32 i = 0; i < TILE_ITEMS; i++) {
        const u32 slot = i * BLOCK + threadIdx.x;
        if (slot < tile_rows) write(slot, tile.digit_base[tile.digit_of_slot[slot]] + slot);
    }
    __syncthreads();
}

// Moves one column of `T` (8 bytes at most) of the tile. `stride`/`part`
// select one 8-byte half of a 16-byte value (stride 2), otherwise 1 and 0.
template <typename T>
__device__ __forceinline__ void move_column(const T* __restrict__ from, T* __restrict__ to, u64 base, u32 tile_rows,
                                            TileExchange tile, u32 stride, u32 part) {
    stage_items<T, TILE_ITEMS / 2>(tile_rows, tile, [&](u32 item) { return from[(base + item) * stride + part]; });
    const T* words = (const T*)tile.words;
    write_slots(tile_rows, tile, [&](u32 slot, u32 position) { to[(u64)position * stride + part] = words[slot]; });
}

// A 4-byte key and a 4-byte column travel as one 8-byte word: one exchange
// instead of two.
__device__ __forceinline__ void move_key_and_column(const u32* __restrict__ keys_from, u32* __restrict__ keys_to,
                                                    const u32* __restrict__ from, u32* __restrict__ to, u64 base,
                                                    u32 tile_rows, TileExchange tile) {
    stage_items<u64, TILE_ITEMS / 4>(tile_rows, tile, [&](u32 item) {
        return (u64)keys_from[base + item] | ((u64)from[base + item] << 32);
    });
    write_slots(tile_rows, tile, [&](u32 slot, u32 position) {
        const u64 pair = tile.words[slot];
        keys_to[position] = (u32)pair;
        to[position] = (u32)(pair >> 32);
    });
}

// The tile's row ids (its items' positions in the input) to their slots.
__device__ __forceinline__ void move_row_ids(u32* __restrict__ to, u64 base, u32 tile_rows, TileExchange tile) {
    stage_items<u32, TILE_ITEMS / 2>(tile_rows, tile, [&](u32 item) { return (u32)(base + item); });
    const u32* words = (const u32*)tile.words;
    write_slots(tile_rows, tile, [&](u32 slot, u32 position) { to[position] = words[slot]; });
}

template <typename K>
__device__ void radix_scatter(const K* keys_in, K* keys_out, u64 n, u32 partition_bits, u32 shift,
                              u32 digit_mask, const u32* digit_counts, u32* next_tile, u64* statuses,
                              const ColumnMove* columns, u32 column_count, u32* generated_row_ids) {
    static_assert(BLOCK == MAX_DIGITS, "one thread per digit publishes and looks back");
    // The warp counters are only needed until every item has its slot, the
    // exchange only after that: they share memory.
    __shared__ u64 words[TILE];
    __shared__ u16 slot_of_item[TILE];
    __shared__ u8 digit_of_slot[TILE];
    __shared__ u32 digit_start[MAX_DIGITS];
    __shared__ u32 digit_base[MAX_DIGITS];
    __shared__ u32 scratch[WARPS];
    __shared__ u32 taken_tile;
    u32(*warp_counts)[MAX_DIGITS] = (u32(*)[MAX_DIGITS])words;

    const u32 tid = threadIdx.x, lane = lane_id(), warp = tid >> 5;
    // Tiles go to blocks in the order they start (see look_back).
    if (tid == 0) taken_tile = atomicAdd(next_tile, 1u);
    for (u32 x = tid; x < WARPS * MAX_DIGITS; x += BLOCK) (&warp_counts[0][0])[x] = 0;
    __syncthreads();
    const u32 tile_index = taken_tile;
    const u64 base = (u64)tile_index * TILE;
    const u32 tile_rows = (u32)min((u64)TILE, n - base);

    // Each warp ranks its own run of WARP_ITEMS consecutive items, 32 at a
    // time, against warp-private digit counters: items are ordered by
    // (warp, round, lane), which is input order, so the ranking is stable.
    const u32 WARP_ITEMS = TILE / WARPS;
    // Digit in the high half, rank in the low half (ranks stay below TILE).
    u32 item_slot[TILE_ITEMS];
#pragma unroll
    for (u32 half = 0; half < TILE_ITEMS; half += TILE_ITEMS / 2) {
        K keys[TILE_ITEMS / 2];
#pragma unroll
        for (u32 r = 0; r < TILE_ITEMS / 2; r++) {
            const u32 item = tile_item(half + r);
            if (item < tile_rows) keys[r] = keys_in[base + item];
        }
#pragma unroll
        for (u32 r = 0; r < TILE_ITEMS / 2; r++) {
            const u32 item = tile_item(half + r);
            item_slot[half + r] = item < tile_rows ? digit_of<K>(keys[r], partition_bits, shift, digit_mask) : MAX_DIGITS;
        }
    }
    __syncthreads();
#pragma unroll
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        const bool valid = item < tile_rows;
        const u32 digit = item_slot[round];
        // Digits take 8 bits; MAX_DIGITS (invalid items) sets the ninth.
        const u32 peers = lanes_with_equal_bits<9>(digit);
        const u32 below = __popc(peers & lanes_below());
        u32 before = 0;
        if (valid) before = warp_counts[warp][digit];
        __syncwarp();
        if (valid && below == 0) warp_counts[warp][digit] = before + __popc(peers);
        __syncwarp();
        item_slot[round] = (digit << 16) | (before + below);
    }
    __syncthreads();

    // Thread d handles digit d: where each warp's items of d start among
    // the tile's, where d's run starts in the tile, and in the output.
    {
        const u32 d = tid;
        u32 count = 0;
        for (u32 w = 0; w < WARPS; w++) {
            const u32 warp_count = warp_counts[w][d];
            warp_counts[w][d] = count;
            count += warp_count;
        }
        // Published first, so that later tiles wait as little as possible.
        u64* status = statuses + (u64)tile_index * MAX_DIGITS + d;
        if (d <= digit_mask) publish_status(status, tile_index == 0 ? STATUS_PREFIX : STATUS_AGGREGATE, count);
        u32 total;
        const u32 start = block_exclusive_scan<u32>(count, &total, scratch);
        const u32 digit_offset = block_exclusive_scan<u32>(d <= digit_mask ? digit_counts[d] : 0u, &total, scratch);
        u32 earlier = 0;
        if (d <= digit_mask && tile_index > 0) {
            earlier = look_back(statuses, tile_index, d);
            publish_status(status, STATUS_PREFIX, earlier + count);
        }
        digit_start[d] = start;
        // Wrapping arithmetic: digit_base + slot is the output position.
        digit_base[d] = digit_offset + earlier - start;
    }
    __syncthreads();
#pragma unroll
    for (u32 round = 0; round < TILE_ITEMS; round++) {
        const u32 item = warp * WARP_ITEMS + round * 32 + lane;
        if (item < tile_rows) {
            const u32 digit = item_slot[round] >> 16;
            const u32 slot = digit_start[digit] + warp_counts[warp][digit] + (item_slot[round] & 0xFFFFu);
            digit_of_slot[slot] = (u8)digit;
            slot_of_item[item] = (u16)slot;
        }
    }
    // The warp counters are dead from here on; the exchange reuses them.
    __syncthreads();

    const TileExchange tile = {words, slot_of_item, digit_of_slot, digit_base};
    // The keys are read again (the tile is still in cache) rather than kept
    // in registers through the ranking.
    u32 first_column = 0;
    if (sizeof(K) == 4 && column_count > 0 && columns[0].width == 4) {
        move_key_and_column((const u32*)keys_in, (u32*)keys_out, (const u32*)columns[0].source,
                            (u32*)columns[0].destination, base, tile_rows, tile);
        first_column = 1;
    } else {
        move_column<K>(keys_in, keys_out, base, tile_rows, tile, 1, 0);
    }
    if (generated_row_ids) move_row_ids(generated_row_ids, base, tile_rows, tile);
    for (u32 c = first_column; c < column_count; c++) {
        const ColumnMove column = columns[c];
        switch (column.width) {
            case 1: move_column<u8>(column.source, column.destination, base, tile_rows, tile, 1, 0); break;
            case 2: move_column<u16>((const u16*)column.source, (u16*)column.destination, base, tile_rows, tile, 1, 0); break;
            case 4: move_column<u32>((const u32*)column.source, (u32*)column.destination, base, tile_rows, tile, 1, 0); break;
            case 8: move_column<u64>((const u64*)column.source, (u64*)column.destination, base, tile_rows, tile, 1, 0); break;
            case 16:
                move_column<u64>((const u64*)column.source, (u64*)column.destination, base, tile_rows, tile, 2, 0);
                move_column<u64>((const u64*)column.source, (u64*)column.destination, base, tile_rows, tile, 2, 1);
                break;
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
    extern "C" __global__ void __launch_bounds__(BLOCK) radix_digit_counts_##K(                              \
        const K* keys, u64 n, u32 partition_bits, u32 plan0, u32 plan1, u32 plan2, u32 plan3, u32 passes,    \
        u32* counts) {                                                                                       \
        radix_digit_counts<K>(keys, n, partition_bits, plan0, plan1, plan2, plan3, passes, counts);          \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK, 4) radix_scatter_##K(                                   \
        const K* keys_in, K* keys_out, u64 n, u32 partition_bits, u32 shift, u32 digit_mask,                 \
        const u32* digit_counts, u32* next_tile, u64* statuses, const ColumnMove* columns, u32 column_count, \
        u32* generated_row_ids) {                                                                            \
        radix_scatter<K>(keys_in, keys_out, n, partition_bits, shift, digit_mask, digit_counts, next_tile,   \
                         statuses, columns, column_count, generated_row_ids);                                \
    }                                                                                                        \
    extern "C" __global__ void partition_offsets_##K(const K* keys, u64 n, u32 partition_bits, u32* offsets) { \
        partition_offsets<K>(keys, n, partition_bits, offsets);                                              \
    }                                                                                                        \
    extern "C" __global__ void sorted_offsets_##K(const K* keys, u64 n, u32* offsets) {                      \
        sorted_offsets<K>(keys, n, offsets);                                                                 \
    }

RADIX_KERNELS(u32)
RADIX_KERNELS(u64)
