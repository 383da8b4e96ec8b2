/* Native backtrace on SIGSEGV/SIGBUS/SIGABRT for machines without gdb (LD_PRELOAD this library).
 *
 *   gcc -shared -fPIC -O1 -o /tmp/segv_backtrace.so tools/gpu/segv_backtrace.c -ldl
 *   LD_PRELOAD=/tmp/segv_backtrace.so python3 ...   # then: tools/gpu/symbolize.sh < stderr
 *
 * Prints one line per frame to stderr: "#N ADDR OBJECT+OFFSET (SYMBOL)" where OFFSET is relative to the
 * object's load base, so `addr2line -f -C -e OBJECT OFFSET` resolves static and inlined code that dladdr
 * cannot name. Then restores the default action and re-raises (the exit status still says which signal).
 * Python's faulthandler, when enabled, dumps Python frames first and then re-raises into this handler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig, siginfo_t *info, void *ucontext) {
    (void)ucontext;
    void *frames[64];
    int n = backtrace(frames, 64);
    dprintf(2, "native-backtrace: signal %d (%s) at address %p, %d frames\n", sig, strsignal(sig), info->si_addr, n);
    for (int i = 0; i < n; i++) {
        Dl_info d;
        if (dladdr(frames[i], &d) && d.dli_fname) {
            dprintf(2, "native-frame #%d %p %s+0x%lx (%s)\n", i, frames[i], d.dli_fname,
                    (unsigned long)((char *)frames[i] - (char *)d.dli_fbase), d.dli_sname ? d.dli_sname : "?");
        } else {
            dprintf(2, "native-frame #%d %p ? (?)\n", i, frames[i]);
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    static char stack[1 << 16];
    stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGABRT, &sa, NULL);
}
