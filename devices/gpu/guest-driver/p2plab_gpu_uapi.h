/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note OR Apache-2.0 */
/*
 * p2plab GPU-like device: the ioctl ABI of /dev/p2plab-gpuN, shared by the
 * kernel driver and user space (p2plab-gpu-tool).
 *
 * All structures have fixed sizes and explicit padding; they are the same
 * on 32- and 64-bit user space.
 */
#ifndef P2PLAB_GPU_UAPI_H
#define P2PLAB_GPU_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define P2PLAB_GPU_IOC_MAGIC	0xb7

/* p2plab_gpu_info.flags */
#define P2PLAB_GPU_INFO_P2PMEM		(1u << 0)	/* BAR2 registered and published as p2pmem */
#define P2PLAB_GPU_INFO_MSIX		(1u << 1)	/* interrupts are MSI-X (else INTx) */
#define P2PLAB_GPU_INFO_BROKEN		(1u << 2)	/* the engine halted; rebind the driver */

struct p2plab_gpu_info {
	__u32 version;		/* device REG_VERSION: major << 16 | minor */
	__u16 vendor_id;
	__u16 device_id;
	__u64 vram_size;	/* bytes */
	__u64 vram_bus_addr;	/* BAR2 bus address */
	__u32 ring_entries;
	__u32 status;		/* device REG_STATUS */
	__u64 completed_fence;	/* last fence the device retired */
	__u64 submitted_fence;	/* last fence the driver submitted */
	__u32 jobs_completed;	/* device counters (wrap at 2^32) */
	__u32 jobs_failed;
	__u32 engine_error;	/* device REG_ENGINE_ERROR */
	__u32 flags;		/* P2PLAB_GPU_INFO_* */
	char pci_name[32];	/* e.g. "0000:03:00.0", NUL-terminated */
};

/* p2plab_gpu_job.op, same numbers as the device opcodes. */
#define P2PLAB_GPU_OP_NOP		0
#define P2PLAB_GPU_OP_COPY_TO_VRAM	1	/* src = user pointer, dst = VRAM offset */
#define P2PLAB_GPU_OP_COPY_FROM_VRAM	2	/* src = VRAM offset, dst = user pointer */
#define P2PLAB_GPU_OP_COPY_VRAM		3	/* src, dst = VRAM offsets (memmove) */
#define P2PLAB_GPU_OP_FILL		4	/* dst = VRAM offset, 32-bit pattern */
#define P2PLAB_GPU_OP_CHECKSUM		5	/* src = VRAM offset; result = CRC32C */

/* p2plab_gpu_job.flags */
/*
 * Pass op (any value up to 255), VRAM offsets, lengths and pattern to the
 * device unchecked, so its own error handling can be exercised end to end
 * (CAP_SYS_ADMIN). User-pointer copies still go through a bounce buffer.
 */
#define P2PLAB_GPU_JOB_UNCHECKED	(1u << 0)
/*
 * For COPY_TO/FROM_VRAM: the host side (src resp. dst) is a bus address
 * used as is, e.g. a peer device's BAR, instead of a user pointer; one
 * device command, no bounce buffer (CAP_SYS_RAWIO).
 */
#define P2PLAB_GPU_JOB_BUS_ADDR		(1u << 1)
#define P2PLAB_GPU_JOB_FLAGS		(P2PLAB_GPU_JOB_UNCHECKED | P2PLAB_GPU_JOB_BUS_ADDR)

struct p2plab_gpu_job {
	/* in */
	__u32 op;		/* P2PLAB_GPU_OP_* */
	__u32 flags;		/* P2PLAB_GPU_JOB_* */
	__u64 src;
	__u64 dst;
	__u64 len;		/* bytes */
	__u32 pattern;		/* FILL: little-endian 32-bit pattern */
	__u32 timeout_ms;	/* 0 = driver default (30 s) */
	/* out */
	__u64 fence;		/* fence of the job's last device command */
	__u32 status;		/* device status code, 0 = OK (see README) */
	__u32 result;		/* CHECKSUM: CRC32C of the range */
};

/*
 * SUBMIT runs a job and waits for it. Returns 0 when the device reported
 * status 0. Otherwise -1 with errno:
 *   EIO        the device reported an error; status holds its code
 *   ETIMEDOUT  the fence did not arrive in time (the job may still finish)
 *   EINTR      a signal arrived while waiting (the job may still finish)
 *   EINVAL     bad op, flags or range (checked before the device sees it)
 *   EFAULT     bad user pointer
 *   EPERM      a flag needs a capability the caller lacks
 *   ECANCELED  a function reset of the device cancelled the job
 *   ENODEV     the device is gone (unbound) or its engine halted
 * fence, status and result are written back in every case where a job
 * reached the device.
 */
#define P2PLAB_GPU_IOC_INFO	_IOR(P2PLAB_GPU_IOC_MAGIC, 0x00, struct p2plab_gpu_info)
#define P2PLAB_GPU_IOC_SUBMIT	_IOWR(P2PLAB_GPU_IOC_MAGIC, 0x01, struct p2plab_gpu_job)

/*
 * VRAM allocations. ALLOC carves size bytes (rounded up to 64 KiB, the
 * GPU page of NVIDIA's peer-memory API) out of the VRAM published as
 * p2pmem and returns its VRAM offset (a multiple of 64 KiB) and a handle;
 * mmap at that offset to reach it (without MAP_FIXED the mapping's address
 * is 64 KiB-aligned too). The allocation belongs to the file it was made
 * on and is freed by FREE or when that file is released (close of the
 * last reference, process exit). Freeing revokes it: peer-memory pins
 * (p2plab_p2p.h, nv-p2p.h) get their free callback, dma-bufs exported from
 * it get move_notify and refuse new mappings; persistent pins
 * (nvidia_p2p_get_pages_persistent) keep the VRAM until they are put, and
 * pinned dma-buf attachments (dma_buf_pin, e.g. an RDMA MR) until they are
 * unpinned and detached (a function reset does not take it from them).
 * Errors: EINVAL size 0 or too big, ENOMEM no room, ENODEV no p2pmem or
 * device gone; FREE: ENOENT unknown handle.
 */
struct p2plab_gpu_alloc {
	__u64 size;		/* in: bytes; out: rounded size */
	__u64 vram_offset;	/* out */
	__u32 handle;		/* out, > 0 */
	__u32 pad;
};

/*
 * EXPORT_DMABUF: a dma-buf of a whole allocation, for importers that
 * support peer-to-peer (dma_buf_attach_ops.allow_peer2peer); non-P2P
 * importers and peers the kernel's P2P distance check refuses fail to
 * attach/map. flags: O_CLOEXEC and/or O_RDWR. Returns the fd in fd.
 */
struct p2plab_gpu_export_dmabuf {
	__u32 handle;		/* in */
	__u32 flags;		/* in: O_CLOEXEC | O_RDWR */
	__s32 fd;		/* out */
	__u32 pad;
};

#define P2PLAB_GPU_IOC_ALLOC		_IOWR(P2PLAB_GPU_IOC_MAGIC, 0x02, struct p2plab_gpu_alloc)
#define P2PLAB_GPU_IOC_FREE		_IOW(P2PLAB_GPU_IOC_MAGIC, 0x03, __u32)
#define P2PLAB_GPU_IOC_EXPORT_DMABUF	_IOWR(P2PLAB_GPU_IOC_MAGIC, 0x04, struct p2plab_gpu_export_dmabuf)

/* mmap(2) of /dev/p2plab-gpuN maps VRAM: file offset = VRAM offset. */

#endif /* P2PLAB_GPU_UAPI_H */
