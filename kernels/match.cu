// Match finding.
//
// Hash match: one block per work unit, a piece of one co-partition (as many
// build rows as a shared-memory hash table holds, and a slice of the probe
// partition; large partitions are split into several units, so skew spreads
// over blocks). The block builds an open-addressing hash table of its build
// rows in shared memory and streams its probe rows through it.
//
// The first launch handles a unit whose build keys are unique and whose probe
// rows no other unit reads ("direct") in one go: each probe row has at most
// one match, so the unit's matches fit in its own probe rows' range of the
// output, and are written there in probe order. Other units only count in
// the first launch. The counts are scanned; where every direct unit's
// matches already sit at their final place (each probe row matched, as in a
// foreign-key join), the first launch's output is the result. Otherwise a
// second launch moves direct units' matches to their place and writes the
// other units' matches (count, then write, He et al.), warps reserving room
// with one shared-memory atomic add each.
//
// Merge match: both relations are sorted; each probe row finds its run of
// equal build keys by binary search, the run lengths are scanned, and each
// probe row writes its pairs at its offset (count, then write).

struct WorkUnit {
    u32 build_begin;
    u32 build_end;
    u32 probe_begin;
    u32 probe_end;
    // 1 when no other unit reads these probe rows.
    u32 direct;
};

// Work units are planned on the device from the partition offsets (the
// offsets never travel to the host): a co-partition gives one unit per
// piece of at most `max_build_rows` build rows and slice of at most
// `probe_slice_rows` probe rows. First the count per co-partition (and the
// largest table any unit builds), then, after a scan, the units.
extern "C" __global__ void plan_unit_counts(const u32* build_offsets, const u32* probe_offsets, u32 partitions,
                                            u32 max_build_rows, u32 probe_slice_rows, u64* unit_counts,
                                            u32* largest_build) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    const u32 build_rows = build_offsets[p + 1] - build_offsets[p];
    const u32 probe_rows = probe_offsets[p + 1] - probe_offsets[p];
    u64 count = 0;
    if (build_rows != 0 && probe_rows != 0) {
        count = (u64)((build_rows - 1) / max_build_rows + 1) * ((probe_rows - 1) / probe_slice_rows + 1);
        atomicMax(largest_build, min(build_rows, max_build_rows));
    }
    unit_counts[p] = count;
}

extern "C" __global__ void plan_units(const u32* build_offsets, const u32* probe_offsets, u32 partitions,
                                      u32 max_build_rows, u32 probe_slice_rows, const u64* unit_offsets,
                                      WorkUnit* units) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    u64 at = unit_offsets[p];
    if (unit_offsets[p + 1] == at) return;
    const u32 b0 = build_offsets[p], b1 = build_offsets[p + 1], p0 = probe_offsets[p], p1 = probe_offsets[p + 1];
    // Direct: the partition's build rows fit one table, so no two units
    // read the same probe rows.
    const u32 direct = b1 - b0 <= max_build_rows;
    for (u32 b = b0; b < b1; b += min(max_build_rows, b1 - b)) {
        const u32 b_end = b + min(max_build_rows, b1 - b);
        for (u32 q = p0; q < p1; q += min(probe_slice_rows, p1 - q)) {
            units[at++] = WorkUnit{b, b_end, q, q + min(probe_slice_rows, p1 - q), direct};
        }
    }
}

__device__ __forceinline__ u32 output_position(u32 position, const u32* row_ids) {
    return row_ids ? row_ids[position] : position;
}

// Hash table slots for `build_rows` rows, load factor at most 3/4;
// table_slots in the host code computes the same.
__device__ __forceinline__ u32 table_slots(u32 build_rows) {
    u32 slots = 2;
    while ((u64)slots * 3 < (u64)build_rows * 4) slots <<= 1;
    return slots;
}

// Linear-probing hash table in shared memory. A 4-byte key and its build
// position share one 8-byte entry, so a probe step is one load; 8-byte keys
// keep their positions in a second array. The unmatchable key marks an
// empty slot (unmatchable rows are never in a work unit).
template <typename K> struct Table;

template <> struct Table<u32> {
    u64* entries;
    u32 mask;
    static constexpr u64 EMPTY = 0xFFFFFFFFFFFFFFFFull;

    __device__ Table(u64* memory, u32 slots) : entries(memory), mask(slots - 1) {}
    __device__ __forceinline__ void clear() {
        for (u32 s = threadIdx.x; s <= mask; s += BLOCK) entries[s] = EMPTY;
    }
    // Returns whether an equal key was met on the way.
    __device__ __forceinline__ bool insert(u32 key, u32 position) {
        const u64 entry = ((u64)position << 32) | key;
        bool equal = false;
        for (u32 slot = slot_hash(key) & mask;; slot = (slot + 1) & mask) {
            const u64 previous = atomicCAS(&entries[slot], EMPTY, entry);
            if (previous == EMPTY) return equal;
            equal |= (u32)previous == key;
        }
    }
    // One probe step at `slot`: 1 = a match (its position set), 0 = an empty
    // slot (the walk ends), 2 = another key.
    __device__ __forceinline__ u32 step(u32 key, u32& slot, u32& position) const {
        const u64 entry = entries[slot];
        slot = (slot + 1) & mask;
        if ((u32)entry == key) {
            position = (u32)(entry >> 32);
            return 1;
        }
        return entry == EMPTY ? 0 : 2;
    }
};

template <> struct Table<u64> {
    u64* keys;
    u32* positions;
    u32 mask;
    static constexpr u64 EMPTY = 0xFFFFFFFFFFFFFFFFull;

    __device__ Table(u64* memory, u32 slots) : keys(memory), positions((u32*)(memory + slots)), mask(slots - 1) {}
    __device__ __forceinline__ void clear() {
        for (u32 s = threadIdx.x; s <= mask; s += BLOCK) keys[s] = EMPTY;
    }
    __device__ __forceinline__ bool insert(u64 key, u32 position) {
        bool equal = false;
        for (u32 slot = slot_hash(key) & mask;; slot = (slot + 1) & mask) {
            const u64 previous = atomicCAS(&keys[slot], EMPTY, key);
            if (previous == EMPTY) {
                positions[slot] = position;
                return equal;
            }
            equal |= previous == key;
        }
    }
    __device__ __forceinline__ u32 step(u64 key, u32& slot, u32& position) const {
        const u64 candidate = keys[slot];
        const u32 at = slot;
        slot = (slot + 1) & mask;
        if (candidate == key) {
            position = positions[at];
            return 1;
        }
        return candidate == EMPTY ? 0 : 2;
    }
};

// Build rows per thread whose keys are loaded at once.
#define BUILD_BATCH 8

// Builds the unit's table; returns whether two of its build keys are equal.
// Ends with a barrier.
template <typename K>
__device__ __forceinline__ bool build_table(Table<K>& table, const K* build_keys, const WorkUnit& unit,
                                            u32* equal_keys) {
    if (threadIdx.x == 0) *equal_keys = 0;
    // The first batch of keys loads while the table is cleared; each batch's
    // loads are in flight together rather than one per insert.
    K keys[BUILD_BATCH];
    // 64-bit, so that stepping past the last row cannot wrap around.
    u64 row = (u64)unit.build_begin + threadIdx.x;
#pragma unroll
    for (u32 k = 0; k < BUILD_BATCH; k++)
        if (row + k * BLOCK < unit.build_end) keys[k] = build_keys[row + k * BLOCK];
    table.clear();
    __syncthreads();
    bool equal = false;
    while (row < unit.build_end) {
#pragma unroll
        for (u32 k = 0; k < BUILD_BATCH; k++)
            if (row + k * BLOCK < unit.build_end) equal |= table.insert(keys[k], (u32)(row + k * BLOCK));
        row += BUILD_BATCH * BLOCK;
#pragma unroll
        for (u32 k = 0; k < BUILD_BATCH; k++)
            if (row + k * BLOCK < unit.build_end) keys[k] = build_keys[row + k * BLOCK];
    }
    if (equal) *equal_keys = 1;
    __syncthreads();
    return *equal_keys != 0;
}

// Streams the unit's probe rows through the table, walking each to an empty
// slot (build keys may repeat). Counts the matches into `found_in_unit`, and
// with WRITE writes them from `unit_base` on. The caller zeroes the counter.
template <typename K, bool WRITE>
__device__ __forceinline__ void probe_all(const Table<K>& table, const K* probe_keys, const WorkUnit& unit,
                                          const u32* build_row_ids, const u32* probe_row_ids, u32* out_build,
                                          u32* out_probe, u64 unit_base, u32* found_in_unit) {
    const u32 lane = lane_id();
    // The next probe key is loaded while the current one walks the table.
    K next_key = unit.probe_begin + threadIdx.x < unit.probe_end ? probe_keys[unit.probe_begin + threadIdx.x] : (K)0;
    for (u32 first = unit.probe_begin; first < unit.probe_end; first += BLOCK) {
        const u32 probe = first + threadIdx.x;
        bool walking = probe < unit.probe_end;
        const K key = next_key;
        if (probe + BLOCK < unit.probe_end) next_key = probe_keys[probe + BLOCK];
        u32 slot = slot_hash(key) & table.mask;
        while (__any_sync(FULL_MASK, walking)) {
            u32 build = 0;
            const u32 state = walking ? table.step(key, slot, build) : 0;
            walking = state != 0;
            const bool found = state == 1;
            const u32 finders = __ballot_sync(FULL_MASK, found);
            if (finders) {
                const u32 leader = __ffs(finders) - 1;
                u32 warp_base = 0;
                if (lane == leader) warp_base = atomicAdd(found_in_unit, __popc(finders));
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
}

// Probe rows per thread and round of a direct unit: their key loads are in
// flight together, and PROBE_ITEMS x WARPS = 32 counts per round are
// scanned by one warp shuffle scan.
#define PROBE_ITEMS 4

// A direct unit: every probe row stops at its first match, the only one.
// Matches are written in probe order from the unit's first probe row on;
// returns how many.
template <typename K>
__device__ __forceinline__ u32 probe_unique(const Table<K>& table, const K* probe_keys, const WorkUnit& unit,
                                            const u32* build_row_ids, const u32* probe_row_ids, u32* out_build,
                                            u32* out_probe, u32 (*round_counts)[PROBE_ITEMS * WARPS]) {
    const u32 lane = lane_id(), warp = threadIdx.x >> 5;
    u32 written = 0;
    u32 parity = 0;
    // The next round's keys load while this round walks the table.
    K next[PROBE_ITEMS];
#pragma unroll
    for (u32 k = 0; k < PROBE_ITEMS; k++) {
        const u64 probe = (u64)unit.probe_begin + k * BLOCK + threadIdx.x;
        if (probe < unit.probe_end) next[k] = probe_keys[probe];
    }
    for (u64 first = unit.probe_begin; first < unit.probe_end; first += BLOCK * PROBE_ITEMS, parity ^= 1) {
        K keys[PROBE_ITEMS];
#pragma unroll
        for (u32 k = 0; k < PROBE_ITEMS; k++) {
            keys[k] = next[k];
            const u64 probe = first + (PROBE_ITEMS + k) * BLOCK + threadIdx.x;
            if (probe < unit.probe_end) next[k] = probe_keys[probe];
        }
        u32 build[PROBE_ITEMS];
        u32 finders[PROBE_ITEMS];
#pragma unroll
        for (u32 k = 0; k < PROBE_ITEMS; k++) {
            bool found = false;
            if (first + k * BLOCK + threadIdx.x < unit.probe_end) {
                u32 slot = slot_hash(keys[k]) & table.mask;
                u32 state;
                do state = table.step(keys[k], slot, build[k]); while (state == 2);
                found = state == 1;
            }
            finders[k] = __ballot_sync(FULL_MASK, found);
        }
        // Counts in probe order (k, warp); two alternating rows, so one
        // barrier per round.
        if (lane == 0) {
#pragma unroll
            for (u32 k = 0; k < PROBE_ITEMS; k++) round_counts[parity][k * WARPS + warp] = __popc(finders[k]);
        }
        __syncthreads();
        const u32 count = round_counts[parity][lane];
        u32 inclusive = count;
#pragma unroll
        for (u32 offset = 1; offset < 32; offset <<= 1) {
            const u32 other = __shfl_up_sync(FULL_MASK, inclusive, offset);
            if (lane >= offset) inclusive += other;
        }
        const u32 exclusive = inclusive - count;
#pragma unroll
        for (u32 k = 0; k < PROBE_ITEMS; k++) {
            const u32 before = __shfl_sync(FULL_MASK, exclusive, k * WARPS + warp);
            if ((finders[k] >> lane) & 1) {
                const u32 at = unit.probe_begin + written + before + __popc(finders[k] & lanes_below());
                out_build[at] = output_position(build[k], build_row_ids);
                out_probe[at] = output_position((u32)(first + k * BLOCK + threadIdx.x), probe_row_ids);
            }
        }
        written += __shfl_sync(FULL_MASK, inclusive, 31);
    }
    return written;
}

// First launch: direct units with unique build keys write their matches
// into `direct_build`/`direct_probe` (as long as the probe relation); the
// others count. unit_matches[u] gets the count, unit_written[u] 1 if written.
template <typename K>
__device__ void hash_first(const K* build_keys, const K* probe_keys, const WorkUnit* units,
                           const u32* build_row_ids, const u32* probe_row_ids, u32* direct_build,
                           u32* direct_probe, u64* unit_matches, u32* unit_written) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 equal_keys, found_in_unit;
    __shared__ u32 round_counts[2][PROBE_ITEMS * WARPS];
    const WorkUnit unit = units[blockIdx.x];
    Table<K> table(shared_words, table_slots(unit.build_end - unit.build_begin));
    if (threadIdx.x == 0) found_in_unit = 0;
    const bool repeated = build_table<K>(table, build_keys, unit, &equal_keys);
    if (unit.direct && !repeated) {
        const u32 written = probe_unique<K>(table, probe_keys, unit, build_row_ids, probe_row_ids, direct_build,
                                            direct_probe, round_counts);
        if (threadIdx.x == 0) {
            unit_matches[blockIdx.x] = written;
            unit_written[blockIdx.x] = 1;
        }
    } else {
        probe_all<K, false>(table, probe_keys, unit, 0, 0, 0, 0, 0, &found_in_unit);
        __syncthreads();
        if (threadIdx.x == 0) {
            unit_matches[blockIdx.x] = found_in_unit;
            unit_written[blockIdx.x] = 0;
        }
    }
}

// Second launch, after the scan of the counts: unit_offsets[u] is where
// unit u's matches go (unit_offsets[units] is the total).
template <typename K>
__device__ void hash_second(const K* build_keys, const K* probe_keys, const WorkUnit* units,
                            const u32* build_row_ids, const u32* probe_row_ids, const u32* direct_build,
                            const u32* direct_probe, u32* out_build, u32* out_probe, const u64* unit_offsets,
                            const u32* unit_written) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 equal_keys, found_in_unit;
    const WorkUnit unit = units[blockIdx.x];
    const u64 offset = unit_offsets[blockIdx.x];
    const u64 count = unit_offsets[blockIdx.x + 1] - offset;
    if (count == 0) return;
    if (unit_written[blockIdx.x]) {
        for (u32 i = threadIdx.x; i < count; i += BLOCK) {
            out_build[offset + i] = direct_build[unit.probe_begin + i];
            out_probe[offset + i] = direct_probe[unit.probe_begin + i];
        }
        return;
    }
    Table<K> table(shared_words, table_slots(unit.build_end - unit.build_begin));
    if (threadIdx.x == 0) found_in_unit = 0;
    build_table<K>(table, build_keys, unit, &equal_keys);
    probe_all<K, true>(table, probe_keys, unit, build_row_ids, probe_row_ids, out_build, out_probe, offset,
                       &found_in_unit);
}

// Sets *misplaced when some unit's matches are not yet at their final place
// in the first launch's output (unit_offsets as in hash_second).
extern "C" __global__ void hash_misplaced(const WorkUnit* units, u32 unit_count, const u64* unit_offsets,
                                          const u32* unit_written, u32* misplaced) {
    const u32 u = blockIdx.x * BLOCK + threadIdx.x;
    if (u >= unit_count) return;
    const u64 offset = unit_offsets[u];
    if (unit_offsets[u + 1] != offset && (!unit_written[u] || offset != units[u].probe_begin)) *misplaced = 1;
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
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_first_##K(                                      \
        const K* build_keys, const K* probe_keys, const WorkUnit* units, const u32* build_row_ids,           \
        const u32* probe_row_ids, u32* direct_build, u32* direct_probe, u64* unit_matches,                   \
        u32* unit_written) {                                                                                 \
        hash_first<K>(build_keys, probe_keys, units, build_row_ids, probe_row_ids, direct_build,             \
                      direct_probe, unit_matches, unit_written);                                             \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_second_##K(                                     \
        const K* build_keys, const K* probe_keys, const WorkUnit* units, const u32* build_row_ids,           \
        const u32* probe_row_ids, const u32* direct_build, const u32* direct_probe, u32* out_build,          \
        u32* out_probe, const u64* unit_offsets, const u32* unit_written) {                                  \
        hash_second<K>(build_keys, probe_keys, units, build_row_ids, probe_row_ids, direct_build,            \
                       direct_probe, out_build, out_probe, unit_offsets, unit_written);                      \
    }                                                                                                        \
    extern "C" __global__ void merge_count_##K(const K* build_keys, u32 build_rows, const K* probe_keys,     \
                                               u32 probe_rows, u64* counts, u32* first) {                    \
        merge_count<K>(build_keys, build_rows, probe_keys, probe_rows, counts, first);                       \
    }

MATCH_KERNELS(u32)
MATCH_KERNELS(u64)
