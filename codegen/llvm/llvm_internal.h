/* llvm_internal.h - what the files of codegen/llvm share: the emitter's entry point. */
#ifndef PTC_LLVM_INTERNAL_H
#define PTC_LLVM_INTERNAL_H

#include "kjit.h"
#include "llvm_api.h"

/* A module holding kernel k as the function `symbol` (see kjit.h for its signature). */
LLVMModuleRef ptc_llvm_emit(LLVMContextRef C, const ptc_kir *k, const char *symbol);

#endif
