/* llvm_jit.c - compiling kernels for the host CPU and linking them into one ORC LLJIT, with an
 * on-disk cache of object files (see kjit.h).
 *
 * One process-wide JIT and one table of compiled kernels (by the hash of their text) behind one
 * mutex: every executor of a run (ranks are threads) asks for the same kernels, and each is
 * compiled or loaded once. LLVM keeps process-wide state of its own, so this is the natural unit.
 */
#define _DEFAULT_SOURCE /* mkdir, getenv */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file.h"
#include "llvm_internal.h"

/* Changes whenever the emitted code for the same kernel text changes: part of the cache key. */
#define EMITTER_VERSION 2

typedef struct entry {
    uint64_t hash;
    ptc_kfn fn;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static LLVMOrcLLJITRef jit;
static LLVMTargetMachineRef tm;
static char *cpu_name, *cpu_features, *triple;
static entry *table;
static int ntable, captable;
static int n_compiled, n_cached;

static void take_error(LLVMErrorRef e, const char *what, char *err, size_t errn)
{
    char *msg = LLVMGetErrorMessage(e);
    ptc_fmt(err, errn, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
}

/* The host target, its machine and the JIT, once. */
static int init_locked(char *err, size_t errn)
{
    if (jit)
        return 0;
    if (ptc_llvm_open(err, errn) < 0) /* (and the host's target initialised) */
        return -1;
    triple = LLVMGetDefaultTargetTriple();
    cpu_name = LLVMGetHostCPUName();
    cpu_features = LLVMGetHostCPUFeatures();
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        ptc_fmt(err, errn, "LLVMGetTargetFromTriple(%s): %s", triple, msg ? msg : "?");
        LLVMDisposeMessage(msg);
        return -1;
    }
    tm = LLVMCreateTargetMachine(target, triple, cpu_name, cpu_features, LLVMCodeGenLevelAggressive,
                                 LLVMRelocPIC, LLVMCodeModelSmall);
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&jit, NULL);
    if (e) {
        take_error(e, "LLVMOrcCreateLLJIT", err, errn);
        jit = NULL;
        return -1;
    }
    /* kernels may call libm (logf) */
    LLVMOrcDefinitionGeneratorRef gen;
    e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit),
                                                             NULL, NULL);
    if (e) {
        take_error(e, "LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess", err, errn);
        return -1;
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
    return 0;
}

void ptc_kjit_target(char *buf, size_t n)
{
    char err[256];
    pthread_mutex_lock(&lock);
    if (init_locked(err, sizeof err) < 0)
        ptc_fmt(buf, n, "LLVM %s: %s", LLVM_VERSION_STRING, err);
    else
        ptc_fmt(buf, n, "LLVM %d.%d, %s %s", LLVM_VERSION_MAJOR, LLVM_VERSION_MINOR, cpu_name,
                cpu_features);
    pthread_mutex_unlock(&lock);
}

/* LLVM's warnings and remarks (a loop it would not vectorize) are not the user's business; errors
 * come back through the calls that fail. */
static void quiet(LLVMDiagnosticInfoRef di, void *ctx)
{
    (void)di;
    (void)ctx;
}

/* The module of k, verified and optimised for the host. */
static LLVMModuleRef build(LLVMContextRef C, const ptc_kir *k, const char *symbol, bool optimize,
                           char *err, size_t errn)
{
    LLVMContextSetDiagnosticHandler(C, quiet, NULL);
    LLVMModuleRef M = ptc_llvm_emit(C, k, symbol);
    LLVMSetTarget(M, triple);
    LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
    LLVMSetModuleDataLayout(M, dl);
    LLVMDisposeTargetData(dl);
    char *msg = NULL;
    if (LLVMVerifyModule(M, LLVMReturnStatusAction, &msg)) {
        ptc_fmt(err, errn, "kernel %s: the emitted LLVM IR does not verify: %s", k->name, msg);
        LLVMDisposeMessage(msg);
        LLVMDisposeModule(M);
        return NULL;
    }
    LLVMDisposeMessage(msg);
    if (!optimize)
        return M;
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(po, 1);
    LLVMErrorRef e = LLVMRunPasses(M, "default<O3>", tm, po);
    LLVMDisposePassBuilderOptions(po);
    if (e) {
        take_error(e, "LLVMRunPasses(default<O3>)", err, errn);
        LLVMDisposeModule(M);
        return NULL;
    }
    return M;
}

static uint64_t cache_key(uint64_t kernel_hash)
{
    char buf[8192];
    int n = snprintf(buf, sizeof buf, "%016llx|%s|%s|%s|%d.%d.%d|%d",
                     (unsigned long long)kernel_hash, triple, cpu_name, cpu_features,
                     LLVM_VERSION_MAJOR, LLVM_VERSION_MINOR, LLVM_VERSION_PATCH, EMITTER_VERSION);
    return ptc_hash64(buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1), 0x6a6974);
}

/* The object file of k from the cache, or compiled (and stored in the cache). */
static LLVMMemoryBufferRef object_of(const ptc_kir *k, const char *symbol, const char *path,
                                     char *err, size_t errn)
{
    if (path) {
        size_t len;
        char *bytes = ptc_read_file(path, &len);
        if (bytes) {
            LLVMMemoryBufferRef b =
                LLVMCreateMemoryBufferWithMemoryRangeCopy(bytes, len, symbol);
            free(bytes);
            n_cached++;
            return b;
        }
    }
    LLVMContextRef C = LLVMContextCreate();
    LLVMModuleRef M = build(C, k, symbol, true, err, errn);
    LLVMMemoryBufferRef obj = NULL;
    char *msg = NULL;
    if (M && LLVMTargetMachineEmitToMemoryBuffer(tm, M, LLVMObjectFile, &msg, &obj)) {
        ptc_fmt(err, errn, "kernel %s: LLVMTargetMachineEmitToMemoryBuffer: %s", k->name,
                msg ? msg : "?");
        obj = NULL;
    }
    LLVMDisposeMessage(msg);
    if (M)
        LLVMDisposeModule(M);
    LLVMContextDispose(C);
    if (!obj)
        return NULL;
    n_compiled++;
    if (path) { /* a cache that cannot be written only costs the next start its compile */
        char werr[256];
        ptc_file_write_file(path, LLVMGetBufferStart(obj), LLVMGetBufferSize(obj), werr,
                            sizeof werr);
    }
    return obj;
}

static ptc_kfn compile_locked(const ptc_kir *k, uint64_t h, const char *cache_dir, char *err,
                              size_t errn)
{
    char symbol[64], *path = NULL;
    snprintf(symbol, sizeof symbol, "ptck_%016llx", (unsigned long long)h);
    char buf[4096], *dir = NULL;
    if (!cache_dir)
        dir = ptc_file_cache_dir("kernels", buf, sizeof buf);
    else if (*cache_dir && strlen(cache_dir) < sizeof buf)
        dir = ptc_file_mkdirs(strcpy(buf, cache_dir)) ? buf : NULL;
    if (dir) {
        size_t n = strlen(dir) + 64;
        path = ptc_xmalloc(n);
        snprintf(path, n, "%s/%016llx.o", dir, (unsigned long long)cache_key(h));
    }
    LLVMMemoryBufferRef obj = object_of(k, symbol, path, err, errn);
    free(path);
    if (!obj)
        return NULL;
    LLVMErrorRef e = LLVMOrcLLJITAddObjectFile(jit, LLVMOrcLLJITGetMainJITDylib(jit), obj);
    if (e) {
        take_error(e, "LLVMOrcLLJITAddObjectFile", err, errn);
        return NULL;
    }
    LLVMOrcExecutorAddress addr = 0;
    e = LLVMOrcLLJITLookup(jit, &addr, symbol);
    if (e) {
        take_error(e, "LLVMOrcLLJITLookup", err, errn);
        return NULL;
    }
    ptc_kfn fn;
    uintptr_t a = (uintptr_t)addr;
    memcpy(&fn, &a, sizeof fn);
    return fn;
}

ptc_kfn ptc_kjit_get(const ptc_kir *k, const char *cache_dir, char *err, size_t errn)
{
    uint64_t h = ptc_kir_hash(k);
    pthread_mutex_lock(&lock);
    ptc_kfn fn = NULL;
    for (int i = 0; i < ntable && !fn; i++)
        if (table[i].hash == h)
            fn = table[i].fn;
    if (!fn && init_locked(err, errn) == 0) {
        fn = compile_locked(k, h, cache_dir, err, errn);
        if (fn) {
            if (ntable == captable) {
                captable = captable ? 2 * captable : 64;
                table = ptc_xrealloc(table, sizeof *table * (size_t)captable);
            }
            table[ntable++] = (entry){h, fn};
        }
    }
    pthread_mutex_unlock(&lock);
    return fn;
}

void ptc_kjit_counts(int *compiled, int *cached)
{
    pthread_mutex_lock(&lock);
    *compiled = n_compiled;
    *cached = n_cached;
    pthread_mutex_unlock(&lock);
}

int ptc_kjit_print_llvm(const ptc_kir *k, bool optimize, FILE *f, char *err, size_t errn)
{
    pthread_mutex_lock(&lock);
    int rc = init_locked(err, errn);
    if (rc == 0) {
        LLVMContextRef C = LLVMContextCreate();
        LLVMModuleRef M = build(C, k, k->name, optimize, err, errn);
        if (M) {
            char *text = LLVMPrintModuleToString(M);
            fputs(text, f);
            LLVMDisposeMessage(text);
            LLVMDisposeModule(M);
        } else {
            rc = -1;
        }
        LLVMContextDispose(C);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
