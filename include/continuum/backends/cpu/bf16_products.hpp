// backends/cpu/bf16_products.hpp — the bfloat16 products of the tiled kernels
// (tiled.hpp), for bfloat16 storage computed in float (MATH.md §10, "bfloat16
// products"), on the best unit the CPU has: Intel AMX-BF16 tiles
// (tdpbf16ps), else AVX512-BF16 vectors (vdpbf16ps) where they outrun float
// FMA (AMD Zen 4 / 5; avx512bf16_preferred: an Intel Xeon whose AMX is not
// offered to the process runs them only when cpu_dispatch is asked to,
// CONTINUUM_CPU_ISA; a header-only build there computes in float FMA):
//
//   S_raw = Q · K_tileᵀ     Q, K exactly their bfloat16 values; S = c_i ⊗ S_raw in float
//   O    += W̃ · V_tile      W̃ = the stencil weights rounded to bfloat16 (RNE)  (forward)
//   dP    = dO · V_tileᵀ    dO, V exactly their bfloat16 values                 (backward)
//
// Both units take the same packed operands (pack_keys, pack_values: "VNNI"
// pairs of bfloat16 in 32-bit words). Products of two bfloat16 numbers are
// exact in float, and both instructions sum them into float accumulators
// with round-to-nearest-even, flushing denormal inputs and outputs to zero
// whatever MXCSR says (and leaving its flags alone); the order of summation
// is the unit's own and fixed: tdpbf16ps's inside one instruction, vdpbf16ps
// pair by pair in depth order. Each output element depends only on its own
// row of A and column of B, so a row's bits never depend on which rows share
// its tile (a KV-cache decode step reproduces the full forward's row bit for
// bit, on each unit). Keys that no row of the task sees are packed as zeros,
// never loaded (structural masking, MATH.md §10).
//
// Compiled where the translation unit targets AVX-512 on x86-64 with GCC ≥ 11
// or Clang ≥ 12 (the avx512 object of cpu_dispatch; a user's -march=native
// build): the instructions are enabled per function (target attributes) and
// used only after the unit's check — avx512bf16_usable(): CPUID says
// AVX512-BF16; amx_usable() (Linux only): CPUID says AMX-TILE, AMX-BF16 and
// AVX512-BF16 (whose conversions both units use), and Linux granted this
// process the tile data state
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once).
// TileScope loads the tile configuration on the calling thread and gives the
// thread back the caller's configuration (or none) when the kernel is done;
// the caller's tile *data* is not kept (loading a configuration clears the
// tiles; no ABI keeps tile registers across a call). cpu_dispatch asks for the
// permission when it first chooses an instruction set (the amx check), so a
// process that links the dispatcher holds it from its first attention call.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include <algorithm>

#include "../../attention/params.hpp"
#include "isa.hpp"
#include "simd.hpp"
#include "storage16.hpp"

#if defined(CONTINUUM_CPU_SIMD) && defined(__AVX512F__) && defined(__x86_64__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#  define CONTINUUM_CPU_AVX512BF16 1
#  include <cpuid.h>
#  include <immintrin.h>
#  define CONTINUUM_DPBF16_FN __attribute__((target("avx512bf16,avx512bw"))) inline
#  if defined(__linux__)
#    define CONTINUUM_CPU_AMX 1
#    include <sys/syscall.h>
#    include <unistd.h>
#    define CONTINUUM_AMX_FN __attribute__((target("amx-tile,amx-bf16"))) inline
#  endif
#endif

namespace continuum {
inline namespace CONTINUUM_CPU_ISA_NAMESPACE {  // backends/cpu/isa.hpp
namespace cpu_detail {
namespace bf16 {

/// The unit that runs the products (none: float FMA on the widened values).
enum class Unit { none, avx512bf16, amx };

/// Rows and 32-bit columns of every tile; keys and depth go in steps of 32
/// bfloat16 (one 64-byte tile row), output columns in blocks of 16 floats.
inline constexpr index_t kRows = 16, kStep = 32, kCols = 16;

/// The bfloat16 bits of a float that is a bfloat16 value (storage widened to
/// float): exact.
inline std::uint16_t bits_exact(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return std::uint16_t(u >> 16);
}

/// The bits of a bfloat16 value as stored.
inline std::uint16_t bits_exact(bfloat16 x) { return Eigen::numext::bit_cast<std::uint16_t>(x); }

/// The bfloat16 bits of a finite float as AVX512-BF16's conversion
/// (vcvtneps2bf16) gives them: rounded to nearest even, a float denormal to
/// a zero of its sign (the units would read a bfloat16 denormal as 0 anyway).
inline std::uint16_t bits_rounded(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) return std::uint16_t((u >> 16) & 0x8000u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

/// Whether x is one of the float denormals that bfloat16 holds as a nonzero
/// denormal, 2^-134 < |x| < 2^-126, which the conversion (and the units, had
/// it kept them) turns into 0: the kernels add such an element's term apart.
/// (At or below 2^-134, x rounds to 0 in bfloat16 in any case.)
inline bool flushed(float x) {
  const float a = std::fabs(x);
  return a > 0x1p-134f && a < 0x1p-126f;
}

/// x rounded to bfloat16 as bits_rounded, as a float.
inline float round_bf16(float x) {
  std::uint32_t u = std::uint32_t(bits_rounded(x)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

/// The 32-bit word of two bfloat16 values held in floats (exactly): lo in
/// bits 0–15, hi in bits 16–31 — one "VNNI" pair of tdpbf16ps.
inline std::uint32_t pair_word(float lo, float hi) {
  std::uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  return (a >> 16) | (b & 0xffff0000u);
}

/// The same word of two bfloat16 values as stored.
inline std::uint32_t pair_word(bfloat16 lo, bfloat16 hi) {
  return std::uint32_t(Eigen::numext::bit_cast<std::uint16_t>(lo)) |
         std::uint32_t(Eigen::numext::bit_cast<std::uint16_t>(hi)) << 16;
}

/// K tile packed for S_raw = Q · Kᵀ (tdpbf16ps's "VNNI" B layout): key block
/// kb (16 keys) and depth pair t hold, at dst[(kb·Dp/2 + t)·32 + 2n + p],
/// key (16 kb + n), element 2t + p; zero for keys ≥ n_keys, for keys with
/// seen[key] == 0 and for elements ≥ D. Dp: D rounded up to kStep; n_blocks
/// blocks are written. Each key's pair words are formed along its row, then
/// 16 × 16 blocks of words are transposed in registers. S: float (holding
/// bfloat16 values) or bfloat16 (read as stored: a KV cache is not widened).
template <class S>
void pack_keys(const S* src, index_t lds, index_t n_keys, index_t D, index_t Dp, const char* seen,
                      index_t n_blocks, std::uint16_t* dst) {
  const index_t P = Dp / 2;  // pair words per key
  std::uint32_t* out = reinterpret_cast<std::uint32_t*>(dst);
  for (index_t kb = 0; kb < n_blocks; ++kb) {
    alignas(64) std::uint32_t words[kCols][kStep * 4];  // 16 keys × up to 128 pair words per pass
    for (index_t t0 = 0; t0 < P; t0 += kStep * 4) {
      const index_t tn = std::min<index_t>(kStep * 4, P - t0);
      for (index_t n = 0; n < kCols; ++n) {
        const index_t j = kb * kCols + n;
        std::uint32_t* w = words[n];
        if (j >= n_keys || !seen[j]) {
          std::fill(w, w + tn, 0u);
          continue;
        }
        const S* k = src + j * lds;
        const index_t full = std::max<index_t>(0, std::min(tn, D / 2 - t0));
        for (index_t t = 0; t < full; ++t) w[t] = pair_word(k[2 * (t0 + t)], k[2 * (t0 + t) + 1]);
        for (index_t t = full; t < tn; ++t) {
          const index_t d = 2 * (t0 + t);
          w[t] = pair_word(d < D ? k[d] : S(0), d + 1 < D ? k[d + 1] : S(0));
        }
      }
      // words[n][t] → out[(kb·P + t0 + t)·16 + n], 16 pair words at a time.
      for (index_t t = 0; t < tn; t += kCols) {
#if defined(CONTINUUM_CPU_SIMD) && defined(__AVX512F__)
        using F = Simd<float>;
        typename F::v r[kCols];
        for (index_t n = 0; n < kCols; ++n) r[n] = F::load(reinterpret_cast<const float*>(words[n] + t));
        transpose_block<float>(r);
        for (index_t i = 0; i < kCols; ++i)
          F::store(reinterpret_cast<float*>(out + (kb * P + t0 + t + i) * kCols), r[i]);
#else
        for (index_t i = 0; i < kCols; ++i)
          for (index_t n = 0; n < kCols; ++n) out[(kb * P + t0 + t + i) * kCols + n] = words[n][t + i];
#endif
      }
    }
  }
}

/// V tile packed for O += W̃ · V (VNNI B layout): output block nb (16
/// columns) and key pair t hold, at dst[(nb·KP + t)·32 + 2n + p], key 2t + p,
/// column 16 nb + n, with KP = n_steps·kStep/2; zero for keys ≥ n_keys, for
/// keys with seen[key] == 0 and for columns ≥ Dv. Dvp: Dv rounded up to kCols.
/// Each pair word joins two value rows column by column (no transpose). S as
/// for pack_keys.
template <class S>
void pack_values(const S* src, index_t lds, index_t n_keys, index_t Dv, index_t Dvp, const char* seen,
                        index_t n_steps, std::uint16_t* dst) {
  const index_t KP = n_steps * kStep / 2;
  std::uint32_t* out = reinterpret_cast<std::uint32_t*>(dst);
  for (index_t t = 0; t < KP; ++t) {
    const index_t j0 = 2 * t, j1 = 2 * t + 1;
    const bool s0 = j0 < n_keys && seen[j0], s1 = j1 < n_keys && seen[j1];
    const S* v0 = s0 ? src + j0 * lds : nullptr;
    const S* v1 = s1 ? src + j1 * lds : nullptr;
    for (index_t nb = 0; nb < Dvp / kCols; ++nb) {
      std::uint32_t* o = out + (nb * KP + t) * kCols;
      const index_t c0 = nb * kCols;
      if (c0 + kCols <= Dv && s0 && s1) {
#pragma omp simd
        for (index_t n = 0; n < kCols; ++n) o[n] = pair_word(v0[c0 + n], v1[c0 + n]);
      } else {
        for (index_t n = 0; n < kCols; ++n) {
          const bool in = c0 + n < Dv;
          o[n] = pair_word(s0 && in ? v0[c0 + n] : S(0), s1 && in ? v1[c0 + n] : S(0));
        }
      }
    }
  }
}

#if defined(CONTINUUM_CPU_AVX512BF16)
/// Whether this CPU has AVX512-BF16 (CPUID leaf 7, subleaf 1, EAX bit 5).
/// (The AVX-512 state itself: the kernels that ask run only where the
/// operating system saves it — cpu_dispatch's avx512 check, or -march.)
inline bool avx512bf16_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    return ((a >> 5) & 1u) != 0;
  }();
  return ok;
}

/// Whether the automatic choice of kernels (cpu_dispatch, or a header-only
/// build's own) puts the products on AVX512-BF16 vectors: where the CPU has
/// them and they outrun float FMA on the widened values — AMD's cores, whose
/// vdpbf16ps does twice float FMA's FLOPs (probes: Zen 4, 468 against 234
/// GFLOP/s on 2 threads). Intel's do half (a Xeon of family 6, model 207:
/// 173 against 349), and there the float kernels run bfloat16 calls 1.55–1.73×
/// faster (docs/PERFORMANCE.md, "AVX512-BF16 on an Intel Xeon without AMX"),
/// so an Intel CPU without AMX, and any other vendor's, computes bfloat16 in
/// float FMA. MATH.md §10, "Instruction sets".
inline bool avx512bf16_preferred() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!avx512bf16_usable() || !__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // "AuthenticAMD"
  }();
  return ok;
}
#endif

#if defined(CONTINUUM_CPU_AMX)

/// Whether this CPU and Linux let this process use AMX-BF16 tiles (asked once,
/// thread-safe; the permission is the process's). The AMX kernels round
/// their float intermediates with AVX512-BF16's conversions (round_pairs,
/// round_row), which every CPU with AMX-BF16 has.
inline bool amx_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile || !avx512bf16_usable()) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

/// The 64-byte tile configuration (palette 1): every tile 16 rows × 64 bytes.
struct TileConfig {
  std::uint8_t palette = 0, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "AMX tile configuration is 64 bytes");

/// Loads the kernels' tile configuration on this thread for its lifetime;
/// then restores the configuration the thread had (or releases the tiles).
class TileScope {
 public:
  // (The compiler sees ldtilecfg / sttilecfg touch only a few bytes of the
  // 64: the "memory" barriers keep it from dropping or caching the rest.)
  CONTINUUM_AMX_FN TileScope() {
    _tile_storeconfig(&saved_);
    __asm__ __volatile__("" ::: "memory");
    static const TileConfig config = [] {
      TileConfig c;
      c.palette = 1;
      for (int t = 0; t < 8; ++t) {
        c.colsb[t] = 64;
        c.rows[t] = std::uint8_t(kRows);
      }
      return c;
    }();
    __asm__ __volatile__("" ::: "memory");
    _tile_loadconfig(&config);
  }
  CONTINUUM_AMX_FN ~TileScope() {
    __asm__ __volatile__("" ::: "memory");
    if (saved_.palette != 0) _tile_loadconfig(&saved_);
    else _tile_release();
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  TileConfig saved_;
};

/// One step of the four accumulator tiles 0–3 against one A step: tile 4 ←
/// a (16 rows, sa bytes apart), then tiles 6 and 7 in turn ← the B steps b,
/// b + blk, b + 2 blk, b + 3 blk (16 rows of 64 bytes each), tile k += A · B_k.
CONTINUUM_AMX_FN void four_products(const std::uint16_t* a, long sa, const std::uint16_t* b, index_t blk) {
  _tile_loadd(4, a, sa);
  _tile_loadd(6, b, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b + blk, 64);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(6, b + 2 * blk, 64);
  _tile_dpbf16ps(2, 4, 6);
  _tile_loadd(7, b + 3 * blk, 64);
  _tile_dpbf16ps(3, 4, 7);
}

/// S_raw for G consecutive 16-row blocks of query rows (q: bfloat16 bits, row
/// stride ldq elements, Dp columns, zero beyond D) and the key blocks [kb0,
/// kb1) of a pack_keys tile: s[r·lds + 16 (kb − kb0) + n] = Σ_d q(r, d)
/// k(16 kb + n, d) in float, r < 16 G. One block (G = 1) takes four key blocks
/// a pass (its Q step loaded once for them); two to four take one key block a
/// pass, each K step loaded once for all G (a tile is 64 KiB, in L2: loaded
/// once per 64 rows instead of once per 16). Each score is the same sum in
/// either shape. Tiles: 0–3 accumulators, 4–5 the Q steps, 6–7 the K steps.
template <int G>
CONTINUUM_AMX_FN void tile_scores(const std::uint16_t* q, index_t ldq, index_t Dp, const std::uint16_t* kp, index_t kb0,
                                  index_t kb1, float* s, index_t lds) {
  static_assert(G >= 1 && G <= 4, "tile_scores: 1 to 4 row blocks");
  const index_t steps = Dp / kStep, blk = (Dp / 2) * 32;
  const long sq = long(ldq * 2), ss = long(lds * 4);
  // GCC's _tile_loadd declares no memory read: inlined (a -march with AMX),
  // its loads could move above the caller's stores to q and kp without this.
  __asm__ __volatile__("" ::: "memory");
  index_t kb = kb0;
  if constexpr (G == 1) {
    for (; kb + 4 <= kb1; kb += 4) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (index_t t = 0; t < steps; ++t) four_products(q + t * kStep, sq, kp + kb * blk + t * 16 * 32, blk);
      float* o = s + (kb - kb0) * kCols;
      _tile_stored(0, o, ss);
      _tile_stored(1, o + kCols, ss);
      _tile_stored(2, o + 2 * kCols, ss);
      _tile_stored(3, o + 3 * kCols, ss);
    }
  }
  for (; kb < kb1; ++kb) {
    _tile_zero(0);
    if constexpr (G > 1) _tile_zero(1);
    if constexpr (G > 2) _tile_zero(2);
    if constexpr (G > 3) _tile_zero(3);
    for (index_t t = 0; t < steps; ++t) {
      _tile_loadd(6, kp + kb * blk + t * 16 * 32, 64);
      _tile_loadd(4, q + t * kStep, sq);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (G > 1) {
        _tile_loadd(5, q + 16 * ldq + t * kStep, sq);
        _tile_dpbf16ps(1, 5, 6);
      }
      if constexpr (G > 2) {
        _tile_loadd(4, q + 32 * ldq + t * kStep, sq);
        _tile_dpbf16ps(2, 4, 6);
      }
      if constexpr (G > 3) {
        _tile_loadd(5, q + 48 * ldq + t * kStep, sq);
        _tile_dpbf16ps(3, 5, 6);
      }
    }
    float* o = s + (kb - kb0) * kCols;
    _tile_stored(0, o, ss);
    if constexpr (G > 1) _tile_stored(1, o + 16 * lds, ss);
    if constexpr (G > 2) _tile_stored(2, o + 32 * lds, ss);
    if constexpr (G > 3) _tile_stored(3, o + 48 * lds, ss);
  }
}

/// O += W̃ · V for G = 1 or 2 consecutive 16-row blocks over the key steps
/// [t0, t1): w holds W̃'s bfloat16 bits (row stride ldw elements, 32 key
/// columns a step, zero where a row sees no key), vp a pack_values tile of
/// n_steps ≥ t1 key steps (its layout), o the float accumulators (row stride
/// ldo, Dvp columns). One block takes four output blocks a pass; two take two
/// output blocks of both (2 × 2: each V step loaded once for 32 rows). Tiles:
/// 0–3 accumulators, 4–5 W̃, 6–7 V.
template <int G>
CONTINUUM_AMX_FN void tile_accumulate(const std::uint16_t* w, index_t ldw, index_t n_steps, index_t t0, index_t t1,
                                      const std::uint16_t* vp, index_t Dvp, float* o, index_t ldo) {
  static_assert(G == 1 || G == 2, "tile_accumulate: 1 or 2 row blocks");
  const index_t KP = n_steps * kStep / 2, blk = KP * 32;
  const long sw = long(ldw * 2), so = long(ldo * 4);
  __asm__ __volatile__("" ::: "memory");  // (as in tile_scores)
  index_t nb = 0;
  const index_t nblocks = Dvp / kCols;
  if constexpr (G == 1) {
    for (; nb + 4 <= nblocks; nb += 4) {
      float* c = o + nb * kCols;
      _tile_loadd(0, c, so);
      _tile_loadd(1, c + kCols, so);
      _tile_loadd(2, c + 2 * kCols, so);
      _tile_loadd(3, c + 3 * kCols, so);
      for (index_t t = t0; t < t1; ++t) four_products(w + t * kStep, sw, vp + nb * blk + t * 16 * 32, blk);
      _tile_stored(0, c, so);
      _tile_stored(1, c + kCols, so);
      _tile_stored(2, c + 2 * kCols, so);
      _tile_stored(3, c + 3 * kCols, so);
    }
  } else {
    const std::uint16_t* w1 = w + 16 * ldw;
    for (; nb + 2 <= nblocks; nb += 2) {
      float* c0 = o + nb * kCols;
      float* c1 = c0 + 16 * ldo;
      _tile_loadd(0, c0, so);
      _tile_loadd(1, c0 + kCols, so);
      _tile_loadd(2, c1, so);
      _tile_loadd(3, c1 + kCols, so);
      for (index_t t = t0; t < t1; ++t) {
        const std::uint16_t* b = vp + nb * blk + t * 16 * 32;
        _tile_loadd(4, w + t * kStep, sw);
        _tile_loadd(6, b, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + blk, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, w1 + t * kStep, sw);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, so);
      _tile_stored(1, c0 + kCols, so);
      _tile_stored(2, c1, so);
      _tile_stored(3, c1 + kCols, so);
    }
  }
  for (; nb < nblocks; ++nb) {
    float* c = o + nb * kCols;
    _tile_loadd(0, c, so);
    if constexpr (G > 1) _tile_loadd(2, c + 16 * ldo, so);
    for (index_t t = t0; t < t1; ++t) {
      _tile_loadd(6, vp + nb * blk + t * 16 * 32, 64);
      _tile_loadd(4, w + t * kStep, sw);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (G > 1) {
        _tile_loadd(5, w + 16 * ldw + t * kStep, sw);
        _tile_dpbf16ps(2, 5, 6);
      }
    }
    _tile_stored(0, c, so);
    if constexpr (G > 1) _tile_stored(2, c + 16 * ldo, so);
  }
}

#else
inline bool amx_usable() { return false; }
/// (A stand-in: never constructed where amx_usable() is false.)
struct TileScope {};
#endif  // CONTINUUM_CPU_AMX

#if defined(CONTINUUM_CPU_AVX512BF16)

/// C[r][j] += A(r) · B(j) on vdpbf16ps for MR rows and NB column blocks of 16:
/// a(r, t) is the pair word t of row r (A's words, row stride lda words), B(j,
/// t) the 16 pair words at b + j·ldb_blk + 16 t; acc holds the sums, in pair
/// order t = 0 … n_pairs − 1 from its start value.
template <int MR, int NB>
CONTINUUM_DPBF16_FN void dot_block(const std::uint32_t* a, index_t lda, const std::uint32_t* b, index_t ldb_blk,
                                   index_t n_pairs, __m512 (&acc)[MR][NB]) {
  for (index_t t = 0; t < n_pairs; ++t) {
    __m512bh bv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) bv[j] = (__m512bh)_mm512_loadu_si512(b + j * ldb_blk + 16 * t);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r * lda + t]));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
    }
  }
}

/// MR query rows against NB key blocks of 16 (P pair words per key):
/// s[r·lds + 16 j + n] = Σ_d q(r, d) k(16 j + n, d).
template <int MR, int NB>
CONTINUUM_DPBF16_FN void dot_scores_block(const std::uint32_t* q, index_t ldq, index_t P, const std::uint32_t* kp,
                                          float* s, index_t lds) {
  __m512 acc[MR][NB];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  dot_block<MR, NB>(q, ldq, kp, P * kCols, P, acc);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(s + r * lds + j * kCols, acc[r][j]);
}

/// O += W̃ · V on AVX512-BF16 for MR rows and NB output blocks (see
/// tile_accumulate): np key pairs, V's blocks blk words apart.
template <int MR, int NB>
CONTINUUM_DPBF16_FN void dot_accumulate_block(const std::uint32_t* w, index_t ldw, index_t blk, index_t np,
                                              const std::uint32_t* vp, float* o, index_t ldo) {
  __m512 acc[MR][NB];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_loadu_ps(o + r * ldo + j * kCols);
  dot_block<MR, NB>(w, ldw, vp, blk, np, acc);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_storeu_ps(o + r * ldo + j * kCols, acc[r][j]);
}

/// MR query rows (pair words q, row stride ldq words) against the key blocks
/// [kb0, kb1) of a pack_keys tile (P pair words per key): 4 blocks at a time.
template <int MR>
CONTINUUM_DPBF16_FN void dot_scores_rows(const std::uint32_t* q, index_t ldq, index_t P, const std::uint32_t* kp,
                                         index_t kb0, index_t kb1, float* s, index_t lds) {
  const index_t blk = P * kCols;
  index_t kb = kb0;
  for (; kb + 4 <= kb1; kb += 4) dot_scores_block<MR, 4>(q, ldq, P, kp + kb * blk, s + (kb - kb0) * kCols, lds);
  float* sb = s + (kb - kb0) * kCols;
  switch (kb1 - kb) {
    case 3: dot_scores_block<MR, 3>(q, ldq, P, kp + kb * blk, sb, lds); break;
    case 2: dot_scores_block<MR, 2>(q, ldq, P, kp + kb * blk, sb, lds); break;
    case 1: dot_scores_block<MR, 1>(q, ldq, P, kp + kb * blk, sb, lds); break;
    default: break;
  }
}

/// MR rows of W̃ (pair words w, row stride ldw words) times the first np key
/// pairs of a pack_values tile of KP key pairs, into nblocks output blocks:
/// 4 blocks at a time.
template <int MR>
CONTINUUM_DPBF16_FN void dot_accumulate_rows(const std::uint32_t* w, index_t ldw, index_t KP, index_t np,
                                             const std::uint32_t* vp, index_t nblocks, float* o, index_t ldo) {
  const index_t blk = KP * kCols;
  index_t nb = 0;
  for (; nb + 4 <= nblocks; nb += 4) dot_accumulate_block<MR, 4>(w, ldw, blk, np, vp + nb * blk, o + nb * kCols, ldo);
  float* ob = o + nb * kCols;
  switch (nblocks - nb) {
    case 3: dot_accumulate_block<MR, 3>(w, ldw, blk, np, vp + nb * blk, ob, ldo); break;
    case 2: dot_accumulate_block<MR, 2>(w, ldw, blk, np, vp + nb * blk, ob, ldo); break;
    case 1: dot_accumulate_block<MR, 1>(w, ldw, blk, np, vp + nb * blk, ob, ldo); break;
    default: break;
  }
}

/// tile_scores on AVX512-BF16 for the rows [0, rows) (the others of their
/// block are not computed): the same operands, each score the same sum of
/// the same exact products, in the vector unit's order.
CONTINUUM_DPBF16_FN void dot_scores(const std::uint16_t* q, index_t ldq, index_t Dp, const std::uint16_t* kp,
                                    index_t kb0, index_t kb1, float* s, index_t lds, index_t rows) {
  const index_t P = Dp / 2, ldq32 = ldq / 2;
  const auto* q32 = reinterpret_cast<const std::uint32_t*>(q);
  const auto* k32 = reinterpret_cast<const std::uint32_t*>(kp);
  index_t r = 0;
  for (; r + 4 <= rows; r += 4) dot_scores_rows<4>(q32 + r * ldq32, ldq32, P, k32, kb0, kb1, s + r * lds, lds);
  switch (rows - r) {
    case 3: dot_scores_rows<3>(q32 + r * ldq32, ldq32, P, k32, kb0, kb1, s + r * lds, lds); break;
    case 2: dot_scores_rows<2>(q32 + r * ldq32, ldq32, P, k32, kb0, kb1, s + r * lds, lds); break;
    case 1: dot_scores_rows<1>(q32 + r * ldq32, ldq32, P, k32, kb0, kb1, s + r * lds, lds); break;
    default: break;
  }
}

/// tile_accumulate on AVX512-BF16 for the rows [0, rows).
CONTINUUM_DPBF16_FN void dot_accumulate(const std::uint16_t* w, index_t ldw, index_t n_steps, index_t steps,
                                        const std::uint16_t* vp, index_t Dvp, float* o, index_t ldo, index_t rows) {
  const index_t KP = n_steps * kStep / 2, np = steps * kStep / 2, ldw32 = ldw / 2, nblocks = Dvp / kCols;
  const auto* w32 = reinterpret_cast<const std::uint32_t*>(w);
  const auto* v32 = reinterpret_cast<const std::uint32_t*>(vp);
  index_t r = 0;
  for (; r + 4 <= rows; r += 4)
    dot_accumulate_rows<4>(w32 + r * ldw32, ldw32, KP, np, v32, nblocks, o + r * ldo, ldo);
  switch (rows - r) {
    case 3: dot_accumulate_rows<3>(w32 + r * ldw32, ldw32, KP, np, v32, nblocks, o + r * ldo, ldo); break;
    case 2: dot_accumulate_rows<2>(w32 + r * ldw32, ldw32, KP, np, v32, nblocks, o + r * ldo, ldo); break;
    case 1: dot_accumulate_rows<1>(w32 + r * ldw32, ldw32, KP, np, v32, nblocks, o + r * ldo, ldo); break;
    default: break;
  }
}

/// The lanes of y that are flushed().
CONTINUUM_DPBF16_FN __mmask16 flushed_lanes(__m512 y) {
  // |y|'s bits a: 2^-134 < |y| < 2^-126 ⟺ 0x8001 ≤ a < 0x800000.
  const __m512i a = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(0x8001)), _mm512_set1_epi32(0x800000 - 0x8001));
}

/// Lanes [lo, hi) of the 16 columns from c, as a mask.
inline __mmask16 column_lanes(index_t c, index_t lo, index_t hi) {
  const index_t a = std::clamp<index_t>(lo - c, 0, 16), b = std::clamp<index_t>(hi - c, 0, 16);
  return b > a ? __mmask16(((1u << b) - 1u) & ~((1u << a) - 1u)) : __mmask16(0);
}

/// The pair words of two rows for the unit (A of dV and dK, tiled.hpp
/// transposed_bits): w[c] = half 0 | half 1 << 16, c in [0, n) (n a multiple of 16),
/// half k = bits_rounded(s_k · x_k[c]) for c in row k's [a_k, b_k), else the
/// bits of s_k · 0 (x_k is read only in its range; s_k finite and > 0 here:
/// 1 or c_i), on vcvtne2ps2bf16. Returns whether some s_k·x_k[c]
/// there is flushed().
CONTINUUM_DPBF16_FN bool round_pairs(const float* x0, float s0, index_t a0, index_t b0, const float* x1, float s1,
                                     index_t a1, index_t b1, index_t n, std::uint32_t* w) {
  // 16-bit lane 2c takes x0's value c (lane c of the conversion), 2c + 1 x1's (lane 16 + c).
  alignas(64) static constexpr std::uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6, 22, 7, 23, 8, 24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  const __m512 v0 = _mm512_set1_ps(s0), v1 = _mm512_set1_ps(s1);
  __mmask16 small = 0;
  // Whole vectors that both rows see, [u0, u1), take no masks.
  const index_t u0 = std::min((std::max(a0, a1) + 15) / 16 * 16, n), u1 = std::max(u0, std::min(b0, b1) / 16 * 16);
  for (index_t c = 0; c < n; c += 16) {
    const bool all = c >= u0 && c < u1;
    const __mmask16 m0 = all ? __mmask16(0xffff) : column_lanes(c, a0, b0);
    const __mmask16 m1 = all ? __mmask16(0xffff) : column_lanes(c, a1, b1);
    const __m512 y0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, x0 + c), v0);
    const __m512 y1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, x1 + c), v1);
    small |= flushed_lanes(y0) | flushed_lanes(y1);
    const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(y1, y0));
    _mm512_storeu_si512(w + c, _mm512_permutexvar_epi16(order, h));
  }
  return small != 0;
}

/// round_row's default weight: x itself.
struct SameLanes {
  __m512 operator()(__m512 x) const { return x; }
};

/// One row for the unit (A of O += W̃·V and of dQ): out[c] = bits_rounded(y[c])
/// for c in [lo, hi) other than `skip`, and 0 for the other c in [0, n) (n a
/// multiple of 32; x is read only there), on vcvtne2ps2bf16. y = x, or
/// weight(x) 16 lanes at a time (lanes outside [lo, hi) hold x = 0; their y
/// is left out, whatever it is): softmax's weights are formed here from the
/// scores. Where rho is not null, *rho += Σ (bfloat16 value − y[c]) over those
/// c, in float lanes and one tree sum; where sum is not null, *sum = Σ y[c]
/// over them, in two lanes' accumulators and one tree sum.
/// Returns whether some y[c] there is flushed() (with kFlushed; else false).
template <bool kFlushed = true, class F = SameLanes>
CONTINUUM_DPBF16_FN bool round_row(const float* x, index_t lo, index_t hi, index_t n, std::uint16_t* out,
                                   float* rho, F&& weight = {}, float* sum = nullptr, index_t skip = -1) {
  __mmask16 small = 0;
  __m512 diff = _mm512_setzero_ps(), acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  // Whole steps of 32 inside [lo, hi), [u0, u1), take no masks.
  const index_t u0 = std::min((lo + 31) / 32 * 32, n), u1 = std::max(u0, hi / 32 * 32);
  const index_t skip_step = skip >= 0 ? skip / 32 * 32 : -1;
  for (index_t c = 0; c < n; c += 32) {
    const bool all = c >= u0 && c < u1 && c != skip_step;
    if (!all && (c + 32 <= lo || c >= hi)) {  // no column of [lo, hi): zeros, no weights formed
      _mm512_storeu_si512(out + c, _mm512_setzero_si512());
      continue;
    }
    __mmask16 k0 = all ? __mmask16(0xffff) : column_lanes(c, lo, hi);
    __mmask16 k1 = all ? __mmask16(0xffff) : column_lanes(c + 16, lo, hi);
    if (c == skip_step) {
      if (skip < c + 16)
        k0 &= __mmask16(~(1u << (skip - c)));
      else
        k1 &= __mmask16(~(1u << (skip - c - 16)));
    }
    const __m512 y0 = weight(_mm512_maskz_loadu_ps(k0, x + c));
    const __m512 y1 = weight(_mm512_maskz_loadu_ps(k1, x + c + 16));
    if constexpr (kFlushed) small |= (flushed_lanes(y0) & k0) | (flushed_lanes(y1) & k1);
    // y0's 16 bits, then y1's; 0 outside the masks
    const __m512i h =
        reinterpret_cast<__m512i>(_mm512_maskz_cvtne2ps_pbh(__mmask32(k0) | __mmask32(k1) << 16, y1, y0));
    _mm512_storeu_si512(out + c, h);
    if (sum) {
      acc0 = _mm512_mask_add_ps(acc0, k0, acc0, y0);
      acc1 = _mm512_mask_add_ps(acc1, k1, acc1, y1);
    }
    if (rho) {
      const __m512 r0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
      const __m512 r1 =
          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
      diff = _mm512_add_ps(diff, _mm512_add_ps(_mm512_maskz_sub_ps(k0, r0, y0), _mm512_maskz_sub_ps(k1, r1, y1)));
    }
  }
  if (rho) *rho += _mm512_reduce_add_ps(diff);
  if (sum) *sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  return small != 0;
}

#else
inline bool avx512bf16_usable() { return false; }
inline bool avx512bf16_preferred() { return false; }
// Declared only: their callers run where kBf16 holds (tiled.hpp), i.e. here.
bool round_pairs(const float* x0, float s0, index_t a0, index_t b0, const float* x1, float s1, index_t a1,
                 index_t b1, index_t n, std::uint32_t* w);
struct SameLanes {};
template <bool kFlushed = true, class F = SameLanes>
bool round_row(const float* x, index_t lo, index_t hi, index_t n, std::uint16_t* out, float* rho, F&& weight = {},
               float* sum = nullptr, index_t skip = -1);
#endif  // CONTINUUM_CPU_AVX512BF16

/// S_raw for the query rows [0, rows) (see tile_scores; any number of 16-row
/// blocks) on `unit` (AMX computes whole blocks: q and s must hold rows rounded
/// up to 16; the rows past `rows` are any finite bits, and their results are
/// not to be read).
inline void scores(Unit unit, const std::uint16_t* q, index_t ldq, index_t Dp, const std::uint16_t* kp, index_t kb0,
                   index_t kb1, float* s, index_t lds, index_t rows) {
#if defined(CONTINUUM_CPU_AMX)
  if (unit == Unit::amx) {
    for (index_t g = 0; g < rows; g += 4 * kRows) {
      const std::uint16_t* qg = q + g * ldq;
      float* sg = s + g * lds;
      switch (std::min<index_t>((rows - g + kRows - 1) / kRows, 4)) {
        case 4: tile_scores<4>(qg, ldq, Dp, kp, kb0, kb1, sg, lds); break;
        case 3: tile_scores<3>(qg, ldq, Dp, kp, kb0, kb1, sg, lds); break;
        case 2: tile_scores<2>(qg, ldq, Dp, kp, kb0, kb1, sg, lds); break;
        default: tile_scores<1>(qg, ldq, Dp, kp, kb0, kb1, sg, lds); break;
      }
    }
    return;
  }
#endif
#if defined(CONTINUUM_CPU_AVX512BF16)
  if (unit == Unit::avx512bf16) return dot_scores(q, ldq, Dp, kp, kb0, kb1, s, lds, rows);
#endif
  (void)unit, (void)q, (void)ldq, (void)Dp, (void)kp, (void)kb0, (void)kb1, (void)s, (void)lds, (void)rows;
}

/// Key steps per pass of accumulate on AMX (256 keys): a pass's W̃ of two
/// row blocks and V of two output blocks (16 KiB each) stay in L1 for the
/// other row and output blocks.
inline constexpr index_t kAccumulateSteps = 8;

/// O += W̃ · V for the rows [0, rows) (see tile_accumulate; any number of
/// 16-row blocks) on `unit` (AMX computes whole blocks: W̃'s rows past `rows`
/// must be zeros, and o must hold them), over the first `steps` key steps of
/// a tile packed for n_steps (all of them by default). AMX takes the steps
/// kAccumulateSteps at a time, o stored and loaded between them (exactly: each
/// accumulator takes the same products in the same order).
inline void accumulate(Unit unit, const std::uint16_t* w, index_t ldw, index_t n_steps, const std::uint16_t* vp,
                       index_t Dvp, float* o, index_t ldo, index_t rows, index_t steps = -1) {
  if (steps < 0) steps = n_steps;
#if defined(CONTINUUM_CPU_AMX)
  if (unit == Unit::amx) {
    for (index_t t0 = 0; t0 < steps; t0 += kAccumulateSteps) {
      const index_t t1 = std::min(steps, t0 + kAccumulateSteps);
      index_t g = 0;
      for (; g + kRows < rows; g += 2 * kRows)
        tile_accumulate<2>(w + g * ldw, ldw, n_steps, t0, t1, vp, Dvp, o + g * ldo, ldo);
      if (g < rows) tile_accumulate<1>(w + g * ldw, ldw, n_steps, t0, t1, vp, Dvp, o + g * ldo, ldo);
    }
    return;
  }
#endif
#if defined(CONTINUUM_CPU_AVX512BF16)
  if (unit == Unit::avx512bf16) return dot_accumulate(w, ldw, n_steps, steps, vp, Dvp, o, ldo, rows);
#endif
  (void)unit, (void)w, (void)ldw, (void)n_steps, (void)vp, (void)Dvp, (void)o, (void)ldo, (void)rows, (void)steps;
}

/// Whether `unit` can run here (none always can).
inline bool usable(Unit unit) {
  return unit == Unit::none || (unit == Unit::amx && amx_usable()) ||
         (unit == Unit::avx512bf16 && avx512bf16_usable());
}

}  // namespace bf16
}  // namespace cpu_detail
}  // namespace CONTINUUM_CPU_ISA_NAMESPACE
}  // namespace continuum
