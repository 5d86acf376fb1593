// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * p2plab-gpu-tool: command-line access to /dev/p2plab-gpuN.
 *
 * Exit codes: 0 success; 1 the device reported an error status; 2 usage;
 * 3 system error (open, ioctl, file I/O); 4 the job timed out.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../p2plab_gpu_uapi.h"
#include "../p2plab_p2p_test_uapi.h"

#define EXIT_DEVICE	1
#define EXIT_USAGE	2
#define EXIT_SYSTEM	3
#define EXIT_TIMEOUT	4

/* Bytes per ioctl for file copies; the driver splits further. */
#define FILE_CHUNK	(16u << 20)

static const char *dev_path = "/dev/p2plab-gpu0";
static int dev_fd = -1;		/* -F: an fd the caller already opened */
static uint32_t timeout_ms;
static uint32_t job_flags;

static void usage(FILE *out)
{
	fprintf(out,
		"usage: p2plab-gpu-tool [-d DEVICE | -F FD] [-t TIMEOUT_MS] [-U] [-B] COMMAND [ARGS]\n"
		"\n"
		"  info                          device information\n"
		"  fill OFF LEN BYTE             fill VRAM with a byte (engine)\n"
		"  fill32 OFF LEN PATTERN        fill VRAM with a 32-bit LE pattern (engine)\n"
		"  checksum OFF LEN              CRC32C of VRAM (engine), printed as 8 hex digits\n"
		"  copy-to-vram FILE OFF         copy a file into VRAM (engine)\n"
		"  copy-from-vram OFF LEN FILE   copy VRAM into a file (engine)\n"
		"  copy-vram SRC DST LEN         copy inside VRAM (engine, memmove)\n"
		"  nop                           an empty job (fence round trip)\n"
		"  raw OP SRC DST LEN [PATTERN]  send a job as is (needs -U or -B, and root)\n"
		"  mmap-fill OFF LEN BYTE        fill VRAM with the CPU through mmap\n"
		"  mmap-checksum OFF LEN         CRC32C of VRAM read by the CPU through mmap\n"
		"  crc32c FILE [OFF [LEN]]       CRC32C of a file (no device)\n"
		"  p2p-scenario PEER SIZE ACTION PREFIX\n"
		"                                peer-memory / dma-buf checks through the\n"
		"                                p2plab_p2p_test module (PEER: PCI name);\n"
		"                                ACTION: unpin free exit reset unbind dmabuf;\n"
		"                                prints PREFIX_KEY=VALUE facts\n"
		"\n"
		"Numbers: decimal or 0x hex, with an optional K, M, G or T suffix (binary).\n"
		"-U sets P2PLAB_GPU_JOB_UNCHECKED; -B sets P2PLAB_GPU_JOB_BUS_ADDR (raw copies:\n"
		"the host side is a bus address, e.g. a peer BAR). -F uses an inherited open fd.\n"
		"Default device: /dev/p2plab-gpu0.\n"
		"Exit: 0 ok, 1 device error status, 2 usage, 3 system error, 4 timeout.\n");
}

__attribute__((noreturn, format(printf, 2, 3)))
static void die(int code, const char *fmt, ...)
{
	va_list ap;

	fputs("p2plab-gpu-tool: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

static uint64_t parse_num(const char *what, const char *s)
{
	char *end;
	uint64_t v, mult = 1;

	errno = 0;
	if (!*s || *s == '-')
		die(EXIT_USAGE, "%s: not a number: '%s'", what, s);
	v = strtoull(s, &end, 0);
	if (errno)
		die(EXIT_USAGE, "%s: out of range: '%s'", what, s);
	switch (*end) {
	case 'k': case 'K': mult = 1ull << 10; end++; break;
	case 'm': case 'M': mult = 1ull << 20; end++; break;
	case 'g': case 'G': mult = 1ull << 30; end++; break;
	case 't': case 'T': mult = 1ull << 40; end++; break;
	}
	if (*end)
		die(EXIT_USAGE, "%s: not a number: '%s'", what, s);
	if (v > UINT64_MAX / mult)
		die(EXIT_USAGE, "%s: out of range: '%s'", what, s);
	return v * mult;
}

/* ---- CRC32C (Castagnoli, reflected), same as the device ---- */

static uint32_t crc_table[256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int b = 0; b < 8; b++)
			c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_table[i] = c;
	}
}

/* Running state: start with ~0, finish with ~state. */
static uint32_t crc_update(uint32_t state, const volatile uint8_t *p, size_t n)
{
	while (n--)
		state = (state >> 8) ^ crc_table[(state ^ *p++) & 0xff];
	return state;
}

/* ---- device ---- */

static int open_dev(void)
{
	int fd;

	if (dev_fd >= 0)
		return dev_fd;
	fd = open(dev_path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		die(EXIT_SYSTEM, "%s: %s", dev_path, strerror(errno));
	return fd;
}

static const char *status_name(uint32_t status)
{
	switch (status) {
	case 0x00: return "ok";
	case 0x01: return "bad opcode";
	case 0x02: return "bad command";
	case 0x03: return "VRAM range out of bounds";
	case 0x04: return "guest memory access failed";
	case 0x05: return "bus mastering disabled";
	case 0x06: return "VRAM backing I/O failed";
	case 0x07: return "completion record write failed";
	case 0x10: return "ring base misaligned";
	case 0x11: return "bad ring size";
	case 0x12: return "ring out of range";
	case 0x13: return "ring fetch failed";
	case 0x14: return "bad tail";
	default: return "unknown";
	}
}

/* Submits one job; 0 or the errno of the failed ioctl. */
static int submit_job(int fd, struct p2plab_gpu_job *job)
{
	job->timeout_ms = timeout_ms;
	job->flags |= job_flags;
	return ioctl(fd, P2PLAB_GPU_IOC_SUBMIT, job) ? errno : 0;
}

/* Prints why a job failed with @err and exits with the matching code. */
__attribute__((noreturn))
static void job_failed(const struct p2plab_gpu_job *job, int err)
{
	switch (err) {
	case EIO:
		die(EXIT_DEVICE, "device error status %#x (%s), fence %" PRIu64, job->status,
		    status_name(job->status), (uint64_t)job->fence);
	case ETIMEDOUT:
		die(EXIT_TIMEOUT, "job timed out (fence %" PRIu64 ")", (uint64_t)job->fence);
	default:
		die(EXIT_SYSTEM, "submit: %s", strerror(err));
	}
}

/* Runs one job; on failure prints why and exits with the matching code. */
static void run_job(int fd, struct p2plab_gpu_job *job)
{
	int err = submit_job(fd, job);

	if (err)
		job_failed(job, err);
}

static int cmd_info(int fd)
{
	struct p2plab_gpu_info info;

	if (ioctl(fd, P2PLAB_GPU_IOC_INFO, &info))
		die(EXIT_SYSTEM, "info: %s", strerror(errno));
	info.pci_name[sizeof(info.pci_name) - 1] = 0;
	printf("pci: %s\n", info.pci_name);
	printf("ids: %04x:%04x\n", info.vendor_id, info.device_id);
	printf("version: %u.%u\n", info.version >> 16, info.version & 0xffff);
	printf("vram_size: %" PRIu64 "\n", (uint64_t)info.vram_size);
	printf("vram_bus_addr: 0x%" PRIx64 "\n", (uint64_t)info.vram_bus_addr);
	printf("ring_entries: %u\n", info.ring_entries);
	printf("status: 0x%x\n", info.status);
	printf("completed_fence: %" PRIu64 "\n", (uint64_t)info.completed_fence);
	printf("submitted_fence: %" PRIu64 "\n", (uint64_t)info.submitted_fence);
	printf("jobs_completed: %u\n", info.jobs_completed);
	printf("jobs_failed: %u\n", info.jobs_failed);
	printf("engine_error: 0x%x\n", info.engine_error);
	printf("p2pmem: %s\n", info.flags & P2PLAB_GPU_INFO_P2PMEM ? "yes" : "no");
	printf("interrupts: %s\n", info.flags & P2PLAB_GPU_INFO_MSIX ? "msix" : "intx");
	printf("broken: %s\n", info.flags & P2PLAB_GPU_INFO_BROKEN ? "yes" : "no");
	return 0;
}

static int cmd_fill(int fd, uint64_t off, uint64_t len, uint32_t pattern)
{
	struct p2plab_gpu_job job = {
		.op = P2PLAB_GPU_OP_FILL, .dst = off, .len = len, .pattern = pattern,
	};

	run_job(fd, &job);
	return 0;
}

static int cmd_checksum(int fd, uint64_t off, uint64_t len)
{
	struct p2plab_gpu_job job = { .op = P2PLAB_GPU_OP_CHECKSUM, .src = off, .len = len };

	run_job(fd, &job);
	printf("%08x\n", job.result);
	return 0;
}

static int cmd_copy_vram(int fd, uint64_t src, uint64_t dst, uint64_t len)
{
	struct p2plab_gpu_job job = {
		.op = P2PLAB_GPU_OP_COPY_VRAM, .src = src, .dst = dst, .len = len,
	};

	run_job(fd, &job);
	return 0;
}

static int cmd_copy_to_vram(int fd, const char *path, uint64_t off)
{
	int in = open(path, O_RDONLY | O_CLOEXEC);
	uint8_t *buf = malloc(FILE_CHUNK);
	uint64_t done = 0;

	if (in < 0)
		die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
	if (!buf)
		die(EXIT_SYSTEM, "out of memory");
	for (;;) {
		size_t have = 0;
		ssize_t n;

		/* Fill the chunk completely unless the file ends. */
		while (have < FILE_CHUNK) {
			n = read(in, buf + have, FILE_CHUNK - have);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0)
				die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
			if (n == 0)
				break;
			have += (size_t)n;
		}
		if (!have)
			break;
		struct p2plab_gpu_job job = {
			.op = P2PLAB_GPU_OP_COPY_TO_VRAM,
			.src = (uintptr_t)buf, .dst = off + done, .len = have,
		};
		run_job(fd, &job);
		done += have;
		if (have < FILE_CHUNK)
			break;
	}
	free(buf);
	close(in);
	fprintf(stderr, "copied %" PRIu64 " bytes to VRAM at 0x%" PRIx64 "\n", done, off);
	return 0;
}

static int cmd_copy_from_vram(int fd, uint64_t off, uint64_t len, const char *path)
{
	int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	uint8_t *buf = malloc(FILE_CHUNK);
	uint64_t done = 0;

	if (out < 0)
		die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
	if (!buf)
		die(EXIT_SYSTEM, "out of memory");
	while (done < len) {
		size_t n = len - done < FILE_CHUNK ? (size_t)(len - done) : FILE_CHUNK;
		struct p2plab_gpu_job job = {
			.op = P2PLAB_GPU_OP_COPY_FROM_VRAM,
			.src = off + done, .dst = (uintptr_t)buf, .len = n,
		};
		size_t put = 0;

		run_job(fd, &job);
		while (put < n) {
			ssize_t w = write(out, buf + put, n - put);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
			put += (size_t)w;
		}
		done += n;
	}
	if (close(out))
		die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
	free(buf);
	return 0;
}

static int cmd_raw(int fd, int argc, char **argv)
{
	struct p2plab_gpu_job job = {
		.op = (uint32_t)parse_num("OP", argv[0]),
		.src = parse_num("SRC", argv[1]),
		.dst = parse_num("DST", argv[2]),
		.len = parse_num("LEN", argv[3]),
		.pattern = argc > 4 ? (uint32_t)parse_num("PATTERN", argv[4]) : 0,
	};

	/* A device error status is this command's answer, not a failure to
	 * report: print it the same way, then exit with EXIT_DEVICE. */
	int err = submit_job(fd, &job);

	if (err && err != EIO)
		job_failed(&job, err);
	printf("status %#x result %08x fence %" PRIu64 "\n", job.status, job.result,
	       (uint64_t)job.fence);
	return job.status ? EXIT_DEVICE : 0;
}

/* Maps [off, off+len) of VRAM; returns the pointer to off. */
static volatile uint8_t *map_vram(int fd, uint64_t off, uint64_t len, void **base,
				  size_t *maplen)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = off & ~(uint64_t)(page - 1);
	void *p;

	if (len == 0)
		die(EXIT_USAGE, "LEN must not be 0");
	*maplen = (size_t)(off - start + len);
	p = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
	if (p == MAP_FAILED)
		die(EXIT_SYSTEM, "mmap VRAM: %s", strerror(errno));
	*base = p;
	return (volatile uint8_t *)p + (off - start);
}

static int cmd_mmap_fill(int fd, uint64_t off, uint64_t len, uint8_t byte)
{
	size_t maplen;
	void *base;
	volatile uint8_t *p = map_vram(fd, off, len, &base, &maplen);

	for (uint64_t i = 0; i < len; i++)
		p[i] = byte;
	munmap(base, maplen);
	return 0;
}

static int cmd_mmap_checksum(int fd, uint64_t off, uint64_t len)
{
	size_t maplen;
	void *base;
	volatile uint8_t *p = map_vram(fd, off, len, &base, &maplen);

	printf("%08x\n", ~crc_update(~0u, p, len));
	munmap(base, maplen);
	return 0;
}

static int cmd_crc32c(int argc, char **argv)
{
	int in = open(argv[0], O_RDONLY | O_CLOEXEC);
	uint64_t off = argc > 1 ? parse_num("OFF", argv[1]) : 0;
	uint64_t left = argc > 2 ? parse_num("LEN", argv[2]) : UINT64_MAX;
	uint8_t *buf = malloc(FILE_CHUNK);
	uint32_t state = ~0u;

	if (in < 0)
		die(EXIT_SYSTEM, "%s: %s", argv[0], strerror(errno));
	if (!buf)
		die(EXIT_SYSTEM, "out of memory");
	/* Plain reads after one seek, so pipes work when OFF is 0. */
	if (off && lseek(in, (off_t)off, SEEK_SET) < 0)
		die(EXIT_SYSTEM, "%s: %s", argv[0], strerror(errno));
	while (left) {
		size_t want = left < FILE_CHUNK ? (size_t)left : FILE_CHUNK;
		ssize_t n = read(in, buf, want);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die(EXIT_SYSTEM, "%s: %s", argv[0], strerror(errno));
		if (n == 0) {
			if (left != UINT64_MAX)
				die(EXIT_SYSTEM, "%s: ends before the requested range", argv[0]);
			break;
		}
		state = crc_update(state, buf, (size_t)n);
		if (left != UINT64_MAX)
			left -= (uint64_t)n;
	}
	printf("%08x\n", ~state);
	free(buf);
	close(in);
	return 0;
}

/* ---- peer-memory scenarios (p2plab_p2p_test.ko as the importer) ---- */

static const char *fact_prefix = "P2P";

static void fact(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s_%s=", fact_prefix, key);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static int open_test(void)
{
	int fd = open("/dev/p2plab-p2p-test", O_RDWR | O_CLOEXEC);

	if (fd < 0)
		die(EXIT_SYSTEM, "/dev/p2plab-p2p-test: %s (modprobe p2plab_p2p_test)",
		    strerror(errno));
	return fd;
}

static void test_ioctl(int tfd, unsigned long req, void *arg, const char *what)
{
	if (ioctl(tfd, req, arg))
		die(EXIT_SYSTEM, "%s: %s", what, strerror(errno));
}

static struct p2plab_gpu_alloc scenario_alloc(int fd, uint64_t size)
{
	struct p2plab_gpu_alloc a = { .size = size };

	if (ioctl(fd, P2PLAB_GPU_IOC_ALLOC, &a))
		die(EXIT_SYSTEM, "ALLOC %" PRIu64 ": %s", size, strerror(errno));
	fact("ALLOC_HANDLE", "%u", a.handle);
	fact("ALLOC_OFFSET", "0x%" PRIx64, (uint64_t)a.vram_offset);
	fact("ALLOC_SIZE", "%" PRIu64, (uint64_t)a.size);
	return a;
}

/* ALLOC, mmap, PIN: prints the pin's facts, returns its id (0: refused). */
static uint32_t scenario_pin(int fd, int tfd, const char *peer, uint64_t size,
			     uint32_t *handle)
{
	struct p2plab_gpu_alloc a = scenario_alloc(fd, size);
	struct p2plab_p2p_test_pin pin = { .len = a.size };
	void *va;

	va = mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)a.vram_offset);
	if (va == MAP_FAILED)
		die(EXIT_SYSTEM, "mmap of the allocation: %s", strerror(errno));
	*handle = a.handle;
	pin.va = (uintptr_t)va;
	snprintf(pin.peer, sizeof(pin.peer), "%s", peer);
	test_ioctl(tfd, P2PLAB_P2P_TEST_IOC_PIN, &pin, "PIN");
	fact("GET_RET", "%d", pin.get_ret);
	fact("MAP_RET", "%d", pin.map_ret);
	fact("ENTRIES", "%u", pin.entries);
	fact("PAGE_SIZE", "%u", pin.page_size);
	fact("PT_VRAM_OFFSET", "0x%" PRIx64, (uint64_t)pin.vram_offset);
	fact("PHYS0", "0x%" PRIx64, (uint64_t)pin.phys0);
	fact("PHYS_CONTIGUOUS", "%u", pin.phys_contiguous);
	fact("DMA0", "0x%" PRIx64, (uint64_t)pin.dma0);
	fact("DMA_CONTIGUOUS", "%u", pin.dma_contiguous);
	fact("MAP_TYPE", "%u", pin.map_type);
	return pin.id;
}

static struct p2plab_p2p_test_status scenario_status(int tfd, uint32_t id, bool unpin,
						     const char *key)
{
	struct p2plab_p2p_test_status st = { .id = id };
	char name[64];

	test_ioctl(tfd, unpin ? P2PLAB_P2P_TEST_IOC_UNPIN : P2PLAB_P2P_TEST_IOC_STATUS, &st,
		   unpin ? "UNPIN" : "STATUS");
	snprintf(name, sizeof(name), "%s_CALLBACKS", key);
	fact(name, "%u", st.callbacks);
	snprintf(name, sizeof(name), "%s_REVOKED", key);
	fact(name, "%u", st.revoked);
	snprintf(name, sizeof(name), "%s_CALLBACK_IN_TASK", key);
	fact(name, "%u", st.callback_in_task);
	if (unpin) {
		snprintf(name, sizeof(name), "%s_PUT_RET", key);
		fact(name, "%d", st.put_ret);
	}
	return st;
}

static void write_sysfs(const char *path, const char *value)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
	n = write(fd, value, strlen(value));
	if (n != (ssize_t)strlen(value))
		die(EXIT_SYSTEM, "write %s to %s: %s", value, path,
		    n < 0 ? strerror(errno) : "short write");
	close(fd);
}

static void scenario_dmabuf_attach(int tfd, int dfd, const char *peer, bool p2p,
				   const char *key, uint32_t *id)
{
	struct p2plab_p2p_test_dmabuf at = { .fd = dfd, .p2p = p2p };
	char name[64];

	snprintf(at.peer, sizeof(at.peer), "%s", peer);
	test_ioctl(tfd, P2PLAB_P2P_TEST_IOC_DMABUF_ATTACH, &at, "DMABUF_ATTACH");
	snprintf(name, sizeof(name), "%s_ATTACH_RET", key);
	fact(name, "%d", at.attach_ret);
	snprintf(name, sizeof(name), "%s_MAP_RET", key);
	fact(name, "%d", at.map_ret);
	snprintf(name, sizeof(name), "%s_NENTS", key);
	fact(name, "%u", at.nents);
	snprintf(name, sizeof(name), "%s_DMA0", key);
	fact(name, "0x%" PRIx64, (uint64_t)at.dma0);
	snprintf(name, sizeof(name), "%s_DMA_LEN", key);
	fact(name, "%" PRIu64, (uint64_t)at.dma_len);
	*id = at.id;
}

static int cmd_p2p_scenario(const char *peer, uint64_t size, const char *action)
{
	int tfd = open_test();
	struct p2plab_gpu_info info;
	char path[128];
	uint32_t id, handle;
	int fd;

	if (!strcmp(action, "exit")) {
		/* The child pins and exits holding everything; the parent asks. */
		int pipefd[2], status;
		pid_t pid;

		if (pipe(pipefd))
			die(EXIT_SYSTEM, "pipe: %s", strerror(errno));
		pid = fork();
		if (pid < 0)
			die(EXIT_SYSTEM, "fork: %s", strerror(errno));
		if (!pid) {
			id = scenario_pin(open_dev(), tfd, peer, size, &handle);
			if (write(pipefd[1], &id, sizeof(id)) != sizeof(id))
				_exit(EXIT_SYSTEM);
			_exit(0);
		}
		close(pipefd[1]);
		if (read(pipefd[0], &id, sizeof(id)) != sizeof(id))
			die(EXIT_SYSTEM, "the pinning child failed");
		if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
			die(EXIT_SYSTEM, "the pinning child failed");
		if (!id)
			die(EXIT_SYSTEM, "the child's pin was refused");
		scenario_status(tfd, id, false, "AFTER");
		scenario_status(tfd, id, true, "FORGET");
		return 0;
	}

	fd = open_dev();
	if (ioctl(fd, P2PLAB_GPU_IOC_INFO, &info))
		die(EXIT_SYSTEM, "INFO: %s", strerror(errno));
	info.pci_name[sizeof(info.pci_name) - 1] = 0;

	if (!strcmp(action, "dmabuf")) {
		struct p2plab_gpu_alloc a = scenario_alloc(fd, size);
		struct p2plab_gpu_export_dmabuf ex = { .handle = a.handle,
						       .flags = O_CLOEXEC | O_RDWR };
		struct p2plab_p2p_test_dmabuf_status st = { 0 };
		uint32_t plain_id;

		if (ioctl(fd, P2PLAB_GPU_IOC_EXPORT_DMABUF, &ex))
			die(EXIT_SYSTEM, "EXPORT_DMABUF: %s", strerror(errno));
		scenario_dmabuf_attach(tfd, ex.fd, peer, true, "P2P", &id);
		scenario_dmabuf_attach(tfd, ex.fd, peer, false, "PLAIN", &plain_id);
		if (plain_id)
			test_ioctl(tfd, P2PLAB_P2P_TEST_IOC_DMABUF_DETACH, &plain_id, "DETACH");
		if (!id)
			return 0;
		if (ioctl(fd, P2PLAB_GPU_IOC_FREE, &a.handle))
			die(EXIT_SYSTEM, "FREE: %s", strerror(errno));
		st.id = id;
		test_ioctl(tfd, P2PLAB_P2P_TEST_IOC_DMABUF_STATUS, &st, "DMABUF_STATUS");
		fact("REVOKED_INVALIDATIONS", "%u", st.invalidations);
		fact("REVOKED_STILL_MAPPED", "%u", st.mapped);
		fact("REVOKED_REMAP_RET", "%d", st.remap_ret);
		test_ioctl(tfd, P2PLAB_P2P_TEST_IOC_DMABUF_DETACH, &id, "DETACH");
		close(ex.fd);
		return 0;
	}

	id = scenario_pin(fd, tfd, peer, size, &handle);
	if (!id)
		return 0;
	if (!strcmp(action, "unpin")) {
		scenario_status(tfd, id, true, "UNPIN");
		return 0;
	}
	if (!strcmp(action, "free")) {
		if (ioctl(fd, P2PLAB_GPU_IOC_FREE, &handle))
			die(EXIT_SYSTEM, "FREE: %s", strerror(errno));
	} else if (!strcmp(action, "reset")) {
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/reset", info.pci_name);
		write_sysfs(path, "1");
	} else if (!strcmp(action, "unbind")) {
		write_sysfs("/sys/bus/pci/drivers/p2plab_gpu/unbind", info.pci_name);
	} else if (strcmp(action, "free")) {
		die(EXIT_USAGE, "unknown action '%s'", action);
	}
	scenario_status(tfd, id, false, "AFTER");
	scenario_status(tfd, id, true, "FORGET");
	if (!strcmp(action, "unbind")) {
		close(fd);
		write_sysfs("/sys/bus/pci/drivers/p2plab_gpu/bind", info.pci_name);
	}
	return 0;
}

static void need(int argc, int min, int max)
{
	if (argc < min || argc > max) {
		usage(stderr);
		exit(EXIT_USAGE);
	}
}

int main(int argc, char **argv)
{
	const char *cmd;
	int opt;

	while ((opt = getopt(argc, argv, "d:F:t:UBh")) != -1) {
		switch (opt) {
		case 'd':
			dev_path = optarg;
			break;
		case 'F':
			dev_fd = (int)parse_num("-F", optarg);
			break;
		case 't':
			timeout_ms = (uint32_t)parse_num("-t", optarg);
			break;
		case 'U':
			job_flags |= P2PLAB_GPU_JOB_UNCHECKED;
			break;
		case 'B':
			job_flags |= P2PLAB_GPU_JOB_BUS_ADDR;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	argc -= optind;
	argv += optind;
	if (argc < 1) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[0];
	argc--;
	argv++;
	crc_init();

	if (!strcmp(cmd, "crc32c")) {
		need(argc, 1, 3);
		return cmd_crc32c(argc, argv);
	}
	if (!strcmp(cmd, "info")) {
		need(argc, 0, 0);
		return cmd_info(open_dev());
	}
	if (!strcmp(cmd, "nop")) {
		struct p2plab_gpu_job job = { .op = P2PLAB_GPU_OP_NOP };

		need(argc, 0, 0);
		run_job(open_dev(), &job);
		printf("fence %" PRIu64 "\n", (uint64_t)job.fence);
		return 0;
	}
	if (!strcmp(cmd, "fill")) {
		uint64_t byte;

		need(argc, 3, 3);
		byte = parse_num("BYTE", argv[2]);
		if (byte > 0xff)
			die(EXIT_USAGE, "BYTE must be 0..255");
		return cmd_fill(open_dev(), parse_num("OFF", argv[0]), parse_num("LEN", argv[1]),
				(uint32_t)byte * 0x01010101u);
	}
	if (!strcmp(cmd, "fill32")) {
		uint64_t pattern;

		need(argc, 3, 3);
		pattern = parse_num("PATTERN", argv[2]);
		if (pattern > 0xffffffffu)
			die(EXIT_USAGE, "PATTERN must fit in 32 bits");
		return cmd_fill(open_dev(), parse_num("OFF", argv[0]), parse_num("LEN", argv[1]),
				(uint32_t)pattern);
	}
	if (!strcmp(cmd, "checksum")) {
		need(argc, 2, 2);
		return cmd_checksum(open_dev(), parse_num("OFF", argv[0]), parse_num("LEN", argv[1]));
	}
	if (!strcmp(cmd, "copy-to-vram")) {
		need(argc, 2, 2);
		return cmd_copy_to_vram(open_dev(), argv[0], parse_num("OFF", argv[1]));
	}
	if (!strcmp(cmd, "copy-from-vram")) {
		need(argc, 3, 3);
		return cmd_copy_from_vram(open_dev(), parse_num("OFF", argv[0]),
					  parse_num("LEN", argv[1]), argv[2]);
	}
	if (!strcmp(cmd, "copy-vram")) {
		need(argc, 3, 3);
		return cmd_copy_vram(open_dev(), parse_num("SRC", argv[0]), parse_num("DST", argv[1]),
				     parse_num("LEN", argv[2]));
	}
	if (!strcmp(cmd, "raw")) {
		need(argc, 4, 5);
		if (!job_flags)
			die(EXIT_USAGE, "raw needs -U or -B");
		return cmd_raw(open_dev(), argc, argv);
	}
	if (!strcmp(cmd, "mmap-fill")) {
		uint64_t byte;

		need(argc, 3, 3);
		byte = parse_num("BYTE", argv[2]);
		if (byte > 0xff)
			die(EXIT_USAGE, "BYTE must be 0..255");
		return cmd_mmap_fill(open_dev(), parse_num("OFF", argv[0]),
				     parse_num("LEN", argv[1]), (uint8_t)byte);
	}
	if (!strcmp(cmd, "mmap-checksum")) {
		need(argc, 2, 2);
		return cmd_mmap_checksum(open_dev(), parse_num("OFF", argv[0]),
					 parse_num("LEN", argv[1]));
	}
	if (!strcmp(cmd, "p2p-scenario")) {
		need(argc, 4, 4);
		fact_prefix = argv[3];
		return cmd_p2p_scenario(argv[0], parse_num("SIZE", argv[1]), argv[2]);
	}
	fprintf(stderr, "p2plab-gpu-tool: unknown command '%s'\n", cmd);
	usage(stderr);
	return EXIT_USAGE;
}
