// Match finding.
//
// Hash match: the build side is cut once into pieces, a co-partition or a
// part of one holding as many rows as a shared-memory hash table holds.
// One block per work unit (a piece and a slice of its probe partition;
// large partitions give several units, so skew spreads over blocks)
// streams its probe rows through the piece's table. The unit builds the
// table in shared memory, unless the probe chunk has few probe rows for
// the build side's size (a chunk's co-partitions are often far smaller
// than the build side's): then each piece's table is built once, kept in
// global memory, and read there by every such chunk's units.
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
// Merge match: both relations are sorted. A sorted search by merge path
// gives each probe row the lower bound of its run of equal build keys.
// When every probe row matches exactly once (a foreign-key join), the
// lower bounds are the matches, in probe order. Otherwise a second search
// gives the upper bounds, the run lengths are scanned and a
// load-balancing search writes the pairs.

// A piece of a build co-partition and its hash table.
struct Piece {
    u32 build_begin;
    u32 build_end;
    // Its table's first slot among the slots of every piece's table.
    u64 first_slot;
    u32 slots;
    // 1 when two of its build keys are equal.
    u32 repeated;
};

struct WorkUnit {
    u32 piece;
    u32 probe_begin;
    u32 probe_end;
    // 1 when no other unit reads these probe rows.
    u32 direct;
};

// Hash table slots for `build_rows` rows, load factor at most 3/4;
// table_slots in the host code computes the same.
__device__ __forceinline__ u32 table_slots(u32 build_rows) {
    u32 slots = 2;
    while ((u64)slots * 3 < (u64)build_rows * 4) slots <<= 1;
    return slots;
}

// Pieces are planned on the device from the build side's partition offsets:
// a co-partition gives one piece per `max_build_rows` build rows. First the
// pieces and table slots per co-partition (and the largest piece), then,
// after a scan of both, the pieces.
extern "C" __global__ void plan_piece_counts(const u32* build_offsets, u32 partitions, u32 max_build_rows,
                                             u64* piece_counts, u64* slot_counts, u32* largest_piece) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    const u32 rows = build_offsets[p + 1] - build_offsets[p];
    const u32 full = rows / max_build_rows, rest = rows % max_build_rows;
    piece_counts[p] = full + (rest != 0);
    slot_counts[p] = (u64)full * table_slots(max_build_rows) + (rest != 0 ? table_slots(rest) : 0);
    if (rows != 0) atomicMax(largest_piece, min(rows, max_build_rows));
}

extern "C" __global__ void plan_pieces(const u32* build_offsets, u32 partitions, u32 max_build_rows,
                                       const u64* piece_offsets, const u64* slot_offsets, Piece* pieces) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    u64 at = piece_offsets[p], slot = slot_offsets[p];
    const u32 b1 = build_offsets[p + 1];
    for (u32 b = build_offsets[p]; b < b1;) {
        const u32 end = b + min(max_build_rows, b1 - b);
        const u32 slots = table_slots(end - b);
        pieces[at++] = Piece{b, end, slot, slots, 0};
        slot += slots;
        b = end;
    }
}

// Work units are planned on the device from the pieces and the probe
// chunk's partition offsets (neither travels to the host): a co-partition
// gives one unit per piece and slice of at most `probe_slice_rows` probe
// rows. First the count per co-partition, then, after a scan, the units.
extern "C" __global__ void plan_unit_counts(const u64* piece_offsets, const u32* probe_offsets, u32 partitions,
                                            u32 probe_slice_rows, u64* unit_counts) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    const u64 pieces = piece_offsets[p + 1] - piece_offsets[p];
    const u32 probe_rows = probe_offsets[p + 1] - probe_offsets[p];
    unit_counts[p] = probe_rows == 0 ? 0 : pieces * ((probe_rows - 1) / probe_slice_rows + 1);
}

extern "C" __global__ void plan_units(const u64* piece_offsets, const u32* probe_offsets, u32 partitions,
                                      u32 probe_slice_rows, const u64* unit_offsets, WorkUnit* units) {
    const u32 p = blockIdx.x * BLOCK + threadIdx.x;
    if (p >= partitions) return;
    u64 at = unit_offsets[p];
    if (unit_offsets[p + 1] == at) return;
    const u64 first_piece = piece_offsets[p], end_piece = piece_offsets[p + 1];
    const u32 p0 = probe_offsets[p], p1 = probe_offsets[p + 1];
    // Direct: the partition's build rows fit one table, so no two units
    // read the same probe rows.
    const u32 direct = end_piece - first_piece == 1;
    for (u64 piece = first_piece; piece < end_piece; piece++) {
        for (u32 q = p0; q < p1; q += min(probe_slice_rows, p1 - q)) {
            units[at++] = WorkUnit{(u32)piece, q, q + min(probe_slice_rows, p1 - q), direct};
        }
    }
}

// Linear-probing hash table, in shared or global memory. A 4-byte key and
// its build position share one 8-byte entry, so a probe step is one load;
// 8-byte keys keep their positions in a second array. The unmatchable key
// marks an empty slot (unmatchable rows are never in a piece).
template <typename K> struct Table;

// Bytes of a table per slot; a table of `slots` slots (an even number) is
// `slots * ENTRY_BYTES / 8` words.
template <typename K> constexpr u32 ENTRY_BYTES = sizeof(K) + 4;

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

// Builds the piece's table; returns whether two of its build keys are
// equal. Ends with a barrier.
template <typename K>
__device__ __forceinline__ bool build_table(Table<K>& table, const K* build_keys, const Piece& piece,
                                            u32* equal_keys) {
    if (threadIdx.x == 0) *equal_keys = 0;
    // The first batch of keys loads while the table is cleared; each batch's
    // loads are in flight together rather than one per insert.
    K keys[BUILD_BATCH];
    // 64-bit, so that stepping past the last row cannot wrap around.
    u64 row = (u64)piece.build_begin + threadIdx.x;
#pragma unroll
    for (u32 k = 0; k < BUILD_BATCH; k++)
        if (row + k * BLOCK < piece.build_end) keys[k] = build_keys[row + k * BLOCK];
    table.clear();
    __syncthreads();
    bool equal = false;
    while (row < piece.build_end) {
#pragma unroll
        for (u32 k = 0; k < BUILD_BATCH; k++)
            if (row + k * BLOCK < piece.build_end) equal |= table.insert(keys[k], (u32)(row + k * BLOCK));
        row += BUILD_BATCH * BLOCK;
#pragma unroll
        for (u32 k = 0; k < BUILD_BATCH; k++)
            if (row + k * BLOCK < piece.build_end) keys[k] = build_keys[row + k * BLOCK];
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

// Builds every piece's table in shared memory, one block per piece, and
// keeps it in `tables` with whether the piece's build keys repeat.
template <typename K>
__device__ void build_tables(const K* build_keys, Piece* pieces, u64* tables) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 equal_keys;
    const Piece piece = pieces[blockIdx.x];
    Table<K> table(shared_words, piece.slots);
    const bool repeated = build_table<K>(table, build_keys, piece, &equal_keys);
    u64* kept = tables + piece.first_slot * ENTRY_BYTES<K> / 8;
    const u32 words = piece.slots * ENTRY_BYTES<K> / 8;
    for (u32 w = threadIdx.x; w < words; w += BLOCK) kept[w] = shared_words[w];
    if (threadIdx.x == 0) pieces[blockIdx.x].repeated = repeated;
}

// The unit's piece's table, and whether its build keys repeat: with KEPT
// the table kept in global memory, otherwise built in shared memory from
// the piece's build rows. Ends with a barrier.
template <typename K, bool KEPT>
__device__ __forceinline__ Table<K> piece_table(const Piece& piece, const K* build_keys, const u64* tables,
                                                u64* shared_words, u32* equal_keys, bool& repeated) {
    if (KEPT) {
        __syncthreads();
        repeated = piece.repeated;
        return Table<K>((u64*)(tables + piece.first_slot * ENTRY_BYTES<K> / 8), piece.slots);
    }
    Table<K> table(shared_words, piece.slots);
    repeated = build_table<K>(table, build_keys, piece, equal_keys);
    return table;
}

// First launch: direct units with unique build keys write their matches
// into `direct_build`/`direct_probe` (as long as the probe relation); the
// others count. unit_matches[u] gets the count, unit_written[u] 1 if written.
template <typename K, bool KEPT>
__device__ void hash_first(const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,
                           const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids,
                           u32* direct_build, u32* direct_probe, u64* unit_matches, u32* unit_written) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 equal_keys, found_in_unit;
    __shared__ u32 round_counts[2][PROBE_ITEMS * WARPS];
    const WorkUnit unit = units[blockIdx.x];
    if (threadIdx.x == 0) found_in_unit = 0;
    const Piece piece = pieces[unit.piece];
    bool repeated;
    const Table<K> table = piece_table<K, KEPT>(piece, build_keys, tables, shared_words, &equal_keys, repeated);
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
template <typename K, bool KEPT>
__device__ void hash_second(const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,
                            const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids,
                            const u32* direct_build, const u32* direct_probe, u32* out_build, u32* out_probe,
                            const u64* unit_offsets, const u32* unit_written) {
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
    if (threadIdx.x == 0) found_in_unit = 0;
    const Piece piece = pieces[unit.piece];
    bool repeated;
    const Table<K> table = piece_table<K, KEPT>(piece, build_keys, tables, shared_words, &equal_keys, repeated);
    probe_all<K, true>(table, probe_keys, unit, build_row_ids, probe_row_ids, out_build, out_probe, offset,
                       &found_in_unit);
}

// summary[0] = the number of matches; summary[1] is set when some unit's
// matches are not yet at their final place in the first launch's output
// (unit_offsets as in hash_second). One read back gives both.
extern "C" __global__ void hash_misplaced(const WorkUnit* units, u32 unit_count, const u64* unit_offsets,
                                          const u32* unit_written, u64* summary) {
    const u32 u = blockIdx.x * BLOCK + threadIdx.x;
    if (u >= unit_count) return;
    if (u == 0) summary[0] = unit_offsets[unit_count];
    const u64 offset = unit_offsets[u];
    if (unit_offsets[u + 1] != offset && (!unit_written[u] || offset != units[u].probe_begin)) summary[1] = 1;
}

// ---- merge match ----

// Items of the merged order one thread merges, and one block's tile.
#define SEARCH_ITEMS 12
#define SEARCH_TILE (BLOCK * SEARCH_ITEMS)
// Output pairs one thread of the expansion writes.
#define EXPAND_ITEMS 8
#define EXPAND_TILE (BLOCK * EXPAND_ITEMS)

// The order of a merge of the sorted probe keys (needles) into the sorted
// build keys: a needle goes before every build key it is at most, less
// `bias`. With bias 0 the build keys before a needle are those below it
// (its lower bound); with bias 1 those at most it (its upper bound).
// Needles are matchable keys, below the unmatchable key, so `needle + 1`
// does not wrap.
template <typename K>
__device__ __forceinline__ bool needle_first(K needle, K build, u32 bias) {
    return needle + (K)bias <= build;
}

// How many needles are among the first `diagonal` items of the merge of
// needles[0..n) and build[0..m) (merge path, Green et al.).
template <typename K>
__device__ __forceinline__ u32 merge_path(const K* needles, u32 n, const K* build, u32 m, u64 diagonal, u32 bias) {
    u32 low = diagonal > m ? (u32)(diagonal - m) : 0u;
    u32 high = (u32)min(diagonal, (u64)n);
    while (low < high) {
        const u32 middle = low + (high - low) / 2;
        if (needle_first<K>(needles[middle], build[diagonal - 1 - middle], bias)) low = middle + 1; else high = middle;
    }
    return low;
}

// splits[t]: needles before tile t's first diagonal, for every tile and
// the end, so that each tile of the search knows its needles and build
// keys without searching.
template <typename K>
__device__ void merge_splits(const K* needles, u32 n, const K* build, u32 m, u32 bias, u32 tiles, u32* splits) {
    const u32 t = blockIdx.x * BLOCK + threadIdx.x;
    if (t > tiles) return;
    const u64 diagonal = min((u64)t * SEARCH_TILE, (u64)n + m);
    splits[t] = merge_path<K>(needles, n, build, m, diagonal, bias);
}

// Sorted search (ModernGPU): every needle's bound among the build keys, for
// a tile of SEARCH_TILE items of the merged order per block. Both runs of
// the tile are loaded coalesced into shared memory, each thread merges
// SEARCH_ITEMS items from its own diagonal, and the bounds leave coalesced.
// The work per block is the same whatever the keys: long runs of equal
// keys on either side cost no more than distinct ones.
//
// Without `lower`, writes each needle's lower bound to `bounds` (bias 0)
// and sets `*not_one` when some needle does not match exactly once: the
// build key at its bound differs, or so does the next one. With `lower`
// (bias 1), the upper bound less the lower bound is the needle's match
// count, written to `counts`.
template <typename K>
__device__ void merge_search(const K* needles, u32 n, const K* build, u32 m, u32 bias, const u32* splits,
                             u32* bounds, const u32* lower, u64* counts, u32* not_one) {
    __shared__ K keys[SEARCH_TILE];
    __shared__ u32 found[SEARCH_TILE];
    const u64 first_diagonal = (u64)blockIdx.x * SEARCH_TILE;
    const u64 end_diagonal = min(first_diagonal + SEARCH_TILE, (u64)n + m);
    const u32 needle_begin = splits[blockIdx.x], needle_end = splits[blockIdx.x + 1];
    const u32 build_begin = (u32)(first_diagonal - needle_begin);
    const u32 needle_count = needle_end - needle_begin;
    const u32 items = (u32)(end_diagonal - first_diagonal);
    for (u32 x = threadIdx.x; x < items; x += BLOCK)
        keys[x] = x < needle_count ? needles[needle_begin + x] : build[build_begin + x - needle_count];
    __syncthreads();
    const K* tile_build = keys + needle_count;
    const u32 build_count = items - needle_count;
    const u32 diagonal = min(threadIdx.x * SEARCH_ITEMS, items);
    u32 i = merge_path<K>(keys, needle_count, tile_build, build_count, diagonal, bias);
    u32 j = diagonal - i;
#pragma unroll
    for (u32 step = 0; step < SEARCH_ITEMS; step++) {
        if (i + j >= items) break;
        if (i < needle_count && (j >= build_count || needle_first<K>(keys[i], tile_build[j], bias))) {
            found[i] = build_begin + j;
            i++;
        } else {
            j++;
        }
    }
    __syncthreads();
    bool mismatch = false;
    for (u32 x = threadIdx.x; x < needle_count; x += BLOCK) {
        const u32 needle = needle_begin + x;
        if (lower == nullptr) {
            const u32 bound = found[x];
            bounds[needle] = bound;
            // Both build keys were just read, so these reads hit the cache.
            mismatch |= bound >= m || build[bound] != keys[x] || (bound + 1 < m && build[bound + 1] == keys[x]);
        } else {
            counts[needle] = found[x] - lower[needle];
        }
    }
    if (lower == nullptr && __syncthreads_or(mismatch) && threadIdx.x == 0) atomicOr(not_one, 1u);
}

// Load-balancing search (ModernGPU): each thread writes EXPAND_ITEMS output
// pairs, finding the probe row of each by a search of the scanned match
// counts, so one probe key matching a long run of build keys spreads over
// as many threads as it has pairs. Output o belongs to the last probe row
// j with offsets[j] <= o, and pairs it with build row lower[j] + o -
// offsets[j]. The block first narrows the search to its own probe rows.
extern "C" __global__ void merge_expand(const u64* offsets, u32 probe_rows, const u32* lower,
                                        const u32* build_row_ids, const u32* probe_row_ids, u32* out_build,
                                        u32* out_probe) {
    __shared__ u32 rows[2];
    const u64 total = offsets[probe_rows];
    const u64 first = (u64)blockIdx.x * EXPAND_TILE;
    if (first >= total) return;
    const u64 last = min(first + EXPAND_TILE, total) - 1;
    // The last probe row whose offset is at most `o`, among rows [low, high).
    auto row_of = [&](u64 o, u32 low, u32 high) {
        while (low < high) {
            const u32 middle = low + (high - low) / 2;
            if (offsets[middle] <= o) low = middle + 1; else high = middle;
        }
        return low - 1;
    };
    if (threadIdx.x < 2) rows[threadIdx.x] = row_of(threadIdx.x == 0 ? first : last, 0, probe_rows + 1);
    __syncthreads();
    const u32 low = rows[0], high = rows[1] + 1;
#pragma unroll
    for (u32 k = 0; k < EXPAND_ITEMS; k++) {
        const u64 o = first + (u64)k * BLOCK + threadIdx.x;
        if (o > last) break;
        const u32 j = row_of(o, low, high);
        out_build[o] = output_position(lower[j] + (u32)(o - offsets[j]), build_row_ids);
        out_probe[o] = output_position(j, probe_row_ids);
    }
}

// ---- marks: the rows with a match flagged, no pairs made ----
//
// Semi, anti and mark joins without a join filter ask only which rows have
// a match. A hash mark streams a unit's probe rows through the piece's
// table as the match does; a probe row stops at its first match unless
// build rows are flagged too. Sorted and directory marks look each row's
// key up among the other side's: no pairs, so no count of them to bound.

// Table slots whose first walker a hash mark remembers: every piece's table
// has at most this many (pieces are sized to a shared-memory table).
#define WALKED_SLOTS 8192

template <typename K, bool KEPT>
__device__ void hash_mark(const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,
                          const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids,
                          u8* build_flags, u8* probe_flags) {
    extern __shared__ u64 shared_words[];
    __shared__ u32 equal_keys;
    // Where a key's walk first matches: set by the first probe row of the
    // unit that walks that key, which flags every build row of the key, so
    // that the unit's other probe rows of the key need not walk again.
    __shared__ u32 walked[WALKED_SLOTS / 32];
    for (u32 w = threadIdx.x; w < WALKED_SLOTS / 32; w += BLOCK) walked[w] = 0;
    const WorkUnit unit = units[blockIdx.x];
    const Piece piece = pieces[unit.piece];
    bool repeated;
    const Table<K> table = piece_table<K, KEPT>(piece, build_keys, tables, shared_words, &equal_keys, repeated);
    const bool remember = table.mask < WALKED_SLOTS;
    for (u32 probe = unit.probe_begin + threadIdx.x; probe < unit.probe_end; probe += BLOCK) {
        const K key = probe_keys[probe];
        u32 slot = slot_hash(key) & table.mask;
        bool matched = false;
        for (;;) {
            const u32 at = slot;
            u32 build = 0;
            const u32 state = table.step(key, slot, build);
            if (state == 0) break;
            if (state != 1) continue;
            if (build_flags == nullptr) {
                matched = true;
                break;
            }
            if (!matched && remember && (atomicOr(&walked[at / 32], 1u << (at % 32)) & (1u << (at % 32)))) {
                matched = true;
                break;
            }
            matched = true;
            build_flags[output_position(build, build_row_ids)] = 1;
            // Without repeated keys the piece holds no other row to flag.
            if (!repeated) break;
        }
        if (matched && probe_flags != nullptr) probe_flags[output_position(probe, probe_row_ids)] = 1;
    }
}

// Flags each of the `rows` sorted keys that the `n` sorted keys `others`
// hold, by a binary search per row.
template <typename K>
__device__ void mark_sorted(const K* keys, u32 rows, const K* others, u32 n, const u32* row_ids, u8* flags) {
    const u32 i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= rows) return;
    const K key = keys[i];
    u32 low = 0, high = n;
    while (low < high) {
        const u32 middle = low + (high - low) / 2;
        if (others[middle] < key) low = middle + 1; else high = middle;
    }
    if (low < n && others[low] == key) flags[output_position(i, row_ids)] = 1;
}

#define HASH_MATCH_KERNELS(K, MODE, KEPT)                                                                    \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_first_##MODE##_##K(                             \
        const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,                   \
        const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids, u32* direct_build,        \
        u32* direct_probe, u64* unit_matches, u32* unit_written) {                                           \
        hash_first<K, KEPT>(pieces, tables, build_keys, probe_keys, units, build_row_ids, probe_row_ids,     \
                            direct_build, direct_probe, unit_matches, unit_written);                         \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_second_##MODE##_##K(                            \
        const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,                   \
        const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids, const u32* direct_build,  \
        const u32* direct_probe, u32* out_build, u32* out_probe, const u64* unit_offsets,                    \
        const u32* unit_written) {                                                                           \
        hash_second<K, KEPT>(pieces, tables, build_keys, probe_keys, units, build_row_ids, probe_row_ids,    \
                             direct_build, direct_probe, out_build, out_probe, unit_offsets, unit_written);  \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) hash_mark_##MODE##_##K(                              \
        const Piece* pieces, const u64* tables, const K* build_keys, const K* probe_keys,                   \
        const WorkUnit* units, const u32* build_row_ids, const u32* probe_row_ids, u8* build_flags,          \
        u8* probe_flags) {                                                                                   \
        hash_mark<K, KEPT>(pieces, tables, build_keys, probe_keys, units, build_row_ids, probe_row_ids,      \
                           build_flags, probe_flags);                                                        \
    }

#define MATCH_KERNELS(K)                                                                                     \
    extern "C" __global__ void __launch_bounds__(BLOCK) build_tables_##K(const K* build_keys, Piece* pieces, \
                                                                         u64* tables) {                      \
        build_tables<K>(build_keys, pieces, tables);                                                         \
    }                                                                                                        \
    HASH_MATCH_KERNELS(K, shared, false)                                                                     \
    HASH_MATCH_KERNELS(K, kept, true)                                                                        \
    extern "C" __global__ void merge_splits_##K(const K* needles, u32 n, const K* build, u32 m, u32 bias,    \
                                                u32 tiles, u32* splits) {                                    \
        merge_splits<K>(needles, n, build, m, bias, tiles, splits);                                          \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(BLOCK) merge_search_##K(                                    \
        const K* needles, u32 n, const K* build, u32 m, u32 bias, const u32* splits, u32* bounds,            \
        const u32* lower, u64* counts, u32* not_one) {                                                       \
        merge_search<K>(needles, n, build, m, bias, splits, bounds, lower, counts, not_one);                 \
    }                                                                                                        \
    extern "C" __global__ void mark_sorted_##K(const K* keys, u32 rows, const K* others, u32 n,               \
                                               const u32* row_ids, u8* flags) {                              \
        mark_sorted<K>(keys, rows, others, n, row_ids, flags);                                               \
    }

MATCH_KERNELS(u32)
MATCH_KERNELS(u64)
