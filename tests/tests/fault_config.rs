//! Fault matrix (docs/faults.md): the site config missing or invalid on a
//! node and on a submit host. Invalid on a node is `config_typo.rs` (audit
//! item H2); here: missing on a node, and missing or invalid on a submit
//! host (its own slurm.conf and plugstack.conf naming a config the node
//! does not use). Jobs without --gpu-mode keep working everywhere; a node
//! without its config refuses mode jobs naming the file, logs it loudly on
//! every hook run, and is not drained.

use gpu_mode_tests::shared::cluster;
use gpu_mode_tests::Cluster;
use std::path::PathBuf;
use std::sync::Mutex;

static TURN: Mutex<()> = Mutex::new(());

fn c() -> &'static Cluster {
    cluster("fault_config", 1)
}

#[test]
fn a_node_without_its_config_refuses_mode_jobs_only_with_a_loud_line_and_no_drain() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let conf = c().dir.join("gpu-mode.toml");
    let aside = c().dir.join("gpu-mode.toml.aside");
    std::fs::rename(&conf, &aside).unwrap();
    let plain = c().sbatch_wait(Some("gmtest1"), &["--gres=gpu:1"], "#!/bin/sh\necho plain-ran\n");
    let mode = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho mode-ran\n");
    // The epilog runs without the config too (it cleans where the prolog wrote).
    if let Ok(m) = &mode {
        let _ = c().wait_epilog(m.id, std::time::Duration::from_secs(60));
    }
    std::fs::rename(&aside, &conf).unwrap();
    let (plain, mode) = (plain.unwrap(), mode.unwrap());
    assert_eq!(plain.exit_code, 0, "{}", plain.output);
    assert!(plain.output.contains("plain-ran"));
    let lines = c().hook_log_lines(plain.id);
    let loud = "action=config";
    assert!(
        lines.iter().any(|l| l.contains(loud) && l.contains("cannot read config file") && l.contains("gpu-mode.toml") && l.ends_with("outcome=failed")),
        "no loud config line for the plain job: {lines:#?}"
    );
    assert_ne!(mode.exit_code, 0, "{}", mode.output);
    assert!(!mode.output.contains("mode-ran"), "{}", mode.output);
    assert!(mode.output.contains("the gpu-mode site configuration of node localhost is invalid") && mode.output.contains("cannot read config file"), "{}", mode.output);
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{state} {reason}");
    let left = c().leftovers(None);
    assert!(left.is_clean(), "{}", left.summary());
}

/// A node whose config still has the old `[checkpoint]` section (the CUDA
/// driver verb's and preemption's keys in one, before `[cuda_ckpt]` and
/// `[preempt]`): jobs run as before, and each hook run says so in one
/// `action=config` line that names the file, without failing or draining.
#[test]
fn a_node_config_with_the_old_checkpoint_section_runs_jobs_and_says_so_in_each_hook() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let conf = c().dir.join("gpu-mode.toml");
    let now = std::fs::read_to_string(&conf).unwrap();
    // The harness writes [cuda_ckpt], then [preempt] (see tests/src/conf.rs):
    // one [checkpoint] with both sets of keys, as a site's file had them.
    let old = now.replacen("[cuda_ckpt]\n", "[checkpoint]\n", 1).replacen("[preempt]\n", "", 1);
    assert!(old.contains("[checkpoint]\n") && !old.contains("[preempt]") && !old.contains("[cuda_ckpt]"), "{old}");
    std::fs::write(&conf, &old).unwrap();
    let job = c().sbatch_wait(Some("gmtest1"), &["--gpu-mode=mps", "--gres=gpu:1"], "#!/bin/sh\necho mode-ran\n");
    if let Ok(j) = &job {
        let _ = c().wait_epilog(j.id, std::time::Duration::from_secs(60));
    }
    std::fs::write(&conf, &now).unwrap();
    let job = job.unwrap();
    assert_eq!(job.exit_code, 0, "{}", job.output);
    assert!(job.output.contains("mode-ran"), "{}", job.output);
    let lines = c().hook_log_lines(job.id);
    let said: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("action=config") && l.contains("deprecated: the [checkpoint] section is now [preempt]"))
        .collect();
    assert_eq!(said.len(), 2, "one line from the prolog and one from the epilog: {lines:#?}");
    assert!(said.iter().all(|l| l.contains("gpu-mode.toml") && l.ends_with("outcome=ok")), "{said:#?}");
    let (state, reason) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"), "{state} {reason}");
    let left = c().leftovers(None);
    assert!(left.is_clean(), "{}", left.summary());
}

/// A submit host's own slurm.conf whose plugstack.conf gives the plugin
/// `config=<config>` (missing or broken), as a login node that lags behind.
fn submit_host(name: &str, config: &str) -> PathBuf {
    let dir = c().dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let slurm = std::fs::read_to_string(c().dir.join("slurm.conf")).unwrap();
    let plugstack = std::fs::read_to_string(c().dir.join("plugstack.conf")).unwrap();
    let node_config = c().dir.join("gpu-mode.toml").display().to_string();
    std::fs::write(dir.join("plugstack.conf"), plugstack.replace(&node_config, config)).unwrap();
    let ours = dir.join("plugstack.conf").display().to_string();
    let node_plugstack = c().dir.join("plugstack.conf").display().to_string();
    std::fs::write(dir.join("slurm.conf"), slurm.replace(&node_plugstack, &ours)).unwrap();
    dir.join("slurm.conf")
}

#[test]
fn a_submit_host_with_a_missing_or_invalid_config_submits_every_job() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let broken = c().dir.join("submit-broken.toml");
    std::fs::write(&broken, "runtimedir = \"/x\"\n[mps\n").unwrap();
    for (name, config) in [("submit-missing", "/nonexistent/gpu-mode.toml".to_string()), ("submit-invalid", broken.display().to_string())] {
        let conf = submit_host(name, &config);
        for (mode, expect) in [(None, "plain-ran"), (Some("--gpu-mode=mps"), "mode-ran")] {
            let script = c().dir.join("out").join(format!("{name}.sh"));
            std::fs::write(&script, format!("#!/bin/sh\necho {expect} mode=$SLURM_GPU_MODE\n")).unwrap();
            let mut args = vec!["--parsable".to_string(), "--wait".into(), "--gres=gpu:1".into(), format!("--output={}/%j.out", c().dir.join("out").display())];
            args.extend(mode.map(String::from));
            args.push(script.display().to_string());
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = c().client("sbatch", &argv).env("SLURM_CONF", conf.to_str().unwrap()).run_as(Some("gmtest2")).unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} {mode:?}: {stderr}");
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let output = std::fs::read_to_string(c().dir.join("out").join(format!("{id}.out"))).unwrap_or_default();
            assert!(output.contains(expect), "{name} {mode:?}: {output}");
            if mode.is_some() {
                assert!(output.contains("mode=mps"), "the node gave the job its mode: {output}");
            }
        }
        // The option is still checked at submit: it needs no config.
        let out = c().client("sbatch", &["--gpu-mode=mps:threads=0", "--wrap", "true"]).env("SLURM_CONF", conf.to_str().unwrap()).run_as(Some("gmtest2")).unwrap();
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("threads=0 is out of range"), "{name}");
    }
    let (state, _) = c().node_state().unwrap();
    assert!(!state.contains("DRAIN"));
}
