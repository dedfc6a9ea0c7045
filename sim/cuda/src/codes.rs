//! CUDA driver result codes the simulation returns (values from cuda.h), with
//! the names and texts cuGetErrorName / cuGetErrorString give for them.

pub const SUCCESS: u32 = 0;
pub const INVALID_VALUE: u32 = 1;
pub const OUT_OF_MEMORY: u32 = 2;
/// What the real driver answers for a pid that is not a CUDA process (seen on
/// an H200, docs/validation.md).
pub const NOT_INITIALIZED: u32 = 3;
pub const NO_DEVICE: u32 = 100;
pub const INVALID_DEVICE: u32 = 101;
pub const ILLEGAL_STATE: u32 = 401;
pub const NOT_PERMITTED: u32 = 800;
pub const NOT_SUPPORTED: u32 = 801;
pub const TIMEOUT: u32 = 909;
pub const UNKNOWN: u32 = 999;

/// `(code, name, text)`; the strings are NUL-terminated for the C API.
const TABLE: &[(u32, &str, &str)] = &[
    (SUCCESS, "CUDA_SUCCESS\0", "no error\0"),
    (INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (NO_DEVICE, "CUDA_ERROR_NO_DEVICE\0", "no CUDA-capable device is detected\0"),
    (INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
    (ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE\0", "the operation cannot be performed in the present state\0"),
    (NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED\0", "operation not permitted\0"),
    (NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
    (TIMEOUT, "CUDA_ERROR_TIMEOUT\0", "the operation timed out\0"),
    (UNKNOWN, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

/// The (name, text) of a known code, NUL-terminated; `None` for others, as
/// the driver answers CUDA_ERROR_INVALID_VALUE for codes it does not know.
pub fn describe(code: u32) -> Option<(&'static str, &'static str)> {
    TABLE.iter().find(|(c, _, _)| *c == code).map(|(_, n, t)| (*n, *t))
}

/// The name without its NUL, for messages.
pub fn name(code: u32) -> String {
    describe(code).map_or_else(|| format!("CUDA error {code}"), |(n, _)| n.trim_end_matches('\0').to_string())
}

/// `CU_PROCESS_STATE_*`.
pub mod state {
    pub const RUNNING: i32 = 0;
    pub const LOCKED: i32 = 1;
    pub const CHECKPOINTED: i32 = 2;
    pub const FAILED: i32 = 3;
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_string_is_nul_terminated() {
        for (code, name, text) in super::TABLE {
            assert!(name.ends_with('\0') && text.ends_with('\0'), "{code}");
        }
        assert_eq!(super::name(909), "CUDA_ERROR_TIMEOUT");
        assert_eq!(super::name(12345), "CUDA error 12345");
    }
}
