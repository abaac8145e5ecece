/*
 * rtdeploy_malloc_trap.c: the allocation trap for C and C++ controllers.
 *
 * Compile it into the program (as C: `cc -c`, or the CMake package's
 * rtdeploy::malloc_trap). Its malloc, calloc, realloc, free and the aligned
 * allocators replace glibc's for the whole program (C++'s new calls malloc;
 * the runtime's Rust allocations do too) and forward to glibc's own
 * (__libc_malloc ...), after rtd_trap_on_alloc(): an allocation on a thread
 * whose trap counts is counted (rtd_allocations), one whose trap aborts
 * prints a line and aborts (rtd_set_alloc_trap). A real-time handler that
 * arms the trap (rtdeploy::AllocTrapScope in C++) is proven, or made to
 * fail loudly, not to allocate. Off, each allocation costs one thread-local
 * read more.
 *
 * glibc only: __libc_malloc and its siblings are glibc's exported names for
 * its own allocator.
 */
#include <errno.h>
#include <stddef.h>
#include <unistd.h>

#include "rtdeploy.h"

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t size);

void *malloc(size_t size) {
    rtd_trap_on_alloc();
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
    rtd_trap_on_alloc();
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
    rtd_trap_on_alloc();
    return __libc_realloc(p, size);
}

void free(void *p) {
    __libc_free(p);
}

void *memalign(size_t align, size_t size) {
    rtd_trap_on_alloc();
    return __libc_memalign(align, size);
}

void *aligned_alloc(size_t align, size_t size) {
    rtd_trap_on_alloc();
    return __libc_memalign(align, size);
}

int posix_memalign(void **out, size_t align, size_t size) {
    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        return EINVAL;
    }
    rtd_trap_on_alloc();
    void *p = __libc_memalign(align, size);
    if (p == NULL) {
        return ENOMEM;
    }
    *out = p;
    return 0;
}

void *valloc(size_t size) {
    rtd_trap_on_alloc();
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), size);
}
