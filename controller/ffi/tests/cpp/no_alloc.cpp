// A C++ handler loop under the allocation trap (rtdeploy_malloc_trap.c
// linked): a phased loop sends by loan and by copy, a watcher receives,
// fetches and reads its context, every handler armed by the loop.
//
//   no_alloc count SHM_DIR N      counts: prints "allocations 0"
//   no_alloc control SHM_DIR N    the watcher also does `new int`: prints
//                                 "allocations N" (the trap sees C++'s new)
//   no_alloc abort SHM_DIR N      the watcher makes a std::vector with the
//                                 trap set to abort: the process aborts
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "rtdeploy.hpp"

struct Sample {
    std::uint64_t seq;
    std::uint64_t echo;
};

static const rtd_type sample_type = {"Sample", sizeof(Sample), alignof(Sample), 0x5a5a5a5a12345678ull};
inline const rtd_type &rtd_type_of(const Sample *) { return sample_type; }

static int *volatile sink;

int main(int argc, char **argv) {
    if (argc != 4) {
        return 2;
    }
    const char *mode = argv[1];
    const std::uint64_t n = std::strtoull(argv[3], nullptr, 10);
    auto lp = rtdeploy::Loop::create(argv[2], "cpp-no-alloc");
    if (!lp) {
        std::fprintf(stderr, "loop: %s\n", lp.status().message.c_str());
        return 2;
    }
    auto out = lp->sender<Sample>("/na/cpp");
    auto fetch = lp->fetcher<Sample>("/na/cpp");
    if (!out || !fetch) {
        std::fprintf(stderr, "sender or fetcher: %s %s\n", out.status().message.c_str(),
                     fetch.status().message.c_str());
        return 2;
    }
    // Allocations outside the handlers (set-up) are not counted.
    auto scratch = std::make_unique<std::vector<int>>(100);
    std::uint64_t sent = 0, got = 0, kept = 0;
    auto *s = &*out;
    auto *f = &*fetch;
    const bool control = std::strcmp(mode, "control") == 0;
    const bool abort_mode = std::strcmp(mode, "abort") == 0;
    auto tick = lp->phased_loop("send", std::chrono::microseconds(200), std::chrono::nanoseconds(0),
                                [&, s](rtdeploy::Ctx &) {
                                    if (sent == n) {
                                        return;
                                    }
                                    if (sent % 2 == 0) {
                                        auto m = s->loan();
                                        m->seq = sent;
                                        m->echo = 0;
                                        m.send();
                                    } else {
                                        Sample m{sent, 0};
                                        s->send(m);
                                    }
                                    sent++;
                                });
    auto w = lp->watch<Sample>("/na/cpp", [&, f](rtdeploy::Ctx &ctx, const Sample &m) {
        got++;
        (void)ctx.latency();
        (void)ctx.lost_before();
        if (const Sample *latest = f->latest()) {
            kept += latest->seq;
        }
        if (control) {
            // Through a volatile pointer: a new-expression whose pointer
            // does not escape may be elided by the compiler.
            sink = new int(static_cast<int>(m.seq));
            kept += static_cast<std::uint64_t>(*sink);
            delete sink;
        }
        if (abort_mode) {
            std::vector<int> v(16);
            kept += v.size();
        }
        if (got == n) {
            ctx.exit();
        }
    });
    if (!tick || !w) {
        return 2;
    }
    lp->trap_handlers(abort_mode ? RTD_TRAP_ABORT : RTD_TRAP_COUNT);
    rtdeploy::Status r = lp->run();
    if (!r) {
        std::fprintf(stderr, "run: %s\n", r.message.c_str());
        return 2;
    }
    std::printf("sent %" PRIu64 ", received %" PRIu64 ", allocations %" PRIu64 " (%" PRIu64 ")\n", sent, got,
                rtdeploy::allocations(), kept);
    return 0;
}
