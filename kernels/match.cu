// Match finding.
//
// Hash match: one block per work unit, a piece of one co-partition (as many
// build rows as a shared-memory hash table holds, and a slice of the probe
// partition; large partitions are split into several units, so skew spreads
// over blocks). The block builds an open-addressing hash table of its build
// rows in shared memory and streams its probe rows through it. Count, then
// write (He et al.): a first launch counts each unit's matches, the counts
// are scanned, and a second launch writes each unit's matches into its own
// range, warps reserving room with one shared-memory atomic add each.
//
// Merge match: both relations are sorted; each probe row finds its run of
// equal build keys by binary search, the run lengths are scanned, and each
// probe row writes its pairs at its offset (count, then write).

struct WorkUnit {
    u32 build_begin;
    u32 build_end;
    u32 probe_begin;
    u32 probe_end;
};

__device__ __forceinline__ u32 output_position(u32 position, const u32* row_ids) {
    return row_ids ? row_ids[position] : position;
}

template <typename K, bool WRITE>
__device__ void hash_match(const K* build_keys, const K* probe_keys, const WorkUnit* units,
                           const u32* build_row_ids, const u32* probe_row_ids, u32* out_build,
                           u32* out_probe, u64* unit_matches) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 found_in_unit;
    const WorkUnit unit = units[blockIdx.x];
    const u32 build_rows = unit.build_end - unit.build_begin;
    // Load factor at most 3/4; table_slots in the host code computes the same.
    u32 slots = 2;
    while ((u64)slots * 3 < (u64)build_rows * 4) slots <<= 1;
    const u32 mask = slots - 1;
    K* table_keys = (K*)shared_words;
    u32* table_positions = (u32*)(table_keys + slots);
    const K empty = Key<K>::unmatchable();

    if (threadIdx.x == 0) found_in_unit = 0;
    for (u32 s = threadIdx.x; s < slots; s += BLOCK) table_keys[s] = empty;
    __syncthreads();
    for (u32 i = threadIdx.x; i < build_rows; i += BLOCK) {
        const K key = build_keys[unit.build_begin + i];
        u32 slot = slot_hash(key) & mask;
        while (atomicCAS(&table_keys[slot], empty, key) != empty) slot = (slot + 1) & mask;
        table_positions[slot] = unit.build_begin + i;
    }
    __syncthreads();

    const u32 lane = lane_id();
    const u64 unit_base = WRITE ? unit_matches[blockIdx.x] : 0;
    // The next probe key is loaded while the current one walks the table.
    K next_key = unit.probe_begin + threadIdx.x < unit.probe_end ? probe_keys[unit.probe_begin + threadIdx.x] : empty;
    for (u32 first = unit.probe_begin; first < unit.probe_end; first += BLOCK) {
        const u32 probe = first + threadIdx.x;
        bool walking = probe < unit.probe_end;
        const K key = next_key;
        const u32 next = probe + BLOCK;
        if (next < unit.probe_end) next_key = probe_keys[next];
        u32 slot = slot_hash(key) & mask;
        while (__any_sync(FULL_MASK, walking)) {
            bool found = false;
            u32 build = 0;
            if (walking) {
                const K candidate = table_keys[slot];
                if (candidate == empty) {
                    walking = false;
                } else {
                    if (candidate == key) {
                        found = true;
                        build = table_positions[slot];
                    }
                    slot = (slot + 1) & mask;
                }
            }
            const u32 finders = __ballot_sync(FULL_MASK, found);
            if (finders) {
                const u32 leader = __ffs(finders) - 1;
                u32 warp_base = 0;
                if (lane == leader) warp_base = atomicAdd(&found_in_unit, __popc(finders));
                if (WRITE) {
                    warp_base = __shfl_sync(FULL_MASK, warp_base, leader);
                    if (found) {
                        const u64 at = unit_base + warp_base + __popc(finders & lanes_below());
                        out_build[at] = output_position(build, build_row_ids);
                        out_probe[at] = output_position(probe, probe_row_ids);
                    }
                }
            }
        }
    }
    if (!WRITE) {
        __syncthreads();
        if (threadIdx.x == 0) unit_matches[blockIdx.x] = found_in_unit;
    }
}

template <typename K>
__device__ __forceinline__ u32 lower_bound(const K* keys, u32 n, K key) {
    u32 low = 0, high = n;
    while (low < high) {
        u32 middle = low + (high - low) / 2;
        if (keys[middle] < key) low = middle + 1; else high = middle;
    }
    return low;
}

template <typename K>
__device__ __forceinline__ u32 upper_bound(const K* keys, u32 n, K key) {
    u32 low = 0, high = n;
    while (low < high) {
        u32 middle = low + (high - low) / 2;
        if (keys[middle] <= key) low = middle + 1; else high = middle;
    }
    return low;
}

// counts[j] = build rows equal to probe row j; first[j] = where they start.
template <typename K>
__device__ void merge_count(const K* build_keys, u32 build_rows, const K* probe_keys, u32 probe_rows,
                            u64* counts, u32* first) {
    const u64 j = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (j >= probe_rows) return;
    const K key = probe_keys[j];
    const u32 low = lower_bound<K>(build_keys, build_rows, key);
    const u32 high = upper_bound<K>(build_keys, build_rows, key);
    counts[j] = high - low;
    first[j] = low;
}

extern "C" __global__ void merge_write(const u32* first, const u64* offsets, u32 probe_rows,
                                       const u32* build_row_ids, const u32* probe_row_ids,
                                       u32* out_build, u32* out_probe) {
    const u64 j = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (j >= probe_rows) return;
    const u64 begin = offsets[j], end = offsets[j + 1];
    const u32 probe = output_position((u32)j, probe_row_ids);
    for (u64 at = begin; at < end; at++) {
        out_build[at] = output_position(first[j] + (u32)(at - begin), build_row_ids);
        out_probe[at] = probe;
    }
}

#define MATCH_KERNELS(K)                                                                                     \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_count_##K(                                      \
        const K* build_keys, const K* probe_keys, const WorkUnit* units, u64* unit_matches) {                \
        hash_match<K, false>(build_keys, probe_keys, units, 0, 0, 0, 0, unit_matches);                       \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_write_##K(                                      \
        const K* build_keys, const K* probe_keys, const WorkUnit* units, const u32* build_row_ids,           \
        const u32* probe_row_ids, u32* out_build, u32* out_probe, const u64* unit_offsets) {                 \
        hash_match<K, true>(build_keys, probe_keys, units, build_row_ids, probe_row_ids, out_build,          \
                            out_probe, (u64*)unit_offsets);                                                  \
    }                                                                                                        \
    extern "C" __global__ void merge_count_##K(const K* build_keys, u32 build_rows, const K* probe_keys,     \
                                               u32 probe_rows, u64* counts, u32* first) {                    \
        merge_count<K>(build_keys, build_rows, probe_keys, probe_rows, counts, first);                       \
    }

MATCH_KERNELS(u32)
MATCH_KERNELS(u64)
