// SPDX-License-Identifier: GPL-2.0
/*
 * p2plab_nic: Linux driver for p2plab's NIC-like PCIe DMA device.
 *
 * - BAR0: control registers; BAR4: MSI-X.
 * - A TX and an RX descriptor ring in coherent DMA memory; the device
 *   writes each descriptor's status back in place, in ring order.
 * - /dev/p2plab-nicN: a verbs-shaped API (p2plab_nic_uapi.h): register
 *   memory regions, post sends and receives (cut into frames), poll
 *   completions.
 *
 * Regions: user RAM is pinned with pin_user_pages (FOLL_LONGTERM) and each
 * page DMA-mapped for the NIC. GPU memory (a user mapping of a p2plab_gpu
 * VRAM allocation) is pinned and mapped through the GPU driver's
 * peer-memory API (p2plab_p2p.h), found with symbol_get so the NIC driver
 * loads without the GPU driver. When the GPU driver revokes the pages
 * (the allocation is freed, its owner exits, the GPU is reset or unbound),
 * its free callback quiesces the NIC, completes the region's posts as
 * revoked and frees the mapping; later posts on the region fail with
 * ENOLINK.
 *
 * A dma-buf (e.g. one the GPU driver exports from a VRAM allocation) is
 * imported with dma_buf_dynamic_attach and allow_peer2peer, so the
 * exporter and the kernel's P2P distance check decide the addresses. Its
 * invalidate_mappings callback (the exporter moving or revoking the
 * buffer) revokes the region the same way.
 *
 * Locks: mr_lock (regions, posts) is taken before a dma-buf's reservation
 * lock; ring_lock (stop, flush, restart of the rings) after either. The
 * dma-buf callback runs under the reservation lock, so it takes ring_lock
 * only; a post checks the region's revoked flag again under the spinlock.
 *
 * Quiescing: the driver clears CTRL's ring enables, then waits for
 * STATUS.TX_BUSY/RX_BUSY to clear; from then on the device touches no
 * buffer, and every outstanding post completes as flushed. The rings run
 * only while the device is open; a closed NIC's receiver is off, so frames
 * still on the wire from an abandoned transfer are dropped, not delivered
 * into the next user's buffers.
 */

#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/scatterlist.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/iopoll.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "p2plab_nic_hw.h"
#include "p2plab_nic_uapi.h"
#include "p2plab_p2p.h"
#include "p2plab_pci.h"

#define DRV_NAME		"p2plab_nic"
#define P2PLAB_NIC_MINORS	16
#define NIC_PAGE		4096u
#define QUIESCE_TIMEOUT_US	(3 * USEC_PER_SEC)

static unsigned int ring_entries = 256;
module_param(ring_entries, uint, 0444);
MODULE_PARM_DESC(ring_entries, "Descriptors per ring, a power of two in 2..4096 (default 256)");

static P2PLAB_CHRDEVS(p2plab_nic_chrdevs, "p2plab-nic", P2PLAB_NIC_MINORS);

struct p2plab_nic;

struct nic_mr {
	struct p2plab_nic *nic;
	u32 handle;
	u32 source;
	u64 length;
	u32 npages;
	u32 seg;		/* frames never cross a multiple of this */
	dma_addr_t *dma;	/* [npages] the NIC's address of each 4 KiB page */
	struct page **pages;	/* SRC_RAM */
	atomic_t inflight;	/* frames posted and not completed */
	bool revoked;
	/* SRC_GPU: the GPU driver's pin and mapping (NULL once revoked). */
	struct p2plab_p2p_page_table *pt;
	struct p2plab_p2p_dma_mapping *map;
	u32 map_type;
	/* Deregistered while its revocation ran: the callback frees it. */
	bool orphan;
	/* SRC_DMABUF */
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
};

/* The GPU driver's peer-memory API, looked up on first use. */
static struct {
	struct mutex lock;
	bool got;
	typeof(&p2plab_p2p_get_pages) get_pages;
	typeof(&p2plab_p2p_dma_map_pages) dma_map_pages;
	typeof(&p2plab_p2p_dma_unmap_pages) dma_unmap_pages;
	typeof(&p2plab_p2p_put_pages) put_pages;
	typeof(&p2plab_p2p_free_page_table) free_page_table;
	typeof(&p2plab_p2p_free_dma_mapping) free_dma_mapping;
} p2p = { .lock = __MUTEX_INITIALIZER(p2p.lock) };

static void p2p_put_symbols(void)
{
	if (!p2p.got)
		return;
	symbol_put(p2plab_p2p_get_pages);
	symbol_put(p2plab_p2p_dma_map_pages);
	symbol_put(p2plab_p2p_dma_unmap_pages);
	symbol_put(p2plab_p2p_put_pages);
	symbol_put(p2plab_p2p_free_page_table);
	symbol_put(p2plab_p2p_free_dma_mapping);
	p2p.got = false;
}

/* Finds the peer-memory API; -EOPNOTSUPP without the GPU driver. */
static int p2p_get_symbols(void)
{
	int ret = 0;

	mutex_lock(&p2p.lock);
	if (!p2p.got) {
		p2p.get_pages = symbol_get(p2plab_p2p_get_pages);
		p2p.dma_map_pages = symbol_get(p2plab_p2p_dma_map_pages);
		p2p.dma_unmap_pages = symbol_get(p2plab_p2p_dma_unmap_pages);
		p2p.put_pages = symbol_get(p2plab_p2p_put_pages);
		p2p.free_page_table = symbol_get(p2plab_p2p_free_page_table);
		p2p.free_dma_mapping = symbol_get(p2plab_p2p_free_dma_mapping);
		p2p.got = true;
		if (!p2p.get_pages || !p2p.dma_map_pages || !p2p.dma_unmap_pages ||
		    !p2p.put_pages || !p2p.free_page_table || !p2p.free_dma_mapping) {
			/* symbol_put of a symbol not got is harmless. */
			if (p2p.get_pages) symbol_put(p2plab_p2p_get_pages);
			if (p2p.dma_map_pages) symbol_put(p2plab_p2p_dma_map_pages);
			if (p2p.dma_unmap_pages) symbol_put(p2plab_p2p_dma_unmap_pages);
			if (p2p.put_pages) symbol_put(p2plab_p2p_put_pages);
			if (p2p.free_page_table) symbol_put(p2plab_p2p_free_page_table);
			if (p2p.free_dma_mapping) symbol_put(p2plab_p2p_free_dma_mapping);
			p2p.got = false;
			ret = -EOPNOTSUPP;
		}
	}
	mutex_unlock(&p2p.lock);
	return ret;
}

struct nic_wr {
	u64 wr_id;
	u32 opcode;
	u32 frames;
	u32 frames_left;
	u32 status;
	u64 bytes;
	struct nic_mr *mr;
};

struct nic_ring {
	struct p2plab_nic_desc *desc;
	dma_addr_t desc_dma;
	struct nic_wr **wr;	/* [entries] the post each slot belongs to */
	u32 head;		/* next slot to reap */
	u32 tail;		/* next slot to fill */
	u32 used;
	u64 base_reg;
	u32 size_reg, doorbell_reg;
};

struct p2plab_nic {
	struct pci_dev *pdev;
	void __iomem *regs;
	struct device dev;
	struct cdev cdev;
	int irq;
	u32 mtu;
	u32 entries;
	spinlock_t lock;	/* rings and completion queue */
	struct nic_ring tx, rx;
	struct p2plab_nic_wc *cq;
	u32 cq_size, cq_head, cq_count, wr_outstanding;
	wait_queue_head_t wq;
	struct mutex mr_lock;	/* regions, posts against them */
	struct mutex ring_lock;	/* stop, flush and restart of the rings */
	struct idr mrs;
	bool open;
	bool dead;
	bool broken;
	u64 tx_frames, rx_frames, revocations;
};

/* Under nic->lock: a completed post goes to the completion queue. */
static void wr_done(struct p2plab_nic *nic, struct nic_wr *wr)
{
	struct p2plab_nic_wc *wc = &nic->cq[(nic->cq_head + nic->cq_count) % nic->cq_size];

	wc->wr_id = wr->wr_id;
	wc->status = wr->status;
	wc->opcode = wr->opcode;
	wc->byte_len = wr->bytes;
	wc->frames = wr->frames;
	wc->reserved = 0;
	nic->cq_count++;
	nic->wr_outstanding--;
	kfree(wr);
}

/* Under nic->lock: retires the slots the device has written back. */
static void ring_reap(struct p2plab_nic *nic, struct nic_ring *ring)
{
	while (ring->used) {
		struct p2plab_nic_desc *d = &ring->desc[ring->head];
		u16 status = le16_to_cpu(READ_ONCE(d->status));
		struct nic_wr *wr;

		if (!status)
			break;
		dma_rmb();
		wr = ring->wr[ring->head];
		ring->wr[ring->head] = NULL;
		if (status != NIC_DESC_STATUS_OK && !wr->status)
			wr->status = status;
		wr->bytes += le32_to_cpu(d->done_len);
		atomic_dec(&wr->mr->inflight);
		ring->head = (ring->head + 1) % nic->entries;
		ring->used--;
		if (!--wr->frames_left)
			wr_done(nic, wr);
	}
}

/* Under nic->lock: every outstanding slot completes with @status. */
static void ring_flush(struct p2plab_nic *nic, struct nic_ring *ring, u32 status,
		       struct nic_mr *revoked)
{
	ring_reap(nic, ring);
	while (ring->used) {
		struct nic_wr *wr = ring->wr[ring->head];

		ring->wr[ring->head] = NULL;
		if (!wr->status)
			wr->status = wr->mr == revoked ? P2PLAB_NIC_WC_REVOKED : status;
		atomic_dec(&wr->mr->inflight);
		ring->head = (ring->head + 1) % nic->entries;
		ring->used--;
		if (!--wr->frames_left)
			wr_done(nic, wr);
	}
}

static void reap_all(struct p2plab_nic *nic)
{
	unsigned long flags;

	spin_lock_irqsave(&nic->lock, flags);
	ring_reap(nic, &nic->tx);
	ring_reap(nic, &nic->rx);
	spin_unlock_irqrestore(&nic->lock, flags);
}

static irqreturn_t p2plab_nic_irq(int irq, void *data)
{
	struct p2plab_nic *nic = data;
	u32 cause = p2plab_pci_irq_ack(nic->regs, NIC_REG_INT_STATUS);

	if (!cause)
		return IRQ_NONE;
	if (cause & NIC_INT_ERROR) {
		WRITE_ONCE(nic->broken, true);
		dev_err(&nic->pdev->dev, "ring halted, error %#x\n",
			readl(nic->regs + NIC_REG_ERROR));
	}
	reap_all(nic);
	wake_up_all(&nic->wq);
	return IRQ_HANDLED;
}

/* Stops both engines and waits until they hold no descriptor. */
static bool rings_stop(struct p2plab_nic *nic)
{
	u32 status;
	int ret;

	writel(0, nic->regs + NIC_REG_CTRL);
	ret = readl_poll_timeout(nic->regs + NIC_REG_STATUS, status,
				 !(status & (NIC_STATUS_TX_BUSY | NIC_STATUS_RX_BUSY)), 1000,
				 QUIESCE_TIMEOUT_US);
	if (ret)
		dev_warn(&nic->pdev->dev, "engines still busy after disabling (status %#x)\n",
			 status);
	return !ret;
}

static void ring_program(struct p2plab_nic *nic, struct nic_ring *ring)
{
	memset(ring->desc, 0, nic->entries * sizeof(*ring->desc));
	ring->head = ring->tail = ring->used = 0;
	writeq(ring->desc_dma, nic->regs + ring->base_reg);
	writel(nic->entries, nic->regs + ring->size_reg);
}

static void rings_start(struct p2plab_nic *nic)
{
	ring_program(nic, &nic->tx);
	ring_program(nic, &nic->rx);
	writel(0, nic->regs + NIC_REG_INT_MASK);
	writel(NIC_CTRL_TX_ENABLE | NIC_CTRL_RX_ENABLE, nic->regs + NIC_REG_CTRL);
	WRITE_ONCE(nic->broken, false);
}

/*
 * Quiesces the device and completes every outstanding post (those on
 * @revoked as revoked, the rest as flushed), then restarts the rings.
 * Caller holds mr_lock. Returns whether the engines stopped in time.
 */
static bool rings_flush_restart(struct p2plab_nic *nic, struct nic_mr *revoked)
{
	unsigned long flags;
	bool idle;

	mutex_lock(&nic->ring_lock);
	if (revoked) {
		/* Posts check this under the spinlock: none on it from now on. */
		spin_lock_irqsave(&nic->lock, flags);
		revoked->revoked = true;
		spin_unlock_irqrestore(&nic->lock, flags);
	}
	idle = rings_stop(nic);
	spin_lock_irqsave(&nic->lock, flags);
	ring_flush(nic, &nic->tx, P2PLAB_NIC_WC_FLUSHED, revoked);
	ring_flush(nic, &nic->rx, P2PLAB_NIC_WC_FLUSHED, revoked);
	spin_unlock_irqrestore(&nic->lock, flags);
	if (READ_ONCE(nic->open) && !READ_ONCE(nic->dead))
		rings_start(nic);
	mutex_unlock(&nic->ring_lock);
	wake_up_all(&nic->wq);
	return idle;
}

/*
 * Gives the region's memory back. For GPU memory: -ENOENT when the GPU
 * driver is revoking it right now; its callback then owns the pin (and,
 * with mr->orphan set, the region).
 */
static int mr_release_memory(struct p2plab_nic *nic, struct nic_mr *mr)
{
	int ret = 0;
	u32 i;

	if (mr->source == P2PLAB_NIC_SRC_GPU && mr->pt) {
		if (mr->map && !p2p.dma_unmap_pages(nic->pdev, mr->pt, mr->map))
			mr->map = NULL;
		ret = p2p.put_pages(mr->pt);
		if (!ret)
			mr->pt = NULL;
		else if (ret != -ENOENT)
			dev_warn(&nic->pdev->dev, "put_pages of region %u: %d\n", mr->handle, ret);
	}

	if (mr->source == P2PLAB_NIC_SRC_RAM && mr->pages) {
		for (i = 0; i < mr->npages; i++)
			dma_unmap_page(&nic->pdev->dev, mr->dma[i], NIC_PAGE, DMA_BIDIRECTIONAL);
		unpin_user_pages(mr->pages, mr->npages);
	}
	if (mr->source == P2PLAB_NIC_SRC_DMABUF && mr->attach) {
		dma_resv_lock(mr->dmabuf->resv, NULL);
		if (mr->sgt)
			dma_buf_unmap_attachment(mr->attach, mr->sgt, DMA_BIDIRECTIONAL);
		mr->sgt = NULL;
		dma_resv_unlock(mr->dmabuf->resv);
		dma_buf_detach(mr->dmabuf, mr->attach);
		mr->attach = NULL;
	}
	if (mr->dmabuf) {
		dma_buf_put(mr->dmabuf);
		mr->dmabuf = NULL;
	}
	kvfree(mr->pages);
	kvfree(mr->dma);
	mr->pages = NULL;
	mr->dma = NULL;
	return ret;
}

static int mr_pin_ram(struct p2plab_nic *nic, struct nic_mr *mr, u64 addr)
{
	long pinned;
	u32 i;

	mr->pages = kvcalloc(mr->npages, sizeof(*mr->pages), GFP_KERNEL);
	if (!mr->pages)
		return -ENOMEM;
	pinned = pin_user_pages_fast(addr, mr->npages, FOLL_WRITE | FOLL_LONGTERM, mr->pages);
	if (pinned != mr->npages) {
		if (pinned > 0)
			unpin_user_pages(mr->pages, pinned);
		kvfree(mr->pages);
		mr->pages = NULL;
		return pinned < 0 ? pinned : -EFAULT;
	}
	for (i = 0; i < mr->npages; i++) {
		mr->dma[i] = dma_map_page(&nic->pdev->dev, mr->pages[i], 0, NIC_PAGE,
					  DMA_BIDIRECTIONAL);
		if (dma_mapping_error(&nic->pdev->dev, mr->dma[i])) {
			while (i--)
				dma_unmap_page(&nic->pdev->dev, mr->dma[i], NIC_PAGE,
					       DMA_BIDIRECTIONAL);
			unpin_user_pages(mr->pages, mr->npages);
			kvfree(mr->pages);
			mr->pages = NULL;
			return -EIO;
		}
	}
	mr->seg = NIC_PAGE;
	return 0;
}

static bool rings_flush_restart(struct p2plab_nic *nic, struct nic_mr *revoked);

/* The GPU driver takes the region's pages back: quiesce, then let go. */
static void mr_free_callback(void *data)
{
	struct nic_mr *mr = data;
	struct p2plab_nic *nic = mr->nic;
	bool orphan;

	mutex_lock(&nic->mr_lock);
	if (!mr->orphan && !nic->dead) {
		bool idle = rings_flush_restart(nic, mr);

		dev_info(&nic->pdev->dev, "region %u revoked by the GPU driver; DMA %s\n",
			 mr->handle, idle ? "quiesced" : "did not stop in time");
	}
	mr->revoked = true;
	nic->revocations++;
	if (mr->map && !p2p.free_dma_mapping(mr->map))
		mr->map = NULL;
	if (mr->pt && !p2p.free_page_table(mr->pt))
		mr->pt = NULL;
	orphan = mr->orphan;
	mutex_unlock(&nic->mr_lock);
	if (orphan) {
		kvfree(mr->dma);
		kfree(mr);
	}
}

static int mr_pin_gpu(struct p2plab_nic *nic, struct nic_mr *mr, u64 addr)
{
	u32 i;
	int ret = p2p_get_symbols();

	if (ret)
		return ret;
	ret = p2p.get_pages(addr, mr->length, &mr->pt, mr_free_callback, mr);
	if (ret) {
		mr->pt = NULL;
		return ret;
	}
	ret = p2p.dma_map_pages(nic->pdev, mr->pt, &mr->map);
	if (ret) {
		/* The kernel's reason (P2P distance) is in dmesg already. */
		dev_warn(&nic->pdev->dev, "GPU memory refused for peer DMA by this NIC: %d\n", ret);
		mr->map = NULL;
		if (!p2p.put_pages(mr->pt))
			mr->pt = NULL;
		return ret;
	}
	if (mr->map->entries != mr->npages || mr->map->page_size != NIC_PAGE) {
		p2p.dma_unmap_pages(nic->pdev, mr->pt, mr->map);
		mr->map = NULL;
		if (!p2p.put_pages(mr->pt))
			mr->pt = NULL;
		return -EINVAL;
	}
	for (i = 0; i < mr->npages; i++)
		mr->dma[i] = mr->map->dma_addresses[i];
	mr->map_type = mr->map->map_type;
	mr->seg = nic->mtu;
	return 0;
}

/* The exporter moves or revokes the buffer; its reservation lock is held. */
static void mr_dmabuf_invalidate(struct dma_buf_attachment *attach)
{
	struct nic_mr *mr = attach->importer_priv;
	struct p2plab_nic *nic = mr->nic;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!READ_ONCE(nic->dead)) {
		bool idle = rings_flush_restart(nic, mr);

		dev_info(&nic->pdev->dev, "dma-buf region %u invalidated by its exporter; DMA %s\n",
			 mr->handle, idle ? "quiesced" : "did not stop in time");
	}
	WRITE_ONCE(mr->revoked, true);
	nic->revocations++;
	if (mr->sgt)
		dma_buf_unmap_attachment(attach, mr->sgt, DMA_BIDIRECTIONAL);
	mr->sgt = NULL;
}

static const struct dma_buf_attach_ops nic_dmabuf_importer = {
	.allow_peer2peer = true,
	.invalidate_mappings = mr_dmabuf_invalidate,
};

static int mr_attach_dmabuf(struct p2plab_nic *nic, struct nic_mr *mr, int fd, u64 offset)
{
	struct scatterlist *sg;
	u64 skip = offset, page = 0;
	unsigned int i;
	int ret = 0;

	mr->dmabuf = dma_buf_get(fd);
	if (IS_ERR(mr->dmabuf)) {
		mr->dmabuf = NULL;
		return -EBADF;
	}
	mr->attach = dma_buf_dynamic_attach(mr->dmabuf, &nic->pdev->dev, &nic_dmabuf_importer, mr);
	if (IS_ERR(mr->attach)) {
		ret = PTR_ERR(mr->attach);
		mr->attach = NULL;
		return ret;
	}
	dma_resv_lock(mr->dmabuf->resv, NULL);
	mr->sgt = dma_buf_map_attachment(mr->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(mr->sgt)) {
		ret = PTR_ERR(mr->sgt);
		mr->sgt = NULL;
		dev_warn(&nic->pdev->dev, "dma-buf refused for peer DMA by this NIC: %d\n", ret);
		goto out;
	}
	/* The region: [offset, offset + length) of the buffer, in 4 KiB pages. */
	for_each_sgtable_dma_sg(mr->sgt, sg, i) {
		dma_addr_t addr = sg_dma_address(sg);
		u64 len = sg_dma_len(sg);

		if (addr % NIC_PAGE || len % NIC_PAGE) {
			ret = -EINVAL;
			goto out;
		}
		for (; len && page < mr->npages; addr += NIC_PAGE, len -= NIC_PAGE) {
			if (skip) {
				skip -= NIC_PAGE;
				continue;
			}
			mr->dma[page++] = addr;
		}
	}
	if (page < mr->npages)
		ret = -EINVAL;	/* the buffer is shorter than the region */
	mr->seg = nic->mtu;
out:
	dma_resv_unlock(mr->dmabuf->resv);
	return ret;
}

static long ioctl_reg_mr(struct p2plab_nic *nic, struct p2plab_nic_reg_mr __user *uarg)
{
	struct p2plab_nic_reg_mr req;
	struct nic_mr *mr;
	int ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.length || req.length % NIC_PAGE || req.addr % NIC_PAGE ||
	    req.length > (u64)U32_MAX * NIC_PAGE)
		return -EINVAL;
	if (req.source != P2PLAB_NIC_SRC_RAM && req.source != P2PLAB_NIC_SRC_GPU &&
	    req.source != P2PLAB_NIC_SRC_DMABUF)
		return -EOPNOTSUPP;
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return -ENOMEM;
	mr->nic = nic;
	mr->source = req.source;
	mr->length = req.length;
	mr->npages = req.length / NIC_PAGE;
	atomic_set(&mr->inflight, 0);
	mr->dma = kvcalloc(mr->npages, sizeof(*mr->dma), GFP_KERNEL);
	if (!mr->dma) {
		ret = -ENOMEM;
		goto err_free;
	}
	if (req.source == P2PLAB_NIC_SRC_GPU) {
		ret = mr_pin_gpu(nic, mr, req.addr);
	} else if (req.source == P2PLAB_NIC_SRC_DMABUF) {
		ret = mr_attach_dmabuf(nic, mr, req.fd, req.addr);
		if (ret)
			goto err_release;
	} else {
		ret = mr_pin_ram(nic, mr, req.addr);
	}
	if (ret)
		goto err_free;

	mutex_lock(&nic->mr_lock);
	ret = nic->dead ? -ENODEV : idr_alloc(&nic->mrs, mr, 1, 0, GFP_KERNEL);
	mutex_unlock(&nic->mr_lock);
	if (ret < 0)
		goto err_release;
	mr->handle = ret;
	req.handle = ret;
	req.map_type = mr->map_type;
	if (copy_to_user(uarg, &req, sizeof(req))) {
		mutex_lock(&nic->mr_lock);
		idr_remove(&nic->mrs, mr->handle);
		mutex_unlock(&nic->mr_lock);
		ret = -EFAULT;
		goto err_release;
	}
	return 0;

err_release:
	mutex_lock(&nic->mr_lock);
	if (mr_release_memory(nic, mr) == -ENOENT) {
		/* Being revoked right now: the callback frees the region. */
		mr->orphan = true;
		mutex_unlock(&nic->mr_lock);
		return ret;
	}
	mutex_unlock(&nic->mr_lock);
err_free:
	kvfree(mr->dma);
	kfree(mr);
	return ret;
}

/* Caller holds mr_lock. */
static int mr_destroy(struct p2plab_nic *nic, struct nic_mr *mr)
{
	if (atomic_read(&mr->inflight))
		return -EBUSY;
	idr_remove(&nic->mrs, mr->handle);
	if (mr_release_memory(nic, mr) == -ENOENT) {
		/* Its revocation is waiting for mr_lock: the callback frees it. */
		mr->orphan = true;
		return 0;
	}
	kfree(mr);
	return 0;
}

static long ioctl_dereg_mr(struct p2plab_nic *nic, u32 __user *uarg)
{
	struct nic_mr *mr;
	u32 handle;
	int ret;

	if (get_user(handle, uarg))
		return -EFAULT;
	mutex_lock(&nic->mr_lock);
	mr = idr_find(&nic->mrs, handle);
	ret = mr ? mr_destroy(nic, mr) : -ENOENT;
	mutex_unlock(&nic->mr_lock);
	return ret;
}

/* Length of the frame at @off (at most @left bytes) in @mr. */
static u32 frame_len(struct p2plab_nic *nic, struct nic_mr *mr, u64 off, u64 left)
{
	u64 seg_end = round_down(off, mr->seg) + mr->seg;
	u64 len = min3(left, seg_end - off, (u64)nic->mtu);
	u64 page = off / NIC_PAGE, last = (off + len - 1) / NIC_PAGE, p;

	/* Only bus-contiguous pages share a frame. */
	for (p = page + 1; p <= last; p++)
		if (mr->dma[p] != mr->dma[p - 1] + NIC_PAGE)
			return p * NIC_PAGE - off;
	return len;
}

static long ioctl_post(struct p2plab_nic *nic, struct p2plab_nic_post __user *uarg, bool send)
{
	struct nic_ring *ring = send ? &nic->tx : &nic->rx;
	struct p2plab_nic_post req;
	unsigned long flags;
	struct nic_mr *mr;
	struct nic_wr *wr;
	u32 frames = 0;
	u64 off, end;
	long ret = 0;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	wr = kzalloc(sizeof(*wr), GFP_KERNEL);
	if (!wr)
		return -ENOMEM;
	mutex_lock(&nic->mr_lock);
	mr = idr_find(&nic->mrs, req.handle);
	if (nic->dead) {
		ret = -ENODEV;
		goto out;
	}
	if (!mr) {
		ret = -ENOENT;
		goto out;
	}
	if (mr->revoked) {
		ret = -ENOLINK;
		goto out;
	}
	if (READ_ONCE(nic->broken)) {
		ret = -EIO;
		goto out;
	}
	if (!req.length || req.offset > mr->length || req.length > mr->length - req.offset) {
		ret = -EINVAL;
		goto out;
	}
	end = req.offset + req.length;
	for (off = req.offset; off < end; off += frame_len(nic, mr, off, end - off))
		frames++;
	/* A post that needs more descriptors than the ring holds never fits:
	 * say so instead of ENOSPC, which callers retry. */
	if (frames > nic->entries - 1) {
		ret = -E2BIG;
		goto out;
	}

	spin_lock_irqsave(&nic->lock, flags);
	if (mr->revoked) {
		spin_unlock_irqrestore(&nic->lock, flags);
		ret = -ENOLINK;
		goto out;
	}
	ring_reap(nic, ring);
	if (frames > nic->entries - 1 - ring->used ||
	    nic->wr_outstanding + nic->cq_count >= nic->cq_size) {
		spin_unlock_irqrestore(&nic->lock, flags);
		ret = -ENOSPC;
		goto out;
	}
	wr->wr_id = req.wr_id;
	wr->opcode = send ? P2PLAB_NIC_WC_SEND : P2PLAB_NIC_WC_RECV;
	wr->frames = wr->frames_left = frames;
	wr->mr = mr;
	nic->wr_outstanding++;
	for (off = req.offset; off < end;) {
		u32 len = frame_len(nic, mr, off, end - off);
		struct p2plab_nic_desc *d = &ring->desc[ring->tail];

		d->addr = cpu_to_le64(mr->dma[off / NIC_PAGE] + off % NIC_PAGE);
		d->len = cpu_to_le32(len);
		d->cookie = cpu_to_le64(req.wr_id);
		d->done_len = 0;
		d->status = 0;
		off += len;
		/* One interrupt per post: on its last frame. */
		d->flags = cpu_to_le16(off == end ? NIC_DESC_FLAG_IRQ : 0);
		ring->wr[ring->tail] = wr;
		atomic_inc(&mr->inflight);
		ring->tail = (ring->tail + 1) % nic->entries;
		ring->used++;
	}
	if (send)
		nic->tx_frames += frames;
	else
		nic->rx_frames += frames;
	/* Descriptors are in memory before the device hears of them. */
	wmb();
	writel(ring->tail, nic->regs + ring->doorbell_reg);
	spin_unlock_irqrestore(&nic->lock, flags);
	wr = NULL;
out:
	mutex_unlock(&nic->mr_lock);
	kfree(wr);
	return ret;
}

static long ioctl_poll(struct p2plab_nic *nic, struct p2plab_nic_poll __user *uarg)
{
	struct p2plab_nic_poll req;
	struct p2plab_nic_wc *out;
	unsigned long flags;
	u32 n = 0;
	long left;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (!req.max || req.max > 1024)
		return -EINVAL;
	out = kcalloc(req.max, sizeof(*out), GFP_KERNEL);
	if (!out)
		return -ENOMEM;
	left = msecs_to_jiffies(req.timeout_ms);
	for (;;) {
		reap_all(nic);
		spin_lock_irqsave(&nic->lock, flags);
		while (n < req.max && nic->cq_count) {
			out[n++] = nic->cq[nic->cq_head];
			nic->cq_head = (nic->cq_head + 1) % nic->cq_size;
			nic->cq_count--;
		}
		spin_unlock_irqrestore(&nic->lock, flags);
		if (n || left <= 0 || READ_ONCE(nic->dead))
			break;
		/* Also looks at the rings itself every 100 ms: a lost interrupt only delays. */
		left -= HZ / 10 - wait_event_interruptible_timeout(nic->wq,
				READ_ONCE(nic->cq_count) || READ_ONCE(nic->dead), HZ / 10);
		if (signal_pending(current)) {
			kfree(out);
			return -ERESTARTSYS;
		}
	}
	req.count = n;
	if (copy_to_user(u64_to_user_ptr(req.wcs), out, n * sizeof(*out)) ||
	    copy_to_user(uarg, &req, sizeof(req))) {
		kfree(out);
		return -EFAULT;
	}
	kfree(out);
	return 0;
}

static long ioctl_info(struct p2plab_nic *nic, struct p2plab_nic_info __user *uarg)
{
	struct p2plab_nic_info info = {};

	info.mtu = nic->mtu;
	info.status = nic->dead ? 0 : readl(nic->regs + NIC_REG_STATUS);
	info.ring_entries = nic->entries;
	info.link_up = !!(info.status & NIC_STATUS_LINK_UP);
	info.tx_frames = nic->tx_frames;
	info.rx_frames = nic->rx_frames;
	info.revocations = nic->revocations;
	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long p2plab_nic_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct p2plab_nic *nic = filp->private_data;
	void __user *uarg = (void __user *)arg;

	if (READ_ONCE(nic->dead))
		return -ENODEV;
	switch (cmd) {
	case P2PLAB_NIC_IOC_INFO:
		return ioctl_info(nic, uarg);
	case P2PLAB_NIC_IOC_REG_MR:
		return ioctl_reg_mr(nic, uarg);
	case P2PLAB_NIC_IOC_DEREG_MR:
		return ioctl_dereg_mr(nic, uarg);
	case P2PLAB_NIC_IOC_POST_SEND:
		return ioctl_post(nic, uarg, true);
	case P2PLAB_NIC_IOC_POST_RECV:
		return ioctl_post(nic, uarg, false);
	case P2PLAB_NIC_IOC_POLL_CQ:
		return ioctl_poll(nic, uarg);
	default:
		return -ENOTTY;
	}
}

static int p2plab_nic_open(struct inode *inode, struct file *filp)
{
	struct p2plab_nic *nic = container_of(inode->i_cdev, struct p2plab_nic, cdev);
	int ret = 0;

	mutex_lock(&nic->mr_lock);
	if (nic->dead)
		ret = -ENODEV;
	else if (nic->open)
		ret = -EBUSY;
	else {
		mutex_lock(&nic->ring_lock);
		WRITE_ONCE(nic->open, true);
		rings_start(nic);
		mutex_unlock(&nic->ring_lock);
	}
	mutex_unlock(&nic->mr_lock);
	if (ret)
		return ret;
	get_device(&nic->dev);
	filp->private_data = nic;
	return 0;
}

/* Caller holds mr_lock: quiesce, complete everything, free every region. */
static void drop_all(struct p2plab_nic *nic)
{
	struct nic_mr *mr;
	unsigned long flags;
	int handle;

	if (!rings_flush_restart(nic, NULL)) {
		/* The device may still touch the buffers: leaking beats corrupting. */
		dev_err(&nic->pdev->dev, "leaking the regions of a NIC that did not stop\n");
		idr_for_each_entry(&nic->mrs, mr, handle)
			idr_remove(&nic->mrs, handle);
		return;
	}
	idr_for_each_entry(&nic->mrs, mr, handle)
		if (mr_destroy(nic, mr))
			dev_warn(&nic->pdev->dev, "region %d still in use\n", handle);
	spin_lock_irqsave(&nic->lock, flags);
	nic->cq_head = nic->cq_count = 0;
	spin_unlock_irqrestore(&nic->lock, flags);
}

static int p2plab_nic_release(struct inode *inode, struct file *filp)
{
	struct p2plab_nic *nic = filp->private_data;

	mutex_lock(&nic->mr_lock);
	/* The receiver stays off while closed: frames still on the wire are dropped. */
	WRITE_ONCE(nic->open, false);
	if (!nic->dead)
		drop_all(nic);
	mutex_unlock(&nic->mr_lock);
	put_device(&nic->dev);
	return 0;
}

static const struct file_operations p2plab_nic_fops = {
	.owner = THIS_MODULE,
	.open = p2plab_nic_open,
	.release = p2plab_nic_release,
	.unlocked_ioctl = p2plab_nic_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static void p2plab_nic_release_dev(struct device *dev)
{
	struct p2plab_nic *nic = container_of(dev, struct p2plab_nic, dev);

	idr_destroy(&nic->mrs);
	p2plab_chrdevs_put_minor(&p2plab_nic_chrdevs, dev);
	kfree(nic);
}

static int ring_alloc(struct p2plab_nic *nic, struct nic_ring *ring, u64 base_reg, u32 size_reg,
		      u32 doorbell_reg)
{
	ring->desc = dma_alloc_coherent(&nic->pdev->dev, nic->entries * sizeof(*ring->desc),
					&ring->desc_dma, GFP_KERNEL);
	if (!ring->desc)
		return -ENOMEM;
	ring->wr = kcalloc(nic->entries, sizeof(*ring->wr), GFP_KERNEL);
	if (!ring->wr) {
		dma_free_coherent(&nic->pdev->dev, nic->entries * sizeof(*ring->desc),
				  ring->desc, ring->desc_dma);
		ring->desc = NULL;
		return -ENOMEM;
	}
	ring->base_reg = base_reg;
	ring->size_reg = size_reg;
	ring->doorbell_reg = doorbell_reg;
	return 0;
}

static void ring_free(struct p2plab_nic *nic, struct nic_ring *ring)
{
	if (!ring->desc)
		return;
	dma_free_coherent(&nic->pdev->dev, nic->entries * sizeof(*ring->desc), ring->desc,
			  ring->desc_dma);
	kfree(ring->wr);
	ring->desc = NULL;
}

static int p2plab_nic_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct p2plab_nic *nic;
	void __iomem *regs;
	int ret;

	if (!p2plab_ring_entries_ok(pdev, ring_entries, P2PLAB_NIC_MIN_RING_ENTRIES,
				    P2PLAB_NIC_MAX_RING_ENTRIES))
		return -EINVAL;
	/* (idr_destroy in the release function is fine with a zeroed idr.) */
	nic = p2plab_chrdevs_alloc(&p2plab_nic_chrdevs, struct p2plab_nic, dev, &pdev->dev,
				   p2plab_nic_release_dev);
	if (IS_ERR(nic))
		return PTR_ERR(nic);
	/* From here on put_device() frees nic and its minor. */
	nic->pdev = pdev;
	nic->entries = ring_entries;
	nic->cq_size = 2 * ring_entries;
	spin_lock_init(&nic->lock);
	mutex_init(&nic->mr_lock);
	mutex_init(&nic->ring_lock);
	idr_init(&nic->mrs);
	init_waitqueue_head(&nic->wq);

	regs = p2plab_pci_map(pdev, (const struct p2plab_pci_ident *)id->driver_data);
	if (IS_ERR(regs)) {
		ret = PTR_ERR(regs);
		goto err_put;
	}
	nic->regs = regs;
	nic->mtu = readl(nic->regs + NIC_REG_MTU);
	rings_stop(nic);

	nic->cq = kcalloc(nic->cq_size, sizeof(*nic->cq), GFP_KERNEL);
	if (!nic->cq) {
		ret = -ENOMEM;
		goto err_unmap;
	}
	ret = ring_alloc(nic, &nic->tx, NIC_REG_TX_RING_BASE, NIC_REG_TX_RING_SIZE,
			 NIC_REG_TX_DOORBELL);
	if (ret)
		goto err_cq;
	ret = ring_alloc(nic, &nic->rx, NIC_REG_RX_RING_BASE, NIC_REG_RX_RING_SIZE,
			 NIC_REG_RX_DOORBELL);
	if (ret)
		goto err_tx;

	ret = p2plab_pci_irq_setup(pdev, p2plab_nic_irq, nic);
	if (ret < 0)
		goto err_rx;
	nic->irq = ret;
	/* The rings start at open. */

	ret = p2plab_chrdevs_add(&nic->cdev, &nic->dev, &p2plab_nic_fops);
	if (ret)
		goto err_irq;
	pci_set_drvdata(pdev, nic);
	dev_info(&pdev->dev, "%s: MTU %u, rings of %u, %s, link %s\n", dev_name(&nic->dev),
		 nic->mtu, nic->entries, pdev->msix_enabled ? "MSI-X" : "INTx",
		 readl(nic->regs + NIC_REG_STATUS) & NIC_STATUS_LINK_UP ? "up" : "down");
	return 0;

err_irq:
	rings_stop(nic);
	p2plab_pci_irq_teardown(pdev, nic->irq, nic);
err_rx:
	ring_free(nic, &nic->rx);
err_tx:
	ring_free(nic, &nic->tx);
err_cq:
	kfree(nic->cq);
err_unmap:
	p2plab_pci_unmap(pdev, nic->regs);
err_put:
	put_device(&nic->dev);
	return ret;
}

static void p2plab_nic_remove(struct pci_dev *pdev)
{
	struct p2plab_nic *nic = pci_get_drvdata(pdev);
	bool idle;

	cdev_device_del(&nic->cdev, &nic->dev);
	mutex_lock(&nic->mr_lock);
	WRITE_ONCE(nic->dead, true);
	drop_all(nic);
	idle = rings_stop(nic);
	mutex_unlock(&nic->mr_lock);
	wake_up_all(&nic->wq);
	p2plab_pci_irq_teardown(pdev, nic->irq, nic);
	if (idle) {
		ring_free(nic, &nic->rx);
		ring_free(nic, &nic->tx);
	}
	kfree(nic->cq);
	nic->cq = NULL;
	p2plab_pci_unmap(pdev, nic->regs);
	put_device(&nic->dev);
}

/* What a device with these IDs must say in BAR0 to be driven. */
static const struct p2plab_pci_ident p2plab_nic_ident = {
	.what = "NIC",
	.regs = { P2PLAB_NIC_REGS_BAR, P2PLAB_NIC_REGS_BAR_SIZE },
	.id = { NIC_REG_ID, P2PLAB_NIC_ID_MAGIC },
	.version = { NIC_REG_VERSION, P2PLAB_NIC_VERSION_MAJOR },
};

static const struct pci_device_id p2plab_nic_ids[] = {
	{ PCI_DEVICE(P2PLAB_NIC_VENDOR_ID, P2PLAB_NIC_DEVICE_ID),
	  .driver_data = (kernel_ulong_t)&p2plab_nic_ident },
	{}
};
MODULE_DEVICE_TABLE(pci, p2plab_nic_ids);

static struct pci_driver p2plab_nic_driver = {
	.name = DRV_NAME,
	.id_table = p2plab_nic_ids,
	.probe = p2plab_nic_probe,
	.remove = p2plab_nic_remove,
};

static int __init p2plab_nic_init(void)
{
	BUILD_BUG_ON(sizeof(struct p2plab_nic_desc) != NIC_DESC_SIZE);
	BUILD_BUG_ON(sizeof(struct p2plab_nic_wc) != 32);
	return p2plab_chrdevs_register(&p2plab_nic_chrdevs, &p2plab_nic_driver);
}

static void __exit p2plab_nic_exit(void)
{
	p2plab_chrdevs_unregister(&p2plab_nic_chrdevs, &p2plab_nic_driver);
	p2p_put_symbols();
}

module_init(p2plab_nic_init);
module_exit(p2plab_nic_exit);

MODULE_IMPORT_NS("DMA_BUF");
MODULE_DESCRIPTION("p2plab NIC-like DMA device: descriptor rings, verbs-shaped char device");
MODULE_LICENSE("GPL");
