//! `gpu-mode-epilog`'s command line; the logic is gpu_mode_core::lifecycle.

pub mod cli;

/// Environment and exit codes, for `--help` and the man page.
pub const HOOK_NOTES: &str = "\
Environment (set by slurmd): SLURM_JOB_ID, SLURM_JOB_UID, SLURM_JOB_GID, SLURM_JOB_USER, SLURMD_NODENAME, \
SLURM_JOB_GPUS, SPANK_GPU_MODE (the job's --gpu-mode, from the SPANK plugin).

Exit status: 0 done (or nothing to do); \
2 usage error; any other non-zero status is a node fault, after the node was drained with a \"gpu-mode:\" reason.";
