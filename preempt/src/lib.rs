//! `--gpu-mode=checkpoint`: a preempted job is checkpointed (CUDA, then
//! CRIU) within its grace time, requeued, and restored where it stopped.
//!
//! ```text
//!  batch script:  exec gpu-mode-run ./train            (wrapper.rs, as the user)
//!                   └ ./train  (own session)           the application tree
//!  prolog ──spawns──▶ gpu-mode-ckpt-agent (root)       (agent/, one per job)
//!                     <socket_dir>/job-<J>.sock        only the job's user (0600 + SO_PEERCRED)
//!
//!  preemption: slurmctld ─SIGUSR1 (--signal=B:USR1@N)─▶ wrapper ─checkpoint─▶ agent
//!     agent: CUDA lock+checkpoint of the tree (GPU memory free) → criu dump
//!            → images fsynced → manifest.json written last → "checkpointed"
//!     wrapper: scontrol requeue <J>, then waits to be killed
//!  requeued run: wrapper ─restore─▶ agent
//!     agent: manifest checks (job, user, version, files, checksums, driver,
//!            GPU models, free memory) → criu restore into the new job's
//!            cgroup → CUDA restore onto the new GPUs → unlock → "restored"
//!            … later "exited <status>", relayed as the job's exit code
//!  epilog: cleanup_after_job (images of a job that is not coming back), sweep (limits)
//! ```
//!
//! Files: `crate::submit` (the pure submission check the plugin calls; in
//! the job tier so that the plugin needs nothing of this module),
//! `manifest.rs` (what a dump promises), `images.rs` (layout, sealing,
//! retention), `protocol.rs` (wrapper ↔ agent), `tree.rs` (who owns which
//! process), `agent/` (the root side), `wrapper.rs` (the user side),
//! `timeline.rs` (where each checkpoint's and restore's time went),
//! `writeback.rs` (the image written to disk while CRIU dumps it),
//! `accounting.rs` (the events in the job's AdminComment or Comment),
//! `hugepages.rs` (the huge-page shim preloaded into the application, and
//! the agent's kept copy of each version), `crate::signal_state` (the
//! application's signal mask and ignored set, as the wrapper inherited them;
//! a base module, the plugin holds the checkpoint signal with it), `shm.rs`
//! (the job's named semaphores in /dev/shm, carried in the image),
//! `user_child.rs` (work done as the job's user from the root agent),
//! `uncheckpointable.rs` (what CRIU or the driver cannot bring back: refused
//! before the lock), `nccl.rs` (NCCL's portable-transport variables, which
//! gpu-mode-run sets and the agent checks).

// The base and device modules at the paths these files name them by
// (`crate::fsutil`), not re-exported: gpu-mode-core re-exports them itself.
use gpu_mode_base::{command, config, drain, fsutil, hostlist, job_env, log, metrics, persist, privdrop, procfs, signal, signal_state, Config};
use gpu_mode_devices::{criu, cuda_ckpt, gpu};

pub mod accounting;
pub mod agent;
pub mod ghosts;
pub mod held;
pub mod hugepages;
pub mod images;
pub mod manifest;
pub mod nccl;
pub mod page_cache;
pub mod netlock;
pub mod pool;
pub mod protocol;
pub mod readiness;
pub mod shm;
/// The application's signal state (a base module: the SPANK plugin holds the
/// checkpoint signal with it too).
pub use gpu_mode_base::signal_state as signals;
pub mod slurm_view;
pub mod staging;
/// The submission check (the job tier: the SPANK plugin calls it).
pub use gpu_mode_base::submit;
pub mod timeline;
pub mod timewait;
pub mod tcp;
pub mod tree;
pub mod uncheckpointable;
pub(crate) mod user_child;
pub mod wrapper;
pub mod writeback;

pub use agent::{spawn_agent, stop_agent, Agent, AgentControlError, AgentLaunch, AgentParams, NodeFacts};
pub use images::{cleanup_after_job, discard_job_images, sweep_images, Cleanup, ImageStore, Limits};
pub use manifest::{Manifest, MANIFEST_VERSION};
pub use submit::{checkpoint_submit_check, SubmitSite};

use std::path::PathBuf;

/// Signal names and numbers live in the base layer (configuration checks
/// them too); these paths stay for the preemption code.
pub use crate::signal::{signal_name, signal_number};

/// The agent socket of job `job`: `<socket_dir>/job-<job>.sock`.
pub fn socket_path(socket_dir: &std::path::Path, job: u32) -> PathBuf {
    socket_dir.join(format!("job-{job}.sock"))
}

/// `f` over `items` on up to `threads` threads at once, results in the
/// items' order. (std's scoped threads; rayon would be a dependency for one
/// loop.)
pub fn parallel_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(item) = items.get(i) else { return done };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a parallel_map worker panicked")).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Milliseconds since the epoch (wall clock: compared across processes of
/// one node, e.g. signal received → GPU memory free).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_map_keeps_the_order_and_runs_every_item_once() {
        let items: Vec<u32> = (0..100).collect();
        let calls = std::sync::atomic::AtomicUsize::new(0);
        for threads in [0, 1, 3, 8, 500] {
            calls.store(0, std::sync::atomic::Ordering::SeqCst);
            let out = parallel_map(&items, threads, |i| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                i * 2
            });
            assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>(), "{threads} threads");
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 100);
        }
        assert!(parallel_map(&Vec::<u32>::new(), 4, |i| *i).is_empty());
    }

    #[test]
    fn the_agent_socket_is_named_by_the_job() {
        assert_eq!(socket_path(std::path::Path::new("/run/x"), 7), PathBuf::from("/run/x/job-7.sock"));
    }
}
