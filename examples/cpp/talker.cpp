// Example controller in C++: publishes a counter from a phased loop, each
// message written in place by a loan (the Rust talker's protocol: its
// listener, in Rust or C++, checks every sequence number).
//
//   cpp-talker [--channel /demo/chatter] [--period-us 1000] [--every 1000] [--count N] [--trap count|abort]
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "Chatter.h"
#include "common.hpp"
#include "rtdeploy.hpp"

int main(int argc, char **argv) {
    Args a = Args::parse(argc, argv);
    lock("cpp-talker");
    auto lp = rtdeploy::Loop::create();
    check("cpp-talker", "loop", lp.status());
    auto out = lp->sender<Chatter>(a.channel.c_str());
    check("cpp-talker", "sender", out.status());
    std::printf("cpp-talker: channel %s, backend %s, real-time %d, period %lluus\n", a.channel.c_str(),
                lp->backend(), lp->real_time() ? 1 : 0, a.period_us);
    std::fflush(stdout);
    std::uint64_t seq = 0, errors = 0;
    auto sender = &*out;
    auto tick = lp->phased_loop(
        "talk", std::chrono::microseconds(a.period_us), std::chrono::nanoseconds(0),
        [&, sender](rtdeploy::Ctx &ctx) {
            auto m = sender->loan();
            if (!m) {
                errors++;
                return;
            }
            m->seq = seq;
            m->deadline_ns = static_cast<std::uint64_t>(ctx.event_time().count());
            if (m.send() == RTD_OK) {
                seq++;
            } else {
                errors++;
            }
            if (seq > 0 && seq % a.every == 0) {
                std::printf("cpp-talker: sent %" PRIu64 " messages (errors %" PRIu64 ")\n", seq, errors);
                std::fflush(stdout);
            }
            if (a.count > 0 && seq >= a.count) {
                ctx.exit();
            }
        });
    check("cpp-talker", "phased loop", tick.status());
    lp->trap_handlers(a.trap);
    check("cpp-talker", "run", lp->run());
    std::printf("cpp-talker: the loop ended after %" PRIu64 " messages (errors %" PRIu64 ")\n", seq, errors);
    return 0;
}
