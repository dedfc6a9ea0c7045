//! The plugin's one option. Like pyxis, a table of options each with one
//! validating function; here the table has a single row.

use gpu_mode_base::gpu_mode::{GpuMode, ModeError};
use crate::spank::{OptionSpec, Spank};
use std::error::Error;
use std::ffi::CStr;

/// `--gpu-mode=<value>`. Slurm also reads it from the environment as
/// `SLURM_SPANK__SLURM_SPANK_OPTION_gpu_mode_gpu_mode`. Taken from the
/// registered name, so the two cannot differ.
pub const GPU_MODE: &str = match OPTION_NAME.to_str() {
    Ok(name) => name,
    Err(_) => panic!("the option name is not UTF-8"),
};
const OPTION_NAME: &CStr = c"gpu-mode";

static OPTION: OptionSpec = OptionSpec {
    name: OPTION_NAME,
    arginfo: c"mode",
    usage: c"GPU mode for the job's GPUs: mps[:threads=<1-100>,mem=<N>M|G] | mig:<profile>[x<n>][,...] | mig:@<layout> | checkpoint[:nccl=portable|native][,pool=on|off]",
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
    use super::*;

    /// `srun --help` shows the usage line: every form and bound it names
    /// must be what the validator accepts, and its bounds' neighbours not.
    #[test]
    fn the_usage_line_promises_what_the_validator_accepts() {
        let usage = OPTION.usage.to_str().unwrap();
        let cases: &[(&str, &str, Option<&str>)] = &[
            // (form in the usage line, value, canonical form or None: refused)
            ("mps", "mps", Some("mps")),
            ("threads=<1-100>", "mps:threads=1", Some("mps:threads=1")),
            ("threads=<1-100>", "mps:threads=100", Some("mps:threads=100")),
            ("threads=<1-100>", "mps:threads=0", None),
            ("threads=<1-100>", "mps:threads=101", None),
            ("mem=<N>M|G", "mps:threads=30,mem=512M", Some("mps:threads=30,mem=512M")),
            ("mem=<N>M|G", "mps:mem=4G", Some("mps:mem=4G")),
            ("mem=<N>M|G", "mps:mem=4K", None),
            ("mig:<profile>[x<n>][,...]", "mig:1g.10gb", Some("mig:1g.10gb")),
            ("mig:<profile>[x<n>][,...]", "mig:1g.10gbx2,3g.40gb", Some("mig:1g.10gbx2,3g.40gb")),
            ("mig:@<layout>", "mig:@half", Some("mig:@half")),
            ("mig:@<layout>", "mig:@", None),
            ("checkpoint", "checkpoint", Some("checkpoint")),
            ("checkpoint", "checkpoint:now", None),
            ("checkpoint[:nccl=portable|native]", "checkpoint:nccl=portable", Some("checkpoint:nccl=portable")),
            ("checkpoint[:nccl=portable|native]", "checkpoint:nccl=native", Some("checkpoint:nccl=native")),
            ("checkpoint[:nccl=portable|native]", "checkpoint:nccl=fast", None),
            ("checkpoint[:nccl=portable|native]", "checkpoint:nccl=", None),
            ("checkpoint[:nccl=portable|native]", "checkpoint:nccl=portable,nccl=native", None),
            ("[,pool=on|off]", "checkpoint:pool=on", Some("checkpoint:pool=on")),
            ("[,pool=on|off]", "checkpoint:pool=off", Some("checkpoint:pool=off")),
            ("[,pool=on|off]", "checkpoint:pool=on,nccl=portable", Some("checkpoint:nccl=portable,pool=on")),
            ("[,pool=on|off]", "checkpoint:pool=maybe", None),
            ("[,pool=on|off]", "checkpoint:pool=on,pool=off", None),
        ];
        for (form, value, want) in cases {
            assert!(usage.contains(form), "the usage line lacks {form:?}: {usage}");
            let got = validate(value).map(|m| m.to_string()).ok();
            assert_eq!(got.as_deref(), *want, "{value} (usage form {form})");
        }
    }
}
