// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * nv-p2p-test-tool: drives the nv_p2p_test module (a third-party-style
 * importer of NVIDIA's peer-memory API) through one scenario on GPU memory
 * of /dev/p2plab-gpuN and prints what happened, one PREFIX_KEY=VALUE fact
 * per line.
 *
 * Exit codes: 0 the scenario ran (the facts say how it went); 2 usage;
 * 3 system error (open, ioctl, mmap, fork).
 */

#define _GNU_SOURCE
#include <ctype.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include "../../guest-driver/p2plab_gpu_uapi.h"
#include "../nv_p2p_test_uapi.h"

#define EXIT_USAGE	2
#define EXIT_SYSTEM	3

/* NVIDIA's GPU page: allocations, pins and mappings are in these. */
#define GPU_PAGE	(64u << 10)

static const char *dev_path = "/dev/p2plab-gpu0";
static const char *prefix = "NV";

static void usage(FILE *out)
{
	fprintf(out,
		"usage: nv-p2p-test-tool [-d DEVICE] PEER SIZE ACTION PREFIX\n"
		"\n"
		"Allocates SIZE bytes of GPU memory after a 1 MiB spacer, maps it and has\n"
		"nv_p2p_test (modprobe nv_p2p_test) pin all but its first 64 KiB through\n"
		"nvidia_p2p_get_pages and DMA-map it for PEER (a PCI name), then:\n"
		"  unpin            unmap and put_pages\n"
		"  free             FREE the allocation (the free callback must run)\n"
		"  exit             a child pins and exits (its GPU file closes)\n"
		"  reset            function reset of the GPU\n"
		"  unbind           unbind the GPU driver (rebinds after)\n"
		"  persistent-free  pin with get_pages_persistent, FREE, allocate again,\n"
		"                   put_pages_persistent, allocate again\n"
		"  persistent-reset pin with get_pages_persistent, function reset, put\n"
		"  args             bad arguments and misuse (nothing stays pinned)\n"
		"Prints PREFIX_KEY=VALUE facts. SIZE takes K, M, G suffixes.\n"
		"Exit: 0 ran, 2 usage, 3 system error.\n");
}

__attribute__((noreturn, format(printf, 2, 3)))
static void die(int code, const char *fmt, ...)
{
	va_list ap;

	fputs("nv-p2p-test-tool: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(code);
}

static uint64_t parse_size(const char *s)
{
	char *end;
	uint64_t v;

	errno = 0;
	if (!*s || *s == '-')
		die(EXIT_USAGE, "SIZE: not a number: '%s'", s);
	v = strtoull(s, &end, 0);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (errno || *end || v > (1ull << 40))
		die(EXIT_USAGE, "SIZE: not a size: '%s'", s);
	return v;
}

/* Prints PREFIX_KEY=VALUE, the key in capitals. */
__attribute__((format(printf, 2, 3)))
static void fact(const char *key, const char *fmt, ...)
{
	va_list ap;

	printf("%s_", prefix);
	for (; *key; key++)
		putchar(toupper((unsigned char)*key));
	putchar('=');
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void xioctl(int fd, unsigned long req, void *arg, const char *what)
{
	if (ioctl(fd, req, arg))
		die(EXIT_SYSTEM, "%s: %s", what, strerror(errno));
}

static int open_or_die(const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC);

	if (fd < 0)
		die(EXIT_SYSTEM, "%s: %s", path, strerror(errno));
	return fd;
}

static void write_sysfs(const char *path, const char *value)
{
	int fd = open_or_die(path, O_WRONLY);
	ssize_t n = write(fd, value, strlen(value));

	if (n != (ssize_t)strlen(value))
		die(EXIT_SYSTEM, "write %s to %s: %s", value, path,
		    n < 0 ? strerror(errno) : "short write");
	close(fd);
}

static struct p2plab_gpu_alloc gpu_alloc(int fd, uint64_t size, const char *key)
{
	struct p2plab_gpu_alloc a = { .size = size };
	char name[64];

	xioctl(fd, P2PLAB_GPU_IOC_ALLOC, &a, "ALLOC");
	if (key) {
		snprintf(name, sizeof(name), "%s_OFFSET", key);
		fact(name, "0x%" PRIx64, (uint64_t)a.vram_offset);
		snprintf(name, sizeof(name), "%s_SIZE", key);
		fact(name, "%" PRIu64, (uint64_t)a.size);
	}
	return a;
}

static void gpu_free(int fd, uint32_t handle)
{
	xioctl(fd, P2PLAB_GPU_IOC_FREE, &handle, "FREE");
}

/* The allocation, mapped; its user address is a GPU page multiple. */
static uint8_t *gpu_map(int fd, const struct p2plab_gpu_alloc *a)
{
	void *va = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			(off_t)a->vram_offset);

	if (va == MAP_FAILED)
		die(EXIT_SYSTEM, "mmap of the allocation: %s", strerror(errno));
	fact("VA_ALIGNED", "%d", (uintptr_t)va % GPU_PAGE == 0);
	return va;
}

static void print_uuid(const char *key, const uint8_t *u)
{
	fact(key, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	     u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
	     u[12], u[13], u[14], u[15]);
}

/*
 * A 1 MiB spacer (kept until the file closes, so the allocation is not at
 * VRAM offset 0), the allocation, its mapping, and a PIN of all but its
 * first GPU page (so offsets inside the allocation count too). Returns the
 * pin's id (0: refused).
 */
static uint32_t scenario_pin(int fd, int tfd, const char *peer, uint64_t size, bool persistent,
			     struct p2plab_gpu_alloc *a)
{
	struct nv_p2p_test_pin pin;
	uint8_t *va;

	gpu_alloc(fd, 1u << 20, NULL);
	*a = gpu_alloc(fd, size, "ALLOC");
	if (a->size < 2 * GPU_PAGE)
		die(EXIT_USAGE, "SIZE must be at least 128 KiB");
	va = gpu_map(fd, a);
	memset(&pin, 0, sizeof(pin));
	pin.va = (uintptr_t)va + GPU_PAGE;
	pin.len = a->size - GPU_PAGE;
	pin.persistent = persistent;
	snprintf(pin.peer, sizeof(pin.peer), "%s", peer);
	xioctl(tfd, NV_P2P_TEST_IOC_PIN, &pin, "PIN");
	fact("GET_RET", "%d", pin.get_ret);
	fact("MAP_RET", "%d", pin.map_ret);
	fact("VERSION", "0x%08x", pin.version);
	fact("PT_COMPATIBLE", "%u", pin.pt_compatible);
	fact("PAGE_SIZE", "%u", pin.page_size);
	fact("ENTRIES", "%u", pin.entries);
	fact("PT_FLAGS", "%u", pin.pt_flags);
	print_uuid("UUID", pin.uuid);
	fact("PHYS0", "0x%" PRIx64, (uint64_t)pin.phys0);
	fact("PHYS_CONTIGUOUS", "%u", pin.phys_contiguous);
	fact("DMA_VERSION", "0x%08x", pin.dma_version);
	fact("DMA_COMPATIBLE", "%u", pin.dma_compatible);
	fact("DMA_PAGE_SIZE", "%u", pin.dma_page_size_type);
	fact("DMA_ENTRIES", "%u", pin.dma_entries);
	fact("DMA_PCI_DEV_OK", "%u", pin.dma_pci_dev_ok);
	fact("DMA0", "0x%" PRIx64, (uint64_t)pin.dma0);
	fact("DMA_CONTIGUOUS", "%u", pin.dma_contiguous);
	return pin.id;
}

static void scenario_status(int tfd, uint32_t id, bool unpin, const char *key)
{
	struct nv_p2p_test_status st = { .id = id };
	char name[64];

	xioctl(tfd, unpin ? NV_P2P_TEST_IOC_UNPIN : NV_P2P_TEST_IOC_STATUS, &st,
	       unpin ? "UNPIN" : "STATUS");
#define STATUS_FACT(field, f) \
	do { \
		snprintf(name, sizeof(name), "%s_%s", key, #field); \
		fact(name, f, st.field); \
	} while (0)
	STATUS_FACT(callbacks, "%u");
	STATUS_FACT(revoked, "%u");
	STATUS_FACT(callback_in_task, "%u");
	STATUS_FACT(table_ok_in_callback, "%u");
	STATUS_FACT(free_map_ret, "%d");
	STATUS_FACT(free_table_ret, "%d");
	STATUS_FACT(table_valid, "%u");
	if (unpin) {
		STATUS_FACT(unmap_ret, "%d");
		STATUS_FACT(put_ret, "%d");
	}
#undef STATUS_FACT
}

static void scenario_args(int fd, int tfd, const char *peer, const char *gpu)
{
	struct nv_p2p_test_args args;
	struct p2plab_gpu_alloc a = gpu_alloc(fd, 4 * GPU_PAGE, "ALLOC");
	uint8_t *va = gpu_map(fd, &a);
	uint8_t *ram = mmap(NULL, 2 * GPU_PAGE, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (ram == MAP_FAILED)
		die(EXIT_SYSTEM, "mmap of RAM: %s", strerror(errno));
	memset(&args, 0, sizeof(args));
	args.va = (uintptr_t)va;
	args.len = a.size;
	args.ram_va = ((uintptr_t)ram + GPU_PAGE - 1) & ~(uint64_t)(GPU_PAGE - 1);
	snprintf(args.peer, sizeof(args.peer), "%s", peer);
	snprintf(args.other, sizeof(args.other), "%s", gpu);
	xioctl(tfd, NV_P2P_TEST_IOC_ARGS, &args, "ARGS");
#define ARG_FACT(field) fact(#field, "%d", args.field)
	ARG_FACT(get_misaligned_va);
	ARG_FACT(get_misaligned_len);
	ARG_FACT(get_zero_len);
	ARG_FACT(get_no_callback);
	ARG_FACT(get_no_data);
	ARG_FACT(get_token);
	ARG_FACT(get_ram);
	ARG_FACT(get_twice);
	ARG_FACT(persistent_misaligned);
	ARG_FACT(persistent_bad_flags);
	ARG_FACT(persistent_ok);
	ARG_FACT(force_bar1_get);
	ARG_FACT(force_bar1_map);
	ARG_FACT(force_bar1_put);
	ARG_FACT(map_null_peer);
	ARG_FACT(map_ok);
	ARG_FACT(unmap_other_peer);
	ARG_FACT(unmap_ok);
	ARG_FACT(unmap_again);
	ARG_FACT(map_left);
	ARG_FACT(put_wrong_va);
	ARG_FACT(put_persistent_of_plain);
	ARG_FACT(put_plain_of_persistent);
	ARG_FACT(put_persistent_flags);
	ARG_FACT(put_null);
	ARG_FACT(put_with_map);
	ARG_FACT(put_twice_ret);
	ARG_FACT(put_persistent_ok);
	ARG_FACT(free_table_null);
	ARG_FACT(free_map_null);
#undef ARG_FACT
}

static const char *const actions[] = {
	"unpin", "free", "exit", "reset", "unbind", "persistent-free", "persistent-reset", "args",
};

static int run(const char *peer, uint64_t size, const char *action)
{
	int tfd = open_or_die("/dev/nv-p2p-test", O_RDWR);
	struct p2plab_gpu_alloc a;
	struct p2plab_gpu_info info;
	char path[160];
	uint32_t id;
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
			id = scenario_pin(open_or_die(dev_path, O_RDWR), tfd, peer, size, false, &a);
			if (write(pipefd[1], &id, sizeof(id)) != sizeof(id))
				_exit(EXIT_SYSTEM);
			_exit(0);
		}
		close(pipefd[1]);
		if (read(pipefd[0], &id, sizeof(id)) != sizeof(id) ||
		    waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
			die(EXIT_SYSTEM, "the pinning child failed");
		if (!id)
			die(EXIT_SYSTEM, "the child's pin was refused");
		scenario_status(tfd, id, false, "AFTER");
		scenario_status(tfd, id, true, "FORGET");
		return 0;
	}

	fd = open_or_die(dev_path, O_RDWR);
	xioctl(fd, P2PLAB_GPU_IOC_INFO, &info, "INFO");
	info.pci_name[sizeof(info.pci_name) - 1] = 0;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/reset", info.pci_name);

	if (!strcmp(action, "args")) {
		scenario_args(fd, tfd, peer, info.pci_name);
		return 0;
	}
	if (!strcmp(action, "persistent-free")) {
		id = scenario_pin(fd, tfd, peer, size, true, &a);
		if (!id)
			return 0;
		gpu_free(fd, a.handle);
		scenario_status(tfd, id, false, "AFTER");
		/* Still pinned: the VRAM is not handed out again. */
		gpu_alloc(fd, a.size, "RETAINED_NEXT");
		scenario_status(tfd, id, true, "FORGET");
		/* Put: it is (first fit finds the hole again). */
		gpu_alloc(fd, a.size, "RELEASED_NEXT");
		return 0;
	}
	if (!strcmp(action, "persistent-reset")) {
		id = scenario_pin(fd, tfd, peer, size, true, &a);
		if (!id)
			return 0;
		write_sysfs(path, "1");
		scenario_status(tfd, id, false, "AFTER");
		scenario_status(tfd, id, true, "FORGET");
		return 0;
	}

	id = scenario_pin(fd, tfd, peer, size, false, &a);
	if (!id)
		return 0;
	if (!strcmp(action, "unpin")) {
		scenario_status(tfd, id, true, "UNPIN");
		return 0;
	}
	if (!strcmp(action, "free"))
		gpu_free(fd, a.handle);
	else if (!strcmp(action, "reset"))
		write_sysfs(path, "1");
	else
		write_sysfs("/sys/bus/pci/drivers/p2plab_gpu/unbind", info.pci_name);
	scenario_status(tfd, id, false, "AFTER");
	scenario_status(tfd, id, true, "FORGET");
	if (!strcmp(action, "unbind"))
		write_sysfs("/sys/bus/pci/drivers/p2plab_gpu/bind", info.pci_name);
	return 0;
}

int main(int argc, char **argv)
{
	int opt;

	while ((opt = getopt(argc, argv, "d:h")) != -1) {
		switch (opt) {
		case 'd':
			dev_path = optarg;
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
	if (argc != 4) {
		usage(stderr);
		return EXIT_USAGE;
	}
	prefix = argv[3];
	for (opt = 0; opt < (int)(sizeof(actions) / sizeof(actions[0])); opt++)
		if (!strcmp(argv[2], actions[opt]))
			break;
	if (opt == (int)(sizeof(actions) / sizeof(actions[0])))
		die(EXIT_USAGE, "unknown action '%s'", argv[2]);
	return run(argv[0], parse_size(argv[1]), argv[2]);
}
