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
 *
 * Lifetime: the char device's struct device owns the driver state, so open
 * files keep it alive after the PCI device is unbound; from then on every
 * file operation fails with -ENODEV and VRAM mappings are zapped (SIGBUS).
 */

#include <linux/capability.h>
#include <linux/cdev.h>
#include <linux/dma-mapping.h>
#include <linux/dmapool.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/iopoll.h>
#include <linux/list.h>
#include <linux/minmax.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/rwsem.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "p2plab_gpu_hw.h"
#include "p2plab_gpu_uapi.h"

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

#ifndef PCI_IRQ_INTX
#define PCI_IRQ_INTX PCI_IRQ_LEGACY
#endif

static unsigned int ring_entries = 256;
module_param(ring_entries, uint, 0444);
MODULE_PARM_DESC(ring_entries, "Command ring entries per device, a power of two in 2..65536 (default 256)");

static unsigned long p2pmem_max_mb;
module_param(p2pmem_max_mb, ulong, 0444);
MODULE_PARM_DESC(p2pmem_max_mb, "Publish at most this many MiB of VRAM as p2pmem (0 = the whole BAR, default)");

static dev_t p2plab_gpu_devt;
static DEFINE_IDA(p2plab_gpu_ida);
static const struct class p2plab_gpu_class = {
	.name = "p2plab-gpu",
};

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
	int id;

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
	u32 cause = readl(gpu->regs + REG_INT_STATUS);

	if (!cause || cause == ~0u)
		return IRQ_NONE;
	writel(cause, gpu->regs + REG_INT_STATUS);
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

static long p2plab_gpu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct gpu_file *gf = filp->private_data;

	switch (cmd) {
	case P2PLAB_GPU_IOC_INFO:
		return ioctl_info(gf->gpu, (void __user *)arg);
	case P2PLAB_GPU_IOC_SUBMIT:
		return ioctl_submit(gf->gpu, (void __user *)arg);
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
	&dev_attr_vram_errors.attr,
	&dev_attr_vram_error_addr.attr,
	NULL,
};
ATTRIBUTE_GROUPS(p2plab_gpu);

/* ---- PCI driver ---- */

static void p2plab_gpu_release_dev(struct device *dev)
{
	struct p2plab_gpu *gpu = container_of(dev, struct p2plab_gpu, dev);

	ida_free(&p2plab_gpu_ida, gpu->id);
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
}

static int p2plab_gpu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct p2plab_gpu *gpu;
	u32 magic, version;
	int ret;

	if (!is_power_of_2(ring_entries) || ring_entries < MIN_RING_ENTRIES ||
	    ring_entries > MAX_RING_ENTRIES) {
		dev_err(&pdev->dev, "ring_entries=%u is not a power of two in 2..65536\n",
			ring_entries);
		return -EINVAL;
	}

	gpu = kzalloc(sizeof(*gpu), GFP_KERNEL);
	if (!gpu)
		return -ENOMEM;
	gpu->id = ida_alloc_max(&p2plab_gpu_ida, P2PLAB_GPU_MINORS - 1, GFP_KERNEL);
	if (gpu->id < 0) {
		ret = gpu->id;
		kfree(gpu);
		return ret;
	}
	/* From here on put_device() frees gpu and its id. */
	device_initialize(&gpu->dev);
	gpu->dev.class = &p2plab_gpu_class;
	gpu->dev.parent = &pdev->dev;
	gpu->dev.devt = MKDEV(MAJOR(p2plab_gpu_devt), gpu->id);
	gpu->dev.release = p2plab_gpu_release_dev;
	gpu->dev.groups = p2plab_gpu_groups;
	dev_set_drvdata(&gpu->dev, gpu);
	ret = dev_set_name(&gpu->dev, "p2plab-gpu%d", gpu->id);
	if (ret)
		goto err_put;

	gpu->pdev = pdev;
	gpu->ring_entries = ring_entries;
	init_rwsem(&gpu->hw_lock);
	mutex_init(&gpu->submit_lock);
	mutex_init(&gpu->map_lock);
	mutex_init(&gpu->files_lock);
	spin_lock_init(&gpu->zombie_lock);
	INIT_LIST_HEAD(&gpu->zombies);
	INIT_LIST_HEAD(&gpu->files);
	init_waitqueue_head(&gpu->wq);
	atomic64_set(&gpu->completed_fence, 0);

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto err_put;
	ret = pci_request_mem_regions(pdev, DRV_NAME);
	if (ret)
		goto err_disable;
	if (pci_resource_len(pdev, P2PLAB_GPU_REGS_BAR) < P2PLAB_GPU_REGS_BAR_SIZE ||
	    !(pci_resource_flags(pdev, P2PLAB_GPU_VRAM_BAR) & IORESOURCE_MEM)) {
		dev_err(&pdev->dev, "unexpected BAR layout\n");
		ret = -ENODEV;
		goto err_release;
	}
	gpu->regs = pci_iomap(pdev, P2PLAB_GPU_REGS_BAR, P2PLAB_GPU_REGS_BAR_SIZE);
	if (!gpu->regs) {
		ret = -ENOMEM;
		goto err_release;
	}
	magic = readl(gpu->regs + REG_ID);
	version = readl(gpu->regs + REG_VERSION);
	if (magic != P2PLAB_GPU_ID_MAGIC || version >> 16 != P2PLAB_GPU_VERSION_MAJOR) {
		dev_err(&pdev->dev, "not a p2plab GPU v1 (id %#x, version %#x)\n", magic,
			version);
		ret = -ENODEV;
		goto err_unmap;
	}
	gpu->vram_phys = pci_resource_start(pdev, P2PLAB_GPU_VRAM_BAR);
	gpu->vram_size = pci_resource_len(pdev, P2PLAB_GPU_VRAM_BAR);
	gpu->vram_bus = pci_bus_address(pdev, P2PLAB_GPU_VRAM_BAR);
	if (readq(gpu->regs + REG_VRAM_SIZE) != gpu->vram_size)
		dev_warn(&pdev->dev, "BAR2 is %llu bytes but the device reports %llu\n",
			 gpu->vram_size, readq(gpu->regs + REG_VRAM_SIZE));

	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		goto err_unmap;
	pci_set_master(pdev);
	if (!engine_stop(gpu)) {
		ret = -EIO;
		goto err_master;
	}

	gpu->ring = dma_alloc_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring),
				       &gpu->ring_dma, GFP_KERNEL);
	if (!gpu->ring) {
		ret = -ENOMEM;
		goto err_master;
	}
	gpu->record_pool = dma_pool_create(DRV_NAME, &pdev->dev,
					   sizeof(struct p2plab_gpu_hw_completion), 16, 0);
	if (!gpu->record_pool) {
		ret = -ENOMEM;
		goto err_ring;
	}

	ret = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSIX | PCI_IRQ_INTX);
	if (ret < 0)
		goto err_pool;
	gpu->msix = pdev->msix_enabled;
	gpu->irq = pci_irq_vector(pdev, 0);
	ret = request_irq(gpu->irq, p2plab_gpu_irq, IRQF_SHARED, DRV_NAME, gpu);
	if (ret)
		goto err_vectors;

	ret = engine_start(gpu);
	if (ret)
		goto err_irq;

	publish_p2pmem(gpu);

	cdev_init(&gpu->cdev, &p2plab_gpu_fops);
	gpu->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&gpu->cdev, &gpu->dev);
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
	free_irq(gpu->irq, gpu);
err_vectors:
	pci_free_irq_vectors(pdev);
err_pool:
	dma_pool_destroy(gpu->record_pool);
err_ring:
	dma_free_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring), gpu->ring,
			  gpu->ring_dma);
err_master:
	pci_clear_master(pdev);
err_unmap:
	pci_iounmap(pdev, gpu->regs);
err_release:
	pci_release_mem_regions(pdev);
err_disable:
	pci_disable_device(pdev);
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
	free_irq(gpu->irq, gpu);
	pci_free_irq_vectors(pdev);
	if (idle) {
		reap_zombies(gpu, true);
		dma_pool_destroy(gpu->record_pool);
		dma_free_coherent(&pdev->dev, (size_t)gpu->ring_entries * sizeof(*gpu->ring),
				  gpu->ring, gpu->ring_dma);
	} else {
		/* The device may still write there: leaking beats corrupting. */
		dev_err(&pdev->dev, "leaking DMA memory of a device that did not stop\n");
	}
	pci_clear_master(pdev);
	pci_iounmap(pdev, gpu->regs);
	gpu->regs = NULL;
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
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

static const struct pci_device_id p2plab_gpu_ids[] = {
	{ PCI_DEVICE(P2PLAB_GPU_VENDOR_ID, P2PLAB_GPU_DEVICE_ID) },
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
	int ret;

	BUILD_BUG_ON(sizeof(struct p2plab_gpu_hw_cmd) != 64);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_hw_completion) != 16);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_info) != 96);
	BUILD_BUG_ON(sizeof(struct p2plab_gpu_job) != 56);

	ret = alloc_chrdev_region(&p2plab_gpu_devt, 0, P2PLAB_GPU_MINORS, "p2plab-gpu");
	if (ret)
		return ret;
	ret = class_register(&p2plab_gpu_class);
	if (ret)
		goto err_chrdev;
	ret = pci_register_driver(&p2plab_gpu_driver);
	if (ret)
		goto err_class;
	return 0;

err_class:
	class_unregister(&p2plab_gpu_class);
err_chrdev:
	unregister_chrdev_region(p2plab_gpu_devt, P2PLAB_GPU_MINORS);
	return ret;
}

static void __exit p2plab_gpu_exit(void)
{
	pci_unregister_driver(&p2plab_gpu_driver);
	class_unregister(&p2plab_gpu_class);
	unregister_chrdev_region(p2plab_gpu_devt, P2PLAB_GPU_MINORS);
	ida_destroy(&p2plab_gpu_ida);
}

module_init(p2plab_gpu_init);
module_exit(p2plab_gpu_exit);

MODULE_DESCRIPTION("p2plab GPU-like device: copy engine, VRAM as P2PDMA memory");
MODULE_LICENSE("GPL");
