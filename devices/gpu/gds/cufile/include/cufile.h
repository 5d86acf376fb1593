/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cufile.h for p2plab: NVIDIA cuFile's documented C API (GPUDirect
 * Storage), implemented by libcufile.so over p2plab-gds. Written for
 * p2plab from the public cuFile API reference (names, signatures, enum
 * values, struct layouts); it contains no NVIDIA code.
 *
 * A program written against cuFile's documentation compiles against this
 * header unchanged, except for how it allocates the GPU buffer: there is
 * no CUDA here, so cudaMalloc/cudaFree/cudaMemcpy become
 * p2plab_gds_mem_alloc/_mem_free/_memcpy_* (p2plab_gds.h, exported by
 * libcufile.so too). Link with -lcufile only. Which path each transfer
 * took, and why, is in cufile_p2plab.h (p2plab_cufile_last_report).
 *
 * Declared and implemented: driver open/close, properties and the
 * properties setters, handle and buffer registration, cuFileRead and
 * cuFileWrite, cuFileGetVersion, cufileop_status_error. Not implemented
 * (not declared): batch, stream and async I/O, the parameter API.
 */
#ifndef P2PLAB_CUFILE_H
#define P2PLAB_CUFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA's driver result. Without cuda.h only the two values this library
 * returns; include cuda.h before this header to get CUDA's own. */
#ifndef __cuda_cuda_h__
typedef enum p2plab_cuda_result {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_UNKNOWN = 999
} CUresult;
#endif

/* cuFile's error numbers (CUfileError_t.err; cuFileRead/Write return
 * their negation). */
#define CUFILEOP_BASE_ERR 5000
typedef enum CUfileOpError {
	CU_FILE_SUCCESS = 0,
	CU_FILE_DRIVER_NOT_INITIALIZED = 5001,
	CU_FILE_DRIVER_INVALID_PROPS = 5002,
	CU_FILE_DRIVER_UNSUPPORTED_LIMIT = 5003,
	CU_FILE_DRIVER_VERSION_MISMATCH = 5004,
	CU_FILE_DRIVER_VERSION_READ_ERROR = 5005,
	CU_FILE_DRIVER_CLOSING = 5006,
	CU_FILE_PLATFORM_NOT_SUPPORTED = 5007,
	CU_FILE_IO_NOT_SUPPORTED = 5008,
	CU_FILE_DEVICE_NOT_SUPPORTED = 5009,
	CU_FILE_NVFS_DRIVER_ERROR = 5010,
	CU_FILE_CUDA_DRIVER_ERROR = 5011,
	CU_FILE_CUDA_POINTER_INVALID = 5012,
	CU_FILE_CUDA_MEMORY_TYPE_INVALID = 5013,
	CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
	CU_FILE_CUDA_CONTEXT_MISMATCH = 5015,
	CU_FILE_INVALID_MAPPING_SIZE = 5016,
	CU_FILE_INVALID_MAPPING_RANGE = 5017,
	CU_FILE_INVALID_FILE_TYPE = 5018,
	CU_FILE_INVALID_FILE_OPEN_FLAG = 5019,
	CU_FILE_DIO_NOT_SET = 5020,
	CU_FILE_INVALID_VALUE = 5022,
	CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
	CU_FILE_MEMORY_NOT_REGISTERED = 5024,
	CU_FILE_PERMISSION_DENIED = 5025,
	CU_FILE_DRIVER_ALREADY_OPEN = 5026,
	CU_FILE_HANDLE_NOT_REGISTERED = 5027,
	CU_FILE_HANDLE_ALREADY_REGISTERED = 5028,
	CU_FILE_DEVICE_NOT_FOUND = 5029,
	CU_FILE_INTERNAL_ERROR = 5030,
	CU_FILE_GETNEWFD_FAILED = 5031,
	CU_FILE_NVFS_SETUP_ERROR = 5033,
	CU_FILE_IO_DISABLED = 5034,
	CU_FILE_BATCH_SUBMIT_FAILED = 5035,
	CU_FILE_GPU_MEMORY_PINNING_FAILED = 5036,
	CU_FILE_BATCH_FULL = 5037,
	CU_FILE_ASYNC_NOT_SUPPORTED = 5038,
	CU_FILE_INTERNAL_BATCH_SETUP_ERROR = 5039,
	CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR = 5040,
	CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR = 5041,
	CU_FILE_INTERNAL_BATCH_CANCEL_ERROR = 5042,
	CU_FILE_NOMEM_ERROR = 5043,
	CU_FILE_IO_ERROR = 5044,
	CU_FILE_INTERNAL_BUF_REGISTER_ERROR = 5045,
	CU_FILE_HASH_OPR_ERROR = 5046,
	CU_FILE_INVALID_CONTEXT_ERROR = 5047,
	CU_FILE_NVFS_INTERNAL_DRIVER_ERROR = 5048,
	CU_FILE_BATCH_NOCOMPAT_ERROR = 5049,
	CU_FILE_IO_MAX_ERROR = 5050
} CUfileOpError;

/* What the status calls return (8 bytes): a cuFile error and, for
 * CU_FILE_CUDA_DRIVER_ERROR (here: the GPU engine failed a copy), a CUDA
 * result. */
typedef struct CUfileError {
	CUfileOpError err;
	CUresult cu_err;
} CUfileError_t;

/* A static string for a CUfileOpError. */
const char *cufileop_status_error(CUfileOpError status);

#define CU_FILE_CUDA_ERR(status) ((status).cu_err)
#define IS_CUDA_ERR(status) ((status).err == CU_FILE_CUDA_DRIVER_ERROR)
/* err may be an int or the ssize_t of cuFileRead/Write (hence the cast:
 * cuFile's numbers fit in an int). */
#define IS_CUFILE_ERR(err) (abs((int)(err)) > CUFILEOP_BASE_ERR)
#define CUFILE_ERRSTR(err) cufileop_status_error((CUfileOpError)abs((int)(err)))

/* CUfileDrvProps_t.nvfs.dstatusflags: bit numbers of what storage takes
 * the direct path. p2plab sets CU_FILE_NVME_SUPPORTED. */
typedef enum CUfileDriverStatusFlags {
	CU_FILE_LUSTRE_SUPPORTED = 0,
	CU_FILE_WEKAFS_SUPPORTED = 1,
	CU_FILE_NFS_SUPPORTED = 2,
	CU_FILE_GPFS_SUPPORTED = 3,
	CU_FILE_NVME_SUPPORTED = 4,
	CU_FILE_NVMEOF_SUPPORTED = 5,
	CU_FILE_SCSI_SUPPORTED = 6,
	CU_FILE_SCALEFLUX_CSD_SUPPORTED = 7,
	CU_FILE_NVMESH_SUPPORTED = 8,
	CU_FILE_BEEGFS_SUPPORTED = 9
} CUfileDriverStatusFlags_t;

/* CUfileDrvProps_t.nvfs.dcontrolflags: bit numbers. p2plab always allows
 * compat mode (a transfer that cannot go P2P goes through a bounce
 * buffer and says why). */
typedef enum CUfileDriverControlFlags {
	CU_FILE_USE_POLL_MODE = 0,
	CU_FILE_ALLOW_COMPAT_MODE = 1
} CUfileDriverControlFlags_t;

/* CUfileDrvProps_t.fflags: bit numbers. p2plab sets none. */
typedef enum CUfileFeatureFlags {
	CU_FILE_DYN_ROUTING_SUPPORTED = 0,
	CU_FILE_BATCH_IO_SUPPORTED = 1,
	CU_FILE_STREAMS_SUPPORTED = 2,
	CU_FILE_PARALLEL_IO_SUPPORTED = 3
} CUfileFeatureFlags_t;

/* The driver's properties (56 bytes). Sizes are in KiB. */
typedef struct CUfileDrvProps {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
		size_t poll_thresh_size;
		size_t max_direct_io_size;
		unsigned int dstatusflags;
		unsigned int dcontrolflags;
	} nvfs;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
	unsigned int max_batch_io_size;
	unsigned int max_batch_io_timeout_msecs;
} CUfileDrvProps_t;

/* CUfileDescr_t.type. p2plab takes CU_FILE_HANDLE_TYPE_OPAQUE_FD. */
typedef enum CUfileFileHandleType {
	CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1,
	CU_FILE_HANDLE_TYPE_OPAQUE_WIN32 = 2,
	CU_FILE_HANDLE_TYPE_USERSPACE_FS = 3
} CUfileFileHandleType;

typedef struct sockaddr sockaddr_t;

typedef struct cufileRDMAInfo {
	int version;
	int desc_len;
	const char *desc_str;
} cufileRDMAInfo_t;

/* Operations of a user-space file system (CU_FILE_HANDLE_TYPE_USERSPACE_FS,
 * which p2plab does not take; with an fd, fs_ops is ignored). */
typedef struct CUfileFSOps {
	const char *(*fs_type)(void *handle);
	int (*getRDMADeviceList)(void *handle, sockaddr_t **hostaddrs);
	int (*getRDMADevicePriority)(void *handle, char *buf, size_t size, off_t offset,
				     sockaddr_t *hostaddr);
	ssize_t (*read)(void *handle, char *buf, size_t size, off_t offset,
			cufileRDMAInfo_t *rdmainfo);
	ssize_t (*write)(void *handle, const char *buf, size_t size, off_t offset,
			 cufileRDMAInfo_t *rdmainfo);
} CUfileFSOps_t;

/* What cuFileHandleRegister registers (24 bytes). */
typedef struct CUfileDescr_t {
	CUfileFileHandleType type;
	union {
		int fd;
		void *handle;
	} handle;
	const CUfileFSOps_t *fs_ops;
} CUfileDescr_t;

/* A registered file; never NULL once registered. */
typedef void *CUfileHandle_t;

/* cuFileBufRegister flags (accepted; they change nothing here: p2plab has
 * no RDMA storage). */
#define CU_FILE_RDMA_REGISTER 1
#define CU_FILE_RDMA_RELAXED_ORDERING (1 << 1)

/* Opens the driver (reference-counted). Registration, I/O and
 * cuFileDriverGetProperties open it on first use if the program did not. */
CUfileError_t cuFileDriverOpen(void);
/* Closes it; the last close drops registrations still left. */
CUfileError_t cuFileDriverClose_v2(void);
#define cuFileDriverClose cuFileDriverClose_v2

CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *props);
/* Recorded and reported by cuFileDriverGetProperties (there is no polling
 * here: every call completes synchronously). */
CUfileError_t cuFileDriverSetPollMode(bool poll, size_t poll_threshold_size);
/* Sizes in KiB, > 0; recorded and reported. */
CUfileError_t cuFileDriverSetMaxDirectIOSize(size_t max_direct_io_size);
CUfileError_t cuFileDriverSetMaxCacheSize(size_t max_cache_size);
CUfileError_t cuFileDriverSetMaxPinnedMemSize(size_t max_pinned_size);

/* version = 1000 * major + 10 * minor of the cuFile API implemented. */
CUfileError_t cuFileGetVersion(int *version);

/* Registers descr->handle.fd (type CU_FILE_HANDLE_TYPE_OPAQUE_FD), a
 * regular file opened with or without O_DIRECT; its position is never
 * moved. */
CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr);
void cuFileHandleDeregister(CUfileHandle_t fh);

/* Registers GPU memory (optional: I/O into unregistered GPU memory
 * registers it for the duration of the call). */
CUfileError_t cuFileBufRegister(const void *bufPtr_base, size_t length, int flags);
CUfileError_t cuFileBufDeregister(const void *bufPtr_base);

/* Reads size bytes at file_offset into bufPtr_base + bufPtr_offset.
 * Returns the bytes read (fewer at end of file), -1 with errno set for a
 * system error, or the negation of a CUfileOpError. */
ssize_t cuFileRead(CUfileHandle_t fh, void *bufPtr_base, size_t size, off_t file_offset,
		   off_t bufPtr_offset);
/* Writes size bytes from bufPtr_base + bufPtr_offset at file_offset. */
ssize_t cuFileWrite(CUfileHandle_t fh, const void *bufPtr_base, size_t size,
		    off_t file_offset, off_t bufPtr_offset);

#ifdef __cplusplus
}
#endif

#endif /* P2PLAB_CUFILE_H */
