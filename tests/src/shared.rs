//! One cluster per test binary, shared by its tests (they run in parallel),
//! stopped when the test process exits, even after failed tests.

use crate::{Artifacts, Cluster, ClusterSpec};
use std::sync::OnceLock;

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// Starts (once) the cluster for the test binary named `name`, with `gpus`
/// simulated GPUs, and returns it. A failed start fails every test of the
/// binary with the same message.
pub fn cluster(name: &str, gpus: u32) -> &'static Cluster {
    cluster_with(name, gpus, |_| {})
}

/// [`cluster`] with `customize` applied to the spec before the start.
pub fn cluster_with(name: &str, gpus: u32, customize: impl FnOnce(&mut ClusterSpec)) -> &'static Cluster {
    let started = CLUSTER.get_or_init(|| {
        let result = (|| -> anyhow::Result<Cluster> {
            crate::users::ensure_test_users()?;
            let mut spec = ClusterSpec::new(name, gpus, Artifacts::locate()?);
            customize(&mut spec);
            Cluster::start(spec)
        })();
        // Statics are never dropped: stop the daemons when the process exits.
        // libtest returns from main or calls exit(), so atexit runs either way.
        unsafe { libc::atexit(stop_at_exit) };
        result.map_err(|e| format!("{e:#}"))
    });
    match started {
        Ok(c) => c,
        Err(e) => panic!("local Slurm cluster did not start: {e}"),
    }
}

extern "C" fn stop_at_exit() {
    if let Some(Ok(c)) = CLUSTER.get() {
        c.stop();
    }
}
