//! cuFile's error numbers (`CUfileOpError` in `include/cufile.h`, as the
//! cuFile API reference numbers them) and how p2plab-gds's codes map onto
//! them. A program that compares against `CU_FILE_INVALID_VALUE` must see
//! 5022 where p2plab-gds says 5002.

use std::ffi::CStr;

use p2plab_gds::ErrorCode;

/// `CUfileOpError`: every value the header declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum OpError {
    Success = 0,
    DriverNotInitialized = 5001,
    DriverInvalidProps = 5002,
    DriverUnsupportedLimit = 5003,
    DriverVersionMismatch = 5004,
    DriverVersionReadError = 5005,
    DriverClosing = 5006,
    PlatformNotSupported = 5007,
    IoNotSupported = 5008,
    DeviceNotSupported = 5009,
    NvfsDriverError = 5010,
    CudaDriverError = 5011,
    CudaPointerInvalid = 5012,
    CudaMemoryTypeInvalid = 5013,
    CudaPointerRangeError = 5014,
    CudaContextMismatch = 5015,
    InvalidMappingSize = 5016,
    InvalidMappingRange = 5017,
    InvalidFileType = 5018,
    InvalidFileOpenFlag = 5019,
    DioNotSet = 5020,
    InvalidValue = 5022,
    MemoryAlreadyRegistered = 5023,
    MemoryNotRegistered = 5024,
    PermissionDenied = 5025,
    DriverAlreadyOpen = 5026,
    HandleNotRegistered = 5027,
    HandleAlreadyRegistered = 5028,
    DeviceNotFound = 5029,
    InternalError = 5030,
    GetNewFdFailed = 5031,
    NvfsSetupError = 5033,
    IoDisabled = 5034,
    BatchSubmitFailed = 5035,
    GpuMemoryPinningFailed = 5036,
    BatchFull = 5037,
    AsyncNotSupported = 5038,
    InternalBatchSetupError = 5039,
    InternalBatchSubmitError = 5040,
    InternalBatchGetstatusError = 5041,
    InternalBatchCancelError = 5042,
    NomemError = 5043,
    IoError = 5044,
    InternalBufRegisterError = 5045,
    HashOprError = 5046,
    InvalidContextError = 5047,
    NvfsInternalDriverError = 5048,
    BatchNocompatError = 5049,
    IoMaxError = 5050,
}

/// CUDA's `CUDA_ERROR_UNKNOWN`: `cu_err` of a GPU engine failure.
pub const CUDA_ERROR_UNKNOWN: i32 = 999;

impl OpError {
    /// Every value with its C name (without `CU_FILE_`) and a sentence.
    pub const ALL: [(OpError, &'static str, &'static CStr); 49] = [
        (OpError::Success, "SUCCESS", c"cufile success"),
        (
            OpError::DriverNotInitialized,
            "DRIVER_NOT_INITIALIZED",
            c"driver not initialized (cuFileDriverOpen)",
        ),
        (
            OpError::DriverInvalidProps,
            "DRIVER_INVALID_PROPS",
            c"invalid driver property",
        ),
        (
            OpError::DriverUnsupportedLimit,
            "DRIVER_UNSUPPORTED_LIMIT",
            c"property range error",
        ),
        (
            OpError::DriverVersionMismatch,
            "DRIVER_VERSION_MISMATCH",
            c"driver version mismatch",
        ),
        (
            OpError::DriverVersionReadError,
            "DRIVER_VERSION_READ_ERROR",
            c"driver version read error",
        ),
        (OpError::DriverClosing, "DRIVER_CLOSING", c"driver closing"),
        (
            OpError::PlatformNotSupported,
            "PLATFORM_NOT_SUPPORTED",
            c"platform not supported",
        ),
        (
            OpError::IoNotSupported,
            "IO_NOT_SUPPORTED",
            c"I/O not supported on this file or handle",
        ),
        (
            OpError::DeviceNotSupported,
            "DEVICE_NOT_SUPPORTED",
            c"device not supported",
        ),
        (
            OpError::NvfsDriverError,
            "NVFS_DRIVER_ERROR",
            c"kernel driver error",
        ),
        (
            OpError::CudaDriverError,
            "CUDA_DRIVER_ERROR",
            c"GPU error (the GPU engine failed a copy)",
        ),
        (
            OpError::CudaPointerInvalid,
            "CUDA_POINTER_INVALID",
            c"not GPU memory of a p2plab GPU",
        ),
        (
            OpError::CudaMemoryTypeInvalid,
            "CUDA_MEMORY_TYPE_INVALID",
            c"invalid GPU memory type",
        ),
        (
            OpError::CudaPointerRangeError,
            "CUDA_POINTER_RANGE_ERROR",
            c"GPU pointer range error",
        ),
        (
            OpError::CudaContextMismatch,
            "CUDA_CONTEXT_MISMATCH",
            c"GPU context mismatch",
        ),
        (
            OpError::InvalidMappingSize,
            "INVALID_MAPPING_SIZE",
            c"invalid mapping size",
        ),
        (
            OpError::InvalidMappingRange,
            "INVALID_MAPPING_RANGE",
            c"invalid mapping range",
        ),
        (
            OpError::InvalidFileType,
            "INVALID_FILE_TYPE",
            c"invalid file type (not a regular file)",
        ),
        (
            OpError::InvalidFileOpenFlag,
            "INVALID_FILE_OPEN_FLAG",
            c"invalid file open flags",
        ),
        (OpError::DioNotSet, "DIO_NOT_SET", c"O_DIRECT not set"),
        (OpError::InvalidValue, "INVALID_VALUE", c"invalid argument"),
        (
            OpError::MemoryAlreadyRegistered,
            "MEMORY_ALREADY_REGISTERED",
            c"memory already registered",
        ),
        (
            OpError::MemoryNotRegistered,
            "MEMORY_NOT_REGISTERED",
            c"memory not registered",
        ),
        (
            OpError::PermissionDenied,
            "PERMISSION_DENIED",
            c"permission denied",
        ),
        (
            OpError::DriverAlreadyOpen,
            "DRIVER_ALREADY_OPEN",
            c"driver already open",
        ),
        (
            OpError::HandleNotRegistered,
            "HANDLE_NOT_REGISTERED",
            c"file handle not registered",
        ),
        (
            OpError::HandleAlreadyRegistered,
            "HANDLE_ALREADY_REGISTERED",
            c"file handle already registered",
        ),
        (
            OpError::DeviceNotFound,
            "DEVICE_NOT_FOUND",
            c"no p2plab GPU found",
        ),
        (OpError::InternalError, "INTERNAL_ERROR", c"internal error"),
        (
            OpError::GetNewFdFailed,
            "GETNEWFD_FAILED",
            c"failed to obtain a new file descriptor",
        ),
        (
            OpError::NvfsSetupError,
            "NVFS_SETUP_ERROR",
            c"kernel driver setup error",
        ),
        (OpError::IoDisabled, "IO_DISABLED", c"I/O disabled"),
        (
            OpError::BatchSubmitFailed,
            "BATCH_SUBMIT_FAILED",
            c"batch submit failed",
        ),
        (
            OpError::GpuMemoryPinningFailed,
            "GPU_MEMORY_PINNING_FAILED",
            c"GPU memory pinning failed",
        ),
        (OpError::BatchFull, "BATCH_FULL", c"batch queue full"),
        (
            OpError::AsyncNotSupported,
            "ASYNC_NOT_SUPPORTED",
            c"async I/O not supported",
        ),
        (
            OpError::InternalBatchSetupError,
            "INTERNAL_BATCH_SETUP_ERROR",
            c"internal batch setup error",
        ),
        (
            OpError::InternalBatchSubmitError,
            "INTERNAL_BATCH_SUBMIT_ERROR",
            c"internal batch submit error",
        ),
        (
            OpError::InternalBatchGetstatusError,
            "INTERNAL_BATCH_GETSTATUS_ERROR",
            c"internal batch get-status error",
        ),
        (
            OpError::InternalBatchCancelError,
            "INTERNAL_BATCH_CANCEL_ERROR",
            c"internal batch cancel error",
        ),
        (OpError::NomemError, "NOMEM_ERROR", c"out of memory"),
        (OpError::IoError, "IO_ERROR", c"I/O error"),
        (
            OpError::InternalBufRegisterError,
            "INTERNAL_BUF_REGISTER_ERROR",
            c"internal buffer registration error",
        ),
        (
            OpError::HashOprError,
            "HASH_OPR_ERROR",
            c"internal hash table error",
        ),
        (
            OpError::InvalidContextError,
            "INVALID_CONTEXT_ERROR",
            c"invalid context",
        ),
        (
            OpError::NvfsInternalDriverError,
            "NVFS_INTERNAL_DRIVER_ERROR",
            c"kernel driver internal error",
        ),
        (
            OpError::BatchNocompatError,
            "BATCH_NOCOMPAT_ERROR",
            c"batch I/O in compat mode",
        ),
        (OpError::IoMaxError, "IO_MAX_ERROR", c"I/O max error"),
    ];

    pub fn from_i32(value: i32) -> Option<OpError> {
        Self::ALL
            .iter()
            .find(|(e, _, _)| *e as i32 == value)
            .map(|(e, _, _)| *e)
    }

    /// The C name without `CU_FILE_`.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(e, _, _)| *e == self)
            .map_or("", |(_, n, _)| n)
    }

    /// The sentence `cufileop_status_error` returns.
    pub fn describe(self) -> &'static CStr {
        Self::ALL
            .iter()
            .find(|(e, _, _)| *e == self)
            .map_or(c"", |(_, _, d)| d)
    }

    /// cuFile's number for a p2plab-gds failure. `errno` is the system
    /// call's (0 when none): a failed system call outside read/write
    /// (which return -1 with errno) becomes INVALID_VALUE (EBADF: not an
    /// open fd), PERMISSION_DENIED (EPERM, EACCES), NOMEM_ERROR (ENOMEM)
    /// or IO_ERROR; the errno stays in `errno` and the text in
    /// `p2plab_cufile_last_error`. INTERNAL_ERROR is only a bug.
    pub fn from_gds(code: ErrorCode, errno: i32) -> OpError {
        match code {
            ErrorCode::Success => OpError::Success,
            ErrorCode::DriverNotInitialized => OpError::DriverNotInitialized,
            ErrorCode::InvalidValue => OpError::InvalidValue,
            ErrorCode::HandleNotRegistered => OpError::HandleNotRegistered,
            ErrorCode::InvalidFileType => OpError::InvalidFileType,
            ErrorCode::MemoryNotRegistered => OpError::MemoryNotRegistered,
            ErrorCode::MemoryAlreadyRegistered => OpError::MemoryAlreadyRegistered,
            ErrorCode::PointerInvalid => OpError::CudaPointerInvalid,
            ErrorCode::DeviceNotFound => OpError::DeviceNotFound,
            ErrorCode::IoNotSupported => OpError::IoNotSupported,
            // cuFile's compat copies are cudaMemcpy; here the GPU engine.
            ErrorCode::GpuEngineError => OpError::CudaDriverError,
            ErrorCode::SystemError => match errno {
                libc::EBADF => OpError::InvalidValue,
                libc::EPERM | libc::EACCES => OpError::PermissionDenied,
                libc::ENOMEM => OpError::NomemError,
                _ => OpError::IoError,
            },
            ErrorCode::InternalError => OpError::InternalError,
        }
    }

    /// `from_gds` for a raw p2plab-gds number (as a status carries it).
    pub fn from_gds_raw(code: i32, errno: i32) -> OpError {
        ErrorCode::from_i32(code).map_or(OpError::InternalError, |c| Self::from_gds(c, errno))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a cuFile code renumbered or missing from the table, or a
    /// p2plab-gds code that maps onto p2plab's own number instead of
    /// cuFile's (5002 for an invalid value, where cuFile says 5022).
    #[test]
    fn numbers_are_cufiles_and_every_gds_code_maps() {
        for (e, name, text) in OpError::ALL {
            assert_eq!(OpError::from_i32(e as i32), Some(e), "{name}");
            assert!(!text.to_bytes().is_empty(), "{name}");
        }
        assert_eq!(OpError::from_i32(5021), None, "5021 is not documented");
        assert_eq!(OpError::from_i32(5032), None, "5032 is not documented");
        let expect = [
            (ErrorCode::Success, 0),
            (ErrorCode::DriverNotInitialized, 5001),
            (ErrorCode::InvalidValue, 5022),
            (ErrorCode::HandleNotRegistered, 5027),
            (ErrorCode::InvalidFileType, 5018),
            (ErrorCode::MemoryNotRegistered, 5024),
            (ErrorCode::MemoryAlreadyRegistered, 5023),
            (ErrorCode::PointerInvalid, 5012),
            (ErrorCode::DeviceNotFound, 5029),
            (ErrorCode::IoNotSupported, 5008),
            (ErrorCode::GpuEngineError, 5011),
            (ErrorCode::SystemError, 5044),
            (ErrorCode::InternalError, 5030),
        ];
        assert_eq!(expect.len(), ErrorCode::ALL.len(), "a new p2plab-gds code");
        for (gds, cufile) in expect {
            assert_eq!(OpError::from_gds(gds, 0) as i32, cufile, "{gds:?}");
            assert_eq!(OpError::from_gds_raw(gds as i32, 0) as i32, cufile);
        }
        for (errno, want) in [
            (libc::EACCES, OpError::PermissionDenied),
            (libc::EPERM, OpError::PermissionDenied),
            (libc::EBADF, OpError::InvalidValue),
            (libc::ENOMEM, OpError::NomemError),
            (libc::EIO, OpError::IoError),
        ] {
            assert_eq!(OpError::from_gds(ErrorCode::SystemError, errno), want);
        }
        assert_eq!(OpError::from_gds_raw(4, 0), OpError::InternalError);
    }
}
