// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * p2plab-efa-check: moves guest RAM to guest RAM through two EFA devices
 * with rdma-core's libibverbs and efadv (the unmodified stack), and checks
 * every byte. perftest moves data but never looks at it.
 *
 *   p2plab-efa-check xfer [--src efa_0] [--dst efa_1] [--size BYTES]
 *                         [--msg BYTES] [--seed N] [--no-read] [--window N]
 *       One SRD QP on each device. The source buffer (registered on --src)
 *       is filled with a seeded pattern and sent in --msg byte SENDs with
 *       the message's index as immediate data, straight into one
 *       destination buffer registered on --dst (a receive posted per
 *       message slot). SRD may deliver out of order: a receive slot k may
 *       get message j; its bytes are compared with source message j, and
 *       every message must arrive exactly once. Then --dst reads the whole
 *       source back with RDMA reads into a second buffer (unless --no-read)
 *       and compares it.
 *       key=value lines: messages, bytes, send_ok, recv_ok, out_of_order,
 *       duplicates, missing, mismatched_bytes, read_bytes,
 *       read_mismatched_bytes, verify (ok|bad), first_error_status,
 *       first_vendor_err, ms.
 *       Exit 0 only if everything completed OK and matched; 1 on a failed
 *       completion or a mismatch; 2 on a usage or setup error.
 *   p2plab-efa-check send-one [--src efa_0] [--dst efa_1]
 *       One SEND of 64 bytes; prints the send completion's status
 *       (status=, status_name=, vendor_err=), whatever it is. Exit 0 if
 *       a completion came (even an error), 2 otherwise.
 *   p2plab-efa-check gpu-xfer [--src efa_0] [--dst efa_1]
 *                   [--src-gpu /dev/p2plab-gpu0] [--dst-gpu /dev/p2plab-gpu1]
 *                   [--size BYTES] [--msg BYTES] [--seed N] [--window N]
 *       GPU memory to GPU memory (GPUDirect RDMA): three allocations
 *       exported by the GPU driver as dma-bufs (P2PLAB_GPU_IOC_EXPORT_DMABUF)
 *       and registered with ibv_reg_dmabuf_mr (the source on --src, the
 *       destination and a read-back buffer on --dst). The source is loaded
 *       with a seeded pattern by the GPU's engine; SRD SENDs move it into
 *       the destination (out-of-order deliveries are put back in place by
 *       the GPU's engine afterwards), then --dst RDMA-reads the source into
 *       the read-back buffer. The GPU's engine checksums all three (CRC32C)
 *       and they must equal the pattern's CRC32C computed here: no byte of
 *       the payload is looked at by the CPU.
 *       key=value lines: src_gpu_pci, dst_gpu_pci, messages, bytes,
 *       send_ok, recv_ok, out_of_order, duplicates, missing, read_bytes,
 *       expected_crc, src_crc, dst_crc, read_crc, verify, first_error_status,
 *       first_vendor_err, ms. When a registration is refused: reg_errno=,
 *       reg_error= and exit 3.
 *   p2plab-efa-check gpu-xfer --listen [ADDR:]PORT|--connect HOST:PORT
 *                   --role src|dst [--dev efa_0] [--gpu /dev/p2plab-gpu0]
 *                   [--size BYTES] [--msg BYTES] [--seed N] [--window N]
 *                   [--timeout SECONDS]
 *       One end of gpu-xfer, the other end another process with its own
 *       EFA and GPU (another guest, e.g. another lab joined by the EFA wire
 *       over TCP). The two ends exchange QPN, GID, rkey, address, length,
 *       SEND size and the source's CRC over one TCP connection (the
 *       guests' IP link), then the source SENDs its VRAM into the
 *       destination's, the destination RDMA-reads it into a second buffer,
 *       checksums both with its GPU engine against the source's GPU CRC,
 *       and sends its result back; the source exits after it (its MR
 *       stays registered for the read). The destination's --size is what
 *       its buffers hold: the source may send less, never more. Every wait
 *       on the peer ends after --timeout seconds (default 120); a peer that
 *       closes early, sends a frame that is not ours, a length beyond the
 *       buffers or a SEND size other than the receives posted is reported
 *       as peer_error=TEXT, exit 2.
 *       key=value lines: role, gpu_pci, listening, peer_gid, peer_qpn,
 *       messages, bytes, msg, ms, verify, first_error_status,
 *       first_vendor_err, dereg; the source: send_ok, expected_crc (the
 *       pattern's), src_crc (its GPU engine's), peer_status, peer_recv_ok,
 *       peer_read_bytes, peer_dst_crc, peer_read_crc; the destination:
 *       recv_ok, out_of_order, duplicates, missing, read_bytes, peer_crc,
 *       dst_crc, read_crc. Exit 0 only if both ends verified.
 *   p2plab-efa-check gpu-pinned [--src efa_0] [--dst efa_1]
 *                   [--gpu /dev/p2plab-gpu1] [--size BYTES] [--msg BYTES]
 *       What the GPU's dma-buf exporter does while the EFA driver's pinned
 *       import (ib_umem_dmabuf_get_pinned) holds an allocation A: A is
 *       registered on --dst and its dma-buf fd closed, then A is FREEd, a
 *       new allocation B is made, SENDs from RAM land in A's MR, the GPU
 *       gets a function reset (sysfs reset), SENDs land again, and the MR
 *       is deregistered. After each step it prints the kernel's
 *       p2pmem/available of the GPU and the driver's dmabuf_pins, and the
 *       GPU engine's CRC32C of A's VRAM against the data sent:
 *       avail_{start,alloc,freed,reset,dereg}, pins_{reg,freed,reset,dereg},
 *       a_offset, b_offset, free_ret, reset_ret, after_free_recv_ok,
 *       after_free_crc_ok, b_intact (B still holds what its owner wrote),
 *       after_reset_recv_ok, after_reset_crc_ok.
 *       Exit 0 if every step ran (the host judges the facts), 2 otherwise.
 *   p2plab-efa-check bench --mem gpu|ram [--src efa_0] [--dst efa_1]
 *                   [--src-gpu ..] [--dst-gpu ..] [--size BYTES] [--msg BYTES]
 *                   [--read-wr BYTES] [--window N] [--read-window N] [--seed N]
 *       Throughput of one memory kind, for scripts/bench --efa-only: the
 *       same three buffers as gpu-xfer, in GPU memory (dma-buf MRs) or in
 *       guest RAM (ordinary MRs). --size bytes go as --msg byte SRD SENDs
 *       (timed: send_us), then are RDMA-read back in --read-wr byte work
 *       requests, --read-window outstanding (timed: read_us). Untimed
 *       afterwards, every byte is checked by CRC32C (the GPU engine's for
 *       VRAM, the CPU's for RAM): the destination against the messages in
 *       the slots they landed in (sent_crc), the read-back against the
 *       pattern (expected_crc). Exit 0 only if all completed and matched.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdarg.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <infiniband/efadv.h>
#include <infiniband/verbs.h>

#include "p2plab_gpu_uapi.h"

#define QKEY 0x11111111u
#define CQ_DEPTH 1024
#define TIMEOUT_MS 120000

static void die(const char *what, int err)
{
	fprintf(stderr, "p2plab-efa-check: %s: %s\n", what, strerror(err));
	exit(2);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t parse_size(const char *text)
{
	char *end;
	uint64_t n = strtoull(text, &end, 0);

	switch (*end) {
	case 'K': case 'k': n <<= 10; end++; break;
	case 'M': case 'm': n <<= 20; end++; break;
	case 'G': case 'g': n <<= 30; end++; break;
	}
	if (*end || n == 0) {
		fprintf(stderr, "p2plab-efa-check: bad size %s\n", text);
		exit(2);
	}
	return n;
}

/* One device's side: context, PD, CQ, SRD QP and an AH to the peer. */
struct side {
	const char *name;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_ah *ah;
	union ibv_gid gid;
	uint32_t max_msg;
	uint32_t max_rdma;
};

static struct ibv_context *open_device(const char *name)
{
	int n, i;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;

	if (!list)
		die("ibv_get_device_list", errno);
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx) {
		fprintf(stderr, "p2plab-efa-check: no device %s\n", name);
		exit(2);
	}
	return ctx;
}

static void side_open(struct side *s, const char *name, uint32_t depth)
{
	struct ibv_port_attr port;
	struct efadv_device_attr dv = { 0 };
	struct ibv_qp_init_attr_ex attr = { 0 };
	struct efadv_qp_init_attr efa = { 0 };
	struct ibv_qp_attr mod = { 0 };
	int err;

	s->name = name;
	s->ctx = open_device(name);
	if (ibv_query_port(s->ctx, 1, &port))
		die("ibv_query_port", errno);
	s->max_msg = port.max_msg_sz;
	err = efadv_query_device(s->ctx, &dv, sizeof(dv));
	if (err)
		die("efadv_query_device", err);
	s->max_rdma = dv.max_rdma_size;
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid", errno);
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		die("ibv_alloc_pd", errno);
	s->cq = ibv_create_cq(s->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!s->cq)
		die("ibv_create_cq", errno);
	attr.qp_type = IBV_QPT_DRIVER;
	attr.send_cq = s->cq;
	attr.recv_cq = s->cq;
	attr.cap.max_send_wr = depth;
	attr.cap.max_recv_wr = depth;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	attr.pd = s->pd;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			      IBV_QP_EX_WITH_RDMA_READ;
	efa.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD;
	s->qp = efadv_create_qp_ex(s->ctx, &attr, &efa, sizeof(efa));
	if (!s->qp)
		die("efadv_create_qp_ex (SRD)", errno);
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	mod.qp_state = IBV_QPS_INIT;
	mod.pkey_index = 0;
	mod.port_num = 1;
	mod.qkey = QKEY;
	if (ibv_modify_qp(s->qp, &mod, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("ibv_modify_qp INIT", errno);
	mod.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(s->qp, &mod, IBV_QP_STATE))
		die("ibv_modify_qp RTR", errno);
	mod.qp_state = IBV_QPS_RTS;
	mod.sq_psn = 0;
	if (ibv_modify_qp(s->qp, &mod, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("ibv_modify_qp RTS", errno);
}

static void side_connect_gid(struct side *s, const union ibv_gid *gid)
{
	struct ibv_ah_attr ah = { 0 };

	ah.is_global = 1;
	ah.port_num = 1;
	ah.grh.dgid = *gid;
	ah.grh.sgid_index = 0;
	s->ah = ibv_create_ah(s->pd, &ah);
	if (!s->ah)
		die("ibv_create_ah", errno);
}

static void side_connect(struct side *s, const struct side *peer)
{
	side_connect_gid(s, &peer->gid);
}

static struct ibv_mr *reg(struct side *s, void *buf, size_t len, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(s->pd, buf, len, access);

	if (!mr)
		die("ibv_reg_mr", errno);
	return mr;
}

static void *alloc_buf(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, len))
		die("posix_memalign", ENOMEM);
	memset(p, 0, len);
	return p;
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
	size_t i;

	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static size_t mismatches(const uint8_t *a, const uint8_t *b, size_t len)
{
	size_t i, n = 0;

	for (i = 0; i < len; i++)
		n += a[i] != b[i];
	return n;
}

/* The first failed completion, for the report. */
static int first_status = -1;
static uint32_t first_vendor;

static void note_error(const struct ibv_wc *wc)
{
	if (first_status < 0) {
		first_status = wc->status;
		first_vendor = wc->vendor_err;
	}
}

static void post_send(struct side *s, uint32_t remote_qpn, uint64_t id, uint32_t imm,
		      uint32_t lkey, void *addr, uint32_t len)
{
	int err;

	ibv_wr_start(s->qpx);
	s->qpx->wr_id = id;
	s->qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(s->qpx, htobe32(imm));
	ibv_wr_set_sge(s->qpx, lkey, (uintptr_t)addr, len);
	ibv_wr_set_ud_addr(s->qpx, s->ah, remote_qpn, QKEY);
	err = ibv_wr_complete(s->qpx);
	if (err)
		die("ibv_wr_complete (send)", err);
}

static void post_recv(struct side *s, uint64_t id, uint32_t lkey, void *addr, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int err = ibv_post_recv(s->qp, &wr, &bad);

	if (err)
		die("ibv_post_recv", err);
}

/* How an option's value is read. */
enum option_kind {
	OPT_TEXT,	/* a string, as given */
	OPT_SIZE,	/* bytes, with K/M/G (parse_size) */
	OPT_U32,	/* a number, strtoul */
	OPT_INT,	/* a number, atoi */
	OPT_OFF,	/* no value: clears a flag */
};

/* One option of a mode: its name, and where its value goes (typed, checked by the compiler). */
struct option_spec {
	const char *name;
	enum option_kind kind;
	union {
		const char **text;
		uint64_t *size;
		uint32_t *u32;
		int *flag;
	} to;
};

/* The options shared by modes, as table entries. */
#define PAIR_OPTIONS(src, dst) \
	{ "--src", OPT_TEXT, { .text = &(src) } }, { "--dst", OPT_TEXT, { .text = &(dst) } }
#define GPU_PAIR_OPTIONS(src_gpu, dst_gpu) \
	{ "--src-gpu", OPT_TEXT, { .text = &(src_gpu) } }, \
	{ "--dst-gpu", OPT_TEXT, { .text = &(dst_gpu) } }
#define TRANSFER_OPTIONS(size_, msg_, seed_, window_) \
	{ "--size", OPT_SIZE, { .size = &(size_) } }, { "--msg", OPT_SIZE, { .size = &(msg_) } }, \
	{ "--seed", OPT_U32, { .u32 = &(seed_) } }, { "--window", OPT_U32, { .u32 = &(window_) } }

/*
 * Reads argv[2..] against a mode's @n options. Anything else, or an
 * option without its value, is an unknown argument: a message and 2 (the
 * mode's exit code), 0 when all were taken.
 */
static int parse_options(int argc, char **argv, const struct option_spec *opts, size_t n)
{
	size_t i;
	int a;

	for (a = 2; a < argc; a++) {
		for (i = 0; i < n; i++)
			if (!strcmp(argv[a], opts[i].name) && (opts[i].kind == OPT_OFF || a + 1 < argc))
				break;
		if (i == n) {
			fprintf(stderr, "p2plab-efa-check: unknown argument %s\n", argv[a]);
			return 2;
		}
		switch (opts[i].kind) {
		case OPT_TEXT:
			*opts[i].to.text = argv[++a];
			break;
		case OPT_SIZE:
			*opts[i].to.size = parse_size(argv[++a]);
			break;
		case OPT_U32:
			*opts[i].to.u32 = strtoul(argv[++a], NULL, 0);
			break;
		case OPT_INT:
			*opts[i].to.flag = atoi(argv[++a]);
			break;
		case OPT_OFF:
			*opts[i].to.flag = 0;
			break;
		}
	}
	return 0;
}

#define PARSE_OPTIONS(argc, argv, table) \
	parse_options(argc, argv, table, sizeof(table) / sizeof((table)[0]))

/* The options every transfer mode takes (each mode has its own defaults). */
struct transfer_opts {
	uint64_t size, msg;
	uint32_t seed, window;
};

/* Both ends in one process: one QP (@depth deep) on each device. */
static void sides_open(struct side *src, struct side *dst, const char *src_name,
		       const char *dst_name, uint32_t depth)
{
	side_open(src, src_name, depth);
	side_open(dst, dst_name, depth);
}

/* Each end gets an AH to the other: SENDs go one way, RDMA reads the other. */
static void sides_connect(struct side *src, struct side *dst)
{
	side_connect(src, dst);
	side_connect(dst, src);
}

/*
 * What the receiving end saw of a run of SENDs. send_ok counts the send
 * completions (the window closes on them); a failed one also shows in
 * verify= and first_error_status=.
 */
struct send_result {
	uint64_t send_ok, recv_ok, out_of_order, duplicates, missing;
};

static void print_transfer(uint64_t count, uint64_t size, uint64_t msg)
{
	printf("messages=%" PRIu64 "\nbytes=%" PRIu64 "\nmsg=%" PRIu64 "\n", count, size, msg);
}

static void print_arrivals(const struct send_result *r)
{
	printf("out_of_order=%" PRIu64 "\nduplicates=%" PRIu64 "\nmissing=%" PRIu64 "\n",
	       r->out_of_order, r->duplicates, r->missing);
}

/* The verdict and the first failed completion (status -1: none). */
static void print_verdict(int failed)
{
	printf("verify=%s\n", failed ? "bad" : "ok");
	printf("first_error_status=%d\nfirst_vendor_err=%u\n", first_status, first_vendor);
}

/* ---- GPU memory through dma-buf MRs ---------------------------------- */

/* Where dma-buf MRs start in their MR's address space (any page-aligned value). */
#define GPU_IOVA (1ull << 40)

/*
 * CRC32C (Castagnoli, reflected, as the GPU's CHECKSUM computes it), by
 * table: the bench checks every byte it moved in guest RAM.
 */
static uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t len)
{
	static uint32_t table[256];
	static int ready;
	size_t i;

	if (!ready) {
		for (i = 0; i < 256; i++) {
			uint32_t c = (uint32_t)i;
			int k;

			for (k = 0; k < 8; k++)
				c = (c >> 1) ^ (0x82f63b78u & -(c & 1));
			table[i] = c;
		}
		ready = 1;
	}
	crc = ~crc;
	for (i = 0; i < len; i++)
		crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
	return ~crc;
}

static uint32_t crc32c(const uint8_t *p, size_t len)
{
	return crc32c_update(0, p, len);
}

/* The seeded pattern every transfer mode moves, in RAM, and its CRC32C. */
static uint8_t *pattern_make(uint64_t size, uint32_t seed, uint32_t *crc)
{
	uint8_t *p = alloc_buf(size);

	fill(p, size, seed);
	*crc = crc32c(p, size);
	return p;
}

/* Runs one GPU engine job; exits on failure. */
static uint32_t gpu_job(int gpu, uint32_t op, uint64_t src, uint64_t dst, uint64_t len,
			uint32_t pattern)
{
	struct p2plab_gpu_job job = { .op = op, .src = src, .dst = dst, .len = len,
				      .pattern = pattern, .timeout_ms = 120000 };

	if (ioctl(gpu, P2PLAB_GPU_IOC_SUBMIT, &job) || job.status) {
		fprintf(stderr, "p2plab-efa-check: GPU job %u: %s, status %#x\n", op,
			strerror(errno), job.status);
		exit(2);
	}
	return job.result;
}

/* A GPU allocation and its dma-buf. */
struct gpu_buf {
	int gpu;
	uint64_t size;
	uint64_t vram_offset;
	uint32_t handle;
	int fd;			/* the dma-buf */
};

static int gpu_open(const char *path, char *pci, size_t pci_len)
{
	struct p2plab_gpu_info info = { 0 };
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		die(path, errno);
	if (ioctl(fd, P2PLAB_GPU_IOC_INFO, &info))
		die("GPU INFO", errno);
	snprintf(pci, pci_len, "%s", info.pci_name);
	return fd;
}

static void gpu_alloc(struct gpu_buf *b, int gpu, uint64_t size)
{
	struct p2plab_gpu_alloc a = { .size = size };
	struct p2plab_gpu_export_dmabuf ex = { 0 };

	if (ioctl(gpu, P2PLAB_GPU_IOC_ALLOC, &a))
		die("GPU ALLOC", errno);
	b->gpu = gpu;
	b->size = a.size;
	b->vram_offset = a.vram_offset;
	b->handle = a.handle;
	ex.handle = a.handle;
	ex.flags = O_RDWR | O_CLOEXEC;
	if (ioctl(gpu, P2PLAB_GPU_IOC_EXPORT_DMABUF, &ex))
		die("GPU EXPORT_DMABUF", errno);
	b->fd = ex.fd;
}

/* ibv_reg_dmabuf_mr of a whole GPU buffer; a refusal is reported and exits 3. */
static struct ibv_mr *reg_gpu(struct side *s, const struct gpu_buf *b, int access)
{
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(s->pd, 0, b->size, GPU_IOVA, b->fd, access);

	if (!mr) {
		int e = errno;

		printf("reg_errno=%d\nreg_error=%s\n", e, strerror(e));
		fprintf(stderr, "p2plab-efa-check: ibv_reg_dmabuf_mr on %s: %s\n", s->name,
			strerror(e));
		exit(3);
	}
	return mr;
}

/* Opens the two GPUs of a one-process transfer and says which they are. */
static void gpus_open(const char *src_path, const char *dst_path, int *sgpu, int *dgpu)
{
	char src_pci[32], dst_pci[32];

	*sgpu = gpu_open(src_path, src_pci, sizeof(src_pci));
	*dgpu = gpu_open(dst_path, dst_pci, sizeof(dst_pci));
	printf("src_gpu_pci=%s\ndst_gpu_pci=%s\n", src_pci, dst_pci);
}

/* CRC32C of a GPU buffer's first @len bytes, by the GPU's engine. */
static uint32_t gpu_crc(const struct gpu_buf *b, uint64_t len)
{
	return gpu_job(b->gpu, P2PLAB_GPU_OP_CHECKSUM, b->vram_offset, 0, len, 0);
}

/*
 * SRD may have put message j in slot k: the GPU's engine moves each
 * message home, from a scratch copy of the buffer as it landed (the CPU
 * never touches the payload).
 */
static void gpu_put_home(const struct gpu_buf *b, const uint64_t *slot_msg, uint64_t count,
			 uint64_t msg)
{
	struct gpu_buf scratch;
	uint64_t k;

	gpu_alloc(&scratch, b->gpu, count * msg);
	gpu_job(b->gpu, P2PLAB_GPU_OP_COPY_VRAM, b->vram_offset, scratch.vram_offset, count * msg,
		0);
	for (k = 0; k < count; k++)
		if (slot_msg[k] != k)
			gpu_job(b->gpu, P2PLAB_GPU_OP_COPY_VRAM, scratch.vram_offset + k * msg,
				b->vram_offset + slot_msg[k] * msg, msg, 0);
}

/*
 * A registered buffer of a transfer: a GPU allocation's dma-buf MR (@gpu
 * an open GPU) or a guest RAM MR (@gpu -1), at @addr in its MR.
 */
struct mem_buf {
	int gpu;
	struct gpu_buf vram;
	uint8_t *ram;
	uint64_t addr;
	struct ibv_mr *mr;
};

/*
 * Makes a buffer of @size bytes on @s holding @contents (zeros when
 * NULL). VRAM is written by the GPU's engine, not over RDMA.
 */
static void mem_buf_make(struct mem_buf *b, int gpu, struct side *s, uint64_t size, int access,
			 const uint8_t *contents)
{
	b->gpu = gpu;
	if (gpu >= 0) {
		gpu_alloc(&b->vram, gpu, size);
		if (contents)
			gpu_job(gpu, P2PLAB_GPU_OP_COPY_TO_VRAM, (uintptr_t)contents,
				b->vram.vram_offset, size, 0);
		else
			gpu_job(gpu, P2PLAB_GPU_OP_FILL, 0, b->vram.vram_offset, size, 0);
		b->mr = reg_gpu(s, &b->vram, access);
		b->addr = GPU_IOVA;
		b->ram = NULL;
	} else {
		b->ram = alloc_buf(size);
		if (contents)
			memcpy(b->ram, contents, size);
		b->mr = reg(s, b->ram, size, access);
		b->addr = (uintptr_t)b->ram;
	}
}

/* CRC32C of a buffer's first @len bytes: the GPU's engine for VRAM, the CPU for RAM. */
static uint32_t mem_buf_crc(const struct mem_buf *b, uint64_t len)
{
	if (b->gpu >= 0)
		return gpu_crc(&b->vram, len);
	return crc32c(b->ram, len);
}

/* Deregisters a buffer's MR: a failure exits 2 (the fact dereg=ok says they all went). */
static void mem_buf_dereg(struct mem_buf *b)
{
	if (ibv_dereg_mr(b->mr))
		die("ibv_dereg_mr", errno);
}

/*
 * The buffers of a one-process transfer: the seeded pattern (in RAM, and
 * its CRC32C); the source holding it (read remotely afterwards) on one
 * end; the destination of the SENDs and the read-back on the other;
 * slot_msg[k], the message receive slot k got.
 */
struct transfer_bufs {
	uint8_t *pattern;
	uint32_t expected;
	struct mem_buf src, dst, back;
	uint64_t *slot_msg;
};

static void transfer_bufs_make(struct transfer_bufs *b, struct side *src, int src_gpu,
			       struct side *dst, int dst_gpu, uint64_t size, uint64_t count,
			       uint32_t seed)
{
	b->pattern = pattern_make(size, seed, &b->expected);
	mem_buf_make(&b->src, src_gpu, src, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
		     b->pattern);
	mem_buf_make(&b->dst, dst_gpu, dst, size, IBV_ACCESS_LOCAL_WRITE, NULL);
	mem_buf_make(&b->back, dst_gpu, dst, size, IBV_ACCESS_LOCAL_WRITE, NULL);
	b->slot_msg = calloc(count, sizeof(*b->slot_msg));
	if (!b->slot_msg)
		die("calloc", ENOMEM);
}

static void transfer_bufs_dereg(struct transfer_bufs *b)
{
	mem_buf_dereg(&b->src);
	mem_buf_dereg(&b->dst);
	mem_buf_dereg(&b->back);
}

/* ---- moving data: SENDs into receive slots, RDMA reads --------------- */

/*
 * The sending end of a run of SENDs: @count messages of @msg bytes from
 * [@addr, lkey) to QP @qpn, each with its index as immediate data (SRD may
 * reorder: the receiver puts them back by it), @window outstanding.
 */
struct sender {
	struct side *s;
	uint32_t qpn, lkey, window;
	uint64_t addr, count, msg;
	uint64_t sent, done, ok;	/* posted, completed, completed OK */
};

static void sender_init(struct sender *tx, struct side *s, uint32_t qpn, uint32_t lkey,
			uint64_t addr, uint64_t count, uint64_t msg, uint32_t window)
{
	*tx = (struct sender){ .s = s, .qpn = qpn, .lkey = lkey, .window = window,
			       .addr = addr, .count = count, .msg = msg };
}

/* Posts SENDs until @window are outstanding or all are posted. */
static void sender_post(struct sender *tx)
{
	while (tx->sent < tx->count && tx->sent - tx->done < tx->window) {
		post_send(tx->s, tx->qpn, tx->sent, (uint32_t)tx->sent, tx->lkey,
			  (void *)(uintptr_t)(tx->addr + tx->sent * tx->msg), tx->msg);
		tx->sent++;
	}
}

/* Polls ibv_poll_cq once into @wc (up to 16); -1 (reported) if it fails. */
static int poll_cq(struct side *s, struct ibv_wc *wc)
{
	int n = ibv_poll_cq(s->cq, 16, wc);

	if (n < 0)
		fprintf(stderr, "p2plab-efa-check: ibv_poll_cq on %s failed\n", s->name);
	return n;
}

/* Takes the send completions there are; 1 if one failed. */
static int sender_poll(struct sender *tx)
{
	struct ibv_wc wc[16];
	int n = poll_cq(tx->s, wc), k, failed = n < 0;

	for (k = 0; k < n; k++) {
		if (wc[k].status != IBV_WC_SUCCESS) {
			note_error(&wc[k]);
			failed = 1;
		} else {
			tx->ok++;
		}
		tx->done++;
	}
	return failed;
}

/*
 * The receiving end: a receive per slot of @msg bytes at [@addr, lkey),
 * slot k's buffer at addr + k * msg. A completion names its slot (wr_id)
 * and its message (the immediate); slot_msg[k] is the message slot k got,
 * and each message must come exactly once. @count may be lowered after
 * receives are posted (a peer that sends less): slots beyond it that
 * complete are errors.
 */
struct receiver {
	struct side *s;
	uint32_t lkey;
	uint64_t addr, count, msg, posted;
	uint8_t *seen;		/* per message: arrived already */
	uint64_t *slot_msg;	/* per slot: the message it got (the caller's) */
	struct send_result *r;
};

static void receiver_init(struct receiver *rx, struct side *s, uint32_t lkey, uint64_t addr,
			  uint64_t count, uint64_t msg, uint64_t *slot_msg, struct send_result *r)
{
	*rx = (struct receiver){ .s = s, .lkey = lkey, .addr = addr, .count = count, .msg = msg,
				 .slot_msg = slot_msg, .r = r };
	rx->seen = calloc(count, 1);
	if (!rx->seen)
		die("calloc", ENOMEM);
	memset(r, 0, sizeof(*r));
}

/* Posts receives for the next slots until @upto (at most count) are posted. */
static void receiver_post(struct receiver *rx, uint64_t upto)
{
	while (rx->posted < rx->count && rx->posted < upto) {
		post_recv(rx->s, rx->posted, rx->lkey,
			  (void *)(uintptr_t)(rx->addr + rx->posted * rx->msg), rx->msg);
		rx->posted++;
	}
}

/* Takes the receive completions there are, reposting a slot for each; 1 on a bad one. */
static int receiver_poll(struct receiver *rx)
{
	struct ibv_wc wc[16];
	int n = poll_cq(rx->s, wc), k, failed = n < 0;

	for (k = 0; k < n; k++) {
		uint64_t slot = wc[k].wr_id, j;

		if (wc[k].status != IBV_WC_SUCCESS) {
			note_error(&wc[k]);
			failed = 1;
			continue;
		}
		j = be32toh(wc[k].imm_data);
		if (!(wc[k].wc_flags & IBV_WC_WITH_IMM) || j >= rx->count || slot >= rx->count ||
		    wc[k].byte_len != rx->msg) {
			failed = 1;
			continue;
		}
		rx->r->duplicates += rx->seen[j];
		rx->seen[j] = 1;
		rx->r->out_of_order += j != slot;
		rx->slot_msg[slot] = j;
		rx->r->recv_ok++;
		receiver_post(rx, rx->posted + 1);
	}
	return failed;
}

/* Counts the messages that never came; 1 if any is missing or came twice. */
static int receiver_finish(struct receiver *rx)
{
	uint64_t i;

	for (i = 0; i < rx->count; i++)
		rx->r->missing += !rx->seen[i];
	free(rx->seen);
	rx->seen = NULL;
	return rx->r->missing || rx->r->duplicates;
}

/*
 * SENDs @count messages of @msg bytes from [@saddr, lkey @skey) on @src
 * into [@daddr, lkey @dkey) on @dst, both ends in this process;
 * slot_msg[k] is the message slot k got. Returns 0 when all arrived once
 * and completed OK.
 */
static int send_all(struct side *src, struct side *dst, uint32_t skey, uint64_t saddr,
		    uint32_t dkey, uint64_t daddr, uint64_t count, uint64_t msg, uint32_t window,
		    uint64_t *slot_msg, struct send_result *r)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;
	struct sender tx;
	struct receiver rx;
	int failed = 0;

	sender_init(&tx, src, dst->qp->qp_num, skey, saddr, count, msg, window);
	receiver_init(&rx, dst, dkey, daddr, count, msg, slot_msg, r);
	receiver_post(&rx, window);	/* receives first: no SEND meets an empty queue */
	while ((tx.done < count || r->recv_ok < count) && !failed) {
		sender_post(&tx);
		failed |= sender_poll(&tx);
		failed |= receiver_poll(&rx);
		if (now_ms() > deadline) {
			fprintf(stderr, "p2plab-efa-check: timed out (%" PRIu64 " sent OK, %" PRIu64
				" received)\n", tx.done, r->recv_ok);
			failed = 1;
		}
	}
	r->send_ok = tx.done;
	failed |= receiver_finish(&rx);
	return failed;
}

/* send_all of a one-process transfer: its source buffer into its destination buffer. */
static int transfer_send(struct side *src, struct side *dst, struct transfer_bufs *b,
			 uint64_t count, uint64_t msg, uint32_t window, struct send_result *r)
{
	return send_all(src, dst, b->src.mr->lkey, b->src.addr, b->dst.mr->lkey, b->dst.addr,
			count, msg, window, b->slot_msg, r);
}

/*
 * RDMA reads of [raddr, rkey) of QP @src_qpn into [laddr, lkey) on @dst,
 * @wr bytes per work request, up to @window outstanding. Returns the bytes
 * read OK (short of @size after a failed completion or a timeout).
 */
static uint64_t read_windowed(struct side *dst, uint32_t src_qpn, uint32_t rkey, uint64_t raddr,
			      uint32_t lkey, uint64_t laddr, uint64_t size, uint64_t wr,
			      uint32_t window)
{
	uint64_t posted = 0, done = 0, outstanding = 0, deadline = now_ms() + TIMEOUT_MS;

	while (done < size) {
		struct ibv_wc wc[16];
		int n, k;

		while (posted < size && outstanding < window) {
			uint64_t len = size - posted < wr ? size - posted : wr;
			int err;

			ibv_wr_start(dst->qpx);
			dst->qpx->wr_id = len;
			dst->qpx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_read(dst->qpx, rkey, raddr + posted);
			ibv_wr_set_sge(dst->qpx, lkey, laddr + posted, (uint32_t)len);
			ibv_wr_set_ud_addr(dst->qpx, dst->ah, src_qpn, QKEY);
			err = ibv_wr_complete(dst->qpx);
			if (err)
				die("ibv_wr_complete (read)", err);
			posted += len;
			outstanding++;
		}
		n = poll_cq(dst, wc);
		if (n < 0)
			return done;
		for (k = 0; k < n; k++) {
			if (wc[k].status != IBV_WC_SUCCESS) {
				note_error(&wc[k]);
				return done;
			}
			done += wc[k].wr_id;
			outstanding--;
		}
		if (n == 0 && now_ms() > deadline) {
			fprintf(stderr, "p2plab-efa-check: RDMA read timed out\n");
			return done;
		}
	}
	return done;
}

/* The read-back of xfer and gpu-xfer: one work request at a time, up to 1 MiB each. */
static uint64_t read_all(struct side *dst, uint32_t src_qpn, uint32_t rkey, uint64_t raddr,
			 uint32_t lkey, uint64_t laddr, uint64_t size)
{
	uint64_t chunk = dst->max_rdma < (1u << 20) ? dst->max_rdma : (1u << 20);

	return read_windowed(dst, src_qpn, rkey, raddr, lkey, laddr, size, chunk, 1);
}

/* ---- xfer, send-one, gpu-xfer (one process) -------------------------- */

static int cmd_xfer(int argc, char **argv)
{
	const char *src_name = "efa_0", *dst_name = "efa_1";
	uint64_t size = 1 << 20, msg = 4096, count, k;
	uint64_t bad_bytes = 0, read_bytes = 0, read_bad = 0, t0;
	uint32_t seed = 1, window = 64;
	int do_read = 1, failed;
	struct side src = { 0 }, dst = { 0 };
	struct transfer_bufs b;
	struct send_result r;
	const struct option_spec opts[] = {
		PAIR_OPTIONS(src_name, dst_name), TRANSFER_OPTIONS(size, msg, seed, window),
		{ "--no-read", OPT_OFF, { .flag = &do_read } },
	};

	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	if (size % msg || window == 0 || window > 512) {
		fprintf(stderr, "p2plab-efa-check: --size must be a multiple of --msg, --window 1..512\n");
		return 2;
	}
	count = size / msg;
	sides_open(&src, &dst, src_name, dst_name, window);
	if (msg > src.max_msg || msg > 65535) {
		fprintf(stderr, "p2plab-efa-check: --msg %" PRIu64 " is over the port's max_msg_sz %u\n",
			msg, src.max_msg);
		return 2;
	}
	sides_connect(&src, &dst);
	transfer_bufs_make(&b, &src, -1, &dst, -1, size, count, seed);
	/* slot_msg[k] == count: no message reached slot k, nothing to compare. */
	for (k = 0; k < count; k++)
		b.slot_msg[k] = count;

	t0 = now_ms();
	failed = transfer_send(&src, &dst, &b, count, msg, window, &r);
	/* Each slot against the source message it got (SRD may reorder). */
	for (k = 0; k < count; k++)
		if (b.slot_msg[k] < count)
			bad_bytes += mismatches(b.dst.ram + k * msg, b.pattern + b.slot_msg[k] * msg,
						msg);
	if (do_read && !failed) {
		read_bytes = read_all(&dst, src.qp->qp_num, b.src.mr->rkey, b.src.addr,
				      b.back.mr->lkey, b.back.addr, size);
		read_bad = mismatches(b.back.ram, b.pattern, size);
	}
	print_transfer(count, size, msg);
	printf("send_ok=%" PRIu64 "\nrecv_ok=%" PRIu64 "\n", r.send_ok, r.recv_ok);
	print_arrivals(&r);
	printf("mismatched_bytes=%" PRIu64 "\n", bad_bytes);
	printf("read_bytes=%" PRIu64 "\nread_mismatched_bytes=%" PRIu64 "\n", read_bytes, read_bad);
	failed |= bad_bytes != 0 || read_bad != 0 || (do_read && read_bytes != size);
	print_verdict(failed);
	printf("ms=%" PRIu64 "\n", now_ms() - t0);
	printf("max_msg_sz=%u\nmax_rdma_size=%u\n", src.max_msg, src.max_rdma);
	return failed ? 1 : 0;
}

static int cmd_send_one(int argc, char **argv)
{
	const char *src_name = "efa_0", *dst_name = "efa_1";
	struct side src = { 0 }, dst = { 0 };
	uint8_t *sbuf, *dbuf;
	struct ibv_mr *smr, *dmr;
	struct ibv_wc wc;
	uint64_t deadline;
	int n;
	const struct option_spec opts[] = { PAIR_OPTIONS(src_name, dst_name) };

	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	sides_open(&src, &dst, src_name, dst_name, 4);
	side_connect(&src, &dst);
	sbuf = alloc_buf(4096);
	dbuf = alloc_buf(4096);
	smr = reg(&src, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	dmr = reg(&dst, dbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	post_recv(&dst, 0, dmr->lkey, dbuf, 4096);
	post_send(&src, dst.qp->qp_num, 7, 7, smr->lkey, sbuf, 64);
	deadline = now_ms() + TIMEOUT_MS;
	do {
		n = ibv_poll_cq(src.cq, 1, &wc);
	} while (n == 0 && now_ms() < deadline);
	if (n != 1) {
		fprintf(stderr, "p2plab-efa-check: no send completion\n");
		return 2;
	}
	printf("status=%d\nstatus_name=%s\nvendor_err=%u\n", wc.status,
	       ibv_wc_status_str(wc.status), wc.vendor_err);
	return 0;
}

static int cmd_gpu_xfer_end(int argc, char **argv);

static int cmd_gpu_xfer(int argc, char **argv)
{
	const char *src_name = "efa_0", *dst_name = "efa_1";
	const char *src_gpu_path = "/dev/p2plab-gpu0", *dst_gpu_path = "/dev/p2plab-gpu1";
	struct transfer_opts o = { .size = 4 << 20, .msg = 8192, .seed = 1, .window = 64 };
	uint64_t size, msg, count, read_bytes = 0, t0;
	uint32_t src_crc, dst_crc, read_crc;
	struct side src = { 0 }, dst = { 0 };
	struct transfer_bufs b;
	struct send_result r;
	int sgpu, dgpu, failed, a;
	const struct option_spec opts[] = {
		PAIR_OPTIONS(src_name, dst_name), GPU_PAIR_OPTIONS(src_gpu_path, dst_gpu_path),
		TRANSFER_OPTIONS(o.size, o.msg, o.seed, o.window),
	};

	for (a = 2; a < argc; a++)
		if (!strcmp(argv[a], "--listen") || !strcmp(argv[a], "--connect"))
			return cmd_gpu_xfer_end(argc, argv);
	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	size = o.size;
	msg = o.msg;
	if (size % msg || size % 65536 || o.window == 0 || o.window > 512) {
		fprintf(stderr, "p2plab-efa-check: --size must be a multiple of --msg and of 64K, --window 1..512\n");
		return 2;
	}
	count = size / msg;
	gpus_open(src_gpu_path, dst_gpu_path, &sgpu, &dgpu);
	sides_open(&src, &dst, src_name, dst_name, o.window);
	if (msg > src.max_msg) {
		fprintf(stderr, "p2plab-efa-check: --msg is over max_msg_sz %u\n", src.max_msg);
		return 2;
	}
	sides_connect(&src, &dst);

	transfer_bufs_make(&b, &src, sgpu, &dst, dgpu, size, count, o.seed);

	t0 = now_ms();
	failed = transfer_send(&src, &dst, &b, count, msg, o.window, &r);
	if (!failed)
		read_bytes = read_all(&dst, src.qp->qp_num, b.src.mr->rkey, b.src.addr,
				      b.back.mr->lkey, b.back.addr, size);
	printf("ms=%" PRIu64 "\n", now_ms() - t0);
	failed |= read_bytes != size;

	if (!failed && r.out_of_order)
		gpu_put_home(&b.dst.vram, b.slot_msg, count, msg);
	src_crc = mem_buf_crc(&b.src, size);
	dst_crc = mem_buf_crc(&b.dst, size);
	read_crc = mem_buf_crc(&b.back, size);
	failed |= src_crc != b.expected || dst_crc != b.expected || read_crc != b.expected;

	print_transfer(count, size, msg);
	printf("send_ok=%" PRIu64 "\nrecv_ok=%" PRIu64 "\n", r.send_ok, r.recv_ok);
	print_arrivals(&r);
	printf("read_bytes=%" PRIu64 "\n", read_bytes);
	printf("expected_crc=0x%08x\nsrc_crc=0x%08x\ndst_crc=0x%08x\nread_crc=0x%08x\n",
	       b.expected, src_crc, dst_crc, read_crc);
	print_verdict(failed);
	transfer_bufs_dereg(&b);
	printf("dereg=ok\n");
	return failed ? 1 : 0;
}

/* ---- gpu-xfer with one end per process (two labs) --------------------- */

/*
 * The out-of-band exchange of `gpu-xfer --listen|--connect`, over one TCP
 * connection between the two guests' IP addresses. Fixed-size frames,
 * big-endian fields; every field the peer sends is checked before use.
 *
 * hello (each end sends one): magic, version, role (1 source, 2
 * destination), QPN, GID[16], size (the source: bytes it sends; the
 * destination: what each of its buffers holds), msg (SEND size), addr and
 * rkey (the source's MR, for the RDMA read), crc (the source: the GPU
 * engine's CRC32C of its buffer).
 * result (the destination sends one when done, then the source exits):
 * magic, kind, status (0 ok), recv_ok, read_bytes, dst_crc, read_crc.
 */
#define XLAB_MAGIC 0x50324c58u	/* "P2LX" */
#define XLAB_VERSION 1u
#define XLAB_RESULT 0x52534c54u	/* "RSLT" */
#define XLAB_HELLO_LEN 72
#define XLAB_RESULT_LEN 40
#define XLAB_ROLE_SRC 1u
#define XLAB_ROLE_DST 2u

struct xlab_hello {
	uint32_t role, qpn, rkey, crc;
	union ibv_gid gid;
	uint64_t size, msg, addr;
};

struct xlab_result {
	uint32_t status, dst_crc, read_crc;
	uint64_t recv_ok, read_bytes;
};

/* Set by --timeout: each wait on the peer (connect, accept, a frame). */
static int xlab_timeout_s = 120;

/* A failure caused by the peer or the link: a fact line, a message, exit 2. */
static void xlab_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void xlab_fail(const char *fmt, ...)
{
	char text[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	printf("peer_error=%s\n", text);
	fprintf(stderr, "p2plab-efa-check: %s\n", text);
	exit(2);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return be64toh(v);
}

/* The socket's waits end after --timeout seconds (SO_RCVTIMEO/SO_SNDTIMEO). */
static void xlab_set_timeouts(int fd)
{
	struct timeval tv = { .tv_sec = xlab_timeout_s };

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
		die("setsockopt (timeouts)", errno);
}

/* Splits [ADDR:]PORT or HOST:PORT; a bad port exits 2. */
static void xlab_split(const char *text, char *host, size_t host_len, char *port,
		       size_t port_len, const char *default_host)
{
	const char *colon = strrchr(text, ':');
	const char *p = colon ? colon + 1 : text;
	char *end;
	unsigned long n = strtoul(p, &end, 10);

	if (!*p || *end || n == 0 || n > 65535) {
		fprintf(stderr, "p2plab-efa-check: bad port in %s\n", text);
		exit(2);
	}
	snprintf(port, port_len, "%lu", n);
	if (colon && (size_t)(colon - text) < host_len && colon != text)
		snprintf(host, host_len, "%.*s", (int)(colon - text), text);
	else if (colon)
		xlab_fail("bad host in %s", text);
	else
		snprintf(host, host_len, "%s", default_host);
}

static struct addrinfo *xlab_resolve(const char *host, const char *port, int passive)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				  .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *ai;
	int err = getaddrinfo(host, port, &hints, &ai);

	if (err)
		xlab_fail("cannot resolve %s:%s: %s", host, port, gai_strerror(err));
	return ai;
}

/* Waits --timeout seconds for one peer on [ADDR:]PORT; its socket. */
static int xlab_listen(const char *where)
{
	char host[128], port[8];
	struct addrinfo *ai;
	struct pollfd pfd;
	int fd, conn, one = 1, n;

	xlab_split(where, host, sizeof(host), port, sizeof(port), "0.0.0.0");
	ai = xlab_resolve(host, port, 1);
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket", errno);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1))
		xlab_fail("cannot listen on %s:%s: %s", host, port, strerror(errno));
	freeaddrinfo(ai);
	printf("listening=%s:%s\n", host, port);
	pfd.fd = fd;
	pfd.events = POLLIN;
	do {
		n = poll(&pfd, 1, xlab_timeout_s * 1000);
	} while (n < 0 && errno == EINTR);
	if (n == 0)
		xlab_fail("no peer connected to %s:%s within %d s", host, port, xlab_timeout_s);
	if (n < 0)
		die("poll", errno);
	conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
	if (conn < 0)
		xlab_fail("accept on %s:%s: %s", host, port, strerror(errno));
	close(fd);
	xlab_set_timeouts(conn);
	setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return conn;
}

/* Dials HOST:PORT until the peer listens, for --timeout seconds; its socket. */
static int xlab_connect(const char *where)
{
	char host[128], port[8];
	struct addrinfo *ai;
	uint64_t deadline = now_ms() + (uint64_t)xlab_timeout_s * 1000;
	int fd, one = 1, err = 0;

	xlab_split(where, host, sizeof(host), port, sizeof(port), "");
	if (!*host)
		xlab_fail("--connect needs HOST:PORT, got %s", where);
	ai = xlab_resolve(host, port, 0);
	for (;;) {
		fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			die("socket", errno);
		xlab_set_timeouts(fd);
		if (!connect(fd, ai->ai_addr, ai->ai_addrlen))
			break;
		err = errno;
		close(fd);
		if (now_ms() > deadline)
			xlab_fail("cannot connect to %s:%s within %d s: %s", host, port,
				  xlab_timeout_s, strerror(err));
		sleep(1);
	}
	freeaddrinfo(ai);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Reads exactly @len bytes of the peer's @what; EOF, a timeout or an error exits 2. */
static void xlab_read(int fd, uint8_t *buf, size_t len, const char *what)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = recv(fd, buf + got, len - got, 0);

		if (n > 0) {
			got += (size_t)n;
		} else if (n == 0) {
			xlab_fail("the peer closed the connection after %zu of the %zu bytes of its %s",
				  got, len, what);
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			xlab_fail("timed out after %d s waiting for the peer's %s (%zu of %zu bytes)",
				  xlab_timeout_s, what, got, len);
		} else if (errno != EINTR) {
			xlab_fail("reading the peer's %s: %s", what, strerror(errno));
		}
	}
}

static void xlab_write(int fd, const uint8_t *buf, size_t len, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = send(fd, buf + done, len - done, MSG_NOSIGNAL);

		if (n > 0)
			done += (size_t)n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
			xlab_fail("sending our %s: %s", what,
				  n < 0 && errno == EAGAIN ? "timed out" : strerror(errno));
	}
}

static void xlab_send_hello(int fd, const struct xlab_hello *h)
{
	uint8_t b[XLAB_HELLO_LEN] = { 0 };

	put32(b, XLAB_MAGIC);
	put32(b + 4, XLAB_VERSION);
	put32(b + 8, h->role);
	put32(b + 12, h->qpn);
	memcpy(b + 16, h->gid.raw, 16);
	put64(b + 32, h->size);
	put64(b + 40, h->msg);
	put64(b + 48, h->addr);
	put32(b + 56, h->rkey);
	put32(b + 60, h->crc);
	xlab_write(fd, b, sizeof(b), "hello");
}

/* The peer's hello, checked for the @role it must have. */
static void xlab_recv_hello(int fd, uint32_t role, struct xlab_hello *h)
{
	uint8_t b[XLAB_HELLO_LEN];

	xlab_read(fd, b, sizeof(b), "hello");
	if (get32(b) != XLAB_MAGIC)
		xlab_fail("the peer's hello has magic %#x, not %#x (not p2plab-efa-check?)",
			  get32(b), XLAB_MAGIC);
	if (get32(b + 4) != XLAB_VERSION)
		xlab_fail("the peer speaks version %u, this end %u", get32(b + 4), XLAB_VERSION);
	h->role = get32(b + 8);
	if (h->role != role)
		xlab_fail("the peer's role is %u, expected %u (one end --role src, the other dst)",
			  h->role, role);
	h->qpn = get32(b + 12);
	if (h->qpn == 0 || h->qpn >= (1u << 24))
		xlab_fail("the peer's QPN %#x is not a QP number", h->qpn);
	memcpy(h->gid.raw, b + 16, 16);
	h->size = get64(b + 32);
	h->msg = get64(b + 40);
	h->addr = get64(b + 48);
	h->rkey = get32(b + 56);
	h->crc = get32(b + 60);
}

static void xlab_send_result(int fd, const struct xlab_result *r)
{
	uint8_t b[XLAB_RESULT_LEN] = { 0 };

	put32(b, XLAB_MAGIC);
	put32(b + 4, XLAB_RESULT);
	put32(b + 8, r->status);
	put32(b + 12, r->dst_crc);
	put64(b + 16, r->recv_ok);
	put64(b + 24, r->read_bytes);
	put32(b + 32, r->read_crc);
	xlab_write(fd, b, sizeof(b), "result");
}

static void xlab_recv_result(int fd, uint64_t count, uint64_t size, struct xlab_result *r)
{
	uint8_t b[XLAB_RESULT_LEN];

	xlab_read(fd, b, sizeof(b), "result");
	if (get32(b) != XLAB_MAGIC || get32(b + 4) != XLAB_RESULT)
		xlab_fail("the peer's result frame has magic %#x kind %#x", get32(b), get32(b + 4));
	r->status = get32(b + 8);
	r->dst_crc = get32(b + 12);
	r->recv_ok = get64(b + 16);
	r->read_bytes = get64(b + 24);
	r->read_crc = get32(b + 32);
	if (r->recv_ok > count || r->read_bytes > size)
		xlab_fail("the peer reports %" PRIu64 " messages and %" PRIu64
			  " bytes read, beyond the %" PRIu64 " messages and %" PRIu64 " bytes sent",
			  r->recv_ok, r->read_bytes, count, size);
}

/* The source's SENDs to the peer's QP, the receives being the peer's. */
static int xlab_send(struct sender *tx)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;
	int failed = 0;

	while (tx->done < tx->count && !failed) {
		sender_post(tx);
		failed |= sender_poll(tx);
		if (now_ms() > deadline) {
			fprintf(stderr, "p2plab-efa-check: SENDs timed out (%" PRIu64 " of %" PRIu64
				" completed)\n", tx->ok, tx->count);
			failed = 1;
		}
	}
	return failed;
}

/*
 * The destination's receives: the first are posted already (before the
 * hello, so no SEND meets an empty queue); the rest as slots complete.
 */
static int xlab_recv(struct receiver *rx)
{
	uint64_t deadline = now_ms() + TIMEOUT_MS;
	int failed = 0;

	while (rx->r->recv_ok < rx->count && !failed) {
		failed |= receiver_poll(rx);
		if (now_ms() > deadline) {
			fprintf(stderr, "p2plab-efa-check: receives timed out (%" PRIu64 " of %" PRIu64
				")\n", rx->r->recv_ok, rx->count);
			failed = 1;
		}
	}
	failed |= receiver_finish(rx);
	return failed;
}

static void print_gid(const char *key, const union ibv_gid *gid)
{
	char text[INET6_ADDRSTRLEN];

	if (!inet_ntop(AF_INET6, gid->raw, text, sizeof(text)))
		snprintf(text, sizeof(text), "?");
	printf("%s=%s\n", key, text);
}

/*
 * Meets the peer: waits for it or dials it, then the hellos both ways
 * (ours first: each end's hello needs nothing of the other's). The
 * connection, kept for the result.
 */
static int xlab_meet(const char *listen_at, const char *connect_to, const struct xlab_hello *me,
		     uint32_t peer_role, struct xlab_hello *peer)
{
	int fd = listen_at ? xlab_listen(listen_at) : xlab_connect(connect_to);

	xlab_send_hello(fd, me);
	xlab_recv_hello(fd, peer_role, peer);
	print_gid("peer_gid", &peer->gid);
	printf("peer_qpn=%u\n", peer->qpn);
	return fd;
}

/*
 * The source end: its GPU buffer, loaded with the pattern by its GPU's
 * engine, is SENT into the peer's; the peer then RDMA-reads it, so its MR
 * stays registered until the peer's result.
 */
static int xlab_source(struct side *s, int gpu, const char *listen_at, const char *connect_to,
		       struct xlab_hello *me, const struct transfer_opts *o)
{
	uint64_t size = o->size, msg = o->msg, count = size / msg, t0;
	struct xlab_hello peer = { 0 };
	struct xlab_result res = { 0 };
	struct sender tx;
	struct mem_buf sb;
	uint8_t *pattern;
	uint32_t expected, src_crc;
	int fd, failed;

	pattern = pattern_make(size, o->seed, &expected);
	mem_buf_make(&sb, gpu, s, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, pattern);
	src_crc = mem_buf_crc(&sb, size);
	me->addr = sb.addr;
	me->rkey = sb.mr->rkey;
	me->crc = src_crc;

	fd = xlab_meet(listen_at, connect_to, me, XLAB_ROLE_DST, &peer);
	if (peer.msg != msg)
		xlab_fail("the peer posted %" PRIu64 "-byte receives, this end sends %" PRIu64
			  "-byte messages", peer.msg, msg);
	if (peer.size < size)
		xlab_fail("the peer's buffers hold %" PRIu64 " bytes, this end sends %" PRIu64,
			  peer.size, size);
	side_connect_gid(s, &peer.gid);

	t0 = now_ms();
	sender_init(&tx, s, peer.qpn, sb.mr->lkey, sb.addr, count, msg, o->window);
	failed = xlab_send(&tx);
	/* The peer reads our buffer next: it stays registered until its result. */
	xlab_recv_result(fd, count, size, &res);
	printf("ms=%" PRIu64 "\n", now_ms() - t0);
	failed |= src_crc != expected || res.status || res.recv_ok != count ||
		  res.read_bytes != size || res.dst_crc != src_crc || res.read_crc != src_crc;
	print_transfer(count, size, msg);
	printf("send_ok=%" PRIu64 "\n", tx.ok);
	printf("expected_crc=0x%08x\nsrc_crc=0x%08x\n", expected, src_crc);
	printf("peer_status=%u\npeer_recv_ok=%" PRIu64 "\npeer_read_bytes=%" PRIu64 "\n",
	       res.status, res.recv_ok, res.read_bytes);
	printf("peer_dst_crc=0x%08x\npeer_read_crc=0x%08x\n", res.dst_crc, res.read_crc);
	print_verdict(failed);
	mem_buf_dereg(&sb);
	close(fd);
	return failed;
}

/*
 * The destination end: receives the peer's SENDs into one GPU buffer,
 * RDMA-reads the peer's buffer into another, checksums both with its
 * GPU's engine against the CRC the peer's engine computed, and sends the
 * peer its result.
 */
static int xlab_destination(struct side *s, int gpu, const char *listen_at,
			    const char *connect_to, const struct xlab_hello *me,
			    const struct transfer_opts *o)
{
	uint64_t size = o->size, msg = o->msg, count = size / msg, read_bytes = 0, t0, *slot_msg;
	struct xlab_hello peer = { 0 };
	struct xlab_result res = { 0 };
	struct mem_buf db, rb;
	struct receiver rx;
	struct send_result r;
	uint32_t dst_crc, read_crc;
	int fd, failed;

	mem_buf_make(&db, gpu, s, size, IBV_ACCESS_LOCAL_WRITE, NULL);
	mem_buf_make(&rb, gpu, s, size, IBV_ACCESS_LOCAL_WRITE, NULL);
	slot_msg = calloc(count, sizeof(*slot_msg));
	if (!slot_msg)
		die("calloc", ENOMEM);
	receiver_init(&rx, s, db.mr->lkey, db.addr, count, msg, slot_msg, &r);
	receiver_post(&rx, o->window);

	fd = xlab_meet(listen_at, connect_to, me, XLAB_ROLE_SRC, &peer);
	/* What the source says it sends must fit what was posted here. */
	if (peer.msg != msg)
		xlab_fail("the peer sends %" PRIu64 "-byte messages, this end posted %" PRIu64
			  "-byte receives", peer.msg, msg);
	if (peer.size == 0 || peer.size > size || peer.size % msg || peer.size % 65536)
		xlab_fail("the peer would send %" PRIu64 " bytes: beyond this end's %" PRIu64
			  "-byte buffers or not whole %" PRIu64 "-byte messages and 64K",
			  peer.size, size, msg);
	if (peer.addr != GPU_IOVA)
		xlab_fail("the peer's buffer starts at %#" PRIx64 ", not %#llx", peer.addr,
			  GPU_IOVA);
	size = peer.size;
	count = size / msg;
	rx.count = count;
	side_connect_gid(s, &peer.gid);

	t0 = now_ms();
	failed = xlab_recv(&rx);
	if (!failed)
		read_bytes = read_all(s, peer.qpn, peer.rkey, peer.addr, rb.mr->lkey, rb.addr, size);
	printf("ms=%" PRIu64 "\n", now_ms() - t0);
	failed |= read_bytes != size;

	if (!failed && r.out_of_order)
		gpu_put_home(&db.vram, slot_msg, count, msg);
	dst_crc = mem_buf_crc(&db, size);
	read_crc = mem_buf_crc(&rb, size);
	failed |= dst_crc != peer.crc || read_crc != peer.crc;
	res.status = failed;
	res.recv_ok = r.recv_ok;
	res.read_bytes = read_bytes;
	res.dst_crc = dst_crc;
	res.read_crc = read_crc;
	xlab_send_result(fd, &res);

	print_transfer(count, size, msg);
	printf("recv_ok=%" PRIu64 "\n", r.recv_ok);
	print_arrivals(&r);
	printf("read_bytes=%" PRIu64 "\n", read_bytes);
	printf("peer_crc=0x%08x\ndst_crc=0x%08x\nread_crc=0x%08x\n", peer.crc, dst_crc,
	       read_crc);
	print_verdict(failed);
	mem_buf_dereg(&db);
	mem_buf_dereg(&rb);
	close(fd);
	return failed;
}

/*
 * gpu-xfer --listen [ADDR:]PORT | --connect HOST:PORT --role src|dst:
 * one end of gpu-xfer, the other end in another process (another guest,
 * another lab). The source's GPU buffer is SENT into the destination's,
 * then the destination RDMA-reads it into a second buffer; the
 * destination's GPU engine checksums both against the CRC the source's
 * GPU engine computed.
 */
static int cmd_gpu_xfer_end(int argc, char **argv)
{
	const char *dev = "efa_0", *gpu_path = "/dev/p2plab-gpu0", *listen_at = NULL;
	const char *connect_to = NULL, *role_name = NULL;
	struct transfer_opts o = { .size = 4 << 20, .msg = 8192, .seed = 1, .window = 64 };
	struct xlab_hello me = { 0 };
	struct side s = { 0 };
	char pci[32];
	int gpu, failed;
	const struct option_spec opts[] = {
		{ "--listen", OPT_TEXT, { .text = &listen_at } },
		{ "--connect", OPT_TEXT, { .text = &connect_to } },
		{ "--role", OPT_TEXT, { .text = &role_name } },
		{ "--dev", OPT_TEXT, { .text = &dev } }, { "--gpu", OPT_TEXT, { .text = &gpu_path } },
		TRANSFER_OPTIONS(o.size, o.msg, o.seed, o.window),
		{ "--timeout", OPT_INT, { .flag = &xlab_timeout_s } },
	};

	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	if (!listen_at == !connect_to || !role_name ||
	    (strcmp(role_name, "src") && strcmp(role_name, "dst"))) {
		fprintf(stderr, "p2plab-efa-check: gpu-xfer needs one of --listen/--connect and --role src|dst\n");
		return 2;
	}
	if (o.size % o.msg || o.size % 65536 || o.window == 0 || o.window > 512 ||
	    xlab_timeout_s <= 0 || xlab_timeout_s > 3600) {
		fprintf(stderr, "p2plab-efa-check: --size must be a multiple of --msg and of 64K, --window 1..512, --timeout 1..3600\n");
		return 2;
	}
	gpu = gpu_open(gpu_path, pci, sizeof(pci));
	printf("role=%s\ngpu_pci=%s\n", role_name, pci);
	side_open(&s, dev, o.window);
	if (o.msg > s.max_msg) {
		fprintf(stderr, "p2plab-efa-check: --msg is over max_msg_sz %u\n", s.max_msg);
		return 2;
	}
	me.role = strcmp(role_name, "src") ? XLAB_ROLE_DST : XLAB_ROLE_SRC;
	me.qpn = s.qp->qp_num;
	me.gid = s.gid;
	me.size = o.size;
	me.msg = o.msg;
	if (me.role == XLAB_ROLE_SRC)
		failed = xlab_source(&s, gpu, listen_at, connect_to, &me, &o);
	else
		failed = xlab_destination(&s, gpu, listen_at, connect_to, &me, &o);
	printf("dereg=ok\n");
	return failed ? 1 : 0;
}

/* A number from a sysfs file, or -1. */
static long long sysfs_number(const char *path)
{
	long long v = -1;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static int cmd_gpu_pinned(int argc, char **argv)
{
	const char *src_name = "efa_0", *dst_name = "efa_1", *gpu_path = "/dev/p2plab-gpu1";
	uint64_t size = 1 << 20, msg = 8192, count, *slot_msg;
	char pci[32], avail_path[160], pins_path[160], reset_path[160];
	struct side src = { 0 }, dst = { 0 };
	struct gpu_buf ab, bb;
	struct ibv_mr *amr, *smr;
	struct send_result r;
	uint8_t *sbuf;
	int gpu, fd, step;
	uint32_t handle;
	const char *name;
	const struct option_spec opts[] = {
		PAIR_OPTIONS(src_name, dst_name), { "--gpu", OPT_TEXT, { .text = &gpu_path } },
		{ "--size", OPT_SIZE, { .size = &size } }, { "--msg", OPT_SIZE, { .size = &msg } },
	};

	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	if (size % msg || size % 65536 || size / msg > 512) {
		fprintf(stderr, "p2plab-efa-check: --size must be a multiple of --msg and of 64K, at most 512 messages\n");
		return 2;
	}
	count = size / msg;
	gpu = gpu_open(gpu_path, pci, sizeof(pci));
	name = strrchr(gpu_path, '/');
	name = name ? name + 1 : gpu_path;
	snprintf(avail_path, sizeof(avail_path), "/sys/bus/pci/devices/%s/p2pmem/available", pci);
	snprintf(reset_path, sizeof(reset_path), "/sys/bus/pci/devices/%s/reset", pci);
	snprintf(pins_path, sizeof(pins_path), "/sys/class/p2plab-gpu/%s/dmabuf_pins", name);
	printf("gpu_pci=%s\n", pci);
	side_open(&src, src_name, count);
	side_open(&dst, dst_name, count);
	side_connect(&src, &dst);
	sbuf = alloc_buf(size);
	smr = reg(&src, sbuf, size, IBV_ACCESS_LOCAL_WRITE);
	slot_msg = calloc(count, sizeof(*slot_msg));
	if (!slot_msg)
		die("calloc", ENOMEM);

	printf("avail_start=%lld\n", sysfs_number(avail_path));
	gpu_alloc(&ab, gpu, size);
	gpu_job(gpu, P2PLAB_GPU_OP_FILL, 0, ab.vram_offset, size, 0);
	printf("a_offset=%" PRIu64 "\navail_alloc=%lld\n", ab.vram_offset, sysfs_number(avail_path));
	amr = reg_gpu(&dst, &ab, IBV_ACCESS_LOCAL_WRITE);
	close(ab.fd);		/* the MR holds the dma-buf now */
	printf("pins_reg=%lld\n", sysfs_number(pins_path));

	/* FREE while the EFA MR pins A: its VRAM must stay out of the pool. */
	handle = ab.handle;
	printf("free_ret=%d\n", ioctl(gpu, P2PLAB_GPU_IOC_FREE, &handle) ? errno : 0);
	printf("avail_freed=%lld\npins_freed=%lld\n", sysfs_number(avail_path),
	       sysfs_number(pins_path));
	gpu_alloc(&bb, gpu, size);
	gpu_job(gpu, P2PLAB_GPU_OP_FILL, 0, bb.vram_offset, size, 0xffffffffu);
	printf("b_offset=%" PRIu64 "\n", bb.vram_offset);

	for (step = 0; step < 2; step++) {
		const char *when = step ? "after_reset" : "after_free";
		uint32_t crc;

		if (step) {
			/* A function reset while pinned: the VRAM stays too. */
			fd = open(reset_path, O_WRONLY);
			printf("reset_ret=%d\n", fd < 0 || write(fd, "1", 1) != 1 ? errno : 0);
			if (fd >= 0)
				close(fd);
			printf("avail_reset=%lld\npins_reset=%lld\n", sysfs_number(avail_path),
			       sysfs_number(pins_path));
		}
		fill(sbuf, size, 100 + step);
		send_all(&src, &dst, smr->lkey, (uintptr_t)sbuf, amr->lkey, GPU_IOVA, count, msg,
			 count, slot_msg, &r);
		printf("%s_recv_ok=%" PRIu64 "\n%s_out_of_order=%" PRIu64 "\n", when, r.recv_ok,
		       when, r.out_of_order);
		/* In place when in order; A's VRAM read by the engine, by offset. */
		crc = gpu_job(gpu, P2PLAB_GPU_OP_CHECKSUM, ab.vram_offset, 0, size, 0);
		printf("%s_crc_ok=%d\n", when, !r.out_of_order && crc == crc32c(sbuf, size));
		if (!step) {
			/* B, all ones, was not written by the EFA. */
			memset(sbuf, 0xff, size);
			crc = gpu_job(gpu, P2PLAB_GPU_OP_CHECKSUM, bb.vram_offset, 0, size, 0);
			printf("b_intact=%d\n", crc == crc32c(sbuf, size));
		}
	}

	if (ibv_dereg_mr(amr))
		die("ibv_dereg_mr", errno);
	printf("avail_dereg=%lld\npins_dereg=%lld\n", sysfs_number(avail_path),
	       sysfs_number(pins_path));
	printf("first_error_status=%d\nfirst_vendor_err=%u\n", first_status, first_vendor);
	return 0;
}

/* ---- throughput: GPU memory against RAM at equal sizes --------------- */

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int cmd_bench(int argc, char **argv)
{
	const char *src_name = "efa_0", *dst_name = "efa_1", *mem = NULL;
	const char *src_gpu_path = "/dev/p2plab-gpu0", *dst_gpu_path = "/dev/p2plab-gpu1";
	struct transfer_opts o = { .size = 8 << 20, .msg = 8192, .seed = 1, .window = 64 };
	uint64_t size, msg, wr = 1 << 20, count, k, read_bytes, t0;
	uint64_t send_us, read_us;
	uint32_t read_window = 4, depth, sent_crc, dst_crc, read_crc;
	struct side src = { 0 }, dst = { 0 };
	struct transfer_bufs b;
	struct send_result r;
	int sgpu = -1, dgpu = -1, failed;
	const struct option_spec opts[] = {
		{ "--mem", OPT_TEXT, { .text = &mem } }, PAIR_OPTIONS(src_name, dst_name),
		GPU_PAIR_OPTIONS(src_gpu_path, dst_gpu_path),
		TRANSFER_OPTIONS(o.size, o.msg, o.seed, o.window),
		{ "--read-wr", OPT_SIZE, { .size = &wr } },
		{ "--read-window", OPT_U32, { .u32 = &read_window } },
	};

	if (PARSE_OPTIONS(argc, argv, opts))
		return 2;
	if (!mem || (strcmp(mem, "gpu") && strcmp(mem, "ram"))) {
		fprintf(stderr, "p2plab-efa-check: bench needs --mem gpu|ram\n");
		return 2;
	}
	size = o.size;
	msg = o.msg;
	if (size % msg || size % 65536 || size % wr || o.window == 0 || o.window > 512 ||
	    read_window == 0 || read_window > 512 || wr > (1u << 30)) {
		fprintf(stderr, "p2plab-efa-check: --size must be a multiple of --msg, --read-wr and 64K; --window and --read-window 1..512\n");
		return 2;
	}
	count = size / msg;
	if (!strcmp(mem, "gpu"))
		gpus_open(src_gpu_path, dst_gpu_path, &sgpu, &dgpu);
	depth = o.window > read_window ? o.window : read_window;
	sides_open(&src, &dst, src_name, dst_name, depth);
	if (msg > src.max_msg || wr > dst.max_rdma) {
		fprintf(stderr, "p2plab-efa-check: --msg over max_msg_sz %u or --read-wr over max_rdma_size %u\n",
			src.max_msg, dst.max_rdma);
		return 2;
	}
	sides_connect(&src, &dst);

	transfer_bufs_make(&b, &src, sgpu, &dst, dgpu, size, count, o.seed);

	t0 = now_us();
	failed = transfer_send(&src, &dst, &b, count, msg, o.window, &r);
	send_us = now_us() - t0;
	read_us = 0;
	read_bytes = 0;
	if (!failed) {
		t0 = now_us();
		read_bytes = read_windowed(&dst, src.qp->qp_num, b.src.mr->rkey, b.src.addr,
					   b.back.mr->lkey, b.back.addr, size, wr, read_window);
		read_us = now_us() - t0;
	}
	failed |= read_bytes != size;

	/* What the destination must hold: message slot_msg[k] in slot k. */
	sent_crc = 0;
	for (k = 0; k < count; k++)
		sent_crc = crc32c_update(sent_crc, b.pattern + b.slot_msg[k] * msg, msg);
	dst_crc = mem_buf_crc(&b.dst, size);
	read_crc = mem_buf_crc(&b.back, size);
	failed |= dst_crc != sent_crc || read_crc != b.expected;

	printf("mem=%s\nbytes=%" PRIu64 "\nmsg=%" PRIu64 "\nread_wr=%" PRIu64 "\n", mem, size, msg,
	       wr);
	printf("messages=%" PRIu64 "\nsend_ok=%" PRIu64 "\nrecv_ok=%" PRIu64 "\n", count,
	       r.send_ok, r.recv_ok);
	print_arrivals(&r);
	printf("read_bytes=%" PRIu64 "\n", read_bytes);
	printf("send_us=%" PRIu64 "\nread_us=%" PRIu64 "\n", send_us, read_us);
	printf("expected_crc=0x%08x\nsent_crc=0x%08x\ndst_crc=0x%08x\nread_crc=0x%08x\n",
	       b.expected, sent_crc, dst_crc, read_crc);
	print_verdict(failed);
	transfer_bufs_dereg(&b);
	return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "xfer"))
		return cmd_xfer(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "send-one"))
		return cmd_send_one(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "gpu-xfer"))
		return cmd_gpu_xfer(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "gpu-pinned"))
		return cmd_gpu_pinned(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "bench"))
		return cmd_bench(argc, argv);
	fprintf(stderr, "usage: p2plab-efa-check xfer|send-one|gpu-xfer|gpu-pinned|bench [options] (see the source's header)\n");
	return 2;
}
