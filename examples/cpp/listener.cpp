// Example controller in C++: receives the talker's counter and checks that
// every sequence number comes, in order, once.
//
//   cpp-listener [--channel /demo/chatter] [--every 1000] [--count N] [--trap count|abort]
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "Chatter.h"
#include "common.hpp"
#include "rtdeploy.hpp"

int main(int argc, char **argv) {
    Args a = Args::parse(argc, argv);
    lock("cpp-listener");
    auto lp = rtdeploy::Loop::create();
    check("cpp-listener", "loop", lp.status());
    std::printf("cpp-listener: channel %s, backend %s, real-time %d\n", a.channel.c_str(), lp->backend(),
                lp->real_time() ? 1 : 0);
    std::fflush(stdout);
    std::uint64_t got = 0, lost = 0, gaps = 0;
    std::int64_t last = -1;
    std::chrono::nanoseconds worst(0);
    check("cpp-listener", "watch",
          lp->watch<Chatter>(a.channel.c_str(), [&](rtdeploy::Ctx &ctx, const Chatter &m) {
              got++;
              lost += ctx.lost_before();
              if (last >= 0 && m.seq != static_cast<std::uint64_t>(last) + 1) {
                  gaps++;
              }
              last = static_cast<std::int64_t>(m.seq);
              if (ctx.latency() > worst) {
                  worst = ctx.latency();
              }
              if (got % a.every == 0) {
                  std::printf("cpp-listener: received %" PRIu64 " messages (last seq %" PRIu64
                              ", lost %" PRIu64 ", worst latency %.1fus)\n",
                              got, m.seq, lost, static_cast<double>(worst.count()) / 1000.0);
                  std::fflush(stdout);
                  worst = std::chrono::nanoseconds(0);
              }
              if (a.count > 0 && got >= a.count) {
                  ctx.exit();
              }
          }));
    lp->trap_handlers(a.trap);
    check("cpp-listener", "run", lp->run());
    std::printf("cpp-listener: the loop ended after %" PRIu64 " messages (last seq %" PRId64 ", lost %" PRIu64
                ", gaps %" PRIu64 ")\n",
                got, last, lost, gaps);
    if (a.trap == RTD_TRAP_COUNT) {
        std::printf("cpp-listener: %" PRIu64 " allocations in its handlers\n", rtdeploy::allocations());
    }
    return gaps == 0 && lost == 0 ? 0 : 1;
}
