// Device-wide exclusive prefix sums in three steps: per-block totals, a scan
// of those totals by one block, then per-block scans offset by them.

#define SCAN_ITEMS 8
#define SCAN_TILE (BLOCK * SCAN_ITEMS)

template <typename T>
__device__ void scan_block_totals(const T* input, u64 n, T* block_totals) {
    __shared__ T scratch[WARPS];
    const u64 base = (u64)blockIdx.x * SCAN_TILE;
    T sum = 0;
    for (u32 i = 0; i < SCAN_ITEMS; i++) {
        u64 index = base + (u64)i * BLOCK + threadIdx.x;
        if (index < n) sum += input[index];
    }
    T total;
    block_exclusive_scan<T>(sum, &total, scratch);
    if (threadIdx.x == 0) block_totals[blockIdx.x] = total;
}

// One block scans `count` totals in place and writes the grand total to
// block_totals[count].
template <typename T>
__device__ void scan_totals(T* block_totals, u32 count) {
    __shared__ T scratch[WARPS];
    T carry = 0;
    for (u32 base = 0; base < count; base += BLOCK) {
        u32 index = base + threadIdx.x;
        T value = index < count ? block_totals[index] : (T)0;
        T total;
        T prefix = block_exclusive_scan<T>(value, &total, scratch);
        if (index < count) block_totals[index] = carry + prefix;
        carry += total;
    }
    if (threadIdx.x == 0) block_totals[count] = carry;
}

// Each thread scans SCAN_ITEMS consecutive values; `output` may alias
// `input`. The tile passes through shared memory so that global loads and
// stores are coalesced; a padding word every 32 keeps the per-thread runs
// off a single bank.
#define SCAN_PADDED(i) ((i) + (i) / 32)

template <typename T>
__device__ void scan_blocks(const T* input, T* output, u64 n, const T* block_offsets) {
    __shared__ T scratch[WARPS];
    __shared__ T tile[SCAN_PADDED(SCAN_TILE)];
    const u64 base = (u64)blockIdx.x * SCAN_TILE;
    for (u32 i = threadIdx.x; i < SCAN_TILE; i += BLOCK) tile[SCAN_PADDED(i)] = base + i < n ? input[base + i] : (T)0;
    __syncthreads();
    const u32 first = threadIdx.x * SCAN_ITEMS;
    T values[SCAN_ITEMS];
    T sum = 0;
    for (u32 i = 0; i < SCAN_ITEMS; i++) {
        values[i] = tile[SCAN_PADDED(first + i)];
        sum += values[i];
    }
    T total;
    T running = block_offsets[blockIdx.x] + block_exclusive_scan<T>(sum, &total, scratch);
    for (u32 i = 0; i < SCAN_ITEMS; i++) {
        tile[SCAN_PADDED(first + i)] = running;
        running += values[i];
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < SCAN_TILE; i += BLOCK)
        if (base + i < n) output[base + i] = tile[SCAN_PADDED(i)];
}

extern "C" __global__ void scan_block_totals_u32(const u32* input, u64 n, u32* totals) { scan_block_totals<u32>(input, n, totals); }
extern "C" __global__ void scan_block_totals_u64(const u64* input, u64 n, u64* totals) { scan_block_totals<u64>(input, n, totals); }
extern "C" __global__ void scan_totals_u32(u32* totals, u32 count) { scan_totals<u32>(totals, count); }
extern "C" __global__ void scan_totals_u64(u64* totals, u32 count) { scan_totals<u64>(totals, count); }
extern "C" __global__ void scan_blocks_u32(const u32* input, u32* output, u64 n, const u32* offsets) { scan_blocks<u32>(input, output, n, offsets); }
extern "C" __global__ void scan_blocks_u64(const u64* input, u64* output, u64 n, const u64* offsets) { scan_blocks<u64>(input, output, n, offsets); }
