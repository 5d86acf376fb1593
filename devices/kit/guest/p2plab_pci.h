/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What p2plab's guest PCI drivers (p2plab_gpu, p2plab_nic) share: bringing
 * a device's register BAR up and down, its one interrupt vector (MSI-X,
 * else INTx), and the char-device plumbing (a class, a minor per device,
 * the module's registration).
 *
 * Static inline functions in a header: each module compiles its own copy,
 * with its own KBUILD_MODNAME and THIS_MODULE, so the drivers share source
 * but no symbols -- no third module, no load order, no Module.symvers.
 * A driver's Kbuild adds this folder to its include path.
 */
#ifndef P2PLAB_PCI_H
#define P2PLAB_PCI_H

#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/kdev_t.h>
#include <linux/log2.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/stddef.h>

#ifndef PCI_IRQ_INTX
#define PCI_IRQ_INTX PCI_IRQ_LEGACY
#endif

/* How a p2plab device names itself in its register BAR. */
struct p2plab_pci_ident {
	const char *what;	/* "GPU", "NIC": for messages */
	struct {
		int bar;
		unsigned long size;
	} regs;
	struct {
		u32 reg;
		u32 magic;
	} id;
	struct {
		u32 reg;
		u32 major;	/* the register's bits 31:16 */
	} version;
};

/*
 * Enables @pdev, claims its memory BARs, maps the register BAR, checks that
 * the device is the one @ident describes, and turns on 64-bit DMA and bus
 * mastering. Returns the registers, or an ERR_PTR with everything undone.
 * @ident comes from the matching pci_device_id's driver_data: NULL when
 * the device was bound through driver_override or a new_id without it.
 */
static inline void __iomem *p2plab_pci_map(struct pci_dev *pdev,
					   const struct p2plab_pci_ident *ident)
{
	void __iomem *regs;
	u32 magic, version;
	int ret;

	if (!ident) {
		dev_err(&pdev->dev, "not a device of this driver's ID table\n");
		return ERR_PTR(-ENODEV);
	}
	ret = pci_enable_device_mem(pdev);
	if (ret)
		return ERR_PTR(ret);
	ret = pci_request_mem_regions(pdev, KBUILD_MODNAME);
	if (ret)
		goto err_disable;
	if (pci_resource_len(pdev, ident->regs.bar) < ident->regs.size) {
		dev_err(&pdev->dev, "unexpected BAR layout\n");
		ret = -ENODEV;
		goto err_release;
	}
	regs = pci_iomap(pdev, ident->regs.bar, ident->regs.size);
	if (!regs) {
		ret = -ENOMEM;
		goto err_release;
	}
	magic = readl(regs + ident->id.reg);
	version = readl(regs + ident->version.reg);
	if (magic != ident->id.magic || version >> 16 != ident->version.major) {
		dev_err(&pdev->dev, "not a p2plab %s v%u (id %#x, version %#x)\n", ident->what,
			ident->version.major, magic, version);
		ret = -ENODEV;
		goto err_unmap;
	}
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		goto err_unmap;
	pci_set_master(pdev);
	return regs;

err_unmap:
	pci_iounmap(pdev, regs);
err_release:
	pci_release_mem_regions(pdev);
err_disable:
	pci_disable_device(pdev);
	return ERR_PTR(ret);
}

/* Undoes p2plab_pci_map once the device no longer does DMA. */
static inline void p2plab_pci_unmap(struct pci_dev *pdev, void __iomem *regs)
{
	pci_clear_master(pdev);
	pci_iounmap(pdev, regs);
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
}

/*
 * One interrupt vector, MSI-X when the device offers it, else INTx (shared,
 * so @handler returns IRQ_NONE for interrupts that are not its device's).
 * Returns the Linux irq number, or a negative errno with nothing allocated.
 */
static inline int p2plab_pci_irq_setup(struct pci_dev *pdev, irq_handler_t handler, void *data)
{
	int irq, ret;

	ret = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSIX | PCI_IRQ_INTX);
	if (ret < 0)
		return ret;
	irq = pci_irq_vector(pdev, 0);
	ret = irq < 0 ? irq : request_irq(irq, handler, IRQF_SHARED, KBUILD_MODNAME, data);
	if (ret) {
		pci_free_irq_vectors(pdev);
		return ret;
	}
	return irq;
}

/*
 * Reads the interrupt causes at @status_reg and acknowledges them (write 1
 * to clear). 0 when there are none, or when the device is gone and reads
 * all ones: not this device's interrupt.
 */
static inline u32 p2plab_pci_irq_ack(void __iomem *regs, u32 status_reg)
{
	u32 cause = readl(regs + status_reg);

	if (!cause || cause == ~0u)
		return 0;
	writel(cause, regs + status_reg);
	return cause;
}

static inline void p2plab_pci_irq_teardown(struct pci_dev *pdev, int irq, void *data)
{
	free_irq(irq, data);
	pci_free_irq_vectors(pdev);
}

/*
 * A driver's char devices: a class (whose name is also the chrdev region's
 * and, with the minor appended, each device's), a region of @minors and the
 * minors handed out. Define one with P2PLAB_CHRDEVS.
 */
struct p2plab_chrdevs {
	const struct class class;
	unsigned int minors;
	dev_t devt;
	struct ida ida;
};

#define P2PLAB_CHRDEVS(var, class_name, nminors)				\
	struct p2plab_chrdevs var = {						\
		.class = { .name = class_name },				\
		.minors = (nminors),						\
		.ida = IDA_INIT(var.ida),					\
	}

/*
 * Module init: the chrdev region, the class, then @pdrv (whose probe may
 * add devices at once). Undoes what it did on failure.
 */
static inline int p2plab_chrdevs_register(struct p2plab_chrdevs *cd, struct pci_driver *pdrv)
{
	int ret;

	ret = alloc_chrdev_region(&cd->devt, 0, cd->minors, cd->class.name);
	if (ret)
		return ret;
	ret = class_register(&cd->class);
	if (ret)
		goto err_chrdev;
	ret = pci_register_driver(pdrv);
	if (ret)
		goto err_class;
	return 0;

err_class:
	class_unregister(&cd->class);
err_chrdev:
	unregister_chrdev_region(cd->devt, cd->minors);
	return ret;
}

static inline void p2plab_chrdevs_unregister(struct p2plab_chrdevs *cd, struct pci_driver *pdrv)
{
	pci_unregister_driver(pdrv);
	class_unregister(&cd->class);
	unregister_chrdev_region(cd->devt, cd->minors);
	ida_destroy(&cd->ida);
}

static inline void *p2plab_chrdevs_alloc_dev(struct p2plab_chrdevs *cd, size_t size,
					     size_t dev_offset, struct device *parent,
					     void (*release)(struct device *))
{
	void *owner = kzalloc(size, GFP_KERNEL);
	struct device *dev;
	int minor, ret;

	if (!owner)
		return ERR_PTR(-ENOMEM);
	dev = owner + dev_offset;
	minor = ida_alloc_max(&cd->ida, cd->minors - 1, GFP_KERNEL);
	if (minor < 0) {
		kfree(owner);
		return ERR_PTR(minor);
	}
	device_initialize(dev);
	dev->class = &cd->class;
	dev->parent = parent;
	dev->devt = MKDEV(MAJOR(cd->devt), minor);
	dev->release = release;
	ret = dev_set_name(dev, "%s%d", cd->class.name, minor);
	if (ret) {
		put_device(dev);
		return ERR_PTR(ret);
	}
	return owner;
}

/*
 * A zeroed @type whose struct device @member has a free minor of @cd, the
 * name "<class><minor>", @parent and @release (which frees the @type and
 * calls p2plab_chrdevs_put_minor): put_device frees it from now on. Or an
 * ERR_PTR.
 */
#define p2plab_chrdevs_alloc(cd, type, member, parent, release)			\
	((type *)p2plab_chrdevs_alloc_dev(cd, sizeof(type), offsetof(type, member),	\
					  parent, release))

/* For the device's release function: its minor is free again. */
static inline void p2plab_chrdevs_put_minor(struct p2plab_chrdevs *cd, struct device *dev)
{
	ida_free(&cd->ida, MINOR(dev->devt));
}

/*
 * The ring_entries module parameter a driver's probe checks: a power of two
 * in @min..@max.
 */
static inline bool p2plab_ring_entries_ok(struct pci_dev *pdev, unsigned int entries,
					  unsigned int min, unsigned int max)
{
	if (is_power_of_2(entries) && entries >= min && entries <= max)
		return true;
	dev_err(&pdev->dev, "ring_entries=%u is not a power of two in %u..%u\n", entries, min,
		max);
	return false;
}

/* Makes @dev's char device (file operations @fops) appear in /dev. */
static inline int p2plab_chrdevs_add(struct cdev *cdev, struct device *dev,
				     const struct file_operations *fops)
{
	cdev_init(cdev, fops);
	cdev->owner = THIS_MODULE;
	return cdev_device_add(cdev, dev);
}

#endif /* P2PLAB_PCI_H */
