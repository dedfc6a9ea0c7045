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

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Job(String),
    /// A node fault; drained as `gpu-mode: <verb>: <detail>`.
    Node(String),
    /// A node fault whose whole drain reason (after `gpu-mode: `) is given,
    /// e.g. `MPS zombie pid 12 (job 7, GPU GPU-...)`.
    Drain(String),
}

impl std::fmt::Display for Failure {
    /// The message alone (the class decides what happens, not what is said).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Job(m) | Failure::Node(m) | Failure::Drain(m) => f.write_str(m),
        }
    }
}
