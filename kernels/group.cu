// Grouping: rows with equal keys become one group, and each reduction folds
// its column's values per group with atomics.
//
// One open-addressing table of a power of two slots, at least twice the
// rows, holds each distinct key once; the unmatchable key, which exact
// (packed) keys never take, marks a free slot. Slots are numbered densely
// by a prefix sum over the used ones, and each row's slot becomes its
// group. Minima and maxima are kept as unsigned values with the sign bit
// flipped, so that one byte pattern (all ones, all zeros) starts them and
// the unsigned atomics order them as signed values.

template <typename K>
__device__ __forceinline__ void insert_row(const K* keys, u64 n, K* slot_keys, u32* slot_rows, u64 mask,
                                           u32* row_slots) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const K key = keys[i];
    const K free = Key<K>::unmatchable();
    u64 slot = (u64)slot_hash(key) & mask;
    while (true) {
        const K held = ((volatile K*)slot_keys)[slot];
        if (held == key) break;
        if (held == free) {
            const K prior = atomicCAS(&slot_keys[slot], free, key);
            if (prior == free) {
                slot_rows[slot] = (u32)i;
                break;
            }
            if (prior == key) break;
        }
        slot = (slot + 1) & mask;
    }
    row_slots[i] = (u32)slot;
}

extern "C" __global__ void group_insert_u32(const u32* keys, u64 n, u32* slot_keys, u32* slot_rows, u64 mask,
                                            u32* row_slots) {
    insert_row<u32>(keys, n, slot_keys, slot_rows, mask, row_slots);
}

extern "C" __global__ void group_insert_u64(const u64* keys, u64 n, u64* slot_keys, u32* slot_rows, u64 mask,
                                            u32* row_slots) {
    insert_row<u64>(keys, n, slot_keys, slot_rows, mask, row_slots);
}

// used[s] = 1 where slot s holds a key: scanned into the slots' groups.
template <typename K>
__device__ __forceinline__ void used_slot(const K* slot_keys, u64 slots, u32* used) {
    const u64 s = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (s < slots) used[s] = slot_keys[s] != Key<K>::unmatchable();
}

extern "C" __global__ void group_used_u32(const u32* slot_keys, u64 slots, u32* used) {
    used_slot<u32>(slot_keys, slots, used);
}

extern "C" __global__ void group_used_u64(const u64* slot_keys, u64 slots, u32* used) {
    used_slot<u64>(slot_keys, slots, used);
}

// The row that took each used slot, at its group.
template <typename K>
__device__ __forceinline__ void slot_row(const K* slot_keys, const u32* slot_rows, const u32* slot_groups, u64 slots,
                                         u32* group_rows) {
    const u64 s = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (s < slots && slot_keys[s] != Key<K>::unmatchable()) group_rows[slot_groups[s]] = slot_rows[s];
}

extern "C" __global__ void group_rows_u32(const u32* slot_keys, const u32* slot_rows, const u32* slot_groups,
                                          u64 slots, u32* group_rows) {
    slot_row<u32>(slot_keys, slot_rows, slot_groups, slots, group_rows);
}

extern "C" __global__ void group_rows_u64(const u64* slot_keys, const u32* slot_rows, const u32* slot_groups,
                                          u64 slots, u32* group_rows) {
    slot_row<u64>(slot_keys, slot_rows, slot_groups, slots, group_rows);
}

// Each row's slot, in place, becomes its group.
extern "C" __global__ void group_of_rows(u32* row_slots, u64 n, const u32* slot_groups) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) row_slots[i] = slot_groups[row_slots[i]];
}

__device__ __forceinline__ bool has_value(const u8* validity, u64 i) { return !validity || validity[i]; }

extern "C" __global__ void group_count(const u32* groups, u64 n, const u8* validity, u64* counts) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n && has_value(validity, i)) atomicAdd(&counts[groups[i]], 1ull);
}

// Marks the groups with a value, where the column may hold nulls.
__device__ __forceinline__ void saw(u8* seen, u32 group) {
    if (seen) seen[group] = 1;
}

extern "C" __global__ void group_sum_8(const u32* groups, u64 n, const u64* values, const u8* validity, u64* sums,
                                       u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    const u32 g = groups[i];
    atomicAdd(&sums[g], values[i]);
    saw(seen, g);
}

// 16-byte sums as two 8-byte words: the low word's carry, known from the
// word it was added to, goes into the high word with the value's own.
extern "C" __global__ void group_sum_16(const u32* groups, u64 n, const u64* values, const u8* validity, u64* sums,
                                        u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    const u32 g = groups[i];
    const u64 low = values[2 * i];
    const u64 before = atomicAdd(&sums[2 * g], low);
    const u64 high = values[2 * i + 1] + (before + low < before ? 1ull : 0ull);
    if (high) atomicAdd(&sums[2 * g + 1], high);
    saw(seen, g);
}

// Values of 4 bytes, and of 8 bytes read every `stride` words (2 for
// 16-byte values within the 8-byte range, read by their low word).
__device__ __forceinline__ u32 ordered_4(const int* values, u64 i) { return (u32)values[i] ^ 0x80000000u; }

__device__ __forceinline__ u64 ordered_8(const long long* values, u64 i, u32 stride) {
    return (u64)values[i * stride] ^ 0x8000000000000000ull;
}

extern "C" __global__ void group_min_4(const u32* groups, u64 n, const int* values, const u8* validity, u32* out,
                                       u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    atomicMin(&out[groups[i]], ordered_4(values, i));
    saw(seen, groups[i]);
}

extern "C" __global__ void group_max_4(const u32* groups, u64 n, const int* values, const u8* validity, u32* out,
                                       u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    atomicMax(&out[groups[i]], ordered_4(values, i));
    saw(seen, groups[i]);
}

extern "C" __global__ void group_min_8(const u32* groups, u64 n, const long long* values, u32 stride,
                                       const u8* validity, u64* out, u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    atomicMin(&out[groups[i]], ordered_8(values, i, stride));
    saw(seen, groups[i]);
}

extern "C" __global__ void group_max_8(const u32* groups, u64 n, const long long* values, u32 stride,
                                       const u8* validity, u64* out, u8* seen) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n || !has_value(validity, i)) return;
    atomicMax(&out[groups[i]], ordered_8(values, i, stride));
    saw(seen, groups[i]);
}
