// The tiled kernels' small helpers (backends/cpu/tiled.hpp) against their
// definitions, for sizes on both sides of the vector width:
// - pack_transposed (the K/V tile packing: W × W blocks transposed in
//   registers, scalar edges, zero padding): dst[d·ldd + c] = src[c·lds + d]
//   (c < n), 0 (n ≤ c < ldd);
// - ScoreTile (the forward's score and weight tiles): column 1 of every row on a
//   64-byte line, the row stride whole lines, zeros when asked, rows apart;
// - row_find (where the forward finds the column of a new row maximum, the
//   reference key: whole vectors compared, the lane from the mask): the first c in [c0, c1)
//   with s[c] == v, c1 when there is none.
#include <catch2/catch.hpp>

#include <continuum/backends/cpu/tiled.hpp>

#include <cstdint>
#include <limits>
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
