/* llvm_api.h - LLVM's C API as codegen/llvm calls it: through a table of the functions, opened
 * with dlopen the first time the jit backend needs LLVM, not linked.
 *
 * Why: linking libLLVM made every process that links the runtime (ptc itself, and every
 * executable it writes) load it at start, for its 366,000 relocations: 22 ms a process (45 ms
 * under ASan), though ptc never generates code and the cpu and ref backends never call LLVM.
 * Thousands of test processes paid it, and so did every `ptc` a user runs. Now only the jit
 * backend's first kernel and the tests and benchmarks of codegen/llvm open it, as the CUDA
 * libraries and the GEMM libraries are opened (runtime/backend/cuda/cudalib.c,
 * runtime/backend/cpu/cpu_gemm.c).
 *
 * The LLVM headers are included first, then every function used is a macro for its table entry
 * (typed from the header's own declaration with __typeof__), so the code calls LLVM as before; a
 * function missing from PTC_LLVM_FUNCTIONS is an undefined symbol at link time, not a crash. */
#ifndef PTC_LLVM_API_H
#define PTC_LLVM_API_H

#include <stddef.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/DebugInfo.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>

#define PTC_LLVM_FUNCTIONS(X) \
    X(LLVMAddAttributeAtIndex) \
    X(LLVMAddFunction) \
    X(LLVMAddIncoming) \
    X(LLVMAppendBasicBlockInContext) \
    X(LLVMBuildAdd) \
    X(LLVMBuildAnd) \
    X(LLVMBuildArrayAlloca) \
    X(LLVMBuildBitCast) \
    X(LLVMBuildBr) \
    X(LLVMBuildCall2) \
    X(LLVMBuildCondBr) \
    X(LLVMBuildFAdd) \
    X(LLVMBuildFCmp) \
    X(LLVMBuildFDiv) \
    X(LLVMBuildFMul) \
    X(LLVMBuildFNeg) \
    X(LLVMBuildFPToSI) \
    X(LLVMBuildFSub) \
    X(LLVMBuildICmp) \
    X(LLVMBuildInBoundsGEP2) \
    X(LLVMBuildLShr) \
    X(LLVMBuildLoad2) \
    X(LLVMBuildMul) \
    X(LLVMBuildNeg) \
    X(LLVMBuildOr) \
    X(LLVMBuildPhi) \
    X(LLVMBuildRetVoid) \
    X(LLVMBuildSDiv) \
    X(LLVMBuildSExt) \
    X(LLVMBuildSIToFP) \
    X(LLVMBuildSRem) \
    X(LLVMBuildSelect) \
    X(LLVMBuildShl) \
    X(LLVMBuildStore) \
    X(LLVMBuildSub) \
    X(LLVMBuildTrunc) \
    X(LLVMBuildZExt) \
    X(LLVMConstInt) \
    X(LLVMConstReal) \
    X(LLVMContextCreate) \
    X(LLVMContextDispose) \
    X(LLVMContextSetDiagnosticHandler) \
    X(LLVMCreateBuilderInContext) \
    X(LLVMCreateMemoryBufferWithMemoryRangeCopy) \
    X(LLVMCreatePassBuilderOptions) \
    X(LLVMCreateStringAttribute) \
    X(LLVMCreateTargetDataLayout) \
    X(LLVMCreateTargetMachine) \
    X(LLVMDisposeBuilder) \
    X(LLVMDisposeErrorMessage) \
    X(LLVMDisposeMessage) \
    X(LLVMDisposeModule) \
    X(LLVMDisposePassBuilderOptions) \
    X(LLVMDisposeTargetData) \
    X(LLVMFloatTypeInContext) \
    X(LLVMFunctionType) \
    X(LLVMGetBufferSize) \
    X(LLVMGetBufferStart) \
    X(LLVMGetDefaultTargetTriple) \
    X(LLVMGetErrorMessage) \
    X(LLVMGetHostCPUFeatures) \
    X(LLVMGetHostCPUName) \
    X(LLVMGetInsertBlock) \
    X(LLVMGetMDKindIDInContext) \
    X(LLVMGetNamedFunction) \
    X(LLVMGetNextInstruction) \
    X(LLVMGetParam) \
    X(LLVMGetTargetFromTriple) \
    X(LLVMInt16TypeInContext) \
    X(LLVMInt1TypeInContext) \
    X(LLVMInt32TypeInContext) \
    X(LLVMInt64TypeInContext) \
    X(LLVMInt8TypeInContext) \
    X(LLVMMDNodeInContext2) \
    X(LLVMMDStringInContext2) \
    X(LLVMMetadataAsValue) \
    X(LLVMMetadataReplaceAllUsesWith) \
    X(LLVMModuleCreateWithNameInContext) \
    X(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess) \
    X(LLVMOrcCreateLLJIT) \
    X(LLVMOrcJITDylibAddGenerator) \
    X(LLVMOrcLLJITAddObjectFile) \
    X(LLVMOrcLLJITGetGlobalPrefix) \
    X(LLVMOrcLLJITGetMainJITDylib) \
    X(LLVMOrcLLJITLookup) \
    X(LLVMPassBuilderOptionsSetLoopInterleaving) \
    X(LLVMPassBuilderOptionsSetLoopUnrolling) \
    X(LLVMPassBuilderOptionsSetLoopVectorization) \
    X(LLVMPassBuilderOptionsSetSLPVectorization) \
    X(LLVMPointerType) \
    X(LLVMPositionBuilderAtEnd) \
    X(LLVMPositionBuilderBefore) \
    X(LLVMPrintModuleToString) \
    X(LLVMRunPasses) \
    X(LLVMSetAlignment) \
    X(LLVMSetMetadata) \
    X(LLVMSetModuleDataLayout) \
    X(LLVMSetTarget) \
    X(LLVMTargetMachineEmitToMemoryBuffer) \
    X(LLVMTemporaryMDNode) \
    X(LLVMValueAsMetadata) \
    X(LLVMVerifyModule) \
    X(LLVMVoidTypeInContext)

struct ptc_llvm_api {
#define PTC_LLVM_MEMBER(f) __typeof__(f) *f;
    PTC_LLVM_FUNCTIONS(PTC_LLVM_MEMBER)
#undef PTC_LLVM_MEMBER
    /* the host target's initialisers (LLVMInitializeNativeTarget's, which the header defines
     * inline, calling them by name) */
    void (*target_info)(void), (*target)(void), (*target_mc)(void), (*asm_printer)(void);
};
extern struct ptc_llvm_api ptc_llvm;

/* Opens the LLVM library ($PTC_LLVM_LIBRARY where set; else the one the build was configured
 * with, by its path, then by its name on the loader's path) and fills ptc_llvm, once; then
 * initialises the host target. 0, or -1 with what is missing. Thread-safe. */
int ptc_llvm_open(char *err, size_t errn);

#ifndef PTC_LLVM_API_IMPL /* (llvm_api.c fills the table by the functions' own names) */
#define LLVMAddAttributeAtIndex (ptc_llvm.LLVMAddAttributeAtIndex)
#define LLVMAddFunction (ptc_llvm.LLVMAddFunction)
#define LLVMAddIncoming (ptc_llvm.LLVMAddIncoming)
#define LLVMAppendBasicBlockInContext (ptc_llvm.LLVMAppendBasicBlockInContext)
#define LLVMBuildAdd (ptc_llvm.LLVMBuildAdd)
#define LLVMBuildAnd (ptc_llvm.LLVMBuildAnd)
#define LLVMBuildArrayAlloca (ptc_llvm.LLVMBuildArrayAlloca)
#define LLVMBuildBitCast (ptc_llvm.LLVMBuildBitCast)
#define LLVMBuildBr (ptc_llvm.LLVMBuildBr)
#define LLVMBuildCall2 (ptc_llvm.LLVMBuildCall2)
#define LLVMBuildCondBr (ptc_llvm.LLVMBuildCondBr)
#define LLVMBuildFAdd (ptc_llvm.LLVMBuildFAdd)
#define LLVMBuildFCmp (ptc_llvm.LLVMBuildFCmp)
#define LLVMBuildFDiv (ptc_llvm.LLVMBuildFDiv)
#define LLVMBuildFMul (ptc_llvm.LLVMBuildFMul)
#define LLVMBuildFNeg (ptc_llvm.LLVMBuildFNeg)
#define LLVMBuildFPToSI (ptc_llvm.LLVMBuildFPToSI)
#define LLVMBuildFSub (ptc_llvm.LLVMBuildFSub)
#define LLVMBuildICmp (ptc_llvm.LLVMBuildICmp)
#define LLVMBuildInBoundsGEP2 (ptc_llvm.LLVMBuildInBoundsGEP2)
#define LLVMBuildLShr (ptc_llvm.LLVMBuildLShr)
#define LLVMBuildLoad2 (ptc_llvm.LLVMBuildLoad2)
#define LLVMBuildMul (ptc_llvm.LLVMBuildMul)
#define LLVMBuildNeg (ptc_llvm.LLVMBuildNeg)
#define LLVMBuildOr (ptc_llvm.LLVMBuildOr)
#define LLVMBuildPhi (ptc_llvm.LLVMBuildPhi)
#define LLVMBuildRetVoid (ptc_llvm.LLVMBuildRetVoid)
#define LLVMBuildSDiv (ptc_llvm.LLVMBuildSDiv)
#define LLVMBuildSExt (ptc_llvm.LLVMBuildSExt)
#define LLVMBuildSIToFP (ptc_llvm.LLVMBuildSIToFP)
#define LLVMBuildSRem (ptc_llvm.LLVMBuildSRem)
#define LLVMBuildSelect (ptc_llvm.LLVMBuildSelect)
#define LLVMBuildShl (ptc_llvm.LLVMBuildShl)
#define LLVMBuildStore (ptc_llvm.LLVMBuildStore)
#define LLVMBuildSub (ptc_llvm.LLVMBuildSub)
#define LLVMBuildTrunc (ptc_llvm.LLVMBuildTrunc)
#define LLVMBuildZExt (ptc_llvm.LLVMBuildZExt)
#define LLVMConstInt (ptc_llvm.LLVMConstInt)
#define LLVMConstReal (ptc_llvm.LLVMConstReal)
#define LLVMContextCreate (ptc_llvm.LLVMContextCreate)
#define LLVMContextDispose (ptc_llvm.LLVMContextDispose)
#define LLVMContextSetDiagnosticHandler (ptc_llvm.LLVMContextSetDiagnosticHandler)
#define LLVMCreateBuilderInContext (ptc_llvm.LLVMCreateBuilderInContext)
#define LLVMCreateMemoryBufferWithMemoryRangeCopy (ptc_llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy)
#define LLVMCreatePassBuilderOptions (ptc_llvm.LLVMCreatePassBuilderOptions)
#define LLVMCreateStringAttribute (ptc_llvm.LLVMCreateStringAttribute)
#define LLVMCreateTargetDataLayout (ptc_llvm.LLVMCreateTargetDataLayout)
#define LLVMCreateTargetMachine (ptc_llvm.LLVMCreateTargetMachine)
#define LLVMDisposeBuilder (ptc_llvm.LLVMDisposeBuilder)
#define LLVMDisposeErrorMessage (ptc_llvm.LLVMDisposeErrorMessage)
#define LLVMDisposeMessage (ptc_llvm.LLVMDisposeMessage)
#define LLVMDisposeModule (ptc_llvm.LLVMDisposeModule)
#define LLVMDisposePassBuilderOptions (ptc_llvm.LLVMDisposePassBuilderOptions)
#define LLVMDisposeTargetData (ptc_llvm.LLVMDisposeTargetData)
#define LLVMFloatTypeInContext (ptc_llvm.LLVMFloatTypeInContext)
#define LLVMFunctionType (ptc_llvm.LLVMFunctionType)
#define LLVMGetBufferSize (ptc_llvm.LLVMGetBufferSize)
#define LLVMGetBufferStart (ptc_llvm.LLVMGetBufferStart)
#define LLVMGetDefaultTargetTriple (ptc_llvm.LLVMGetDefaultTargetTriple)
#define LLVMGetErrorMessage (ptc_llvm.LLVMGetErrorMessage)
#define LLVMGetHostCPUFeatures (ptc_llvm.LLVMGetHostCPUFeatures)
#define LLVMGetHostCPUName (ptc_llvm.LLVMGetHostCPUName)
#define LLVMGetInsertBlock (ptc_llvm.LLVMGetInsertBlock)
#define LLVMGetMDKindIDInContext (ptc_llvm.LLVMGetMDKindIDInContext)
#define LLVMGetNamedFunction (ptc_llvm.LLVMGetNamedFunction)
#define LLVMGetNextInstruction (ptc_llvm.LLVMGetNextInstruction)
#define LLVMGetParam (ptc_llvm.LLVMGetParam)
#define LLVMGetTargetFromTriple (ptc_llvm.LLVMGetTargetFromTriple)
#define LLVMInt16TypeInContext (ptc_llvm.LLVMInt16TypeInContext)
#define LLVMInt1TypeInContext (ptc_llvm.LLVMInt1TypeInContext)
#define LLVMInt32TypeInContext (ptc_llvm.LLVMInt32TypeInContext)
#define LLVMInt64TypeInContext (ptc_llvm.LLVMInt64TypeInContext)
#define LLVMInt8TypeInContext (ptc_llvm.LLVMInt8TypeInContext)
#define LLVMMDNodeInContext2 (ptc_llvm.LLVMMDNodeInContext2)
#define LLVMMDStringInContext2 (ptc_llvm.LLVMMDStringInContext2)
#define LLVMMetadataAsValue (ptc_llvm.LLVMMetadataAsValue)
#define LLVMMetadataReplaceAllUsesWith (ptc_llvm.LLVMMetadataReplaceAllUsesWith)
#define LLVMModuleCreateWithNameInContext (ptc_llvm.LLVMModuleCreateWithNameInContext)
#define LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess (ptc_llvm.LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess)
#define LLVMOrcCreateLLJIT (ptc_llvm.LLVMOrcCreateLLJIT)
#define LLVMOrcJITDylibAddGenerator (ptc_llvm.LLVMOrcJITDylibAddGenerator)
#define LLVMOrcLLJITAddObjectFile (ptc_llvm.LLVMOrcLLJITAddObjectFile)
#define LLVMOrcLLJITGetGlobalPrefix (ptc_llvm.LLVMOrcLLJITGetGlobalPrefix)
#define LLVMOrcLLJITGetMainJITDylib (ptc_llvm.LLVMOrcLLJITGetMainJITDylib)
#define LLVMOrcLLJITLookup (ptc_llvm.LLVMOrcLLJITLookup)
#define LLVMPassBuilderOptionsSetLoopInterleaving (ptc_llvm.LLVMPassBuilderOptionsSetLoopInterleaving)
#define LLVMPassBuilderOptionsSetLoopUnrolling (ptc_llvm.LLVMPassBuilderOptionsSetLoopUnrolling)
#define LLVMPassBuilderOptionsSetLoopVectorization (ptc_llvm.LLVMPassBuilderOptionsSetLoopVectorization)
#define LLVMPassBuilderOptionsSetSLPVectorization (ptc_llvm.LLVMPassBuilderOptionsSetSLPVectorization)
#define LLVMPointerType (ptc_llvm.LLVMPointerType)
#define LLVMPositionBuilderAtEnd (ptc_llvm.LLVMPositionBuilderAtEnd)
#define LLVMPositionBuilderBefore (ptc_llvm.LLVMPositionBuilderBefore)
#define LLVMPrintModuleToString (ptc_llvm.LLVMPrintModuleToString)
#define LLVMRunPasses (ptc_llvm.LLVMRunPasses)
#define LLVMSetAlignment (ptc_llvm.LLVMSetAlignment)
#define LLVMSetMetadata (ptc_llvm.LLVMSetMetadata)
#define LLVMSetModuleDataLayout (ptc_llvm.LLVMSetModuleDataLayout)
#define LLVMSetTarget (ptc_llvm.LLVMSetTarget)
#define LLVMTargetMachineEmitToMemoryBuffer (ptc_llvm.LLVMTargetMachineEmitToMemoryBuffer)
#define LLVMTemporaryMDNode (ptc_llvm.LLVMTemporaryMDNode)
#define LLVMValueAsMetadata (ptc_llvm.LLVMValueAsMetadata)
#define LLVMVerifyModule (ptc_llvm.LLVMVerifyModule)
#define LLVMVoidTypeInContext (ptc_llvm.LLVMVoidTypeInContext)
#endif

#endif
