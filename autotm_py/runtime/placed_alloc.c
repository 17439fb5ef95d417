/* The placed allocator: torch's CUDA allocator, replaced (CUDAPluggableAllocator), so that a
 * kernel's output lands at its planned arena offset instead of being copied there.
 *
 * Every allocation torch makes comes here with its exact size. Before a kernel without an
 * `out=` form runs, the executor names the slots its outputs should occupy
 * (`autotm_expect`); the first allocation of exactly a slot's size gets that slot's address.
 * Everything else (kernel workspaces, outputs with no slot, the arena itself) comes from one
 * region reserved once with cudaMalloc and handed out first-fit (512-byte aligned, freed
 * extents merged), with no CUDA call per allocation, so a CUDA graph can be captured through
 * it. Frees inside the arena are the executor's business and ignored here (a slot handed out
 * and freed is offered again until `autotm_expect_clear`). When the region has no room, the
 * request goes to cudaMalloc and is counted as overflow (the run reports it).
 *
 * Single-threaded by design: the executor allocates from one thread. No CUDA header is needed:
 * libcudart is looked up at run time (torch has loaded it), and `autotm_use_region` lets the
 * tests drive the bookkeeping over made-up addresses on a machine without a GPU.
 * Python side: autotm_py/runtime/placed.py. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ALIGN 512
#define MAX_EXPECTED 16
#define MAX_FREE 65536
#define ARMED 1
#define HANDED 2

typedef void *stream_t;

static uintptr_t region_lo, region_hi;
static size_t region_request;          /* bytes to reserve at first use; 0: free - margin */
static uintptr_t free_lo[MAX_FREE], free_hi[MAX_FREE]; /* free extents, sorted, disjoint */
static int n_free;
static uintptr_t fence;                /* region allocations only at or above it (0: off) */
static size_t graph_extent;            /* the region's extent a fenced graph may write */
static uintptr_t arena_lo, arena_hi;   /* the executor's arena, allocated from the region */
static uintptr_t exp_ptr[MAX_EXPECTED];
static size_t exp_size[MAX_EXPECTED];
static int exp_state[MAX_EXPECTED];
static int n_exp;
/* stats: bytes in use, their peak, the peak of the highest byte used (the region's extent a
 * run needed), allocations served at planned addresses, and overflow to cudaMalloc */
static size_t in_use, peak_in_use, peak_top, overflow_bytes;
static long placed_count, overflow_count;

static int (*cuda_malloc)(void **, size_t);
static int (*cuda_free)(void *);
static int (*cuda_mem_get_info)(size_t *, size_t *);

static size_t round_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static int load_cudart(void) {
  static const char *names[] = {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0",
                                "libcudart.so"};
  if (cuda_malloc) return 1;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *lib = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen(names[i], RTLD_NOW);
    if (!lib) continue;
    cuda_malloc = (int (*)(void **, size_t))dlsym(lib, "cudaMalloc");
    cuda_free = (int (*)(void *))dlsym(lib, "cudaFree");
    cuda_mem_get_info = (int (*)(size_t *, size_t *))dlsym(lib, "cudaMemGetInfo");
    if (cuda_malloc && cuda_free && cuda_mem_get_info) return 1;
    cuda_malloc = 0;
  }
  return 0;
}

static void set_region(uintptr_t lo, size_t size) {
  region_lo = lo;
  region_hi = lo + size;
  n_free = size > 0;
  free_lo[0] = lo;
  free_hi[0] = lo + size;
  in_use = peak_in_use = peak_top = graph_extent = 0;
  fence = arena_lo = arena_hi = 0;
}

/* The region, reserved at the first allocation (torch has made the CUDA context by then). */
static void reserve_region(void) {
  size_t free_b = 0, total_b = 0, size;
  void *p = 0;
  if (region_hi || !load_cudart()) return;
  if (cuda_mem_get_info(&free_b, &total_b) != 0) return;
  size = region_request ? region_request : (free_b > (1ull << 30) ? free_b - (1ull << 30) : 0);
  if (size > free_b) size = free_b;
  size = size / ALIGN * ALIGN;
  if (size && cuda_malloc(&p, size) == 0) set_region((uintptr_t)p, size);
}

static void note_top(void) {
  uintptr_t top = region_hi;
  if (n_free && free_hi[n_free - 1] == region_hi) top = free_lo[n_free - 1];
  if (top - region_lo > peak_top) peak_top = top - region_lo;
}

static void *take_from_region(size_t size) {
  for (int i = 0; i < n_free; i++) {
    uintptr_t lo = free_lo[i] < fence ? fence : free_lo[i];
    if (lo >= free_hi[i] || free_hi[i] - lo < size) continue;
    if (lo > free_lo[i]) { /* keep the part below the fence free */
      if (n_free == MAX_FREE) return 0;
      memmove(&free_lo[i + 1], &free_lo[i], (n_free - i) * sizeof *free_lo);
      memmove(&free_hi[i + 1], &free_hi[i], (n_free - i) * sizeof *free_hi);
      n_free++;
      free_hi[i] = lo;
      i++;
      free_lo[i] = lo;
    }
    free_lo[i] += size;
    if (free_lo[i] == free_hi[i]) {
      memmove(&free_lo[i], &free_lo[i + 1], (n_free - i - 1) * sizeof *free_lo);
      memmove(&free_hi[i], &free_hi[i + 1], (n_free - i - 1) * sizeof *free_hi);
      n_free--;
    }
    in_use += size;
    if (in_use > peak_in_use) peak_in_use = in_use;
    note_top();
    return (void *)lo;
  }
  return 0;
}

static void give_to_region(uintptr_t lo, size_t size) {
  uintptr_t hi = lo + size;
  int i = 0;
  while (i < n_free && free_lo[i] < lo) i++;
  int joins_prev = i > 0 && free_hi[i - 1] == lo;
  int joins_next = i < n_free && free_lo[i] == hi;
  in_use -= size;
  if (joins_prev && joins_next) {
    free_hi[i - 1] = free_hi[i];
    memmove(&free_lo[i], &free_lo[i + 1], (n_free - i - 1) * sizeof *free_lo);
    memmove(&free_hi[i], &free_hi[i + 1], (n_free - i - 1) * sizeof *free_hi);
    n_free--;
  } else if (joins_prev) {
    free_hi[i - 1] = hi;
  } else if (joins_next) {
    free_lo[i] = lo;
  } else if (n_free < MAX_FREE) {
    memmove(&free_lo[i + 1], &free_lo[i], (n_free - i) * sizeof *free_lo);
    memmove(&free_hi[i + 1], &free_hi[i], (n_free - i) * sizeof *free_hi);
    free_lo[i] = lo;
    free_hi[i] = hi;
    n_free++;
  } /* else: the extent is lost until the region is reset (65536 holes: not seen) */
}

void *autotm_alloc(size_t size, int device, stream_t stream) {
  (void)device;
  (void)stream;
  for (int i = 0; i < n_exp; i++) {
    if (exp_state[i] == ARMED && exp_size[i] == size) {
      exp_state[i] = HANDED;
      placed_count++;
      return (void *)exp_ptr[i];
    }
  }
  if (size == 0) size = 1; /* a distinct address for every live allocation */
  reserve_region();
  void *p = take_from_region(round_up(size));
  if (p) return p;
  if (load_cudart() && cuda_malloc(&p, size) == 0) {
    overflow_bytes += size;
    overflow_count++;
    return p;
  }
  return 0;
}

void autotm_free(void *ptr, size_t size, int device, stream_t stream) {
  uintptr_t p = (uintptr_t)ptr;
  (void)device;
  (void)stream;
  if (size == 0) size = 1;
  if (p >= arena_lo && p < arena_hi) {
    for (int i = 0; i < n_exp; i++)
      if (exp_ptr[i] == p && exp_state[i] == HANDED) exp_state[i] = ARMED;
    return; /* a slot: the arena's bytes stay the executor's */
  }
  if (p < arena_lo && p + size >= arena_hi) arena_lo = arena_hi = 0; /* the arena's own */
  if (p >= region_lo && p < region_hi) {
    give_to_region(p, round_up(size));
  } else if (cuda_free) {
    overflow_bytes -= size;
    cuda_free(ptr);
  }
}

/* ---- called from Python (ctypes) ---------------------------------------------------------- */
void autotm_request_region(size_t size) { region_request = size; }
void autotm_use_region(uintptr_t lo, size_t size) { set_region(lo, size); } /* tests */
void autotm_set_arena(uintptr_t lo, size_t size) { arena_lo = lo; arena_hi = lo + size; }

/* A slot to offer: inside the arena, whose start the caller keeps off the address of its own
 * allocation (torch keys allocations by address: two live ones must differ). */
int autotm_expect(uintptr_t ptr, size_t size) {
  if (n_exp == MAX_EXPECTED || ptr < arena_lo || ptr + size > arena_hi)
    return 0;
  exp_ptr[n_exp] = ptr;
  exp_size[n_exp] = size;
  exp_state[n_exp++] = ARMED;
  return 1;
}

void autotm_expect_clear(void) { n_exp = 0; }

/* After a capture: region allocations from now on only above the highest byte used since the
 * last reset of the peaks (the capture's scratch, which its replays write, stays untouched),
 * and that extent stays in the reported peak while the fence is up; 0 lifts it. */
void autotm_fence(int on) {
  note_top();
  graph_extent = on ? peak_top : 0;
  fence = on ? region_lo + peak_top : 0;
}

void autotm_reset_peaks(void) {
  peak_in_use = in_use;
  peak_top = graph_extent;
  note_top();
}

/* region bytes, in use, peak in use, peak extent, overflow bytes, overflow allocations,
 * allocations at planned addresses, region start */
void autotm_stats(uint64_t out[8]) {
  out[0] = region_hi - region_lo;
  out[1] = in_use;
  out[2] = peak_in_use;
  out[3] = peak_top;
  out[4] = overflow_bytes;
  out[5] = (uint64_t)overflow_count;
  out[6] = (uint64_t)placed_count;
  out[7] = region_lo;
}
