//! The codes of the EFA device interface, named as the driver's headers
//! name them (`efa_admin_cmds_defs.h`, `efa_admin_defs.h`,
//! `efa_io_defs.h`) after their prefixes, so traces, logs and the
//! reference page say what the driver's source says.

/// Declares a table of codes: an enum with each code's value, its name as
/// in the C header after `prefix`, `ALL`, and a checked conversion from
/// the raw value.
macro_rules! codes {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $raw:ty, prefix $prefix:literal {
            $( $(#[$doc:meta])* $variant:ident($cname:ident) = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$doc])* $variant, )+
        }

        impl $name {
            /// Every code, in the header's order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// What the C header puts before each name.
            pub const PREFIX: &'static str = $prefix;

            /// The raw value.
            pub const fn code(self) -> $raw {
                match self { $($name::$variant => $value,)+ }
            }

            /// The name as in the C header (after the prefix).
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => stringify!($cname),)+ }
            }

            /// The code with this raw value, if there is one.
            pub fn from_code(raw: $raw) -> Option<Self> {
                match raw {
                    $($value => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// Admin command opcodes (`enum efa_admin_aq_opcode`).
    pub enum AdminOpcode: u8, prefix "EFA_ADMIN_" {
        /// Creates a queue pair.
        CreateQp(CREATE_QP) = 1,
        /// Changes a QP's state, qkey, PSN or RNR retry.
        ModifyQp(MODIFY_QP) = 2,
        /// Reports a QP's state.
        QueryQp(QUERY_QP) = 3,
        /// Destroys a QP.
        DestroyQp(DESTROY_QP) = 4,
        /// Creates an address handle for a destination GID.
        CreateAh(CREATE_AH) = 5,
        /// Destroys an address handle.
        DestroyAh(DESTROY_AH) = 6,
        /// Registers a memory region (a page list).
        RegMr(REG_MR) = 7,
        /// Deregisters a memory region.
        DeregMr(DEREG_MR) = 8,
        /// Creates a completion queue.
        CreateCq(CREATE_CQ) = 9,
        /// Destroys a completion queue.
        DestroyCq(DESTROY_CQ) = 10,
        /// Reads a feature's attributes.
        GetFeature(GET_FEATURE) = 11,
        /// Sets a feature (AENQ groups, host info).
        SetFeature(SET_FEATURE) = 12,
        /// Reads device statistics.
        GetStats(GET_STATS) = 13,
        /// Allocates a protection domain.
        AllocPd(ALLOC_PD) = 14,
        /// Frees a protection domain.
        DeallocPd(DEALLOC_PD) = 15,
        /// Allocates a user access region (a doorbell page).
        AllocUar(ALLOC_UAR) = 16,
        /// Frees a UAR.
        DeallocUar(DEALLOC_UAR) = 17,
        /// Creates an event queue.
        CreateEq(CREATE_EQ) = 18,
        /// Destroys an event queue.
        DestroyEq(DESTROY_EQ) = 19,
        /// Allocates an MR for fast registration (not supported).
        AllocMr(ALLOC_MR) = 20,
        /// Service command (not supported).
        Service(SERVICE) = 21,
        /// Event counters (not supported, not advertised).
        CreateEventCounter(CREATE_EVENT_COUNTER) = 25,
        /// Event counters (not supported).
        DestroyEventCounter(DESTROY_EVENT_COUNTER) = 26,
        /// Event counters (not supported).
        AttachEventCounter(ATTACH_EVENT_COUNTER) = 27,
        /// Event counters (not supported).
        ModifyEventCounter(MODIFY_EVENT_COUNTER) = 28,
        /// Event counters (not supported).
        DetachEventCounter(DETACH_EVENT_COUNTER) = 29,
    }
}

/// The name of an admin opcode for traces: the header's name, or
/// `UNKNOWN(n)` for a value the interface does not define.
pub fn admin_opcode_name(raw: u8) -> String {
    AdminOpcode::from_code(raw).map_or_else(|| format!("UNKNOWN({raw})"), |op| op.name().into())
}

codes! {
    /// Admin completion status (`enum efa_admin_aq_completion_status`);
    /// the driver turns them into errnos.
    pub enum AdminStatus: u8, prefix "EFA_ADMIN_" {
        /// Done (0).
        Success(SUCCESS) = 0,
        /// A table is full (-ENOMEM).
        ResourceAllocationFailure(RESOURCE_ALLOCATION_FAILURE) = 1,
        /// No such opcode (-EINVAL).
        BadOpcode(BAD_OPCODE) = 2,
        /// A known opcode the device does not implement (-EOPNOTSUPP).
        UnsupportedOpcode(UNSUPPORTED_OPCODE) = 3,
        /// A malformed command or control buffer (-EINVAL).
        MalformedRequest(MALFORMED_REQUEST) = 4,
        /// A bad index, handle or value (-EINVAL).
        IllegalParameter(ILLEGAL_PARAMETER) = 5,
        /// Anything else (-EINVAL).
        UnknownError(UNKNOWN_ERROR) = 6,
        /// The object is in use (-EINVAL).
        ResourceBusy(RESOURCE_BUSY) = 7,
    }
}

codes! {
    /// Feature IDs of GET_FEATURE / SET_FEATURE (`enum
    /// efa_admin_aq_feature_id`).
    pub enum FeatureId: u8, prefix "EFA_ADMIN_" {
        /// Device attributes and supported features.
        DeviceAttr(DEVICE_ATTR) = 1,
        /// AENQ groups supported and enabled.
        AenqConfig(AENQ_CONFIG) = 2,
        /// GID and MTU.
        NetworkAttr(NETWORK_ATTR) = 3,
        /// Queue and table limits.
        QueueAttr1(QUEUE_ATTR_1) = 4,
        /// Timeouts the driver uses.
        HwHints(HW_HINTS) = 5,
        /// The host's OS and driver (SET only).
        HostInfo(HOST_INFO) = 6,
        /// Event queue limits.
        EventQueueAttr(EVENT_QUEUE_ATTR) = 7,
        /// More queue attributes (extended inline size).
        QueueAttr2(QUEUE_ATTR_2) = 9,
    }
}

codes! {
    /// QP transport types (`enum efa_admin_qp_type`).
    pub enum QpType: u8, prefix "EFA_ADMIN_QP_TYPE_" {
        /// Unreliable datagram.
        Ud(UD) = 1,
        /// Scalable reliable datagram.
        Srd(SRD) = 2,
    }
}

codes! {
    /// QP states (`enum efa_admin_qp_state`, the same numbers as the
    /// kernel's `ib_qp_state`).
    pub enum QpState: u32, prefix "EFA_ADMIN_QP_STATE_" {
        /// Nothing posted is processed; queue indices are zero.
        Reset(RESET) = 0,
        /// Receives may be posted.
        Init(INIT) = 1,
        /// Ready to receive.
        Rtr(RTR) = 2,
        /// Ready to send.
        Rts(RTS) = 3,
        /// Send queue drained.
        Sqd(SQD) = 4,
        /// Send queue error.
        Sqe(SQE) = 5,
        /// Error: nothing is processed.
        Err(ERR) = 6,
    }
}

codes! {
    /// GET_STATS types (`enum efa_admin_get_stats_type`).
    pub enum StatsType: u8, prefix "EFA_ADMIN_GET_STATS_TYPE_" {
        /// Packets and bytes on the wire.
        Basic(BASIC) = 0,
        /// SEND messages.
        Messages(MESSAGES) = 1,
        /// RDMA reads.
        RdmaRead(RDMA_READ) = 2,
        /// RDMA writes.
        RdmaWrite(RDMA_WRITE) = 3,
        /// Retransmissions and unresponsive peers.
        Network(NETWORK) = 4,
    }
}

codes! {
    /// AENQ event groups (`enum efa_admin_aenq_group`).
    pub enum AenqGroup: u16, prefix "EFA_ADMIN_" {
        /// Fatal errors.
        FatalError(FATAL_ERROR) = 1,
        /// Warnings.
        Warning(WARNING) = 2,
        /// Notifications (the lab's link state changes).
        Notification(NOTIFICATION) = 3,
        /// Keep-alive: the driver counts them in `keep_alive_rcvd`.
        KeepAlive(KEEP_ALIVE) = 4,
    }
}

/// Every AENQ group the driver requires the device to support.
pub const AENQ_GROUPS_SUPPORTED: u32 = 1 << 1 | 1 << 2 | 1 << 3 | 1 << 4;

codes! {
    /// Syndromes of the NOTIFICATION group the lab posts. The interface
    /// leaves them to the device; the 7.3 driver logs "Unknown event was
    /// received or event with unimplemented handler" for every one.
    pub enum LinkSyndrome: u16, prefix "P2PLAB_EFA_AENQ_" {
        /// The fabric port went down: SRD sends fail as unreachable.
        LinkDown(LINK_DOWN) = 1,
        /// The fabric port is up again.
        LinkUp(LINK_UP) = 2,
    }
}

codes! {
    /// Send operation types in a TX WQE and a completion (`enum
    /// efa_io_send_op_type`).
    pub enum IoOp: u8, prefix "EFA_IO_" {
        /// A SEND message.
        Send(SEND) = 0,
        /// An RDMA read.
        RdmaRead(RDMA_READ) = 1,
        /// An RDMA write.
        RdmaWrite(RDMA_WRITE) = 2,
        /// Fast MR registration (not supported).
        FastReg(FAST_REG) = 3,
        /// Fast MR invalidation (not supported).
        FastInv(FAST_INV) = 4,
    }
}

codes! {
    /// Which queue a completion belongs to (`enum efa_io_queue_type`).
    pub enum IoQueue: u8, prefix "EFA_IO_" {
        /// A QP's send queue.
        SendQueue(SEND_QUEUE) = 1,
        /// A QP's receive queue.
        RecvQueue(RECV_QUEUE) = 2,
    }
}

codes! {
    /// Completion status (`enum efa_io_comp_status`); rdma-core maps
    /// them to `ibv_wc_status` and reports the raw one as `vendor_err`.
    pub enum IoStatus: u8, prefix "EFA_IO_COMP_STATUS_" {
        /// Done.
        Ok(OK) = 0,
        /// Flushed: the QP went to the error state.
        Flushed(FLUSHED) = 1,
        /// Internal QP error.
        LocalQpInternalError(LOCAL_ERROR_QP_INTERNAL_ERROR) = 2,
        /// A malformed WQE or an operation the device does not support.
        LocalUnsupportedOp(LOCAL_ERROR_UNSUPPORTED_OP) = 3,
        /// No such address handle (or another PD's).
        LocalInvalidAh(LOCAL_ERROR_INVALID_AH) = 4,
        /// LKEY not registered or not matching the address.
        LocalInvalidLkey(LOCAL_ERROR_INVALID_LKEY) = 5,
        /// Message too long.
        LocalBadLength(LOCAL_ERROR_BAD_LENGTH) = 6,
        /// RKEY not registered or not matching the remote address.
        RemoteBadAddress(REMOTE_ERROR_BAD_ADDRESS) = 7,
        /// Connection reset by the remote side.
        RemoteAbort(REMOTE_ERROR_ABORT) = 8,
        /// No such destination QP (or not in a receiving state).
        RemoteBadDestQpn(REMOTE_ERROR_BAD_DEST_QPN) = 9,
        /// The receiver had no receive posted, retries exhausted.
        RemoteRnr(REMOTE_ERROR_RNR) = 10,
        /// The receiver's buffer was too short.
        RemoteBadLength(REMOTE_ERROR_BAD_LENGTH) = 11,
        /// The responder failed the operation in another way.
        RemoteBadStatus(REMOTE_ERROR_BAD_STATUS) = 12,
        /// A remote that answered before stopped answering.
        LocalUnrespRemote(LOCAL_ERROR_UNRESP_REMOTE) = 13,
        /// The remote knows no such peer.
        RemoteUnknownPeer(REMOTE_ERROR_UNKNOWN_PEER) = 14,
        /// No answer ever came.
        LocalUnreachRemote(LOCAL_ERROR_UNREACH_REMOTE) = 15,
        /// Remote feature mismatch.
        RemoteFeatureMismatch(REMOTE_ERROR_FEATURE_MISMATCH) = 18,
    }
}

/// DEVICE_ATTR.device_caps bits (`EFA_ADMIN_FEATURE_DEVICE_ATTR_DESC_*`).
pub mod device_caps {
    /// RDMA read.
    pub const RDMA_READ: u32 = 1 << 0;
    /// RNR retry (the driver then accepts IB_QP_RNR_RETRY).
    pub const RNR_RETRY: u32 = 1 << 1;
    /// 128-byte data polling (not offered).
    pub const DATA_POLLING_128: u32 = 1 << 2;
    /// RDMA write.
    pub const RDMA_WRITE: u32 = 1 << 3;
    /// Unsolicited write-with-immediate receive (not offered).
    pub const UNSOLICITED_WRITE_RECV: u32 = 1 << 4;
    /// Event counters (not offered).
    pub const EVENT_COUNTERS: u32 = 1 << 5;
    /// 64-bit SQ request IDs (not offered).
    pub const SQ_64_BIT_REQ_ID: u32 = 1 << 10;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a code table whose raw values do not round trip, or a
    /// name that lost its C spelling.
    #[test]
    fn codes_round_trip_and_keep_their_c_names() {
        for op in AdminOpcode::ALL {
            assert_eq!(AdminOpcode::from_code(op.code()), Some(*op));
        }
        assert_eq!(AdminOpcode::RegMr.name(), "REG_MR");
        assert_eq!(AdminOpcode::from_code(22), None);
        assert_eq!(admin_opcode_name(7), "REG_MR");
        assert_eq!(admin_opcode_name(200), "UNKNOWN(200)");
        for status in IoStatus::ALL {
            assert_eq!(IoStatus::from_code(status.code()), Some(*status));
        }
        assert_eq!(IoStatus::RemoteRnr.code(), 10);
        assert_eq!(IoStatus::from_code(16), None);
        assert_eq!(FeatureId::QueueAttr2.code(), 9);
        assert_eq!(AENQ_GROUPS_SUPPORTED, 0x1e);
    }
}
