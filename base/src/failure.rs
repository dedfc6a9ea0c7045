//! Why a lifecycle verb or a mode could not do its job. A leaf: the modes
//! return it and the lifecycle verbs turn it into exit codes and drains, so
//! modes never import the lifecycle.
//!
//! * [`Failure::Job`]: the job asked for something this node cannot give it
//!   (a bad or unsupported value, a MIG profile the GPU lacks, a GPU another
//!   user's MPS daemon holds). The node is healthy and is not drained; the
//!   prolog records a refusal and the plugin fails the job's tasks.
//! * [`Failure::Node`]: the node is at fault; drained as
//!   `gpu-mode: <verb>: <detail>` after what was done is undone.
//! * [`Failure::Drain`]: a node fault whose whole drain reason is given.
//!
//! A node fault carries its [`Fault`] kind beside the message: the kind is
//! the `reason` label of `gpu_mode_drains_total`, so rewording a message
//! never changes a metric (the label was once read from the text).

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Job(String),
    /// A node fault; drained as `gpu-mode: <verb>: <detail>`.
    Node(Fault, String),
    /// A node fault whose whole drain reason (after `gpu-mode: `) is given,
    /// e.g. `MPS zombie pid 12 (job 7, GPU GPU-...)`.
    Drain(Fault, String),
}

impl Failure {
    /// A node fault of kind `fault`.
    pub fn node(fault: Fault, detail: impl Into<String>) -> Failure {
        Failure::Node(fault, detail.into())
    }

    /// The node fault's kind; `None` for the job's own failure.
    pub fn fault(&self) -> Option<Fault> {
        match self {
            Failure::Job(_) => None,
            Failure::Node(f, _) | Failure::Drain(f, _) => Some(*f),
        }
    }

    /// The message alone, whatever the class.
    pub fn message(&self) -> &str {
        match self {
            Failure::Job(m) | Failure::Node(_, m) | Failure::Drain(_, m) => m,
        }
    }
}

impl std::fmt::Display for Failure {
    /// The message alone (the class decides what happens, not what is said).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// What on the node failed: one kind per thing an admin would look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A step of the hook did not finish within `hook_deadline_ms`.
    Hang,
    /// NVML would not load or answer.
    Nvml,
    /// Slurm's GPU indices do not map onto the node's GPUs.
    GpuIndices,
    /// The job's state file could not be written, read or removed.
    JobState,
    /// The configuration cannot serve the job (e.g. an unknown signal name).
    Config,
    /// Taking the per-GPU locks failed.
    GpuLock,
    /// Starting, stopping or undoing the job's MPS daemon or compute mode.
    Mps,
    /// A process of the job's MPS daemon outlived its teardown.
    MpsZombie,
    /// Creating, recording or removing the job's MIG instances.
    Mig,
    /// A MIG instance of the job still had processes at teardown.
    MigBusy,
    /// The per-job checkpoint agent would not start.
    CheckpointAgent,
    /// The job's checkpoint images (store or staging) could not be read or
    /// removed.
    CheckpointImages,
    /// A process the checkpoint mode stopped could not be removed at the
    /// job's end.
    CheckpointStuck,
}

impl Fault {
    /// Every kind, for the label tests and the docs' table.
    pub const ALL: [Fault; 13] = [
        Fault::Hang,
        Fault::Nvml,
        Fault::GpuIndices,
        Fault::JobState,
        Fault::Config,
        Fault::GpuLock,
        Fault::Mps,
        Fault::MpsZombie,
        Fault::Mig,
        Fault::MigBusy,
        Fault::CheckpointAgent,
        Fault::CheckpointImages,
        Fault::CheckpointStuck,
    ];

    // A kind added at the end and left out of ALL fails this (the
    // discriminants count up from 0).
    const _ALL_IS_COMPLETE: () = assert!(Fault::ALL.len() == Fault::CheckpointStuck as usize + 1);

    /// The metric label: fixed, lowercase, never built from text.
    pub fn label(self) -> &'static str {
        match self {
            Fault::Hang => "hang",
            Fault::Nvml => "nvml",
            Fault::GpuIndices => "gpu_indices",
            Fault::JobState => "job_state",
            Fault::Config => "config",
            Fault::GpuLock => "gpu_lock",
            Fault::Mps => "mps",
            Fault::MpsZombie => "mps_zombie",
            Fault::Mig => "mig",
            Fault::MigBusy => "mig_busy",
            Fault::CheckpointAgent => "checkpoint_agent",
            Fault::CheckpointImages => "checkpoint_images",
            Fault::CheckpointStuck => "checkpoint_stuck",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_has_its_own_plain_documented_label() {
        let labels: Vec<&str> = Fault::ALL.iter().map(|f| f.label()).collect();
        gpu_mode_testkit::labels::assert_metric_labels("drain reasons", &labels, include_str!("../../docs/metrics.md"));
    }

    #[test]
    fn the_class_decides_the_fault_and_the_text_stays() {
        let cases = [
            (Failure::Job("no such profile".into()), None, "no such profile"),
            (Failure::node(Fault::Nvml, "NVML: gone"), Some(Fault::Nvml), "NVML: gone"),
            (Failure::Drain(Fault::MpsZombie, "MPS zombie pid 3".into()), Some(Fault::MpsZombie), "MPS zombie pid 3"),
        ];
        for (failure, fault, text) in cases {
            assert_eq!(failure.fault(), fault, "{failure:?}");
            assert_eq!(failure.to_string(), text);
        }
    }
}
