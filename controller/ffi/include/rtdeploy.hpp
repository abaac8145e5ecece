// rtdeploy.hpp: the runtime for C++ controllers, header only, over
// rtdeploy.h (C++17; builds with -Wall -Wextra -Werror and with
// -fno-exceptions: no call throws, failures are returned).
//
//   auto lp = rtdeploy::Loop::create();          // from the supervisor's environment
//   if (!lp) { std::fprintf(stderr, "%s\n", lp.status().message.c_str()); return 2; }
//   auto out = lp->sender<Chatter>("/demo/chatter");
//   lp->phased_loop("talk", 1ms, 0ns, [&](rtdeploy::Ctx &ctx) {
//       auto m = out->loan();                    // written in place
//       m->seq = seq++;
//       m.send();
//   });
//   lp->watch<Chatter>("/demo/chatter", [&](rtdeploy::Ctx &ctx, const Chatter &m) { ... });
//   lp->run();
//
// A message type T is a struct `deploy gen --lang c` wrote from its
// description: its header gives `rtd_type_of(const T *)`, the record a
// channel checks at open (a channel of another type is refused, both
// named).
//
// What it keeps: a handler is stored as its own type, never in a
// std::function, so its captures are moved once, when it is added, and
// calling it allocates nothing; sends, loans, fetches and the context
// allocate nothing (the C interface's promise). Making a loop, a sender,
// a fetcher, a watcher or a timer allocates: do it before run(). A
// handler must not throw (an exception thrown through the runtime aborts
// the process): build handlers noexcept or with -fno-exceptions.
#ifndef RTDEPLOY_HPP
#define RTDEPLOY_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rtdeploy.h"

namespace rtdeploy {

// What a call did: RTD_OK, or a status and the library's message.
struct Status {
    rtd_status code = RTD_OK;
    std::string message;

    bool ok() const { return code == RTD_OK; }
    explicit operator bool() const { return ok(); }
    const char *name() const { return rtd_status_name(code); }

    // The status of the C call that returned `s` (its message copied:
    // set-up and error paths only).
    static Status of(rtd_status s) {
        Status st;
        st.code = s;
        if (s != RTD_OK) {
            st.message = rtd_last_error();
        }
        return st;
    }
};

// A value or why there is none.
template <class T>
class Result {
  public:
    Result(T v) : value_(std::move(v)) {}
    Result(Status s) : status_(std::move(s)) {}

    bool ok() const { return value_.has_value(); }
    explicit operator bool() const { return ok(); }
    T &operator*() { return *value_; }
    T *operator->() { return &*value_; }
    const Status &status() const { return status_; }

  private:
    std::optional<T> value_;
    Status status_;
};

// The record of T a channel checks: from its generated header.
template <class T>
const rtd_type &type_of() {
    static_assert(std::is_trivially_copyable<T>::value, "a channel's type is plain data");
    return rtd_type_of(static_cast<const T *>(nullptr));
}

// The context of one handler call.
class Ctx {
  public:
    explicit Ctx(rtd_ctx *c) : c_(c) {}
    std::chrono::nanoseconds now() const { return ns(rtd_ctx_now_ns(c_)); }
    // A message's send time, a timer's deadline.
    std::chrono::nanoseconds event_time() const { return ns(rtd_ctx_event_time_ns(c_)); }
    std::chrono::nanoseconds latency() const { return ns(rtd_ctx_latency_ns(c_)); }
    std::uint64_t missed_cycles() const { return rtd_ctx_missed_cycles(c_); }
    std::uint64_t lost_before() const { return rtd_ctx_lost_before(c_); }
    // Ends the loop's run once this handler returns.
    void exit() { rtd_ctx_exit(c_); }

  private:
    static std::chrono::nanoseconds ns(std::uint64_t v) {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(v));
    }
    rtd_ctx *c_;
};

// A message of T written in place in the channel's slot; send() publishes
// it, dropping it unsent gives the slot back.
template <class T>
class Loan {
  public:
    Loan(Loan &&o) noexcept : s_(o.s_), msg_(o.msg_), status_(o.status_) { o.s_ = nullptr; }
    Loan(const Loan &) = delete;
    Loan &operator=(const Loan &) = delete;
    Loan &operator=(Loan &&) = delete;
    ~Loan() {
        if (s_ != nullptr && msg_ != nullptr) {
            rtd_loan_cancel(s_);
        }
    }

    // Whether the loan was given (else status() says why).
    explicit operator bool() const { return msg_ != nullptr; }
    rtd_status status() const { return status_; }
    T &operator*() { return *msg_; }
    T *operator->() { return msg_; }

    rtd_status send() {
        if (s_ == nullptr || msg_ == nullptr) {
            return status_ != RTD_OK ? status_ : RTD_ERR_STATE;
        }
        rtd_status s = rtd_loan_send(s_);
        s_ = nullptr;
        return s;
    }

  private:
    template <class>
    friend class Sender;
    explicit Loan(rtd_sender *s) : s_(s) {
        void *p = nullptr;
        status_ = rtd_loan(s, &p);
        msg_ = status_ == RTD_OK ? std::launder(static_cast<T *>(p)) : nullptr;
    }
    rtd_sender *s_;
    T *msg_ = nullptr;
    rtd_status status_ = RTD_OK;
};

// A publisher of T on one channel.
template <class T>
class Sender {
  public:
    Sender(Sender &&) noexcept = default;
    Sender &operator=(Sender &&) noexcept = default;

    // A copy of `m`; allocates nothing.
    rtd_status send(const T &m) { return rtd_send(s_.get(), &m, sizeof(T)); }
    // The next message's slot, to write in place; allocates nothing.
    Loan<T> loan() { return Loan<T>(s_.get()); }

  private:
    friend class Loop;
    struct Free {
        void operator()(rtd_sender *s) const { rtd_sender_free(s); }
    };
    explicit Sender(rtd_sender *s) : s_(s) {}
    std::unique_ptr<rtd_sender, Free> s_;
};

// A reader of T that never wakes the loop.
template <class T>
class Fetcher {
  public:
    Fetcher(Fetcher &&) noexcept = default;
    Fetcher &operator=(Fetcher &&) noexcept = default;

    // The newest message not fetched yet, or nullptr (also on a fault:
    // status() says which); valid until the next call.
    const T *latest() { return get(rtd_fetch_latest); }
    // The next message in order, or nullptr.
    const T *next() { return get(rtd_fetch_next); }
    rtd_status status() const { return status_; }
    std::uint64_t lost() const { return rtd_fetcher_lost(f_.get()); }

  private:
    friend class Loop;
    struct Free {
        void operator()(rtd_fetcher *f) const { rtd_fetcher_free(f); }
    };
    explicit Fetcher(rtd_fetcher *f) : f_(f) {}
    const T *get(rtd_status (*fetch)(rtd_fetcher *, const void **)) {
        const void *p = nullptr;
        status_ = fetch(f_.get(), &p);
        return status_ == RTD_OK ? static_cast<const T *>(p) : nullptr;
    }
    std::unique_ptr<rtd_fetcher, Free> f_;
    rtd_status status_ = RTD_OK;
};

// A timer's handle: disable or reschedule it.
class Timer {
  public:
    void disable() { rtd_timer_disable(t_.get()); }
    void schedule(std::chrono::nanoseconds deadline, std::chrono::nanoseconds period) {
        rtd_timer_schedule(t_.get(), static_cast<std::uint64_t>(deadline.count()),
                           static_cast<std::uint64_t>(period.count()));
    }

  private:
    friend class Loop;
    struct Free {
        void operator()(rtd_timer *t) const { rtd_timer_free(t); }
    };
    explicit Timer(rtd_timer *t) : t_(t) {}
    std::unique_ptr<rtd_timer, Free> t_;
};

// An event loop and the handlers it calls (owned here, each stored as
// its own type).
class Loop {
  public:
    // From the supervisor's environment; shm_dir and process replace it
    // when given (see rtd_loop_new).
    static Result<Loop> create(const char *shm_dir = nullptr, const char *process = nullptr) {
        rtd_loop *lp = nullptr;
        rtd_status s = rtd_loop_new(shm_dir, process, &lp);
        if (s != RTD_OK) {
            return Status::of(s);
        }
        return Loop(lp);
    }

    // Every handler of this loop runs under the allocation trap in `mode`
    // (RTD_TRAP_COUNT, RTD_TRAP_ABORT; RTD_TRAP_OFF, the default, arms
    // nothing): with rtdeploy_malloc_trap.c linked, C++'s allocations are
    // seen as well as the runtime's.
    void trap_handlers(rtd_alloc_trap mode) { *trap_ = mode; }

    Loop(Loop &&) noexcept = default;
    Loop &operator=(Loop &&) noexcept = default;
    ~Loop() {
        // The loop first: it calls the handlers, which go after it.
        lp_.reset();
        handlers_.clear();
    }

    Status run() { return Status::of(rtd_loop_run(lp_.get())); }
    const char *backend() const { return rtd_loop_backend(lp_.get()); }
    bool real_time() const { return rtd_loop_real_time(lp_.get()) != 0; }
    std::chrono::nanoseconds now() const {
        return std::chrono::nanoseconds(static_cast<std::int64_t>(rtd_loop_now_ns(lp_.get())));
    }
    rtd_loop *get() { return lp_.get(); }

    template <class T>
    Result<Sender<T>> sender(const char *channel) {
        rtd_sender *s = nullptr;
        rtd_status st = rtd_sender_new(lp_.get(), channel, &type_of<T>(), &s);
        if (st != RTD_OK) {
            return Status::of(st);
        }
        return Sender<T>(s);
    }

    template <class T>
    Result<Fetcher<T>> fetcher(const char *channel) {
        rtd_fetcher *f = nullptr;
        rtd_status st = rtd_fetcher_new(lp_.get(), channel, &type_of<T>(), &f);
        if (st != RTD_OK) {
            return Status::of(st);
        }
        return Fetcher<T>(f);
    }

    // f(Ctx &, const T &) for every message of `channel` from now on.
    template <class T, class F>
    Status watch(const char *channel, F &&f) {
        auto h = std::make_unique<Handler<std::decay_t<F>>>(std::forward<F>(f), trap_.get());
        auto *raw = h.get();
        rtd_status st = rtd_watch(lp_.get(), channel, &type_of<T>(), &call_watch<T, std::decay_t<F>>, raw);
        if (st == RTD_OK) {
            handlers_.push_back(std::move(h));
        }
        return Status::of(st);
    }

    // f(Ctx &) at first_deadline on the loop's clock, then every period (0: once).
    template <class F>
    Result<Timer> timer(const char *name, std::chrono::nanoseconds first_deadline,
                        std::chrono::nanoseconds period, F &&f) {
        auto h = std::make_unique<Handler<std::decay_t<F>>>(std::forward<F>(f), trap_.get());
        rtd_timer *t = nullptr;
        rtd_status st = rtd_timer_add(lp_.get(), name, static_cast<std::uint64_t>(first_deadline.count()),
                                      static_cast<std::uint64_t>(period.count()),
                                      &call_timer<std::decay_t<F>>, h.get(), &t);
        if (st != RTD_OK) {
            return Status::of(st);
        }
        handlers_.push_back(std::move(h));
        return Timer(t);
    }

    // f(Ctx &) at every k * period + offset of the loop's clock.
    template <class F>
    Result<Timer> phased_loop(const char *name, std::chrono::nanoseconds period,
                              std::chrono::nanoseconds offset, F &&f) {
        auto h = std::make_unique<Handler<std::decay_t<F>>>(std::forward<F>(f), trap_.get());
        rtd_timer *t = nullptr;
        rtd_status st = rtd_phased_loop_add(lp_.get(), name, static_cast<std::uint64_t>(period.count()),
                                            static_cast<std::uint64_t>(offset.count()),
                                            &call_timer<std::decay_t<F>>, h.get(), &t);
        if (st != RTD_OK) {
            return Status::of(st);
        }
        handlers_.push_back(std::move(h));
        return Timer(t);
    }

    // The loop's timing report now (allocates: a diagnostic).
    std::vector<rtd_report_entry> report() const {
        std::vector<rtd_report_entry> v(16);
        std::size_t n = 0;
        if (rtd_loop_report(lp_.get(), v.data(), v.size(), &n) != RTD_OK) {
            return {};
        }
        if (n > v.size()) {
            v.resize(n);
            if (rtd_loop_report(lp_.get(), v.data(), v.size(), &n) != RTD_OK) {
                return {};
            }
        }
        v.resize(n < v.size() ? n : v.size());
        return v;
    }

  private:
    struct HandlerBase {
        virtual ~HandlerBase() = default;
    };
    template <class F>
    struct Handler final : HandlerBase {
        Handler(F &&g, const rtd_alloc_trap *t) : f(std::move(g)), trap(t) {}
        Handler(const F &g, const rtd_alloc_trap *t) : f(g), trap(t) {}
        F f;
        // The loop's trap mode (the loop owns it, at a fixed address).
        const rtd_alloc_trap *trap;
    };
    // Arms the loop's trap for one handler call (nothing when it is off).
    class Armed {
      public:
        explicit Armed(rtd_alloc_trap mode)
            : on_(mode != RTD_TRAP_OFF), prev_(on_ ? rtd_set_alloc_trap(mode) : RTD_TRAP_OFF) {}
        Armed(const Armed &) = delete;
        Armed &operator=(const Armed &) = delete;
        ~Armed() {
            if (on_) {
                rtd_set_alloc_trap(prev_);
            }
        }

      private:
        bool on_;
        rtd_alloc_trap prev_;
    };
    template <class T, class F>
    static void call_watch(rtd_ctx *c, const void *msg, std::size_t, void *user) {
        auto *h = static_cast<Handler<F> *>(user);
        Armed armed(*h->trap);
        Ctx ctx(c);
        h->f(ctx, *static_cast<const T *>(msg));
    }
    template <class F>
    static void call_timer(rtd_ctx *c, void *user) {
        auto *h = static_cast<Handler<F> *>(user);
        Armed armed(*h->trap);
        Ctx ctx(c);
        h->f(ctx);
    }
    struct Free {
        void operator()(rtd_loop *lp) const { rtd_loop_free(lp); }
    };
    explicit Loop(rtd_loop *lp) : lp_(lp), trap_(std::make_unique<rtd_alloc_trap>(RTD_TRAP_OFF)) {}

    std::unique_ptr<rtd_loop, Free> lp_;
    std::vector<std::unique_ptr<HandlerBase>> handlers_;
    std::unique_ptr<rtd_alloc_trap> trap_;
};

// This thread's allocation trap for a scope (see rtd_set_alloc_trap);
// the previous mode comes back at the scope's end.
class AllocTrapScope {
  public:
    explicit AllocTrapScope(rtd_alloc_trap mode) : prev_(rtd_set_alloc_trap(mode)) {}
    AllocTrapScope(const AllocTrapScope &) = delete;
    AllocTrapScope &operator=(const AllocTrapScope &) = delete;
    ~AllocTrapScope() { rtd_set_alloc_trap(prev_); }

  private:
    rtd_alloc_trap prev_;
};

// Allocations this thread made while its trap counted.
inline std::uint64_t allocations() { return rtd_allocations(); }

// Locks the process's memory and touches stack and heap (see rtd_lock_memory).
inline Status lock_memory(std::size_t stack_bytes, std::size_t heap_bytes) {
    return Status::of(rtd_lock_memory(stack_bytes, heap_bytes));
}

}  // namespace rtdeploy

#endif  // RTDEPLOY_HPP
