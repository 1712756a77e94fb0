// Masking is structural: data that an output cannot see never changes it.
// Every layout below is run twice, clean and with garbage (NaN, ±Inf, ±1e30)
// written into positions hidden from some outputs; every output whose inputs
// avoid the garbage must be bitwise identical in the two runs — forward out and
// lse, dQ, dK, dV and the per-query dτ — for float storage in float (the
// default) and in double (Compute::float64), and for double storage.
//
// Which outputs depend on which inputs (MATH.md §3, §6): row i (out_i, lse_i)
// reads q_i and the keys/values of its range [lo_i, hi_i); its gradients dQ_i,
// dτ_i also read dO_i. dK_j, dV_j read k_j, v_j and everything the rows that see
// key j read. An output is "clean" when none of that holds garbage.
#include <catch2/catch.hpp>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;

namespace {

/// Which inputs hold garbage: query rows (q and dO) and key rows (k and v),
/// per (batch, head, position).
struct Poison {
  std::vector<char> query, key;  // [B, Hq, Lq], [B, Hk, Lk]
};

template <class T>
struct Outputs {
  std::vector<T> o, lse, dq, dk, dv, dtau;
};

template <class T>
Outputs<T> run(Case<T> c, bool fa) {
  auto f = c.forward_args();
  f.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_forward(continuum::cpu, f);
  auto g = c.backward_args();
  g.compute = fa ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_backward(continuum::cpu, g);
  return {c.o.contiguous(), c.lse, c.dq.contiguous(), c.dk.contiguous(), c.dv.contiguous(), c.dtau};
}

template <class T>
void write_garbage(Case<T>& c, const Poison& p, T garbage) {
  for (index_t b = 0; b < c.B; ++b) {
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i)
        if (p.query[std::size_t((b * c.Hq + h) * c.Lq + i)]) {
          for (index_t d = 0; d < c.D; ++d) c.q.at(b, h, i, d) = garbage;
          for (index_t d = 0; d < c.dv_dim(); ++d) c.dout.at(b, h, i, d) = garbage;
        }
    for (index_t h = 0; h < c.Hk; ++h)
      for (index_t j = 0; j < c.Lk; ++j)
        if (p.key[std::size_t((b * c.Hk + h) * c.Lk + j)]) {
          for (index_t d = 0; d < c.D; ++d) c.k.at(b, h, j, d) = garbage;
          for (index_t d = 0; d < c.dv_dim(); ++d) c.v.at(b, h, j, d) = garbage;
        }
  }
}

/// Compares the clean elements of two runs bitwise; returns how many rows /
/// keys were clean (the test requires some of each kind).
template <class T>
void compare_clean(const Case<T>& c, const Poison& p, const Outputs<T>& ref, const Outputs<T>& got,
                   index_t& clean_rows, index_t& clean_keys) {
  const index_t group = c.Hq / c.Hk, Dv = c.dv_dim();
  const continuum::Visibility vis = c.visibility();
  std::vector<char> row_dirty(std::size_t(c.B * c.Hq * c.Lq)), fwd_dirty(row_dirty.size());
  std::vector<char> key_dirty(std::size_t(c.B * c.Hk * c.Lk));
  for (std::size_t k = 0; k < key_dirty.size(); ++k) key_dirty[k] = p.key[k];
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i) {
        const std::size_t r = std::size_t((b * c.Hq + h) * c.Lq + i);
        const auto rg = continuum::visible_range(vis, b, i, c.Lq, c.Lk);
        bool sees = false;
        for (index_t j = rg.lo; j < rg.hi; ++j) sees = sees || p.key[std::size_t((b * c.Hk + h / group) * c.Lk + j)];
        // An empty row reads nothing (out 0, lse -inf, zero gradients).
        fwd_dirty[r] = !rg.empty() && (sees || p.query[r]);
        row_dirty[r] = fwd_dirty[r];
      }
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.Hq; ++h)
      for (index_t i = 0; i < c.Lq; ++i) {
        const std::size_t r = std::size_t((b * c.Hq + h) * c.Lq + i);
        if (!row_dirty[r]) continue;
        const auto rg = continuum::visible_range(vis, b, i, c.Lq, c.Lk);
        for (index_t j = rg.lo; j < rg.hi; ++j) key_dirty[std::size_t((b * c.Hk + h / group) * c.Lk + j)] = 1;
      }
  auto same = [](const T* a, const T* b, index_t n) { return std::memcmp(a, b, std::size_t(n) * sizeof(T)) == 0; };
  clean_rows = clean_keys = 0;
  for (std::size_t r = 0; r < row_dirty.size(); ++r) {
    if (row_dirty[r]) continue;
    ++clean_rows;
    INFO("row " << r);
    CHECK(same(&ref.o[r * Dv], &got.o[r * Dv], Dv));
    CHECK(same(&ref.lse[r], &got.lse[r], 1));
    CHECK(same(&ref.dq[r * c.D], &got.dq[r * c.D], c.D));
    CHECK(same(&ref.dtau[r], &got.dtau[r], 1));
  }
  for (std::size_t k = 0; k < key_dirty.size(); ++k) {
    if (key_dirty[k]) continue;
    ++clean_keys;
    INFO("key " << k);
    CHECK(same(&ref.dk[k * c.D], &got.dk[k * c.D], c.D));
    CHECK(same(&ref.dv[k * Dv], &got.dv[k * Dv], Dv));
  }
}

/// Layouts: 0 causal (keys from position t = kBc + 6 on are garbage: hidden
/// from the rows before t, whose keys span two of the forward's key tiles), 1
/// causal sliding window of 5 with garbage queries, dO and keys from t on (keys
/// well before t stay clean), 2 GQA (4 query heads, 2 KV heads) causal with Lq
/// < Lk, 3 explicit ranges with padding (per batch item a length n_b: rows ≥ n_b
/// are empty padded queries with garbage q and dO, keys ≥ n_b padded keys with
/// garbage), 4 KV cache (3 new queries over a cache of kBc + 72 slots of which
/// kBc + 3 are filled: the unused slots, in the forward's second key tile, hold
/// garbage), 5 non-causal window (left, right) = (3, 2) with garbage queries, dO
/// and keys from t on. (kBc: the forward's key tile, 512 keys.)
template <class T>
void setup(Case<T>& c, Poison& p, int layout) {
  constexpr index_t kBc = continuum::cpu_detail::tiled::kBc;
  c.B = 1;
  c.Hq = c.Hk = 2;
  c.Lq = c.Lk = kBc + 12;
  c.D = 8;
  c.Dv = 6;
  c.tau = T(0.3);
  c.threads = 2;
  c.tshape = continuum::TemperatureShape::per_query;
  index_t t = kBc + 6;
  switch (layout) {
    case 0: c.vis.causal = true; break;
    case 1: c.vis = visibility_code(4); break;
    case 2:
      c.Hq = 4;
      c.Lq = 100;
      c.Lk = 150;
      c.vis.causal = true;
      t = 100;
      break;
    case 3:
      c.B = 2;
      for (index_t b = 0; b < c.B; ++b) {
        const index_t n = b == 0 ? 100 : 131;
        std::mt19937_64 rng(77 + std::uint64_t(b));
        for (index_t i = 0; i < c.Lq; ++i) {
          const index_t lo = i < n ? index_t(rng() % std::uint64_t(n)) : 0;
          const index_t hi = i < n ? lo + 1 + index_t(rng() % std::uint64_t(n - lo)) : 0;
          c.range_lo.push_back(lo);
          c.range_hi.push_back(hi);
        }
      }
      break;
    case 5:
      c.vis.window_left = 3;
      c.vis.window_right = 2;
      break;
    case 4:
      c.Lq = 3;
      c.Lk = kBc + 72;
      t = kBc + 3;  // filled slots
      for (index_t i = 0; i < c.Lq; ++i) {
        c.range_lo.push_back(0);
        c.range_hi.push_back(kBc + 1 + i);
      }
      break;
  }
  c.alloc();
  auto rng = rng_for(9000 + std::uint64_t(layout));
  c.fill_uniform(rng);
  random_taus(c, rng, 0.2, 1.0);
  p.query.assign(std::size_t(c.B * c.Hq * c.Lq), 0);
  p.key.assign(std::size_t(c.B * c.Hk * c.Lk), 0);
  for (index_t b = 0; b < c.B; ++b) {
    const index_t n = layout == 3 ? (b == 0 ? 100 : 131) : t;
    for (index_t h = 0; h < c.Hk; ++h)
      for (index_t j = n; j < c.Lk; ++j) p.key[std::size_t((b * c.Hk + h) * c.Lk + j)] = 1;
    if (layout == 1 || layout == 3 || layout == 5)
      for (index_t h = 0; h < c.Hq; ++h)
        for (index_t i = n; i < c.Lq; ++i) p.query[std::size_t((b * c.Hq + h) * c.Lq + i)] = 1;
  }
}

}  // namespace

TEMPLATE_TEST_CASE("masking is structural: hidden garbage changes no visible output bit", "[operator][masking]",
                   float, double) {
  using T = TestType;
  const int layout = GENERATE(0, 1, 2, 3, 4, 5);
  const int kernel = GENERATE(0, 1);
  const bool fa = GENERATE(true, false);
  Case<T> c;
  Poison p;
  setup(c, p, layout);
  c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  const Outputs<T> ref = run(c, fa);
  const T inf = std::numeric_limits<T>::infinity();
  for (T garbage : {std::numeric_limits<T>::quiet_NaN(), inf, -inf, T(1e30), T(-1e30)}) {
    Case<T> d = c;
    write_garbage(d, p, garbage);
    const Outputs<T> got = run(d, fa);
    index_t rows = 0, keys = 0;
    INFO(type_name<T>() << " layout " << layout << " kernel " << kernel << " float_arithmetic " << fa
                        << " garbage " << garbage);
    compare_clean(c, p, ref, got, rows, keys);
    CHECK(rows > 0);
    if (layout != 0 && layout != 2) CHECK(keys > 0);  // causal: every key is seen by a dirty row
  }
}
