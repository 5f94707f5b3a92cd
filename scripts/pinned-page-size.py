# Whether the page size of pinned memory (and of the source) changes the
# host's copy rate into it, alone and with the copy engine reading another
# pinned region meanwhile, or the transfers' rate.
# Needs CuPy and NumPy. Usage: python3 scripts/pinned-page-size.py
import ctypes, mmap, time
from concurrent.futures import ThreadPoolExecutor
import numpy as np
import cupy as cp
rt = cp.cuda.runtime
GB = 1 << 30
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
cp.zeros(1).sum()

def region(huge):
    m = mmap.mmap(-1, GB + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    aligned = (base + (2 << 20) - 1) & ~((2 << 20) - 1)
    libc.madvise(aligned, GB, MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8, count=GB, offset=aligned - base).view(np.int32)
    a[:] = 1
    return m, a

def anon_huge_kb():
    for line in open("/proc/meminfo"):
        if line.startswith("AnonHugePages"): return line.strip()

pool = ThreadPoolExecutor(16)
keep = []
src4k = region(False); keep.append(src4k); s4k = src4k[1]; s4k[:] = np.arange(s4k.size, dtype=np.int32)
srcth = region(True); keep.append(srcth); sth = srcth[1]; sth[:] = s4k
print(anon_huge_kb())
pinned = cp.cuda.alloc_pinned_memory(GB)
dst_alloc = np.frombuffer(pinned, dtype=np.int32, count=GB // 4); dst_alloc[:] = 0
m, dst_th = region(True); keep.append(m); rt.hostRegister(dst_th.ctypes.data, GB, 0)
m, dst_4k = region(False); keep.append(m); rt.hostRegister(dst_4k.ctypes.data, GB, 0)
print(anon_huge_kb())
d = cp.empty(GB // 4, dtype=np.int32)
def run(src, dst, with_dma):
    n = src.size; per = n // 16
    st = cp.cuda.Stream(non_blocking=True)
    t0 = time.perf_counter()
    futs = [pool.submit(np.copyto, dst[i*per:(i+1)*per], src[i*per:(i+1)*per]) for i in range(16)]
    if with_dma:
        # the engine reads the other half of a second pinned region meanwhile
        rt.memcpyAsync(d.data.ptr, dst_alloc.ctypes.data if dst is not dst_alloc else dst_th.ctypes.data, GB, 1, st.ptr)
    for f in futs: f.result()
    t1 = time.perf_counter()
    st.synchronize()
    return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3
for name, src in (("src 4k", s4k), ("src THP", sth)):
    for dname, dst in (("cudaHostAlloc", dst_alloc), ("registered THP", dst_th), ("registered 4k", dst_4k)):
        for dma in (False, True):
            r = [run(src, dst, dma) for _ in range(5)]
            c = sorted(x[0] for x in r)[2]; tot = sorted(x[1] for x in r)[2]
            print(f"{name} -> {dname}{' + 1GiB DMA' if dma else ''}: copy {c:.1f} ms ({GB/c/1e6:.1f} GB/s), all {tot:.1f} ms")
def transfer_ms(dst_ptr, src_ptr, kind, stream):
    """Median of 5 transfers of 1 GiB (kind 1: up, 2: down)."""
    ts = []
    for _ in range(5):
        stream.synchronize(); t0 = time.perf_counter()
        rt.memcpyAsync(dst_ptr, src_ptr, GB, kind, stream.ptr); stream.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[2]
st = cp.cuda.Stream(non_blocking=True)
for dname, dst in (("cudaHostAlloc", dst_alloc), ("registered THP", dst_th), ("registered 4k", dst_4k)):
    print(f"DMA up from {dname}: {transfer_ms(d.data.ptr, dst.ctypes.data, 1, st):.1f} ms")
    print(f"DMA down into {dname}: {transfer_ms(dst.ctypes.data, d.data.ptr, 2, st):.1f} ms")
