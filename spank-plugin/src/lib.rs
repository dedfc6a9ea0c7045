//! The `gpu_mode` SPANK plugin. This file only exports what Slurm loads and
//! routes each callback by context (as pyxis does): option handling lives in
//! `options`, plugstack arguments in `args`, submit-side work (srun, sbatch,
//! salloc) in `local`, slurmstepd-side work in `remote`, and the SPANK calls
//! in `spank` (bindings generated from the installed `<slurm/spank.h>`).
//! Every callback runs inside `spank::callback`'s `catch_unwind`, so a panic
//! becomes an error return, never an unwind into srun or slurmstepd.
//!
//! Exported: `plugin_name`, `plugin_type`, `plugin_version` (the installed
//! Slurm's `SLURM_VERSION_NUMBER`: Slurm loads a plugin only when its
//! major.minor match) and the four callbacks used. Never `init`/`fini`:
//! Slurm would call them as a generic plugin's.

pub mod args;
pub mod local;
pub mod options;
pub mod remote;
pub mod spank;

use spank::{Context, Spank};
use std::error::Error;
use std::os::raw::{c_char, c_int, c_uint};
use std::sync::Mutex;

#[no_mangle]
pub static plugin_name: [u8; 9] = *b"gpu_mode\0";
#[no_mangle]
pub static plugin_type: [u8; 6] = *b"spank\0";
#[no_mangle]
pub static plugin_version: c_uint = spank::SLURM_VERSION_NUMBER;

/// What one process of srun/sbatch/salloc/slurmstepd keeps between callbacks.
#[derive(Default)]
struct PluginState {
    args: args::PluginArgs,
    /// Found as root in task_init_privileged, applied in task_init: both
    /// run in the same forked task process.
    pending: remote::Pending,
}

/// Slurm calls a plugin from one thread at a time; the lock only makes that
/// visible to Rust (a poisoned lock still holds valid state: take it).
static STATE: Mutex<Option<PluginState>> = Mutex::new(None);

fn with_state<T>(f: impl FnOnce(&mut PluginState) -> T) -> T {
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(PluginState::default))
}

type Raw = spank::sys::spank_t;

/// Exports one SPANK callback: Slurm calls `$c` with its handle and the
/// plugstack arguments (all `spank::callback` relies on), which runs `$f`.
macro_rules! export_callback {
    ($c:ident => $f:path) => {
        /// # Safety
        /// Called by Slurm only, with its handle and plugstack arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $c(sp: Raw, ac: c_int, av: *mut *mut c_char) -> c_int {
            spank::callback(stringify!($c), sp, ac, av, $f)
        }
    };
}

export_callback!(slurm_spank_init => init);
export_callback!(slurm_spank_init_post_opt => init_post_opt);
export_callback!(slurm_spank_task_init_privileged => task_init_privileged);
export_callback!(slurm_spank_task_init => task_init);

fn init(spank: &mut Spank) -> Result<(), Box<dyn Error>> {
    let parsed = args::PluginArgs::parse(&spank.plugin_argv()?)?;
    with_state(|s| s.args = parsed);
    match spank.context()? {
        Context::Local | Context::Allocator | Context::Remote => options::register(spank),
        Context::Slurmd | Context::JobScript => Ok(()),
    }
}

fn init_post_opt(spank: &mut Spank) -> Result<(), Box<dyn Error>> {
    match spank.context()? {
        Context::Local | Context::Allocator => {
            let args = with_state(|s| s.args.clone());
            local::init_post_opt(spank, &args)
        }
        _ => Ok(()),
    }
}

/// Runs as root in each task process after fork: reads the root-only
/// job state. Never fails the task itself: errors wait for task_init.
fn task_init_privileged(spank: &mut Spank) -> Result<(), Box<dyn Error>> {
    if let Context::Remote = spank.context()? {
        let args = with_state(|s| s.args.clone());
        let pending = remote::task_init_privileged(spank, &args).unwrap_or_else(|e| remote::Pending::Fail(e.to_string()));
        with_state(|s| s.pending = pending);
    }
    Ok(())
}

/// Runs in each task process before exec. A failure here ends only that
/// task (exit 1), which is how a refused job must fail: the same failure
/// in user_init is a batch launch failure, and Slurm drains the node for it.
fn task_init(spank: &mut Spank) -> Result<(), Box<dyn Error>> {
    match spank.context()? {
        Context::Remote => {
            let (args, pending) = with_state(|s| (s.args.clone(), std::mem::take(&mut s.pending)));
            remote::task_init(spank, &args, &pending)
        }
        _ => Ok(()),
    }
}
