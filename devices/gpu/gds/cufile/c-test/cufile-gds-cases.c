// SPDX-License-Identifier: Apache-2.0
/*
 * cufile-gds-cases: one cuFile transfer, written against NVIDIA's cuFile
 * API documentation (cufile.h) as a GDS program would be, linked with
 * -lcufile. Only the GPU memory calls (the CUDA runtime's cudaMalloc,
 * cudaMemcpy and cudaFree in a CUDA program) are p2plab's: they are the
 * gpu_* functions at the top. The path report at the end is p2plab's
 * extension (cufile_p2plab.h).
 *
 *   cufile-gds-cases info
 *   cufile-gds-cases read  FILE SIZE FILE_OFFSET DEVPTR_OFFSET
 *   cufile-gds-cases write FILE SIZE FILE_OFFSET DEVPTR_OFFSET [SEED]
 *
 * A read verifies the GPU buffer (copied back to the host) against the
 * file read back through the page cache; a write fills the GPU buffer
 * from the host first and verifies the file afterwards. Prints KEY=VALUE
 * lines: CF_RET, CF_VERIFY, CF_PATH, CF_P2P_BYTES, CF_COMPAT_BYTES,
 * CF_REASONS, CF_P2P_ERRNO, CF_EOF, CF_DETAIL (info: CF_VERSION and the
 * driver properties). Exit status: 0 verified, 1 I/O error or mismatch,
 * 2 usage or setup.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cufile.h"
#include "cufile_p2plab.h"

/* ---- GPU memory: the only p2plab-specific calls (CUDA runtime in a CUDA
 * program). devPtr is VRAM of the p2plab GPU (its p2pmem). ---- */
static int gpu_malloc(void **devPtr, size_t size) /* cudaMalloc */
{
	return p2plab_gds_mem_alloc(devPtr, size, NULL).err;
}
static int gpu_free(void *devPtr) /* cudaFree */
{
	return p2plab_gds_mem_free(devPtr).err;
}
static int gpu_memcpy_htod(void *dst, const void *src, size_t size) /* cudaMemcpyHostToDevice */
{
	return p2plab_gds_memcpy_htod(dst, src, size).err;
}
static int gpu_memcpy_dtoh(void *dst, const void *src, size_t size) /* cudaMemcpyDeviceToHost */
{
	return p2plab_gds_memcpy_dtoh(dst, src, size).err;
}
/* ---- end of the p2plab-specific part ---- */

static int check(const char *what, CUfileError_t st)
{
	if (st.err == CU_FILE_SUCCESS)
		return 0;
	fprintf(stderr, "%s: %s (%d)\n", what, CUFILE_ERRSTR(st.err), st.err);
	return -1;
}

static int info(void)
{
	CUfileDrvProps_t props;
	int version = 0;

	if (check("cuFileDriverOpen", cuFileDriverOpen()) ||
	    check("cuFileGetVersion", cuFileGetVersion(&version)) ||
	    check("cuFileDriverGetProperties", cuFileDriverGetProperties(&props)))
		return 2;
	printf("CF_VERSION=%d\n", version);
	printf("CF_NVME_SUPPORTED=%d\n", !!(props.nvfs.dstatusflags & (1u << CU_FILE_NVME_SUPPORTED)));
	printf("CF_ALLOW_COMPAT=%d\n",
	       !!(props.nvfs.dcontrolflags & (1u << CU_FILE_ALLOW_COMPAT_MODE)));
	printf("CF_MAX_DIRECT_IO_KB=%zu\n", props.nvfs.max_direct_io_size);
	printf("CF_PER_BUFFER_CACHE_KB=%u\n", props.per_buffer_cache_size);
	return check("cuFileDriverClose", cuFileDriverClose()) ? 2 : 0;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint32_t x = 2463534242u ^ seed;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

/* Reads [offset, offset + size) of path through the page cache. */
static ssize_t read_back(const char *path, unsigned char *buf, size_t size, off_t offset)
{
	size_t done = 0;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -1;
	while (done < size) {
		ssize_t n = pread(fd, buf + done, size - done, offset + (off_t)done);

		if (n < 0) {
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	close(fd);
	return (ssize_t)done;
}

static void print_report(void)
{
	struct p2plab_gds_io_report r;
	const char *sep = "";

	if (p2plab_cufile_last_report(&r) != 0) {
		printf("CF_PATH=unknown\n");
		return;
	}
	printf("CF_PATH=%s\n", p2plab_gds_path_name(r.path));
	printf("CF_P2P_BYTES=%" PRIu64 "\n", r.p2p_bytes);
	printf("CF_COMPAT_BYTES=%" PRIu64 "\n", r.compat_bytes);
	printf("CF_REASONS=");
	for (unsigned bit = 0; bit < 32; bit++) {
		if (r.reasons & (1u << bit)) {
			printf("%s%s", sep, p2plab_gds_reason_name(1u << bit));
			sep = ",";
		}
	}
	printf("\nCF_P2P_ERRNO=%d\n", r.p2p_errno);
	printf("CF_EOF=%u\n", r.eof);
	printf("CF_DETAIL=%s\n", r.detail);
}

int main(int argc, char **argv)
{
	CUfileDescr_t cf_descr;
	CUfileHandle_t cf_handle;
	unsigned char *host, *file_bytes;
	void *devPtr = NULL;
	size_t size, alloc;
	off_t file_offset, devPtr_offset;
	ssize_t ret, got;
	int write_mode, fd, ok;

	if (argc == 2 && strcmp(argv[1], "info") == 0)
		return info();
	if (argc < 6 || argc > 7 ||
	    (strcmp(argv[1], "read") != 0 && strcmp(argv[1], "write") != 0)) {
		fprintf(stderr,
			"usage: %s info | read|write FILE SIZE FILE_OFFSET DEVPTR_OFFSET [SEED]\n",
			argv[0]);
		return 2;
	}
	write_mode = strcmp(argv[1], "write") == 0;
	size = (size_t)strtoull(argv[3], NULL, 0);
	file_offset = (off_t)strtoll(argv[4], NULL, 0);
	devPtr_offset = (off_t)strtoll(argv[5], NULL, 0);
	alloc = size + (size_t)devPtr_offset;
	host = malloc(size);
	file_bytes = malloc(size);
	if (size == 0 || !host || !file_bytes) {
		fprintf(stderr, "bad size\n");
		return 2;
	}

	/* As the cuFile documentation has it: open with O_DIRECT, open the
	 * driver, register the file and the GPU buffer. */
	fd = open(argv[2], (write_mode ? O_RDWR | O_CREAT : O_RDONLY) | O_DIRECT, 0644);
	if (fd < 0) {
		perror(argv[2]);
		return 2;
	}
	if (check("cuFileDriverOpen", cuFileDriverOpen()))
		return 2;
	memset(&cf_descr, 0, sizeof(cf_descr));
	cf_descr.handle.fd = fd;
	cf_descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	if (check("cuFileHandleRegister", cuFileHandleRegister(&cf_handle, &cf_descr)))
		return 2;
	if (gpu_malloc(&devPtr, alloc) != 0) {
		fprintf(stderr, "GPU allocation of %zu bytes failed: %s\n", alloc,
			p2plab_cufile_last_error());
		return 2;
	}
	if (check("cuFileBufRegister", cuFileBufRegister(devPtr, alloc, 0)))
		return 2;

	if (write_mode) {
		fill(host, size, argc == 7 ? (unsigned)strtoul(argv[6], NULL, 0) : 1);
		if (gpu_memcpy_htod((char *)devPtr + devPtr_offset, host, size) != 0) {
			fprintf(stderr, "copy to the GPU failed\n");
			return 2;
		}
		ret = cuFileWrite(cf_handle, devPtr, size, file_offset, devPtr_offset);
	} else {
		memset(host, 0x5a, size);
		if (gpu_memcpy_htod((char *)devPtr + devPtr_offset, host, size) != 0) {
			fprintf(stderr, "poisoning the GPU buffer failed\n");
			return 2;
		}
		ret = cuFileRead(cf_handle, devPtr, size, file_offset, devPtr_offset);
	}
	printf("CF_RET=%zd\n", ret);
	print_report();
	if (ret < 0) {
		if (ret == -1)
			fprintf(stderr, "cuFile%s: %s\n", write_mode ? "Write" : "Read",
				strerror(errno));
		else
			fprintf(stderr, "cuFile%s: %s (%zd)\n", write_mode ? "Write" : "Read",
				CUFILE_ERRSTR(ret), ret);
		printf("CF_VERIFY=error\n");
		return 1;
	}

	/* The bytes moved must be the file's bytes at file_offset. */
	if (!write_mode && gpu_memcpy_dtoh(host, (char *)devPtr + devPtr_offset, (size_t)ret) != 0) {
		fprintf(stderr, "copy from the GPU failed\n");
		return 2;
	}
	got = read_back(argv[2], file_bytes, (size_t)ret, file_offset);
	ok = got == ret && memcmp(host, file_bytes, (size_t)ret) == 0;
	printf("CF_VERIFY=%s\n", ok ? "ok" : "mismatch");

	if (check("cuFileBufDeregister", cuFileBufDeregister(devPtr)) || gpu_free(devPtr) != 0)
		return 2;
	cuFileHandleDeregister(cf_handle);
	if (check("cuFileDriverClose", cuFileDriverClose()))
		return 2;
	close(fd);
	free(host);
	free(file_bytes);
	return ok ? 0 : 1;
}
