/* Run ONNX Runtime without AMX: its MLAS then falls back to its AVX-512 VNNI kernels.

   MLAS uses AMX only after Linux grants the process the tile registers
   (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), called through libc's syscall()).
   Preloaded, this refuses that one request and passes every other call on, so the same
   graph can be timed with and without AMX on one CPU (docs/performance.md):

       gcc -O2 -shared -fPIC -o build/noamx.so bench/noamx.c -ldl
       LD_PRELOAD=build/noamx.so python -m bench.step_ab build/models/fr-en/decoder.int8.onnx --rows 32

   A benchmark's tool, never part of the product. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023

long syscall(long number, ...) {
  va_list args;
  va_start(args, number);
  long a0 = va_arg(args, long), a1 = va_arg(args, long), a2 = va_arg(args, long);
  long a3 = va_arg(args, long), a4 = va_arg(args, long), a5 = va_arg(args, long);
  va_end(args);
  if (number == SYS_arch_prctl && a0 == ARCH_REQ_XCOMP_PERM) {
    static const char said[] = "noamx: AMX permission refused\n";
    static int told;
    if (!told++) write(2, said, sizeof said - 1);
    errno = EPERM;
    return -1;
  }
  long (*real)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(number, a0, a1, a2, a3, a4, a5);
}
