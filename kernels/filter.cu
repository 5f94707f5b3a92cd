// Join filters on candidate pairs: a comparison of two columns' values at
// the pair's rows, ANDed into the flags of the comparisons before it. The
// columns are read where they lie, so no gathered copy is made.

// Comparison codes; the order of Comparison in src/backend/mod.rs.
#define COMPARE_EQ 0
#define COMPARE_NOT_EQ 1
#define COMPARE_LT 2
#define COMPARE_LT_EQ 3
#define COMPARE_GT 4
#define COMPARE_GT_EQ 5

template <typename T>
__device__ bool compare(u32 op, T a, T b) {
    switch (op) {
        case COMPARE_EQ: return a == b;
        case COMPARE_NOT_EQ: return a != b;
        case COMPARE_LT: return a < b;
        case COMPARE_LT_EQ: return a <= b;
        case COMPARE_GT: return a > b;
        default: return a >= b;
    }
}

// out[i] = and[i] && left[left_rows[i]] op right[right_rows[i]], 0 where a
// row is null or a value is NULL. `and` and the validity bytes are null
// when absent.
template <typename T>
__device__ void compare_rows(u32 op, const T* left, const u8* left_valid, const u32* left_rows, const T* right,
                             const u8* right_valid, const u32* right_rows, const u8* and_flags, u64 n, u8* out) {
    const u64 i = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    if (and_flags != 0 && and_flags[i] == 0) {
        out[i] = 0;
        return;
    }
    const u32 l = left_rows[i];
    const u32 r = right_rows[i];
    const bool valid = l != NULL_POSITION && r != NULL_POSITION && (left_valid == 0 || left_valid[l] != 0) &&
                       (right_valid == 0 || right_valid[r] != 0);
    out[i] = valid && compare<T>(op, left[l], right[r]);
}

#define COMPARE_ROWS(name, T)                                                                                   \
    extern "C" __global__ void name(u32 op, const T* left, const u8* left_valid, const u32* left_rows,         \
                                    const T* right, const u8* right_valid, const u32* right_rows,              \
                                    const u8* and_flags, u64 n, u8* out) {                                     \
        compare_rows<T>(op, left, left_valid, left_rows, right, right_valid, right_rows, and_flags, n, out); \
    }

COMPARE_ROWS(compare_rows_i8, signed char)
COMPARE_ROWS(compare_rows_i16, short)
COMPARE_ROWS(compare_rows_i32, int)
COMPARE_ROWS(compare_rows_i64, long long)
COMPARE_ROWS(compare_rows_u8, u8)
COMPARE_ROWS(compare_rows_u16, u16)
COMPARE_ROWS(compare_rows_u32, u32)
COMPARE_ROWS(compare_rows_u64, u64)
