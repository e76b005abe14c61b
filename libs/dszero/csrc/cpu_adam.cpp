// Fused CPU Adam/AdamW step for ZeRO's CPU optimizer offload.
//
// One pass over memory per tensor: read param, grad, exp_avg, exp_avg_sq, write param, the two
// moments and optionally a bf16/fp16 copy of the param. The step is memory bound, so the point is
// to touch each byte once and keep every core streaming. No torch headers: Python hands over data
// pointers and element counts after checking dtype, device and contiguity (see cpu_adam.py).
//
// The arithmetic follows torch.optim.Adam/AdamW's single-tensor path operation by operation, fusing
// a multiply-add exactly where ATen's vectorised kernels do (lerp, addcmul, add with alpha) and
// nowhere else (built with -ffp-contract=off), so most elements agree with torch bit for bit. The loop body is written once and compiled three times
// (generic x86-64, AVX2, AVX-512) through target attributes; the widest one the CPU supports is
// picked at run time, so the wheel needs no -march flag and runs on any x86-64 CPU.

#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace py = pybind11;

namespace {

// Dtype codes shared with dszero/ops/cpu_adam.py.
enum class Dtype : int { f32 = 0, bf16 = 1, f16 = 2, none = 3 };

#define DSZ_INLINE inline __attribute__((always_inline))

DSZ_INLINE uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

DSZ_INLINE float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

DSZ_INLINE float load(float x) { return x; }
DSZ_INLINE float load(uint16_t bf16) { return float_of(uint32_t(bf16) << 16); }

// Round to nearest even, as torch's float->bfloat16 cast does (NaN becomes torch's quiet NaN).
DSZ_INLINE uint16_t to_bf16(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FC0u) : uint16_t(rounded);
}

// Round to nearest even float->half. All three regimes are computed and one selected, so the
// loop stays branch-free and vectorises; subnormals let the FPU's own rounding place the bits.
DSZ_INLINE uint16_t to_f16(float f) {
  uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  const uint32_t inf_or_nan = u > 0x7F800000u ? 0x7E00u : 0x7C00u;
  const uint32_t subnormal = bits_of(float_of(u) + 0.5f) - 0x3F000000u;
  const uint32_t normal = (u + 0xC8000FFFu + ((u >> 13) & 1u)) >> 13;  // rebias exponent by -112
  const uint32_t half = u >= 0x47800000u ? inf_or_nan : (u < 0x38800000u ? subnormal : normal);
  return uint16_t(half | sign);
}

// ATen fuses these multiply-adds on FMA hardware; without FMA a libm fmaf call would cost more than
// the ulp it saves, so the generic build rounds twice.
template <bool kFma>
DSZ_INLINE float mul_add(float a, float b, float c) {
  if constexpr (kFma) return std::fma(a, b, c);
  return a * b + c;
}

DSZ_INLINE void store(float& dst, float x) { dst = x; }
DSZ_INLINE void store(uint16_t& dst, float x) { dst = to_bf16(x); }

// Per-step scalars, already rounded to float the way torch rounds its Python-float arguments.
struct Hyper {
  float decay;          // AdamW's param multiplier 1 - lr*wd (1 when there is no decoupled decay)
  float l2;             // Adam's weight decay folded into the gradient
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;
  float neg_step_size;  // -lr / bias_correction1
  float eps;
};

struct Job {
  float* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  uint16_t* low_copy;
  Hyper h;
};

template <bool kFma, typename GradT, typename StateT, Dtype Low, bool L2>
DSZ_INLINE void adam_range(const Job& job, int64_t begin, int64_t end) {
  float* __restrict p = job.param + begin;
  const GradT* __restrict g = static_cast<const GradT*>(job.grad) + begin;
  StateT* __restrict m = static_cast<StateT*>(job.exp_avg) + begin;
  StateT* __restrict v = static_cast<StateT*>(job.exp_avg_sq) + begin;
  uint16_t* __restrict low = job.low_copy + (Low == Dtype::none ? 0 : begin);
  // Local copies: the vectoriser must see these as loop invariants, not loads through `job`.
  const float decay = job.h.decay, l2 = job.h.l2, one_minus_beta1 = job.h.one_minus_beta1,
              beta2 = job.h.beta2, one_minus_beta2 = job.h.one_minus_beta2,
              bias_correction2_sqrt = job.h.bias_correction2_sqrt, neg_step_size = job.h.neg_step_size,
              eps = job.h.eps;
  const int64_t n = end - begin;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float grad = load(g[i]);
    float param = p[i];
    if constexpr (L2) grad = mul_add<kFma>(l2, param, grad);                     // grad.add(param, alpha=wd)
    param = param * decay;                                                       // param.mul_(1 - lr*wd)
    float avg = load(m[i]);
    avg = mul_add<kFma>(one_minus_beta1, grad - avg, avg);                       // exp_avg.lerp_(grad, 1 - beta1)
    float avg_sq = load(v[i]) * beta2;                                           // exp_avg_sq.mul_(beta2)
    avg_sq = mul_add<kFma>(one_minus_beta2 * grad, grad, avg_sq);                // .addcmul_(g, g, 1 - beta2)
    const float denom = std::sqrt(avg_sq) / bias_correction2_sqrt + eps;
    param = param + neg_step_size * avg / denom;                                 // param.addcdiv_(avg, denom, -step_size)
    p[i] = param;
    store(m[i], avg);
    store(v[i], avg_sq);
    if constexpr (Low == Dtype::bf16) low[i] = to_bf16(param);
    if constexpr (Low == Dtype::f16) low[i] = to_f16(param);
  }
}

using ChunkFn = void (*)(const Job&, int64_t, int64_t);

// The same loop body compiled for three instruction sets; adam_range inlines into each wrapper and
// is vectorised with the wrapper's target.
struct Generic {
  static constexpr const char* name = "generic";
  template <typename G, typename S, Dtype Low, bool L2>
  static void run(const Job& job, int64_t begin, int64_t end) {
    adam_range<false, G, S, Low, L2>(job, begin, end);
  }
};

struct Avx2 {
  static constexpr const char* name = "avx2";
  template <typename G, typename S, Dtype Low, bool L2>
  __attribute__((target("avx2,fma,f16c"))) static void run(const Job& job, int64_t begin, int64_t end) {
    adam_range<true, G, S, Low, L2>(job, begin, end);
  }
};

struct Avx512 {
  static constexpr const char* name = "avx512";
  template <typename G, typename S, Dtype Low, bool L2>
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) static void run(
      const Job& job, int64_t begin, int64_t end) {
    adam_range<true, G, S, Low, L2>(job, begin, end);
  }
};

template <typename Isa, typename G, typename S, Dtype Low>
ChunkFn pick_l2(bool l2) {
  return l2 ? &Isa::template run<G, S, Low, true> : &Isa::template run<G, S, Low, false>;
}

template <typename Isa, typename G, typename S>
ChunkFn pick_low(Dtype low, bool l2) {
  switch (low) {
    case Dtype::bf16: return pick_l2<Isa, G, S, Dtype::bf16>(l2);
    case Dtype::f16: return pick_l2<Isa, G, S, Dtype::f16>(l2);
    default: return pick_l2<Isa, G, S, Dtype::none>(l2);
  }
}

template <typename Isa, typename G>
ChunkFn pick_state(Dtype state, Dtype low, bool l2) {
  return state == Dtype::bf16 ? pick_low<Isa, G, uint16_t>(low, l2) : pick_low<Isa, G, float>(low, l2);
}

template <typename Isa>
ChunkFn pick_kernel(Dtype grad, Dtype state, Dtype low, bool l2) {
  return grad == Dtype::bf16 ? pick_state<Isa, uint16_t>(state, low, l2)
                             : pick_state<Isa, float>(state, low, l2);
}

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

std::string best_isa() {
  if (cpu_has_avx512()) return Avx512::name;
  if (cpu_has_avx2()) return Avx2::name;
  return Generic::name;
}

ChunkFn select_kernel(const std::string& isa, Dtype grad, Dtype state, Dtype low, bool l2) {
  const std::string chosen = isa == "auto" ? best_isa() : isa;
  if (chosen == Avx512::name) {
    if (!cpu_has_avx512()) throw std::invalid_argument("isa='avx512' requested but this CPU lacks AVX-512");
    return pick_kernel<Avx512>(grad, state, low, l2);
  }
  if (chosen == Avx2::name) {
    if (!cpu_has_avx2()) throw std::invalid_argument("isa='avx2' requested but this CPU lacks AVX2/FMA/F16C");
    return pick_kernel<Avx2>(grad, state, low, l2);
  }
  if (chosen == Generic::name) return pick_kernel<Generic>(grad, state, low, l2);
  throw std::invalid_argument("isa must be 'auto', 'avx512', 'avx2' or 'generic', got '" + isa + "'");
}

// Below this many elements per thread, waking a thread costs more than the work it takes over.
constexpr int64_t kMinElementsPerThread = int64_t(1) << 15;
// Work is handed out in blocks claimed on demand, not one static slice per thread: the CPUs are
// shared, and a thread that loses its core would otherwise hold up the whole step. A block is
// 256 KiB of fp32 per array (small enough to balance, large enough to amortise the claim) and a
// multiple of 64 elements, so blocks split no cache line in fp32 or 16-bit arrays.
constexpr int64_t kBlock = int64_t(1) << 16;

void run_threads(ChunkFn kernel, const Job& job, int64_t n, int threads) {
  const int64_t useful = std::max<int64_t>(1, n / kMinElementsPerThread);
  const int nthreads = int(std::min<int64_t>(std::max(threads, 1), useful));
  if (nthreads == 1) {
    kernel(job, 0, n);
    return;
  }
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
  for (int64_t b = 0; b < nblocks; ++b) kernel(job, b * kBlock, std::min(n, (b + 1) * kBlock));
#else
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t b = next++; b < nblocks; b = next++) kernel(job, b * kBlock, std::min(n, (b + 1) * kBlock));
  };
  std::vector<std::thread> helpers;
  helpers.reserve(nthreads - 1);
  for (int t = 1; t < nthreads; ++t) helpers.emplace_back(worker);
  worker();
  for (auto& h : helpers) h.join();
#endif
}

Dtype dtype_from_code(int code, const char* what, bool allow_none) {
  if (code == int(Dtype::f32) || code == int(Dtype::bf16) || code == int(Dtype::f16) ||
      (allow_none && code == int(Dtype::none)))
    return Dtype(code);
  throw std::invalid_argument(std::string("unknown dtype code for ") + what + ": " + std::to_string(code));
}

void adam_step(uintptr_t param, uintptr_t grad, int grad_dtype, uintptr_t exp_avg, uintptr_t exp_avg_sq,
               int state_dtype, uintptr_t low_copy, int low_dtype, int64_t numel, int64_t step, double lr,
               double beta1, double beta2, double eps, double weight_decay, bool adamw_mode,
               bool bias_correction, int threads, const std::string& isa) {
  const Dtype g = dtype_from_code(grad_dtype, "grad", false);
  const Dtype s = dtype_from_code(state_dtype, "exp_avg/exp_avg_sq", false);
  const Dtype low = dtype_from_code(low_dtype, "low_precision_copy", true);
  if (g == Dtype::f16 || s == Dtype::f16)
    throw std::invalid_argument("grad and optimizer state must be float32 or bfloat16");
  if (low == Dtype::f32) throw std::invalid_argument("low_precision_copy must be bfloat16 or float16");
  if (numel < 0) throw std::invalid_argument("numel must be >= 0");
  if (step < 1) throw std::invalid_argument("step must be >= 1 (the count including this step)");
  if (numel > 0 && (!param || !grad || !exp_avg || !exp_avg_sq || (low != Dtype::none && !low_copy)))
    throw std::invalid_argument("null data pointer");

  const bool l2 = !adamw_mode && weight_decay != 0.0;
  const double bias_correction1 = bias_correction ? 1.0 - std::pow(beta1, double(step)) : 1.0;
  const double bias_correction2 = bias_correction ? 1.0 - std::pow(beta2, double(step)) : 1.0;
  Job job;
  job.param = reinterpret_cast<float*>(param);
  job.grad = reinterpret_cast<const void*>(grad);
  job.exp_avg = reinterpret_cast<void*>(exp_avg);
  job.exp_avg_sq = reinterpret_cast<void*>(exp_avg_sq);
  job.low_copy = reinterpret_cast<uint16_t*>(low_copy);
  job.h.decay = adamw_mode && weight_decay != 0.0 ? float(1.0 - lr * weight_decay) : 1.0f;
  job.h.l2 = float(weight_decay);
  job.h.one_minus_beta1 = float(1.0 - beta1);
  job.h.beta2 = float(beta2);
  job.h.one_minus_beta2 = float(1.0 - beta2);
  job.h.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  job.h.neg_step_size = float(-(lr / bias_correction1));
  job.h.eps = float(eps);

  const ChunkFn kernel = select_kernel(isa, g, s, low, l2);
  if (numel == 0) return;
  py::gil_scoped_release no_gil;
  run_threads(kernel, job, numel, threads);
}

}  // namespace

PYBIND11_MODULE(_cpu_adam, m) {
  m.doc() = "dszero's fused CPU Adam/AdamW kernel (raw pointers; use dszero.ops.cpu_adam_step).";
  m.def("adam_step", &adam_step, py::arg("param"), py::arg("grad"), py::arg("grad_dtype"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("state_dtype"), py::arg("low_copy"), py::arg("low_dtype"),
        py::arg("numel"), py::arg("step"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("adamw_mode"), py::arg("bias_correction"), py::arg("threads"),
        py::arg("isa") = "auto");
  m.def("best_isa", &best_isa, "The widest instruction set this CPU runs the kernel with.");
#ifdef _OPENMP
  m.attr("threading") = "openmp";
#else
  m.attr("threading") = "std::thread";
#endif
}
