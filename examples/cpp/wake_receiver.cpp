// The receiving side of `deploy bench wake --cpp-receiver`: a C++ loop
// (rtdeploy.hpp over the C ABI) that watches the bench's channel and
// records each message's wake latency, as the Rust arm's loop does, so
// that the two are measured by the same harness, interleaved.
//
//   cpp-wake-receiver --channel /bench/wake --count N
//
// It prints `ready <backend> <real-time>` once it watches, and after N
// messages (lost ones counted) `samples <k>` and one latency in ns a line.
// The environment (RTDEPLOY_SHM_DIR, the wake class and backend) is the
// bench's; the latencies go into memory reserved before the loop runs.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "WakeStamp.h"
#include "common.hpp"
#include "rtdeploy.hpp"

int main(int argc, char **argv) {
    Args a = Args::parse(argc, argv);
    // The bench's sender publishes until told to stop: a count of 0 or one
    // past what memory holds is refused rather than guessed.
    if (a.count == 0 || a.count > 50000000ULL) {
        std::fprintf(stderr, "cpp-wake-receiver: --count must be 1 to 50000000\n");
        return 2;
    }
    std::vector<std::uint64_t> lat;
    lat.reserve(a.count);
    auto lp = rtdeploy::Loop::create();
    check("cpp-wake-receiver", "loop", lp.status());
    std::uint64_t got = 0;
    const std::uint64_t total = a.count;
    check("cpp-wake-receiver", "watch",
          lp->watch<WakeStamp>(a.channel.c_str(), [&](rtdeploy::Ctx &ctx, const WakeStamp &) {
              if (lat.size() < lat.capacity()) {
                  lat.push_back(static_cast<std::uint64_t>(ctx.latency().count()));
              }
              got += 1 + ctx.lost_before();
              if (got >= total) {
                  ctx.exit();
              }
          }));
    std::printf("ready %s %d\n", lp->backend(), lp->real_time() ? 1 : 0);
    std::fflush(stdout);
    check("cpp-wake-receiver", "run", lp->run());
    std::printf("samples %zu\n", lat.size());
    for (std::uint64_t v : lat) {
        std::printf("%" PRIu64 "\n", v);
    }
    return 0;
}
