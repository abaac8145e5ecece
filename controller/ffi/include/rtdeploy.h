/*
 * rtdeploy.h: the real-time runtime's C interface (librtdeploy.a,
 * librtdeploy.so).
 *
 * Written by hand and checked against the library's source by its tests
 * (controller/ffi/tests/header.rs: every prototype, every struct's size and
 * field offsets, every constant), which CI runs.
 *
 * What holds for every function:
 * - Nothing unwinds out of the library: a panic of the runtime is
 *   RTD_ERR_PANIC with its message in rtd_last_error(). A callback must
 *   not unwind into the library either (a C++ exception thrown through it
 *   aborts the process).
 * - rtd_send, rtd_loan, rtd_loan_send, rtd_fetch_latest, rtd_fetch_next,
 *   the rtd_ctx_* calls and the loop's calls of a callback allocate
 *   nothing. Making loops, senders, watchers, fetchers and timers
 *   allocates: do it before rtd_loop_run. rtd_loop_report allocates.
 * - A NULL handle or string is refused with RTD_ERR_ARGUMENT (or ignored
 *   by the functions that return no status); names are UTF-8.
 * - A loop and everything made from it belong to the thread that runs
 *   the loop.
 */
#ifndef RTDEPLOY_H
#define RTDEPLOY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The interface's version; rtd_abi_version() gives the library's. */
#define RTD_ABI_VERSION 1

/* What a call did. rtd_last_error() says why for every status but RTD_OK. */
typedef enum rtd_status {
    RTD_OK = 0,
    RTD_ERR_ARGUMENT = 1, /* NULL, not UTF-8, a length not the type's, a type the runtime cannot carry */
    RTD_ERR_CHANNEL = 2,  /* the channel cannot be opened or attached */
    RTD_ERR_TYPE = 3,     /* the channel records another type (both are named) */
    RTD_ERR_LOOP = 4,     /* the loop cannot be made, or its run failed */
    RTD_ERR_PUBLISH = 5,  /* a publish was refused */
    RTD_ERR_FETCH = 6,    /* a fetch found a fault or a message of another size */
    RTD_ERR_STATE = 7,    /* a call at the wrong time (a second loan, a loop that panicked) */
    RTD_ERR_PANIC = 8,    /* the runtime panicked */
    RTD_ERR_SYSTEM = 9    /* the system refused (memory locking) */
} rtd_status;

/* What a channel records of its message type. The name and layout hash
 * come with the message's description (`deploy gen` writes them beside the
 * struct); size and align are sizeof and _Alignof of the struct. A channel
 * bound to another record refuses the type, naming both. */
typedef struct rtd_type {
    const char *name;
    uint64_t size;
    uint64_t align;
    uint64_t layout_hash;
} rtd_type;

typedef struct rtd_loop rtd_loop;       /* an event loop */
typedef struct rtd_ctx rtd_ctx;         /* a callback's context, valid during the callback */
typedef struct rtd_sender rtd_sender;   /* a publisher of one channel */
typedef struct rtd_fetcher rtd_fetcher; /* a reader of one channel that never wakes the loop */
typedef struct rtd_timer rtd_timer;     /* a timer's handle */

/* Called with each message: the loop's own copy, len bytes, valid during the call. */
typedef void (*rtd_watch_fn)(rtd_ctx *ctx, const void *msg, size_t len, void *user);
/* Called at each firing of a timer or phased loop. */
typedef void (*rtd_timer_fn)(rtd_ctx *ctx, void *user);

/* Kinds of rtd_report_entry. */
#define RTD_ENTRY_WATCHER 0
#define RTD_ENTRY_TIMER 1
#define RTD_ENTRY_SENDER 2

/* One watcher, timer or sender of a loop's timing report (latencies over
 * the report's window, as `deploy status` shows them). */
typedef struct rtd_report_entry {
    char name[64]; /* the channel's or timer's name, NUL-terminated */
    uint32_t kind; /* RTD_ENTRY_* */
    uint32_t reserved;
    uint64_t count;
    uint64_t total;
    uint64_t latency_p50_ns;
    uint64_t latency_p99_ns;
    uint64_t latency_max_ns;
    uint64_t handler_p99_ns;
    uint64_t handler_max_ns;
    uint64_t lost;
    uint64_t missed;
    uint64_t errors;
} rtd_report_entry;

/* ---- versions, errors, memory ---- */

uint32_t rtd_abi_version(void);
/* "RTD_ERR_TYPE" ..., a static string. */
const char *rtd_status_name(rtd_status status);
/* This thread's last error (at most 1023 bytes), valid until the next failing call on this thread. */
const char *rtd_last_error(void);
/* mlockall, then stack_bytes of stack and heap_bytes of heap touched: no page fault on the real-time path. */
rtd_status rtd_lock_memory(size_t stack_bytes, size_t heap_bytes);

/* ---- the allocation trap ---- */

/* What this thread's allocations do: pass, be counted, or abort the
 * process with one line on stderr (a real-time section that allocates). */
typedef enum rtd_alloc_trap {
    RTD_TRAP_OFF = 0,
    RTD_TRAP_COUNT = 1,
    RTD_TRAP_ABORT = 2
} rtd_alloc_trap;

/* Sets this thread's trap; returns the previous mode. It sees the
 * runtime's allocations, and the program's once the program links
 * rtdeploy_malloc_trap.c (C's malloc family, so C++'s new too). */
rtd_alloc_trap rtd_set_alloc_trap(rtd_alloc_trap mode);
/* Allocations this thread made while its trap counted. */
uint64_t rtd_allocations(void);
/* The trap's check for one allocation (rtdeploy_malloc_trap.c calls it). */
void rtd_trap_on_alloc(void);

/* ---- the loop ---- */

/* A loop from the supervisor's environment (RTDEPLOY_SHM_DIR, RTDEPLOY_PROCESS,
 * the wake class, a forced backend); shm_dir and process replace the
 * environment's when not NULL. Timing reports are published once a second
 * on /rtdeploy/timing/<process>. */
rtd_status rtd_loop_new(const char *shm_dir, const char *process, rtd_loop **out);
void rtd_loop_free(rtd_loop *lp);
/* Runs until a callback calls rtd_ctx_exit, or the loop fails. */
rtd_status rtd_loop_run(rtd_loop *lp);
/* "io_uring-futex", "futex_waitv", "doorbell" or "simulated", a static string. */
const char *rtd_loop_backend(const rtd_loop *lp);
/* 1 for a loop of the real-time wake class, else 0. */
int rtd_loop_real_time(const rtd_loop *lp);
/* The loop's clock (CLOCK_MONOTONIC, or a simulation's virtual time), ns. */
uint64_t rtd_loop_now_ns(const rtd_loop *lp);
/* Up to cap entries of the loop's timing report now; *n their number (may exceed cap). Allocates. */
rtd_status rtd_loop_report(const rtd_loop *lp, rtd_report_entry *entries, size_t cap, size_t *n);

/* ---- watchers, timers ---- */

/* f(ctx, msg, len, user) for every message published on channel from now on, in order. */
rtd_status rtd_watch(rtd_loop *lp, const char *channel, const rtd_type *ty, rtd_watch_fn f, void *user);
/* First due at first_deadline_ns on the loop's clock, then every period_ns (0: once); out may be NULL. */
rtd_status rtd_timer_add(rtd_loop *lp, const char *name, uint64_t first_deadline_ns, uint64_t period_ns, rtd_timer_fn f, void *user, rtd_timer **out);
/* Due at every k * period_ns + offset_ns; a late loop skips the passed cycles (rtd_ctx_missed_cycles). */
rtd_status rtd_phased_loop_add(rtd_loop *lp, const char *name, uint64_t period_ns, uint64_t offset_ns, rtd_timer_fn f, void *user, rtd_timer **out);
void rtd_timer_disable(rtd_timer *t);
void rtd_timer_schedule(rtd_timer *t, uint64_t deadline_ns, uint64_t period_ns);
/* Frees the handle; the timer stays with its loop. */
void rtd_timer_free(rtd_timer *t);

/* ---- a callback's context ---- */

uint64_t rtd_ctx_now_ns(rtd_ctx *ctx);
/* A message's send time, a timer's deadline. */
uint64_t rtd_ctx_event_time_ns(rtd_ctx *ctx);
/* From the event's time to this callback's start. */
uint64_t rtd_ctx_latency_ns(rtd_ctx *ctx);
uint64_t rtd_ctx_missed_cycles(rtd_ctx *ctx);
uint64_t rtd_ctx_lost_before(rtd_ctx *ctx);
/* Ends the loop's run once this callback returns. */
void rtd_ctx_exit(rtd_ctx *ctx);

/* ---- senders ---- */

rtd_status rtd_sender_new(rtd_loop *lp, const char *channel, const rtd_type *ty, rtd_sender **out);
void rtd_sender_free(rtd_sender *s);
/* Publishes a copy of len bytes (the type's size). */
rtd_status rtd_send(rtd_sender *s, const void *msg, size_t len);
/* *msg: the next message's slot, the type's size, 8-byte aligned, holding
 * whatever it held (write every field). Then rtd_loan_send or
 * rtd_loan_cancel, no other call on the sender in between. */
rtd_status rtd_loan(rtd_sender *s, void **msg);
rtd_status rtd_loan_send(rtd_sender *s);
void rtd_loan_cancel(rtd_sender *s);

/* ---- fetchers ---- */

rtd_status rtd_fetcher_new(rtd_loop *lp, const char *channel, const rtd_type *ty, rtd_fetcher **out);
void rtd_fetcher_free(rtd_fetcher *f);
/* *msg: the fetcher's copy of the newest message not fetched yet (valid
 * until the next call on the fetcher), or NULL when there is none. */
rtd_status rtd_fetch_latest(rtd_fetcher *f, const void **msg);
/* The next message in order, as rtd_fetch_latest otherwise. */
rtd_status rtd_fetch_next(rtd_fetcher *f, const void **msg);
uint64_t rtd_fetcher_lost(const rtd_fetcher *f);

#ifdef __cplusplus
}
#endif

#endif /* RTDEPLOY_H */
