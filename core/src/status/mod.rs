//! `gpu-mode status`: one screen for the admin on a node (docs/admin.md).
//! [`records`] reads this project's records; [`gather`] adds what NVML and
//! Slurm say; [`render`] prints it as a table or JSON and decides the exit
//! code.

pub mod records;
