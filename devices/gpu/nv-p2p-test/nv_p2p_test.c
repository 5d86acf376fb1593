// SPDX-License-Identifier: GPL-2.0
/*
 * nv_p2p_test: imports GPU memory through NVIDIA's kernel peer-memory API,
 * written the way a third-party driver for NVIDIA GPUs is: it includes
 * nv-p2p.h, calls nvidia_p2p_* and nothing of p2plab, and is built
 * against the exporter's Module.symvers. Driven from user space through
 * /dev/nv-p2p-test (nv_p2p_test_uapi.h) by nv-p2p-test-tool.
 *
 * The importer's rules it follows are NVIDIA's (as nvidia-peermem keeps
 * them): each pin has a mutex that its free callback takes; the callback
 * stops "DMA", calls nvidia_p2p_free_dma_mapping and
 * nvidia_p2p_free_page_table (which do nothing; the GPU driver frees both
 * when the callback returns) and forgets the pointers. Teardown unmaps
 * under that mutex (the table cannot go while the callback waits for it)
 * but calls put_pages without it, because put_pages waits for a callback
 * in flight; once put_pages returned, no callback runs and the pin can be
 * freed. After a revocation it still calls put_pages with the old pointer,
 * which NVIDIA promises to answer gracefully. The peer device is only
 * named, never driven: its DMA addresses are what the test checks.
 */

#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nv-p2p.h"
#include "nv_p2p_test_uapi.h"

#define GPU_PAGE	SZ_64K

struct nvt_pin {
	struct list_head node;		/* nvt_pins, under nvt_lock */
	u32 id;
	struct pci_dev *peer;
	u64 va;
	bool persistent;
	u32 entries;
	u64 phys0;
	/* Under lock, which the free callback takes. */
	struct mutex lock;
	struct nvidia_p2p_page_table *pt;	/* NULL once let go of */
	struct nvidia_p2p_dma_mapping *map;	/* NULL once let go of */
	struct nvidia_p2p_page_table *old_pt;	/* for put_pages after a callback */
	u32 callbacks;
	bool revoked;
	bool callback_in_task;
	bool table_ok_in_callback;
	int free_map_ret;
	int free_table_ret;
};

static DEFINE_MUTEX(nvt_lock);
static LIST_HEAD(nvt_pins);
static u32 nvt_next_id;

static struct pci_dev *pci_by_name(const char *name)
{
	unsigned int domain, bus, dev, fn;

	if (sscanf(name, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
		return NULL;
	return pci_get_domain_bus_and_slot(domain, bus, PCI_DEVFN(dev, fn));
}

/* Whether @pt still reads as it did when it was pinned. */
static bool table_intact(struct nvt_pin *p, struct nvidia_p2p_page_table *pt)
{
	return NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(pt) &&
	       pt->page_size == NVIDIA_P2P_PAGE_SIZE_64KB && pt->entries == p->entries &&
	       pt->pages[0]->physical_address == p->phys0;
}

/* The GPU memory is going away: stop DMA, let go of the table. */
static void nvt_free_callback(void *data)
{
	struct nvt_pin *p = data;

	might_sleep();
	/* Process context may sleep: prove it (a WARN would show in dmesg). */
	usleep_range(100, 200);
	mutex_lock(&p->lock);
	p->callbacks++;
	p->callback_in_task = in_task();
	/* The table is the GPU driver's until we return; it must be whole. */
	p->table_ok_in_callback = p->pt && table_intact(p, p->pt);
	/* (A real driver stops its device's DMA to the pages here.) */
	if (p->map)
		p->free_map_ret = nvidia_p2p_free_dma_mapping(p->map);
	if (p->pt)
		p->free_table_ret = nvidia_p2p_free_page_table(p->pt);
	p->map = NULL;
	p->pt = NULL;
	p->revoked = true;
	mutex_unlock(&p->lock);
}

static bool contiguous(const u64 *a, u32 n, u64 step)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (a[i] != a[0] + (u64)i * step)
			return false;
	return true;
}

static long nvt_pin(struct nv_p2p_test_pin __user *uarg)
{
	struct nv_p2p_test_pin arg;
	struct nvt_pin *p;
	u64 *phys;
	u32 i;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	arg.peer[sizeof(arg.peer) - 1] = 0;
	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	mutex_init(&p->lock);
	p->peer = pci_by_name(arg.peer);
	if (!p->peer) {
		kfree(p);
		return -ENODEV;
	}
	p->va = arg.va;
	p->persistent = arg.persistent;

	/* The callback can run as soon as get_pages returns: hold its lock. */
	mutex_lock(&p->lock);
	if (p->persistent)
		arg.get_ret = nvidia_p2p_get_pages_persistent(arg.va, arg.len, &p->pt, arg.flags);
	else
		arg.get_ret = nvidia_p2p_get_pages(0, 0, arg.va, arg.len, &p->pt,
						   nvt_free_callback, p);
	if (arg.get_ret) {
		mutex_unlock(&p->lock);
		pci_dev_put(p->peer);
		kfree(p);
		return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
	}
	p->old_pt = p->pt;
	arg.version = p->pt->version;
	arg.page_size = p->pt->page_size;
	arg.entries = p->pt->entries;
	arg.pt_flags = p->pt->flags;
	arg.pt_compatible = NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p->pt);
	memcpy(arg.uuid, p->pt->gpu_uuid, sizeof(arg.uuid));
	p->entries = p->pt->entries;
	phys = kvmalloc_array(p->entries, sizeof(*phys), GFP_KERNEL);
	if (phys) {
		for (i = 0; i < p->entries; i++)
			phys[i] = p->pt->pages[i]->physical_address;
		arg.phys_contiguous = contiguous(phys, p->entries, GPU_PAGE);
		kvfree(phys);
	}
	arg.phys0 = p->phys0 = p->pt->pages[0]->physical_address;

	arg.map_ret = nvidia_p2p_dma_map_pages(p->peer, p->pt, &p->map);
	if (!arg.map_ret) {
		arg.dma_version = p->map->version;
		arg.dma_page_size_type = p->map->page_size_type;
		arg.dma_entries = p->map->entries;
		arg.dma_compatible = NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(p->map);
		arg.dma_pci_dev_ok = p->map->pci_dev == p->peer;
		arg.dma0 = p->map->dma_addresses[0];
		arg.dma_contiguous = p->map->entries == p->entries &&
				     contiguous(p->map->dma_addresses, p->map->entries, GPU_PAGE);
	} else {
		p->map = NULL;
	}
	mutex_unlock(&p->lock);

	mutex_lock(&nvt_lock);
	p->id = ++nvt_next_id;
	list_add_tail(&p->node, &nvt_pins);
	mutex_unlock(&nvt_lock);
	arg.id = p->id;
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

/*
 * Teardown of @p, off the list: unmap under the pin's lock, put without
 * it (put_pages waits for a callback in flight), then nothing can run.
 */
static void nvt_release(struct nvt_pin *p, struct nv_p2p_test_status *st)
{
	struct nvidia_p2p_page_table *pt;

	mutex_lock(&p->lock);
	if (p->pt && p->map)
		st->unmap_ret = nvidia_p2p_dma_unmap_pages(p->peer, p->pt, p->map);
	p->map = NULL;
	/* Revoked: the old pointer, which the API must answer with 0. */
	pt = p->pt ?: p->old_pt;
	p->pt = NULL;
	mutex_unlock(&p->lock);
	if (p->persistent)
		st->put_ret = nvidia_p2p_put_pages_persistent(p->va, pt, 0);
	else
		st->put_ret = nvidia_p2p_put_pages(0, 0, p->va, pt);
}

static long nvt_status(struct nv_p2p_test_status __user *uarg, bool unpin)
{
	struct nv_p2p_test_status arg;
	struct nvt_pin *p, *found = NULL;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	mutex_lock(&nvt_lock);
	list_for_each_entry(p, &nvt_pins, node) {
		if (p->id == arg.id) {
			found = p;
			if (unpin)
				list_del(&p->node);
			break;
		}
	}
	mutex_unlock(&nvt_lock);
	if (!found)
		return -ENOENT;
	p = found;

	mutex_lock(&p->lock);
	arg.callbacks = p->callbacks;
	arg.revoked = p->revoked;
	arg.callback_in_task = p->callback_in_task;
	arg.table_ok_in_callback = p->table_ok_in_callback;
	arg.free_map_ret = p->free_map_ret;
	arg.free_table_ret = p->free_table_ret;
	arg.table_valid = p->pt && table_intact(p, p->pt);
	mutex_unlock(&p->lock);
	arg.unmap_ret = 0;
	arg.put_ret = 0;
	if (unpin) {
		nvt_release(p, &arg);
		pci_dev_put(p->peer);
		kfree(p);
	}
	return copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
}

static void nvt_noop_callback(void *data)
{
}

/* Bad arguments and misuse; see struct nv_p2p_test_args. */
static long nvt_args(struct nv_p2p_test_args __user *uarg)
{
	struct nvidia_p2p_page_table *pt = NULL, *twice = NULL, *ppt = NULL, *fpt = NULL;
	struct nvidia_p2p_dma_mapping *map = NULL, *fmap = NULL;
	struct nv_p2p_test_args arg;
	struct pci_dev *peer, *other;
	struct nvidia_p2p_page_table *junk;
	u64 va, len;
	long ret = 0;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	arg.peer[sizeof(arg.peer) - 1] = 0;
	arg.other[sizeof(arg.other) - 1] = 0;
	va = arg.va;
	len = arg.len;
	if (len < 2 * GPU_PAGE)
		return -EINVAL;
	peer = pci_by_name(arg.peer);
	other = pci_by_name(arg.other);
	if (!peer || !other) {
		ret = -ENODEV;
		goto out_dev;
	}

	arg.get_misaligned_va = nvidia_p2p_get_pages(0, 0, va + SZ_4K, len - GPU_PAGE, &junk,
						     nvt_noop_callback, &arg);
	arg.get_misaligned_len = nvidia_p2p_get_pages(0, 0, va, len - SZ_4K, &junk,
						      nvt_noop_callback, &arg);
	arg.get_zero_len = nvidia_p2p_get_pages(0, 0, va, 0, &junk, nvt_noop_callback, &arg);
	arg.get_no_callback = nvidia_p2p_get_pages(0, 0, va, len, &junk, NULL, &arg);
	arg.get_no_data = nvidia_p2p_get_pages(0, 0, va, len, &junk, nvt_noop_callback, NULL);
	arg.get_token = nvidia_p2p_get_pages(1, 0, va, len, &junk, nvt_noop_callback, &arg);
	arg.get_ram = nvidia_p2p_get_pages(0, 0, arg.ram_va, GPU_PAGE, &junk,
					   nvt_noop_callback, &arg);
	arg.persistent_misaligned = nvidia_p2p_get_pages_persistent(va + SZ_4K, GPU_PAGE, &junk, 0);
	arg.persistent_bad_flags = nvidia_p2p_get_pages_persistent(va, len, &junk, 2);

	/* The callback of these never runs: nothing frees the memory meanwhile. */
	ret = nvidia_p2p_get_pages(0, 0, va, len, &pt, nvt_noop_callback, &arg);
	if (ret)
		goto out_dev;
	arg.get_twice = nvidia_p2p_get_pages(0, 0, va, len, &twice, nvt_noop_callback, &arg);
	arg.map_null_peer = nvidia_p2p_dma_map_pages(NULL, pt, &map);
	arg.map_ok = nvidia_p2p_dma_map_pages(peer, pt, &map);
	if (!arg.map_ok) {
		arg.unmap_other_peer = nvidia_p2p_dma_unmap_pages(other, pt, map);
		arg.unmap_ok = nvidia_p2p_dma_unmap_pages(peer, pt, map);
		/* Released: the pointer is only compared, never followed. */
		arg.unmap_again = nvidia_p2p_dma_unmap_pages(peer, pt, map);
	}
	arg.map_left = nvidia_p2p_dma_map_pages(peer, pt, &map);
	arg.put_wrong_va = nvidia_p2p_put_pages(0, 0, va + GPU_PAGE, pt);
	arg.put_persistent_of_plain = nvidia_p2p_put_pages_persistent(va, pt, 0);
	arg.put_null = nvidia_p2p_put_pages(0, 0, va, NULL);
	/* Unmaps what is left (map_left) and unpins. */
	arg.put_with_map = nvidia_p2p_put_pages(0, 0, va, pt);
	if (!arg.get_twice)
		arg.put_twice_ret = nvidia_p2p_put_pages(0, 0, va, twice);

	arg.persistent_ok = nvidia_p2p_get_pages_persistent(va, len, &ppt, 0);
	if (!arg.persistent_ok) {
		arg.put_plain_of_persistent = nvidia_p2p_put_pages(0, 0, va, ppt);
		arg.put_persistent_flags = nvidia_p2p_put_pages_persistent(va, ppt, 1);
		arg.put_persistent_ok = nvidia_p2p_put_pages_persistent(va, ppt, 0);
	}
	arg.force_bar1_get = nvidia_p2p_get_pages_persistent(va, len, &fpt,
							     NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING);
	if (!arg.force_bar1_get) {
		arg.force_bar1_map = nvidia_p2p_dma_map_pages(peer, fpt, &fmap);
		if (!arg.force_bar1_map)
			nvidia_p2p_dma_unmap_pages(peer, fpt, fmap);
		arg.force_bar1_put = nvidia_p2p_put_pages_persistent(va, fpt, 0);
	}
	arg.free_table_null = nvidia_p2p_free_page_table(NULL);
	arg.free_map_null = nvidia_p2p_free_dma_mapping(NULL);
	ret = copy_to_user(uarg, &arg, sizeof(arg)) ? -EFAULT : 0;
out_dev:
	pci_dev_put(peer);
	pci_dev_put(other);
	return ret;
}

static long nvt_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	switch (cmd) {
	case NV_P2P_TEST_IOC_PIN:
		return nvt_pin(uarg);
	case NV_P2P_TEST_IOC_STATUS:
		return nvt_status(uarg, false);
	case NV_P2P_TEST_IOC_UNPIN:
		return nvt_status(uarg, true);
	case NV_P2P_TEST_IOC_ARGS:
		return nvt_args(uarg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations nvt_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = nvt_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

static struct miscdevice nvt_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "nv-p2p-test",
	.fops = &nvt_fops,
};

static int __init nvt_init(void)
{
	BUILD_BUG_ON(sizeof(struct nv_p2p_test_pin) != 152);
	BUILD_BUG_ON(sizeof(struct nv_p2p_test_status) != 40);
	BUILD_BUG_ON(sizeof(struct nv_p2p_test_args) != 208);
	return misc_register(&nvt_misc);
}

/* Releases what is left; the exporter cannot go while we use its symbols. */
static void __exit nvt_exit(void)
{
	struct nv_p2p_test_status st;
	struct nvt_pin *p, *tmp;

	misc_deregister(&nvt_misc);
	list_for_each_entry_safe(p, tmp, &nvt_pins, node) {
		list_del(&p->node);
		nvt_release(p, &st);
		pci_dev_put(p->peer);
		kfree(p);
	}
}

module_init(nvt_init);
module_exit(nvt_exit);

MODULE_DESCRIPTION("Test importer of GPU memory through NVIDIA's peer-memory API (nv-p2p.h)");
MODULE_LICENSE("GPL");
