// The tiled CPU kernels (backends/cpu/tiled.hpp) against the 256-bit reference,
// on shapes that cross every tile boundary (forward key tiles of kBc = 512,
// query blocks of 256 with sub-blocks of 64; backward key tiles of 128 and
// query tiles of 64; kept
// small because the reference is 256-bit), for float
// storage in float (the default,
// "float_arithmetic" in the labels) and in double (Compute::float64), and for
// double. Tolerances: harness.hpp forward_tolerance /
// backward_tolerance (derivations there), unchanged.
#include <catch2/catch.hpp>

#include <cfenv>
#include <optional>

#include "operator/harness.hpp"

using namespace harness;
using continuum::index_t;
using continuum::cpu_detail::tiled::kBc;

namespace {

template <class T>
void run_forward(Case<T>& c, bool float_arithmetic) {
  auto a = c.forward_args();
  a.compute = float_arithmetic ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_forward(continuum::cpu, a);
}

template <class T>
void run_backward(Case<T>& c, bool float_arithmetic) {
  auto a = c.backward_args();
  a.compute = float_arithmetic ? continuum::Compute::automatic : continuum::Compute::float64;
  continuum::attention_backward(continuum::cpu, a);
}

template <class T>
void setup(Case<T>& c, int shape, int vis, int kernel, std::uint64_t salt) {
  // Shapes 1 and 4 cross the forward's key tiles (one boundary, two), where
  // the backward's row statistics come from too (shape 4 in the backward test).
  static const index_t L[][2] = {{70, 140}, {20, kBc + 5}, {261, 20}, {66, 130}, {1, 2 * kBc + 4}};
  c.B = 1;
  c.Hq = 2;
  c.Hk = shape == 3 ? 1 : 2;  // GQA once
  c.Lq = L[shape][0];
  c.Lk = L[shape][1];
  c.D = shape == 1 ? 17 : 8;
  c.Dv = shape == 2 ? 5 : c.D;
  c.vis = visibility_code(vis);
  c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  c.tau = T(0.3);
  c.threads = 2;
  c.alloc();
  auto rng = rng_for(salt);
  c.fill_uniform(rng);
}

/// The arithmetic a storage type's calls are checked in: float storage in
/// float (true) and in double (Compute::float64); double in double.
template <class T>
std::vector<bool> float_arithmetic_modes() {
  return std::is_same<T, float>::value ? std::vector<bool>{true, false} : std::vector<bool>{false};
}

/// A float call's outputs and gradients, to compare runs bit for bit.
struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
  explicit Outputs(const Case<float>& c)
      : o(c.o.contiguous()), lse(c.lse), dq(c.dq.contiguous()), dk(c.dk.contiguous()), dv(c.dv.contiguous()) {}
};

/// CHECKs that c's outputs and gradients are `first`'s, bit for bit.
void check_bitwise_same(const Case<float>& c, const Outputs& first) {
  const Outputs now(c);
  CHECK(bitwise_equal(now.o, first.o));
  CHECK(bitwise_equal(now.lse, first.lse));
  CHECK(bitwise_equal(now.dq, first.dq));
  CHECK(bitwise_equal(now.dk, first.dk));
  CHECK(bitwise_equal(now.dv, first.dv));
}

/// The source of the decode tests' rows: a float causal forward over kDecodeN
/// tokens, Hq query heads on Hk, head_dim D and Dv, a window of `window` keys
/// (0: none), τ = 0.3, data uniform in [-1, 1) from `salt`.
constexpr index_t kDecodeN = kBc + 44;
void setup_causal(Case<float>& c, index_t Hq, index_t Hk, index_t D, index_t Dv, index_t window, int kernel,
                  std::uint64_t salt) {
  c.Hq = Hq;
  c.Hk = Hk;
  c.Lq = c.Lk = kDecodeN;
  c.D = D;
  c.Dv = Dv;
  c.vis.causal = true;
  c.vis.window_left = window - 1;
  c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
  c.tau = 0.3f;
  c.alloc();
  auto rng = rng_for(salt);
  c.fill_uniform(rng);
}

}  // namespace

TEMPLATE_TEST_CASE("tiled forward matches the reference across tile boundaries", "[operator][tiled]", float,
                   double) {
  use_mp_precision();
  const int shape = GENERATE(0, 1, 2, 3, 4);
  const int vis = GENERATE(0, 1, 3, 5, 6);
  const int kernel = GENERATE(0, 1);
  Case<TestType> c;
  setup(c, shape, vis, kernel, std::uint64_t(100 * shape + 10 * vis + kernel));
  const auto p = c.template problem<mp>();
  const auto f = continuum::reference::forward(p);
  const double tol = forward_tolerance<TestType>(max_abs(f.scores), c.D);
  // float storage: in float, then in double, against the one reference.
  for (const bool fa : float_arithmetic_modes<TestType>()) {
    run_forward(c, fa);
    const Error out = compare(c.o.contiguous(), f.out);
    const Error lse = compare(c.lse, f.lse);
    INFO("shape " << shape << " vis " << vis << " kernel " << kernel << " float_arithmetic " << fa << " Lq=" << c.Lq
                  << " Lk=" << c.Lk << " tol " << tol << " out err " << out.max_abs << "/" << out.ref_scale
                  << " lse err " << lse.max_abs);
    record(std::string("tiled forward out ") + (fa ? "float_arithmetic " : "") + type_name<TestType>(), out.rel());
    CHECK(out.max_abs <= tol * std::max(out.ref_scale, 1e-300));
    CHECK(lse.max_abs <= tol * std::max(1.0, lse.ref_scale));
    CHECK(c.o.padding_untouched());
  }
}

TEMPLATE_TEST_CASE("tiled backward matches the reference across tile boundaries", "[operator][tiled]", float,
                   double) {
  use_mp_precision();
  const int shape = GENERATE(0, 3, 4);
  const int vis = GENERATE(0, 3);
  const int kernel = GENERATE(0, 1);
  Case<TestType> c;
  setup(c, shape, vis, kernel, std::uint64_t(7000 + 100 * shape + 10 * vis + kernel));
  const auto p = c.template problem<mp>();
  const auto g = continuum::reference::backward(p, c.template grad_out_ref<mp>());
  const auto f = continuum::reference::forward(p);
  const double tol = backward_tolerance<TestType>(max_abs(f.scores), c.D);
  for (const bool fa : float_arithmetic_modes<TestType>()) {
    run_forward(c, fa);
    run_backward(c, fa);
    const Error dq = compare(c.dq.contiguous(), g.grad_query);
    const Error dk = compare(c.dk.contiguous(), g.grad_key);
    const Error dv = compare(c.dv.contiguous(), g.grad_value);
    INFO("shape " << shape << " vis " << vis << " kernel " << kernel << " float_arithmetic " << fa << " tol " << tol
                  << " dQ " << dq.max_abs << "/" << dq.ref_scale << " dK " << dk.max_abs << "/" << dk.ref_scale
                  << " dV " << dv.max_abs << "/" << dv.ref_scale);
    const std::string t = std::string(fa ? "float_arithmetic " : "") + type_name<TestType>();
    record("tiled backward dQ " + t, dq.rel());
    record("tiled backward dK " + t, dk.rel());
    record("tiled backward dV " + t, dv.rel());
    CHECK(dq.max_abs <= tol * std::max(dq.ref_scale, 1e-300));
    CHECK(dk.max_abs <= tol * std::max(dk.ref_scale, 1e-300));
    CHECK(dv.max_abs <= tol * std::max(dv.ref_scale, 1e-300));
  }
}

// The backward's row statistics come from the forward (MATH.md §6), which
// holds back each key tile's last visible key until the next tile (its
// right-hand segment needs the next key's score) and gives a row's first and
// last keys their half-token cells. Rows whose range starts or ends at the
// keys around a forward key tile boundary (the first row starts at the
// previous tile's last key, so that key is both held back and the row's
// first) take each of these paths; then a band of rows over three query
// blocks, whose blocks read only some columns of a tile (the gradient sweep
// forms S and dP on those only). Against the 256-bit reference, within the
// backward tolerance.
TEMPLATE_TEST_CASE("tiled backward: ranges that start or end at a forward key tile boundary", "[operator][tiled]",
                   float, double) {
  use_mp_precision();
  const auto kernel = GENERATE(continuum::Kernel::continuum, continuum::Kernel::softmax);
  const index_t tile = kBc;
  Case<TestType> c;
  c.kernel = kernel;
  c.Lk = 2 * tile + 9;
  const index_t lo[] = {tile - 1, tile - 2, tile, tile + 1, 3, tile - 1, 2 * tile - 1, 0};
  const index_t hi[] = {c.Lk, tile + 40, 2 * tile, 2 * tile + 1, tile, tile + 1, c.Lk, 2 * tile - 1};
  c.range_lo.assign(std::begin(lo), std::end(lo));
  c.range_hi.assign(std::begin(hi), std::end(hi));
  for (index_t i = 0; i < 136; ++i) {  // the band: rows 8 … 143, keys [7i, 7i + 41)
    c.range_lo.push_back(7 * i);
    c.range_hi.push_back(7 * i + 41);
  }
  c.Lq = index_t(c.range_lo.size());
  c.D = 5;
  c.Dv = 3;
  c.tau = TestType(0.3);
  c.threads = 2;
  c.alloc();
  auto rng = rng_for(std::uint64_t(7900 + int(kernel)));
  c.fill_uniform(rng);
  check_backward<mp>(c, "statistics tile boundary");
}

TEST_CASE("tiled kernels: bitwise independent of the thread count, in the caller's rounding mode and "
          "flush-to-zero bits",
          "[operator][tiled]") {
  // Out, lse, dQ, dK and dV on 1, 2 and 3 threads, bit for bit, in the
  // default mode and in the others. OpenMP workers keep their own
  // floating-point modes; each parallel region runs them in the caller's
  // (tiled.hpp, CallerFloatModes), so results stay independent of the
  // thread count in any mode, and the caller's modes are
  // unchanged after a call. Two tasks (B · Hk = 2): on 2 threads the second
  // head runs on a worker. Without the adoption, head 1 differs in its last
  // bits under a directed rounding, and in denormal v under DAZ/FTZ.
  struct Restore {  // the test's thread back to round-to-nearest, even after a failed check
    int round = std::fegetround();
#if defined(CONTINUUM_CPU_MXCSR)
    unsigned csr = _mm_getcsr();
#endif
    ~Restore() {
      std::fesetround(round);
#if defined(CONTINUUM_CPU_MXCSR)
      _mm_setcsr(csr);
#endif
    }
  } restore;
  struct Mode {
    const char* name;
    int round;
    bool flush;  // MXCSR's flush-to-zero and denormals-are-zero bits (x86-64)
  };
  std::vector<Mode> modes = {{"to nearest", FE_TONEAREST, false}, {"toward zero", FE_TOWARDZERO, false},
                             {"upward", FE_UPWARD, false}, {"downward", FE_DOWNWARD, false}};
#if defined(CONTINUUM_CPU_MXCSR)
  modes.push_back({"nearest, FTZ+DAZ", FE_TONEAREST, true});
#endif
  for (const Mode& m : modes)
    for (bool fa : {false, true}) {
      std::optional<Outputs> first;
      for (int threads : {1, 2, 3}) {
        Case<float> c;
        setup(c, 0, 1, 0, 99);
        c.threads = threads;
        if (m.flush)  // values below float's normal range: DAZ reads them as 0
          c.v.for_each([](float& x) { x *= 1e-40f; });
        REQUIRE(std::fesetround(m.round) == 0);
#if defined(CONTINUUM_CPU_MXCSR)
        if (m.flush) _mm_setcsr(_mm_getcsr() | 0x8040u);
        const unsigned csr = _mm_getcsr() & 0xffc0u;
#endif
        run_forward(c, fa);
        run_backward(c, fa);
        INFO("mode " << m.name << ", threads " << threads << ", float_arithmetic " << fa);
        CHECK(std::fegetround() == m.round);
#if defined(CONTINUUM_CPU_MXCSR)
        CHECK((_mm_getcsr() & 0xffc0u) == csr);
#endif
        std::fesetround(restore.round);
#if defined(CONTINUUM_CPU_MXCSR)
        _mm_setcsr(restore.csr);
#endif
        if (threads == 1)
          first.emplace(c);
        else
          check_bitwise_same(c, *first);
      }
    }
}

TEST_CASE("tiled forward: a KV-cache decode step is the full causal row, bit for bit", "[operator][tiled]") {
  // Key tiles sit at absolute multiples of the tile width, so a decode step
  // (Lq = 1 over the first t + 1 cached keys) runs the same operations as row t
  // of the full causal forward. Rows on both sides of the query blocks' (256)
  // and the key tiles' (kBc) boundaries. The decode step's few rows (the
  // query heads of one KV head: 1, 3 and 6 here) take their scores from
  // few_row_scores, which transposes the
  // keys in registers; the full forward's from the tile GEMM: head_dim 3, 20
  // and 24 leave a tail past the last whole vector on every instruction set.
  struct Shape {
    index_t Hq, Hk, D;
  };
  const Shape shape = GENERATE(Shape{1, 1, 16}, Shape{3, 1, 20}, Shape{12, 2, 24}, Shape{2, 2, 3}, Shape{6, 1, 64});
  const index_t window = GENERATE(0, 50);
  const int kernel = GENERATE(0, 1);
  Case<float> full;
  setup_causal(full, shape.Hq, shape.Hk, shape.D, 16, window, kernel, 4242);
  const index_t n = kDecodeN;
  for_each_vector_isa<float>("the decode step", "", [&] {
    run_forward(full, true);
    const auto full_o = full.o.contiguous();
    for (index_t t : {index_t(0), index_t(1), index_t(2), index_t(200), index_t(255), index_t(256), index_t(257),
                      kBc - 1, kBc, kBc + 1, n - 1}) {
      continuum::ForwardArgs<float> a = full.forward_args();
      a.compute = continuum::Compute::automatic;
      a.query.data = full.q.view.row(0, 0, t);
      a.query.seq = 1;
      a.key.seq = t + 1;
      a.value.seq = t + 1;
      const index_t Hq = shape.Hq;
      std::vector<float> out(std::size_t(Hq * 16), std::numeric_limits<float>::quiet_NaN());
      std::vector<float> lse(std::size_t(Hq), std::numeric_limits<float>::quiet_NaN());
      a.out = continuum::TensorView<float>::bhsd(out.data(), 1, Hq, 1, 16);
      a.lse = lse.data();
      continuum::attention_forward(continuum::cpu, a);
      for (index_t h = 0; h < Hq; ++h) {
        INFO("heads " << Hq << " on " << shape.Hk << ", head_dim " << shape.D << ", window " << window << " kernel "
                      << kernel << " step " << t << " head " << h);
        CHECK(std::memcmp(out.data() + h * 16, full_o.data() + (h * n + t) * 16, 16 * sizeof(float)) == 0);
        CHECK(std::memcmp(&lse[std::size_t(h)], &full.lse[std::size_t(h * n + t)], sizeof(float)) == 0);
      }
    }
  });
}

TEST_CASE("tiled forward: a decode step measures its rows' eligibility where it reads its keys", "[operator][tiled]") {
  // A decode step's task (the few query rows of one head group) takes its
  // rows' key and value magnitudes from the key tiles it reads (measure_keys),
  // not from row_eligibility's pass over the KV cache; the rows' states must be
  // the same. In KV head 1, key 300's value row is 1e29 (a row that sees it
  // exceeds float's value bound: computed in double) and key 100's value holds
  // a NaN (a row that sees it is NaN). Each decode step must be the full causal
  // forward's row (tasks of 256 rows: row_eligibility's states), bit for bit;
  // a declined row must be the Compute::float64 call's row.
  const index_t window = GENERATE(0, 50);
  const int kernel = GENERATE(0, 1);
  const index_t n = kDecodeN, D = 16;
  Case<float> full;
  setup_causal(full, 6, 2, D, D, window, kernel, 4343);
  for (index_t d = 0; d < D; ++d) full.v.view.row(0, 1, 300)[d] = 1e29f;
  full.v.view.row(0, 1, 100)[3] = std::numeric_limits<float>::quiet_NaN();
  const auto sees = [&](index_t t, index_t key) { return key <= t && (window == 0 || t - key < window); };
  for_each_vector_isa<float>("the decode step", "", [&] {
    run_forward(full, true);
    const auto full_o = full.o.contiguous();
    for (index_t t : {index_t(99), index_t(100), index_t(149), index_t(150), index_t(299), index_t(300),
                      index_t(349), index_t(350), n - 1}) {
      std::vector<float> out[2], lse[2];
      for (int exact : {0, 1}) {
        continuum::ForwardArgs<float> a = full.forward_args();
        a.compute = exact ? continuum::Compute::float64 : continuum::Compute::automatic;
        a.query.data = full.q.view.row(0, 0, t);
        a.query.seq = 1;
        a.key.seq = a.value.seq = t + 1;
        out[exact].assign(std::size_t(6 * D), 0.f);
        lse[exact].assign(6, 0.f);
        a.out = continuum::TensorView<float>::bhsd(out[exact].data(), 1, 6, 1, D);
        a.lse = lse[exact].data();
        continuum::attention_forward(continuum::cpu, a);
      }
      for (index_t h = 0; h < 6; ++h) {
        INFO("window " << window << " kernel " << kernel << " step " << t << " head " << h);
        const float* o = out[0].data() + h * D;
        CHECK(std::memcmp(o, full_o.data() + (h * n + t) * D, std::size_t(D) * sizeof(float)) == 0);
        CHECK(std::memcmp(&lse[0][std::size_t(h)], &full.lse[std::size_t(h * n + t)], sizeof(float)) == 0);
        const bool nan_row = h >= 3 && sees(t, 100), declined = h >= 3 && !nan_row && sees(t, 300);
        CHECK(std::isnan(o[0]) == nan_row);
        CHECK(std::isnan(lse[0][std::size_t(h)]) == nan_row);
        if (declined) {
          CHECK(std::isfinite(o[0]));
          CHECK(std::memcmp(o, out[1].data() + h * D, std::size_t(D) * sizeof(float)) == 0);
        }
      }
    }
  });
}

TEST_CASE("tiled forward: a split decode step measures its rows' eligibility chunk by chunk", "[operator][tiled]") {
  // Over 2·kSplitKeys + 37 cached keys (three chunks, each a task that measures
  // what its rows see: measure_keys), batch 0's KV head 0 has a NaN in key 5's
  // value (its rows are NaN), its KV head 1 a value row of 1e29 at key 3000 in
  // the second chunk (its rows are computed in double: the Compute::float64
  // call's rows, bit for bit); batch 1 sees keys [100, Lk) and has a NaN in
  // key 50's value, which it cannot see: its rows are those of the same call
  // without that NaN. Bitwise the same on 1, 2 and 3 threads.
  using continuum::cpu_detail::tiled::kSplitKeys;
  const int kernel = GENERATE(0, 1);
  const index_t Lk = 2 * kSplitKeys + 37, Hq = 4, Dv = 8;
  auto make = [&](Case<float>& c, int threads, bool hidden_nan, bool exact) {
    c.B = 2;
    c.Hq = Hq;
    c.Hk = 2;
    c.Lq = 1;
    c.Lk = Lk;
    c.D = 16;
    c.Dv = Dv;
    c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
    c.tau = 0.3f;
    c.range_lo = {0, 100};
    c.range_hi = {Lk, Lk};
    c.threads = threads;
    c.compute = exact ? continuum::Compute::float64 : continuum::Compute::automatic;
    c.alloc();
    auto rng = rng_for(919);
    c.fill_uniform(rng);
    c.v.view.row(0, 0, 5)[2] = std::numeric_limits<float>::quiet_NaN();
    for (index_t d = 0; d < Dv; ++d) c.v.view.row(0, 1, 3000)[d] = 1e29f;
    if (hidden_nan) c.v.view.row(1, 0, 50)[0] = std::numeric_limits<float>::quiet_NaN();
    c.forward();
  };
  for_each_vector_isa<float>("the split decode step", "", [&] {
    Case<float> exact, clean;
    make(exact, 1, true, true);
    make(clean, 1, false, false);
    const auto exact_o = exact.o.contiguous(), clean_o = clean.o.contiguous();
    std::vector<float> o1, l1;
    for (int threads : {1, 2, 3}) {
      Case<float> c;
      make(c, threads, true, false);
      const auto o = c.o.contiguous();
      for (index_t h = 0; h < Hq; ++h) {
        INFO("kernel " << kernel << ", threads " << threads << ", head " << h);
        const std::size_t b0 = std::size_t(h * Dv), b1 = std::size_t((Hq + h) * Dv);
        if (h < 2) {  // batch 0, KV head 0: sees the NaN
          CHECK(std::isnan(o[b0]));
          CHECK(std::isnan(c.lse[std::size_t(h)]));
        } else {  // batch 0, KV head 1: declined to double
          CHECK(std::isfinite(o[b0]));
          CHECK(std::memcmp(&o[b0], &exact_o[b0], std::size_t(Dv) * sizeof(float)) == 0);
          CHECK(std::memcmp(&c.lse[std::size_t(h)], &exact.lse[std::size_t(h)], sizeof(float)) == 0);
        }
        CHECK(std::isfinite(o[b1]));  // batch 1: the hidden NaN changes nothing
        CHECK(std::memcmp(&o[b1], &clean_o[b1], std::size_t(Dv) * sizeof(float)) == 0);
        CHECK(std::memcmp(&c.lse[std::size_t(Hq + h)], &clean.lse[std::size_t(Hq + h)], sizeof(float)) == 0);
      }
      if (threads == 1) {
        o1 = o;
        l1 = c.lse;
      } else {
        CHECK(bitwise_equal(o, o1));
        CHECK(bitwise_equal(c.lse, l1));
      }
    }
  });
}

TEST_CASE("tiled forward: a block of a few rows measures each row's own keys", "[operator][tiled]") {
  // Four query rows of two query heads per KV head (a task of 8 rows: the
  // measuring path), causal over t0 + 4 keys, so that each row sees one key
  // more than the row before (measure_keys' per-row maxima). In KV head 1,
  // key t0 + 2's value row is 1e29 (rows 2 and 3 see it) and key t0 + 3's key
  // holds a NaN (row 3 sees it): row 3 is NaN, row 2 is computed in double
  // (the Compute::float64 call's row), rows 0 and 1 stay in float, beside the
  // declined rows' task-mates in the double pass. Every row must be the full
  // causal forward's (tasks of 256 rows: row_eligibility's states), bit for
  // bit. t0 = kBc − 2 puts the block's last two rows' ends in the next key tile.
  const int kernel = GENERATE(0, 1);
  const index_t t0 = GENERATE(index_t(100), kBc - 2);
  const index_t Hq = 4, n = kDecodeN, D = 16, rows = 4;
  Case<float> full;
  setup_causal(full, Hq, 2, D, D, 0, kernel, 5151);
  for (index_t d = 0; d < D; ++d) full.v.view.row(0, 1, t0 + 2)[d] = 1e29f;
  full.k.view.row(0, 1, t0 + 3)[5] = std::numeric_limits<float>::quiet_NaN();
  for_each_vector_isa<float>("the block of a few rows", "", [&] {
    run_forward(full, true);
    const auto full_o = full.o.contiguous();
    std::vector<float> out[2], lse[2];
    for (int exact : {0, 1}) {
      continuum::ForwardArgs<float> a = full.forward_args();
      a.compute = exact ? continuum::Compute::float64 : continuum::Compute::automatic;
      a.query.data = full.q.view.row(0, 0, t0);
      a.query.seq = rows;
      a.key.seq = a.value.seq = t0 + rows;
      out[exact].assign(std::size_t(Hq * rows * D), 0.f);
      lse[exact].assign(std::size_t(Hq * rows), 0.f);
      a.out = continuum::TensorView<float>::bhsd(out[exact].data(), 1, Hq, rows, D);
      a.lse = lse[exact].data();
      continuum::attention_forward(continuum::cpu, a);
    }
    for (index_t h = 0; h < Hq; ++h)
      for (index_t i = 0; i < rows; ++i) {
        INFO("kernel " << kernel << ", t0 " << t0 << ", head " << h << ", row " << i);
        const std::size_t at = std::size_t((h * rows + i) * D), row = std::size_t(h * rows + i);
        CHECK(std::memcmp(&out[0][at], full_o.data() + (h * n + t0 + i) * D, std::size_t(D) * sizeof(float)) == 0);
        CHECK(std::memcmp(&lse[0][row], &full.lse[std::size_t(h * n + t0 + i)], sizeof(float)) == 0);
        const bool nan_row = h >= 2 && i == 3, declined = h >= 2 && i == 2;
        CHECK(std::isnan(out[0][at]) == nan_row);
        if (declined) CHECK(std::memcmp(&out[0][at], &out[1][at], std::size_t(D) * sizeof(float)) == 0);
      }
  });
}

TEST_CASE("tiled forward: a decode step over a long KV cache is split over the key axis", "[operator][tiled]") {
  // Lk ≥ 2·kSplitKeys: chunks of kSplitKeys keys (the last one short), each a
  // task, combined in chunk order. Checked against the reference (with P and
  // π, which check_forward also requires to change no bit), with visible
  // ranges that start just before, at and just after a chunk boundary (the
  // halo at the chunk's start), end at one, and bitwise across thread counts.
  using continuum::cpu_detail::tiled::kSplitKeys;
  use_mp_precision();
  const int kernel = GENERATE(0, 1);
  const index_t Lk = 2 * kSplitKeys + 37;
  auto make = [&](Case<float>& c) {
    c.B = 1;
    c.Hq = 4;
    c.Hk = 2;  // GQA: one task per KV head holds both query heads
    c.Lq = 1;
    c.Lk = Lk;
    c.D = 16;
    c.Dv = 8;
    c.kernel = kernel ? continuum::Kernel::softmax : continuum::Kernel::continuum;
    c.tau = 0.3f;
  };
  struct Range {
    index_t lo, hi;
    const char* name;
  };
  for (const Range r : {Range{0, Lk, "all keys"}, Range{kSplitKeys - 1, Lk, "from the key before a boundary"},
                        Range{kSplitKeys, Lk, "from a boundary"}, Range{kSplitKeys + 1, Lk, "from after a boundary"},
                        Range{100, 2 * kSplitKeys, "ending at a boundary"}}) {
    std::vector<float> o1, l1;
    for (int threads : {1, 2, 3}) {
      Case<float> c;
      make(c);
      c.range_lo.assign(1, r.lo);
      c.range_hi.assign(1, r.hi);
      c.threads = threads;
      c.want_maps = threads == 1;
      c.alloc();
      auto rng = rng_for(777);
      c.fill_uniform(rng);
      INFO("kernel " << kernel << ", keys [" << r.lo << ", " << r.hi << "): " << r.name << ", threads " << threads);
      if (threads == 1) {
        check_forward<mp>(c, std::string("decode split ") + r.name);
        c.forward();  // check_forward's last call computed in double
        o1 = c.o.contiguous();
        l1 = c.lse;
      } else {
        c.forward();
        CHECK(bitwise_equal(c.o.contiguous(), o1));
        CHECK(bitwise_equal(c.lse, l1));
      }
    }
  }
}
