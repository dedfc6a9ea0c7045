//! The plugin's one option. Like pyxis, a table of options each with one
//! validating function; here the table has a single row.

use gpu_mode_core::mode::{GpuMode, ModeError};
use crate::spank::{OptionSpec, Spank};
use std::error::Error;

/// `--gpu-mode=<value>`. Slurm also reads it from the environment as
/// `SLURM_SPANK__SLURM_SPANK_OPTION_gpu_mode_gpu_mode`.
pub const GPU_MODE: &str = "gpu-mode";

static OPTION: OptionSpec = OptionSpec {
    name: c"gpu-mode",
    arginfo: c"mode",
    usage: c"GPU mode for the job's GPUs: mps[:threads=<1-100>,mem=<N>M|G] | mig:<profile>[x<n>][,...] | mig:@<layout> | checkpoint",
};

/// Registers the options. Called from `slurm_spank_init` in every context
/// that sees them (local, allocator, remote), as Slurm requires.
pub fn register(spank: &mut Spank) -> Result<(), Box<dyn Error>> {
    spank.register_option(&OPTION)?;
    Ok(())
}

/// The option's value as the user gave it, if given.
pub fn gpu_mode_value(spank: &Spank) -> Result<Option<String>, Box<dyn Error>> {
    match spank.get_option_value(GPU_MODE) {
        Ok(v) => Ok(v),
        // Not valid UTF-8: let the shared parser name the problem.
        Err(_) => Ok(Some(spank.get_option_value_lossy(GPU_MODE).unwrap_or_default())),
    }
}

/// The option's validator: the library's parser, nothing else.
pub fn validate(value: &str) -> Result<GpuMode, ModeError> {
    GpuMode::parse(value)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_registered_name_is_the_option_name() {
        assert_eq!(super::OPTION.name.to_str().unwrap(), super::GPU_MODE);
    }
}
