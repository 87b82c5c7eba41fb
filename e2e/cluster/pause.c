/* The pod sandbox ("pause") process of the real-kubelet cluster: it holds the pod's namespaces,
 * reaps orphaned children and exits on SIGINT/SIGTERM. Built statically by realnode.sh, so the
 * image is this one file and nothing has to be pulled. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
