// bench/probes/attention: where attention_fused's time goes. Runs the DQN's fused attention
// kernel (examples/dqn/cuda/attention_fused.cu, included as it is), its fold and its finish
// alone at the step's sizes on random inputs, on several grids, and prints
//   - each one's time (CUDA events around each launch, after warm-up: median of 50);
//   - built with -DAF_PHASE_CLOCKS (af_probe_clocks), the cycles a tile spends in each of
//     the kernel's phases, averaged over the blocks' tiles, and their shares;
//   - checks that can fail: pred the same bits on every grid and finite; the partial rows'
//     column sums (in double) on each grid against those of the first, within 1e-4 of
//     each part's largest magnitude; the finish's sums of the rows equal to those sums in
//     f32, within 1e-5 of each part's largest magnitude.
// The kernel's correctness against a CPU reference is the GPU tests' (tests/gpu/attention.rs).
//
//   ./af_probe [GRID...]          default grids 132 66
//   AF_DUMP=FILE ./af_probe ...    also writes the first grid's pred and gradients to FILE
//   AF_AGAINST=FILE ./af_probe ... and compares them with FILE's (another build's: an A/B
//                                  of kernel variants checks that they compute the same)
// AF_KERNEL (build.sh's KERNEL=...) includes another copy of the kernel, for such an A/B: a
// copy with the same kernels' signatures and partial row (the probe of 84bf607..a74def2's
// copies, before the fold, was the one in git at 6abc4bb).
#ifdef AF_KERNEL
#include AF_KERNEL
#else
#include "../../../examples/dqn/cuda/attention_fused.cu"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,            \
                         cudaGetErrorString(e_));                                      \
            std::exit(2);                                                              \
        }                                                                              \
    } while (0)

static const unsigned kB = 16384;  // the step's batch

static float* upload(const std::vector<float>& h) {
    float* d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(float)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static std::vector<float> uniform(size_t n, float bound, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-bound, bound);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// The parts of a partial row, and the phases the clocks name.
static const unsigned kRowParts[] = {AF_P_G, AF_P_CSQ, AF_P_SUM, AF_P_DBP, AF_P_LOSS, AF_ROW_LEN};
static const int kParts = sizeof(kRowParts) / sizeof(kRowParts[0]) - 1;
static const char* kPhaseNames[] = AF_PHASE_NAMES;
static const int kPhases = sizeof(kPhaseNames) / sizeof(kPhaseNames[0]);

// The largest difference of two partial rows' values, each part's relative to that part's
// largest magnitude in `want` (one scale for the whole row would be the loss's sum).
template <typename T>
static double row_diff(const std::vector<T>& got, const std::vector<double>& want) {
    double worst = 0;
    for (int k = 0; k < kParts; ++k) {
        double scale = 0;
        for (unsigned c = kRowParts[k]; c < kRowParts[k + 1]; ++c)
            scale = std::max(scale, std::fabs(want[c]));
        for (unsigned c = kRowParts[k]; c < kRowParts[k + 1]; ++c)
            if (scale > 0) worst = std::max(worst, std::fabs((double)got[c] - want[c]) / scale);
    }
    return worst;
}

// The finish's outputs, in one order.
static const char* kOutputs[7] = {"dwqkv", "dwemb", "dbemb", "dwo", "dwp", "dbp", "loss"};
static const size_t kOutputLen[7] = {AF_E3 * AF_E, AF_E * AF_S, AF_E, AF_E * AF_E, AF_E, 1, 1};

struct Run {
    unsigned grid;
    float fold_ms, median_ms, finish_ms;
    std::vector<float> pred;
    std::vector<double> colsum;            // over the grid's partial rows
    std::vector<float> summed;             // what the finish took as those sums
    std::vector<std::vector<float>> outs;  // kOutputs
    std::vector<unsigned long long> clocks;  // [grid][AF_PHASES] where built with clocks
};

// The largest elementwise difference of a and b, relative to b's largest magnitude.
static double rel_diff(const float* a, const float* b, size_t n) {
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs((double)b[i]));
    for (size_t i = 0; i < n; ++i)
        if (scale > 0) worst = std::max(worst, std::fabs((double)a[i] - b[i]) / scale);
    return worst;
}

// AF_DUMP writes pred and the finish's outputs (f32, in kOutputs' order); AF_AGAINST reads
// another build's and compares each against its own largest magnitude (the kernels' TF32
// operands allow about 1e-3 between builds that round, or add, differently).
static int dump_or_compare(const Run& run) {
    std::vector<const std::vector<float>*> all = {&run.pred};
    for (const auto& o : run.outs) all.push_back(&o);
    if (const char* path = std::getenv("AF_DUMP")) {
        FILE* f = std::fopen(path, "wb");
        bool ok = f != nullptr;
        for (const auto* v : all) ok = ok && std::fwrite(v->data(), 4, v->size(), f) == v->size();
        if (f) std::fclose(f);
        if (!ok) {
            std::printf("FAIL: cannot write %s\n", path);
            return 1;
        }
    }
    const char* path = std::getenv("AF_AGAINST");
    if (!path) return 0;
    FILE* f = std::fopen(path, "rb");
    std::vector<std::vector<float>> theirs;
    bool ok = f != nullptr;
    for (const auto* v : all) {
        theirs.emplace_back(v->size());
        ok = ok && std::fread(theirs.back().data(), 4, v->size(), f) == v->size();
    }
    if (f) std::fclose(f);
    if (!ok) {
        std::printf("FAIL: cannot read pred and the gradients from %s\n", path);
        return 1;
    }
    int failures = 0;
    std::printf("\nagainst %s:", path);
    for (size_t k = 0; k < all.size(); ++k) {
        const double d = rel_diff(all[k]->data(), theirs[k].data(), all[k]->size());
        std::printf(" %s %.2e", k == 0 ? "pred" : kOutputs[k - 1], d);
        failures += !(d <= 1e-3);
    }
    std::printf(" (of each one's largest magnitude)%s\n", failures ? ": FAIL, more than 1e-3" : "");
    return failures;
}

int main(int argc, char** argv) {
    std::vector<unsigned> grids;
    for (int i = 1; i < argc; ++i) grids.push_back((unsigned)std::strtoul(argv[i], nullptr, 10));
    if (grids.empty()) grids = {132, 66};
    const unsigned tiles = (kB + AF_SAMPLES - 1) / AF_SAMPLES;
    for (unsigned g : grids) {
        if (g == 0 || g > tiles) {
            std::fprintf(stderr, "grid %u: expected 1 to %u blocks\n", g, tiles);
            return 2;
        }
    }

    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int clock_khz = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
#ifdef AF_PHASE_CLOCKS
    const char* build = "with phase clocks";
#else
    const char* build = "without phase clocks";
#endif
    std::printf("device: %s, %d SMs, nominal SM clock %.0f MHz; attention_fused %s\n", prop.name,
                prop.multiProcessorCount, clock_khz / 1e3, build);

    // The GPU tests' initialisation: unit-variance windows and rewards around -1, weights
    // uniform in +-sqrt(3 / fan_in), so that the softmax is far from uniform.
    std::mt19937 rng(20261202);
    const auto win = uniform((size_t)kB * AF_W * AF_S, std::sqrt(3.0f), rng);
    const auto wemb = uniform(AF_E * AF_S, std::sqrt(3.0f / AF_S), rng);
    const auto bemb = uniform(AF_E, std::sqrt(3.0f / AF_S), rng);
    const auto wqkv = uniform(AF_E3 * AF_E, std::sqrt(3.0f / AF_E), rng);
    const auto wo = uniform(AF_E * AF_E, std::sqrt(3.0f / AF_E), rng);
    const auto wp = uniform(AF_E, std::sqrt(3.0f / AF_E), rng);
    const std::vector<float> bp = {0.1f};
    auto r = uniform(kB, std::sqrt(3.0f), rng);
    for (auto& x : r) x -= 1.0f;
    float *d_win = upload(win), *d_wemb = upload(wemb), *d_bemb = upload(bemb),
          *d_wqkv = upload(wqkv), *d_wo = upload(wo), *d_wp = upload(wp), *d_bp = upload(bp),
          *d_r = upload(r);
    const unsigned max_grid = *std::max_element(grids.begin(), grids.end());
    float *d_pred, *d_partials, *d_out[7];
    CK(cudaMalloc(&d_pred, kB * sizeof(float)));
    // One row a block, the row of their sums and the fold (those two at multiples of 4
    // floats: + 8).
    CK(cudaMalloc(&d_partials,
                  ((size_t)(max_grid + 1) * AF_ROW_LEN + 8 + AF_FOLD_LEN) * sizeof(float)));
    for (int k = 0; k < 6; ++k) CK(cudaMalloc(&d_out[k], kOutputLen[k] * sizeof(float)));
    CK(cudaMalloc(&d_out[6], LOSS_SLOT_COUNT * sizeof(float)));  // the loss slots
    CK(cudaFuncSetAttribute(attention_fused, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            AF_SMEM_BYTES));
    const float coef = 0.1f;  // ATTN_LOSS_COEF
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // Median of 50 timed launches after 5 untimed ones.
    auto median_ms = [&](auto launch) {
        for (int i = 0; i < 5; ++i) launch();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int i = 0; i < 50; ++i) {
            CK(cudaEventRecord(e0));
            launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t = 0.0f;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    };

    std::vector<Run> runs;
    for (unsigned g : grids) {
        auto fold = [&]() {
            attention_fused_fold<<<AF_FOLD_BLOCKS, AF_THREADS>>>(d_wemb, d_bemb, d_wqkv, d_wo,
                                                                 d_wp, d_partials, g);
        };
        auto launch = [&]() {
            attention_fused<<<g, AF_THREADS, AF_SMEM_BYTES>>>(d_win, d_bp, d_r, d_pred,
                                                              d_partials, kB, coef);
        };
        auto finish = [&]() {
            attention_fused_sums<<<(AF_ROW_LEN + 31) / 32, dim3(32, 32)>>>(d_partials, g);
            attention_fused_grads<<<AF_GRADS_BLOCKS, AF_THREADS>>>(
                d_partials, g, d_wemb, d_bemb, d_wqkv, d_wo, d_wp, d_out[0], d_out[1], d_out[2],
                d_out[3], d_out[4], d_out[5], d_out[6], kB, coef);
        };
        Run run;
        run.grid = g;
        run.fold_ms = median_ms(fold);
        run.median_ms = median_ms(launch);
        run.finish_ms = median_ms(finish);
#ifdef AF_PHASE_CLOCKS
        std::vector<unsigned long long> zeros((size_t)AF_CLOCK_BLOCKS * AF_PHASES, 0);
        CK(cudaMemcpyToSymbol(af_phase_clocks, zeros.data(), zeros.size() * 8));
        launch();
        CK(cudaDeviceSynchronize());
        run.clocks.resize((size_t)g * AF_PHASES);
        CK(cudaMemcpyFromSymbol(run.clocks.data(), af_phase_clocks, run.clocks.size() * 8));
#else
        launch();
#endif
        run.pred.resize(kB);
        CK(cudaMemcpy(run.pred.data(), d_pred, kB * sizeof(float), cudaMemcpyDeviceToHost));
        std::vector<float> part((size_t)g * AF_ROW_LEN);
        CK(cudaMemcpy(part.data(), d_partials, part.size() * sizeof(float),
                      cudaMemcpyDeviceToHost));
        run.colsum.assign(AF_ROW_LEN, 0.0);
        for (unsigned b = 0; b < g; ++b)
            for (unsigned c = 0; c < AF_ROW_LEN; ++c) run.colsum[c] += part[(size_t)b * AF_ROW_LEN + c];
        CK(cudaMemset(d_out[6], 0, LOSS_SLOT_COUNT * sizeof(float)));
        finish();
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        for (int k = 0; k < 7; ++k) {
            std::vector<float> o(k == 6 ? LOSS_SLOT_COUNT : kOutputLen[k]);
            CK(cudaMemcpy(o.data(), d_out[k], o.size() * sizeof(float), cudaMemcpyDeviceToHost));
            if (k == 6) o = {o[LOSS_ATTN]};
            run.outs.push_back(std::move(o));
        }
        run.summed.resize(AF_ROW_LEN);
        CK(cudaMemcpy(run.summed.data(), af_sums_at(d_partials, g), AF_ROW_LEN * sizeof(float),
                      cudaMemcpyDeviceToHost));
        runs.push_back(std::move(run));
    }

    int failures = 0;
    for (const Run& run : runs) {
        const double per_sm_tiles = (double)tiles / run.grid;
        std::printf("\ngrid %u blocks (%.1f tiles a block): attention_fused %.4f ms, its fold "
                    "%.4f ms, its finish %.4f ms (medians of 50)\n",
                    run.grid, per_sm_tiles, run.median_ms, run.fold_ms, run.finish_ms);
        if (!run.clocks.empty()) {
            std::vector<double> sum(kPhases, 0.0);
            double total = 0;
            for (unsigned b = 0; b < run.grid; ++b)
                for (int p = 0; p < kPhases; ++p)
                    sum[p] += (double)run.clocks[(size_t)b * kPhases + p];
            for (int p = 0; p < kPhases; ++p) total += sum[p];
            std::printf("  %-26s %14s %14s %7s\n", "phase", "cycles a tile", "cycles a block",
                        "share");
            for (int p = 0; p < kPhases; ++p) {
                const bool per_tile = p >= 1 && p <= kPhases - 2;
                std::printf("  %-26s %14.0f %14.0f %6.1f%%\n", kPhaseNames[p],
                            per_tile ? sum[p] / tiles : 0.0, sum[p] / run.grid,
                            100.0 * sum[p] / total);
            }
            const double cycles = total / run.grid;
            std::printf("  a block's cycles %.0f: %.4f ms at the kernel's measured time, so the SMs "
                        "ran at %.0f MHz\n",
                        cycles, run.median_ms, cycles / (run.median_ms * 1e3));
        }
        for (float p : run.pred) {
            if (!std::isfinite(p)) {
                std::printf("  FAIL: a pred is not finite\n");
                ++failures;
                break;
            }
        }
        const Run& first = runs.front();
        if (&run != &first) {
            if (std::memcmp(run.pred.data(), first.pred.data(), kB * sizeof(float)) != 0) {
                std::printf("  FAIL: pred differs from grid %u's (it depends on its sample only)\n",
                            first.grid);
                ++failures;
            }
            const double worst = row_diff(run.colsum, first.colsum);
            std::printf("  partial rows' sums against grid %u's: %.2e of each part's largest magnitude\n",
                        first.grid, worst);
            if (!(worst <= 1e-4)) {
                std::printf("  FAIL: more than 1e-4\n");
                ++failures;
            }
        }
        const double worst = row_diff(run.summed, run.colsum);
        std::printf("  the finish's sums of the rows against the host's: %.2e of each part's "
                    "largest magnitude\n", worst);
        if (!(worst <= 1e-5)) {
            std::printf("  FAIL: more than 1e-5\n");
            ++failures;
        }
    }
    failures += dump_or_compare(runs.front());
    std::printf("\n%s\n", failures ? "FAILED" : "ALL PASSED");
    return failures ? 1 : 0;
}
