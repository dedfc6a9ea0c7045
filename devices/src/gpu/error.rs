//! Every NVML failure becomes a [`GpuError`] naming the NVML call and the GPU.
//! The failures a site must act on differently (no library, no driver, a lost
//! GPU, a GPU needing a reset) have their own variants.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES as INSUFFICIENT_RESOURCES;
use std::fmt;

/// Which GPU a call was about: a GPU index, or the node as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuLabel(pub Option<u32>);

impl fmt::Display for GpuLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(i) => write!(f, "GPU {i}"),
            None => f.write_str("the node"),
        }
    }
}

/// What kind of refusal an NVML call returned, for callers that branch on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    NotSupported,
    NoPermission,
    /// NVML_ERROR_IN_USE: processes or other clients hold the GPU.
    InUse,
    /// NVML_ERROR_INSUFFICIENT_RESOURCES: e.g. no room for another MIG instance.
    InsufficientResources,
    InvalidArgument,
    NotFound,
    Timeout,
    Other(String),
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::NotSupported => f.write_str("not supported on this GPU or driver"),
            ErrorKind::NoPermission => f.write_str("permission denied (needs root)"),
            ErrorKind::InUse => f.write_str("in use by processes or another client"),
            ErrorKind::InsufficientResources => f.write_str("insufficient resources (the GPU is full)"),
            ErrorKind::InvalidArgument => f.write_str("invalid argument"),
            ErrorKind::NotFound => f.write_str("not found"),
            ErrorKind::Timeout => f.write_str("timed out"),
            ErrorKind::Other(s) => f.write_str(s),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("cannot load libnvidia-ml from {library}: {detail} (is the NVIDIA driver installed? \
             [nvml] library chooses another)")]
    LibraryMissing { library: String, detail: String },
    #[error("{call}: the NVIDIA driver is not loaded (is the nvidia kernel module loaded?)")]
    DriverNotLoaded { call: &'static str },
    #[error("{call} on {gpu}: the GPU is lost (fell off the bus); the node needs service")]
    GpuLost { call: &'static str, gpu: GpuLabel },
    #[error("{call} on {gpu}: the GPU needs a reset")]
    ResetRequired { call: &'static str, gpu: GpuLabel },
    #[error("{call}: the loaded libnvidia-ml does not have this function (driver too old?)")]
    MissingSymbol { call: &'static str },
    #[error("{call} on {gpu}: {kind}")]
    Nvml { call: &'static str, gpu: GpuLabel, kind: ErrorKind },
    #[error("{gpu}: {detail}")]
    Refused { gpu: GpuLabel, detail: String },
}

impl GpuError {
    /// The refusal kind of an ordinary NVML error; `None` for the special variants.
    pub fn kind(&self) -> Option<&ErrorKind> {
        match self {
            GpuError::Nvml { kind, .. } => Some(kind),
            _ => None,
        }
    }

    pub fn is_not_supported(&self) -> bool {
        self.kind() == Some(&ErrorKind::NotSupported)
    }

    /// Errors that make every further reading of this GPU (or the node)
    /// pointless: stop and report rather than collect more.
    pub fn is_fatal(&self) -> bool {
        !matches!(self, GpuError::Nvml { .. } | GpuError::MissingSymbol { .. } | GpuError::Refused { .. })
    }

    /// Converts nvml-wrapper's error for `call` on `gpu`.
    pub fn from_wrapper(call: &'static str, gpu: Option<u32>, e: NvmlError) -> GpuError {
        let gpu = GpuLabel(gpu);
        let kind = match e {
            NvmlError::DriverNotLoaded => return GpuError::DriverNotLoaded { call },
            NvmlError::GpuLost => return GpuError::GpuLost { call, gpu },
            NvmlError::ResetRequired => return GpuError::ResetRequired { call, gpu },
            NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound => return GpuError::MissingSymbol { call },
            NvmlError::LibloadingError(e) => {
                return GpuError::LibraryMissing { library: String::from("libnvidia-ml"), detail: e.to_string() }
            }
            NvmlError::NotSupported => ErrorKind::NotSupported,
            NvmlError::NoPermission => ErrorKind::NoPermission,
            NvmlError::InUse => ErrorKind::InUse,
            NvmlError::InvalidArg => ErrorKind::InvalidArgument,
            NvmlError::NotFound => ErrorKind::NotFound,
            NvmlError::Timeout => ErrorKind::Timeout,
            NvmlError::UnexpectedVariant(c) if c == INSUFFICIENT_RESOURCES => ErrorKind::InsufficientResources,
            other => ErrorKind::Other(other.to_string()),
        };
        GpuError::Nvml { call, gpu, kind }
    }

    /// Converts a raw NVML return code (from a call through nvml-wrapper-sys).
    pub fn from_code(call: &'static str, gpu: Option<u32>, code: u32) -> GpuError {
        GpuError::from_wrapper(call, gpu, NvmlError::from(code))
    }
}

/// `Ok` for NVML_SUCCESS, else the typed error.
pub fn check(call: &'static str, gpu: Option<u32>, code: u32) -> Result<(), GpuError> {
    if code == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::from_code(call, gpu, code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::*;

    #[test]
    fn codes_become_errors_that_name_call_and_gpu() {
        let cases: &[(u32, Option<u32>, &str)] = &[
            (nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, Some(1), "nvmlX on GPU 1: the GPU is lost"),
            (nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED, Some(0), "nvmlX on GPU 0: the GPU needs a reset"),
            (nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, None, "nvmlX: the NVIDIA driver is not loaded"),
            (nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES, Some(2), "nvmlX on GPU 2: insufficient resources"),
            (nvmlReturn_enum_NVML_ERROR_IN_USE, Some(3), "nvmlX on GPU 3: in use"),
            (nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, None, "nvmlX on the node: not supported"),
            (nvmlReturn_enum_NVML_ERROR_NO_PERMISSION, Some(0), "permission denied"),
        ];
        for (code, gpu, want) in cases {
            let text = GpuError::from_code("nvmlX", *gpu, *code).to_string();
            assert!(text.starts_with(want) || text.contains(want), "code {code}: {text:?} lacks {want:?}");
        }
    }

    #[test]
    fn fatal_errors_are_the_special_ones() {
        assert!(GpuError::from_code("c", Some(0), nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST).is_fatal());
        assert!(!GpuError::from_code("c", Some(0), nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED).is_fatal());
        assert!(GpuError::from_code("c", Some(0), nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED).is_not_supported());
        assert!(check("c", None, nvmlReturn_enum_NVML_SUCCESS).is_ok());
    }
}
