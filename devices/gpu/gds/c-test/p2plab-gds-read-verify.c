// SPDX-License-Identifier: Apache-2.0
/*
 * p2plab-gds-read-verify: a C program linked against libp2plab_gds, the
 * way GDS test code links against libcufile. It reads FILE (or its first
 * SIZE bytes) into GPU memory and verifies the bytes with the GPU's
 * checksum engine against a CPU CRC32C of the file:
 *
 *   p2plab-gds-read-verify FILE [SIZE]
 *
 * Prints KEY=VALUE lines (C_RET, C_PATH, C_P2P_BYTES, C_COMPAT_BYTES,
 * C_REASONS, C_DETAIL, C_GPU, C_VRAM_OFFSET, C_GPU_CRC, C_FILE_CRC,
 * C_VERIFY). Exit status: 0 verified, 1 I/O error or mismatch, 2 setup.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "p2plab_gds.h"

/* The ABI the header promises. */
_Static_assert(sizeof(struct p2plab_gds_io_report) == 304, "io_report size");
_Static_assert(offsetof(struct p2plab_gds_io_report, detail) == 48, "io_report layout");
_Static_assert(sizeof(struct p2plab_gds_buf_info) == 40, "buf_info size");
_Static_assert(sizeof(p2plab_gds_status_t) == 8, "status size");

static int check(const char *what, p2plab_gds_status_t st)
{
	if (st.err == P2PLAB_GDS_SUCCESS)
		return 0;
	fprintf(stderr, "%s: %s (err %d, errno %d): %s\n", what, p2plab_gds_error_string(st.err),
		st.err, st.sys_errno, p2plab_gds_last_error());
	return -1;
}

/* CRC32C (Castagnoli, reflected), bit by bit: independent of the library. */
static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82f63b78u & -(crc & 1u));
	}
	return ~crc;
}

static int file_crc(const char *path, size_t len, uint32_t *out)
{
	unsigned char chunk[65536];
	uint32_t crc = 0;
	size_t done = 0;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -1;
	while (done < len) {
		size_t n = len - done < sizeof(chunk) ? len - done : sizeof(chunk);
		ssize_t got = pread(fd, chunk, n, (off_t)done);

		if (got <= 0) {
			close(fd);
			return -1;
		}
		crc = crc32c(crc, chunk, (size_t)got);
		done += (size_t)got;
	}
	close(fd);
	*out = crc;
	return 0;
}

int main(int argc, char **argv)
{
	struct p2plab_gds_io_report report;
	struct p2plab_gds_buf_info info;
	p2plab_gds_handle_t fh = 0;
	uint32_t gpu_crc = 0, cpu_crc = 0;
	void *gpu = NULL;
	struct stat st;
	size_t size;
	ssize_t ret;
	int fd, ok;

	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s FILE [SIZE]\n", argv[0]);
		return 2;
	}
	fd = open(argv[1], O_RDONLY | O_DIRECT);
	if (fd < 0 || fstat(fd, &st) != 0) {
		perror(argv[1]);
		return 2;
	}
	size = argc == 3 ? (size_t)strtoull(argv[2], NULL, 0) : (size_t)st.st_size;
	if (size == 0) {
		fprintf(stderr, "nothing to read\n");
		return 2;
	}
	if (check("driver_open", p2plab_gds_driver_open()) ||
	    check("handle_register", p2plab_gds_handle_register(&fh, fd)) ||
	    check("mem_alloc", p2plab_gds_mem_alloc(&gpu, size, NULL)) ||
	    check("buf_register", p2plab_gds_buf_register(gpu, size, 0)) ||
	    check("buf_info", p2plab_gds_buf_info(gpu, &info)))
		return 2;

	ret = p2plab_gds_read(fh, gpu, size, 0, 0, &report);
	printf("C_RET=%zd\n", ret);
	if (ret < 0) {
		fprintf(stderr, "read: %s (errno %d): %s\n",
			ret == -1 ? strerror(errno) : p2plab_gds_error_string((int)ret), errno,
			p2plab_gds_last_error());
		return 1;
	}
	printf("C_PATH=%s\n", p2plab_gds_path_name(report.path));
	printf("C_P2P_BYTES=%" PRIu64 "\n", report.p2p_bytes);
	printf("C_COMPAT_BYTES=%" PRIu64 "\n", report.compat_bytes);
	printf("C_REASONS=%" PRIu32 "\n", report.reasons);
	printf("C_DETAIL=%s\n", report.detail);
	printf("C_GPU=%s\n", info.gpu);
	printf("C_BUF_KIND=%s\n", info.kind == P2PLAB_GDS_BUF_P2PMEM ? "p2pmem" : "devmap");
	printf("C_VRAM_OFFSET=0x%" PRIx64 "\n", info.vram_offset);

	if (check("checksum", p2plab_gds_checksum(gpu, (size_t)ret, &gpu_crc)))
		return 1;
	if (file_crc(argv[1], (size_t)ret, &cpu_crc) != 0) {
		perror("reading the file back");
		return 2;
	}
	ok = gpu_crc == cpu_crc && report.bytes == (uint64_t)ret;
	printf("C_GPU_CRC=%08" PRIx32 "\n", gpu_crc);
	printf("C_FILE_CRC=%08" PRIx32 "\n", cpu_crc);
	printf("C_VERIFY=%s\n", ok ? "ok" : "mismatch");

	if (check("buf_deregister", p2plab_gds_buf_deregister(gpu)) ||
	    check("mem_free", p2plab_gds_mem_free(gpu)) ||
	    check("handle_deregister", p2plab_gds_handle_deregister(fh)) ||
	    check("driver_close", p2plab_gds_driver_close()))
		return 2;
	close(fd);
	return ok ? 0 : 1;
}
