/* A minimal ptrace tracer for the traced-process tests (issue 31): a
 * process with a tracer has a TracerPid in /proc/PID/status, as under gdb,
 * strace or CRIU, and must get no probe under --probe-traced-processes
 * never (auto on arm64).
 *
 *   tracer -- CMD [ARG...]   runs CMD traced from before its exec
 *                            (PTRACE_TRACEME), stdin and stdout shared, and
 *                            exits as CMD does; CMD dies with the tracer
 *                            (PTRACE_O_EXITKILL).
 *   tracer --attach PID      attaches to a running process (PTRACE_SEIZE:
 *                            no stop), prints "attached PID"; on SIGTERM
 *                            or SIGINT it detaches, prints "detached PID"
 *                            and exits 0.
 *
 * Signals the tracee receives are passed on to it. Only the thread-group
 * leader is traced: that is the TracerPid profi reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
	(void)sig;
	stop = 1;
}

/* The signal to pass on at a stop: none for ptrace's own stops. */
static int pass_on(int status)
{
	int sig = WSTOPSIG(status);

	if (status >> 16 || sig == SIGTRAP)
		return 0;
	return sig;
}

static int run(char **argv)
{
	int status, first = 1;
	pid_t child = fork();

	if (child < 0) {
		perror("tracer: fork");
		return 1;
	}
	if (child == 0) {
		if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) < 0) {
			perror("tracer: PTRACE_TRACEME");
			_exit(127);
		}
		execvp(argv[0], argv);
		perror("tracer: exec");
		_exit(127);
	}
	for (;;) {
		if (waitpid(child, &status, 0) < 0) {
			if (errno == EINTR)
				continue;
			perror("tracer: waitpid");
			return 1;
		}
		if (WIFEXITED(status))
			return WEXITSTATUS(status);
		if (WIFSIGNALED(status)) {
			signal(WTERMSIG(status), SIG_DFL);
			raise(WTERMSIG(status));
			return 128 + WTERMSIG(status);
		}
		if (first) { /* the stop at exec */
			first = 0;
			ptrace(PTRACE_SETOPTIONS, child, NULL, (void *)PTRACE_O_EXITKILL);
			ptrace(PTRACE_CONT, child, NULL, NULL);
			continue;
		}
		ptrace(PTRACE_CONT, child, NULL, (void *)(long)pass_on(status));
	}
}

/*
 * Waits for the attached pid's next state change into *status: 1 for a
 * stop, 0 when the process is gone, -1 on an error (printed), and, when
 * interruptible, 2 once a signal interrupted the wait and set stop.
 */
static int wait_traced(pid_t pid, int *status, int interruptible)
{
	for (;;) {
		if (waitpid(pid, status, __WALL) >= 0)
			return WIFEXITED(*status) || WIFSIGNALED(*status) ? 0 : 1;
		if (errno != EINTR) {
			perror("tracer: waitpid");
			return -1;
		}
		if (interruptible && stop)
			return 2;
	}
}

static int attach(pid_t pid)
{
	struct sigaction sa;
	int status;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop; /* no SA_RESTART: waitpid returns EINTR */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	if (ptrace(PTRACE_SEIZE, pid, NULL, NULL) < 0) {
		fprintf(stderr, "tracer: PTRACE_SEIZE %d: %s\n", pid, strerror(errno));
		return 1;
	}
	printf("attached %d\n", pid);
	fflush(stdout);
	while (!stop) {
		int r = wait_traced(pid, &status, 1);
		if (r < 0)
			return 1;
		if (r == 0)
			return 0;
		if (r == 2)
			break;
		ptrace(PTRACE_CONT, pid, NULL, (void *)(long)pass_on(status));
	}
	/* Detaching needs a ptrace-stop: interrupt, and pass on a signal
	 * whose delivery stop comes first. */
	if (ptrace(PTRACE_INTERRUPT, pid, NULL, NULL) < 0) {
		perror("tracer: PTRACE_INTERRUPT");
		return 1;
	}
	for (;;) {
		int r = wait_traced(pid, &status, 0);
		if (r < 0)
			return 1;
		if (r == 0)
			return 0;
		if (WIFSTOPPED(status))
			break;
	}
	if (ptrace(PTRACE_DETACH, pid, NULL, (void *)(long)pass_on(status)) < 0) {
		perror("tracer: PTRACE_DETACH");
		return 1;
	}
	printf("detached %d\n", pid);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "--") == 0)
		return run(argv + 2);
	if (argc == 3 && strcmp(argv[1], "--attach") == 0)
		return attach((pid_t)atoi(argv[2]));
	fprintf(stderr, "usage: tracer -- CMD [ARG...] | tracer --attach PID\n");
	return 2;
}
