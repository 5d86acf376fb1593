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
 * - VRAM allocations (carved from the published p2pmem), exported to other
 *   kernel modules through the peer-memory API of p2plab_p2p.h and to
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
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/rwsem.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "p2plab_gpu_hw.h"
#include "p2plab_gpu_uapi.h"
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
	u32 next_handle;
	bool allocs_closed;		/* remove started: no new allocations */
	struct p2pdma_provider *provider;	/* BAR2 for dma-buf mappings */
	atomic_t p2p_revocations;	/* free callbacks run */
	atomic_t dmabuf_revocations;	/* dma-bufs invalidated by a revoke */

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

/* ---- VRAM allocations, the peer-memory API and dma-buf export ---- */

MODULE_IMPORT_NS("DMA_BUF");

static const struct file_operations p2plab_gpu_fops;

/*
 * A VRAM allocation. The owning file's reference is dropped when it is
 * freed; pins and dma-bufs hold their own. The VRAM itself goes back to
 * the p2pmem pool at revocation, after every importer was told.
 */
struct gpu_alloc {
	struct kref ref;
	struct list_head node;		/* gpu->allocs while owned, under alloc_lock */
	struct p2plab_gpu *gpu;		/* holds a reference on gpu->dev */
	struct gpu_file *owner;		/* NULL once freed by its owner */
	u32 handle;
	u64 offset;			/* in VRAM */
	u64 size;
	void *p2p_va;			/* from pci_alloc_p2pmem; NULL once revoked */
	bool revoked;			/* under alloc_lock */
	struct list_head pins;		/* struct gpu_pin, under alloc_lock */
	struct list_head dmabufs;	/* struct gpu_dmabuf, under alloc_lock */
};

/* One p2plab_p2p_get_pages() result; the page table is its first member. */
struct gpu_pin {
	struct p2plab_p2p_page_table pt;
	struct list_head node;		/* alloc->pins until put or revoked */
	struct gpu_alloc *alloc;	/* reference */
	void (*free_callback)(void *data);
	void *data;
	bool revoked;			/* under alloc_lock */
	unsigned int mappings;		/* under alloc_lock */
};

struct gpu_p2p_map {
	struct p2plab_p2p_dma_mapping map;
	struct sg_table sgt;
};

struct gpu_dmabuf {
	struct dma_buf *dmabuf;
	struct gpu_alloc *alloc;	/* reference */
	struct list_head node;		/* alloc->dmabufs, under alloc_lock */
	struct phys_vec range;
	struct p2pdma_provider *provider;
	bool revoked;			/* under the dma-buf's reservation lock */
};

static void alloc_release(struct kref *ref)
{
	struct gpu_alloc *a = container_of(ref, struct gpu_alloc, ref);

	WARN_ON(a->p2p_va);
	put_device(&a->gpu->dev);
	kfree(a);
}

static void alloc_put(struct gpu_alloc *a)
{
	kref_put(&a->ref, alloc_release);
}

/*
 * Takes @a out of service: every pinned page table gets its free callback,
 * every dma-buf is invalidated, user mappings of the range are zapped, and
 * only then does the VRAM go back to the pool. Idempotent; sleeps.
 */
static void alloc_revoke(struct gpu_alloc *a)
{
	struct p2plab_gpu *gpu = a->gpu;
	struct gpu_pin *pin, *tmp;
	struct gpu_dmabuf *db;
	struct gpu_file *gf;
	LIST_HEAD(pins);
	void *va;

	mutex_lock(&gpu->alloc_lock);
	if (a->revoked) {
		mutex_unlock(&gpu->alloc_lock);
		return;
	}
	a->revoked = true;
	list_splice_init(&a->pins, &pins);
	list_for_each_entry(pin, &pins, node)
		pin->revoked = true;
	list_for_each_entry(db, &a->dmabufs, node) {
		/* A dma-buf being released has no importers left to tell. */
		if (!get_file_active(&db->dmabuf->file))
			continue;
		dma_resv_lock(db->dmabuf->resv, NULL);
		db->revoked = true;
		dma_buf_invalidate_mappings(db->dmabuf);
		dma_resv_unlock(db->dmabuf->resv);
		atomic_inc(&gpu->dmabuf_revocations);
		fput(db->dmabuf->file);
	}
	va = a->p2p_va;
	a->p2p_va = NULL;
	mutex_unlock(&gpu->alloc_lock);

	/* No lock held: the callbacks may sleep and call back into us. */
	list_for_each_entry_safe(pin, tmp, &pins, node) {
		list_del_init(&pin->node);
		atomic_inc(&gpu->p2p_revocations);
		/* The callback frees the page table (and pin) itself. */
		pin->free_callback(pin->data);
	}

	mutex_lock(&gpu->files_lock);
	list_for_each_entry(gf, &gpu->files, node)
		unmap_mapping_range(gf->filp->f_mapping, a->offset, a->size, 1);
	mutex_unlock(&gpu->files_lock);

	if (va)
		pci_free_p2pmem(gpu->pdev, va, a->size);
}

/* Revokes every allocation (reset, unbind); owners keep their handles. */
static void revoke_all_allocs(struct p2plab_gpu *gpu)
{
	struct gpu_alloc *a;

	for (;;) {
		struct gpu_alloc *found = NULL;

		mutex_lock(&gpu->alloc_lock);
		list_for_each_entry(a, &gpu->allocs, node) {
			if (!a->revoked) {
				kref_get(&a->ref);
				found = a;
				break;
			}
		}
		mutex_unlock(&gpu->alloc_lock);
		if (!found)
			return;
		alloc_revoke(found);
		alloc_put(found);
	}
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
	size = PAGE_ALIGN(arg.size);
	if (!gpu->p2pmem || !gpu->provider)
		return -ENODEV;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	kref_init(&a->ref);
	INIT_LIST_HEAD(&a->pins);
	INIT_LIST_HEAD(&a->dmabufs);
	a->gpu = gpu;
	get_device(&gpu->dev);
	a->size = size;

	mutex_lock(&gpu->alloc_lock);
	if (gpu->allocs_closed || READ_ONCE(gpu->resetting)) {
		ret = -ENODEV;
		goto err_unlock;
	}
	a->p2p_va = pci_alloc_p2pmem(gpu->pdev, size);
	if (!a->p2p_va) {
		ret = -ENOMEM;
		goto err_unlock;
	}
	a->offset = pci_p2pmem_virt_to_bus(gpu->pdev, a->p2p_va) - gpu->vram_bus;
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
		alloc_revoke(a);
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
	alloc_revoke(a);
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
		alloc_revoke(found);
		alloc_put(found);
	}
}

/* -- peer-memory API (p2plab_p2p.h) -- */

int p2plab_p2p_get_pages(u64 user_va, u64 len, struct p2plab_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct p2plab_gpu *gpu = NULL;
	struct gpu_alloc *a, *alloc = NULL;
	struct file *file = NULL;
	struct gpu_pin *pin;
	u64 offset = 0, entries, i;
	int ret;

	might_sleep();
	if (!page_table || !free_callback || !len || !PAGE_ALIGNED(user_va) ||
	    !PAGE_ALIGNED(len) || user_va + len < user_va)
		return -EINVAL;
	entries = len >> PAGE_SHIFT;
	if (entries > U32_MAX || !mm)
		return -EINVAL;

	mmap_read_lock(mm);
	vma = vma_lookup(mm, user_va);
	if (vma && vma->vm_file && vma->vm_file->f_op == &p2plab_gpu_fops &&
	    user_va + len <= vma->vm_end) {
		file = get_file(vma->vm_file);
		offset = ((u64)vma->vm_pgoff << PAGE_SHIFT) + (user_va - vma->vm_start);
	}
	mmap_read_unlock(mm);
	if (!file)
		return -EFAULT;
	gpu = ((struct gpu_file *)file->private_data)->gpu;

	pin = kzalloc(sizeof(*pin), GFP_KERNEL);
	if (!pin) {
		ret = -ENOMEM;
		goto out_file;
	}
	pin->pt.phys = kvmalloc_array(entries, sizeof(u64), GFP_KERNEL);
	if (!pin->pt.phys) {
		ret = -ENOMEM;
		goto err_pin;
	}

	mutex_lock(&gpu->alloc_lock);
	if (gpu->allocs_closed || READ_ONCE(gpu->resetting)) {
		ret = -ENODEV;
		goto err_unlock;
	}
	list_for_each_entry(a, &gpu->allocs, node) {
		if (!a->revoked && offset >= a->offset && offset + len <= a->offset + a->size) {
			alloc = a;
			break;
		}
	}
	if (!alloc) {
		ret = -EFAULT;
		goto err_unlock;
	}
	kref_get(&alloc->ref);
	pin->alloc = alloc;
	pin->free_callback = free_callback;
	pin->data = data;
	pin->pt.version = P2PLAB_P2P_PAGE_TABLE_VERSION;
	pin->pt.page_size = P2PLAB_P2P_PAGE_SIZE;
	pin->pt.entries = entries;
	pin->pt.vram_offset = offset;
	pin->pt.gpu = gpu->pdev;
	pin->pt.priv = pin;
	for (i = 0; i < entries; i++)
		pin->pt.phys[i] = gpu->vram_phys + offset + (i << PAGE_SHIFT);
	list_add_tail(&pin->node, &alloc->pins);
	mutex_unlock(&gpu->alloc_lock);

	*page_table = &pin->pt;
	ret = 0;
	goto out_file;

err_unlock:
	mutex_unlock(&gpu->alloc_lock);
	kvfree(pin->pt.phys);
err_pin:
	kfree(pin);
out_file:
	fput(file);
	return ret;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_get_pages);

static struct gpu_pin *pt_pin(struct p2plab_p2p_page_table *pt)
{
	return pt && pt->version == P2PLAB_P2P_PAGE_TABLE_VERSION ? pt->priv : NULL;
}

/*
 * DMA-maps the pinned pages for @peer the way the kernel maps P2PDMA pages
 * for any driver (dma_map_sgtable on ZONE_DEVICE p2p pages): bus addresses
 * behind a common switch, a regular mapping through an allowed host
 * bridge, -EREMOTEIO otherwise. The distance check before it puts the
 * kernel's reason for a refusal in dmesg.
 */
int p2plab_p2p_dma_map_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			     struct p2plab_p2p_dma_mapping **dma_mapping)
{
	struct gpu_pin *pin = pt_pin(page_table);
	struct device *client;
	struct scatterlist *sg;
	struct p2plab_gpu *gpu;
	struct gpu_p2p_map *m;
	struct page **pages;
	u32 i, n;
	int ret;

	might_sleep();
	if (!pin || !peer || !dma_mapping)
		return -EINVAL;
	gpu = pin->alloc->gpu;
	if (READ_ONCE(pin->revoked))
		return -ENODEV;
	client = &peer->dev;
	if (pci_p2pdma_distance_many(gpu->pdev, &client, 1, true) < 0)
		return -EINVAL;

	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->map.dma_addresses = kvmalloc_array(page_table->entries, sizeof(dma_addr_t),
					      GFP_KERNEL);
	pages = kvmalloc_array(page_table->entries, sizeof(*pages), GFP_KERNEL);
	if (!m->map.dma_addresses || !pages) {
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
	for (i = 0; i < page_table->entries; i++)
		pages[i] = virt_to_page(pin->alloc->p2p_va +
					(page_table->vram_offset - pin->alloc->offset) +
					((u64)i << PAGE_SHIFT));
	pin->mappings++;
	mutex_unlock(&gpu->alloc_lock);

	ret = sg_alloc_table_from_pages(&m->sgt, pages, page_table->entries, 0,
					(u64)page_table->entries << PAGE_SHIFT, GFP_KERNEL);
	if (ret)
		goto err_count;
	ret = dma_map_sgtable(&peer->dev, &m->sgt, DMA_BIDIRECTIONAL, DMA_ATTR_SKIP_CPU_SYNC);
	if (ret) {
		dev_warn(&peer->dev, "p2plab_gpu %s: DMA mapping of VRAM refused: %d\n",
			 pci_name(gpu->pdev), ret);
		ret = -EINVAL;
		goto err_sgt;
	}
	m->map.map_type = PCI_P2PDMA_MAP_THRU_HOST_BRIDGE;
	n = 0;
	for_each_sgtable_dma_sg(&m->sgt, sg, i) {
		dma_addr_t addr = sg_dma_address(sg);
		unsigned int left = sg_dma_len(sg);

		if (sg_dma_is_bus_address(sg))
			m->map.map_type = PCI_P2PDMA_MAP_BUS_ADDR;
		for (; left && n < page_table->entries; left -= min(left, PAGE_SIZE)) {
			m->map.dma_addresses[n++] = addr;
			addr += PAGE_SIZE;
		}
	}
	if (WARN_ON_ONCE(n != page_table->entries)) {
		ret = -EIO;
		goto err_unmap;
	}
	kvfree(pages);
	m->map.version = P2PLAB_P2P_DMA_MAPPING_VERSION;
	m->map.entries = page_table->entries;
	m->map.page_size = P2PLAB_P2P_PAGE_SIZE;
	m->map.peer = pci_dev_get(peer);
	m->map.pt = page_table;
	m->map.priv = m;
	*dma_mapping = &m->map;
	return 0;

err_unmap:
	dma_unmap_sgtable(&peer->dev, &m->sgt, DMA_BIDIRECTIONAL, DMA_ATTR_SKIP_CPU_SYNC);
err_sgt:
	sg_free_table(&m->sgt);
err_count:
	mutex_lock(&gpu->alloc_lock);
	pin->mappings--;
	mutex_unlock(&gpu->alloc_lock);
err_free:
	kvfree(pages);
	kvfree(m->map.dma_addresses);
	kfree(m);
	return ret;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_dma_map_pages);

static void p2p_map_free(struct gpu_p2p_map *m)
{
	struct gpu_pin *pin = pt_pin(m->map.pt);
	struct p2plab_gpu *gpu = pin->alloc->gpu;

	dma_unmap_sgtable(&m->map.peer->dev, &m->sgt, DMA_BIDIRECTIONAL,
			  DMA_ATTR_SKIP_CPU_SYNC);
	sg_free_table(&m->sgt);
	mutex_lock(&gpu->alloc_lock);
	pin->mappings--;
	mutex_unlock(&gpu->alloc_lock);
	pci_dev_put(m->map.peer);
	kvfree(m->map.dma_addresses);
	kfree(m);
}

static struct gpu_p2p_map *map_of(struct p2plab_p2p_dma_mapping *map)
{
	return map && map->version == P2PLAB_P2P_DMA_MAPPING_VERSION ? map->priv : NULL;
}

int p2plab_p2p_dma_unmap_pages(struct pci_dev *peer, struct p2plab_p2p_page_table *page_table,
			       struct p2plab_p2p_dma_mapping *dma_mapping)
{
	struct gpu_p2p_map *m = map_of(dma_mapping);

	might_sleep();
	if (!m || !pt_pin(page_table) || dma_mapping->pt != page_table || dma_mapping->peer != peer)
		return -EINVAL;
	p2p_map_free(m);
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_dma_unmap_pages);

int p2plab_p2p_free_dma_mapping(struct p2plab_p2p_dma_mapping *dma_mapping)
{
	struct gpu_p2p_map *m = map_of(dma_mapping);

	might_sleep();
	if (!m)
		return -EINVAL;
	p2p_map_free(m);
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_free_dma_mapping);

static void pin_free(struct gpu_pin *pin)
{
	struct gpu_alloc *a = pin->alloc;

	pin->pt.version = 0;	/* a stale pointer fails the version check */
	kvfree(pin->pt.phys);
	kfree(pin);
	alloc_put(a);
}

int p2plab_p2p_put_pages(struct p2plab_p2p_page_table *page_table)
{
	struct gpu_pin *pin = pt_pin(page_table);
	struct p2plab_gpu *gpu;

	might_sleep();
	if (!pin)
		return -EINVAL;
	gpu = pin->alloc->gpu;
	mutex_lock(&gpu->alloc_lock);
	if (pin->revoked) {
		/* The free callback owns the table now. */
		mutex_unlock(&gpu->alloc_lock);
		return -ENOENT;
	}
	if (pin->mappings) {
		mutex_unlock(&gpu->alloc_lock);
		return -EBUSY;
	}
	list_del(&pin->node);
	mutex_unlock(&gpu->alloc_lock);
	pin_free(pin);
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_put_pages);

int p2plab_p2p_free_page_table(struct p2plab_p2p_page_table *page_table)
{
	struct gpu_pin *pin = pt_pin(page_table);
	struct p2plab_gpu *gpu;
	bool ok;

	might_sleep();
	if (!pin)
		return -EINVAL;
	gpu = pin->alloc->gpu;
	mutex_lock(&gpu->alloc_lock);
	ok = pin->revoked && !pin->mappings;
	mutex_unlock(&gpu->alloc_lock);
	if (!ok) {
		/* Not from a callback, or mappings left: leaking beats a use after free. */
		pr_warn_ratelimited(DRV_NAME ": free_page_table %s\n",
				    pin->revoked ? "with DMA mappings left" : "outside the free callback");
		return pin->revoked ? -EBUSY : -EINVAL;
	}
	pin_free(pin);
	return 0;
}
EXPORT_SYMBOL_GPL(p2plab_p2p_free_page_table);

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
	init_rwsem(&gpu->hw_lock);
	mutex_init(&gpu->submit_lock);
	mutex_init(&gpu->map_lock);
	mutex_init(&gpu->files_lock);
	mutex_init(&gpu->alloc_lock);
	INIT_LIST_HEAD(&gpu->allocs);
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
	revoke_all_allocs(gpu);

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
	revoke_all_allocs(gpu);
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
