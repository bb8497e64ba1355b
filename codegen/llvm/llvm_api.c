/* llvm_api.c - the LLVM library opened at run time (llvm_api.h says why). */
#define PTC_LLVM_API_IMPL
#include "llvm_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct ptc_llvm_api ptc_llvm;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool opened;
static char failure[512];

#define PTC_STR_(x) #x
#define PTC_STR(x) PTC_STR_(x)

/* dlsym of name into *slot (a function pointer, whatever its type); false when missing */
static bool take(void *so, const char *name, void *slot)
{
    void *p = dlsym(so, name);
    if (!p)
        return false;
    memcpy(slot, &p, sizeof p);
    return true;
}

static void open_locked(void)
{
    /* $PTC_LLVM_LIBRARY alone where set; else the path the build found, then its file name on
     * the loader's path (a machine with the library elsewhere: the executables ptc writes are
     * copied) */
    const char *env = getenv("PTC_LLVM_LIBRARY");
    const char *path = env && *env ? env : PTC_LLVM_LIBRARY, *base = strrchr(path, '/');
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so && base && path != env)
        so = dlopen(base + 1, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        const char *why = dlerror();
        ptc_fmt(failure, sizeof failure,
                "the jit backend needs LLVM %d's library (%s%s), which would not open: %s "
                "(install it, or run --backend cpu)",
                LLVM_VERSION_MAJOR, path, path == env ? ", from $PTC_LLVM_LIBRARY" : "",
                why ? why : "not found");
        return;
    }
    const char *missing = NULL;
#define PTC_LLVM_TAKE(f)                                                                           \
    if (!missing && !take(so, #f, &ptc_llvm.f))                                                    \
        missing = #f;
    PTC_LLVM_FUNCTIONS(PTC_LLVM_TAKE)
#undef PTC_LLVM_TAKE
    if (!missing && !take(so, PTC_STR(LLVM_NATIVE_TARGETINFO), &ptc_llvm.target_info))
        missing = PTC_STR(LLVM_NATIVE_TARGETINFO);
    if (!missing && !take(so, PTC_STR(LLVM_NATIVE_TARGET), &ptc_llvm.target))
        missing = PTC_STR(LLVM_NATIVE_TARGET);
    if (!missing && !take(so, PTC_STR(LLVM_NATIVE_TARGETMC), &ptc_llvm.target_mc))
        missing = PTC_STR(LLVM_NATIVE_TARGETMC);
    if (!missing && !take(so, PTC_STR(LLVM_NATIVE_ASMPRINTER), &ptc_llvm.asm_printer))
        missing = PTC_STR(LLVM_NATIVE_ASMPRINTER);
    if (missing) {
        ptc_fmt(failure, sizeof failure, "%s (LLVM %d's library) has no %s", path,
                LLVM_VERSION_MAJOR, missing);
        dlclose(so);
        return;
    }
    ptc_llvm.target_info();
    ptc_llvm.target();
    ptc_llvm.target_mc();
    ptc_llvm.asm_printer();
    opened = true;
}

int ptc_llvm_open(char *err, size_t errn)
{
    pthread_mutex_lock(&lock);
    if (!opened && !failure[0])
        open_locked();
    if (!opened)
        ptc_fmt(err, errn, "%s", failure);
    int rc = opened ? 0 : -1;
    pthread_mutex_unlock(&lock);
    return rc;
}
