//! `gpu-mode-cluster`: start or stop the project's local Slurm cluster by hand
//! (the README's demo uses it; the tests use the library directly).
//!
//!   gpu-mode-cluster up [--gpus N] [--name NAME] [--contain] [--preempt] [--installed]
//!                                                  start, print how to use it;
//!                                                  --contain: cgroups and an
//!                                                  extern step per job;
//!                                                  --preempt: partitions low/high
//!                                                  (docs/preempt.md)
//!   gpu-mode-cluster down [--name NAME]            stop and remove
//!   gpu-mode-cluster env [--name NAME]             print `export SLURM_CONF=...`
//!   gpu-mode-cluster write --installed [--gpus N] [--name NAME] [--preempt]
//!       write a cluster that runs the installed package (no gpu-mode lines:
//!       the Ansible role adds them, from <dir>/ansible-vars.json)
//!   gpu-mode-cluster start [--name NAME]           start a written cluster

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
    let mut contain = false;
    let mut installed = false;
    let mut preempt = false;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--contain" => contain = true,
            "--installed" => installed = true,
            "--preempt" => preempt = true,
            "--name" => name = it.next().cloned().ok_or_else(|| anyhow::anyhow!("--name needs a value"))?,
            "--gpus" => gpus = it.next().ok_or_else(|| anyhow::anyhow!("--gpus needs a value"))?.parse()?,
            _ => bail!("unexpected argument {a:?}"),
        }
    }
    let artifacts = || if installed { Artifacts::installed() } else { Artifacts::locate() };
    let base = std::env::var("GPU_MODE_CLUSTER_BASE").unwrap_or_else(|_| "/tmp/gpu-mode-cluster".into());
    let dir = std::path::Path::new(&base).join(&name);
    match verb {
        "up" => {
            gpu_mode_tests::users::ensure_test_users()?;
            let mut spec = ClusterSpec::new(&name, gpus, artifacts()?);
            spec.contain = contain;
            spec.installed = installed;
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
        "write" => {
            gpu_mode_tests::users::ensure_test_users()?;
            let found = if installed { Ok(Artifacts::installed_unchecked()) } else { Artifacts::locate() };
            let mut spec = ClusterSpec::new(&name, gpus, found?);
            spec.installed = installed;
            if preempt {
                spec.preemption = Some(Preemption::default());
            }
            Cluster::write(&spec)?;
            println!("cluster {name} is written in {} (not started)", dir.display());
            Ok(())
        }
        "start" => {
            // Ports and GPUs are in the written slurm.conf; the spec only
            // names the directory and the node.
            let cluster = Cluster::start_written(ClusterSpec::new(&name, gpus, artifacts()?))?;
            println!("cluster {name} is up in {}", dir.display());
            println!("export SLURM_CONF={}", dir.join("slurm.conf").display());
            std::mem::forget(cluster);
            Ok(())
        }
        "down" => {
            process::stop_daemons_in(&dir);
            // An installed cluster named its simulated node in the sim's
            // pointer file: drop it with the cluster.
            let pointer = gpu_mode_tests::conf::nvml_sim_pointer();
            if std::fs::read_to_string(pointer).is_ok_and(|p| std::path::Path::new(p.trim()).starts_with(&dir)) {
                let _ = std::fs::remove_file(pointer);
            }
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
        _ => bail!("usage: gpu-mode-cluster up|write|start|down|env [--name NAME] [--gpus N] [--contain] [--preempt] [--installed]"),
    }
}
