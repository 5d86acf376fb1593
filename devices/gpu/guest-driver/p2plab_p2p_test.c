// SPDX-License-Identifier: GPL-2.0
/*
 * p2plab_p2p_test: a test importer of p2plab_gpu memory, like the kernel's
 * lib/test_*.c modules: real code calling the real peer-memory API
 * (p2plab_p2p.h) and the real dma-buf importer API, driven from user space
 * through /dev/p2plab-p2p-test (p2plab_p2p_test_uapi.h).
 *
 * It follows the importer rules of p2plab_p2p.h the way a NIC driver must:
 * the pin's table pointers live under test_lock; the free callback takes
 * test_lock, frees the mapping and the table and clears them; UNPIN takes
 * test_lock and calls put_pages while holding it (put_pages never waits for
 * a callback). The peer device is only named, never driven: its DMA
 * addresses are what the test checks.
 */

#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "p2plab_p2p.h"
#include "p2plab_p2p_test_uapi.h"

MODULE_IMPORT_NS("DMA_BUF");

struct test_pin {
	struct list_head node;
	u32 id;
	struct pci_dev *peer;
	struct p2plab_p2p_page_table *pt;	/* under test_lock; NULL once gone */
	struct p2plab_p2p_dma_mapping *map;	/* under test_lock */
	u32 callbacks;
	bool revoked;
	bool callback_in_task;
};

struct test_attach {
	struct list_head node;
	u32 id;
	struct pci_dev *peer;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;		/* under the dma-buf's reservation lock */
	u32 invalidations;		/* under the reservation lock */
};

static DEFINE_MUTEX(test_lock);
static LIST_HEAD(test_pins);
static LIST_HEAD(test_attachments);
static u32 test_next_id;

static struct pci_dev *peer_by_name(const char *name)
{
	unsigned int domain, bus, dev, fn;

	if (sscanf(name, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
		return NULL;
	return pci_get_domain_bus_and_slot(domain, bus, PCI_DEVFN(dev, fn));
}

/* The GPU is taking the memory away: stop "DMA", free what we hold. */
static void test_free_callback(void *data)
{
	struct test_pin *p = data;

	might_sleep();
	/* Process context may sleep: prove it (a WARN would show in dmesg). */
	usleep_range(100, 200);
	mutex_lock(&test_lock);
	p->callbacks++;
	p->callback_in_task = in_task();
	if (p->map)
		WARN_ON(p2plab_p2p_free_dma_mapping(p->map));
	p->map = NULL;
	if (p->pt)
		WARN_ON(p2plab_p2p_free_page_table(p->pt));
	p->pt = NULL;
	p->revoked = true;
	mutex_unlock(&test_lock);
}

static long test_pin(struct p2plab_p2p_test_pin __user *uarg)
{
	struct p2plab_p2p_test_pin arg;
	struct test_pin *p;
	u32 i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	arg.peer[sizeof(arg.peer) - 1] = 0;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	p->peer = peer_by_name(arg.peer);
	if (!p->peer) {
		kfree(p);
		return -ENODEV;
	}

	mutex_lock(&test_lock);
	arg.get_ret = p2plab_p2p_get_pages(arg.va, arg.len, &p->pt, test_free_callback, p);
	if (arg.get_ret) {
		mutex_unlock(&test_lock);
		pci_dev_put(p->peer);
		kfree(p);
		return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
	}
	p->id = ++test_next_id;
	list_add_tail(&p->node, &test_pins);
	arg.id = p->id;
	arg.entries = p->pt->entries;
	arg.page_size = p->pt->page_size;
	arg.vram_offset = p->pt->vram_offset;
	arg.phys0 = p->pt->phys[0];
	arg.phys_contiguous = 1;
	for (i = 0; i < p->pt->entries; i++)
		if (p->pt->phys[i] != p->pt->phys[0] + (u64)i * p->pt->page_size)
			arg.phys_contiguous = 0;
	arg.map_ret = p2plab_p2p_dma_map_pages(p->peer, p->pt, &p->map);
	if (!arg.map_ret) {
		arg.map_type = p->map->map_type;
		arg.dma0 = p->map->dma_addresses[0];
		arg.dma_contiguous = p->map->entries == p->pt->entries;
		for (i = 0; i < p->map->entries; i++)
			if (p->map->dma_addresses[i] != p->map->dma_addresses[0] +
							 (u64)i * p->map->page_size)
				arg.dma_contiguous = 0;
	} else {
		p->map = NULL;
	}
	mutex_unlock(&test_lock);
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static struct test_pin *pin_by_id(u32 id)
{
	struct test_pin *p;

	list_for_each_entry(p, &test_pins, node)
		if (p->id == id)
			return p;
	return NULL;
}

static long test_status(struct p2plab_p2p_test_status __user *uarg, bool unpin)
{
	struct p2plab_p2p_test_status arg;
	struct test_pin *p;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	mutex_lock(&test_lock);
	p = pin_by_id(arg.id);
	if (!p) {
		mutex_unlock(&test_lock);
		return -ENOENT;
	}
	arg.put_ret = 0;
	if (unpin && p->pt) {
		if (p->map)
			arg.put_ret = p2plab_p2p_dma_unmap_pages(p->peer, p->pt, p->map);
		if (!arg.put_ret) {
			p->map = NULL;
			arg.put_ret = p2plab_p2p_put_pages(p->pt);
			if (!arg.put_ret)
				p->pt = NULL;
		}
	}
	arg.callbacks = p->callbacks;
	arg.revoked = p->revoked;
	arg.callback_in_task = p->callback_in_task;
	/* A pin fully released (by us or the callback) is forgotten on UNPIN. */
	if (unpin && !p->pt) {
		list_del(&p->node);
		pci_dev_put(p->peer);
		kfree(p);
	}
	mutex_unlock(&test_lock);
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

/* dma-buf importer: invalidate_mappings runs with the reservation lock held. */
static void test_invalidate(struct dma_buf_attachment *attach)
{
	struct test_attach *t = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	t->invalidations++;
	if (t->sgt)
		dma_buf_unmap_attachment(attach, t->sgt, DMA_BIDIRECTIONAL);
	t->sgt = NULL;
}

static const struct dma_buf_attach_ops test_p2p_importer = {
	.allow_peer2peer = true,
	.invalidate_mappings = test_invalidate,
};

static const struct dma_buf_attach_ops test_plain_importer = {
	.allow_peer2peer = false,
	.invalidate_mappings = test_invalidate,
};

static long test_dmabuf_attach(struct p2plab_p2p_test_dmabuf __user *uarg)
{
	struct p2plab_p2p_test_dmabuf arg;
	struct scatterlist *sg;
	struct test_attach *t;
	unsigned int i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	arg.peer[sizeof(arg.peer) - 1] = 0;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	t->peer = peer_by_name(arg.peer);
	if (!t->peer) {
		kfree(t);
		return -ENODEV;
	}
	t->dmabuf = dma_buf_get(arg.fd);
	if (IS_ERR(t->dmabuf)) {
		pci_dev_put(t->peer);
		kfree(t);
		return -EBADF;
	}
	t->attach = dma_buf_dynamic_attach(t->dmabuf, &t->peer->dev,
					   arg.p2p ? &test_p2p_importer : &test_plain_importer, t);
	if (IS_ERR(t->attach)) {
		arg.attach_ret = PTR_ERR(t->attach);
		dma_buf_put(t->dmabuf);
		pci_dev_put(t->peer);
		kfree(t);
		return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
	}
	dma_resv_lock(t->dmabuf->resv, NULL);
	t->sgt = dma_buf_map_attachment(t->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(t->sgt)) {
		arg.map_ret = PTR_ERR(t->sgt);
		t->sgt = NULL;
	} else {
		arg.nents = t->sgt->nents;
		for_each_sgtable_dma_sg(t->sgt, sg, i) {
			if (!i)
				arg.dma0 = sg_dma_address(sg);
			arg.dma_len += sg_dma_len(sg);
		}
	}
	dma_resv_unlock(t->dmabuf->resv);
	mutex_lock(&test_lock);
	t->id = ++test_next_id;
	list_add_tail(&t->node, &test_attachments);
	mutex_unlock(&test_lock);
	arg.id = t->id;
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static struct test_attach *attach_by_id(u32 id)
{
	struct test_attach *t;

	list_for_each_entry(t, &test_attachments, node)
		if (t->id == id)
			return t;
	return NULL;
}

static long test_dmabuf_status(struct p2plab_p2p_test_dmabuf_status __user *uarg)
{
	struct p2plab_p2p_test_dmabuf_status arg;
	struct sg_table *sgt;
	struct test_attach *t;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	mutex_lock(&test_lock);
	t = attach_by_id(arg.id);
	if (!t) {
		mutex_unlock(&test_lock);
		return -ENOENT;
	}
	dma_resv_lock(t->dmabuf->resv, NULL);
	arg.invalidations = t->invalidations;
	arg.mapped = !!t->sgt;
	sgt = dma_buf_map_attachment(t->attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt))
		arg.remap_ret = PTR_ERR(sgt);
	else
		dma_buf_unmap_attachment(t->attach, sgt, DMA_BIDIRECTIONAL);
	dma_resv_unlock(t->dmabuf->resv);
	mutex_unlock(&test_lock);
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static void attach_free(struct test_attach *t)
{
	dma_resv_lock(t->dmabuf->resv, NULL);
	if (t->sgt)
		dma_buf_unmap_attachment(t->attach, t->sgt, DMA_BIDIRECTIONAL);
	t->sgt = NULL;
	dma_resv_unlock(t->dmabuf->resv);
	dma_buf_detach(t->dmabuf, t->attach);
	dma_buf_put(t->dmabuf);
	pci_dev_put(t->peer);
	kfree(t);
}

static long test_dmabuf_detach(u32 __user *uid)
{
	struct test_attach *t;
	u32 id;

	if (get_user(id, uid))
		return -EFAULT;
	mutex_lock(&test_lock);
	t = attach_by_id(id);
	if (t)
		list_del(&t->node);
	mutex_unlock(&test_lock);
	if (!t)
		return -ENOENT;
	attach_free(t);
	return 0;
}

static long test_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	switch (cmd) {
	case P2PLAB_P2P_TEST_IOC_PIN:
		return test_pin(uarg);
	case P2PLAB_P2P_TEST_IOC_STATUS:
		return test_status(uarg, false);
	case P2PLAB_P2P_TEST_IOC_UNPIN:
		return test_status(uarg, true);
	case P2PLAB_P2P_TEST_IOC_DMABUF_ATTACH:
		return test_dmabuf_attach(uarg);
	case P2PLAB_P2P_TEST_IOC_DMABUF_STATUS:
		return test_dmabuf_status(uarg);
	case P2PLAB_P2P_TEST_IOC_DMABUF_DETACH:
		return test_dmabuf_detach(uarg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations test_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = test_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice test_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "p2plab-p2p-test",
	.fops = &test_fops,
};

static int __init p2plab_p2p_test_init(void)
{
	BUILD_BUG_ON(sizeof(struct p2plab_p2p_test_pin) != 104);
	BUILD_BUG_ON(sizeof(struct p2plab_p2p_test_dmabuf) != 72);
	return misc_register(&test_misc);
}

/* Releases what is left; the GPU module cannot go while we use its symbols. */
static void __exit p2plab_p2p_test_exit(void)
{
	struct test_attach *t, *ttmp;
	struct test_pin *p, *ptmp;

	misc_deregister(&test_misc);
	list_for_each_entry_safe(t, ttmp, &test_attachments, node) {
		list_del(&t->node);
		attach_free(t);
	}
	mutex_lock(&test_lock);
	list_for_each_entry(p, &test_pins, node) {
		if (p->pt && p->map && !p2plab_p2p_dma_unmap_pages(p->peer, p->pt, p->map))
			p->map = NULL;
		if (p->pt && !p2plab_p2p_put_pages(p->pt))
			p->pt = NULL;
	}
	/* put_pages said -ENOENT: that pin's callback waits for test_lock. */
	while (!list_empty(&test_pins)) {
		list_for_each_entry_safe(p, ptmp, &test_pins, node) {
			if (p->pt)
				continue;
			list_del(&p->node);
			pci_dev_put(p->peer);
			kfree(p);
		}
		mutex_unlock(&test_lock);
		if (!list_empty(&test_pins))
			msleep(10);
		mutex_lock(&test_lock);
	}
	mutex_unlock(&test_lock);
}

module_init(p2plab_p2p_test_init);
module_exit(p2plab_p2p_test_exit);

MODULE_DESCRIPTION("p2plab_gpu peer-memory and dma-buf test importer");
MODULE_LICENSE("GPL");
