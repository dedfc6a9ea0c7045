//! `gpu-mode-cluster`: start or stop the project's local Slurm cluster by hand
//! (the README's demo uses it; the tests use the library directly).
//!
//!   gpu-mode-cluster up [--gpus N] [--name NAME] [--preempt]
//!                                                  start, print how to use it;
//!                                                  --preempt: partitions low/high
//!                                                  (docs/checkpoint.md, Preemption)
//!   gpu-mode-cluster down [--name NAME]            stop and remove
//!   gpu-mode-cluster env [--name NAME]             print `export SLURM_CONF=...`

use anyhow::{bail, Result};
use gpu_mode_tests::{process, Artifacts, Cluster, ClusterSpec, Preemption};

fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()) {
        eprintln!("gpu-mode-cluster: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let (verb, rest) = args.split_first().map(|(v, r)| (v.as_str(), r)).unwrap_or(("", &[]));
    let mut name = "demo".to_string();
    let mut gpus = 4u32;
    let mut preempt = false;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--preempt" {
            preempt = true;
            continue;
        }
        match (a.as_str(), it.next()) {
            ("--name", Some(v)) => name = v.clone(),
            ("--gpus", Some(v)) => gpus = v.parse()?,
            _ => bail!("unexpected argument {a:?}"),
        }
    }
    let base = std::env::var("GPU_MODE_CLUSTER_BASE").unwrap_or_else(|_| "/tmp/gpu-mode-cluster".into());
    let dir = std::path::Path::new(&base).join(&name);
    match verb {
        "up" => {
            gpu_mode_tests::users::ensure_test_users()?;
            let mut spec = ClusterSpec::new(&name, gpus, Artifacts::locate()?);
            if preempt {
                spec.preemption = Some(Preemption::default());
            }
            let cluster = Cluster::start(spec)?;
            let kind = if cluster.spec.real_gpus { "real" } else { "simulated" };
            println!("cluster {name} is up with {gpus} {kind} GPUs in {}", dir.display());
            if preempt {
                println!("partitions: debug, low (preemptible, requeued), high (preempts low)");
            }
            println!("export SLURM_CONF={}", dir.join("slurm.conf").display());
            // Keep the daemons: they run on after this process exits.
            std::mem::forget(cluster);
            Ok(())
        }
        "down" => {
            process::stop_daemons_in(&dir);
            process::stop_agents_in(&dir);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            println!("cluster {name} is down");
            Ok(())
        }
        "env" => {
            println!("export SLURM_CONF={}", dir.join("slurm.conf").display());
            Ok(())
        }
        _ => bail!("usage: gpu-mode-cluster up|down|env [--name NAME] [--gpus N] [--preempt]"),
    }
}
