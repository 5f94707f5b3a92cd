# What pinning host memory in place (cudaHostRegister) costs, against
# copying it into pinned memory, and how fast the device reads registered
# memory: by one transfer, by many small ones, and by a kernel's loads.
# Needs CuPy and NumPy. Usage: python3 scripts/pin-in-place.py
import os, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import cupy as cp
rt = cp.cuda.runtime

def t(f, *a):
    s = time.perf_counter(); r = f(*a); return (time.perf_counter() - s) * 1e3, r

print("thp", open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip())
print("cpus", os.cpu_count())
cp.cuda.Device(0).use()
cp.zeros(1).sum()
GB = 1 << 30
def fresh(n):
    a = np.empty(n // 4, dtype=np.int32)
    a[:] = np.arange(a.size, dtype=np.int32)
    return a

def register_one_call(a):
    ms, _ = t(rt.hostRegister, a.ctypes.data, a.nbytes, 0)
    ms2, _ = t(rt.hostUnregister, a.ctypes.data)
    return ms, ms2

def register_on_threads(a, pool, pieces=16):
    piece = a.nbytes // pieces
    starts = [a.ctypes.data + i * piece for i in range(pieces)]
    ms, _ = t(lambda: list(pool.map(lambda p: rt.hostRegister(p, piece, 0), starts)))
    ms2, _ = t(lambda: list(pool.map(rt.hostUnregister, starts)))
    return ms, ms2

# 1 and 2. one 1 GiB region, in one call and as 16 pieces on 16 threads,
# with huge pages (NumPy's default for large arrays) and without
pool = ThreadPoolExecutor(16)
numpy_core = getattr(np, "_core", None) or np.core
for huge in (True, False):
    numpy_core.multiarray._set_madvise_hugepage(huge)
    pages = "2MiB pages" if huge else "4KiB pages"
    for rep in range(3):
        a = fresh(GB)
        ms, ms2 = register_one_call(a)
        print(f"{pages}: register 1GiB one call: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s), unregister {ms2:.1f} ms")
        ms, ms2 = register_on_threads(fresh(GB), pool)
        print(f"{pages}: register 1GiB 16 threads: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s), unregister {ms2:.1f} ms")
numpy_core.multiarray._set_madvise_hugepage(True)

# 3. many small regions (64 KiB each, page aligned) one thread
a = fresh(GB // 4)
n = a.nbytes // 65536
s = time.perf_counter()
for i in range(n): rt.hostRegister(a.ctypes.data + i * 65536, 65536, 0)
ms = (time.perf_counter() - s) * 1e3
s = time.perf_counter()
for i in range(n): rt.hostUnregister(a.ctypes.data + i * 65536)
ms2 = (time.perf_counter() - s) * 1e3
print(f"register {n} x 64KiB: {ms:.1f} ms ({ms*1e3/n:.1f} us each), unregister {ms2:.1f} ms")

# 4. copy 1 GiB into pinned memory on 16 threads (the present path's pass)
pinned = cp.cuda.alloc_pinned_memory(GB)
dst = np.frombuffer(pinned, dtype=np.int32, count=GB // 4)
src = fresh(GB)
chunk = src.size // 16
def cpy(i): np.copyto(dst[i*chunk:(i+1)*chunk], src[i*chunk:(i+1)*chunk])
for rep in range(3):
    s = time.perf_counter(); list(pool.map(cpy, range(16))); ms = (time.perf_counter() - s) * 1e3
    print(f"copy 1GiB into pinned 16 threads: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s)")

# 5. DMA from pinned, and from registered memory; zero-copy kernel read
d = cp.empty(GB // 4, dtype=np.int32)
st = cp.cuda.Stream(non_blocking=True)
def upload_ms(host_ptr):
    st.synchronize(); s = time.perf_counter()
    rt.memcpyAsync(d.data.ptr, host_ptr, GB, 1, st.ptr); st.synchronize()
    return (time.perf_counter() - s) * 1e3
for rep in range(3):
    ms = upload_ms(dst.ctypes.data)
    print(f"DMA 1GiB from pinned: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s)")
rt.hostRegister(src.ctypes.data, src.nbytes, 0)
for rep in range(3):
    ms = upload_ms(src.ctypes.data)
    print(f"DMA 1GiB from registered: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s)")
# DMA of many 32 KiB pieces from registered memory
for rep in range(2):
    st.synchronize(); s = time.perf_counter()
    n = 8192; step = 32768
    for i in range(n):
        rt.memcpyAsync(d.data.ptr + i*step, src.ctypes.data + i*step, step, 1, st.ptr)
    st.synchronize()
    ms = (time.perf_counter() - s) * 1e3
    print(f"DMA {n} x 32KiB from registered: {ms:.1f} ms ({n*step/ms/1e6:.1f} GB/s)")
k = cp.RawKernel(r'''
extern "C" __global__ void rd(const int4* __restrict__ p, long long n, int4* d) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  long long stride = (long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) { d[i] = p[i]; }
}''', 'rd')
for blocks in (264, 1056, 4224):
    for rep in range(2):
        cp.cuda.Device().synchronize(); s = time.perf_counter()
        k((blocks,), (256,), (np.uint64(src.ctypes.data), np.int64(GB // 16), d))
        cp.cuda.Device().synchronize()
        ms = (time.perf_counter() - s) * 1e3
        print(f"kernel reads 1GiB registered, {blocks} blocks: {ms:.1f} ms ({GB/ms/1e6:.1f} GB/s)")
ok = bool((d[:1000].get() == src[:1000]).all()) and bool((d[-1000:].get() == src[-1000:]).all())
print("kernel copy correct", ok)
rt.hostUnregister(src.ctypes.data)
