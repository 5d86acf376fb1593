// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * p2plab-nic-tool: drives /dev/p2plab-nicN through p2plab_nic_uapi.h.
 *
 *   p2plab-nic-tool info [DEV]
 *       key=value lines: mtu, link_up, status, ring_entries, counters.
 *   p2plab-nic-tool xfer [--tx DEV] [--rx DEV] [--size BYTES] [--post BYTES]
 *                        [--src ram|gpu|dmabuf] [--dst ram|gpu|dmabuf] [--gpu DEV] [--seed N]
 *                        [--free-dst-after POSTS] [--abandon]
 *       Registers a source region on the TX NIC and a destination region
 *       on the RX NIC, fills the source with a seeded pattern, moves it
 *       over the wire in posts of --post bytes (receives posted first),
 *       and compares. Prints key=value lines (bytes, posts, frames, errors,
 *       first_error, verify, ms, mib_per_s). Exit 0 only if every post
 *       completed OK and the data matches; 1 on a failed post or mismatch;
 *       2 on a usage or setup error (the message names the cause).
 *       A gpu region is a VRAM allocation of the GPU (--gpu, default
 *       /dev/p2plab-gpu0) mapped into this process and registered through
 *       the GPU driver's peer-memory API; the GPU's copy engine fills the
 *       source and its CRC32C checksum job verifies the destination
 *       (src_crc, dst_crc). --src and --dst must be of one kind (frames
 *       are cut the same way on both sides).
 *       A dmabuf region is such an allocation exported by the GPU driver as
 *       a dma-buf and imported by the NIC driver by fd (no mapping here).
 *       --free-dst-after POSTS: free the destination's VRAM allocation once
 *       POSTS receives completed, with posts outstanding (revocation);
 *       the run then stops at the first failed post (post_errno) and
 *       reports the completions it got (rx_revoked).
 *       --signal-after POSTS FILE: create FILE once POSTS receives completed
 *       (so a script can act mid-transfer, e.g. unbind the GPU driver).
 *       --abandon: post what fits and exit at once without polling, so the
 *       driver's release path must quiesce the rings with posts outstanding.
 *
 * DEV defaults: --tx /dev/p2plab-nic0, --rx the same (the loopback wire).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h>
#include "../p2plab_nic_uapi.h"
#include "p2plab_gpu_uapi.h"

#define PAGE 4096u

static void die(const char *what)
{
	fprintf(stderr, "p2plab-nic-tool: %s: %s\n", what, strerror(errno));
	exit(2);
}

static uint64_t parse_size(const char *text)
{
	char *end;
	uint64_t v = strtoull(text, &end, 0);

	switch (*end) {
	case 'K': case 'k': v <<= 10; end++; break;
	case 'M': case 'm': v <<= 20; end++; break;
	case 'G': case 'g': v <<= 30; end++; break;
	}
	if (*end || !v) {
		fprintf(stderr, "p2plab-nic-tool: %s is not a size like 4M\n", text);
		exit(2);
	}
	return v;
}

static int open_nic(const char *path)
{
	int fd = open(path, O_RDWR);

	if (fd < 0) {
		fprintf(stderr, "p2plab-nic-tool: open %s: %s\n", path, strerror(errno));
		exit(2);
	}
	return fd;
}

static int info(const char *path)
{
	struct p2plab_nic_info i;
	int fd = open_nic(path);

	if (ioctl(fd, P2PLAB_NIC_IOC_INFO, &i))
		die("INFO");
	printf("mtu=%u\nlink_up=%u\nstatus=0x%x\nring_entries=%u\n", i.mtu, i.link_up, i.status,
	       i.ring_entries);
	printf("tx_frames=%llu\nrx_frames=%llu\nrevocations=%llu\n",
	       (unsigned long long)i.tx_frames, (unsigned long long)i.rx_frames,
	       (unsigned long long)i.revocations);
	close(fd);
	return 0;
}

struct region {
	int nic;
	uint8_t *va;
	uint64_t len;
	uint32_t handle;
	int gpu;		/* GPU fd for a gpu region, else -1 */
	uint64_t vram_offset;
	uint32_t gpu_handle;
	uint32_t map_type;
};

static int post_errno;

static void reg_ram(struct region *r, int nic, uint64_t len)
{
	struct p2plab_nic_reg_mr mr = { 0 };

	r->nic = nic;
	r->len = len;
	r->va = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->va == MAP_FAILED)
		die("mmap RAM");
	memset(r->va, 0, len);
	mr.addr = (uintptr_t)r->va;
	mr.length = len;
	mr.source = P2PLAB_NIC_SRC_RAM;
	mr.fd = -1;
	if (ioctl(nic, P2PLAB_NIC_IOC_REG_MR, &mr))
		die("REG_MR ram");
	r->handle = mr.handle;
	r->gpu = -1;
}

/* Runs one GPU engine job; exits on failure. */
static uint32_t gpu_job(int gpu, uint32_t op, uint64_t src, uint64_t dst, uint64_t len,
			uint32_t pattern)
{
	struct p2plab_gpu_job job = { .op = op, .src = src, .dst = dst, .len = len,
				      .pattern = pattern, .timeout_ms = 120000 };

	if (ioctl(gpu, P2PLAB_GPU_IOC_SUBMIT, &job) || job.status) {
		fprintf(stderr, "p2plab-nic-tool: GPU job %u: %s, status %#x\n", op,
			strerror(errno), job.status);
		exit(2);
	}
	return job.result;
}

static void reg_gpu(struct region *r, int nic, int gpu, uint64_t len, int dmabuf)
{
	struct p2plab_gpu_alloc a = { .size = len };
	struct p2plab_nic_reg_mr mr = { 0 };
	struct p2plab_gpu_export_dmabuf ex = { 0 };

	r->nic = nic;
	r->len = len;
	r->gpu = gpu;
	if (ioctl(gpu, P2PLAB_GPU_IOC_ALLOC, &a))
		die("GPU ALLOC");
	r->vram_offset = a.vram_offset;
	r->gpu_handle = a.handle;
	mr.length = len;
	if (dmabuf) {
		/* The allocation as a dma-buf; the NIC imports it by fd. */
		ex.handle = a.handle;
		ex.flags = O_RDWR | O_CLOEXEC;
		if (ioctl(gpu, P2PLAB_GPU_IOC_EXPORT_DMABUF, &ex))
			die("GPU EXPORT_DMABUF");
		mr.addr = 0;
		mr.source = P2PLAB_NIC_SRC_DMABUF;
		mr.fd = ex.fd;
	} else {
		r->va = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, gpu, a.vram_offset);
		if (r->va == MAP_FAILED)
			die("mmap VRAM");
		mr.addr = (uintptr_t)r->va;
		mr.source = P2PLAB_NIC_SRC_GPU;
		mr.fd = -1;
	}
	if (ioctl(nic, P2PLAB_NIC_IOC_REG_MR, &mr)) {
		int e = errno;

		printf("reg_errno=%d\n", e);
		fprintf(stderr, "p2plab-nic-tool: REG_MR gpu: %s\n", strerror(e));
		exit(3);
	}
	r->handle = mr.handle;
	r->map_type = mr.map_type;
	/* Zeroed by the GPU's engine, not through the (slow) BAR mapping. */
	gpu_job(gpu, P2PLAB_GPU_OP_FILL, 0, a.vram_offset, len, 0);
}

static uint8_t pattern(uint64_t i, uint32_t seed)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;

	return (uint8_t)(x >> 29);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct tally {
	uint64_t done, bytes, frames, errors;
	uint32_t first_error, revoked;
};

/* Reaps completions of @nic into @tx / @rx; waits up to @ms for one. */
static void reap(int nic, unsigned int ms, struct tally *tx, struct tally *rx)
{
	struct p2plab_nic_wc wc[64];
	struct p2plab_nic_poll p = { .wcs = (uintptr_t)wc, .max = 64, .timeout_ms = ms };
	uint32_t i;

	if (ioctl(nic, P2PLAB_NIC_IOC_POLL_CQ, &p))
		die("POLL_CQ");
	for (i = 0; i < p.count; i++) {
		struct tally *t = wc[i].opcode == P2PLAB_NIC_WC_SEND ? tx : rx;

		t->done++;
		t->bytes += wc[i].byte_len;
		t->frames += wc[i].frames;
		if (wc[i].status == P2PLAB_NIC_WC_REVOKED)
			t->revoked++;
		if (wc[i].status != P2PLAB_NIC_WC_OK) {
			if (!t->errors)
				t->first_error = wc[i].status;
			t->errors++;
		}
	}
}

/* Posts [off, off+len); 0, or -1 when the ring is full (ENOSPC). */
static int post(struct region *r, unsigned long cmd, uint64_t off, uint64_t len, uint64_t id)
{
	struct p2plab_nic_post p = { .handle = r->handle, .offset = off, .length = len, .wr_id = id };

	if (!ioctl(r->nic, cmd, &p))
		return 0;
	if (errno == ENOSPC)
		return -1;
	post_errno = errno;
	fprintf(stderr, "p2plab-nic-tool: post at %" PRIu64 ": %s\n", off, strerror(errno));
	return -2;
}

static int xfer(int argc, char **argv)
{
	const char *txp = "/dev/p2plab-nic0", *rxp = NULL, *src = "ram", *dst = "ram";
	uint64_t size = 4 << 20, chunk = 256 << 10, sent = 0, posted_rx = 0, posts;
	struct tally tx = { 0 }, rx = { 0 };
	struct region s, d;
	uint32_t seed = 1, src_crc = 0, dst_crc = 0, revoked_wcs = 0;
	uint64_t free_after = 0, signal_after = 0;
	const char *signal_file = NULL;
	const char *gpup = "/dev/p2plab-gpu0";
	int txfd, rxfd, i, abandon = 0, gpu = -1, freed = 0;
	double t0, ms;
	uint64_t bad = 0, k;

	for (i = 0; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--abandon")) {
			abandon = 1;
			continue;
		}
		if (!v) {
			fprintf(stderr, "p2plab-nic-tool: %s needs a value\n", a);
			return 2;
		}
		if (!strcmp(a, "--tx")) txp = v;
		else if (!strcmp(a, "--rx")) rxp = v;
		else if (!strcmp(a, "--size")) size = parse_size(v);
		else if (!strcmp(a, "--post")) chunk = parse_size(v);
		else if (!strcmp(a, "--src")) src = v;
		else if (!strcmp(a, "--dst")) dst = v;
		else if (!strcmp(a, "--seed")) seed = strtoul(v, NULL, 0);
		else if (!strcmp(a, "--gpu")) gpup = v;
		else if (!strcmp(a, "--free-dst-after")) free_after = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--signal-after")) {
			signal_after = strtoull(v, NULL, 0);
			if (i + 2 >= argc) {
				fprintf(stderr, "p2plab-nic-tool: --signal-after needs POSTS FILE\n");
				return 2;
			}
			signal_file = argv[++i + 1];
		}
		else {
			fprintf(stderr, "p2plab-nic-tool: unknown option %s\n", a);
			return 2;
		}
		i++;
	}
	if (strcmp(src, dst) || (strcmp(src, "ram") && strcmp(src, "gpu") && strcmp(src, "dmabuf"))) {
		fprintf(stderr, "p2plab-nic-tool: --src/--dst %s/%s: both ram, gpu or dmabuf\n",
			src, dst);
		return 2;
	}
	if (size % PAGE || chunk % PAGE || size % chunk) {
		fprintf(stderr, "p2plab-nic-tool: --size must be a multiple of --post, both of 4K\n");
		return 2;
	}
	txfd = open_nic(txp);
	rxfd = rxp && strcmp(rxp, txp) ? open_nic(rxp) : txfd;
	if (strcmp(src, "ram")) {
		int dmabuf = !strcmp(src, "dmabuf");
		uint64_t block = 4 << 20;
		uint8_t *buf = malloc(block);

		gpu = open(gpup, O_RDWR);
		if (gpu < 0 || !buf)
			die(gpup);
		reg_gpu(&s, txfd, gpu, size, dmabuf);
		reg_gpu(&d, rxfd, gpu, size, dmabuf);
		printf("map_type=%u\n", s.map_type);
		/* The source pattern goes in through the GPU's copy engine. */
		for (k = 0; k < size; k += block) {
			uint64_t j, n = size - k < block ? size - k : block;

			/* Word by word: byte by byte is slow under TCG. */
			for (j = 0; j < n; j += 8) {
				uint64_t w = ((k + j) / 8 + 1) * 0x9e3779b97f4a7c15ull ^ seed;

				w ^= w >> 29;
				memcpy(buf + j, &w, 8);
			}
			gpu_job(gpu, P2PLAB_GPU_OP_COPY_TO_VRAM, (uintptr_t)buf, s.vram_offset + k,
				n, 0);
		}
		free(buf);
		src_crc = gpu_job(gpu, P2PLAB_GPU_OP_CHECKSUM, s.vram_offset, 0, size, 0);
	} else {
		reg_ram(&s, txfd, size);
		reg_ram(&d, rxfd, size);
		for (k = 0; k < size; k++)
			s.va[k] = pattern(k, seed);
	}
	posts = size / chunk;

	t0 = now_ms();
	while (tx.done < posts || rx.done < posts) {
		int progress = 0;

		int r;

		while (posted_rx < posts &&
		       !(r = post(&d, P2PLAB_NIC_IOC_POST_RECV, posted_rx * chunk, chunk, posted_rx))) {
			posted_rx++;
			progress = 1;
		}
		while (!post_errno && sent < posts && sent < posted_rx &&
		       !(r = post(&s, P2PLAB_NIC_IOC_POST_SEND, sent * chunk, chunk, sent))) {
			sent++;
			progress = 1;
		}
		if (post_errno) {
			/* Collect what completes of the posts already made. */
			reap(txfd, 500, &tx, &rx);
			if (rxfd != txfd)
				reap(rxfd, 500, &tx, &rx);
			break;
		}
		if (signal_file && rx.done >= signal_after) {
			int fd = open(signal_file, O_WRONLY | O_CREAT, 0644);

			if (fd < 0)
				die(signal_file);
			close(fd);
			printf("signalled_after_rx=%" PRIu64 "\n", rx.done);
			signal_file = NULL;
		}
		if (free_after && !freed && rx.done >= free_after) {
			if (ioctl(gpu, P2PLAB_GPU_IOC_FREE, &d.gpu_handle))
				die("GPU FREE");
			freed = 1;
			printf("freed_after_rx=%" PRIu64 "\n", rx.done);
		}
		if (abandon) {
			printf("abandoned_posts=%" PRIu64 "\n", sent + posted_rx);
			return 0;
		}
		reap(txfd, progress ? 0 : 100, &tx, &rx);
		if (rxfd != txfd)
			reap(rxfd, 0, &tx, &rx);
		if (now_ms() - t0 > 600e3) {
			fprintf(stderr, "p2plab-nic-tool: no progress for 10 minutes\n");
			break;
		}
	}
	ms = now_ms() - t0;
	revoked_wcs = rx.revoked + tx.revoked;
	if (freed || post_errno) {
		/* Nothing to compare: the run stopped on purpose or on an error. */
		bad = 0;
	} else if (gpu >= 0) {
		dst_crc = gpu_job(gpu, P2PLAB_GPU_OP_CHECKSUM, d.vram_offset, 0, size, 0);
		bad = src_crc != dst_crc;
		printf("src_crc=0x%08x\ndst_crc=0x%08x\n", src_crc, dst_crc);
	} else {
		for (k = 0; k < size; k++)
			bad += d.va[k] != s.va[k];
	}
	printf("post_errno=%d\nrevoked_wcs=%u\n", post_errno, revoked_wcs);
	printf("bytes=%" PRIu64 "\nposts=%" PRIu64 "\n", size, posts);
	printf("tx_done=%" PRIu64 "\ntx_bytes=%" PRIu64 "\ntx_frames=%" PRIu64 "\ntx_errors=%" PRIu64
	       "\n", tx.done, tx.bytes, tx.frames, tx.errors);
	printf("rx_done=%" PRIu64 "\nrx_bytes=%" PRIu64 "\nrx_frames=%" PRIu64 "\nrx_errors=%" PRIu64
	       "\n", rx.done, rx.bytes, rx.frames, rx.errors);
	printf("first_error=0x%x\n", tx.errors ? tx.first_error : rx.first_error);
	printf("mismatched_bytes=%" PRIu64 "\nverify=%s\n", bad,
	       freed || post_errno ? "skipped" : bad ? "mismatch" : "ok");
	printf("ms=%.0f\nmib_per_s=%.1f\n", ms, size / 1048576.0 / (ms / 1e3));
	if (freed || post_errno)
		return post_errno ? 1 : 0;
	return tx.errors || rx.errors || bad || tx.done < posts || rx.done < posts;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "info"))
		return info(argc > 2 ? argv[2] : "/dev/p2plab-nic0");
	if (argc >= 2 && !strcmp(argv[1], "xfer"))
		return xfer(argc - 2, argv + 2);
	fprintf(stderr, "usage: p2plab-nic-tool info [DEV] | xfer [--tx DEV] [--rx DEV] "
			"[--size BYTES] [--post BYTES] [--src ram|gpu|dmabuf] [--dst ...] [--gpu DEV] "
			"[--seed N] [--free-dst-after POSTS] [--abandon]\n");
	return 2;
}
