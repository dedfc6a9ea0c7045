//! MIG, one domain (issue 26): everything this project knows and does about
//! MIG, for both users of it.
//!
//! * [`placement`]: a GPU's geometry, where instances of each profile can
//!   go (pure; the profile tables of the GPU models);
//! * [`layout`]: a request (`mig:<layout>`, `[mig.layouts]`) resolved
//!   against a GPU model's profiles;
//! * [`journal`]: what a job's prolog made, step by step, so that the
//!   epilog (or a later one, after a crash) destroys exactly that;
//! * [`job`]: the per-job mode (`--gpu-mode=mig:<layout>`, the prolog's
//!   setup and the epilog's teardown), reached as `modes::mig`;
//! * [`baseline`]: the node's MIG baseline between jobs (mig-parted
//!   configs, the plan, the apply at boot with the services around it, the
//!   `gpu-mode-mig` verbs), reached as `mig_baseline` too.
//!
//! The NVML calls (profiles, instances, MIG mode) are the GPU layer's
//! (`crate::gpu::mig`), under both.

pub mod baseline;
pub mod job;
pub mod journal;
pub mod layout;
pub mod placement;
