//! Error codes in the cuFile style: a library code (5000 and up, so it
//! never collides with an errno) plus the errno of the system call that
//! failed, and a sentence for people. The numbers are the C ABI
//! (`P2PLAB_GDS_*` in `include/p2plab_gds.h`); never renumber one.

use std::fmt;

/// What went wrong, as the C ABI numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorCode {
    Success = 0,
    /// A call before `driver_open` (or after the last `driver_close`).
    DriverNotInitialized = 5001,
    /// A bad argument: null pointer, zero size where one is needed, an
    /// offset or size that overflows.
    InvalidValue = 5002,
    /// The file handle is not (or no longer) registered.
    HandleNotRegistered = 5003,
    /// The fd does not name a regular file.
    InvalidFileType = 5004,
    /// The buffer range is not inside a registered GPU buffer.
    MemoryNotRegistered = 5005,
    /// The buffer is already registered (or still registered at free).
    MemoryAlreadyRegistered = 5006,
    /// The pointer is not GPU memory: not p2pmem of a p2plab GPU nor a
    /// mapping of /dev/p2plab-gpuN.
    PointerInvalid = 5007,
    /// No p2plab GPU (bound to p2plab_gpu, with p2pmem when needed).
    DeviceNotFound = 5008,
    /// The I/O cannot be done on either path (e.g. a write on a
    /// read-only handle); errno says more.
    IoNotSupported = 5009,
    /// The GPU engine failed a job (copy or checksum); errno EIO and the
    /// device status are in the detail.
    GpuEngineError = 5010,
    /// A system call failed; errno says which error.
    SystemError = 5011,
    /// A bug in the library (a panic caught at the C boundary).
    InternalError = 5012,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 13] = [
        ErrorCode::Success,
        ErrorCode::DriverNotInitialized,
        ErrorCode::InvalidValue,
        ErrorCode::HandleNotRegistered,
        ErrorCode::InvalidFileType,
        ErrorCode::MemoryNotRegistered,
        ErrorCode::MemoryAlreadyRegistered,
        ErrorCode::PointerInvalid,
        ErrorCode::DeviceNotFound,
        ErrorCode::IoNotSupported,
        ErrorCode::GpuEngineError,
        ErrorCode::SystemError,
        ErrorCode::InternalError,
    ];

    /// The C name without the `P2PLAB_GDS_` prefix.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Success => "SUCCESS",
            ErrorCode::DriverNotInitialized => "DRIVER_NOT_INITIALIZED",
            ErrorCode::InvalidValue => "INVALID_VALUE",
            ErrorCode::HandleNotRegistered => "HANDLE_NOT_REGISTERED",
            ErrorCode::InvalidFileType => "INVALID_FILE_TYPE",
            ErrorCode::MemoryNotRegistered => "MEMORY_NOT_REGISTERED",
            ErrorCode::MemoryAlreadyRegistered => "MEMORY_ALREADY_REGISTERED",
            ErrorCode::PointerInvalid => "POINTER_INVALID",
            ErrorCode::DeviceNotFound => "DEVICE_NOT_FOUND",
            ErrorCode::IoNotSupported => "IO_NOT_SUPPORTED",
            ErrorCode::GpuEngineError => "GPU_ENGINE_ERROR",
            ErrorCode::SystemError => "SYSTEM_ERROR",
            ErrorCode::InternalError => "INTERNAL_ERROR",
        }
    }

    pub fn from_i32(value: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| *c as i32 == value)
    }

    /// One line for `p2plab_gds_error_string` (a static C string).
    pub fn describe_c(self) -> &'static std::ffi::CStr {
        match self {
            ErrorCode::Success => c"success",
            ErrorCode::DriverNotInitialized => c"the driver is not open (call driver_open first)",
            ErrorCode::InvalidValue => c"invalid argument",
            ErrorCode::HandleNotRegistered => c"file handle not registered",
            ErrorCode::InvalidFileType => c"not a regular file",
            ErrorCode::MemoryNotRegistered => c"buffer range not inside a registered GPU buffer",
            ErrorCode::MemoryAlreadyRegistered => c"buffer already registered",
            ErrorCode::PointerInvalid => c"not GPU memory of a p2plab GPU",
            ErrorCode::DeviceNotFound => c"no p2plab GPU found",
            ErrorCode::IoNotSupported => c"I/O not possible on this handle",
            ErrorCode::GpuEngineError => c"the GPU engine failed a job",
            ErrorCode::SystemError => c"a system call failed (see errno)",
            ErrorCode::InternalError => c"internal error in p2plab-gds",
        }
    }

    pub fn describe(self) -> &'static str {
        self.describe_c().to_str().unwrap_or("")
    }
}

/// An error of the library: code, errno (0 when none) and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdsError {
    pub code: ErrorCode,
    pub errno: i32,
    pub detail: String,
}

impl GdsError {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            errno: 0,
            detail: detail.into(),
        }
    }

    /// A failed system call: SystemError with its errno.
    pub fn sys(err: &std::io::Error, what: impl fmt::Display) -> Self {
        Self {
            code: ErrorCode::SystemError,
            errno: err.raw_os_error().unwrap_or(libc::EIO),
            detail: format!("{what}: {err}"),
        }
    }

    pub fn with_errno(mut self, errno: i32) -> Self {
        self.errno = errno;
        self
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidValue, detail).with_errno(libc::EINVAL)
    }
}

impl fmt::Display for GdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.detail, self.code.name())?;
        if self.errno != 0 {
            write!(
                f,
                " [errno {}: {}]",
                self.errno,
                std::io::Error::from_raw_os_error(self.errno)
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for GdsError {}

pub type Result<T, E = GdsError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_never_look_like_errno() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i32(code as i32), Some(code));
            assert!(code == ErrorCode::Success || code as i32 > 4095);
        }
        assert_eq!(ErrorCode::from_i32(4), None);
    }

    #[test]
    fn display_names_code_and_errno() {
        let err = GdsError::sys(&std::io::Error::from_raw_os_error(libc::EBADF), "pread");
        let text = err.to_string();
        assert!(text.contains("SYSTEM_ERROR"), "{text}");
        assert!(text.contains("errno 9"), "{text}");
        assert_eq!(err.errno, libc::EBADF);
    }
}
