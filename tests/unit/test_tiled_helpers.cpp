// The tiled kernels' small helpers (backends/cpu/tiled.hpp) against their
// definitions, for sizes on both sides of the vector width:
// - pack_transposed (the K/V tile packing: W × W blocks transposed in
//   registers, scalar edges, zero padding): dst[d·ldd + c] = src[c·lds + d]
//   (c < n), 0 (n ≤ c < ldd);
// - ScoreTile (the forward's score and weight tiles): column 1 of every row on a
//   64-byte line, the row stride whole lines, zeros when asked, rows apart;
// - row_find (where the forward finds the column of a new row maximum, the
//   reference key: whole vectors compared, the lane from the mask): the first c in [c0, c1)
//   with s[c] == v, c1 when there is none;
// - row_max (the forward's row maximum per key tile, its last columns one
//   vector with the lanes past c1 left out): the largest s[c] over [c0, c1),
//   whatever lies past c1 (+inf, NaN), which it leaves as it was (kScale:
//   s[c] *= scale in the range only);
// - KeyMagnitudes::range_max (row_eligibility's largest ‖k‖², ‖v‖² and NaN/Inf
//   flag over a row's visible keys, from per-block, prefix and suffix maxima):
//   the maxima and the flag of the keys [lo, hi), for every range;
// - key_range_gemm (the backward's dK and dV products): each key's row of C
//   plus the running multiply-add, in ascending r, over exactly the rows whose
//   range holds it, bit for bit, for monotone and arbitrary row ranges.
#include <catch2/catch.hpp>

#include <continuum/backends/cpu/tiled.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

TEMPLATE_TEST_CASE("pack_transposed is the transpose, zero-padded", "[unit][tiled]", float, double) {
  using continuum::index_t;
  const index_t n = GENERATE(0, 1, 7, 8, 16, 17, 100, 128);
  const index_t cols = GENERATE(1, 5, 8, 16, 17, 64);
  const index_t lds = cols + 3, ldd = (n + 15) / 16 * 16 + 16;
  std::vector<TestType> src(static_cast<std::size_t>(std::max<index_t>(1, n * lds)));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = TestType(i + 1);
  std::vector<TestType> dst(static_cast<std::size_t>(cols * ldd), TestType(-7));
  continuum::cpu_detail::tiled::pack_transposed<TestType>(src.data(), lds, n, cols, dst.data(), ldd);
  index_t wrong = 0;
  for (index_t d = 0; d < cols; ++d)
    for (index_t c = 0; c < ldd; ++c)
      wrong += dst[static_cast<std::size_t>(d * ldd + c)] != (c < n ? src[static_cast<std::size_t>(c * lds + d)] : TestType(0));
  INFO("n " << n << " cols " << cols);
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("row_find is the first column equal to the value", "[unit][tiled]", float, double) {
  using continuum::index_t;
  using T = TestType;
  const index_t c0 = GENERATE(0, 1, 5);
  const index_t len = GENERATE(0, 1, 3, 8, 15, 16, 17, 33, 64, 100);
  const index_t c1 = c0 + len;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> s(static_cast<std::size_t>(c1 + 20));
  // Columns outside [c0, c1) hold the value too: they must never be found.
  const auto fill = [&] {
    for (index_t c = 0; c < index_t(s.size()); ++c) s[std::size_t(c)] = c < c0 || c >= c1 ? T(2) : T(c % 7) - T(3);
  };
  const auto first = [&](T v) {  // the definition
    index_t c = c0;
    while (c < c1 && !(s[std::size_t(c)] == v)) ++c;
    return c;
  };
  index_t wrong = 0, checks = 0;
  const auto check = [&](T v) {
    const index_t got = continuum::cpu_detail::tiled::row_find(s.data(), c0, c1, v);
    wrong += got != first(v);
    ++checks;
  };
  fill();
  check(T(2));    // only outside the range: c1
  check(T(-3));   // every 7th column: the first of them
  check(nan);     // never equal
  for (index_t at = c0; at < c1; ++at) {
    fill();
    s[std::size_t(at)] = T(5);  // the one place
    check(T(5));
    for (index_t c = c0; c < at; ++c) s[std::size_t(c)] = nan;  // NaNs before it are skipped
    check(T(5));
    s[std::size_t(at)] = T(-0.0);  // -0 == +0
    check(T(0));
    if (at + 1 < c1) {
      s[std::size_t(at + 1)] = T(-0.0);  // a second equal column after it
      check(T(-0.0));
    }
  }
  INFO("c0 " << c0 << " c1 " << c1 << ", " << checks << " checks");
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("row_max is the largest column in the range, whatever lies past it", "[unit][tiled]", float,
                   double) {
  using continuum::index_t;
  using T = TestType;
  namespace tl = continuum::cpu_detail::tiled;
  const index_t c0 = GENERATE(0, 1, 5);
  const index_t len = GENERATE(0, 1, 3, 15, 16, 17, 31, 33, 47, 64, 100);
  const index_t c1 = c0 + len;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> s(static_cast<std::size_t>(c1 + 64));
  // Past c1: +inf, NaN and a large finite score, as a score tile's spare columns may hold.
  const auto fill = [&](index_t at) {
    for (index_t c = 0; c < index_t(s.size()); ++c)
      s[std::size_t(c)] = c >= c1 ? (c % 3 == 0 ? inf : c % 3 == 1 ? nan : T(50)) : c < c0 ? T(100) : T(c % 5) - T(7);
    if (at >= 0) s[std::size_t(at)] = T(3);  // the one largest
  };
  index_t wrong = 0;
  for (index_t at = c0 - 1; at < c1; ++at) {
    fill(at < c0 ? -1 : at);
    T expect = -inf;
    for (index_t c = c0; c < c1; ++c) expect = std::max(expect, s[std::size_t(c)]);  // the definition
    const std::vector<T> before = s;
    wrong += tl::row_max(s.data(), c0, c1) != expect;
    wrong += tl::row_max<true>(s.data(), c0, c1, T(2)) != T(2) * expect;
    for (index_t c = 0; c < index_t(s.size()); ++c) {
      const T b = before[std::size_t(c)], a = s[std::size_t(c)];
      const bool kept = c >= c0 && c < c1 ? a == T(2) * b : (a == b || (a != a && b != b));
      wrong += !kept;
    }
  }
  INFO("c0 " << c0 << " len " << len);
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("ScoreTile puts every row's first key on a 64-byte line, rows apart", "[unit][tiled]", float, double,
                   long double) {
  using continuum::index_t;
  namespace tl = continuum::cpu_detail::tiled;
  using T = TestType;
  const index_t rows = GENERATE(1, 3, 16, 256);
  const index_t cols = tl::kBc + 1 + tl::kPad<T>;  // the columns the forward's row passes may touch
  tl::ScoreTile<T> tile(rows, true);
  CHECK(tile.stride() >= cols);
  CHECK(tile.stride() * index_t(sizeof(T)) % 64 == 0);
  index_t misaligned = 0, nonzero = 0;
  for (index_t r = 0; r < rows; ++r) {
    misaligned += reinterpret_cast<std::uintptr_t>(tile.row(r) + 1) % 64 != 0;
    CHECK(tile.row(r) == tile.data() + r * tile.stride());
    for (index_t c = 0; c < cols; ++c) nonzero += tile(r, c) != T(0);
  }
  CHECK(misaligned == 0);
  CHECK(nonzero == 0);
  // Every row's columns are its own (a sanitizer build also checks the bounds).
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) tile.row(r)[c] = T(r * cols + c);
  index_t wrong = 0;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) wrong += tile(r, c) != T(r * cols + c);
  CHECK(wrong == 0);
}

TEST_CASE("KeyMagnitudes::range_max is the maximum over every key range", "[unit][tiled]") {
  using continuum::index_t;
  namespace tl = continuum::cpu_detail::tiled;
  const index_t Lk = GENERATE(index_t(1), index_t(2), tl::kNormBlock - 1, tl::kNormBlock, tl::kNormBlock + 1,
                              3 * tl::kNormBlock + 45);
  const index_t D = 3, Dv = 2;
  std::mt19937 rng{static_cast<unsigned>(Lk)};
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> k(std::size_t(Lk * D)), v(std::size_t(Lk * Dv));
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  // A NaN key, an infinite value and a norm that overflows float (+inf, finite elements).
  if (Lk > 5) k[std::size_t(5 * D + 1)] = std::numeric_limits<float>::quiet_NaN();
  if (Lk > tl::kNormBlock + 2) v[std::size_t((tl::kNormBlock + 2) * Dv)] = -std::numeric_limits<float>::infinity();
  if (Lk > 200) k[std::size_t(200 * D)] = 3e30f;
  const auto kv = continuum::TensorView<const float>::bhsd(k.data(), 1, 1, Lk, D);
  const auto vv = continuum::TensorView<const float>::bhsd(v.data(), 1, 1, Lk, Dv);
  tl::KeyMagnitudes<float> km;
  km.build(kv, vv, 0, 0);
  const auto norm2 = [](const float* x, index_t n) {
    double s = 0;
    for (index_t d = 0; d < n; ++d) s += double(x[d]) * x[d];
    return s;
  };
  const auto finite = [](const float* x, index_t n) { return std::all_of(x, x + n, [](float e) { return std::isfinite(e); }); };
  index_t wrong = 0, flagged = 0;
  for (index_t lo = 0; lo < Lk; ++lo) {
    double kmax = 0, vmax = 0;
    bool bad = false;
    for (index_t hi = lo + 1; hi <= Lk; ++hi) {
      const float* kr = k.data() + (hi - 1) * D;
      const float* vr = v.data() + (hi - 1) * Dv;
      bad = bad || !finite(kr, D) || !finite(vr, Dv);
      if (finite(kr, D)) kmax = std::max(kmax, norm2(kr, D));
      if (finite(vr, Dv)) vmax = std::max(vmax, norm2(vr, Dv));
      const auto seen = km.range_max(lo, hi);
      const float km2 = seen.kn, vm2 = seen.vn;
      const bool nonfinite = seen.bad != 0;
      flagged += nonfinite;
      // (float sums of three squares: within 1e-6 of the double ones; ‖k‖² beyond FLT_MAX is +inf.)
      const float inf = std::numeric_limits<float>::infinity();
      const bool k_ok = kmax > std::numeric_limits<float>::max() ? km2 == inf : std::abs(km2 - kmax) <= 1e-6 * kmax;
      const bool v_ok = std::abs(vm2 - vmax) <= 1e-6 * vmax;
      const bool ok = nonfinite == bad && (bad || (k_ok && v_ok));
      if (!ok && wrong++ < 5) UNSCOPED_INFO("[" << lo << ", " << hi << "): " << km2 << " " << vm2 << " " << nonfinite);
    }
  }
  INFO("Lk " << Lk);
  CHECK(wrong == 0);
  if (Lk > 5) CHECK(flagged > 0);
}

TEMPLATE_TEST_CASE("key_range_gemm sums each key over exactly the rows that see it, in ascending order",
                   "[unit][tiled]", float, double) {
  // The backward's dK and dV products: C(c, :) += Σ_{r : ov0[r] ≤ c < ov1[r]} A(c, r) · B(r, :), with
  // A(c, r) = A[c + r·lda], each element a running multiply-add in ascending r (the definition below,
  // bit for bit). Row ranges whose ends are non-decreasing in r (full, causal, windows, empty rows
  // among them) take the interval sweep; the others (explicit ranges) the general scan.
  using continuum::index_t;
  using T = TestType;
  namespace cd = continuum::cpu_detail;
  const int family = GENERATE(0, 1, 2, 3, 4);  // full, causal, window, window with rows before and after, random
  const index_t R = GENERATE(0, 1, 5, 6, 7, 13, 64);
  const index_t ncols = GENERATE(1, 9, 40, 128);
  const index_t N = GENERATE(1, 8, 19);
  std::mt19937_64 rng(std::uint64_t(1000 * family + 100 * R + 10 * ncols + N));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<index_t> ov0(static_cast<std::size_t>(R)), ov1(static_cast<std::size_t>(R));
  for (index_t r = 0; r < R; ++r) {
    const index_t diag = R > 0 ? r * ncols / std::max<index_t>(R, 1) : 0;
    switch (family) {
      case 0: ov0[r] = 0, ov1[r] = ncols; break;
      case 1: ov0[r] = 0, ov1[r] = std::min(ncols, diag + 1); break;
      case 2: ov0[r] = std::max<index_t>(0, diag - 5), ov1[r] = std::min(ncols, diag + 3); break;
      case 3:  // rows that see none of the tile's keys, before it (0, 0) and after it (ncols, ncols), as the backward sets them
        ov0[r] = std::clamp<index_t>(2 * diag - ncols / 2, 0, ncols);
        ov1[r] = std::clamp<index_t>(2 * diag - ncols / 2 + 4, 0, ncols);
        break;
      default: {
        const index_t lo = index_t(rng() % std::uint64_t(ncols + 1));
        ov0[r] = lo, ov1[r] = rng() % 5 == 0 ? lo : lo + index_t(rng() % std::uint64_t(ncols - lo + 1));
      }
    }
  }
  const index_t lda = ncols + 3, ldb = N + 2, ldc = N + 1;
  std::vector<T> A(std::size_t(std::max<index_t>(1, R * lda))), B(std::size_t(std::max<index_t>(1, R * ldb))),
      C(std::size_t(ncols * ldc));
  for (T& x : A) x = T(u(rng));
  for (T& x : B) x = T(u(rng));
  for (T& x : C) x = T(u(rng));
  std::vector<T> want = C;
  for (index_t c = 0; c < ncols; ++c)
    for (index_t n = 0; n < N; ++n) {
      T acc = want[std::size_t(c * ldc + n)];
      for (index_t r = 0; r < R; ++r)
        if (ov0[r] <= c && c < ov1[r]) acc = cd::madd(A[std::size_t(c + r * lda)], B[std::size_t(r * ldb + n)], acc);
      want[std::size_t(c * ldc + n)] = acc;
    }
  std::vector<index_t> rb(static_cast<std::size_t>(ncols)), re(static_cast<std::size_t>(ncols));
  cd::tiled::key_range_gemm<T>(ncols, R, N, A.data(), lda, B.data(), ldb, C.data(), ldc, ov0.data(), ov1.data(),
                               rb.data(), re.data());
  index_t wrong = 0;
  for (std::size_t i = 0; i < C.size(); ++i)
    if (std::memcmp(&C[i], &want[i], sizeof(T)) != 0 && wrong++ < 5) UNSCOPED_INFO("C[" << i << "] " << C[i] << " want " << want[i]);
  INFO("family " << family << " R " << R << " ncols " << ncols << " N " << N);
  CHECK(wrong == 0);
}
