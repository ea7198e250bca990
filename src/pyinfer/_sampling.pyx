# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Sampling hot loops over one logits row: penalties, partial selection of the best
candidates, exp sums, the top-k / top-p / min-p cut and the draw."""

from libc.float cimport FLT_MAX
from libc.math cimport INFINITY, isfinite, log
from libc.stdint cimport int32_t, uint32_t
from libc.string cimport memmove, memset

# A token within this many nats (relative: 1e-6) of a top-p or min-p cut-off is kept, so
# that a cut-off placed exactly on a probability does not depend on float rounding.
cdef double CUT_TOL = 1e-6

# ---- exp

cdef union f32bits:
    float f
    uint32_t u


cdef inline float _exp_neg(float x) noexcept nogil:
    """exp(x) for x <= 0 (relative error < 1e-7; x < -87 gives about 1.6e-38).

    Cephes' expf polynomial, branch-free so that loops over it vectorize: libm's expf is
    about six times slower here because it is not inlined.
    """
    cdef float LOG2E = 1.44269504088896341
    cdef float SHIFT = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer
    cdef float LN2_HI = 0.693359375
    cdef float LN2_LO = -2.12194440e-4
    cdef float t, r, p
    cdef f32bits scale
    cdef f32bits v
    # Clamp to -87 (below it 2^n leaves the normal range) on the bits: a float compare
    # would keep GCC from vectorizing the loop unless -fno-trapping-math. x <= 0, so the
    # magnitude alone decides; -inf becomes -87 too.
    v.f = x
    v.u = (v.u & 0x80000000u) | min(v.u & 0x7FFFFFFFu, <uint32_t>0x42AE0000u)  # 87.0f
    x = v.f
    t = x * LOG2E + SHIFT
    t = t - SHIFT  # n = round(x / ln 2)
    r = x - t * LN2_HI
    r = r - t * LN2_LO  # r = x - n ln 2, in [-ln2/2, ln2/2]
    p = <float>1.9875691500e-4
    p = p * r + <float>1.3981999507e-3
    p = p * r + <float>8.3334519073e-3
    p = p * r + <float>4.1665795894e-2
    p = p * r + <float>1.6666665459e-1
    p = p * r + <float>5.0000001201e-1
    p = p * r * r + r + <float>1.0
    scale.u = <uint32_t>(<int32_t>t + 127) << 23  # 2^n
    return p * scale.f


cdef double _exp_sum(const float* x, Py_ssize_t n, float m, float inv_t, float* out) noexcept nogil:
    """out[i] = exp((x[i] - m) * inv_t); returns the sum."""
    cdef Py_ssize_t i, j
    cdef double acc[8]
    cdef double z = 0.0
    for i in range(n):
        # No test for -inf here: it would keep the loop from vectorizing, and a value
        # below e^-87 counts as ~1.6e-38, nothing next to the best token's 1.
        out[i] = _exp_neg((x[i] - m) * inv_t)
    # 8 partial sums in double: one accumulator is latency-bound, and float ones lose
    # about 1e-5 over 49k terms
    for j in range(8):
        acc[j] = 0.0
    for i in range(0, n - 7, 8):
        for j in range(8):
            acc[j] += out[i + j]
    for i in range(n - n % 8, n):
        z += out[i]
    for j in range(8):
        z += acc[j]
    return z


def exp_sum(const float[::1] x, float m, float inv_t, float[::1] scratch) -> float:
    """sum(exp((x - m) * inv_t)) over the row, in one vectorized pass (scratch: len(x))."""
    cdef double z
    if x.shape[0] == 0:
        raise ValueError("the row is empty")
    if scratch.shape[0] < x.shape[0]:
        raise ValueError("scratch buffer is shorter than the row")
    with nogil:
        z = _exp_sum(&x[0], x.shape[0], m, inv_t, &scratch[0])
    return z


# ---- partial selection

cdef inline bint _better(const float* x, int32_t a, int32_t b) noexcept nogil:
    # Larger value first; equal values: the lower id first, as argmax picks it.
    return x[a] > x[b] or (x[a] == x[b] and a < b)


cdef void _sift_down(const float* x, int32_t* heap, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    # Min-heap on _better: the root is the worst entry kept.
    cdef Py_ssize_t child
    cdef int32_t item = heap[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _better(x, heap[child], heap[child + 1]):
            child += 1
        if not _better(x, item, heap[child]):
            break
        heap[i] = heap[child]
        i = child
    heap[i] = item


cdef Py_ssize_t _select(const float* x, Py_ssize_t n, Py_ssize_t k, float floor,
                        int32_t* out) noexcept nogil:
    """The ids of the (up to) k largest values >= floor, best first, into out[:k].

    A bounded heap: O(n) compares plus O(k log k) per replacement, and most values fail
    the first compare against the worst value kept. -inf and NaN never qualify.
    """
    cdef Py_ssize_t i, j, size = 0
    cdef float v, worst = floor
    cdef int32_t tmp
    if k <= 0:
        return 0
    if floor < -FLT_MAX:
        floor = -FLT_MAX
    for i in range(n):
        v = x[i]
        if not (v >= floor):
            continue
        if size < k:
            # sift up
            j = size
            size += 1
            while j > 0 and _better(x, out[(j - 1) // 2], <int32_t>i):
                out[j] = out[(j - 1) // 2]
                j = (j - 1) // 2
            out[j] = <int32_t>i
            if size == k:
                worst = x[out[0]]
        elif v > worst:  # equal to the worst: this id is higher, so not better
            out[0] = <int32_t>i
            _sift_down(x, out, size, 0)
            worst = x[out[0]]
    # heap sort: move the worst to the end each time, leaving the best first
    for j in range(size - 1, 0, -1):
        tmp = out[0]
        out[0] = out[j]
        out[j] = tmp
        _sift_down(x, out, j, 0)
    return size


cdef void _sort_ids(const float* x, int32_t* ids, Py_ssize_t c) noexcept nogil:
    """Sort ids[:c] best first (larger value, then lower id): heap sort."""
    cdef Py_ssize_t j
    cdef int32_t tmp
    for j in range(c // 2 - 1, -1, -1):
        _sift_down(x, ids, c, j)
    for j in range(c - 1, 0, -1):
        tmp = ids[0]
        ids[0] = ids[j]
        ids[j] = tmp
        _sift_down(x, ids, j, 0)


def top_ids(const float[::1] x, Py_ssize_t k, int32_t[::1] out) -> int:
    """The ids of the k largest finite-or-+inf values of x into out[:k], best first (ties:
    lower id first); returns how many there were (fewer when x has -inf entries)."""
    cdef Py_ssize_t c
    if x.shape[0] == 0 or k < 1:
        raise ValueError(f"top_ids needs a non-empty row and k >= 1, got {x.shape[0]} values and k = {k}")
    k = min(k, x.shape[0])
    if out.shape[0] < k:
        raise ValueError("output buffer is shorter than k")
    with nogil:
        c = _select(&x[0], x.shape[0], k, -INFINITY, &out[0])
    return c


# ---- penalties and bias

cdef inline double _clamp_float(double v) noexcept nogil:
    """v within float32's finite range (v not NaN)."""
    return FLT_MAX if v > FLT_MAX else -FLT_MAX if v < -FLT_MAX else v


def apply_penalties(float[::1] x, list window, int32_t[::1] counts, double repeat,
                    double presence, double frequency) -> None:
    """llama.cpp's repetition penalties, in place, for each distinct token in `window`.

    A positive logit is divided by `repeat` and a negative one multiplied by it (so the
    token becomes less likely when repeat > 1), then count * frequency + presence is
    subtracted. The arithmetic is in double and a finite logit stays finite: a result past
    float32's range becomes its largest finite value of that sign, so any finite penalty
    (1e-300, -1e308) is defined instead of turning the row into infinities. `counts` is
    zeroed scratch of len(x); it is left zeroed.
    """
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t tok
    cdef int32_t c
    cdef double v
    if counts.shape[0] < n:
        raise ValueError("counts is shorter than the row")
    for t in window:
        tok = t
        if tok < 0 or tok >= n:
            raise ValueError(f"token id {tok} in the history is out of range for a vocabulary of {n}")
    for t in window:
        counts[<Py_ssize_t>t] += 1
    for t in window:
        tok = t
        c = counts[tok]
        if c == 0:  # already applied for an earlier occurrence
            continue
        counts[tok] = 0
        v = x[tok]
        if not isfinite(v):
            continue  # an inf or NaN logit is the model's to report, not the penalties'
        v = _clamp_float(v * repeat if v <= 0 else v / repeat)
        x[tok] = <float>_clamp_float(v - (<double>c * frequency + presence))


def apply_bias(float[::1] x, const int32_t[::1] ids, const float[::1] bias) -> None:
    """x[ids] += bias."""
    cdef Py_ssize_t i
    if bias.shape[0] != ids.shape[0]:
        raise ValueError(f"{ids.shape[0]} ids but {bias.shape[0]} biases")
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= x.shape[0]:
            raise ValueError(f"token id {ids[i]} is out of range for a vocabulary of {x.shape[0]}")
    for i in range(ids.shape[0]):
        x[ids[i]] += bias[i]


# ---- the cut and the draw

cdef Py_ssize_t _cut(const float* x, const int32_t* idx, const float* w, Py_ssize_t c,
                     float m, float inv_t, double target, double min_p_log) noexcept nogil:
    """How many of the c sorted candidates survive top-p (the shortest prefix whose mass
    reaches `target`; target < 0: off) and min-p (log-prob ratio to the best >=
    min_p_log). At least one."""
    cdef Py_ssize_t j, keep = c
    cdef double cum = 0.0
    if target >= 0:
        for j in range(c):
            cum += w[j]
            if cum >= target:
                keep = j + 1
                break
    if min_p_log > -INFINITY:
        for j in range(keep):
            if <double>((x[idx[j]] - m) * inv_t) < min_p_log:
                keep = j
                break
    return keep if keep > 0 else 1


def filter_candidates(const float[::1] x, float m, double temperature, Py_ssize_t top_k,
                      double top_p, double min_p, int32_t[::1] idx, float[::1] w,
                      float[::1] scratch) -> int:
    """Apply temperature, then top-k, top-p and min-p to the row x (whose maximum is m).

    Fills idx[:c] with the surviving ids and w[:c] with their unnormalized probabilities
    exp((x - m) / temperature), best first when a sort was needed (top-k or top-p), in id
    order otherwise; returns c >= 1. Buffers idx, w, scratch: len(x) each.
    """
    cdef Py_ssize_t n = x.shape[0]
    cdef Py_ssize_t c
    if n == 0:
        raise ValueError("the row is empty")
    if idx.shape[0] < n or w.shape[0] < n or scratch.shape[0] < n:
        raise ValueError("work buffers are shorter than the row")
    if not temperature > 0:
        raise ValueError("temperature must be > 0 here (0 is greedy: take the argmax)")
    with nogil:
        c = _filter(&x[0], n, m, temperature, top_k, top_p, min_p, &idx[0], &w[0], &scratch[0])
    return c


cdef Py_ssize_t _filter(const float* x, Py_ssize_t n, float m, double temperature,
                        Py_ssize_t top_k, double top_p, double min_p, int32_t* idx, float* w,
                        float* scratch) noexcept nogil:
    cdef Py_ssize_t c, j, keep
    # 1 / temperature held to float32's range: past it (temperature below about 2.9e-39) the
    # product with the best logit's 0 was NaN; FLT_MAX still sends every lower logit's weight
    # to 0, the limit the temperature tends to, and ties keep equal weights.
    cdef double inv = 1.0 / temperature
    cdef float inv_t = <float>(inv if inv < FLT_MAX else FLT_MAX)
    cdef double z, target, min_p_log = -INFINITY
    cdef float floor = -FLT_MAX
    cdef float d
    if min_p > 0:
        min_p_log = log(min_p) - CUT_TOL
        # A looser floor in logit space only prunes the search; _cut decides exactly.
        floor = <float>(m + (min_p_log - 1e-3) * temperature)
    if 0 < top_k < n:
        # top-p is relative to the mass of the k kept tokens
        c = _select(x, n, top_k, -FLT_MAX, idx)
        z = 0.0
        for j in range(c):
            w[j] = _exp_neg((x[idx[j]] - m) * inv_t)
            z += w[j]
        target = top_p * z * (1.0 - CUT_TOL) if top_p < 1.0 else -1.0
        return _cut(x, idx, w, c, m, inv_t, target, min_p_log)
    if top_p < 1.0:
        # The mass of the whole row, then the shortest sorted prefix that reaches top_p. The
        # nucleus is usually small: try the best 64 before the general method.
        z = _exp_sum(x, n, m, inv_t, scratch)
        target = top_p * z * (1.0 - CUT_TOL)
        c = _select(x, n, 64, floor, idx)
        for j in range(c):
            w[j] = scratch[idx[j]]
        keep = _cut(x, idx, w, c, m, inv_t, target, min_p_log)
        if keep < c or c < 64:
            return keep
        return _nucleus(x, n, m, inv_t, target, min_p_log, scratch, idx, w)
    if min_p > 0:
        # every token above the min-p cut, in id order; most fail the first compare
        c = 0
        for j in range(n):
            d = (x[j] - m) * inv_t
            if d >= min_p_log:
                idx[c] = <int32_t>j
                w[c] = _exp_neg(d)
                c += 1
        return c
    # the whole row, less banned tokens
    _exp_sum(x, n, m, inv_t, w)
    c = 0
    for j in range(n):
        if x[j] > -INFINITY:
            idx[c] = <int32_t>j
            w[c] = w[j]  # c <= j: in place
            c += 1
    return c


cdef enum:
    NBINS = 4096  # bins of 87/4096 = 0.02 nats

cdef Py_ssize_t _bin(float x, float m, float inv_t) noexcept nogil:
    cdef float f = (m - x) * inv_t * <float>(NBINS / 87.0)
    return <Py_ssize_t>f if f < NBINS - 1 else NBINS - 1


cdef Py_ssize_t _nucleus(const float* x, Py_ssize_t n, float m, float inv_t, double target,
                         double min_p_log, const float* e, int32_t* idx,
                         float* w) noexcept nogil:
    """top-p (then min-p) over the whole row without a full sort: bins of log-probability
    locate the bin where the cumulative mass reaches `target`; only that bin is sorted.
    e[i] = exp((x[i] - m) * inv_t). Fills idx/w (bins above in id order, then the sorted
    part of the crossing bin); returns the count."""
    cdef double mass[NBINS]
    cdef double cum = 0.0
    cdef Py_ssize_t i, j, b, cross, c = 0, cb = 0, keep
    memset(mass, 0, sizeof(mass))
    for i in range(n):
        mass[_bin(x[i], m, inv_t)] += e[i]
    cross = NBINS - 1
    for b in range(NBINS):
        if cum + mass[b] >= target:
            cross = b
            break
        cum += mass[b]
    # bins above the crossing one from the front of idx, the crossing bin from the back
    for i in range(n):
        b = _bin(x[i], m, inv_t)
        if b < cross:
            idx[c] = <int32_t>i
            c += 1
        elif b == cross:
            cb += 1
            idx[n - cb] = <int32_t>i
    _sort_ids(x, &idx[n - cb], cb)
    memmove(&idx[c], &idx[n - cb], cb * sizeof(int32_t))
    keep = c + cb
    for j in range(c, c + cb):
        cum += e[idx[j]]
        if cum >= target:
            keep = j + 1
            break
    # min-p and banned tokens, keeping the order
    c = 0
    for j in range(keep):
        i = idx[j]
        if <double>((x[i] - m) * inv_t) >= min_p_log and x[i] > -INFINITY:
            idx[c] = <int32_t>i
            w[c] = e[i]
            c += 1
    return c


def draw(const float[::1] w, Py_ssize_t c, double u) -> int:
    """The position j in [0, c) drawn with probability w[j] / sum(w[:c]), for u in [0, 1)."""
    cdef Py_ssize_t j
    cdef double z = 0.0, cum = 0.0, target
    if not 0 < c <= w.shape[0]:
        raise ValueError(f"c = {c} is not in [1, {w.shape[0]}]")
    for j in range(c):
        z += w[j]
    target = u * z
    for j in range(c):
        cum += w[j]
        if cum > target:
            return j
    # u * z rounded up to z: the last token with any weight
    for j in range(c - 1, -1, -1):
        if w[j] > 0:
            return j
    return 0
