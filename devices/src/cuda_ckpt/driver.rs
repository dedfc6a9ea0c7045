//! The CUDA driver's process checkpoint API (CUDA 12.8 / r570 and later),
//! loaded at run time from libcuda.so.1.
//!
//! Nothing here links against libcuda: CI machines have no driver, and a node
//! with an old driver must get a typed error, not a loader failure. The
//! orchestration talks to the [`CudaCkptDriver`] trait so it can be tested
//! against a double.

use crate::watchdog::DeadlineError;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::path::{Path, PathBuf};

/// The default library name; the driver installs it in the loader's path.
pub const DEFAULT_CUDA_LIBRARY: &str = "libcuda.so.1";

/// `CU_PROCESS_STATE_*`, read as a plain integer so an unknown value from a
/// newer driver is reported, never undefined behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    Unknown(i32),
}

impl ProcessState {
    pub fn from_raw(raw: i32) -> Self {
        match raw {
            0 => ProcessState::Running,
            1 => ProcessState::Locked,
            2 => ProcessState::Checkpointed,
            3 => ProcessState::Failed,
            other => ProcessState::Unknown(other),
        }
    }

    pub fn name(self) -> String {
        match self {
            ProcessState::Running => "running".into(),
            ProcessState::Locked => "locked".into(),
            ProcessState::Checkpointed => "checkpointed".into(),
            ProcessState::Failed => "failed".into(),
            ProcessState::Unknown(n) => format!("unknown({n})"),
        }
    }
}

/// Why a text is no GPU UUID a checkpoint can name. A MIG device's UUID is
/// well formed but its own kind: the driver cannot checkpoint MIG.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UuidError {
    #[error("{text:?} is a MIG UUID: MIG devices cannot be checkpointed")]
    Mig { text: String },
    #[error("{text:?} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    Malformed { text: String },
}

/// A GPU's 16-byte UUID, as CUDA's `CUuuid` and NVML's `GPU-…` text hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuUuid(pub [u8; 16]);

impl GpuUuid {
    /// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (the `GPU-` prefix is
    /// optional). MIG UUIDs are refused: the driver cannot checkpoint MIG.
    pub fn parse(text: &str) -> Result<Self, UuidError> {
        let hex = text.strip_prefix("GPU-").unwrap_or(text);
        if hex.starts_with("MIG-") {
            return Err(UuidError::Mig { text: text.to_string() });
        }
        let digits: String = hex.chars().filter(|c| *c != '-').collect();
        let bad = || UuidError::Malformed { text: text.to_string() };
        if digits.len() != 32 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(GpuUuid(bytes))
    }
}

impl std::fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = &self.0;
        let hex = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        write!(f, "GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
    }
}

impl serde::Serialize for GpuUuid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for GpuUuid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        GpuUuid::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// One old → new GPU of a restore's device map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPair {
    pub old: GpuUuid,
    pub new: GpuUuid,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    #[error("cannot load the CUDA driver library {library}: {detail}")]
    NoLibrary { library: String, detail: String },
    #[error(
        "the CUDA driver in {library} lacks {symbol}: the checkpoint API needs driver r570 / CUDA 12.8 or later"
    )]
    MissingSymbol { library: String, symbol: &'static str },
    #[error("restoring onto other GPUs needs driver r580 / CUDA 13.0 or later; this driver reports CUDA {version}")]
    DeviceMapUnsupported { version: String },
    #[error("{call}(pid {pid}) failed: {name} ({code}): {text}")]
    Call { call: &'static str, pid: i32, code: u32, name: String, text: String },
    #[error("cuInit failed: {name} ({code}): {text}")]
    Init { code: u32, name: String, text: String },
    /// The call was not answered in time (or died): see [`DriverError::unanswered`].
    #[error("{0}")]
    NoAnswer(DeadlineError),
}

impl DriverError {
    /// The CUDA error code, when the driver answered.
    pub fn code(&self) -> Option<u32> {
        match self {
            DriverError::Call { code, .. } | DriverError::Init { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The call may still be running, or may have done its work: the
    /// process's state is unknown until the driver is asked again.
    pub fn unanswered(&self) -> bool {
        matches!(self, DriverError::NoAnswer(DeadlineError::Timeout { .. } | DeadlineError::Panicked { .. }))
    }

    /// The caller stopped waiting because the process ended during the call
    /// ([`super::bounded::BoundedDriver`]).
    pub fn process_ended(&self) -> bool {
        matches!(self, DriverError::NoAnswer(DeadlineError::Abandoned { .. }))
    }
}

/// The driver's names of the six calls, as errors and records name them.
pub mod calls {
    pub const GET_STATE: &str = "cuCheckpointProcessGetState";
    pub const GET_RESTORE_THREAD_ID: &str = "cuCheckpointProcessGetRestoreThreadId";
    pub const LOCK: &str = "cuCheckpointProcessLock";
    pub const CHECKPOINT: &str = "cuCheckpointProcessCheckpoint";
    pub const RESTORE: &str = "cuCheckpointProcessRestore";
    pub const UNLOCK: &str = "cuCheckpointProcessUnlock";
}

/// `CUDA_ERROR_TIMEOUT`: what Lock answers when its timeout passes.
pub const CUDA_ERROR_TIMEOUT: u32 = 909;

/// The six calls, as the orchestration sees them. `Send + Sync` because a
/// job's processes are handled from one thread each, and each call runs on a
/// thread of its own under a deadline ([`super::bounded::BoundedDriver`]).
pub trait CudaCkptDriver: Send + Sync {
    fn state(&self, pid: i32) -> Result<ProcessState, DriverError>;
    fn restore_thread_id(&self, pid: i32) -> Result<i32, DriverError>;
    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), DriverError>;
    fn checkpoint(&self, pid: i32) -> Result<(), DriverError>;
    /// `pairs` empty: restore onto the GPUs it was checkpointed from.
    fn restore(&self, pid: i32, pairs: &[GpuPair]) -> Result<(), DriverError>;
    fn unlock(&self, pid: i32) -> Result<(), DriverError>;
}

// The argument structs of cuda.h (CUDA 13.0); each is 64 bytes and its
// reserved fields must be zero. Defined here, not taken from cudarc, so the
// library crate needs no CUDA version feature.
#[repr(C)]
struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

#[repr(C)]
struct ReservedArgs {
    reserved: [u64; 8],
}

#[repr(C)]
struct RawGpuPair {
    old_uuid: [u8; 16],
    new_uuid: [u8; 16],
}

#[repr(C)]
struct RestoreArgs {
    gpu_pairs: *mut RawGpuPair,
    gpu_pairs_count: c_uint,
    reserved: [c_char; 44],
    reserved1: u64,
}

const _: () = assert!(std::mem::size_of::<LockArgs>() == 64);
const _: () = assert!(std::mem::size_of::<ReservedArgs>() == 64);
const _: () = assert!(std::mem::size_of::<RestoreArgs>() == 64);
const _: () = assert!(std::mem::size_of::<RawGpuPair>() == 32);

type CuResult = c_uint;
type FnPidInt = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type FnLock = unsafe extern "C" fn(c_int, *mut LockArgs) -> CuResult;
type FnReserved = unsafe extern "C" fn(c_int, *mut ReservedArgs) -> CuResult;
type FnRestore = unsafe extern "C" fn(c_int, *mut RestoreArgs) -> CuResult;
type FnErr = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type FnInit = unsafe extern "C" fn(c_uint) -> CuResult;
type FnVersion = unsafe extern "C" fn(*mut c_int) -> CuResult;

/// The real driver. Loading resolves every symbol up front, so a missing one
/// is found before any process is touched.
pub struct CudaDriver {
    // Kept so the function pointers below stay valid.
    _lib: libloading::Library,
    library: String,
    version: i32,
    get_state: FnPidInt,
    get_restore_tid: FnPidInt,
    lock: FnLock,
    checkpoint: FnReserved,
    restore: FnRestore,
    unlock: FnReserved,
    error_name: FnErr,
    error_string: FnErr,
}

impl CudaDriver {
    /// Loads `library` (default libcuda.so.1) and calls cuInit(0): the
    /// driver requires it (or persistence mode) before a restore.
    pub fn load(library: Option<&Path>) -> Result<Self, DriverError> {
        let path = library.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from(DEFAULT_CUDA_LIBRARY));
        let name = path.display().to_string();
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which
        // is what every CUDA program does.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| DriverError::NoLibrary { library: name.clone(), detail: e.to_string() })?;
        let init: FnInit = symbol(&lib, &name, "cuInit")?;
        let version_fn: FnVersion = symbol(&lib, &name, "cuDriverGetVersion")?;
        let driver = CudaDriver {
            get_state: symbol(&lib, &name, calls::GET_STATE)?,
            get_restore_tid: symbol(&lib, &name, calls::GET_RESTORE_THREAD_ID)?,
            lock: symbol(&lib, &name, calls::LOCK)?,
            checkpoint: symbol(&lib, &name, calls::CHECKPOINT)?,
            restore: symbol(&lib, &name, calls::RESTORE)?,
            unlock: symbol(&lib, &name, calls::UNLOCK)?,
            error_name: symbol(&lib, &name, "cuGetErrorName")?,
            error_string: symbol(&lib, &name, "cuGetErrorString")?,
            version: 0,
            library: name,
            _lib: lib,
        };
        let mut version = 0;
        // SAFETY: plain out-parameter calls with the signatures of cuda.h.
        let code = unsafe { version_fn(&mut version) };
        let code = if code == 0 { unsafe { init(0) } } else { code };
        if code != 0 {
            let (name, text) = driver.describe(code);
            return Err(DriverError::Init { code, name, text });
        }
        Ok(CudaDriver { version, ..driver })
    }

    /// The driver's CUDA version as cuDriverGetVersion gives it (13000 = 13.0).
    pub fn version(&self) -> i32 {
        self.version
    }

    pub fn library(&self) -> &str {
        &self.library
    }

    fn describe(&self, code: CuResult) -> (String, String) {
        let read = |f: FnErr| {
            let mut ptr: *const c_char = std::ptr::null();
            // SAFETY: the driver returns a pointer to a static string or an error.
            if unsafe { f(code, &mut ptr) } == 0 && !ptr.is_null() {
                unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
            } else {
                "unrecognised error code".to_string()
            }
        };
        (read(self.error_name), read(self.error_string))
    }

    fn check(&self, call: &'static str, pid: i32, code: CuResult) -> Result<(), DriverError> {
        if code == 0 {
            return Ok(());
        }
        let (name, text) = self.describe(code);
        Err(DriverError::Call { call, pid, code, name, text })
    }
}

fn symbol<T: Copy>(lib: &libloading::Library, library: &str, name: &'static str) -> Result<T, DriverError> {
    let cname = format!("{name}\0");
    // SAFETY: each T above is the exact signature from cuda.h for that name.
    unsafe { lib.get::<T>(cname.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| DriverError::MissingSymbol { library: library.to_string(), symbol: name })
}

impl CudaCkptDriver for CudaDriver {
    fn state(&self, pid: i32) -> Result<ProcessState, DriverError> {
        let mut raw: c_int = -1;
        // SAFETY: CUprocessState is a C enum, int-sized; read as an integer.
        let code = unsafe { (self.get_state)(pid, &mut raw) };
        self.check(calls::GET_STATE, pid, code)?;
        Ok(ProcessState::from_raw(raw))
    }

    fn restore_thread_id(&self, pid: i32) -> Result<i32, DriverError> {
        let mut tid: c_int = 0;
        let code = unsafe { (self.get_restore_tid)(pid, &mut tid) };
        self.check(calls::GET_RESTORE_THREAD_ID, pid, code)?;
        Ok(tid)
    }

    fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), DriverError> {
        let mut args = LockArgs { timeout_ms, reserved0: 0, reserved1: [0; 7] };
        let code = unsafe { (self.lock)(pid, &mut args) };
        self.check(calls::LOCK, pid, code)
    }

    fn checkpoint(&self, pid: i32) -> Result<(), DriverError> {
        let mut args = ReservedArgs { reserved: [0; 8] };
        let code = unsafe { (self.checkpoint)(pid, &mut args) };
        self.check(calls::CHECKPOINT, pid, code)
    }

    fn restore(&self, pid: i32, pairs: &[GpuPair]) -> Result<(), DriverError> {
        if !pairs.is_empty() && self.version < 13000 {
            return Err(DriverError::DeviceMapUnsupported { version: format_version(self.version) });
        }
        let mut raw: Vec<RawGpuPair> =
            pairs.iter().map(|p| RawGpuPair { old_uuid: p.old.0, new_uuid: p.new.0 }).collect();
        let mut args = RestoreArgs {
            gpu_pairs: if raw.is_empty() { std::ptr::null_mut() } else { raw.as_mut_ptr() },
            gpu_pairs_count: raw.len() as c_uint,
            reserved: [0; 44],
            reserved1: 0,
        };
        // SAFETY: `raw` outlives the call; the driver only reads the pairs.
        let code = unsafe { (self.restore)(pid, &mut args) };
        self.check(calls::RESTORE, pid, code)
    }

    fn unlock(&self, pid: i32) -> Result<(), DriverError> {
        let mut args = ReservedArgs { reserved: [0; 8] };
        let code = unsafe { (self.unlock)(pid, &mut args) };
        self.check(calls::UNLOCK, pid, code)
    }
}

fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_read_as_integers() {
        let cases = [
            (0, ProcessState::Running),
            (1, ProcessState::Locked),
            (2, ProcessState::Checkpointed),
            (3, ProcessState::Failed),
            (7, ProcessState::Unknown(7)),
            (-1, ProcessState::Unknown(-1)),
        ];
        for (raw, want) in cases {
            assert_eq!(ProcessState::from_raw(raw), want, "raw {raw}");
        }
        assert_eq!(ProcessState::Unknown(7).name(), "unknown(7)");
    }

    #[test]
    fn uuids_round_trip_and_bad_ones_are_named() {
        let text = "GPU-5a3c1f2e-0b9d-4e11-8a2b-c0ffee123456";
        let uuid = GpuUuid::parse(text).unwrap();
        assert_eq!(uuid.0[0], 0x5a);
        assert_eq!(uuid.0[15], 0x56);
        assert_eq!(uuid.to_string(), text);
        assert_eq!(GpuUuid::parse("5a3c1f2e-0b9d-4e11-8a2b-c0ffee123456").unwrap(), uuid);
        let bad = [
            ("GPU-123", "not a GPU UUID", false),
            ("GPU-zz3c1f2e-0b9d-4e11-8a2b-c0ffee123456", "not a GPU UUID", false),
            ("MIG-5a3c1f2e-0b9d-4e11-8a2b-c0ffee123456", "MIG devices cannot be checkpointed", true),
        ];
        for (text, needle, mig) in bad {
            let err = GpuUuid::parse(text).unwrap_err();
            assert!(err.to_string().contains(needle), "{text}: {err}");
            assert_eq!(matches!(err, UuidError::Mig { .. }), mig, "{text}: {err:?}");
        }
        let err = GpuUuid::parse("GPU-123").unwrap_err();
        assert_eq!(err.to_string(), r#""GPU-123" is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"#);
    }

    #[test]
    fn a_missing_library_is_a_typed_error() {
        let err = CudaDriver::load(Some(Path::new("/nonexistent/libcuda.so.1"))).err().unwrap();
        assert!(matches!(err, DriverError::NoLibrary { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/libcuda.so.1"), "{err}");
    }

    #[test]
    fn a_library_without_the_api_names_the_symbol_and_the_driver_needed() {
        // libc has no cuInit: the error must name the symbol, not crash.
        let err = CudaDriver::load(Some(Path::new("libc.so.6"))).err().unwrap();
        let text = err.to_string();
        assert!(matches!(err, DriverError::MissingSymbol { symbol: "cuInit", .. }), "{text}");
        assert!(text.contains("r570 / CUDA 12.8"), "{text}");
    }

    #[test]
    fn versions_print_as_major_minor() {
        assert_eq!(format_version(12080), "12.8");
        assert_eq!(format_version(13000), "13.0");
    }
}
