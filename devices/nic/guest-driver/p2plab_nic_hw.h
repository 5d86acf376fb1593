/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * p2plab-nic hardware interface: PCI identity, BAR0 registers and bits,
 * the descriptor layout and status codes. devices/nic/src/regs.rs and
 * descriptor.rs define the same; devices/nic/tests/guest_header.rs checks
 * every define here against them, both ways.
 */
#ifndef P2PLAB_NIC_HW_H
#define P2PLAB_NIC_HW_H

#define P2PLAB_NIC_VENDOR_ID		0x5032
#define P2PLAB_NIC_DEVICE_ID		0x4e49
#define P2PLAB_NIC_REGS_BAR		0
#define P2PLAB_NIC_REGS_BAR_SIZE	0x1000
#define P2PLAB_NIC_MSIX_BAR		4
#define P2PLAB_NIC_ID_MAGIC		0x50324e49
#define P2PLAB_NIC_VERSION_MAJOR	1
#define P2PLAB_NIC_MIN_RING_ENTRIES	2
#define P2PLAB_NIC_MAX_RING_ENTRIES	4096
#define P2PLAB_NIC_MAX_MTU		0x100000

/* BAR0 registers (32-bit unless noted). */
#define NIC_REG_ID		0x000
#define NIC_REG_VERSION		0x004
#define NIC_REG_MTU		0x008
#define NIC_REG_STATUS		0x00c
#define NIC_REG_CTRL		0x010
#define NIC_REG_ERROR		0x014
#define NIC_REG_SCRATCH		0x018
#define NIC_REG_TX_RING_BASE	0x020	/* 64-bit */
#define NIC_REG_TX_RING_SIZE	0x028
#define NIC_REG_TX_HEAD		0x02c
#define NIC_REG_TX_DOORBELL	0x030
#define NIC_REG_TX_TAIL		0x034
#define NIC_REG_RX_RING_BASE	0x040	/* 64-bit */
#define NIC_REG_RX_RING_SIZE	0x048
#define NIC_REG_RX_HEAD		0x04c
#define NIC_REG_RX_DOORBELL	0x050
#define NIC_REG_RX_TAIL		0x054
#define NIC_REG_INT_STATUS	0x060
#define NIC_REG_INT_MASK	0x064

#define NIC_STATUS_READY	0x01
#define NIC_STATUS_LINK_UP	0x02
#define NIC_STATUS_TX_ENABLED	0x04
#define NIC_STATUS_RX_ENABLED	0x08
#define NIC_STATUS_BUS_MASTER	0x10
#define NIC_STATUS_HALTED	0x20
#define NIC_STATUS_TX_BUSY	0x40	/* the TX engine holds a descriptor */
#define NIC_STATUS_RX_BUSY	0x80	/* the RX engine may write a buffer */

#define NIC_CTRL_TX_ENABLE	0x01
#define NIC_CTRL_RX_ENABLE	0x02

#define NIC_INT_TX		0x01
#define NIC_INT_RX		0x02
#define NIC_INT_ERROR		0x04
#define NIC_INT_ALL		0x07

/* Ring-level errors in NIC_REG_ERROR. */
#define NIC_ERR_BAD_RING	0x10
#define NIC_ERR_RING_DMA	0x11
#define NIC_ERR_BAD_DOORBELL	0x12

/* Descriptors: 32 bytes, the same for TX and RX rings. */
#define NIC_DESC_SIZE		32
#define NIC_DESC_FLAG_IRQ	0x0001

/* Written by the device into desc.status; 0 means the device owns it. */
#define NIC_DESC_STATUS_OK		1
#define NIC_DESC_STATUS_DMA_ERROR	2
#define NIC_DESC_STATUS_TOO_LONG	3
#define NIC_DESC_STATUS_BAD_FCS		4
#define NIC_DESC_STATUS_TRUNCATED	5
#define NIC_DESC_STATUS_LINK_DOWN	6
#define NIC_DESC_STATUS_BAD_DESCRIPTOR	7

#ifdef __KERNEL__
#include <linux/types.h>
struct p2plab_nic_desc {
	__le64 addr;	/* bus address of the buffer */
	__le32 len;	/* TX: frame bytes; RX: buffer capacity */
	__le16 flags;	/* NIC_DESC_FLAG_* */
	__le16 status;	/* NIC_DESC_STATUS_*, written last by the device */
	__le64 cookie;	/* the driver's; never touched by the device */
	__le32 done_len;	/* bytes moved, written before status */
	__le32 reserved;
};
#endif

#endif /* P2PLAB_NIC_HW_H */
