//! `--gpu-mode=mps`: one MPS control daemon per job user and GPU set.
//!
//! * [`setup`] (prolog): lock the GPUs, refuse GPUs another user's daemon
//!   holds, reuse the user's daemon for the same GPUs or start one (compute
//!   mode first, then the daemon as the user, then the `mps:` parameters),
//!   and return what the job's tasks need. Any failure undoes every step.
//! * [`teardown`] (epilog): drop the job from its daemon; the last job stops
//!   it (`quit`, SIGTERM, SIGKILL), restores the compute modes and removes
//!   the directories. A survivor is a node fault with the drain reason
//!   `MPS zombie pid <p> (job <j>, GPU <uuid>)`.
//! * [`orphans`] (node checker): MPS processes no live job owns.

pub mod control;
pub mod daemon;
mod driver;
pub mod orphans;
/// The daemon records: gpu-mode-base's (plain data the plugin reads too).
pub use gpu_mode_base::mps_daemons::registry;
pub mod setup;
pub mod teardown;

pub use driver::MpsDriver;
pub use orphans::{find_orphans, OrphanMps};
pub use registry::{daemon_key, DaemonRecord};
pub use setup::{setup, MpsJob};
pub use teardown::{teardown, TeardownOutcome};

use std::path::PathBuf;

pub use crate::job_env::KEEP_IF_SET;

#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error(transparent)]
    Spawn(#[from] crate::privdrop::SpawnError),
    #[error("MPS daemon did not start: {0}")]
    Start(String),
    #[error(transparent)]
    Command(crate::command::CommandError),
    #[error("MPS control ({pipe_dir}) refused \"{commands}\": {detail}")]
    Control { pipe_dir: PathBuf, commands: String, detail: String },
}

pub use gpu_mode_base::mps_daemons::{adopt_into_job, task_privileged, AdoptError, Adoption};
