// What the C++ example controllers share: their command line (as the Rust
// examples': --channel, --every, --count, --period-us) and the start every
// real-time controller makes (memory locked, heap prefaulted).
#ifndef RTDEPLOY_EXAMPLES_COMMON_HPP
#define RTDEPLOY_EXAMPLES_COMMON_HPP

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rtdeploy.hpp"

struct Args {
    std::string channel = "/demo/chatter";
    unsigned long long every = 1000;
    unsigned long long count = 0;
    unsigned long long period_us = 1000;
    // --trap count|abort: the handlers run under the allocation trap
    // (rtdeploy_malloc_trap.c linked sees C++'s allocations too).
    rtd_alloc_trap trap = RTD_TRAP_OFF;

    static Args parse(int argc, char **argv) {
        Args a;
        for (int i = 1; i + 1 < argc; i += 2) {
            const char *k = argv[i];
            const char *v = argv[i + 1];
            if (std::strcmp(k, "--channel") == 0) {
                a.channel = v;
            } else if (std::strcmp(k, "--every") == 0) {
                a.every = std::strtoull(v, nullptr, 10);
            } else if (std::strcmp(k, "--count") == 0) {
                a.count = std::strtoull(v, nullptr, 10);
            } else if (std::strcmp(k, "--period-us") == 0) {
                a.period_us = std::strtoull(v, nullptr, 10);
            } else if (std::strcmp(k, "--trap") == 0) {
                a.trap = std::strcmp(v, "abort") == 0 ? RTD_TRAP_ABORT
                         : std::strcmp(v, "count") == 0 ? RTD_TRAP_COUNT
                                                         : RTD_TRAP_OFF;
            } else {
                std::fprintf(stderr, "unknown option %s\n", k);
                std::exit(2);
            }
        }
        if (a.every == 0) {
            a.every = 1;
        }
        return a;
    }
};

// Dies with the status's message.
inline void check(const char *role, const char *what, const rtdeploy::Status &s) {
    if (!s.ok()) {
        std::fprintf(stderr, "%s: %s: %s: %s\n", role, what, s.name(), s.message.c_str());
        std::exit(2);
    }
}

// Memory locked and 1 MiB of heap touched, as the Rust examples do (a
// warning only where the limit refuses: a development machine).
inline void lock(const char *role) {
    rtdeploy::Status s = rtdeploy::lock_memory(256 << 10, 1 << 20);
    if (!s.ok()) {
        std::fprintf(stderr, "%s: warning: %s\n", role, s.message.c_str());
    }
}

#endif
