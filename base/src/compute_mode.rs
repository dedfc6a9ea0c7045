//! A GPU's compute mode, as this project records it (the MPS daemon records
//! keep the modes to put back) and reads it (gpu-mode-core's `gpu`, which
//! converts NVML's). Plain data, so that records can be read without NVML.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeMode {
    Default,
    /// Removed by NVIDIA; only ever read, never set.
    ExclusiveThread,
    Prohibited,
    /// One process (the MPS server with MPS) holds the GPU.
    ExclusiveProcess,
}
