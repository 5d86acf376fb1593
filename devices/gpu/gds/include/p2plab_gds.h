/* SPDX-License-Identifier: Apache-2.0 */
/*
 * p2plab-gds: a cuFile-shaped GPUDirect Storage API for the p2plab guest.
 *
 * Moves data between files and the p2plab GPU's VRAM. P2P when the kernel
 * allows it (O_DIRECT with a p2pmem mapping of the GPU's BAR as the
 * buffer: the NVMe controller DMAs straight into VRAM); otherwise compat
 * mode (page-cache I/O into a bounce buffer in host RAM, then a GPU engine
 * copy). Every read and write says which path ran and why.
 *
 * cuFile                      p2plab-gds
 *   cuFileDriverOpen/Close      p2plab_gds_driver_open/close
 *   cuFileHandleRegister        p2plab_gds_handle_register (takes an fd)
 *   cudaMalloc                  p2plab_gds_mem_alloc (GPU p2pmem)
 *   cuFileBufRegister           p2plab_gds_buf_register
 *   cuFileRead/Write            p2plab_gds_read/write (+ an optional report)
 *   cudaMemcpy                  p2plab_gds_memcpy_htod/dtoh (GPU engine)
 *
 * Link with -lp2plab_gds (shared: libp2plab_gds.so; static:
 * libp2plab_gds.a plus -lpthread -ldl -lm). In the lab's guest the files
 * are in /opt/p2plab/{include,lib}. All functions are thread-safe.
 * Environment: P2PLAB_GDS_FORCE_COMPAT=1 forces compat mode.
 */
#ifndef P2PLAB_GDS_H
#define P2PLAB_GDS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define P2PLAB_GDS_ABI_VERSION 1

/* Library error codes (p2plab_gds_status_t.err; read/write return their
 * negation). 5000 and up, so they never look like an errno. */
#define P2PLAB_GDS_SUCCESS                    0
#define P2PLAB_GDS_DRIVER_NOT_INITIALIZED  5001 /* no driver_open yet */
#define P2PLAB_GDS_INVALID_VALUE           5002 /* bad argument */
#define P2PLAB_GDS_HANDLE_NOT_REGISTERED   5003
#define P2PLAB_GDS_INVALID_FILE_TYPE       5004 /* not a regular file */
#define P2PLAB_GDS_MEMORY_NOT_REGISTERED   5005 /* range outside registered buffers */
#define P2PLAB_GDS_MEMORY_ALREADY_REGISTERED 5006
#define P2PLAB_GDS_POINTER_INVALID         5007 /* not VRAM of a p2plab GPU */
#define P2PLAB_GDS_DEVICE_NOT_FOUND        5008 /* no p2plab GPU */
#define P2PLAB_GDS_IO_NOT_SUPPORTED        5009 /* e.g. write on a read-only handle */
#define P2PLAB_GDS_GPU_ENGINE_ERROR        5010 /* the GPU engine failed a copy/checksum */
#define P2PLAB_GDS_SYSTEM_ERROR            5011 /* a system call failed: see sys_errno */
#define P2PLAB_GDS_INTERNAL_ERROR          5012 /* a bug in the library */

/* What a call returns: a library code and the errno behind it (0 if none). */
typedef struct p2plab_gds_status {
	int32_t err;
	int32_t sys_errno;
} p2plab_gds_status_t;

/* A registered file; 0 is never a valid handle. */
typedef uint64_t p2plab_gds_handle_t;

/* p2plab_gds_io_report.path */
#define P2PLAB_GDS_PATH_NONE   0 /* nothing moved (size 0, or at/after EOF) */
#define P2PLAB_GDS_PATH_P2P    1 /* O_DIRECT straight between storage and the GPU BAR */
#define P2PLAB_GDS_PATH_COMPAT 2 /* bounce buffer in host RAM + GPU engine copy */
#define P2PLAB_GDS_PATH_MIXED  3 /* part P2P, part compat */

/* p2plab_gds_io_report.reasons: why (part of) a transfer ran in compat. */
#define P2PLAB_GDS_REASON_ALIGNMENT       (1u << 0) /* offset/address/length vs. O_DIRECT alignment */
#define P2PLAB_GDS_REASON_EOF_TAIL        (1u << 1) /* last partial block of the file */
#define P2PLAB_GDS_REASON_SPARSE          (1u << 2) /* a hole of a sparse file */
#define P2PLAB_GDS_REASON_APPEND          (1u << 3) /* O_APPEND handle, or an unaligned append */
#define P2PLAB_GDS_REASON_FS_NO_DIRECT_IO (1u << 4) /* the file system refuses O_DIRECT */
#define P2PLAB_GDS_REASON_FS_REFUSED      (1u << 5) /* O_DIRECT into GPU memory refused (see p2p_errno) */
#define P2PLAB_GDS_REASON_TOPOLOGY        (1u << 6) /* the kernel refused P2P between storage and GPU */
#define P2PLAB_GDS_REASON_NOT_PCI_STORAGE (1u << 7) /* the file is not on a PCI device */
#define P2PLAB_GDS_REASON_NOT_P2PMEM      (1u << 8) /* buffer mapped via /dev/p2plab-gpuN */
#define P2PLAB_GDS_REASON_FORCED          (1u << 9) /* P2PLAB_GDS_FORCE_COMPAT / set_force_compat */

/* What one read or write did (304 bytes). */
struct p2plab_gds_io_report {
	uint32_t path;          /* P2PLAB_GDS_PATH_* */
	uint32_t reasons;       /* P2PLAB_GDS_REASON_* bits of the compat part */
	uint64_t requested;     /* size asked for */
	uint64_t bytes;         /* bytes moved (= the return value when >= 0) */
	uint64_t p2p_bytes;
	uint64_t compat_bytes;
	int32_t  p2p_errno;     /* errno of a refused P2P attempt, 0 if none */
	uint32_t eof;           /* 1: the read reached end of file */
	char     detail[256];   /* why, in words (or the error), NUL-terminated */
};

/* p2plab_gds_buf_info.kind */
#define P2PLAB_GDS_BUF_P2PMEM 1 /* p2pmem: O_DIRECT-capable */
#define P2PLAB_GDS_BUF_DEVMAP 2 /* /dev/p2plab-gpuN mapping: compat only */

/* Where a registered buffer lives (40 bytes). */
struct p2plab_gds_buf_info {
	char     gpu[16];       /* PCI name of the GPU, e.g. "0000:04:00.0" */
	uint32_t kind;          /* P2PLAB_GDS_BUF_* */
	uint32_t bar;           /* the VRAM BAR (2) */
	uint64_t vram_offset;   /* offset of ptr in VRAM = in BAR2 */
	uint64_t size;          /* registered bytes from ptr on */
};

/* Opens the driver (reference-counted; pair every open with a close). */
p2plab_gds_status_t p2plab_gds_driver_open(void);
/* The last close drops registrations and allocations still left. */
p2plab_gds_status_t p2plab_gds_driver_close(void);
/* Non-zero: every transfer runs in compat mode (reason FORCED). */
p2plab_gds_status_t p2plab_gds_driver_set_force_compat(int on);

/* Registers an open regular file. fd may or may not have O_DIRECT; the
 * library reopens it privately (/proc/self/fd) and never moves fd's
 * position. O_APPEND fds append (reason APPEND). */
p2plab_gds_status_t p2plab_gds_handle_register(p2plab_gds_handle_t *fh, int fd);
p2plab_gds_status_t p2plab_gds_handle_deregister(p2plab_gds_handle_t fh);

/* VRAM for I/O. mem_alloc takes it from the GPU's p2pmem (P2P-capable);
 * gpu is a PCI name or NULL for the first p2plab GPU. mem_map_vram maps
 * VRAM at vram_offset through /dev/p2plab-gpuN (always compat). Free with
 * mem_free after deregistering. */
p2plab_gds_status_t p2plab_gds_mem_alloc(void **ptr, size_t size, const char *gpu);
p2plab_gds_status_t p2plab_gds_mem_map_vram(void **ptr, size_t size, uint64_t vram_offset,
					    const char *gpu);
p2plab_gds_status_t p2plab_gds_mem_free(void *ptr);

/* Registers GPU memory (from mem_alloc/mem_map_vram, or the caller's own
 * mmap of p2pmem/allocate or /dev/p2plab-gpuN); flags must be 0. The
 * range must stay mapped while registered. Finding a p2pmem buffer's VRAM
 * offset reads /proc/self/pagemap, which needs CAP_SYS_ADMIN. */
p2plab_gds_status_t p2plab_gds_buf_register(const void *ptr, size_t size, int flags);
p2plab_gds_status_t p2plab_gds_buf_deregister(const void *ptr);
p2plab_gds_status_t p2plab_gds_buf_info(const void *ptr, struct p2plab_gds_buf_info *info);

/* Reads size bytes at file_offset into buf_base + buf_offset (inside one
 * registered buffer). Returns the bytes read (fewer at end of file), -1
 * with errno set for a system error, or -P2PLAB_GDS_* for a library error.
 * report (may be NULL) says which path moved which bytes and why. */
ssize_t p2plab_gds_read(p2plab_gds_handle_t fh, void *buf_base, size_t size,
			int64_t file_offset, int64_t buf_offset,
			struct p2plab_gds_io_report *report);
/* Writes size bytes from buf_base + buf_offset at file_offset. */
ssize_t p2plab_gds_write(p2plab_gds_handle_t fh, const void *buf_base, size_t size,
			 int64_t file_offset, int64_t buf_offset,
			 struct p2plab_gds_io_report *report);

/* CRC32C (Castagnoli) of registered GPU memory, by the GPU's engine. */
p2plab_gds_status_t p2plab_gds_checksum(const void *ptr, size_t size, uint32_t *crc32c);
/* Host <-> registered GPU memory, by the GPU's engine. */
p2plab_gds_status_t p2plab_gds_memcpy_htod(void *dst, const void *src, size_t size);
p2plab_gds_status_t p2plab_gds_memcpy_dtoh(void *dst, const void *src, size_t size);

/* Static names: of an error code (or its negation), a reason bit, a path. */
const char *p2plab_gds_error_string(int err);
const char *p2plab_gds_reason_name(uint32_t reason);
const char *p2plab_gds_path_name(uint32_t path);
/* This thread's last failure in full ("" after a success); valid until
 * the thread's next p2plab_gds_* call. */
const char *p2plab_gds_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* P2PLAB_GDS_H */
