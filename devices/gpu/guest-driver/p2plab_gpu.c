// SPDX-License-Identifier: GPL-2.0
/*
 * p2plab_gpu: Linux driver for p2plab's GPU-like PCIe device.
 *
 * - BAR0: control registers; BAR2: VRAM, registered and published as
 *   PCI P2PDMA memory; BAR4: MSI-X.
 * - One command ring in coherent DMA memory. Every job command carries its
 *   own completion record (from a dma_pool) and a fence; the device writes
 *   the record, advances REG_FENCE and raises an interrupt.
 * - /dev/p2plab-gpuN: ioctls (p2plab_gpu_uapi.h) to query the device and
 *   to run copy/fill/checksum jobs synchronously, and mmap of VRAM.
 * - VRAM allocations (carved from the published p2pmem in 64 KiB GPU
 *   pages), exported to other kernel modules through two peer-memory APIs,
 *   p2plab's (p2plab_p2p.h) and NVIDIA's (nv-p2p.h, nvidia_p2p_*), and to
 *   dma-buf importers; freeing, closing, reset and unbind revoke them.
 *
 * Lifetime: the char device's struct device owns the driver state, so open
 * files keep it alive after the PCI device is unbound; from then on every
 * file operation fails with -ENODEV and VRAM mappings are zapped (SIGBUS).
 */

#include <linux/capability.h>
#include <linux/cdev.h>
#include <linux/dma-buf.h>
#include <linux/dma-buf-mapping.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/dmapool.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/iopoll.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/rwsem.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "p2plab_gpu_hw.h"
#include "p2plab_gpu_uapi.h"
#include "nv-p2p.h"
#include "p2plab_p2p.h"
#include "p2plab_pci.h"

#define DRV_NAME		"p2plab_gpu"
#define P2PLAB_GPU_MINORS	64
#define BOUNCE_SIZE		(1024 * 1024)
#define DEFAULT_TIMEOUT_MS	30000
#define IDLE_TIMEOUT_US		(5 * USEC_PER_SEC)
/*
 * A waiter looks at REG_FENCE itself this often, so a job whose interrupt
 * was lost completes within one poll instead of timing out.
 */
#define FENCE_POLL_MS		200
/*
 * VRAM is handed out in GPU pages of 64 KiB, the page of NVIDIA's
 * peer-memory API: allocations, their offsets and the user addresses they
 * are mapped at are multiples of it.
 */
#define GPU_PAGE_SIZE		SZ_64K

static unsigned int ring_entries = 256;
module_param(ring_entries, uint, 0444);
MODULE_PARM_DESC(ring_entries, "Command ring entries per device, a power of two in 2..65536 (default 256)");

static unsigned long p2pmem_max_mb;
module_param(p2pmem_max_mb, ulong, 0444);
MODULE_PARM_DESC(p2pmem_max_mb, "Publish at most this many MiB of VRAM as p2pmem (0 = the whole BAR, default)");

static P2PLAB_CHRDEVS(p2plab_gpu_chrdevs, "p2plab-gpu", P2PLAB_GPU_MINORS);

/* The DMA memory one device command uses; freed only once it retired. */
struct gpu_job_ctx {
	struct list_head node;		/* on gpu->zombies once abandoned */
	u64 fence;			/* 0 until submitted */
	struct p2plab_gpu_hw_completion *record;
	dma_addr_t record_dma;
	void *bounce;
	dma_addr_t bounce_dma;
	size_t bounce_size;
};

struct p2plab_gpu {
	struct device dev;		/* the char device; owns this struct */
	struct cdev cdev;
	struct pci_dev *pdev;

	/*
	 * Readers use the hardware (MMIO, ring, DMA memory); remove takes it
	 * for writing to tear the hardware side down. @removing tells
	 * sleeping readers to give up so remove does not wait on them.
	 */
	struct rw_semaphore hw_lock;
	bool removing;
	bool resetting;			/* between reset_prepare and reset_done */
	bool dead;			/* under hw_lock */
	bool broken;			/* the engine halted */

	void __iomem *regs;
	phys_addr_t vram_phys;
	u64 vram_size;
	u64 vram_bus;
	bool p2pmem;
	bool msix;
	int irq;

	struct p2plab_gpu_hw_cmd *ring;
	dma_addr_t ring_dma;
	u32 ring_entries;
	struct mutex submit_lock;	/* ring tail and submitted_fence */
	u32 tail;
	u64 submitted_fence;
	atomic64_t completed_fence;	/* updated from the interrupt handler */
	wait_queue_head_t wq;		/* fence progress, ring space, removal */

	struct dma_pool *record_pool;
	spinlock_t zombie_lock;
	struct list_head zombies;

	/* Serialises mmap against remove, which zaps every mapping. */
	struct mutex map_lock;
	bool unmapped;			/* under map_lock */
	struct mutex files_lock;
	struct list_head files;

	/*
	 * VRAM allocations (struct gpu_alloc) with their peer-memory pins and
	 * dma-bufs. Never held while a free callback runs; taken before a
	 * dma-buf's reservation lock.
	 */
	struct mutex alloc_lock;
	struct list_head allocs;
	struct list_head retained;	/* revoked allocations whose VRAM pins still hold */
	u32 next_handle;
	bool allocs_closed;		/* remove started: no new allocations */
	struct p2pdma_provider *provider;	/* BAR2 for dma-buf mappings */
	atomic_t p2p_revocations;	/* free callbacks run */
	atomic_t dmabuf_revocations;	/* dma-bufs invalidated by a revoke */
	atomic_t dmabuf_pins;		/* dma-buf attachments pinned now */
	atomic_t p2p_pins;		/* page tables of both APIs not yet freed */
	atomic_t p2p_maps;		/* their DMA mappings not yet freed */
	atomic_t p2p_bus_addr_maps;	/* mappings made with PCI bus addresses */
	/* The board's UUID, for NVIDIA's page tables: stable per PCI location. */
	u8 uuid[NVIDIA_P2P_GPU_UUID_LEN];

	/* Recovery counters, in sysfs. */
	atomic_t engine_resets;		/* hung engine stopped and restarted */
	atomic_t irq_recoveries;	/* fences found by polling, no interrupt */
	u32 vram_errors_seen;		/* REG_VRAM_ERR_COUNT last logged (irq handler) */
};

struct gpu_file {
	struct list_head node;
	struct file *filp;
	struct p2plab_gpu *gpu;
};

static bool gpu_stopping(struct p2plab_gpu *gpu)
{
	return READ_ONCE(gpu->removing) || READ_ONCE(gpu->broken) || READ_ONCE(gpu->resetting);
}

/* Why a waiter gave up: the job was cancelled, or the device is gone. */
static int stopping_error(struct p2plab_gpu *gpu)
{
	return READ_ONCE(gpu->resetting) && !READ_ONCE(gpu->removing) ? -ECANCELED : -ENODEV;
}

/* ---- DMA memory of jobs ---- */

static struct gpu_job_ctx *ctx_alloc(struct p2plab_gpu *gpu, size_t bounce)
{
	struct gpu_job_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);

	if (!ctx)
		return NULL;
	INIT_LIST_HEAD(&ctx->node);
	ctx->record = dma_pool_zalloc(gpu->record_pool, GFP_KERNEL, &ctx->record_dma);
	if (!ctx->record)
		goto err_ctx;
	if (bounce) {
		ctx->bounce = dma_alloc_coherent(&gpu->pdev->dev, bounce, &ctx->bounce_dma,
						 GFP_KERNEL);
		if (!ctx->bounce)
			goto err_record;
		ctx->bounce_size = bounce;
	}
	return ctx;

err_record:
	dma_pool_free(gpu->record_pool, ctx->record, ctx->record_dma);
err_ctx:
	kfree(ctx);
	return NULL;
}

static void ctx_free(struct p2plab_gpu *gpu, struct gpu_job_ctx *ctx)
{
	if (ctx->bounce)
		dma_free_coherent(&gpu->pdev->dev, ctx->bounce_size, ctx->bounce,
				  ctx->bounce_dma);
	dma_pool_free(gpu->record_pool, ctx->record, ctx->record_dma);
	kfree(ctx);
}

/*
 * A waiter gave up on a command the device may still execute: keep its
 * memory until the command retires (or the engine is stopped at remove).
 */
static void ctx_abandon(struct p2plab_gpu *gpu, struct gpu_job_ctx *ctx)
{
	spin_lock(&gpu->zombie_lock);
	list_add_tail(&ctx->node, &gpu->zombies);
	spin_unlock(&gpu->zombie_lock);
}

/* Frees abandoned contexts whose command retired, or all with @all. */
static void reap_zombies(struct p2plab_gpu *gpu, bool all)
{
	u64 done = atomic64_read(&gpu->completed_fence);
	struct gpu_job_ctx *ctx, *tmp;
	LIST_HEAD(dead);

	spin_lock(&gpu->zombie_lock);
	list_for_each_entry_safe(ctx, tmp, &gpu->zombies, node)
		if (all || ctx->fence <= done)
			list_move_tail(&ctx->node, &dead);
	spin_unlock(&gpu->zombie_lock);

	list_for_each_entry_safe(ctx, tmp, &dead, node) {
		list_del(&ctx->node);
		ctx_free(gpu, ctx);
	}
}

/* ---- engine ---- */

/* Fences only move forward, whichever reader of REG_FENCE stores last. */
static void fence_advance(struct p2plab_gpu *gpu, u64 fence)
{
	s64 old = atomic64_read(&gpu->completed_fence);

	while ((u64)old < fence &&
	       !atomic64_try_cmpxchg(&gpu->completed_fence, &old, (s64)fence))
		;
}

static irqreturn_t p2plab_gpu_irq(int irq, void *data)
{
	struct p2plab_gpu *gpu = data;
	u32 cause = p2plab_pci_irq_ack(gpu->regs, REG_INT_STATUS);

	if (!cause)
		return IRQ_NONE;
	fence_advance(gpu, readq(gpu->regs + REG_FENCE));
	if (cause & INT_ERROR) {
		u32 status = readl(gpu->regs + REG_STATUS);
		u32 error = readl(gpu->regs + REG_ENGINE_ERROR);

		if (status & STATUS_HALTED) {
			WRITE_ONCE(gpu->broken, true);
			dev_err(&gpu->pdev->dev, "engine halted, error %#x; rebind the driver\n",
				error);
		} else if (error == HW_ERR_VRAM_IO &&
			   readl(gpu->regs + REG_VRAM_ERR_COUNT) != gpu->vram_errors_seen) {
			/* The device reported a bad VRAM range, not just any VRAM_IO. */
			gpu->vram_errors_seen = readl(gpu->regs + REG_VRAM_ERR_COUNT);
			dev_err_ratelimited(&gpu->pdev->dev,
					    "VRAM error at offset %#llx (%u so far)\n",
					    readq(gpu->regs + REG_VRAM_ERR_ADDR),
					    gpu->vram_errors_seen);
		} else {
			dev_dbg(&gpu->pdev->dev, "command failed, error %#x\n", error);
		}
	}
	wake_up_all(&gpu->wq);
	return IRQ_HANDLED;
}

static bool ring_has_space(struct p2plab_gpu *gpu)
{
	return gpu->submitted_fence - atomic64_read(&gpu->completed_fence) <
	       gpu->ring_entries - 1;
}

/*
 * What a waiter sleeps on: the fence as the interrupt handler (or a poll
 * of REG_FENCE) reported it. Not the record, so that a job whose interrupt
 * was lost is only found by the poll, and counted.
 */
static bool ctx_fence_reached(struct p2plab_gpu *gpu, struct gpu_job_ctx *ctx)
{
	return atomic64_read(&gpu->completed_fence) >= ctx->fence;
}

static bool ctx_retired(struct p2plab_gpu *gpu, struct gpu_job_ctx *ctx)
{
	return atomic64_read(&gpu->completed_fence) >= ctx->fence ||
	       le64_to_cpu(READ_ONCE(ctx->record->fence)) == ctx->fence;
}

/* The result of one device command. */
struct cmd_result {
	u64 fence;
	u32 status;
	u32 result;
};

/*
 * Puts one command on the ring and waits for it. Caller holds hw_lock for
 * reading. On success (return 0, whatever the device status) the context
 * is free to reuse. On -ETIMEDOUT, -EINTR or -ENODEV after submission the
 * context now belongs to the zombie list and *ctxp is cleared.
 */
static int submit_and_wait(struct p2plab_gpu *gpu, struct gpu_job_ctx **ctxp, u8 opcode,
			   u64 src, u64 dst, u64 len, u32 pattern, long *timeout,
			   struct cmd_result *res)
{
	struct gpu_job_ctx *ctx = *ctxp;
	struct p2plab_gpu_hw_cmd *slot;
	long left;
	int ret;

	if (mutex_lock_interruptible(&gpu->submit_lock))
		return -EINTR;
	left = wait_event_interruptible_timeout(gpu->wq,
						ring_has_space(gpu) || gpu_stopping(gpu),
						*timeout);
	if (left <= 0 || gpu_stopping(gpu)) {
		mutex_unlock(&gpu->submit_lock);
		if (gpu_stopping(gpu))
			return stopping_error(gpu);
		return left == 0 ? -ETIMEDOUT : -EINTR;
	}
	*timeout = left;

	ctx->fence = ++gpu->submitted_fence;
	WRITE_ONCE(ctx->record->fence, 0);
	slot = &gpu->ring[gpu->tail];
	memset(slot, 0, sizeof(*slot));
	slot->opcode = opcode;
	slot->flags = CMD_FLAG_IRQ | CMD_FLAG_COMPLETION;
	slot->pattern = cpu_to_le32(pattern);
	slot->fence = cpu_to_le64(ctx->fence);
	slot->src = cpu_to_le64(src);
	slot->dst = cpu_to_le64(dst);
	slot->len = cpu_to_le64(len);
	slot->completion_addr = cpu_to_le64(ctx->record_dma);
	gpu->tail = (gpu->tail + 1) & (gpu->ring_entries - 1);
	/* writel orders the ring entry before the doorbell. */
	writel(gpu->tail, gpu->regs + REG_DOORBELL);
	mutex_unlock(&gpu->submit_lock);
	res->fence = ctx->fence;

	left = *timeout;
	while (left > 0) {
		long slice = min_t(long, left, msecs_to_jiffies(FENCE_POLL_MS));
		long got = wait_event_interruptible_timeout(gpu->wq,
							    ctx_fence_reached(gpu, ctx) ||
							    gpu_stopping(gpu), slice);
		u64 fence;

		if (got < 0) {
			left = got;
			break;
		}
		if (got > 0) {
			left -= slice - got;
			left = max(left, 1L);
			break;
		}
		left -= slice;
		if (gpu_stopping(gpu))
			break;
		/* No wake-up within a poll: look at the device itself. */
		fence = readq(gpu->regs + REG_FENCE);
		if (fence != ~0ull && fence >= ctx->fence) {
			atomic_inc(&gpu->irq_recoveries);
			dev_warn_ratelimited(&gpu->pdev->dev,
					     "fence %llu retired without an interrupt; recovered by polling\n",
					     ctx->fence);
			fence_advance(gpu, fence);
			left = max(left, 1L);
			break;
		}
	}
	if (!ctx_retired(gpu, ctx)) {
		if (gpu_stopping(gpu))
			ret = stopping_error(gpu);
		else
			ret = left < 0 ? -EINTR : -ETIMEDOUT;
		ctx_abandon(gpu, ctx);
		*ctxp = NULL;
		return ret;
	}
	*timeout = max(left, 1L);
	dma_rmb();	/* read the record after seeing it complete */
	if (le64_to_cpu(READ_ONCE(ctx->record->fence)) != ctx->fence) {
		/* Retired, but the device could not write the record. */
		res->status = HW_ERR_COMPLETION_WRITE;
		res->result = 0;
	} else {
		res->status = le32_to_cpu(ctx->record->status);
		res->result = le32_to_cpu(ctx->record->result);
	}
	return 0;
}

static bool vram_range_ok(struct p2plab_gpu *gpu, u64 off, u64 len)
{
	return off <= gpu->vram_size && len <= gpu->vram_size - off;
}

/* A user-pointer copy, in bounce-buffer-sized device commands. */
static int run_user_copy(struct p2plab_gpu *gpu, struct p2plab_gpu_job *job, long *timeout,
			 struct cmd_result *res)
{
	bool to_vram = job->op == P2PLAB_GPU_OP_COPY_TO_VRAM;
	u64 user = to_vram ? job->src : job->dst;
	u64 vram = to_vram ? job->dst : job->src;
	struct gpu_job_ctx *ctx;
	u64 done = 0;
	int ret = 0;

	if (!job->len)
		return 0;
	if (user + job->len < user)
		return -EFAULT;
	ctx = ctx_alloc(gpu, min_t(u64, job->len, BOUNCE_SIZE));
	if (!ctx)
		return -ENOMEM;
	while (done < job->len) {
		size_t n = min_t(u64, job->len - done, ctx->bounce_size);
		void __user *uptr = u64_to_user_ptr(user + done);

		if (to_vram && copy_from_user(ctx->bounce, uptr, n)) {
			ret = -EFAULT;
			break;
		}
		if (to_vram)
			ret = submit_and_wait(gpu, &ctx, OP_COPY_TO_VRAM, ctx->bounce_dma,
					      vram + done, n, 0, timeout, res);
		else
			ret = submit_and_wait(gpu, &ctx, OP_COPY_FROM_VRAM, vram + done,
					      ctx->bounce_dma, n, 0, timeout, res);
		if (ret || res->status)
			break;
		if (!to_vram && copy_to_user(uptr, ctx->bounce, n)) {
			ret = -EFAULT;
			break;
		}
		done += n;
		if (fatal_signal_pending(current)) {
			ret = -EINTR;
			break;
		}
	}
	if (ctx)
		ctx_free(gpu, ctx);
	return ret;
}

static int run_job(struct p2plab_gpu *gpu, struct p2plab_gpu_job *job, struct cmd_result *res)
{
	bool unchecked = job->flags & P2PLAB_GPU_JOB_UNCHECKED;
	long timeout = msecs_to_jiffies(job->timeout_ms ?: DEFAULT_TIMEOUT_MS);
	struct gpu_job_ctx *ctx;
	u64 src = job->src, dst = job->dst;
	bool ok = true;
	int ret;

	if (unchecked) {
		/* Anything goes to the device, which must cope (root only). */
		if (job->op > 0xff)
			return -EINVAL;
		goto submit;
	}
	switch (job->op) {
	case P2PLAB_GPU_OP_NOP:
		break;
	case P2PLAB_GPU_OP_COPY_TO_VRAM:
		ok = vram_range_ok(gpu, job->dst, job->len);
		break;
	case P2PLAB_GPU_OP_COPY_FROM_VRAM:
	case P2PLAB_GPU_OP_CHECKSUM:
		ok = vram_range_ok(gpu, job->src, job->len);
		break;
	case P2PLAB_GPU_OP_COPY_VRAM:
		ok = vram_range_ok(gpu, job->src, job->len) &&
		     vram_range_ok(gpu, job->dst, job->len);
		break;
	case P2PLAB_GPU_OP_FILL:
		ok = vram_range_ok(gpu, job->dst, job->len);
		break;
	default:
		return -EINVAL;
	}
	if (!ok || (job->op != P2PLAB_GPU_OP_FILL && job->pattern))
		return -EINVAL;

submit:
	if ((job->op == P2PLAB_GPU_OP_COPY_TO_VRAM || job->op == P2PLAB_GPU_OP_COPY_FROM_VRAM) &&
	    !(job->flags & P2PLAB_GPU_JOB_BUS_ADDR))
		return run_user_copy(gpu, job, &timeout, res);

	ctx = ctx_alloc(gpu, 0);
	if (!ctx)
		return -ENOMEM;
	ret = submit_and_wait(gpu, &ctx, (u8)job->op, src, dst, job->len, job->pattern,
			      &timeout, res);
	if (ctx)
		ctx_free(gpu, ctx);
	return ret;
}

static bool engine_stop(struct p2plab_gpu *gpu);
static int engine_start(struct p2plab_gpu *gpu);

/*
 * A job timed out: the engine is wedged (or far too slow). Stop it, which
 * abandons whatever it holds, free the abandoned jobs' memory and start a
 * fresh ring. Jobs other threads still wait on end with ETIMEDOUT on their
 * own; they were never retired. If the engine does not stop, the device
 * is marked broken (rebind to recover).
 */
static void engine_recover(struct p2plab_gpu *gpu, u64 hung_fence)
{
	u32 status;

	down_write(&gpu->hw_lock);
	if (gpu->dead || READ_ONCE(gpu->broken) ||
	    atomic64_read(&gpu->completed_fence) >= hung_fence) {
		/* Gone, beyond help, or another recovery (or the job) got there. */
		up_write(&gpu->hw_lock);
		return;
	}
	status = readl(gpu->regs + REG_STATUS);
	dev_warn(&gpu->pdev->dev,
		 "job fence %llu timed out (status %#x, device fence %llu); resetting the engine\n",
		 hung_fence, status, readq(gpu->regs + REG_FENCE));
	if (engine_stop(gpu)) {
		reap_zombies(gpu, true);
		if (engine_start(gpu))
			WRITE_ONCE(gpu->broken, true);
	} else {
		WRITE_ONCE(gpu->broken, true);
	}
	if (READ_ONCE(gpu->broken)) {
		dev_err(&gpu->pdev->dev, "engine reset failed; rebind the driver\n");
	} else {
		atomic_inc(&gpu->engine_resets);
		dev_info(&gpu->pdev->dev, "engine reset done (%d so far)\n",
			 atomic_read(&gpu->engine_resets));
	}
	up_write(&gpu->hw_lock);
	wake_up_all(&gpu->wq);
}

/* ---- file operations ---- */

static long ioctl_submit(struct p2plab_gpu *gpu, struct p2plab_gpu_job __user *ujob)
{
	struct cmd_result res = { 0 };
	struct p2plab_gpu_job job;
	int ret;

	if (copy_from_user(&job, ujob, sizeof(job)))
		return -EFAULT;
	if (job.flags & ~P2PLAB_GPU_JOB_FLAGS)
		return -EINVAL;
	if ((job.flags & P2PLAB_GPU_JOB_UNCHECKED) && !capable(CAP_SYS_ADMIN))
		return -EPERM;
	if (job.flags & P2PLAB_GPU_JOB_BUS_ADDR) {
		if (!capable(CAP_SYS_RAWIO))
			return -EPERM;
		if (job.op != P2PLAB_GPU_OP_COPY_TO_VRAM && job.op != P2PLAB_GPU_OP_COPY_FROM_VRAM)
			return -EINVAL;
	}

	down_read(&gpu->hw_lock);
	if (gpu->dead || READ_ONCE(gpu->broken)) {
		up_read(&gpu->hw_lock);
		return -ENODEV;
	}
	reap_zombies(gpu, false);
	ret = run_job(gpu, &job, &res);
	up_read(&gpu->hw_lock);
	if (ret == -ETIMEDOUT && res.fence)
		engine_recover(gpu, res.fence);

	job.fence = res.fence;
	job.status = res.status;
	job.result = res.result;
	if (res.fence && copy_to_user(ujob, &job, sizeof(job)))
		return -EFAULT;
	if (ret)
		return ret;
	return res.status ? -EIO : 0;
}

static long ioctl_info(struct p2plab_gpu *gpu, struct p2plab_gpu_info __user *uinfo)
{
	struct p2plab_gpu_info info;

	memset(&info, 0, sizeof(info));
	down_read(&gpu->hw_lock);
	if (gpu->dead) {
		up_read(&gpu->hw_lock);
		return -ENODEV;
	}
	info.version = readl(gpu->regs + REG_VERSION);
	info.vendor_id = gpu->pdev->vendor;
	info.device_id = gpu->pdev->device;
	info.vram_size = gpu->vram_size;
	info.vram_bus_addr = gpu->vram_bus;
	info.ring_entries = gpu->ring_entries;
	info.status = readl(gpu->regs + REG_STATUS);
	info.completed_fence = atomic64_read(&gpu->completed_fence);
	info.submitted_fence = READ_ONCE(gpu->submitted_fence);
	info.jobs_completed = readl(gpu->regs + REG_JOBS_COMPLETED);
	info.jobs_failed = readl(gpu->regs + REG_JOBS_FAILED);
	info.engine_error = readl(gpu->regs + REG_ENGINE_ERROR);
	info.flags = (gpu->p2pmem ? P2PLAB_GPU_INFO_P2PMEM : 0) |
		     (gpu->msix ? P2PLAB_GPU_INFO_MSIX : 0) |
		     (READ_ONCE(gpu->broken) ? P2PLAB_GPU_INFO_BROKEN : 0);
	strscpy(info.pci_name, pci_name(gpu->pdev), sizeof(info.pci_name));
	up_read(&gpu->hw_lock);

	return copy_to_user(uinfo, &info, sizeof(info)) ? -EFAULT : 0;
}

/* ---- VRAM allocations, the peer-memory APIs and dma-buf export ---- */

MODULE_IMPORT_NS("DMA_BUF");

static const struct file_operations p2plab_gpu_fops;

/*
 * A VRAM allocation. The owning file's reference is dropped when it is
 * freed; pins and dma-bufs hold their own. The VRAM itself goes back to
 * the p2pmem pool at revocation, after every importer was told, or, when
 * persistent pins (nvidia_p2p_get_pages_persistent) hold it, when the last
 * of them is put or a reset or unbind tears them down.
 */
struct gpu_alloc {
	struct kref ref;
	struct list_head node;		/* gpu->allocs while owned, under alloc_lock */
	struct list_head retained;	/* gpu->retained: revoked, VRAM held by pins */
	struct p2plab_gpu *gpu;		/* holds a reference on gpu->dev */
	struct gpu_file *owner;		/* NULL once freed by its owner */
	u32 handle;
	u64 offset;			/* in VRAM, a multiple of GPU_PAGE_SIZE */
	u64 size;			/* a multiple of GPU_PAGE_SIZE */
	void *p2p_va;			/* p2pmem address of offset; NULL once given back */
	void *pool_va;			/* what pci_alloc_p2pmem returned, */
	size_t pool_size;		/* and for how many bytes */
	bool revoked;			/* under alloc_lock */
	struct list_head pins;		/* struct gpu_pin, under alloc_lock */
	struct list_head dmabufs;	/* struct gpu_dmabuf, under alloc_lock */
	/*
	 * dma-buf attachments pinned (dma_buf_pin) on this allocation's
	 * dma-bufs. Changed under a dma-buf's reservation lock, which ranks
	 * below alloc_lock, so it is atomic: alloc_revoke reads it after it
	 * marked every dma-buf revoked (no pin can come after that), and the
	 * last unpin's detach gives revoked VRAM back (alloc_vram_if_idle).
	 */
	atomic_t dmabuf_pins;
};

/* Which API made a pin, and so what its page table looks like. */
enum gpu_pin_kind {
	PIN_P2PLAB,			/* p2plab_p2p_get_pages: 4 KiB pages */
	PIN_NV,				/* nvidia_p2p_get_pages: 64 KiB pages */
	PIN_NV_PERSISTENT,		/* nvidia_p2p_get_pages_persistent */
};

/* Where an NVIDIA pin is in its life (under nv_lock). */
enum nv_pin_state {
	NV_LIVE,
	NV_REVOKING,			/* its free callback runs */
	NV_DONE,			/* off nv_pins; the last waiter frees it */
};

/*
 * One pinned range of an allocation. The page table the importer sees is
 * the first member; which one depends on the kind.
 */
struct gpu_pin {
	union {
		struct p2plab_p2p_page_table pt;	/* PIN_P2PLAB */
		struct nvidia_p2p_page_table nv;	/* PIN_NV, PIN_NV_PERSISTENT */
	};
	enum gpu_pin_kind kind;
	struct list_head node;		/* alloc->pins until put or revoked */
	struct gpu_alloc *alloc;	/* reference */
	u64 offset;			/* VRAM offset of the first byte */
	u64 len;
	/* Called at revocation; NULL for a persistent pin. */
	void (*free_callback)(void *data);
	void *data;
	bool revoked;			/* under alloc_lock */
	struct list_head maps;		/* struct gpu_p2p_map, under alloc_lock */

	/* NVIDIA API only, under nv_lock. */
	struct list_head nv_node;	/* nv_pins until NV_DONE */
	enum nv_pin_state nv_state;
	unsigned int nv_waiters;	/* put_pages waiting for the callback */
	struct task_struct *nv_callback_task;
	void (*nv_callback)(void *data);	/* the importer's */
	void *nv_data;
	u64 nv_va;
	u32 nv_flags;			/* of get_pages_persistent */
	struct nvidia_p2p_page *nv_page_array;	/* [entries], nv.pages points here */
	u8 nv_uuid[NVIDIA_P2P_GPU_UUID_LEN];
};

/* A DMA mapping of a pin for one peer; the importer's view comes first. */
struct gpu_p2p_map {
	union {
		struct p2plab_p2p_dma_mapping map;	/* PIN_P2PLAB */
		struct nvidia_p2p_dma_mapping nv;	/* the NVIDIA kinds */
	};
	struct list_head node;		/* pin->maps until released, under alloc_lock */
	struct gpu_pin *pin;
	struct pci_dev *peer;		/* reference */
	struct sg_table sgt;
	dma_addr_t *dma;		/* [pin->len / PAGE_SIZE] */
	u32 map_type;			/* enum pci_p2pdma_map_type */
	bool mapped;			/* sgt is DMA-mapped (under alloc_lock) */
	bool torn_down;			/* unmapped under the importer (under alloc_lock) */
};

struct gpu_dmabuf {
	struct dma_buf *dmabuf;
	struct gpu_alloc *alloc;	/* reference */
	struct list_head node;		/* alloc->dmabufs, under alloc_lock */
	struct phys_vec range;
	struct p2pdma_provider *provider;
	bool revoked;			/* under the dma-buf's reservation lock */
	unsigned int pins;		/* pinned attachments, under the reservation lock */
};

static void alloc_release(struct kref *ref)
{
	struct gpu_alloc *a = container_of(ref, struct gpu_alloc, ref);

	WARN_ON(a->pool_va);
	put_device(&a->gpu->dev);
	kfree(a);
}

static void alloc_put(struct gpu_alloc *a)
{
	kref_put(&a->ref, alloc_release);
}

/* Under alloc_lock: takes @a's VRAM for pci_free_p2pmem (NULL if none). */
static void *alloc_take_vram(struct gpu_alloc *a, size_t *size)
{
	void *va = a->pool_va;

	*size = a->pool_size;
	a->p2p_va = NULL;
	a->pool_va = NULL;
	return va;
}

/*
 * Under alloc_lock: a reset or unbind takes the VRAM of a persistent pin.
 * Its DMA mappings are unmapped now, while the pages still exist; the
 * importer, which has no callback to hear it, still owns the table and
 * the mappings and releases them with put_pages_persistent.
 */
static void pin_tear_down(struct gpu_pin *pin)
{
	struct gpu_p2p_map *m;

	list_for_each_entry(m, &pin->maps, node) {
		if (m->mapped)
			dma_unmap_sgtable(&m->peer->dev, &m->sgt, DMA_BIDIRECTIONAL,
					  DMA_ATTR_SKIP_CPU_SYNC);
		m->mapped = false;
		m->torn_down = true;
	}
}

/* Why an allocation is revoked, which decides what its pins keep. */
enum revoke_mode {
	REVOKE_FREE,		/* FREE, the owner's close */
	REVOKE_RESET,		/* a function reset */
	REVOKE_UNBIND,		/* the driver lets go of the device */
};

/* Under alloc_lock: does anything still hold @a's VRAM? */
static bool alloc_vram_held(struct gpu_alloc *a)
{
	return !list_empty(&a->pins) || atomic_read(&a->dmabuf_pins);
}

/*
 * Takes @a out of service: every pinned page table gets its free callback,
 * every dma-buf is invalidated (dynamic importers unmap), user mappings of
 * the range are zapped, and only then does the VRAM go back to the pool.
 *
 * Pins that cannot be told keep the VRAM (the allocation waits on
 * gpu->retained): persistent peer-memory pins, and pinned dma-buf
 * attachments (dma_buf_pin, e.g. an RDMA MR from
 * ib_umem_dmabuf_get_pinned), as amdgpu keeps a pinned BO's VRAM and
 * habanalabs exported memory. A reset loses the persistent pins' mappings
 * (torn down with a warning: nobody can be told) but not the VRAM under a
 * pinned dma-buf, which the importer's device may still reach: it goes
 * back when the last such attachment is unpinned and detached. Unbind
 * takes everything, since the BAR itself goes away. Idempotent; sleeps.
 */
static void alloc_revoke(struct gpu_alloc *a, enum revoke_mode mode, const char *why)
{
	bool hard = mode != REVOKE_FREE;
	unsigned int dmabuf_pins = 0;
	struct p2plab_gpu *gpu = a->gpu;
	struct gpu_pin *pin, *tmp;
	struct gpu_dmabuf *db;
	struct gpu_file *gf;
	unsigned int torn = 0;
	bool first, drop = false;
	size_t size = 0;
	LIST_HEAD(pins);
	void *va = NULL;

	mutex_lock(&gpu->alloc_lock);
	if (a->revoked && !(hard && a->p2p_va)) {
		mutex_unlock(&gpu->alloc_lock);
		return;
	}
	first = !a->revoked;
	a->revoked = true;
	list_for_each_entry_safe(pin, tmp, &a->pins, node) {
		if (pin->free_callback) {
			list_move_tail(&pin->node, &pins);
			pin->revoked = true;
		} else if (hard) {
			list_del_init(&pin->node);
			pin->revoked = true;
			pin_tear_down(pin);
			torn++;
		}
	}
	list_for_each_entry(db, &a->dmabufs, node) {
		/* Told once; a dma-buf being released has no importers left. */
		if (!first || !get_file_active(&db->dmabuf->file))
			continue;
		dma_resv_lock(db->dmabuf->resv, NULL);
		db->revoked = true;
		dma_buf_invalidate_mappings(db->dmabuf);
		dma_resv_unlock(db->dmabuf->resv);
		atomic_inc(&gpu->dmabuf_revocations);
		fput(db->dmabuf->file);
	}
	/* Every dma-buf is marked revoked now: no new pin can come. */
	dmabuf_pins = atomic_read(&a->dmabuf_pins);
	if (!a->p2p_va) {
		/* Given back already. */
	} else if (list_empty(&a->pins) && (mode == REVOKE_UNBIND || !dmabuf_pins)) {
		va = alloc_take_vram(a, &size);
		if (!list_empty(&a->retained)) {
			list_del_init(&a->retained);
			drop = true;	/* gpu->retained's reference */
		}
	} else if (list_empty(&a->retained)) {
		kref_get(&a->ref);
		list_add_tail(&a->retained, &gpu->retained);
	}
	mutex_unlock(&gpu->alloc_lock);

	if (torn)
		dev_warn(&gpu->pdev->dev,
			 "%s took VRAM %#llx+%#llx from %u persistent peer-memory pin(s): no callback to tell their importer, whose DMA addresses are now stale\n",
			 why, a->offset, a->size, torn);
	if (va && dmabuf_pins)
		dev_warn(&gpu->pdev->dev,
			 "%s took VRAM %#llx+%#llx from %u pinned dma-buf attachment(s)\n",
			 why, a->offset, a->size, dmabuf_pins);
	else if (dmabuf_pins && first)
		dev_info(&gpu->pdev->dev,
			 "%s: VRAM %#llx+%#llx stays allocated while %u dma-buf attachment(s) pin it\n",
			 why, a->offset, a->size, dmabuf_pins);

	/* No lock held: the callbacks may sleep and call back into us. */
	list_for_each_entry_safe(pin, tmp, &pins, node) {
		list_del_init(&pin->node);
		atomic_inc(&gpu->p2p_revocations);
		/* The callback (and whoever it tells) frees the table. */
		pin->free_callback(pin->data);
	}

	if (first) {
		mutex_lock(&gpu->files_lock);
		list_for_each_entry(gf, &gpu->files, node)
			unmap_mapping_range(gf->filp->f_mapping, a->offset, a->size, 1);
		mutex_unlock(&gpu->files_lock);
	}

	if (va)
		pci_free_p2pmem(gpu->pdev, va, size);
	if (drop)
		alloc_put(a);
}

/*
 * Revokes every allocation, and tears down the persistent pins of freed
 * ones (reset, unbind); owners keep their handles.
 */
static void revoke_all_allocs(struct p2plab_gpu *gpu, enum revoke_mode mode, const char *why)
{
	struct gpu_alloc *a;

	for (;;) {
		struct gpu_alloc *found = NULL;

		mutex_lock(&gpu->alloc_lock);
		list_for_each_entry(a, &gpu->allocs, node) {
			if (!a->revoked) {
				found = a;
				break;
			}
		}
		/*
		 * Retained ones with something left to take: persistent pins
		 * (torn down by both), or the VRAM itself at unbind. One that
		 * only pinned dma-bufs hold keeps its VRAM over a reset.
		 */
		if (!found) {
			list_for_each_entry(a, &gpu->retained, retained) {
				if (a->p2p_va &&
				    (!list_empty(&a->pins) || mode == REVOKE_UNBIND)) {
					found = a;
					break;
				}
			}
		}
		if (found)
			kref_get(&found->ref);
		mutex_unlock(&gpu->alloc_lock);
		if (!found)
			return;
		alloc_revoke(found, mode, why);
		alloc_put(found);
	}
}

/* VRAM offset of a p2pmem address of the GPU. */
static u64 p2pmem_offset(struct p2plab_gpu *gpu, void *va)
{
	return pci_p2pmem_virt_to_bus(gpu->pdev, va) - gpu->vram_bus;
}

/*
 * Under alloc_lock: @size bytes of VRAM for @a at a GPU_PAGE_SIZE-aligned
 * offset. Our own allocations keep the pool aligned; a foreign user of the
 * published p2pmem (sysfs p2pmem/allocate) may not, so a misaligned block
 * is traded for one a GPU page larger, aligned inside.
 */
static int alloc_vram(struct p2plab_gpu *gpu, struct gpu_alloc *a, u64 size)
{
	size_t pool = size;
	void *va = pci_alloc_p2pmem(gpu->pdev, pool);
	u64 off;

	if (va && !IS_ALIGNED(p2pmem_offset(gpu, va), GPU_PAGE_SIZE)) {
		pci_free_p2pmem(gpu->pdev, va, pool);
		pool = size + GPU_PAGE_SIZE - PAGE_SIZE;
		va = pci_alloc_p2pmem(gpu->pdev, pool);
	}
	if (!va)
		return -ENOMEM;
	off = p2pmem_offset(gpu, va);
	a->pool_va = va;
	a->pool_size = pool;
	a->offset = ALIGN(off, GPU_PAGE_SIZE);
	a->p2p_va = va + (a->offset - off);
	return 0;
}

static long ioctl_alloc(struct gpu_file *gf, struct p2plab_gpu_alloc __user *uarg)
{
	struct p2plab_gpu *gpu = gf->gpu;
	struct p2plab_gpu_alloc arg;
	struct gpu_alloc *a;
	u64 size;
	int ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (!arg.size || arg.size > gpu->vram_size || arg.pad)
		return -EINVAL;
	size = ALIGN(arg.size, GPU_PAGE_SIZE);
	if (!gpu->p2pmem || !gpu->provider)
		return -ENODEV;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	kref_init(&a->ref);
	INIT_LIST_HEAD(&a->pins);
	INIT_LIST_HEAD(&a->dmabufs);
	INIT_LIST_HEAD(&a->retained);
	a->gpu = gpu;
	get_device(&gpu->dev);
	a->size = size;

	mutex_lock(&gpu->alloc_lock);
	if (gpu->allocs_closed || READ_ONCE(gpu->resetting)) {
		ret = -ENODEV;
		goto err_unlock;
	}
	ret = alloc_vram(gpu, a, size);
	if (ret)
		goto err_unlock;
	a->owner = gf;
	a->handle = ++gpu->next_handle ?: ++gpu->next_handle;
	list_add_tail(&a->node, &gpu->allocs);
	arg.size = size;
	arg.vram_offset = a->offset;
	arg.handle = a->handle;
	mutex_unlock(&gpu->alloc_lock);

	if (copy_to_user(uarg, &arg, sizeof(arg))) {
		/* Nobody saw the handle: undo. */
		mutex_lock(&gpu->alloc_lock);
		list_del(&a->node);
		a->owner = NULL;
		mutex_unlock(&gpu->alloc_lock);
		alloc_revoke(a, REVOKE_FREE, "ALLOC");
		alloc_put(a);
		return -EFAULT;
	}
	return 0;

err_unlock:
	mutex_unlock(&gpu->alloc_lock);
	alloc_put(a);
	return ret;
}

/* The owner's allocation @handle, with a reference; NULL if none. */
static struct gpu_alloc *alloc_find(struct gpu_file *gf, u32 handle, bool unlink)
{
	struct p2plab_gpu *gpu = gf->gpu;
	struct gpu_alloc *a, *found = NULL;

	mutex_lock(&gpu->alloc_lock);
	list_for_each_entry(a, &gpu->allocs, node) {
		if (a->owner == gf && a->handle == handle) {
			found = a;
			if (unlink) {
				/* The owner's reference moves to the caller. */
				list_del(&a->node);
				a->owner = NULL;
			} else {
				kref_get(&a->ref);
			}
			break;
		}
	}
	mutex_unlock(&gpu->alloc_lock);
	return found;
}

static long ioctl_free(struct gpu_file *gf, u32 __user *uhandle)
{
	struct gpu_alloc *a;
	u32 handle;

	if (get_user(handle, uhandle))
		return -EFAULT;
	a = alloc_find(gf, handle, true);
	if (!a)
		return -ENOENT;
	alloc_revoke(a, REVOKE_FREE, "FREE");
	alloc_put(a);
	return 0;
}

/* At the last close of a file: free what it still owns. */
static void free_file_allocs(struct gpu_file *gf)
{
	struct p2plab_gpu *gpu = gf->gpu;

	for (;;) {
		struct gpu_alloc *a, *found = NULL;

		mutex_lock(&gpu->alloc_lock);
		list_for_each_entry(a, &gpu->allocs, node) {
			if (a->owner == gf) {
				list_del(&a->node);
				a->owner = NULL;
				found = a;
				break;
			}
		}
		mutex_unlock(&gpu->alloc_lock);
		if (!found)
			return;
		alloc_revoke(found, REVOKE_FREE, "close");
		alloc_put(found);
	}
}

/* -- pins and DMA mappings, what both peer-memory APIs are made of -- */

/* Under alloc_lock: the kind's page table, now that the offset is known. */
static void pin_fill(struct gpu_pin *pin, struct p2plab_gpu *gpu)
{
	u64 phys = gpu->vram_phys + pin->offset;
	u32 i;

	if (pin->kind == PIN_P2PLAB) {
		for (i = 0; i < pin->pt.entries; i++)
			pin->pt.phys[i] = phys + ((u64)i << PAGE_SHIFT);
		pin->pt.vram_offset = pin->offset;
		pin->pt.gpu = gpu->pdev;
	} else {
		for (i = 0; i < pin->nv.entries; i++)
			pin->nv_page_array[i].physical_address = phys + (u64)i * GPU_PAGE_SIZE;
		memcpy(pin->nv_uuid, gpu->uuid, sizeof(pin->nv_uuid));
	}
}

/*
 * Pins [@user_va, @user_va + pin->len) of the caller: it must lie in one
 * mmap of /dev/p2plab-gpuN and in one live allocation. @pin comes with its
 * kind, length, callback and table arrays; from here on a revocation may
 * call its callback. -EFAULT: not such memory; -ENODEV: the GPU is going.
 */
static int pin_register(struct gpu_pin *pin, u64 user_va)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct gpu_alloc *a, *alloc = NULL;
	struct file *file = NULL;
	struct p2plab_gpu *gpu;
	u64 offset = 0;
	int ret = 0;

	if (!mm)
		return -EFAULT;
	mmap_read_lock(mm);
	vma = vma_lookup(mm, user_va);
	if (vma && vma->vm_file && vma->vm_file->f_op == &p2plab_gpu_fops &&
	    user_va + pin->len <= vma->vm_end) {
		file = get_file(vma->vm_file);
		offset = ((u64)vma->vm_pgoff << PAGE_SHIFT) + (user_va - vma->vm_start);
	}
	mmap_read_unlock(mm);
	if (!file)
		return -EFAULT;
	gpu = ((struct gpu_file *)file->private_data)->gpu;

	mutex_lock(&gpu->alloc_lock);
	if (gpu->allocs_closed || READ_ONCE(gpu->resetting)) {
		ret = -ENODEV;
		goto out;
	}
	list_for_each_entry(a, &gpu->allocs, node) {
		if (!a->revoked && offset >= a->offset && offset + pin->len <= a->offset + a->size) {
			alloc = a;
			break;
		}
	}
	if (!alloc) {
		ret = -EFAULT;
		goto out;
	}
	kref_get(&alloc->ref);
	pin->alloc = alloc;
	pin->offset = offset;
	pin_fill(pin, gpu);
	list_add_tail(&pin->node, &alloc->pins);
	atomic_inc(&gpu->p2p_pins);
out:
	mutex_unlock(&gpu->alloc_lock);
	fput(file);
	return ret;
}

static struct gpu_pin *pin_new(enum gpu_pin_kind kind, u64 len)
{
	struct gpu_pin *pin = kzalloc(sizeof(*pin), GFP_KERNEL);

	if (!pin)
		return NULL;
	pin->kind = kind;
	pin->len = len;
	INIT_LIST_HEAD(&pin->node);
	INIT_LIST_HEAD(&pin->maps);
	INIT_LIST_HEAD(&pin->nv_node);
	return pin;
}

/* Frees a pin that nothing can reach any more (no maps left). */
static void pin_free(struct gpu_pin *pin)
{
	struct gpu_alloc *a = pin->alloc;

	WARN_ON(!list_empty(&pin->maps));
	if (pin->kind == PIN_P2PLAB) {
		pin->pt.version = 0;	/* a stale pointer fails the version check */
		kvfree(pin->pt.phys);
	} else {
		kvfree(pin->nv.pages);
		kvfree(pin->nv_page_array);
	}
	kfree(pin);
	if (a) {
		atomic_dec(&a->gpu->p2p_pins);
		alloc_put(a);
	}
}

/*
 * Unpins @pin, which has no DMA mappings left: 0 (then only pin_free is
 * left to do), -ENOENT when a revocation took it first (its callback owns
 * it), -EBUSY while mappings exist. The last pin of a freed allocation
 * (a persistent one) gives its VRAM back.
 */
static int pin_unpin(struct gpu_pin *pin)
{
	struct gpu_alloc *a = pin->alloc;
	struct p2plab_gpu *gpu = a->gpu;
	bool drop = false;
	size_t size = 0;
	void *va = NULL;

	mutex_lock(&gpu->alloc_lock);
	if (pin->revoked && pin->free_callback) {
		mutex_unlock(&gpu->alloc_lock);
		return -ENOENT;
	}
	if (!list_empty(&pin->maps)) {
		mutex_unlock(&gpu->alloc_lock);
		return -EBUSY;
	}
	/* A torn-down persistent pin is off the list already. */
	list_del_init(&pin->node);
	if (a->revoked && a->p2p_va && !alloc_vram_held(a)) {
		va = alloc_take_vram(a, &size);
		list_del_init(&a->retained);
		drop = true;
	}
	mutex_unlock(&gpu->alloc_lock);
	if (va)
		pci_free_p2pmem(gpu->pdev, va, size);
	if (drop)
		alloc_put(a);
	return 0;
}

/*
 * DMA-maps @pin's pages for @peer the way the kernel maps P2PDMA pages for
 * any driver (dma_map_sgtable on ZONE_DEVICE p2p pages): bus addresses
 * behind a common switch, a regular mapping through an allowed host
 * bridge. The distance check first puts the kernel's reason for a refusal
 * in dmesg. Returns the map, on pin->maps, with one address per 4 KiB page
 * in m->dma; ERR_PTR -EREMOTEIO (the kernel refuses the pair), -ENODEV
 * (revoked), -ENOMEM, -EIO.
 */
static struct gpu_p2p_map *pin_dma_map(struct gpu_pin *pin, struct pci_dev *peer)
{
	struct gpu_alloc *a = pin->alloc;
	struct p2plab_gpu *gpu = a->gpu;
	u64 n = pin->len >> PAGE_SHIFT, i, k;
	struct device *client = &peer->dev;
	struct gpu_p2p_map *m;
	struct scatterlist *sg;
	struct page **pages;
	unsigned int j;
	int ret;

	might_sleep();
	if (READ_ONCE(pin->revoked))
		return ERR_PTR(-ENODEV);
	if (pci_p2pdma_distance_many(gpu->pdev, &client, 1, true) < 0)
		return ERR_PTR(-EREMOTEIO);

	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&m->node);
	m->pin = pin;
	m->peer = pci_dev_get(peer);
	m->dma = kvmalloc_array(n, sizeof(*m->dma), GFP_KERNEL);
	pages = kvmalloc_array(n, sizeof(*pages), GFP_KERNEL);
	if (!m->dma || !pages) {
		ret = -ENOMEM;
		goto err_free;
	}

	mutex_lock(&gpu->alloc_lock);
	if (pin->revoked) {
		mutex_unlock(&gpu->alloc_lock);
		ret = -ENODEV;
		goto err_free;
	}
	/* The allocation's p2pmem pages; they stay until revocation. */
	for (i = 0; i < n; i++)
		pages[i] = virt_to_page(a->p2p_va + (pin->offset - a->offset) + (i << PAGE_SHIFT));
	list_add_tail(&m->node, &pin->maps);
	mutex_unlock(&gpu->alloc_lock);

	ret = sg_alloc_table_from_pages(&m->sgt, pages, n, 0, pin->len, GFP_KERNEL);
	if (ret)
		goto err_unlink;
	ret = dma_map_sgtable(&peer->dev, &m->sgt, DMA_BIDIRECTIONAL, DMA_ATTR_SKIP_CPU_SYNC);
	if (ret) {
		dev_warn(&peer->dev, "p2plab_gpu %s: DMA mapping of VRAM refused: %d\n",
			 pci_name(gpu->pdev), ret);
		ret = ret == -EREMOTEIO ? -EREMOTEIO : -EIO;
		goto err_sgt;
	}
	m->map_type = PCI_P2PDMA_MAP_THRU_HOST_BRIDGE;
	k = 0;
	for_each_sgtable_dma_sg(&m->sgt, sg, j) {
		dma_addr_t addr = sg_dma_address(sg);
		unsigned int left = sg_dma_len(sg);

		if (sg_dma_is_bus_address(sg))
			m->map_type = PCI_P2PDMA_MAP_BUS_ADDR;
		for (; left && k < n; left -= min(left, PAGE_SIZE)) {
			m->dma[k++] = addr;
			addr += PAGE_SIZE;
		}
	}
	if (WARN_ON_ONCE(k != n)) {
		ret = -EIO;
		goto err_unmap;
	}
	mutex_lock(&gpu->alloc_lock);
	if (m->torn_down) {
		/* A reset or unbind took the pin's memory meanwhile. */
		mutex_unlock(&gpu->alloc_lock);
		ret = -ENODEV;
		goto err_unmap;
	}
	m->mapped = true;
	mutex_unlock(&gpu->alloc_lock);
	kvfree(pages);
	atomic_inc(&gpu->p2p_maps);
	if (m->map_type == PCI_P2PDMA_MAP_BUS_ADDR)
		atomic_inc(&gpu->p2p_bus_addr_maps);
	return m;

err_unmap:
	dma_unmap_sgtable(&peer->dev, &m->sgt, DMA_BIDIRECTIONAL, DMA_ATTR_SKIP_CPU_SYNC);
err_sgt:
	sg_free_table(&m->sgt);
err_unlink:
	mutex_lock(&gpu->alloc_lock);
	list_del(&m->node);
	mutex_unlock(&gpu->alloc_lock);
err_free:
	kvfree(pages);
	kvfree(m->dma);
	pci_dev_put(m->peer);
	kfree(m);
	return ERR_PTR(ret);
}

/* Under alloc_lock: takes @m off its pin, once; false if it was off. */
static bool map_unlink(struct gpu_p2p_map *m)
{
	if (list_empty(&m->node))
		return false;
	list_del_init(&m->node);
	return true;
}

/* Releases a map that map_unlink took off its pin. */
static void map_free(struct gpu_p2p_map *m)
{
	struct p2plab_gpu *gpu = m->pin->alloc->gpu;

	/* Not under alloc_lock: mapped only changes while the map is listed. */
	if (m->mapped)
		dma_unmap_sgtable(&m->peer->dev, &m->sgt, DMA_BIDIRECTIONAL,
				  DMA_ATTR_SKIP_CPU_SYNC);
	sg_free_table(&m->sgt);
	atomic_dec(&gpu->p2p_maps);
	pci_dev_put(m->peer);
	if (m->pin->kind != PIN_P2PLAB)
		kvfree(m->nv.dma_addresses);
	kvfree(m->dma);
	kfree(m);
}

/* Releases every map still on @pin. */
static void pin_release_maps(struct gpu_pin *pin)
{
	struct p2plab_gpu *gpu = pin->alloc->gpu;
	struct gpu_p2p_map *m;

	for (;;) {
		mutex_lock(&gpu->alloc_lock);
		m = list_first_entry_or_null(&pin->maps, struct gpu_p2p_map, node);
		if (m)
			map_unlink(m);
		mutex_unlock(&gpu->alloc_lock);
		if (!m)
			return;
		map_free(m);
	}
}

/* -- peer-memory API (p2plab_p2p.h) -- */

int p2plab_p2p_get_pages(u64 user_va, u64 len, struct p2plab_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	struct gpu_pin *pin;
	u64 entries;
	int ret;

	might_sleep();
	if (!page_table || !free_callback || !len || !PAGE_ALIGNED(user_va) ||
	    !PAGE_ALIGNED(len) || user_va + len < user_va)
		return -EINVAL;
	entries = len >> PAGE_SHIFT;
	if (entries > U32_MAX || !current->mm)
		return -EINVAL;

	pin = pin_new(PIN_P2PLAB, len);
	if (!pin)
		return -ENOMEM;
	pin->free_callback = free_callback;
	pin->data = data;
	pin->pt.version = P2PLAB_P2P_PAGE_TABLE_VERSION;
	pin->pt.page_size = P2PLAB_P2P_PAGE_SIZE;
	pin->pt.entries = entries;
	pin->pt.priv = pin;
	pin->pt.phys = kvmalloc_array(entries, sizeof(u64), GFP_KERNEL);
	if (!pin->pt.phys) {
		pin_free(pin);
		return -ENOMEM;
	}
	ret = pin_register(pin, user_va);
	if (ret) {
		pin_free(pin);
		return ret;
	}
	*page_table = &pin->pt;
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_get_pages);

static struct gpu_pin *pt_pin(struct p2plab_p2p_page_table *pt)
{
	return pt && pt->version == P2PLAB_P2P_PAGE_TABLE_VERSION ? pt->priv : NULL;
}

/* Refusals by the kernel come back as -EINVAL, see p2plab_p2p.h. */
int p2plab_p2p_dma_map_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			     struct p2plab_p2p_dma_mapping **dma_mapping)
{
	struct gpu_pin *pin = pt_pin(page_table);
	struct gpu_p2p_map *m;

	might_sleep();
	if (!pin || !peer || !dma_mapping)
		return -EINVAL;
	m = pin_dma_map(pin, peer);
	if (IS_ERR(m))
		return PTR_ERR(m) == -EREMOTEIO || PTR_ERR(m) == -EIO ? -EINVAL : PTR_ERR(m);
	m->map.version = P2PLAB_P2P_DMA_MAPPING_VERSION;
	m->map.entries = page_table->entries;
	m->map.page_size = P2PLAB_P2P_PAGE_SIZE;
	m->map.map_type = m->map_type;
	m->map.dma_addresses = m->dma;
	m->map.peer = peer;
	m->map.pt = page_table;
	m->map.priv = m;
	*dma_mapping = &m->map;
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_dma_map_pages);

static struct gpu_p2p_map *map_of(struct p2plab_p2p_dma_mapping *map)
{
	return map && map->version == P2PLAB_P2P_DMA_MAPPING_VERSION ? map->priv : NULL;
}

/* Takes @m off its pin and releases it; -EINVAL if it was not on one. */
static int p2p_map_release(struct gpu_p2p_map *m)
{
	struct p2plab_gpu *gpu = m->pin->alloc->gpu;
	bool ok;

	mutex_lock(&gpu->alloc_lock);
	ok = map_unlink(m);
	mutex_unlock(&gpu->alloc_lock);
	if (!ok)
		return -EINVAL;
	map_free(m);
	return 0;
}

int p2plab_p2p_dma_unmap_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			       struct p2plab_p2p_dma_mapping *dma_mapping)
{
	struct gpu_p2p_map *m = map_of(dma_mapping);

	might_sleep();
	if (!m || !pt_pin(page_table) || dma_mapping->pt != page_table || dma_mapping->peer != peer)
		return -EINVAL;
	return p2p_map_release(m);
}
EXPORT_SYMBOL_GPL(p2plab_p2p_dma_unmap_pages);

int p2plab_p2p_free_dma_mapping(struct p2plab_p2p_dma_mapping *dma_mapping)
{
	struct gpu_p2p_map *m = map_of(dma_mapping);

	might_sleep();
	if (!m)
		return -EINVAL;
	return p2p_map_release(m);
}
EXPORT_SYMBOL_GPL(p2plab_p2p_free_dma_mapping);

int p2plab_p2p_put_pages(struct p2plab_p2p_page_table *page_table)
{
	struct gpu_pin *pin = pt_pin(page_table);
	int ret;

	might_sleep();
	if (!pin)
		return -EINVAL;
	/* -ENOENT: the free callback owns the table now. */
	ret = pin_unpin(pin);
	if (!ret)
		pin_free(pin);
	return ret;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_put_pages);

int p2plab_p2p_free_page_table(struct p2plab_p2p_page_table *page_table)
{
	struct gpu_pin *pin = pt_pin(page_table);
	struct p2plab_gpu *gpu;
	bool revoked, ok;

	might_sleep();
	if (!pin)
		return -EINVAL;
	gpu = pin->alloc->gpu;
	mutex_lock(&gpu->alloc_lock);
	revoked = pin->revoked;
	ok = revoked && list_empty(&pin->maps);
	mutex_unlock(&gpu->alloc_lock);
	if (!ok) {
		/* Not from a callback, or mappings left: leaking beats a use after free. */
		pr_warn_ratelimited(DRV_NAME ": free_page_table %s\n",
				    revoked ? "with DMA mappings left" : "outside the free callback");
		return revoked ? -EBUSY : -EINVAL;
	}
	pin_free(pin);
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_free_page_table);

/*
 * -- NVIDIA's peer-memory API (nv-p2p.h) --
 *
 * The same pins and maps, with NVIDIA's tables (64 KiB GPU pages) and
 * NVIDIA's ownership rules: the GPU driver, not the importer, frees a
 * revoked table and its mappings once the importer's callback returned
 * (free_page_table and free_dma_mapping do nothing), put_pages releases
 * mappings left behind and waits for a callback in flight, and calls on
 * a table that is gone find nothing and return 0. Tables are looked up by
 * address in nv_pins, never dereferenced first, so a stale pointer is
 * harmless. nv_lock is taken before alloc_lock and never held while an
 * importer's callback runs. Exported like NVIDIA's (EXPORT_SYMBOL), so a
 * module that links against nvidia.ko links against us.
 */

static DEFINE_MUTEX(nv_lock);
static LIST_HEAD(nv_pins);			/* struct gpu_pin, NV_LIVE or NV_REVOKING */
static DECLARE_WAIT_QUEUE_HEAD(nv_wq);		/* pins reaching NV_DONE */

/* Under nv_lock: the pin of @pt, if it is one of ours and not done. */
static struct gpu_pin *nv_pin_find(struct nvidia_p2p_page_table *pt)
{
	struct gpu_pin *pin;

	list_for_each_entry(pin, &nv_pins, nv_node)
		if (&pin->nv == pt)
			return pin;
	return NULL;
}

/* What NVIDIA's driver returns where ours knows more. */
static int nv_errno(int err)
{
	switch (err) {
	case -EFAULT:		/* not GPU memory of the caller */
		return -EINVAL;
	case -ENODEV:		/* the GPU is gone or resetting */
		return -EIO;
	case -EREMOTEIO:	/* the kernel refuses P2P for the pair */
		return -ENOTSUPP;
	default:
		return err;
	}
}

/* Whether a revocation took @pin to call its free callback. */
static bool pin_revoked_with_callback(struct gpu_pin *pin)
{
	struct p2plab_gpu *gpu = pin->alloc->gpu;
	bool revoked;

	mutex_lock(&gpu->alloc_lock);
	revoked = pin->revoked && pin->free_callback;
	mutex_unlock(&gpu->alloc_lock);
	return revoked;
}

/* A waiter of a done pin lets go; the last one frees it. */
static void nv_waiter_done(struct gpu_pin *pin)
{
	bool last;

	mutex_lock(&nv_lock);
	last = !--pin->nv_waiters;
	mutex_unlock(&nv_lock);
	if (last)
		pin_free(pin);
}

/* Under nv_lock: whether the current task runs one of our free callbacks. */
static bool nv_in_callback(void)
{
	struct gpu_pin *pin;

	list_for_each_entry(pin, &nv_pins, nv_node)
		if (pin->nv_callback_task == current)
			return true;
	return false;
}

/*
 * Called with nv_lock held on a pin whose callback runs or is about to:
 * waits until it returned and the table is gone (as NVIDIA's put_pages
 * waits for the RM lock its free path holds). From inside a callback
 * (this pin's, or another's whose revocation calls this one's next) it
 * returns at once: waiting there could never end. Drops nv_lock.
 */
static void nv_wait_callback(struct gpu_pin *pin)
{
	if (nv_in_callback()) {
		mutex_unlock(&nv_lock);
		return;
	}
	pin->nv_waiters++;
	mutex_unlock(&nv_lock);
	wait_event(nv_wq, READ_ONCE(pin->nv_state) == NV_DONE);
	nv_waiter_done(pin);
}

/* The core's free callback of NVIDIA pins: the importer's, then cleanup. */
static void nv_free_callback(void *data)
{
	struct gpu_pin *pin = data;
	bool last;

	mutex_lock(&nv_lock);
	pin->nv_state = NV_REVOKING;
	pin->nv_callback_task = current;
	mutex_unlock(&nv_lock);

	pin->nv_callback(pin->nv_data);

	/* The importer stopped its DMA; what it left mapped is ours to free. */
	pin_release_maps(pin);
	mutex_lock(&nv_lock);
	pin->nv_callback_task = NULL;
	list_del_init(&pin->nv_node);
	WRITE_ONCE(pin->nv_state, NV_DONE);
	/* Off the list: no new waiters; those there free it last. */
	last = !pin->nv_waiters;
	mutex_unlock(&nv_lock);
	wake_up_all(&nv_wq);
	if (last)
		pin_free(pin);
}

static int nv_get_pages(u64 va, u64 len, struct nvidia_p2p_page_table **page_table,
			void (*free_callback)(void *data), void *data, u32 flags)
{
	struct gpu_pin *pin;
	u64 entries, i;
	int ret;

	might_sleep();
	if (!page_table)
		return -EINVAL;
	*page_table = NULL;
	if (!len || !IS_ALIGNED(va, GPU_PAGE_SIZE) || !IS_ALIGNED(len, GPU_PAGE_SIZE) ||
	    va + len < va)
		return -EINVAL;
	entries = len / GPU_PAGE_SIZE;
	if (entries > U32_MAX)
		return -EINVAL;

	pin = pin_new(free_callback ? PIN_NV : PIN_NV_PERSISTENT, len);
	if (!pin)
		return -ENOMEM;
	if (free_callback) {
		pin->free_callback = nv_free_callback;
		pin->data = pin;
	}
	pin->nv_callback = free_callback;
	pin->nv_data = data;
	pin->nv_va = va;
	pin->nv_flags = flags;
	pin->nv_page_array = kvcalloc(entries, sizeof(*pin->nv_page_array), GFP_KERNEL);
	pin->nv.pages = kvmalloc_array(entries, sizeof(*pin->nv.pages), GFP_KERNEL);
	if (!pin->nv_page_array || !pin->nv.pages) {
		pin_free(pin);
		return -ENOMEM;
	}
	pin->nv.version = NVIDIA_P2P_PAGE_TABLE_VERSION;
	pin->nv.page_size = NVIDIA_P2P_PAGE_SIZE_64KB;
	pin->nv.entries = entries;
	pin->nv.gpu_uuid = pin->nv_uuid;
	pin->nv.flags = 0;
	for (i = 0; i < entries; i++)
		pin->nv.pages[i] = &pin->nv_page_array[i];

	/* A revocation's callback waits for nv_lock: it sees a listed pin. */
	mutex_lock(&nv_lock);
	ret = pin_register(pin, va);
	if (ret) {
		mutex_unlock(&nv_lock);
		pin_free(pin);
		return nv_errno(ret);
	}
	pin->nv_state = NV_LIVE;
	list_add_tail(&pin->nv_node, &nv_pins);
	*page_table = &pin->nv;
	mutex_unlock(&nv_lock);
	return 0;
}

int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space, uint64_t virtual_address,
			 uint64_t length, struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	/* NVIDIA's wants data too, and tokens are a thing of the past. */
	if (!free_callback || !data || p2p_token || va_space)
		return -EINVAL;
	return nv_get_pages(virtual_address, length, page_table, free_callback, data, 0);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages);

int nvidia_p2p_get_pages_persistent(uint64_t virtual_address, uint64_t length,
				    struct nvidia_p2p_page_table **page_table, uint32_t flags)
{
	/* NVIDIA's ignores unknown flags; a lab had better say so. */
	if (flags & ~NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING)
		return -EINVAL;
	return nv_get_pages(virtual_address, length, page_table, NULL, NULL, flags);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages_persistent);

int nvidia_p2p_dma_map_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping)
{
	const u64 per_page = GPU_PAGE_SIZE >> PAGE_SHIFT;
	struct gpu_p2p_map *m;
	struct gpu_pin *pin;
	u64 *addrs;
	u32 i, j;
	int ret;

	might_sleep();
	if (!dma_mapping)
		return -EINVAL;
	*dma_mapping = NULL;
	if (!peer || !page_table)
		return -EINVAL;

	/* Held throughout: a revocation waits for the mapping to be listed. */
	mutex_lock(&nv_lock);
	pin = nv_pin_find(page_table);
	if (!pin || pin->nv_state != NV_LIVE) {
		ret = -EINVAL;
		goto out;
	}
	if (pin->nv_flags & NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING) {
		/* NVIDIA's only maps such tables for the CPU. */
		ret = -ENOTSUPP;
		goto out;
	}
	addrs = kvmalloc_array(pin->nv.entries, sizeof(*addrs), GFP_KERNEL);
	if (!addrs) {
		ret = -ENOMEM;
		goto out;
	}
	m = pin_dma_map(pin, peer);
	if (IS_ERR(m)) {
		kvfree(addrs);
		ret = nv_errno(PTR_ERR(m));
		goto out;
	}
	/* One address per GPU page: its 4 KiB pages must follow each other. */
	for (i = 0; i < pin->nv.entries; i++) {
		addrs[i] = m->dma[i * per_page];
		for (j = 1; j < per_page; j++)
			if (m->dma[i * per_page + j] != addrs[i] + ((u64)j << PAGE_SHIFT))
				break;
		if (j < per_page)
			break;
	}
	m->nv.dma_addresses = addrs;
	if (i < pin->nv.entries) {
		dev_warn(&peer->dev, "p2plab_gpu: DMA mapping of VRAM is not contiguous per 64 KiB page\n");
		mutex_lock(&pin->alloc->gpu->alloc_lock);
		map_unlink(m);
		mutex_unlock(&pin->alloc->gpu->alloc_lock);
		map_free(m);
		ret = -EIO;
		goto out;
	}
	m->nv.version = NVIDIA_P2P_DMA_MAPPING_VERSION;
	m->nv.page_size_type = NVIDIA_P2P_PAGE_SIZE_64KB;
	m->nv.entries = pin->nv.entries;
	m->nv.private = m;
	m->nv.pci_dev = peer;
	*dma_mapping = &m->nv;
	ret = 0;
out:
	mutex_unlock(&nv_lock);
	return ret;
}
EXPORT_SYMBOL(nvidia_p2p_dma_map_pages);

int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping)
{
	struct gpu_p2p_map *m, *found = NULL;
	struct p2plab_gpu *gpu;
	struct gpu_pin *pin;
	int ret = 0;

	might_sleep();
	if (!peer || !page_table || !dma_mapping)
		return -EINVAL;
	mutex_lock(&nv_lock);
	pin = nv_pin_find(page_table);
	if (!pin) {
		mutex_unlock(&nv_lock);
		/* NVIDIA's would read freed memory here. */
		pr_warn_ratelimited(DRV_NAME ": nvidia_p2p_dma_unmap_pages on a page table that is gone (put, or freed after its free callback)\n");
		return -EINVAL;
	}
	gpu = pin->alloc->gpu;
	mutex_lock(&gpu->alloc_lock);
	list_for_each_entry(m, &pin->maps, node) {
		if (&m->nv == dma_mapping) {
			found = m;
			break;
		}
	}
	if (found && found->peer != peer) {
		ret = -EINVAL;	/* NVIDIA's warns and unmaps anyway */
		found = NULL;
	} else if (found) {
		map_unlink(found);
	}
	mutex_unlock(&gpu->alloc_lock);
	mutex_unlock(&nv_lock);
	if (ret)
		pr_warn_ratelimited(DRV_NAME ": nvidia_p2p_dma_unmap_pages for another peer than the mapping's\n");
	/* Not found: released already (by put_pages or after a callback). */
	if (found)
		map_free(found);
	return ret;
}
EXPORT_SYMBOL(nvidia_p2p_dma_unmap_pages);

/* put_pages and put_pages_persistent. */
static int nv_put_pages(u64 va, struct nvidia_p2p_page_table *page_table, bool persistent)
{
	struct gpu_pin *pin;
	int ret;

	might_sleep();
	mutex_lock(&nv_lock);
	pin = nv_pin_find(page_table);
	if (!pin) {
		/* Gone already, e.g. after its free callback: NVIDIA's returns 0. */
		mutex_unlock(&nv_lock);
		return 0;
	}
	if ((pin->kind == PIN_NV_PERSISTENT) != persistent || pin->nv_va != va) {
		const char *why = pin->nv_va != va ? "not the address the table was pinned at" :
				  "the table is from the other get_pages";

		mutex_unlock(&nv_lock);
		pr_warn_ratelimited(DRV_NAME ": nvidia_p2p_put_pages%s: %s\n",
				    persistent ? "_persistent" : "", why);
		return -EINVAL;
	}
	if (pin->nv_state != NV_LIVE || pin_revoked_with_callback(pin)) {
		/*
		 * Its callback runs, or a revocation will call it (it waits for
		 * nv_lock): the driver frees the table and its maps after it.
		 */
		nv_wait_callback(pin);
		return 0;
	}
	/* NVIDIA's releases what the importer left mapped. */
	pin_release_maps(pin);
	ret = pin_unpin(pin);
	if (ret == -ENOENT) {
		/* A revocation got there meanwhile. */
		nv_wait_callback(pin);
		return 0;
	}
	if (WARN_ON_ONCE(ret)) {
		mutex_unlock(&nv_lock);
		return -EIO;
	}
	list_del_init(&pin->nv_node);
	pin->nv_state = NV_DONE;
	mutex_unlock(&nv_lock);
	pin_free(pin);
	return 0;
}

int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space, uint64_t virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	if (!page_table)
		return 0;
	if (p2p_token || va_space)
		return -EINVAL;
	return nv_put_pages(virtual_address, page_table, false);
}
EXPORT_SYMBOL(nvidia_p2p_put_pages);

int nvidia_p2p_put_pages_persistent(uint64_t virtual_address,
				    struct nvidia_p2p_page_table *page_table, uint32_t flags)
{
	if (flags)
		return -EINVAL;
	if (!page_table)
		return 0;
	return nv_put_pages(virtual_address, page_table, true);
}
EXPORT_SYMBOL(nvidia_p2p_put_pages_persistent);

int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	return page_table ? 0 : -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_free_page_table);

int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping)
{
	return dma_mapping ? 0 : -EINVAL;
}
EXPORT_SYMBOL(nvidia_p2p_free_dma_mapping);

/* -- dma-buf exporter -- */

static int gpu_dmabuf_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct gpu_dmabuf *db = dmabuf->priv;

	/* VRAM has no struct pages for the importer and cannot move to RAM. */
	if (!attach->peer2peer)
		return -EOPNOTSUPP;
	if (READ_ONCE(db->revoked))
		return -ENODEV;
	/* The kernel's verdict, with its reason in dmesg on refusal. */
	if (pci_p2pdma_distance(db->alloc->gpu->pdev, attach->dev, true) < 0)
		return -EOPNOTSUPP;
	return 0;
}

static struct sg_table *gpu_dmabuf_map(struct dma_buf_attachment *attach,
				       enum dma_data_direction dir)
{
	struct gpu_dmabuf *db = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (db->revoked)
		return ERR_PTR(-ENODEV);
	return dma_buf_phys_vec_to_sgt(attach, db->provider, &db->range, 1, db->range.len, dir);
}

static void gpu_dmabuf_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
			     enum dma_data_direction dir)
{
	dma_buf_free_sgt(attach, sgt, dir);
}

/*
 * dma_buf_pin, under the reservation lock: the importer (a pinned one
 * such as ib_umem_dmabuf_get_pinned, which never hears invalidate_mappings)
 * keeps its mapping until it unpins. VRAM never moves here, so pinning
 * only has to keep it allocated: alloc_revoke leaves a pinned
 * allocation's VRAM out of the pool until the last pin is gone. A revoked
 * dma-buf cannot be pinned (its VRAM may be back in the pool).
 */
static int gpu_dmabuf_pin(struct dma_buf_attachment *attach)
{
	struct gpu_dmabuf *db = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (db->revoked)
		return -ENODEV;
	db->pins++;
	atomic_inc(&db->alloc->dmabuf_pins);
	atomic_inc(&db->alloc->gpu->dmabuf_pins);
	return 0;
}

/*
 * dma_buf_unpin, under the reservation lock, which ranks below alloc_lock:
 * the VRAM of a revoked allocation goes back at the importer's detach
 * (gpu_dmabuf_detach), where alloc_lock may be taken.
 */
static void gpu_dmabuf_unpin(struct dma_buf_attachment *attach)
{
	struct gpu_dmabuf *db = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!db->pins)
		return;
	db->pins--;
	atomic_dec(&db->alloc->dmabuf_pins);
	atomic_dec(&db->alloc->gpu->dmabuf_pins);
}

/* A revoked allocation nothing pins any more gives its VRAM back. */
static void alloc_vram_if_idle(struct gpu_alloc *a)
{
	struct p2plab_gpu *gpu = a->gpu;
	bool drop = false;
	size_t size = 0;
	void *va = NULL;

	mutex_lock(&gpu->alloc_lock);
	if (a->revoked && a->p2p_va && !alloc_vram_held(a)) {
		va = alloc_take_vram(a, &size);
		if (!list_empty(&a->retained)) {
			list_del_init(&a->retained);
			drop = true;
		}
	}
	mutex_unlock(&gpu->alloc_lock);
	if (va)
		pci_free_p2pmem(gpu->pdev, va, size);
	if (drop)
		alloc_put(a);
}

/* Called unlocked after the importer unpinned and unmapped. */
static void gpu_dmabuf_detach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct gpu_dmabuf *db = dmabuf->priv;

	alloc_vram_if_idle(db->alloc);
}

static void gpu_dmabuf_release(struct dma_buf *dmabuf)
{
	struct gpu_dmabuf *db = dmabuf->priv;
	struct p2plab_gpu *gpu = db->alloc->gpu;

	mutex_lock(&gpu->alloc_lock);
	list_del_init(&db->node);
	mutex_unlock(&gpu->alloc_lock);
	alloc_put(db->alloc);
	kfree(db);
}

static const struct dma_buf_ops gpu_dmabuf_ops = {
	.attach = gpu_dmabuf_attach,
	.detach = gpu_dmabuf_detach,
	.pin = gpu_dmabuf_pin,
	.unpin = gpu_dmabuf_unpin,
	.map_dma_buf = gpu_dmabuf_map,
	.unmap_dma_buf = gpu_dmabuf_unmap,
	.release = gpu_dmabuf_release,
};

static long ioctl_export_dmabuf(struct gpu_file *gf, struct p2plab_gpu_export_dmabuf __user *uarg)
{
	struct p2plab_gpu *gpu = gf->gpu;
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct p2plab_gpu_export_dmabuf arg;
	struct dma_buf *dmabuf;
	struct gpu_dmabuf *db;
	struct gpu_alloc *a;
	int fd;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.flags & ~(O_CLOEXEC | O_ACCMODE) || arg.pad)
		return -EINVAL;
	a = alloc_find(gf, arg.handle, false);
	if (!a)
		return -ENOENT;
	db = kzalloc(sizeof(*db), GFP_KERNEL);
	if (!db) {
		alloc_put(a);
		return -ENOMEM;
	}
	INIT_LIST_HEAD(&db->node);
	db->alloc = a;		/* takes over the reference */
	db->provider = gpu->provider;
	db->range.paddr = gpu->vram_phys + a->offset;
	db->range.len = a->size;

	exp_info.ops = &gpu_dmabuf_ops;
	exp_info.size = a->size;
	exp_info.flags = arg.flags;
	exp_info.priv = db;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		alloc_put(a);
		kfree(db);
		return PTR_ERR(dmabuf);
	}
	db->dmabuf = dmabuf;
	/* From here on dma_buf_put() frees db. */
	mutex_lock(&gpu->alloc_lock);
	dma_resv_lock(dmabuf->resv, NULL);
	db->revoked = a->revoked;
	list_add_tail(&db->node, &a->dmabufs);
	dma_resv_unlock(dmabuf->resv);
	mutex_unlock(&gpu->alloc_lock);
	if (db->revoked) {
		dma_buf_put(dmabuf);
		return -ENODEV;
	}

	fd = dma_buf_fd(dmabuf, arg.flags);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	arg.fd = fd;
	if (copy_to_user(uarg, &arg, sizeof(arg)))
		/* The fd is installed; the caller's close(2) releases it. */
		return -EFAULT;
	return 0;
}

static long p2plab_gpu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct gpu_file *gf = filp->private_data;

	switch (cmd) {
	case P2PLAB_GPU_IOC_INFO:
		return ioctl_info(gf->gpu, (void __user *)arg);
	case P2PLAB_GPU_IOC_SUBMIT:
		return ioctl_submit(gf->gpu, (void __user *)arg);
	case P2PLAB_GPU_IOC_ALLOC:
		return ioctl_alloc(gf, (void __user *)arg);
	case P2PLAB_GPU_IOC_FREE:
		return ioctl_free(gf, (void __user *)arg);
	case P2PLAB_GPU_IOC_EXPORT_DMABUF:
		return ioctl_export_dmabuf(gf, (void __user *)arg);
	default:
		return -ENOTTY;
	}
}

static int p2plab_gpu_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct gpu_file *gf = filp->private_data;
	struct p2plab_gpu *gpu = gf->gpu;
	int ret;

	mutex_lock(&gpu->map_lock);
	if (gpu->unmapped) {
		ret = -ENODEV;
		goto out;
	}
	/*
	 * Uncached: P2PDMA already maps this BAR uncached in the kernel, and
	 * x86 PAT refuses a conflicting attribute for the same range.
	 */
	vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
	/* Checks vm_pgoff and the length against VRAM. */
	ret = vm_iomap_memory(vma, gpu->vram_phys, gpu->vram_size);
out:
	mutex_unlock(&gpu->map_lock);
	return ret;
}

/*
 * Mappings start at a user address that is congruent with their VRAM
 * offset modulo GPU_PAGE_SIZE, so an allocation lands 64 KiB-aligned, as
 * nvidia_p2p_get_pages wants (cudaMalloc's addresses are too). The same
 * padding trick as thp_get_unmapped_area.
 */
static unsigned long p2plab_gpu_get_unmapped_area(struct file *filp, unsigned long addr,
						  unsigned long len, unsigned long pgoff,
						  unsigned long flags)
{
	unsigned long off = pgoff << PAGE_SHIFT, pad = len + GPU_PAGE_SIZE, ret;

	if ((flags & MAP_FIXED) || pad < len)
		return mm_get_unmapped_area(filp, addr, len, pgoff, flags);
	ret = mm_get_unmapped_area(filp, 0, pad, pgoff, flags);
	if (IS_ERR_VALUE(ret))
		return mm_get_unmapped_area(filp, addr, len, pgoff, flags);
	return ret + ((off - ret) & (GPU_PAGE_SIZE - 1));
}

static int p2plab_gpu_open(struct inode *inode, struct file *filp)
{
	struct p2plab_gpu *gpu = container_of(inode->i_cdev, struct p2plab_gpu, cdev);
	struct gpu_file *gf = kzalloc(sizeof(*gf), GFP_KERNEL);

	if (!gf)
		return -ENOMEM;
	gf->filp = filp;
	gf->gpu = gpu;
	get_device(&gpu->dev);
	mutex_lock(&gpu->files_lock);
	list_add_tail(&gf->node, &gpu->files);
	mutex_unlock(&gpu->files_lock);
	filp->private_data = gf;
	return 0;
}

static int p2plab_gpu_release(struct inode *inode, struct file *filp)
{
	struct gpu_file *gf = filp->private_data;
	struct p2plab_gpu *gpu = gf->gpu;

	free_file_allocs(gf);
	mutex_lock(&gpu->files_lock);
	list_del(&gf->node);
	mutex_unlock(&gpu->files_lock);
	kfree(gf);
	put_device(&gpu->dev);
	return 0;
}

static const struct file_operations p2plab_gpu_fops = {
	.owner = THIS_MODULE,
	.open = p2plab_gpu_open,
	.release = p2plab_gpu_release,
	.unlocked_ioctl = p2plab_gpu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = p2plab_gpu_mmap,
	.get_unmapped_area = p2plab_gpu_get_unmapped_area,
};

/* ---- sysfs: recovery counters and the device's VRAM error report ---- */

static ssize_t engine_resets_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->engine_resets));
}
static DEVICE_ATTR_RO(engine_resets);

static ssize_t irq_recoveries_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->irq_recoveries));
}
static DEVICE_ATTR_RO(irq_recoveries);

/* Peer-memory free callbacks run, and dma-bufs invalidated, by revocations. */
static ssize_t p2p_revocations_show(struct device *dev, struct device_attribute *attr,
				    char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->p2p_revocations));
}
static DEVICE_ATTR_RO(p2p_revocations);

static ssize_t dmabuf_revocations_show(struct device *dev, struct device_attribute *attr,
				       char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->dmabuf_revocations));
}
static DEVICE_ATTR_RO(dmabuf_revocations);

/* dma-buf attachments pinned now (dma_buf_pin, e.g. RDMA MRs of VRAM). */
static ssize_t dmabuf_pins_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->dmabuf_pins));
}
static DEVICE_ATTR_RO(dmabuf_pins);

/* Page tables (both peer-memory APIs) pinned and not yet freed. */
static ssize_t p2p_pins_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->p2p_pins));
}
static DEVICE_ATTR_RO(p2p_pins);

/* Their DMA mappings not yet freed. */
static ssize_t p2p_maps_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->p2p_maps));
}
static DEVICE_ATTR_RO(p2p_maps);

/* Mappings made so far whose addresses are PCI bus addresses (map type BUS_ADDR). */
static ssize_t p2p_bus_addr_maps_show(struct device *dev, struct device_attribute *attr,
				      char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "%d\n", atomic_read(&gpu->p2p_bus_addr_maps));
}
static DEVICE_ATTR_RO(p2p_bus_addr_maps);

/* The UUID in NVIDIA's page tables, spelled as nvidia-smi spells one. */
static ssize_t uuid_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);

	return sysfs_emit(buf, "GPU-%pUb\n", gpu->uuid);
}
static DEVICE_ATTR_RO(uuid);

/* REG_VRAM_ERR_COUNT, or -ENODEV once the device is gone. */
static ssize_t vram_errors_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);
	ssize_t ret = -ENODEV;

	down_read(&gpu->hw_lock);
	if (!gpu->dead)
		ret = sysfs_emit(buf, "%u\n", readl(gpu->regs + REG_VRAM_ERR_COUNT));
	up_read(&gpu->hw_lock);
	return ret;
}
static DEVICE_ATTR_RO(vram_errors);

/* REG_VRAM_ERR_ADDR: VRAM offset of the most recent error's first bad byte. */
static ssize_t vram_error_addr_show(struct device *dev, struct device_attribute *attr,
				    char *buf)
{
	struct p2plab_gpu *gpu = dev_get_drvdata(dev);
	ssize_t ret = -ENODEV;

	down_read(&gpu->hw_lock);
	if (!gpu->dead)
		ret = sysfs_emit(buf, "%#llx\n", readq(gpu->regs + REG_VRAM_ERR_ADDR));
	up_read(&gpu->hw_lock);
	return ret;
}
static DEVICE_ATTR_RO(vram_error_addr);

static struct attribute *p2plab_gpu_attrs[] = {
	&dev_attr_engine_resets.attr,
	&dev_attr_irq_recoveries.attr,
	&dev_attr_p2p_revocations.attr,
	&dev_attr_dmabuf_revocations.attr,
	&dev_attr_dmabuf_pins.attr,
	&dev_attr_p2p_pins.attr,
	&dev_attr_p2p_maps.attr,
	&dev_attr_p2p_bus_addr_maps.attr,
	&dev_attr_uuid.attr,
	&dev_attr_vram_errors.attr,
	&dev_attr_vram_error_addr.attr,
	NULL,
};
ATTRIBUTE_GROUPS(p2plab_gpu);

/* ---- PCI driver ---- */

static void p2plab_gpu_release_dev(struct device *dev)
{
	struct p2plab_gpu *gpu = container_of(dev, struct p2plab_gpu, dev);

	p2plab_chrdevs_put_minor(&p2plab_gpu_chrdevs, dev);
	pci_dev_put(gpu->pdev);
	kfree(gpu);
}

/* Stops the engine; true once it is idle and will not touch memory again. */
static bool engine_stop(struct p2plab_gpu *gpu)
{
	u32 status;
	int ret;

	writel(INT_ALL, gpu->regs + REG_INT_MASK);
	writel(0, gpu->regs + REG_RING_CTRL);
	ret = readl_poll_timeout(gpu->regs + REG_STATUS, status,
				 !(status & STATUS_BUSY) || status == ~0u, 1000, IDLE_TIMEOUT_US);
	writel(INT_ALL, gpu->regs + REG_INT_STATUS);
	if (ret || status == ~0u) {
		dev_err(&gpu->pdev->dev, "engine did not go idle (status %#x)\n", status);
		return false;
	}
	return true;
}

static int engine_start(struct p2plab_gpu *gpu)
{
	u64 fence;

	writel(lower_32_bits(gpu->ring_dma), gpu->regs + REG_RING_BASE);
	writel(upper_32_bits(gpu->ring_dma), gpu->regs + REG_RING_BASE + 4);
	writel(gpu->ring_entries, gpu->regs + REG_RING_SIZE);
	writel(RING_CTRL_ENABLE, gpu->regs + REG_RING_CTRL);
	if (readl(gpu->regs + REG_STATUS) & STATUS_HALTED) {
		dev_err(&gpu->pdev->dev, "device refused the ring, error %#x\n",
			readl(gpu->regs + REG_ENGINE_ERROR));
		return -EIO;
	}
	/* REG_FENCE survives ring re-enables; continue from it. */
	fence = readq(gpu->regs + REG_FENCE);
	atomic64_set(&gpu->completed_fence, fence);
	gpu->submitted_fence = fence;
	gpu->tail = 0;
	writel(0, gpu->regs + REG_INT_MASK);
	return 0;
}

static void publish_p2pmem(struct p2plab_gpu *gpu)
{
	struct pci_dev *pdev = gpu->pdev;
	u64 size = gpu->vram_size;
	int ret;

	if (p2pmem_max_mb && p2pmem_max_mb < (size >> 20))
		size = (u64)p2pmem_max_mb << 20;
	ret = pci_p2pdma_add_resource(pdev, P2PLAB_GPU_VRAM_BAR,
				      size == gpu->vram_size ? 0 : size, 0);
	if (ret) {
		dev_warn(&pdev->dev, "VRAM not registered as p2pmem: %d\n", ret);
		return;
	}
	pci_p2pmem_publish(pdev, true);
	gpu->p2pmem = true;
	/* What dma-buf mappings translate BAR2 addresses with. */
	gpu->provider = pcim_p2pdma_provider(pdev, P2PLAB_GPU_VRAM_BAR);
}

/*
 * A UUID that names the board as long as it sits where it does, as a real
 * GPU's names the board: "p2plab", the PCI domain, bus, device and
 * function, vendor and device ID, marked as an RFC 9562 version 8 UUID.
 */
static void make_uuid(struct p2plab_gpu *gpu)
{
	struct pci_dev *pdev = gpu->pdev;
	u8 *u = gpu->uuid;
	int domain = pci_domain_nr(pdev->bus);

	memcpy(u, "p2plab", 6);
	u[6] = 0x80;				/* version 8 */
	u[7] = pdev->bus->number;
	u[8] = 0x80;				/* variant 10 */
	u[9] = pdev->devfn;
	u[10] = domain >> 8;
	u[11] = domain;
	u[12] = pdev->vendor >> 8;
	u[13] = pdev->vendor;
	u[14] = pdev->device >> 8;
	u[15] = pdev->device;
}

static int p2plab_gpu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct p2plab_gpu *gpu;
	void __iomem *regs;
	int ret;

	if (!p2plab_ring_entries_ok(pdev, ring_entries, MIN_RING_ENTRIES, MAX_RING_ENTRIES))
		return -EINVAL;
	gpu = p2plab_chrdevs_alloc(&p2plab_gpu_chrdevs, struct p2plab_gpu, dev, &pdev->dev,
				   p2plab_gpu_release_dev);
	if (IS_ERR(gpu))
		return PTR_ERR(gpu);
	/* From here on put_device() frees gpu and its minor. */
	gpu->dev.groups = p2plab_gpu_groups;
	dev_set_drvdata(&gpu->dev, gpu);

	/*
	 * Held until the last reference to gpu: allocations and dma-bufs can
	 * outlive the binding, even a hot unplug.
	 */
	gpu->pdev = pci_dev_get(pdev);
	gpu->ring_entries = ring_entries;
	make_uuid(gpu);
	init_rwsem(&gpu->hw_lock);
	mutex_init(&gpu->submit_lock);
	mutex_init(&gpu->map_lock);
	mutex_init(&gpu->files_lock);
	mutex_init(&gpu->alloc_lock);
	INIT_LIST_HEAD(&gpu->allocs);
	INIT_LIST_HEAD(&gpu->retained);
	spin_lock_init(&gpu->zombie_lock);
	INIT_LIST_HEAD(&gpu->zombies);
	INIT_LIST_HEAD(&gpu->files);
	init_waitqueue_head(&gpu->wq);
	atomic64_set(&gpu->completed_fence, 0);

	/* The register BAR is checked by p2plab_pci_map, VRAM here. */
	if (!(pci_resource_flags(pdev, P2PLAB_GPU_VRAM_BAR) & IORESOURCE_MEM)) {
		dev_err(&pdev->dev, "unexpected BAR layout\n");
		ret = -ENODEV;
		goto err_put;
	}
	regs = p2plab_pci_map(pdev, (const struct p2plab_pci_ident *)id->driver_data);
	if (IS_ERR(regs)) {
		ret = PTR_ERR(regs);
		goto err_put;
	}
	gpu->regs = regs;
	gpu->vram_phys = pci_resource_start(pdev, P2PLAB_GPU_VRAM_BAR);
	gpu->vram_size = pci_resource_len(pdev, P2PLAB_GPU_VRAM_BAR);
	gpu->vram_bus = pci_bus_address(pdev, P2PLAB_GPU_VRAM_BAR);
	if (readq(gpu->regs + REG_VRAM_SIZE) != gpu->vram_size)
		dev_warn(&pdev->dev, "BAR2 is %llu bytes but the device reports %llu\n",
			 gpu->vram_size, readq(gpu->regs + REG_VRAM_SIZE));

	if (!engine_stop(gpu)) {
		ret = -EIO;
		goto err_unmap;
	}

	gpu->ring = dma_alloc_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring),
				       &gpu->ring_dma, GFP_KERNEL);
	if (!gpu->ring) {
		ret = -ENOMEM;
		goto err_unmap;
	}
	gpu->record_pool = dma_pool_create(DRV_NAME, &pdev->dev,
					   sizeof(struct p2plab_gpu_hw_completion), 16, 0);
	if (!gpu->record_pool) {
		ret = -ENOMEM;
		goto err_ring;
	}

	ret = p2plab_pci_irq_setup(pdev, p2plab_gpu_irq, gpu);
	if (ret < 0)
		goto err_pool;
	gpu->irq = ret;
	gpu->msix = pdev->msix_enabled;

	ret = engine_start(gpu);
	if (ret)
		goto err_irq;

	publish_p2pmem(gpu);

	ret = p2plab_chrdevs_add(&gpu->cdev, &gpu->dev, &p2plab_gpu_fops);
	if (ret)
		goto err_engine;
	pci_set_drvdata(pdev, gpu);

	dev_info(&pdev->dev, "%s: %llu MiB VRAM at %pa, %s, ring of %u, p2pmem %s\n",
		 dev_name(&gpu->dev), gpu->vram_size >> 20, &gpu->vram_phys,
		 gpu->msix ? "MSI-X" : "INTx", gpu->ring_entries,
		 gpu->p2pmem ? "published" : "off");
	return 0;

err_engine:
	engine_stop(gpu);
err_irq:
	p2plab_pci_irq_teardown(pdev, gpu->irq, gpu);
err_pool:
	dma_pool_destroy(gpu->record_pool);
err_ring:
	dma_free_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring), gpu->ring,
			  gpu->ring_dma);
err_unmap:
	p2plab_pci_unmap(pdev, gpu->regs);
err_put:
	put_device(&gpu->dev);
	return ret;
}

static void p2plab_gpu_remove(struct pci_dev *pdev)
{
	struct p2plab_gpu *gpu = pci_get_drvdata(pdev);
	struct gpu_file *gf;
	bool idle;

	/* No new opens; wake everyone who sleeps on the device. */
	cdev_device_del(&gpu->cdev, &gpu->dev);
	WRITE_ONCE(gpu->removing, true);
	wake_up_all(&gpu->wq);

	/*
	 * Importers stop their DMA (free callbacks, dma-buf invalidation)
	 * and the VRAM goes back to p2pdma before devres tears it down.
	 */
	mutex_lock(&gpu->alloc_lock);
	gpu->allocs_closed = true;
	mutex_unlock(&gpu->alloc_lock);
	revoke_all_allocs(gpu, REVOKE_UNBIND, "unbind");

	/* Zap VRAM mappings: later accesses get SIGBUS, not a stale BAR. */
	mutex_lock(&gpu->map_lock);
	gpu->unmapped = true;
	mutex_lock(&gpu->files_lock);
	list_for_each_entry(gf, &gpu->files, node)
		unmap_mapping_range(gf->filp->f_mapping, 0, 0, 1);
	mutex_unlock(&gpu->files_lock);
	mutex_unlock(&gpu->map_lock);

	down_write(&gpu->hw_lock);
	gpu->dead = true;
	idle = engine_stop(gpu);
	p2plab_pci_irq_teardown(pdev, gpu->irq, gpu);
	if (idle) {
		reap_zombies(gpu, true);
		dma_pool_destroy(gpu->record_pool);
		dma_free_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring),
				  gpu->ring, gpu->ring_dma);
	} else {
		/* The device may still write there: leaking beats corrupting. */
		dev_err(&pdev->dev, "leaking DMA memory of a device that did not stop\n");
	}
	p2plab_pci_unmap(pdev, gpu->regs);
	gpu->regs = NULL;
	up_write(&gpu->hw_lock);

	dev_info(&pdev->dev, "%s removed\n", dev_name(&gpu->dev));
	put_device(&gpu->dev);
}

/*
 * A function reset (e.g. /sys/bus/pci/devices/.../reset) wipes the device's
 * registers. Jobs in flight are cancelled (ECANCELED), the ring is set up
 * again afterwards.
 */
static void p2plab_gpu_reset_prepare(struct pci_dev *pdev)
{
	struct p2plab_gpu *gpu = pci_get_drvdata(pdev);

	WRITE_ONCE(gpu->resetting, true);
	wake_up_all(&gpu->wq);
	/* A reset loses VRAM: importers must stop using it first. */
	revoke_all_allocs(gpu, REVOKE_RESET, "a function reset");
	down_write(&gpu->hw_lock);
	if (engine_stop(gpu))
		reap_zombies(gpu, true);
}

static void p2plab_gpu_reset_done(struct pci_dev *pdev)
{
	struct p2plab_gpu *gpu = pci_get_drvdata(pdev);

	/* Only safe to reuse the ring if the engine really stopped before. */
	if (!READ_ONCE(gpu->broken) && list_empty(&gpu->zombies)) {
		if (engine_start(gpu))
			WRITE_ONCE(gpu->broken, true);
	} else {
		WRITE_ONCE(gpu->broken, true);
	}
	if (READ_ONCE(gpu->broken))
		dev_err(&pdev->dev, "engine not restarted after reset; rebind the driver\n");
	WRITE_ONCE(gpu->resetting, false);
	up_write(&gpu->hw_lock);
}

static const struct pci_error_handlers p2plab_gpu_err_handlers = {
	.reset_prepare = p2plab_gpu_reset_prepare,
	.reset_done = p2plab_gpu_reset_done,
};

/* What a device with these IDs must say in BAR0 to be driven. */
static const struct p2plab_pci_ident p2plab_gpu_ident = {
	.what = "GPU",
	.regs = { P2PLAB_GPU_REGS_BAR, P2PLAB_GPU_REGS_BAR_SIZE },
	.id = { REG_ID, P2PLAB_GPU_ID_MAGIC },
	.version = { REG_VERSION, P2PLAB_GPU_VERSION_MAJOR },
};

static const struct pci_device_id p2plab_gpu_ids[] = {
	{ PCI_DEVICE(P2PLAB_GPU_VENDOR_ID, P2PLAB_GPU_DEVICE_ID),
	  .driver_data = (kernel_ulong_t)&p2plab_gpu_ident },
	{ }
};
MODULE_DEVICE_TABLE(pci, p2plab_gpu_ids);

static struct pci_driver p2plab_gpu_driver = {
	.name = DRV_NAME,
	.id_table = p2plab_gpu_ids,
	.probe = p2plab_gpu_probe,
	.remove = p2plab_gpu_remove,
	.err_handler = &p2plab_gpu_err_handlers,
};

static int __init p2plab_gpu_init(void)
{
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_hw_cmd) != 64);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_hw_completion) != 16);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_info) != 96);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_job) != 56);
	/* NVIDIA's layouts, as a module built for NVIDIA's driver sees them. */
	BUILD_BUG_ON(sizeof(struct nvidia_p2p_page) != 32);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_page_table, pages) != 8);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_page_table, entries) != 16);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_page_table, gpu_uuid) != 24);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_page_table, flags) != 32);
	BUILD_BUG_ON(sizeof(struct nvidia_p2p_page_table) != 40);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_dma_mapping, entries) != 8);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_dma_mapping, dma_addresses) != 16);
	BUILD_BUG_ON(offsetof(struct nvidia_p2p_dma_mapping, pci_dev) != 32);
	BUILD_BUG_ON(sizeof(struct nvidia_p2p_dma_mapping) != 40);
	return p2plab_chrdevs_register(&p2plab_gpu_chrdevs, &p2plab_gpu_driver);
}

static void __exit p2plab_gpu_exit(void)
{
	p2plab_chrdevs_unregister(&p2plab_gpu_chrdevs, &p2plab_gpu_driver);
}

module_init(p2plab_gpu_init);
module_exit(p2plab_gpu_exit);

MODULE_DESCRIPTION("p2plab GPU-like device: copy engine, VRAM as P2PDMA memory");
MODULE_LICENSE("GPL");
