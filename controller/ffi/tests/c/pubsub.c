/*
 * A C controller on the C interface alone (rtdeploy.h): publishes and
 * receives messages of the Rust examples' type (a sequence number and a
 * deadline), every sequence number checked.
 *
 *   pubsub MODE SHM_DIR TYPE_NAME LAYOUT_HASH COUNT
 *
 * MODE: self (a phased loop publishes COUNT messages, half copied and
 * half loaned, and a watcher of the same loop receives them), talk
 * (publishes only), listen (receives COUNT, from whoever publishes).
 * Prints what it did; exits 0 when every message came in order.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtdeploy.h"

struct chatter {
    uint64_t seq;
    uint64_t deadline_ns;
};

struct state {
    rtd_sender *sender;
    uint64_t count;
    uint64_t sent;
    uint64_t received;
    uint64_t out_of_order;
    int talk;
    int listen;
};

static void die(const char *what, rtd_status s) {
    fprintf(stderr, "pubsub: %s: %s: %s\n", what, rtd_status_name(s), rtd_last_error());
    exit(2);
}

static void on_message(rtd_ctx *ctx, const void *msg, size_t len, void *user) {
    struct state *st = user;
    const struct chatter *m = msg;
    if (len != sizeof *m || m->seq != st->received) {
        st->out_of_order++;
    }
    st->received++;
    if (st->received == st->count) {
        rtd_ctx_exit(ctx);
    }
}

static void on_tick(rtd_ctx *ctx, void *user) {
    struct state *st = user;
    if (st->sent == st->count) {
        if (!st->listen) {
            rtd_ctx_exit(ctx);
        }
        return;
    }
    rtd_status s;
    if (st->sent % 2 == 0) {
        struct chatter m = {st->sent, rtd_ctx_event_time_ns(ctx)};
        s = rtd_send(st->sender, &m, sizeof m);
    } else {
        void *slot = NULL;
        s = rtd_loan(st->sender, &slot);
        if (s == RTD_OK) {
            struct chatter *m = slot;
            m->seq = st->sent;
            m->deadline_ns = rtd_ctx_event_time_ns(ctx);
            s = rtd_loan_send(st->sender);
        }
    }
    if (s != RTD_OK) {
        die("send", s);
    }
    st->sent++;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: pubsub self|talk|listen SHM_DIR TYPE_NAME LAYOUT_HASH COUNT\n");
        return 2;
    }
    const char *mode = argv[1];
    rtd_type chatter = {argv[3], sizeof(struct chatter), _Alignof(struct chatter),
                        strtoull(argv[4], NULL, 0)};
    struct state st = {0};
    st.count = strtoull(argv[5], NULL, 0);
    st.talk = strcmp(mode, "listen") != 0;
    st.listen = strcmp(mode, "talk") != 0;

    if (rtd_abi_version() != RTD_ABI_VERSION) {
        fprintf(stderr, "pubsub: library ABI %u, header %u\n", rtd_abi_version(), RTD_ABI_VERSION);
        return 2;
    }
    rtd_loop *lp = NULL;
    rtd_status s = rtd_loop_new(argv[2], "c-pubsub", &lp);
    if (s != RTD_OK) {
        die("loop", s);
    }
    printf("backend %s, real-time %d\n", rtd_loop_backend(lp), rtd_loop_real_time(lp));

    /* The same name and size, another layout: refused, both named. */
    rtd_type swapped = chatter;
    swapped.name = "Swapped";
    swapped.layout_hash ^= 1;
    rtd_sender *wrong = NULL;
    s = rtd_sender_new(lp, "/demo/chatter", &swapped, &wrong);
    printf("wrong type: %s: %s\n", rtd_status_name(s), rtd_last_error());
    if (s != RTD_ERR_TYPE || wrong != NULL) {
        return 1;
    }
    /* NULLs are refused, not dereferenced. */
    s = rtd_send(NULL, &st, 1);
    printf("null sender: %s: %s\n", rtd_status_name(s), rtd_last_error());
    if (s != RTD_ERR_ARGUMENT) {
        return 1;
    }

    rtd_fetcher *fetcher = NULL;
    if ((s = rtd_fetcher_new(lp, "/demo/chatter", &chatter, &fetcher)) != RTD_OK) {
        die("fetcher", s);
    }
    if (st.talk) {
        if ((s = rtd_sender_new(lp, "/demo/chatter", &chatter, &st.sender)) != RTD_OK) {
            die("sender", s);
        }
        rtd_timer *tick = NULL;
        if ((s = rtd_phased_loop_add(lp, "talk", 1000000, 0, on_tick, &st, &tick)) != RTD_OK) {
            die("phased loop", s);
        }
        rtd_timer_free(tick);
    }
    if (st.listen) {
        if ((s = rtd_watch(lp, "/demo/chatter", &chatter, on_message, &st)) != RTD_OK) {
            die("watch", s);
        }
    }
    printf("ready\n");
    fflush(stdout);
    if ((s = rtd_loop_run(lp)) != RTD_OK) {
        die("run", s);
    }

    const void *latest = NULL;
    if ((s = rtd_fetch_latest(fetcher, &latest)) != RTD_OK) {
        die("fetch", s);
    }
    if (latest != NULL) {
        printf("fetched latest seq %" PRIu64 "\n", ((const struct chatter *)latest)->seq);
    }
    rtd_report_entry entries[8];
    size_t n = 0;
    if ((s = rtd_loop_report(lp, entries, 8, &n)) != RTD_OK) {
        die("report", s);
    }
    for (size_t i = 0; i < n && i < 8; i++) {
        printf("report %s kind %u total %" PRIu64 " errors %" PRIu64 "\n", entries[i].name,
               entries[i].kind, entries[i].total, entries[i].errors);
    }
    printf("sent %" PRIu64 ", received %" PRIu64 " of %" PRIu64 ", out of order %" PRIu64 "\n",
           st.sent, st.received, st.listen ? st.count : 0, st.out_of_order);
    rtd_fetcher_free(fetcher);
    rtd_sender_free(st.sender);
    rtd_loop_free(lp);
    return st.out_of_order == 0 && (!st.listen || st.received == st.count) ? 0 : 1;
}
