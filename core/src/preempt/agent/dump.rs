//! Checkpoint: CUDA first (the GPU memory is freed as early as possible,
//! and CRIU then finds no GPU files), then CRIU, then the images are sealed
//! and the manifest written last. Success is reported only after the
//! manifest is durable; a failure leaves no manifest and removes the run
//! directory.

use super::server::Peer;
use super::{Agent, RootState};
use crate::checkpoint::record::CheckpointRecord;
use crate::checkpoint::{CheckpointError, CheckpointReport, DeviceMap, Step, Target};
use crate::criu::DumpRequest;
use crate::preempt::images::ImageStore;
use crate::preempt::manifest::{DumpTimings, Manifest, MANIFEST_VERSION};
use crate::preempt::protocol::CheckpointSummary;
use crate::preempt::{now_ms, tree};
use std::path::Path;
use std::time::Instant;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

fn phase_ms(r: &Option<CheckpointReport>, step: Step) -> f64 {
    r.as_ref().and_then(|r| r.phases.iter().find(|p| p.step == step)).map_or(0.0, |p| p.wall_ms)
}

impl Agent {
    pub(super) fn checkpoint(&self, peer: Peer, root: i32, signal_at_ms: Option<u64>) -> Result<CheckpointSummary, String> {
        let _op = self.exclusive()?;
        self.criu_status.clone().map_err(|e| format!("cannot checkpoint: {e}"))?;
        self.check_root(peer, root)?;
        let pids = self.host.with_descendants(root);
        tree::check_owned(&pids, self.params.uid)?;
        let (job, restart) = (self.params.job, self.params.restart_count);
        let run = self.settings.images.prepare_run(job, restart).map_err(|e| format!("cannot prepare the image directory: {e}"))?;
        let was = self.root_state(root);
        if was.is_some() {
            self.set_root(root, Some(RootState::Dumping));
        }
        let result = self.dump_into(&run, root, &pids, signal_at_ms);
        if result.is_err() {
            // Never leave a partial image, and never one that claims success.
            let _ = crate::fsutil::remove_tree_if_present(&run);
        }
        if was.is_some() {
            self.set_root(root, Some(if result.is_ok() { RootState::Dumped } else { RootState::Running }));
        }
        result
    }

    /// The root must be the caller's own descendant or a tree this agent
    /// restored, and the caller must be one of the job's processes (root,
    /// the admin, is trusted).
    fn check_root(&self, peer: Peer, root: i32) -> Result<(), String> {
        if peer.uid != 0 {
            self.peer_in_job(peer)?;
        }
        if self.root_state(root).is_some() || tree::descends_from(root, peer.pid) {
            return Ok(());
        }
        Err(format!("pid {root} is neither a descendant of the caller (pid {}) nor a tree this agent restored: refused", peer.pid))
    }

    /// Another job of the same user on this node must not use this agent.
    pub(super) fn peer_in_job(&self, peer: Peer) -> Result<(), String> {
        match self.host.job_processes(self.params.job) {
            Ok((pids, _)) if pids.contains(&peer.pid) => Ok(()),
            Ok(_) => Err(format!("the caller (pid {}) is not a process of job {}: refused", peer.pid, self.params.job)),
            Err(e) => Err(format!("cannot tell the processes of job {}: {e}", self.params.job)),
        }
    }

    fn dump_into(&self, run: &Path, root: i32, pids: &[i32], signal_at_ms: Option<u64>) -> Result<CheckpointSummary, String> {
        let start = Instant::now();
        let ckpt = self.checkpointer();
        let target = Target::Pids(vec![root]);
        let cuda = match ckpt.checkpoint(&target) {
            Ok(r) => Some(r),
            Err(CheckpointError::NoCudaProcesses { .. }) => None,
            Err(e) => return Err(format!("CUDA checkpoint failed: {e}")),
        };
        let gpu_free_ms = now_ms();
        let criu_start = Instant::now();
        let req = DumpRequest { pid: root, images_dir: run.to_path_buf(), tcp_established: self.settings.tcp_established };
        if let Err(e) = self.criu.dump(&req) {
            return Err(format!("{e}; {}", self.roll_back(cuda.is_some(), &target)));
        }
        let criu_ms = ms(criu_start);
        let key = target.key();
        let _ = CheckpointRecord::remove(&self.settings.checkpoint.record_dir, &key);
        // From here on the tree is gone: a failure means starting over.
        let seal_start = Instant::now();
        let images = ImageStore::seal(run).map_err(|e| format!("cannot seal the images in {}: {e}", run.display()))?;
        let timings = DumpTimings {
            signal_to_gpu_free_ms: signal_at_ms.map(|s| gpu_free_ms.saturating_sub(s) as f64),
            cuda_lock_ms: phase_ms(&cuda, Step::Lock),
            cuda_checkpoint_ms: phase_ms(&cuda, Step::Checkpoint),
            criu_dump_ms: criu_ms,
            seal_ms: ms(seal_start),
            total_ms: 0.0,
        };
        let mut manifest = self.manifest(root, pids, cuda.as_ref(), images, timings);
        manifest.timings.total_ms = ms(start);
        manifest.save(run).map_err(|e| format!("cannot write the manifest in {}: {e}", run.display()))?;
        self.settings.images.sync_parents(self.params.job).map_err(|e| format!("cannot sync the image directory: {e}"))?;
        // Older images of this job (restored already) are of no more use.
        let _ = self.settings.images.remove_other_runs(self.params.job, Some(self.params.restart_count));
        Ok(CheckpointSummary {
            image_dir: run.display().to_string(),
            image_bytes: manifest.image_bytes,
            gpu_bytes: cuda.as_ref().map_or(0, |r| r.bytes()),
            cuda_processes: manifest.cuda.len(),
            timings: manifest.timings,
        })
    }

    /// After a failed CRIU dump (CRIU resumed the tree): the GPU state goes
    /// back so the application runs on until the job ends or is requeued.
    fn roll_back(&self, had_cuda: bool, target: &Target) -> String {
        if !had_cuda {
            return "the application runs on".into();
        }
        match self.checkpointer().restore(target, &DeviceMap::default()) {
            Ok(_) => "its GPU state was restored and the application runs on".into(),
            Err(e) => format!("its GPU state could NOT be restored ({e})"),
        }
    }

    fn manifest(
        &self,
        root: i32,
        pids: &[i32],
        cuda: Option<&CheckpointReport>,
        images: Vec<crate::preempt::manifest::ImageFile>,
        timings: DumpTimings,
    ) -> Manifest {
        let p = &self.params;
        Manifest {
            version: MANIFEST_VERSION,
            job: p.job,
            restart_count: p.restart_count,
            uid: p.uid,
            gid: p.gid,
            node: p.node.clone(),
            created_unix: now_ms() / 1000,
            root_pid: root,
            pids: pids.to_vec(),
            cuda: cuda.map(|r| r.processes.clone()).unwrap_or_default(),
            gpus: p.gpus.clone(),
            node_gpus: self.facts.node_gpus.clone(),
            driver_version: self.facts.driver_version.clone(),
            cuda_version: self.facts.cuda_version,
            criu_version: self.criu_status.clone().unwrap_or_default(),
            tcp_established: self.settings.tcp_established,
            image_bytes: images.iter().map(|f| f.bytes).sum(),
            images,
            timings,
        }
    }
}
