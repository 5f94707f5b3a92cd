// Directory join: dense key codes index the build side directly.
//
// A build side sorted by key code gets a directory: entry c is the number of
// its matchable keys below c, so that code c's run of build rows is
// [directory[c], directory[c + 1]). It is a histogram of the codes, scanned.
// A probe key then finds its run with two adjacent reads, in its own row's
// place: the probe side is neither partitioned nor sorted, and its matches
// come out in probe order. When every probe row's run is one row long (a
// foreign-key join), the run starts are the matches; otherwise the run
// lengths are scanned and the merge match's load-balancing search writes the
// pairs.

// counts[key] += 1 for each of `n` sorted build keys below `codes` (the
// unmatchable key and any code past the directory are left out).
template <typename K>
__device__ void directory_counts(const K* keys, u64 n, u32 codes, u32* counts) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const K key = keys[i];
    if (key < (K)codes) atomicAdd(&counts[(u32)key], 1u);
}

// Each probe key's run among the build rows: with `counts` null, its start
// into `lower`, and `not_one` set when some run is not one row long; with
// `counts`, its length (`lower` then holds the starts).
template <typename K>
__device__ void directory_search(const K* keys, u64 n, const u32* directory, u32 codes, u32* lower, u64* counts,
                                 u32* not_one) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const K key = keys[i];
    u32 start = 0, end = 0;
    if (key < (K)codes) {
        start = directory[(u32)key];
        end = directory[(u32)key + 1];
    }
    if (counts) {
        counts[i] = end - start;
        return;
    }
    lower[i] = start;
    if (end - start != 1) *not_one = 1;
}

// Probe rows whose code has build rows: flagged where `probe_flags` is
// given, and their code marked seen where `seen` is.
template <typename K>
__device__ void directory_mark_probe(const K* keys, u64 n, const u32* directory, u32 codes, u8* seen,
                                     u8* probe_flags) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const K key = keys[i];
    if (key >= (K)codes || directory[(u32)key + 1] == directory[(u32)key]) return;
    if (seen) seen[(u32)key] = 1;
    if (probe_flags) probe_flags[i] = 1;
}

// Build rows whose code some probe row has, flagged.
template <typename K>
__device__ void directory_mark_build(const K* keys, u64 n, u32 codes, const u8* seen, const u32* row_ids,
                                     u8* build_flags) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const K key = keys[i];
    if (key < (K)codes && seen[(u32)key]) build_flags[output_position((u32)i, row_ids)] = 1;
}

#define DIRECTORY_KERNELS(K)                                                                                   \
    extern "C" __global__ void directory_counts_##K(const K* keys, u64 n, u32 codes, u32* counts) {            \
        directory_counts<K>(keys, n, codes, counts);                                                         \
    }                                                                                                        \
    extern "C" __global__ void directory_search_##K(const K* keys, u64 n, const u32* directory, u32 codes,    \
                                                    u32* lower, u64* counts, u32* not_one) {                 \
        directory_search<K>(keys, n, directory, codes, lower, counts, not_one);                              \
    }                                                                                                        \
    extern "C" __global__ void directory_mark_probe_##K(const K* keys, u64 n, const u32* directory, u32 codes, \
                                                        u8* seen, u8* probe_flags) {                         \
        directory_mark_probe<K>(keys, n, directory, codes, seen, probe_flags);                               \
    }                                                                                                        \
    extern "C" __global__ void directory_mark_build_##K(const K* keys, u64 n, u32 codes, const u8* seen,      \
                                                        const u32* row_ids, u8* build_flags) {               \
        directory_mark_build<K>(keys, n, codes, seen, row_ids, build_flags);                                 \
    }

DIRECTORY_KERNELS(u32)
DIRECTORY_KERNELS(u64)
