//! Our small safe layer over the few SPANK calls the plugin makes, on
//! bindings generated from the installed `<slurm/spank.h>` (build.rs). It
//! replaces the slurm-spank crate, whose releases each build against only
//! some Slurm versions (0.2.x not 23.11+, 0.3/0.4 not 22.05).
//!
//! Nothing here may unwind into C: [`callback`] runs every exported
//! callback under `catch_unwind` and turns errors and panics into a logged
//! line and `-1`, and the option callback does no more than store a value.

use std::error::Error;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::os::raw::{c_char, c_int};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// The generated bindings (only the items build.rs allowlists).
pub mod sys {
    // Generated: C names and items Slurm defines but we do not use.
    #![allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/spank_sys.rs"));
}

/// The Slurm version the plugin was built against (`SLURM_VERSION_NUMBER`
/// of the installed headers); exported as `plugin_version`.
pub const SLURM_VERSION_NUMBER: u32 = sys::SLURM_VERSION_NUMBER;

// The oldest Slurm whose SPANK API this plugin is written against.
const _: () = assert!(SLURM_VERSION_NUMBER >= 0x160500, "the Slurm headers found are older than 22.05: not supported");

/// `major.minor.micro` of [`SLURM_VERSION_NUMBER`].
pub fn built_for() -> String {
    let v = SLURM_VERSION_NUMBER;
    format!("{}.{:02}.{}", (v >> 16) & 0xff, (v >> 8) & 0xff, v & 0xff)
}

/// Where in Slurm the plugin is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// srun
    Local,
    /// slurmstepd
    Remote,
    /// sbatch, salloc
    Allocator,
    Slurmd,
    /// `slurmstepd spank prolog|epilog`
    JobScript,
}

/// A failed SPANK call, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpankError(String);

impl fmt::Display for SpankError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for SpankError {}

fn api_error(call: &str, err: sys::spank_err_t) -> SpankError {
    // SAFETY: spank_strerror returns a static string for any value.
    let text = unsafe { sys::spank_strerror(err) };
    let text = if text.is_null() {
        format!("error {err}")
    } else {
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    SpankError(format!("{call} failed: {text}"))
}

fn c_string(what: &str, bytes: &[u8]) -> Result<CString, SpankError> {
    CString::new(bytes).map_err(|_| SpankError(format!("{what} {:?} contains a NUL byte", String::from_utf8_lossy(bytes))))
}

/// The handle Slurm passes to a callback, with its plugstack arguments.
pub struct Spank {
    raw: sys::spank_t,
    argv: Vec<String>,
}

impl Spank {
    /// # Safety
    /// `raw`, `ac` and `av` must be what Slurm passed to the callback.
    unsafe fn new(raw: sys::spank_t, ac: c_int, av: *mut *mut c_char) -> Result<Spank, SpankError> {
        let mut argv = Vec::new();
        if !av.is_null() {
            for i in 0..usize::try_from(ac).unwrap_or(0) {
                let p = *av.add(i);
                if p.is_null() {
                    break;
                }
                let arg = CStr::from_ptr(p);
                argv.push(
                    arg.to_str()
                        .map_err(|_| SpankError(format!("plugstack.conf argument {:?} is not UTF-8", arg.to_string_lossy())))?
                        .to_string(),
                );
            }
        }
        Ok(Spank { raw, argv })
    }

    /// The arguments after the plugin's path in plugstack.conf.
    pub fn plugin_argv(&self) -> Result<Vec<&str>, SpankError> {
        Ok(self.argv.iter().map(String::as_str).collect())
    }

    pub fn context(&self) -> Result<Context, SpankError> {
        // SAFETY: no arguments; valid in every callback.
        let ctx = unsafe { sys::spank_context() };
        Ok(match ctx {
            sys::S_CTX_LOCAL => Context::Local,
            sys::S_CTX_REMOTE => Context::Remote,
            sys::S_CTX_ALLOCATOR => Context::Allocator,
            sys::S_CTX_SLURMD => Context::Slurmd,
            sys::S_CTX_JOB_SCRIPT => Context::JobScript,
            other => return Err(SpankError(format!("spank_context returned unknown context {other}"))),
        })
    }

    /// Registers `opt` (from `slurm_spank_init` only, as Slurm requires).
    /// Its value arrives through the option callback and is read back with
    /// [`Spank::get_option_value`].
    pub fn register_option(&mut self, opt: &'static OptionSpec) -> Result<(), SpankError> {
        let mut c_opt = sys::spank_option {
            name: opt.name.as_ptr() as *mut c_char,
            arginfo: opt.arginfo.as_ptr() as *mut c_char,
            usage: opt.usage.as_ptr() as *mut c_char,
            has_arg: 1,
            val: 0,
            cb: Some(option_callback),
        };
        // SAFETY: the strings are 'static; Slurm copies the struct.
        match unsafe { sys::spank_option_register(self.raw, &mut c_opt) } {
            sys::ESPANK_SUCCESS => Ok(()),
            e => Err(api_error("spank_option_register", e)),
        }
    }

    /// The option's value as the user gave it, if given. An error if it is
    /// not UTF-8 (the lossy form is [`Spank::get_option_value_lossy`]).
    pub fn get_option_value(&self, _name: &str) -> Result<Option<String>, SpankError> {
        match option_value() {
            None => Ok(None),
            Some(v) => v
                .into_string()
                .map(Some)
                .map_err(|v| SpankError(format!("option value {:?} is not UTF-8", v.to_string_lossy()))),
        }
    }

    pub fn get_option_value_lossy(&self, _name: &str) -> Option<String> {
        option_value().map(|v| v.to_string_lossy().into_owned())
    }

    /// The job control environment (local/allocator): the Prolog and Epilog
    /// see `SPANK_<name>`.
    pub fn job_control_setenv(&self, name: &str, value: impl AsRef<OsStr>, overwrite: bool) -> Result<(), SpankError> {
        let n = c_string("variable name", name.as_bytes())?;
        let v = c_string("value", value.as_ref().as_bytes())?;
        // SAFETY: valid handle and NUL-terminated strings for the call.
        match unsafe { sys::spank_job_control_setenv(self.raw, n.as_ptr(), v.as_ptr(), overwrite as c_int) } {
            sys::ESPANK_SUCCESS => Ok(()),
            e => Err(api_error(&format!("spank_job_control_setenv({name})"), e)),
        }
    }

    /// A variable of the job's environment (remote context).
    pub fn getenv(&self, name: &str) -> Result<Option<String>, SpankError> {
        let n = c_string("variable name", name.as_bytes())?;
        let mut len = 4096usize;
        loop {
            let mut buf = vec![0u8; len];
            let c_len = c_int::try_from(len).map_err(|_| SpankError(format!("{name} is too long")))?;
            // SAFETY: buf has c_len writable bytes; Slurm NUL-terminates.
            match unsafe { sys::spank_getenv(self.raw, n.as_ptr(), buf.as_mut_ptr() as *mut c_char, c_len) } {
                sys::ESPANK_SUCCESS => {
                    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
                    buf.truncate(end);
                    return String::from_utf8(buf)
                        .map(Some)
                        .map_err(|e| SpankError(format!("{name} is not UTF-8: {:?}", String::from_utf8_lossy(e.as_bytes()))));
                }
                sys::ESPANK_ENV_NOEXIST => return Ok(None),
                sys::ESPANK_NOSPACE if len < 1 << 20 => len *= 4,
                e => return Err(api_error(&format!("spank_getenv({name})"), e)),
            }
        }
    }

    /// Sets a variable in the job's environment (remote context).
    pub fn setenv(&self, name: &str, value: &str, overwrite: bool) -> Result<(), SpankError> {
        let n = c_string("variable name", name.as_bytes())?;
        let v = c_string("value", value.as_bytes())?;
        // SAFETY: valid handle and NUL-terminated strings for the call.
        match unsafe { sys::spank_setenv(self.raw, n.as_ptr(), v.as_ptr(), overwrite as c_int) } {
            sys::ESPANK_SUCCESS => Ok(()),
            e => Err(api_error(&format!("spank_setenv({name})"), e)),
        }
    }

    /// The job id (remote and job script contexts).
    pub fn job_id(&self) -> Result<u32, SpankError> {
        let mut id: u32 = 0;
        // SAFETY: S_JOB_ID takes one uint32_t* (spank.h).
        match unsafe { sys::spank_get_item(self.raw, sys::S_JOB_ID, &mut id as *mut u32) } {
            sys::ESPANK_SUCCESS => Ok(id),
            e => Err(api_error("spank_get_item(S_JOB_ID)", e)),
        }
    }
}

/// `SLURM_BATCH_SCRIPT` of slurm.h: the batch step's step id (slurm.h is
/// not in the bindings, only spank.h).
pub const BATCH_STEP_ID: u32 = 0xffff_fffb;

impl Spank {
    /// The step id (remote context); [`BATCH_STEP_ID`] for the batch step.
    pub fn step_id(&self) -> Result<u32, SpankError> {
        let mut id: u32 = 0;
        // SAFETY: S_JOB_STEPID takes one uint32_t* (spank.h).
        match unsafe { sys::spank_get_item(self.raw, sys::S_JOB_STEPID, &mut id as *mut u32) } {
            sys::ESPANK_SUCCESS => Ok(id),
            e => Err(api_error("spank_get_item(S_JOB_STEPID)", e)),
        }
    }
}

/// A plugin option, as C strings that live as long as the plugin.
pub struct OptionSpec {
    pub name: &'static CStr,
    pub arginfo: &'static CStr,
    pub usage: &'static CStr,
}

/// The one option's value: `None` until the option callback ran. Slurm
/// calls the plugin from one thread at a time; the lock only makes that
/// visible to Rust.
static OPTION_VALUE: Mutex<Option<OsString>> = Mutex::new(None);

fn option_value() -> Option<OsString> {
    OPTION_VALUE.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Slurm's option callback: keeps the value for the plugin's callbacks
/// (validation happens in init_post_opt, where an error can be reported).
extern "C" fn option_callback(_val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    let stored = catch_unwind(|| {
        let value = if optarg.is_null() {
            OsString::new()
        } else {
            // SAFETY: Slurm passes a NUL-terminated string or NULL.
            OsStr::from_bytes(unsafe { CStr::from_ptr(optarg) }.to_bytes()).to_os_string()
        };
        *OPTION_VALUE.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
    });
    if stored.is_ok() {
        0
    } else {
        -1
    }
}

/// Logs through Slurm's `error()`: srun/sbatch/salloc print it as
/// `error: ...`; slurmstepd writes it to the job's stderr and slurmd's log.
pub fn log_error(msg: &str) {
    // A NUL would end the message early: show it as \0.
    let text = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: "%s" with one NUL-terminated string argument.
    unsafe { sys::slurm_error(c"%s".as_ptr(), text.as_ptr()) };
}

/// Logs through Slurm's `verbose()`: in slurmd's log at its verbose level
/// (SlurmdDebug=verbose and above), never on the job's stderr.
pub fn log_verbose(msg: &str) {
    let text = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: "%s" with one NUL-terminated string argument.
    unsafe { sys::slurm_verbose(c"%s".as_ptr(), text.as_ptr()) };
}

/// Runs one exported callback: builds the handle, calls `f`, and turns an
/// error or a panic into a logged line and `-1`. Never unwinds.
///
/// # Safety
/// `raw`, `ac` and `av` must be what Slurm passed to the callback.
pub unsafe fn callback(
    name: &str,
    raw: sys::spank_t,
    ac: c_int,
    av: *mut *mut c_char,
    f: impl FnOnce(&mut Spank) -> Result<(), Box<dyn Error>>,
) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut spank = Spank::new(raw, ac, av)?;
        f(&mut spank)
    }));
    match outcome {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            log_error(&format!("gpu-mode: {e}"));
            -1
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic".into());
            let _ = catch_unwind(|| log_error(&format!("gpu-mode: internal error in {name}: {what}")));
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_comes_from_the_installed_headers() {
        let header = std::fs::read_to_string(
            std::env::var("SLURM_INCLUDE_DIR").map(|d| format!("{d}/slurm/slurm_version.h")).unwrap_or("/usr/include/slurm/slurm_version.h".into()),
        )
        .unwrap();
        let line = header.lines().find(|l| l.starts_with("#define SLURM_VERSION_NUMBER")).unwrap();
        let hex = line.split_whitespace().last().unwrap().trim_start_matches("0x");
        assert_eq!(SLURM_VERSION_NUMBER, u32::from_str_radix(hex, 16).unwrap(), "built for {}", built_for());
    }
}
