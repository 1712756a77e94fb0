// Fuzz target: the operator API (attention_forward / attention_backward, CPU).
//
// The input decodes into argument structs: sizes (some zero), layouts
// (contiguous, BSHD, padded, arbitrary small strides, packed QKV / packed
// gradients), placements in one arena (apart, or at a fuzzed offset so that
// buffers may overlap), values, temperature shape and value (tame or
// hostile), scale, visibility, ranges, kernel, compute. Every byte
// of the arena that is not an element of some buffer is poisoned for ASan, so
// any read or write outside the views is reported. Every call must either
// throw std::invalid_argument ("continuum::...") or
//   * change only bytes of the buffers it writes,
//   * give finite outputs (lse: not NaN) when the inputs are tame, and
//   * give bitwise the results of the same call on separate contiguous
//     copies (an accepted call has no aliasing that changes its results).
#include <continuum/continuum.hpp>
#include <fuzzer/FuzzedDataProvider.h>
#include <sanitizer/asan_interface.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using continuum::index_t;
using continuum::TensorView;

[[noreturn]] void bug(const std::string& what) {
  std::fprintf(stderr, "fuzz_operator: %s\n", what.c_str());
  std::abort();
}

/// One buffer in the arena: its element size and the byte offsets of its
/// elements (row-major over its logical shape).
struct Buf {
  std::size_t esize = 8, offset = 0, bytes = 0;  // the span it occupies
  std::vector<std::size_t> elems;
  bool used = false;
};

struct Geometry {
  index_t n[4] = {0, 0, 0, 0};
  index_t st[3] = {0, 0, 0};
  index_t base = 0;  // element offset inside its buffer (packed layouts)
};

class Arena {
 public:
  static constexpr std::size_t guard = 32;
  std::size_t end = guard;

  /// Reserves `span` elements of `esize` bytes: apart from everything else,
  /// or (overlap) at a fuzzed offset inside what is placed already.
  std::size_t place(FuzzedDataProvider& in, std::size_t span, std::size_t esize) {
    std::size_t at;
    if (end > guard && in.ConsumeIntegralInRange(0, 7) == 0) {
      at = in.ConsumeIntegralInRange<std::size_t>(guard, end - 1);
    } else {
      at = end;
    }
    at = (at + 7) / 8 * 8;
    const std::size_t stop = at + span * esize;
    if (stop + guard > end) end = stop + guard;
    return at;
  }
};

Geometry layout(FuzzedDataProvider& in, index_t b, index_t h, index_t s, index_t d) {
  Geometry g;
  g.n[0] = b, g.n[1] = h, g.n[2] = s, g.n[3] = d;
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0: case 1:  // BHSD
      g.st[0] = h * s * d, g.st[1] = s * d, g.st[2] = d;
      break;
    case 2:  // BSHD
      g.st[0] = s * h * d, g.st[1] = d, g.st[2] = h * d;
      break;
    case 3: {  // padded BHSD
      const index_t pad = in.ConsumeIntegralInRange(1, 3);
      g.st[2] = d + pad, g.st[1] = s * (d + pad) + pad, g.st[0] = h * g.st[1] + pad;
      break;
    }
    default:  // arbitrary small strides (outputs may overlap themselves)
      for (auto& x : g.st) x = in.ConsumeIntegralInRange(0, 40);
  }
  return g;
}

index_t span_of(const Geometry& g) {
  for (index_t x : g.n)
    if (x == 0) return 0;
  return g.base + (g.n[0] - 1) * g.st[0] + (g.n[1] - 1) * g.st[1] + (g.n[2] - 1) * g.st[2] + g.n[3];
}

void elements(const Geometry& g, std::size_t offset, std::size_t esize, Buf& buf) {
  buf.esize = esize, buf.offset = offset, buf.used = true;
  buf.bytes = std::size_t(span_of(g)) * esize;
  for (index_t b = 0; b < g.n[0]; ++b)
    for (index_t h = 0; h < g.n[1]; ++h)
      for (index_t s = 0; s < g.n[2]; ++s)
        for (index_t d = 0; d < g.n[3]; ++d)
          buf.elems.push_back(offset + std::size_t(g.base + b * g.st[0] + h * g.st[1] + s * g.st[2] + d) * esize);
}

void array_elements(std::size_t n, std::size_t offset, std::size_t esize, Buf& buf) {
  buf.esize = esize, buf.offset = offset, buf.bytes = n * esize, buf.used = true;
  for (std::size_t i = 0; i < n; ++i) buf.elems.push_back(offset + i * esize);
}

const double kTame[] = {0.05, 0.3, 1.0, 2.5, 10.0};
const double kHostile[] = {0.0, -1.0, NAN, INFINITY, 1e-30, 1e-45, 1e-300, 1e300, 3e38};

/// The roles of the buffers.
enum Role { Q, K, V, O, DO, LSE, TAU, LO, HI, P, PI, DQ, DK, DV, DTAU, NROLES };

template <class T>
struct Problem {
  bool backward = false, tame = true;
  index_t B = 0, Hq = 0, Hk = 0, Lq = 0, Lk = 0, D = 0, Dv = 0;
  continuum::Kernel kernel = continuum::Kernel::continuum;
  continuum::TemperatureShape tshape = continuum::TemperatureShape::scalar;
  double tau_scalar = 1;
  std::optional<double> scale;
  bool causal = false, probs = false, ranges = false;
  continuum::Compute compute = continuum::Compute::automatic;
  index_t window_left = -1, window_right = -1;  // MATH.md §3; negative = unlimited
  bool want[NROLES] = {};
  Geometry geo[NROLES];
  Buf buf[NROLES];
};

template <class T>
struct Run {  // pointers of every buffer, in the arena or in separate copies
  unsigned char* base[NROLES] = {};
  template <class U>
  U* ptr(const Problem<T>& p, Role r) const {
    return p.want[r] ? reinterpret_cast<U*>(base[r]) : nullptr;
  }
  template <class U>
  TensorView<U> view(const Problem<T>& p, Role r) const {
    const Geometry& g = p.geo[r];
    if (!p.want[r]) return {};
    return {reinterpret_cast<U*>(base[r]) + g.base, g.n[0], g.n[1], g.n[2], g.n[3], g.st[0], g.st[1], g.st[2], 1};
  }
};

template <class T, class Args>
void set_common(const Problem<T>& p, const Run<T>& r, Args& a) {
  a.query = r.template view<const T>(p, Q);
  a.key = r.template view<const T>(p, K);
  a.value = r.template view<const T>(p, V);
  a.kernel = p.kernel;
  a.temperature.shape = p.tshape;
  a.temperature.value = T(p.tau_scalar);
  a.temperature.data = r.template ptr<const T>(p, TAU);
  a.scale = p.scale;
  a.visibility.causal = p.causal;
  a.visibility.window_left = p.window_left;
  a.visibility.window_right = p.window_right;
  a.visibility.range_lo = r.template ptr<const index_t>(p, LO);
  a.visibility.range_hi = r.template ptr<const index_t>(p, HI);
  a.compute = p.compute;
  a.num_threads = 1;
}

template <class T>
void call(const Problem<T>& p, const Run<T>& r) {
  if (!p.backward) {
    continuum::ForwardArgs<T> a;
    set_common(p, r, a);
    a.out = r.template view<T>(p, O);
    a.lse = r.template ptr<T>(p, LSE);
    a.probs = r.template ptr<T>(p, P);
    a.cell_mass = r.template ptr<T>(p, PI);
    continuum::attention_forward(continuum::cpu, a);
  } else {
    continuum::BackwardArgs<T> a;
    set_common(p, r, a);
    a.out = r.template view<const T>(p, O);
    a.grad_out = r.template view<const T>(p, DO);
    a.lse = r.template ptr<const T>(p, LSE);
    a.grad_query = r.template view<T>(p, DQ);
    a.grad_key = r.template view<T>(p, DK);
    a.grad_value = r.template view<T>(p, DV);
    a.grad_temperature = r.template ptr<T>(p, DTAU);
    continuum::attention_backward(continuum::cpu, a);
  }
}

bool is_output(bool backward, int r) {
  return backward ? (r == DQ || r == DK || r == DV || r == DTAU) : (r == O || r == LSE || r == P || r == PI);
}

/// Every buffer of p in its own contiguous allocation (elements in order),
/// the inputs' values copied from `bytes` (the arena).
template <class T>
struct Separate {
  Problem<T> q;
  Run<T> run;
  std::vector<std::vector<unsigned char>> copies;
};
template <class T>
Separate<T> separate(const Problem<T>& p, const unsigned char* bytes) {
  Separate<T> s;
  s.q = p;
  s.copies.resize(NROLES);
  for (int r = 0; r < NROLES; ++r) {
    if (!p.want[r]) continue;
    const Buf& b = p.buf[r];
    s.copies[r].resize(b.elems.size() * b.esize + 1);
    if (!is_output(p.backward, r))
      for (std::size_t i = 0; i < b.elems.size(); ++i) std::memcpy(&s.copies[r][i * b.esize], bytes + b.elems[i], b.esize);
    Geometry& g = s.q.geo[r];
    g.st[2] = g.n[3], g.st[1] = g.n[2] * g.n[3], g.st[0] = g.n[1] * g.n[2] * g.n[3], g.base = 0;
    s.run.base[r] = s.copies[r].data();
  }
  return s;
}

template <class T>
std::string describe(const Problem<T>& p) {
  auto n = [](index_t x) { return std::to_string(x); };
  std::string s = std::string(sizeof(T) == 4 ? "float " : "double ") + (p.backward ? "backward" : "forward") +
                  " kernel " + n(int(p.kernel)) + " B Hq Hk Lq Lk D Dv = " + n(p.B) + " " + n(p.Hq) + " " +
                  n(p.Hk) + " " + n(p.Lq) + " " + n(p.Lk) + " " + n(p.D) + " " + n(p.Dv) + ", tau shape " +
                  n(int(p.tshape)) + " scalar " + std::to_string(p.tau_scalar) + ", scale " +
                  (p.scale ? std::to_string(*p.scale) : "default") + ", causal " + n(p.causal) + " window (" +
                  n(p.window_left) + ", " + n(p.window_right) + ")" + " ranges " + n(p.ranges) + " compute " + n(int(p.compute));
  return s;
}

template <class T>
int run(FuzzedDataProvider& in) {
  Problem<T> p;
  p.backward = in.ConsumeBool();
  p.kernel = static_cast<continuum::Kernel>(in.ConsumeIntegralInRange(0, 5) % 4);  // 3: invalid
  p.B = in.ConsumeIntegralInRange(0, 2);
  p.Hk = in.ConsumeIntegralInRange(0, 3);
  p.Hq = p.Hk * in.ConsumeIntegralInRange(0, 3);
  if (in.ConsumeIntegralInRange(0, 15) == 0) p.Hq = in.ConsumeIntegralInRange(0, 4);  // maybe not a multiple
  p.Lq = in.ConsumeIntegralInRange(0, 9);
  p.Lk = in.ConsumeIntegralInRange(0, 9);
  p.D = in.ConsumeIntegralInRange(0, 5);
  p.Dv = in.ConsumeIntegralInRange(0, 5);
  p.tshape = static_cast<continuum::TemperatureShape>(in.ConsumeIntegralInRange(0, 2));
  const bool hostile = in.ConsumeIntegralInRange(0, 7) == 0;
  p.tame = !hostile;
  auto tau_value = [&] {
    return hostile ? kHostile[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kHostile) - 1)]
                   : kTame[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kTame) - 1)];
  };
  p.tau_scalar = tau_value();
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: break;  // default 1/sqrt(D)
    case 1: p.scale = 0.5; break;
    case 2: p.scale = 2.0; break;
    default: p.scale = hostile ? kHostile[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kHostile) - 1)] : 0.125;
  }
  p.causal = in.ConsumeBool();
  {  // small windows, unlimited sides, and bounds near INT64_MAX
    const index_t bounds[] = {-1, 0, 1, 3, std::numeric_limits<index_t>::max()};
    p.window_left = bounds[in.ConsumeIntegralInRange<std::size_t>(0, 4)];
    p.window_right = bounds[in.ConsumeIntegralInRange<std::size_t>(0, 4)];
  }
  p.ranges = in.ConsumeIntegralInRange(0, 3) == 0;
  p.probs = !p.backward && in.ConsumeIntegralInRange(0, 3) == 0;
  // automatic, float32 (rejected with double storage), float64
  p.compute = static_cast<continuum::Compute>(in.ConsumeIntegralInRange(0, 2));

  const index_t rows = p.B * p.Hq * p.Lq;
  Arena arena;
  const std::size_t es = sizeof(T);
  auto place_view = [&](Role r, index_t b, index_t h, index_t s, index_t d) {
    p.want[r] = true;
    p.geo[r] = layout(in, b, h, s, d);
    elements(p.geo[r], arena.place(in, std::size_t(span_of(p.geo[r])), es), es, p.buf[r]);
  };
  auto place_array = [&](Role r, std::size_t n, std::size_t esize) {
    p.want[r] = true;
    array_elements(n, arena.place(in, n, esize), esize, p.buf[r]);
  };
  /// Q, K, V (or dQ, dK, dV) as views of one packed [B, L, 3, H, D] buffer.
  auto place_packed = [&](Role q, Role k, Role v) {
    const index_t H = p.Hq, L = p.Lq, D = p.D;
    const std::size_t at = arena.place(in, std::size_t(p.B * L * 3 * H * D), es);
    for (int x = 0; x < 3; ++x) {
      const Role r = x == 0 ? q : x == 1 ? k : v;
      p.want[r] = true;
      Geometry& g = p.geo[r];
      g.n[0] = p.B, g.n[1] = H, g.n[2] = L, g.n[3] = D;
      g.st[0] = L * 3 * H * D, g.st[1] = D, g.st[2] = 3 * H * D;
      g.base = x * H * D;
      elements(g, at, es, p.buf[r]);
    }
  };
  const bool packable = p.Hq == p.Hk && p.Lq == p.Lk && p.D == p.Dv;
  if (packable && in.ConsumeIntegralInRange(0, 3) == 0) {
    place_packed(Q, K, V);
  } else {
    place_view(Q, p.B, p.Hq, p.Lq, p.D);
    place_view(K, p.B, p.Hk, p.Lk, p.D);
    place_view(V, p.B, p.Hk, p.Lk, p.Dv);
  }
  place_view(O, p.B, p.Hq, p.Lq, p.Dv);
  if (in.ConsumeIntegralInRange(0, 3) != 0) place_array(LSE, std::size_t(rows), es);
  const std::size_t ntau = p.tshape == continuum::TemperatureShape::per_head ? std::size_t(p.Hq)
                           : p.tshape == continuum::TemperatureShape::per_query ? std::size_t(rows) : 0;
  if (p.tshape != continuum::TemperatureShape::scalar) place_array(TAU, ntau, es);
  if (p.ranges) {
    place_array(LO, std::size_t(p.B * p.Lq), sizeof(index_t));
    place_array(HI, std::size_t(p.B * p.Lq), sizeof(index_t));
  }
  if (p.probs) {
    place_array(P, std::size_t(rows * p.Lk), es);
    place_array(PI, std::size_t(rows * p.Lk), es);
  }
  if (p.backward) {
    place_view(DO, p.B, p.Hq, p.Lq, p.Dv);
    if (packable && in.ConsumeIntegralInRange(0, 3) == 0) {
      place_packed(DQ, DK, DV);
    } else {
      if (in.ConsumeIntegralInRange(0, 5) != 0) place_view(DQ, p.B, p.Hq, p.Lq, p.D);
      if (in.ConsumeIntegralInRange(0, 5) != 0) place_view(DK, p.B, p.Hk, p.Lk, p.D);
      if (in.ConsumeIntegralInRange(0, 5) != 0) place_view(DV, p.B, p.Hk, p.Lk, p.Dv);
    }
    if (in.ConsumeBool()) place_array(DTAU, p.tshape == continuum::TemperatureShape::scalar ? 1 : ntau, es);
  }

  // The arena, every byte 0xA5, then the values of the inputs.
  std::unique_ptr<unsigned char[]> mem(new unsigned char[arena.end]);
  std::memset(mem.get(), 0xA5, arena.end);
  for (int r = 0; r < NROLES; ++r) {
    if (!p.want[r] || is_output(p.backward, r)) continue;
    for (std::size_t off : p.buf[r].elems) {
      if (r == LO || r == HI) {
        const index_t x = in.ConsumeIntegralInRange<index_t>(-1, p.Lk + 1) ;
        index_t v = x;
        if (r == HI && in.ConsumeIntegralInRange(0, 7) != 0) v = p.Lk;  // mostly valid
        if (r == LO && in.ConsumeIntegralInRange(0, 7) != 0) v = x < 0 ? 0 : (x > p.Lk ? p.Lk : x) / 2;
        std::memcpy(mem.get() + off, &v, sizeof v);
      } else {
        const T v = r == TAU ? T(tau_value()) : T((int(in.ConsumeIntegral<std::uint8_t>()) - 128) / 64.0);
        std::memcpy(mem.get() + off, &v, sizeof v);
      }
    }
  }

  // The backward's out and lse: the forward's, computed on separate copies
  // (left as they are where the forward rejects the arguments).
  if (p.backward) {
    Problem<T> f = p;
    f.backward = false;
    f.want[P] = f.want[PI] = false;
    if (!f.want[LSE]) {
      f.want[LSE] = true;
      array_elements(std::size_t(rows), 0, es, f.buf[LSE]);
    }
    Separate<T> s = separate(f, mem.get());
    try {
      call(s.q, s.run);
      for (Role r : {O, LSE})
        if (p.want[r])
          for (std::size_t i = 0; i < p.buf[r].elems.size(); ++i)
            std::memcpy(mem.get() + p.buf[r].elems[i], &s.copies[r][i * es], es);
    } catch (const std::invalid_argument&) {
    }
    // Where out or lse overlaps another input, writing them changed what the
    // forward read: they are no longer the forward's of these inputs, and the
    // backward's results need not be finite (a caller's contract).
    const Separate<T> now = separate(f, mem.get());
    for (Role r : {Q, K, V, TAU, LO, HI})
      if (p.want[r] && now.copies[r] != s.copies[r]) p.tame = false;
  }

  // Poison every byte that is no element of a buffer.
  ASAN_POISON_MEMORY_REGION(mem.get(), arena.end);
  for (int r = 0; r < NROLES; ++r)
    if (p.want[r])
      for (std::size_t off : p.buf[r].elems) ASAN_UNPOISON_MEMORY_REGION(mem.get() + off, p.buf[r].esize);
  Run<T> in_arena;
  for (int r = 0; r < NROLES; ++r)
    if (p.want[r]) in_arena.base[r] = mem.get() + p.buf[r].offset;
  std::vector<unsigned char> before(arena.end);
  ASAN_UNPOISON_MEMORY_REGION(mem.get(), arena.end);
  std::memcpy(before.data(), mem.get(), arena.end);
  ASAN_POISON_MEMORY_REGION(mem.get(), arena.end);
  for (int r = 0; r < NROLES; ++r)
    if (p.want[r])
      for (std::size_t off : p.buf[r].elems) ASAN_UNPOISON_MEMORY_REGION(mem.get() + off, p.buf[r].esize);

  bool accepted = true;
  try {
    call(p, in_arena);
  } catch (const std::invalid_argument& e) {
    if (std::strncmp(e.what(), "continuum::", 11) != 0) bug("invalid_argument without the continuum:: prefix");
    accepted = false;
  }
  ASAN_UNPOISON_MEMORY_REGION(mem.get(), arena.end);
  // Bytes changed only inside the elements of the buffers the call writes.
  std::vector<char> writable(arena.end, 0);
  for (int r = 0; r < NROLES; ++r)
    if (p.want[r] && is_output(p.backward, r))
      for (std::size_t off : p.buf[r].elems) std::memset(&writable[off], 1, p.buf[r].esize);
  for (std::size_t i = 0; i < arena.end; ++i)
    if (mem[i] != before[i] && (!accepted || !writable[i])) bug(accepted ? "wrote outside its outputs" : "wrote before throwing");
  if (!accepted) return 0;

  Separate<T> s = separate(p, before.data());
  try {
    call(s.q, s.run);
  } catch (const std::invalid_argument&) {
    bug("accepted with these buffers in the arena, rejected with separate ones");
  }
  const auto& copies = s.copies;
  // Tame only if what the call read is finite (lse, an input of the
  // backward, may overlap another input and put -inf there).
  bool tame = p.tame;
  for (Role r : {Q, K, V, DO, TAU})
    if (p.want[r])
      for (std::size_t i = 0; i < p.buf[r].elems.size(); ++i) {
        T w;
        std::memcpy(&w, &copies[r][i * sizeof(T)], sizeof w);
        tame = tame && std::isfinite(w);
      }
  for (int r = 0; r < NROLES; ++r) {
    if (!p.want[r] || !is_output(p.backward, r)) continue;
    const Buf& b = p.buf[r];
    for (std::size_t i = 0; i < b.elems.size(); ++i) {
      if (std::memcmp(&copies[r][i * b.esize], &mem[b.elems[i]], b.esize) != 0)
        bug("results differ from the same call on separate buffers");
      T v;
      std::memcpy(&v, &mem[b.elems[i]], sizeof v);
      if (tame && (r == LSE ? std::isnan(v) : !std::isfinite(v)) && std::getenv("FUZZ_DUMP"))
        for (int x = 0; x < NROLES; ++x) {
          if (!p.want[x] || is_output(p.backward, x)) continue;
          std::fprintf(stderr, "role %d:", x);
          for (std::size_t e = 0; e < p.buf[x].elems.size(); ++e) {
            T w;
            std::memcpy(&w, &copies[x][e * sizeof(T)], sizeof w);
            std::fprintf(stderr, " %.17g", double(w));
          }
          std::fprintf(stderr, "\n");
        }
      if (tame && (r == LSE ? std::isnan(v) : !std::isfinite(v)))
        bug("non-finite output (role " + std::to_string(r) + " element " + std::to_string(i) + ": " +
            std::to_string(double(v)) + ") for tame inputs: " + describe(p));
    }
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  return in.ConsumeBool() ? run<double>(in) : run<float>(in);
}
