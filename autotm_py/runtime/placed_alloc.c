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
 * Overflow and CUDA graphs: while the executor holds a graph (`autotm_hold_overflow`, from
 * before its capture until the graph is gone), overflow is allocated in CUDA's relaxed capture
 * mode (a capture in global mode forbids cudaMalloc, on every thread: autograd's device thread
 * allocates too) and no overflow block is cudaFree'd: the graph's replays may use its
 * addresses, and a cudaFree during a capture would end it. torch's caching allocator does the
 * same for its private pools. The frees wait until the hold is lifted. A failed cudaMalloc's
 * error is cleared: CUDA keeps it per thread, and torch's next kernel-launch check on that
 * thread would raise it as that kernel's.
 *
 * Scratch windows: a plan may give a kernel's scratch (its workspace, the outputs it allocates
 * beside its slots) a window of its own inside the arena, free of tensors while that kernel
 * runs. While the executor holds a window open (`autotm_window_open`), every allocation that
 * is not a slot comes first-fit from the window, and from the region only where the window has
 * no room; closing it (`autotm_window_close`) says how many of its allocations are still live,
 * which the executor treats as an error (their bytes belong to other tensors from then on).
 * Requests under WINDOW_MIN (and empty ones, which may outlive their kernel) skip the window.
 *
 * Single-threaded by design: the executor allocates from one thread. No CUDA header is needed:
 * libcudart is looked up at run time (torch has loaded it), and `autotm_use_region` lets the
 * tests drive the bookkeeping over made-up addresses on a machine without a GPU.
 * Python side: autotm_py/runtime/placed.py. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#define ALIGN 512
#define MAX_EXPECTED 16
/* Requests smaller than this skip the open window for the region: a window holds the
 * profiled scratch and little more (machine.WINDOW_SLACK_BYTES), so small temporaries, which
 * profiles do not count, are kept out of it rather than left to take a workspace's room. */
#define WINDOW_MIN (1u << 20)
#define MAX_FREE 65536
#define ARMED 1
#define HANDED 2

typedef void *stream_t;

/* free extents of a range, sorted, disjoint */
typedef struct {
  uintptr_t lo[MAX_FREE], hi[MAX_FREE];
  int n;
} extents_t;

static uintptr_t region_lo, region_hi;
static size_t region_request;          /* bytes to reserve at first use; 0: free - margin */
static extents_t region_free;
static uintptr_t win_lo, win_hi;       /* the open scratch window (win_hi 0: none) */
static extents_t win_free;
static long win_live;                  /* allocations from the open window not yet freed */
static long window_count;              /* allocations served from windows (since install) */
static size_t win_spilled, win_spill_max; /* what the open window's kernel got elsewhere */
/* who asked for the largest requests the region could not serve: the executor tags each
 * record before it runs (`autotm_tag`); MAX_MISSES (tag, bytes), largest first */
#define MAX_MISSES 8
static long current_tag = -1;
static long miss_tag[MAX_MISSES];
static size_t miss_size[MAX_MISSES];
static int n_miss;
/* AUTOTM_PLACED_TRACE=1: every request and free while a window is open, to stderr */
static int tracing = -1;

static void trace(const char *what, size_t size, uintptr_t p) {
  if (tracing < 0) {
    const char *on = getenv("AUTOTM_PLACED_TRACE");
    tracing = on && *on == '1';
  }
  if (tracing && win_hi)
    fprintf(stderr, "placed: record %ld %s %zu at window+%ld\n", current_tag, what, size,
            (long)(p - win_lo));
}

static void note_miss(size_t size) {
  int i = 0;
  for (; i < n_miss; i++)
    if (miss_tag[i] == current_tag) {
      if (size <= miss_size[i]) return;
      break; /* a larger request of the same tag replaces its entry */
    }
  if (i == n_miss) {
    if (n_miss < MAX_MISSES) n_miss++;
    else if (size <= miss_size[n_miss - 1]) return;
    i = n_miss - 1;
  }
  for (; i > 0 && miss_size[i - 1] < size; i--) {
    miss_tag[i] = miss_tag[i - 1];
    miss_size[i] = miss_size[i - 1];
  }
  miss_tag[i] = current_tag;
  miss_size[i] = size;
}
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
static int (*cuda_get_last_error)(void);
static int (*cuda_exchange_capture_mode)(int *);
#define CAPTURE_MODE_RELAXED 2 /* cudaStreamCaptureModeRelaxed */

/* overflow frees waiting for the hold on graphs to be lifted (`autotm_hold_overflow`) */
#define MAX_DEFERRED 65536
static int holding; /* graphs (and captures) that may use overflow blocks */
static void *deferred_ptr[MAX_DEFERRED];
static size_t deferred_size[MAX_DEFERRED];
static int n_deferred;

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
    cuda_get_last_error = (int (*)(void))dlsym(lib, "cudaGetLastError");
    cuda_exchange_capture_mode = (int (*)(int *))dlsym(lib, "cudaThreadExchangeStreamCaptureMode");
    if (cuda_malloc && cuda_free && cuda_mem_get_info) return 1;
    cuda_malloc = 0;
  }
  return 0;
}

static void reset_extents(extents_t *e, uintptr_t lo, size_t size) {
  e->n = size > 0;
  e->lo[0] = lo;
  e->hi[0] = lo + size;
}

static void set_region(uintptr_t lo, size_t size) {
  region_lo = lo;
  region_hi = lo + size;
  reset_extents(&region_free, lo, size);
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
  const extents_t *e = &region_free;
  if (e->n && e->hi[e->n - 1] == region_hi) top = e->lo[e->n - 1];
  if (top - region_lo > peak_top) peak_top = top - region_lo;
}

/* First fit at or above `floor` (the part of a free extent below it stays free). */
static uintptr_t take(extents_t *e, size_t size, uintptr_t floor) {
  for (int i = 0; i < e->n; i++) {
    uintptr_t lo = e->lo[i] < floor ? floor : e->lo[i];
    if (lo >= e->hi[i] || e->hi[i] - lo < size) continue;
    if (lo > e->lo[i]) { /* keep the part below the floor free */
      if (e->n == MAX_FREE) return 0;
      memmove(&e->lo[i + 1], &e->lo[i], (e->n - i) * sizeof *e->lo);
      memmove(&e->hi[i + 1], &e->hi[i], (e->n - i) * sizeof *e->hi);
      e->n++;
      e->hi[i] = lo;
      i++;
      e->lo[i] = lo;
    }
    e->lo[i] += size;
    if (e->lo[i] == e->hi[i]) {
      memmove(&e->lo[i], &e->lo[i + 1], (e->n - i - 1) * sizeof *e->lo);
      memmove(&e->hi[i], &e->hi[i + 1], (e->n - i - 1) * sizeof *e->hi);
      e->n--;
    }
    return lo;
  }
  return 0;
}

static void give(extents_t *e, uintptr_t lo, size_t size) {
  uintptr_t hi = lo + size;
  int i = 0;
  while (i < e->n && e->lo[i] < lo) i++;
  int joins_prev = i > 0 && e->hi[i - 1] == lo;
  int joins_next = i < e->n && e->lo[i] == hi;
  if (joins_prev && joins_next) {
    e->hi[i - 1] = e->hi[i];
    memmove(&e->lo[i], &e->lo[i + 1], (e->n - i - 1) * sizeof *e->lo);
    memmove(&e->hi[i], &e->hi[i + 1], (e->n - i - 1) * sizeof *e->hi);
    e->n--;
  } else if (joins_prev) {
    e->hi[i - 1] = hi;
  } else if (joins_next) {
    e->lo[i] = lo;
  } else if (e->n < MAX_FREE) {
    memmove(&e->lo[i + 1], &e->lo[i], (e->n - i) * sizeof *e->lo);
    memmove(&e->hi[i + 1], &e->hi[i], (e->n - i) * sizeof *e->hi);
    e->lo[i] = lo;
    e->hi[i] = hi;
    e->n++;
  } /* else: the extent is lost until the range is reset (65536 holes: not seen) */
}

static void *take_from_region(size_t size) {
  uintptr_t p = take(&region_free, size, fence);
  if (!p) return 0;
  in_use += size;
  if (in_use > peak_in_use) peak_in_use = in_use;
  note_top();
  return (void *)p;
}

static void give_to_region(uintptr_t lo, size_t size) {
  in_use -= size;
  give(&region_free, lo, size);
}

/* cudaMalloc for a request beyond the region: in relaxed capture mode while graphs are held
 * (a capture may be under way, here or on another thread), its error cleared if it fails. */
static int overflow_malloc(void **p, size_t size) {
  int mode = CAPTURE_MODE_RELAXED, ok;
  int relax = holding && cuda_exchange_capture_mode;
  if (relax) cuda_exchange_capture_mode(&mode);
  ok = cuda_malloc(p, size) == 0;
  if (relax) cuda_exchange_capture_mode(&mode);
  if (!ok && cuda_get_last_error) cuda_get_last_error();
  return ok;
}

static void overflow_free(void *ptr, size_t size) {
  if (!holding) {
    overflow_bytes -= size;
    cuda_free(ptr);
  } else if (n_deferred < MAX_DEFERRED) {
    deferred_ptr[n_deferred] = ptr;
    deferred_size[n_deferred++] = size;
  } /* else: beyond MAX_DEFERRED the block stays allocated (counted as overflow) */
}

void *autotm_alloc(size_t size, int device, stream_t stream) {
  (void)device;
  (void)stream;
  for (int i = 0; i < n_exp; i++) {
    if (exp_state[i] == ARMED && exp_size[i] == size) {
      exp_state[i] = HANDED;
      placed_count++;
      trace("slot", size, exp_ptr[i]);
      return (void *)exp_ptr[i];
    }
  }
  if (win_hi && size >= WINDOW_MIN) {
    size_t rounded = round_up(size);
    uintptr_t w = take(&win_free, rounded, 0);
    if (w) {
      win_live++;
      window_count++;
      trace("window", size, w);
      return (void *)w;
    }
    win_spilled += rounded;
    if (rounded > win_spill_max) win_spill_max = rounded;
  }
  if (size == 0) size = 1; /* a distinct address for every live allocation */
  reserve_region();
  void *p = take_from_region(round_up(size));
  trace(p ? "region" : "beyond", size, (uintptr_t)p);
  if (p) return p;
  note_miss(size);
  if (load_cudart() && overflow_malloc(&p, size)) {
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
  trace("free", size, p);
  if (p >= win_lo && p < win_hi) {
    give(&win_free, p, round_up(size));
    win_live--;
    return;
  }
  if (p >= arena_lo && p < arena_hi) {
    for (int i = 0; i < n_exp; i++)
      if (exp_ptr[i] == p && exp_state[i] == HANDED) exp_state[i] = ARMED;
    return; /* a slot: the arena's bytes stay the executor's */
  }
  if (p < arena_lo && p + size >= arena_hi) arena_lo = arena_hi = 0; /* the arena's own */
  if (p >= region_lo && p < region_hi) {
    give_to_region(p, round_up(size));
  } else if (cuda_free) {
    overflow_free(ptr, size);
  }
}

/* ---- called from Python (ctypes) ---------------------------------------------------------- */
void autotm_tag(long tag) { current_tag = tag; }

/* The largest requests that overflowed the region, with their tags; returns how many (and
 * forgets them). */
int autotm_misses(int64_t tags[MAX_MISSES], uint64_t sizes[MAX_MISSES]) {
  int n = n_miss;
  for (int i = 0; i < n; i++) {
    tags[i] = miss_tag[i];
    sizes[i] = miss_size[i];
  }
  n_miss = 0;
  return n;
}

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

/* The scratch window of the kernel about to run: [lo, lo + size), inside the arena. */
int autotm_window_open(uintptr_t lo, size_t size) {
  if (win_hi || lo < arena_lo || lo + size > arena_hi || !size) return 0;
  win_lo = lo;
  win_hi = lo + size;
  reset_extents(&win_free, lo, size);
  win_live = 0;
  win_spilled = win_spill_max = 0;
  return 1;
}

/* Close the open window; returns how many of its allocations are still live (0 when all
 * its kernel allocated there was freed with the kernel). `spilled`: the bytes its kernel
 * asked for that the window could not serve (they came from the region) and the largest such
 * request. */
long autotm_window_close(uint64_t spilled[2]) {
  long live = win_live;
  spilled[0] = win_spilled;
  spilled[1] = win_spill_max;
  win_lo = win_hi = 0;
  win_live = 0;
  return live;
}

/* After a capture: region allocations from now on only above the highest byte used since the
 * last reset of the peaks (the capture's scratch, which its replays write, stays untouched),
 * and that extent stays in the reported peak while the fence is up; 0 lifts it. */
void autotm_fence(int on) {
  note_top();
  graph_extent = on ? peak_top : 0;
  fence = on ? region_lo + peak_top : 0;
}

/* Hold (1) overflow blocks for a CUDA graph about to be captured, or lift that graph's hold
 * (0) when it is gone: holds count, and when none is left the frees that waited happen (a
 * graph released during the next one's capture frees nothing then). Returns how many frees
 * wait (after the call). */
int autotm_hold_overflow(int on) {
  holding += on ? 1 : (holding > 0 ? -1 : 0);
  if (!holding) {
    for (int i = 0; i < n_deferred; i++) {
      overflow_bytes -= deferred_size[i];
      cuda_free(deferred_ptr[i]);
    }
    n_deferred = 0;
  }
  return n_deferred;
}

/* Tests on a machine without a GPU: overflow from the C heap, with a counter standing for the
 * capture-mode switch, so that the bookkeeping of `autotm_hold_overflow` can be checked. */
static long mode_switches;
static int host_malloc(void **p, size_t size) { return (*p = malloc(size)) ? 0 : 2; }
static int host_free(void *p) { free(p); return 0; }
static int host_exchange(int *mode) { (void)mode; mode_switches++; return 0; }
static int host_mem_get_info(size_t *f, size_t *t) { *f = *t = 0; return 0; }
long autotm_use_host_overflow(void) {
  cuda_malloc = host_malloc;
  cuda_free = host_free;
  cuda_exchange_capture_mode = host_exchange;
  cuda_mem_get_info = host_mem_get_info;
  return mode_switches;
}

void autotm_reset_peaks(void) {
  peak_in_use = in_use;
  peak_top = graph_extent;
  note_top();
}

/* region bytes, in use, peak in use, peak extent, overflow bytes, overflow allocations,
 * allocations at planned addresses, region start, allocations served from windows */
void autotm_stats(uint64_t out[9]) {
  out[0] = region_hi - region_lo;
  out[1] = in_use;
  out[2] = peak_in_use;
  out[3] = peak_top;
  out[4] = overflow_bytes;
  out[5] = (uint64_t)overflow_count;
  out[6] = (uint64_t)placed_count;
  out[7] = region_lo;
  out[8] = (uint64_t)window_count;
}
