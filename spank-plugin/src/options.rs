//! The plugin's one option. Like pyxis, a table of options each with one
//! validating function; here the table has a single row.

use gpu_mode_core::mode::{GpuMode, ModeError};
use slurm_spank::{SpankHandle, SpankOption};
use std::error::Error;

/// `--gpu-mode=<value>`. Slurm also reads it from the environment as
/// `SLURM_SPANK__SLURM_SPANK_OPTION_gpu_mode_gpu_mode`.
pub const GPU_MODE: &str = "gpu-mode";

const USAGE: &str = "GPU mode for the job's GPUs: mps[:threads=<1-100>,mem=<N>M|G] | \
mig:<profile>[x<n>][,...] | mig:@<layout> | checkpoint";

/// Registers the options. Called from `slurm_spank_init` in every context
/// that sees them (local, allocator, remote), as Slurm requires.
pub fn register(spank: &mut SpankHandle) -> Result<(), Box<dyn Error>> {
    spank.register_option(SpankOption::new(GPU_MODE).takes_value("mode").usage(USAGE))?;
    Ok(())
}

/// The option's value as the user gave it, if given.
pub fn gpu_mode_value(spank: &SpankHandle) -> Result<Option<String>, Box<dyn Error>> {
    match spank.get_option_value(GPU_MODE) {
        Ok(v) => Ok(v.map(|c| c.into_owned())),
        // Not valid UTF-8: let the shared parser name the problem.
        Err(_) => Ok(Some(
            spank.get_option_value_lossy(GPU_MODE).map(|c| c.into_owned()).unwrap_or_default(),
        )),
    }
}

/// The option's validator: the library's parser, nothing else.
pub fn validate(value: &str) -> Result<GpuMode, ModeError> {
    GpuMode::parse(value)
}
